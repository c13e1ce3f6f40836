"""The three graph rewrites behind the conversion formats.

* `simulate`: round float weights (initializers, Constant values) to target values in place.
* `qdq`: a quantize-dequantize pair on every float activation -- two Casts (with_cast) or two
  model-local function nodes (customqdq) -- plus rounded weights (with_cast) or weights stored
  in the target type behind a dequantize node (customqdq).
* `native`: the graph computes in the target type; nodes the execution provider has no kernel
  for (probed, see `probe.py`) stay in the source float type with Casts around them.

All work on a copy of the model (the caller's ModelProto is never modified) and only on tensors of
the source float type F (float32, or float16 for fp16 models); int64 shape paths, indices, bool
masks and other types are never touched. Parameter inputs (Resize scales/roi, Dropout ratio,
Range bounds; `_graph.NON_DATA_INPUTS`) are never rounded.
"""
from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import onnx
from onnx import AttributeProto, TensorProto, helper

from ..errors import ModelError
from ..graph import subgraphs, walk_graphs
from ..formats.base import MIXQ_DOMAIN, MIXQ_DOMAIN_VERSION
from . import _graph as G
from ._rounding import BF16_MAX, FP16_MAX, element_type_name, round_tensor_inplace, tensor_to_target
from ._fragile import (find_fragile, find_input_affine, find_phases, find_sentinels, find_shape_arithmetic,
                       find_underflow)
from ..kernels import probe_kernel, short_error

__all__ = ["RewriteResult", "KeptFloat", "simulate", "qdq", "native", "QUANTIZE_FN", "DEQUANTIZE_FN"]

#: Names of the customqdq model-local functions (domain MIXQ_DOMAIN).
QUANTIZE_FN = "BFloat16Quantize"
DEQUANTIZE_FN = "BFloat16Dequantize"


@dataclass
class KeptFloat:
    """A node left in the source float type, and why."""

    node: str
    op_type: str
    reason: str


@dataclass
class RewriteResult:
    """The rewritten model and counts for the report."""

    model: onnx.ModelProto
    nodes_converted: int = 0
    tensors_converted: int = 0
    initializers_converted: int = 0
    casts_inserted: int = 0
    qdq_nodes_inserted: int = 0
    kept_float: list[KeptFloat] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    unverified_ops: set[str] = field(default_factory=set)
    converted_node_names: list[str] = field(default_factory=list)
    converted_ops: Counter[str] = field(default_factory=Counter)
    serialized_size: int | None = None


class _Names:
    """Fresh, collision-free tensor and node names."""

    def __init__(self, model: onnx.ModelProto) -> None:
        g = model.graph
        self.used: set[str] = {n for node in g.node for n in list(node.input) + list(node.output)}
        self.used |= {i.name for i in g.input} | {o.name for o in g.output} | {t.name for t in g.initializer}
        self.used |= {v.name for v in g.value_info} | {node.name for node in g.node}
        self.used |= G.subgraph_names(g)

    def fresh(self, base: str) -> str:
        name, k = base, 1
        while name in self.used:
            name = f"{base}_{k}"
            k += 1
        self.used.add(name)
        return name


def _copy(model: onnx.ModelProto) -> onnx.ModelProto:
    m = onnx.ModelProto()
    m.CopyFrom(model)
    return m


def _is_default(domain: str) -> bool:
    return domain in ("", "ai.onnx")


def _non_data(node: onnx.NodeProto, j: int) -> bool:
    return _is_default(node.domain) and j in G.NON_DATA_INPUTS.get(node.op_type, ())


def _uses(info: G.GraphInfo, model: onnx.ModelProto, name: str) -> tuple[int, int]:
    """(data uses, parameter uses) of tensor `name` in the main graph."""
    d = p = 0
    for k, j in info.consumers.get(name, ()):
        if _non_data(model.graph.node[k], j):
            p += 1
        else:
            d += 1
    return d, p


def _outside_uses(info: G.GraphInfo, model: onnx.ModelProto, name: str, keep: dict[int, str]) -> int:
    """Data uses of tensor `name` by nodes not kept in float."""
    return sum(1 for k, j in info.consumers.get(name, ())
               if k not in keep and not _non_data(model.graph.node[k], j))


def _numel(t: TensorProto) -> int:
    n = 1
    for d in t.dims:
        n *= int(d)
    return n


