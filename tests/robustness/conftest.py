"""Shared helpers of the robustness suite: every case ends in a correct model or a MixqError,
the input file is never modified, and no half-written output or temporary file is left."""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np
import onnx
import pytest

import mixq
from mixq.errors import MixqError


def sha(path: str | os.PathLike) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def assert_runs(model: onnx.ModelProto, feed: dict | None = None) -> None:
    """The checker accepts the model (full check) and stock onnxruntime runs it."""
    import onnxruntime as ort

    onnx.checker.check_model(model, full_check=True)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    if feed is not None:
        names = {i.name for i in sess.get_inputs()}
        outs = sess.run(None, {k: v for k, v in feed.items() if k in names})
        assert outs


def assert_clean_dir(d: Path) -> None:
    """No temporary files of an atomic write are left behind."""
    left = [p.name for p in d.iterdir() if p.name.startswith(".") and p.name.endswith(".tmp")]
    assert not left, f"temporary files left behind: {left}"


def outcome(fn, *, input_path: Path | None = None, output_path: Path | None = None,
            feed: dict | None = None, expect_error: type | None = None, match: str | None = None,
            runs: bool = True):
    """Run `fn()` (a quantize call) and check the robustness contract; returns the result or
    the MixqError. `expect_error`: the case must fail with that MixqError subclass."""
    before = sha(input_path) if input_path is not None else None
    out_before = sha(output_path) if output_path is not None and output_path.exists() else None
    try:
        res = fn()
    except MixqError as exc:
        msg = str(exc)
        assert len(msg) > 20, f"uninformative message: {msg!r}"
        assert "Traceback" not in msg
        if expect_error is not None:
            assert isinstance(exc, expect_error), f"{type(exc).__name__}: {msg}"
        if match is not None:
            import re

            assert re.search(match, msg, re.I), f"{match!r} not in {msg!r}"
        if output_path is not None:  # never half-written: absent, or exactly what was there
            assert (sha(output_path) if output_path.exists() else None) == out_before
            if output_path.parent.exists():
                assert_clean_dir(output_path.parent)
        res = exc
    else:
        assert expect_error is None, f"expected {expect_error.__name__}, got a result"
        if runs:
            assert_runs(res.model, feed)
        if output_path is not None:
            assert output_path.exists()
            assert_runs(mixq._io.load_model(output_path), feed) if runs else \
                onnx.checker.check_model(str(output_path))
            assert_clean_dir(output_path.parent)
    if input_path is not None:
        assert sha(input_path) == before, "the input file was modified"
    return res


@pytest.fixture
def saved(tmp_path):
    """save(model, name) -> path of the model written into tmp_path."""
    def save(model: onnx.ModelProto, name: str = "in.onnx") -> Path:
        p = tmp_path / name
        p.write_bytes(model.SerializeToString())
        return p
    return save


def finite_qparams(model: onnx.ModelProto) -> None:
    """Every scale of the quantized model is finite and positive."""
    inits = {t.name: t for t in model.graph.initializer}
    for n in model.graph.node:
        if n.op_type in ("QuantizeLinear", "DequantizeLinear") and len(n.input) > 1 and n.input[1] in inits:
            s = onnx.numpy_helper.to_array(inits[n.input[1]]).astype(np.float64)
            assert np.all(np.isfinite(s)) and np.all(s > 0), (n.name, s)
