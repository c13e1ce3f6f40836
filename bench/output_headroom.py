"""What `output_headroom` buys and costs on 8-bit grids: the graph output's range widened past the
calibrated extremes, scored on samples the calibration never saw (docs/ACCURACY.md section 8).

Four seeded models, each calibrated on a small set and scored against float on fresh samples of
the same distribution:

- the decoder block of `bench/decoder_block.py` (logits; 16 calibration, 64 fresh sequences);
- an LSTM over 12 steps of 8 features with a linear head on its last state (16 calibration
  batches of 1, 64 fresh);
- a two-layer MLP regressor (16 calibration rows, 1024 fresh);
- a linear classifier of near ties (the setup of the guard's likely-loss test: top-two leads
  U(0, 0.06) on N(0, 1) scores; 256 calibration rows, 4000 fresh): the cost side, where the
  wider step flips close calls.

    python bench/output_headroom.py [--presets A8W8,U8S8] [--headrooms auto,1.25,1.5]
"""
from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import mixq  # noqa: E402
from bench import decoder_block  # noqa: E402
from mixq.config import get_default_config  # noqa: E402

Feeds = list[dict[str, np.ndarray]]


def _model(nodes: list[onnx.NodeProto], inputs: list[onnx.ValueInfoProto], output: str,
           inits: dict[str, np.ndarray]) -> onnx.ModelProto:
    g = helper.make_graph(nodes, "m", inputs, [helper.make_tensor_value_info(output, TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)], ir_version=9)


def lstm(seed: int = 0) -> tuple[onnx.ModelProto, Feeds, Feeds]:
    """LSTM (12 steps, 8 features, 16 hidden) -> last state -> MatMul head (4 outputs)."""
    rng = np.random.default_rng(seed)
    hid, feat = 16, 8
    inits = {"W": rng.normal(0, 0.4, (1, 4 * hid, feat)).astype(np.float32),
             "R": rng.normal(0, 0.3, (1, 4 * hid, hid)).astype(np.float32),
             "B": rng.normal(0, 0.1, (1, 8 * hid)).astype(np.float32),
             "head": rng.normal(0, 0.5, (hid, 4)).astype(np.float32),
             "axes": np.array([0], np.int64)}
    nodes = [helper.make_node("LSTM", ["x", "W", "R", "B"], ["", "h"], hidden_size=hid),
             helper.make_node("Squeeze", ["h", "axes"], ["h2"]),
             helper.make_node("MatMul", ["h2", "head"], ["y"])]
    m = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [12, 1, feat])], "y", inits)

    def draw(n: int, s: int) -> Feeds:
        r = np.random.default_rng(s)
        return [{"x": r.normal(0, 1, (12, 1, feat)).astype(np.float32)} for _ in range(n)]

    return m, draw(16, seed + 1), draw(64, seed + 2)


def mlp(seed: int = 0) -> tuple[onnx.ModelProto, Feeds, Feeds]:
    """MatMul -> Relu -> MatMul regressor, 16 -> 32 -> 6."""
    rng = np.random.default_rng(seed)
    inits = {"w1": rng.normal(0, 0.3, (16, 32)).astype(np.float32),
             "w2": rng.normal(0, 0.3, (32, 6)).astype(np.float32)}
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["a"]), helper.make_node("Relu", ["a"], ["r"]),
             helper.make_node("MatMul", ["r", "w2"], ["y"])]
    m = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 16])], "y", inits)
    return (m, [{"x": rng.normal(0, 1, (16, 16)).astype(np.float32)}],
            [{"x": rng.normal(0, 1, (1024, 16)).astype(np.float32)}])


def near_ties(seed: int = 6) -> tuple[onnx.ModelProto, Feeds, Feeds]:
    """x @ w, w orthogonal, scores N(0, 1) with the top class ahead by U(0, 0.06)."""
    rng = np.random.default_rng(seed)
    w = np.linalg.qr(rng.normal(0, 1, (10, 10)))[0].astype(np.float32)

    def draw(n: int) -> np.ndarray:
        z = rng.normal(0, 1, (n, 10))
        order = np.argsort(-z, axis=1)
        z[np.arange(n), order[:, 0]] = z[np.arange(n), order[:, 1]] + rng.uniform(0.0, 0.06, n)
        return (z @ w.T).astype(np.float32)

    m = _model([helper.make_node("MatMul", ["x", "w"], ["y"])],
               [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 10])], "y", {"w": w})
    x = draw(256)
    return m, [{"x": x[i:i + 32]} for i in range(0, 256, 32)], [{"x": draw(4000)}]


def decoder(seed: int = 0) -> tuple[onnx.ModelProto, Feeds, Feeds]:
    return decoder_block.build(seed=seed), decoder_block.feeds(16, seed=1), decoder_block.feeds(64, seed=7)


MODELS: dict[str, Callable[[], tuple[onnx.ModelProto, Feeds, Feeds]]] = {
    "decoder block (logits)": decoder, "LSTM + head": lstm, "MLP regressor": mlp, "near-tie classifier": near_ties}


def _run(model: Any, feeds: Feeds) -> list[np.ndarray]:
    s = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return [s.run(None, f)[0] for f in feeds]


def score(refs: list[np.ndarray], got: list[np.ndarray]) -> tuple[float, float]:
    """(SQNR dB, top-1 agreement % over the last axis) of `got` against `refs`."""
    noise = sum(float(((r - g) ** 2).sum()) for r, g in zip(refs, got))
    sqnr = 10 * np.log10(sum(float((r ** 2).sum()) for r in refs) / noise) if noise else float("inf")
    agree = float(np.mean(np.concatenate([(r.argmax(-1) == g.argmax(-1)).ravel() for r, g in zip(refs, got)])))
    return sqnr, 100 * agree


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--presets", default="A8W8,U8S8")
    ap.add_argument("--headrooms", default="auto,1.25,1.5")
    args = ap.parse_args(argv)
    heads: list[float | str] = [h if h == "auto" else float(h) for h in args.headrooms.split(",")]
    print("SQNR against float on fresh samples (top-1 agreement % where the output is a classifier's)\n")
    print("| model | preset | " + " | ".join(f"output_headroom {h}" for h in heads) + " |")
    print("|---|---|" + "---:|" * len(heads))
    for name, make in MODELS.items():
        model, calib, fresh = make()
        refs = _run(model, fresh)
        for preset in args.presets.split(","):
            cells = []
            for h in heads:
                cfg = get_default_config(preset).with_options(output_headroom=h)
                res = mixq.quantize(model, cfg, calib, check_kernels=False)
                sqnr, top1 = score(refs, _run(res.model, fresh))
                cells.append(f"{sqnr:.1f} dB" + (f", {top1:.1f} %" if name != "MLP regressor" else ""))
            print(f"| {name} | {preset} | " + " | ".join(cells) + " |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
