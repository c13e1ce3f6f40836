"""mixq._io: load_model errors, atomic save, external data, never overwriting the input."""
from __future__ import annotations

import os

import numpy as np
import onnx
import pytest

from mixq import _io
from mixq._io import load_model, save_model
from mixq.convert.testing import classifier_model
from mixq.errors import ModelError, OutputError


def test_load_missing_file(tmp_path):
    with pytest.raises(ModelError, match="does not exist"):
        load_model(tmp_path / "nope.onnx")


def test_load_directory(tmp_path):
    with pytest.raises(ModelError, match="directory"):
        load_model(tmp_path)


def test_load_empty_file(tmp_path):
    p = tmp_path / "empty.onnx"
    p.write_bytes(b"")
    with pytest.raises(ModelError, match="empty"):
        load_model(p)


@pytest.mark.parametrize("payload", [b"\xff\xfe\x00garbage" * 10, b"hello, this is not a model\n" * 5,
                                     b"\x0a\xff\xff\xff\xff\x0f"])
def test_load_non_onnx_bytes(tmp_path, payload):
    p = tmp_path / "bad.onnx"
    p.write_bytes(payload)
    with pytest.raises(ModelError, match="bad.onnx"):
        load_model(p)
    with pytest.raises(ModelError):
        load_model(payload)


def test_load_truncated_model(tmp_path):
    data = classifier_model().SerializeToString()
    p = tmp_path / "trunc.onnx"
    p.write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelError, match="trunc.onnx"):
        load_model(p)


def test_load_wrong_type():
    with pytest.raises(ModelError, match="path"):
        load_model(42)  # type: ignore[arg-type]


def test_roundtrip_and_proto_passthrough(tmp_path):
    m = classifier_model()
    assert load_model(m) is m
    p = save_model(m, tmp_path / "sub" / "m.onnx")
    assert p.exists() and p.parent.name == "sub"
    assert load_model(p).SerializeToString() == m.SerializeToString()
    assert not [f for f in os.listdir(p.parent) if f.endswith(".tmp")]


def test_save_refuses_to_overwrite_input(tmp_path):
    m = classifier_model()
    p = save_model(m, tmp_path / "m.onnx")
    before = p.read_bytes()
    with pytest.raises(OutputError, match="input model"):
        save_model(m, tmp_path / "." / "m.onnx", protect=p)
    with pytest.raises(OutputError):
        save_model(m, str(p), protect=[tmp_path / "x.onnx", str(tmp_path / ".." / tmp_path.name / "m.onnx")])
    assert p.read_bytes() == before


def test_save_to_directory_is_an_error(tmp_path):
    with pytest.raises(OutputError, match="directory"):
        save_model(classifier_model(), tmp_path)


def test_external_data_forced_and_automatic(tmp_path, monkeypatch):
    m = classifier_model()
    ref = m.SerializeToString()
    p = save_model(m, tmp_path / "ext.onnx", external=True)
    assert (tmp_path / "ext.onnx.data").exists()
    assert m.SerializeToString() == ref, "save_model must not modify the model"
    loaded = load_model(p)
    for a, b in zip(loaded.graph.initializer, m.graph.initializer):
        assert np.array_equal(onnx.numpy_helper.to_array(a), onnx.numpy_helper.to_array(b))
    assert os.path.getsize(p) < len(ref)
    # automatic: above the threshold -> external
    monkeypatch.setattr(_io, "EXTERNAL_THRESHOLD", 1000)
    save_model(m, tmp_path / "auto.onnx")
    assert (tmp_path / "auto.onnx.data").exists()
    monkeypatch.setattr(_io, "EXTERNAL_THRESHOLD", 10 ** 12)
    save_model(m, tmp_path / "small.onnx")
    assert not (tmp_path / "small.onnx.data").exists()


def test_missing_external_data(tmp_path):
    p = save_model(classifier_model(), tmp_path / "ext.onnx", external=True)
    os.remove(tmp_path / "ext.onnx.data")
    with pytest.raises(ModelError, match="external data"):
        load_model(p)
    m = load_model(p, load_external=False)
    with pytest.raises(OutputError, match="load_external"):
        save_model(m, tmp_path / "again.onnx")
