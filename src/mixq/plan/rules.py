"""Build a precision plan from a config and the op semantics table, in three stages:

1. requests: every quantized node asks for its activation format on its activation inputs
   (and its output, where the config quantizes outputs) and its weight format on its weights;
2. resolve: a tensor takes the format its producer asks for (or, with no quantized producer,
   its first consumer's); consumers that ask for another format become consumer formats
   (precision boundaries the rewrite materializes); tensor overrides win over everything;
3. policies: small ordered functions that adjust the result (activation fusion, single-element
   constants), each writing its reason into the plan.

Every float tensor of the graph (subgraphs included) ends in the plan or in `skipped`, with a
reason.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np
import onnx

from ..config import QuantConfig
from ..errors import ConfigError, did_you_mean
from ..formats import get_format
from ..granularity import PerBlock, PerChannel
from ..graph import GraphIndex, float_attr, is_float_type, subgraphs, walk_graphs
from .ops import (COMPUTE_OPS, SHAPE_ONLY_REASON, TAIL_REASON, postprocess_tail, semantics,
                  shape_only_tensors, unsupported_reason)
from .plan import PrecisionPlan, TensorPrecision

__all__ = ["build_plan", "float_tensors", "layerless_islands", "tensor_ranks"]


def float_tensors(model: onnx.ModelProto) -> set[str]:
    """Names of float32 tensors (from shape inference, graph inputs/outputs and initializers)."""
    g = model.graph
    names = {v.name for v in [*g.value_info, *g.input, *g.output]
             if v.type.tensor_type.elem_type == onnx.TensorProto.FLOAT}
    names |= {t.name for t in g.initializer if t.data_type == onnx.TensorProto.FLOAT}
    return names


def tensor_ranks(model: onnx.ModelProto) -> dict[str, int]:
    ix = GraphIndex.of(model)
    return {n: r for n in ix.types if (r := ix.rank(n)) is not None}


class _Groups:
    """Union-find over tensor names; the root is the representative tensor."""

    def __init__(self) -> None:
        self.parent: dict[str, str] = {}

    def find(self, x: str) -> str:
        self.parent.setdefault(x, x)
        while self.parent[x] != x:
            self.parent[x] = self.parent[self.parent[x]]
            x = self.parent[x]
        return x

    def union(self, keep: str, other: str) -> None:
        a, b = self.find(keep), self.find(other)
        if a != b:
            self.parent[b] = a


def _norm_axis(axis: int | None, rank: int | None) -> int | None:
    if axis is None or rank is None:
        return axis
    return axis + rank if axis < 0 else axis


def _default_block_axis(rank: int | None) -> int | None:
    return _norm_axis(1 if rank in (3, 4, 5) else -1, rank)


@dataclass
class _Requests:
    """What the nodes ask for (stage 1), before formats are resolved per tensor."""

    produced: dict[str, tuple[str, str, int | None]] = field(default_factory=dict)
    consumed: dict[str, list[tuple[str, str, str, int | None]]] = field(default_factory=dict)
    constants: dict[str, TensorPrecision] = field(default_factory=dict)
    passthrough_of: dict[str, str] = field(default_factory=dict)
    float_scalars: list[str] = field(default_factory=list)
    float_nodes: dict[str, str] = field(default_factory=dict)
    float_ids: dict[int, str] = field(default_factory=dict)  # id(node) -> why (names may repeat)
    untyped: dict[str, str] = field(default_factory=dict)
    fused: dict[str, str] = field(default_factory=dict)   # compute output -> activation output
    left: dict[str, str] = field(default_factory=dict)    # tensor -> why a policy left it float
    groups: _Groups = field(default_factory=_Groups)


def _why_float(node: onnx.NodeProto, config: QuantConfig) -> str | None:
    if semantics(node) is None:
        return unsupported_reason(node)
    if config.op_types is not None and node.op_type not in config.op_types:
        return f"op type {node.op_type} is not in op_types"
    if node.op_type in config.exclude_op_types:
        return f"op type {node.op_type} excluded by exclude_op_types"
    if config.excludes_node(node.name):
        return "node excluded by exclude_nodes"
    return None


def _weight_precision(ix: GraphIndex, node: onnx.NodeProto, w: str, fmt: str, why: str,
                      config: QuantConfig, overridden: bool, act: str) -> TensorPrecision:
    """The plan entry of a weight: its format, per-channel axis or blocks, and the reason."""
    sem = semantics(node)
    assert sem is not None  # only quantized nodes have weights
    rank = ix.rank(w)
    reason = "tensor override" if overridden else f"weight of {node.op_type} ({why})"
    channel = _norm_axis(sem.weight_channel_axis, rank)
    block = _norm_axis(sem.weight_block_axis, rank)
    if rank == 1:
        block = 0
    if node.op_type == "MatMul" and rank != 2:
        # onnxruntime's integer MatMul kernels take per-column scales only for a 2-D B
        # (QLinearMatMul: "zero point must be a scalar, 1D tensor of size 1..."): per tensor
        channel = None
        if config.per_channel_weights and get_format(fmt).kind == "int":
            reason += f"; per tensor: a {rank}-D MatMul weight has no per-column form in onnxruntime"
    g = config.granularity
    block_size = None
    if isinstance(g, PerChannel):
        if g.axis is not None and rank:
            channel = _norm_axis(g.axis, rank)
    elif isinstance(g, PerBlock) and get_format(fmt).kind == "int" and channel is not None and \
            get_format(fmt).bits == 8 and get_format(act).kind == "int" and get_format(act).bits == 8 \
            and node.op_type in ("MatMul", "Conv"):
        # onnxruntime fuses an 8-bit blocked weight with 8-bit activations into QLinearMatMul /
        # QLinearConv, which reject blocked parameters at run time: per channel instead
        reason += "; per channel, not per block: onnxruntime's 8-bit integer MatMul/Conv kernels take no blocked weights"
    elif isinstance(g, PerBlock) and get_format(fmt).kind == "int" and channel is not None:
        block_size = g.size
        if g.axis is not None and rank:
            block = _norm_axis(g.axis, rank)
        channel = None
    else:
        channel = None
    return TensorPrecision(tensor=w, role="weight", format=fmt, reason=reason,
                           channel_axis=channel, block_axis=block, block_size=block_size)


def _requests(ix: GraphIndex, config: QuantConfig) -> _Requests:
    """Stage 1: per node, the formats it asks for on its inputs, weights, bias and output."""
    req = _Requests()
    overrides = dict(config.tensor_formats)
    inits = ix.initializers
    shaped = shape_only_tensors(ix.graph.node, set(inits))
    read_float = shaped - set(overrides)  # shape-only operands stay unquantized, unless overridden
    tail = set() if config.quantize_tail else postprocess_tail(
        ix.graph.node, {n: tuple(t.dims) for n, t in inits.items()})
    for k, node in enumerate(ix.graph.node):
        why_not = _why_float(node, config)
        floaty = any(ix.elem_type(t) == onnx.TensorProto.FLOAT for t in [*node.input, *node.output] if t)
        if why_not is None and node.output and all(o in shaped for o in node.output if o) and floaty:
            why_not = SHAPE_ONLY_REASON  # (integer-only shape nodes are no candidates: not listed)
        if why_not is None and k in tail and floaty and \
                not any(r.matches(node.op_type, node.name) for r in config.layer_rules):
            why_not = TAIL_REASON
        if why_not is not None:
            if node.op_type != "Constant":
                req.float_nodes[node.name] = why_not
            req.float_ids[id(node)] = why_not
            continue
        sem = semantics(node)
        assert sem is not None  # _why_float returned None
        act, wfmt, why = config.formats_for(node.op_type, node.name)
        int_pair = get_format(act).kind == "int" and get_format(wfmt).kind == "int"
        indices = sem.activation_indices(node)
        act_inputs = [node.input[i] for i in indices if node.input[i] and node.input[i] not in read_float]
        for i in indices:
            name = node.input[i]
            if not name:
                continue
            et = ix.elem_type(name)
            if et == 0:
                p = ix.producer(name)
                req.untyped[name] = (
                    f"type unknown: shape inference could not infer it"
                    + (f" (produced by {p.domain + '.' if p.domain else ''}{p.op_type} node "
                       f"{p.name!r})" if p is not None else "")
                    + f"; {node.op_type} node {node.name!r} reads it unquantized. Declare its "
                    "type and shape in the model's value_info to quantize it.")
                continue
            if et != onnx.TensorProto.FLOAT:
                continue
            if name in read_float:  # e.g. a position scale in float
                req.left.setdefault(name, SHAPE_ONLY_REASON)
                continue
            if name in inits:
                if sem.weight == i:
                    continue  # a weight, below
                # a constant where the op reads activations is a parameter (weight format),
                # except between integer formats: integer kernels fuse an Add/Mul only when its
                # inputs share a type (onnxruntime's QLinearAdd: a uint8 activation plus an int8
                # constant ran as a float Add between DQ/Q), so it takes the activation format
                cfmt = overrides.get(name, act if int_pair else wfmt)
                if get_format(cfmt).kind != "int" and int(np.prod(inits[name].dims)) == 1:
                    # a single number: no storage to save, while a block / float format would
                    # round it to its few mantissa bits (MXFP8: 3), a systematic error on every
                    # element it scales (PP-OCRv4 rec: 0% accuracy); deployment compilers fold
                    # such scalars into the neighbouring scales
                    if name not in req.float_scalars:
                        req.float_scalars.append(name)
                    continue
                req.constants.setdefault(name, TensorPrecision(
                    tensor=name, role="constant", format=cfmt,
                    reason="tensor override" if name in overrides else
                    f"constant input of {node.op_type}: "
                    f"{'activation' if int_pair else 'weight'} format ({why})", block_axis=-1))
                continue
            block_axis = sem.block_axis_of(i, ix.rank(name))
            req.consumed.setdefault(name, []).append(
                (node.name, act, f"activation of {node.op_type} ({why})",
                 _norm_axis(block_axis, ix.rank(name))))
        if sem.weight is not None and sem.weight < len(node.input):
            w = node.input[sem.weight]
            if w in inits and ix.elem_type(w) == onnx.TensorProto.FLOAT:
                req.constants.setdefault(w, _weight_precision(
                    ix, node, w, overrides.get(w, wfmt), why, config, w in overrides, act))
        if sem.bias is not None and sem.bias < len(node.input) and node.input[sem.bias] in inits:
            b = node.input[sem.bias]
            req.constants.setdefault(b, _bias_precision(ix, node, b, int_pair, config))
        if not (config.quantize_outputs or sem.passthrough):
            continue
        for o in node.output[:1]:
            if not o or ix.elem_type(o) != onnx.TensorProto.FLOAT:
                continue
            if sem.passthrough:
                if act_inputs:
                    req.passthrough_of[o] = act_inputs[0]
                continue
            req.produced[o] = (act, f"output of {node.op_type} ({why})",
                               _default_block_axis(ix.rank(o)))
        if sem.shared_scale and config.share_concat_scales:
            members = [t for t in [*act_inputs, *node.output[:1]]
                       if ix.elem_type(t) == onnx.TensorProto.FLOAT and t not in inits]
            for t in members[1:]:
                req.groups.union(members[0], t)
    return req


def _bias_precision(ix: GraphIndex, node: onnx.NodeProto, b: str, int_pair: bool,
                    config: QuantConfig) -> TensorPrecision:
    """int32 bias at input scale x weight scale, or float with the reason."""
    if not int_pair or config.bias == "float":
        return TensorPrecision(tensor=b, role="bias", format=None, reason=(
            "bias kept float by config" if config.bias == "float" else
            "bias kept float: the activation/weight formats are not both integer"))
    shape = ix.shape(b)
    if shape is None or len(shape) != 1:
        return TensorPrecision(tensor=b, role="bias", format=None, reason=(
            f"bias of shape {shape} is broadcast, not one value per output channel: kept float"))
    if node.op_type == "Gemm" and (float_attr(node, "alpha", 1.0) != 1.0
                                   or float_attr(node, "beta", 1.0) != 1.0):
        return TensorPrecision(tensor=b, role="bias", format=None, reason=(
            "Gemm with alpha or beta != 1 scales its bias apart from the product: kept float"))
    return TensorPrecision(tensor=b, role="bias", format="int32",
                           reason="int32 bias, scale = input scale x weight scale")


# ----------------------------------------------------------------------------- policies
_FUSE_PRODUCERS = frozenset({"Conv", "ConvTranspose", "Gemm", "MatMul", "Add"})
_FUSED_ACTIVATIONS = frozenset({"Relu", "Clip"})


def _fuse_activations(ix: GraphIndex, config: QuantConfig, req: _Requests) -> None:
    """Drop the calibration of a compute op's output that only a Relu/Clip reads; remember
    {compute output: activation output} for the outputs read by a single Relu/Clip (see
    `_requantize_fused`)."""
    if not config.fuse_activations:
        return
    overrides = dict(config.tensor_formats)
    outputs = set(ix.outputs)
    for name in list(req.produced):
        p = ix.producer(name)
        rs = ix.consumers(name)
        if p is None or p.op_type not in _FUSE_PRODUCERS or name in outputs or name in overrides:
            continue
        if rs and all(r.op_type in _FUSED_ACTIVATIONS and r.input[0] == name for r in rs):
            del req.produced[name]
            req.consumed.pop(name, None)
            req.left[name] = (f"fused with the {rs[0].op_type} that reads it: backends run the "
                              "pair as one kernel")
            if len(rs) == 1 and rs[0].output and rs[0].output[0]:
                req.fused[name] = rs[0].output[0]


def _requantize_fused(tensors: dict[str, TensorPrecision], req: _Requests) -> None:
    """Quantize a fused compute output with its activation's output parameters (integer formats).

    With Q a monotone, idempotent quantizer and f a Relu or Clip, Q(f(Q(x))) = Q(f(x)): a Q/DQ
    pair on the compute output with the activation output's parameters changes no value. It
    gives backends the pattern they fuse: onnxruntime turns DQ -> Conv -> Q into QLinearConv,
    while DQ -> Conv -> Relu -> Q stays a float Conv wherever the Relu cannot be absorbed
    (any zero point above the type's minimum: symmetric activations). Block and float formats
    are excluded: a Relu changes a block's shared exponent, so the identity does not hold."""
    for pre, post in req.fused.items():
        tp = tensors.get(post)
        if tp is None or tp.role != "activation" or tp.format is None or tp.consumer_formats \
                or get_format(tp.format).kind != "int":
            continue
        tensors[pre] = TensorPrecision(
            tensor=pre, role="activation", format=tp.format, block_axis=tp.block_axis,
            calibrate=False, reason=f"fused with the activation that reads it: quantized with "
                                    f"{post}'s parameters (exact; lets backends fuse the pair)")
        req.left.pop(pre, None)
        req.groups.union(req.groups.find(post), pre)


def _carry_grids_through_float_passthrough(ix: GraphIndex, config: QuantConfig,
                                           tensors: dict[str, TensorPrecision], req: _Requests) -> None:
    """Float outputs of a pass-through node whose input is on an integer grid take that grid
    (the input's parameters, nothing calibrated): outputs of a node left float (exclude_nodes,
    op_types), and those the island drop left float behind a quantized one (the grid reached
    its input through a float pass-through after the drop). Their values are the input's
    values moved, so this changes none of them; left float, a DequantizeLinear (int8) ->
    Transpose / Reshape / Slice chain read by float ops is what onnxruntime's QDQ propagation
    (default optimizations, 1.31) turns into a QuantizeLinear it then rejects at session
    creation ("output_dtype INT8 does not match y_zero_point type UINT8"). Not Pad: a pad
    value need not lie on the grid. In graph order, so a grid runs down a chain."""
    overrides = dict(config.tensor_formats)
    for node in ix.graph.node:
        sem = semantics(node)
        if sem is None or not sem.passthrough or node.op_type == "Pad" or not node.input \
                or node.input[0] not in tensors:
            continue
        left = req.float_ids.get(id(node))
        src = tensors[node.input[0]]
        fmt = src.consumer_formats.get(node.name, src.format)
        if src.role != "activation" or fmt is None or fmt != src.format or get_format(fmt).kind != "int":
            continue
        for o in node.output:
            # consumers may ask for the format too: one grid, not a second; one left float (an
            # island without a layer, dropped before this grid reached it) takes it, exactly
            had = tensors.get(o)
            if not o or o in overrides or ix.elem_type(o) != onnx.TensorProto.FLOAT \
                    or (had is not None and had.format is not None and (had.format != fmt or left is None)):
                continue
            cformats = had.consumer_formats if had is not None else {}
            tensors[o] = TensorPrecision(
                tensor=o, role="activation", format=fmt, block_axis=src.block_axis,
                calibrate=any(get_format(f).needs_qparams for f in cformats.values()), consumer_formats=cformats,
                reason=f"output of {node.op_type} {node.name!r}"
                       + (f", left float ({left})" if left is not None else "")
                       + f": carries {node.input[0]}'s {fmt} values unchanged, so it is re-quantized with "
                       "that tensor's parameters (exact; onnxruntime rejects the QuantizeLinear its "
                       "optimizer forms after an int8 DequantizeLinear -> Transpose/Reshape otherwise)")
            req.groups.union(req.groups.find(node.input[0]), o)


def _leave_empty_block_tensors(ix: GraphIndex, tensors: dict[str, TensorPrecision]) -> None:
    """Activations whose inferred shape has a zero dim stay float under block formats: there is
    nothing to quantize, and the block functions' reshapes cannot run on zero-size tensors."""
    for name, tp in list(tensors.items()):
        shape = ix.shape(name)
        if tp.role != "activation" or shape is None or 0 not in shape:
            continue
        if any(get_format(f).kind == "block" for f in tp.formats()):
            tensors[name] = replace(tp, format=None, consumer_formats={},
                                    reason="zero-size tensor: nothing to quantize, left float")


def island_reason(ends: list[str]) -> str:
    """Why an activation of a quantized island without a layer stays float (the plan's reason);
    `ends`: what the island is read from and feeds (float nodes, graph inputs and outputs)."""
    shown = ", ".join(ends[:3]) + (f" and {len(ends) - 3} more" if len(ends) > 3 else "")
    return ("no quantized layer (Conv, ConvTranspose, Gemm, MatMul) computes with it, directly or through "
            "the data movement and element-wise ops around it: it lies between " + (shown or "float nodes")
            + ", where a grid adds rounding and no integer kernel runs; left float")


def _drop_layerless_islands(ix: GraphIndex, config: QuantConfig, tensors: dict[str, TensorPrecision],
                            req: _Requests) -> None:
    """Activations on a calibrated grid (integer, scaled fp8) that no quantized layer reads or
    writes, through the quantized nodes connecting them, stay float (`layerless_islands`)."""
    named = {n.name for n in ix.graph.node if any(r.matches("", n.name) for r in config.layer_rules)}
    found = layerless_islands(ix, tensors, lambda n: req.float_ids.get(id(n)),
                              {t for t, _ in config.tensor_formats}, named)
    for t, why in found.items():
        tensors[t] = replace(tensors[t], format=None, consumer_formats={}, calibrate=False, reason=why)


def _has_nested_layers(graph: onnx.GraphProto) -> bool:
    """Whether a Conv / ConvTranspose / Gemm / MatMul sits inside the body of an If / Loop /
    Scan node (left float): a model whose layers all sit there is no element-wise model
    quantized on purpose (Silero VAD's top-level If on the sample rate)."""
    return any(n.op_type in COMPUTE_OPS for node in graph.node for sg in subgraphs(node)
               for g in walk_graphs(sg) for n in g.node)


def layerless_islands(ix: GraphIndex, tensors: dict[str, TensorPrecision],
                      float_reason: Callable[[onnx.NodeProto], str | None], keep: set[str],
                      named: set[str]) -> dict[str, str]:
    """{activation: reason} for the activations on a calibrated grid (integer, scaled fp8) of
    quantized islands without a layer: the groups of nodes left quantized (`float_reason` None)
    connected through such activations, none of them a Conv, ConvTranspose, Gemm or MatMul. A
    Transpose between a graph input and an LSTM, a Squeeze between two LSTMs, or (after the
    numerics policies kept a Log's inputs float) a waveform's pre-emphasis before an STFT Conv
    whose input is float: quantized, such an island is a round trip of rounding between float
    ops that no backend computes in integer (on an NPU, a partition of its own); onnxruntime's
    quantizer leaves them float too (resemblyzer's speaker encoder at A16W8: a linear mel input
    rounded on its way to the LSTM, cosine 0.93 against onnxruntime's 0.9998). Whole islands
    only: a grid cut inside one leaves a DequantizeLinear -> pass-through -> float pattern
    onnxruntime's QDQ propagation rejects; tensors of one parameter group (a float
    pass-through's output on its input's grid) are one island for that reason. A model with no
    layer at all, nor any inside a control-flow body, keeps its plan (the user quantizes
    element-wise ops on purpose); one whose layers all sit in such bodies drops its islands in
    every format, bf16 and block formats too, and
    an island holding a tensor of `keep` (overrides) or a node of `named` (layer rules) keeps
    its grids."""
    live = [n for n in ix.graph.node if float_reason(n) is None]
    top_layers = any(n.op_type in COMPUTE_OPS for n in live)
    # every layer inside a control-flow body: no island is worth its rounding, in any format (a
    # bf16 rounding of an If's outputs is no bf16 model either: the layers compute in float)
    nested_only = not top_layers and _has_nested_layers(ix.graph)

    def gridded(tp: TensorPrecision) -> bool:
        return tp.role == "activation" and any(nested_only or get_format(f).needs_qparams
                                               for f in tp.formats())

    planned = {n for n, tp in tensors.items() if gridded(tp)}
    if not planned or not (top_layers or nested_only):
        return {}
    islands = _Groups()
    kept = {t for t in keep if t in planned}
    for node in live:
        touched = [t for t in dict.fromkeys([*node.input, *node.output]) if t in planned]
        for t in touched:
            islands.union(touched[0], t)
        if touched and (node.op_type in COMPUTE_OPS or node.name in named):
            kept.add(touched[0])
    for t in planned:  # one grid (a pass-through left float carries its input's): one island
        g = tensors[t].group
        if g is not None and g in planned:
            islands.union(g, t)
    kept_roots = {islands.find(t) for t in kept}
    ends: dict[str, list[str]] = {}
    outputs = {o.name for o in ix.graph.output}
    for t in planned:
        root = islands.find(t)
        if root in kept_roots:
            continue
        here = ends.setdefault(root, [])
        p = ix.producer(t)
        for n in ([p] if p is not None else []) + ix.consumers(t):
            why = float_reason(n)
            if why is not None and n.op_type not in ("Shape", "Size"):  # they read no values
                here.append(f"{n.op_type} {n.name!r} ({why.split(':')[0]})")
            elif why is None and (q := tensors.get(n.output[0] if n.output else "")) is not None \
                    and q.role == "activation" and q.format is None and n is not p:
                here.append(f"{n.op_type} {n.name!r} (output kept float)")
        if p is None and t in ix.inputs:
            here.append(f"graph input {t!r}")
        if t in outputs:
            here.append(f"graph output {t!r}")
    return {t: island_reason(list(dict.fromkeys(ends[islands.find(t)])))
            for t in planned if islands.find(t) not in kept_roots}


#: Policies on the requests, before formats are resolved (each may drop or change requests).
REQUEST_POLICIES: tuple[Callable[[GraphIndex, QuantConfig, _Requests], None], ...] = (
    _fuse_activations,
)


# ----------------------------------------------------------------------------- resolve
def _resolve(ix: GraphIndex, config: QuantConfig, req: _Requests) -> dict[str, TensorPrecision]:
    """Stage 2: one producer format per tensor, plus consumer formats at boundaries."""
    overrides = dict(config.tensor_formats)
    tensors: dict[str, TensorPrecision] = {}
    names = ix.values()
    for name in names:
        reqs = req.consumed.get(name, [])
        cal = True
        if name in req.passthrough_of:
            src = tensors.get(req.passthrough_of[name])
            # the format the pass-through op reads its input in: the producer's, or the one a
            # boundary gives this consumer (an int8 MaxPool after an fp16 Add)
            prod = ix.producer(name)
            src_fmt = None if src is None else (
                src.consumer_formats.get(prod.name, src.format) if prod is not None else src.format)
            kind = get_format(src_fmt).kind if src_fmt else None
            if kind == "int" and src is not None and src_fmt and name not in overrides:
                # integer formats re-quantize idempotently with the input's parameters (and
                # onnxruntime's optimizer needs the Q after an integer MaxPool: without it, it
                # propagates the DQ through the op and forms a QuantizeLinear it then rejects)
                if src_fmt == src.format:
                    fmt, why, axis, cal = (src_fmt, "output of a pass-through op: input's "
                                           "parameters", src.block_axis, False)
                    req.groups.union(req.groups.find(req.passthrough_of[name]), name)
                else:  # the input's own group is in another format: parameters of its own
                    fmt, why, axis, cal = (src_fmt, "output of a pass-through op reading its "
                                           f"input in {src_fmt} at a precision boundary",
                                           src.block_axis, True)
            else:
                if kind == "float" and src is not None and name not in overrides:
                    # bf16/fp16 values moved by data movement stay on their grid; a consumer
                    # asking for the same cast format needs no second conversion. Block formats
                    # do not survive data movement (a Transpose or Slice moves elements across
                    # blocks), so their consumers keep their own requests.
                    kept = [r for r in reqs if r[1] != src.format]
                    if len(kept) < len(reqs):
                        req.left.setdefault(name, f"output of a pass-through op: carries its "
                                                  f"input's {src.format} values unchanged")
                    reqs = kept
                if not reqs and name not in overrides:
                    continue
                fmt, why, axis = None, "", None
        elif name in req.produced:
            fmt, why, axis = req.produced[name]
        elif reqs:
            _, fmt, why, axis = reqs[0]
        else:
            continue
        cformats: dict[str, str]
        if name in overrides:
            fmt, why, cal = overrides[name], "tensor override", True
            cformats = {}
        else:
            cformats = {n: f for n, f, _, _ in reqs if f != fmt}
        if fmt is None:
            if not cformats:
                continue
            # no quantized producer: the first consumer format becomes the producer's
            fmt, why = next(iter(cformats.values())), reqs[0][2]
            cformats = {n: f for n, f in cformats.items() if f != fmt}
        # blocks run along the axis the reading op reduces (a MatMul's B: its K axis), which
        # the producer's default does not know; one axis per tensor, so readers that reduce
        # along different axes are named in the reason
        block_reads = [(n, a) for n, f, _, a in reqs if a is not None and get_format(f).kind == "block"]
        if block_reads and get_format(fmt).kind == "block":
            axis = block_reads[0][1]
        elif axis is None:
            axis = next((a for _, _, _, a in reqs if a is not None), None)
        if axis is None and fmt is not None and get_format(fmt).kind == "block":
            # an override on a tensor no op reads in a block format (a Slice read by a Neg):
            # the producers' default, channels of a rank-3..5 tensor, else the last axis
            axis = _default_block_axis(ix.rank(name))
            why += f"; blocks along axis {axis} (no reader reduces it in a block format: the default)"
        others = [f"{n!r} along axis {a}" for n, a in block_reads if a != axis]
        if others and get_format(fmt).kind == "block":
            why += (f"; blocks along axis {axis} for every reader (one block axis per tensor), "
                    f"where {', '.join(others)} reduce(s) it")
        needs_stats = any(get_format(f).needs_qparams for f in cformats.values())
        tensors[name] = TensorPrecision(tensor=name, role="activation", format=fmt, reason=why,
                                        block_axis=axis, calibrate=cal or needs_stats,
                                        consumer_formats=cformats)
    return tensors


def _check_overrides(ix: GraphIndex, config: QuantConfig) -> None:
    known = {n for n in ix.types if ix.elem_type(n) == onnx.TensorProto.FLOAT} | set(ix.initializers)
    for t, _ in config.tensor_formats:
        if t not in known:
            raise ConfigError(f"tensor_formats / MixedPrecisionTensor names tensor {t!r}, which the "
                              f"model does not have (as a float tensor)." + did_you_mean(t, sorted(known)))


def _check_names(ix: GraphIndex, config: QuantConfig) -> None:
    """Names in the config that match nothing are errors, never silently nothing: an op type that
    is no ONNX op (nor one of the model's), a node name the model does not have, a layer-rule
    pattern that matches no node."""
    import fnmatch

    model_ops = {n.op_type for n in ix.graph.node}
    ops = set(config.op_types or ()) | set(config.exclude_op_types)
    for r in config.layer_rules:
        ops |= set(r.op_types)
    for op in sorted(ops):
        if op not in model_ops and not onnx.defs.has(op):
            raise ConfigError(f"op type {op!r} is not an ONNX op type, nor one of this model's."
                              + did_you_mean(op, sorted(model_ops | set(_ONNX_OPS))))
    nodes = [n.name for n in ix.graph.node]
    node_set = set(nodes)
    wanted = [(n, "exclude_nodes") for n in sorted(config.exclude_nodes)]
    wanted += [(n, f"layer rule {i}") for i, r in enumerate(config.layer_rules) for n in r.nodes]
    for name, where in wanted:
        if name in node_set:
            continue
        if any(c in name for c in "*?[") and fnmatch.filter(nodes, name):
            continue
        raise ConfigError(f"{where} names node {name!r}, which matches no node of the model."
                          + did_you_mean(name, nodes) + " `mixq check MODEL` lists the nodes.")


_ONNX_OPS = sorted({s.name for s in onnx.defs.get_all_schemas()})


def _unplanned(ix: GraphIndex, req: _Requests, tensors: dict[str, TensorPrecision]
               ) -> dict[str, str]:
    """Every float tensor of the model that is not in the plan, with the reason."""
    skipped: dict[str, str] = {}

    def float_reason(n: onnx.NodeProto) -> str:
        return req.float_ids.get(id(n), "")

    for name, why in req.untyped.items():
        if name not in tensors:
            skipped[name] = why
    candidates = list(ix.inputs) + [o for n in ix.graph.node for o in n.output if o] + \
        list(ix.initializers)
    for name in dict.fromkeys(candidates):
        if name in tensors or name in skipped:
            continue
        et = ix.elem_type(name)
        if et == 0:
            p = ix.producer(name)
            if p is not None and any(is_float_type(ix.elem_type(i)) for i in p.input if i):
                skipped[name] = ("type unknown: shape inference could not infer it (produced by "
                                 f"{p.op_type} node {p.name!r}); left float")
            continue
        if not is_float_type(et):
            continue
        if name in req.left:
            skipped[name] = req.left[name]
            continue
        if et != onnx.TensorProto.FLOAT:
            # prepare computes a float16 model in float32: what is left is its boundary (a
            # float16 input or output kept as the model declares it) or a bfloat16/double tensor
            skipped[name] = (f"{onnx.TensorProto.DataType.Name(et).lower()} tensor: mixq quantizes "
                             "float32 tensors (float16 models are computed in float32 between "
                             "Casts at their inputs and outputs; this one is kept as declared)")
            continue
        p = ix.producer(name)
        users = ix.consumers(name)
        quantized_users = [u for u in users if id(u) not in req.float_ids]
        if name in ix.initializers:
            if users and not quantized_users:
                u = users[0]
                skipped[name] = (f"constant read only by nodes left float ({u.op_type} "
                                 f"{u.name!r}: {float_reason(u) or 'left float'})")
            elif not users:
                skipped[name] = "initializer no node reads"
            else:
                u = quantized_users[0]
                skipped[name] = (f"constant input of {u.op_type} {u.name!r} that its semantics "
                                 "leave float (a shape, scale or index operand)")
            continue
        if p is not None and id(p) in req.float_ids and not quantized_users:
            skipped[name] = f"produced by {p.op_type} {p.name!r}, left float: {float_reason(p)}"
        elif p is None and not quantized_users:
            skipped[name] = ("graph input read only by nodes left float"
                             + (f" ({users[0].op_type} {users[0].name!r}: "
                                f"{float_reason(users[0])})" if users else ""))
        elif p is not None and id(p) not in req.float_ids:
            sem = semantics(p)
            if sem is not None and sem.passthrough:
                skipped[name] = (f"output of pass-through {p.op_type} {p.name!r} whose input is "
                                 "not quantized")
            else:
                skipped[name] = (f"output of {p.op_type} {p.name!r}: this config quantizes "
                                 "operands, not outputs (quantize_outputs=False), and no "
                                 "consumer asks for a format")
        else:
            skipped[name] = "no quantized op reads or writes it as an activation"
    # subgraph tensors: the bodies of If/Loop/Scan are left float
    for node in ix.graph.node:
        for sg in subgraphs(node):
            for g in walk_graphs(sg):
                names = [v.name for v in g.input] + [o for n in g.node for o in n.output if o] + \
                    [t.name for t in g.initializer]
                for name in names:
                    skipped.setdefault(name, f"inside the body of {node.op_type} node "
                                             f"{node.name!r}: subgraphs are left float")
    return skipped


def build_plan(model: onnx.ModelProto, config: QuantConfig, *,
               index: GraphIndex | None = None) -> PrecisionPlan:
    """Decide the formats of every tensor of a prepared model (shapes inferred, names unique).

    See the module docstring for the stages. Tensor overrides win over everything."""
    ix = index if index is not None else GraphIndex.of(model)
    _check_overrides(ix, config)
    _check_names(ix, config)
    req = _requests(ix, config)
    for policy in REQUEST_POLICIES:
        policy(ix, config, req)
    tensors = _resolve(ix, config, req)
    _requantize_fused(tensors, req)
    _drop_layerless_islands(ix, config, tensors, req)
    _carry_grids_through_float_passthrough(ix, config, tensors, req)
    _leave_empty_block_tensors(ix, tensors)
    position = {n: i for i, n in enumerate(ix.values())}  # graph order, fused inputs included
    tensors = dict(sorted(tensors.items(), key=lambda kv: position[kv[0]]))
    tensors.update(req.constants)
    for name in req.float_scalars:
        tensors.setdefault(name, TensorPrecision(
            tensor=name, role="constant", format=None,
            reason="single-element constant kept float: nothing to save, and a block or float "
                   "format would round it"))
    # every name the union-find knows belongs to a group of two or more tensors
    final = {name: replace(tp, group=req.groups.find(name))
             if name in req.groups.parent and tp.role == "activation" else tp
             for name, tp in tensors.items()}
    skipped = _unplanned(ix, req, final)
    for t, f in config.tensor_formats:  # an override that changes nothing is an error, not a no-op
        if t not in final:
            raise ConfigError(f"tensor_formats / MixedPrecisionTensor asks {f} for tensor {t!r}, but no op "
                              f"that this config quantizes reads or writes it ({skipped.get(t, 'left float')}), "
                              "so the override would change nothing. Drop it, or quantize an op that reads "
                              "the tensor (op_types, layer rules).")
    return PrecisionPlan(tensors=final, float_nodes=req.float_nodes, config_name=config.name,
                         skipped=skipped, config=config.to_dict())
