"""Calibration data: every accepted kind of input turned into validated feed dicts.

Accepted `data` (see :func:`as_feeds`):

* an onnxruntime-style data reader: an object with ``get_next()`` returning a feed dict or
  ``None`` at the end; ``rewind()`` (if present) is called before every pass after the first;
* any iterable of feed dicts (a list, a generator...);
* a mapping ``{input name: array}`` or a single array (single-input models), whose first axis
  holds samples (see "arrays" below);
* a path to a ``.npz`` file (keys = input names; each member's .npy header is read and checked
  first, then its rows are decompressed forward, one feed at a time, so it is never read whole),
  or an ``.npz`` keyed ``SAMPLE/INPUT`` (``00000/image``): one feed per sample, in key order,
  each as it is stored (an array one dimension short of its input gets the batch axis);
  or a ``.npy`` file (single-input models; opened memory-mapped, so it is never read whole);
* a path to a folder of ``.npy`` / ``.npz`` files, read one file at a time in sorted name order.

Arrays (from files, mappings or single arrays) are split into feeds: an array with one more
dimension than the model input is a stack of samples, each fed on its own; an array with the
input's rank is cut along its first (batch) axis into pieces of the input's static first dim,
or of `batch_size` (default 1) when that dim is dynamic (the last piece may then be shorter).
Statistics do not depend on the split.

Every feed is validated: unknown or missing input names, wrong rank, static dims that differ
and dtypes of another kind raise :class:`DataError`. Dtypes: data of the input's dtype is used as
is; another dtype of the same kind is converted when no value changes (int -> int exactly,
float -> float rounding but never overflowing to inf); a change of kind (uint8 images into a
float32 input, floats into an integer input) is refused unless ``cast=True`` (``--cast``), which
converts any exact or rounding conversion. Files are read with ``allow_pickle=False``.

Limits (see docs/DATA.md): a pass reads at most `max_samples` feeds (default
:data:`DEFAULT_MAX_SAMPLES`; ``None`` = no bound), so an endless generator ends; one feed read
from a file holds at most :data:`MAX_FEED_BYTES`; a Fortran-ordered .npz member (which cannot be
read row by row) at most :data:`MAX_WHOLE_MEMBER_BYTES`.
"""
from __future__ import annotations

import math
import os
import warnings
import zipfile
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from mixq.errors import DataError, did_you_mean

__all__ = ["InputSpec", "feed_rows", "input_specs_from_model", "as_feeds", "readable_twice", "FeedSource", "CalibData",
           "validate_feed", "DEFAULT_MAX_SAMPLES", "MAX_FEED_BYTES", "MAX_WHOLE_MEMBER_BYTES"]

#: Feeds one pass reads by default; more are left unread (with a warning naming the bound).
DEFAULT_MAX_SAMPLES = 4096
#: Bytes of one feed read from a file (the memory a file source costs at once).
MAX_FEED_BYTES = 1 << 30
#: Bytes of an .npz member that must be read whole (Fortran order cannot be read row by row).
MAX_WHOLE_MEMBER_BYTES = 1 << 30


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


def feed_rows(feed: Mapping[str, Any]) -> int:
    """The samples of one feed as a calibration pass counts them (its first input's first
    axis; 1 for a scalar or an empty feed): sample indices (GPTQ's draws and blocks, shard
    offsets) follow it."""
    f0 = next(iter(feed.values()), None)
    return int(f0.shape[0]) if f0 is not None and np.ndim(f0) else 1


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
def _kind(dtype: np.dtype) -> str:
    """'float', 'int' (signed, unsigned) or 'bool': conversions within a kind need no request."""
    return {"f": "float", "i": "int", "u": "int", "b": "bool"}[dtype.kind]


def _convert(name: str, arr: np.ndarray, dtype: np.dtype, cast: bool = False) -> np.ndarray:
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
    if not cast and _kind(arr.dtype) != _kind(dtype):
        # e.g. uint8 images into a float32 input: the values are valid numbers but almost
        # never what the model was trained on (no scaling/normalization); never guess
        raise DataError(f"input {name!r} has dtype {arr.dtype} but the model expects {dtype}; "
                        f"mixq does not convert between kinds on its own (uint8 images usually "
                        f"need scaling/normalization first): convert the data to {dtype} "
                        f"yourself, or pass cast=True / --cast to convert the values as they are")
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


def validate_feed(feed: Any, specs: Sequence[InputSpec], where: str = "", *,
                  cast: bool = False) -> dict[str, np.ndarray]:
    """Check one feed dict against the model inputs; returns it with dtypes converted (a change
    of kind, e.g. uint8 -> float32, only when `cast`)."""
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
        out[s.name] = _convert(s.name, arr, s.dtype, cast)
    return out