def _scalar_note(n: int, F: int) -> list[str]:
    if not n:
        return []
    return [f"{n} one-element weight(s) (scalar operands such as a learned scale or shift) kept exact in "
            f"{element_type_name(F)}: rounding a scalar moves the whole tensor it scales or shifts "
            "coherently (an error that does not average out), and keeping it costs no size"]


def _kept_records(model: onnx.ModelProto, keep: dict[int, str]) -> list[KeptFloat]:
    g = model.graph
    return [KeptFloat(g.node[k].name or g.node[k].output[0], g.node[k].op_type, why)
            for k, why in sorted(keep.items())]


def _split_shared_params(model: onnx.ModelProto, info: G.GraphInfo, F: int, names: _Names) -> int:
    """Give parameter uses (Resize scales, ...) of initializers that are also data their own copy,
    so rounding the data never changes a parameter. Returns the number of copies made."""
    g = model.graph
    made = 0
    for name, t in list(info.initializers.items()):
        if t.data_type != F:
            continue
        d, p = _uses(info, model, name)
        if d and p:
            copy = TensorProto()
            copy.CopyFrom(t)
            copy.name = names.fresh(name + "__param")
            g.initializer.append(copy)
            for k, j in info.consumers[name]:
                if _non_data(g.node[k], j):
                    g.node[k].input[j] = copy.name
            made += 1
    return made


def _constant_tensor(node: onnx.NodeProto, F: int) -> TensorProto | None:
    """The F-typed value of a Constant node, as a TensorProto (value_float(s) converted)."""
    for a in node.attribute:
        if a.name == "value" and a.type == AttributeProto.TENSOR and a.t.data_type == F:
            return a.t
        if F == TensorProto.FLOAT and a.name == "value_float":
            return helper.make_tensor("", TensorProto.FLOAT, [], [a.f])
        if F == TensorProto.FLOAT and a.name == "value_floats":
            return helper.make_tensor("", TensorProto.FLOAT, [len(a.floats)], list(a.floats))
    return None


def _lift_constants(model: onnx.ModelProto, F: int) -> int:
    """Turn F-typed Constant nodes of the main graph into initializers (not graph outputs or names
    used in subgraphs). Returns how many were lifted."""
    g = model.graph
    pinned = {o.name for o in g.output} | G.outer_scope_names(g)
    keep, lifted = [], 0
    for node in g.node:
        if node.op_type == "Constant" and _is_default(node.domain) and node.output[0] not in pinned:
            t = _constant_tensor(node, F)
            if t is not None:
                init = TensorProto()
                init.CopyFrom(t)
                init.name = node.output[0]
                g.initializer.append(init)
                lifted += 1
                continue
        keep.append(node)
    if lifted:
        del g.node[:]
        g.node.extend(keep)
    return lifted


def _isolate_constants(m: onnx.ModelProto, keep: set[int], F: int, names: _Names) -> int:
    """Give the kept-float nodes (indices `keep`) their own copy of every F constant (initializer
    or Constant output) they share with other nodes, so rounding it for the others leaves theirs
    exact. Copied Constant nodes go first in the graph (indices in `keep` shift accordingly,
    in place). Returns the number of copies."""
    g = m.graph
    inits = {t.name: t for t in g.initializer}
    consts = {n.output[0]: n for n in g.node if n.op_type == "Constant" and _is_default(n.domain)}
    users: dict[str, list[int]] = {}
    for k, n in enumerate(g.node):
        for i in n.input:
            if i and (i in inits or i in consts):
                users.setdefault(i, []).append(k)
    front: list[onnx.NodeProto] = []
    made = 0
    for name, ks in users.items():
        inside = {k for k in ks if k in keep}
        if not inside or len(inside) == len(ks):
            continue
        t = inits.get(name)
        if t is not None and t.data_type != F:
            continue
        new = names.fresh(f"{name}__float")
        if t is not None:
            c = TensorProto()
            c.CopyFrom(t)
            c.name = new
            g.initializer.append(c)
        else:
            src = consts[name]
            if _constant_tensor(src, F) is None:
                continue
            c_node = onnx.NodeProto()
            c_node.CopyFrom(src)
            c_node.output[0] = new
            c_node.name = names.fresh(f"{src.name or name}__float")
            front.append(c_node)
        for k in inside:
            node = g.node[k]
            for j, i in enumerate(node.input):
                if i == name:
                    node.input[j] = new
        made += 1
    if front:
        shifted = {k + len(front) for k in keep}
        keep.clear()
        keep |= shifted
        nodes = front + list(g.node)
        del g.node[:]
        g.node.extend(nodes)
    return made


