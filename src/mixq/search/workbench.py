"""The workbench of a search: the model prepared once, statistics collected once, float outputs on
the held-out data computed once; any config can then be materialized in a fraction of a second.

Calibration statistics do not depend on the format (they are exact histograms), so one
onnxruntime pass serves every candidate plan; weights are always re-quantized from the float
weights of the prepared model, never from already quantized values.
"""
from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from .._shards import Executor, Shared, in_worker, shard_bounds, shared_value
from ..config import QuantConfig
from ..errors import ConfigError
from ..graph import with_weights
from ..pipeline import Pipeline, model_from_shared, shared_form
from ..plan.memo import StatsMemo
from ..plan.numerics import apply_numerics, nonfinite_initializers
from ..plan.plan import PrecisionPlan

Feeds = list[dict[str, np.ndarray]]


def feeds_digest(feeds: Feeds) -> str:
    """Content hash of a list of feed dicts (names, dtypes, shapes and bytes)."""
    h = hashlib.sha256()
    for f in feeds:
        for k in sorted(f):
            a = np.ascontiguousarray(f[k])
            h.update(k.encode())
            h.update(str(a.dtype).encode())
            h.update(str(a.shape).encode())
            h.update(a.tobytes())
    return h.hexdigest()


def run_output(model: onnx.ModelProto, feeds: Feeds, index: int, threads: int | None = None
               ) -> list[np.ndarray]:
    """Output `index` of `model` on every feed, with the QDQ semantics the search decides on
    (basic optimizations: constants folded, no integer fusions, as the sensitivities)."""
    from ..evaluate import make_session

    sess = make_session(model, optimize="basic", threads=threads)
    name = sess.get_outputs()[index].name
    return [sess.run([name], f)[0] for f in feeds]


def relative_l2(pairs, parts: Sequence[tuple[int, tuple[int, ...]]] = ()) -> float:
    """sqrt(sum (q - f)^2 / sum f^2) over (quantized, float) array pairs; a pair of different
    shapes (a detector's box count changed) counts as unrelated: sum q^2 + sum f^2. With
    `parts` ((axis, channels) of the float output's quiet parts, `quiet_parts`): the largest
    of the whole output's and each part's own relative L2, as the guard judges an output."""
    pairs = list(pairs)
    num = den = 0.0
    for q, f in pairs:
        f64, q64 = np.asarray(f, dtype=np.float64), np.asarray(q, dtype=np.float64)
        num += float(np.sum((q64 - f64) ** 2)) if q64.shape == f64.shape else \
            float(np.sum(q64 ** 2) + np.sum(f64 ** 2))
        den += float(np.sum(f64 ** 2))
    whole = float(np.sqrt(num / den)) if den > 0 else float(np.sqrt(num))
    worst = whole
    for axis, channels in parts:
        sub = [(np.take(np.asarray(q), channels, axis=axis), np.take(np.asarray(f), channels, axis=axis))
               for q, f in pairs if np.asarray(q).shape == np.asarray(f).shape and np.asarray(f).ndim > axis]
        if sub:
            worst = max(worst, relative_l2(sub))
    return worst


def quiet_parts(model: onnx.ModelProto, index: int, outputs: Sequence[np.ndarray]
                ) -> list[tuple[int, tuple[int, ...]]]:
    """The quiet parts (`mixq.evaluate.quiet_part`) of output `index`'s float values: channels
    along an axis whose rms lies PART_GAP times below the rest (a detector's scores beside its
    boxes; a regression head's (N, 4) whose first column is 80x the others), which a relative
    L2 of the whole output does not see. None for probabilities (written by a Softmax), which
    the guard judges by agreement, not by parts; logits and other rank-2 outputs are read as
    the guard reads them (`mixq.fidelity.is_broken`)."""
    from ..evaluate import ErrorStats, class_score_outputs

    name = model.graph.output[index].name if index < len(model.graph.output) else None
    if not outputs or name is None or name in class_score_outputs(model) or \
            any(np.asarray(o).ndim < 2 for o in outputs):
        return []
    acc = ErrorStats(classifier=False)
    for f in outputs:
        acc.update(f, f)
    return [(p.axis, p.channels) for p in acc.quiet_parts()]


