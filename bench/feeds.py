"""Lists of onnxruntime feed dicts stored in one .npz file (keys ``<batch index>/<input name>``)."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import onnx

Feed = dict[str, np.ndarray]


def save_feeds(path: Path, feeds: list[Feed]) -> None:
    """Write `feeds` (a list of feed dicts) to `path` (.npz, uncompressed)."""
    arrays = {f"{i:05d}/{name}": np.asarray(v) for i, feed in enumerate(feeds)
              for name, v in feed.items()}
    np.savez(path, **arrays)


def load_feeds(path: Path) -> list[Feed]:
    """Read a list of feed dicts written by :func:`save_feeds`, in order."""
    out: dict[int, Feed] = {}
    with np.load(path, allow_pickle=False) as z:
        for key in z.files:
            idx, name = key.split("/", 1)
            out.setdefault(int(idx), {})[name] = z[key]
    return [out[i] for i in sorted(out)]


def batched(x: np.ndarray, name: str, batch: int) -> list[Feed]:
    """Cut a stack of samples into feeds of `batch` samples for input `name`."""
    return [{name: np.ascontiguousarray(x[i:i + batch])} for i in range(0, len(x), batch)]


def first_sample(feeds: list[Feed]) -> Feed:
    """A batch-1 feed: the first sample of the first feed (for latency)."""
    return {k: np.ascontiguousarray(v[:1]) if v.ndim else v for k, v in feeds[0].items()}


def fresh_sqnr(model: "onnx.ModelProto", qmodel: "onnx.ModelProto", feeds: list[Feed]) -> float:
    """The first output's SQNR (dB) of `qmodel` against `model` over `feeds`, in plain onnxruntime
    (default optimizations, CPU): the sweeps' check of mixq's claims, independent of its guard."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    a, b = (ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"]) for m in (model, qmodel))
    ref = np.concatenate([a.run(None, f)[0].ravel() for f in feeds])
    got = np.concatenate([b.run(None, f)[0].ravel() for f in feeds])
    err = float(np.sum((ref - got) ** 2))
    return 10 * np.log10(float(np.sum(ref ** 2)) / err) if err > 0 else float("inf")
