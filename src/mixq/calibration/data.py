"""Calibration data: every accepted kind of input turned into validated feed dicts.

Accepted `data` (see :func:`as_feeds`):

* an onnxruntime-style data reader: an object with ``get_next()`` returning a feed dict or
  ``None`` at the end; ``rewind()`` (if present) is called before every pass after the first;
* any iterable of feed dicts (a list, a generator...);
* a mapping ``{input name: array}`` or a single array (single-input models), whose first axis
  holds samples (see "arrays" below);
* a path to a ``.npz`` file (keys = input names) or a ``.npy`` file (single-input models; opened
  memory-mapped, so it is never read whole);
* a path to a folder of ``.npy`` / ``.npz`` files, read one file at a time in sorted name order.

Arrays (from files, mappings or single arrays) are split into feeds: an array with one more
dimension than the model input is a stack of samples, each fed on its own; an array with the
input's rank is cut along its first (batch) axis into pieces of the input's static first dim,
or of `batch_size` (default 1) when that dim is dynamic. Statistics do not depend on the split.

Every feed is validated: unknown or missing input names, wrong rank, static dims that differ
and dtypes that cannot be converted without changing values raise :class:`DataError`. Files are
read with ``allow_pickle=False``.
"""
from __future__ import annotations

import os
import zipfile
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from mixq.errors import DataError, did_you_mean

__all__ = ["InputSpec", "input_specs_from_model", "as_feeds", "FeedSource", "validate_feed"]


@dataclass(frozen=True)
class InputSpec:
    """One model input: name, numpy dtype, shape (int = static dim, None/str = dynamic)."""

    name: str
    dtype: np.dtype
    shape: tuple[int | str | None, ...] | None  # None: rank unknown

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", np.dtype(self.dtype))
        if self.shape is not None:
            object.__setattr__(self, "shape", tuple(self.shape))

    @property
    def shape_str(self) -> str:
        if self.shape is None:
            return "(any)"
        return "(" + ", ".join("?" if d is None else str(d) for d in self.shape) + \
            ("," if len(self.shape) == 1 else "") + ")"


def _np_dtype(elem_type: int) -> np.dtype:
    try:
        return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type))
    except (KeyError, TypeError, ValueError):
        return np.dtype(np.float32)


def input_specs_from_model(model: onnx.ModelProto) -> list[InputSpec]:
    """The feedable inputs of `model` (graph inputs that are not initializers)."""
    inits = {i.name for i in model.graph.initializer}
    specs = []
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        tt = vi.type.tensor_type
        shape: tuple[int | str | None, ...] | None = None
        if tt.HasField("shape"):
            shape = tuple(d.dim_value if d.HasField("dim_value") else
                          (d.dim_param or None) for d in tt.shape.dim)
        specs.append(InputSpec(vi.name, _np_dtype(tt.elem_type), shape))
    return specs


def _specs(input_specs: Any) -> list[InputSpec]:
    if isinstance(input_specs, onnx.ModelProto):
        return input_specs_from_model(input_specs)
    out = []
    for s in input_specs:
        if isinstance(s, InputSpec):
            out.append(s)
        elif isinstance(s, (tuple, list)) and len(s) == 3:
            out.append(InputSpec(*s))
        else:
            raise TypeError(f"input spec must be an InputSpec or (name, dtype, shape), got {s!r}")
    if not out:
        raise DataError("the model has no inputs to feed")
    return out


# ---------------------------------------------------------------------------- validation
def _convert(name: str, arr: np.ndarray, dtype: np.dtype) -> np.ndarray:
    if dtype.kind == "O":  # an ONNX string tensor: onnxruntime takes str and object arrays
        if arr.dtype.kind not in "OU" or (arr.dtype.kind == "O" and arr.size
                                           and not all(isinstance(v, str) for v in arr.flat)):
            raise DataError(f"input {name!r} is a string tensor but the data has dtype "
                            f"{arr.dtype}; give an array of str")
        return arr
    if arr.dtype == dtype:
        return arr
    if arr.dtype.kind not in "biuf" or dtype.kind not in "biuf":
        raise DataError(f"input {name!r} has dtype {arr.dtype} but the model expects {dtype}; "
                        "convert the data to the expected dtype")
    if np.can_cast(arr.dtype, dtype, casting="safe"):
        return arr.astype(dtype)
    with np.errstate(over="ignore", invalid="ignore"):
        out = arr.astype(dtype)
        if arr.dtype.kind == "f" and dtype.kind == "f":
            # float -> narrower float: rounding is accepted, overflow to inf is not
            ok = np.array_equal(np.isfinite(out), np.isfinite(arr))
        else:
            ok = np.array_equal(out.astype(arr.dtype), arr, equal_nan=arr.dtype.kind == "f")
    if not ok:
        raise DataError(f"input {name!r} has dtype {arr.dtype} but the model expects {dtype}, "
                        f"and converting changes values; convert the data to {dtype} yourself")
    return out


