"""Small helpers to build and run the ONNX pieces formats emit.

Building (`make_function`, `const_tensor`, `node`) is pure onnx; `run_emission` imports
onnxruntime lazily, so the pure core never needs it at import time."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .base import MIXQ_DOMAIN, MIXQ_DOMAIN_VERSION, Emission

#: Default-domain opset every emission targets (QuantizeLinear block_size / int4 / float8: 21).
ONNX_OPSET = 21


def make_function(name: str, inputs: Sequence[str], outputs: Sequence[str],
                  nodes: Sequence[onnx.NodeProto], opset: int = ONNX_OPSET,
                  attributes: Sequence[str] = (), doc: str = "") -> onnx.FunctionProto:
    """A model-local function `name` in MIXQ_DOMAIN whose body uses the default opset `opset`."""
    return helper.make_function(MIXQ_DOMAIN, name, list(inputs), list(outputs), list(nodes),
                                [helper.make_opsetid("", opset)], list(attributes), doc_string=doc)


def const_tensor(name: str, array: Any, dtype: Any = None) -> onnx.TensorProto:
    """A TensorProto initializer named `name` holding `array` (optionally cast to `dtype`).

    int4/uint4 (ml_dtypes) arrays are packed two per byte by onnx.numpy_helper."""
    arr = np.asarray(array) if dtype is None else np.asarray(array).astype(dtype)
    return numpy_helper.from_array(arr, name)


def const_node(name: str, array: Any, dtype: Any = None) -> onnx.NodeProto:
    """A Constant node producing `name` (for function bodies, which have no initializers)."""
    return helper.make_node("Constant", [], [name], value=const_tensor(name, array, dtype))


def emission_outputs(emission: Emission) -> list[str]:
    """Names the emission's nodes produce that none of its nodes consume (its outputs)."""
    produced = [o for n in emission.nodes for o in n.output if o]
    consumed = {i for n in emission.nodes for i in n.input}
    return [o for o in produced if o not in consumed]


def emission_to_model(emission: Emission, input_types: Mapping[str, int],
                      output_names: Sequence[str] | None = None,
                      output_types: Mapping[str, int] | None = None,
                      input_shapes: Mapping[str, Sequence[int | str | None]] | None = None,
                      ) -> onnx.ModelProto:
    """Wrap `emission` into a ModelProto: opset 21 + its functions + the MIXQ_DOMAIN import.

    `input_types` maps graph input names to TensorProto element types (`input_shapes` to their
    shapes, default: rank-unknown dims are not allowed by the checker, so give shapes when the
    model is checked); outputs default to the emission's unconsumed node outputs, typed FLOAT
    unless `output_types` says otherwise, shaped by ONNX shape inference where it can."""
    outs = list(output_names) if output_names is not None else emission_outputs(emission)
    output_types = dict(output_types or {})
    input_shapes = dict(input_shapes or {})
    inputs = [helper.make_tensor_value_info(n, t, input_shapes.get(n)) for n, t in input_types.items()]
    outputs = [helper.make_tensor_value_info(n, output_types.get(n, onnx.TensorProto.FLOAT), None)
               for n in outs]
    graph = helper.make_graph(list(emission.nodes), "mixq_emission", inputs, outputs,
                              initializer=list(emission.initializers))
    opsets = {"": ONNX_OPSET, MIXQ_DOMAIN: MIXQ_DOMAIN_VERSION}
    for dom, ver in emission.opsets.items():
        opsets[dom] = max(ver, opsets.get(dom, 0))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets.items()],
                              functions=list(emission.functions))
    model.ir_version = 10  # IR 10 carries opset 21 and is read by onnxruntime 1.31
    try:  # give graph outputs the shapes inference finds (the checker wants a shape field)
        inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
        known = {v.name: v for v in list(inferred.graph.value_info) + list(inferred.graph.output)}
        for out in model.graph.output:
            src = known.get(out.name)
            if src is not None and src.type.tensor_type.HasField("shape"):
                out.type.tensor_type.shape.CopyFrom(src.type.tensor_type.shape)
    except onnx.shape_inference.InferenceError:
        pass  # the checker reports the real problem
    for out in model.graph.output:  # at least an (empty-dims-unknown) shape field
        if not out.type.tensor_type.HasField("shape"):
            out.type.tensor_type.shape.SetInParent()
    return model


def run_emission(emission: Emission, input_arrays: Mapping[str, np.ndarray],
                 input_types: Mapping[str, int] | None = None, *,
                 output_names: Sequence[str] | None = None,
                 output_types: Mapping[str, int] | None = None,
                 check: bool = True) -> list[np.ndarray]:
    """Run `emission` in stock onnxruntime (CPU, default session options), return its outputs.

    The model is checked with onnx.checker.check_model(full_check=True) first. `input_types`
    defaults to the element types of `input_arrays`."""
    import onnxruntime as ort  # lazy: the pure core never imports onnxruntime

    arrays = {k: np.asarray(v) for k, v in input_arrays.items()}
    types = dict(input_types) if input_types is not None else {}
    for k, v in arrays.items():
        types.setdefault(k, helper.np_dtype_to_tensor_dtype(v.dtype))
    shapes = {k: list(v.shape) for k, v in arrays.items()}
    model = emission_to_model(emission, types, output_names, output_types, shapes)
    if check:
        onnx.checker.check_model(model, full_check=True)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, arrays)


def expand_param_nodes(ref: str, param: str, out: str, *, axis: int | None,
                       block_size: int | None, prefix: str) -> list[onnx.NodeProto]:
    """Nodes that broadcast a per-channel / per-block float `param` to the full shape of `ref`.

    ONNX has no "repeat along axis" op; DequantizeLinear of an int8 tensor of ones does exactly
    that (1 * scale is exact) and takes `axis` (negative ok) and `block_size` like QuantizeLinear,
    so the expansion needs neither the rank nor the shape of `ref` at build time."""
    shape, ones = f"{prefix}/shape", f"{prefix}/ones"
    attrs: dict[str, Any] = {}  # node attributes for make_node(**attrs)
    if axis is not None:
        attrs["axis"] = int(axis)
    if block_size:
        attrs["block_size"] = int(block_size)
    return [
        helper.make_node("Shape", [ref], [shape], name=f"{prefix}/Shape"),
        helper.make_node("ConstantOfShape", [shape], [ones], name=f"{prefix}/ConstantOfShape",
                         value=helper.make_tensor("value", onnx.TensorProto.INT8, [1], [1])),
        helper.make_node("DequantizeLinear", [ones, param], [out], name=f"{prefix}/Expand", **attrs),
    ]
