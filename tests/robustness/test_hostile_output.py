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


@pytest.mark.parametrize("path", [b"out.onnx", 7])
def test_output_path_that_is_no_path_is_a_clear_error(path, src, tmp_path, monkeypatch):
    """bytes (a model's contents where `model` takes them) or a number as output_path ended in
    pathlib's TypeError; now an OutputError that says what a path is, before any work."""
    monkeypatch.chdir(tmp_path)
    outcome(lambda: mixq.quantize(src, "A8W8", FEEDS, output_path=path), input_path=src,
            expect_error=OutputError, match="must be a file path")
    assert not (tmp_path / "out.onnx").exists()


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


# ---------------------------------------------------------------------------- files destroyed
# Issue 15: every writer goes through mixq._io.check_output_path; none of these may touch a
# file that is an input (the model, its external data, calibration data, labels) or a device.

def _run_cli(argv):
    from mixq.cli.main import main

    return main([str(a) for a in argv])


@pytest.fixture
def ext_model(tmp_path):
    """An input model whose weights live in w1.bin beside it, with the hashes of both."""
    p = tmp_path / "ext.onnx"
    onnx.save(M.mlp(21), p, save_as_external_data=True, all_tensors_to_one_file=True,
              location="w1.bin", size_threshold=0)
    return p, tmp_path / "w1.bin"


@pytest.fixture
def calib_npz(tmp_path):
    p = tmp_path / "calib.npz"
    np.savez(p, **FEEDS[2])
    return p


def _hashes(*paths):
    return [sha(p) for p in paths]


def test_cli_quantize_onto_the_inputs_external_data(ext_model, calib_npz, capsys):
    model, data = ext_model
    before = _hashes(model, data)
    assert _run_cli(["quantize", model, data, "--calib", calib_npz]) == 2
    err = capsys.readouterr().err
    assert "external-data file" in err and "w1.bin" in err
    assert _hashes(model, data) == before
    mixq.quantize(model, "A8W8", FEEDS, check_kernels=False)  # the input still loads and runs


@pytest.mark.parametrize("how", ["direct", "symlink"])
def test_api_output_path_is_the_inputs_external_data(how, ext_model, tmp_path):
    model, data = ext_model
    out = data
    if how == "symlink":
        out = tmp_path / "link.bin"
        out.symlink_to(data)
    before = sha(data)
    outcome(lambda: mixq.quantize(model, "A8W8", FEEDS, output_path=out), input_path=model,
            expect_error=OutputError, match="external-data file")
    assert sha(data) == before


def test_guard_same_inode_through_a_hard_link(ext_model, tmp_path):
    # (onnx itself refuses to load external data with several links, so only the guard here)
    model, data = ext_model
    os.link(data, tmp_path / "hard.bin")
    with pytest.raises(OutputError, match="external-data file"):
        _io.check_output_path(tmp_path / "hard.bin", models=[model])


def test_saved_external_data_file_never_lands_on_an_input(tmp_path, monkeypatch):
    """The output model's own .data file (q.onnx -> q.onnx.data) is checked too."""
    p = tmp_path / "in.onnx"
    onnx.save(M.mlp(21), p, save_as_external_data=True, all_tensors_to_one_file=True,
              location="q.onnx.data", size_threshold=0)
    before = _hashes(p, tmp_path / "q.onnx.data")
    monkeypatch.setattr(_io, "_EXTERNAL_MIN_TENSOR", 16)
    res = mixq.quantize(p, "A8W8", FEEDS, check_kernels=False)
    with pytest.raises(OutputError, match="external-data file"):
        _io.save_model(res.model, tmp_path / "q.onnx", external=True, protect=p)
    assert _hashes(p, tmp_path / "q.onnx.data") == before
    assert not (tmp_path / "q.onnx").exists()


def test_cli_convert_onto_the_inputs_external_data(ext_model, capsys):
    model, data = ext_model
    before = _hashes(model, data)
    assert _run_cli(["convert", "bf16", model, data]) == 2
    assert "external-data file" in capsys.readouterr().err
    assert _hashes(model, data) == before


def test_cli_plan_output_is_the_input_model(src, capsys):
    before = sha(src)
    assert _run_cli(["plan", src, "-o", src]) == 2
    assert "input model" in capsys.readouterr().err
    assert sha(src) == before


def test_cli_convert_json_is_the_input_model(src, tmp_path, capsys):
    before = sha(src)
    assert _run_cli(["convert", "bf16", src, tmp_path / "o.onnx", "--json", src]) == 2
    assert "input model" in capsys.readouterr().err
    assert sha(src) == before


def test_cli_convert_json_is_the_model_just_written(src, tmp_path, capsys):
    out = tmp_path / "o.onnx"
    assert _run_cli(["convert", "bf16", src, out, "--json", out]) == 2
    assert "--output model" in capsys.readouterr().err
    assert not out.exists()  # refused before any work


def test_cli_convert_json_written(src, tmp_path):
    import json

    assert _run_cli(["convert", "bf16", src, tmp_path / "o.onnx", "--json", tmp_path / "r.json"]) == 0
    assert "sqnr" in json.dumps(json.loads((tmp_path / "r.json").read_text())).lower()


