"""Per-layer reconstruction after calibration: AdaRound and AdaQuant.

For every quantized Conv / ConvTranspose / Gemm / MatMul whose weight is an initializer, in
topological order:

1. inputs: the layer's input as the *partially finetuned quantized* model produces it. The QDQ
   model is built with `apply_plan` from the model with the weights finetuned so far and run in
   onnxruntime (optimizations off, exact QDQ semantics) with the tensor the layer reads (its input
   QDQ output) exposed as an output; targets: the layer's output in the float model. Both stream
   over the calibration data; at most `max_samples` / `max_cache_mb` of them are kept (a seeded
   reservoir sample of the batch rows).
2. the layer is re-implemented in torch (`layers.LayerSpec`), its weight fake-quantized by
   `fakequant.TorchQuantizer` (bit-exact with the NumPy reference) with the plan's qparams, the
   int32 bias quantization mirrored when the plan has it;
3. AdaRound learns the rounding of integer weights, AdaQuant the continuous weight (and bias)
   under a straight-through estimator, on the cached rows less a seeded held-out share; the
   deployable result is evaluated on the held-out rows (early stopping too) and kept only when
   it beats the plain quantized layer there. A layer with few rows learns its calibration
   samples rather than the layer: judged on the rows it was fit on, its gain does not carry to
   new inputs (a 64-input MatMul fit on 9 rows: +6.7 dB there, -0.9 dB on fresh samples).

`finetune` returns the adjusted float weights (and biases); the normal rewrite quantizes them
with the same qparams. AdaRound weights are exactly on the integer grid, so the rewrite
reproduces the learned codes.
"""
from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from ..calibration.data import FeedSource, input_specs_from_model
from ..errors import ConfigError, DataError, ModelError, did_you_mean
from ..evaluate import onnxruntime_max_ir_version, seed_random_ops
from ..formats import QParams, get_format
from ..plan.plan import PrecisionPlan
from .config import AdaQuantConfig, AdaRoundConfig, EarlyStop, held_out_rows
from .layers import LayerSpec
from .report import FinetuneReport, LayerReport, ModelMetric

_INT32_MAX = 2**31 - 1
#: rectified sigmoid stretch of AdaRound (Nagel et al. 2020)
_GAMMA, _ZETA = -0.1, 1.1
#: rows per forward when evaluating a layer on its held-out samples
_EVAL_CHUNK = 256


@dataclass
class _Layer:
    node: onnx.NodeProto
    spec: LayerSpec
    weight: str
    bias: str | None
    weight_format: str
    weight_qparams: QParams | None
    block_axis: int | None
    bias_scale: np.ndarray | None  # int32 bias: input scale x weight scale (per output channel)


# ------------------------------------------------------------------------------------- helpers
def clear_gain(before: np.ndarray, after: np.ndarray) -> bool:
    """Whether the per-row losses `after` beat `before` by more than twice the standard error of
    the rows' gains: a gain within the spread of a few held-out rows is not one."""
    d = before - after
    if d.size < 2:
        return bool(d.sum() > 0)
    return bool(d.mean() > 2.0 * d.std(ddof=1) / np.sqrt(d.size))


