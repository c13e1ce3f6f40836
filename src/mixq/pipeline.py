"""One pipeline object: a model loaded and prepared once, with the stages every client runs.

`mixq.quantize`, the automatic mixed-precision search, the CLI, fast finetuning and the demo
all go through a `Pipeline`; none assembles load / prepare / plan / calibrate / parameters /
rewrite on its own. Statistics are collected once per tensor and kept, so a search that tries
many plans runs onnxruntime's calibration pass once.

    pipe = Pipeline.load("model.onnx")
    plan = pipe.plan(config)
    stats = pipe.calibrate(plan, data)
    model, report = pipe.rewrite(plan, pipe.qparams(plan, config), config)
"""
from __future__ import annotations

import os
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx
from onnx import numpy_helper

from ._io import has_external_data, load_deferred, load_model, load_model_deferred
from ._shards import in_worker
from .calibration.stats import TensorStats
from .calibration.variety import Extremes, InputExtremes, constant_data
from .config import QuantConfig
from .errors import ConfigError, DataError, ModelError, did_you_mean
from .formats import QParams, get_format
from .graph import GraphIndex, with_weights
from .passes.prepare import PrepareReport, prepare
from .passes.qdq import RewriteReport, apply_plan
from .plan.plan import PrecisionPlan, deployed_weight_bytes
from .plan.memo import StatsMemo
from .plan.ops import bounded_tensors, output_defining_tensors
from .plan.qparams import activation_qparams, constant_qparams
from .plan.rules import build_plan

if TYPE_CHECKING:
    from ._shards import Executor

__all__ = ["Pipeline", "ensure_node_names", "config_of_plan", "model_from_shared", "shared_form"]


def ensure_node_names(model: onnx.ModelProto) -> int:
    """Give every main-graph node a unique name (plans and layer rules refer to nodes by name);
    returns how many were named or renamed."""
    seen: set[str] = set()
    changed = 0
    for i, n in enumerate(model.graph.node):
        name = n.name or f"{n.op_type}_{i}"
        while name in seen:
            name = f"{name}_{i}"
        if name != n.name:
            n.name = name
            changed += 1
        seen.add(name)
    return changed


def config_of_plan(plan: PrecisionPlan, config: QuantConfig | None) -> QuantConfig:
    """The config a plan is replayed with: the one it carries. A different `config` given
    beside it is an error (the plan is authoritative); a plan without one (version 1) needs
    `config`."""
    if plan.config is None:
        if config is None:
            raise ConfigError("this plan does not carry the config that made it (an old plan "
                              "file): pass the preset or config it was made with.")
        return config
    # a plan written before range_headroom (output_headroom) existed was made without any:
    # replay it so
    carried = QuantConfig.from_dict({"range_headroom": 1.0, "output_headroom": 1.0, **plan.config})
    if config is not None and config.to_dict() != carried.to_dict():
        theirs, ours = carried.to_dict(), config.to_dict()
        diff = [k for k in ours if ours[k] != theirs.get(k)]
        raise ConfigError(f"the plan was made with config {carried.name!r}, and the config given "
                          f"beside it differs ({', '.join(diff[:4])}): a plan is replayed with "
                          "its own config. Drop --preset/--config (or the config argument), or "
                          "make a new plan with `mixq plan`.")
    return carried