@pytest.mark.parametrize("how", ["direct", "symlink"])
def test_api_output_path_is_the_calibration_file(how, src, calib_npz, tmp_path):
    out = calib_npz
    if how == "symlink":
        out = tmp_path / "link.onnx"
        out.symlink_to(calib_npz)
    outcome(lambda: mixq.quantize(src, "A8W8", calib_npz, output_path=out), input_path=calib_npz,
            expect_error=OutputError, match="input file")
    np.load(calib_npz)  # still the data


def test_cli_output_is_the_calibration_file_or_a_data_file_in_the_folder(src, tmp_path, capsys):
    d = tmp_path / "calib"
    d.mkdir()
    np.savez(d / "a.npz", **FEEDS[2])
    before = sha(d / "a.npz")
    assert _run_cli(["quantize", src, d / "a.npz", "--calib", d / "a.npz"]) == 2
    assert _run_cli(["quantize", src, d / "b.npz", "--calib", d]) == 2  # would join the data
    assert capsys.readouterr().err.count("refusing") == 2
    assert sha(d / "a.npz") == before and not (d / "b.npz").exists()


def test_cli_output_is_the_plan_or_config_file(src, tmp_path, capsys):
    plan = tmp_path / "plan.json"
    assert _run_cli(["plan", src, "-o", plan]) == 0
    before = sha(plan)
    assert _run_cli(["quantize", src, plan, "--plan", plan, "--calib", "x.npz"]) == 2
    assert "input file" in capsys.readouterr().err
    assert sha(plan) == before


def test_cli_auto_output_is_the_labels_file(src, calib_npz, tmp_path, capsys):
    labels = tmp_path / "labels.npy"
    np.save(labels, np.zeros(3, np.int64))
    before = sha(labels)
    assert _run_cli(["auto", src, labels, "--calib", calib_npz, "--labels", labels,
                     "--top1-drop", "0.1", "--no-cache"]) == 2
    assert "input file" in capsys.readouterr().err
    assert sha(labels) == before


def test_output_is_a_fifo(src, tmp_path, capsys):
    """A non-regular file (here a FIFO; as root /dev/null was replaced by a regular file) is
    refused before any work, and is still there, unchanged in kind, afterwards."""
    import stat

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    assert _run_cli(["quantize", src, fifo, "--calib", "missing.npz"]) == 2
    assert "not a regular file" in capsys.readouterr().err
    outcome(lambda: mixq.quantize(src, "A8W8", FEEDS, output_path=fifo), expect_error=OutputError,
            match="not a regular file")
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)


def test_dev_null_is_refused_without_writing():
    # only the check (never a real run onto /dev/null: a regression would replace the device)
    if not os.path.exists("/dev/null") or not os.path.stat.S_ISCHR(os.stat("/dev/null").st_mode):
        pytest.skip("no character device /dev/null here")
    with pytest.raises(OutputError, match="not a regular file"):
        _io.check_output_path("/dev/null")


def test_cli_plan_onto_a_directory_and_into_a_missing_one(src, tmp_path, capsys):
    assert _run_cli(["plan", src, "-o", tmp_path]) == 2
    assert "is a directory" in capsys.readouterr().err
    out = tmp_path / "new" / "sub" / "plan.json"  # created, as for models
    assert _run_cli(["plan", src, "-o", out]) == 0
    assert out.read_text().lstrip().startswith("{")
    f = tmp_path / "file"
    f.write_text("x")
    assert _run_cli(["plan", src, "-o", f / "plan.json"]) == 2
    assert "cannot create the directory" in capsys.readouterr().err


def test_auto_report_dir_and_cache_dir_that_are_files(src, calib_npz, tmp_path, capsys):
    f = tmp_path / "file"
    f.write_text("x")
    base = ["auto", src, tmp_path / "o.onnx", "--calib", calib_npz, "--l2-target", "0.5"]
    assert _run_cli(base + ["--cache-dir", f]) == 2
    assert "cache directory" in capsys.readouterr().err
    assert _run_cli(base + ["--no-cache", "--report-dir", f]) == 2
    assert "--report-dir" in capsys.readouterr().err
    assert f.read_text() == "x"
    assert not (tmp_path / "o.onnx").exists()  # refused before the search, not after writing


@pytest.mark.parametrize("how", ["same", "symlink", "hardlink"])
def test_vendor_model_quantizer_never_writes_onto_its_input(how, src, tmp_path):
    """The vendor's presets switch CLE on: ModelQuantizer equalized the model in memory and
    handed quantize that copy, so nothing tied the output to the user's file, and
    quantize_model(path, path) overwrote the input model."""
    from mixq.compat import Config, ModelQuantizer, get_default_config

    out = src if how == "same" else tmp_path / f"{how}.onnx"
    if how == "symlink":
        out.symlink_to(src)
    elif how == "hardlink":
        os.link(src, out)
    q = ModelQuantizer(Config(global_quant_config=get_default_config("XINT8")))
    assert q.translation.flags.get("cle")  # the case at stake: the vendor's default CLE
    outcome(lambda: q.quantize_model(str(src), str(out), FEEDS), input_path=src,
            expect_error=OutputError, match="input model")


def test_failed_write_leaves_an_existing_plan_untouched(src, tmp_path, monkeypatch, capsys):
    out = tmp_path / "plan.json"
    out.write_text("previous")
    monkeypatch.setattr(os, "write", _DiskFull(10))
    assert _run_cli(["plan", src, "-o", out]) == 2
    monkeypatch.undo()
    assert "disk is full" in capsys.readouterr().err
    assert out.read_text() == "previous"
    assert_clean_dir(tmp_path)