# ---------------------------------------------------------------------------- array sources
def _split_arrays(arrays: Mapping[str, Any], specs: Sequence[InputSpec], batch_size: int,
                  where: str, max_bytes: int | None = None) -> Iterator[dict[str, Any]]:
    """Cut {name: array-with-samples} into feeds (see the module docstring); with `max_bytes`
    (file sources), a feed larger than that is refused before it is read."""
    names = [s.name for s in specs]
    _check_names(arrays, names, f" (in {where})", "expected arrays named")
    plans = {}
    n_items = set()
    n_rows: set[int] = set()  # inputs split along a dynamic axis must agree on rows, not feeds
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
            fixed = isinstance(d0, int) and d0 > 0
            step = d0 if isinstance(d0, int) and d0 > 0 else batch_size
            # a fixed batch dim must be filled; along a dynamic one the last feed may be short
            if fixed and a.shape[0] % step:
                raise DataError(f"input {s.name!r} (in {where}) has {a.shape[0]} rows along its "
                                f"first axis, not a multiple of the model's batch dim {step}")
            if not fixed:
                n_rows.add(a.shape[0])
            plans[s.name] = ("batch", step)
            n_items.add(-(-a.shape[0] // step))
        else:
            raise DataError(f"input {s.name!r} (in {where}) has shape {tuple(a.shape)} but the "
                            f"model expects shape {s.shape_str}: give an array of rank "
                            f"{rank} (a batch) or {rank + 1} (a stack of samples)")
    counts = {c for c in n_items if c is not None}
    if len(counts) > 1 or len(n_rows) > 1:
        raise DataError(f"the arrays in {where} hold different numbers of samples "
                        f"({', '.join(f'{k}: {arrays[k].shape[0]}' for k in names if arrays[k].ndim)})")
    n = counts.pop() if counts else 1
    if max_bytes is not None:
        feed_bytes = sum(arrays[k].dtype.itemsize * math.prod(arrays[k].shape[1:]) * plans[k][1]
                         if plans[k][0] != "whole" else 0 for k in names)
        if feed_bytes > max_bytes:
            raise DataError(f"one feed from {where} would hold {feed_bytes / 1e6:.0f} MB (shapes "
                            f"{', '.join(f'{k}: {tuple(arrays[k].shape)}' for k in names)}), above "
                            f"the bound of {max_bytes / 1e6:.0f} MB per feed; use a smaller "
                            "batch_size or smaller samples")
    for i in range(n):
        feed = {}
        for name in names:
            kind, step = plans[name]
            a = arrays[name]
            feed[name] = a if kind == "whole" else (a[i] if kind == "stack" else
                                                    a[i * step:(i + 1) * step])
            feed[name] = np.ascontiguousarray(feed[name])  # materialize one piece of a memmap
        yield feed


class _NpzMember:
    """One array of an .npz archive, read forward in row ranges (never whole).

    Behaves like the read-only array slices :func:`_split_arrays` takes: ``shape``, ``ndim``,
    ``dtype``, ``m[i]`` and ``m[a:b]``. Rows are decompressed from the member's stream as they
    are asked for; asking for an earlier row reopens the stream."""

    def __init__(self, zf: zipfile.ZipFile, info: zipfile.ZipInfo, where: str,
                 shape: tuple[int, ...], dtype: np.dtype) -> None:
        self.zf, self.info, self.where = zf, info, where
        self.shape, self.dtype, self.ndim = shape, dtype, len(shape)
        self.row_bytes = math.prod(shape[1:]) * dtype.itemsize
        self._stream: Any = None
        self._row = 0

    def _open(self) -> None:
        self._stream = self.zf.open(self.info)
        _read_npy_header(self._stream, self.where)  # checked at load; skipped here
        self._row = 0

    def _read(self, nbytes: int) -> bytes:
        buf = self._stream.read(nbytes)
        if len(buf) != nbytes:
            raise DataError(f"{self.where} ends early: its .npy header declares shape "
                            f"{self.shape}, but the data stops before that; the file is damaged")
        return buf

    def rows(self, a: int, b: int) -> np.ndarray:
        """Rows a..b-1 as a new array."""
        try:
            if self._stream is None or a < self._row:
                self._open()
            while self._row < a:  # skip forward in pieces of ~4 MB
                n = min(a - self._row, max(1, (1 << 22) // max(self.row_bytes, 1)))
                self._read(n * self.row_bytes)
                self._row += n
            buf = self._read((b - a) * self.row_bytes)
        except (OSError, EOFError, zipfile.BadZipFile, zlib.error) as e:  # damaged data, CRC
            raise DataError(f"cannot read {self.where}: {e}; is it a complete .npz written by "
                            "numpy.savez?") from e
        self._row = b
        return np.frombuffer(buf, self.dtype).reshape((b - a,) + self.shape[1:])

    def __getitem__(self, key: int | slice) -> np.ndarray:
        if isinstance(key, slice):
            a, b, _ = key.indices(self.shape[0])
            return self.rows(a, b)
        return self.rows(key, key + 1)[0]

    def close(self) -> None:
        if self._stream is not None:
            self._stream.close()
            self._stream = None


def _read_npy_header(f: Any, where: str) -> tuple[tuple[int, ...], bool, np.dtype]:
    """(shape, fortran_order, dtype) from the .npy header at the start of stream `f`."""
    fmt = np.lib.format
    try:
        version = fmt.read_magic(f)
        if version == (1, 0):
            shape, fortran, dtype = fmt.read_array_header_1_0(f)
        elif version == (2, 0):
            shape, fortran, dtype = fmt.read_array_header_2_0(f)
        else:
            raise ValueError(f".npy format version {version} is not supported")
    except (ValueError, EOFError) as e:
        raise DataError(f"{where} is not a .npy array ({e}); an .npz must hold one array per "
                        "model input, written by numpy.savez / savez_compressed") from e
    return tuple(int(d) for d in shape), bool(fortran), np.dtype(dtype)


def _open_npz(path: Path, zf: zipfile.ZipFile) -> dict[str, np.ndarray | _NpzMember]:
    """Check every member's header, declared size and dtype before reading any data."""
    out: dict[str, np.ndarray | _NpzMember] = {}
    for info in zf.infolist():
        if info.is_dir():
            continue
        key = info.filename[:-4] if info.filename.endswith(".npy") else info.filename
        where = f"member {key!r} of {path}"
        with zf.open(info) as f:
            shape, fortran, dtype = _read_npy_header(f, where)
            header = f.tell()
        if dtype.hasobject:
            raise DataError(f"{where} holds Python objects (dtype {dtype}); mixq never unpickles "
                            "data: save numeric arrays")
        nbytes = math.prod(shape) * dtype.itemsize
        if header + nbytes != info.file_size:
            raise DataError(f"{where} declares shape {shape} of {dtype} ({nbytes} bytes) but "
                            f"holds {info.file_size - header} bytes; the file is damaged or "
                            "was not written by numpy.savez")
        if len(shape) == 0 or (fortran and len(shape) > 1):
            if nbytes > MAX_WHOLE_MEMBER_BYTES:
                raise DataError(f"{where} is a Fortran-ordered array of {nbytes / 1e6:.0f} MB, "
                                f"which must be read whole (the bound is "
                                f"{MAX_WHOLE_MEMBER_BYTES / 1e6:.0f} MB); save it in C order "
                                "(np.ascontiguousarray) or split it into several files in a "
                                "folder")
            with zf.open(info) as f:
                _read_npy_header(f, where)
                arr = np.frombuffer(f.read(nbytes), dtype)
            out[key] = arr.reshape(shape, order="F" if fortran else "C")
        else:
            out[key] = _NpzMember(zf, info, where, shape, dtype)
    return out


def _load_file(path: Path, specs: Sequence[InputSpec], zfs: list[zipfile.ZipFile]
               ) -> Mapping[str, Any]:
    """The arrays of one file: a memmap (.npy) or checked, streamed members (.npz; the opened
    archive is appended to `zfs` for the caller to close)."""
    suffix = path.suffix.lower()
    try:
        if suffix == ".npy":
            if len(specs) != 1:
                raise DataError(f"{path} is a .npy file, which can only feed a single-input "
                                f"model; this model has inputs {', '.join(s.name for s in specs)}"
                                ": use a .npz with one array per input name")
            return {specs[0].name: np.load(path, mmap_mode="r", allow_pickle=False)}
        if suffix == ".npz":
            zf = zipfile.ZipFile(path)
            zfs.append(zf)
            return _open_npz(path, zf)
    except DataError:
        raise
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error) as e:
        raise DataError(f"cannot read calibration data file {path}: {e}; is it a complete "
                        ".npy/.npz written by numpy.save/savez?") from e
    raise DataError(f"unsupported calibration data file {path}: expected .npy or .npz")


def _sample_keyed(arrays: Mapping[str, Any], specs: Sequence[InputSpec],
                  path: Path) -> dict[str, dict[str, Any]] | None:
    """Group the members of an .npz keyed ``SAMPLE/INPUT`` (e.g. ``00000/image``; the input
    name may hold ``/`` itself) by sample, in sorted key order; None when the keys are input
    names."""
    names = [s.name for s in specs]
    keys = sorted(arrays)
    if all(k in names for k in keys) or not any("/" in k for k in keys):
        return None
    samples: dict[str, dict[str, Any]] = {}
    for k in keys:
        sample, _, name = k.partition("/")
        if not sample or name not in names:
            raise DataError(f"{path}: key {k!r} is neither an input name nor SAMPLE/INPUT (e.g. "
                            f"00000/{names[0] if names else 'image'}); name every array one way or "
                            f"the other. The model inputs are: {', '.join(names)}."
                            f"{did_you_mean(name or k, names)}")
        samples.setdefault(sample, {})[name] = arrays[k]
    return samples


def _sample_feeds(samples: Mapping[str, Mapping[str, Any]], specs: Sequence[InputSpec],
                  path: Path) -> Iterator[dict]:
    """One feed per sample, as it is (samples are never joined or cut: the first dim of an
    input is not always a batch); an array one dimension short of its input's rank gets the
    batch axis. Each sample is read when its turn comes."""
    ranks = {s.name: None if s.shape is None else len(s.shape) for s in specs}
    for sample, members in samples.items():
        where = f"sample {sample!r} of {path}"
        nbytes = sum(m.dtype.itemsize * math.prod(m.shape) for m in members.values())
        if nbytes > MAX_FEED_BYTES:
            raise DataError(f"{where} holds {nbytes / 1e6:.0f} MB, above the bound of "
                            f"{MAX_FEED_BYTES / 1e6:.0f} MB per feed; store smaller samples")
        feed = {}
        for name, m in members.items():
            a = m[0:m.shape[0]] if isinstance(m, _NpzMember) else np.asarray(m)
            rank = ranks.get(name)
            if rank is not None and a.ndim == rank - 1:
                a = a[None]  # one sample without its batch axis
            feed[name] = np.ascontiguousarray(a)
        yield feed


def _file_arrays(f: Path, specs: Sequence[InputSpec], batch_size: int) -> Iterator[dict]:
    zfs: list[zipfile.ZipFile] = []
    arrays: Mapping[str, Any] = {}
    try:
        arrays = _load_file(f, specs, zfs)
        samples = _sample_keyed(arrays, specs, f) if zfs else None
        if samples is not None:
            yield from _sample_feeds(samples, specs, f)
            return
        yield from _split_arrays(arrays, specs, batch_size, str(f), max_bytes=MAX_FEED_BYTES)
    finally:
        for a in arrays.values():
            if isinstance(a, _NpzMember):
                a.close()
        for z in zfs:
            z.close()


def _path_source(path: Path, specs: Sequence[InputSpec], batch_size: int) -> Iterator[dict]:
    if not path.exists():
        raise DataError(f"calibration data path {path} does not exist")
    if path.is_dir():
        files = sorted(p for p in path.iterdir()
                       if p.is_file() and p.suffix.lower() in (".npy", ".npz"))
        if not files:
            raise DataError(f"calibration data is empty: folder {path} holds no .npy or .npz files")
        for f in files:
            yield from _file_arrays(f, specs, batch_size)
    else:
        yield from _file_arrays(path, specs, batch_size)


# ---------------------------------------------------------------------------- sources
_UNSET: Any = object()


@dataclass(frozen=True)
class CalibData:
    """Calibration `data` with reading options, accepted wherever data is (e.g. ``quantize``).

    `max_samples`: feeds read per pass (default :data:`DEFAULT_MAX_SAMPLES`, ``None`` = all);
    `cast`: convert data of another dtype kind (e.g. uint8 images into a float32 input) instead
    of refusing it; `batch_size`: rows per feed when arrays are split along a dynamic batch axis
    (None: the caller's choice, 1 by default)."""

    data: Any
    max_samples: int | None = DEFAULT_MAX_SAMPLES
    cast: bool = False
    batch_size: int | None = None


def sample_bound(data: Any) -> int | None:
    """The feeds per pass ``FeedSource(data, ...)`` reads at most (None: no bound)."""
    return data.max_samples if isinstance(data, CalibData) else DEFAULT_MAX_SAMPLES


def _check_max_samples(max_samples: Any) -> int | None:
    if max_samples is None:
        return None
    if isinstance(max_samples, bool) or not isinstance(max_samples, (int, np.integer)) \
            or max_samples < 1:
        raise DataError(f"max_samples (--calib-samples) must be a positive integer or None (no "
                        f"bound), got {max_samples!r}")
    return int(max_samples)


class FeedSource:
    """A re-iterable view of calibration data: every ``iter()`` is one validated pass.

    A reader is rewound (``rewind()``) before every pass but the first; a one-shot iterator
    (e.g. a generator) can be passed over only once and raises DataError on a second pass.
    A reader's ``get_next()`` ends the data by returning None or raising StopIteration (the
    Python end-of-iteration signal, treated the same way).

    `max_samples`: feeds read per pass (default :data:`DEFAULT_MAX_SAMPLES`, ``None``: no
    bound); when the default bound cuts a source short a warning says so. `cast`: convert data
    of another dtype kind instead of refusing it. `data` may be a :class:`CalibData`, whose
    options apply unless given here.
    """

    def __init__(self, data: Any, input_specs: Any, *, batch_size: int = 1,
                 max_samples: int | None = _UNSET, cast: bool | None = None) -> None:
        if isinstance(data, CalibData):
            if max_samples is _UNSET:
                max_samples = data.max_samples
            if cast is None:
                cast = data.cast
            if data.batch_size is not None:
                batch_size = data.batch_size
            data = data.data
        if data is None:
            raise DataError("calibration data is empty: got None; pass a data reader, an "
                            "iterable of feed dicts, arrays, or a .npy/.npz file or folder")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise DataError(f"batch_size must be a positive integer, got {batch_size!r}")
        self.explicit_bound = max_samples is not _UNSET
        self.max_samples = _check_max_samples(DEFAULT_MAX_SAMPLES if max_samples is _UNSET
                                              else max_samples)
        self.cast = bool(cast)
        self.data = data
        self.specs = _specs(input_specs)
        self.batch_size = batch_size
        self._passes = 0

    def _reader_items(self, d: Any) -> Iterator[tuple[Any, str]]:
        i = 0
        while True:
            try:
                f = d.get_next()
            except StopIteration:  # a get_next() written as next(it): the end of the data
                break
            if f is None:
                break
            yield f, f"reader item {i}"
            i += 1

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
            yield from self._reader_items(d)
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
        try:
            for feed, where in raw:
                if self.max_samples is not None and n >= self.max_samples:
                    if not self.explicit_bound and self._passes == 1:
                        warnings.warn(
                            f"calibration data holds more than {self.max_samples} samples "
                            f"(feeds); only the first {self.max_samples} are used (the default "
                            "bound, which also ends an endless generator); pass max_samples=N "
                            "(--calib-samples N) to use more, or None for no bound",
                            stacklevel=2)
                    break
                yield validate_feed(feed, self.specs, where, cast=self.cast)
                n += 1
                if self.explicit_bound and n == self.max_samples:
                    break  # asked for: read nothing more (the default bound peeks, to warn)
        finally:
            close = getattr(raw, "close", None)
            if close is not None:
                close()  # release open files of a source cut short
        if n == 0:
            raise DataError("calibration data is empty: it produced no samples; expected feed "
                            f"dicts for inputs {', '.join(s.name for s in self.specs)}")


def readable_twice(data: Any) -> bool:
    """Whether `data` gives the same feeds when read again (containers, arrays and files do, also
    inside a CalibData; a data reader or a generator is read once)."""
    raw = data.data if isinstance(data, CalibData) else data
    return isinstance(raw, (list, tuple, Mapping, np.ndarray, str, os.PathLike))


def as_feeds(data: Any, input_specs: Any, *, batch_size: int = 1,
             max_samples: int | None = _UNSET, cast: bool | None = None
             ) -> Iterator[dict[str, np.ndarray]]:
    """One validated pass over calibration `data` as feed dicts ``{input name: array}``.

    `input_specs`: a list of :class:`InputSpec` (or ``(name, dtype, shape)`` tuples) or the
    ``onnx.ModelProto`` itself. `batch_size`: rows per feed when arrays are split along a dynamic
    batch axis. `max_samples`: feeds read (default :data:`DEFAULT_MAX_SAMPLES`; None: all).
    `cast`: convert data of another dtype kind (e.g. uint8 -> float32) instead of refusing it.
    Errors (:class:`DataError`) are raised lazily, when the bad item is reached; an empty source
    raises when the iteration ends without a single feed.
    """
    return iter(FeedSource(data, input_specs, batch_size=batch_size, max_samples=max_samples,
                           cast=cast))
