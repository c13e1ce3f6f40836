"""Automatic mixed precision: quantize wide, measure each layer's sensitivity to each narrower
candidate, then narrow layers in ascending sensitivity as far as the target allows.

Honest by construction: the all-wide plan is evaluated first; when it misses the target the
search starts from every candidate layer float instead (or, where that is the float model
itself, from every candidate layer in a 16-bit float: the float model meets any target and says
nothing about quantized plans), and when that misses too it stops (two evaluations) with the
better plan and a message saying the target cannot be met. A result with `target_met=False`
always carries that `message`.

Targets: relative L2 of one output (`l2_target`), a top-1 drop (labels or a user
EvaluateFunction), a weight-size budget (`max_size_mb`, `max_avg_bits`) and a time budget.
Decisions are made on data held out from calibration; the final model's metric on that data is
reported. Sensitivities, statistics and (for built-in metrics) evaluations are cached on disk by
content hash, so a rerun is instant.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from .._io import check_output_path, save_model
from ..calibration.stats import TensorStats
from ..calibration.variety import ConstantDataWarning, constant_data, feed_extremes
from ..config import LayerRule, QuantConfig, get_default_config
from ..errors import ConfigError, DataError
from ..formats import get_format
from ..pipeline import Pipeline
from ..plan.numerics import FP16_SAFE_ABSMAX
from ..plan.plan import PrecisionPlan
from .objectives import (AgreementObjective, DropObjective, L2Objective, Measured, Objective,
                         SQNRObjective, Top1Objective, make_objective)
from .sensitivity import (ALL_OPS, FLOAT, Candidate, SensitivityTable, candidate_layers,
                          measure_sensitivity)
from .strategies import (STRATEGIES, Evaluation, Evaluator, MetricModel, OutOfTime, bisection, front,
                         greedy, guided, noise_coordinates, pareto, predicted_break,
                         PointView, speculate)
from .workbench import Feeds, Workbench, feeds_digest, plan_outputs

#: the documented AutoMixprecision TargetOpType default (mixq.compat passes it)
DEFAULT_OP_TYPES = frozenset({"Conv", "ConvTranspose", "Gemm", "MatMul"})
#: AutoConfig's default: every op that quantizes a tensor of its own is a candidate
ALL_OP_TYPES = frozenset({ALL_OPS})


@dataclass(frozen=True)
class AutoConfig:
    """An automatic mixed-precision search.

    base: the wide config every layer starts in (e.g. A16W8).
    candidates: narrower precisions a candidate layer may take (e.g. int8/int8, bfp16).
    op_types: op types whose nodes are candidate layers; "all" (the default): every op that
      quantizes a tensor of its own (element-wise ops, Softmax inputs, Concat, Gather tables as
      well as Conv/Gemm/MatMul).
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
    max_sensitivity_rows: held-out rows the per-layer sensitivities are measured on (whole
      feeds: a feed is never cut or joined).
    metric / target: the metric (see `mixq.search.objectives.METRICS`: l2, sqnr, cosine,
      agreement, top1, function) and its target in the metric's units (the largest allowed
      value for l2, the smallest for sqnr, the largest allowed drop from the float model for
      the others); instead of l2_target / top1_drop.
    widen: when the all-wide plan misses the accuracy target, leave the most sensitive layers
      float and try that once before giving up (False: give up at once).
    confidence: a plan meets an accuracy target only when the one-sided `confidence` upper
      bound of its drop does (`mixq.search.bounds`: Student's t over per-sample drops; the
      flip risk of each sample's top-1 lead for agreement / top1; Clopper-Pearson for a
      function's pass/fail scores), so that the chosen plan meets the target on other data
      from the same source too, not only on the samples the search measured (0.5: the
      measured drop alone). Metrics without per-sample values (l2, sqnr, a function returning
      one number) take no margin.
    refine: after the strategy picks its point on a path, at most this many more evaluations
      try the weight-narrowing moves the path holds past the one that broke the target, one at
      a time in the path's order, each kept when the plan still meets it: the sensitivities
      that order the path are estimates, and a layer further along it may narrow where the
      next one could not (0: the strategy's point as it is).
    kept_weights: how every plan of the search stores the weights a numerics policy keeps off
      their integer or block grid (`QuantConfig.kept_weights`): 'half' (the default: in a
      16-bit float, measured with every plan like any other precision) or 'float' (float32,
      as they came).
    """

    base: QuantConfig
    candidates: tuple[Candidate, ...]
    op_types: frozenset[str] = ALL_OP_TYPES
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
    metric: str | None = None
    target: float | None = None
    widen: bool = True
    confidence: float = 0.9
    refine: int = 3
    kept_weights: str = "half"

    def __post_init__(self) -> None:
        from ..config import KEPT_WEIGHTS, _choice

        object.__setattr__(self, "kept_weights", _choice("kept_weights", self.kept_weights, KEPT_WEIGHTS))
        if not self.candidates:
            raise ConfigError("auto mixed precision needs at least one candidate precision, "
                              "e.g. candidates=(Candidate('int8', 'int8'),).")
        if self.strategy not in STRATEGIES:
            from ..errors import did_you_mean

            raise ConfigError(f"strategy={self.strategy!r}: choose one of {', '.join(STRATEGIES)}."
                              + did_you_mean(self.strategy, STRATEGIES))
        if self.metric is not None:
            from .objectives import METRICS

            if self.metric not in METRICS:
                from ..errors import did_you_mean

                raise ConfigError(f"metric={self.metric!r}: choose one of {', '.join(METRICS)}."
                                  + did_you_mean(self.metric, METRICS))
            if self.l2_target is not None or self.top1_drop is not None:
                raise ConfigError("give either metric and target, or l2_target / top1_drop, "
                                  "not both.")
        elif self.target is not None:
            raise ConfigError(f"target={self.target} needs a metric to apply to, e.g. "
                              "metric='l2' (or use l2_target / top1_drop).")
        if all(t is None for t in (self.l2_target, self.top1_drop, self.target, self.max_size_mb,
                                   self.max_avg_bits)):
            raise ConfigError("auto mixed precision needs a target: metric and target, "
                              "l2_target, top1_drop, max_size_mb or max_avg_bits.")
        if self.target is not None and not np.isfinite(self.target):
            raise ConfigError(f"target={self.target} must be a finite number.")
        for name in ("max_size_mb", "max_avg_bits", "time_budget_s"):
            v = getattr(self, name)
            if v is not None and not v > 0:
                raise ConfigError(f"{name}={v} must be positive.")
        if not 0.5 <= self.confidence < 1.0:
            raise ConfigError(f"confidence={self.confidence} must be in [0.5, 1), e.g. 0.9 (0.5: "
                              "the measured drop alone, no margin for sampling noise).")
        if isinstance(self.refine, bool) or not isinstance(self.refine, int) or self.refine < 0:
            raise ConfigError(f"refine={self.refine!r} must be a whole number of evaluations >= 0, "
                              "e.g. 3 (0: return the strategy's point as it is).")
        if not 0.0 <= self.size_tol < 1.0:
            raise ConfigError(f"size_tol={self.size_tol} must be in [0, 1), e.g. 0.02.")
        object.__setattr__(self, "op_types", frozenset(self.op_types))
        object.__setattr__(self, "candidates", tuple(self.candidates))
        if self.base.bias_correction:
            raise ConfigError("the base config has bias_correction=True: the search does not correct "
                              "biases (each plan would need its own float pass); drop the option.")
        if self.base.activation is not None and self.base.weight is not None:
            base = Candidate(get_format(self.base.activation).name, get_format(self.base.weight).name)
            for c in self.candidates:
                if c.is_float or _narrowness(c) >= _narrowness(base):
                    # such a candidate could never be chosen: the path only narrows
                    raise ConfigError(
                        f"candidate {c.label} is not narrower than the base {base.label}: give the "
                        "widest precision first (the base) and narrower ones after it; float is "
                        "tried on its own when the base misses the target.")


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
    message: str = ""  # whether the target was met, and if not why and what to try
    #: output-defining grids ending at the extremes of few calibration samples (`mixq.api._exposed`)
    exposed: tuple[str, ...] = ()
    widened_layers: list[str] = field(default_factory=list)  # left float after the all-wide miss
    #: how the widest plan after the all-wide one widened them ("left float", or "in a 16-bit
    #: float" where every candidate layer float is the float model itself, which proves nothing)
    widened_how: str = ""
    #: the refinement past the strategy's point (`AutoConfig.refine`): moves tried, moves kept,
    #: and the weight bytes the strategy's point had
    refine_tried: int = 0
    refine_kept: int = 0
    strategy_size_bytes: float = 0.0
    float_size_bytes: float = 0.0  # the float model's weight bytes
    baseline_evaluations: int = 0  # full-model runs spent on the report's baselines only
    wide_label: str = ""
    narrow_label: str = ""
    check_metric: float | None = None  # the chosen model on check_data (never searched on)
    check_met: bool | None = None
    #: how far the chosen plan's drop bound lies above its measured drop (AutoConfig.confidence)
    metric_margin: float = 0.0
    confidence: float = 0.5


def _materialize_feeds(data: Any, model: onnx.ModelProto) -> Feeds:
    from ..calibration.data import as_feeds

    return list(as_feeds(data, model))


def split_held_out(feeds: Feeds, model: onnx.ModelProto | None = None) -> tuple[Feeds, Feeds, str]:
    """Calibration / held-out split of one data set: the last quarter of the batches (or of the
    rows when there is a single batch, which a model with a static batch dim cannot take) is
    held out."""
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
    if model is not None:
        from ..calibration.data import input_specs_from_model

        fixed = [s.name for s in input_specs_from_model(model)
                 if s.shape and isinstance(s.shape[0], int) and s.shape[0] > 0]
        if fixed:
            raise DataError(f"auto mixed precision got a single batch, and input {fixed[0]!r} has "
                            "a fixed batch size, so it cannot be split into calibration and "
                            "held-out rows: pass several batches, or eval_data (--eval).")
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


def _scaled(fmt: str) -> bool:
    """Whether a format's grid takes parameters (a scale) chosen from statistics."""
    return get_format(fmt).needs_qparams


def _key(*parts: Any) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(json.dumps(p, sort_keys=True, default=str).encode())
        h.update(b"\0")
    return h.hexdigest()[:32]


def _assignment_config(base: QuantConfig, assignment: dict[str, Candidate],
                       idle: frozenset[str] = frozenset()) -> QuantConfig:
    """The config of an assignment: a layer rule per candidate precision, the layers left
    float (and `idle`: pass-through nodes left without a quantized consumer) excluded."""
    by: dict[Candidate, list[str]] = {}
    left_float: list[str] = sorted(idle)
    for node, c in assignment.items():
        if c.is_float:
            left_float.append(node)
        else:
            by.setdefault(c, []).append(node)
    rules = tuple(LayerRule(nodes=tuple(sorted(nodes)), activation=c.activation, weight=c.weight)
                  for c, nodes in sorted(by.items(), key=lambda kv: kv[0].label))
    opts: dict[str, Any] = {"layer_rules": tuple(base.layer_rules) + rules, "name": f"{base.name}+auto"}
    if left_float:
        opts["exclude_nodes"] = frozenset(base.exclude_nodes) | frozenset(left_float)
    return base.with_options(**opts)


class PassThroughs:
    """The pass-through nodes of a model (MaxPool, Reshape, Flatten, Transpose...: they move
    values without computing new ones) and whether each still has a consumer that quantizes.

    A pass-through node quantizes its input so that an integer consumer after it reads the same
    grid; once every consumer after it (through chains of pass-throughs) is left float, that
    quantization is a Q/DQ pair between float layers and nothing else. `idle` names the nodes
    a float assignment leaves in that state, so that the search excludes them with the layers
    (every candidate layer float is then the float model itself)."""

    def __init__(self, model: onnx.ModelProto, never: frozenset[str]) -> None:
        from ..plan.ops import semantics

        self.order: list[onnx.NodeProto] = list(model.graph.node)
        self.kind: dict[str, str] = {}  # node -> "pass" | "quantizes"
        for n in self.order:
            sem = semantics(n)
            if sem is not None and n.name not in never:
                self.kind[n.name] = "pass" if sem.passthrough else "quantizes"
        self.consumers: dict[str, list[str]] = {}
        for n in self.order:
            for i in n.input:
                if i:
                    self.consumers.setdefault(i, []).append(n.name)
        self.base = self._wanting(frozenset())

    def _wanting(self, left_float: frozenset[str]) -> set[str]:
        """The pass-through nodes with a quantizing consumer (transitively) under `left_float`."""
        wants: set[str] = set()
        for n in reversed(self.order):  # consumers come after their producers
            if self.kind.get(n.name) != "pass" or n.name in left_float:
                continue
            after = [c for o in n.output[:1] for c in self.consumers.get(o, [])]
            if any((self.kind.get(c) == "quantizes" and c not in left_float) or c in wants
                   for c in after):
                wants.add(n.name)
        return wants

    def idle(self, left_float: frozenset[str]) -> frozenset[str]:
        """The pass-through nodes that had a quantizing consumer in the all-wide plan and have
        none once `left_float` are float (the all-wide plan itself is unchanged)."""
        if not left_float:
            return frozenset()
        return frozenset(self.base - self._wanting(left_float))


def half_floats(wb: Workbench, layers: list[str]) -> dict[str, Candidate]:
    """The 16-bit float each widened layer takes: float16 (10 mantissa bits) when every tensor
    the node reads or writes has a calibrated (or constant) magnitude below `FP16_SAFE_ABSMAX`,
    else bfloat16 (float32's range: additive masks of -3.4e38, large sentinels)."""
    ix = wb.pipeline.index
    wanted = set(layers)
    nodes = {n.name: n for n in wb.model.graph.node if n.name in wanted}
    fp16, bf16 = Candidate("fp16", "fp16"), Candidate("bf16", "bf16")

    def fits(name: str) -> bool:
        if name in ix.initializers:
            m = float(np.max(np.abs(numpy_helper.to_array(ix.initializers[name])), initial=0.0))
        elif name in wb.pipeline.stats:
            m = wb.pipeline.stats[name].absmax
        else:
            return False  # a range nobody measured: bfloat16's range is the safe one
        return m < FP16_SAFE_ABSMAX

    return {layer: fp16 if all(fits(v) for v in [*nodes[layer].input, *nodes[layer].output] if v)
            else bf16 for layer in layers}


def _narrowness(c: Candidate) -> float:
    if c.is_float:
        return 64.0
    return get_format(c.activation).avg_bits + get_format(c.weight).avg_bits


def _err(table: SensitivityTable, layer: str, c: Candidate) -> float:
    """A layer's measured error at precision `c` (a layer left float adds none)."""
    if c.is_float:
        return 0.0
    # a layer widened to a 16-bit float (a path's start) was not measured: about float's error
    return table.err[layer].get(c.label, 0.0) if get_format(c.activation).kind == "float" \
        else table.err[layer][c.label]


#: how far (in noise power) the refinement distrusts the sensitivities' estimate of a move it
#: could try: a move is skipped when even 1/REFINE_SLACK of its estimated noise, on the scale
#: the measured break sets, would miss the target. On 30 random MLPs (bench/auto_refine_sweep.py,
#: refine=4) 16 found every one-step narrowing that still met the target for 27 evaluations more
#: than no refinement, 4 two thirds of those bytes for 8, no skipping the same bytes for 106
REFINE_SLACK = 16.0
#: the label of the refinement's trial paths: their points are tries, not widest plans
REFINED = "refined"


def _width(layer: str, c: Candidate, weightless: frozenset[str]) -> float:
    """How wide `layer` is at `c` (a layer without a weight: its activation format alone)."""
    if layer in weightless and not c.is_float:
        return get_format(c.activation).avg_bits
    return _narrowness(c)


def _weight_bits(layer: str, c: Candidate, weightless: frozenset[str]) -> float:
    """Bits per weight of `layer` at `c` (inf: left float; 0: no weight)."""
    return math.inf if c.is_float else 0.0 if layer in weightless else get_format(c.weight).avg_bits


def build_path(layers: list[str], base: Candidate, candidates: list[Candidate],
               table: SensitivityTable, start: dict[str, Candidate] | None = None,
               weightless: frozenset[str] = frozenset()) -> list[tuple[str, Candidate]]:
    """Moves (layer, candidate) in ascending estimated error, those that narrow a weight first;
    each narrows a layer further.
    `start`: layers that begin wider than `base` (left float by the widening); they may move to
    `base` and then to the candidates. `weightless`: layers without a weight, for which only
    the activation format counts (a move that changes only the weight format changes nothing)."""
    start = start or {}
    current = {layer: start.get(layer, base) for layer in layers}
    options = [base] + [c for c in candidates if c != base]
    moves = []
    for layer in layers:
        if layer not in table.err:
            continue
        for c in options:
            if _width(layer, c, weightless) < _width(layer, current[layer], weightless):
                # a move that narrows no weight (an activation only) saves no byte: after every
                # move that does, so that the first plan of each size is the widest of it
                same_size = _weight_bits(layer, c, weightless) >= _weight_bits(layer, current[layer], weightless)
                moves.append((same_size, _err(table, layer, c), -_narrowness(c), layer, c))
    moves.sort(key=lambda m: (m[0], m[1], m[2], m[3]))
    return _narrowing(((layer, c) for *_, layer, c in moves), current, weightless)


def _narrowing(moves: Iterable[tuple[str, Candidate]], current: dict[str, Candidate],
              weightless: frozenset[str]) -> list[tuple[str, Candidate]]:
    """The moves, in order, that narrow their layer further from `current` (updated as they do)."""
    path = []
    for layer, c in moves:
        if _width(layer, c, weightless) < _width(layer, current[layer], weightless):
            current[layer] = c
            path.append((layer, c))
    return path


def weightless_layers(model: onnx.ModelProto, layers: list[str]) -> frozenset[str]:
    """The candidate layers that read no weight (initializer) in their weight input."""
    from ..plan.ops import semantics

    inits = {t.name for t in model.graph.initializer}
    out = set()
    for n in model.graph.node:
        if n.name in layers:
            sem = semantics(n)
            w = None if sem is None else sem.weight
            if w is None or w >= len(n.input) or n.input[w] not in inits:
                out.add(n.name)
    return frozenset(out)


def path_noise(layers: list[str], base: Candidate, path: list[tuple[str, Candidate]],
               table: SensitivityTable, start: dict[str, Candidate] | None = None) -> list[float]:
    """s[k]: the estimated error power of P[k], the sum over layers of err^2 at the layer's
    current precision (the base's own error included; a re-narrowed layer counts once)."""
    start = start or {}
    current = {layer: _err(table, layer, start.get(layer, base)) for layer in layers
               if layer in table.err}
    s = [float(sum(v * v for v in current.values()))]
    for layer, c in path:
        e = _err(table, layer, c)
        s.append(s[-1] + e * e - current[layer] ** 2)
        current[layer] = e
    return s


def metric_model(objective: Objective, n_samples: int | None, classes: int | None) -> MetricModel | None:
    """How the objective's metric degrades with output noise (see `MetricModel`), None without an
    accuracy target. A top-1 in [0, 1] (or a top-1 agreement) is a fraction of flipped samples
    ('flip': its step is one sample when the number evaluated is known; it saturates at chance,
    1/classes, when the output's width tells the classes); SQNR is a relative L2 in dB ('power');
    1 - cosine grows with the noise power ('linear'); other units are unknown ('linear')."""
    chance = 1.0 / classes if classes and classes >= 2 else 0.0
    if isinstance(objective, L2Objective) and objective.target is not None:
        return MetricModel(degradation=lambda v: v, limit=objective.target, link="power")
    if isinstance(objective, SQNRObjective) and objective.min_db is not None:
        return MetricModel(degradation=lambda v: 10.0 ** (-v / 20.0),
                           limit=10.0 ** (-objective.min_db / 20.0), link="power")
    if isinstance(objective, AgreementObjective) and objective.max_drop is not None:
        return MetricModel(degradation=lambda v: 1.0 - v, limit=objective.max_drop, link="flip",
                           resolution=1.0 / n_samples if n_samples else None,
                           saturation=1.0 - chance if chance < 1.0 else 1.0)
    if isinstance(objective, DropObjective) and objective.max_drop is not None:
        ref_d = objective.float_value
        return MetricModel(degradation=lambda v: max(ref_d - v, 0.0), limit=objective.max_drop,
                           link="linear")
    if isinstance(objective, Top1Objective) and objective.max_drop is not None \
            and objective.float_value is not None:
        ref = float(objective.float_value)
        if objective.evaluate_function is not None and not objective.higher_is_better:
            return MetricModel(degradation=lambda v: max(v - ref, 0.0), limit=objective.max_drop,
                               link="linear")
        fraction = 0.0 <= ref <= 1.0
        return MetricModel(degradation=lambda v: ref - v, limit=objective.max_drop,
                           link="flip" if fraction else "linear",
                           resolution=1.0 / n_samples if fraction and n_samples else None,
                           saturation=ref - chance if fraction and ref > chance else 1.0)
    return None


@dataclass
class _Path:
    """One nested path of plans (P[0] = `start`, each next point one layer narrower) and the
    evaluations spent on it."""

    start: dict[str, Candidate]
    moves: list[tuple[str, Candidate]]
    assignments: list[dict[str, Candidate]]
    ev: Evaluator
    configs: dict[int, QuantConfig] = field(default_factory=dict)  # P[k]'s, see _Search.config
    plans: dict[int, PrecisionPlan] = field(default_factory=dict)
    keys: dict[int, str] = field(default_factory=dict)  # the evaluation cache's key of P[k]
    #: what the path is, for its points listed in the record when it is not the chosen one
    label: str = ""

    @property
    def n(self) -> int:
        return len(self.moves)


class _Search:
    """The shared state of one search: the workbench, the objective, the sensitivity table and
    the evaluation cache; builds paths and runs the strategies on them."""

    def __init__(self, wb: Workbench, auto: AutoConfig, objective: Objective, accuracy_target: bool,
                 layers: list[str], cands: list[Candidate], table: SensitivityTable,
                 ev_cache: dict[str, list[float]], deadline: float | None,
                 progress: Callable[[str, int, int], None] | None, rows: int | None,
                 calib: Feeds, executor: Any = None) -> None:
        self.wb, self.auto, self.objective, self.calib = wb, auto, objective, calib
        # candidate models evaluated on workers: only metrics computed from the outputs
        self.executor = (executor if executor is not None and executor.workers > 1
                         and objective.scores_outputs else None)
        self.accuracy_target = accuracy_target
        self.layers, self.cands, self.table = layers, cands, table
        self.ev_cache, self.deadline, self.progress, self.rows = ev_cache, deadline, progress, rows
        self.paths: list[_Path] = []
        self.weightless = weightless_layers(wb.model, layers)
        self.passthroughs = PassThroughs(wb.model, frozenset(wb.plan(auto.base).float_nodes))

    @property
    def count(self) -> int:
        """Full-model evaluations spent so far, on every path."""
        return sum(p.ev.count for p in self.paths)

    def _new_path(self, start: dict[str, Candidate], moves: list[tuple[str, Candidate]],
                  label: str) -> _Path:
        """A path from `start` through `moves`, with its evaluator, registered in `paths`."""
        assignments: list[dict[str, Candidate]] = [dict(start)]
        for layer, c in moves:
            a = dict(assignments[-1])
            a[layer] = c
            assignments.append(a)
        path = _Path(start, moves, assignments, Evaluator(lambda k: (0.0, False, 0.0), None),
                     label=label)
        ex = self.executor
        path.ev = Evaluator(lambda k: self._run_point(path, k), self.deadline,
                            batch=None if ex is None else (lambda ks: self._run_points(path, ks)),
                            width=1 if ex is None else ex.workers)
        self.paths.append(path)
        return path

    def make_path(self, start: dict[str, Candidate]) -> _Path:
        """The path from `start` (layers that begin float). A path from float layers ends where
        the last of them is back at the base: every later point is at least as narrow as the
        all-wide plan everywhere, so it is no better than that plan (which it starts from only
        when that plan missed the target)."""
        moves = build_path(self.layers, self.cands[0], self.cands[1:], self.table, start,
                           self.weightless)
        if start:
            floats = set(start)
            for i, (layer, _) in enumerate(moves):
                floats.discard(layer)
                if not floats:
                    moves = moves[:i + 1]
                    break
        label = ("all wide" if not start else "every candidate layer float"
                 if all(c.is_float for c in start.values()) else "every candidate layer in a 16-bit float")
        return self._new_path(start, moves, label)

    def widened_path(self, start: dict[str, Candidate], wide: _Path) -> _Path:
        """The path from `start` (layers wider than the base). When no layer is left at its
        start format at the end, the end is known: the same formats as the all-wide plan."""
        p = self.make_path(start)
        starts = set(start.values())
        if all(c not in starts for c in p.assignments[-1].values()):
            p.ev.seed(p.n, wide.ev(0))
        return p

    def guess(self, p: _Path) -> Callable[[int, int], int | None]:
        """The bisection's speculation on `p`: the last point of a bracket the cheap
        sensitivities predict to meet the target (see `strategies.predicted_break`)."""
        model = self.metric_model()
        x = noise_coordinates(path_noise(self.layers, self.cands[0], p.moves, self.table, p.start))
        return lambda lo, hi: predicted_break(x, model, p.ev, lo, hi)

    def metric_model(self) -> MetricModel | None:
        """How the objective degrades with output noise. Labels score the rows of the held-out
        outputs: one flipped row moves top-1 by 1/rows; a row's width is the number of classes."""
        outs = self.wb.float_outputs
        classes = int(np.prod(outs[0].shape[1:])) if outs and outs[0].ndim >= 2 else None
        return metric_model(self.objective, self.rows, classes)

    def _run_points(self, p: _Path, ks: list[int]) -> list[tuple[float, bool, float]]:
        """`_run_point` of several points, their models evaluated at once on the workers."""
        keys = {k: self.key(p, k) for k in ks}
        for k in ks:
            exact = self.exact(p, k) if keys[k] not in self.ev_cache else None
            if exact is not None:
                self.ev_cache[keys[k]] = [exact.value, exact.margin]
        todo = [k for k in ks if keys[k] not in self.ev_cache]
        if todo and self.executor is not None:
            cands = [(self.plan(p, k), self.config(p, k)) for k in todo]
            outs = plan_outputs(self.executor, self.wb.pipeline, cands, self.wb.eval_feeds,
                                self.wb.output_index,
                                weights=[self.wb.rounded_weights(c, pl) for pl, c in cands],
                                feeds_key=self.wb.eval_digest)
            for k, o in zip(todo, outs):
                m = self.objective.measure_outputs(self.wb, o)
                self.ev_cache[keys[k]] = [m.value, m.margin]
        out = []
        for k in ks:
            ok = self.accurate(p, k) and self.size_ok(p, k)
            out.append((self.metric(p, k), ok, self.size(p, k)))
        if self.progress:
            self.progress("evaluate", self.count + len(ks), self.count + len(ks))
        return out

    def config(self, p: _Path, k: int) -> QuantConfig:
        """The config of P[k], made when first asked for (a path has a point per layer; a
        search builds a handful)."""
        if k not in p.configs:
            a = p.assignments[k]
            p.configs[k] = _assignment_config(self.auto.base, a, self.passthroughs.idle(
                frozenset(layer for layer, c in a.items() if c.is_float)))
        return p.configs[k]

    def plan(self, p: _Path, k: int) -> PrecisionPlan:
        if k not in p.plans:
            p.plans[k] = self.wb.plan(self.config(p, k))
            # a mixed plan may calibrate a tensor no uniform plan does (a Conv output whose Relu
            # was left float): collect what is missing, once (nothing when nothing is)
            self.wb.pipeline.calibrate(p.plans[k], self.calib)
        return p.plans[k]

    def key(self, p: _Path, k: int) -> str:
        """The evaluation cache's key of P[k] (its plan's content), computed once."""
        if k not in p.keys:
            p.keys[k] = _key(self.plan(p, k).to_json())
        return p.keys[k]

    def size(self, p: _Path, k: int) -> float:
        return self.wb.size_bytes(self.plan(p, k))

    def size_ok(self, p: _Path, k: int) -> bool:
        auto = self.auto
        if auto.max_size_mb is not None and self.size(p, k) > auto.max_size_mb * 1e6:
            return False
        if auto.max_avg_bits is not None and self.wb.avg_weight_bits(self.plan(p, k)) > auto.max_avg_bits:
            return False
        return True

    def measured(self, p: _Path, k: int) -> Measured:
        """The objective's value of P[k] and its drop's margin (the evaluation cache first)."""
        pk = self.key(p, k)
        if pk not in self.ev_cache:
            got = self.exact(p, k)
            if got is None:
                m, _ = self.wb.materialize(self.config(p, k), self.plan(p, k))
                got = self.objective.measure(self.wb, m)
            self.ev_cache[pk] = [got.value, got.margin]
        value, margin = self.ev_cache[pk]
        return Measured(float(value), float(margin))

    def exact(self, p: _Path, k: int) -> Measured | None:
        """The float model's own value when P[k] quantizes nothing (None otherwise): the float
        model drops nothing, on this data or any other, so it takes no sampling margin and no
        run (a pass/fail metric could never tell that from a sample)."""
        if self.plan(p, k).formats():
            return None
        value = _float_metric(self.objective)
        return None if value is None else Measured(value)

    def metric(self, p: _Path, k: int) -> float:
        """The objective's value of P[k]."""
        return self.measured(p, k).value

    def accurate(self, p: _Path, k: int) -> bool:
        """Whether P[k] meets the accuracy target at the search's confidence (always, without
        an accuracy target)."""
        if not self.accuracy_target:
            return True
        m = self.measured(p, k)
        return self.objective.meets(m.value, m.margin)

    def _run_point(self, p: _Path, k: int) -> tuple[float, bool, float]:
        if self.executor is not None:  # on the workers too, its feeds split between them
            return self._run_points(p, [k])[0]
        metric = self.metric(p, k)
        if self.progress:
            self.progress("evaluate", self.count + 1, self.count + 1 + max(p.n - p.ev.count, 0))
        return metric, self.accurate(p, k) and self.size_ok(p, k), self.size(p, k)

    def levels(self, p: _Path) -> list[int]:
        """The points of `p` where the model size changes (P[0], then each point whose move
        changes a weighted layer's weight format), and the all-narrow end. Where no two
        candidates differ in their weights (activation-only candidates: int16/int8, int8/int8)
        every point is a level: narrower activations are all such a search can buy, and the
        widest plan would be its answer for any target the all-wide plan meets."""
        current = {layer: p.start.get(layer, self.cands[0]) for layer in self.layers}
        pts = [0]
        for k, (layer, c) in enumerate(p.moves, 1):
            if self._saves(layer, c, current[layer]):
                pts.append(k)
            current[layer] = c
        if pts[-1] != p.n:
            pts.append(p.n)
        return pts

    def bisection_view(self, p: _Path) -> tuple[PointView, Callable[[int, int], int | None] | None]:
        """What the bisection runs on: `p` seen through its `levels` (the first point of each
        model size: at equal weight bytes the widest plan, whose narrower activations would buy
        nothing the size counts and cost accuracy on data the search never saw), and the
        speculation's guess in that view (None without parallel workers)."""
        view = PointView(p.ev, self.levels(p))
        if p.ev.width <= 1:
            return view, None
        guess = self.guess(p)
        return view, lambda lo, hi: view.index_at_most(guess(view.points[lo], view.points[hi]))

    def first(self, p: _Path) -> Evaluation:
        """P[0] of `p`. On parallel workers the bisection evaluates, beside it, the all-narrow
        end it probes first (needed by the report too) or, when that is known, its first
        midpoint: one round instead of two, the same values."""
        ev = p.ev
        if ev.width > 1 and p.n and self.accuracy_target and self.auto.strategy == "bisection":
            view, guess = self.bisection_view(p)
            pts = [0] + ([] if p.n in ev.done else [p.n])
            if len(pts) < ev.width and guess is not None:
                last = len(view.points) - 1
                pts += [view.points[i] for i in speculate(0, last, ev.width - len(pts), view,
                                                          guess(0, last))]
            ev.prefetch(pts)
        return ev(0)

    def first_accurate(self, p: _Path) -> bool:
        """Evaluate P[0] of `p` (see `first`): whether it meets the accuracy target."""
        self.first(p)
        return self.accurate(p, 0)

    def run_strategy(self, p: _Path) -> int:
        """The strategy's chosen point on `p` (P[0] is known to meet an accuracy target)."""
        auto, n, ev = self.auto, p.n, p.ev
        has_budget = auto.max_size_mb is not None or auto.max_avg_bits is not None
        if not self.accuracy_target:
            chosen = next((k for k in range(n + 1) if self.size_ok(p, k)), n)
            ev(chosen)
            return chosen
        if auto.strategy == "greedy":
            return greedy(n, ev)
        if auto.strategy == "bisection":
            view, guess = self.bisection_view(p)
            return view.points[bisection(len(view.points) - 1, view, guess)]
        if auto.strategy == "guided":
            noise = path_noise(self.layers, self.cands[0], p.moves, self.table, p.start)
            return guided(n, ev, noise, [self.size(p, k) for k in range(n + 1)],
                          self.metric_model(), size_tol=auto.size_tol)
        return pareto(n, ev, size_ok=(lambda k: self.size_ok(p, k)) if has_budget else None,
                      accuracy_target=True)

    def _saves(self, layer: str, c: Candidate, now: Candidate) -> bool:
        """Whether moving `layer` from `now` to `c` narrows it and changes the model size: it
        changes a weighted layer's weight format, or (where no two candidates differ in their
        weights, see `levels`) narrows it at all."""
        if _width(layer, c, self.weightless) >= _width(layer, now, self.weightless):
            return False
        if len({x.weight for x in self.cands}) == 1:
            return True
        return layer not in self.weightless and c.weight != now.weight

    def refine(self, p: _Path, k: int) -> tuple[_Path, int, int]:
        """Past the strategy's point P[k]: try, one at a time in the path's order, the moves
        that narrow a weight beyond the next one (which broke the target), each on the plan so
        far and kept when it still meets the target, within `AutoConfig.refine` evaluations.
        Returns the path the plan lies on (the accepted moves first), its point, and how many
        moves were kept. A move is tried once; the time budget stops it like the strategies."""
        budget = self.auto.refine
        if budget <= 0 or not self.accuracy_target or k >= p.n:
            return p, k, 0
        now = dict(p.assignments[k])
        current = {layer: now.get(layer, self.cands[0]) for layer in self.layers}
        # the move that broke the target: the first one past k that changes the size
        nxt = next((i for i in range(k, p.n) if self._saves(*p.moves[i], current[p.moves[i][0]])), None)
        if nxt is None:
            return p, k, 0
        # (when the strategy never measured the point that move leads to, it is tried first)
        skipped = {p.moves[nxt][0]} if nxt + 1 in p.ev.done else set()
        model = self.metric_model()
        step = self._noise_step(model, p, k, nxt, current)
        kept = 0
        for i in range(nxt, p.n):
            if budget <= 0:
                break
            layer, c = p.moves[i]
            known = p.ev.done.get(k)
            if layer in skipped or not self._saves(layer, c, current[layer]) or (
                    known is not None and self._hopeless(model, step, known.metric, layer, c, current[layer])):
                continue
            rest = [(x, cx) for j, (x, cx) in enumerate(p.moves) if j >= k and j != i]
            trial = self._new_path(p.start, list(p.moves[:k]) + [(layer, c)]
                                   + _narrowing(rest, {**current, layer: c}, self.weightless), REFINED)
            for j in range(k + 1):  # the same plans as on `p`: known, not counted again
                if j in p.ev.done:
                    trial.ev.seed(j, p.ev.done[j])
            budget -= 1
            try:
                ok = trial.ev(k + 1).ok
            except OutOfTime:
                break
            if ok:
                p, k, kept = trial, k + 1, kept + 1
                current[layer] = c
            else:
                skipped.add(layer)  # its further moves narrow it more
        return p, k, kept

    def _noise_step(self, model: MetricModel | None, p: _Path, k: int, nxt: int,
                    current: dict[str, Candidate]) -> float | None:
        """The metric's noise power (`MetricModel.power`) per unit of the sensitivities'
        estimated error power, read off the measured break: P[k] and P[nxt + 1], which adds
        move `nxt` (None: no metric model, the break not measured, or no increase to read)."""
        broke = p.ev.done.get(nxt + 1)
        if model is None or broke is None or k not in p.ev.done:
            return None
        layer, c = p.moves[nxt]
        est = _err(self.table, layer, c) ** 2 - _err(self.table, layer, current[layer]) ** 2
        rise = model.power(model.degradation(broke.metric)) - model.power(model.degradation(p.ev.done[k].metric))
        step = rise / est if est > 0.0 else math.nan
        return step if math.isfinite(step) and step > 0.0 else None

    def _hopeless(self, model: MetricModel | None, step: float | None, metric: float, layer: str,
                  c: Candidate, now: Candidate) -> bool:
        """Whether moving `layer` from `now` to `c`, on a plan measuring `metric`, misses the
        target even were its estimated error REFINE_SLACK times too large in noise power, on the
        scale `step` the break set (False where that scale is unknown: the move is tried)."""
        if step is None or model is None:
            return False
        est = max(_err(self.table, layer, c) ** 2 - _err(self.table, layer, now) ** 2, 0.0)
        return model.power(model.degradation(metric)) + step * est / REFINE_SLACK > model.target_power()



def _objective_of(auto: AutoConfig, labels: np.ndarray | None,
                  evaluate_function: Callable[[str], Any] | None) -> tuple[Objective, bool]:
    """The objective the search aims at and whether it has an accuracy target."""
    uses_labels = auto.metric == "top1" or (auto.metric is None and auto.l2_target is None)
    if labels is not None and not uses_labels:
        raise ConfigError(f"labels were given, but the {auto.metric or 'l2'} metric does not "
                          "read them: use the top1 metric (top1_drop, --metric top1) or drop "
                          "the labels.")
    if auto.metric is not None:
        return make_objective(auto.metric, auto.target, labels=labels,
                              evaluate_function=evaluate_function,
                              confidence=auto.confidence), auto.target is not None
    if auto.l2_target is not None:
        if evaluate_function is not None:
            raise ConfigError("an EvaluateFunction was given with an L2 target, which does not "
                              "call it: give a top-1 target (top1_drop) or metric='function'.")
        return L2Objective(auto.l2_target), True
    if auto.top1_drop is not None or labels is not None or evaluate_function is not None:
        return (Top1Objective(auto.top1_drop, labels=labels, evaluate_function=evaluate_function,
                              confidence=auto.confidence), auto.top1_drop is not None)
    return L2Objective(None), False  # size budget alone: report L2, the budget decides


def auto_quantize(model: Any, auto: AutoConfig, calibration_data: Any, eval_data: Any = None, *,
                  labels: np.ndarray | None = None,
                  evaluate_function: Callable[[str], Any] | None = None,
                  output_path: str | os.PathLike | None = None,
                  report_dir: str | os.PathLike | None = None,
                  progress: Callable[[str, int, int], None] | None = None,
                  check_data: Any = None, executor: Any = None) -> AutoResult:
    """Run the search and return (and optionally write) the chosen model with its record.

    executor: a :class:`mixq.distributed.Executor` (local processes, Ray): the calibration
    shards, the per-layer sensitivities and the candidate models' evaluations run on its
    workers, and the bisection evaluates the next points it predicts it will probe at once.
    The decisions, the output model and its record are those of a one-process run; only the
    count of full-model evaluations (speculative ones included) and the wall time differ.

    check_data: data the search never looks at; the chosen model's metric on it is reported
    (`check_metric`, `check_met`), for the metrics that compare with the float model (l2, sqnr,
    cosine, agreement: labels and user functions carry their own data).

    The all-wide plan is evaluated first. When it misses an accuracy target, every candidate
    layer is left float and that plan is evaluated: when it meets the target the search runs on
    the path from it (the least sensitive layers narrowed first, so the most sensitive stay
    float); when it misses too, the search stops there (two full-model evaluations) and returns
    the better of the two with `target_met=False` and a `message` saying so. Where every
    candidate layer float is the float model itself (every quantized tensor belongs to a
    candidate layer, pass-throughs left without a quantized consumer included), that plan is
    not run: the widest quantized plan, every candidate layer in a 16-bit float, takes its
    place. The model is written to `output_path` whether or not the target was met."""
    t_start = time.perf_counter()
    in_model = None if isinstance(model, onnx.ModelProto) else model
    in_data = [d for d in (calibration_data, eval_data, check_data) if isinstance(d, (str, os.PathLike))]
    # where the results go is checked before the search: a bad path must not cost the search,
    # nor end in an error after the model is written
    if output_path is not None:
        check_output_path(output_path, models=[in_model], inputs=in_data, kind="output")
    if report_dir is not None:
        from ..report.auto_report import check_report_dir

        check_report_dir(Path(report_dir), models=[in_model], inputs=in_data, output=output_path)
    deadline = time.monotonic() + auto.time_budget_s if auto.time_budget_s else None
    timings: dict[str, float] = {}
    pipe = Pipeline.load(model, defer=False, equalize=auto.base.equalize, keep_nodes=auto.base.named_nodes())
    prepared = pipe.model
    cache = _Cache(auto.cache_dir)

    t = time.perf_counter()
    calib = _materialize_feeds(calibration_data, prepared)
    constant = constant_data(prepared, feed_extremes(calib, prepared))  # np.zeros as data
    note = ""
    if eval_data is None:
        calib, held, note = split_held_out(calib, prepared)
    else:
        held = _materialize_feeds(eval_data, prepared)
    base = auto.base
    cands = [Candidate(base.activation, base.weight)] + [c for c in auto.candidates]
    model_digest = hashlib.sha256(prepared.SerializeToString()).hexdigest()
    # statistics for every tensor any candidate may quantize: one pass, cached
    needed: set[str] = set()
    for c in cands:
        if c.is_float:
            continue
        cfg = base.with_options(activation=c.activation, weight=c.weight)
        # and the outputs a fused Relu/Clip hides: a mixed plan that leaves the activation in
        # another format calibrates them (in this pass, not in one pass per plan)
        for plan in (pipe.plan(cfg), pipe.plan(cfg.with_options(fuse_activations=False))):
            needed |= set(plan.calibrated_tensors(_scaled))
            # and the tensors that share another's parameters in a uniform plan (a MaxPool's or
            # Reshape's output): at a mixed plan's precision boundary they get their own
            needed |= {n for n, tp in plan.tensors.items()
                       if tp.role == "activation" and tp.format is not None and _scaled(tp.format)}
    stats_key = _key("stats", model_digest, sorted(needed), feeds_digest(calib))
    # GPTQ (weight_rounding 'auto' or 'gptq'): the layer inputs' second moments, measured in the
    # calibration pass where it runs here, in a float pass of their own where it does not
    tap = _gram_tap(prepared, pipe, base, cands)
    cached = cache.get(stats_key)
    if cached is not None:
        stats = {k: TensorStats.from_dict(v) for k, v in cached.items()}
    else:
        stats = {}
        if needed:
            from ..calibration.collect import collect_stats

            if executor is not None and executor.workers > 1:
                from ..calibration.sharded import calibrate_sharded

                stats = dict(calibrate_sharded(prepared, sorted(needed), calib, executor, tap=tap).stats)
            else:
                stats = dict(collect_stats(prepared, sorted(needed), calib, tap=tap).stats)
        cache.put(stats_key, {k: v.to_dict() for k, v in stats.items()})
    rounder = None
    if tap is not None:
        from ..passes.gptq import WeightRounder

        if not tap.complete:
            tap.run(prepared, calib)
        rounder = WeightRounder(prepared, tap, damp=base.gptq_damp, act_order=base.gptq_act_order)
        del tap
    # every plan of the search is measured, and replays, with the rounding it resolved to
    base = base.with_options(weight_rounding="gptq" if rounder else "nearest", kept_weights=auto.kept_weights)
    auto = replace(auto, base=base)
    timings["calibrate"] = time.perf_counter() - t

    t = time.perf_counter()
    pipe.stats.update(stats)
    from ..fidelity import count_samples

    pipe.calibration_rows = count_samples(calib)  # what the statistics saw (also when cached)
    wb = Workbench(pipe, held, output_index=auto.output_index, rounder=rounder)
    objective, accuracy_target = _objective_of(auto, labels, evaluate_function)
    if isinstance(objective, Top1Objective):
        objective.bind_float(wb)
    check_wb = None
    if check_data is not None:
        if isinstance(objective, Top1Objective):
            raise ConfigError("check data works with the metrics that compare with the float "
                              "model (l2, sqnr, cosine, agreement); top-1 labels and a user "
                              "function measure their own data: drop the check data.")
        check_wb = Workbench(pipe, _materialize_feeds(check_data, prepared),
                             output_index=auto.output_index, rounder=rounder)

    layers = candidate_layers(wb, base, auto.op_types)
    if not layers:
        raise ConfigError(f"no layer of op types {sorted(auto.op_types)} is quantized by the base "
                          "config: nothing to search over.")
    sens_key = _key("sens", model_digest, base.to_dict(), [c.label for c in cands], layers,
                    wb.eval_digest, stats_key, auto.max_sensitivity_rows)
    sc = cache.get(sens_key)
    if sc is not None:
        table = SensitivityTable.from_dict(sc)
    else:
        table = measure_sensitivity(wb, base, layers, cands, max_rows=auto.max_sensitivity_rows,
                                    progress=(lambda i: progress("sensitivity", i + 1, len(layers)))
                                    if progress else None, executor=executor)
        cache.put(sens_key, table.to_dict())
    timings["sensitivity"] = time.perf_counter() - t

    cacheable = evaluate_function is None
    ev_key_base = _key("eval/margin", sens_key, objective.describe(), None if labels is None else
                       hashlib.sha256(np.ascontiguousarray(labels).tobytes()).hexdigest(),
                       *([wb.parts] if wb.parts else []))  # L2 and SQNR read the quiet parts too
    ev_cache = (cache.get(ev_key_base) or {}) if cacheable else {}
    rows = (sum(o.shape[0] for o in wb.float_outputs if o.ndim)
            if evaluate_function is None and (labels is not None or auto.metric == "agreement")
            else None)
    search = _Search(wb, auto, objective, accuracy_target, layers, cands, table, ev_cache,
                     deadline, progress, rows, calib, executor)
    wide = search.make_path({})
    chosen_path, chosen = wide, 0
    refined = 0  # moves the refinement kept past the strategy's point
    strategy_point: tuple[_Path, int] | None = None  # the strategy's choice, before the refinement
    widened: list[str] = []
    unreachable = False
    t = time.perf_counter()
    timed_out = False
    try:
        # the accuracy alone decides whether to widen (a size budget is met by narrowing)
        if not accuracy_target or search.first_accurate(wide):
            chosen = search.run_strategy(wide)
            strategy_point = (wide, chosen)
            chosen_path, chosen, refined = search.refine(wide, chosen)
        else:
            if auto.widen:
                # the widest plan the search space has: every candidate layer float. Its path
                # first narrows the least sensitive layers back to the base, so the point the
                # strategy picks leaves float exactly the most sensitive ones it must
                widened = [layer for layer in layers if layer in table.err]
                wider = search.widened_path({layer: FLOAT for layer in widened}, wide)
                # every candidate layer float may be the float model itself (every quantized
                # tensor belongs to a candidate): it meets any target and says nothing about
                # quantized plans, so the widest quantized plan, every candidate layer in a
                # 16-bit float, decides whether the target can be met at all
                float_model = search.exact(wider, 0) is not None
                if not float_model:
                    wider.ev(0)  # not searched on: no speculation
                if float_model or search.accurate(wider, 0):
                    # the next wider format first: the same layers in a 16-bit float (half the
                    # bytes of float32), searched from when it meets the target too
                    half = search.widened_path(half_floats(wb, widened), wide)
                    if search.first_accurate(half):
                        chosen_path = half
                    elif not float_model:
                        chosen_path = wider
                    if chosen_path is not wide:
                        chosen = search.run_strategy(chosen_path)
                        strategy_point = (chosen_path, chosen)
                        chosen_path, chosen, refined = search.refine(chosen_path, chosen)
            if chosen_path is wide:  # even the widest plan misses: stop here
                unreachable = True
                tried = [(p, 0) for p in search.paths if 0 in p.ev.done]
                better = objective.better
                chosen_path, chosen = tried[0]
                for p, k in tried[1:]:
                    if better(p.ev.done[k].metric, chosen_path.ev.done[chosen].metric):
                        chosen_path, chosen = p, k
    except OutOfTime:
        timed_out = True
        chosen = chosen_path.ev.best_ok()
    n = chosen_path.n
    # a size budget the accuracy search overshot: move along the path until it fits
    if accuracy_target and not unreachable and not search.size_ok(chosen_path, chosen):
        chosen = next((k for k in range(chosen, n + 1) if search.size_ok(chosen_path, k)), n)
    timings["search"] = time.perf_counter() - t
    full_evaluations = search.count

    # the final model on the held-out data
    final_config = search.config(chosen_path, chosen)
    final_model, final_plan = wb.materialize(final_config, search.plan(chosen_path, chosen))
    _check_loads(final_model)
    final = chosen_path.ev.done.get(chosen)
    final_metric = final.metric if final is not None else search.metric(chosen_path, chosen)
    # the uniform baselines for the record (not search evaluations: counted apart; cached), none
    # when the search stopped early (out of time, or an unreachable target: stop at once)
    baselines: dict[int, float | None] = {}
    baseline_evals = 0
    for k in (0, wide.n):
        if k in wide.ev.done:
            baselines[k] = wide.ev.done[k].metric
        elif timed_out or unreachable:
            baselines[k] = None
        else:
            pk = search.key(wide, k)
            baseline_evals += pk not in ev_cache
            baselines[k] = search.metric(wide, k)
    if cacheable:
        cache.put(ev_key_base, ev_cache)
    met = search.accurate(chosen_path, chosen) and search.size_ok(chosen_path, chosen)
    final_margin = search.measured(chosen_path, chosen).margin
    # every point measured once: a seeded point (a plan measured on the other path) is listed there
    evaluations = sorted((e for k, e in chosen_path.ev.done.items() if k not in chosen_path.ev.seeded),
                         key=lambda e: e.k)
    for p in search.paths:
        if p is not chosen_path:
            evaluations += [replace(e, k=-1, label=f"{p.label}, point {e.k}")
                            for k, e in p.ev.done.items() if k not in p.ev.seeded]
    front_pts = front([e for e in evaluations if e.k >= 0], objective.higher_is_better)
    size_chosen = search.size(chosen_path, chosen)
    result = AutoResult(
        model=final_model, plan=final_plan, config=final_config,
        assignment={layer: c.label for layer, c in chosen_path.assignments[chosen].items()},
        sensitivity=table, path_labels=[(layer, c.label) for layer, c in chosen_path.moves],
        chosen_k=chosen, evaluations=evaluations, front=front_pts,
        objective=objective.describe(), metric_name=objective.name, metric=final_metric,
        float_metric=_float_metric(objective), target_met=met,
        size_bytes=size_chosen, wide_size_bytes=search.size(wide, 0),
        narrow_size_bytes=search.size(wide, wide.n),
        wide_metric=baselines[0], narrow_metric=baselines[wide.n],
        full_evaluations=full_evaluations, wall_seconds=0.0, timed_out=timed_out,
        held_out_note=note, timings=timings, widened_layers=widened,
        float_size_bytes=float(sum(pipe.weight_elems.values()) * 4.0),
        baseline_evaluations=baseline_evals,
        refine_tried=sum(p.ev.count for p in search.paths if p.label == REFINED), refine_kept=refined,
        strategy_size_bytes=size_chosen if strategy_point is None else search.size(*strategy_point),
        wide_label=cands[0].label, narrow_label=_narrowest_label(cands),
        metric_margin=final_margin, confidence=objective.confidence)
    if check_wb is not None:
        result.check_metric = objective.evaluate(check_wb, final_model)
        result.check_met = objective.meets(result.check_metric) if accuracy_target else None
    first = {id(p): p.ev.done[0].metric for p in search.paths if 0 in p.ev.done and p.label != REFINED}
    # the widest plans meet the measured target, their confidence bound does not
    noise_only = unreachable and any(objective.meets(v) for v in first.values())
    wide_first = first.get(id(wide))
    # the widest plan tried after the all-wide one: every candidate layer float, or (where that
    # is the float model itself) every candidate layer in a 16-bit float
    wider_path = next((p for p in search.paths if p is not wide and 0 in p.ev.done
                       and p.label != REFINED), None)
    result.widened_how = ("" if wider_path is None else
                          "in a 16-bit float" if any(not c.is_float for c in wider_path.start.values())
                          else "left float")
    result.message = _message(result, auto, unreachable, wide_first,
                              None if wider_path is None else wider_path.ev.done[0].metric,
                              noise_only=noise_only,
                              wide_bound_only=wide_first is not None and objective.meets(wide_first))
    from ..api import _exposed, exposure_note

    # the held-out data scored the plan; inputs past the calibrated extremes of its output grids
    # are clipped there, which a cosine or agreement target scales away (measured: a row whose
    # largest value was clipped from 9.1 to 5.0 kept cosine 0.9988)
    result.exposed = _exposed(pipe, final_plan, final_config)
    if result.exposed:
        result.message += " Note: " + exposure_note(
            final_plan, result.exposed, pipe.calibration_rows,
            "which the search, scoring the held-out data, need not see", final_config) + "."
    if constant is not None:  # every measurement above was made on it: first in the message
        result.message = f"WARNING: {constant} {result.message}"
    if output_path is not None:
        result.output_path = save_model(final_model, output_path, protect=in_model, inputs=in_data)
    result.wall_seconds = time.perf_counter() - t_start
    if report_dir is not None:
        from ..report.auto_report import write_report

        result.report_paths = write_report(result, Path(report_dir), models=[in_model], inputs=in_data)
    if not result.target_met or result.check_met is False:  # never silent, whoever called
        import warnings

        warnings.warn(result.message, TargetNotMetWarning, stacklevel=2)
    elif constant is not None:
        import warnings

        warnings.warn(result.message, ConstantDataWarning, stacklevel=2)
    return result


class TargetNotMetWarning(UserWarning):
    """auto_quantize returned a model that does not meet its target (see AutoResult.message)."""


def _gram_tap(prepared: onnx.ModelProto, pipe: Pipeline, base: QuantConfig,
              cands: list[Candidate]) -> Any:
    """The GramTap of the search's GPTQ rounding: the Conv / Gemm / MatMul weights the first
    candidate with integer weights puts on a grid (every candidate covers the same layers);
    None for `weight_rounding='nearest'` or where no candidate has integer weights."""
    from ..formats.integer import IntFormat
    from ..passes.gptq import GramTap

    if base.weight_rounding == "nearest":
        return None
    for c in cands:
        if not c.is_float and isinstance(get_format(c.weight), IntFormat):
            tap = GramTap(prepared, pipe.plan(base.with_options(activation=c.activation, weight=c.weight)))
            if tap.targets:
                return tap
    if base.weight_rounding == "gptq":
        raise ConfigError("weight_rounding='gptq' in the base config, but no candidate puts a "
                          "Conv/Gemm/MatMul weight on an integer grid: drop the option.")
    return None


def _float_metric(objective: Objective) -> float | None:
    """The float model's value of the metric (None where it is not measured)."""
    if isinstance(objective, L2Objective):
        return 0.0
    if isinstance(objective, SQNRObjective):
        return float("inf")
    return getattr(objective, "float_value", None)


def _narrowest_label(cands: list[Candidate]) -> str:
    """The label of the all-narrow end: each layer at its narrowest candidate."""
    return min(cands, key=_narrowness).label


def _check_loads(model: onnx.ModelProto) -> None:
    """The chosen model must load with onnxruntime's default optimizations (the search scores
    plans with the basic ones, which form no integer kernels): never hand back one that does not."""
    from ..evaluate import make_session

    try:
        make_session(model.SerializeToString())
    except Exception as exc:  # onnxruntime's own error type: say what failed and what to do
        from ..errors import ModelError

        raise ModelError("the chosen mixed-precision model does not load in onnxruntime with "
                         f"its default optimizations: {exc}. This is a mixq bug; please report "
                         "it with the model. Meanwhile --strategy or --candidates give "
                         "another plan.") from exc


def _message(r: AutoResult, auto: AutoConfig, unreachable: bool,
             wide_metric: float | None, wider_metric: float | None, noise_only: bool = False,
             wide_bound_only: bool = False) -> str:
    """One plain sentence or two on whether the target was met, and if not, why and what next.
    wide_metric / wider_metric: the all-wide plan's and the widened plan's measured values;
    noise_only: one of them met the target as measured, and missed it only by the margin for
    sampling noise; wide_bound_only: the all-wide plan did (so the search widened on the bound)."""
    margin = (f" (its drop's {r.confidence:.0%} upper bound lies {r.metric_margin:.3g} above "
              "the measured drop)" if r.metric_margin > 0 else "")
    got = (f"{r.metric_name} {r.metric:.6g} on the held-out data{margin}, "
           f"{r.size_bytes / 1e6:.4g} MB of weights")
    evals = f"{r.full_evaluations} full-model evaluation{'s' if r.full_evaluations != 1 else ''}"
    if unreachable and noise_only:
        # name the plan that met it as measured: the all-wide one, or only the widened one
        if wide_metric is not None and (wide_bound_only or wider_metric is None):
            which = f"The all-wide plan ({r.wide_label} everywhere) meets it as measured ({wide_metric:.6g})"
        elif wider_metric is not None:
            which = (f"Only with every candidate layer {r.widened_how or 'left float'} does the model meet "
                     f"it as measured ({wider_metric:.6g}"
                     + (f"; all wide: {wide_metric:.6g})" if wide_metric is not None else ")"))
        else:
            which = "The widest plan meets it as measured"
        return (f"target NOT met at {r.confidence:.0%} confidence: {r.objective}. {which}, but the held-out data "
                "is too small or too noisy to tell that it meets it on other data: the margin "
                f"for sampling noise exceeds what is left of the target. Stopped after {evals}; "
                f"returned the best plan found ({got}). Give more held-out data (--eval), or "
                "accept the measured drop alone (--confidence 0.5).")
    if unreachable:
        text = f"target NOT met, and it cannot be met with these candidates: {r.objective}."
        if wide_metric is not None:
            text += f" The all-wide plan ({r.wide_label} everywhere) gives {wide_metric:.6g}"
            if wider_metric is not None:
                text += (f"; even with all {len(r.widened_layers)} candidate layers "
                         f"{r.widened_how or 'left float'} it gives {wider_metric:.6g}")
            text += "."
        return (text + f" Stopped after {evals}; returned the best plan found ({got}). Loosen "
                "the target, widen the base (the first --candidates entry) or add op types "
                "(--op-types) so that more tensors can be made wider.")
    if r.timed_out:
        return (f"the time budget ran out after {evals}; returned the best plan found ({got}), "
                + ("which meets the target." if r.target_met else
                   f"which does NOT meet the target {r.objective}."))
    if not r.target_met:
        budget = []
        if auto.max_size_mb is not None:
            budget.append(f"{auto.max_size_mb} MB")
        if auto.max_avg_bits is not None:
            budget.append(f"{auto.max_avg_bits} average weight bits")
        return (f"target NOT met: {r.objective}" + (f" within {' and '.join(budget)}" if budget else "")
                + f"; the narrowest plan the candidates allow is {r.narrow_size_bytes / 1e6:.4g} MB. "
                f"Returned the best plan found ({got}) after {evals}. Allow a larger size or add "
                "narrower candidates (int4 weights, a block format).")
    msg = f"target met: {r.objective}: {got}, after {evals}."
    if r.check_met is False:
        msg = (f"target met on the search data but NOT on the check data: {r.objective}: {got}, "
               f"and {r.check_metric:.6g} on the check data, after {evals}. The held-out data "
               "the search decides on is too small or unlike the check data: give more of it "
               "(--eval), or a margin in the target.")
    elif r.check_met:
        msg += f" On the check data (never searched on): {r.check_metric:.6g}, also met."
    if r.refine_kept:
        msg += (f" Past the strategy's point ({r.strategy_size_bytes / 1e6:.4g} MB), "
                f"{r.refine_kept} of {r.refine_tried} further single-layer moves tried still met "
                "the target and were kept (AutoConfig.refine).")
    if r.widened_layers:
        wide_again = {r.wide_label} | {c.label for c in auto.candidates}
        kept = sorted(c for c in r.assignment.values() if c not in wide_again)
        counts = ", ".join(f"{kept.count(c)} {c}" for c in dict.fromkeys(kept))
        why = (f"{wide_metric:.6g}: it meets the target as measured, but not at "
               f"{r.confidence:.0%} confidence on this much data" if wide_bound_only
               else f"{wide_metric:.6g}")
        msg += (f" The all-wide plan missed it ({why}), so the search started from "
                f"every candidate layer widened (float, then a 16-bit float when that met it "
                f"too): the most sensitive stay wide ({counts or 'none'}).")
    return msg


def parse_candidates(text: str) -> list[Candidate]:
    """'int16/int8,int8,bfp16' -> candidates (the first one is the wide base in the CLI)."""
    items = [s for s in str(text).split(",") if s.strip()]
    if not items:
        raise ConfigError("--candidates needs at least one format, e.g. int16/int8,int8.")
    return [Candidate.parse(s) for s in items]


#: the preset whose options a base of these (activation, weight) formats takes by default, so
#: that the all-wide plan is that uniform preset (and the search never returns a plan larger
#: than a uniform preset that meets the target only because it calibrated differently)
BASE_PRESETS = {("int16", "int8"): "A16W8", ("int8", "int8"): "A8W8"}


def base_from_candidate(c: Candidate, preset: str | None = None) -> QuantConfig:
    """The wide base config: a preset's options with the candidate's formats. Without `preset`,
    the preset of exactly these formats (`BASE_PRESETS`), else symmetric activations with
    MinMax ranges."""
    preset = preset or BASE_PRESETS.get((c.activation, c.weight))
    cfg = get_default_config(preset) if preset else QuantConfig(activation_symmetric=True)
    return cfg.with_options(activation=c.activation, weight=c.weight, name=f"auto-base {c.label}")