@dataclass
class Pipeline:
    """A prepared model and what the stages need from it, built once.

    model: the prepared model (shapes inferred, nodes named, opset upgraded);
    base_dir: where its deferred initializers live (big models), None when loaded whole;
    source: the input file, when the model came from one;
    stats: calibration statistics collected so far, by tensor name.
    """

    model: onnx.ModelProto
    prepare_report: PrepareReport
    base_dir: Path | None = None
    source: Path | None = None
    stats: dict[str, TensorStats] = field(default_factory=dict)
    calib_skipped: dict[str, str] = field(default_factory=dict)
    #: the data inputs' extremes over the last calibration pass (mixq.calibration.variety)
    input_extremes: dict[str, Extremes] = field(default_factory=dict)
    calibration_rows: int = 0  # the samples the last calibration pass read (0: none ran)
    _index: GraphIndex | None = field(default=None, repr=False)
    _elems: dict[str, int] | None = field(default=None, repr=False)
    _bounds: dict[str, tuple[float, float]] | None = field(default=None, repr=False)
    _output_defining: set[str] | None = field(default=None, repr=False)
    # activation ranges chosen so far (see activation_qparams): a search builds many plans
    _ranges: StatsMemo = field(default_factory=StatsMemo, repr=False)
    # the last `shared_form` and the statistics it was made of (a search ships it every round)
    _shared: tuple[tuple[tuple[str, TensorStats], ...], Any] | None = field(default=None, repr=False)

    # -- construction ----------------------------------------------------------------------
    @classmethod
    def load(cls, model: onnx.ModelProto | str | os.PathLike | bytes, *,
             defer: bool = True, equalize: bool = True, keep_nodes: Collection[str] = ()) -> "Pipeline":
        """Load (a path: big weights stay in their external data file when `defer`) and prepare
        `model` (`equalize`: as QuantConfig.equalize; `keep_nodes`: the nodes a config names,
        `QuantConfig.named_nodes`, which no fold removes). A ModelProto given by the caller is
        copied, never changed."""
        base_dir = None
        source = Path(model) if isinstance(model, (str, os.PathLike)) else None
        if isinstance(model, (str, os.PathLike)) and defer:
            src, base_dir = load_model_deferred(model)
        else:
            src = load_model(model)
        if base_dir is None:
            unloaded = [t.name for t in src.graph.initializer if has_external_data(t)]
            if unloaded:
                raise ModelError(f"initializer {unloaded[0]!r} refers to external data that is not "
                                 f"loaded ({len(unloaded)} such initializers); pass the .onnx path, or "
                                 "load the model with its data (onnx.load(path) without "
                                 "load_external_data=False).")
        # a model mixq loaded itself is prepared in place: no copy of the weights
        owned = not isinstance(model, onnx.ModelProto)
        prepared, rep = prepare(src, copy=not owned, base_dir=base_dir, equalize=equalize, keep_nodes=keep_nodes)
        ensure_node_names(prepared)
        return cls(prepared, rep, base_dir=base_dir, source=source)

    @classmethod
    def of_prepared(cls, model: onnx.ModelProto,
                    stats: dict[str, TensorStats] | None = None) -> "Pipeline":
        """A pipeline over a model that is already prepared (a search's sub-model)."""
        return cls(model, PrepareReport(), stats=dict(stats or {}))

    def raise_if_source_fails(self, exc: ModelError | DataError, prefix: str) -> None:
        """When `exc` (an error whose message starts with `prefix`) says onnxruntime could not
        load mixq's prepared copy, or failed running it on the data, and the user's file does not
        load: raise that, naming the user's file, instead of an error about a copy the user
        never saw (or about the data: an opset-6 PRelu's slope, carried to opset 21 unchanged by
        onnx's converter, broadcast over the wrong axis there)."""
        why = self._source_load_error() if str(exc).startswith(prefix) else None
        if why:
            rep = self.prepare_report
            then = "" if isinstance(exc, ModelError) else (
                f"; mixq's prepared copy (opset {rep.opset_from} -> {rep.opset_to}) then failed on the "
                f"data: {exc}")
            raise ModelError(f"{self.source} does not load in onnxruntime as given, before mixq changes "
                             f"anything: {why}{then}. Check it with onnxruntime.InferenceSession and fix or "
                             "re-export it (for example at another opset).") from exc

    def _source_load_error(self) -> str | None:
        """Why onnxruntime refuses the input file itself (None: it loads, or there is none)."""
        if self.source is None:
            return None
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        so.log_severity_level = 3
        try:
            ort.InferenceSession(str(self.source), sess_options=so, providers=["CPUExecutionProvider"])
        except Exception as exc:  # noqa: BLE001 - onnxruntime raises its own exception types
            return str(exc)
        return None

    # -- views -----------------------------------------------------------------------------
    @property
    def index(self) -> GraphIndex:
        if self._index is None:
            self._index = GraphIndex.of(self.model)
        return self._index

    @property
    def bounds(self) -> dict[str, tuple[float, float]]:
        """Tensor -> the interval it lies in by construction (`plan.ops.bounded_tensors`)."""
        if self._bounds is None:
            inits = self.index.initializers  # prepare made Constant nodes initializers

            def constant(name: str) -> np.ndarray | None:
                t = inits.get(name)
                return None if t is None or has_external_data(t) else numpy_helper.to_array(t)

            self._bounds = bounded_tensors(self.model.graph.node, constant)
        return self._bounds

    @property
    def output_defining(self) -> set[str]:
        """Tensors whose range no method clips (`plan.ops.output_defining_tensors`)."""
        if self._output_defining is None:
            self._output_defining = output_defining_tensors(self.model.graph)
        return self._output_defining

    def invalidate(self) -> None:
        """Forget the views after the prepared model was changed (finetuned weights)."""
        self._index = None
        self._elems = None
        self._bounds = None
        self._output_defining = None
        self._shared = None

    @property
    def weight_elems(self) -> dict[str, int]:
        """Elements per initializer (from dims: no data read)."""
        if self._elems is None:
            self._elems = {t.name: int(np.prod(t.dims)) for t in self.model.graph.initializer}
        return self._elems

    def size_bytes(self, plan: PrecisionPlan) -> float:
        """Weight bytes a backend stores for `plan` (see `deployed_weight_bytes`)."""
        return deployed_weight_bytes(self.weight_elems, plan)

    # -- stages ----------------------------------------------------------------------------
    def plan(self, config: QuantConfig) -> PrecisionPlan:
        """The precision plan of `config` (pure: reads the graph only)."""
        return build_plan(self.model, config, index=self.index)

    def check_plan(self, plan: PrecisionPlan) -> None:
        """A replayed plan must name tensors of this model and formats mixq knows."""
        ix = self.index
        names = set(ix.types) | set(ix.producers) | set(ix.initializers) | set(ix.inputs)
        unknown = [t for t in plan.tensors if t not in names]
        if unknown:
            raise ConfigError(f"the plan names tensor {unknown[0]!r}, which the model does not have."
                              + did_you_mean(unknown[0], names))
        for f in plan.formats():
            get_format(f)

    def calibrate(self, plan: PrecisionPlan, data: Any, *,
                  progress: Callable[[int], None] | None = None,
                  executor: Executor | None = None, tap: Any = None,
                  kept: Any = None) -> dict[str, TensorStats]:
        """Statistics of every tensor `plan` calibrates, collected in one onnxruntime pass over
        `data` (tensors collected before are not collected again). With an `executor`
        (mixq.distributed) the data is cut into one shard per worker and the shards' statistics
        are merged: the same statistics, to the bit. `tap` (mixq.passes.gptq.GramTap) watches
        the same pass where one runs in this process, or makes its own over the feeds read for
        the shards (`tap.complete` then); `kept` (mixq.fidelity.HeldBack) keeps the pass's last
        samples, here or before the shards are sent. Where no pass fed them (no statistic was
        missing), one runs for them: both are `complete` after a call with data."""
        from .check import custom_op_problems

        needed = plan.calibrated_tensors(lambda f: get_format(f).needs_qparams)
        ranged: list[str] = []
        if data is not None:
            from .plan.numerics import cast_limit, phase_inputs, small_value_candidates

            # observed beside what the formats need: the casts' ranges (numerics policy g), the
            # Sin / Cos inputs whose range decides every format on their way (h), and the
            # block-format tensors (b) reads (a shared exponent rounds small values to 0)
            have = set(needed)
            for extra in (plan.calibrated_tensors(lambda f: cast_limit(f) is not None),
                          phase_inputs(plan, self.model), small_value_candidates(plan, self.model)):
                new = [n for n in extra if n not in have]
                ranged += new
                have.update(new)
        missing = [n for n in needed + ranged if n not in self.stats and n not in self.calib_skipped]
        if not missing:
            self._observe(data, (tap, kept), progress)
            return self.stats
        unknown_ops = {d: why for d, why in custom_op_problems(self.model).items()
                       if "custom op library" in why}
        if unknown_ops and not set(missing) - set(ranged):  # only the casts' range check: skip it, said
            self.calib_skipped["bf16/fp16 casts"] = (f"{len(missing)} activations not checked against the "
                                                     f"format's range: {next(iter(unknown_ops.values()))}")
            return self.stats
        if unknown_ops:
            raise ModelError(f"calibration runs the model in onnxruntime, but "
                             f"{next(iter(unknown_ops.values()))}. Replace the op with standard "
                             "ONNX ops (or a model-local function), or use a preset that needs "
                             "no calibration (BF16, FP16, block formats).")
        if data is None:
            raise ConfigError(f"the plan's formats need calibration data for {len(missing)} "
                              "activations; pass calibration_data (a data reader, feeds, a "
                              ".npz/.npy file or a folder).")
        from .calibration.collect import LOAD_FAILED, RUN_FAILED, collect_stats

        from .plan.numerics import channel_axes

        # the inputs' extremes, watched by the same pass (see constant_calibration); the graph
        # outputs' per-channel ranges, for numerics policy (j)
        extremes = InputExtremes(self.model)
        axes = {n: a for n, a in channel_axes(self.model).items() if n in missing}
        try:
            if executor is not None:
                from .calibration.sharded import calibrate_sharded

                res = calibrate_sharded(self.model, missing, data, executor, progress=progress,
                                        base_dir=self.base_dir, kept=(kept, extremes), tap=tap, axes=axes)
            else:
                res = collect_stats(self.model, missing, data, progress=progress, axes=axes,
                                    base_dir=self.base_dir, tap=(tap, kept, extremes))
        except ModelError as exc:
            self.raise_if_source_fails(exc, LOAD_FAILED)
            raise
        except DataError as exc:
            self.raise_if_source_fails(exc, RUN_FAILED)
            raise
        self.input_extremes, self.calibration_rows = extremes.extremes, extremes.rows
        self.stats.update(res.stats)
        self.calib_skipped.update(res.skipped)
        self._observe(data, (tap, kept), progress)  # those the shards' read did not feed
        return self.stats

    def nonfinite_inputs(self) -> dict[str, tuple[int, int, int]]:
        """Data inputs whose calibration values held inf or NaN: name -> (infinite, NaN, all
        values seen), over the last calibration pass."""
        return {n: (e.inf, e.nan, e.count) for n, e in self.input_extremes.items() if e.inf or e.nan}

    def constant_calibration(self) -> str | None:
        """Why the calibration data cannot stand for real inputs (mixq.calibration.variety): None
        when an input varied, or no calibration pass ran."""
        return constant_data(self.model, self.input_extremes)

    def _observe(self, data: Any, observers: tuple[Any, ...], progress: Callable[[int], None] | None) -> None:
        """One float pass over `data` for the calibration observers no pass has fed yet (no
        statistic was missing: weights only, block activations): GPTQ's grams and the guard's
        samples do not depend on whether statistics were collected."""
        todo = tuple(t for t in observers if t is not None and not t.complete)
        if todo and data is not None:
            from .calibration.collect import collect_stats

            collect_stats(self.model, [], data, progress=progress, base_dir=self.base_dir, tap=todo)

    def qparams(self, plan: PrecisionPlan, config: QuantConfig) -> dict[str, QParams]:
        """Activation parameters from the statistics, constant parameters from the weights
        (deferred weights read one at a time)."""
        out = self.activation_qparams(plan, config)
        out.update(self.constant_qparams(plan, config))
        return out

    def activation_qparams(self, plan: PrecisionPlan, config: QuantConfig) -> dict[str, QParams]:
        """The activations' parameters of `qparams` alone (the statistics only: no weight read)."""
        return activation_qparams(plan, self.stats, config, self._ranges, self.bounds, self.output_defining)

    def constant_qparams(self, plan: PrecisionPlan, config: QuantConfig) -> dict[str, QParams]:
        """The parameters of `qparams` that weights and constants get (no statistics read):
        constant_qparams, reading deferred weights one at a time: each is loaded into a
        one-tensor model that is dropped once its parameters are known, so the float weights
        are never all in memory (protobuf never gives back the memory of a cleared field)."""
        from dataclasses import replace

        inits = self.index.initializers
        deferred = [n for n, tp in plan.tensors.items()
                    if n in inits and has_external_data(inits[n]) and tp.role in ("weight", "constant")]
        if self.base_dir is None or not deferred:
            return constant_qparams(self.model, plan, config)
        skip = set(deferred)
        out = constant_qparams(self.model, replace(plan, tensors={
            n: tp for n, tp in plan.tensors.items() if n not in skip}), config)
        for name in deferred:
            one = onnx.ModelProto()
            one.graph.initializer.add().CopyFrom(inits[name])  # no data yet: a small copy
            load_deferred(one, self.base_dir)
            out.update(constant_qparams(one, replace(plan, tensors={name: plan.tensors[name]}), config))
            del one
        return {n: out[n] for n in plan.tensors if n in out}  # constant_qparams' (plan) order

    def rewrite(self, plan: PrecisionPlan, qparams: dict[str, QParams], config: QuantConfig, *,
                model: onnx.ModelProto | None = None, copy: bool = True
                ) -> tuple[onnx.ModelProto, RewriteReport]:
        """The quantized model (`model`: another version of the prepared model, e.g. with
        finetuned weights). `copy=False` rewrites the prepared model itself (the pipeline is
        spent afterwards: what keeps a > 2 GB model within memory)."""
        m = self.model if model is None else model
        out, rep = apply_plan(m, plan, qparams, dual=config.dual_quant_nodes, copy=copy,
                              base_dir=self.base_dir)
        if not copy and m is self.model:
            self.invalidate()
        return out, rep

    def materialize(self, config: QuantConfig, plan: PrecisionPlan | None = None
                    ) -> tuple[onnx.ModelProto, PrecisionPlan]:
        """The quantized model of `config` (or of a plan made from it) from the statistics
        collected so far; the prepared model is left as it is."""
        plan = plan or self.plan(config)
        model, _ = self.rewrite(plan, self.qparams(plan, config), config)
        return model, plan