@dataclass
class Workbench:
    """A pipeline (the prepared float model and its statistics) with the held-out data and
    float outputs a search measures plans on."""

    pipeline: Pipeline
    eval_feeds: Feeds
    output_index: int = 0
    float_outputs: list[np.ndarray] = field(default_factory=list)
    #: `feeds_digest` of the held-out feeds (computed once: they go to the workers every round)
    eval_digest: str = field(default="", init=False)
    #: the model's weights holding +-inf / NaN, read once for every plan of the search
    nonfinite: dict[str, tuple[int, int]] = field(default_factory=dict)
    #: GPTQ rounding of the integer weights (mixq.passes.gptq.WeightRounder), applied to every
    #: plan whose config does not ask for nearest rounding; None: nearest everywhere
    rounder: Any = None
    #: what each tensor's statistics alone decide in the numerics policies, across the plans
    _numerics: StatsMemo = field(default_factory=StatsMemo, init=False, repr=False)
    #: the output's quiet parts (`quiet_parts`), which `relative_l2` measures beside the whole
    parts: list[tuple[int, tuple[int, ...]]] = field(default_factory=list, init=False)

    def __post_init__(self) -> None:
        from ..evaluate import decision_outputs, make_session

        if not self.float_outputs:
            sess = make_session(self.model)
            outs = sess.get_outputs()
            out = outs[self.output_index]
            decisions = decision_outputs(self.model)  # indices, counts, masks: no error to measure
            if out.name in decisions:
                scored = [f"{k} ({o.name!r})" for k, o in enumerate(outs) if o.name not in decisions]
                raise ConfigError(
                    f"output {self.output_index} ({out.name!r}) holds {out.type}: the search's metrics "
                    "measure how far a float output moves, and this one holds decisions (indices, "
                    "counts, a mask). Choose a float output with --output-index / output_index: "
                    f"{', '.join(scored) or 'the model has none'}.")
            self.float_outputs = [sess.run([out.name], f)[0] for f in self.eval_feeds]
        self.eval_digest = feeds_digest(self.eval_feeds)
        self.nonfinite = nonfinite_initializers(self.model)
        self.parts = quiet_parts(self.model, self.output_index, self.float_outputs)

    @property
    def model(self) -> onnx.ModelProto:
        return self.pipeline.model

    # -- plans -------------------------------------------------------------------------------
    def plan(self, config: QuantConfig) -> PrecisionPlan:
        """`config`'s plan with the numerics policies applied, as `quantize` applies them: the
        tensors no grid suits (a -inf or -3.4e38 mask, a Log's input...) are float at every
        point, so the search spends no evaluation finding them."""
        plan, _ = apply_numerics(self.pipeline.plan(config), self.model, self.pipeline.stats,
                                 enabled=config.numerics_policies, nonfinite=self.nonfinite,
                                 memo=self._numerics, kept_weights=config.kept_weights)
        return plan

    def materialize(self, config: QuantConfig, plan: PrecisionPlan | None = None
                    ) -> tuple[onnx.ModelProto, PrecisionPlan]:
        """The quantized model of `config` (or of a given plan made from it), its integer
        weights rounded by the workbench's `rounder` where it has one."""
        plan = plan or self.pipeline.plan(config)
        qparams = self.pipeline.qparams(plan, config)
        weights = self.rounded_weights(config, plan, qparams)
        source = with_weights(self.model, weights) if weights else None
        return self.pipeline.rewrite(plan, qparams, config, model=source, copy=source is None)[0], plan

    def rounded_weights(self, config: QuantConfig, plan: PrecisionPlan,
                        qparams: dict[str, Any] | None = None) -> dict[str, np.ndarray]:
        """The GPTQ-rounded float weights `materialize` puts into `plan`'s model (none for
        nearest rounding)."""
        if not self.rounder or config.weight_rounding == "nearest":
            return {}
        # the weights' parameters only: no activation range is chosen for them
        return self.rounder.weights(plan, qparams if qparams is not None
                                    else self.pipeline.constant_qparams(plan, config))

    def size_bytes(self, plan: PrecisionPlan) -> float:
        """Deployed weight bytes of a plan (see `deployed_weight_bytes`)."""
        return self.pipeline.size_bytes(plan)

    def avg_weight_bits(self, plan: PrecisionPlan) -> float:
        n = sum(self.pipeline.weight_elems.values()) or 1
        return 8.0 * self.size_bytes(plan) / n

    # -- metrics -------------------------------------------------------------------------------
    def outputs(self, model: onnx.ModelProto) -> list[np.ndarray]:
        return run_output(model, self.eval_feeds, self.output_index)

    def relative_l2(self, outputs: list[np.ndarray]) -> float:
        """Relative L2 of `outputs` to the float outputs over the held-out data (the worst of
        the whole output's and its quiet parts')."""
        return relative_l2(zip(outputs, self.float_outputs), self.parts)

    def top1_agree_rows(self, outputs: list[np.ndarray]) -> np.ndarray:
        """1.0 for each output row whose top-1 class is the float model's, else 0.0."""
        agree = [np.argmax(q.reshape(q.shape[0], -1), 1) == np.argmax(f.reshape(f.shape[0], -1), 1)
                 if q.shape == f.shape else np.zeros(f.shape[0] if f.ndim else 1, dtype=bool)
                 for q, f in zip(outputs, self.float_outputs)]
        return np.concatenate(agree).astype(np.float64) if agree else np.zeros(0)

    def weight_array(self, name: str) -> np.ndarray:
        t = next(t for t in self.model.graph.initializer if t.name == name)
        return numpy_helper.to_array(t)


