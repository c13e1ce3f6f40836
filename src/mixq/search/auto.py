"""Automatic mixed precision: quantize wide, measure each layer's sensitivity to each narrower
candidate, then narrow layers in ascending sensitivity as far as the target allows.

Targets: relative L2 of one output (`l2_target`), a top-1 drop (labels or a user
EvaluateFunction), a weight-size budget (`max_size_mb`, `max_avg_bits`) and a time budget.
Decisions are made on data held out from calibration; the final model's metric on that data is
reported. Sensitivities, statistics and (for built-in metrics) evaluations are cached on disk by
content hash, so a rerun is instant.
"""
from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from .._io import save_model
from ..calibration.stats import TensorStats
from ..config import LayerRule, QuantConfig, get_default_config
from ..errors import ConfigError, DataError
from ..formats import get_format
from ..pipeline import Pipeline
from ..plan.plan import PrecisionPlan
from .objectives import L2Objective, Objective, Top1Objective
from .sensitivity import Candidate, SensitivityTable, candidate_layers, measure_sensitivity
from .strategies import (STRATEGIES, Evaluation, Evaluator, MetricModel, OutOfTime, bisection, front,
                         greedy, guided, pareto)
from .workbench import Feeds, Workbench, feeds_digest

DEFAULT_OP_TYPES = frozenset({"Conv", "ConvTranspose", "Gemm", "MatMul"})


@dataclass(frozen=True)
class AutoConfig:
    """An automatic mixed-precision search.

    base: the wide config every layer starts in (e.g. A16W8).
    candidates: narrower precisions a candidate layer may take (e.g. int8/int8, bfp16).
    op_types: op types whose nodes are candidate layers.
    l2_target / top1_drop / max_size_mb / max_avg_bits: targets (at least one).
    output_index: the model output the L2 target and top-1 metrics read.
    strategy: 'bisection' (default), 'guided' (predict the break from the sensitivities, verify
      with a few evaluations), 'greedy' (the documented walk) or 'pareto'.
    size_tol: 'guided' stops once the weight size still at stake between the last plan meeting
      the target and the first one breaking it is at most this fraction of the all-wide to
      all-narrow size range (0: search until they are adjacent; the result is then never
      larger than the greedy walk's).
    time_budget_s: stop searching after this many seconds and return the best plan so far.
    cache_dir: where sensitivities and evaluations are cached (None: no cache).
    """

    base: QuantConfig
    candidates: tuple[Candidate, ...]
    op_types: frozenset[str] = DEFAULT_OP_TYPES
    l2_target: float | None = None
    top1_drop: float | None = None
    max_size_mb: float | None = None
    max_avg_bits: float | None = None
    output_index: int = 0
    strategy: str = "bisection"
    size_tol: float = 0.02
    time_budget_s: float | None = None
    cache_dir: str | None = None
    max_sensitivity_rows: int = 16

    def __post_init__(self) -> None:
        if not self.candidates:
            raise ConfigError("auto mixed precision needs at least one candidate precision, "
                              "e.g. candidates=(Candidate('int8', 'int8'),).")
        if self.strategy not in STRATEGIES:
            from ..errors import did_you_mean

            raise ConfigError(f"strategy={self.strategy!r}: choose one of {', '.join(STRATEGIES)}."
                              + did_you_mean(self.strategy, STRATEGIES))
        if all(t is None for t in (self.l2_target, self.top1_drop, self.max_size_mb, self.max_avg_bits)):
            raise ConfigError("auto mixed precision needs a target: l2_target, top1_drop, "
                              "max_size_mb or max_avg_bits.")
        for name in ("max_size_mb", "max_avg_bits", "time_budget_s"):
            v = getattr(self, name)
            if v is not None and not v > 0:
                raise ConfigError(f"{name}={v} must be positive.")
        if not 0.0 <= self.size_tol < 1.0:
            raise ConfigError(f"size_tol={self.size_tol} must be in [0, 1), e.g. 0.02.")
        object.__setattr__(self, "op_types", frozenset(self.op_types))
        object.__setattr__(self, "candidates", tuple(self.candidates))