def _prepare(model: onnx.ModelProto, F: int, *, lift: bool, fragile: bool = False,
             target: int | None = None,
             ) -> tuple[onnx.ModelProto, G.GraphInfo, _Names, list[str], dict[int, str]]:
    """Copy the model, lift constants (`lift`), split shared parameters and, with `fragile`,
    find the numerically fragile nodes to keep float; with a `target` type, also the nodes that
    read constants past its range (`find_sentinels`) or under it (`find_underflow`) and the
    float shape arithmetic
    (`find_shape_arithmetic`): returns (model, info, names, notes,
    {node index: reason})."""
    m = _copy(model)
    notes: list[str] = []
    if lift:
        n = _lift_constants(m, F)
        if n:
            notes.append(f"{n} Constant node(s) turned into initializers")
    info = G.analyze(m)
    names = _Names(m)
    n = _split_shared_params(m, info, F, names)
    if n:
        notes.append(f"{n} initializer(s) used both as data and as a parameter (e.g. Resize scales) duplicated")
        info = G.analyze(m)
    keep: dict[int, str] = {}
    regions = find_fragile(m.graph) if fragile else []
    if target is not None:
        limit, tname = (BF16_MAX, "bfloat16") if target == TensorProto.BFLOAT16 else (FP16_MAX, "float16")
        regions += find_sentinels(m.graph, limit, tname) + find_shape_arithmetic(m.graph)
        regions += find_phases(m, info.types, tname, 7 if target == TensorProto.BFLOAT16 else 10)
        regions += find_input_affine(m)
        regions += find_underflow(m.graph, "bf16" if target == TensorProto.BFLOAT16 else "fp16", tname)
    for region in regions:
        for k in region.nodes:
            keep.setdefault(k, region.reason)
    for k, node in enumerate(m.graph.node):  # control flow: its bodies are not rewritten
        if k not in keep and (why := _body_reason(node, F, info.types)) is not None:
            keep[k] = why
    if keep:
        ks = set(keep)
        before = sorted(keep)
        if _isolate_constants(m, ks, F, names):
            shift = min(ks) - before[0]
            keep = {k + shift: keep[k] for k in before}
            info = G.analyze(m)
    sub_only = [k for k, t in info.initializers.items()
                if t.data_type == F and k in info.outer_refs and not info.consumers.get(k)]
    if sub_only:
        notes.append(f"{len(sub_only)} weight(s) used only inside subgraphs (If/Loop/Scan) left unchanged: "
                     + ", ".join(sub_only[:5]) + (" ..." if len(sub_only) > 5 else ""))
    return m, info, names, notes, keep


def _body_reason(node: onnx.NodeProto, F: int, types: dict[str, int]) -> str | None:
    """Why an If / Loop / Scan node with F data in its bodies (weights, Constants, or an outer
    F tensor it reads) stays in the source type, or None. The converters rewrite the main
    graph only: such a body computes as before, and the report must say so rather than count
    the node as having nothing to convert."""
    bodies = [g for sg in subgraphs(node) for g in walk_graphs(sg)]
    weights = sum(t.data_type == F for g in bodies for t in g.initializer)
    weights += sum(a.type == AttributeProto.TENSOR and a.t.data_type == F
                   for g in bodies for n in g.node for a in n.attribute)
    reads = any(types.get(i) == F for g in bodies for n in g.node for i in n.input)
    if not weights and not reads:
        return None
    src = element_type_name(F)
    held = f" and its {weights} {src} weight(s) stay so" if weights else ""
    return (f"has a subgraph (If/Loop/Scan body): the converters rewrite the main graph only, so "
            f"the body computes in {src}{held}")


def _overflow_note(over: int, target: int) -> list[str]:
    if not over:
        return []
    if target == TensorProto.BFLOAT16:
        return [f"{over} weight value(s) beyond the bfloat16 range saturated to +-3.39e38 (as +-inf, a "
                "float32-lowest mask would make a fully masked Softmax row NaN)"]
    return [f"{over} weight value(s) beyond the float16 range saturated to +-65504"]


# ----------------------------------------------------------------------------- simulate