# -- on an executor's workers (see auto's speculative bisection) ---------------------------------
#: what every `_outputs_task` of one call shares: `shared_form`'s model part and key, the
#: evaluation feeds, the output's index
_OutputsShared = tuple[tuple[bytes, dict[str, dict[str, Any]], str | None], str, list[dict[str, np.ndarray]], int]


def _outputs_task(shared: _OutputsShared | Shared,
                  item: tuple[str, dict[str, Any], dict[str, np.ndarray], int, int]) -> list[np.ndarray]:
    """Task: output `index` of one candidate (plan JSON, config dict, rounded weights) on the
    evaluation feeds ``[lo, hi)``, computed as `Workbench.outputs` computes it."""
    model_part, key, feeds, index = shared_value(shared)
    plan_json, config, weights, lo, hi = item
    # one thread per worker: the workers share the cores (onnxruntime computes each output
    # element the same way whatever its thread count)
    return run_output(model_from_shared(model_part, plan_json, config, key, weights), feeds[lo:hi],
                      index, threads=1 if in_worker() else None)


def plan_outputs(executor: Executor, pipe: Any, candidates: Sequence[tuple[Any, Any]],
                 feeds: list[dict[str, np.ndarray]], output_index: int,
                 weights: Sequence[dict[str, np.ndarray]] | None = None,
                 feeds_key: str | None = None) -> list[list[np.ndarray]]:
    """Output `output_index` on every feed of each ``(PrecisionPlan, QuantConfig)``: the same
    arrays as ``Workbench.outputs`` of the materialized model (the model is rebuilt on the
    worker from the same prepared model and statistics, byte for byte; `weights`: per
    candidate, the rounded weights ``Workbench.rounded_weights`` gives, which the driver
    computes and ships with the task). Fewer candidates than workers: each candidate's feeds
    are cut into contiguous shards, a task each, so that no worker idles. The prepared model,
    statistics and feeds are shared (sent once, reused while unchanged; `feeds_key`: the feeds'
    `feeds_digest` where the caller keeps it)."""
    if not candidates:
        return []
    model_part, key = shared_form(pipe)
    token = hashlib.sha256(f"outputs {key} {feeds_key or feeds_digest(feeds)} {output_index}".encode()).hexdigest()
    per = list(weights) if weights is not None else [{} for _ in candidates]
    bounds = shard_bounds(len(feeds), -(-executor.workers // len(candidates))) if feeds else [(0, 0)]
    items = [(plan.to_json(), cfg.to_dict(), w, lo, hi)
             for (plan, cfg), w in zip(candidates, per) for lo, hi in bounds]
    parts = executor.map(_outputs_task, items, Shared((model_part, key, feeds, output_index), token))
    k = len(bounds)
    return [[o for part in parts[c * k:(c + 1) * k] for o in part] for c in range(len(candidates))]
