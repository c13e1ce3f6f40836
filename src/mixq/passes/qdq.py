"""Materialize a precision plan: insert quantize-dequantize for every planned tensor.

Activations get their format's run-time QDQ (native QuantizeLinear/DequantizeLinear, Cast pairs,
or a model-local function) right where they are produced; weights are replaced by their stored
quantized form; biases become int32 + DequantizeLinear when planned so.
"""
from __future__ import annotations

import math
import os
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .._io import tensor_array
from ..formats import Emission, QParams, get_format
from ..formats._block_onnx import MIN_BLOCK_OPSET
from ..graph import (GraphIndex, NameAllocator, PassResult, int_attr, model_opset, outer_scope_reads, static_shape,
                     subgraphs)
from ..plan.plan import PrecisionPlan, TensorPrecision
from ..plan.qparams import consumer_key
from .function_ops import stranded_ops
from .prepare import declare_shapes

_INT32_MAX = 2**31 - 1


@dataclass
class RewriteReport:
    """What the rewrite changed."""

    activations_quantized: int = 0
    weights_quantized: int = 0
    biases_int32: int = 0
    biases_kept_float: dict[str, str] = field(default_factory=dict)
    boundary_conversions: int = 0
    notes: list[str] = field(default_factory=list)
    #: weight -> (its bias, k): the weight's grid widened by 2**k so that the bias fits int32 at
    #: input scale x weight scale (onnxruntime's 8-bit Conv/Gemm kernels read it there)
    bias_grids: dict[str, tuple[str, int]] = field(default_factory=dict)
    passes: list[PassResult] = field(default_factory=list)


def _bias_qparams(node: onnx.NodeProto, plan: PrecisionPlan, qparams: dict[str, QParams]
                  ) -> tuple[np.ndarray | None, str]:
    """The int32 bias scale of `node`: input scale x weight scale (float32), or None and why."""
    scales, why = _operand_scales(node, plan, qparams)
    if scales is None:
        return None, why
    sx, sw = scales
    return (np.float32(sx) * sw).astype(np.float32), ""


def _operand_scales(node: onnx.NodeProto, plan: PrecisionPlan, qparams: dict[str, QParams]
                    ) -> tuple[tuple[np.float32, np.ndarray] | None, str]:
    """(input scale, weight scales flattened) of a Conv/Gemm, or None and why."""
    x, w = node.input[0], node.input[1]
    tx = plan.tensors.get(x)
    if tx is None:
        qx = None
    elif node.name in tx.consumer_formats:  # the node reads x in a boundary format
        qx = qparams.get(consumer_key(x, tx.consumer_formats[node.name]))
    else:
        qx = qparams.get(tx.group or x)
    qw = qparams.get(w)
    if qx is None or qw is None:
        return None, "input or weight is not integer-quantized"
    sx, sw = qx.scale, qw.scale
    if sx.size != 1:
        return None, "input is not quantized per tensor"
    return (np.float32(sx.reshape(())), sw.reshape(-1)), ""


