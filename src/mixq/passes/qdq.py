"""Materialize a precision plan: insert quantize-dequantize for every planned tensor.

Activations get their format's run-time QDQ (native QuantizeLinear/DequantizeLinear, Cast pairs,
or a model-local function) right where they are produced; weights are replaced by their stored
quantized form; biases become int32 + DequantizeLinear when planned so.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .._io import tensor_array
from ..formats import Emission, QParams, get_format
from ..plan.plan import PrecisionPlan
from ..plan.qparams import consumer_key

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


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "_." else "_" for c in name)


def _bias_qparams(node: onnx.NodeProto, plan: PrecisionPlan, qparams: dict[str, QParams]
                  ) -> tuple[np.ndarray, str] | tuple[None, str]:
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
    return (np.float32(sx.reshape(())) * sw.reshape(-1)).astype(np.float32), ""


def _int32_bias(b: np.ndarray, scale: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """int32 codes of a finite bias at `scale` (per element), each scale multiplied by the
    smallest power of two 2**k that keeps its codes within int32; returns (scale, codes, max k).

    Where input scale x weight scale is tiny (16-bit activations and weights) b / scale
    overflows int32. A float bias is no way out: onnxruntime's basic optimizations quantize a
    float Conv/Gemm bias between QDQ inputs to int32 at that very scale, without a range check
    (S16S16 on the PP-OCR classifier: 62 % instead of 100 %). 2**k keeps 31 bits of precision."""
    with np.errstate(divide="ignore"):
        need = np.abs(b) / scale.astype(np.float64) / _INT32_MAX
    # k = ceil(log2(need)) exactly: need = m * 2**e with m in [0.5, 1)
    m, e = np.frexp(need)
    k = np.where(need > 1.0, np.where(m == 0.5, e - 1, e), 0).astype(np.int64)
    scale = np.ldexp(scale, k).astype(np.float32)
    return scale, np.rint(b / scale.astype(np.float64)), int(k.max(initial=0))


def _static_shape(t: onnx.TypeProto | None) -> tuple[int | None, ...] | None:
    """The dims of a tensor type (None where unknown), or None without a shape."""
    if t is None or not t.HasField("tensor_type") or not t.tensor_type.HasField("shape"):
        return None
    return tuple(d.dim_value if d.HasField("dim_value") else None for d in t.tensor_type.shape.dim)


def _upgrade_for(m: onnx.ModelProto, plan: PrecisionPlan, rep: RewriteReport) -> onnx.ModelProto:
    """`m` at the default-domain opset every planned format's ONNX needs (block formats: 25)."""
    from .prepare import model_opset, upgrade_opset

    names = {tp.format for tp in plan.tensors.values() if tp.format}
    names |= {f for tp in plan.tensors.values() for f in tp.consumer_formats.values() if f}
    need = max((get_format(f).onnx_opset for f in names), default=0)
    have = model_opset(m)
    if need <= have:
        return m
    rep.notes.append(f"model upgraded from opset {have} to {need}, which its formats' ONNX needs")
    return upgrade_opset(m, need)


