"""Does the fidelity guard's verdict match what a preset does to a classifier it never saw?

    python -m bench.guard_sweep [--models attn,gru,...] [--presets A8W8,...]

Five small classifiers of architectures the bench models do not have (a causal-attention
block with LayerNorm and a -inf mask, a GRU, an SE-ResNet with GroupNorm and Hardswish, a
U-Net with ConvTranspose, bilinear Resize, InstanceNorm and a skip Concat, an RMSNorm/SwiGLU
token mixer) are trained for a few seconds on synthetic tasks (torch, CPU; nothing is
downloaded), exported at opset 17, and quantized with each preset from 128 calibration
samples. Each quantized model (QDQ semantics: onnxruntime with optimizations off, so that a
CPU's fused int8 kernels do not enter) is then compared with the float one on 512 fresh
samples. The table gives the top-1 agreement there (all rows, and the decisive rows that are
no near-ties, `mixq.evaluate.NEAR_TIE`), the guard's verdict on its held-back samples (broken /
likely loss / quiet), the agreement it expected on them (`OutputMetrics.expected_agreement`)
and the flips it saw. A model that loses more than 5 points on the fresh samples while the
guard is quiet is marked "missed".

    python -m bench.guard_sweep --bench efficientnet_lite0,fashion_cnn,ppocr_cls [--presets ...]

prints instead, for bench models (their full-suite calibration data, built into the bench
cache), the guard's verdict and the agreement it expects on each class-score output: what a
model within 1 point of float must not warn about.
"""
from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

PRESETS = ("A8W8", "U8S8", "XINT8", "A16W8", "BF16", "BFP16", "MX9", "MXFP4")