def shared_form(pipe: Pipeline) -> tuple[tuple[bytes, dict[str, dict[str, Any]], str | None], str]:
    """What a worker needs to rebuild `pipe` (`model_from_shared`): (prepared model bytes,
    statistics as plain data, external-data directory), and its content digest, the key under
    which a worker keeps the pipeline it parsed."""
    from ._shards import digest

    # the model changes only with `invalidate`; statistics are added, never changed in place
    # (the cache holds the objects it was made of: their identity stands for their values)
    seen = tuple(pipe.stats.items())
    if pipe._shared is not None and len(pipe._shared[0]) == len(seen) and all(
            a == c and b is d for (a, b), (c, d) in zip(pipe._shared[0], seen)):
        return pipe._shared[1]
    part = (pipe.model.SerializeToString(), {n: s.to_dict() for n, s in pipe.stats.items()},
            None if pipe.base_dir is None else str(pipe.base_dir))
    out = (part, digest(part)[0])
    pipe._shared = (seen, out)
    return out


# the pipeline a worker built last, by the digest of (model, statistics): a search's rounds
# evaluate many plans of one calibrated model
_WORKER_PIPE: tuple[str, Any] | None = None


def model_from_shared(shared: tuple[bytes, dict[str, dict[str, Any]], str | None], plan_json: str,
                      config: dict[str, Any], key: str | None = None,
                      weights: dict[str, np.ndarray] | None = None) -> onnx.ModelProto:
    """The quantized model of (plan, config) rebuilt on a worker from the shipped prepared
    model and statistics: the same bytes as the driver's. `key`: the digest of `shared`, under
    which the parsed pipeline is kept for the next task; `weights`: float weights that replace
    the prepared model's (GPTQ-rounded ones, computed by the driver)."""
    global _WORKER_PIPE
    if key is not None and _WORKER_PIPE is not None and _WORKER_PIPE[0] == key:
        pipe = _WORKER_PIPE[1]
    else:
        model_bytes, stats, base_dir = shared
        _WORKER_PIPE = None
        pipe = Pipeline(onnx.load_from_string(model_bytes), PrepareReport(),
                        base_dir=None if base_dir is None else Path(base_dir),
                        stats={n: TensorStats.from_dict(d) for n, d in stats.items()})
        if key is not None and in_worker():
            _WORKER_PIPE = (key, pipe)
    plan, cfg = PrecisionPlan.from_json(plan_json), QuantConfig.from_dict(config)
    if weights:
        return pipe.rewrite(plan, pipe.qparams(plan, cfg), cfg, model=with_weights(pipe.model, weights),
                            copy=False)[0]
    return pipe.rewrite(plan, pipe.qparams(plan, cfg), cfg)[0]