def simulate(model: onnx.ModelProto, F: int, target: int, *, fragile: bool = False) -> RewriteResult:
    """Round every F weight used as data to `target` values, stored as F. Nothing else changes
    (no node is added or removed). With `fragile`, weights read only by numerically fragile
    nodes (`_fragile`) stay exact."""
    m, info, _, notes, keep = _prepare(model, F, lift=False, fragile=fragile, target=target)
    res = RewriteResult(m, notes=notes, kept_float=_kept_records(m, keep))
    over = scalars = 0
    for name, t in info.initializers.items():
        if t.data_type == F and _outside_uses(info, m, name, keep):
            if fragile and _numel(t) == 1:
                scalars += 1
                continue
            over += round_tensor_inplace(t, target)
            res.initializers_converted += 1
    for node in m.graph.node:
        if node.op_type != "Constant" or not _is_default(node.domain):
            continue
        d, p = _uses(info, m, node.output[0])
        if not d or p or not _outside_uses(info, m, node.output[0], keep):
            continue
        for a in node.attribute:
            if fragile and ((a.name == "value" and a.type == AttributeProto.TENSOR and a.t.data_type == F
                             and _numel(a.t) == 1) or a.name == "value_float"):
                scalars += 1
            elif a.name == "value" and a.type == AttributeProto.TENSOR and a.t.data_type == F:
                over += round_tensor_inplace(a.t, target)
                res.initializers_converted += 1
            elif F == TensorProto.FLOAT and a.name in ("value_float", "value_floats"):
                import numpy as np

                from ._rounding import round_like
                if a.name == "value_float":
                    a.f = float(round_like(np.array([a.f], np.float32), target)[0])
                else:
                    vals = round_like(np.array(a.floats, np.float32), target)
                    del a.floats[:]
                    a.floats.extend(float(v) for v in vals)
                res.initializers_converted += 1
    res.tensors_converted = res.initializers_converted
    res.notes += _overflow_note(over, target) + _scalar_note(scalars, F)
    return res


# ----------------------------------------------------------------------------- qdq

def _ensure_opset(model: onnx.ModelProto, domain: str, version: int) -> None:
    for op in model.opset_import:
        if op.domain == domain:
            op.version = max(op.version, version)
            return
    model.opset_import.append(helper.make_opsetid(domain, version))


def qdq_functions(opset: int, target: int = TensorProto.BFLOAT16) -> list[onnx.FunctionProto]:
    """The customqdq functions: Quantize (any float -> bfloat16, Cast) and Dequantize
    (bfloat16 -> the float type given by its `to` attribute, Cast), bodies in opset `opset`."""
    q = helper.make_function(
        MIXQ_DOMAIN, QUANTIZE_FN, ["x"], ["y"], [helper.make_node("Cast", ["x"], ["y"], to=target)],
        [helper.make_opsetid("", opset)], [],
        doc_string="Round a float tensor to bfloat16 (round to nearest even; NaN/inf kept).")
    cast = helper.make_node("Cast", ["x"], ["y"])
    ref = AttributeProto()
    ref.name, ref.ref_attr_name, ref.type = "to", "to", AttributeProto.INT
    cast.attribute.append(ref)
    dq = helper.make_function(
        MIXQ_DOMAIN, DEQUANTIZE_FN, ["x"], ["y"], [cast], [helper.make_opsetid("", opset)], ["to"],
        doc_string="Widen a bfloat16 tensor to the float type `to` (exact).")
    return [q, dq]


