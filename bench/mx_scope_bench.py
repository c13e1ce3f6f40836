"""Block presets on the PP-OCRv4 recognizer: the presets' scope, the operands of the compute ops
(Conv, ConvTranspose, MatMul, Gemm; everything else float, as block-format hardware runs vector
ops in higher precision), against the same format on every op's inputs and outputs (what the
presets did before; what QuantConfig(activation=..., weight=...) does).

    python bench/mx_scope_bench.py [--presets MXFP8_E4M3,MXFP4,BFP16,MXINT8] [--lines 24]

Prints character accuracy (greedy CTC against the rendered text), the fraction of output frames
whose argmax agrees with the float model, and the number of block-function calls, all in the QDQ
semantics (onnxruntime optimizations off).
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--presets", default="MXFP8_E4M3,MXFP4,BFP16,MXINT8")
    ap.add_argument("--lines", type=int, default=24, help="evaluation text lines")
    args = ap.parse_args(argv)
    import mixq
    from mixq.evaluate import make_session
    from mixq.formats import MIXQ_DOMAIN
    from tests import realmodels as rm

    path = str(rm.ppocr_rec_model_path())
    calib = rm.rec_inputs("calib", 8)
    ev, texts = rm.rec_inputs("eval", args.lines, with_texts=True)
    charset = rm.rec_charset(path)

    def score(model) -> tuple[float, np.ndarray]:
        probs = make_session(model, optimize=False).run(None, {"x": ev})[0]
        return 100 * rm.char_accuracy(rm.ctc_greedy_decode(probs, charset), texts), probs

    acc, ref = score(path)
    print(f"PP-OCRv4 recognizer, {len(texts)} rendered lines; float: char accuracy {acc:.2f} %\n")
    print("| preset | scope | char accuracy % | frames agreeing with float % | block calls |")
    print("|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for preset in [p.strip().upper() for p in args.presets.split(",") if p.strip()]:
            base = mixq.get_default_config(preset)
            every = replace(base, op_types=None, quantize_outputs=True)
            for scope, cfg in (("every op", every), ("compute operands (preset)", base)):
                out = Path(tmp) / f"{preset}.onnx"
                q = mixq.quantize(path, cfg, [{"x": calib}], output_path=out).model
                calls = sum(1 for n in q.graph.node if n.domain == MIXQ_DOMAIN)
                acc, probs = score(str(out))
                agree = 100 * float(np.mean(probs.argmax(-1) == ref.argmax(-1)))
                print(f"| {preset} | {scope} | {acc:.2f} | {agree:.1f} | {calls} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
