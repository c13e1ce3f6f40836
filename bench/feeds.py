"""Lists of onnxruntime feed dicts stored in one .npz file (keys ``<batch index>/<input name>``)."""
from __future__ import annotations

from pathlib import Path

import numpy as np

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