def qdq(model: onnx.ModelProto, F: int, target: int, *, functions: bool, fragile: bool = False) -> RewriteResult:
    """Quantize-dequantize every F activation to `target` and back.

    `functions=False` (with_cast): a Cast pair per activation, weights rounded in place.
    `functions=True` (customqdq, bfloat16 only): a BFloat16Quantize/BFloat16Dequantize function
    node pair per activation; weights stored as bfloat16 initializers feeding a BFloat16Dequantize.
    With `fragile`, numerically fragile nodes (`_fragile`) read and write float: no pair between
    two of them, and they read the unrounded version of what they share with other nodes."""
    m, info, names, notes, keep = _prepare(model, F, lift=True, fragile=fragile, target=target)
    g = m.graph
    res = RewriteResult(m, notes=notes, kept_float=_kept_records(m, keep))
    if functions:
        _ensure_opset(m, MIXQ_DOMAIN, MIXQ_DOMAIN_VERSION)
        have = {(f.domain, f.name) for f in m.functions}
        for fn in qdq_functions(info.opset, target):
            if (fn.domain, fn.name) not in have:
                m.functions.append(fn)
        if m.ir_version < 8:
            m.ir_version = 8
            res.notes.append("IR version raised to 8 (model-local functions)")

    outputs = set(info.graph_outputs)
    graph_inputs = set(info.graph_inputs)
    tname = element_type_name(target)

    def pair(src: str, dst: str, base: str) -> list[onnx.NodeProto]:
        mid = names.fresh(f"{base}__{tname}")
        if functions:
            res.qdq_nodes_inserted += 2
            return [helper.make_node(QUANTIZE_FN, [src], [mid], name=names.fresh(f"{base}__Quantize"),
                                     domain=MIXQ_DOMAIN),
                    helper.make_node(DEQUANTIZE_FN, [mid], [dst], name=names.fresh(f"{base}__Dequantize"),
                                     domain=MIXQ_DOMAIN, to=F)]
        res.casts_inserted += 2
        return [helper.make_node("Cast", [src], [mid], name=names.fresh(f"{base}__to_{tname}"), to=target),
                helper.make_node("Cast", [mid], [dst], name=names.fresh(f"{base}__back"), to=F)]

    # weights
    head: list[onnx.NodeProto] = []
    over = scalars = 0
    new_inits: list[TensorProto] = []
    drop: set[str] = set()
    for name, t in info.initializers.items():
        if t.data_type != F or not _outside_uses(info, m, name, keep):
            continue
        if fragile and _numel(t) == 1:
            scalars += 1
            continue
        res.initializers_converted += 1
        if functions and name not in graph_inputs and name not in outputs and name not in info.outer_refs:
            stored, o = tensor_to_target(t, target, names.fresh(f"{name}__{tname}"))
            over += o
            new_inits.append(stored)
            drop.add(name)
            res.qdq_nodes_inserted += 1
            head.append(helper.make_node(DEQUANTIZE_FN, [stored.name], [name], domain=MIXQ_DOMAIN,
                                         name=names.fresh(f"{name}__Dequantize"), to=F))
        else:
            over += round_tensor_inplace(t, target)
    if drop:
        kept_inits = [t for t in g.initializer if t.name not in drop]
        del g.initializer[:]
        g.initializer.extend(kept_inits + new_inits)
    res.notes += _overflow_note(over, target) + _scalar_note(scalars, F)

    # activations: F tensors produced by nodes or graph inputs, read as data or graph outputs
    def wanted(name: str) -> bool:
        if info.types.get(name) != F or name in info.initializers:
            return False
        return _outside_uses(info, m, name, keep) > 0 or name in outputs

    rounded: dict[str, str] = {}
    raw: dict[str, str] = {}
    for name in info.graph_inputs:
        if wanted(name) and name not in outputs:
            rounded[name] = names.fresh(f"{name}__{tname}rt")
            head += pair(name, rounded[name], name)
            res.tensors_converted += 1
    new_nodes: list[onnx.NodeProto] = list(head)
    for k, node in enumerate(g.node):
        touched = False
        for j, inp in enumerate(node.input):
            if not inp:
                continue
            if _non_data(node, j) or k in keep:
                node.input[j] = raw.get(inp, inp)
            elif inp in rounded:
                node.input[j] = rounded[inp]
                touched = True
        res.nodes_converted += touched
        if touched:
            res.converted_ops[node.op_type] += 1
        tail: list[onnx.NodeProto] = []
        for i, out in enumerate(node.output):
            if not out or not wanted(out):
                continue
            if out in outputs and k in keep:
                # a kept node's graph output stays as it computed it (a value under the
                # target's range would lose there what the node was kept for); the nodes
                # that convert read a rounded copy
                if _outside_uses(info, m, out, keep):
                    rounded[out] = names.fresh(f"{out}__{tname}rt")
                    tail += pair(out, rounded[out], out)
                    res.tensors_converted += 1
                continue
            res.tensors_converted += 1
            if out in outputs:  # keep the graph output's name on the rounded tensor
                src = names.fresh(f"{out}__raw")
                node.output[i] = src
                raw[out] = src
                tail += pair(src, out, out)
            else:
                rounded[out] = names.fresh(f"{out}__{tname}rt")
                tail += pair(out, rounded[out], out)
        new_nodes.append(node)
        new_nodes += tail
    del g.node[:]
    g.node.extend(new_nodes)
    return res


