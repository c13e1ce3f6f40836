"""Numerically fragile subgraphs the bfloat16 converters keep in float.

A written-out normalization (LayerNorm, RMSNorm exported as elementwise ops) is fragile in
bfloat16 (8 significant bits):

* the variance as E[x^2] - E[x]^2 (``ReduceMean(x*x) - ReduceMean(x)^2``, or ``ReduceSum * 1/n``,
  or ``Pow(x, 2)``) cancels catastrophically when x has a mean offset: both terms are ~mean^2,
  their bfloat16 rounding errors are ~mean^2/256, the difference (the variance) can be smaller;
* the mean / variance / rsqrt chain feeds every output element, so one rounded statistic shifts
  or scales a whole row; and onnxruntime fuses the chain into one LayerNormalization (or
  SimplifiedLayerNormalization) node at session creation, whose bfloat16 kernel may not exist
  on the provider (CPU), so the converted model would not load.

`find_fragile` recognises these structurally (by the graph, not by names) and returns the nodes
to keep in the source float type with a reason. It is a small detector local to the converter;
a general pattern recognizer for the quantizer may replace it later.
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import AttributeProto, numpy_helper

__all__ = ["FragileRegion", "find_fragile", "find_input_affine", "find_phases", "find_sentinels",
           "find_shape_arithmetic", "find_underflow", "REASON_AFFINE", "REASON_CANCEL", "REASON_NORM", "REASON_RMS",
           "REASON_SHAPE"]

REASON_CANCEL = ("numerically fragile: variance computed as E[x^2]-E[x]^2 (cancels catastrophically "
                 "in bfloat16); its normalization is kept in float")
REASON_NORM = ("numerically fragile: internals of a written-out normalization (mean/variance/rsqrt); "
               "kept in float (onnxruntime would also fuse them into one LayerNormalization node)")
REASON_RMS = ("numerically fragile: internals of a written-out RMS normalization (mean of squares/rsqrt); "
              "kept in float")

REASON_AFFINE = ("standardizes a graph input with constants ((x - mean) / std): features fed in their own "
                 "units lose their variation, and the mean its value, to a narrower float's spacing there "
                 "(bfloat16 spaces a year of 2020 by 8); kept in float")

REASON_SHAPE = ("shape arithmetic: computed from Shape/Size only, exact integers in float that a "
                "narrower float rounds (bfloat16 turns a Reshape target of 1156 into 1152); kept in float")

#: Elementwise ops that may sit on the chain variance -> eps -> sqrt -> reciprocal.
_CHAIN_OPS = frozenset({"Add", "Sqrt", "Reciprocal", "Pow", "Div", "Mul", "Max", "Clip", "Relu", "Cast"})
_MAX_CHAIN = 8


@dataclass
class FragileRegion:
    """Node indices (of the graph `find_fragile` was given) to keep float, and why."""

    nodes: set[int]
    reason: str


_SMALL = 64


def _numel(t: onnx.TensorProto) -> int:
    return int(np.prod([int(d) for d in t.dims])) if len(t.dims) else 1


class _View:
    """Producers, consumers and constant values of a graph's main-level tensors."""

    def __init__(self, g: onnx.GraphProto) -> None:
        self.g = g
        self.producer: dict[str, int] = {}
        self.consumers: dict[str, list[int]] = {}
        for k, n in enumerate(g.node):
            for o in n.output:
                if o:
                    self.producer[o] = k
            for i in n.input:
                if i:
                    self.consumers.setdefault(i, []).append(k)
        self.inits = {t.name: t for t in g.initializer}

    def node_of(self, name: str) -> tuple[int, onnx.NodeProto] | None:
        k = self.producer.get(name)
        return None if k is None else (k, self.g.node[k])

    def const(self, name: str) -> np.ndarray | None:
        """The value of a small (<= _SMALL elements) initializer or Constant output; None if it
        is not constant or too big to be a scalar, an exponent or axes (never copies weights)."""
        if name in self.inits:
            t = self.inits[name]
            return numpy_helper.to_array(t) if _numel(t) <= _SMALL else None
        hit = self.node_of(name)
        if hit is None or hit[1].op_type != "Constant":
            return None
        for a in hit[1].attribute:
            if a.name == "value" and a.type == AttributeProto.TENSOR:
                return numpy_helper.to_array(a.t) if _numel(a.t) <= _SMALL else None
            if a.name == "value_float":
                return np.array(a.f, np.float32)
            if a.name == "value_floats":
                return np.array(list(a.floats), np.float32)
        return None

    def is_const(self, name: str) -> bool:
        """Whether `name` is an initializer or a Constant output (of any size)."""
        if name in self.inits:
            return True
        hit = self.node_of(name)
        return hit is not None and hit[1].op_type == "Constant"


