"""Expand onnxruntime's fused contrib ops (domain com.microsoft) into the standard ops they
compute.

Why: a model saved by onnxruntime after its graph optimizations (`optimized_model_filepath` at
the extended level) or by its transformer optimizer holds FusedConv, FusedGemm, FusedMatMul,
BiasGelu, SkipLayerNormalization, EmbedLayerNormalization, Attention...: ops no quantizer's op
table knows, so every layer in them stays float and the "quantized" model is the float one.
Expanded, each layer is a Conv, Gemm or MatMul again, quantized like any other, and onnxruntime
fuses the quantized pattern back at session creation. onnxruntime also writes two ops of its own
into the default domain (RUNTIME_ONNX_OPS); `hold_runtime_onnx_ops` keeps them from the checker
and the opset converter, and this pass releases them.

Each rule is pattern / check / rewrite: it returns the standard nodes that write the fused
node's outputs under their own names, or a reason it declines (an input, attribute or output
the expansion would not reproduce exactly), which the pass reports. The pass works in place.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..graph import NameAllocator, PassResult, model_opset, static_shape

MS_DOMAIN = "com.microsoft"
#: Ops onnxruntime registers in the default ONNX domain where the standard has none (its graph
#: optimizer writes them into the models it saves): op type -> the first opset whose standard
#: op of that name computes the same (None: no standard op of that name).
RUNTIME_ONNX_OPS: dict[str, int | None] = {"LayerNormalization": 17, "SimplifiedLayerNormalization": None}
#: The opset from which every held op is a standard op or expands into standard ones.
STANDARD_SINCE = max(v for v in RUNTIME_ONNX_OPS.values() if v is not None)
#: onnxruntime's layout-specific domain: what `optimized_model_filepath` writes at ORT_ENABLE_ALL.
NCHWC_DOMAIN = "com.microsoft.nchwc"
#: onnxruntime's ops that are layers (they hold a layer's weights): one left float leaves that
#: layer float. Its other ops read constants that are no layer's weights (RotaryEmbedding's
#: cos / sin caches).
ORT_LAYER_OPS = frozenset({(MS_DOMAIN, op) for op in (
    "FusedConv", "FusedGemm", "FusedMatMul", "TransposeMatMul", "Attention", "EmbedLayerNormalization", "NhwcConv",
    "ConvTransposeWithDynamicPads", "DecoderAttention", "LongformerAttention", "WordConvEmbedding")}
    | {(NCHWC_DOMAIN, "Conv")})
#: Where such nodes wait while the ONNX checker and the opset converter run (neither knows them).
HELD_DOMAIN = "com.mixq.held"


class _Emit:
    """Standard nodes for one fused node, named after it; constants become initializers."""

    def __init__(self, node: onnx.NodeProto, names: NameAllocator, opset: int) -> None:
        self.node = node
        self.names = names
        self.opset = opset
        self.base = node.name or (node.output[0] if node.output else node.op_type)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.ranks: dict[str, int] = {}  # ranks of the outputs it writes, which no inference knows yet

    def op(self, op_type: str, ins: list[str], out: str | None = None, **attrs: Any) -> str:
        """Emit `op_type`; its output is `out` (a name the fused node wrote) or a fresh one."""
        name = out if out else self.names.value(self.base, op_type.lower())
        self.nodes.append(helper.make_node(op_type, ins, [name], name=self.names.value(self.base, op_type),
                                           **attrs))
        return name

    def const(self, value: np.ndarray, what: str) -> str:
        name = self.names.value(self.base, what)
        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def axes(self, *axes: int) -> str:
        return self.const(np.array(axes, np.int64), "axes")

    def rms_norm(self, x: str, scale: str, eps: float, out: str) -> None:
        """x / sqrt(mean(x^2 over the last axis) + eps) * scale into `out`: the standard op from
        opset 23, written out before (ReduceMean's axes an input from opset 18, an attribute
        before)."""
        if self.opset >= 23:
            self.op("RMSNormalization", [x, scale], out, axis=-1, epsilon=eps)
            return
        sq = self.op("Mul", [x, x])
        ms = (self.op("ReduceMean", [sq, self.axes(-1)], keepdims=1) if self.opset >= 18
              else self.op("ReduceMean", [sq], axes=[-1], keepdims=1))
        rms = self.op("Sqrt", [self.op("Add", [ms, self.const(np.float32(eps), "epsilon")])])
        self.op("Mul", [self.op("Div", [x, rms]), scale], out)


def _attrs(node: onnx.NodeProto) -> dict[str, Any]:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _input(node: onnx.NodeProto, i: int) -> str:
    """Input `i`, or "" when absent (ONNX's empty name for an optional input)."""
    return node.input[i] if len(node.input) > i else ""


def _output(node: onnx.NodeProto, i: int) -> str:
    return node.output[i] if len(node.output) > i else ""


def _activation(e: _Emit, kind: str, params: list[float], x: str, out: str) -> str | None:
    """`kind` (onnxruntime's fused-activation names) applied to `x`, written to `out`; a reason
    when the kind or its parameters are not ones the standard ops reproduce."""
    n = {"LeakyRelu": 1, "Clip": 2, "HardSigmoid": 2}.get(kind, 0)
    if len(params) < n:
        return f"activation {kind} needs {n} parameters, the node gives {len(params)}"
    if kind in ("Relu", "Tanh", "Sigmoid"):
        e.op(kind, [x], out)
    elif kind == "LeakyRelu":
        e.op("LeakyRelu", [x], out, alpha=float(params[0]))
    elif kind == "HardSigmoid":
        e.op("HardSigmoid", [x], out, alpha=float(params[0]), beta=float(params[1]))
    elif kind == "Clip":
        e.op("Clip", [x, e.const(np.float32(params[0]), "min"), e.const(np.float32(params[1]), "max")], out)
    else:
        return f"fused activation {kind!r} has no standard-op expansion here"
    return None


def _fused_conv(e: _Emit) -> str | None:
    a = _attrs(e.node)
    kind = _text(a.pop("activation", ""))
    params = [float(p) for p in a.pop("activation_params", [])]
    a.pop("alpha", None)  # the mobile schema's LeakyRelu alpha
    ins = list(e.node.input[:3])
    while ins and not ins[-1]:
        ins.pop()
    z = _input(e.node, 3)
    out = e.node.output[0]
    y = e.op("Conv", ins, None if (kind or z) else out, **a)
    if z:
        y = e.op("Add", [y, z], None if kind else out)
    return _activation(e, kind, params, y, out) if kind else None


def _fused_gemm(e: _Emit) -> str | None:
    a = _attrs(e.node)
    kind = _text(a.pop("activation", ""))
    alpha, beta = a.pop("activation_alpha", None), a.pop("activation_beta", None)
    a.pop("activation_gamma", None)
    params = [float(p) for p in (alpha, beta) if p is not None]
    if kind == "LeakyRelu" and not params:
        params = [0.01]  # the LeakyRelu default
    out = e.node.output[0]
    y = e.op("Gemm", list(e.node.input), None if kind else out, **a)
    return _activation(e, kind, params, y, out) if kind else None


def _fused_matmul(e: _Emit, rank_of: Callable[[str], int | None]) -> str | None:
    a = _attrs(e.node)
    if a.get("transBatchA") or a.get("transBatchB"):
        return "transBatchA / transBatchB move the batch axes, which a Transpose would have to follow"
    ins = []
    for x, flag in zip(e.node.input[:2], ("transA", "transB")):
        if a.get(flag):
            r = rank_of(x)
            if r is None or r < 2:
                return f"{flag}=1 on {x!r}, whose rank is not known here"
            x = e.op("Transpose", [x], perm=list(range(r - 2)) + [r - 1, r - 2])
        ins.append(x)
    alpha = float(a.get("alpha", 1.0))
    out = e.node.output[0]
    y = e.op("MatMul", ins, None if alpha != 1.0 else out)
    if alpha != 1.0:
        e.op("Mul", [y, e.const(np.float32(alpha), "alpha")], out)
    return None


def _gelu(e: _Emit, approximate: str, with_bias: bool) -> str | None:
    if e.opset < 20:
        return f"Gelu needs opset 20, the model is at {e.opset}"
    x, bias = _input(e.node, 0), _input(e.node, 1) if with_bias else ""
    if bias:
        x = e.op("Add", [x, bias])
    e.op("Gelu", [x], e.node.output[0], **({"approximate": approximate} if approximate != "none" else {}))
    return None


def _quick_gelu(e: _Emit) -> str | None:
    alpha = float(_attrs(e.node).get("alpha", 1.702))
    x = e.node.input[0]
    e.op("Mul", [x, e.op("Sigmoid", [e.op("Mul", [x, e.const(np.float32(alpha), "alpha")])])], e.node.output[0])
    return None


def _skip_sum(e: _Emit, out_index: int, bias_index: int | None) -> str:
    """input + skip (+ bias): the residual sum, written to the node's sum output when it has one."""
    x, skip = e.node.input[:2]
    bias = _input(e.node, bias_index) if bias_index is not None else ""
    out = _output(e.node, out_index)
    s = e.op("Add", [x, skip], None if bias else (out or None))
    return e.op("Add", [s, bias], out or None) if bias else s


def _skip_layer_norm(e: _Emit) -> str | None:
    if _output(e.node, 1) or _output(e.node, 2):
        return "its mean / inverse-std-dev outputs are read (training outputs)"
    eps = float(_attrs(e.node).get("epsilon", 1e-12))
    s = _skip_sum(e, 3, 4)
    ins = [s, e.node.input[2]] + ([_input(e.node, 3)] if _input(e.node, 3) else [])
    e.op("LayerNormalization", ins, e.node.output[0], axis=-1, epsilon=eps)
    return None


def _skip_simplified_layer_norm(e: _Emit) -> str | None:
    if _output(e.node, 1) or _output(e.node, 2):
        return "its mean / inverse-std-dev outputs are read (training outputs)"
    if _input(e.node, 3):
        return "a bias input, which onnxruntime versions apply differently"
    eps = float(_attrs(e.node).get("epsilon", 1e-12))
    e.rms_norm(_skip_sum(e, 3, None), e.node.input[2], eps, e.node.output[0])
    return None


def _seq_len(e: _Emit, x: str, axis: int = 1) -> str:
    """x.shape[axis] as a 0-D int64."""
    return e.op("Gather", [e.op("Shape", [x]), e.const(np.array(axis, np.int64), "seq_axis")], axis=0)


def _range(e: _Emit, start: str | None, stop: str) -> str:
    """start (0 when None) .. stop - 1, int64 0-D bounds."""
    zero, one = e.const(np.array(0, np.int64), "zero"), e.const(np.array(1, np.int64), "one")
    return e.op("Range", [start or zero, stop, one])


def _positions(e: _Emit, x: str) -> str:
    """0 .. x.shape[1] - 1 (int64)."""
    return _range(e, None, _seq_len(e, x))


def _additive(e: _Emit, keep: str, fill: float) -> str:
    """0 where `keep`, `fill` elsewhere (onnxruntime adds its mask_filter_value, not -inf)."""
    return e.op("Where", [keep, e.const(np.float32(0.0), "keep"), e.const(np.float32(fill), "fill")])


def _key_mask(e: _Emit, mask: str, rank: int, key_len: str, fill: float) -> str:
    """The additive [B, 1, 1, L] mask of a 1-D valid-length or a 2-D 0/1 key mask over the
    `key_len` (0-D int64) keys."""
    if rank == 1:  # valid lengths: key positions at or past the length are masked
        lengths = e.op("Unsqueeze", [e.op("Cast", [mask], to=onnx.TensorProto.INT64), e.axes(1)])
        keep = e.op("Less", [e.op("Unsqueeze", [_range(e, None, key_len), e.axes(0)]), lengths])
    else:
        keep = e.op("Greater", [mask, e.const(np.array(0, np.int32), "zero_i32")])
    return e.op("Unsqueeze", [_additive(e, keep, fill), e.axes(1, 2)])


def _causal_mask(e: _Emit, q_len: str, k_len: str, fill: float) -> str:
    """The additive [S, L] mask hiding from query i the keys after it: the queries are the last
    `q_len` of the `k_len` positions (a past state before them)."""
    queries = _range(e, e.op("Sub", [k_len, q_len]), k_len)
    keep = e.op("LessOrEqual", [e.op("Unsqueeze", [_range(e, None, k_len), e.axes(0)]),
                                e.op("Unsqueeze", [queries, e.axes(1)])])
    return _additive(e, keep, fill)


@dataclass
class _Heads:
    """Multi-head attention over [B, S, H * head_size] projections: the heads, the scale, the
    past keys and values ([B, H, P, head_size]) before the new ones, and where the keys and
    values with the past go (present outputs: separate, or stacked [2, B, H, P + S, hd])."""

    heads: int
    head_size: int
    scale: float
    past_k: str = ""
    past_v: str = ""
    present_k: str = ""
    present_v: str = ""
    present: str = ""
    shape4: str = ""  # the [0, 0, H, hd] Reshape target, made on first use

    def split(self, e: _Emit, *ts: str) -> list[str]:
        """Each [B, S, H * hd] tensor of `ts` as [B, H, S, hd] (one shape constant for all)."""
        if not self.shape4:
            self.shape4 = e.const(np.array([0, 0, self.heads, self.head_size], np.int64), "heads")
        return [e.op("Transpose", [e.op("Reshape", [t, self.shape4])], perm=[0, 2, 1, 3]) for t in ts]

    def keys(self, e: _Emit, k: str, v: str) -> tuple[str, str]:
        """The [B, H, L, hd] keys and values: `k`, `v` split into heads after the past ones."""
        k, v = self.split(e, k, v)
        if self.past_k:
            k = e.op("Concat", [self.past_k, k], self.present_k or None, axis=2)
            v = e.op("Concat", [self.past_v, v], self.present_v or None, axis=2)
        else:  # presents without a past: the new keys and values themselves
            for t, present in ((k, self.present_k), (v, self.present_v)):
                if present:
                    e.op("Identity", [t], present)
        if self.present:
            e.op("Concat", [e.op("Unsqueeze", [t, e.axes(0)]) for t in (k, v)], self.present, axis=0)
        return k, v

    def attend(self, e: _Emit, q: str, k: str, v: str, masks: list[str]) -> None:
        """softmax(Q K^T * scale + masks) V into the node's first output, [B, S, H * hd]."""
        q, = self.split(e, q)
        s = e.op("MatMul", [q, e.op("Transpose", [k], perm=[0, 1, 3, 2])])
        s = e.op("Mul", [s, e.const(np.float32(self.scale), "scale")])
        for m in masks:
            s = e.op("Add", [s, m])
        o = e.op("Transpose", [e.op("MatMul", [e.op("Softmax", [s], axis=-1), v])], perm=[0, 2, 1, 3])
        hidden = e.const(np.array([0, 0, self.heads * self.head_size], np.int64), "hidden")
        e.op("Reshape", [o, hidden], e.node.output[0])


def _mask_rank(mask: str, shape_of: Callable[[str], tuple[int | None, ...] | None]) -> str | int:
    """The rank of a key mask input (0: none), or why it is not one the expansion reproduces."""
    r = len(shape_of(mask) or ()) if mask else 0
    if mask and r not in (1, 2):
        return f"a key mask of rank {r or 'unknown'}; only 1-D lengths and 2-D 0/1 masks are expanded"
    return r


def _attention(e: _Emit, shape_of: Callable[[str], tuple[int | None, ...] | None]) -> str | None:
    """onnxruntime's packed-QKV Attention: x W + b split into Q, K, V, heads, the past keys and
    values before the new ones (a [2, B, H, P, hd] past input; the present output stacks them
    alike), softmax(Q K^T * scale + masks) V; the key mask from 1-D valid lengths or a 2-D 0/1
    mask_index, a causal mask where unidirectional, and the attention_bias input (T5's relative
    position bias) added to the scores."""
    a = _attrs(e.node)
    heads = int(a.get("num_heads", 0))
    unsupported = [k for k in ("do_rotary", "past_present_share_buffer") if a.get(k)]
    if a.get("qkv_hidden_sizes"):
        sizes = [int(s) for s in a["qkv_hidden_sizes"]]
        if len(set(sizes)) != 1:
            unsupported.append("unequal qkv_hidden_sizes")
    # inputs: 4 past ([2, B, H, P, hd]), 5 attention_bias (added to the scores), 6 and on: a shared buffer's
    extra = [i for i in range(6, len(e.node.input)) if e.node.input[i]]
    if unsupported or extra:
        return f"{', '.join(unsupported + [f'input {i}' for i in extra])}: not expanded"
    w_shape = shape_of(e.node.input[1])
    cols = w_shape[1] if w_shape is not None and len(w_shape) == 2 else None
    if heads <= 0 or not cols or cols % (3 * heads):
        return "the packed weight's shape is not known, or num_heads does not divide it"
    hidden = cols // 3
    mask = _input(e.node, 3)
    rank = _mask_rank(mask, shape_of)
    if isinstance(rank, str):
        return rank
    x, w = e.node.input[:2]
    qkv = e.op("MatMul", [x, w])
    if _input(e.node, 2):
        qkv = e.op("Add", [qkv, e.node.input[2]])
    split = [e.names.value(e.base, n) for n in ("q", "k", "v")]
    e.nodes.append(helper.make_node("Split", [qkv, e.const(np.array([hidden] * 3, np.int64), "split")], split,
                                    name=e.names.value(e.base, "Split"), axis=-1))
    past = _input(e.node, 4)
    spec = _Heads(heads, hidden // heads, float(a.get("scale", 0.0) or 1.0 / math.sqrt(hidden // heads)),
                  present=_output(e.node, 1))
    if past:
        spec.past_k, spec.past_v = (e.op("Gather", [past, e.const(np.array(i, np.int64), "kv")], axis=0)
                                    for i in (0, 1))
    q, k, v = split
    k, v = spec.keys(e, k, v)
    fill = float(a.get("mask_filter_value", -10000.0))
    key_len = _seq_len(e, k, 2)
    masks = ([_key_mask(e, mask, rank, key_len, fill)] if mask else []) + \
        ([_causal_mask(e, _seq_len(e, x), key_len, fill)] if a.get("unidirectional") else []) + \
        ([_input(e.node, 5)] if _input(e.node, 5) else [])
    spec.attend(e, q, k, v, masks)
    return None


def _multi_head_attention(e: _Emit, shape_of: Callable[[str], tuple[int | None, ...] | None]) -> str | None:
    """onnxruntime's MultiHeadAttention on projected [B, S, D] query, key and value (the
    optional bias of 3D added to each), past key / value before the new ones (and the present
    outputs); key mask, causal flag and attention bias as in Attention."""
    a = _attrs(e.node)
    heads = int(a.get("num_heads", 0))
    q, k, v, bias, mask, attention_bias, past_k, past_v = (_input(e.node, i) for i in range(8))
    extra = [i for i in range(8, len(e.node.input)) if e.node.input[i]]  # a shared buffer's, a beam's
    ranks = [len(shape_of(t) or ()) for t in (q, k, v)]
    if extra or ranks != [3, 3, 3] or bool(past_k) != bool(past_v):
        return f"only 3-D query, key and value (and past keys with past values) are expanded (ranks {ranks})"
    dims = shape_of(bias) if bias else shape_of(q)
    width = (dims[0] // 3 if bias and dims and dims[0] else None) if bias else (dims[-1] if dims else None)
    if heads <= 0 or not width or width % heads:
        return "the hidden size is not known, or num_heads does not divide it"
    rank = _mask_rank(mask, shape_of)
    if isinstance(rank, str):
        return rank
    if bias:
        parts = [e.names.value(e.base, n) for n in ("bias_q", "bias_k", "bias_v")]
        e.nodes.append(helper.make_node("Split", [bias, e.const(np.array([width] * 3, np.int64), "split")], parts,
                                        name=e.names.value(e.base, "Split"), axis=0))
        q, k, v = (e.op("Add", [t, b]) for t, b in zip((q, k, v), parts))
    spec = _Heads(heads, width // heads, float(a.get("scale", 0.0) or 1.0 / math.sqrt(width // heads)),
                  past_k, past_v, _output(e.node, 1), _output(e.node, 2))
    q_len = _seq_len(e, q)
    k, v = spec.keys(e, k, v)
    fill = float(a.get("mask_filter_value", -10000.0))
    key_len = _seq_len(e, k, 2)
    masks = ([_key_mask(e, mask, rank, key_len, fill)] if mask else []) + \
        ([_causal_mask(e, q_len, key_len, fill)] if a.get("unidirectional") else []) + \
        ([attention_bias] if attention_bias else [])
    spec.attend(e, q, k, v, masks)
    return None


def _embed_layer_norm(e: _Emit) -> str | None:
    """BERT's embeddings: word[ids] + position[0..S-1 or position_ids] (+ segment[segment_ids]),
    LayerNormalization; the mask_index output is each row's count of mask ones."""
    a = _attrs(e.node)
    ids, seg, word, pos, seg_table, gamma, beta, mask, pos_ids = (_input(e.node, i) for i in range(9))
    if bool(seg) != bool(seg_table):
        return "segment ids without a segment table, or the reverse"
    if _output(e.node, 1) and int(a.get("mask_index_type", 1)) != 1:
        return f"mask_index_type={a.get('mask_index_type')}"
    if not pos_ids:
        pos_ids = _positions(e, ids)
    total = _output(e.node, 2)
    s = e.op("Add", [e.op("Gather", [word, ids], axis=0), e.op("Gather", [pos, pos_ids], axis=0)],
             None if seg else (total or None))
    if seg:
        s = e.op("Add", [s, e.op("Gather", [seg_table, seg], axis=0)], total or None)
    eps = float(a.get("epsilon", 1e-12))
    e.op("LayerNormalization", [s, gamma] + ([beta] if beta else []), e.node.output[0], axis=-1, epsilon=eps)
    e.ranks[e.node.output[0]] = 3
    if _output(e.node, 1):  # each row's count of ones; without a mask, zeros
        ones = mask or e.op("Mul", [e.op("Cast", [ids], to=onnx.TensorProto.INT32),
                                    e.const(np.array(0, np.int32), "zero_i32")])
        e.op("ReduceSum", [ones, e.axes(1)], e.node.output[1], keepdims=0)
        e.ranks[e.node.output[1]] = 1
    return None


def _simplified_layer_norm(e: _Emit, rank_of: Callable[[str], int | None]) -> str | None:
    """onnxruntime's SimplifiedLayerNormalization (RMSNorm) over the last axis."""
    a = _attrs(e.node)
    axis, r = int(a.get("axis", -1)), rank_of(e.node.input[0])
    if axis != -1 and (r is None or axis != r - 1):
        return f"axis={axis}: only the last axis is expanded"
    if _output(e.node, 1):
        return "its inverse-std-dev output is read (a training output)"
    e.rms_norm(e.node.input[0], e.node.input[1], float(a.get("epsilon", 1e-5)), e.node.output[0])
    return None


def runtime_onnx_ops(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """The default-domain nodes of the main graph that are onnxruntime's own ops at the
    model's opset (RUNTIME_ONNX_OPS: a LayerNormalization before opset 17, any
    SimplifiedLayerNormalization)."""
    opset = model_opset(model)
    out = []
    for node in model.graph.node:
        since = RUNTIME_ONNX_OPS.get(node.op_type, 0) if node.domain in ("", "ai.onnx") else 0
        if since is None or (since and opset < since):
            out.append(node)
    return out


def ms_domain_undeclared(model: onnx.ModelProto) -> bool:
    """Whether nodes use com.microsoft and the model imports no opset of it: what onnxruntime's
    transformer optimizer leaves in the model it returns in memory (it adds the import only
    when saving)."""
    return not any(o.domain == MS_DOMAIN for o in model.opset_import) and any(
        n.domain == MS_DOMAIN for n in model.graph.node)


def import_ms_domain(model: onnx.ModelProto) -> bool:
    """Declare the com.microsoft opset (its only version, 1) where `ms_domain_undeclared`. In
    place; whether it was missing."""
    if not ms_domain_undeclared(model):
        return False
    model.opset_import.append(helper.make_opsetid(MS_DOMAIN, 1))
    return True


def hold_runtime_onnx_ops(model: onnx.ModelProto) -> int:
    """Move `runtime_onnx_ops` to HELD_DOMAIN, so that the checker and the opset converter
    pass them; `unfuse` releases them. A model onnxruntime saved optimized at opset 13 holds
    such a LayerNormalization, and was refused as failing the checker. In place; returns how
    many were held."""
    nodes = runtime_onnx_ops(model)
    for node in nodes:
        node.domain = HELD_DOMAIN
    if nodes and not any(o.domain == HELD_DOMAIN for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(HELD_DOMAIN, 1))
    return len(nodes)


def needs_admission(model: onnx.ModelProto) -> bool:
    """Whether `admit_runtime_ops` would change `model` (asked before copying one)."""
    return bool(runtime_onnx_ops(model)) or ms_domain_undeclared(model)


def admit_runtime_ops(model: onnx.ModelProto) -> tuple[int, bool]:
    """What a model onnxruntime wrote needs before the ONNX checker and the opset converter read
    it, in place: its default-domain ops held (`hold_runtime_onnx_ops`), a missing com.microsoft
    import declared (`import_ms_domain`). Returns (ops held, whether the import was declared)."""
    return hold_runtime_onnx_ops(model), import_ms_domain(model)


#: The inputs each expanded op requires (the others take one).
_MIN_INPUTS = {"FusedConv": 2, "FusedGemm": 2, "FusedMatMul": 2, "TransposeMatMul": 2, "BiasGelu": 2,
               "SkipLayerNormalization": 3, "SkipSimplifiedLayerNormalization": 3, "Attention": 2,
               "EmbedLayerNormalization": 4, "SimplifiedLayerNormalization": 2}

#: The fused ops this pass expands; any other com.microsoft op is left as it is.
EXPANDED_OPS = ("FusedConv", "FusedGemm", "FusedMatMul", "TransposeMatMul", "BiasGelu", "FastGelu", "Gelu",
                "QuickGelu", "SkipLayerNormalization", "SkipSimplifiedLayerNormalization", "Attention",
                "MultiHeadAttention", "EmbedLayerNormalization")  # and, held, SimplifiedLayerNormalization


def unfuse(model: onnx.ModelProto, result: PassResult | None = None) -> int:
    """Expand every com.microsoft op of EXPANDED_OPS in `model`'s main graph into standard ops
    (in place; the outputs keep their names). Returns how many were expanded; `result` gets a
    declined entry for each fused node left as it was, with why."""
    g = model.graph
    if not any(n.domain == HELD_DOMAIN or (n.domain == MS_DOMAIN and n.op_type in EXPANDED_OPS) for n in g.node):
        return 0
    opset = model_opset(model)
    names = NameAllocator.for_model(model)
    inits = {t.name: t for t in g.initializer}
    typed = {vi.name: vi.type for vi in list(g.input) + list(g.value_info) + list(g.output)}

    ranks: dict[str, int] = {}  # of values an earlier expansion wrote

    def shape_of(name: str) -> tuple[int | None, ...] | None:
        if name in inits:
            return tuple(int(d) for d in inits[name].dims)
        if name in ranks:
            return (None,) * ranks[name]
        return static_shape(typed.get(name))

    def rank_of(name: str) -> int | None:
        s = shape_of(name)
        return None if s is None else len(s)

    rules: dict[str, Callable[[_Emit], str | None]] = {
        "FusedConv": _fused_conv, "FusedGemm": _fused_gemm,
        "FusedMatMul": lambda e: _fused_matmul(e, rank_of), "TransposeMatMul": lambda e: _fused_matmul(e, rank_of),
        "BiasGelu": lambda e: _gelu(e, "none", True), "FastGelu": lambda e: _gelu(e, "tanh", True),
        "Gelu": lambda e: _gelu(e, "none", False), "QuickGelu": _quick_gelu,
        "SkipLayerNormalization": _skip_layer_norm, "SkipSimplifiedLayerNormalization": _skip_simplified_layer_norm,
        "Attention": lambda e: _attention(e, shape_of), "EmbedLayerNormalization": _embed_layer_norm,
        "MultiHeadAttention": lambda e: _multi_head_attention(e, shape_of),
    }
    held_rules: dict[str, Callable[[_Emit], str | None]] = {
        "SimplifiedLayerNormalization": lambda e: _simplified_layer_norm(e, rank_of)}
    out: list[onnx.NodeProto] = []
    expanded = 0
    for node in g.node:
        held = node.domain == HELD_DOMAIN
        rule = rules.get(node.op_type) if node.domain == MS_DOMAIN else held_rules.get(node.op_type) if held else None
        if held:
            node.domain = ""  # back where onnxruntime runs it (a standard op by now, or its own)
        if rule is None:
            out.append(node)
            continue
        e = _Emit(node, names, opset)
        given = sum(1 for i in node.input if i)
        # a malformed node is kept as written, so that onnxruntime's error names the user's node
        why = (f"{given} inputs, fewer than the op takes" if given < _MIN_INPUTS.get(node.op_type, 1)
               else rule(e))
        written = {o for n in e.nodes for o in n.output}
        unwritten = [o for o in node.output if o and o not in written]
        if why is None and unwritten:  # an output the expansion does not compute: never a dangling name
            why = f"its output {unwritten[0]!r} is not one the expansion computes"
        if why is not None:
            if result is not None:
                where = f"{node.domain or 'onnxruntime'}.{node.op_type}"
                result.decline(node.name or node.output[0], f"{where} kept: {why}")
            out.append(node)
            continue
        out.extend(e.nodes)
        g.initializer.extend(e.inits)
        ranks.update(e.ranks)
        expanded += 1
    del g.node[:]
    g.node.extend(out)
    kept = [o for o in model.opset_import if o.domain != HELD_DOMAIN]
    if len(kept) != len(model.opset_import):
        del model.opset_import[:]
        model.opset_import.extend(kept)
    if result is not None:
        result.changed += expanded
        if expanded:
            result.notes.append(f"{expanded} onnxruntime-specific op(s) (its fused com.microsoft ops, its own "
                                "normalizations) expanded into the standard ops they compute")
    return expanded
