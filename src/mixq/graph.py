"""The graph layer: def-use over an ONNX model, subgraph-aware, and one name allocator.

Every stage that reads or rewrites a graph (prepare, plan, rewrite, calibration) asks a
`GraphIndex` instead of building its own producer/consumer maps, and takes new names from a
`NameAllocator`, which knows every name in the model (all graphs, nodes, functions) and every
name it handed out, so a new name can never collide with one the model already has.

The storage stays `onnx.ModelProto`: the format emitters produce protos, big models keep their
weights deferred in external data (mixq._io) and outputs stay byte-identical to what the
protos serialize to. The index is a view: it is rebuilt (cheaply, O(nodes)) after a pass that
changes the graph, never kept stale (`GraphIndex.of` is the one constructor).
"""
from __future__ import annotations

import re
from collections.abc import Callable, Collection, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
import onnx.helper

__all__ = ["GraphIndex", "NameAllocator", "subgraphs", "walk_graphs", "outer_scope_reads", "all_names",
           "int_attr", "float_attr", "set_attr", "name_matcher", "names_and_patterns", "model_opset",
           "tensor_type", "static_shape", "is_float_type", "with_outputs", "with_weights", "PassResult"]

FLOAT_TYPES = frozenset({onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16,
                         onnx.TensorProto.BFLOAT16, onnx.TensorProto.DOUBLE})


def subgraphs(node: onnx.NodeProto) -> Iterator[onnx.GraphProto]:
    """The graphs held in `node`'s attributes (If branches, Loop/Scan bodies)."""
    for a in node.attribute:
        if a.type == onnx.AttributeProto.GRAPH:
            yield a.g
        elif a.type == onnx.AttributeProto.GRAPHS:
            yield from a.graphs


def walk_graphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    """`graph` and every subgraph inside it, at any depth (depth first)."""
    yield graph
    for n in graph.node:
        for sg in subgraphs(n):
            yield from walk_graphs(sg)


def outer_scope_reads(graph: onnx.GraphProto) -> set[str]:
    """Names a (sub)graph reads that it does not define itself: values of an enclosing scope."""
    defined = {i.name for i in graph.input} | {t.name for t in graph.initializer}
    defined |= {t.values.name for t in graph.sparse_initializer}
    reads: set[str] = set()
    for n in graph.node:
        reads.update(i for i in n.input if i and i not in defined)
        for sg in subgraphs(n):
            reads.update(r for r in outer_scope_reads(sg) if r not in defined)
        defined.update(o for o in n.output if o)
    reads.update(o.name for o in graph.output if o.name not in defined)
    return reads


def all_names(model: onnx.ModelProto) -> set[str]:
    """Every name used anywhere in `model`: values, initializers, nodes, in every graph and in
    the model-local functions."""
    names: set[str] = set()
    for g in walk_graphs(model.graph):
        names.update(v.name for v in [*g.input, *g.output, *g.value_info])
        names.update(t.name for t in g.initializer)
        names.update(t.values.name for t in g.sparse_initializer)
        for n in g.node:
            names.add(n.name)
            names.update(n.input)
            names.update(n.output)
    for f in model.functions:
        names.add(f.name)
        for n in f.node:
            names.add(n.name)
            names.update(n.input)
            names.update(n.output)
    names.discard("")
    return names


_UNSAFE = re.compile(r"[^0-9A-Za-z_.]")


