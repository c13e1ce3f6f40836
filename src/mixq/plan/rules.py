"""Build a precision plan from a config and the op semantics table."""
from __future__ import annotations

import numpy as np
import onnx

from ..config import QuantConfig
from ..formats import get_format
from .ops import semantics, unsupported_reason
from .plan import PrecisionPlan, TensorPrecision

_FLOAT_TYPES = {onnx.TensorProto.FLOAT}


def float_tensors(model: onnx.ModelProto) -> set[str]:
    """Names of float32 tensors (from shape inference, graph inputs/outputs and initializers)."""
    g = model.graph
    names = {v.name for v in [*g.value_info, *g.input, *g.output]
             if v.type.tensor_type.elem_type in _FLOAT_TYPES}
    names |= {t.name for t in g.initializer if t.data_type in _FLOAT_TYPES}
    return names


def tensor_ranks(model: onnx.ModelProto) -> dict[str, int]:
    g = model.graph
    ranks = {v.name: len(v.type.tensor_type.shape.dim) for v in [*g.value_info, *g.input, *g.output]
             if v.type.tensor_type.HasField("shape")}
    ranks.update({t.name: len(t.dims) for t in g.initializer})
    return ranks


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


_FUSE_PRODUCERS = frozenset({"Conv", "ConvTranspose", "Gemm", "MatMul", "Add"})
_FUSED_ACTIVATIONS = frozenset({"Relu", "Clip"})


def _fuse_activations(g: onnx.GraphProto, produced: dict, consumed: dict, overrides: dict
                      ) -> dict[str, str]:
    """Drop the calibration of a compute op's output that only a Relu/Clip reads; returns
    {compute output: activation output} for the outputs read by a single Relu/Clip (see
    `_requantize_fused`)."""
    producer = {o: n for n in g.node for o in n.output}
    readers: dict[str, list[onnx.NodeProto]] = {}
    for n in g.node:
        for i in n.input:
            readers.setdefault(i, []).append(n)
    outputs = {o.name for o in g.output}
    single: dict[str, str] = {}
    for name in list(produced):
        p = producer.get(name)
        rs = readers.get(name, [])
        if p is None or p.op_type not in _FUSE_PRODUCERS or name in outputs or name in overrides:
            continue
        if rs and all(r.op_type in _FUSED_ACTIVATIONS and r.input[0] == name for r in rs):
            del produced[name]
            consumed.pop(name, None)
            if len(rs) == 1 and rs[0].output and rs[0].output[0]:
                single[name] = rs[0].output[0]
    return single


def _requantize_fused(tensors: dict[str, TensorPrecision], fused: dict[str, str],
                      groups: _Groups) -> None:
    """Quantize a fused compute output with its activation's output parameters (integer formats).

    With Q a monotone, idempotent quantizer and f a Relu or Clip, Q(f(Q(x))) = Q(f(x)): a Q/DQ
    pair on the compute output with the activation output's parameters changes no value. It
    gives backends the pattern they fuse: onnxruntime turns DQ -> Conv -> Q into QLinearConv,
    while DQ -> Conv -> Relu -> Q stays a float Conv wherever the Relu cannot be absorbed
    (any zero point above the type's minimum: symmetric activations). Block and float formats
    are excluded: a Relu changes a block's shared exponent, so the identity does not hold."""
    for pre, post in fused.items():
        tp = tensors.get(post)
        if tp is None or tp.role != "activation" or tp.format is None or tp.consumer_formats \
                or get_format(tp.format).kind != "int":
            continue
        tensors[pre] = TensorPrecision(
            tensor=pre, role="activation", format=tp.format, block_axis=tp.block_axis,
            calibrate=False, reason=f"fused with the activation that reads it: quantized with "
                                    f"{post}'s parameters (exact; lets backends fuse the pair)")
        groups.union(groups.find(post), pre)


def _node_formats(node: onnx.NodeProto, config: QuantConfig) -> tuple[str, str, str]:
    return config.formats_for(node.op_type, node.name)


def _why_float(node: onnx.NodeProto, config: QuantConfig) -> str | None:
    if semantics(node) is None:
        return unsupported_reason(node)
    if config.op_types is not None and node.op_type not in config.op_types:
        return f"op type {node.op_type} is not in op_types"
    if node.op_type in config.exclude_op_types:
        return f"op type {node.op_type} excluded by exclude_op_types"
    if node.name in config.exclude_nodes:
        return "node excluded by exclude_nodes"
    return None


