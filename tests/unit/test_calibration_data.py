"""as_feeds / FeedSource: every data kind and every error case."""
from __future__ import annotations

import numpy as np
import pytest

from mixq.calibration import FeedSource, InputSpec, as_feeds
from mixq.errors import DataError

SPECS = [InputSpec("image", np.float32, (None, 3, 4, 4)), InputSpec("mask", np.int64, ("N", 2))]
ONE = [InputSpec("x", np.float32, (1, 3, 4))]


def _feed(n=2, seed=0):
    rng = np.random.default_rng(seed)
    return {"image": rng.standard_normal((n, 3, 4, 4)).astype(np.float32),
            "mask": rng.integers(0, 5, (n, 2))}


def _cat(feeds, name):
    return np.concatenate([f[name] for f in feeds])


class Reader:
    def __init__(self, feeds, rewindable=True):
        self.feeds, self.i = feeds, 0
        if rewindable:
            self.rewind = self._rewind

    def get_next(self):
        if self.i >= len(self.feeds):
            return None
        self.i += 1
        return self.feeds[self.i - 1]

    def _rewind(self):
        self.i = 0


def test_iterables_and_readers():
    feeds = [_feed(2, s) for s in range(3)]
    assert len(list(as_feeds(feeds, SPECS))) == 3
    assert len(list(as_feeds((f for f in feeds), SPECS))) == 3
    src = FeedSource(Reader(feeds), SPECS)
    a, b = list(src), list(src)  # rewind() gives a second pass
    assert len(a) == len(b) == 3 and np.array_equal(a[2]["image"], b[2]["image"])
    src = FeedSource(Reader(feeds, rewindable=False), SPECS)
    list(src)
    with pytest.raises(DataError, match="rewind"):
        list(src)
    gen = FeedSource((f for f in feeds), SPECS)
    list(gen)
    with pytest.raises(DataError, match="one-shot"):
        list(gen)
    src = FeedSource(feeds, SPECS)
    assert len(list(src)) == len(list(src)) == 3  # lists are re-iterable


