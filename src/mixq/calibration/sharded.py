"""Sharded calibration: the statistics of contiguous shards of the calibration feeds, collected
on an executor's workers and merged in shard order. The statistics are exact and their merge is
plain integer addition plus min/max, so the merged statistics, and the quantized model, are the
same bytes for any shard count (see docs/SCALING.md)."""
from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import onnx

from .._shards import Executor, shard_bounds

__all__ = ["calibrate_sharded"]


def _calib_shard(shared: tuple[bytes, list[str], list[dict[str, np.ndarray]], str | None, Any, int,
                              dict[str, int]],
                 bounds: tuple[int, int, int, int]
                 ) -> tuple[dict[str, dict[str, Any]], dict[str, str], int, dict[str, Any] | None]:
    """Task: statistics of one shard of the feeds (feeds ``[lo, hi)``, samples ``[first,
    last)``), as plain data (``{name: TensorStats.to_dict()}``, ``{name: why skipped}``, feeds
    run, and the GPTQ grams' part of the shard when a GramTap came along)."""
    from .collect import collect_stats

    model_bytes, names, feeds, base_dir, tap, total, axes = shared
    lo, hi, first, last = bounds
    part = tap.shard(first, last, total) if tap is not None else None
    res = collect_stats(onnx.load_from_string(model_bytes), names, feeds[lo:hi],
                        base_dir=base_dir, tap=part, axes=axes)
    return ({n: s.to_dict() for n, s in res.items()}, dict(res.skipped), res.num_batches,
            part.partial() if part is not None else None)


def calibrate_sharded(model: onnx.ModelProto, tensor_names: Sequence[str], data: Any,
                      executor: Executor, *, shards: int | None = None,
                      base_dir: str | os.PathLike | None = None,
                      progress: Callable[[int], Any] | None = None, kept: Any = None,
                      tap: Any = None, axes: dict[str, int] | None = None) -> Any:
    """:func:`mixq.calibration.collect.collect_stats` of `data` split into `shards` (default
    ``executor.workers``) contiguous shards run on `executor`, merged in shard order: the same
    statistics as one pass. Initializers are read once here, not per shard. The data is read
    here once (every feed validated) and sent to the workers once. `progress` is called with
    every batch index once its shard's results are back; `kept` (mixq.fidelity.HeldBack, or a
    tuple of such observers with `add(feed)` and `finish()`) sees the feeds as they are read;
    `tap` (mixq.passes.gptq.GramTap, empty) is fed on the workers too, each shard's GPTQ
    statistics merged here into the same bytes as one pass; `axes` as collect_stats'. Returns a
    CollectResult."""
    from .collect import CollectResult, collect_stats
    from .data import FeedSource, feed_rows
    from .stats import TensorStats

    names = list(dict.fromkeys(tensor_names))
    inits = {t.name for t in model.graph.initializer}
    # initializers (and unknown names) need no data: once, here
    local = collect_stats(model, [n for n in names if n in inits], None, base_dir=base_dir, axes=axes)
    run_names = [n for n in names if n not in inits]
    feeds = [{k: np.asarray(v) for k, v in f.items()}
             for f in FeedSource(data, model)] if run_names else []
    observers = [o for o in (kept if isinstance(kept, tuple) else (kept,)) if o is not None]
    if run_names:
        for o in observers:
            for f in feeds:
                o.add(f)
            o.finish()
    merged: dict[str, TensorStats] = {}
    skipped: dict[str, str] = dict(local.skipped)
    n_batches = 0
    if run_names:
        bounds = shard_bounds(len(feeds), shards if shards is not None else executor.workers)
        starts = np.concatenate([[0], np.cumsum([feed_rows(f) for f in feeds])]).astype(int)
        shared = (model.SerializeToString(), run_names, feeds,
                  None if base_dir is None else str(base_dir), tap, int(starts[-1]), dict(axes or {}))
        items = [(lo, hi, int(starts[lo]), int(starts[hi])) for lo, hi in bounds]
        partials = []
        set_total = getattr(progress, "set_total", None)  # a mixq._progress.Progress
        if callable(set_total):
            set_total(len(feeds))
        for part_stats, part_skipped, nb, part_tap in executor.map(_calib_shard, items, shared):
            if part_tap is not None:
                partials.append(part_tap)
            for n, d in part_stats.items():  # in shard order (merging is exact in any order)
                s = TensorStats.from_dict(d)
                if n in merged:
                    merged[n].merge(s)
                else:
                    merged[n] = s
            skipped.update(part_skipped)
            if progress is not None:
                for i in range(n_batches, n_batches + nb):
                    progress(i)
            n_batches += nb
        if tap is not None:
            tap.merge(partials)
    out = {**local.stats, **{n: s for n, s in merged.items() if n not in skipped}}
    return CollectResult({n: out[n] for n in names if n in out}, skipped, n_batches)
