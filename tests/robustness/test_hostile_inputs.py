"""Every input checked at the door (issue 15): hostile .npz members, readers, endless
generators, dtype kinds, `mixq eval` labels and inputs, format block sizes, and `mixq inspect`
showing the formats in use."""
from __future__ import annotations

import io
import itertools
import tracemalloc
import warnings
import zipfile

import numpy as np
import onnx
import pytest

import mixq
from mixq.calibration import data as cdata
from mixq.calibration.data import CalibData, as_feeds
from mixq.cli.main import main
from mixq.errors import DataError, FormatError

from . import models as M
from .conftest import outcome

MLP = M.mlp(21)
X = np.random.default_rng(0).standard_normal((4, M.D)).astype(np.float32)


def _npy_header(shape, descr="<f4") -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": descr, "fortran_order": False,
                                               "shape": tuple(shape)})
    return buf.getvalue()


# ---------------------------------------------------------------------------- .npz members
def test_npz_bomb_is_streamed_not_read_whole(tmp_path):
    """A small .npz whose member inflates to 128 MB: reading a few feeds costs ~ one feed."""
    rows = 1 << 21  # x 16 float32 = 134 MB of zeros, ~130 kB compressed
    p = tmp_path / "bomb.npz"
    with zipfile.ZipFile(p, "w", zipfile.ZIP_DEFLATED) as z:
        with z.open("x.npy", "w", force_zip64=True) as f:
            f.write(_npy_header((rows, M.D)))
            chunk = bytes(1 << 22)
            for _ in range(rows * M.D * 4 // len(chunk)):
                f.write(chunk)
    assert p.stat().st_size < 2_000_000
    tracemalloc.start()
    try:
        feeds = list(itertools.islice(as_feeds(p, MLP), 8))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(feeds) == 8 and feeds[0]["x"].shape == (1, M.D)
    assert peak < 16e6, f"peak {peak / 1e6:.0f} MB: the member was read whole"


@pytest.mark.parametrize("member", ["x.npy", "x"])
def test_npz_member_of_raw_bytes(member, tmp_path):
    p = tmp_path / "raw.npz"
    with zipfile.ZipFile(p, "w") as z:
        z.writestr(member, b"just some raw bytes, not an array" * 4)
    outcome(lambda: mixq.quantize(MLP, "A8W8", p, check_kernels=False),
            expect_error=DataError, match=r"member 'x'.*not a \.npy array")


def test_npz_member_declaring_more_than_it_holds(tmp_path):
    p = tmp_path / "short.npz"
    with zipfile.ZipFile(p, "w") as z:
        z.writestr("x.npy", _npy_header((1000, M.D)) + X.tobytes())
    with pytest.raises(DataError, match=r"declares shape \(1000, 16\).*holds 256 bytes"):
        next(as_feeds(p, MLP))


def test_npz_member_of_objects_never_unpickled(tmp_path):
    p = tmp_path / "obj.npz"
    with zipfile.ZipFile(p, "w") as z:
        z.writestr("x.npy", _npy_header((1,), descr="|O") + b"\x80\x04N.")
    with pytest.raises(DataError, match="Python objects"):
        next(as_feeds(p, MLP))


def test_npz_still_reads_every_layout(tmp_path):
    """C order, Fortran order, big-endian and compressed members give the same feeds."""
    ref = [f["x"] for f in as_feeds({"x": X}, MLP)]
    for i, (arr, save) in enumerate([(X, np.savez), (X, np.savez_compressed),
                                     (np.asfortranarray(X), np.savez), (X.astype(">f4"), np.savez)]):
        p = tmp_path / f"d{i}.npz"
        save(p, x=arr)
        got = [f["x"] for f in as_feeds(p, MLP)]
        assert len(got) == len(ref) and all(np.array_equal(a, b) for a, b in zip(got, ref))
        # a second pass (the reader reopens the members) gives the same again
        src = cdata.FeedSource(p, MLP)
        assert [f["x"].tolist() for f in src] == [f["x"].tolist() for f in src]


# ---------------------------------------------------------------------------- readers / generators
class _StopIterationReader:
    """get_next() written as next(it): raises StopIteration at the end instead of None."""

    def __init__(self, feeds):
        self.feeds = feeds
        self.it = iter(feeds)

    def get_next(self):
        return next(self.it)

    def rewind(self):
        self.it = iter(self.feeds)


def test_reader_raising_stop_iteration_ends_the_data():
    feeds = [{"x": X[:2]}, {"x": X[2:]}]
    res = outcome(lambda: mixq.quantize(MLP, "A8W8", _StopIterationReader(feeds)), feed={"x": X})
    ref = mixq.quantize(MLP, "A8W8", feeds)
    assert res.model.SerializeToString() == ref.model.SerializeToString()


def _endless(limit=100_000):
    """A generator that never ends in practice (it fails loudly if read too far)."""
    for i in range(limit):
        yield {"x": X}
    raise AssertionError("the endless generator was read to its end")


def test_endless_generator_ends_at_the_default_bound(monkeypatch):
    monkeypatch.setattr(cdata, "DEFAULT_MAX_SAMPLES", 40, raising=False)
    with pytest.warns(UserWarning, match=r"more than 40 samples.*--calib-samples"):
        res = mixq.quantize(MLP, "A8W8", _endless(), check_kernels=False)
    assert res.model is not None


def test_calib_samples_bounds_a_source():
    seen = []

    def gen():
        for i in itertools.count():
            seen.append(i)
            yield {"x": X * (1 + (i >= 10))}  # samples past the bound would widen the ranges

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an explicit bound is no surprise: no warning
        res = mixq.quantize(MLP, "A8W8", CalibData(gen(), max_samples=10), check_kernels=False)
    ref = mixq.quantize(MLP, "A8W8", [{"x": X}] * 10, check_kernels=False)
    assert len(seen) == 10
    assert res.model.SerializeToString() == ref.model.SerializeToString()
    with pytest.raises(DataError, match="max_samples"):
        as_feeds([{"x": X}], MLP, max_samples=0)


# ---------------------------------------------------------------------------- dtype kinds
def test_uint8_images_into_float_input_refused_unless_cast():
    img = [{"x": (np.abs(X) * 60).astype(np.uint8)}]
    outcome(lambda: mixq.quantize(MLP, "A8W8", img, check_kernels=False), expect_error=DataError,
            match=r"input 'x' has dtype uint8 but the model expects float32.*--cast")
    res = mixq.quantize(MLP, "A8W8", CalibData(img, cast=True), check_kernels=False)
    ref = mixq.quantize(MLP, "A8W8", [{"x": img[0]["x"].astype(np.float32)}], check_kernels=False)
    assert res.model.SerializeToString() == ref.model.SerializeToString()
    # same kind: float64 -> float32 and int32 -> int64 stay automatic
    assert next(as_feeds([{"x": X.astype(np.float64)}], MLP))["x"].dtype == np.float32


def test_cli_quantize_cast_and_calib_samples(tmp_path, capsys):
    src = tmp_path / "m.onnx"
    onnx.save(MLP, src)
    calib = tmp_path / "c.npz"
    np.savez(calib, x=(np.abs(X) * 60).astype(np.uint8))
    out = tmp_path / "q.onnx"
    assert main(["quantize", str(src), str(out), "--calib", str(calib)]) == 2
    assert "--cast" in capsys.readouterr().err and not out.exists()
    assert main(["quantize", str(src), str(out), "--calib", str(calib), "--cast",
                 "--calib-samples", "2"]) == 0
    assert out.exists()
    assert main(["quantize", str(src), str(out), "--calib", str(calib),
                 "--calib-samples", "-3"]) == 2
    assert "--calib-samples -3" in capsys.readouterr().err
    assert main(["quantize", str(src), str(out), "--preset", "BF16", "--cast"]) == 2
    assert "no --calib was given" in capsys.readouterr().err


# ---------------------------------------------------------------------------- mixq eval
@pytest.fixture
def eval_files(tmp_path):
    fm = tmp_path / "f.onnx"
    onnx.save(MLP, fm)
    qm = tmp_path / "q.onnx"
    xs = np.random.default_rng(3).standard_normal((50, M.D)).astype(np.float32)
    data = tmp_path / "d.npz"
    np.savez(data, x=xs[:, None])  # 50 samples of shape (1, 16)
    mixq.quantize(MLP, "A8W8", [{"x": xs[:8]}], output_path=qm, check_kernels=False)
    return fm, qm, data, tmp_path


def _eval(files, labels_path, capsys, *extra):
    fm, qm, data, _ = files
    rc = main(["eval", str(fm), str(qm), "--data", str(data), "--labels", str(labels_path), *extra])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_eval_labels_checked(eval_files, capsys):
    tmp = eval_files[3]
    cases = {
        "missing": (tmp / "nope.npy", "does not exist"),
        "folder": (tmp, "is not a file"),
    }
    np.save(tmp / "pickled.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    cases["pickled"] = (tmp / "pickled.npy", "never unpickles")
    np.save(tmp / "short.npy", np.zeros(10, np.int64))
    cases["too_few"] = (tmp / "short.npy", "holds 10 labels.*more samples")
    np.save(tmp / "long.npy", np.zeros(80, np.int64))
    cases["too_many"] = (tmp / "long.npy", "holds 80 labels.*has 50 samples")
    np.save(tmp / "float.npy", np.zeros(50, np.float32))
    cases["float"] = (tmp / "float.npy", "dtype float32.*integer")
    np.save(tmp / "onehot.npy", np.zeros((50, 4), np.int64))
    cases["2d"] = (tmp / "onehot.npy", r"shape \(50, 4\)")
    import re

    for kind, (path, match) in cases.items():
        rc, out, err = _eval(eval_files, path, capsys)
        assert rc == 2 and "accuracy" not in out, kind
        assert re.search(match, err), (kind, err)
        assert "Traceback" not in err
    np.save(tmp / "good.npy", np.zeros(50, np.int64))
    rc, out, _ = _eval(eval_files, tmp / "good.npy", capsys)
    assert rc == 0 and "accuracy: float" in out


def test_eval_models_with_different_inputs(eval_files, capsys):
    fm, qm, data, tmp = eval_files
    q = onnx.load(qm)
    for n in q.graph.node:
        n.input[:] = ["image" if i == "x" else i for i in n.input]
    q.graph.input[0].name = "image"
    other = tmp / "other.onnx"
    onnx.save(q, other)
    assert main(["eval", str(fm), str(other), "--data", str(data)]) == 2
    err = capsys.readouterr().err
    assert "different inputs" in err and "x (float32)" in err and "image (float32)" in err


@pytest.mark.parametrize("case", ["float_does_not_load", "quant_does_not_load", "other_outputs"])
def test_eval_models_that_do_not_load_or_do_not_match(case, eval_files, capsys):
    """A model onnxruntime refuses (an IR version above what it supports) ended `mixq eval`
    in onnxruntime's traceback; a quantized model without the float model's outputs, in a
    KeyError-like failure of its run. Each is a clear error now, naming the model."""
    fm, qm, data, tmp = eval_files
    m = onnx.load(fm if case == "float_does_not_load" else qm)
    if case == "other_outputs":
        m.graph.output[0].name = "renamed"
        for n in m.graph.node:
            n.output[:] = ["renamed" if o == onnx.load(fm).graph.output[0].name else o for o in n.output]
    else:
        m.ir_version = 99
    bad = tmp / f"{case}.onnx"
    onnx.save(m, bad)
    args = [str(bad), str(qm)] if case == "float_does_not_load" else [str(fm), str(bad)]
    assert main(["eval", *args, "--data", str(data)]) == 2
    err = capsys.readouterr().err
    want = {"float_does_not_load": "the float model does not load in onnxruntime",
            "quant_does_not_load": "the quantized model does not load in onnxruntime",
            "other_outputs": "the quantized model has no output"}[case]
    assert want in err and "Traceback" not in err, err


# ---------------------------------------------------------------------------- formats
@pytest.mark.parametrize("name", ["bfp(block=100000000)", "bfp(block=4097,exp=8,mant=4)"])
def test_huge_block_size_refused(name):
    with pytest.raises(FormatError, match=r"block=\d+ is above the largest block size 4096"):
        mixq.formats.get_format(name)
    assert mixq.formats.get_format("bfp(block=4096)").block_size == 4096


# ---------------------------------------------------------------------------- inspect
def test_inspect_shows_formats_in_use_and_deployed_size(tmp_path, capsys):
    q = tmp_path / "q.onnx"
    res = mixq.quantize(MLP, "A16W8", [{"x": X}], output_path=q, check_kernels=False)
    assert main(["inspect", str(q)]) == 0
    out = capsys.readouterr().out
    assert "| activation | QDQ int16 |" in out and "| weight | QDQ int8 |" in out
    weights = sum(len(t.raw_data) for t in res.model.graph.initializer)
    assert f"deployed weights {weights / 1e6:.3f} MB" in out
    b = tmp_path / "b.onnx"
    mixq.quantize(MLP, "BFP16", None, output_path=b)
    assert main(["inspect", str(b)]) == 0
    out = capsys.readouterr().out
    assert "| weight | mixq BFP16 | 2 |" in out and "| activation | mixq BFP16 |" in out



def test_progress_total_is_the_bounded_count():
    """The calibration progress total says what will be read, not what the file holds."""
    totals = []

    class Tick:
        def __call__(self, i):
            pass

        def set_total(self, n):
            totals.append(n)

    stack = {"x": np.repeat(X[:, None], 5, axis=0)}  # 20 samples
    mixq.quantize(MLP, "A8W8", CalibData(stack, max_samples=3), progress=Tick(), check_kernels=False)
    mixq.quantize(MLP, "A8W8", stack, progress=Tick(), check_kernels=False)
    assert totals == [3, 20]


def test_eval_labels_for_a_non_classifier_output(tmp_path, capsys):
    m = onnx.parser.parse_model("""<ir_version: 10, opset_import: ["" : 21]>
        g (float[N, 16] x) => (float[N, 4, 4] y) {
            s = Constant<value_ints = [-1, 4, 4]>()
            y = Reshape(x, s)
        }""")
    fm = tmp_path / "f.onnx"
    onnx.save(m, fm)
    data = tmp_path / "d.npz"
    np.savez(data, x=X)
    np.save(tmp_path / "l.npy", np.zeros(4, np.int64))
    rc = main(["eval", str(fm), str(fm), "--data", str(data), "--labels", str(tmp_path / "l.npy")])
    err = capsys.readouterr().err
    assert rc == 2 and "must be (batch, classes)" in err and "(N, 4, 4)" in err, err


def test_npz_member_with_damaged_compressed_data(tmp_path):
    p = tmp_path / "d.npz"
    np.savez_compressed(p, x=np.random.default_rng(1).standard_normal((64, M.D)).astype(np.float32))
    raw = bytearray(p.read_bytes())
    start = raw.index(b"x.npy") + 200  # inside the deflate stream, after the .npy header
    raw[start:start + 64] = bytes(64)
    p.write_bytes(bytes(raw))
    with pytest.raises(DataError, match=r"member 'x'|cannot read"):
        list(as_feeds(p, MLP))


def test_wrapped_calibration_file_is_still_protected(tmp_path):
    """CalibData(path) hides the path from a naive check: the output guard must unwrap it."""
    from mixq.errors import OutputError

    mlp = M.mlp(21)
    src = tmp_path / "m.onnx"
    src.write_bytes(mlp.SerializeToString())
    calib = tmp_path / "calib.npz"
    np.savez(calib, x=np.random.default_rng(0).standard_normal((8, 16)).astype(np.float32))
    before = calib.read_bytes()
    with pytest.raises(OutputError, match="input file"):
        mixq.quantize(src, "A8W8", CalibData(str(calib), max_samples=4), output_path=calib)
    assert calib.read_bytes() == before