def _check_names(keys: Iterable[Any], names: list[str], at: str, expected: str) -> None:
    """DataError for a key that is not a model input, or a model input with no key."""
    keys = list(keys)
    for k in keys:
        if k not in names:
            raise DataError(f"calibration data has an unknown input {k!r}{at}; the model "
                            f"inputs are: {', '.join(names)}.{did_you_mean(str(k), names)}")
    missing = [n for n in names if n not in keys]
    if missing:
        raise DataError(f"calibration data lacks model input(s) {', '.join(map(repr, missing))}"
                        f"{at}; {expected}: {', '.join(names)}")


def validate_feed(feed: Any, specs: Sequence[InputSpec], where: str = "") -> dict[str, np.ndarray]:
    """Check one feed dict against the model inputs; returns it with dtypes converted."""
    at = f" (in {where})" if where else ""
    if not isinstance(feed, Mapping):
        raise DataError(f"each calibration sample must be a dict {{input name: array}}, got "
                        f"{type(feed).__name__}{at}; expected names: "
                        f"{', '.join(s.name for s in specs)}")
    _check_names(feed, [s.name for s in specs], at, "every sample must feed")
    out = {}
    for s in specs:
        v = feed[s.name]
        try:
            arr = np.asarray(v)
        except Exception as e:  # noqa: BLE001 - anything not array-like
            raise DataError(f"input {s.name!r}{at} is not array-like ({type(v).__name__})") from e
        if arr.dtype == object and s.dtype.kind != "O":
            raise DataError(f"input {s.name!r}{at} is an object array; expected {s.dtype}")
        if s.shape is not None:
            if arr.ndim != len(s.shape):
                raise DataError(f"input {s.name!r}{at} has shape {tuple(arr.shape)} (rank "
                                f"{arr.ndim}) but the model expects shape {s.shape_str} (rank "
                                f"{len(s.shape)})")
            bad = [i for i, (g, e) in enumerate(zip(arr.shape, s.shape))
                   if isinstance(e, int) and e > 0 and g != e]
            if bad:
                raise DataError(f"input {s.name!r}{at} has shape {tuple(arr.shape)} but the model "
                                f"expects shape {s.shape_str} (dim {bad[0]} must be "
                                f"{s.shape[bad[0]]})")
        out[s.name] = _convert(s.name, arr, s.dtype)
    return out


