"""A Llama-style decoder block as exporters write it, quantized with every preset asked and with
onnxruntime's `quantize_static`: output SQNR and per-token top-1 agreement against float.

The graph (random weights, seeded): a token Gather from a 128 x 64 embedding with one channel 8x
the others (a "massive activation"), per layer RMSNorm written out (Pow, ReduceMean, Add, Sqrt,
Reciprocal or Div, Mul), q/k/v projections, rotary embeddings with the rotate-half pattern
(Slice, Neg, Concat, Mul, Add), a causal mask of finfo(float32).min added before the Softmax,
SwiGLU as x * Sigmoid(x) * up, residual Adds, a final RMSNorm and the vocabulary projection.
Calibration on 16 sequences of 16 tokens, scored on 8 others (docs/ROBUSTNESS.md, round 19).

    python bench/decoder_block.py [--presets XINT8,A8W8,...] [--layers 2] [--rms recip|div] [--no-ort]
    python bench/decoder_block.py --save DIR    # DIR/decoder.onnx and DIR/ids.npz (32 sequences), e.g.
    mixq auto DIR/decoder.onnx out.onnx --calib DIR/ids.npz --l2-target 0.1
"""
from __future__ import annotations

import argparse
import os
import tempfile
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

import mixq

PRESETS = ("XINT8", "A8W8", "U8S8", "A16W8", "BF16", "FP16", "BFP16", "MXINT8", "MXFP8_E4M3", "MX9")


def build(seed: int = 0, vocab: int = 128, dim: int = 64, heads: int = 4, seq: int = 16, layers: int = 2,
          ffn: int = 172, rms: str = "recip") -> onnx.ModelProto:
    """The decoder (opset 18), input `ids` (1, seq) int64, output `logits` (1, seq, vocab)."""
    rng = np.random.default_rng(seed)
    inits: list[onnx.TensorProto] = []
    nodes: list[onnx.NodeProto] = []

    def const(name: str, value: Any) -> str:
        inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def node(op: str, inputs: list[str], **attrs: Any) -> str:
        out = f"{op}_{len(nodes)}"
        nodes.append(helper.make_node(op, inputs, [out], name=out, **attrs))
        return out

    hd = dim // heads
    emb = rng.normal(0, 1.0, (vocab, dim)).astype(np.float32)
    emb[:, 3] *= 8.0
    const("emb", emb)
    const("two", np.float32(2.0))
    const("eps", np.float32(1e-6))
    const("ax_last", np.array([-1], np.int64))
    freq = 1.0 / (10000 ** (np.arange(0, hd, 2) / hd))
    angle = np.concatenate([np.arange(seq)[:, None] * freq[None]] * 2, -1)
    const("cos", np.cos(angle).astype(np.float32)[None, None])
    const("sin", np.sin(angle).astype(np.float32)[None, None])
    const("mask", np.triu(np.full((seq, seq), np.finfo(np.float32).min, np.float32), 1)[None, None])
    const("to_heads", np.array([1, seq, heads, hd], np.int64))
    const("to_model", np.array([1, seq, dim], np.int64))
    for name, v in (("s0", 0), ("s_half", hd // 2), ("s_end", hd), ("ax3", 3)):
        const(name, np.array([v], np.int64))
    const("scale", np.float32(1 / np.sqrt(hd)))

    def rmsnorm(x: str, tag: str) -> str:
        w = const(f"rms_{tag}", (1 + rng.normal(0, 0.1, dim)).astype(np.float32))
        mean = node("ReduceMean", [node("Pow", [x, "two"]), "ax_last"], keepdims=1)
        root = node("Sqrt", [node("Add", [mean, "eps"])])
        y = node("Mul", [x, node("Reciprocal", [root])]) if rms == "recip" else node("Div", [x, root])
        return node("Mul", [y, w])

    def linear(x: str, tag: str, k: int, n: int) -> str:
        return node("MatMul", [x, const(f"w_{tag}", rng.normal(0, 1 / np.sqrt(k), (k, n)).astype(np.float32))])

    def rope(x: str) -> str:
        lo, hi = node("Slice", [x, "s0", "s_half", "ax3"]), node("Slice", [x, "s_half", "s_end", "ax3"])
        rotated = node("Concat", [node("Neg", [hi]), lo], axis=-1)
        return node("Add", [node("Mul", [x, "cos"]), node("Mul", [rotated, "sin"])])

    x = node("Gather", ["emb", "ids"], axis=0)
    for i in range(layers):
        h = rmsnorm(x, f"attn{i}")
        q, k, v = (node("Transpose", [node("Reshape", [linear(h, f"{p}{i}", dim, dim), "to_heads"])],
                        perm=[0, 2, 1, 3]) for p in "qkv")
        scores = node("Add", [node("Mul", [node("MatMul", [rope(q), node("Transpose", [rope(k)], perm=[0, 1, 3, 2])]),
                                           "scale"]), "mask"])
        attn = node("MatMul", [node("Softmax", [scores], axis=-1), v])
        merged = node("Reshape", [node("Transpose", [attn], perm=[0, 2, 1, 3]), "to_model"])
        x = node("Add", [x, linear(merged, f"o{i}", dim, dim)])
        h = rmsnorm(x, f"mlp{i}")
        gate, up = linear(h, f"gate{i}", dim, ffn), linear(h, f"up{i}", dim, ffn)
        act = node("Mul", [node("Mul", [gate, node("Sigmoid", [gate])]), up])
        x = node("Add", [x, linear(act, f"down{i}", ffn, dim)])
    nodes.append(helper.make_node("MatMul", [rmsnorm(x, "final"), const(
        "lm_head", rng.normal(0, 1 / np.sqrt(dim), (dim, vocab)).astype(np.float32))], ["logits"], name="lm_head"))
    g = helper.make_graph(nodes, "decoder", [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, seq])],
                          [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, seq, vocab])], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)
    onnx.checker.check_model(model, full_check=True)
    return model