# ----------------------------------------------------------------------------- native

@dataclass
class _Plan:
    mode: str  # "target" | "float" | "neutral" | "agnostic" | "cast"
    conv_in: frozenset[int] = frozenset()
    conv_out: frozenset[int] = frozenset()
    reason: str = ""


def _attr(node: onnx.NodeProto, name: str):
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return None


def _plan_node(node: onnx.NodeProto, info: G.GraphInfo, F: int, target: int, provider: str,
               forced: dict[str, str], opset_imports, unverified: set[str]) -> _Plan:
    types = info.types
    kw = {"opset_imports": opset_imports, "detect_cast_insertion": target == TensorProto.FLOAT16}
    f_in = [j for j, i in enumerate(node.input) if i and types.get(i) == F]
    f_out = [i for i, o in enumerate(node.output) if o and types.get(o) == F]
    if not f_in and not f_out:
        return _Plan("neutral")
    tname = element_type_name(target)
    op = node.op_type
    if node.name in forced:
        return _Plan("float", reason=forced[node.name])
    if G.has_subgraph(node):
        return _Plan("float", reason="has a subgraph (If/Loop/Scan body); left in the source type")
    if not _is_default(node.domain):
        return _Plan("float", reason=f"op of domain {node.domain!r}: no ONNX schema to retarget")
    opset = info.opset
    orig_in = [types.get(i) if i else None for i in node.input]
    orig_out = [types.get(o) if o else None for o in node.output]
    if op == "Cast":
        to = _attr(node, "to")
        in_t = orig_in[0]
        if to == F and in_t != F:  # e.g. int64 -> float: produce the target type directly
            r = probe_kernel(node, [in_t], [target], opset=opset, provider=provider, **kw)
            if r.ok:
                return _Plan("cast", conv_out=frozenset({0}))
            return _Plan("float", reason=r.reason)
        if in_t == F and to != F:  # float -> int/bool: read whichever version exists if possible
            r = probe_kernel(node, [target], [to], opset=opset, provider=provider, **kw)
            return _Plan("agnostic" if r.ok else "neutral")
        return _Plan("neutral")
    if op in G.ATTR_TYPED_OPS:
        return _Plan("float", reason="output type is set by an attribute")
    schema = G.get_schema(op, node.domain, opset)
    if schema is None:
        return _Plan("float", reason=f"no ONNX schema for {op} at opset {opset}")
    if op in G.VALUE_AGNOSTIC:
        r = probe_kernel(node, [target] + orig_in[1:], orig_out, opset=opset, provider=provider, **kw)
        return _Plan("agnostic" if r.ok else "neutral")
    in_vars = {j: G.input_var(schema, j) for j in f_in}
    out_vars = {i: G.output_var(schema, i) for i in f_out}
    data_vars = [v for j, v in in_vars.items() if not _non_data(node, j)] + list(out_vars.values())
    want = G.TYPE_STR[target]
    convertible: list[str] = []
    for v in data_vars:
        if v is not None and v not in convertible and want in G.allowed_types(schema, v):
            convertible.append(v)
    if not convertible:
        return _Plan("float", reason=f"the ONNX schema of {op}-{schema.since_version} has no {tname} type")
    cands = [set(convertible)]
    if len(convertible) > 1:
        cands.append({convertible[0]})
    last = None
    for cand in cands:
        conv_in = frozenset(j for j, v in in_vars.items() if v in cand)
        conv_out = frozenset(i for i, v in out_vars.items() if v in cand)
        in_types = [target if j in conv_in else ty for j, ty in enumerate(orig_in)]
        out_types = [target if i in conv_out else ty for i, ty in enumerate(orig_out)]
        r = probe_kernel(node, in_types, out_types, opset=opset, provider=provider, float_in_types=orig_in,
                         float_out_types=orig_out, **kw)
        if r.ok:
            if not r.verified:
                unverified.add(op)
            return _Plan("target", conv_in, conv_out)
        last = r
    why = last.reason if last else "unsupported"
    if why.startswith("no kernel"):
        why = f"{provider} has no {tname} kernel for {op}-{schema.since_version}"
    else:
        why = f"onnxruntime cannot build {op}-{schema.since_version} in {tname} on {provider}: {why}"
    return _Plan("float", reason=why)