# ---------------------------------------------------------------------------- array sources
def _split_arrays(arrays: Mapping[str, np.ndarray], specs: Sequence[InputSpec], batch_size: int,
                  where: str) -> Iterator[dict[str, Any]]:
    """Cut {name: array-with-samples} into feeds (see the module docstring)."""
    names = [s.name for s in specs]
    _check_names(arrays, names, f" (in {where})", "expected arrays named")
    plans = {}
    n_items = set()
    for s in specs:
        a = arrays[s.name]
        rank = None if s.shape is None else len(s.shape)
        if rank is not None and a.ndim == rank + 1:
            plans[s.name] = ("stack", 1)
            n_items.add(a.shape[0])
        elif rank is None or a.ndim == rank:
            if a.ndim == 0:
                plans[s.name] = ("whole", 1)
                n_items.add(None)
                continue
            d0 = s.shape[0] if s.shape else None
            step = d0 if isinstance(d0, int) and d0 > 0 else batch_size
            if a.shape[0] % step:
                raise DataError(f"input {s.name!r} (in {where}) has {a.shape[0]} rows along its "
                                f"first axis, not a multiple of the model's batch dim {step}")
            plans[s.name] = ("batch", step)
            n_items.add(-(-a.shape[0] // step))
        else:
            raise DataError(f"input {s.name!r} (in {where}) has shape {tuple(a.shape)} but the "
                            f"model expects shape {s.shape_str}: give an array of rank "
                            f"{rank} (a batch) or {rank + 1} (a stack of samples)")
    counts = {c for c in n_items if c is not None}
    if len(counts) > 1:
        raise DataError(f"the arrays in {where} hold different numbers of samples "
                        f"({', '.join(f'{k}: {arrays[k].shape[0]}' for k in names if arrays[k].ndim)})")
    n = counts.pop() if counts else 1
    for i in range(n):
        feed = {}
        for name in names:
            kind, step = plans[name]
            a = arrays[name]
            feed[name] = a if kind == "whole" else (a[i] if kind == "stack" else
                                                    a[i * step:(i + 1) * step])
            feed[name] = np.ascontiguousarray(feed[name])  # materialize one piece of a memmap
        yield feed


def _load_file(path: Path, specs: Sequence[InputSpec]) -> Mapping[str, np.ndarray]:
    suffix = path.suffix.lower()
    try:
        if suffix == ".npy":
            if len(specs) != 1:
                raise DataError(f"{path} is a .npy file, which can only feed a single-input "
                                f"model; this model has inputs {', '.join(s.name for s in specs)}"
                                ": use a .npz with one array per input name")
            return {specs[0].name: np.load(path, mmap_mode="r", allow_pickle=False)}
        if suffix == ".npz":
            with np.load(path, allow_pickle=False) as z:
                return {k: z[k] for k in z.files}
    except DataError:
        raise
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
        raise DataError(f"cannot read calibration data file {path}: {e}; is it a complete "
                        ".npy/.npz written by numpy.save/savez?") from e
    raise DataError(f"unsupported calibration data file {path}: expected .npy or .npz")


def _path_source(path: Path, specs: Sequence[InputSpec], batch_size: int) -> Iterator[dict]:
    if not path.exists():
        raise DataError(f"calibration data path {path} does not exist")
    if path.is_dir():
        files = sorted(p for p in path.iterdir()
                       if p.is_file() and p.suffix.lower() in (".npy", ".npz"))
        if not files:
            raise DataError(f"calibration data is empty: folder {path} holds no .npy or .npz files")
        for f in files:
            yield from _split_arrays(_load_file(f, specs), specs, batch_size, str(f))
    else:
        yield from _split_arrays(_load_file(path, specs), specs, batch_size, str(path))


# ---------------------------------------------------------------------------- sources
class FeedSource:
    """A re-iterable view of calibration data: every ``iter()`` is one validated pass.

    A reader is rewound (``rewind()``) before every pass but the first; a one-shot iterator
    (e.g. a generator) can be passed over only once and raises DataError on a second pass.
    """

    def __init__(self, data: Any, input_specs: Any, *, batch_size: int = 1) -> None:
        if data is None:
            raise DataError("calibration data is empty: got None; pass a data reader, an "
                            "iterable of feed dicts, arrays, or a .npy/.npz file or folder")
        if not isinstance(batch_size, int) or batch_size < 1:
            raise DataError(f"batch_size must be a positive integer, got {batch_size!r}")
        self.data = data
        self.specs = _specs(input_specs)
        self.batch_size = batch_size
        self._passes = 0

    def _raw(self, again: bool) -> Iterator[tuple[Any, str]]:
        d, specs = self.data, self.specs
        if isinstance(d, (str, os.PathLike)):
            for i, f in enumerate(_path_source(Path(d), specs, self.batch_size)):
                yield f, f"{d} item {i}"
        elif isinstance(d, np.ndarray):
            if len(specs) != 1:
                raise DataError("a single array can only feed a single-input model; this model "
                                f"has inputs {', '.join(s.name for s in specs)}: pass a dict "
                                "{name: array} or feed dicts")
            for i, f in enumerate(_split_arrays({specs[0].name: d}, specs, self.batch_size,
                                                "the array")):
                yield f, f"sample {i}"
        elif isinstance(d, Mapping):
            arrays = {k: np.asarray(v) for k, v in d.items()}
            for i, f in enumerate(_split_arrays(arrays, specs, self.batch_size, "the arrays")):
                yield f, f"sample {i}"
        elif callable(getattr(d, "get_next", None)):
            if again:
                rewind: Callable[[], Any] | None = getattr(d, "rewind", None)
                if not callable(rewind):
                    raise DataError("the calibration data reader has no rewind() method, so it "
                                    "cannot be read a second time; add rewind() or pass a list")
                rewind()
            i = 0
            while True:
                f = d.get_next()
                if f is None:
                    break
                yield f, f"reader item {i}"
                i += 1
        elif isinstance(d, Iterable):
            if again and iter(d) is d:
                raise DataError("the calibration data is a one-shot iterator (e.g. a generator) "
                                "that was already consumed; pass a list or a reader with "
                                "rewind() when several passes are needed")
            for i, f in enumerate(d):
                yield f, f"item {i}"
        else:
            raise DataError(f"unsupported calibration data of type {type(d).__name__}; pass a "
                            "data reader (get_next()), an iterable of feed dicts, arrays, or a "
                            ".npy/.npz file or folder")

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        n = 0
        raw = self._raw(again=self._passes > 0)
        self._passes += 1
        for feed, where in raw:
            yield validate_feed(feed, self.specs, where)
            n += 1
        if n == 0:
            raise DataError("calibration data is empty: it produced no samples; expected feed "
                            f"dicts for inputs {', '.join(s.name for s in self.specs)}")


def as_feeds(data: Any, input_specs: Any, *, batch_size: int = 1) -> Iterator[dict[str, np.ndarray]]:
    """One validated pass over calibration `data` as feed dicts ``{input name: array}``.

    `input_specs`: a list of :class:`InputSpec` (or ``(name, dtype, shape)`` tuples) or the
    ``onnx.ModelProto`` itself. `batch_size`: rows per feed when arrays are split along a dynamic
    batch axis. Errors (:class:`DataError`) are raised lazily, when the bad item is reached; an
    empty source raises when the iteration ends without a single feed.
    """
    return iter(FeedSource(data, input_specs, batch_size=batch_size))
