"""Every preset on small synthetic graphs of model classes the bench lacks, against float.

    python -m bench.class_sweep [--models unet_time,rope_runtime,...] [--presets A8W8,...]

Each model is built with random weights (nothing is downloaded), quantized with each preset
from 16 calibration feeds of 4 samples, and compared with the float model on 8 fresh feeds in
onnxruntime. The table gives the lowest output SQNR on the fresh feeds, the same on each
element's variation around its mean over the fresh samples (what an output on a large offset
really carries), for rank-2 and rank-4 outputs the share of argmax positions that agree, the
guard's verdict (broken / warns / quiet) and "missed" where either SQNR is under 10 dB while
the guard is quiet. The classes:
a diffusion UNet block (timestep embedding, GroupNormalization-21), a decoder with a KV cache
(past length 0 in some feeds), super-resolution, segmentation, DLRM, a CLIP-like dual encoder,
mixture-of-experts routing, a written-out LayerNorm, a GAN generator, a float64 island, run-time
rotary embeddings, FPN levels that are outputs and consumed, a box decoder with Exp, a GRU cell
with its state as input and output, odd linear layers, pruned and denormal weights, opset-9
idioms, a head on large offsets, tabular features standardized in the graph, and a ViT. The
fourth round adds 22: causal attention masked with -inf built at run time, a detector with
NonMaxSuppression in the graph, ArgMax/TopK outputs, native LSTM and GRU ops, Loop and If,
a float16 model, a conformer conv module, CTC log-probabilities, style transfer
(InstanceNormalization, reflect Pad), hostile outputs (an input echoed, a constant, one value
under two names), PointNet, an activation zoo (Mish, HardSwish, PRelu, Elu, Selu, Celu),
Einsum attention with a bool mask, a running energy before a Log, ALiBi attention, a run-time
temperature, optical-flow warping by GridSample, a Llama block (RMSNorm written with Pow -0.5,
SwiGLU), tied embeddings, the STFT op before a log-mel, RoiAlign, and sigmoid boxes scaled
to 640. The fifth adds 7: an sklearn-onnx pipeline (Scaler, LinearClassifier), a ZipMap
output, a VAE sampling with RandomNormalLike, sequence ops, a Scan RNN, mask logic (And, Or,
Xor, Mod), and a tree ensemble after a projection. The sixth adds 9: SegNet's MaxPool indices
and MaxUnpool, LRN and Lp pooling, a Conv3d video model, ConvTranspose with output_padding and
output_shape, OneHot before a MatMul (JAX), a Hardmax output, cubic antialiased Resize to
sizes, TF-style asymmetric pads and dilations, and an opset-7 IR-3 export. The seventh adds 12:
a physics model in SI units (inputs of 1e-9), NaN imputed in the graph (IsNaN and Where, the
ai.onnx.ml Imputer), an LpNormalization embedding, a GNN layer (ScatterElements add), Reduce
L2 / LogSumExp / Prod / SumSquare outputs, an already-quantized QAT export (an error by
design), hashed ids, opset-11 Softmax over axis 1, depth as 1 / disparity, inputs of +-inf
clipped in the graph, and attention pooling. The eighth adds 11: channels 1000x apart (no
normalization), uint8 images, a bool decision output, batches of varying size and length, an
unread input and an initializer output, an ensemble's Mean / Max / Min, NaN in float's own
output, Softplus / Softsign / ThresholdedRelu / Shrink / Erf, Resize to a run-time shape,
gates computed from activations, a growing residual stream, and a depthwise block with
imbalanced channels. The ninth adds 7: an MLP with hidden units 1000x apart, a VQ codebook
lookup, a cosine written out, a Gaussian NLL head, reversible instance normalization, NeRF's
positional encoding, and raw int16 PCM as float. The tenth adds 7: squeeze-and-excitation,
a WaveNet stack, ResNeXt's grouped Convs, a mask from a lengths input, capsule squash,
BatchNormalization after an Add, and a grouped Conv with imbalanced channels. The eleventh adds 10:
a BERT layer and a CNN as onnxruntime saves them optimized (com.microsoft Attention,
SkipLayerNormalization, BiasGelu, FastGelu, FusedMatMul, FusedConv, FusedGemm), a ConvNeXt block
(layer scale from 1e-6 to 1), T5's relative-position buckets computed in float, soft-argmax
keypoints, a HiFi-GAN vocoder, a Mamba-style selective scan (a Sub of two running sums), an
autoencoder's reconstruction error, opset-23 RMSNormalization / RotaryEmbedding / Attention, and
int8 weights cast to float in the graph. The twelfth adds 4: a second stage on the boxes a
threshold keeps (none in some samples), a float16 model with float32 inputs and outputs
(keep_io_types), BERT's embeddings fused by onnxruntime (EmbedLayerNormalization, its
mask_index into Attention), and a GPT-2 block as its transformer optimizer writes it (Attention
with a past state). The fourteenth adds 2: a PP-LCNetV3 stage as paddle2onnx writes it (a
learned scale and shift after each Conv's BatchNorm, HardSwish and a hard-sigmoid gate written
out), and a YOLOv4-style block with Mish written out. A run that raises is printed
with its error; the sweep goes on.
"""
from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable

import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

from .torch_classes import builders as torch_builders

PRESETS = ["A8W8", "XINT8", "A16W8", "U8S8", "S16S16", "BF16", "FP16", "BFP16", "MX9", "MXINT8", "MXFP4",
           "MXFP8_E4M3"]
Feeds = Callable[[np.random.Generator, int], dict[str, np.ndarray]]