def _int32_shift(b: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """Per element, the smallest k >= 0 with |b| / (scale * 2**k) within int32 (`scale` > 0)."""
    need = np.abs(b) / np.asarray(scale, np.float64) / _INT32_MAX
    # k = ceil(log2(need)) exactly: need = m * 2**e with m in [0.5, 1)
    m, e = np.frexp(need)
    return np.where(need > 1.0, np.where(m == 0.5, e - 1, e), 0).astype(np.int64)


def _int32_bias(b: np.ndarray, scale: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """int32 codes of a finite bias at `scale` (per element), each scale multiplied by the
    smallest power of two 2**k that keeps its codes within int32; returns (scale, codes, max k).

    Where input scale x weight scale is tiny (16-bit activations and weights) b / scale
    overflows int32. A float bias is no way out: onnxruntime's basic optimizations quantize a
    float Conv/Gemm bias between QDQ inputs to int32 at that very scale, without a range check
    (S16S16 on the PP-OCR classifier: 62 % instead of 100 %). 2**k keeps 31 bits of precision.
    Where input scale x weight scale underflows float32 to 0 (activations and weights both near
    1e-20), the scale starts from float32's smallest normal number instead: b / 0 has no code."""
    scale = np.where(scale > 0, scale, np.finfo(np.float32).tiny).astype(np.float32)
    k = _int32_shift(b, scale)
    scale = np.ldexp(scale, k).astype(np.float32)
    return scale, np.rint(b / scale.astype(np.float64)), int(k.max(initial=0))


@dataclass
class _Rewrite:
    """The state the rewrite passes share: what each pass decided, applied once by `_assemble`
    (so the node order and names are the same whatever order the passes ran in)."""

    model: onnx.ModelProto
    plan: PrecisionPlan
    qparams: dict[str, QParams]
    dual: bool
    base_dir: str | os.PathLike | None
    report: RewriteReport
    index: GraphIndex = field(init=False)
    names: NameAllocator = field(init=False)
    rename: dict[str, str] = field(default_factory=dict)       # tensor -> name consumers read
    node_rename: dict[tuple[str, str], str] = field(default_factory=dict)  # (node, tensor) -> name
    replace_init: dict[str, Emission] = field(default_factory=dict)
    new_after: dict[int, list[onnx.NodeProto]] = field(default_factory=dict)  # producer index
    emission: Emission = field(default_factory=Emission)
    block_outputs: dict[str, str] = field(default_factory=dict)  # block output -> source tensor
    prefixes: dict[str, str] = field(default_factory=dict)
    #: the opset block formats' functions are emitted at (None: theirs, 26); see _pass_opset
    block_opset: int | None = None

    def block_kw(self, fmt: Any) -> dict[str, Any]:
        """The emission keywords of `fmt`: block formats get `block_opset`."""
        return {"opset": self.block_opset} if fmt.kind == "block" and self.block_opset is not None else {}

    def reindex(self) -> None:
        self.index = GraphIndex.of(self.model)
        self.names = NameAllocator.for_model(self.model)

    def prefix(self, tensor: str) -> str:
        """The namespace of the nodes and initializers emitted for `tensor` (one per tensor)."""
        if tensor not in self.prefixes:
            self.prefixes[tensor] = self.names.prefix(tensor)
        return self.prefixes[tensor]


def _pass_opset(rw: _Rewrite) -> PassResult:
    """Upgrade the model to the default-domain opset every planned format's ONNX needs (block
    formats: 26). Not in place when it converts: the converter returns a new model."""
    from .prepare import model_opset, upgrade_opset

    res = PassResult("opset", in_place=True)
    need = max((get_format(f).onnx_opset for f in rw.plan.formats()), default=0)
    have = model_opset(rw.model)
    if need <= have:
        res.decline("model", f"opset {have} already runs every planned format")
        return res
    lost = stranded_ops(rw.model, have, need) if need > MIN_BLOCK_OPSET else {}
    if lost:
        import onnxruntime as ort

        rw.block_opset = max(have, MIN_BLOCK_OPSET)
        rw.report.notes.append(
            f"block formats emitted at opset {rw.block_opset}, with an exponent computed without BitCast "
            f"(slower per call, the same values): onnxruntime {ort.__version__} does not run "
            + "; ".join(f"{op} ({why})" for op, why in sorted(lost.items()))
            + f" at opset {need}, which BitCast needs")
        need = rw.block_opset
        if need <= have:
            res.decline("model", f"opset {have} runs every planned format (block formats without BitCast)")
            return res
    # the table gives the user's opset; `have` is the prepared model's, which preparation may
    # already have raised
    rw.report.notes.append(f"model upgraded to opset {need}, which its formats' ONNX needs")
    rw.model = upgrade_opset(rw.model, need, result=res)
    rw.report.notes += res.notes
    res.in_place, res.changed = False, res.changed + 1
    return res


def _int8_grid(fmt: str | None) -> bool:
    """Whether `fmt` is an integer format of at most 8 bits: what onnxruntime's fused integer
    kernels (QLinearConv, QGemm, QLinearSoftmax ...) are built from."""
    if fmt is None:
        return False
    f = get_format(fmt)
    return f.kind == "int" and f.bits <= 8


def _bias_owner(rw: _Rewrite, bias: str) -> onnx.NodeProto | None:
    """The Conv/ConvTranspose/Gemm that adds `bias` (its third input), if any."""
    return next((n for n in rw.index.consumers(bias)
                 if n.op_type in ("Conv", "ConvTranspose", "Gemm") and len(n.input) > 2
                 and n.input[2] == bias), None)


def _bias_owners(rw: _Rewrite) -> list[tuple[str, onnx.NodeProto]]:
    """(bias, the Conv/ConvTranspose/Gemm that adds it) for every bias planned on a grid."""
    out = []
    for name, tp in rw.plan.tensors.items():
        owner = _bias_owner(rw, name) if tp.role == "bias" and tp.format is not None else None
        if owner is not None:
            out.append((name, owner))
    return out


def _pass_bias_room(rw: _Rewrite) -> PassResult:
    """8-bit Conv/Gemm whose int32 bias would overflow at input scale x weight scale: the
    weight's scale doubles (per channel where it has one) until the bias fits.

    `_int32_bias` keeps such a bias exact at a 2**k larger scale, which the QDQ semantics
    honour, but onnxruntime fuses 8-bit DequantizeLinear -> Conv -> QuantizeLinear into
    QLinearConv / QGemm, which read the int32 codes at input scale x weight scale whatever
    scale the bias's DequantizeLinear says: the bias shrinks by 2**k in the user's runtime
    (a Conv over near-zero inputs: the whole bias lost, at default optimizations only). Where
    |bias| > 2**31 x that product the weights' contribution is far below the output's step,
    so a coarser weight grid costs little; onnxruntime's own quantizer widens weight scales
    for the same reason. Not in place on `rw.qparams`: the caller's dict is left as it was."""
    res = PassResult("bias room")
    widened: dict[str, QParams] = {}
    for name, owner in _bias_owners(rw):
        x, w = owner.input[0], owner.input[1]
        tx, tw = rw.plan.tensors.get(x), rw.plan.tensors.get(w)
        if tx is None or tw is None or tw.format is None:
            continue
        if not (_int8_grid(tx.consumer_formats.get(owner.name, tx.format)) and _int8_grid(tw.format)):
            res.decline(name, "not an 8-bit integer Conv/Gemm: the 2**k bias scale stands")
            continue
        scales, _ = _operand_scales(owner, rw.plan, {**rw.qparams, **widened})
        qw = widened.get(w, rw.qparams.get(w))
        if scales is None or qw is None or qw.block_size:
            continue
        b = tensor_array(rw.index.initializers[name], rw.base_dir).astype(np.float64)
        if not np.all(np.isfinite(b)) or scales[1].size not in (1, b.size):
            continue
        # in float64: the float32 product underflows to 0 where both scales are tiny; the
        # margin keeps the float32 product the bias pass computes from needing a shift again
        product = np.float64(scales[0]) * np.broadcast_to(scales[1], b.shape).astype(np.float64)
        k = _int32_shift(b * (1 + 2.0**-16), np.maximum(product, np.finfo(np.float64).tiny))
        if not k.any():
            continue
        k = k.reshape(qw.scale.shape) if qw.scale.size == k.size else np.asarray(k.max())
        widened[w] = QParams(np.ldexp(qw.scale, k).astype(np.float32), qw.zero_point, qw.axis)
        rw.report.bias_grids[w] = (name, int(k.max()))
        res.changed += 1
    if widened:
        rw.qparams = {**rw.qparams, **widened}
    return res


#: onnxruntime's QLinearSoftmax (the fusion of an 8-bit DequantizeLinear -> Softmax ->
#: QuantizeLinear) scales its exp table to FLT_MAX / (D e^5) and multiplies by floor(1 / y_scale)
#: in float: past 1 / y_scale = D e^5 the product is inf and the row's codes 0.
_SOFTMAX_TABLE_HEADROOM = math.exp(5.0)


def _symbolic_shapes(model: onnx.ModelProto) -> dict[str, tuple[int | None, ...]]:
    """Tensor shapes by onnxruntime's symbolic shape inference (None where a dim stays
    symbolic); {} where it fails. It follows shapes computed at run time from static dims
    (Shape -> Gather -> Concat -> Reshape) that ONNX's own inference leaves unknown."""
    try:
        from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

        inferred = SymbolicShapeInference.infer_shapes(model, auto_merge=True)
    except Exception:  # noqa: BLE001 - a best effort: without it the axis stays unknown
        return {}
    out: dict[str, tuple[int | None, ...]] = {}
    for vi in [*inferred.graph.value_info, *inferred.graph.output]:
        dims = static_shape(vi.type)
        if dims is not None:
            out[vi.name] = tuple(d or None for d in dims)
    return out


def _pass_softmax_room(rw: _Rewrite) -> PassResult:
    """8-bit Softmax outputs whose calibrated scale is below 1 / (D e^5) (D the softmax axis's
    length: nearly uniform rows, a largest probability under 1.7 / D) get that scale instead.

    Exact in the QDQ semantics (a coarser grid over the same values) and keeps onnxruntime's
    QLinearSoftmax finite: below it, every code of the row is 0 in the user's runtime. Needs the
    axis length: ONNX shape inference's, else (only for a scale that some length >= 2 would
    break) onnxruntime's symbolic shape inference, which follows computed Reshape shapes; an
    axis still symbolic is sized at run time, and the guard's runtime check then shows the
    failure. Not in place on `rw.qparams`."""
    res = PassResult("softmax room")
    widened: dict[str, QParams] = {}
    symbolic: dict[str, tuple[int | None, ...]] | None = None
    for node in rw.model.graph.node:
        if node.op_type != "Softmax" or node.domain not in ("", "ai.onnx") or not node.output:
            continue
        y = node.output[0]
        tp = rw.plan.tensors.get(y)
        if tp is None or not _int8_grid(tp.format):
            continue
        key = tp.group or y
        qp = widened.get(key, rw.qparams.get(key))
        shape = rw.index.shape(y)
        axis = next((a.i for a in node.attribute if a.name == "axis"), -1)
        if qp is None or qp.scale.size != 1 or not shape or not -len(shape) <= axis < len(shape):
            continue
        scale = float(qp.scale.reshape(()))
        d = shape[axis]
        if d is None and scale < 1.0 / (2 * _SOFTMAX_TABLE_HEADROOM):
            symbolic = _symbolic_shapes(rw.model) if symbolic is None else symbolic
            sym = symbolic.get(y)
            d = sym[axis] if sym is not None and len(sym) == len(shape) else None
        if d is None:
            res.decline(y, "the softmax axis has no static length")
            continue
        floor = np.float32(1.0 / (d * _SOFTMAX_TABLE_HEADROOM) * 1.01)
        if scale >= floor:
            continue
        widened[key] = QParams(np.asarray(floor, np.float32), qp.zero_point, qp.axis)
        rw.report.notes.append(f"{y}: scale {scale:.3g} -> {float(floor):.3g} (onnxruntime's "
                               f"QLinearSoftmax overflows below 1 / ({d} e^5): nearly uniform rows)")
        res.changed += 1
    if widened:
        rw.qparams = {**rw.qparams, **widened}
    return res


def _pass_constants(rw: _Rewrite) -> PassResult:
    """Weights and constant inputs: each replaced by its stored quantized form (an integer
    payload + DequantizeLinear, or the float weight plus a constant-foldable function)."""
    res = PassResult("constants")
    inits = rw.index.initializers
    for name, tp in rw.plan.tensors.items():
        if tp.role not in ("weight", "constant") or tp.format is None:
            continue
        fmt = get_format(tp.format)
        qp = rw.qparams.get(name)
        if fmt.needs_qparams and qp is None:
            res.decline(name, "no parameters were computed; left float")
            continue
        w = tensor_array(inits[name], rw.base_dir)
        if w.size == 0:
            res.decline(name, "zero-size constant: nothing to quantize, left float")
            rw.report.notes.append(f"{name}: zero-size constant left float")
            continue
        out = rw.names.value(name, "mq")
        axis = tp.block_axis if fmt.kind == "block" else (qp.axis if qp is not None else None)
        rw.replace_init[name] = fmt.emit_weight(w, out, qparams=qp, axis=axis, prefix=rw.prefix(name),
                                                **rw.block_kw(fmt))
        rw.rename[name] = out
        rw.report.weights_quantized += 1
        res.changed += 1
        del w  # a deferred weight: only one float array in memory at a time
    return res


def _pass_biases(rw: _Rewrite) -> PassResult:
    """Biases planned int32: stored at input scale x weight scale (x 2**k where the product
    alone would overflow), read through DequantizeLinear."""
    res = PassResult("biases")
    inits = rw.index.initializers
    for name, tp in rw.plan.tensors.items():
        if tp.role != "bias":
            continue
        if tp.format is None:
            rw.report.biases_kept_float[name] = tp.reason
            continue
        owner = _bias_owner(rw, name)
        scale: np.ndarray | None
        scale, why = _bias_qparams(owner, rw.plan, rw.qparams) if owner is not None else (None, "no owner")
        b = tensor_array(inits[name], rw.base_dir).astype(np.float64)
        if scale is not None and not np.all(np.isfinite(b)):
            scale, why = None, "the bias holds NaN or inf; kept float"
        groups = int_attr(owner, "group", 1) if owner is not None and owner.op_type == "ConvTranspose" else 1
        if scale is not None and groups > 1 and scale.size * groups == b.size:
            # a grouped ConvTranspose's weight channels (axis 1) repeat in each group's outputs
            scale = np.tile(scale.reshape(-1), groups)
        if scale is not None and scale.size not in (1, b.size):
            why = f"bias of shape {b.shape} does not match the {scale.size} weight channels; kept float"
            scale = None
        if scale is not None:
            scale, q, shift = _int32_bias(b, np.broadcast_to(scale, b.shape).astype(np.float32))
            if shift:
                rw.report.notes.append(f"bias {name}: int32 at input scale x weight scale x 2**{shift} "
                                       "(the product alone would overflow int32)")
        if scale is None:
            rw.report.biases_kept_float[name] = why
            res.decline(name, why)
            continue
        prefix = rw.prefix(name)
        qname, sname = rw.names.value(prefix, "q"), rw.names.value(prefix, "scale")
        out, dq = rw.names.value(name, "mq"), rw.names.value(prefix, "dq")
        rw.replace_init[name] = Emission(
            nodes=[helper.make_node("DequantizeLinear", [qname, sname], [out], name=dq, axis=0)],
            initializers=[numpy_helper.from_array(q.astype(np.int32), qname),
                          numpy_helper.from_array(scale, sname)],
            opsets={"": 21})
        rw.rename[name] = out
        rw.report.biases_int32 += 1
        res.changed += 1
    return res


def _pass_activations(rw: _Rewrite) -> PassResult:
    """Activations: the format's run-time quantize-dequantize right after the producer;
    consumers in another format read a conversion node (precision boundaries), fed by the
    float tensor or, with dual quant nodes, by the producer-format value."""
    res = PassResult("activations")
    outputs = set(rw.index.outputs)
    for name, tp in rw.plan.tensors.items():
        if tp.role != "activation" or tp.format is None:
            continue
        fmt = get_format(tp.format)
        qp = rw.qparams.get(tp.group or name)
        if fmt.needs_qparams and qp is None:
            rw.report.notes.append(f"{name}: no statistics were collected; left float")
            res.decline(name, "no statistics were collected; left float")
            continue
        shape = static_shape(rw.index.types.get(name))
        if fmt.kind == "block" and shape is not None and 0 in shape:
            res.decline(name, "zero-size tensor: nothing to quantize, left float")
            continue
        prod = rw.index.producer(name)
        is_output = name in outputs
        if is_output and prod is None:  # a graph input that is also an output: leave it
            res.decline(name, "a graph input that is also a graph output")
            continue
        prefix = rw.prefix(name)
        float_name = rw.names.value(name, "f") if is_output else name
        quant_name = name if is_output else rw.names.value(name, "mq")
        em = fmt.emit(float_name, quant_name, qparams=qp if fmt.needs_qparams else None,
                      axis=tp.block_axis if fmt.kind == "block" else (qp.axis if qp else None),
                      prefix=prefix, shape=shape, **rw.block_kw(fmt))
        if fmt.kind == "block":
            rw.block_outputs[quant_name] = name
        if is_output:
            assert prod is not None
            prod.output[list(prod.output).index(name)] = float_name
        else:
            rw.rename[name] = quant_name
        key = rw.index.order(prod) if prod is not None else -1
        rw.new_after.setdefault(key, []).extend(em.nodes)
        rw.emission.extend(Emission(initializers=em.initializers, functions=em.functions, opsets=em.opsets))
        rw.report.activations_quantized += 1
        res.changed += 1
        for cfmt_name in sorted(set(tp.consumer_formats.values())):
            _boundary(rw, name, tp, cfmt_name, key, quant_name if rw.dual else float_name, shape)
    return res


def _boundary(rw: _Rewrite, name: str, tp: TensorPrecision, cfmt_name: str, key: int,
              source: str, shape: tuple[int | None, ...] | None) -> None:
    """One conversion node for the consumers of `name` that read it in `cfmt_name`."""
    cfmt = get_format(cfmt_name)
    cqp = rw.qparams.get(consumer_key(name, cfmt_name))
    if cfmt.needs_qparams and cqp is None:
        rw.report.notes.append(f"{name} ({cfmt_name} consumers): no statistics; left float")
        return
    safe = "".join(c if c.isalnum() or c in "_." else "_" for c in cfmt_name)
    cout = rw.names.value(name, f"mq_{safe}")
    cem = cfmt.emit(source, cout, qparams=cqp if cfmt.needs_qparams else None,
                    axis=tp.block_axis if cfmt.kind == "block" else (cqp.axis if cqp else None),
                    prefix=rw.names.prefix(f"{rw.prefix(name)}__{safe}"), shape=shape, **rw.block_kw(cfmt))
    if cfmt.kind == "block":
        rw.block_outputs[cout] = name
    rw.new_after[key].extend(cem.nodes)
    rw.emission.extend(Emission(initializers=cem.initializers, functions=cem.functions,
                                opsets=cem.opsets))
    for node_name, f in tp.consumer_formats.items():
        if f == cfmt_name:
            rw.node_rename[(node_name, name)] = cout
    rw.report.boundary_conversions += 1


def _assemble(rw: _Rewrite) -> None:
    """Apply what the passes decided: rewire consumers, swap initializers, order nodes (each
    inserted node right after its producer, weight nodes first), add functions and opsets,
    and leave value_info to shape inference (block outputs excepted)."""
    m, plan = rw.model, rw.plan
    g = m.graph
    inserted = {id(n) for ns in rw.new_after.values() for n in ns}
    for n in g.node:
        if id(n) in inserted:
            continue
        for i, inp in enumerate(n.input):
            if (n.name, inp) in rw.node_rename:
                n.input[i] = rw.node_rename[(n.name, inp)]
            elif inp in rw.rename:
                n.input[i] = rw.rename[inp]
    # weights and biases: drop float initializers nothing reads any more (subgraphs that read
    # a weight from the outer scope keep it), add the stored forms, in plan order
    still_used = {i for n in g.node for i in n.input} | {o.name for o in g.output}
    for n in g.node:
        for sg in subgraphs(n):
            still_used |= outer_scope_reads(sg)
    weight_nodes: list[onnx.NodeProto] = []
    for name in plan.tensors:
        em = rw.replace_init.get(name)
        if em is None:
            continue
        weight_nodes += em.nodes
        rw.emission.extend(Emission(initializers=em.initializers, functions=em.functions, opsets=em.opsets))
    still_used |= {i for n in weight_nodes for i in n.input}  # block weights read the float one
    keep_inits = [t for t in g.initializer if t.name not in rw.replace_init or t.name in still_used]
    del g.initializer[:]
    g.initializer.extend(keep_inits)
    g.initializer.extend(rw.emission.initializers)

    ordered: list[onnx.NodeProto] = list(weight_nodes) + list(rw.new_after.get(-1, []))
    for i, n in enumerate(g.node):
        ordered.append(n)
        ordered.extend(rw.new_after.get(i, []))
    del g.node[:]
    g.node.extend(ordered)
    known = {(f.domain, f.name) for f in m.functions}
    m.functions.extend([f for f in rw.emission.functions if (f.domain, f.name) not in known])
    have = {imp.domain for imp in m.opset_import}
    for dom, ver in rw.emission.opsets.items():
        if dom not in ("", "ai.onnx") and dom not in have:
            m.opset_import.append(helper.make_opsetid(dom, ver))
    value_types = {v.name: v.type for v in [*g.input, *g.value_info, *g.output]}
    outputs = {o.name for o in g.output}
    # value_info of renamed graph-output producers is stale: shape inference recomputes it
    del g.value_info[:]
    # but a block function's output shape (its input's) is declared: onnxruntime cannot infer
    # it through the function's Reshape to Shape(x), and unknown dims there would spread through
    # the graph (slower memory planning and no shape-specialized kernels downstream)
    for out, src in rw.block_outputs.items():
        t = value_types.get(src)
        if t is not None and out not in outputs and t.tensor_type.HasField("shape"):
            vi = g.value_info.add()
            vi.name = out
            vi.type.CopyFrom(t)


#: Ops onnxruntime's QDQ propagation (1.31, default optimizations) moves a DequantizeLinear
#: through. Where the op's output reaches no QuantizeLinear, at opset 21 and above with an int8
#: zero point, it forms a QuantizeLinear whose output type (int8) and zero point (uint8, after
#: its s8 -> u8 rewrite on x86) disagree, and the session fails to load.
ORT_PROPAGATED_OPS = frozenset({"MaxPool", "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Slice"})


def _pass_propagation_room(model: onnx.ModelProto) -> PassResult:
    """The last rewrite step, on the assembled graph: after an int8 DequantizeLinear read by an
    ORT_PROPAGATED_OPS op whose output reaches no QuantizeLinear, put a quantize-dequantize with
    the DequantizeLinear's own parameters (per-tensor; down a chain of such ops). The op moves
    or picks values already on that grid, so no value changes; the plan's rules give such
    outputs their input's grid already (`plan.rules._carry_grids_through_float_passthrough`),
    this catches what they do not see (an override that puts the output in another format)."""
    res = PassResult("propagation_room")
    if model_opset(model) < 21:
        res.decline("model", "below opset 21 onnxruntime's propagation forms valid nodes")
        return res
    g = model.graph
    int8_zp = {t.name for t in g.initializer if t.data_type == onnx.TensorProto.INT8 and not t.dims}
    scalar = {t.name for t in g.initializer if not t.dims}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for n in g.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    names = NameAllocator.for_model(model)
    inserted: dict[int, list[onnx.NodeProto]] = {}  # id(op) -> the pair after it
    todo = deque(n for n in g.node if n.op_type == "DequantizeLinear" and n.domain in ("", "ai.onnx")
                 and len(n.input) == 3 and n.input[2] in int8_zp and n.input[1] in scalar)
    while todo:
        dq = todo.popleft()
        for op in consumers.get(dq.output[0], []):
            if op.op_type not in ORT_PROPAGATED_OPS or op.domain not in ("", "ai.onnx") or \
                    not op.input or op.input[0] != dq.output[0] or id(op) in inserted:
                continue
            out = op.output[0]
            if any(c.op_type == "QuantizeLinear" for c in consumers.get(out, [])):
                continue
            pre, q = names.value(out, "pre"), names.value(out, "q")
            op.output[0] = pre
            pair = [helper.make_node("QuantizeLinear", [pre, dq.input[1], dq.input[2]], [q],
                                     name=names.value(out, "QuantizeLinear")),
                    helper.make_node("DequantizeLinear", [q, dq.input[1], dq.input[2]], [out],
                                     name=names.value(out, "DequantizeLinear"))]
            inserted[id(op)] = pair
            consumers[pre] = [pair[0]]
            consumers[q] = [pair[1]]
            todo.append(pair[1])
            res.changed += 1
            res.notes.append(f"{out}: re-quantized after {op.op_type} {op.name!r} with its input's int8 "
                             "parameters (exact): onnxruntime's QDQ propagation refuses the model otherwise")
    if inserted:
        ordered = []
        for n in g.node:
            ordered.append(n)
            ordered += inserted.get(id(n), [])
        del g.node[:]
        g.node.extend(ordered)
    return res


#: The rewrite, in order; each pass declares whether it worked in place and what it changed.
REWRITE_PASSES = (_pass_bias_room, _pass_softmax_room, _pass_constants, _pass_biases, _pass_activations)


def apply_plan(model: onnx.ModelProto, plan: PrecisionPlan, qparams: dict[str, QParams], *,
               dual: bool = False, copy: bool = True,
               base_dir: str | os.PathLike | None = None) -> tuple[onnx.ModelProto, RewriteReport]:
    """Return a model with `plan` materialized using calibrated `qparams`.

    `dual`: at precision boundaries the consumer-format node reads the producer-format value
    (both quantization nodes in series) instead of the float tensor.
    `copy=False` rewrites `model` itself (and returns it): no second copy of the weights.
    `base_dir`: where deferred initializers are read from (mixq._io.load_model_deferred), one
    at a time; a deferred weight that is replaced is never loaded into the model, one left
    float stays deferred.
    """
    if copy:
        m = onnx.ModelProto()
        m.CopyFrom(model)
    else:
        m = model
    rw = _Rewrite(m, plan, qparams, dual, base_dir, RewriteReport())
    rw.report.passes.append(_pass_opset(rw))
    rw.reindex()
    for p in REWRITE_PASSES:
        rw.report.passes.append(p(rw))
    _assemble(rw)
    room = _pass_propagation_room(rw.model)
    rw.report.passes.append(room)
    if room.changed:
        rw.report.notes.append(f"{room.changed} pass-through output(s) re-quantized on their input's int8 grid "
                               "(exact), where onnxruntime's QDQ propagation would form a QuantizeLinear it "
                               "refuses: " + ", ".join(n.split(":")[0] for n in room.notes[:4])
                               + (f" and {room.changed - 4} more" if room.changed > 4 else ""))
    shapes = declare_shapes(rw.model)
    rw.report.passes.append(shapes)
    rw.report.notes += shapes.notes
    return rw.model, rw.report


