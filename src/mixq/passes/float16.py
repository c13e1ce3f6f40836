"""A float16 or bfloat16 model computed in float32 between the quantize nodes (the vendor's
`convert_fp16_to_fp32`, always on): the quantizer's grids, statistics and QDQ pairs are float32.

Widening is exact (every float16 and bfloat16 value is a float32 value), so the weights keep
their values; the arithmetic between them becomes float32, slightly more precise than the
model's (and a bfloat16 model runs on onnxruntime's CPU provider, which has few bfloat16
kernels). The model's 16-bit inputs and outputs keep their type and names: a Cast to float32
after each input, a Cast back before each output. Casts to 16-bit floats inside the graph
become casts to float32, and so do the 16-bit types named by attributes (ConstantOfShape's
value, the random generators' dtype), in subgraphs and model-local functions too.
"""
from __future__ import annotations

import os

import numpy as np
import onnx
from onnx import AttributeProto, TensorProto, helper, numpy_helper

from ..graph import PassResult

__all__ = ["compute_float16_in_float32"]

F32 = TensorProto.FLOAT
#: the 16-bit float types widened (exactly) to float32
HALVES = frozenset({TensorProto.FLOAT16, TensorProto.BFLOAT16})
#: ops whose integer `dtype` / `to` attribute names the element type they produce
_TYPE_ATTRS = {"Cast": "to", "RandomNormal": "dtype", "RandomUniform": "dtype", "RandomNormalLike": "dtype",
               "RandomUniformLike": "dtype", "EyeLike": "dtype", "Bernoulli": "dtype"}


def _has_float16(model: onnx.ModelProto) -> bool:
    g = model.graph
    return any(t.data_type in HALVES for t in g.initializer) or any(
        v.type.tensor_type.elem_type in HALVES for v in [*g.input, *g.output, *g.value_info]) or any(
        a.name == "to" and a.i in HALVES for n in g.node if n.op_type == "Cast" for a in n.attribute)


def _widen_tensor(t: TensorProto, base_dir: str | os.PathLike | None) -> None:
    """A float16 / bfloat16 TensorProto rewritten in place as the same values in float32."""
    if t.data_location == TensorProto.EXTERNAL:  # a deferred weight: read once, widened in memory
        from .._io import load_deferred_tensor

        load_deferred_tensor(t, base_dir if base_dir is not None else "")
        t.data_location = TensorProto.DEFAULT
        del t.external_data[:]
    wide = numpy_helper.to_array(t).astype(np.float32)
    t.CopyFrom(numpy_helper.from_array(wide, t.name))


def _widen_nodes(nodes: list[onnx.NodeProto], res: PassResult, base_dir: str | os.PathLike | None) -> None:
    for n in nodes:
        for a in n.attribute:
            if a.type == AttributeProto.TENSOR and a.t.data_type in HALVES:
                _widen_tensor(a.t, base_dir)
                res.changed += 1
            elif a.type == AttributeProto.INT and a.i in HALVES and _TYPE_ATTRS.get(n.op_type) == a.name:
                a.i = F32
                res.changed += 1
            elif a.type == AttributeProto.GRAPH:
                _widen_graph(a.g, res, base_dir, main=False)
            elif a.type == AttributeProto.GRAPHS:
                for sg in a.graphs:
                    _widen_graph(sg, res, base_dir, main=False)


def _widen_values(values: list[onnx.ValueInfoProto]) -> int:
    k = 0
    for v in values:
        if v.type.HasField("tensor_type") and v.type.tensor_type.elem_type in HALVES:
            v.type.tensor_type.elem_type = F32
            k += 1
    return k


def _widen_graph(g: onnx.GraphProto, res: PassResult, base_dir: str | os.PathLike | None, *, main: bool) -> None:
    for t in g.initializer:
        if t.data_type in HALVES:
            _widen_tensor(t, base_dir)
            res.changed += 1
    _widen_nodes(list(g.node), res, base_dir)
    res.changed += _widen_values(list(g.value_info))
    if not main:  # a subgraph's inputs and outputs follow the graph around it
        res.changed += _widen_values(list(g.input)) + _widen_values(list(g.output))


def _fresh(taken: set[str], base: str) -> str:
    name, k = base, 0
    while name in taken:
        k += 1
        name = f"{base}_{k}"
    taken.add(name)
    return name


def compute_float16_in_float32(model: onnx.ModelProto, base_dir: str | os.PathLike | None = None) -> PassResult:
    """Widen a float16 or bfloat16 model to float32 in place (see the module docstring);
    nothing for a model without 16-bit float tensors."""
    res = PassResult("float16 computed in float32")  # bfloat16 too
    if not _has_float16(model):
        return res
    g = model.graph
    taken = {o for n in g.node for o in n.output} | {i.name for i in g.input} | {t.name for t in g.initializer}
    inits = {t.name for t in g.initializer}
    _widen_graph(g, res, base_dir, main=True)
    for fn in model.functions:
        _widen_nodes(list(fn.node), res, base_dir)
    head: list[onnx.NodeProto] = []
    for inp in g.input:
        if inp.name in inits or inp.type.tensor_type.elem_type not in HALVES:
            continue
        wide = _fresh(taken, f"{inp.name}__fp32")
        head.append(helper.make_node("Cast", [inp.name], [wide], name=_fresh(taken, f"{inp.name}__to_fp32"), to=F32))
        for n in g.node:
            for j, x in enumerate(n.input):
                if x == inp.name:
                    n.input[j] = wide
    tail: list[onnx.NodeProto] = []
    produced = {o for n in g.node for o in n.output}
    for out in g.output:
        half = out.type.tensor_type.elem_type
        if half not in HALVES or out.name in {i.name for i in g.input}:
            continue  # an input passed straight through keeps its type
        if out.name not in produced:  # an initializer as an output: now float32
            out.type.tensor_type.elem_type = F32
            continue
        inner = _fresh(taken, f"{out.name}__fp32")
        for n in g.node:
            for j, x in enumerate(n.output):
                if x == out.name:
                    n.output[j] = inner
            for j, x in enumerate(n.input):
                if x == out.name:  # an output also read inside the graph
                    n.input[j] = inner
        tail.append(helper.make_node("Cast", [inner], [out.name], name=_fresh(taken, f"{out.name}__back"), to=half))
    if head or tail:
        nodes = head + list(g.node) + tail
        del g.node[:]
        g.node.extend(nodes)
    res.notes.append("float16/bfloat16 model: computed in float32 between the quantize nodes (weights "
                     "widened exactly; its 16-bit inputs and outputs keep their type, through Casts)")
    return res
