"""Read-only analysis of a model's main graph for the converters: element types of every
tensor (ONNX type inference on a weight-free skeleton, so it is fast and works past 2 GiB),
producers and consumers, names used inside subgraphs, and ONNX schema type bindings."""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import onnx
from onnx import AttributeProto, TensorProto, helper

from ..graph import schema_types

__all__ = ["GraphInfo", "analyze", "input_var", "output_var", "allowed_types", "NON_DATA_INPUTS",
           "VALUE_AGNOSTIC", "ATTR_TYPED_OPS", "subgraph_names", "default_opset"]

#: Inputs that are float but are parameters, not data: rounding them would change shapes or
#: semantics (Resize scales, Dropout ratio) or they are only read for their shape.
NON_DATA_INPUTS: dict[str, frozenset[int]] = {
    "Resize": frozenset({1, 2}),       # roi, scales
    "Upsample": frozenset({1}),        # scales
    "Dropout": frozenset({1}),         # ratio
    "Range": frozenset({0, 1, 2}),     # start/limit/delta decide the output length
    "Shape": frozenset({0}),
    "Size": frozenset({0}),
    "EyeLike": frozenset({0}),
    "RandomNormalLike": frozenset({0}),
    "RandomUniformLike": frozenset({0}),
    "BernoulliLike": frozenset({0}),
}

#: Ops that only read the shape of their input (any element type will do).
VALUE_AGNOSTIC = frozenset({"Shape", "Size"})

#: Ops whose float output type is chosen by an attribute, not by their inputs.
ATTR_TYPED_OPS = frozenset({"ConstantOfShape", "RandomNormal", "RandomUniform", "RandomNormalLike",
                            "RandomUniformLike", "EyeLike", "Multinomial", "Bernoulli"})


def default_opset(model: onnx.ModelProto) -> int:
    """The model's default-domain ('' / 'ai.onnx') opset version."""
    for op in model.opset_import:
        if op.domain in ("", "ai.onnx"):
            return int(op.version)
    return 1


def subgraph_names(g: onnx.GraphProto) -> set[str]:
    """Every tensor name a (sub)graph reads, recursively (a superset of its outer-scope refs)."""
    names: set[str] = set()
    for node in g.node:
        names.update(i for i in node.input if i)
        for attr in node.attribute:
            if attr.type == AttributeProto.GRAPH:
                names |= subgraph_names(attr.g)
            elif attr.type == AttributeProto.GRAPHS:
                for sub in attr.graphs:
                    names |= subgraph_names(sub)
    for o in g.output:
        names.add(o.name)
    return names


def outer_scope_names(g: onnx.GraphProto) -> set[str]:
    """Names read inside the subgraphs of g's nodes (candidates for outer-scope references)."""
    names: set[str] = set()
    for node in g.node:
        for a in node.attribute:
            if a.type == AttributeProto.GRAPH:
                names |= subgraph_names(a.g)
            elif a.type == AttributeProto.GRAPHS:
                for sub in a.graphs:
                    names |= subgraph_names(sub)
    return names


def has_subgraph(node: onnx.NodeProto) -> bool:
    """Whether the node carries a GRAPH/GRAPHS attribute (If, Loop, Scan, ...)."""
    return any(a.type in (AttributeProto.GRAPH, AttributeProto.GRAPHS) for a in node.attribute)


@dataclass
class GraphInfo:
    """Facts about the main graph the converters need."""

    types: dict[str, int]
    producer: dict[str, int]
    consumers: dict[str, list[tuple[int, int]]]
    initializers: dict[str, TensorProto]
    graph_inputs: list[str]
    graph_outputs: list[str]
    outer_refs: set[str]
    opset: int
    unknown_types: set[str] = field(default_factory=set)

    def dtype(self, name: str) -> int | None:
        return self.types.get(name)


def _elem_type(vi: onnx.ValueInfoProto) -> int | None:
    tt = vi.type.tensor_type if vi.type.HasField("tensor_type") else None
    if tt is None or not tt.elem_type:
        return None
    return int(tt.elem_type)