class B:
    """A small graph under construction: weights drawn from a seeded generator, nodes and
    tensor names numbered in order."""

    def __init__(self, seed: int = 0, opset: int = 21) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.k = 0
        self.opset = opset

    def w(self, *shape: int, scale: float | None = None, arr: np.ndarray | None = None) -> str:
        """A weight: `arr`, or N(0, scale) of `shape` (scale 1/sqrt(fan-in) by default)."""
        if arr is None:
            fan = int(np.prod(shape[1:])) if len(shape) > 1 else shape[0]
            sd = scale if scale is not None else 1.0 / np.sqrt(max(fan, 1))
            arr = (self.rng.standard_normal(shape) * sd).astype(np.float32)
        self.k += 1
        self.inits.append(nh.from_array(np.asarray(arr), f"W{self.k}"))
        return f"W{self.k}"

    def c(self, arr) -> str:
        """A constant."""
        return self.w(arr=np.asarray(arr))

    def op(self, op_type: str, ins: list[str], n_out: int = 1, **attrs):
        self.k += 1
        outs = [f"{op_type.lower()}_{self.k}_{i}" for i in range(n_out)]
        self.nodes.append(h.make_node(op_type, ins, outs, name=f"{op_type}_{self.k}", **attrs))
        return outs[0] if n_out == 1 else outs

    def conv(self, x: str, cin: int, cout: int, k: int = 3, stride: int = 1) -> str:
        return self.op("Conv", [x, self.w(cout, cin, k, k), self.w(cout, scale=0.05)], pads=[k // 2] * 4,
                       strides=[stride] * 2)

    def lin(self, x: str, din: int, dout: int) -> str:
        return self.op("Add", [self.op("MatMul", [x, self.w(din, dout)]), self.w(dout, scale=0.05)])

    def silu(self, x: str) -> str:
        return self.op("Mul", [x, self.op("Sigmoid", [x])])

    def bn(self, x: str, c: int) -> str:
        """A trained-looking BatchNormalization over `c` channels."""
        return self.op("BatchNormalization", [x, self.c(self.rng.uniform(0.5, 2, c).astype(np.float32)),
                                              self.c(self.rng.normal(0, 0.3, c).astype(np.float32)),
                                              self.c(self.rng.normal(0, 0.5, c).astype(np.float32)),
                                              self.c(self.rng.uniform(0.3, 2, c).astype(np.float32))])

    def model(self, inputs: list[onnx.ValueInfoProto], outputs: list[onnx.ValueInfoProto]) -> onnx.ModelProto:
        g = h.make_graph(self.nodes, "probe", inputs, outputs, self.inits)
        m = h.make_model(g, opset_imports=[h.make_opsetid("", self.opset)])
        m.ir_version = 10
        return m


vi = h.make_tensor_value_info

def unet_time(seed=0):
    b = B(seed); C = 16
    freqs = np.exp(-np.log(10000) * np.arange(8) / 8).astype(np.float32)
    tt = b.op("Unsqueeze", ["t", b.c(np.array([1], np.int64))])
    arg = b.op("Mul", [tt, b.c(freqs[None, :])])
    emb = b.op("Concat", [b.op("Sin", [arg]), b.op("Cos", [arg])], axis=1)
    e = b.lin(b.silu(b.lin(emb, 16, 32)), 32, C)
    e4 = b.op("Unsqueeze", [e, b.c(np.array([2, 3], np.int64))])
    x = b.conv("x", 4, C)
    gn = b.op("GroupNormalization", [x, b.c(np.ones(C, np.float32)), b.c(np.zeros(C, np.float32))], num_groups=4)
    x2 = b.op("Add", [b.silu(gn), e4])
    x3 = b.conv(b.silu(x2), C, C)
    y = b.conv(b.op("Add", [x3, x]), C, 4)
    return b.model([vi("x", T.FLOAT, ["N", 4, 16, 16]), vi("t", T.FLOAT, ["N"])],
                   [vi(y, T.FLOAT, None)]), lambda r, n: {"x": r.standard_normal((n, 4, 16, 16)).astype(np.float32),
                                                       "t": r.uniform(0, 1000, n).astype(np.float32)}

def kv_decoder(seed=0):
    b = B(seed); D, V, H, hd = 32, 50, 2, 16
    emb = b.op("Gather", [b.w(V, D, scale=0.5), "ids"])
    def heads(x):  # [N,S,D] -> [N,H,S,hd]
        r = b.op("Reshape", [x, b.c(np.array([0, 0, H, hd], np.int64))])
        return b.op("Transpose", [r], perm=[0, 2, 1, 3])
    q = heads(b.lin(emb, D, D)); k = heads(b.lin(emb, D, D)); v = heads(b.lin(emb, D, D))
    kk = b.op("Concat", ["past_k", k], axis=2); vv = b.op("Concat", ["past_v", v], axis=2)
    s = b.op("Mul", [b.op("MatMul", [q, b.op("Transpose", [kk], perm=[0, 1, 3, 2])]), b.c(np.float32(0.25))])
    a = b.op("MatMul", [b.op("Softmax", [s], axis=-1), vv])
    a = b.op("Reshape", [b.op("Transpose", [a], perm=[0, 2, 1, 3]), b.c(np.array([0, 0, D], np.int64))])
    hdn = b.op("Add", [emb, b.lin(a, D, D)])
    ln = b.op("LayerNormalization", [hdn, b.c(np.ones(D, np.float32)), b.c(np.zeros(D, np.float32))], axis=-1)
    logits = b.op("MatMul", [ln, b.w(D, V)])
    b.nodes.append(h.make_node("Identity", [kk], ["present_k"])); b.nodes.append(h.make_node("Identity", [vv], ["present_v"]))
    m = b.model([vi("ids", T.INT64, ["N", "S"]), vi("past_k", T.FLOAT, ["N", H, "P", hd]), vi("past_v", T.FLOAT, ["N", H, "P", hd])],
                [vi(logits, T.FLOAT, ["N", "S", V]), vi("present_k", T.FLOAT, None), vi("present_v", T.FLOAT, None)])
    def f(r, n):
        P = int(r.integers(0, 6)); S = 1 if P else int(r.integers(2, 6))
        return {"ids": r.integers(0, V, (n, S)).astype(np.int64),
                "past_k": r.standard_normal((n, H, P, hd)).astype(np.float32),
                "past_v": r.standard_normal((n, H, P, hd)).astype(np.float32)}
    return m, f

def superres(seed=0):
    b = B(seed)
    x = b.op("Relu", [b.conv("x", 1, 16, k=5)]); x = b.op("Relu", [b.conv(x, 16, 16)])
    x = b.conv(x, 16, 4)
    y = b.op("Clip", [b.op("DepthToSpace", [x], blocksize=2), b.c(np.float32(0)), b.c(np.float32(1))])
    return b.model([vi("x", T.FLOAT, ["N", 1, 16, 16])], [vi(y, T.FLOAT, None)]), \
        lambda r, n: {"x": r.uniform(0, 1, (n, 1, 16, 16)).astype(np.float32)}

def segment(seed=0):
    b = B(seed)
    x = b.op("Relu", [b.conv("x", 3, 16, stride=2)]); x = b.op("Relu", [b.conv(x, 16, 32, stride=2)])
    x = b.conv(x, 32, 6, k=1)
    y = b.op("Resize", [x, "", b.c(np.array([1, 1, 4, 4], np.float32))], mode="linear")
    return b.model([vi("x", T.FLOAT, ["N", 3, 32, 32])], [vi(y, T.FLOAT, ["N", 6, 32, 32])]), \
        lambda r, n: {"x": r.standard_normal((n, 3, 32, 32)).astype(np.float32)}

def dlrm(seed=0):
    b = B(seed); E = 16
    d = b.op("Relu", [b.lin("dense", 13, 32)]); d = b.op("Relu", [b.lin(d, 32, E)])
    embs = [d]
    for i in range(3):
        idx = b.op("Gather", ["sparse", b.c(np.array(i, np.int64))], axis=1)
        embs.append(b.op("Gather", [b.w(1000, E, scale=0.1), idx]))
    st = b.op("Concat", [b.op("Unsqueeze", [e, b.c(np.array([1], np.int64))]) for e in embs], axis=1)  # N,4,E
    inter = b.op("MatMul", [st, b.op("Transpose", [st], perm=[0, 2, 1])])  # N,4,4
    fl = b.op("Flatten", [inter], axis=1)
    z = b.op("Concat", [d, fl], axis=1)
    z = b.op("Relu", [b.lin(z, E + 16, 32)]); z = b.lin(z, 32, 1)
    y = b.op("Sigmoid", [z])
    return b.model([vi("dense", T.FLOAT, ["N", 13]), vi("sparse", T.INT64, ["N", 3])], [vi(y, T.FLOAT, ["N", 1])]), \
        lambda r, n: {"dense": np.log1p(r.exponential(3, (n, 13))).astype(np.float32),
                      "sparse": r.integers(0, 1000, (n, 3)).astype(np.int64)}

def clip_dual(seed=0):
    b = B(seed); E = 16
    x = b.op("Relu", [b.conv("image", 3, 16, stride=2)]); x = b.op("GlobalAveragePool", [x])
    x = b.op("Gemm", [b.op("Flatten", [x]), b.w(E, 16), b.w(E, scale=0.05)], transB=1)
    xi = b.op("Div", [x, b.op("ReduceL2", [x, b.c(np.array([1], np.int64))], keepdims=1)])
    t = b.op("ReduceMean", [b.op("Gather", [b.w(100, E, scale=0.5), "text"]), b.c(np.array([1], np.int64))], keepdims=0)
    t = b.lin(t, E, E)
    ti = b.op("Div", [t, b.op("ReduceL2", [t, b.c(np.array([1], np.int64))], keepdims=1)])
    lg = b.op("Mul", [b.op("MatMul", [xi, b.op("Transpose", [ti], perm=[1, 0])]), b.op("Exp", [b.c(np.float32(np.log(100)))])])
    return b.model([vi("image", T.FLOAT, ["N", 3, 16, 16]), vi("text", T.INT64, ["M", 8])],
                   [vi(lg, T.FLOAT, ["N", "M"]), vi(xi, T.FLOAT, ["N", E])]), \
        lambda r, n: {"image": r.standard_normal((n, 3, 16, 16)).astype(np.float32),
                      "text": r.integers(0, 100, (4, 8)).astype(np.int64)}

def moe(seed=0):
    b = B(seed); D, X = 16, 4
    router = b.op("Softmax", [b.op("MatMul", ["x", b.w(D, X)])], axis=-1)  # N,S,X
    vals, idx = b.op("TopK", [router, b.c(np.array([2], np.int64))], n_out=2, axis=-1)
    mask = b.op("ScatterElements", [b.op("Mul", [router, b.c(np.float32(0))]), idx, vals], axis=-1)
    outs = []
    for e in range(X):
        ye = b.lin(b.op("Relu", [b.lin("x", D, 32)]), 32, D)
        g = b.op("Gather", [mask, b.c(np.array([e], np.int64))], axis=-1)
        outs.append(b.op("Mul", [ye, g]))
    y = outs[0]
    for o in outs[1:]: y = b.op("Add", [y, o])
    return b.model([vi("x", T.FLOAT, ["N", "S", D])], [vi(y, T.FLOAT, None)]), \
        lambda r, n: {"x": r.standard_normal((n, 5, D)).astype(np.float32)}

def decomposed_ln(seed=0):
    b = B(seed, opset=13); D = 32
    x = b.lin("x", 8, D)
    mu = b.op("ReduceMean", [x], axes=[-1]); xc = b.op("Sub", [x, mu])
    var = b.op("ReduceMean", [b.op("Pow", [xc, b.c(np.float32(2))])], axes=[-1])
    y = b.op("Div", [xc, b.op("Sqrt", [b.op("Add", [var, b.c(np.float32(1e-12))])])])
    y = b.op("Add", [b.op("Mul", [y, b.c(np.ones(D, np.float32))]), b.c(np.zeros(D, np.float32))])
    y = b.lin(b.op("Relu", [y]), D, 10)
    return b.model([vi("x", T.FLOAT, ["N", 8])], [vi(y, T.FLOAT, ["N", 10])]), \
        lambda r, n: {"x": r.standard_normal((n, 8)).astype(np.float32)}

def gan(seed=0):
    b = B(seed); 
    z = b.op("Reshape", [b.lin("z", 32, 64 * 4 * 4), b.c(np.array([-1, 64, 4, 4], np.int64))])
    z = b.op("Relu", [b.op("BatchNormalization", [z, b.c(np.ones(64, np.float32)), b.c(np.zeros(64, np.float32)),
                                                b.c(np.zeros(64, np.float32)), b.c(np.ones(64, np.float32))])])
    z = b.op("Relu", [b.op("ConvTranspose", [z, b.w(64, 32, 4, 4, scale=0.05), b.w(32, scale=0.05)], strides=[2, 2], pads=[1, 1, 1, 1])])
    y = b.op("Tanh", [b.op("ConvTranspose", [z, b.w(32, 3, 4, 4, scale=0.05)], strides=[2, 2], pads=[1, 1, 1, 1])])
    return b.model([vi("z", T.FLOAT, ["N", 32])], [vi(y, T.FLOAT, None)]), \
        lambda r, n: {"z": r.standard_normal((n, 32)).astype(np.float32)}

def float64_island(seed=0):
    b = B(seed)
    x = b.lin("x", 16, 32)
    d = b.op("Cast", [x], to=T.DOUBLE)
    d = b.op("Exp", [b.op("Mul", [d, b.c(np.float64(0.1))])])
    x2 = b.op("Cast", [d], to=T.FLOAT)
    y = b.lin(b.op("Relu", [x2]), 32, 10)
    return b.model([vi("x", T.FLOAT, ["N", 16])], [vi(y, T.FLOAT, ["N", 10])]), \
        lambda r, n: {"x": r.standard_normal((n, 16)).astype(np.float32)}


def rope_runtime(seed=0):
    b = B(seed); D, H = 32, 16
    pos = b.op("Cast", ["position_ids"], to=T.FLOAT)               # N,S
    pos3 = b.op("Unsqueeze", [pos, b.c(np.array([2], np.int64))])  # N,S,1
    inv = (1.0 / (10000 ** (np.arange(0, H, 2) / H))).astype(np.float32)[None, :]  # 1,H/2
    fr = b.op("MatMul", [pos3, b.c(inv)])
    em = b.op("Concat", [fr, fr], axis=-1)
    cos, sin = b.op("Cos", [em]), b.op("Sin", [em])
    q = b.lin("x", D, H)
    q1 = b.op("Slice", [q, b.c(np.array([0], np.int64)), b.c(np.array([H // 2], np.int64)), b.c(np.array([-1], np.int64))])
    q2 = b.op("Slice", [q, b.c(np.array([H // 2], np.int64)), b.c(np.array([H], np.int64)), b.c(np.array([-1], np.int64))])
    rot = b.op("Concat", [b.op("Neg", [q2]), q1], axis=-1)
    qr = b.op("Add", [b.op("Mul", [q, cos]), b.op("Mul", [rot, sin])])
    y = b.lin(qr, H, 8)
    m = b.model([vi("x", T.FLOAT, ["N", "S", D]), vi("position_ids", T.INT64, ["N", "S"])], [vi(y, T.FLOAT, ["N", "S", 8])])
    def f(r, n):
        S = 6; start = int(r.integers(0, 2000))
        return {"x": r.standard_normal((n, S, D)).astype(np.float32),
                "position_ids": np.tile(np.arange(start, start + S), (n, 1)).astype(np.int64)}
    return m, f

def fpn_outputs(seed=0):
    """Intermediate feature maps that are graph outputs AND consumed further (FPN levels)."""
    b = B(seed)
    c1 = b.op("Relu", [b.conv("x", 3, 8, stride=2)])
    c2 = b.op("Relu", [b.conv(c1, 8, 16, stride=2)])
    c3 = b.op("Relu", [b.conv(c2, 16, 16, stride=2)])
    head = b.op("Flatten", [b.op("GlobalAveragePool", [c3])])
    logits = b.op("Gemm", [head, b.w(10, 16), b.w(10, scale=0.05)], transB=1)
    return b.model([vi("x", T.FLOAT, ["N", 3, 32, 32])], [vi(logits, T.FLOAT, ["N", 10]), vi(c1, T.FLOAT, None), vi(c2, T.FLOAT, None)]), \
        lambda r, n: {"x": r.standard_normal((n, 3, 32, 32)).astype(np.float32)}

def exp_decode(seed=0):
    """Box decode: centre + exp(size) * anchors, concatenated with sigmoid scores."""
    b = B(seed)
    f = b.op("Relu", [b.lin("x", 16, 32)])
    reg = b.lin(f, 32, 4)  # dx, dy, dw, dh
    xy = b.op("Slice", [reg, b.c(np.array([0], np.int64)), b.c(np.array([2], np.int64)), b.c(np.array([1], np.int64))])
    wh = b.op("Slice", [reg, b.c(np.array([2], np.int64)), b.c(np.array([4], np.int64)), b.c(np.array([1], np.int64))])
    wh = b.op("Mul", [b.op("Exp", [wh]), b.c(np.array([[32.0, 64.0]], np.float32))])
    xy = b.op("Add", [b.op("Mul", [xy, b.c(np.float32(16.0))]), "anchor"])
    boxes = b.op("Concat", [xy, wh], axis=1)
    scores = b.op("Sigmoid", [b.lin(f, 32, 3)])
    return b.model([vi("x", T.FLOAT, ["N", 16]), vi("anchor", T.FLOAT, ["N", 2])], [vi(boxes, T.FLOAT, ["N", 4]), vi(scores, T.FLOAT, ["N", 3])]), \
        lambda r, n: {"x": (r.standard_normal((n, 16)) * 2).astype(np.float32), "anchor": r.uniform(0, 640, (n, 2)).astype(np.float32)}

def gru_state(seed=0):
    """A GRU cell in plain ops with its state as graph input and output (streaming models)."""
    b = B(seed); Hd = 16
    xh = b.op("Concat", ["x", "h"], axis=1)
    z = b.op("Sigmoid", [b.lin(xh, 8 + Hd, Hd)]); rr = b.op("Sigmoid", [b.lin(xh, 8 + Hd, Hd)])
    xrh = b.op("Concat", ["x", b.op("Mul", [rr, "h"])], axis=1)
    n = b.op("Tanh", [b.lin(xrh, 8 + Hd, Hd)])
    one_m_z = b.op("Sub", [b.c(np.float32(1)), z])
    h2 = b.op("Add", [b.op("Mul", [one_m_z, n]), b.op("Mul", [z, "h"])])
    b.nodes.append(h.make_node("Identity", [h2], ["h_out"]))
    y = b.lin(h2, Hd, 4)
    return b.model([vi("x", T.FLOAT, ["N", 8]), vi("h", T.FLOAT, ["N", Hd])], [vi(y, T.FLOAT, ["N", 4]), vi("h_out", T.FLOAT, ["N", Hd])]), \
        lambda r, n: {"x": r.standard_normal((n, 8)).astype(np.float32), "h": np.tanh(r.standard_normal((n, Hd))).astype(np.float32)}


def odd_linear(seed=0):
    """Gemm with alpha/beta/transA, MatMul with the weight first, batched 3-D weight, Conv1d,
    Gemm whose C is a run-time tensor, LayerScale Mul by a [C] weight."""
    b = B(seed); D = 16
    xt = b.op("Transpose", ["x"], perm=[1, 0])                       # D,N
    g1 = b.op("Gemm", [xt, b.w(D, 32), b.w(32, scale=0.5)], transA=1, alpha=0.5, beta=2.0)   # N,32
    wfirst = b.op("MatMul", [b.w(24, 32), b.op("Transpose", [g1], perm=[1, 0])])  # 24,N
    wf = b.op("Transpose", [wfirst], perm=[1, 0])                     # N,24
    r3 = b.op("Reshape", [wf, b.c(np.array([-1, 3, 8], np.int64))])   # N,3,8
    bw = b.op("MatMul", [b.op("Transpose", [r3], perm=[1, 0, 2]), b.w(3, 8, 8)])  # 3,N,8 batched weights
    bw = b.op("Transpose", [bw], perm=[1, 0, 2])                       # N,3,8
    c1 = b.op("Conv", [bw, b.w(6, 3, 3), b.w(6, scale=0.1)], pads=[1, 1], dilations=[1])  # N,6,8
    ls = b.op("Mul", [c1, b.w(6, 1, scale=0.1)])                      # LayerScale
    fl = b.op("Flatten", [ls])
    gc = b.op("Gemm", [fl, b.w(48, 10), b.op("Relu", [b.lin("x", D, 10)])], beta=0.5)  # C at run time
    return b.model([vi("x", T.FLOAT, ["N", D])], [vi(gc, T.FLOAT, ["N", 10])]), \
        lambda r, n: {"x": r.standard_normal((n, D)).astype(np.float32)}

def pruned(seed=0):
    """Structured-pruned conv (4 of 8 filters all zero), a fully zero Gemm weight branch,
    denormal-scale weights, depthwise conv with channel multiplier 2."""
    b = B(seed)
    w = b.rng.standard_normal((8, 3, 3, 3)).astype(np.float32) * 0.3; w[::2] = 0
    c = b.op("Relu", [b.op("Conv", ["x", b.w(arr=w), b.w(8, scale=0.0)], pads=[1, 1, 1, 1])])
    dw = b.op("Conv", [c, b.w(16, 1, 3, 3, scale=0.3)], pads=[1, 1, 1, 1], group=8)
    tiny = (b.rng.standard_normal((16, 1, 1, 1)) * 1e-39).astype(np.float32)
    dw2 = b.op("Add", [dw, b.op("Conv", [dw, b.w(arr=tiny)], group=16)])
    f = b.op("Flatten", [b.op("GlobalAveragePool", [dw2])])
    z = b.op("Gemm", [f, b.w(arr=np.zeros((16, 10), np.float32))])
    y = b.op("Add", [b.op("Gemm", [f, b.w(16, 10)]), z])
    return b.model([vi("x", T.FLOAT, ["N", 3, 16, 16])], [vi(y, T.FLOAT, ["N", 10])]), \
        lambda r, n: {"x": r.standard_normal((n, 3, 16, 16)).astype(np.float32)}

def legacy_ops(seed=0):
    """Opset-9 export idioms: Dropout, Upsample, Sum of three, Clip with attributes, Flatten,
    Gemm, Max (variadic), Mean."""
    b = B(seed, opset=9)
    c = b.op("Conv", ["x", b.w(8, 3, 3, 3), b.w(8, scale=0.1)], pads=[1, 1, 1, 1], strides=[2, 2])
    c = b.op("Clip", [c], min=0.0, max=6.0)
    d = b.op("Dropout", [c], ratio=0.1)
    u = b.op("Upsample", [d, b.c(np.array([1, 1, 2, 2], np.float32))], mode="nearest")
    c2 = b.op("Conv", [u, b.w(8, 8, 3, 3), b.w(8, scale=0.1)], pads=[1, 1, 1, 1])
    s = b.op("Sum", [c2, u, c2])
    mx = b.op("Max", [s, u])
    mn = b.op("Mean", [mx, s])
    f = b.op("Flatten", [b.op("GlobalAveragePool", [mn])], axis=1)
    y = b.op("Gemm", [f, b.w(10, 8), b.w(10, scale=0.1)], transB=1)
    m = b.model([vi("x", T.FLOAT, ["N", 3, 16, 16])], [vi(y, T.FLOAT, ["N", 10])])
    m.ir_version = 4
    return m, lambda r, n: {"x": r.standard_normal((n, 3, 16, 16)).astype(np.float32)}

def offset_output(seed=0):
    """A head on large offsets (kelvins: 300, 250, 280) with a small learned variation, then a
    layer taking differences between the channels."""
    b = B(seed)
    h1 = b.op("Relu", [b.lin("x", 8, 32)])
    z = b.lin(h1, 32, 3)
    pre = b.op("Add", [b.op("Mul", [z, b.c(np.float32(0.5))]), b.c(np.array([300.0, 250.0, 280.0], np.float32))])
    y = b.op("MatMul", [pre, b.c(np.array([[1, -1, 0], [0, 1, -1], [1, 0, -1]], np.float32))])
    return b.model([vi("x", T.FLOAT, ["N", 8])], [vi(y, T.FLOAT, ["N", 3])]), \
        lambda r, n: {"x": r.standard_normal((n, 8)).astype(np.float32)}


def tabular_raw(seed=0):
    """Unnormalized tabular features (a year, a price, a latitude) standardized in the graph
    ((x - mean) / std with constants), then an MLP."""
    b = B(seed)
    mean = np.array([2020.0, 350.0, 45.0, 0.0], np.float32); std = np.array([3.0, 40.0, 0.5, 1.0], np.float32)
    z = b.op("Div", [b.op("Sub", ["x", b.c(mean)]), b.c(std)])
    y = b.lin(b.op("Relu", [b.lin(z, 4, 32)]), 32, 2)
    return b.model([vi("x", T.FLOAT, ["N", 4])], [vi(y, T.FLOAT, ["N", 2])]), \
        lambda r, n: {"x": (np.array([2020.0, 350.0, 45.0, 0.0]) + r.standard_normal((n, 4)) * np.array([3.0, 40.0, 0.5, 1.0])).astype(np.float32)}

def vit(seed=0):
    b = B(seed); D = 32
    p = b.op("Conv", ["x", b.w(D, 3, 4, 4), b.w(D, scale=0.05)], strides=[4, 4])      # N,D,4,4
    t = b.op("Transpose", [b.op("Reshape", [p, b.c(np.array([0, D, -1], np.int64))])], perm=[0, 2, 1])  # N,16,D
    cls = b.op("Expand", [b.w(1, 1, D, scale=0.5), b.op("Concat", [b.op("Slice", [b.op("Shape", ["x"]), b.c(np.array([0], np.int64)), b.c(np.array([1], np.int64))]), b.c(np.array([1, D], np.int64))], axis=0)])
    h = b.op("Add", [b.op("Concat", [cls, t], axis=1), b.w(1, 17, D, scale=0.5)])
    ln = b.op("LayerNormalization", [h, b.c(np.ones(D, np.float32)), b.c(np.zeros(D, np.float32))], axis=-1)
    q, k, v = b.lin(ln, D, D), b.lin(ln, D, D), b.lin(ln, D, D)
    a = b.op("Softmax", [b.op("Mul", [b.op("MatMul", [q, b.op("Transpose", [k], perm=[0, 2, 1])]), b.c(np.float32(D ** -0.5))])], axis=-1)
    h = b.op("Add", [h, b.lin(b.op("MatMul", [a, v]), D, D)])
    ln2 = b.op("LayerNormalization", [h, b.c(np.ones(D, np.float32)), b.c(np.zeros(D, np.float32))], axis=-1)
    h = b.op("Add", [h, b.lin(b.op("Gelu", [b.lin(ln2, D, 64)]), 64, D)])
    c0 = b.op("Squeeze", [b.op("Slice", [h, b.c(np.array([0], np.int64)), b.c(np.array([1], np.int64)), b.c(np.array([1], np.int64))]), b.c(np.array([1], np.int64))])
    y = b.lin(c0, D, 10)
    return b.model([vi("x", T.FLOAT, ["N", 3, 16, 16])], [vi(y, T.FLOAT, ["N", 10])]), \
        lambda r, n: {"x": r.standard_normal((n, 3, 16, 16)).astype(np.float32)}


# ---------------------------------------------------------------- fourth probe round
def causal_inf(seed=0):
    """Causal attention whose mask is built at run time: Trilu of ones, Where(-inf)."""
    b = B(seed); D = 16
    q, k, v = b.lin("x", D, D), b.lin("x", D, D), b.lin("x", D, D)
    s = b.op("Mul", [b.op("MatMul", [q, b.op("Transpose", [k], perm=[0, 2, 1])]), b.c(np.float32(0.25))])
    S = b.op("Slice", [b.op("Shape", ["x"]), b.c(np.array([1], np.int64)), b.c(np.array([2], np.int64))])
    sq = b.op("Concat", [S, S], axis=0)
    ones = b.op("ConstantOfShape", [sq], value=nh.from_array(np.array([1], np.float32)))
    tri = b.op("Trilu", [ones], upper=0)
    keep = b.op("Cast", [tri], to=T.BOOL)
    sm = b.op("Where", [keep, s, b.c(np.float32(-np.inf))])
    a = b.op("MatMul", [b.op("Softmax", [sm], axis=-1), v])
    y = b.lin(a, D, 8)
    return b.model([vi("x", T.FLOAT, ["N", "S", D])], [vi(y, T.FLOAT, ["N", "S", 8])]), \
        lambda r, n: {"x": r.standard_normal((n, 6, D)).astype(np.float32)}

def nms_head(seed=0):
    """A detector with NonMaxSuppression in the graph: selected indices (int64, variable count)
    and the gathered boxes and scores as outputs."""
    b = B(seed); A = 32
    f = b.op("Relu", [b.lin("x", 8, 32)])                     # N,A,32
    box = b.op("Add", [b.op("Mul", [b.op("Sigmoid", [b.lin(f, 32, 4)]), b.c(np.float32(100))]), b.c(np.array([0, 0, 20, 20], np.float32))])
    sc = b.op("Sigmoid", [b.lin(f, 32, 2)])                    # N,A,2
    sct = b.op("Transpose", [sc], perm=[0, 2, 1])              # N,2,A
    sel = b.op("NonMaxSuppression", [box, sct, b.c(np.array([5], np.int64)), b.c(np.array([0.5], np.float32)), b.c(np.array([0.3], np.float32))])
    bi = b.op("Gather", [sel, b.c(np.array([2], np.int64))], axis=1)     # K,1
    kb = b.op("Gather", [b.op("Squeeze", [box, b.c(np.array([0], np.int64))]), b.op("Squeeze", [bi, b.c(np.array([1], np.int64))])], axis=0)
    return b.model([vi("x", T.FLOAT, [1, A, 8])], [vi(sel, T.INT64, ["K", 3]), vi(kb, T.FLOAT, ["K", 4]), vi(sc, T.FLOAT, [1, A, 2])]), \
        lambda r, n: {"x": r.standard_normal((1, A, 8)).astype(np.float32)}

def int_outputs(seed=0):
    """A classifier returning ArgMax and TopK (values and indices) beside its logits."""
    b = B(seed)
    lg = b.lin(b.op("Relu", [b.lin("x", 16, 32)]), 32, 10)
    am = b.op("ArgMax", [lg], axis=1, keepdims=0)
    tv, ti = b.op("TopK", [b.op("Softmax", [lg], axis=1), b.c(np.array([3], np.int64))], n_out=2, axis=1)
    return b.model([vi("x", T.FLOAT, ["N", 16])], [vi(am, T.INT64, ["N"]), vi(tv, T.FLOAT, ["N", 3]), vi(ti, T.INT64, ["N", 3])]), \
        lambda r, n: {"x": r.standard_normal((n, 16)).astype(np.float32)}

def native_rnn(seed=0):
    """ONNX LSTM and GRU ops (not written out), sequence first, then a linear head."""
    b = B(seed); I, H = 8, 16
    y, yh, yc = b.op("LSTM", ["x", b.w(1, 4 * H, I), b.w(1, 4 * H, H), b.w(1, 8 * H, scale=0.1)], n_out=3, hidden_size=H)
    ys = b.op("Squeeze", [y, b.c(np.array([1], np.int64))])   # S,N,H
    g, gh = b.op("GRU", [ys, b.w(1, 3 * H, H), b.w(1, 3 * H, H), b.w(1, 6 * H, scale=0.1)], n_out=2, hidden_size=H)
    last = b.op("Squeeze", [gh, b.c(np.array([0], np.int64))])
    out = b.lin(last, H, 4)
    return b.model([vi("x", T.FLOAT, ["S", "N", I])], [vi(out, T.FLOAT, ["N", 4])]), \
        lambda r, n: {"x": r.standard_normal((12, n, I)).astype(np.float32)}

def control_flow(seed=0):
    """A Loop that applies a small residual MLP step 4 times, then an If choosing a head on a
    run-time flag."""
    b = B(seed); D = 16
    w1 = nh.from_array((b.rng.standard_normal((D, D)) * 0.2).astype(np.float32), "lw")
    body = h.make_graph(
        [h.make_node("MatMul", ["s_in", "lw"], ["mm"]), h.make_node("Tanh", ["mm"], ["th"]),
         h.make_node("Add", ["s_in", "th"], ["s_out"]), h.make_node("Identity", ["cond_in"], ["cond_out"])],
        "body", [vi("i", T.INT64, []), vi("cond_in", T.BOOL, []), vi("s_in", T.FLOAT, None)],
        [vi("cond_out", T.BOOL, []), vi("s_out", T.FLOAT, None)], [w1])
    x0 = b.lin("x", D, D)
    lo = b.op("Loop", [b.c(np.array(4, np.int64)), b.c(np.array(True)), x0], body=body)
    wa = nh.from_array((b.rng.standard_normal((D, 4)) * 0.3).astype(np.float32), "wa")
    wb = nh.from_array((b.rng.standard_normal((D, 4)) * 0.3).astype(np.float32), "wb")
    then_g = h.make_graph([h.make_node("MatMul", [lo, "wa"], ["ya"])], "then", [], [vi("ya", T.FLOAT, None)], [wa])
    else_g = h.make_graph([h.make_node("MatMul", [lo, "wb"], ["yb"])], "else", [], [vi("yb", T.FLOAT, None)], [wb])
    y = b.op("If", ["flag"], then_branch=then_g, else_branch=else_g)
    return b.model([vi("x", T.FLOAT, ["N", D]), vi("flag", T.BOOL, [])], [vi(y, T.FLOAT, ["N", 4])]), \
        lambda r, n: {"x": r.standard_normal((n, D)).astype(np.float32), "flag": np.array(bool(r.integers(0, 2)))}

def fp16_model(seed=0):
    """A CNN whose weights, inputs and outputs are float16."""
    b = B(seed)
    c = b.op("Relu", [b.op("Conv", ["x", b.w(arr=(b.rng.standard_normal((16, 3, 3, 3)) * 0.2).astype(np.float16)),
                                    b.w(arr=np.zeros(16, np.float16))], pads=[1, 1, 1, 1])])
    c = b.op("Relu", [b.op("Conv", [c, b.w(arr=(b.rng.standard_normal((16, 16, 3, 3)) * 0.08).astype(np.float16))], pads=[1, 1, 1, 1], strides=[2, 2])])
    f = b.op("Flatten", [b.op("GlobalAveragePool", [c])])
    y = b.op("Gemm", [f, b.w(arr=(b.rng.standard_normal((16, 10)) * 0.25).astype(np.float16))])
    return b.model([vi("x", T.FLOAT16, ["N", 3, 16, 16])], [vi(y, T.FLOAT16, ["N", 10])]), \
        lambda r, n: {"x": r.standard_normal((n, 3, 16, 16)).astype(np.float16)}

def conformer(seed=0):
    """A conformer conv module: pointwise Conv1d, GLU (Split + Sigmoid + Mul), depthwise Conv1d,
    BatchNorm, Swish, pointwise Conv1d, residual."""
    b = B(seed); C = 16
    xt = b.op("Transpose", ["x"], perm=[0, 2, 1])            # N,C,S
    pw = b.op("Conv", [xt, b.w(2 * C, C, 1), b.w(2 * C, scale=0.05)])
    a, g = b.op("Split", [pw, b.c(np.array([C, C], np.int64))], n_out=2, axis=1)
    glu = b.op("Mul", [a, b.op("Sigmoid", [g])])
    dw = b.op("Conv", [glu, b.w(C, 1, 7, scale=0.3)], pads=[3, 3], group=C)
    bn = b.op("BatchNormalization", [dw, b.c(np.ones(C, np.float32) * 2), b.c(np.zeros(C, np.float32) + 0.1),
                                      b.c(np.zeros(C, np.float32)), b.c(np.ones(C, np.float32) * 0.5)])
    sw = b.silu(bn)
    pw2 = b.op("Conv", [sw, b.w(C, C, 1), b.w(C, scale=0.05)])
    y = b.op("Add", [b.op("Transpose", [pw2], perm=[0, 2, 1]), "x"])
    return b.model([vi("x", T.FLOAT, ["N", "S", C])], [vi(y, T.FLOAT, ["N", "S", C])]), \
        lambda r, n: {"x": r.standard_normal((n, 20, C)).astype(np.float32)}

def ctc_logprobs(seed=0):
    """An OCR/ASR head with LogSoftmax as the output (CTC log-probabilities down to -30)."""
    b = B(seed)
    hd = b.op("Relu", [b.lin("x", 16, 32)])
    lg = b.op("Mul", [b.lin(hd, 32, 40), b.c(np.float32(4.0))])
    y = b.op("LogSoftmax", [lg], axis=-1)
    return b.model([vi("x", T.FLOAT, ["N", "S", 16])], [vi(y, T.FLOAT, ["N", "S", 40])]), \
        lambda r, n: {"x": r.standard_normal((n, 10, 16)).astype(np.float32)}

def style_transfer(seed=0):
    """InstanceNormalization, Resize nearest upsampling, reflect Pad, Tanh scaled to 0..255."""
    b = B(seed)
    c = b.op("Relu", [b.op("InstanceNormalization", [b.conv("x", 3, 16, stride=2), b.c(np.ones(16, np.float32)), b.c(np.zeros(16, np.float32))])])
    c = b.op("Relu", [b.op("InstanceNormalization", [b.conv(c, 16, 16), b.c(np.ones(16, np.float32)), b.c(np.zeros(16, np.float32))])])
    u = b.op("Resize", [c, "", b.c(np.array([1, 1, 2, 2], np.float32))], mode="nearest")
    p = b.op("Pad", [u, b.c(np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64))], mode="reflect")
    o = b.op("Conv", [p, b.w(3, 16, 3, 3), b.w(3, scale=0.05)])
    y = b.op("Add", [b.op("Mul", [b.op("Tanh", [o]), b.c(np.float32(127.5))]), b.c(np.float32(127.5))])
    return b.model([vi("x", T.FLOAT, ["N", 3, 16, 16])], [vi(y, T.FLOAT, ["N", 3, 16, 16])]), \
        lambda r, n: {"x": r.uniform(0, 1, (n, 3, 16, 16)).astype(np.float32)}

def passthrough(seed=0):
    """Hostile outputs: a graph input returned as is, a constant output, one tensor listed
    twice... (two names of one value via Identity), and a logits output."""
    b = B(seed)
    lg = b.lin(b.op("Relu", [b.lin("x", 8, 16)]), 16, 4)
    b.nodes.append(h.make_node("Identity", [lg], ["logits_copy"]))
    b.nodes.append(h.make_node("Identity", ["x"], ["x_echo"]))
    cst = b.c(np.arange(4, dtype=np.float32))
    b.nodes.append(h.make_node("Identity", [cst], ["const_out"]))
    return b.model([vi("x", T.FLOAT, ["N", 8])], [vi(lg, T.FLOAT, ["N", 4]), vi("logits_copy", T.FLOAT, ["N", 4]),
                                                  vi("x_echo", T.FLOAT, ["N", 8]), vi("const_out", T.FLOAT, [4])]), \
        lambda r, n: {"x": r.standard_normal((n, 8)).astype(np.float32)}

def pointnet(seed=0):
    """PointNet: shared Conv1d MLP over points then ReduceMax over the points, xyz in metres
    around a large offset (a lidar frame), GatherElements of the argmax point."""
    b = B(seed)
    c = b.op("Relu", [b.op("Conv", ["pts", b.w(32, 3, 1), b.w(32, scale=0.05)])])
    c = b.op("Relu", [b.op("Conv", [c, b.w(64, 32, 1), b.w(64, scale=0.05)])])
    g = b.op("ReduceMax", [c, b.c(np.array([2], np.int64))], keepdims=0)
    y = b.lin(b.op("Relu", [b.lin(g, 64, 32)]), 32, 5)
    return b.model([vi("pts", T.FLOAT, ["N", 3, 128])], [vi(y, T.FLOAT, ["N", 5])]), \
        lambda r, n: {"pts": (r.standard_normal((n, 3, 128)) * np.array([[10.0], [10.0], [1.0]])).astype(np.float32)}

def activations_zoo(seed=0):
    """Mish written out (x * tanh(softplus(x))), HardSwish, PRelu, LeakyRelu, Elu, Selu, Celu."""
    b = B(seed)
    x = b.lin("x", 16, 32)
    m = b.op("Mul", [x, b.op("Tanh", [b.op("Softplus", [x])])])
    hs = b.op("HardSwish", [b.lin(m, 32, 32)])
    pr = b.op("PRelu", [b.lin(hs, 32, 32), b.w(32, scale=0.2)])
    lr = b.op("LeakyRelu", [b.lin(pr, 32, 32)], alpha=0.1)
    el = b.op("Elu", [b.lin(lr, 32, 32)])
    se = b.op("Selu", [b.lin(el, 32, 32)])
    y = b.lin(b.op("Celu", [se]), 32, 6)
    return b.model([vi("x", T.FLOAT, ["N", 16])], [vi(y, T.FLOAT, ["N", 6])]), \
        lambda r, n: {"x": r.standard_normal((n, 16)).astype(np.float32)}

def einsum_attn(seed=0):
    """Attention written with Einsum (bhqd,bhkd->bhqk and back) and a bool padding mask input."""
    b = B(seed); D, H, hd = 16, 2, 8
    def heads(x):
        return b.op("Transpose", [b.op("Reshape", [x, b.c(np.array([0, 0, H, hd], np.int64))])], perm=[0, 2, 1, 3])
    q, k, v = heads(b.lin("x", D, D)), heads(b.lin("x", D, D)), heads(b.lin("x", D, D))
    s = b.op("Einsum", [q, k], equation="bhqd,bhkd->bhqk")
    m4 = b.op("Unsqueeze", ["mask", b.c(np.array([1, 2], np.int64))])
    s = b.op("Where", [m4, b.op("Mul", [s, b.c(np.float32(hd ** -0.5))]), b.c(np.float32(-1e9))])
    a = b.op("Einsum", [b.op("Softmax", [s], axis=-1), v], equation="bhqk,bhkd->bhqd")
    a = b.op("Reshape", [b.op("Transpose", [a], perm=[0, 2, 1, 3]), b.c(np.array([0, 0, D], np.int64))])
    y = b.lin(a, D, 4)
    def f(r, n):
        L = int(r.integers(3, 9)); mk = np.zeros((n, 8), bool); mk[:, :L] = True
        return {"x": r.standard_normal((n, 8, D)).astype(np.float32), "mask": mk}
    return b.model([vi("x", T.FLOAT, ["N", 8, D]), vi("mask", T.BOOL, ["N", 8])], [vi(y, T.FLOAT, ["N", 8, 4])]), f

def running_sum(seed=0):
    """A running energy: CumSum over 200 time steps of a squared feature, then a log."""
    b = B(seed)
    l = b.lin("x", 4, 8); e = b.op("Mul", [l, l])
    cs_ = b.op("CumSum", [e, b.c(np.array(1, np.int64))])
    ln = b.op("Log", [b.op("Add", [cs_, b.c(np.float32(1e-3))])])
    y = b.lin(ln, 8, 3)
    return b.model([vi("x", T.FLOAT, ["N", 200, 4])], [vi(y, T.FLOAT, ["N", 200, 3])]), \
        lambda r, n: {"x": r.standard_normal((n, 200, 4)).astype(np.float32)}

def alibi_attn(seed=0):
    """Attention with an ALiBi bias: -slope * |i - j| added to the scores (S=64, slopes 1/2 and
    1/8), then Softmax: the bias sets the range, the top scores carry the result."""
    b = B(seed); D, H, hd, S = 16, 2, 8, 64
    def heads(x):
        return b.op("Transpose", [b.op("Reshape", [x, b.c(np.array([0, 0, H, hd], np.int64))])], perm=[0, 2, 1, 3])
    q, k, v = heads(b.lin("x", D, D)), heads(b.lin("x", D, D)), heads(b.lin("x", D, D))
    s = b.op("Mul", [b.op("MatMul", [q, b.op("Transpose", [k], perm=[0, 1, 3, 2])]), b.c(np.float32(hd ** -0.5))])
    d = np.abs(np.arange(S)[:, None] - np.arange(S)[None, :]).astype(np.float32)
    bias = -np.array([0.5, 0.125], np.float32)[:, None, None] * d[None]
    a = b.op("Softmax", [b.op("Add", [s, b.c(bias[None])])], axis=-1)
    o = b.op("Reshape", [b.op("Transpose", [b.op("MatMul", [a, v])], perm=[0, 2, 1, 3]), b.c(np.array([0, 0, D], np.int64))])
    y = b.lin(o, D, 4)
    return b.model([vi("x", T.FLOAT, ["N", S, D])], [vi(y, T.FLOAT, ["N", S, 4])]), \
        lambda r, n: {"x": r.standard_normal((n, S, D)).astype(np.float32)}

def temperature(seed=0):
    """Logits divided by a run-time temperature (a scalar input, 0.05 .. 2), then Softmax."""
    b = B(seed)
    lg = b.lin(b.op("Relu", [b.lin("x", 16, 32)]), 32, 10)
    y = b.op("Softmax", [b.op("Div", [lg, "temp"])], axis=-1)
    return b.model([vi("x", T.FLOAT, ["N", 16]), vi("temp", T.FLOAT, [])], [vi(y, T.FLOAT, ["N", 10])]), \
        lambda r, n: {"x": r.standard_normal((n, 16)).astype(np.float32), "temp": np.array(r.uniform(0.05, 2.0), np.float32)}

def flow_warp(seed=0):
    """Optical-flow warping: a predicted flow (pixels) added to a base grid, normalized to
    [-1, 1] and read by GridSample on a 64x64 image."""
    b = B(seed); W = 64
    f = b.op("Relu", [b.conv("img", 3, 8)])
    flow = b.op("Mul", [b.conv(f, 8, 2), b.c(np.float32(4.0))])          # N,2,H,W in pixels
    ys, xs = np.meshgrid(np.arange(W), np.arange(W), indexing="ij")
    base = np.stack([xs, ys])[None].astype(np.float32)                       # 1,2,H,W
    pos = b.op("Add", [flow, b.c(base)])
    norm = b.op("Sub", [b.op("Mul", [pos, b.c(np.float32(2.0 / (W - 1)))]), b.c(np.float32(1.0))])
    grid = b.op("Transpose", [norm], perm=[0, 2, 3, 1])                      # N,H,W,2
    y = b.op("GridSample", ["img", grid], align_corners=1)
    return b.model([vi("img", T.FLOAT, ["N", 3, W, W])], [vi(y, T.FLOAT, ["N", 3, W, W])]), \
        lambda r, n: {"img": np.cumsum(np.cumsum(r.standard_normal((n, 3, W, W)), 2), 3).astype(np.float32) / 20}

def llama_block(seed=0):
    """A Llama-style block: RMSNorm written out (x * (mean(x^2) + eps) ** -0.5 * g), SwiGLU,
    residual, final RMSNorm and logits."""
    b = B(seed, opset=17); D = 32
    def rms(x):
        ms = b.op("ReduceMean", [b.op("Mul", [x, x]), b.c(np.array([-1], np.int64))], keepdims=1) if b.opset >= 18 else \
            b.op("ReduceMean", [b.op("Mul", [x, x])], axes=[-1], keepdims=1)
        inv = b.op("Pow", [b.op("Add", [ms, b.c(np.float32(1e-6))]), b.c(np.float32(-0.5))])
        return b.op("Mul", [b.op("Mul", [x, inv]), b.w(D, scale=0.3, arr=(1 + 0.3 * b.rng.standard_normal(D)).astype(np.float32))])
    hdn = b.op("Gather", [b.w(100, D, scale=1.0), "ids"])
    n1 = rms(hdn)
    gate = b.op("MatMul", [n1, b.w(D, 64)]); up = b.op("MatMul", [n1, b.w(D, 64)])
    ff = b.op("MatMul", [b.op("Mul", [b.silu(gate), up]), b.w(64, D)])
    hdn = b.op("Add", [hdn, ff])
    y = b.op("MatMul", [rms(hdn), b.w(D, 100)])
    return b.model([vi("ids", T.INT64, ["N", "S"])], [vi(y, T.FLOAT, ["N", "S", 100])]), \
        lambda r, n: {"ids": r.integers(0, 100, (n, 8)).astype(np.int64)}

def tied_embedding(seed=0):
    """One initializer read by Gather (the token embedding) and by MatMul through a Transpose
    (the tied output projection)."""
    b = B(seed); D, V = 16, 60
    E = b.w(V, D, scale=0.5)
    e = b.op("Gather", [E, "ids"])
    hdn = b.op("Tanh", [b.lin(e, D, D)])
    y = b.op("MatMul", [hdn, b.op("Transpose", [E], perm=[1, 0])])
    return b.model([vi("ids", T.INT64, ["N", "S"])], [vi(y, T.FLOAT, ["N", "S", V])]), \
        lambda r, n: {"ids": r.integers(0, V, (n, 6)).astype(np.int64)}

def stft_logmel(seed=0):
    """The STFT op (opset 17) on a waveform, magnitude squared, a mel filterbank, log, a layer."""
    b = B(seed, opset=17); L, nfft, hop = 1024, 64, 32
    x3 = b.op("Unsqueeze", ["wav", b.c(np.array([-1], np.int64))])            # N,L,1
    win = b.c(np.hanning(nfft).astype(np.float32))
    st = b.op("STFT", [x3, b.c(np.array(hop, np.int64)), win, b.c(np.array(nfft, np.int64))], onesided=1)  # N,F,33,2
    pw = b.op("ReduceSum", [b.op("Mul", [st, st]), b.c(np.array([-1], np.int64))], keepdims=0)  # N,F,33
    fb = np.abs(b.rng.standard_normal((33, 16))).astype(np.float32) * 0.2
    mel = b.op("MatMul", [pw, b.c(fb)])
    lm = b.op("Log", [b.op("Add", [mel, b.c(np.float32(1e-6))])])
    y = b.lin(lm, 16, 4)
    return b.model([vi("wav", T.FLOAT, ["N", L])], [vi(y, T.FLOAT, ["N", "F", 4])]), \
        lambda r, n: {"wav": (r.standard_normal((n, L)) * 10.0 ** r.uniform(-3, 0, (n, 1))).astype(np.float32)}

def roi_align(seed=0):
    """Two-stage detector head: RoiAlign of boxes (pixels on a 64x64 image, stride 4 features)
    then a box-refinement MLP."""
    b = B(seed)
    fm = b.op("Relu", [b.conv(b.op("Relu", [b.conv("img", 3, 8, stride=2)]), 8, 8, stride=2)])   # N,8,16,16
    ra = b.op("RoiAlign", [fm, "rois", "bidx"], output_height=4, output_width=4, spatial_scale=0.25, sampling_ratio=2)
    f = b.op("Flatten", [ra])
    y = b.lin(b.op("Relu", [b.lin(f, 128, 32)]), 32, 4)
    def g(r, n):
        x0 = r.uniform(0, 40, (6, 2)); wh = r.uniform(8, 24, (6, 2))
        return {"img": r.standard_normal((n, 3, 64, 64)).astype(np.float32),
                "rois": np.concatenate([x0, x0 + wh], 1).astype(np.float32), "bidx": r.integers(0, n, 6).astype(np.int64)}
    return b.model([vi("img", T.FLOAT, ["N", 3, 64, 64]), vi("rois", T.FLOAT, ["R", 4]), vi("bidx", T.INT64, ["R"])],
                   [vi(y, T.FLOAT, ["R", 4])]), g

def sigmoid_boxes(seed=0):
    """Boxes predicted as sigmoid * image size (640) plus class scores in one output, YOLO-like
    xywh with anchor-free centres."""
    b = B(seed)
    f = b.op("Relu", [b.lin("x", 16, 32)])
    boxes = b.op("Mul", [b.op("Sigmoid", [b.lin(f, 32, 4)]), b.c(np.float32(640.0))])
    cls = b.op("Sigmoid", [b.lin(f, 32, 5)])
    y = b.op("Concat", [boxes, cls], axis=-1)
    return b.model([vi("x", T.FLOAT, ["N", "A", 16])], [vi(y, T.FLOAT, ["N", "A", 9])]), \
        lambda r, n: {"x": (r.standard_normal((n, 20, 16)) * 2).astype(np.float32)}


# ---------------------------------------------------------------- fifth probe round
def _ml(b, inputs, outputs, ml=3):
    """`b`'s graph as a model importing the ai.onnx.ml domain (version `ml`) too."""
    g = h.make_graph(b.nodes, "probe", inputs, outputs, b.inits)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", b.opset), h.make_opsetid("ai.onnx.ml", ml)])
    m.ir_version = 10
    return m

def sklearn_pipe(seed=0):
    """An sklearn-onnx pipeline: Scaler, an MLP in MatMul/Add, LinearClassifier (ai.onnx.ml),
    label (int64) and probabilities outputs."""
    b = B(seed)
    b.k += 1; sc = f"scaled_{b.k}"
    b.nodes.append(h.make_node("Scaler", ["x"], [sc], domain="ai.onnx.ml", offset=[1.0, -2.0, 0.5, 3.0], scale=[0.5, 2.0, 1.0, 0.25]))
    hdn = b.op("Relu", [b.lin(sc, 4, 16)])
    coefs = (b.rng.standard_normal((3, 16)) * 0.5).astype(np.float32)
    b.nodes.append(h.make_node("LinearClassifier", [hdn], ["label", "probabilities"], domain="ai.onnx.ml",
                               classlabels_ints=[0, 1, 2], coefficients=coefs.ravel().tolist(), intercepts=[0.1, -0.1, 0.0],
                               multi_class=1, post_transform="SOFTMAX"))
    return _ml(b, [vi("x", T.FLOAT, ["N", 4])], [vi("label", T.INT64, ["N"]), vi("probabilities", T.FLOAT, ["N", 3])]), \
        lambda r, n: {"x": (r.standard_normal((n, 4)) * 2).astype(np.float32)}

def zipmap_out(seed=0):
    """sklearn-onnx's default classifier output: probabilities through ZipMap (a sequence of
    maps) beside the label."""
    b = B(seed)
    lg = b.lin(b.op("Relu", [b.lin("x", 4, 16)]), 16, 3)
    p = b.op("Softmax", [lg], axis=1)
    lab = b.op("ArgMax", [p], axis=1, keepdims=0)
    b.nodes.append(h.make_node("ZipMap", [p], ["output_probability"], domain="ai.onnx.ml", classlabels_int64s=[0, 1, 2]))
    seqmap = h.make_sequence_type_proto(h.make_map_type_proto(T.INT64, h.make_tensor_type_proto(T.FLOAT, [])))
    return _ml(b, [vi("x", T.FLOAT, ["N", 4])], [vi(lab, T.INT64, ["N"]), h.make_value_info("output_probability", seqmap)], ml=1), \
        lambda r, n: {"x": r.standard_normal((n, 4)).astype(np.float32)}

def vae_sampling(seed=0):
    """A VAE decoder fed by the reparameterization z = mu + exp(logvar / 2) * eps, eps drawn by
    RandomNormalLike in the graph: the model is not deterministic."""
    b = B(seed)
    hdn = b.op("Relu", [b.lin("x", 16, 32)])
    mu, lv = b.lin(hdn, 32, 8), b.lin(hdn, 32, 8)
    eps = b.op("RandomNormalLike", [mu])
    z = b.op("Add", [mu, b.op("Mul", [b.op("Exp", [b.op("Mul", [lv, b.c(np.float32(0.5))])]), eps])])
    y = b.op("Sigmoid", [b.lin(b.op("Relu", [b.lin(z, 8, 32)]), 32, 16)])
    return b.model([vi("x", T.FLOAT, ["N", 16])], [vi(y, T.FLOAT, ["N", 16])]), \
        lambda r, n: {"x": r.standard_normal((n, 16)).astype(np.float32)}

def sequences(seed=0):
    """SplitToSequence of a feature map into chunks, each through SequenceAt, and
    ConcatFromSequence back (torch.split / unbind exports)."""
    b = B(seed)
    x = b.op("Relu", [b.lin("x", 8, 12)])
    sq = b.op("SplitToSequence", [x, b.c(np.array([4, 4, 4], np.int64))], axis=-1)
    parts = [b.op("Mul", [b.op("SequenceAt", [sq, b.c(np.array(i, np.int64))]), b.c(np.float32(i + 1))]) for i in range(3)]
    sq2 = b.op("SequenceConstruct", parts)
    cat = b.op("ConcatFromSequence", [sq2], axis=-1)
    y = b.lin(cat, 12, 4)
    return b.model([vi("x", T.FLOAT, ["N", 8])], [vi(y, T.FLOAT, ["N", 4])]), \
        lambda r, n: {"x": r.standard_normal((n, 8)).astype(np.float32)}

def scan_rnn(seed=0):
    """An RNN as a Scan over time (older exports): state h = tanh(x_t W + h U)."""
    b = B(seed); I, H = 4, 8
    W = nh.from_array((b.rng.standard_normal((I, H)) * 0.4).astype(np.float32), "sW")
    U = nh.from_array((b.rng.standard_normal((H, H)) * 0.3).astype(np.float32), "sU")
    body = h.make_graph([h.make_node("MatMul", ["xt", "sW"], ["a"]), h.make_node("MatMul", ["h_in", "sU"], ["c"]),
                         h.make_node("Add", ["a", "c"], ["s"]), h.make_node("Tanh", ["s"], ["h_out"]),
                         h.make_node("Identity", ["h_out"], ["y_t"])], "body",
                        [vi("h_in", T.FLOAT, ["N", H]), vi("xt", T.FLOAT, ["N", I])],
                        [vi("h_out", T.FLOAT, ["N", H]), vi("y_t", T.FLOAT, ["N", H])], [W, U])
    b.nodes.append(h.make_node("Scan", ["h0", "x"], ["hT", "ys"], num_scan_inputs=1, body=body, name="scan"))
    y = b.lin("hT", H, 3)
    return b.model([vi("h0", T.FLOAT, ["N", H]), vi("x", T.FLOAT, ["S", "N", I])], [vi(y, T.FLOAT, ["N", 3])]), \
        lambda r, n: {"h0": np.zeros((n, H), np.float32), "x": r.standard_normal((10, n, I)).astype(np.float32)}

def mask_logic(seed=0):
    """Bool logic on masks (And, Or, Not, Xor of comparisons) selecting between two branches
    with Where, and an int Mod / BitShift on position ids feeding a Gather."""
    b = B(seed); D = 8
    a = b.lin("x", D, D); c = b.lin("x", D, D)
    m1 = b.op("Greater", [a, b.c(np.float32(0.0))]); m2 = b.op("Less", [c, b.c(np.float32(0.5))])
    mk = b.op("Or", [b.op("And", [m1, m2]), b.op("Not", [b.op("Xor", [m1, m2])])])
    sel = b.op("Where", [mk, a, c])
    pid = b.op("Mod", ["pos", b.c(np.array(16, np.int64))])
    pe = b.op("Gather", [b.w(16, D, scale=0.5), pid])
    y = b.lin(b.op("Add", [sel, pe]), D, 4)
    return b.model([vi("x", T.FLOAT, ["N", D]), vi("pos", T.INT64, ["N"])], [vi(y, T.FLOAT, ["N", 4])]), \
        lambda r, n: {"x": r.standard_normal((n, D)).astype(np.float32), "pos": r.integers(0, 100, n).astype(np.int64)}

def tree_model(seed=0):
    """A tree ensemble regressor (ai.onnx.ml) after a learned projection."""
    b = B(seed)
    p = b.lin("x", 4, 2)
    b.nodes.append(h.make_node("TreeEnsembleRegressor", [p], ["pred"], domain="ai.onnx.ml", n_targets=1,
                               nodes_treeids=[0, 0, 0], nodes_nodeids=[0, 1, 2], nodes_featureids=[0, 0, 0],
                               nodes_values=[0.0, 0.0, 0.0], nodes_modes=["BRANCH_LEQ", "LEAF", "LEAF"],
                               nodes_truenodeids=[1, 0, 0], nodes_falsenodeids=[2, 0, 0],
                               nodes_missing_value_tracks_true=[0, 0, 0],
                               target_treeids=[0, 0], target_nodeids=[1, 2], target_ids=[0, 0], target_weights=[-1.0, 2.0]))
    y = b.op("Add", ["pred", b.lin(p, 2, 1)])
    return _ml(b, [vi("x", T.FLOAT, ["N", 4])], [vi(y, T.FLOAT, ["N", 1])]), \
        lambda r, n: {"x": r.standard_normal((n, 4)).astype(np.float32)}


# ---------------------------------------------------------------- sixth probe round
def segnet_unpool(seed=0):
    """SegNet: MaxPool with its indices output, MaxUnpool by them."""
    b = B(seed)
    c = b.op("Relu", [b.conv("x", 3, 8)])
    p, idx = b.op("MaxPool", [c], n_out=2, kernel_shape=[2, 2], strides=[2, 2])
    c2 = b.op("Relu", [b.conv(p, 8, 8)])
    u = b.op("MaxUnpool", [c2, idx, b.op("Shape", [c])], kernel_shape=[2, 2], strides=[2, 2])
    y = b.conv(u, 8, 4, k=1)
    return b.model([vi("x", T.FLOAT, ["N", 3, 16, 16])], [vi(y, T.FLOAT, ["N", 4, 16, 16])]), \
        lambda r, n: {"x": r.standard_normal((n, 3, 16, 16)).astype(np.float32)}

def alexnet_lrn(seed=0):
    """LRN after Conv (AlexNet / GoogLeNet v1), LpPool, GlobalLpPool."""
    b = B(seed)
    c = b.op("LRN", [b.op("Relu", [b.conv("x", 3, 16, k=5, stride=2)])], size=5, alpha=1e-4, beta=0.75, bias=1.0)
    p = b.op("LpPool", [c], kernel_shape=[2, 2], strides=[2, 2], p=2)
    g = b.op("Flatten", [b.op("GlobalLpPool", [b.op("Relu", [b.conv(p, 16, 16)])], p=2)])
    y = b.op("Gemm", [g, b.w(10, 16), b.w(10, scale=0.05)], transB=1)
    return b.model([vi("x", T.FLOAT, ["N", 3, 32, 32])], [vi(y, T.FLOAT, ["N", 10])]), \
        lambda r, n: {"x": r.standard_normal((n, 3, 32, 32)).astype(np.float32)}

def video3d(seed=0):
    """A video model: Conv3d, MaxPool3d, BatchNorm3d, AveragePool over time, a linear head."""
    b = B(seed)
    c = b.op("Conv", ["x", b.w(8, 3, 3, 3, 3), b.w(8, scale=0.05)], pads=[1] * 6)
    c = b.op("Relu", [b.op("BatchNormalization", [c, b.c(np.ones(8, np.float32)), b.c(np.zeros(8, np.float32)),
                                                 b.c(np.zeros(8, np.float32) + 0.1), b.c(np.ones(8, np.float32) * 2)])])
    c = b.op("MaxPool", [c], kernel_shape=[1, 2, 2], strides=[1, 2, 2])
    c = b.op("Relu", [b.op("Conv", [c, b.w(16, 8, 3, 3, 3), b.w(16, scale=0.05)], pads=[1] * 6, strides=[2, 1, 1])])
    g = b.op("Flatten", [b.op("GlobalAveragePool", [c])])
    y = b.op("Gemm", [g, b.w(5, 16), b.w(5, scale=0.05)], transB=1)
    return b.model([vi("x", T.FLOAT, ["N", 3, 8, 16, 16])], [vi(y, T.FLOAT, ["N", 5])]), \
        lambda r, n: {"x": r.standard_normal((n, 3, 8, 16, 16)).astype(np.float32)}

def convt_shapes(seed=0):
    """ConvTranspose with output_padding, group 2 and dilations, then one with output_shape."""
    b = B(seed)
    c = b.op("Relu", [b.conv("x", 4, 8, stride=2)])
    t = b.op("ConvTranspose", [c, b.w(8, 4, 3, 3, scale=0.2), b.w(8, scale=0.05)], strides=[2, 2], pads=[1, 1, 1, 1],
             output_padding=[1, 1], group=2)
    t2 = b.op("ConvTranspose", [b.op("Relu", [t]), b.w(8, 3, 3, 3, scale=0.2)], strides=[2, 2], output_shape=[31, 31])
    return b.model([vi("x", T.FLOAT, ["N", 4, 16, 16])], [vi(t2, T.FLOAT, ["N", 3, 31, 31])]), \
        lambda r, n: {"x": r.standard_normal((n, 4, 16, 16)).astype(np.float32)}

def onehot_jax(seed=0):
    """JAX-style: token ids one-hot encoded (OneHot) then a MatMul with the embedding table."""
    b = B(seed); V, D = 40, 16
    oh = b.op("OneHot", ["ids", b.c(np.array(V, np.int64)), b.c(np.array([0.0, 1.0], np.float32))], axis=-1)
    e = b.op("MatMul", [oh, b.w(V, D, scale=0.5)])
    hdn = b.op("Tanh", [b.lin(e, D, D)])
    y = b.lin(b.op("ReduceMean", [hdn, b.c(np.array([1], np.int64))], keepdims=0), D, 3)
    return b.model([vi("ids", T.INT64, ["N", "S"])], [vi(y, T.FLOAT, ["N", 3])]), \
        lambda r, n: {"ids": r.integers(0, V, (n, 7)).astype(np.int64)}

def hardmax_out(seed=0):
    """A head whose output is Hardmax (one-hot of the argmax, as float) beside the logits."""
    b = B(seed)
    lg = b.lin(b.op("Relu", [b.lin("x", 8, 16)]), 16, 6)
    hm = b.op("Hardmax", [lg], axis=-1)
    return b.model([vi("x", T.FLOAT, ["N", 8])], [vi(hm, T.FLOAT, ["N", 6]), vi(lg, T.FLOAT, ["N", 6])]), \
        lambda r, n: {"x": r.standard_normal((n, 8)).astype(np.float32)}

def resize_cubic(seed=0):
    """Resize to explicit sizes, cubic with antialias (opset 18), then nearest with
    coordinate_transformation_mode asymmetric, a super-resolution tail."""
    b = B(seed, opset=18)
    c = b.op("Relu", [b.conv("x", 3, 8)])
    r1 = b.op("Resize", [c, "", "", b.c(np.array([1, 8, 11, 11], np.int64))], mode="cubic", antialias=1)
    r2 = b.op("Resize", [b.conv(r1, 8, 3), "", b.c(np.array([1, 1, 2, 2], np.float32))], mode="nearest",
              coordinate_transformation_mode="asymmetric", nearest_mode="floor")
    return b.model([vi("x", T.FLOAT, [1, 3, 16, 16])], [vi(r2, T.FLOAT, [1, 3, 22, 22])]), \
        lambda r, n: {"x": r.standard_normal((1, 3, 16, 16)).astype(np.float32)}

def tf_pads(seed=0):
    """TF-style convolutions: asymmetric pads, dilation 2, a Pad node before a valid Conv."""
    b = B(seed, opset=13)
    c = b.op("Conv", ["x", b.w(8, 3, 3, 3), b.w(8, scale=0.05)], pads=[0, 0, 1, 1], strides=[2, 2])
    c = b.op("Relu", [c])
    c = b.op("Conv", [c, b.w(8, 8, 3, 3), b.w(8, scale=0.05)], pads=[2, 2, 2, 2], dilations=[2, 2])
    p = b.op("Pad", [b.op("Relu", [c]), b.c(np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64))], mode="constant")
    c = b.op("Conv", [p, b.w(4, 8, 3, 3), b.w(4, scale=0.05)])
    y = b.op("Flatten", [b.op("GlobalAveragePool", [c])])
    return b.model([vi("x", T.FLOAT, ["N", 3, 17, 17])], [vi(y, T.FLOAT, ["N", 4])]), \
        lambda r, n: {"x": r.standard_normal((n, 3, 17, 17)).astype(np.float32)}

def opset7_ir3(seed=0):
    """An opset-7, IR-3 export (Caffe2 era): BatchNormalization-7, Upsample-7 with scales as an
    attribute, Gemm-7, initializers also listed as graph inputs."""
    b = B(seed, opset=7)
    c = b.op("Conv", ["x", b.w(8, 3, 3, 3), b.w(8, scale=0.05)], pads=[1, 1, 1, 1])
    c = b.op("Relu", [b.op("BatchNormalization", [c, b.c(np.ones(8, np.float32)), b.c(np.zeros(8, np.float32)),
                                                 b.c(np.zeros(8, np.float32)), b.c(np.ones(8, np.float32))], epsilon=1e-5)])
    u = b.op("Upsample", [c], scales=[1.0, 1.0, 2.0, 2.0], mode="nearest")
    g = b.op("Flatten", [b.op("GlobalAveragePool", [b.conv(u, 8, 8)])])
    y = b.op("Gemm", [g, b.w(10, 8), b.w(10, scale=0.05)], transB=1)
    m = b.model([vi("x", T.FLOAT, [1, 3, 16, 16])], [vi(y, T.FLOAT, [1, 10])])
    for t in m.graph.initializer:
        m.graph.input.append(vi(t.name, t.data_type, list(t.dims)))
    m.ir_version = 3
    return m, lambda r, n: {"x": r.standard_normal((1, 3, 16, 16)).astype(np.float32)}


def tiny_units(seed=0):
    """A physics model in SI units: inputs of order 1e-9 (farads, metres), scaled up by a constant
    Mul inside the graph, an MLP, and an output of order 1e-6 (a Mul by 1e-6)."""
    b = B(seed)
    x = b.op("Mul", ["x", b.c(np.float32(1e9))])
    y = b.lin(b.op("Tanh", [b.lin(x, 6, 16)]), 16, 3)
    y = b.op("Mul", [y, b.c(np.float32(1e-6))])
    return b.model([vi("x", T.FLOAT, ["N", 6])], [vi(y, T.FLOAT, ["N", 3])]), \
        lambda r, n: {"x": (r.standard_normal((n, 6)) * 1e-9).astype(np.float32)}

def _with_nans(r, x, share=0.15):
    x = x.copy()
    x[r.random(x.shape) < share] = np.nan
    return x

def nan_impute(seed=0):
    """Missing values as NaN in the inputs (a tenth of them), imputed in the graph with
    Where(IsNaN(x), fill, x), then an MLP: the calibration data itself holds NaN."""
    b = B(seed)
    f = b.op("Where", [b.op("IsNaN", ["x"]), b.c(np.linspace(-1, 1, 8).astype(np.float32)), "x"])
    y = b.lin(b.op("Relu", [b.lin(f, 8, 16)]), 16, 4)
    return b.model([vi("x", T.FLOAT, ["N", 8])], [vi(y, T.FLOAT, ["N", 4])]), \
        lambda r, n: {"x": _with_nans(r, r.standard_normal((n, 8)).astype(np.float32))}

def ml_imputer(seed=0):
    """sklearn-onnx's SimpleImputer: the ai.onnx.ml Imputer replacing NaN, then a Scaler and an MLP."""
    b = B(seed)
    b.k += 1
    imp = f"imputer_{b.k}_0"
    b.nodes.append(h.make_node("Imputer", ["x"], [imp], domain="ai.onnx.ml", name=f"Imputer_{b.k}",
                               imputed_value_floats=list(np.linspace(-0.5, 0.5, 8).astype(float)),
                               replaced_value_float=float("nan")))
    y = b.lin(b.op("Relu", [b.lin(imp, 8, 16)]), 16, 3)
    return _ml(b, [vi("x", T.FLOAT, ["N", 8])], [vi(y, T.FLOAT, ["N", 3])]), \
        lambda r, n: {"x": _with_nans(r, r.standard_normal((n, 8)).astype(np.float32))}

def lp_embed(seed=0):
    """A face-recognition embedding: Conv, GAP, Gemm, LpNormalization (p=2) as one output and
    its cosine similarities to a constant normalized gallery as another."""
    b = B(seed)
    c = b.op("Relu", [b.conv(b.op("Relu", [b.conv("x", 3, 16, stride=2)]), 16, 16)])
    e = b.op("Gemm", [b.op("Flatten", [b.op("GlobalAveragePool", [c])]), b.w(32, 16), b.w(32, scale=0.05)], transB=1)
    e = b.op("LpNormalization", [e], axis=1, p=2)
    g = b.rng.standard_normal((32, 10)).astype(np.float32)
    sim = b.op("MatMul", [e, b.c(g / np.linalg.norm(g, axis=0, keepdims=True))])
    return b.model([vi("x", T.FLOAT, ["N", 3, 16, 16])], [vi(e, T.FLOAT, ["N", 32]), vi(sim, T.FLOAT, ["N", 10])]), \
        lambda r, n: {"x": r.standard_normal((n, 3, 16, 16)).astype(np.float32)}

def gnn_scatter(seed=0):
    """A graph neural network layer: node features gathered along run-time edges, messages
    summed into their targets with ScatterElements(reduction=add), degree-normalized, a linear."""
    b = B(seed, opset=18)
    hsrc = b.op("Gather", [b.lin("x", 8, 16), "src"], axis=0)
    idx = b.op("Expand", [b.op("Unsqueeze", ["dst", b.c(np.array([1], np.int64))]), b.op("Shape", [hsrc])])
    agg = b.op("ScatterElements", [b.op("ConstantOfShape", [b.c(np.array([32, 16], np.int64))]), idx, hsrc],
               axis=0, reduction="add")
    y = b.lin(b.op("Relu", [agg]), 16, 4)
    def feeds(r, n):
        e = 96
        return {"x": r.standard_normal((32, 8)).astype(np.float32),
                "src": r.integers(0, 32, e).astype(np.int64), "dst": r.integers(0, 32, e).astype(np.int64)}
    return b.model([vi("x", T.FLOAT, [32, 8]), vi("src", T.INT64, ["E"]), vi("dst", T.INT64, ["E"])],
                   [vi(y, T.FLOAT, [32, 4])]), feeds

def reduce_zoo(seed=0):
    """ReduceL2, ReduceLogSumExp, ReduceProd of sigmoids and ReduceSumSquare as outputs."""
    b = B(seed, opset=18)
    f = b.lin(b.op("Relu", [b.lin("x", 8, 16)]), 16, 12)
    ax = b.c(np.array([1], np.int64))
    outs = [b.op("ReduceL2", [f, ax], keepdims=0), b.op("ReduceLogSumExp", [f, ax], keepdims=0),
            b.op("ReduceProd", [b.op("Sigmoid", [f]), ax], keepdims=0), b.op("ReduceSumSquare", [f, ax], keepdims=0)]
    return b.model([vi("x", T.FLOAT, ["N", 8])], [vi(o, T.FLOAT, ["N"]) for o in outs]), \
        lambda r, n: {"x": r.standard_normal((n, 8)).astype(np.float32)}

def qdq_input(seed=0):
    """A model that is already quantized (a QAT export): QuantizeLinear/DequantizeLinear pairs
    around the input and the weights of its convolutions."""
    b = B(seed)
    def qdq(t, scale):
        q = b.op("QuantizeLinear", [t, b.c(np.float32(scale)), b.c(np.int8(0))])
        return b.op("DequantizeLinear", [q, b.c(np.float32(scale)), b.c(np.int8(0))])
    x = qdq("x", 4 / 127)
    c = b.op("Relu", [b.op("Conv", [x, qdq(b.w(8, 3, 3, 3), 0.02), b.w(8, scale=0.05)], pads=[1, 1, 1, 1])])
    c = qdq(c, 3 / 127)
    y = b.op("Flatten", [b.op("GlobalAveragePool", [b.op("Conv", [c, qdq(b.w(6, 8, 3, 3), 0.01), b.w(6, scale=0.05)],
                                                               pads=[1, 1, 1, 1])])])
    return b.model([vi("x", T.FLOAT, ["N", 3, 16, 16])], [vi(y, T.FLOAT, ["N", 6])]), \
        lambda r, n: {"x": r.standard_normal((n, 3, 16, 16)).astype(np.float32)}

def hash_embed(seed=0):
    """Hashed ids: int64 ids Mod a bucket count, Gather from an embedding, ReduceMean, a head."""
    b = B(seed)
    ids = b.op("Mod", ["ids", b.c(np.int64(500))])
    e = b.op("ReduceMean", [b.op("Gather", [b.w(500, 16, scale=0.3), ids]), b.c(np.array([1], np.int64))], keepdims=0)
    y = b.lin(b.op("Relu", [b.lin(e, 16, 16)]), 16, 5)
    return b.model([vi("ids", T.INT64, ["N", 12])], [vi(y, T.FLOAT, ["N", 5])]), \
        lambda r, n: {"ids": r.integers(0, 2**40, (n, 12)).astype(np.int64)}

def softmax_legacy(seed=0):
    """Opset-11 Softmax and LogSoftmax with axis=1 on a rank-3 tensor (coerced to 2-D: over the
    last two axes together)."""
    b = B(seed, opset=11)
    f = b.op("Reshape", [b.lin(b.op("Relu", [b.lin("x", 8, 16)]), 16, 24), b.c(np.array([0, 4, 6], np.int64))])
    s = b.op("Softmax", [f], axis=1)
    ls = b.op("LogSoftmax", [f], axis=1)
    return b.model([vi("x", T.FLOAT, ["N", 8])], [vi(s, T.FLOAT, ["N", 4, 6]), vi(ls, T.FLOAT, ["N", 4, 6])]), \
        lambda r, n: {"x": r.standard_normal((n, 8)).astype(np.float32)}

def depth_recip(seed=0):
    """Monocular depth: a disparity from Sigmoid scaled to 0.01..10, depth = 1 / disparity (0.1 m
    to 100 m) as the output."""
    b = B(seed)
    c = b.op("Relu", [b.conv(b.op("Relu", [b.conv("x", 3, 8)]), 8, 8)])
    d = b.op("Add", [b.op("Mul", [b.op("Sigmoid", [b.op("Mul", [b.conv(c, 8, 1), b.c(np.float32(6.0))])]),
                                    b.c(np.float32(10.0))]), b.c(np.float32(0.01))])
    y = b.op("Reciprocal", [d])
    return b.model([vi("x", T.FLOAT, ["N", 3, 16, 16])], [vi(y, T.FLOAT, ["N", 1, 16, 16])]), \
        lambda r, n: {"x": (r.standard_normal((n, 3, 16, 16)) * 2).astype(np.float32)}

def inf_clamp(seed=0):
    """Inputs that hold +inf and -inf (an unbounded ratio feature), clamped in the graph by Clip
    to -1e3..1e3 and squashed by a log1p-like Log(1 + |x|) * Sign(x) before an MLP."""
    b = B(seed, opset=13)
    c = b.op("Clip", ["x", b.c(np.float32(-1e3)), b.c(np.float32(1e3))])
    s = b.op("Mul", [b.op("Log", [b.op("Add", [b.op("Abs", [c]), b.c(np.float32(1.0))])]), b.op("Sign", [c])])
    y = b.lin(b.op("Relu", [b.lin(s, 8, 16)]), 16, 3)
    def feeds(r, n):
        x = (r.standard_normal((n, 8)) * 20).astype(np.float32)
        x[r.random(x.shape) < 0.05] = np.inf
        x[r.random(x.shape) < 0.05] = -np.inf
        return {"x": x}
    return b.model([vi("x", T.FLOAT, ["N", 8])], [vi(y, T.FLOAT, ["N", 3])]), feeds

def attn_pool(seed=0):
    """Attention pooling over time: scores by a linear, Softmax over axis 1 (time, not the last
    axis), weights times features summed over time, a classifier."""
    b = B(seed)
    f = b.op("Tanh", [b.lin("x", 8, 16)])
    w = b.op("Softmax", [b.lin(f, 16, 1)], axis=1)
    p = b.op("ReduceSum", [b.op("Mul", [w, f]), b.c(np.array([1], np.int64))], keepdims=0)
    y = b.lin(p, 16, 5)
    return b.model([vi("x", T.FLOAT, ["N", 50, 8])], [vi(y, T.FLOAT, ["N", 5])]), \
        lambda r, n: {"x": r.standard_normal((n, 50, 8)).astype(np.float32)}


def conv_imbalance(seed=0):
    """A CNN without normalization whose channels' ranges differ 1000x (one channel's filter
    scaled up, as before cross-layer equalization): one per-tensor grid for all channels."""
    b = B(seed)
    w = b.rng.standard_normal((8, 3, 3, 3)).astype(np.float32) * 0.2
    w[:2] *= np.float32(30.0)  # two loud channels
    w[2:5] *= np.float32(0.03)  # three quiet ones
    c = b.op("Relu", [b.op("Conv", ["x", b.w(arr=w), b.w(8, scale=0.01)], pads=[1, 1, 1, 1])])
    w2 = (b.rng.standard_normal((6, 8, 3, 3)) * 0.1).astype(np.float32)
    w2[:, :2] *= np.float32(1 / 30.0)
    w2[:, 2:5] *= np.float32(30.0)
    y = b.op("Flatten", [b.op("GlobalAveragePool", [b.op("Conv", [c, b.w(arr=w2), b.w(6, scale=0.01)], pads=[1, 1, 1, 1])])])
    return b.model([vi("x", T.FLOAT, ["N", 3, 12, 12])], [vi(y, T.FLOAT, ["N", 6])]), \
        lambda r, n: {"x": r.standard_normal((n, 3, 12, 12)).astype(np.float32)}

def uint8_image(seed=0):
    """A deployment model taking uint8 images: Cast to float, / 255, per-channel mean and std."""
    b = B(seed)
    f = b.op("Div", [b.op("Cast", ["img"], to=T.FLOAT), b.c(np.float32(255.0))])
    f = b.op("Div", [b.op("Sub", [f, b.c(np.array([0.485, 0.456, 0.406], np.float32).reshape(1, 3, 1, 1))]),
                     b.c(np.array([0.229, 0.224, 0.225], np.float32).reshape(1, 3, 1, 1))])
    c = b.op("Relu", [b.conv(b.op("Relu", [b.conv(f, 3, 8, stride=2)]), 8, 8)])
    y = b.op("Gemm", [b.op("Flatten", [b.op("GlobalAveragePool", [c])]), b.w(5, 8), b.w(5, scale=0.05)], transB=1)
    return b.model([vi("img", T.UINT8, ["N", 3, 16, 16])], [vi(y, T.FLOAT, ["N", 5])]), \
        lambda r, n: {"img": r.integers(0, 256, (n, 3, 16, 16)).astype(np.uint8)}

def bool_threshold(seed=0):
    """A binary decision as an output: Greater(Sigmoid(score), 0.5) (bool) beside the score."""
    b = B(seed)
    s = b.op("Sigmoid", [b.lin(b.op("Relu", [b.lin("x", 8, 16)]), 16, 3)])
    d = b.op("Greater", [s, b.c(np.float32(0.5))])
    return b.model([vi("x", T.FLOAT, ["N", 8])], [vi(d, T.BOOL, ["N", 3]), vi(s, T.FLOAT, ["N", 3])]), \
        lambda r, n: {"x": r.standard_normal((n, 8)).astype(np.float32)}

def variable_shapes(seed=0):
    """A sequence model fed batches of varying size and length (1..4 x 5..40), mean-pooled."""
    b = B(seed)
    hdn = b.op("Relu", [b.lin("x", 8, 16)])
    p = b.op("ReduceMean", [hdn, b.c(np.array([1], np.int64))], keepdims=0)
    y = b.lin(p, 16, 4)
    def feeds(r, n):
        return {"x": r.standard_normal((int(r.integers(1, n + 1)), int(r.integers(5, 41)), 8)).astype(np.float32)}
    return b.model([vi("x", T.FLOAT, ["N", "T", 8])], [vi(y, T.FLOAT, ["N", 4])]), feeds

def unused_input(seed=0):
    """Hostile inputs: a graph input no node reads, and an initializer that is also an output."""
    b = B(seed)
    w = b.w(8, 16)
    y = b.op("Add", [b.op("MatMul", [b.op("Relu", ["x"]), w]), b.w(16, scale=0.05)])
    return b.model([vi("x", T.FLOAT, ["N", 8]), vi("unused", T.FLOAT, ["N", 4])],
                   [vi(y, T.FLOAT, ["N", 16]), vi(w, T.FLOAT, [8, 16])]), \
        lambda r, n: {"x": r.standard_normal((n, 8)).astype(np.float32),
                      "unused": r.standard_normal((n, 4)).astype(np.float32)}

def ensemble_mean(seed=0):
    """An ensemble: three small heads' logits averaged by the variadic Mean op, with Max and Min
    of them as further outputs."""
    b = B(seed)
    hs = [b.lin(b.op("Tanh", [b.lin("x", 8, 12)]), 12, 5) for _ in range(3)]
    return b.model([vi("x", T.FLOAT, ["N", 8])], [vi(b.op("Mean", hs), T.FLOAT, ["N", 5]),
                                                  vi(b.op("Max", hs), T.FLOAT, ["N", 5]),
                                                  vi(b.op("Min", hs), T.FLOAT, ["N", 5])]), \
        lambda r, n: {"x": r.standard_normal((n, 8)).astype(np.float32)}

def nan_float_output(seed=0):
    """Attention whose fully masked rows give NaN in float itself (an all -inf row's Softmax):
    the reference has NaN in some rows, by the model's own arithmetic."""
    b = B(seed)
    s = b.op("MatMul", [b.lin("x", 8, 8), b.op("Transpose", [b.lin("x", 8, 8)], perm=[0, 2, 1])])
    s = b.op("Add", [s, "mask"])
    a = b.op("MatMul", [b.op("Softmax", [s], axis=-1), b.lin("x", 8, 8)])
    def feeds(r, n):
        mask = np.zeros((n, 6, 6), np.float32)
        mask[:, :, 4:] = -np.inf
        mask[0, 5, :] = -np.inf  # one fully masked query row
        return {"x": r.standard_normal((n, 6, 8)).astype(np.float32), "mask": mask}
    return b.model([vi("x", T.FLOAT, ["N", 6, 8]), vi("mask", T.FLOAT, ["N", 6, 6])], [vi(a, T.FLOAT, ["N", 6, 8])]), feeds

def softplus_zoo(seed=0):
    """Softplus, Softsign, ThresholdedRelu, Shrink and Erf as activations of one MLP."""
    b = B(seed)
    x = b.op("Softplus", [b.lin("x", 8, 16)])
    x = b.op("Softsign", [b.lin(x, 16, 16)])
    x = b.op("ThresholdedRelu", [b.lin(x, 16, 16)], alpha=0.1)
    x = b.op("Shrink", [b.lin(x, 16, 16)], lambd=0.05, bias=0.0)
    y = b.lin(b.op("Erf", [b.lin(x, 16, 16)]), 16, 4)
    return b.model([vi("x", T.FLOAT, ["N", 8])], [vi(y, T.FLOAT, ["N", 4])]), \
        lambda r, n: {"x": r.standard_normal((n, 8)).astype(np.float32)}

def runtime_resize(seed=0):
    """Resize to the size of a skip connection read at run time (Shape -> Slice -> Concat as
    sizes), a U-Net decoder's upsampling."""
    b = B(seed)
    e1 = b.op("Relu", [b.conv("x", 3, 8)])
    e2 = b.op("Relu", [b.conv(e1, 8, 8, stride=2)])
    size = b.op("Shape", [e1])
    up = b.op("Resize", [e2, "", "", size], mode="linear")
    y = b.conv(b.op("Concat", [up, e1], axis=1), 16, 2)
    return b.model([vi("x", T.FLOAT, ["N", 3, 15, 15])], [vi(y, T.FLOAT, ["N", 2, 15, 15])]), \
        lambda r, n: {"x": r.standard_normal((n, 3, 15, 15)).astype(np.float32)}

def act_gating(seed=0):
    """A gate computed from an activation: Where(Greater(g, 0), x, 0.1 * x) and a hard mask
    Cast(Greater(h, 0.3)) * v: the quantized activation decides which branch runs."""
    b = B(seed)
    g = b.lin("x", 8, 16)
    xx = b.lin("x", 8, 16)
    w = b.op("Where", [b.op("Greater", [g, b.c(np.float32(0.0))]), xx, b.op("Mul", [xx, b.c(np.float32(0.1))])])
    hh = b.op("Sigmoid", [b.lin(w, 16, 16)])
    m = b.op("Cast", [b.op("Greater", [hh, b.c(np.float32(0.3))])], to=T.FLOAT)
    y = b.lin(b.op("Mul", [m, b.lin(w, 16, 16)]), 16, 4)
    return b.model([vi("x", T.FLOAT, ["N", 8])], [vi(y, T.FLOAT, ["N", 4])]), \
        lambda r, n: {"x": r.standard_normal((n, 8)).astype(np.float32)}

def resid_growth(seed=0):
    """A deep residual MLP whose stream grows 3x per block (12 blocks), normalized only at the
    end: early and late blocks on very different scales."""
    b = B(seed)
    hcur = b.lin("x", 8, 16)
    for _ in range(12):
        hcur = b.op("Add", [hcur, b.lin(b.op("Relu", [hcur]), 16, 16)])
    y = b.lin(b.op("LayerNormalization", [hcur, b.c(np.ones(16, np.float32)), b.c(np.zeros(16, np.float32))],
                   axis=-1), 16, 4)
    return b.model([vi("x", T.FLOAT, ["N", 8])], [vi(y, T.FLOAT, ["N", 4])]), \
        lambda r, n: {"x": r.standard_normal((n, 8)).astype(np.float32)}


def dw_imbalance(seed=0):
    """A MobileNet-style block without normalization: a depthwise Conv whose channels' ranges
    differ 1000x, LeakyRelu, MaxPool, then the pointwise Conv that compensates."""
    b = B(seed)
    c0 = b.op("Relu", [b.conv("x", 3, 8)])
    w = (b.rng.standard_normal((8, 1, 3, 3)) * 0.3).astype(np.float32)
    w[:2] *= np.float32(30.0)
    w[2:5] *= np.float32(0.03)
    d = b.op("Conv", [c0, b.w(arr=w), b.w(8, scale=0.01)], pads=[1, 1, 1, 1], group=8)
    d = b.op("MaxPool", [b.op("LeakyRelu", [d], alpha=0.1)], kernel_shape=[2, 2], strides=[2, 2])
    w2 = (b.rng.standard_normal((6, 8, 1, 1)) * 0.3).astype(np.float32)
    w2[:, :2] *= np.float32(1 / 30.0)
    w2[:, 2:5] *= np.float32(30.0)
    y = b.op("Flatten", [b.op("GlobalAveragePool", [b.op("Conv", [d, b.w(arr=w2), b.w(6, scale=0.01)])])])
    return b.model([vi("x", T.FLOAT, ["N", 3, 12, 12])], [vi(y, T.FLOAT, ["N", 6])]), \
        lambda r, n: {"x": r.standard_normal((n, 3, 12, 12)).astype(np.float32)}


def mlp_imbalance(seed=0):
    """A tabular MLP trained without normalization: hidden units whose ranges differ 1000x
    (MatMul + bias, Relu, MatMul compensating)."""
    b = B(seed)
    w1 = (b.rng.standard_normal((8, 32)) * 0.35).astype(np.float32)
    w1[:, :4] *= np.float32(30.0)
    w1[:, 4:12] *= np.float32(0.03)
    h1 = b.op("Relu", [b.op("Add", [b.op("MatMul", ["x", b.w(arr=w1)]), b.w(32, scale=0.01)])])
    w2 = (b.rng.standard_normal((32, 4)) * 0.2).astype(np.float32)
    w2[:4] /= np.float32(30.0)
    w2[4:12] /= np.float32(0.03)
    y = b.op("Add", [b.op("MatMul", [h1, b.w(arr=w2)]), b.w(4, scale=0.01)])
    return b.model([vi("x", T.FLOAT, ["N", 8])], [vi(y, T.FLOAT, ["N", 4])]), \
        lambda r, n: {"x": r.standard_normal((n, 8)).astype(np.float32)}

def vq_codebook(seed=0):
    """A VQ-VAE bottleneck: distances ||z||^2 - 2 z.E + ||E||^2 to a codebook, ArgMin, the
    chosen code gathered, then a decoder layer (the distances cancel: codes sit close)."""
    b = B(seed)
    z = b.lin(b.op("Relu", [b.lin("x", 8, 16)]), 16, 8)
    E = (b.rng.standard_normal((32, 8)) * 0.5 + 2.0).astype(np.float32)  # codes near a common centre
    zz = b.op("ReduceSum", [b.op("Mul", [z, z]), b.c(np.array([1], np.int64))], keepdims=1)
    ze = b.op("MatMul", [z, b.c(E.T.copy())])
    ee = b.c((E * E).sum(1)[None, :].astype(np.float32))
    dist = b.op("Add", [b.op("Sub", [zz, b.op("Mul", [ze, b.c(np.float32(2.0))])]), ee])
    idx = b.op("ArgMin", [dist], axis=1, keepdims=0)
    q = b.op("Gather", [b.c(E), idx], axis=0)
    y = b.lin(b.op("Relu", [b.lin(q, 8, 16)]), 16, 6)
    return b.model([vi("x", T.FLOAT, ["N", 8])], [vi(y, T.FLOAT, ["N", 6]), vi(idx, T.INT64, ["N"])]), \
        lambda r, n: {"x": r.standard_normal((n, 8)).astype(np.float32)}

def cosine_written(seed=0):
    """Cosine similarity written out: a.b / (sqrt(sum a^2) * sqrt(sum b^2) + eps) between two
    embeddings of one input pair (a siamese matcher)."""
    b = B(seed)
    ax = b.c(np.array([1], np.int64))
    ea = b.lin(b.op("Relu", [b.lin("a", 8, 16)]), 16, 16)
    eb = b.lin(b.op("Relu", [b.lin("b", 8, 16)]), 16, 16)
    dot = b.op("ReduceSum", [b.op("Mul", [ea, eb]), ax], keepdims=0)
    na = b.op("Sqrt", [b.op("ReduceSum", [b.op("Mul", [ea, ea]), ax], keepdims=0)])
    nb = b.op("Sqrt", [b.op("ReduceSum", [b.op("Mul", [eb, eb]), ax], keepdims=0)])
    y = b.op("Div", [dot, b.op("Add", [b.op("Mul", [na, nb]), b.c(np.float32(1e-8))])])
    return b.model([vi("a", T.FLOAT, ["N", 8]), vi("b", T.FLOAT, ["N", 8])], [vi(y, T.FLOAT, ["N"])]), \
        lambda r, n: {"a": r.standard_normal((n, 8)).astype(np.float32), "b": r.standard_normal((n, 8)).astype(np.float32)}

def gaussian_nll(seed=0):
    """A probabilistic regressor: mean and Softplus scale heads, and the Gaussian negative
    log-likelihood of a target input, 0.5 ((t - mu) / sigma)^2 + log(sigma), as outputs."""
    b = B(seed)
    h = b.op("Relu", [b.lin("x", 8, 16)])
    mu = b.lin(h, 16, 2)
    sig = b.op("Add", [b.op("Softplus", [b.lin(h, 16, 2)]), b.c(np.float32(1e-3))])
    zt = b.op("Div", [b.op("Sub", ["t", mu]), sig])
    nll = b.op("Add", [b.op("Mul", [b.op("Mul", [zt, zt]), b.c(np.float32(0.5))]), b.op("Log", [sig])])
    return b.model([vi("x", T.FLOAT, ["N", 8]), vi("t", T.FLOAT, ["N", 2])],
                   [vi(mu, T.FLOAT, ["N", 2]), vi(sig, T.FLOAT, ["N", 2]), vi(nll, T.FLOAT, ["N", 2])]), \
        lambda r, n: {"x": r.standard_normal((n, 8)).astype(np.float32), "t": r.standard_normal((n, 2)).astype(np.float32)}

def revin_forecast(seed=0):
    """A forecaster with reversible instance normalization: the input window's mean and std
    taken out, an MLP over time, and put back (series on an offset of 1000, varying 5)."""
    b = B(seed)
    ax = b.c(np.array([1], np.int64))
    mean = b.op("ReduceMean", ["x", ax], keepdims=1)
    xc = b.op("Sub", ["x", mean])
    std = b.op("Sqrt", [b.op("Add", [b.op("ReduceMean", [b.op("Mul", [xc, xc]), ax], keepdims=1), b.c(np.float32(1e-5))])])
    xn = b.op("Div", [xc, std])
    f = b.lin(b.op("Relu", [b.lin(xn, 48, 64)]), 64, 12)
    y = b.op("Add", [b.op("Mul", [f, std]), mean])
    def feeds(r, n):
        t = np.arange(48, dtype=np.float32)
        base = 1000 + r.standard_normal((n, 1)) * 20
        return {"x": (base + 5 * np.sin(t / 6 + r.random((n, 1)) * 6) + r.standard_normal((n, 48))).astype(np.float32)}
    return b.model([vi("x", T.FLOAT, ["N", 48])], [vi(y, T.FLOAT, ["N", 12])]), feeds

def nerf_encoding(seed=0):
    """NeRF positional encoding: coordinates times 2^k (k = 0..9) through Sin and Cos,
    concatenated, then an MLP to a density and a colour."""
    b = B(seed)
    freqs = (np.pi * 2.0 ** np.arange(10)).astype(np.float32)
    ph = b.op("Reshape", [b.op("Mul", [b.op("Unsqueeze", ["p", b.c(np.array([2], np.int64))]), b.c(freqs)]),
                          b.c(np.array([0, 30], np.int64))])
    enc = b.op("Concat", ["p", b.op("Sin", [ph]), b.op("Cos", [ph])], axis=1)
    y = b.lin(b.op("Relu", [b.lin(b.op("Relu", [b.lin(enc, 63, 32)]), 32, 32)]), 32, 4)
    return b.model([vi("p", T.FLOAT, ["N", 3])], [vi(y, T.FLOAT, ["N", 4])]), \
        lambda r, n: {"p": r.uniform(-1, 1, (n, 3)).astype(np.float32)}

def pcm_audio(seed=0):
    """Raw int16 PCM given as float (-32768 .. 32767), scaled by 1/32768 in the graph, a strided
    Conv1d front end, Abs, Log(1 + x), and a classifier."""
    b = B(seed)
    s = b.op("Mul", ["wav", b.c(np.float32(1 / 32768))])
    f = b.op("Conv", [s, b.w(16, 1, 64, scale=0.2), b.w(16, scale=0.01)], strides=[32])
    f = b.op("Log", [b.op("Add", [b.op("Abs", [f]), b.c(np.float32(1.0))])])
    p = b.op("ReduceMean", [f, b.c(np.array([2], np.int64))], keepdims=0)
    y = b.lin(b.op("Relu", [b.lin(p, 16, 16)]), 16, 5)
    def feeds(r, n):
        t = np.arange(4096, dtype=np.float32)
        amp = 10 ** r.uniform(2, 4.3, (n, 1, 1))
        return {"wav": np.clip(amp * np.sin(t * r.uniform(0.01, 0.3, (n, 1, 1))) + r.standard_normal((n, 1, 4096)) * 50,
                               -32768, 32767).round().astype(np.float32)}
    return b.model([vi("wav", T.FLOAT, ["N", 1, 4096])], [vi(y, T.FLOAT, ["N", 5])]), feeds


def se_block(seed=0):
    """Squeeze-and-excitation: GAP, 1x1 Conv, Relu, 1x1 Conv, Sigmoid gating the features."""
    b = B(seed)
    f = b.op("Relu", [b.conv(b.op("Relu", [b.conv("x", 3, 16)]), 16, 16)])
    s = b.op("GlobalAveragePool", [f])
    s = b.op("Sigmoid", [b.conv(b.op("Relu", [b.conv(s, 16, 4, k=1)]), 4, 16, k=1)])
    g = b.op("Mul", [f, s])
    y = b.op("Flatten", [b.op("GlobalAveragePool", [b.conv(g, 16, 6)])])
    return b.model([vi("x", T.FLOAT, ["N", 3, 12, 12])], [vi(y, T.FLOAT, ["N", 6])]), \
        lambda r, n: {"x": r.standard_normal((n, 3, 12, 12)).astype(np.float32)}

def wavenet(seed=0):
    """A WaveNet / TCN stack: dilated causal Conv1d (left Pad), tanh * sigmoid gates, residual
    and skip connections summed over 6 layers."""
    b = B(seed, opset=18)
    h = b.op("Conv", ["x", b.w(16, 1, 1), b.w(16, scale=0.01)])
    skip = None
    for i in range(6):
        d = 2 ** i
        p = b.op("Pad", [h, b.c(np.array([0, 0, 2 * d, 0, 0, 0], np.int64))])
        a = b.op("Conv", [p, b.w(16, 16, 3), b.w(16, scale=0.01)], dilations=[d])
        gte = b.op("Conv", [p, b.w(16, 16, 3), b.w(16, scale=0.01)], dilations=[d])
        z = b.op("Mul", [b.op("Tanh", [a]), b.op("Sigmoid", [gte])])
        h = b.op("Add", [h, b.op("Conv", [z, b.w(16, 16, 1), b.w(16, scale=0.01)])])
        sk = b.op("Conv", [z, b.w(16, 16, 1), b.w(16, scale=0.01)])
        skip = sk if skip is None else b.op("Add", [skip, sk])
    y = b.op("Conv", [b.op("Relu", [skip]), b.w(8, 16, 1), b.w(8, scale=0.01)])
    return b.model([vi("x", T.FLOAT, ["N", 1, 256])], [vi(y, T.FLOAT, ["N", 8, 256])]), \
        lambda r, n: {"x": np.cumsum(r.standard_normal((n, 1, 256)) * 0.1, axis=2).astype(np.float32)}

def resnext_group(seed=0):
    """ResNeXt's grouped convolutions (group 4) between 1x1 Convs, a residual Add."""
    b = B(seed)
    x0 = b.op("Relu", [b.conv("x", 3, 16)])
    a = b.op("Relu", [b.conv(x0, 16, 16, k=1)])
    a = b.op("Relu", [b.op("Conv", [a, b.w(16, 4, 3, 3), b.w(16, scale=0.01)], pads=[1, 1, 1, 1], group=4)])
    a = b.conv(a, 16, 16, k=1)
    y = b.op("Flatten", [b.op("GlobalAveragePool", [b.op("Relu", [b.op("Add", [x0, a])])])])
    y = b.op("Gemm", [y, b.w(5, 16), b.w(5, scale=0.05)], transB=1)
    return b.model([vi("x", T.FLOAT, ["N", 3, 12, 12])], [vi(y, T.FLOAT, ["N", 5])]), \
        lambda r, n: {"x": r.standard_normal((n, 3, 12, 12)).astype(np.float32)}

def length_mask(seed=0):
    """Sequences with a lengths input: the padding mask built in the graph (Range, Less), padded
    steps zeroed, a masked mean over time (sum / length), a classifier."""
    b = B(seed)
    T_ = 20
    steps = b.op("Range", [b.c(np.int64(0)), b.c(np.int64(T_)), b.c(np.int64(1))])
    keep = b.op("Cast", [b.op("Less", [steps, b.op("Unsqueeze", ["lengths", b.c(np.array([1], np.int64))])])], to=T.FLOAT)
    hdn = b.op("Relu", [b.lin("x", 8, 16)])
    m = b.op("Mul", [hdn, b.op("Unsqueeze", [keep, b.c(np.array([2], np.int64))])])
    tot = b.op("ReduceSum", [m, b.c(np.array([1], np.int64))], keepdims=0)
    mean = b.op("Div", [tot, b.op("Unsqueeze", [b.op("Cast", ["lengths"], to=T.FLOAT), b.c(np.array([1], np.int64))])])
    y = b.lin(mean, 16, 4)
    def feeds(r, n):
        return {"x": r.standard_normal((n, T_, 8)).astype(np.float32), "lengths": r.integers(1, T_ + 1, n).astype(np.int64)}
    return b.model([vi("x", T.FLOAT, ["N", T_, 8]), vi("lengths", T.INT64, ["N"])], [vi(y, T.FLOAT, ["N", 4])]), feeds

def capsule_squash(seed=0):
    """Capsule networks' squash: v = |s|^2 / (1 + |s|^2) * s / |s| per capsule, then the
    capsules' lengths as class scores."""
    b = B(seed)
    s = b.op("Reshape", [b.lin(b.op("Relu", [b.lin("x", 8, 32)]), 32, 40), b.c(np.array([0, 5, 8], np.int64))])
    ax = b.c(np.array([2], np.int64))
    n2 = b.op("ReduceSum", [b.op("Mul", [s, s]), ax], keepdims=1)
    nrm = b.op("Sqrt", [b.op("Add", [n2, b.c(np.float32(1e-9))])])
    v = b.op("Mul", [b.op("Div", [n2, b.op("Add", [n2, b.c(np.float32(1.0))])]), b.op("Div", [s, nrm])])
    y = b.op("Sqrt", [b.op("ReduceSum", [b.op("Mul", [v, v]), ax], keepdims=0)])
    return b.model([vi("x", T.FLOAT, ["N", 8])], [vi(y, T.FLOAT, ["N", 5])]), \
        lambda r, n: {"x": r.standard_normal((n, 8)).astype(np.float32)}

def bn_after_add(seed=0):
    """BatchNormalization that no Conv precedes (after a residual Add, and on an input), with
    running statistics far from 0 / 1, as pre-activation ResNets have."""
    b = B(seed)
    c = 8
    def bn(t, shift):
        return b.op("BatchNormalization", [t, b.c(b.rng.uniform(0.5, 2, c).astype(np.float32)),
                                          b.c(b.rng.normal(0, 0.1, c).astype(np.float32)),
                                          b.c((b.rng.normal(0, 1, c) + shift).astype(np.float32)),
                                          b.c(b.rng.uniform(0.5, 4, c).astype(np.float32))])
    x1 = b.op("Relu", [bn(b.conv("x", 3, c), 0.0)])
    r = b.op("Add", [x1, b.conv(x1, c, c)])
    r = b.op("Relu", [bn(r, 2.0)])
    y = b.op("Flatten", [b.op("GlobalAveragePool", [b.conv(r, c, 4)])])
    return b.model([vi("x", T.FLOAT, ["N", 3, 12, 12])], [vi(y, T.FLOAT, ["N", 4])]), \
        lambda r, n: {"x": r.standard_normal((n, 3, 12, 12)).astype(np.float32)}

def grouped_imbalance(seed=0):
    """A grouped Conv (group 2) whose output channels differ 1000x, Relu, then a 1x1 Conv that
    compensates: equalization of a grouped first layer."""
    b = B(seed)
    w = (b.rng.standard_normal((8, 2, 3, 3)) * 0.3).astype(np.float32)
    w[:2] *= np.float32(30.0)
    w[4:7] *= np.float32(0.03)
    x0 = b.op("Relu", [b.conv("x", 3, 4)])
    h = b.op("Relu", [b.op("Conv", [x0, b.w(arr=w), b.w(8, scale=0.01)], pads=[1, 1, 1, 1], group=2)])
    w2 = (b.rng.standard_normal((6, 8, 1, 1)) * 0.3).astype(np.float32)
    w2[:, :2] /= np.float32(30.0)
    w2[:, 4:7] /= np.float32(0.03)
    y = b.op("Flatten", [b.op("GlobalAveragePool", [b.op("Conv", [h, b.w(arr=w2), b.w(6, scale=0.01)])])])
    return b.model([vi("x", T.FLOAT, ["N", 3, 12, 12])], [vi(y, T.FLOAT, ["N", 6])]), \
        lambda r, n: {"x": r.standard_normal((n, 3, 12, 12)).astype(np.float32)}


def _ms(b, inputs, outputs):
    m = b.model(inputs, outputs)
    m.opset_import.append(h.make_opsetid("com.microsoft", 1))
    return m

def _msop(b, op_type, ins, n_out=1, **attrs):
    b.k += 1
    outs = [f"{op_type.lower()}_{b.k}_{i}" for i in range(n_out)]
    b.nodes.append(h.make_node(op_type, ins, outs, name=f"{op_type}_{b.k}", domain="com.microsoft", **attrs))
    return outs[0] if n_out == 1 else outs

def ort_fused_bert(seed=0):
    """A BERT layer as onnxruntime's transformer optimizer saves it: com.microsoft Attention (packed
    QKV), SkipLayerNormalization, BiasGelu, FastGelu, FusedMatMul."""
    b = B(seed, opset=17); D, S = 32, 8
    x = b.op("Add", [b.op("MatMul", ["x", b.w(16, D)]), b.w(D, scale=0.05)])
    a = _msop(b, "Attention", [x, b.w(D, 3 * D), b.w(3 * D, scale=0.05)], num_heads=2)
    y = _msop(b, "SkipLayerNormalization", [b.op("MatMul", [a, b.w(D, D)]), x, b.c(np.ones(D, np.float32)),
                                            b.c(np.zeros(D, np.float32)), b.w(D, scale=0.05)], epsilon=1e-12)
    f = _msop(b, "BiasGelu", [b.op("MatMul", [y, b.w(D, 4 * D)]), b.w(4 * D, scale=0.05)])
    f2 = _msop(b, "FastGelu", [_msop(b, "FusedMatMul", [f, b.w(4 * D, D)], alpha=1.0), b.w(D, scale=0.05)])
    z = _msop(b, "SkipLayerNormalization", [f2, y, b.c(np.ones(D, np.float32)), b.c(np.zeros(D, np.float32))], epsilon=1e-12)
    lg = b.op("MatMul", [b.op("ReduceMean", [z], axes=[1], keepdims=0), b.w(D, 4)])
    return _ms(b, [vi("x", T.FLOAT, ["N", S, 16])], [vi(lg, T.FLOAT, ["N", 4])]), \
        lambda r, n: {"x": r.standard_normal((n, S, 16)).astype(np.float32)}

def ort_fused_cnn(seed=0):
    """A CNN as onnxruntime saves it after its graph optimizations: com.microsoft FusedConv with Relu
    and with Sigmoid, FusedGemm with LeakyRelu."""
    b = B(seed, opset=17)
    x = _msop(b, "FusedConv", ["x", b.w(16, 3, 3, 3), b.w(16, scale=0.05)], activation="Relu", pads=[1] * 4)
    x = _msop(b, "FusedConv", [x, b.w(16, 16, 3, 3), b.w(16, scale=0.05)], activation="Sigmoid", pads=[1] * 4, strides=[2, 2])
    x = b.op("Flatten", [b.op("GlobalAveragePool", [x])])
    y = _msop(b, "FusedGemm", [x, b.w(10, 16), b.w(10, scale=0.05)], transB=1, activation="LeakyRelu", activation_alpha=0.1)
    return _ms(b, [vi("x", T.FLOAT, ["N", 3, 16, 16])], [vi(y, T.FLOAT, ["N", 10])]), \
        lambda r, n: {"x": r.standard_normal((n, 3, 16, 16)).astype(np.float32)}

def convnext_block(seed=0):
    """ConvNeXt: depthwise 7x7 Conv, NHWC LayerNormalization, 4x MLP with Gelu-20, layer scale
    (gamma from 1e-6 to 1 across channels), residual."""
    b = B(seed, opset=20); C = 16
    x = b.conv("x", 3, C)
    for _ in range(2):
        d = b.op("Conv", [x, b.w(C, 1, 7, 7, scale=0.1), b.w(C, scale=0.05)], pads=[3] * 4, group=C)
        t = b.op("Transpose", [d], perm=[0, 2, 3, 1])
        ln = b.op("LayerNormalization", [t, b.c(np.ones(C, np.float32)), b.c(np.zeros(C, np.float32))], axis=-1, epsilon=1e-6)
        m = b.lin(b.op("Gelu", [b.lin(ln, C, 4 * C)]), 4 * C, C)
        gamma = (10.0 ** b.rng.uniform(-6, 0, C)).astype(np.float32)
        m = b.op("Mul", [m, b.c(gamma)])
        x = b.op("Add", [x, b.op("Transpose", [m], perm=[0, 3, 1, 2])])
    y = b.op("Gemm", [b.op("Flatten", [b.op("GlobalAveragePool", [x])]), b.w(10, C), b.w(10, scale=0.05)], transB=1)
    return b.model([vi("x", T.FLOAT, ["N", 3, 16, 16])], [vi(y, T.FLOAT, ["N", 10])]), \
        lambda r, n: {"x": r.standard_normal((n, 3, 16, 16)).astype(np.float32)}

def t5_relbias(seed=0):
    """T5: relative-position buckets computed in float at run time (Log of |i - j|, Cast to
    int64), a Gather of the bias table added to unscaled scores, RMSNorm with Sqrt and Div."""
    b = B(seed, opset=17); D, H, NB, MAXD = 32, 2, 16, 64
    S = b.op("Gather", [b.op("Shape", ["x"]), b.c(np.array(1, np.int64))])
    pos = b.op("Range", [b.c(np.array(0, np.int64)), S, b.c(np.array(1, np.int64))])
    rel = b.op("Sub", [b.op("Unsqueeze", [pos, b.c(np.array([0], np.int64))]), b.op("Unsqueeze", [pos, b.c(np.array([1], np.int64))])])
    n = b.op("Abs", [rel])
    exact = NB // 2
    is_small = b.op("Less", [n, b.c(np.array(exact, np.int64))])
    nf = b.op("Cast", [n], to=T.FLOAT)
    lg = b.op("Div", [b.op("Log", [b.op("Div", [nf, b.c(np.float32(exact))])]), b.c(np.float32(np.log(MAXD / exact)))])
    large = b.op("Cast", [b.op("Mul", [lg, b.c(np.float32(NB - exact))])], to=T.INT64)
    large = b.op("Min", [b.op("Add", [large, b.c(np.array(exact, np.int64))]), b.c(np.array(NB - 1, np.int64))])
    bucket = b.op("Where", [is_small, n, large])
    bias = b.op("Transpose", [b.op("Gather", [b.w(NB, H, scale=2.0), bucket])], perm=[2, 0, 1])  # H,S,S
    def rms(x):
        v = b.op("ReduceMean", [b.op("Pow", [x, b.c(np.float32(2))])], axes=[-1])
        return b.op("Mul", [b.op("Div", [x, b.op("Sqrt", [b.op("Add", [v, b.c(np.float32(1e-6))])])]), b.c(np.ones(D, np.float32))])
    x = b.op("MatMul", ["x", b.w(8, D)])
    def heads(t):
        return b.op("Transpose", [b.op("Reshape", [t, b.c(np.array([0, 0, H, D // H], np.int64))])], perm=[0, 2, 1, 3])
    hn = rms(x)
    q, k, v = (heads(b.op("MatMul", [hn, b.w(D, D)])) for _ in range(3))
    s = b.op("Add", [b.op("MatMul", [q, b.op("Transpose", [k], perm=[0, 1, 3, 2])]), bias])
    a = b.op("MatMul", [b.op("Softmax", [s], axis=-1), v])
    a = b.op("Reshape", [b.op("Transpose", [a], perm=[0, 2, 1, 3]), b.c(np.array([0, 0, D], np.int64))])
    x = b.op("Add", [x, b.op("MatMul", [a, b.w(D, D)])])
    y = b.op("MatMul", [rms(x), b.w(D, 6)])
    return b.model([vi("x", T.FLOAT, ["N", "S", 8])], [vi(y, T.FLOAT, ["N", "S", 6])]), \
        lambda r, n: {"x": r.standard_normal((n, 40, 8)).astype(np.float32)}

def soft_argmax(seed=0):
    """Pose keypoints by soft-argmax: heatmaps (Conv) flattened, Softmax over 1024 positions with
    a temperature of 20, MatMul with the pixel grid -> coordinates in pixels (0..31)."""
    b = B(seed); K = 4
    x = b.op("Relu", [b.conv("x", 3, 16)]); hm = b.conv(x, 16, K)
    f = b.op("Mul", [b.op("Reshape", [hm, b.c(np.array([0, K, 1024], np.int64))]), b.c(np.float32(20.0))])
    p = b.op("Softmax", [f], axis=-1)
    yy, xx = np.meshgrid(np.arange(32), np.arange(32), indexing="ij")
    grid = np.stack([xx.ravel(), yy.ravel()], 1).astype(np.float32)
    y = b.op("MatMul", [p, b.c(grid)])
    return b.model([vi("x", T.FLOAT, ["N", 3, 32, 32])], [vi(y, T.FLOAT, ["N", K, 2])]), \
        lambda r, n: {"x": r.standard_normal((n, 3, 32, 32)).astype(np.float32)}

def hifigan(seed=0):
    """A HiFi-GAN-style vocoder: mel in, ConvTranspose upsampling x4 twice, LeakyRelu 0.1,
    dilated residual Conv1d, Tanh waveform out."""
    b = B(seed)
    def c1(x, ci, co, k, d=1):
        return b.op("Conv", [x, b.w(co, ci, k), b.w(co, scale=0.05)], pads=[d * (k // 2)] * 2, dilations=[d])
    x = c1("mel", 20, 32, 7)
    for ci, co in ((32, 16), (16, 8)):
        x = b.op("ConvTranspose", [b.op("LeakyRelu", [x], alpha=0.1), b.w(ci, co, 8, scale=0.1), b.w(co, scale=0.05)],
                 strides=[4], pads=[2, 2])
        for d in (1, 3):
            x = b.op("Add", [x, c1(b.op("LeakyRelu", [x], alpha=0.1), co, co, 3, d)])
    y = b.op("Tanh", [c1(b.op("LeakyRelu", [x], alpha=0.1), 8, 1, 7)])
    return b.model([vi("mel", T.FLOAT, ["N", 20, 16])], [vi(y, T.FLOAT, None)]), \
        lambda r, n: {"mel": r.normal(-5, 2, (n, 20, 16)).astype(np.float32)}

def selective_scan(seed=0):
    """A Mamba-style selective scan in parallel form: dt = Softplus(x W), log-decays dt * A (A from
    -1 to -16) summed over time by CumSum, decay exp(L_t - L_s) between every two steps (a Sub of
    two running sums), masked causal, times B_s x_s."""
    b = B(seed, opset=17); D, N, Tn = 8, 4, 24
    dt = b.op("Softplus", [b.lin("x", D, N)])                          # B,T,N
    A = -np.linspace(1, 16, N).astype(np.float32)
    L = b.op("CumSum", [b.op("Mul", [dt, b.c(A)]), b.c(np.array(1, np.int64))])  # B,T,N
    Lt = b.op("Transpose", [L], perm=[0, 2, 1])                         # B,N,T
    diff = b.op("Sub", [b.op("Unsqueeze", [Lt, b.c(np.array([3], np.int64))]), b.op("Unsqueeze", [Lt, b.c(np.array([2], np.int64))])])
    mask = np.tril(np.ones((Tn, Tn), np.float32))
    dec = b.op("Mul", [b.op("Exp", [b.op("Min", [diff, b.c(np.float32(0))])]), b.c(mask)])   # B,N,T,T
    u = b.op("Transpose", [b.op("Mul", [b.lin("x", D, N), b.lin("x", D, N)]), ], perm=[0, 2, 1])  # B,N,T
    hs = b.op("MatMul", [dec, b.op("Unsqueeze", [u, b.c(np.array([3], np.int64))])])  # B,N,T,1
    hs = b.op("Transpose", [b.op("Squeeze", [hs, b.c(np.array([3], np.int64))])], perm=[0, 2, 1])  # B,T,N
    y = b.lin(hs, N, D)
    return b.model([vi("x", T.FLOAT, ["N", Tn, D])], [vi(y, T.FLOAT, ["N", Tn, D])]), \
        lambda r, n: {"x": r.standard_normal((n, Tn, D)).astype(np.float32)}

def recon_error(seed=0):
    """An anomaly detector: an autoencoder's reconstruction and the per-sample mean squared error
    between input and reconstruction (close to each other) as the score output."""
    b = B(seed); D = 32
    W = b.rng.standard_normal((D, 8)).astype(np.float32) / np.sqrt(D)
    Q, _ = np.linalg.qr(W)
    z = b.op("MatMul", ["x", b.c(Q.astype(np.float32))])
    rec = b.op("MatMul", [z, b.c(Q.T.astype(np.float32).copy())])
    err = b.op("ReduceMean", [b.op("Pow", [b.op("Sub", ["x", rec]), b.c(np.float32(2))]), b.c(np.array([1], np.int64))], keepdims=0)
    def f(r, n):
        lat = r.standard_normal((n, 8)).astype(np.float32)
        return {"x": (lat @ Q.T + 0.05 * r.standard_normal((n, D))).astype(np.float32)}
    return b.model([vi("x", T.FLOAT, ["N", D])], [vi(err, T.FLOAT, ["N"]), vi(rec, T.FLOAT, ["N", D])]), f

def opset23_ops(seed=0):
    """A recent exporter's opset-23 ops: RMSNormalization, RotaryEmbedding and Attention."""
    b = B(seed, opset=23); D, H, hd, S = 32, 2, 16, 8
    x = b.op("MatMul", ["x", b.w(8, D)])
    hn = b.op("RMSNormalization", [x, b.c(np.ones(D, np.float32))], axis=-1)
    def heads(t):
        return b.op("Transpose", [b.op("Reshape", [t, b.c(np.array([0, 0, H, hd], np.int64))])], perm=[0, 2, 1, 3])
    q, k, v = (heads(b.op("MatMul", [hn, b.w(D, D)])) for _ in range(3))
    ang = np.arange(S)[:, None] * (1.0 / 10000 ** (np.arange(hd // 2) / (hd // 2)))[None]
    cos, sin = b.c(np.cos(ang).astype(np.float32)), b.c(np.sin(ang).astype(np.float32))
    pid = b.c(np.arange(S, dtype=np.int64)[None].repeat(1, 0))
    q = b.op("RotaryEmbedding", [q, cos, sin, "pos"])
    k = b.op("RotaryEmbedding", [k, cos, sin, "pos"])
    a = b.op("Attention", [q, k, v], is_causal=1)
    a = b.op("Reshape", [b.op("Transpose", [a], perm=[0, 2, 1, 3]), b.c(np.array([0, 0, D], np.int64))])
    x = b.op("Add", [x, b.op("MatMul", [a, b.w(D, D)])])
    y = b.op("MatMul", [b.op("RMSNormalization", [x, b.c(np.ones(D, np.float32))], axis=-1), b.w(D, 6)])
    return b.model([vi("x", T.FLOAT, ["N", S, 8]), vi("pos", T.INT64, ["N", S])], [vi(y, T.FLOAT, ["N", S, 6])]), \
        lambda r, n: {"x": r.standard_normal((n, S, 8)).astype(np.float32),
                      "pos": np.tile(np.arange(S, dtype=np.int64), (n, 1))}

def int_weight_cast(seed=0):
    """Weight-only compressed export: int8 weights stored as int8 initializers, Cast to float and
    multiplied by a per-column scale before each MatMul."""
    b = B(seed)
    def lin(x, di, do):
        w = b.rng.standard_normal((di, do)) / np.sqrt(di)
        s = (np.abs(w).max(0) / 127).astype(np.float32)
        q = np.round(w / s).astype(np.int8)
        wf = b.op("Mul", [b.op("Cast", [b.c(q)], to=T.FLOAT), b.c(s)])
        return b.op("Add", [b.op("MatMul", [x, wf]), b.w(do, scale=0.05)])
    y = lin(b.op("Relu", [lin("x", 16, 64)]), 64, 10)
    return b.model([vi("x", T.FLOAT, ["N", 16])], [vi(y, T.FLOAT, ["N", 10])]), \
        lambda r, n: {"x": r.standard_normal((n, 16)).astype(np.float32)}


def empty_boxes(seed=0):
    """A two-stage head on the boxes a score threshold keeps: NonZero of scores > 0.9 (zero
    boxes in some samples), Gather of their features, an MLP on the kept rows, ReduceMax of its
    logits over the boxes (an empty tensor in between)."""
    b = B(seed); D = 16
    feat = b.op("Relu", [b.lin("x", 8, D)])                       # [K, D] boxes' features
    score = b.op("Sigmoid", [b.op("Squeeze", [b.lin(feat, D, 1), b.c(np.array([1], np.int64))])])  # [K]
    idx = b.op("Squeeze", [b.op("NonZero", [b.op("Greater", [score, b.c(np.float32(0.9))])]), b.c(np.array([0], np.int64))])
    kept = b.op("Gather", [feat, idx], axis=0)                   # [k, D], k may be 0
    lg = b.lin(b.op("Relu", [b.lin(kept, D, D)]), D, 4)
    y = b.op("ReduceSum", [lg, b.c(np.array([0], np.int64))], keepdims=0)
    return b.model([vi("x", T.FLOAT, ["K", 8])], [vi(y, T.FLOAT, [4]), vi(score, T.FLOAT, ["K"])]), \
        lambda r, n: {"x": (r.standard_normal((6, 8)) + (2.0 if r.random() < 0.5 else -2.0)).astype(np.float32)}

def fp16_keep_io(seed=0):
    """A model converted to float16 with keep_io_types: float32 input Cast to float16, Conv /
    Relu / Gemm in float16, Softmax kept float32 between Casts, float32 output."""
    b = B(seed, opset=17)
    def w16(*shape, scale=None):
        fan = int(np.prod(shape[1:])) if len(shape) > 1 else shape[0]
        arr = (b.rng.standard_normal(shape) * (scale or 1 / np.sqrt(fan))).astype(np.float16)
        return b.c(arr)
    x = b.op("Cast", ["x"], to=T.FLOAT16)
    x = b.op("Relu", [b.op("Conv", [x, w16(16, 3, 3, 3), w16(16, scale=0.05)], pads=[1] * 4)])
    x = b.op("Relu", [b.op("Conv", [x, w16(16, 16, 3, 3), w16(16, scale=0.05)], pads=[1] * 4, strides=[2, 2])])
    x = b.op("Flatten", [b.op("GlobalAveragePool", [x])])
    lg = b.op("Gemm", [x, w16(10, 16), w16(10, scale=0.05)], transB=1)
    p = b.op("Softmax", [b.op("Cast", [lg], to=T.FLOAT)], axis=-1)
    return b.model([vi("x", T.FLOAT, ["N", 3, 16, 16])], [vi(p, T.FLOAT, ["N", 10])]), \
        lambda r, n: {"x": r.standard_normal((n, 3, 16, 16)).astype(np.float32)}

def embed_layernorm(seed=0):
    """BERT's embeddings as onnxruntime's transformer optimizer fuses them: com.microsoft
    EmbedLayerNormalization (word, position and segment tables, LayerNorm, mask_index), then
    Attention with the mask_index and a classifier."""
    b = B(seed, opset=17); D, V, S = 32, 60, 8
    emb, mi = _msop(b, "EmbedLayerNormalization", ["ids", "seg", b.w(V, D, scale=0.5), b.w(S, D, scale=0.1),
                                                   b.w(2, D, scale=0.1), b.c(np.ones(D, np.float32)),
                                                   b.c(np.zeros(D, np.float32)), "mask"], n_out=2, epsilon=1e-12)
    a = _msop(b, "Attention", [emb, b.w(D, 3 * D), b.w(3 * D, scale=0.05), mi], num_heads=2)
    y = _msop(b, "SkipLayerNormalization", [b.op("MatMul", [a, b.w(D, D)]), emb, b.c(np.ones(D, np.float32)),
                                            b.c(np.zeros(D, np.float32))], epsilon=1e-12)
    cls = b.op("Gather", [y, b.c(np.array(0, np.int64))], axis=1)
    lg = b.op("Gemm", [cls, b.w(3, D), b.w(3, scale=0.05)], transB=1)
    def f(r, n):
        L = r.integers(3, S + 1, (n, 1))
        return {"ids": r.integers(0, V, (n, S)).astype(np.int32), "seg": np.zeros((n, S), np.int32),
                "mask": (np.arange(S)[None] < L).astype(np.int32)}
    return _ms(b, [vi("ids", T.INT32, ["N", S]), vi("seg", T.INT32, ["N", S]), vi("mask", T.INT32, ["N", S])],
               [vi(lg, T.FLOAT, ["N", 3])]), f


def ort_gpt2_past(seed=0):
    """A GPT-2 block as onnxruntime's transformer optimizer writes it: com.microsoft Attention
    with a causal flag, a stacked past input and present output (a decoder step with a KV
    cache, past length 0 in some feeds), FastGelu MLP, SkipLayerNormalization."""
    b = B(seed, opset=17); D, H = 32, 2
    x = b.op("LayerNormalization", ["x", b.c(np.ones(D, np.float32)), b.c(np.zeros(D, np.float32))], axis=-1)
    b.k += 1
    a = f"attention_{b.k}_0"
    b.nodes.append(h.make_node("Attention", [x, b.w(D, 3 * D), b.w(3 * D, scale=0.05), "", "past"], [a, "present"],
                               name=f"Attention_{b.k}", domain="com.microsoft", num_heads=H, unidirectional=1))
    y = _msop(b, "SkipLayerNormalization", [b.op("MatMul", [a, b.w(D, D)]), "x", b.c(np.ones(D, np.float32)),
                                            b.c(np.zeros(D, np.float32)), b.w(D, scale=0.05)], epsilon=1e-5)
    f = _msop(b, "FastGelu", [b.op("MatMul", [y, b.w(D, 4 * D)]), b.w(4 * D, scale=0.05)])
    z = b.op("Add", [b.op("MatMul", [f, b.w(4 * D, D)]), y])
    lg = b.op("MatMul", [z, b.w(D, 50)])
    m = _ms(b, [vi("x", T.FLOAT, ["N", "S", D]), vi("past", T.FLOAT, [2, "N", H, "P", D // H])],
            [vi(lg, T.FLOAT, ["N", "S", 50]), vi("present", T.FLOAT, [2, "N", H, "T", D // H])])
    def f_(r, n):
        P = int(r.integers(0, 6)); S = 1 if P else int(r.integers(2, 6))
        return {"x": r.standard_normal((n, S, D)).astype(np.float32),
                "past": r.standard_normal((2, n, H, P, D // H)).astype(np.float32)}
    return m, f_


def competing_logits(seed=0):
    """An ImageNet-style head: 1000 classes, two of them close at the top of each sample
    (dog breeds), the rest near 0; the logits are the output."""
    b = B(seed)
    F_, K = 64, 1000
    w1 = (np.eye(F_) * 3.0 + b.rng.standard_normal((F_, F_)) * 0.02).astype(np.float32)
    w2 = (b.rng.standard_normal((F_, K)) * 0.08).astype(np.float32)
    w2[np.arange(F_), np.arange(F_)] += 3.0
    lg = b.op("Gemm", [b.op("Relu", [b.op("MatMul", ["x", b.c(w1)])]), b.c(w2)])
    def f_(r, n):
        x = np.abs(r.standard_normal((n, F_))).astype(np.float32) * 0.1
        for row in x:
            top = r.choice(F_, size=2, replace=False)
            row[top[0]] = r.uniform(0.78, 0.955)
            row[top[1]] = row[top[0]] - r.uniform(0.0, 0.045)
        return {"x": x}
    return b.model([vi("x", T.FLOAT, ["N", F_])], [vi(lg, T.FLOAT, ["N", K])]), f_


def clip_zeroshot(seed=0):
    """A zero-shot classifier: an image embedding L2-normalized (ReduceL2, Div), cosine against
    200 constant normalized class embeddings, times CLIP's logit scale 100."""
    b = B(seed)
    E, K = 64, 200
    x = b.op("Relu", [b.conv("image", 3, 16, stride=2)])
    x = b.op("Flatten", [b.op("GlobalAveragePool", [b.conv(x, 16, 32)])])
    x = b.op("Gemm", [x, b.w(E, 32), b.w(E, scale=0.05)], transB=1)
    xi = b.op("Div", [x, b.op("ReduceL2", [x, b.c(np.array([1], np.int64))], keepdims=1)])
    t = b.rng.standard_normal((K, E)) + 2.0 * b.rng.standard_normal((1, E))  # classes share a direction
    t = (t / np.linalg.norm(t, axis=1, keepdims=True)).T.astype(np.float32)
    lg = b.op("Mul", [b.op("MatMul", [xi, b.c(t)]), b.c(np.float32(100.0))])
    return b.model([vi("image", T.FLOAT, ["N", 3, 16, 16])], [vi(lg, T.FLOAT, ["N", K])]), \
        lambda r, n: {"image": r.standard_normal((n, 3, 16, 16)).astype(np.float32)}


def paddle_biases(seed=0):
    """paddle2onnx's idioms: a Conv and a ConvTranspose without bias input, each followed by
    an Add of a (1, C, 1, 1) bias, then BatchNormalization (a DBNet-style upsampling head)."""
    b = B(seed)
    bn = b.bn
    x = b.op("Conv", ["x", b.w(8, 3, 3, 3)], pads=[1] * 4)
    x = b.op("Relu", [bn(b.op("Add", [x, b.w(1, 8, 1, 1, scale=0.3)]), 8)])
    u = b.op("ConvTranspose", [x, b.w(8, 4, 2, 2)], strides=[2, 2])
    u = b.op("Relu", [bn(b.op("Add", [u, b.w(1, 4, 1, 1, scale=0.3)]), 4)])
    y = b.op("Sigmoid", [b.op("Conv", [u, b.w(1, 4, 3, 3), b.w(1, scale=0.1)], pads=[1] * 4)])
    return b.model([vi("x", T.FLOAT, ["N", 3, 16, 16])], [vi(y, T.FLOAT, ["N", 1, 32, 32])]), \
        lambda r, n: {"x": r.standard_normal((n, 3, 16, 16)).astype(np.float32)}


def linear_bn1d(seed=0):
    """A tabular MLP as PyTorch writes it: Gemm -> BatchNorm1d -> Relu, twice, with an
    Identity passing one BatchNorm's bias as another's mean (the exporter's deduplication of
    equal parameters)."""
    b = B(seed)
    def bn(t, c, mean=None):
        return b.op("BatchNormalization", [t, b.c(b.rng.uniform(0.5, 2, c).astype(np.float32)),
                                          bias := b.c(b.rng.normal(0, 0.3, c).astype(np.float32)),
                                          mean or b.c(b.rng.normal(0, 0.5, c).astype(np.float32)),
                                          b.c(b.rng.uniform(0.3, 2, c).astype(np.float32))]), bias
    h1, bias1 = bn(b.op("Gemm", ["x", b.w(32, 12), b.w(32, scale=0.1)], transB=1), 32)
    h2 = b.op("Gemm", [b.op("Relu", [h1]), b.w(32, 32), b.w(32, scale=0.1)], transB=1)
    h2, _ = bn(h2, 32, mean=b.op("Identity", [bias1]))
    y = b.op("Gemm", [b.op("Relu", [h2]), b.w(3, 32), b.w(3, scale=0.1)], transB=1)
    return b.model([vi("x", T.FLOAT, ["N", 12])], [vi(y, T.FLOAT, ["N", 3])]), \
        lambda r, n: {"x": (r.standard_normal((n, 12)) * 2).astype(np.float32)}


def lcnet_written(seed=0):
    """A PP-LCNetV3 stage as paddle2onnx writes it: Conv -> BatchNorm -> learnable affine block
    (Mul and Add of scalars) -> HardSwish written out as x * relu6(x + 3) / 6, a depthwise
    Conv the same way, a squeeze-and-excitation gate written as relu6(x + 3) / 6, and a head."""
    b = B(seed)
    bn = b.bn

    def lab_hswish(t):
        t = b.op("Add", [b.op("Mul", [b.c(np.float32(b.rng.uniform(0.5, 1.5))), t]),
                         b.c(np.float32(b.rng.normal(0, 0.2)))])
        r6 = b.op("Clip", [b.op("Add", [t, b.c(np.float32(3.0))]), b.c(np.float32(0.0)), b.c(np.float32(6.0))])
        return b.op("Div", [b.op("Mul", [t, r6]), b.c(np.float32(6.0))])

    h = lab_hswish(bn(b.op("Conv", ["x", b.w(16, 3, 3, 3)], pads=[1] * 4, strides=[2, 2]), 16))
    h = lab_hswish(bn(b.op("Conv", [h, b.w(16, 1, 3, 3)], pads=[1] * 4, group=16), 16))
    s = b.op("Relu", [b.conv(b.op("GlobalAveragePool", [h]), 16, 4, k=1)])
    s = b.conv(s, 4, 16, k=1)
    gate = b.op("Div", [b.op("Clip", [b.op("Add", [s, b.c(np.float32(3.0))]), b.c(np.float32(0.0)),
                                       b.c(np.float32(6.0))]), b.c(np.float32(6.0))])
    h = lab_hswish(bn(b.op("Conv", [b.op("Mul", [h, gate]), b.w(32, 16, 1, 1)]), 32))
    y = b.op("Gemm", [b.op("Flatten", [b.op("GlobalAveragePool", [h])]), b.w(10, 32), b.w(10, scale=0.1)], transB=1)
    return b.model([vi("x", T.FLOAT, ["N", 3, 16, 16])], [vi(y, T.FLOAT, ["N", 10])]), \
        lambda r, n: {"x": r.standard_normal((n, 3, 16, 16)).astype(np.float32)}


def mish_written(seed=0):
    """A YOLOv4-style CSP block exported before opset 18: Conv -> BatchNorm -> Mish written out
    as x * tanh(softplus(x)) (Softplus in one branch, tf2onnx's Log(Exp(x) + 1) in the other),
    the two branches concatenated and fused by a 1x1 Conv."""
    b = B(seed, opset=17)

    def mish(t, log_exp):
        sp = b.op("Log", [b.op("Add", [b.op("Exp", [t]), b.c(np.float32(1.0))])]) if log_exp \
            else b.op("Softplus", [t])
        return b.op("Mul", [t, b.op("Tanh", [sp])])

    h = mish(b.bn(b.op("Conv", ["x", b.w(16, 3, 3, 3)], pads=[1] * 4), 16), False)
    left = mish(b.bn(b.op("Conv", [h, b.w(8, 16, 1, 1)]), 8), False)
    right = mish(b.bn(b.op("Conv", [h, b.w(8, 16, 3, 3)], pads=[1] * 4), 8), True)
    y = b.op("Conv", [b.op("Concat", [left, right], axis=1), b.w(6, 16, 1, 1), b.w(6, scale=0.05)])
    return b.model([vi("x", T.FLOAT, ["N", 3, 12, 12])], [vi(y, T.FLOAT, ["N", 6, 12, 12])]), \
        lambda r, n: {"x": r.standard_normal((n, 3, 12, 12)).astype(np.float32)}


def groupnorm_written(seed=0):
    """A diffusion-UNet-style residual block as torch's TorchScript exporter writes nn.GroupNorm
    (Reshape to (N, G, -1), InstanceNormalization with scale 1 and bias 0, Reshape back by
    Shape(x), Mul by gamma, Add beta; trained-looking gamma and beta), SiLU written out."""
    b = B(seed, opset=17)

    def group_norm(t, c, groups):
        r = b.op("Reshape", [t, b.c(np.array([0, groups, -1], np.int64))])
        n = b.op("InstanceNormalization", [r, b.c(np.ones(groups, np.float32)), b.c(np.zeros(groups, np.float32))],
                 epsilon=1e-5)
        y = b.op("Reshape", [n, b.op("Shape", [t])])
        gamma = b.c(b.rng.uniform(0.5, 2, (c, 1, 1)).astype(np.float32))
        return b.op("Add", [b.op("Mul", [y, gamma]), b.c(b.rng.normal(0, 0.5, (c, 1, 1)).astype(np.float32))])

    h = b.conv("x", 3, 16)
    r = b.conv(b.silu(group_norm(h, 16, 4)), 16, 16)
    r = b.conv(b.silu(group_norm(r, 16, 4)), 16, 16)
    y = b.conv(b.op("Add", [h, r]), 16, 6, k=1)
    return b.model([vi("x", T.FLOAT, ["N", 3, 12, 12])], [vi(y, T.FLOAT, ["N", 6, 12, 12])]), \
        lambda r, n: {"x": r.standard_normal((n, 3, 12, 12)).astype(np.float32)}


def _declare_outputs(m: onnx.ModelProto, gen: Feeds) -> onnx.ModelProto:
    """Declare the rank of outputs inference leaves shapeless (from one onnxruntime run), with
    symbolic dims: the sweep is about presets, not about undeclared outputs."""
    if all(o.type.tensor_type.HasField("shape") for o in m.graph.output if o.type.HasField("tensor_type")):
        return m
    import onnxruntime as ort

    outs = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, gen(np.random.default_rng(0), 2))
    for o, v in zip(m.graph.output, outs):
        if o.type.HasField("tensor_type") and not o.type.tensor_type.HasField("shape"):
            for i in range(v.ndim):
                o.type.tensor_type.shape.dim.add().dim_param = f"{o.name}_d{i}"
    onnx.checker.check_model(m)
    return m


MODELS: dict[str, Callable[..., tuple[onnx.ModelProto, Feeds]]] = {
    f.__name__: f for f in (unet_time, kv_decoder, superres, segment, dlrm, clip_dual, moe, decomposed_ln, gan,
                            float64_island, rope_runtime, fpn_outputs, exp_decode, gru_state, odd_linear, pruned,
                            legacy_ops, offset_output, tabular_raw, vit,
                            # the fourth round
                            causal_inf, nms_head, int_outputs, native_rnn, control_flow, fp16_model, conformer,
                            ctc_logprobs, style_transfer, passthrough, pointnet, activations_zoo, einsum_attn, running_sum,
                            alibi_attn, temperature, flow_warp, llama_block, tied_embedding, stft_logmel, roi_align, sigmoid_boxes,
                            # the fifth round
                            sklearn_pipe, zipmap_out, vae_sampling, sequences, scan_rnn, mask_logic, tree_model,
                            # the sixth round
                            segnet_unpool, alexnet_lrn, video3d, convt_shapes, onehot_jax, hardmax_out, resize_cubic, tf_pads, opset7_ir3,
                            # the seventh round
                            tiny_units, nan_impute, ml_imputer, lp_embed, gnn_scatter, reduce_zoo, qdq_input,
                            hash_embed, softmax_legacy, depth_recip, inf_clamp, attn_pool,
                            # the eighth round
                            conv_imbalance, uint8_image, bool_threshold, variable_shapes, unused_input, ensemble_mean,
                            nan_float_output, softplus_zoo, runtime_resize, act_gating, resid_growth, dw_imbalance,
                            # the ninth round
                            mlp_imbalance, vq_codebook, cosine_written, gaussian_nll, revin_forecast, nerf_encoding,
                            pcm_audio,
                            # the tenth round
                            se_block, wavenet, resnext_group, length_mask, capsule_squash, bn_after_add,
                            grouped_imbalance,
                            # the eleventh round
                            ort_fused_bert, ort_fused_cnn, convnext_block, t5_relbias, soft_argmax, hifigan,
                            selective_scan, recon_error, opset23_ops, int_weight_cast,
                            # the twelfth round
                            empty_boxes, fp16_keep_io, embed_layernorm, ort_gpt2_past,
                            # the thirteenth round
                            competing_logits, clip_zeroshot, paddle_biases, linear_bn1d,
                            # the fourteenth round
                            lcnet_written, mish_written,
                            # the fifteenth round
                            groupnorm_written)}
MODELS.update(torch_builders())  # the thirteenth round too: PyTorch modules as torch.onnx exports them


def _sqnr(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64), b.astype(np.float64)
    if a.shape != b.shape:
        return float("nan")
    err = float(np.sum((a - b) ** 2))
    return math.inf if err == 0 else 10 * math.log10(max(float(np.sum(a * a)), 1e-30) / err)


def run(name: str, presets: list[str]) -> list[dict]:
    """One model through `presets`: a row per preset (fresh SQNR, agreement, guard verdict)."""

    import mixq

    m, gen = MODELS[name]()
    m = _declare_outputs(m, gen)
    r = np.random.default_rng(1)
    calib = [gen(r, 4) for _ in range(16)]
    r = np.random.default_rng(7)
    fresh = [gen(r, 4) for _ in range(8)]
    from mixq.evaluate import make_session  # random ops seeded alike: both models draw the same values

    fs = make_session(m, optimize=True)
    ref = [fs.run(None, f) for f in fresh]
    rows = []
    for preset in presets:
        try:
            res = mixq.quantize(m, preset, calib, check_kernels=False)
        except Exception as exc:  # noqa: BLE001 - a sweep reports and goes on
            rows.append({"model": name, "preset": preset, "error": f"{type(exc).__name__}: {str(exc)[:160]}"})
            continue
        qs = make_session(res.model, optimize=True)
        got = [qs.run(None, f) for f in fresh]
        sqnr, var_sqnr, agree = math.inf, math.inf, None
        for j, o in enumerate(fs.get_outputs()):
            if not isinstance(ref[0][j], np.ndarray) or ref[0][j].dtype.kind != "f":
                continue  # integers, strings, sequences and maps: the guard's own business
            sqnr = min(sqnr, float(np.mean([_sqnr(ref[i][j], got[i][j]) for i in range(len(fresh))])))
            if len({ref[i][j].shape for i in range(len(fresh))}) == 1:  # each element's spread over samples
                rr = np.concatenate([ref[i][j] for i in range(len(fresh))]).astype(np.float64)
                qq = np.concatenate([got[i][j] for i in range(len(fresh))]).astype(np.float64)
                var_sqnr = min(var_sqnr, _sqnr(rr - rr.mean(0), qq - rr.mean(0)))
            if ref[0][j].ndim in (2, 4) and ref[0][j].shape[1] > 1:
                ax = 1 if ref[0][j].ndim == 4 else -1
                a = float(np.mean([np.mean(ref[i][j].argmax(ax) == got[i][j].argmax(ax)) for i in range(len(fresh))]))
                agree = a if agree is None else min(agree, a)
        fid = res.fidelity
        warns = (fid.likely_loss is not None or bool(getattr(fid, "offset_losses", []))  # older mixq: none
                 or any(w.startswith("WARNING") for w in res.warnings))
        verdict = "broken" if fid.broken else "warns" if warns else "quiet"
        rows.append({"model": name, "preset": preset, "sqnr": sqnr, "var_sqnr": var_sqnr, "agree": agree,
                     "verdict": verdict, "kept": len(res.numerics),
                     "missed": min(sqnr, var_sqnr) < 10.0 and verdict == "quiet"})
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--presets", default=",".join(PRESETS))
    args = ap.parse_args(argv)
    os.environ.setdefault("MIXQ_QUIET", "1")
    unknown = [n for n in args.models.split(",") if n not in MODELS]
    if unknown:
        ap.error(f"unknown model(s) {', '.join(unknown)}; choose from {', '.join(MODELS)}")
    print("| model | preset | fresh SQNR dB (lowest output) | on the variation across samples | argmax agreement "
          "| guard | tensors kept float |")
    print("|---|---|---|---|---|---|---|")
    rows: list[dict] = []
    for name in args.models.split(","):
        for row in run(name, args.presets.split(",")):
            rows.append(row)
            if "error" in row:
                print(f"| {name} | {row['preset']} | error: {row['error']} | | | | |", flush=True)
                continue
            agree = "" if row["agree"] is None else f"{100 * row['agree']:.1f} %"
            print(f"| {name} | {row['preset']} | {row['sqnr']:.1f} | {row['var_sqnr']:.1f} | {agree} | {row['verdict']}"
                  f"{' **missed**' if row['missed'] else ''} | {row['kept']} |", flush=True)
    errors = sum("error" in r for r in rows)
    missed = sum(r.get("missed", False) for r in rows)
    print(f"\n{len(rows)} runs: {errors} raised, {missed} under 10 dB on fresh feeds (or on their variation) "
          "with the guard quiet")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