def build_plan(model: onnx.ModelProto, config: QuantConfig) -> PrecisionPlan:
    """Decide the formats of every tensor of a prepared model (shapes inferred, names unique).

    Each quantized node asks for its activation format on its activation inputs (and on its
    output, where it quantizes outputs) and its weight format on its weights. A tensor takes
    the format its producer asks for (or, with no quantized producer, its first consumer's);
    consumers that ask for another format are recorded as consumer formats: precision
    boundaries the rewrite materializes. Tensor overrides win over everything.
    """
    g = model.graph
    floats = float_tensors(model)
    ranks = tensor_ranks(model)
    inits = {t.name for t in g.initializer}
    init_sizes = {t.name: int(np.prod(t.dims)) for t in g.initializer}  # dims only: no data read
    overrides = dict(config.tensor_formats)
    known = floats | {t.name for t in g.initializer}
    for t in overrides:
        if t not in known:
            from ..errors import ConfigError, did_you_mean

            raise ConfigError(f"tensor_formats / MixedPrecisionTensor names tensor {t!r}, which the "
                              f"model does not have (as a float tensor)." + did_you_mean(t, sorted(known)))
    float_nodes: dict[str, str] = {}
    groups = _Groups()
    # per tensor: producer request (format, reason), consumer requests [(node, format, reason)]
    produced: dict[str, tuple[str, str, int | None]] = {}
    consumed: dict[str, list[tuple[str, str, str, int | None]]] = {}
    weights: dict[str, TensorPrecision] = {}
    passthrough_of: dict[str, str] = {}
    float_scalars: set[str] = set()

    for node in g.node:
        why_not = _why_float(node, config)
        if why_not is not None:
            if node.op_type != "Constant":
                float_nodes[node.name] = why_not
            continue
        sem = semantics(node)
        assert sem is not None  # _why_float returned None
        act, wfmt, why = _node_formats(node, config)
        int_pair = get_format(act).kind == "int" and get_format(wfmt).kind == "int"
        act_inputs = [node.input[i] for i in sem.activations if i < len(node.input) and node.input[i]]
        for i in sem.activations:
            if i >= len(node.input):
                continue
            name = node.input[i]
            if not name or name not in floats:
                continue
            if name in inits:
                if sem.weight == i:
                    continue  # a weight, below
                # a constant where the op reads activations is a parameter (weight format),
                # except between integer formats: integer kernels fuse an Add/Mul only when its
                # inputs share a type (onnxruntime's QLinearAdd: a uint8 activation plus an int8
                # constant ran as a float Add between DQ/Q), so it takes the activation format
                cfmt = overrides.get(name, act if int_pair else wfmt)
                if get_format(cfmt).kind != "int" and init_sizes[name] == 1:
                    # a single number: no storage to save, while a block / float format would
                    # round it to its few mantissa bits (MXFP8: 3), a systematic error on every
                    # element it scales (PP-OCRv4 rec: 0% accuracy); deployment compilers fold
                    # such scalars into the neighbouring scales
                    float_scalars.add(name)
                    continue
                weights.setdefault(name, TensorPrecision(
                    tensor=name, role="constant", format=cfmt,
                    reason="tensor override" if name in overrides else
                    f"constant input of {node.op_type}: "
                    f"{'activation' if int_pair else 'weight'} format ({why})", block_axis=-1))
                continue
            block_axis = sem.activation_block_axis
            if block_axis is None:
                block_axis = 1 if ranks.get(name, 0) in (3, 4, 5) else -1
            consumed.setdefault(name, []).append(
                (node.name, act, f"activation of {node.op_type} ({why})", _norm_axis(block_axis, ranks.get(name))))
        if sem.weight is not None and sem.weight < len(node.input):
            w = node.input[sem.weight]
            if w in inits and w in floats:
                rank = ranks.get(w)
                weights.setdefault(w, TensorPrecision(
                    tensor=w, role="weight", format=overrides.get(w, wfmt),
                    reason="tensor override" if w in overrides else f"weight of {node.op_type} ({why})",
                    channel_axis=_norm_axis(sem.weight_channel_axis, rank) if config.per_channel else None,
                    block_axis=_norm_axis(sem.weight_block_axis, rank)))
        if sem.bias is not None and sem.bias < len(node.input) and node.input[sem.bias] in inits:
            b = node.input[sem.bias]
            use_int = int_pair and config.bias in ("auto", "int32")
            weights.setdefault(b, TensorPrecision(
                tensor=b, role="bias", format="int32" if use_int else None,
                reason=("int32 bias, scale = input scale x weight scale" if use_int else
                        "bias kept float by config" if config.bias == "float" else
                        "bias kept float: the activation/weight formats are not both integer")))
        if not (config.quantize_outputs or sem.passthrough):
            continue
        for o in node.output[:1]:
            if not o or o not in floats:
                continue
            if sem.passthrough:
                if act_inputs:
                    passthrough_of[o] = act_inputs[0]
                continue
            rank = ranks.get(o)
            produced[o] = (act, f"output of {node.op_type} ({why})",
                           _norm_axis(1 if rank in (3, 4, 5) else -1, rank))
        if sem.shared_scale and config.share_concat_scales:
            members = [t for t in [*act_inputs, *node.output[:1]] if t in floats and t not in inits]
            for t in members[1:]:
                groups.union(members[0], t)

    fused = _fuse_activations(g, produced, consumed, overrides) if config.fuse_activations else {}
    tensors: dict[str, TensorPrecision] = {}
    names = list(dict.fromkeys([i.name for i in g.input] + [o for n in g.node for o in n.output]))
    for name in names:
        reqs = consumed.get(name, [])
        if name in passthrough_of:
            src = tensors.get(passthrough_of[name])
            # integer formats re-quantize idempotently with the input's parameters; block and cast
            # formats need no node there (the values are already on their grid)
            if src is None or src.format is None or get_format(src.format).kind != "int" \
                    or name in overrides:
                if src is not None and src.format is not None:
                    # values moved by a pass-through op are already on the block/cast grid
                    reqs = [r for r in reqs if r[1] != src.format]
                if not reqs and name not in overrides:
                    continue
                fmt, why, axis, cal = None, "", None, True
            else:
                fmt, why, axis, cal = src.format, "output of a pass-through op: input's parameters", src.block_axis, False
                groups.union(groups.find(passthrough_of[name]), name)
        elif name in produced:
            fmt, why, axis = produced[name]
            cal = True
        elif reqs:
            _, fmt, why, axis = reqs[0]
            cal = True
        else:
            continue
        if name in overrides:
            fmt, why, cal = overrides[name], "tensor override", True
            cformats = {}
        else:
            cformats = {n: f for n, f, _, _ in reqs if f != fmt}
        if fmt is None:
            if not cformats:
                continue
            # no quantized producer: the first consumer format becomes the producer's
            first = next(iter(cformats.values()))
            fmt, why = first, reqs[0][2]
            cformats = {n: f for n, f in cformats.items() if f != fmt}
        if axis is None:
            axis = next((a for _, _, _, a in reqs if a is not None), None)
        needs_stats = any(get_format(f).needs_qparams for f in cformats.values())
        tensors[name] = TensorPrecision(tensor=name, role="activation", format=fmt, reason=why,
                                        block_axis=axis, calibrate=cal or needs_stats,
                                        consumer_formats=cformats)
    _requantize_fused(tensors, fused, groups)
    position = {n: i for i, n in enumerate(names)}  # graph order, fused inputs included
    tensors = dict(sorted(tensors.items(), key=lambda kv: position[kv[0]]))
    tensors.update(weights)
    for name in float_scalars:
        tensors.setdefault(name, TensorPrecision(
            tensor=name, role="constant", format=None,
            reason="single-element constant kept float: nothing to save, and a block or float "
                   "format would round it"))
    # every name the union-find knows belongs to a group of two or more tensors
    final = {name: TensorPrecision(**{**tp.__dict__, "group": groups.find(name)})
             if name in groups.parent and tp.role == "activation" else tp
             for name, tp in tensors.items()}
    return PrecisionPlan(tensors=final, float_nodes=float_nodes, config_name=config.name)