@dataclass
class AutoResult:
    """The chosen model and the whole search record."""

    model: onnx.ModelProto
    plan: PrecisionPlan
    config: QuantConfig
    assignment: dict[str, str]
    sensitivity: SensitivityTable
    path_labels: list[tuple[str, str]]
    chosen_k: int
    evaluations: list[Evaluation]
    front: list[Evaluation]
    objective: str
    metric_name: str
    metric: float
    float_metric: float | None
    target_met: bool
    size_bytes: float
    wide_size_bytes: float
    narrow_size_bytes: float
    wide_metric: float | None
    narrow_metric: float | None
    full_evaluations: int
    wall_seconds: float
    timed_out: bool = False
    held_out_note: str = ""
    output_path: Path | None = None
    report_paths: list[Path] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)


def _materialize_feeds(data: Any, model: onnx.ModelProto) -> Feeds:
    from ..calibration.data import as_feeds

    return list(as_feeds(data, model))


def split_held_out(feeds: Feeds) -> tuple[Feeds, Feeds, str]:
    """Calibration / held-out split of one data set: the last quarter of the batches (or of the
    rows when there is a single batch) is held out."""
    if len(feeds) >= 2:
        k = max(1, len(feeds) // 4)
        return feeds[:-k], feeds[-k:], f"held out the last {k} of {len(feeds)} calibration batches"
    if not feeds:
        raise DataError("auto mixed precision got no data.")
    f = feeds[0]
    n = next(iter(f.values())).shape[0]
    if n < 2:
        raise DataError("auto mixed precision needs at least two samples: one to calibrate and "
                        "one held out to check decisions on; pass more data or eval_data.")
    k = max(1, n // 4)
    return ([{a: v[:-k] for a, v in f.items()}], [{a: v[-k:] for a, v in f.items()}],
            f"held out the last {k} of {n} calibration rows")


class _Cache:
    """A JSON file per content hash under `root`, bounded to `max_bytes` (least recently used
    files out first; default MIXQ_CACHE_MAX_MB, 100 MB). A `root` that is a file is an
    OutputError."""

    def __init__(self, root: str | os.PathLike | None, max_bytes: int | None = None) -> None:
        self.root = Path(root).expanduser() if root else None
        if self.root is not None and self.root.exists() and not self.root.is_dir():
            from ..errors import OutputError

            raise OutputError(f"the cache directory {str(root)!r} is a file; give a directory "
                              "(--cache-dir, MIXQ_CACHE_DIR) or --no-cache.")
        self.max_bytes = cache_max_bytes() if max_bytes is None else max_bytes

    def get(self, key: str) -> Any:
        if self.root is None:
            return None
        p = self.root / f"{key}.json"
        if not p.exists():
            return None
        try:
            value = json.loads(p.read_text())
            os.utime(p)  # used: the eviction goes by last use
        except (OSError, ValueError):
            return None
        return value

    def put(self, key: str, value: Any) -> None:
        if self.root is None:
            return
        from .._io import write_output

        write_output(self.root / f"{key}.json", json.dumps(value).encode(), kind="cache file")
        self.evict(keep=f"{key}.json")

    def evict(self, keep: str = "") -> None:
        """Delete the least recently used cache files (modification time, which `get` renews)
        until they take at most max_bytes; `keep` (the file just written) stays even when it
        alone is larger. Only files named like cache entries (`_key` + .json) are counted or
        deleted: a cache directory shared with other files (`--cache-dir .`) loses none of
        them."""
        if self.root is None:
            return
        import re

        files = []
        for p in self.root.glob("*.json"):
            if not re.fullmatch(r"[0-9a-f]{32}\.json", p.name):
                continue
            try:
                st = p.stat()
            except OSError:  # removed meanwhile (another run)
                continue
            files.append((st.st_mtime_ns, p.name, st.st_size, p))
        total = sum(f[2] for f in files)
        for _, name, size, p in sorted(files):
            if total <= self.max_bytes:
                break
            if name == keep:
                continue
            try:
                p.unlink()
            except OSError:
                continue
            total -= size


def default_cache_dir() -> str:
    """Where `mixq auto` caches by default: $MIXQ_CACHE_DIR, else ~/.cache/mixq."""
    return os.environ.get("MIXQ_CACHE_DIR") or str(Path.home() / ".cache" / "mixq")


def cache_max_bytes() -> int:
    """The cache bound in bytes: $MIXQ_CACHE_MAX_MB megabytes (10^6 bytes), default 100."""
    raw = os.environ.get("MIXQ_CACHE_MAX_MB", "100")
    try:
        mb = float(raw)
    except ValueError:
        mb = -1.0
    if not mb >= 0:
        raise ConfigError(f"MIXQ_CACHE_MAX_MB={raw!r} is not a size in MB; set a number >= 0 "
                          "(e.g. 100).")
    return int(mb * 1e6)


def _key(*parts: Any) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(json.dumps(p, sort_keys=True, default=str).encode())
        h.update(b"\0")
    return h.hexdigest()[:32]


def _assignment_config(base: QuantConfig, assignment: dict[str, Candidate]) -> QuantConfig:
    by: dict[Candidate, list[str]] = {}
    for node, c in assignment.items():
        by.setdefault(c, []).append(node)
    rules = tuple(LayerRule(nodes=tuple(sorted(nodes)), activation=c.activation, weight=c.weight)
                  for c, nodes in sorted(by.items(), key=lambda kv: kv[0].label))
    return base.with_options(layer_rules=tuple(base.layer_rules) + rules, name=f"{base.name}+auto")


def _narrowness(c: Candidate) -> float:
    return get_format(c.activation).avg_bits + get_format(c.weight).avg_bits


def build_path(layers: list[str], base: Candidate, candidates: list[Candidate],
               table: SensitivityTable) -> list[tuple[str, Candidate]]:
    """Moves (layer, candidate) in ascending estimated error; each narrows a layer further."""
    moves = []
    for layer in layers:
        row = table.err.get(layer)
        if row is None:
            continue
        for c in candidates:
            if _narrowness(c) < _narrowness(base):
                moves.append((row[c.label], -_narrowness(c), layer, c))
    moves.sort(key=lambda m: (m[0], m[1], m[2]))
    current = {layer: base for layer in layers}
    path = []
    for _, _, layer, c in moves:
        if _narrowness(c) < _narrowness(current[layer]):
            current[layer] = c
            path.append((layer, c))
    return path


def path_noise(layers: list[str], base: Candidate, path: list[tuple[str, Candidate]],
               table: SensitivityTable) -> list[float]:
    """s[k]: the estimated error power of P[k], the sum over layers of err^2 at the layer's
    current precision (the base's own error included; a re-narrowed layer counts once)."""
    current = {layer: table.err[layer][base.label] for layer in layers if layer in table.err}
    s = [float(sum(v * v for v in current.values()))]
    for layer, c in path:
        e = table.err[layer][c.label]
        s.append(s[-1] + e * e - current[layer] ** 2)
        current[layer] = e
    return s


def metric_model(objective: Objective, n_samples: int | None, classes: int | None) -> MetricModel | None:
    """How the objective's metric degrades with output noise (see `MetricModel`), None without an
    accuracy target. A top-1 in [0, 1] is a fraction of flipped samples ('flip': its step is one
    sample when labels tell how many were evaluated; it saturates at chance, 1/classes, when the
    output's width tells the classes); other units are unknown ('linear')."""
    if isinstance(objective, L2Objective) and objective.target is not None:
        return MetricModel(degradation=lambda v: v, limit=objective.target, link="power")
    if isinstance(objective, Top1Objective) and objective.max_drop is not None \
            and objective.float_value is not None:
        ref = float(objective.float_value)
        fraction = 0.0 <= ref <= 1.0
        chance = 1.0 / classes if classes and classes >= 2 else 0.0
        return MetricModel(degradation=lambda v: ref - v, limit=objective.max_drop,
                           link="flip" if fraction else "linear",
                           resolution=1.0 / n_samples if fraction and n_samples else None,
                           saturation=ref - chance if fraction and ref > chance else 1.0)
    return None


def auto_quantize(model: Any, auto: AutoConfig, calibration_data: Any, eval_data: Any = None, *,
                  labels: np.ndarray | None = None,
                  evaluate_function: Callable[[str], Any] | None = None,
                  output_path: str | os.PathLike | None = None,
                  report_dir: str | os.PathLike | None = None,
                  progress: Callable[[str, int, int], None] | None = None) -> AutoResult:
    """Run the search and return (and optionally write) the chosen model with its record."""
    t_start = time.perf_counter()
    deadline = time.monotonic() + auto.time_budget_s if auto.time_budget_s else None
    timings: dict[str, float] = {}
    pipe = Pipeline.load(model, defer=False)
    prepared = pipe.model
    cache = _Cache(auto.cache_dir)

    t = time.perf_counter()
    calib = _materialize_feeds(calibration_data, prepared)
    note = ""
    if eval_data is None:
        calib, held, note = split_held_out(calib)
    else:
        held = _materialize_feeds(eval_data, prepared)
    base = auto.base
    cands = [Candidate(base.activation, base.weight)] + [c for c in auto.candidates]
    model_digest = hashlib.sha256(prepared.SerializeToString()).hexdigest()
    # statistics for every tensor any candidate may quantize: one pass, cached
    needed: set[str] = set()
    for c in cands:
        cfg = base.with_options(activation=c.activation, weight=c.weight)
        needed |= set(pipe.plan(cfg).calibrated_tensors(lambda f: get_format(f).needs_qparams))
    stats_key = _key("stats", model_digest, sorted(needed), feeds_digest(calib))
    cached = cache.get(stats_key)
    if cached is not None:
        stats = {k: TensorStats.from_dict(v) for k, v in cached.items()}
    else:
        stats = {}
        if needed:
            from ..calibration.collect import collect_stats

            stats = dict(collect_stats(prepared, sorted(needed), calib).stats)
        cache.put(stats_key, {k: v.to_dict() for k, v in stats.items()})
    timings["calibrate"] = time.perf_counter() - t

    t = time.perf_counter()
    pipe.stats.update(stats)
    wb = Workbench(pipe, held, output_index=auto.output_index)
    objective: Objective | None
    if auto.l2_target is not None:
        objective = L2Objective(auto.l2_target)
    elif auto.top1_drop is not None or labels is not None or evaluate_function is not None:
        objective = Top1Objective(auto.top1_drop, labels=labels, evaluate_function=evaluate_function)
        objective.bind_float(wb)
    else:
        objective = L2Objective(None)  # size budget alone: report L2, the budget decides
    accuracy_target = auto.l2_target is not None or auto.top1_drop is not None

    layers = candidate_layers(wb, base, auto.op_types)
    if not layers:
        raise ConfigError(f"no layer of op types {sorted(auto.op_types)} is quantized by the base "
                          "config: nothing to search over.")
    sens_key = _key("sens", model_digest, base.to_dict(), [c.label for c in cands], layers,
                    feeds_digest(held), stats_key, auto.max_sensitivity_rows)
    sc = cache.get(sens_key)
    if sc is not None:
        table = SensitivityTable.from_dict(sc)
    else:
        table = measure_sensitivity(wb, base, layers, cands, max_rows=auto.max_sensitivity_rows,
                                    progress=(lambda i: progress("sensitivity", i + 1, len(layers)))
                                    if progress else None)
        cache.put(sens_key, table.to_dict())
    timings["sensitivity"] = time.perf_counter() - t

    path = build_path(layers, cands[0], cands[1:], table)
    n = len(path)
    assignments: list[dict[str, Candidate]] = [{}]
    for layer, c in path:
        a = dict(assignments[-1])
        a[layer] = c
        assignments.append(a)
    configs = [_assignment_config(base, a) for a in assignments]
    plans: dict[int, PrecisionPlan] = {}

    def plan_of(k: int) -> PrecisionPlan:
        if k not in plans:
            plans[k] = wb.plan(configs[k])
        return plans[k]

    def size_of(k: int) -> float:
        return wb.size_bytes(plan_of(k))

    def size_ok(k: int) -> bool:
        if auto.max_size_mb is not None and size_of(k) > auto.max_size_mb * 1e6:
            return False
        if auto.max_avg_bits is not None and wb.avg_weight_bits(plan_of(k)) > auto.max_avg_bits:
            return False
        return True

    cacheable = evaluate_function is None
    ev_key_base = _key("eval", sens_key, objective.name, None if labels is None else
                       hashlib.sha256(np.ascontiguousarray(labels).tobytes()).hexdigest())
    ev_cache = (cache.get(ev_key_base) or {}) if cacheable else {}

    def run_point(k: int) -> tuple[float, bool, float]:
        pk = _key(plan_of(k).to_json())
        if pk in ev_cache:
            metric = float(ev_cache[pk])
        else:
            m, _ = wb.materialize(configs[k], plan_of(k))
            metric = objective.evaluate(wb, m)
            ev_cache[pk] = metric
        if progress:
            progress("evaluate", len(ev.done) + 1, n + 1)
        ok = (objective.meets(metric) if accuracy_target else True) and size_ok(k)
        return metric, ok, size_of(k)

    ev = Evaluator(run_point, deadline)
    t = time.perf_counter()
    timed_out = False
    try:
        if auto.strategy == "greedy":
            if accuracy_target:
                chosen = greedy(n, ev)
            else:
                chosen = next((k for k in range(n + 1) if size_ok(k)), n)
                ev(chosen)
        elif auto.strategy in ("bisection", "guided"):
            if not accuracy_target:
                chosen = next((k for k in range(n + 1) if size_ok(k)), n)
                ev(chosen)
            elif auto.strategy == "bisection":
                chosen = bisection(n, ev)
            else:
                # labels score the rows of the held-out outputs: one flipped row moves top-1 by
                # 1/rows; a row's width is the number of classes
                outs = wb.float_outputs
                rows = (sum(o.shape[0] for o in outs)
                        if labels is not None and evaluate_function is None else None)
                classes = int(np.prod(outs[0].shape[1:])) if outs and outs[0].ndim >= 2 else None
                chosen = guided(n, ev, path_noise(layers, cands[0], path, table),
                                [size_of(k) for k in range(n + 1)],
                                metric_model(objective, rows, classes), size_tol=auto.size_tol)
        else:
            chosen = pareto(n, ev, size_ok=size_ok if (auto.max_size_mb or auto.max_avg_bits) else None,
                            accuracy_target=accuracy_target)
    except OutOfTime:
        timed_out = True
        chosen = ev.best_ok()
    # a size budget the accuracy search overshot: move along the path until it fits
    if accuracy_target and (auto.max_size_mb or auto.max_avg_bits) and not size_ok(chosen):
        chosen = next((k for k in range(chosen, n + 1) if size_ok(k)), n)
    timings["search"] = time.perf_counter() - t
    if cacheable:
        cache.put(ev_key_base, ev_cache)

    # the final model on the held-out data, plus the uniform baselines for the record
    final_model, final_plan = wb.materialize(configs[chosen], plan_of(chosen))
    final = ev.done.get(chosen) or Evaluation(chosen, objective.evaluate(wb, final_model), True,
                                              size_of(chosen), 0.0)
    # the uniform baselines for the record (not counted as search evaluations; cached)
    baselines: dict[int, float | None] = {}
    for k in (0, n):
        if k in ev.done:
            baselines[k] = ev.done[k].metric
        elif timed_out:  # out of time: no extra evaluations, the report says so
            baselines[k] = None
        else:
            pk = _key(plan_of(k).to_json())
            if pk not in ev_cache:
                ev_cache[pk] = objective.evaluate(wb, wb.materialize(configs[k], plan_of(k))[0])
            baselines[k] = float(ev_cache[pk])
    if cacheable:
        cache.put(ev_key_base, ev_cache)
    met = (objective.meets(final.metric) if accuracy_target else True) and size_ok(chosen)
    result = AutoResult(
        model=final_model, plan=final_plan, config=configs[chosen],
        assignment={layer: c.label for layer, c in assignments[chosen].items()},
        sensitivity=table, path_labels=[(layer, c.label) for layer, c in path], chosen_k=chosen,
        evaluations=sorted(ev.done.values(), key=lambda e: e.k),
        front=front(list(ev.done.values()), objective.higher_is_better),
        objective=objective.describe(), metric_name=objective.name, metric=final.metric,
        float_metric=getattr(objective, "float_value", None), target_met=met,
        size_bytes=size_of(chosen), wide_size_bytes=size_of(0), narrow_size_bytes=size_of(n),
        wide_metric=baselines[0], narrow_metric=baselines[n],
        full_evaluations=ev.count, wall_seconds=0.0, timed_out=timed_out, held_out_note=note,
        timings=timings)
    in_model = None if isinstance(model, onnx.ModelProto) else model
    in_data = [d for d in (calibration_data, eval_data) if isinstance(d, (str, os.PathLike))]
    if output_path is not None:
        result.output_path = save_model(final_model, output_path, protect=in_model, inputs=in_data)
    result.wall_seconds = time.perf_counter() - t_start
    if report_dir is not None:
        from ..report.auto_report import write_report

        result.report_paths = write_report(result, Path(report_dir), models=[in_model], inputs=in_data)
    return result


def parse_candidates(text: str) -> list[Candidate]:
    """'int16/int8,int8,bfp16' -> candidates (the first one is the wide base in the CLI)."""
    items = [s for s in str(text).split(",") if s.strip()]
    if not items:
        raise ConfigError("--candidates needs at least one format, e.g. int16/int8,int8.")
    return [Candidate.parse(s) for s in items]


def base_from_candidate(c: Candidate, preset: str | None = None) -> QuantConfig:
    """The wide base config: a preset's options with the candidate's formats."""
    cfg = get_default_config(preset) if preset else QuantConfig(activation_symmetric=True)
    return cfg.with_options(activation=c.activation, weight=c.weight, name=f"auto-base {c.label}")