def apply_plan(model: onnx.ModelProto, plan: PrecisionPlan, qparams: dict[str, QParams], *,
               dual: bool = False, copy: bool = True,
               base_dir: str | os.PathLike | None = None) -> tuple[onnx.ModelProto, RewriteReport]:
    """Return a new model with `plan` materialized using calibrated `qparams`.

    `dual`: at precision boundaries the consumer-format node reads the producer-format value
    (both quantization nodes in series) instead of the float tensor.
    `copy=False` rewrites `model` itself (and returns it): no second copy of the weights.
    `base_dir`: where deferred initializers are read from (mixq._io.load_model_deferred), one
    at a time; a deferred weight that is replaced is never loaded into the model, one left
    float stays deferred.
    """
    rep = RewriteReport()
    if copy:
        m = onnx.ModelProto()
        m.CopyFrom(model)
    else:
        m = model
    m = _upgrade_for(m, plan, rep)
    g = m.graph
    inits = {t.name: t for t in g.initializer}
    graph_outputs = {o.name for o in g.output}
    value_types = {v.name: v.type for v in [*g.input, *g.value_info, *g.output]}
    block_outputs: dict[str, str] = {}  # block-function output -> the tensor whose shape it has
    producers = {o: n for n in g.node for o in n.output}
    emission = Emission()
    rename: dict[str, str] = {}          # tensor -> name its consumers read after the rewrite
    node_rename: dict[tuple[str, str], str] = {}  # (consumer node, tensor) -> boundary conversion
    replace_init: dict[str, Emission] = {}
    new_before: dict[int, list[onnx.NodeProto]] = {}  # insert after producer node index
    node_index = {id(n): i for i, n in enumerate(g.node)}
    bias_owner = {}
    for n in g.node:
        if n.op_type in ("Conv", "ConvTranspose", "Gemm") and len(n.input) > 2 and n.input[2]:
            bias_owner[n.input[2]] = n

    for name, tp in plan.tensors.items():
        if tp.format is None:
            if tp.role == "bias":
                rep.biases_kept_float[name] = tp.reason
            continue
        fmt = get_format(tp.format)
        prefix = _safe(name)
        qp = qparams.get(tp.group or name) if tp.role == "activation" else qparams.get(name)
        if tp.role in ("weight", "constant"):
            w = tensor_array(inits[name], base_dir)
            out = f"{name}__mq"
            axis = tp.block_axis if fmt.kind == "block" else (qp.axis if qp is not None else None)
            em = fmt.emit_weight(w, out, qparams=qp, axis=axis, prefix=prefix)
            replace_init[name] = em
            rename[name] = out
            rep.weights_quantized += 1
            del w  # a deferred weight: only one float array in memory at a time
        elif tp.role == "bias":
            owner = bias_owner.get(name)
            scale, why = _bias_qparams(owner, plan, qparams) if owner is not None else (None, "no owner")
            b = tensor_array(inits[name], base_dir).astype(np.float64)
            if scale is not None and not np.all(np.isfinite(b)):
                scale, why = None, "the bias holds NaN or inf; kept float"
            if scale is not None:
                scale, q, shift = _int32_bias(b, np.broadcast_to(scale, b.shape).astype(np.float32))
                if shift:
                    rep.notes.append(f"bias {name}: int32 at input scale x weight scale x 2**{shift} "
                                     "(the product alone would overflow int32)")
            if scale is None:
                rep.biases_kept_float[name] = why
                continue
            qname, sname, out = f"{prefix}__q", f"{prefix}__scale", f"{name}__mq"
            em = Emission(
                nodes=[helper.make_node("DequantizeLinear", [qname, sname], [out], name=f"{prefix}__dq", axis=0)],
                initializers=[numpy_helper.from_array(q.astype(np.int32), qname),
                              numpy_helper.from_array(scale, sname)],
                opsets={"": 21})
            replace_init[name] = em
            rename[name] = out
            rep.biases_int32 += 1
        else:  # activation
            if fmt.needs_qparams and qp is None:
                rep.notes.append(f"{name}: no statistics were collected; left float")
                continue
            is_output = name in graph_outputs
            prod = producers.get(name)
            if is_output and prod is None:  # a graph input that is also an output: leave it
                continue
            float_name = f"{name}__f" if is_output else name
            quant_name = name if is_output else f"{name}__mq"
            em = fmt.emit(float_name, quant_name, qparams=qp if fmt.needs_qparams else None,
                          axis=tp.block_axis if fmt.kind == "block" else (qp.axis if qp else None),
                          prefix=prefix, shape=_static_shape(value_types.get(name)))
            if fmt.kind == "block":
                block_outputs[quant_name] = name
            if is_output:
                prod.output[list(prod.output).index(name)] = float_name
            else:
                rename[name] = quant_name
            key = node_index[id(prod)] if prod is not None else -1
            new_before.setdefault(key, []).extend(em.nodes)
            emission.extend(Emission(initializers=em.initializers, functions=em.functions, opsets=em.opsets))
            rep.activations_quantized += 1
            # precision boundaries: consumers in another format read a conversion node, fed by
            # the float tensor, or with dual quant nodes by the producer-format value
            for cfmt_name in sorted(set(tp.consumer_formats.values())):
                cfmt = get_format(cfmt_name)
                cqp = qparams.get(consumer_key(name, cfmt_name))
                if cfmt.needs_qparams and cqp is None:
                    rep.notes.append(f"{name} ({cfmt_name} consumers): no statistics; left float")
                    continue
                cout = f"{name}__mq_{_safe(cfmt_name)}"
                cem = cfmt.emit(quant_name if dual else float_name, cout,
                                qparams=cqp if cfmt.needs_qparams else None,
                                axis=tp.block_axis if cfmt.kind == "block" else (cqp.axis if cqp else None),
                                prefix=f"{prefix}__{_safe(cfmt_name)}",
                                shape=_static_shape(value_types.get(name)))
                if cfmt.kind == "block":
                    block_outputs[cout] = name
                new_before[key].extend(cem.nodes)
                emission.extend(Emission(initializers=cem.initializers, functions=cem.functions,
                                         opsets=cem.opsets))
                for node_name, f in tp.consumer_formats.items():
                    if f == cfmt_name:
                        node_rename[(node_name, name)] = cout
                rep.boundary_conversions += 1

    # rewire consumers (the inserted nodes read the original names)
    inserted = {id(n) for ns in new_before.values() for n in ns}
    for n in g.node:
        if id(n) in inserted:
            continue
        for i, inp in enumerate(n.input):
            if (n.name, inp) in node_rename:
                n.input[i] = node_rename[(n.name, inp)]
            elif inp in rename:
                n.input[i] = rename[inp]
    # weights and biases: drop float initializers no other node reads, add stored forms
    still_used = {i for n in g.node for i in n.input} | graph_outputs
    weight_nodes: list[onnx.NodeProto] = []
    for name, em in replace_init.items():
        weight_nodes += em.nodes
        emission.extend(Emission(initializers=em.initializers, functions=em.functions, opsets=em.opsets))
    still_used |= {i for n in weight_nodes for i in n.input}  # block weights read the float one
    keep_inits = [t for t in g.initializer if t.name not in replace_init or t.name in still_used]
    del g.initializer[:]
    g.initializer.extend(keep_inits)
    g.initializer.extend(emission.initializers)

    ordered: list[onnx.NodeProto] = list(weight_nodes) + list(new_before.get(-1, []))
    for i, n in enumerate(g.node):
        ordered.append(n)
        ordered.extend(new_before.get(i, []))
    del g.node[:]
    g.node.extend(ordered)
    known = {(f.domain, f.name) for f in m.functions}
    m.functions.extend([f for f in emission.functions if (f.domain, f.name) not in known])
    have = {imp.domain: imp for imp in m.opset_import}
    for dom, ver in emission.opsets.items():
        if dom in ("", "ai.onnx"):
            continue
        if dom not in have:
            m.opset_import.append(helper.make_opsetid(dom, ver))
    # value_info of renamed graph-output producers is stale: shape inference recomputes it
    del g.value_info[:]
    # but a block function's output shape (its input's) is declared: onnxruntime cannot infer
    # it through the function's Reshape to Shape(x), and unknown dims there would spread through
    # the graph (slower memory planning and no shape-specialized kernels downstream)
    for out, src in block_outputs.items():
        t = value_types.get(src)
        if t is not None and out not in graph_outputs and t.tensor_type.HasField("shape"):
            vi = g.value_info.add()
            vi.name = out
            vi.type.CopyFrom(t)
    return m, rep