def feeds(n: int, seed: int, seq: int = 16, vocab: int = 128) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"ids": rng.integers(0, vocab, (1, seq)).astype(np.int64)} for _ in range(n)]


def score(refs: list[np.ndarray], session: ort.InferenceSession, test: list[dict[str, np.ndarray]]) -> tuple[float, float]:
    """(output SQNR dB, per-token top-1 agreement %) of `session` against float's `refs`."""
    got = [session.run(None, f)[0] for f in test]
    noise = sum(float(((r - g) ** 2).sum()) for r, g in zip(refs, got))
    sqnr = 10 * np.log10(sum(float((r ** 2).sum()) for r in refs) / noise) if noise else float("inf")
    return sqnr, 100 * float(np.mean([np.mean(r.argmax(-1) == g.argmax(-1)) for r, g in zip(refs, got)]))


def _ort_rows(model: onnx.ModelProto, calib: list[dict[str, np.ndarray]], test: list[dict[str, np.ndarray]],
              refs: list[np.ndarray]) -> list[str]:
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.items = iter(calib)

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.items, None)

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        src, dst = os.path.join(tmp, "float.onnx"), os.path.join(tmp, "q.onnx")
        onnx.save(model, src)
        for label, act in (("int8", QuantType.QInt8), ("U8S8", QuantType.QUInt8), ("int16 activations", QuantType.QInt16)):
            quantize_static(src, dst, Reader(), quant_format=QuantFormat.QDQ, activation_type=act,
                            weight_type=QuantType.QInt8, per_channel=True,
                            extra_options={"ActivationSymmetric": act != QuantType.QUInt8})
            sqnr, top1 = score(refs, ort.InferenceSession(dst), test)
            rows.append(f"| onnxruntime quantize_static, {label} | {sqnr:.1f} dB, {top1:.1f} % | - |")
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--presets", default=",".join(PRESETS))
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--rms", choices=("recip", "div"), default="recip")
    ap.add_argument("--no-ort", action="store_true", help="skip onnxruntime's quantize_static rows")
    ap.add_argument("--save", metavar="DIR", help="write the model and 32 token sequences there, and stop")
    args = ap.parse_args(argv)
    model = build(layers=args.layers, rms=args.rms)
    if args.save:
        os.makedirs(args.save, exist_ok=True)
        onnx.save(model, os.path.join(args.save, "decoder.onnx"))
        np.savez(os.path.join(args.save, "ids.npz"), ids=np.concatenate([f["ids"] for f in feeds(32, seed=1)]))
        print(f"wrote {args.save}/decoder.onnx and {args.save}/ids.npz")
        return 0
    calib, test = feeds(16, seed=1), feeds(8, seed=7)
    fs = ort.InferenceSession(model.SerializeToString())
    refs = [fs.run(None, f)[0] for f in test]
    print("| preset | SQNR, top-1 | guard |\n|---|---|---|")
    for preset in args.presets.split(","):
        res = mixq.quantize(model, preset, calib)
        sqnr, top1 = score(refs, ort.InferenceSession(res.model.SerializeToString()), test)
        guard = "warns" if any("WARNING" in line for line in res.summary().splitlines()) else "quiet"
        print(f"| {preset} | {sqnr:.1f} dB, {top1:.1f} % | {guard} |")
    if not args.no_ort:
        print("\n".join(_ort_rows(model, calib, test, refs)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
