"""Hostile output paths: the input itself (directly, via a link, via ..), a directory, a
read-only or missing directory, a full disk. The output is never half-written, temporary files
are removed, and the input is never modified.

Decision (documented in mixq/_io.py): a missing output directory is created."""
from __future__ import annotations

import errno
import os

import numpy as np
import onnx
import pytest

import mixq
from mixq import _io
from mixq.errors import OutputError

from . import models as M
from .conftest import assert_clean_dir, outcome, sha

MLP = M.mlp(21)
FEEDS = M.feeds(MLP, 3)


@pytest.fixture
def src(saved):
    return saved(MLP)


@pytest.mark.parametrize("how", ["same", "relative_dotdot", "symlink", "hardlink", "tilde_free_abs"])
def test_output_equal_to_input(how, src, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    if how == "same":
        out = src
    elif how == "relative_dotdot":
        (tmp_path / "sub").mkdir()
        out = tmp_path / "sub" / ".." / src.name
    elif how == "symlink":
        out = tmp_path / "link.onnx"
        out.symlink_to(src)
    elif how == "hardlink":
        out = tmp_path / "hard.onnx"
        os.link(src, out)
    else:
        out = src.resolve()
    res = outcome(lambda: mixq.quantize(src, "A8W8", FEEDS, output_path=out), input_path=src,
                  expect_error=OutputError, match="input")
    assert "choose" in str(res).lower() or "different" in str(res).lower()


def test_output_is_a_directory(src, tmp_path):
    d = tmp_path / "a_dir"
    d.mkdir()
    outcome(lambda: mixq.quantize(src, "A8W8", FEEDS, output_path=d), input_path=src,
            expect_error=OutputError, match="directory")


@pytest.mark.parametrize("depth", [1, 3])
def test_missing_output_directory_is_created(depth, src, tmp_path):
    out = tmp_path.joinpath(*[f"new{i}" for i in range(depth)]) / "q.onnx"
    res = outcome(lambda: mixq.quantize(src, "A8W8", FEEDS, output_path=out), input_path=src,
                  output_path=out, feed=FEEDS[0])
    assert res.output_path == out.resolve()


def test_output_parent_is_a_file(src, tmp_path):
    f = tmp_path / "plain_file"
    f.write_text("x")
    outcome(lambda: mixq.quantize(src, "A8W8", FEEDS, output_path=f / "q.onnx"), input_path=src,
            expect_error=OutputError, match="output directory")


def _deny(*a, **k):
    raise PermissionError(errno.EACCES, "Permission denied")


@pytest.mark.parametrize("where", ["mkstemp", "mkdir", "replace"])
def test_read_only_output_directory(where, src, tmp_path, monkeypatch):
    # running as root ignores chmod: the denial is simulated where the OS would raise it
    out = tmp_path / ("ro_new" if where == "mkdir" else "") / "q.onnx"
    target = {"mkstemp": (_io.tempfile, "mkstemp"), "mkdir": (_io.pathlib.Path, "mkdir"),
              "replace": (_io.os, "replace")}[where]
    monkeypatch.setattr(*target, _deny)
    res = outcome(lambda: mixq.quantize(src, "A8W8", FEEDS, output_path=out), input_path=src,
                  output_path=out, expect_error=OutputError)
    assert "permission" in str(res).lower() or "not writable" in str(res).lower()
    monkeypatch.undo()
    assert not out.exists()
    assert_clean_dir(tmp_path)


def test_real_read_only_directory_when_not_root(src, tmp_path):
    if os.geteuid() == 0:
        pytest.skip("root ignores directory permissions (covered by the simulated cases)")
    d = tmp_path / "ro"
    d.mkdir()
    d.chmod(0o500)
    try:
        outcome(lambda: mixq.quantize(src, "A8W8", FEEDS, output_path=d / "q.onnx"), input_path=src,
                output_path=d / "q.onnx", expect_error=OutputError, match="writable")
    finally:
        d.chmod(0o700)


class _DiskFull:
    """os.write that accepts `room` bytes, then fails with ENOSPC (stdio fds untouched)."""

    def __init__(self, room: int):
        self.room = room
        self.real = os.write

    def __call__(self, fd, data):
        if fd <= 2:
            return self.real(fd, data)
        n = min(len(data), self.room)
        if n == 0:
            raise OSError(errno.ENOSPC, "No space left on device")
        self.room -= n
        return self.real(fd, memoryview(data)[:n])


@pytest.mark.parametrize("frac", [0.0, 0.001, 0.25, 0.5, 0.99])
@pytest.mark.parametrize("existing", [False, True])
def test_full_disk_single_file(frac, existing, src, tmp_path, monkeypatch):
    out = tmp_path / "q.onnx"
    size = len(mixq.quantize(src, "A8W8", FEEDS, check_kernels=False).model.SerializeToString())
    room = int(size * frac)
    if existing:
        out.write_bytes(b"previous output, must survive")
    monkeypatch.setattr(os, "write", _DiskFull(room))
    res = outcome(lambda: mixq.quantize(src, "A8W8", FEEDS, output_path=out), input_path=src,
                  output_path=out, expect_error=OutputError, match="disk is full")
    assert "space" in str(res)
    monkeypatch.undo()
    assert (out.read_bytes() == b"previous output, must survive") if existing else not out.exists()


@pytest.mark.parametrize("room", [0, 100, 1000, 2000])
def test_full_disk_external_data(room, src, tmp_path, monkeypatch):
    """External data (forced with a low threshold): neither the model nor the .data file is
    left behind when either write fails."""
    res = mixq.quantize(src, "A8W8", FEEDS, check_kernels=False)
    out = tmp_path / "ext" / "q.onnx"
    out.parent.mkdir()
    monkeypatch.setattr(_io, "_EXTERNAL_MIN_TENSOR", 16)
    monkeypatch.setattr(os, "write", _DiskFull(room))
    with pytest.raises(OutputError, match="disk is full"):
        _io.save_model(res.model, out, external=True)
    monkeypatch.undo()
    assert list(out.parent.iterdir()) == []
    # and the model object is unchanged (tensors restored)
    onnx.checker.check_model(res.model, full_check=True)
    _io.save_model(res.model, out, external=True)
    assert (out.parent / "q.onnx.data").exists()
    again = _io.load_model(out)
    assert again.SerializeToString() == res.model.SerializeToString()


def test_fsync_failure(src, tmp_path, monkeypatch):
    out = tmp_path / "q.onnx"

    def bad_fsync(fd):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "fsync", bad_fsync)
    outcome(lambda: mixq.quantize(src, "A8W8", FEEDS, output_path=out), input_path=src,
            output_path=out, expect_error=OutputError, match="Input/output")
    monkeypatch.undo()
    assert not out.exists()