def _reduce_key(v: _View, node: onnx.NodeProto) -> tuple:
    """What a Reduce* node reduces over (attribute axes or a constant axes input, keepdims)."""
    axes: tuple = ()
    keep = 1
    for a in node.attribute:
        if a.name == "axes":
            axes = tuple(a.ints)
        elif a.name == "keepdims":
            keep = a.i
    if len(node.input) > 1 and node.input[1]:
        c = v.const(node.input[1])
        axes = tuple(int(x) for x in np.ravel(c)) if c is not None else ("?", node.input[1])
    return axes, keep


def _mean_of(v: _View, name: str) -> tuple[str, tuple, set[int]] | None:
    """(x, reduction key, nodes) if `name` is a mean of x: ReduceMean(x), or ReduceSum(x) scaled
    by a scalar constant (Mul by 1/n or Div by n)."""
    hit = v.node_of(name)
    if hit is None:
        return None
    k, n = hit
    if n.op_type == "ReduceMean":
        return n.input[0], _reduce_key(v, n), {k}
    if n.op_type in ("Mul", "Div") and len(n.input) == 2:
        cands = [(n.input[0], n.input[1])] + ([(n.input[1], n.input[0])] if n.op_type == "Mul" else [])
        for s, c in cands:
            cv = v.const(c)
            sh = v.node_of(s)
            if cv is not None and cv.size == 1 and sh is not None and sh[1].op_type == "ReduceSum":
                return sh[1].input[0], _reduce_key(v, sh[1]), {k, sh[0]}
    return None


def _square_of(v: _View, name: str) -> tuple[str, int] | None:
    """(x, node) if `name` is x*x or Pow(x, 2)."""
    hit = v.node_of(name)
    if hit is None:
        return None
    k, n = hit
    if n.op_type == "Mul" and len(n.input) == 2 and n.input[0] == n.input[1]:
        return n.input[0], k
    if n.op_type == "Pow" and len(n.input) == 2:
        e = v.const(n.input[1])
        if e is not None and e.size == 1 and float(np.ravel(e)[0]) == 2.0:
            return n.input[0], k
    return None


def _chain(v: _View, start: str, data: Iterable[str]) -> set[int] | None:
    """Nodes from a variance tensor to where it scales the data (eps Add, Sqrt, Reciprocal,
    Pow(-0.5), Div/Mul of a data tensor), or None if no such end is reached."""
    data = set(data)
    found: set[int] = set()
    frontier = [start]
    ended = False
    for _ in range(_MAX_CHAIN):
        nxt: list[str] = []
        for t in frontier:
            for k in v.consumers.get(t, ()):
                n = v.g.node[k]
                if n.op_type not in _CHAIN_OPS or k in found:
                    continue
                others = [i for i in n.input if i and i != t]
                if n.op_type in ("Div", "Mul") and any(o in data for o in others):
                    found.add(k)  # the normalization itself: data / std or data * rstd
                    ended = True
                    continue
                if all(v.is_const(o) for o in others):
                    found.add(k)
                    nxt += [o for o in n.output if o]
        frontier = nxt
        if not frontier:
            break
    return found if ended else None


def find_fragile(g: onnx.GraphProto) -> list[FragileRegion]:
    """The fragile normalization subgraphs of main graph `g` (see the module docstring)."""
    v = _View(g)
    regions: list[FragileRegion] = []
    taken: set[int] = set()
    for name in list(v.producer):
        ms = _mean_of(v, name)
        if ms is None:
            continue
        sq_in, key, mean_nodes = ms
        sq = _square_of(v, sq_in)
        if sq is None:
            continue
        y, sq_node = sq
        region = set(mean_nodes) | {sq_node}
        reason = ""
        var = name
        # E[y^2] - E[y]^2
        for k in v.consumers.get(name, ()):
            n = v.g.node[k]
            if n.op_type == "Sub" and n.input[0] == name:
                b = _square_of(v, n.input[1])
                m = _mean_of(v, b[0]) if b else None
                if b and m and m[0] == y and m[1] == key:
                    region |= {k, b[1]} | m[2]
                    var, reason = n.output[0], REASON_CANCEL
                    centered = [c for c in v.consumers.get(b[0], ()) if v.g.node[c].op_type == "Sub"
                                and list(v.g.node[c].input) == [y, b[0]]]
                    region |= set(centered)
                    data = [y] + [v.g.node[c].output[0] for c in centered]
                    break
        if not reason:
            c = v.node_of(y)
            m = _mean_of(v, c[1].input[1]) if c and c[1].op_type == "Sub" and len(c[1].input) == 2 else None
            if c is not None and m is not None and m[0] == c[1].input[0] and m[1] == key:
                region |= {c[0]} | m[2]
                reason, data = REASON_NORM, [y]
            else:
                reason, data = REASON_RMS, [y]
        tail = _chain(v, var, data)
        if tail is None and reason != REASON_CANCEL:
            continue  # a mean of squares that normalizes nothing (a loss, an energy): not ours
        region |= tail or set()
        region -= taken
        if region:
            taken |= region
            regions.append(FragileRegion(region, reason))
    return regions