def infer_types(model: onnx.ModelProto) -> dict[str, int]:
    """Element type of every main-graph tensor ONNX type inference can determine.

    Inference runs on a skeleton (initializers replaced by typed graph inputs), so it never
    copies weights and works for models past the 2 GiB protobuf limit."""
    g = model.graph
    skel = onnx.GraphProto()
    skel.name = g.name or "g"
    skel.node.extend(g.node)
    skel.input.extend(g.input)
    seen = {i.name for i in g.input}
    for t in g.initializer:
        if t.name not in seen:
            skel.input.append(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    skel.output.extend(g.output)
    skel.value_info.extend(g.value_info)
    m = onnx.ModelProto()
    m.ir_version = model.ir_version
    m.opset_import.extend(model.opset_import)
    m.functions.extend(model.functions)
    m.graph.CopyFrom(skel)
    types: dict[str, int] = {}
    try:
        inferred = onnx.shape_inference.infer_shapes(m, check_type=False, strict_mode=False)
        vis = list(inferred.graph.input) + list(inferred.graph.value_info) + list(inferred.graph.output)
    except Exception:  # inference failure: fall back on what the model declares
        vis = list(g.input) + list(g.value_info) + list(g.output)
    for vi in vis:
        et = _elem_type(vi)
        if et is not None:
            types.setdefault(vi.name, et)
    for t in g.initializer:
        types[t.name] = int(t.data_type)
    schema_types(model, types)
    for node in g.node:  # Constant outputs, in case inference skipped them
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
            for a in node.attribute:
                if a.name == "value" and a.type == AttributeProto.TENSOR:
                    types.setdefault(node.output[0], int(a.t.data_type))
                elif a.name in ("value_float", "value_floats"):
                    types.setdefault(node.output[0], TensorProto.FLOAT)
    return types


def analyze(model: onnx.ModelProto) -> GraphInfo:
    """Collect types, producers, consumers and subgraph references of the main graph."""
    g = model.graph
    producer: dict[str, int] = {}
    consumers: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for k, node in enumerate(g.node):
        for o in node.output:
            if o:
                producer[o] = k
        for j, i in enumerate(node.input):
            if i:
                consumers[i].append((k, j))
    outer = outer_scope_names(g)
    types = infer_types(model)
    known = set(producer) | {i.name for i in g.input} | {t.name for t in g.initializer}
    unknown = {n for n in known if n not in types}
    return GraphInfo(types=types, producer=producer, consumers=dict(consumers),
                     initializers={t.name: t for t in g.initializer},
                     graph_inputs=[i.name for i in g.input], graph_outputs=[o.name for o in g.output],
                     outer_refs=outer & known, opset=default_opset(model), unknown_types=unknown)


# ----------------------------------------------------------------------------- schemas

_SCHEMA_CACHE: dict[tuple[str, str, int], object] = {}


def get_schema(op_type: str, domain: str, opset: int):
    """The ONNX OpSchema of `op_type` at `opset`, or None (custom / unknown ops)."""
    key = (op_type, domain, opset)
    if key not in _SCHEMA_CACHE:
        try:
            _SCHEMA_CACHE[key] = onnx.defs.get_schema(op_type, opset, "" if domain == "ai.onnx" else domain)
        except Exception:
            _SCHEMA_CACHE[key] = None
    return _SCHEMA_CACHE[key]


def _formal(params, idx: int):
    if idx < len(params):
        return params[idx]
    if params and params[-1].option == onnx.defs.OpSchema.FormalParameterOption.Variadic:
        return params[-1]
    return None


def input_var(schema, idx: int) -> str | None:
    """The type string of input `idx` ('T', 'T1', or a concrete 'tensor(float)')."""
    p = _formal(schema.inputs, idx) if schema is not None else None
    return p.type_str if p is not None else None


def output_var(schema, idx: int) -> str | None:
    """The type string of output `idx`."""
    p = _formal(schema.outputs, idx) if schema is not None else None
    return p.type_str if p is not None else None


def allowed_types(schema, type_str: str | None) -> set[str]:
    """The allowed type strings ('tensor(bfloat16)', ...) of a type variable or concrete type."""
    if schema is None or type_str is None:
        return set()
    for c in schema.type_constraints:
        if c.type_param_str == type_str:
            return set(c.allowed_type_strs)
    return {type_str}


TYPE_STR: dict[int, str] = {TensorProto.FLOAT: "tensor(float)", TensorProto.FLOAT16: "tensor(float16)",
            TensorProto.BFLOAT16: "tensor(bfloat16)", TensorProto.DOUBLE: "tensor(double)"}