class NameAllocator:
    """Fresh names that collide with nothing in the model nor with each other.

    `fresh("conv1.weight", "q")` -> "conv1.weight__q", or "conv1.weight__q_2" when taken. The
    base is kept readable (only characters unsafe in file names are replaced) but uniqueness is
    checked against the real set of names, so `a:b` and `a_b` (which sanitize alike) still get
    different names, and a model that already has `x__mq` gets `x__mq_2`."""

    def __init__(self, taken: set[str]) -> None:
        self._taken = set(taken)
        # the part before the first "/" of every name: a prefix whose emitted names are
        # f"{prefix}/..." must not be one of them
        self._heads = {n.split("/", 1)[0] for n in taken if "/" in n}
        self._prefixes: set[str] = set()

    @classmethod
    def for_model(cls, model: onnx.ModelProto) -> "NameAllocator":
        return cls(all_names(model))

    @staticmethod
    def _first_free(name: str, taken: set[str], *also: set[str]) -> str:
        """`name`, or `name_2`, `name_3`... : the first not in `taken` (nor in `also`)."""
        candidate, i = name, 2
        while candidate in taken or any(candidate in t for t in also):
            candidate = f"{name}_{i}"
            i += 1
        taken.add(candidate)
        return candidate

    def prefix(self, base: str) -> str:
        """A fresh namespace for emitted names `f"{prefix}/..."`: no name of the model starts
        with it, and no earlier prefix is the same (so `a:b` and `a_b` get two)."""
        return self._first_free(_UNSAFE.sub("_", base) if base else "t", self._prefixes, self._heads)

    def value(self, base: str, suffix: str) -> str:
        """A fresh value or node name `f"{base}__{suffix}"` (base kept verbatim: ONNX names may
        hold any character), numbered when taken."""
        return self._first_free(f"{base}__{suffix}", self._taken)

    def exact(self, name: str) -> str:
        """`name` itself when free, else `name_2`, `name_3`...: for passes whose names users
        see (a folded bias), kept as they were when nothing collides."""
        return self._first_free(name, self._taken)

    def reserve(self, name: str) -> None:
        """Mark `name` as used (a name the caller creates itself)."""
        self._taken.add(name)

    def __contains__(self, name: object) -> bool:
        return name in self._taken


def int_attr(node: onnx.NodeProto, name: str, default: int) -> int:
    """`node`'s integer attribute `name`, or `default` where it has none."""
    for a in node.attribute:
        if a.name == name:
            return int(a.i)
    return default


def names_and_patterns(names: Iterable[str]) -> tuple[frozenset[str], tuple[str, ...]]:
    """`names` split into plain names (looked up) and fnmatch patterns (matched)."""
    names = tuple(names)
    globs = tuple(p for p in names if any(c in p for c in "*?["))
    return frozenset(names).difference(globs), globs


def name_matcher(names: Collection[str]) -> Callable[[str], bool]:
    """Whether a node name is one of `names` or matches one of its fnmatch patterns."""
    import fnmatch

    plain, globs = names_and_patterns(names)
    return lambda name: bool(name) and (name in plain or any(fnmatch.fnmatchcase(name, g) for g in globs))


def float_attr(node: onnx.NodeProto, name: str, default: float) -> float:
    """`node`'s numeric attribute `name` as a float (a FLOAT or an INT one), or `default`."""
    for a in node.attribute:
        if a.name == name:
            return float(a.f) if a.type == onnx.AttributeProto.FLOAT else float(a.i)
    return default


def set_attr(node: onnx.NodeProto, name: str, value: Any) -> None:
    """Set `node`'s attribute `name` to `value`, replacing the one it has."""
    keep = [a for a in node.attribute if a.name != name]
    del node.attribute[:]
    node.attribute.extend(keep + [onnx.helper.make_attribute(name, value)])


def model_opset(model: onnx.ModelProto) -> int:
    """The model's default-domain ('' / 'ai.onnx') opset version; 0 when it imports none."""
    for imp in model.opset_import:
        if imp.domain in ("", "ai.onnx"):
            return int(imp.version)
    return 0