def _modules() -> dict[str, Callable[[], Any]]:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class SE(nn.Module):
        def __init__(self, c: int) -> None:
            super().__init__()
            self.a, self.b = nn.Linear(c, c // 4), nn.Linear(c // 4, c)

        def forward(self, x: Any) -> Any:
            w = torch.sigmoid(self.b(F.silu(self.a(x.mean((2, 3))))))
            return x * w[:, :, None, None]

    class SEResNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stem, self.bn = nn.Conv2d(3, 16, 3, 2, 1), nn.BatchNorm2d(16)
            self.b1 = nn.Sequential(nn.Conv2d(16, 16, 3, 1, 1, groups=16), nn.BatchNorm2d(16),
                                    nn.Hardswish(), nn.Conv2d(16, 16, 1), SE(16))
            self.b2 = nn.Sequential(nn.Conv2d(16, 32, 3, 2, 1), nn.GroupNorm(4, 32), nn.GELU(), SE(32))
            self.head = nn.Linear(32, 10)

        def forward(self, x: Any) -> Any:
            x = F.relu(self.bn(self.stem(x)))
            return self.head(self.b2(x + self.b1(x)).mean((2, 3)))

    class UNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.e1, self.e2 = nn.Conv2d(3, 8, 3, 1, 1), nn.Conv2d(8, 16, 3, 2, 1)
            self.up, self.d = nn.ConvTranspose2d(16, 8, 2, 2), nn.Conv2d(16, 8, 3, 1, 1)
            self.o, self.norm = nn.Conv2d(8, 4, 1), nn.InstanceNorm2d(8, affine=True)

        def forward(self, x: Any) -> Any:
            a = F.leaky_relu(self.e1(x))
            b = F.relu(self.e2(a))
            r = F.interpolate(b, scale_factor=2.0, mode="bilinear", align_corners=False)[:, :8]
            y = torch.cat([self.up(b) + r, self.norm(a)], 1)
            return self.o(F.elu(self.d(y))).mean((2, 3))

    class GRUNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inp, self.gru, self.out = nn.Linear(12, 32), nn.GRU(32, 32, batch_first=True), nn.Linear(32, 6)

        def forward(self, x: Any) -> Any:
            return self.out(self.gru(torch.tanh(self.inp(x)))[0][:, -1])

    class CausalAttn(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb, self.qkv, self.o = nn.Linear(8, 32), nn.Linear(32, 96), nn.Linear(32, 32)
            self.ln, self.head = nn.LayerNorm(32), nn.Linear(32, 5)

        def forward(self, x: Any) -> Any:
            h = self.emb(x)
            q, k, v = self.qkv(self.ln(h)).chunk(3, -1)
            att = torch.einsum("btd,bsd->bts", q, k) / 32 ** 0.5
            mask = torch.triu(torch.ones(h.shape[1], h.shape[1], dtype=torch.bool), 1)
            h = h + self.o(att.masked_fill(mask, float("-inf")).softmax(-1) @ v)
            return self.head(h.mean(1))

    class Mixer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.e, self.g = nn.Linear(6, 32), nn.Parameter(torch.ones(32))
            self.w1, self.w3 = nn.Linear(32, 64, bias=False), nn.Linear(32, 64, bias=False)
            self.w2, self.tok, self.head = nn.Linear(64, 32, bias=False), nn.Linear(10, 10), nn.Linear(32, 3)

        def forward(self, x: Any) -> Any:
            h = self.e(x)
            n = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6) * self.g
            h = h + self.w2(F.silu(self.w1(n)) * self.w3(n))
            h = h + self.tok(h.transpose(1, 2)).transpose(1, 2)
            return self.head(h.mean(1))

    return {"attn": CausalAttn, "gru": GRUNet, "seresnet": SEResNet, "unet": UNet, "mixer": Mixer}


def _data(name: str, n: int, seed: int) -> tuple[Any, Any]:
    """Inputs and labels of a synthetic task (a few rules of the inputs; the classes overlap)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    if name in ("seresnet", "unet"):
        x = torch.randn(n, 3, 32, 32, generator=g)
        y = (x[:, 0, :16].mean((1, 2)) > x[:, 1, 16:].mean((1, 2))).long() + 2 * (x[:, 2].std((1, 2)) > 1).long()
    elif name == "gru":
        x = torch.randn(n, 20, 12, generator=g)
        y = (x[:, :, :6].sum((1, 2)) > 0).long() * 3 + (x[:, -5:, 6].sum(1) > 0).long()
    elif name == "attn":
        x = torch.randn(n, 12, 8, generator=g)
        y = (x[:, :, 0].sum(1) > 0).long() + 2 * (x[:, 3, 1] > 0).long()
    else:
        x = torch.randn(n, 10, 6, generator=g)
        y = (x[:, :, 0].sum(1) > 0).long() + (x[:, 0, 1] > 0).long()
    return x, y


def build(name: str, path: Path) -> None:
    """Train `name` for 60 epochs on 512 samples (seeded) and export it to `path`."""
    import torch
    import torch.nn.functional as F

    torch.manual_seed(0)
    model = _modules()[name]()
    x, y = _data(name, 512, 0)
    opt = torch.optim.Adam(model.parameters(), 3e-3)
    for _ in range(60):
        for i in range(0, 512, 64):
            opt.zero_grad()
            F.cross_entropy(model(x[i:i + 64]), y[i:i + 64]).backward()
            opt.step()
    model.eval()
    with torch.no_grad():
        torch.onnx.export(model, (x[:1],), str(path), opset_version=17, dynamo=False, input_names=["x"],
                          output_names=["y"], dynamic_axes={"x": {0: "N"}, "y": {0: "N"}})


def run(name: str, presets: list[str], d: Path) -> list[dict[str, Any]]:
    import mixq
    from mixq.evaluate import ErrorStats, make_session

    path = d / f"{name}.onnx"
    build(name, path)
    xc, _ = _data(name, 128, 1)
    xe, _ = _data(name, 512, 2)
    calib = [{"x": xc[i:i + 16].numpy()} for i in range(0, 128, 16)]
    ref = make_session(str(path)).run(None, {"x": xe.numpy()})[0]
    rows = []
    for preset in presets:
        t = time.perf_counter()
        res = mixq.quantize(str(path), preset, calib, check_kernels=False)
        got = make_session(res.model, optimize=False).run(None, {"x": xe.numpy()})[0]
        fresh = ErrorStats().update(ref, got).result("y")
        fid, held = res.fidelity, res.fidelity.outputs[0]
        verdict = "broken" if fid.broken else "likely loss" if fid.likely_loss is not None else "quiet"
        drop = 100 * (1 - (fresh.top1_agreement or 0.0))
        rows.append({"model": name, "preset": preset, "fresh": 100 * (fresh.top1_agreement or 0.0),
                     "fresh_decisive": 100 * (fresh.decisive_agreement or 0.0), "verdict": verdict,
                     "expected": 100 * (held.expected_agreement or 0.0),
                     "flips": held.decisive_flips,
                     "held": held.decisive_rows, "missed": verdict == "quiet" and drop > 5,
                     "s": time.perf_counter() - t})
        r = rows[-1]
        print(f"{name} {preset}: fresh {r['fresh']:.2f} guard {verdict} (expects {r['expected']:.1f})", flush=True)
    return rows


def bench_verdicts(names: list[str], presets: list[str]) -> None:
    """The guard's verdict, and the agreement it expects, for each bench model and preset."""
    import mixq

    from .auto_models_bench import _built
    from .cases import get_case
    from .feeds import load_feeds

    print("| model | preset | guard | output: expected agreement (flips seen) |")
    print("|---|---|---|---|")
    for name in names:
        d = _built(get_case(name))
        calib = load_feeds(d / "calib.npz")
        for preset in presets:
            fid = mixq.quantize(str(d / "float.onnx"), preset, calib, check_kernels=False).fidelity
            verdict = "broken" if fid.broken else "likely loss" if fid.likely_loss is not None else "quiet"
            outs = "; ".join(f"{o.name}: {100 * o.expected_agreement:.1f} % "
                             f"({o.decisive_flips} of {o.decisive_rows})"
                             for o in fid.outputs if o.expected_agreement is not None) or "no class scores read"
            print(f"| {name} | {preset} | {verdict} | {outs} |", flush=True)


def main(argv: list[str] | None = None) -> int:
    import tempfile

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="attn,gru,seresnet,unet,mixer")
    ap.add_argument("--presets", default=",".join(PRESETS))
    ap.add_argument("--bench", help="comma-separated bench cases: print their guard verdicts instead")
    args = ap.parse_args(argv)
    if args.bench:
        bench_verdicts(args.bench.split(","), args.presets.split(","))
        return 0
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            rows += run(name, args.presets.split(","), Path(tmp))
    print("\n| model | preset | agreement on 512 fresh samples (decisive rows) | guard | expected on its held-back samples | flips seen |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['preset']} | {r['fresh']:.2f} ({r['fresh_decisive']:.2f}) | "
              f"{r['verdict']}{' **missed**' if r['missed'] else ''} | {r['expected']:.1f} | "
              f"{r['flips']} of {r['held']} |")
    missed = sum(r["missed"] for r in rows)
    print(f"\n{missed} of {len(rows)} models lose more than 5 points on the fresh samples while the guard is quiet")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