def test_output_written_with_normal_permissions(src, tmp_path):
    out = tmp_path / "q.onnx"
    mixq.quantize(src, "A8W8", FEEDS, output_path=out, check_kernels=False)
    mode = out.stat().st_mode & 0o777
    assert mode & 0o044 == 0o044 or (os.umask(0o22) and False) or mode & 0o600 == 0o600


def test_input_model_proto_is_not_modified():
    m = M.seq_block()
    before = m.SerializeToString()
    mixq.quantize(m, "A8W8", M.feeds(m, 3))
    assert m.SerializeToString() == before


def test_input_bytes_and_path_give_same_output(src):
    a = mixq.quantize(src, "A8W8", FEEDS, check_kernels=False).model.SerializeToString()
    b = mixq.quantize(src.read_bytes(), "A8W8", FEEDS, check_kernels=False).model.SerializeToString()
    c = mixq.quantize(MLP, "A8W8", FEEDS, check_kernels=False).model.SerializeToString()
    assert a == b == c


def test_missing_external_data(tmp_path):
    m = M.mlp(21)
    p = tmp_path / "ext.onnx"
    onnx.save(m, p, save_as_external_data=True, all_tensors_to_one_file=True, location="ext.data",
              size_threshold=0)
    h = sha(p)
    (tmp_path / "ext.data").unlink()
    outcome(lambda: mixq.quantize(p, "A8W8", FEEDS), expect_error=mixq.errors.ModelError,
            match="external data")
    assert sha(p) == h


def test_external_data_input_roundtrip(tmp_path):
    m = M.mlp(21)
    p = tmp_path / "ext.onnx"
    onnx.save(m, p, save_as_external_data=True, all_tensors_to_one_file=True, location="ext.data",
              size_threshold=0)
    hashes = (sha(p), sha(tmp_path / "ext.data"))
    out = tmp_path / "o" / "q.onnx"
    outcome(lambda: mixq.quantize(p, "A8W8", FEEDS, output_path=out), input_path=p, output_path=out,
            feed=FEEDS[0])
    assert (sha(p), sha(tmp_path / "ext.data")) == hashes
    assert np.isfinite(out.stat().st_size)