def _native_once(model: onnx.ModelProto, F: int, target: int, provider: str,
                 forced: dict[str, str], fragile: bool = False) -> RewriteResult:
    m, info, names, notes, keep = _prepare(model, F, lift=True, fragile=fragile, target=target)
    g = m.graph
    res = RewriteResult(m, notes=notes)
    tname = element_type_name(target)
    for k, node in enumerate(g.node):  # probes and retry messages need node names
        if not node.name:
            node.name = names.fresh(f"{node.op_type}_{k}")
    forced = {**{g.node[k].name: why for k, why in keep.items()}, **forced}
    opset_imports = [op for op in m.opset_import if op.domain in ("", "ai.onnx")]
    plans = [_plan_node(n, info, F, target, provider, forced, opset_imports, res.unverified_ops)
             for n in g.node]
    outputs = set(info.graph_outputs)
    pinned = outputs | info.outer_refs
    graph_inputs = set(info.graph_inputs)
    avail: dict[str, dict[int, str]] = {}
    retyped: set[str] = set()

    def cast_to(name: str, want: int, sink: list[onnx.NodeProto]) -> str:
        versions = avail.get(name)
        if versions is None:
            return name
        if want in versions:
            return versions[want]
        src = next(iter(versions.values()))
        new = names.fresh(f"{name}__{element_type_name(want)}")
        sink.append(helper.make_node("Cast", [src], [new], name=names.fresh(f"{name}__cast_{element_type_name(want)}"),
                                     to=want))
        res.casts_inserted += 1
        versions[want] = new
        return new

    for name in info.graph_inputs:
        if info.types.get(name) == F and name not in info.initializers:
            avail[name] = {F: name}
    over = scalars = 0
    ir3 = [n for n in info.initializers if n in graph_inputs]
    for name, t in info.initializers.items():
        if t.data_type != F:
            continue
        if not _outside_uses(info, m, name, keep) or name in pinned or name in graph_inputs:
            avail[name] = {F: name}
            continue
        if fragile and _numel(t) == 1:  # a node computing in `target` reads it through a Cast
            avail[name] = {F: name}
            scalars += 1
            continue
        stored, o = tensor_to_target(t, target)
        over += o
        t.CopyFrom(stored)
        avail[name] = {target: name}
        retyped.add(name)
        res.initializers_converted += 1
        res.tensors_converted += 1
    if ir3:
        res.notes.append(f"{len(ir3)} initializer(s) are also graph inputs (overridable); kept in {element_type_name(F)}")
    res.notes += _overflow_note(over, target) + _scalar_note(scalars, F)

    new_nodes: list[onnx.NodeProto] = []
    for node, plan in zip(g.node, plans):
        pre: list[onnx.NodeProto] = []
        post: list[onnx.NodeProto] = []
        for j, inp in enumerate(node.input):
            if not inp or info.types.get(inp) != F or inp not in avail:
                continue
            if plan.mode == "agnostic":
                node.input[j] = next(iter(avail[inp].values()))
            elif plan.mode == "target" and j in plan.conv_in:
                node.input[j] = cast_to(inp, target, pre)
            else:
                node.input[j] = cast_to(inp, F, pre)
        if plan.mode == "cast":
            for a in node.attribute:
                if a.name == "to":
                    a.i = target
        for i, out in enumerate(node.output):
            if not out or info.types.get(out) != F:
                continue
            if plan.mode in ("target", "cast") and i in plan.conv_out:
                res.tensors_converted += 1
                if out in pinned:
                    inner = names.fresh(f"{out}__{tname}")
                    node.output[i] = inner
                    post.append(helper.make_node("Cast", [inner], [out], name=names.fresh(f"{out}__cast_out"), to=F))
                    res.casts_inserted += 1
                    avail[out] = {target: inner, F: out}
                else:
                    avail[out] = {target: out}
                    retyped.add(out)
            else:
                avail[out] = {F: out}
        if plan.mode in ("target", "cast"):
            res.nodes_converted += 1
            res.converted_node_names.append(node.name)
            res.converted_ops[node.op_type] += 1
        elif plan.mode == "float":
            res.kept_float.append(KeptFloat(node.name, node.op_type, plan.reason))
        new_nodes += pre + [node] + post
    for out_name in info.graph_outputs:  # every graph output keeps its name and source float type
        if out_name in avail and F not in avail[out_name]:
            raise ModelError(f"internal error: graph output {out_name!r} has no "
                             f"{element_type_name(F)} version")
    del g.node[:]
    g.node.extend(new_nodes)
    for vi in g.value_info:
        if vi.name in retyped and vi.type.tensor_type.elem_type == F:
            vi.type.tensor_type.elem_type = target
    return res


