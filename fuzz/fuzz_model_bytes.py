"""Fuzz target: arbitrary model bytes into mixq.quantize.

Mutations of a valid model (truncation, bit flips, byte insertions/deletions, splices of
protobuf fields) and raw random bytes. The contract: quantize returns a model that passes the
ONNX checker and runs in onnxruntime, or raises a mixq.errors.MixqError; any other exception is
a bug. The input file is never modified and no output or temporary file is left behind on
failure.

    python fuzz/fuzz_model_bytes.py --seconds 60      # bounded run (hypothesis)
    python -m pytest tests/robustness/test_fuzz.py    # the ~10 s run of the suite
"""
from __future__ import annotations

import argparse
import hashlib
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import mixq
from mixq.errors import MixqError


def seed_model() -> bytes:
    """A small valid model: MatMul, Add, Relu, Gemm, Softmax on x[N, 8]."""
    rng = np.random.default_rng(0)
    w = lambda *s: (rng.standard_normal(s) * 0.3).astype(np.float32)  # noqa: E731
    inits = [numpy_helper.from_array(w(8, 8), "w1"), numpy_helper.from_array(w(8), "b1"),
             numpy_helper.from_array(w(8, 4), "w2"), numpy_helper.from_array(w(4), "b2")]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm"),
             helper.make_node("Add", ["h", "b1"], ["hb"], name="add"),
             helper.make_node("Relu", ["hb"], ["r"], name="relu"),
             helper.make_node("Gemm", ["r", "w2", "b2"], ["z"], name="fc"),
             helper.make_node("Softmax", ["z"], ["y"], axis=1, name="sm")]
    g = helper.make_graph(nodes, "fuzz_seed", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m.SerializeToString()


SEED = seed_model()
FEEDS = [{"x": np.random.default_rng(i).standard_normal((2, 8)).astype(np.float32)} for i in range(2)]


def mutate(data: bytes, ops: list[tuple[int, int, int]]) -> bytes:
    """Apply (kind, position, value) mutations."""
    b = bytearray(data)
    for kind, pos, val in ops:
        if not b:
            break
        i = pos % len(b)
        if kind == 0:      # flip a bit
            b[i] ^= 1 << (val % 8)
        elif kind == 1:    # set a byte
            b[i] = val % 256
        elif kind == 2:    # delete a run
            del b[i:i + 1 + val % 16]
        elif kind == 3:    # insert bytes
            b[i:i] = bytes([val % 256]) * (1 + val % 7)
        elif kind == 4:    # truncate
            del b[i:]
        else:              # duplicate a slice (splices repeated protobuf fields)
            b[i:i] = b[i:i + 1 + val % 64]
    return bytes(b)


class Finding(AssertionError):
    pass


def check_one(data: bytes, workdir: Path) -> str:
    """Run quantize on `data` written to a file; return the outcome kind, raise Finding on a
    contract violation."""
    src = workdir / "in.onnx"
    out = workdir / "out.onnx"
    src.write_bytes(data)
    for p in workdir.iterdir():
        if p.name not in ("in.onnx",):
            p.unlink()
    h = hashlib.sha256(data).digest()
    try:
        res = mixq.quantize(src, "A8W8", FEEDS, output_path=out, check_kernels=False)
    except MixqError as exc:
        if len(str(exc)) < 20:
            raise Finding(f"uninformative MixqError: {exc!r}") from exc
        kind = f"error:{type(exc).__name__}"
        if out.exists():
            raise Finding("an output was written although quantize failed") from exc
    except Exception as exc:  # noqa: BLE001 - the point of fuzzing
        raise Finding(f"raw {type(exc).__name__} escaped: {exc}") from exc
    else:
        import onnxruntime as ort

        try:
            onnx.checker.check_model(res.model, full_check=True)
            sess = ort.InferenceSession(res.model.SerializeToString(), providers=["CPUExecutionProvider"])
            names = [i.name for i in sess.get_inputs()]
            if names == ["x"]:
                sess.run(None, FEEDS[0])
        except Exception as exc:  # noqa: BLE001
            raise Finding(f"quantize returned a model that does not check/run: {exc}") from exc
        kind = "ok"
    if hashlib.sha256(src.read_bytes()).digest() != h:
        raise Finding("the input file was modified")
    left = [p.name for p in workdir.iterdir() if p.name.endswith(".tmp")]
    if left:
        raise Finding(f"temporary files left: {left}")
    return kind


mutations = st.lists(st.tuples(st.integers(0, 5), st.integers(0, 1 << 30), st.integers(0, 255)),
                     min_size=1, max_size=6)
inputs = st.one_of(mutations.map(lambda ops: mutate(SEED, ops)),
                   st.binary(max_size=512),
                   st.integers(0, len(SEED)).map(lambda n: SEED[:n]))


def run(seconds: float, seed: int | None = None) -> dict[str, int]:
    """Fuzz for about `seconds` (rounds of 20 examples until the time is up); returns outcome
    counts. Raises Finding on the first bug (hypothesis shrinks it first)."""
    counts: dict[str, int] = {}
    deadline = time.monotonic() + seconds
    rounds = 0
    with tempfile.TemporaryDirectory(prefix="mixq_fuzz_") as tmp:
        workdir = Path(tmp)
        while time.monotonic() < deadline:
            @settings(max_examples=20, deadline=None, database=None,
                      suppress_health_check=list(HealthCheck), print_blob=True)
            @given(inputs)
            def target(data: bytes) -> None:
                if time.monotonic() > deadline:
                    return
                kind = check_one(data, workdir)
                counts[kind] = counts.get(kind, 0) + 1

            if seed is not None:  # reproducible: round r uses seed + r
                from hypothesis import seed as hseed

                target = hseed(seed + rounds)(target)
            target()
            rounds += 1
    return counts


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=60.0)
    args = ap.parse_args(argv)
    os.environ.setdefault("ORT_LOGGING_LEVEL", "3")
    t = time.monotonic()
    try:
        counts = run(args.seconds)
    except Finding as exc:
        print(f"FINDING: {exc}", file=sys.stderr)
        return 1
    n = sum(counts.values())
    print(f"{n} inputs in {time.monotonic() - t:.1f} s, no contract violation: "
          + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
