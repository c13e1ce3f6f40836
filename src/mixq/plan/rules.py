"""Build a precision plan from a config and the op semantics table."""
from __future__ import annotations

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


def build_plan(model: onnx.ModelProto, config: QuantConfig) -> PrecisionPlan:
    """Decide a format for every tensor of a prepared model (shapes inferred, names unique)."""
    g = model.graph
    floats = float_tensors(model)
    ranks = tensor_ranks(model)
    inits = {t.name for t in g.initializer}
    act_fmt, w_fmt = get_format(config.activation), get_format(config.weight)
    int_pair = act_fmt.kind == "int" and w_fmt.kind == "int"
    tensors: dict[str, TensorPrecision] = {}
    float_nodes: dict[str, str] = {}
    groups = _Groups()
    calibrated: set[str] = set()
    preset = f"preset {config.name}" if config.name != "custom" else "config"

    def add(name: str, **kw) -> None:
        if name not in tensors:
            tensors[name] = TensorPrecision(tensor=name, **kw)

    for node in g.node:
        sem = semantics(node)
        why_not = None
        if sem is None:
            why_not = unsupported_reason(node)
        elif config.op_types is not None and node.op_type not in config.op_types:
            why_not = f"op type {node.op_type} is not in op_types"
        elif node.op_type in config.exclude_op_types:
            why_not = f"op type {node.op_type} excluded by exclude_op_types"
        elif node.name in config.exclude_nodes:
            why_not = "node excluded by exclude_nodes"
        if why_not is not None:
            if node.op_type not in ("Constant",):
                float_nodes[node.name] = why_not
            continue
        assert sem is not None
        act_inputs = [node.input[i] for i in sem.activations if i < len(node.input) and node.input[i]]
        for i, name in ((i, node.input[i]) for i in sem.activations if i < len(node.input)):
            if not name or name not in floats:
                continue
            if sem.weight == i and name in inits:
                continue  # handled below as a weight
            if name in inits:
                add(name, role="constant", format=w_fmt.name,
                    reason=f"constant input of {node.op_type}: weight format of {preset}",
                    block_axis=-1)
                continue
            block_axis = sem.activation_block_axis
            if block_axis is None:
                block_axis = 1 if ranks.get(name, 0) in (3, 4, 5) else -1
            add(name, role="activation", format=act_fmt.name,
                reason=f"activation of {node.op_type}: {preset}",
                block_axis=_norm_axis(block_axis, ranks.get(name)))
            calibrated.add(name)
        if sem.weight is not None and sem.weight < len(node.input):
            w = node.input[sem.weight]
            if w in inits and w in floats:
                rank = ranks.get(w)
                add(w, role="weight", format=w_fmt.name, reason=f"weight of {node.op_type}: {preset}",
                    channel_axis=_norm_axis(sem.weight_channel_axis, rank) if config.per_channel else None,
                    block_axis=_norm_axis(sem.weight_block_axis, rank))
        if sem.bias is not None and sem.bias < len(node.input) and node.input[sem.bias] in inits:
            b = node.input[sem.bias]
            use_int = config.bias == "int32" or (config.bias == "auto" and int_pair)
            if use_int and not int_pair:
                use_int = False
            add(b, role="bias", format="int32" if use_int else None,
                reason=("int32 bias, scale = input scale x weight scale" if use_int else
                        "bias kept float: the activation/weight formats are not both integer"
                        if config.bias == "auto" else "bias kept float by config"))
        outs = [o for o in node.output[:1] if o and o in floats] if (config.quantize_outputs or sem.passthrough) else []
        for o in outs:
            if sem.passthrough:
                src = act_inputs[0] if act_inputs else None
                if src is None or src not in tensors or tensors[src].format is None \
                        or tensors[src].role != "activation":
                    continue
                # integer formats re-quantize idempotently with the input's parameters; block and
                # cast formats need no node there (the values are already on their grid)
                if get_format(tensors[src].format).kind != "int":
                    continue
                add(o, role="activation", format=tensors[src].format,
                    reason=f"output of pass-through {node.op_type}: input's parameters",
                    block_axis=tensors[src].block_axis, calibrate=False)
                groups.union(groups.find(src), o)
            else:
                rank = ranks.get(o)
                block_axis = 1 if rank in (3, 4, 5) else -1
                add(o, role="activation", format=act_fmt.name,
                    reason=f"output of {node.op_type}: {preset}", block_axis=_norm_axis(block_axis, rank))
                calibrated.add(o)
        if sem.shared_scale and config.share_concat_scales:
            members = [t for t in [*act_inputs, *outs] if t in tensors and tensors[t].role == "activation"]
            for t in members[1:]:
                groups.union(members[0], t)

    # every name the union-find knows belongs to a group of two or more tensors
    final = {name: TensorPrecision(**{**tp.__dict__, "group": groups.find(name)})
             if name in groups.parent else tp for name, tp in tensors.items()}
    return PrecisionPlan(tensors=final, float_nodes=float_nodes, config_name=config.name)