#: Ops that carry a mask's sentinel values to their output unchanged or combined (a mask built as
#: (1 - m) * lowest, Where(m, 0, lowest), added to the scores, broadcast, moved).
_CARRIERS = frozenset({"Where", "Add", "Sub", "Mul", "Neg", "Expand", "Reshape", "Unsqueeze", "Squeeze",
                       "Transpose", "Concat", "Slice", "Gather", "Tile", "Cast", "Identity", "Max",
                       "Min", "Flatten"})


def _float_constants(v: _View) -> Iterator[tuple[str, np.ndarray]]:
    """The float constants of the main graph (initializers stored in the file, Constant outputs
    and their value_float(s)): (name, finite values), one at a time (a big model's weights are
    never all copied at once)."""
    tensors = [(t.name, t) for t in v.g.initializer if t.data_location != onnx.TensorProto.EXTERNAL]
    tensors += [(n.output[0], a.t) for n in v.g.node if n.op_type == "Constant"
                for a in n.attribute if a.name == "value" and a.type == AttributeProto.TENSOR]
    for name, t in tensors:
        if t.data_type in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE):
            vals = numpy_helper.to_array(t).ravel()
            yield name, vals[np.isfinite(vals)]
    for n in v.g.node:
        if n.op_type == "Constant":
            for attr in n.attribute:
                if attr.name in ("value_float", "value_floats"):
                    vals = np.array([attr.f] if attr.name == "value_float" else attr.floats, np.float64)
                    yield n.output[0], vals[np.isfinite(vals)]


def _sentinel_constants(v: _View, limit: float) -> list[str]:
    """Float constants (initializers, Constant outputs) holding a finite value beyond `limit`."""
    return [name for name, vals in _float_constants(v) if vals.size and float(np.abs(vals).max()) > limit]


def find_underflow(g: onnx.GraphProto, fmt: str, target: str) -> list[FragileRegion]:
    """The nodes that read a constant (a scale of 1e-6, a LayerNorm epsilon of 1e-12) whose cast
    to `fmt` keeps under `mixq.plan.numerics.CAST_MIN_DB` (`underflow_db`): below the target's
    smallest normal value it rounds to subnormals or 0, a coherent error in everything the
    constant scales or shifts. The nodes stay float and read the exact constant; one region
    per constant, its reason naming it."""
    from ..plan.numerics import reaches_below_float32, underflow_db

    if not reaches_below_float32(fmt):  # bf16: float32's exponents
        return []
    v = _View(g)
    regions = []
    for name, vals in _float_constants(v):
        if name not in v.consumers:
            continue
        mag = np.abs(vals.astype(np.float64))
        db = underflow_db(fmt, mag, np.ones_like(mag))
        if db is not None:
            regions.append(FragileRegion(set(v.consumers[name]), (
                f"reads constant {name!r} (|x| up to {float(mag.max()):.3g}) under {target}'s smallest normal value: "
                f"cast, it rounds to subnormals or 0 (a predicted {max(db, -99.0):.1f} dB); kept in float")))
    return regions


def find_sentinels(g: onnx.GraphProto, limit: float, target: str) -> list[FragileRegion]:
    """The nodes that read values past the target type's largest finite value `limit`: from
    every constant holding one (an attention mask of float32's lowest value), through the ops
    that carry it (`_CARRIERS`), to the first node that consumes it otherwise (the Softmax).
    Cast to the target those values become +-inf, and a fully masked row's Softmax NaN; the
    nodes stay float and the Softmax reads the float32 scores."""
    v = _View(g)
    region: set[int] = set()
    frontier = _sentinel_constants(v, limit)
    seen = set(frontier)
    while frontier:
        nxt: list[str] = []
        for t in frontier:
            for k in v.consumers.get(t, ()):
                n = v.g.node[k]
                region.add(k)
                if n.op_type in _CARRIERS:
                    nxt += [o for o in n.output if o and o not in seen]
                    seen.update(n.output)
        frontier = nxt
    if not region:
        return []
    return [FragileRegion(region, f"reads values past {target}'s largest finite value {limit:.4g} (a mask "
                                  f"of float32's lowest value): cast to {target} they become inf, and a "
                                  "fully masked row's Softmax NaN; kept in float")]