def with_outputs(model: onnx.ModelProto, names: list[str]) -> onnx.ModelProto:
    """A copy of `model` that also outputs the float tensors `names` (those not outputs
    already), for a run that reads intermediate values."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    have = {o.name for o in m.graph.output}
    m.graph.output.extend(onnx.helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, None)
                          for n in names if n not in have)
    return m


def with_weights(model: onnx.ModelProto, weights: dict[str, np.ndarray]) -> onnx.ModelProto:
    """A copy of `model` whose initializers named in `weights` hold those values instead."""
    from onnx import numpy_helper

    m = onnx.ModelProto()
    m.CopyFrom(model)
    for init in m.graph.initializer:
        if init.name in weights:
            init.CopyFrom(numpy_helper.from_array(weights[init.name], init.name))
    return m


def conv_padding(auto_pad: str, pads: list[int], spatial: list[int] | tuple[int, ...], kernel: list[int],
                 strides: list[int], dilations: list[int]) -> list[tuple[int, int]]:
    """(begin, end) padding of each spatial dim of a Conv (or pooling) over an input of
    `spatial` dims: `pads` (begin dims, then end dims) as given, none for VALID, and SAME_UPPER
    / SAME_LOWER as ONNX sizes it (the output ceil(in / stride); the odd pixel at the end for
    UPPER, at the start for LOWER)."""
    nd = len(kernel)
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        out = []
        for i, dim in enumerate(spatial):
            span = (kernel[i] - 1) * dilations[i] + 1
            total = max((-(-dim // strides[i]) - 1) * strides[i] + span - dim, 0)
            small = total // 2
            out.append((small, total - small) if auto_pad == "SAME_UPPER" else (total - small, small))
        return out
    if auto_pad == "VALID":
        return [(0, 0)] * nd
    return [(pads[i], pads[i + nd]) for i in range(nd)]


def per_channel(c: np.ndarray, rank: int, channels: int) -> np.ndarray | None:
    """The constant `c`, broadcast against a rank-`rank` tensor, as one value per channel (axis
    1), or None when it varies along another axis (or would widen the tensor)."""
    if c.ndim > rank:
        return None
    shape = (1,) * (rank - c.ndim) + c.shape
    if any(d != 1 for i, d in enumerate(shape) if i != 1) or shape[1] not in (1, channels):
        return None
    return np.broadcast_to(c.reshape(-1), (channels,))


def tensor_type(t: onnx.TypeProto | None) -> int:
    """The element type of a tensor type, 0 when unknown or not a tensor."""
    if t is None or not t.HasField("tensor_type"):
        return 0
    return int(t.tensor_type.elem_type)


def static_shape(t: onnx.TypeProto | None) -> tuple[int | None, ...] | None:
    """The dims of a tensor type (None where unknown), or None without a shape."""
    if t is None or not t.HasField("tensor_type") or not t.tensor_type.HasField("shape"):
        return None
    return tuple(d.dim_value if d.HasField("dim_value") else None for d in t.tensor_type.shape.dim)


def is_float_type(elem_type: int) -> bool:
    return elem_type in FLOAT_TYPES


_TYPE_NAMES = {f"tensor({onnx.helper.tensor_dtype_to_string(t).split('.')[-1].lower()})": int(t)
               for t in onnx.TensorProto.DataType.values() if t != onnx.TensorProto.UNDEFINED}


def schema_types(model: onnx.ModelProto, types: dict[str, int]) -> None:
    """Type (in `types`, element types by name) the node outputs of the main graph that ONNX
    inference left untyped, from each op's schema, in graph order: an output whose type
    variable an input binds takes that input's type, one the schema fixes to a single type
    takes it. ONNX infers no type through some function ops (GroupNormalization):
    without this every tensor after one is untyped: the converters neither converted nor cast it
    (a bfloat16 tensor reached a float Conv), and the quantizer planned none of it."""
    opsets = {(d.domain or ""): int(d.version) for d in model.opset_import}
    for node in model.graph.node:
        missing = [o for o in node.output if o and o not in types]
        domain = "" if node.domain in ("", "ai.onnx") else node.domain
        if not missing or domain not in opsets:
            continue
        try:
            schema = onnx.defs.get_schema(node.op_type, opsets[domain], domain)
        except Exception:  # noqa: BLE001 - a custom op: no schema, left untyped
            continue
        bound: dict[str, int] = {}
        for i, name in enumerate(node.input):
            if not schema.inputs or not name or name not in types:
                continue
            formal = schema.inputs[min(i, len(schema.inputs) - 1)]
            bound.setdefault(formal.type_str, types[name])
        allowed = {c.type_param_str: list(c.allowed_type_strs) for c in schema.type_constraints}
        for j, name in enumerate(node.output):
            if not name or name in types or not schema.outputs:
                continue
            ts = schema.outputs[min(j, len(schema.outputs) - 1)].type_str
            only = allowed.get(ts, [ts])
            if ts in bound:
                types[name] = bound[ts]
            elif len(only) == 1 and only[0] in _TYPE_NAMES:
                types[name] = _TYPE_NAMES[only[0]]


@dataclass
class GraphIndex:
    """Def-use of a model's main graph.

    producer(v): the node that produces v (None for graph inputs and initializers);
    consumers(v): the main-graph nodes that read v, including control-flow nodes (If, Loop,
    Scan) whose subgraphs read v from the outer scope: a value used across a subgraph boundary
    is a use like any other (a weight shared by the main graph and an If branch is never
    replaced behind the branch's back).
    """

    model: onnx.ModelProto
    producers: dict[str, onnx.NodeProto] = field(default_factory=dict)
    readers: dict[str, list[onnx.NodeProto]] = field(default_factory=dict)
    subgraph_readers: dict[str, list[onnx.NodeProto]] = field(default_factory=dict)
    types: dict[str, onnx.TypeProto] = field(default_factory=dict)
    initializers: dict[str, onnx.TensorProto] = field(default_factory=dict)
    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    position: dict[int, int] = field(default_factory=dict)

    @classmethod
    def of(cls, model: onnx.ModelProto) -> "GraphIndex":
        g = model.graph
        ix = cls(model)
        ix.initializers = {t.name: t for t in g.initializer}
        ix.inputs = [i.name for i in g.input if i.name not in ix.initializers]
        ix.outputs = [o.name for o in g.output]
        for v in [*g.input, *g.value_info, *g.output]:
            if v.HasField("type"):
                ix.types[v.name] = v.type
        for t in g.initializer:
            tp = onnx.TypeProto()
            tp.tensor_type.elem_type = t.data_type
            tp.tensor_type.shape.dim.extend(onnx.TensorShapeProto.Dimension(dim_value=d) for d in t.dims)
            ix.types[t.name] = tp
        known = {k: tensor_type(v) for k, v in ix.types.items() if tensor_type(v)}
        schema_types(model, known)
        for k, et in known.items():  # typed from the schemas: element type, no shape
            if k not in ix.types or not tensor_type(ix.types[k]):
                tp = onnx.TypeProto()
                tp.tensor_type.elem_type = et
                ix.types[k] = tp
        for i, n in enumerate(g.node):
            ix.position[id(n)] = i
            for o in n.output:
                if o:
                    ix.producers[o] = n
            for name in dict.fromkeys(x for x in n.input if x):
                ix.readers.setdefault(name, []).append(n)
            sub_reads: set[str] = set()
            for sg in subgraphs(n):
                sub_reads |= outer_scope_reads(sg)
            for name in sub_reads:
                ix.subgraph_readers.setdefault(name, []).append(n)
        return ix

    @property
    def graph(self) -> onnx.GraphProto:
        return self.model.graph

    def producer(self, name: str) -> onnx.NodeProto | None:
        return self.producers.get(name)

    def consumers(self, name: str) -> list[onnx.NodeProto]:
        """Every main-graph node that uses `name`, directly or inside its subgraphs."""
        direct = self.readers.get(name, [])
        sub = [n for n in self.subgraph_readers.get(name, []) if all(n is not d for d in direct)]
        return direct + sub

    def used_in_subgraph(self, name: str) -> bool:
        return bool(self.subgraph_readers.get(name))

    def elem_type(self, name: str) -> int:
        return tensor_type(self.types.get(name))

    def shape(self, name: str) -> tuple[int | None, ...] | None:
        return static_shape(self.types.get(name))

    def rank(self, name: str) -> int | None:
        s = self.shape(name)
        return None if s is None else len(s)

    def is_initializer(self, name: str) -> bool:
        return name in self.initializers

    def order(self, node: onnx.NodeProto) -> int:
        return self.position[id(node)]

    def values(self) -> list[str]:
        """Every value of the main graph in graph order: inputs, then node outputs."""
        out = list(self.inputs)
        for n in self.graph.node:
            out.extend(o for o in n.output if o)
        return list(dict.fromkeys(out))


@dataclass
class PassResult:
    """What one pass did: whether it worked in place, how many things it changed, notes for the
    report, and the matches it declined with why (in the manner of a rewrite rule's check)."""

    name: str
    in_place: bool = True
    changed: int = 0
    notes: list[str] = field(default_factory=list)
    declined: list[tuple[str, str]] = field(default_factory=list)

    def decline(self, where: str, why: str) -> None:
        self.declined.append((where, why))