_NODE_RE = re.compile(r"node with name '([^']*)'")
_OP_RE = re.compile(r"implementation for (\w+)\((\d+)\)")


def _fused_culprits(model: onnx.ModelProto, F: int, target: int, provider: str, forced: dict[str, str],
                    fragile: bool, factory: Callable, suspects: list[str], msg: str) -> list[str]:
    """Converted nodes to keep in F when onnxruntime fails on a node its optimizer formed (a
    fusion of several of our nodes into an op without a `target` kernel; the error names neither
    our nodes nor their op type). Halving search over `suspects` (graph order): a part whose
    nodes, kept in F, let the model load, narrowed while one half suffices (forcing any node of a
    fused pattern breaks the pattern). At most 2*log2(len) + 1 extra session creations; [] if
    even forcing all suspects does not help."""
    why = (f"onnxruntime's optimizer fuses it with its neighbours into a node without a "
           f"{element_type_name(target)} kernel on {provider} ({msg})")

    def loads(part: list[str]) -> bool:
        trial = _native_once(model, F, target, provider, {**forced, **{n: why for n in part}}, fragile)
        try:
            factory(trial.model, provider)
            return True
        except Exception:  # noqa: BLE001 - any failure: this part does not suffice
            return False

    part = list(suspects)
    if not loads(part):
        return []
    while len(part) > 1:
        half = len(part) // 2
        if loads(part[:half]):
            part = part[:half]
        elif loads(part[half:]):
            part = part[half:]
        else:
            break  # both halves hold a culprit: keep the whole part
    for n in part:
        forced[n] = why
    return part


def native(model: onnx.ModelProto, F: int, target: int, provider: str, *, validate: bool = True,
           session_factory: Callable | None = None, max_retries: int = 8, fragile: bool = False) -> RewriteResult:
    """Convert the graph to compute in `target`, keeping nodes without a `target` kernel in F.

    With `validate`, the result is loaded in onnxruntime on `provider`; a node named in a
    missing-kernel error is moved back to F and the conversion redone (at most `max_retries`
    times), so the returned model always loads. A missing-kernel error for a node onnxruntime's
    optimizer formed (named by neither our nodes nor their op types) is traced back to the
    converted nodes it fused by a halving search (`_fused_culprits`). Raises ModelError if the
    model still does not load. With `fragile`, numerically fragile nodes (`_fragile`: written-out normalizations, which
    onnxruntime would fuse into one node) stay in F from the start."""
    from ._session import open_session

    factory = session_factory or open_session
    forced: dict[str, str] = {}
    for _ in range(max_retries + 1):
        res = _native_once(model, F, target, provider, forced, fragile)
        if not validate:
            return res
        try:
            res.serialized_size = factory(res.model, provider)[1]
            return res
        except Exception as exc:  # onnxruntime raises its own classes
            msg = short_error(exc)
            op_of = {n.name: n.op_type for n in res.model.graph.node}
            converted = [n for n in res.converted_node_names if n not in forced]
            named = set(_NODE_RE.findall(str(exc)))
            names = [n for n in converted if n in named]
            if not names:  # the error names an op (e.g. inside a function body), not our node
                ops = {op for op, _ in _OP_RE.findall(str(exc))}
                names = [n for n in converted if op_of.get(n) in ops]
            if not names and converted and "Could not find an implementation" in str(exc):
                names = _fused_culprits(model, F, target, provider, forced, fragile, factory, converted, msg)
            if not names:
                raise ModelError(
                    f"the {element_type_name(target)} model does not load in onnxruntime {provider}: {msg}. "
                    "Use --format with_cast, which runs on any provider.") from exc
            for n in names:
                forced.setdefault(n, f"onnxruntime rejected it in {element_type_name(target)}: {msg}")
    raise ModelError(f"the {element_type_name(target)} model still does not load in onnxruntime {provider} "
                     f"after {max_retries} retries; use --format with_cast.")
