"""Op semantics as data: for each op type, which inputs are activations, weights and bias, which
axes matter, and whether quantization passes through unchanged.

One table instead of one class per op. The quantizer reads it to decide which tensors get a
format; an op type missing from the table stays float and the report says so.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import onnx

from ..graph import float_attr, int_attr, outer_scope_reads, subgraphs


@dataclass(frozen=True)
class OpSemantics:
    """How one op type takes part in quantization.

    activations: input indices quantized as run-time activations (an initializer there is
        quantized as a per-tensor constant with the weight format).
    weight: input index of the weight, quantized with the weight format (per channel allowed).
    weight_channel_axis / weight_block_axis: functions of the node giving the output-channel axis
        (per-channel scales) and the reduction axis (blocks of block formats) of the weight.
    bias: input index of a bias, quantized to int32 with scale = input scale x weight scale.
    passthrough: the outputs carry their first input's quantization unchanged (data movement and
        max-like ops), so they reuse its parameters instead of being calibrated.
    quantize_output: the first output is quantized too.
    shared_scale: all activation inputs and the output share one scale (Concat on NPUs).
    activation_block_axis: the axis blocks of a block format run along in the activation
        inputs (the reduction axis; None: 1 for a rank-3..5 tensor, else the last).
    activation_block_axes: per input index, where it differs from `activation_block_axis`
        (MatMul's B reduces along its second-to-last axis, A along its last).
    variadic: every input is an activation (Concat, Sum, Max...), however many there are.
    """

    activations: tuple[int, ...] = (0,)
    weight: int | None = None
    weight_channel_axis: int | None = None
    weight_block_axis: int | None = None
    bias: int | None = None
    passthrough: bool = False
    quantize_output: bool = True
    shared_scale: bool = False
    activation_block_axis: int | None = None
    variadic: bool = False
    activation_block_axes: tuple[int | None, ...] = ()

    def activation_indices(self, node: onnx.NodeProto) -> tuple[int, ...]:
        """The input indices of `node` that are activations."""
        if self.variadic:
            return tuple(range(len(node.input)))
        return tuple(i for i in self.activations if i < len(node.input))

    def block_axis_of(self, index: int, rank: int | None) -> int:
        """The axis (possibly negative) that blocks of input `index` run along, for a tensor of
        `rank` (None: unknown): the axis the op reduces that input over."""
        axes = self.activation_block_axes
        axis = axes[index] if index < len(axes) and axes[index] is not None else self.activation_block_axis
        if axis is None:
            return 1 if rank in (3, 4, 5) else -1
        if rank is not None and not -rank <= axis < rank:
            return -1  # MatMul with a 1-D B: its one axis is the reduced one
        return axis


# a weight computed at run time (not an initializer) is read as an activation: blocked, like
# the weight, along the input channels (W is (C_out, C_in/g, k...) for Conv, (C_in, ...) for
# ConvTranspose)
_CONV = OpSemantics(activations=(0, 1), weight=1, weight_channel_axis=0, weight_block_axis=1, bias=2,
                    activation_block_axis=1)
_CONVT = OpSemantics(activations=(0, 1), weight=1, weight_channel_axis=1, weight_block_axis=0, bias=2,
                     activation_block_axis=1, activation_block_axes=(1, 0))
# A (..., M, K) @ B (..., K, N): blocks of a block format run along K in both operands (the
# shared exponent of an MX dot product is one per block of K), whether B is a weight or not
_MATMUL = OpSemantics(activations=(0, 1), weight=1, weight_channel_axis=-1, weight_block_axis=-2,
                      activation_block_axis=-1, activation_block_axes=(-1, -2))
_UNARY = OpSemantics(activations=(0,))
_BINARY = OpSemantics(activations=(0, 1))
_PASS = OpSemantics(activations=(0,), passthrough=True)

#: The op semantics table. Gemm's weight axes depend on transB and are fixed up in `semantics`.
OP_TABLE: dict[str, OpSemantics] = {
    "Conv": _CONV,
    "ConvTranspose": _CONVT,
    "MatMul": _MATMUL,
    "Gemm": OpSemantics(activations=(0, 1), weight=1, weight_channel_axis=1, weight_block_axis=0,
                        bias=2, activation_block_axis=-1, activation_block_axes=(-1, 0)),
    "Add": _BINARY, "Mul": _BINARY, "Sub": _BINARY, "Div": OpSemantics(activations=(0,)),
    "Concat": OpSemantics(activations=(), variadic=True, shared_scale=True),
    "AveragePool": _UNARY, "GlobalAveragePool": _UNARY,
    "Relu": _UNARY, "Clip": _UNARY, "LeakyRelu": _UNARY, "Sigmoid": _UNARY, "Tanh": _UNARY,
    "HardSigmoid": _UNARY, "HardSwish": _UNARY, "Softmax": _UNARY, "Gelu": _UNARY, "Erf": _UNARY,
    "PRelu": _UNARY, "Elu": _UNARY, "Mish": _UNARY, "Swish": _UNARY,
    "Resize": _UNARY, "LayerNormalization": _UNARY, "InstanceNormalization": _UNARY,
    "RMSNormalization": _UNARY, "GroupNormalization": _UNARY, "Sin": _UNARY, "Cos": _UNARY,
    "ReduceMean": _UNARY, "Pow": _UNARY, "Sqrt": _UNARY,
    "Gather": OpSemantics(activations=(0,), passthrough=True),
    # data movement and max-like ops keep their input's quantization
    "Reshape": _PASS, "Transpose": _PASS, "Flatten": _PASS, "Squeeze": _PASS, "Unsqueeze": _PASS,
    "Slice": _PASS, "Split": _PASS, "MaxPool": _PASS, "GlobalMaxPool": _PASS, "Identity": _PASS,
    "DepthToSpace": _PASS, "SpaceToDepth": _PASS, "Pad": _PASS, "Expand": _PASS, "Tile": _PASS,
    "ReduceMax": _PASS, "ReduceMin": _PASS,
}

#: Ops whose float inputs/outputs are never quantized, with the reason shown to users.
NEVER_QUANTIZED: dict[str, str] = {
    "Shape": "produces integers", "Size": "produces integers", "NonZero": "produces integers",
    "ArgMax": "produces integers", "ArgMin": "produces integers", "TopK": "index output",
    "If": "control flow (subgraphs are left float)", "Loop": "control flow (subgraphs are left float)",
    "Scan": "control flow (subgraphs are left float)", "Cast": "type conversion",
    "BatchNormalization": "left float: not folded into a layer (the notes say why)",
    "LSTM": "recurrent op: no QDQ form in stock onnxruntime",
    "GRU": "recurrent op: no QDQ form in stock onnxruntime",
    "RNN": "recurrent op: no QDQ form in stock onnxruntime", "QuantizeLinear": "already quantized", "DequantizeLinear": "already quantized",
}


def semantics(node: onnx.NodeProto) -> OpSemantics | None:
    """The semantics of `node`, or None when mixq leaves that op type float."""
    if node.domain not in ("", "ai.onnx"):
        return None
    sem = OP_TABLE.get(node.op_type)
    if sem is None:
        return None
    if node.op_type == "Gemm":
        trans_a, trans_b = int_attr(node, "transA", 0), int_attr(node, "transB", 0)
        # B is (K, N) or, with transB, (N, K): the output channel is N, the reduction axis K;
        # A is (M, K) or, with transA, (K, M): its blocks run along K
        # a B computed at run time (not an initializer) is an activation, blocked along K too
        sem = OpSemantics(activations=(0, 1), weight=1, weight_channel_axis=0 if trans_b else 1,
                          weight_block_axis=1 if trans_b else 0, bias=2,
                          activation_block_axis=0 if trans_a else -1,
                          activation_block_axes=(0 if trans_a else -1, 1 if trans_b else 0))
    return sem


#: Ops whose output lies in a fixed interval, whatever the input: a calibrated range that
#: reaches the bound needs no headroom past it (QuantConfig.range_headroom).
BOUNDED_OUTPUTS: dict[str, tuple[float, float]] = {
    "Sigmoid": (0.0, 1.0), "HardSigmoid": (0.0, 1.0), "Softmax": (0.0, 1.0),
    "Tanh": (-1.0, 1.0), "Erf": (-1.0, 1.0), "Relu": (0.0, float("inf")),
    "Sin": (-1.0, 1.0), "Cos": (-1.0, 1.0),
}

#: Ops whose output is a mean of input values (or of padded zeros): they keep a bound.
_AVERAGING = frozenset({"AveragePool", "GlobalAveragePool", "ReduceMean"})


def output_bounds(node: onnx.NodeProto, constant: Callable[[str], np.ndarray | None]
                  ) -> tuple[float, float] | None:
    """The interval `node`'s first output lies in by construction, or None. `constant(name)`
    gives an input's value where it is a constant (Clip's bounds)."""
    if node.domain not in ("", "ai.onnx"):
        return None
    if node.op_type in BOUNDED_OUTPUTS:
        return BOUNDED_OUTPUTS[node.op_type]
    if node.op_type != "Clip":
        return None
    lo, hi = float_attr(node, "min", -np.inf), float_attr(node, "max", np.inf)
    for i in (1, 2):
        if len(node.input) > i and node.input[i]:
            v = constant(node.input[i])
            if v is None or v.size != 1:
                return None
            lo, hi = (float(v.reshape(())), hi) if i == 1 else (lo, float(v.reshape(())))
    return (lo, hi) if lo <= hi else None


def bounded_tensors(nodes: Iterable[onnx.NodeProto], constant: Callable[[str], np.ndarray | None]
                    ) -> dict[str, tuple[float, float]]:
    """Tensor -> the interval it lies in by construction: outputs of bounded ops, and the
    outputs of pass-through ops (data movement, max-like; not Pad, whose pad value may lie
    outside) and of averages that read one. `nodes` in topological order."""
    out: dict[str, tuple[float, float]] = {}
    for node in nodes:
        b = output_bounds(node, constant)
        if b is None and node.input and node.input[0] in out and node.domain in ("", "ai.onnx"):
            inner = out[node.input[0]]
            sem = semantics(node)
            if node.op_type in _AVERAGING:  # a mean of values in [lo, hi] (or of padded zeros)
                b = (min(inner[0], 0.0), max(inner[1], 0.0))
            elif sem is not None and sem.passthrough and node.op_type != "Pad":
                b = inner
        if b is not None and node.output:
            out[node.output[0]] = b
    return out


#: Ops whose outputs depend on their input's shape only, never on its values.
SHAPE_OPS = frozenset({"Shape", "Size"})

#: Why a tensor computed from shapes alone is left float (the plan's reason).
SHAPE_ONLY_REASON = ("computed from tensor shapes only (Shape/Size and constants): the same values "
                     "for every input of one shape, e.g. a Reshape target computed in float, whose "
                     "exact integers any rounding breaks, or position embeddings; left float")


def shape_only_tensors(nodes: Iterable[onnx.NodeProto], constants: set[str]) -> set[str]:
    """Tensors whose values depend on the input's shapes alone: outputs of Shape / Size, and
    the outputs of nodes (no subgraphs) whose every input is one of them or a constant, with
    at least one of them (a torch export's `ceil(H / patch) * patch` in float). `nodes` in
    topological order; `constants`: the initializers' names (Constant nodes count too)."""
    out: set[str] = set()
    const = set(constants)
    for node in nodes:
        if node.domain not in ("", "ai.onnx"):
            continue
        ins = [i for i in node.input if i]
        if node.op_type == "Constant":
            const.update(node.output)
        elif node.op_type in SHAPE_OPS or (
                node.op_type not in ("If", "Loop", "Scan") and any(i in out for i in ins)
                and all(i in out or i in const for i in ins)):
            out.update(o for o in node.output if o)
    return out


def unsupported_reason(node: onnx.NodeProto) -> str:
    """Why `node` is left float (for the report)."""
    if node.domain == "ai.onnx.ml":  # ONNX's own classical-ML domain, not a custom one
        return f"ONNX-ML op '{node.domain}.{node.op_type}' is not in mixq's op table"
    if node.domain not in ("", "ai.onnx"):
        return f"custom-domain op '{node.domain}.{node.op_type}' is not in mixq's op table"
    return NEVER_QUANTIZED.get(node.op_type, f"op type '{node.op_type}' is not in mixq's op table")


#: Ops that compute with a weight slot (Conv/ConvTranspose/Gemm/MatMul): the layers a model is
#: made of; what follows the last of them on the way to an output is post-processing.
COMPUTE_OPS = frozenset(op for op, s in OP_TABLE.items() if s.weight is not None)
#: Activations backends run inside the compute op before them (one kernel): part of the layer.
LAYER_ACTIVATIONS = frozenset({"Relu", "Clip"})

#: Why a post-processing node is left float (the plan's reason).
TAIL_REASON = ("post-processing after the last Conv/Gemm/MatMul on the way to an output (a box "
               "decode, scores, a final Softmax or normalization): kept float, as deployments run it "
               "on the host, since a uniform grid over decoded values (coordinates 0..640 from a "
               "0..80 anchor grid times a stride) costs pixels; quantize_tail=True quantizes it")


def _captures(node: onnx.NodeProto) -> set[str]:
    """Outer-scope names a node's subgraphs (If branches, Loop/Scan bodies) read."""
    return set().union(*(outer_scope_reads(g) for g in subgraphs(node)))


def postprocess_tail(nodes: Iterable[onnx.NodeProto],
                     constants: Mapping[str, Sequence[int]] | None = None) -> set[int]:
    """Indices (into `nodes`) of the post-processing tail: nodes downstream of a compute op
    (COMPUTE_OPS) from which no compute op, nor any op with subgraphs, is reachable. Left out,
    as parts of the layer before them: a bias Add (an Add of a constant of `constants`, name ->
    dims, with one non-unit dim) and a Relu/Clip that read a layer's output alone (one kernel
    with it); and pass-through ops (Reshape, Split, ...) that read a tensor outside the tail,
    which carry its grid exactly: a float Reshape after a DequantizeLinear is what
    onnxruntime's QDQ propagation turns into a QuantizeLinear it then rejects ("output_dtype
    INT8 does not match y_zero_point type UINT8"). A pass-through op that reads a tail node's
    output stays float with it (a Transpose after a Concat of boxes and scores: quantized, it
    put both on one grid). A graph with no compute op has no tail. Order-independent."""
    nodes = list(nodes)
    consts = dict(constants or {})
    producer: dict[str, int] = {}
    consumers: dict[str, list[int]] = {}
    reads: list[set[str]] = []  # per node: its inputs and its subgraphs' captures
    for i, n in enumerate(nodes):
        reads.append({x for x in n.input if x} | _captures(n))
        if n.op_type == "Constant" and n.output:
            value = next((a.t for a in n.attribute if a.name == "value"), None)
            # (a Constant of another kind, e.g. value_floats, counts as no bias: dims (0, 0))
            consts[n.output[0]] = tuple(value.dims) if value is not None else (0, 0)
            continue
        producer.update((o, i) for o in n.output if o)
        for x in sorted(reads[i]):
            consumers.setdefault(x, []).append(i)

    layers = {i for i, n in enumerate(nodes) if n.domain in ("", "ai.onnx") and n.op_type in COMPUTE_OPS}
    barriers = layers | {i for i, n in enumerate(nodes) if next(subgraphs(n), None) is not None}
    upstream: set[int] = set()  # nodes that reach a barrier
    todo = sorted(barriers)
    while todo:
        i = todo.pop()
        for x in reads[i]:
            p = producer.get(x)
            if p is not None and p not in upstream:
                upstream.add(p)
                todo.append(p)
    downstream: set[int] = set()  # nodes a compute op reaches
    todo = sorted(layers)
    while todo:
        i = todo.pop()
        for o in nodes[i].output:
            for c in consumers.get(o, ()):
                if c not in downstream:
                    downstream.add(c)
                    todo.append(c)
    tail = downstream - upstream - barriers
    layer_ends = set(layers)  # grows by the bias Adds and activations that continue a layer

    def continues_layer(n: onnx.NodeProto) -> bool:
        data = [x for x in n.input if x in producer]
        if len(data) != 1 or producer[data[0]] not in layer_ends \
                or len(consumers.get(data[0], ())) != 1:
            return False
        if n.op_type in LAYER_ACTIVATIONS:
            return n.input[0] == data[0]
        others = [x for x in n.input if x and x != data[0]]
        return n.op_type == "Add" and len(others) == 1 and others[0] in consts \
            and sum(1 for d in consts[others[0]] if d != 1) <= 1

    changed = True
    while changed:  # a bias Add, then a Relu: both part of the layer
        changed = False
        for i in sorted(tail):
            if continues_layer(nodes[i]):
                tail.discard(i)
                layer_ends.add(i)
                changed = True
    changed = True
    while changed:  # a pass-through op on a quantized tensor carries its grid (and so the next)
        changed = False
        for i in sorted(tail):
            sem = semantics(nodes[i])
            if sem is None or not sem.passthrough:
                continue
            p = producer.get(nodes[i].input[0]) if nodes[i].input else None
            if p is None or p not in tail:
                tail.discard(i)
                changed = True
    return tail


#: Ops an output's extremes pass through unmixed (element-wise monotone, moving data, taking a
#: maximum, or deciding by one: an ArgMax or TopK reads the logits' largest values): a clipped
#: input of one of them is a saturated output, or a tie. Binary ones count with a constant operand.
EXTREMES_PRESERVING = frozenset({
    "Identity", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose", "Concat", "Slice", "Split",
    "Expand", "Tile", "Cast", "Softmax", "LogSoftmax", "Sigmoid", "HardSigmoid", "Tanh", "Exp", "Relu",
    "LeakyRelu", "Clip", "Softplus", "Mul", "Add", "Sub", "Div", "Neg",
    "Resize", "Upsample", "DepthToSpace", "SpaceToDepth", "Pad", "Gather", "GatherElements", "GatherND",
    "MaxPool", "GlobalMaxPool", "ReduceMax", "ReduceMin", "Max", "Min",
    "ArgMax", "ArgMin", "TopK"})
_BINARY_OPS = frozenset({"Mul", "Add", "Sub", "Div"})
#: data: input 0 (the others are shapes, indices, pads, scales or a count)
_SHAPED = frozenset({"Slice", "Reshape", "Expand", "Tile", "Split", "Squeeze", "Unsqueeze", "Resize",
                     "Upsample", "Pad", "Gather", "GatherElements", "GatherND", "ReduceMax", "ReduceMin",
                     "TopK"})


def output_defining_tensors(graph: onnx.GraphProto) -> set[str]:
    """Tensors whose extremes are the model's answer: the graph's outputs and the tensors they
    are computed from through `EXTREMES_PRESERVING` ops alone (the logits a Softmax turns into
    probabilities, a detector's raw head before its sigmoid and scaling). Their largest values
    are the decision (the class, the most confident box), so no range method may clip them for
    the bulk's precision. A normalization or a reduction mixes its input: the hidden state
    before an encoder's final LayerNorm is not one."""
    consts = {t.name for t in graph.initializer}
    consts |= {o for n in graph.node if n.op_type == "Constant" for o in n.output}
    producer = {o: n for n in graph.node for o in n.output if o}
    out: set[str] = set()
    todo = [o.name for o in graph.output]
    while todo:
        t = todo.pop()
        if t in out or t in consts:
            continue
        out.add(t)
        n = producer.get(t)
        if n is None or n.domain not in ("", "ai.onnx") or n.op_type not in EXTREMES_PRESERVING:
            continue
        data = [x for x in (n.input[:1] if n.op_type in _SHAPED else n.input) if x and x not in consts]
        if n.op_type in _BINARY_OPS and len(data) != 1:
            continue  # a sum or product of two tensors mixes them
        todo.extend(data)
    return out