def find_shape_arithmetic(g: onnx.GraphProto) -> list[FragileRegion]:
    """The nodes that compute only from tensor shapes (`mixq.plan.ops.shape_only_tensors`: a
    torch export's Reshape target as Cast(Shape) arithmetic in float). Their values are exact
    integers; converted, they would be rounded to the target's significand."""
    from ..plan.ops import shape_only_tensors

    shaped = shape_only_tensors(g.node, {t.name for t in g.initializer})
    region = {k for k, n in enumerate(g.node) if n.output and n.op_type != "Constant"
              and all(o in shaped for o in n.output if o)}
    return [FragileRegion(region, REASON_SHAPE)] if region else []


def find_phases(model: onnx.ModelProto, types: dict[str, int], target: str, mantissa_bits: int
                ) -> list[FragileRegion]:
    """The nodes computing the phase of a Sin / Cos, or the input of a Floor / Ceil / Round (a
    feature bucketized in the graph), from coordinates (positions cast from integers, a
    timestep or coordinates fed as a graph input), through the ops that carry their
    rounding scaled (`mixq.plan.numerics.phase_paths`), and the periodic nodes themselves. Such
    phases reach the thousands, where `target` spaces values by a sizeable part of a period
    (bfloat16: 8 at 2000; float16: 1): Cos / Sin of them is noise. A phase a layer computes from
    features is left to the conversion (no range is known here, and it is usually small).
    `types`: the element type of each tensor (the converter's type inference)."""
    from ..plan.numerics import PERIODIC_OPS, phase_paths

    producer = {o: k for k, n in enumerate(model.graph.node) for o in n.output if o}
    graph_inputs = {i.name for i in model.graph.input}
    inits = {t.name for t in model.graph.initializer}
    region: set[int] = set()
    for phase, path in phase_paths(model, elem_type=types.get).items():
        def coordinate(t: str) -> bool:
            if t in graph_inputs and t not in inits:
                return True
            k = producer.get(t)
            return k is not None and model.graph.node[k].op_type == "Cast" and \
                any(i and i not in path for i in model.graph.node[k].input)  # cast from an integer
        if not any(coordinate(t) for t in path):
            continue
        region.update(producer[t] for t in path if t in producer)
        region.update(k for k, n in enumerate(model.graph.node)
                      if n.op_type in PERIODIC_OPS and n.input and n.input[0] == phase)
    if not region:
        return []
    return [FragileRegion(region, f"phase of a Sin / Cos (or a Floor / Ceil / Round's input) computed from "
                                  f"positions, a timestep or a feature: {target} "
                                  f"keeps {mantissa_bits + 1} significant bits, which space a phase of 2000 "
                                  f"{2.0 ** (10 - mantissa_bits):g} apart, a sizeable part of its period; "
                                  "kept in float")]


_AFFINE = frozenset({"Sub", "Add", "Mul", "Div"})


def find_input_affine(model: onnx.ModelProto) -> list[FragileRegion]:
    """The Sub / Add / Mul / Div nodes that apply constants to a float graph input, and those
    that go on applying constants to their output, where one of them adds or subtracts: the
    input standardization a model does itself. Its offsets are the largest values the model
    sees (a year, a price, a latitude, minus their means), where a narrower float's spacing is
    widest; keeping these few element-wise nodes float costs nothing."""
    g = model.graph
    inits = {t.name for t in g.initializer}
    consumers: dict[str, list[int]] = {}
    for k, n in enumerate(g.node):
        for i in n.input:
            if i:
                consumers.setdefault(i, []).append(k)
    float_types = (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE)
    region: set[int] = set()
    for inp in g.input:
        if inp.name in inits or inp.type.tensor_type.elem_type not in float_types:
            continue
        chain: set[int] = set()
        frontier = [inp.name]
        while frontier:
            t = frontier.pop()
            for k in consumers.get(t, ()):
                n = g.node[k]
                if k in chain or n.op_type not in _AFFINE or n.domain not in ("", "ai.onnx") or len(n.input) != 2:
                    continue
                other = n.input[1] if n.input[0] == t else n.input[0]
                if other not in inits or (n.op_type == "Div" and n.input[0] != t):
                    continue
                chain.add(k)
                frontier.append(n.output[0])
        # a scaling alone (x / 255) rounds relative to each value; an offset removed is the risk
        if any(g.node[k].op_type in ("Sub", "Add") for k in chain):
            region |= chain
    return [FragileRegion(region, REASON_AFFINE)] if region else []