def test_npz_npy_folder(tmp_path):
    f = _feed(6)
    np.savez(tmp_path / "d.npz", **f)
    feeds = list(as_feeds(tmp_path / "d.npz", SPECS))
    assert len(feeds) == 6 and feeds[0]["image"].shape == (1, 3, 4, 4)  # batch_size 1
    assert np.array_equal(_cat(feeds, "image"), f["image"])
    feeds = list(as_feeds(str(tmp_path / "d.npz"), SPECS, batch_size=3))
    assert len(feeds) == 2 and np.array_equal(_cat(feeds, "mask"), f["mask"])
    # .npy, single input with static batch 1: a stack of samples (rank + 1) or a batch (rank)
    x = np.random.default_rng(0).standard_normal((5, 1, 3, 4)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    feeds = list(as_feeds(tmp_path / "x.npy", ONE))
    assert len(feeds) == 5 and feeds[4]["x"].shape == (1, 3, 4)
    np.save(tmp_path / "x2.npy", x[:, 0])
    assert len(list(as_feeds(tmp_path / "x2.npy", ONE))) == 5
    # a folder: files in sorted name order, one at a time
    d = tmp_path / "folder"
    d.mkdir()
    for i in (2, 0, 1):
        np.save(d / f"s{i}.npy", x[i])
    (d / "notes.txt").write_text("ignored")
    feeds = list(as_feeds(d, ONE))
    assert [float(fd["x"][0, 0, 0]) for fd in feeds] == [float(x[i, 0, 0, 0]) for i in range(3)]
    d2 = tmp_path / "npzs"
    d2.mkdir()
    np.savez(d2 / "a.npz", **_feed(2, 1))
    np.savez(d2 / "b.npz", **_feed(2, 2))
    assert len(list(as_feeds(d2, SPECS))) == 4


def test_arrays_and_mappings():
    x = np.zeros((4, 1, 3, 4), np.float32)
    assert len(list(as_feeds(x, ONE))) == 4
    assert len(list(as_feeds(_feed(4), SPECS, batch_size=2))) == 2
    # along a dynamic batch axis the last feed may be short; rows are all used, in order
    feeds = list(as_feeds(_feed(5), SPECS, batch_size=2))
    assert [len(f["image"]) for f in feeds] == [2, 2, 1]
    assert np.array_equal(_cat(feeds, "mask"), _feed(5)["mask"])
    # a fixed batch dim must be filled
    with pytest.raises(DataError, match="not a multiple of the model's batch dim 2"):
        list(as_feeds(np.zeros((3, 4), np.float32), [InputSpec("x", np.float32, (2, 4))]))
    # inputs cut along a dynamic axis must agree on rows, even when they make as many feeds
    uneven = {"image": _feed(5)["image"], "mask": _feed(6)["mask"]}
    with pytest.raises(DataError, match="different numbers of samples"):
        list(as_feeds(uneven, SPECS, batch_size=3))


def test_dtype_conversion():
    f = _feed(2)
    f["image"] = f["image"].astype(np.float64)
    f["mask"] = f["mask"].astype(np.int32)
    out = next(as_feeds([f], SPECS))
    assert out["image"].dtype == np.float32 and out["mask"].dtype == np.int64
    f = _feed(2)
    f["mask"] = f["mask"] + 0.5
    with pytest.raises(DataError, match=r"'mask' has dtype float64 but the model expects int64"):
        next(as_feeds([f], SPECS))
    f = _feed(2)
    f["image"] = np.full((2, 3, 4, 4), 1e300)
    with pytest.raises(DataError, match="changes values"):
        next(as_feeds([f], SPECS))
    f = _feed(2)
    f["image"] = f["image"].astype(str)
    with pytest.raises(DataError, match="dtype"):
        next(as_feeds([f], SPECS))


def test_name_errors():
    f = _feed()
    f["imagee"] = f.pop("image")
    with pytest.raises(DataError, match=r"unknown input 'imagee'.*image, mask.*Did you mean: image"):
        next(as_feeds([f], SPECS))
    f = _feed()
    del f["mask"]
    with pytest.raises(DataError, match=r"lacks model input\(s\) 'mask'"):
        next(as_feeds([f], SPECS))
    with pytest.raises(DataError, match="must be a dict"):
        next(as_feeds([np.zeros(3)], SPECS))


def test_shape_errors():
    f = _feed()
    f["image"] = f["image"][:, :2]
    with pytest.raises(DataError, match=r"'image'.*\(2, 2, 4, 4\).*\(\?, 3, 4, 4\)"):
        next(as_feeds([f], SPECS))
    f = _feed()
    f["image"] = f["image"][0]
    with pytest.raises(DataError, match=r"'image'.*rank 3.*rank 4"):
        next(as_feeds([f], SPECS))
    with pytest.raises(DataError, match=r"'x'.*shape \(2, 2\)"):
        next(as_feeds(np.zeros((2, 2), np.float32), ONE))
    bad = _feed(4)
    bad["mask"] = bad["mask"][:3]
    with pytest.raises(DataError, match="different numbers of samples"):
        list(as_feeds(bad, SPECS))


def test_empty_and_bad_sources(tmp_path):
    with pytest.raises(DataError, match="calibration data is empty"):
        list(as_feeds([], SPECS))
    with pytest.raises(DataError, match="calibration data is empty"):
        list(as_feeds(Reader([]), SPECS))
    with pytest.raises(DataError, match="calibration data is empty"):
        as_feeds(None, SPECS)
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="calibration data is empty.*no .npy or .npz"):
        list(as_feeds(tmp_path / "empty", SPECS))
    with pytest.raises(DataError, match="does not exist"):
        list(as_feeds(tmp_path / "nope.npz", SPECS))
    (tmp_path / "d.txt").write_text("x")
    with pytest.raises(DataError, match="unsupported calibration data file"):
        list(as_feeds(tmp_path / "d.txt", SPECS))
    np.save(tmp_path / "x.npy", np.zeros((2, 3, 4, 4), np.float32))
    with pytest.raises(DataError, match="single-input"):
        list(as_feeds(tmp_path / "x.npy", SPECS))
    np.save(tmp_path / "obj.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(DataError, match="cannot read"):
        list(as_feeds(tmp_path / "obj.npy", ONE))  # never unpickles
    (tmp_path / "broken.npz").write_bytes(b"not a zip")
    with pytest.raises(DataError, match="cannot read"):
        list(as_feeds(tmp_path / "broken.npz", SPECS))
    with pytest.raises(DataError, match="unsupported calibration data of type int"):
        list(as_feeds(3, SPECS))
    with pytest.raises(DataError, match="batch_size"):
        as_feeds([_feed()], SPECS, batch_size=0)


def test_npz_keyed_by_sample_and_input(tmp_path):
    """SAMPLE/INPUT keys (the layout `mixq auto` documents) feed every command the same way: one
    feed per sample in key order, never joined or cut, a batch axis added where it is missing."""
    rng = np.random.default_rng(3)
    arrays = {}
    for i in (2, 0, 1):  # stored out of order: read in key order
        arrays[f"{i:05d}/image"] = rng.standard_normal((3, 4, 4) if i else (2, 3, 4, 4)).astype(np.float32)
        arrays[f"{i:05d}/mask"] = rng.integers(0, 5, (1, 2) if i else (2, 2))
    np.savez(tmp_path / "s.npz", **arrays)
    feeds = list(as_feeds(str(tmp_path / "s.npz"), SPECS, batch_size=1))
    assert [f["image"].shape[0] for f in feeds] == [2, 1, 1]  # sample 0 keeps its two rows
    for i, f in enumerate(feeds):
        img = arrays[f"{i:05d}/image"]
        assert np.array_equal(f["image"], img if img.ndim == 4 else img[None])
        assert np.array_equal(f["mask"], arrays[f"{i:05d}/mask"])


def test_npz_keyed_by_sample_errors_and_slashed_input_names(tmp_path):
    x = np.zeros((3, 4, 4), np.float32)
    np.savez(tmp_path / "mixed.npz", **{"00000/image": x, "image": x[None], "mask": np.zeros((1, 2), np.int64)})
    with pytest.raises(DataError, match="SAMPLE/INPUT"):
        list(as_feeds(str(tmp_path / "mixed.npz"), SPECS))
    np.savez(tmp_path / "typo.npz", **{"00000/imgae": x, "00000/mask": np.zeros((1, 2), np.int64)})
    with pytest.raises(DataError, match="Did you mean: image"):
        list(as_feeds(str(tmp_path / "typo.npz"), SPECS))
    # input names that hold a '/' themselves (TensorFlow exports): the keys are input names
    specs = [InputSpec("serving/x", np.float32, (None, 3))]
    np.savez(tmp_path / "named.npz", **{"serving/x": np.ones((4, 3), np.float32)})
    assert len(list(as_feeds(str(tmp_path / "named.npz"), specs, batch_size=2))) == 2
    np.savez(tmp_path / "named_s.npz", **{"00000/serving/x": np.ones((1, 3), np.float32),
                                           "00001/serving/x": np.ones(3, np.float32)})
    assert [f["serving/x"].shape for f in as_feeds(str(tmp_path / "named_s.npz"), specs)] == [(1, 3), (1, 3)]