def with_weights(model: onnx.ModelProto, weights: dict[str, np.ndarray]) -> onnx.ModelProto:
    """A copy of `model` with the initializers named in `weights` replaced (same dtype/shape)."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    if not weights:
        return m
    inits = {t.name: t for t in m.graph.initializer}
    for name, arr in weights.items():
        if name not in inits:
            raise ModelError(f"finetuned weight {name!r} is not an initializer of the model")
        old = inits[name]
        arr = np.asarray(arr, dtype=numpy_helper.to_array(old).dtype)
        inits[name].CopyFrom(numpy_helper.from_array(arr.reshape(tuple(old.dims)), name))
    return m


def _session(model: onnx.ModelProto, outputs: list[str], threads: int | None) -> Any:
    import onnxruntime as ort

    m = onnx.ModelProto()
    m.CopyFrom(model)
    have = {o.name for o in m.graph.output}
    for name in outputs:
        if name not in have:
            m.graph.output.append(onnx.ValueInfoProto(name=name))
            have.add(name)
    m.ir_version = min(m.ir_version, onnxruntime_max_ir_version())
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 3
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if threads:
        so.intra_op_num_threads = threads
    try:
        return ort.InferenceSession(seed_random_ops(m).SerializeToString(), so, providers=["CPUExecutionProvider"])
    except Exception as exc:  # noqa: BLE001 - onnxruntime raises its own types
        raise ModelError(f"onnxruntime cannot load the model for fast finetuning: {exc}") from exc


class _Reservoir:
    """A seeded uniform sample of at most `cap` rows of (x, y) pairs seen in batches."""

    def __init__(self, cap: int, rng: np.random.Generator) -> None:
        self.cap, self.rng, self.seen = cap, rng, 0
        self.x: np.ndarray | None = None
        self.y: np.ndarray | None = None
        self.n = 0

    def add(self, x: np.ndarray, y: np.ndarray) -> None:
        if x.shape[0] != y.shape[0]:
            raise DataError(f"layer input has {x.shape[0]} rows but its output has {y.shape[0]}; "
                            "fast finetuning needs the batch on axis 0 of both")
        if self.x is None or self.y is None:
            self.x = np.empty((self.cap,) + x.shape[1:], np.float32)
            self.y = np.empty((self.cap,) + y.shape[1:], np.float32)
        elif x.shape[1:] != self.x.shape[1:] or y.shape[1:] != self.y.shape[1:]:
            raise DataError(f"calibration samples change shape ({self.x.shape[1:]} -> {x.shape[1:]}); "
                            "fast finetuning caches layer inputs and needs one sample shape")
        for i in range(x.shape[0]):  # algorithm R, sequential so that the sample is seeded
            if self.n < self.cap:
                slot = self.n
                self.n += 1
            else:
                j = int(self.rng.integers(0, self.seen + 1))
                slot = j if j < self.cap else -1
            if slot >= 0:
                self.x[slot], self.y[slot] = x[i], y[i]
            self.seen += 1

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        if self.x is None or self.y is None or self.n == 0:
            raise DataError("calibration data is empty: no sample reached the layer")
        return self.x[:self.n], self.y[:self.n]


def _progress(enabled: bool, msg: str) -> None:
    if enabled:
        print(f"[mixq finetune] {msg}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def _torch_state(seed: int, threads: int | None) -> Iterator[Any]:
    """Seeded, deterministic torch; restores the global settings afterwards."""
    from ._torch import require_torch

    torch = require_torch()
    prev_det = torch.are_deterministic_algorithms_enabled()
    prev_warn = torch.is_deterministic_algorithms_warn_only_enabled()
    prev_threads = torch.get_num_threads()
    prev_rng = torch.get_rng_state()
    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(True)
    if threads:
        torch.set_num_threads(threads)
    try:
        yield torch
    finally:
        torch.use_deterministic_algorithms(prev_det, warn_only=prev_warn)
        torch.set_num_threads(prev_threads)
        torch.set_rng_state(prev_rng)


# ------------------------------------------------------------------------------- layer choice
def find_layers(model: onnx.ModelProto, plan: PrecisionPlan, qparams: dict[str, QParams],
                config: AdaRoundConfig | AdaQuantConfig) -> tuple[list[_Layer], dict[str, str]]:
    """The layers to finetune, in topological (graph) order, and why others are left alone."""
    g = model.graph
    inits = {t.name: t for t in g.initializer}
    uses: dict[str, int] = {}
    for n in g.node:
        for i in n.input:
            uses[i] = uses.get(i, 0) + 1
    candidates = {n.name for n in g.node if n.op_type in config.op_types}
    for opt in ("include_layers", "exclude_layers"):
        for name in sorted(getattr(config, opt) or ()):
            if name not in candidates:
                raise ConfigError(f"{opt}: the model has no {'/'.join(sorted(config.op_types))} node "
                                  f"named {name!r}." + did_you_mean(name, candidates))
    layers: list[_Layer] = []
    skipped: dict[str, str] = {}
    for n in g.node:
        if n.name not in candidates:
            continue
        if config.include_layers is not None and n.name not in config.include_layers:
            continue
        if n.name in config.exclude_layers:
            skipped[n.name] = "excluded by exclude_layers"
            continue
        why = None
        w = n.input[1] if len(n.input) > 1 else ""
        tp = plan.tensors.get(w)
        b = n.input[2] if n.op_type != "MatMul" and len(n.input) > 2 and n.input[2] else None
        if not n.input or not n.input[0] or n.input[0] in inits:
            why = "input 0 is not a run-time activation"
        elif w not in inits:
            why = "the weight is not an initializer"
        elif tp is None or tp.role != "weight" or tp.format is None:
            why = "the weight is not quantized by the plan"
        elif uses.get(w, 0) > 1:
            why = f"the weight is shared by {uses[w]} nodes"
        elif b is not None and b not in inits:
            why = "the bias is computed at run time"
        elif n.op_type == "Gemm" and any(a.name == "transA" and a.i for a in n.attribute):
            why = "Gemm with transA=1 (the batch is not on axis 0)"
        elif isinstance(config, AdaRoundConfig) and get_format(tp.format).kind != "int":
            why = (f"AdaRound learns integer rounding; weight format {tp.format} has none "
                   "(use AdaQuantConfig)")
        else:
            wa = numpy_helper.to_array(inits[w])
            if wa.dtype != np.float32 or not np.all(np.isfinite(wa)):
                why = "the weight is not a finite float32 tensor"
        if why is not None or tp is None or tp.format is None:
            skipped[n.name] = why or "the weight is not quantized by the plan"
            continue
        fmt = get_format(tp.format)
        layers.append(_Layer(node=n, spec=LayerSpec.from_node(n), weight=w, bias=b,
                             weight_format=fmt.name, weight_qparams=qparams.get(w),
                             block_axis=tp.block_axis if fmt.kind == "block" else None,
                             bias_scale=_bias_scale(n, b, plan, qparams, inits)))
    if isinstance(config, AdaRoundConfig) and not layers and skipped and all(
            "AdaRound learns integer rounding" in r for r in skipped.values()):
        fmts = sorted({plan.tensors[n.input[1]].format or "float" for n in g.node
                       if n.name in skipped and n.input[1] in plan.tensors})
        raise ConfigError(f"AdaRound needs integer weight formats; this plan's weights are "
                          f"{', '.join(map(str, fmts))}. Use AdaQuantConfig instead.")
    return layers, skipped


def _bias_scale(node: onnx.NodeProto, bias: str | None, plan: PrecisionPlan,
                qparams: dict[str, QParams], inits: dict[str, onnx.TensorProto]) -> np.ndarray | None:
    """Scale of the int32 bias the rewrite will store (None: the bias stays float)."""
    if bias is None:
        return None
    bp = plan.tensors.get(bias)
    if bp is None or bp.format != "int32":
        return None
    tx = plan.tensors.get(node.input[0])
    qx = qparams.get(tx.group or node.input[0]) if tx is not None else None
    qw = qparams.get(node.input[1])
    if qx is None or qw is None or qx.scale.size != 1:
        return None
    b = numpy_helper.to_array(inits[bias]).astype(np.float64)
    scale = np.broadcast_to((np.float32(qx.scale.reshape(())) * qw.scale.reshape(-1)).astype(np.float32),
                            b.shape).astype(np.float32)
    q = np.rint(b / scale.astype(np.float64))
    if np.any(~np.isfinite(q)) or np.any(np.abs(q) > _INT32_MAX):
        return None
    return scale


# ------------------------------------------------------------------------------------ finetune
def finetune(prepared: onnx.ModelProto, plan: PrecisionPlan, qparams: dict[str, QParams],
             calibration_data: Any, config: AdaRoundConfig | AdaQuantConfig, *,
             eval_data: Any = None, rewrite: Callable[[onnx.ModelProto], onnx.ModelProto] | None = None
             ) -> tuple[dict[str, np.ndarray], FinetuneReport]:
    """Finetune the weights of `prepared` (the model `apply_plan` rewrites) layer by layer.

    `plan` and `qparams` are the ones the rewrite will use (weight qparams are kept: the
    rewrite must not recompute them from the finetuned weights). Returns ``(weights, report)``:
    the adjusted float weights (and biases) by initializer name, to be put into `prepared`
    (`with_weights`) before `apply_plan`, and a `FinetuneReport`. With ``num_iterations=0`` the
    dict is empty: the rewrite produces exactly the plain quantized model.

    `eval_data` (default: the calibration data) is where the report's model-level metric is
    measured (output `config.output_index`). `rewrite(model) -> quantized model` builds the
    QDQ model the layer inputs are taken from (default: ``apply_plan(model, plan, qparams)``);
    `quantize` passes its own rewrite so that both agree.
    """
    if rewrite is None:
        from ..passes.qdq import apply_plan

        def rewrite(m: onnx.ModelProto) -> onnx.ModelProto:
            return apply_plan(m, plan, qparams)[0]

    if not isinstance(config, (AdaRoundConfig, AdaQuantConfig)):
        raise ConfigError(f"finetune config must be an AdaRoundConfig or AdaQuantConfig, got "
                          f"{type(config).__name__}")
    t_start = time.perf_counter()
    report = FinetuneReport(algorithm=config.algorithm, config=config)
    n_out = len(prepared.graph.output)
    if config.output_index >= n_out:
        raise ConfigError(f"output_index={config.output_index} but the model has {n_out} output(s) "
                          f"({', '.join(o.name for o in prepared.graph.output)}); use 0..{n_out - 1}.")
    if config.num_iterations == 0:
        report.notes.append("num_iterations=0: weights left as quantized")
        report.total_seconds = time.perf_counter() - t_start
        return {}, report
    layers, report.skipped = find_layers(prepared, plan, qparams, config)
    show = config.verbose or sys.stderr.isatty()
    specs = input_specs_from_model(prepared)
    _check_rereadable(calibration_data)
    source = FeedSource(calibration_data, specs)
    updated: dict[str, np.ndarray] = {}
    plain_q = rewrite(prepared)
    out_name = prepared.graph.output[config.output_index].name
    if config.report_metric:
        report.metric_before = _metric(prepared, plain_q, eval_data if eval_data is not None else calibration_data,
                                       specs, config)
    if not layers:
        report.notes.append("no layer to finetune")
        report.total_seconds = time.perf_counter() - t_start
        return {}, report
    float_sess = _session(prepared, [L.node.output[0] for L in layers], None)
    rng = np.random.default_rng(config.seed)
    q_sess, q_version, version = None, -1, 0
    q_inputs: dict[str, str] = {}
    with _torch_state(config.seed, config.num_threads) as torch:
        for li, layer in enumerate(layers):
            t0 = time.perf_counter()
            if q_version != version:
                qmodel = plain_q if not updated else rewrite(with_weights(prepared, updated))
                qnodes = {n.name: n for n in qmodel.graph.node}
                q_inputs = {L.node.name: qnodes[L.node.name].input[0] for L in layers[li:]}
                q_sess = _session(qmodel, sorted(set(q_inputs.values())), None)
                q_version = version
            x, y = _collect(q_sess, float_sess, q_inputs[layer.node.name], layer.node.output[0], source,
                            config, rng, layer)
            res = _optimize_layer(torch, layer, prepared, x, y, config, seed=config.seed + li)
            res.seconds = time.perf_counter() - t0
            report.layers.append(res.report)
            if not res.report.kept_plain:
                updated.update(res.weights)
                version += 1
            r = res.report
            _progress(show, f"{li + 1}/{len(layers)} {r.node} ({r.op_type}, {r.weight_format}): loss "
                            f"{r.loss_before:.4g} -> {r.loss_after:.4g} ({r.improvement_db:+.2f} dB), "
                            f"{r.iterations} it, {r.samples} samples, {res.seconds:.2f} s")
            report.layers[-1].seconds = res.seconds
    if config.report_metric:
        final_q = plain_q if not updated else rewrite(with_weights(prepared, updated))
        report.metric_after = _metric(prepared, final_q, eval_data if eval_data is not None else calibration_data,
                                      specs, config)
        _progress(show, f"{out_name}: {report.metric_before} -> {report.metric_after}")
        if updated and report.metric_before is not None and report.metric_after.worse_than(report.metric_before):
            # each layer gained on its held-out rows, yet the output lost, even on the data the
            # weights were fit on: what the layers learned does not compose
            report.plain_because = (f"the finetuned weights scored worse at the output ({report.metric_before} -> "
                                    f"{report.metric_after} on {out_name}, calibration data): the plain "
                                    "quantized weights are kept")
            updated = {}
    report.total_seconds = time.perf_counter() - t_start
    return updated, report


def _check_rereadable(data: Any) -> None:
    """Fast finetuning reads the data once per layer: one-shot iterators cannot be used, and a
    reader already consumed by calibration is rewound first."""
    if callable(getattr(data, "get_next", None)):
        rewind = getattr(data, "rewind", None)
        if not callable(rewind):
            raise DataError("fast finetuning reads the calibration data once per layer, but the data "
                            "reader has no rewind() method; add rewind() or pass a list of feeds")
        rewind()
    elif isinstance(data, Iterator):
        raise DataError("fast finetuning reads the calibration data once per layer, but it is a one-shot "
                        "iterator (e.g. a generator); pass a list of feeds, arrays, a file or a reader "
                        "with rewind()")


def _metric(float_model: onnx.ModelProto, qmodel: onnx.ModelProto, data: Any, specs: Any,
            config: AdaRoundConfig | AdaQuantConfig) -> ModelMetric:
    from ..evaluate import compare

    fm, qm = onnx.ModelProto(), onnx.ModelProto()
    fm.CopyFrom(float_model)
    qm.CopyFrom(qmodel)
    top = onnxruntime_max_ir_version()
    fm.ir_version = min(fm.ir_version, top)
    qm.ir_version = min(qm.ir_version, top)
    m = compare(fm, qm, FeedSource(data, specs), optimize=False, output_index=config.output_index).first()
    return ModelMetric(m.name, m.sqnr_db, m.top1_agreement)


def _collect(q_sess: Any, f_sess: Any, in_name: str, out_name: str, source: FeedSource,
             config: AdaRoundConfig | AdaQuantConfig, rng: np.random.Generator, layer: _Layer
             ) -> tuple[np.ndarray, np.ndarray]:
    """Stream the data: the layer's quantized input and float output, reservoir-sampled."""
    res: _Reservoir | None = None
    for i, feed in enumerate(source):
        try:
            x = np.asarray(q_sess.run([in_name], feed)[0], dtype=np.float32)
            y = np.asarray(f_sess.run([out_name], feed)[0], dtype=np.float32)
        except Exception as exc:  # noqa: BLE001 - onnxruntime raises its own types
            raise DataError(f"onnxruntime failed on calibration batch {i} while collecting the inputs of "
                            f"{layer.node.name!r}: {exc}") from exc
        if x.ndim == 0 or y.ndim == 0:
            raise DataError(f"layer {layer.node.name!r} has a scalar input or output; nothing to finetune")
        if res is None:
            row_bytes = 4 * (int(np.prod(x.shape[1:])) + int(np.prod(y.shape[1:])))
            cap = max(1, int(config.max_cache_mb * 2**20) // max(row_bytes, 1))
            if config.max_samples is not None:
                cap = min(cap, config.max_samples)
            res = _Reservoir(cap, rng)
        res.add(x, y)
    if res is None:
        raise DataError("calibration data is empty")
    return res.arrays()


@dataclass
class _Result:
    report: LayerReport
    weights: dict[str, np.ndarray]
    seconds: float = 0.0


def _optimize_layer(torch: Any, layer: _Layer, model: onnx.ModelProto, x_np: np.ndarray, y_np: np.ndarray,
                    config: AdaRoundConfig | AdaQuantConfig, *, seed: int) -> _Result:
    from .fakequant import TorchQuantizer

    inits = {t.name: t for t in model.graph.initializer}
    w0 = np.array(numpy_helper.to_array(inits[layer.weight]), dtype=np.float32)
    b0 = np.array(numpy_helper.to_array(inits[layer.bias]), dtype=np.float32) if layer.bias else None
    held = held_out_rows(x_np.shape[0])
    if held:  # a seeded draw of the rows: the fit ones first, the held-out ones last
        order = np.random.default_rng(seed).permutation(x_np.shape[0])
        x_np, y_np = x_np[order], y_np[order]
    X, Y = torch.from_numpy(np.ascontiguousarray(x_np)), torch.from_numpy(np.ascontiguousarray(y_np))
    n = X.shape[0] - held  # the rows the weights are fit on
    Xc, Yc = (X[n:], Y[n:]) if held else (X, Y)  # the rows they are judged on
    wq = TorchQuantizer(layer.weight_format, w0.shape, layer.weight_qparams, axis=layer.block_axis)
    bscale = torch.from_numpy(layer.bias_scale) if layer.bias_scale is not None else None
    spec = layer.spec
    cdim = spec.channel_dim

    def bias_q(b: Any, ste: bool) -> Any:
        if b is None or bscale is None:
            return b
        q = (torch.round(b.detach().double() / bscale.double())).float() * bscale
        return b + (q - b).detach() if ste else q

    def row_losses(w: Any, b: Any) -> np.ndarray:
        """The squared error of each judged row (float64)."""
        with torch.no_grad():
            parts = []
            for s in range(0, Xc.shape[0], _EVAL_CHUNK):
                err = (spec.forward(Xc[s:s + _EVAL_CHUNK], w, b) - Yc[s:s + _EVAL_CHUNK]).double() ** 2
                parts.append(err.reshape(err.shape[0], -1).sum(dim=1).numpy())
            return np.concatenate(parts)

    def full_loss(w: Any, b: Any) -> float:
        return float(row_losses(w, b).sum()) / Yc.numel()

    w0_t = torch.from_numpy(w0)
    b0_t = torch.from_numpy(b0) if b0 is not None else None
    plain_w, plain_b = wq(w0_t), bias_q(b0_t, False)
    plain_rows = row_losses(plain_w, plain_b)
    loss_before = float(plain_rows.sum()) / Yc.numel()
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    bs = min(config.batch_size, n)
    es = config.early_stop if isinstance(config.early_stop, EarlyStop) else None
    best = (loss_before, None, None)  # loss, weight, bias (None: plain)
    bad_checks = 0
    stopped = False
    it = 0

    if isinstance(config, AdaRoundConfig):
        s = wq.scale
        zp = wq.zero_point
        with torch.no_grad():
            y0 = w0_t / s
            wfloor = torch.floor(y0)
            rest = (y0.double() - wfloor.double()).clamp(0.0, 1.0)
            V0 = -torch.log((_ZETA - _GAMMA) / (rest - _GAMMA) - 1.0)
        V = torch.nn.Parameter(V0.float())
        opt = torch.optim.Adam([V], lr=config.learning_rate)
        b_fixed = plain_b
        t_max = config.num_iterations
        warm = config.warm_start * t_max
        b_start, b_end = config.beta_range

        def h_of(v: Any) -> Any:
            return torch.clamp(torch.sigmoid(v) * (_ZETA - _GAMMA) + _GAMMA, 0.0, 1.0)

        def hard_w() -> Any:
            with torch.no_grad():
                q = torch.clamp(wfloor + (V >= 0).float() + zp, wq.lo, wq.hi)
                return (q - zp) * s

        for it in range(1, config.num_iterations + 1):
            idx = torch.randint(0, n, (bs,), generator=gen)
            h = h_of(V)
            w_soft = (torch.clamp(wfloor + h + zp, wq.lo, wq.hi) - zp) * s
            out = spec.forward(X[idx], w_soft, b_fixed)
            err = (out - Y[idx]) ** 2
            rec = err.sum() * (out.shape[cdim] / err.numel())  # per position, summed over channels
            if it < warm:
                loss = rec
            else:
                rel = (it - warm) / max(t_max - warm, 1.0)
                beta = b_end + (b_start - b_end) * max(0.0, 1.0 - rel)
                loss = rec + config.reg_param * torch.sum(1.0 - torch.abs(2.0 * h - 1.0) ** beta)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if es is not None and it % es.interval == 0 and it >= warm:
                # only after the warm start: before it, the hard rounding is not what is learned
                cur = full_loss(hard_w(), b_fixed)
                if cur < best[0] * (1.0 - es.min_delta):
                    best, bad_checks = (cur, hard_w(), None), 0
                else:
                    bad_checks += 1
                    if bad_checks >= es.patience:
                        stopped = True
                        break
        final_w = hard_w()
        final_loss = full_loss(final_w, b_fixed)
        if final_loss < best[0]:
            best = (final_loss, final_w, None)
    else:
        w = torch.nn.Parameter(w0_t.clone())
        params = [w]
        b = None
        if b0_t is not None:
            b = torch.nn.Parameter(b0_t.clone()) if config.update_bias else b0_t
            if config.update_bias:
                params.append(b)
        opt = torch.optim.Adam(params, lr=config.learning_rate)

        def deploy() -> tuple[Any, Any]:
            return wq(w.detach()), bias_q(b.detach() if b is not None else None, False)

        for it in range(1, config.num_iterations + 1):
            idx = torch.randint(0, n, (bs,), generator=gen)
            out = spec.forward(X[idx], wq.ste(w), bias_q(b, True))
            loss = torch.mean((out - Y[idx]) ** 2)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if es is not None and it % es.interval == 0:
                cur = full_loss(*deploy())
                if cur < best[0] * (1.0 - es.min_delta):
                    best, bad_checks = (cur, w.detach().clone(), b.detach().clone() if b is not None else None), 0
                else:
                    bad_checks += 1
                    if bad_checks >= es.patience:
                        stopped = True
                        break
        final_loss = full_loss(*deploy())
        if final_loss < best[0]:
            best = (final_loss, w.detach().clone(), b.detach().clone() if b is not None else None)

    loss_after, best_w, best_b = best
    if best_w is not None and held:
        deployed = (best_w, b_fixed) if isinstance(config, AdaRoundConfig) else (wq(best_w), bias_q(best_b, False))
        if not clear_gain(plain_rows, row_losses(*deployed)):
            best_w = best_b = None
    kept_plain = best_w is None
    weights: dict[str, np.ndarray] = {}
    if best_w is not None:
        weights[layer.weight] = best_w.numpy().astype(np.float32)
        if best_b is not None and layer.bias is not None and isinstance(config, AdaQuantConfig) \
                and config.update_bias:
            weights[layer.bias] = best_b.numpy().astype(np.float32)
    rep = LayerReport(node=layer.node.name, op_type=layer.node.op_type, weight=layer.weight,
                      weight_format=layer.weight_format, algorithm=config.algorithm,
                      loss_before=loss_before, loss_after=loss_after if not kept_plain else loss_before,
                      iterations=it, samples=n + held, seconds=0.0, kept_plain=kept_plain, stopped_early=stopped,
                      held_out=held)
    return _Result(rep, weights)


def run_finetune(prepared: onnx.ModelProto, plan: PrecisionPlan, qparams: dict[str, QParams],
                 calibration_data: Any, config: Any,
                 rewrite: Callable[[onnx.ModelProto], onnx.ModelProto] | None = None
                 ) -> tuple[onnx.ModelProto, FinetuneReport]:
    """The hook `mixq.quantize` calls: `finetune`, then the model with the adjusted weights.

    `config`: an AdaRoundConfig / AdaQuantConfig, or a list holding exactly one (a compat
    QConfig's algo_config)."""
    if isinstance(config, (list, tuple)):
        algos = [c for c in config if isinstance(c, (AdaRoundConfig, AdaQuantConfig))]
        if len(algos) != 1 or len(config) != 1:
            raise ConfigError(f"give exactly one finetune algorithm (AdaRoundConfig or AdaQuantConfig), "
                              f"got {[type(c).__name__ for c in config]}")
        config = algos[0]
    weights, report = finetune(prepared, plan, qparams, calibration_data, config, rewrite=rewrite)
    return (with_weights(prepared, weights) if weights else prepared), report


__all__ = ["finetune", "find_layers", "run_finetune", "with_weights"]
