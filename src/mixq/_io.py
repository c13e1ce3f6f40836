"""Loading and saving ONNX models: clear errors, external data, atomic writes.

`load_model` and `save_model` are the only places mixq reads or writes model files, so every
command gets the same behaviour:

* a missing file, a directory, non-ONNX bytes or a truncated protobuf raise `ModelError`
  naming the path;
* models whose serialized size would pass the 2 GiB protobuf limit (anything over
  `EXTERNAL_THRESHOLD` bytes) are written with their tensors in one external data file next to
  the model (`<name>.data`);
* writes are atomic (a temporary file in the target directory, then `os.replace`), so an
  interrupted run never leaves a half-written model behind;
* every writer (models and their `.data` file, plan JSON, JSON reports, the auto report and
  cache) goes through `check_output_path`: an output that resolves (links followed, same
  inode) to an input model, one of its external-data files, a calibration/eval data or labels
  file, or an existing non-regular file (a device such as /dev/null, a FIFO) is refused with
  `OutputError` before anything is written;
* a missing output directory is created (with its parents); one that cannot be created or
  written to, or a full disk, raises `OutputError` with the fix, and leaves neither a partial
  output nor a temporary file behind.

`load_model_deferred` loads a model whose external data is large with its big initializers
left on disk ("deferred"): `tensor_array` reads one of them when it is needed and
`load_deferred` brings them into the model (as `load_model` would have), so a > 2 GB model is
never held in memory whole while it is quantized.
"""
from __future__ import annotations

import os
import pathlib
import tempfile
from collections.abc import Iterable, Iterator

import numpy as np
import onnx
from google.protobuf.message import DecodeError

from .errors import ModelError, OutputError

__all__ = ["load_model", "save_model", "model_size", "EXTERNAL_THRESHOLD", "same_path",
           "check_output_path", "write_output", "external_data_files",
           "load_model_deferred", "load_deferred", "load_deferred_tensor", "tensor_array", "tensor_size", "has_external_data",
           "DEFER_MIN_MODEL_BYTES", "DEFER_MIN_TENSOR_BYTES"]

#: Serialized size (bytes) above which `save_model` stores tensors as external data.
EXTERNAL_THRESHOLD = 1_800_000_000
#: Tensors at least this large (bytes) go to the external data file when external data is used.
_EXTERNAL_MIN_TENSOR = 1024

#: `load_model_deferred` leaves initializers on disk only when they add up to at least this many
#: bytes: smaller models are loaded whole, exactly as before (module-level so tests can lower it).
#: Loaded whole, a model's weights are held several times over while it is calibrated and
#: rewritten (bench/bigmodel_bench.py measured 7x at 0.6 GB, against 1.04x deferred at 2.4 GB).
DEFER_MIN_MODEL_BYTES = 64 << 20
#: ... and only initializers of at least this many bytes (shape-like constants are always loaded).
DEFER_MIN_TENSOR_BYTES = 1 << 20

PathLike = str | os.PathLike


def load_model(src: PathLike | onnx.ModelProto | bytes, *, load_external: bool = True) -> onnx.ModelProto:
    """Return the ModelProto in `src`: a path to an .onnx file, serialized bytes, or a ModelProto.

    A ModelProto is returned as is (not copied). External data next to the file is loaded when
    `load_external` (the default). Raises ModelError with the path and the reason for a missing
    file, a directory, an empty or non-ONNX file, a protobuf decode error or missing external data.
    """
    if isinstance(src, onnx.ModelProto):
        return src
    if isinstance(src, (bytes, bytearray, memoryview)):
        try:
            model = onnx.load_model_from_string(bytes(src))
        except Exception as exc:  # DecodeError, onnx ValidationError, ...
            raise ModelError(f"the given bytes are not a serialized ONNX model ({exc}).") from exc
        _check_looks_like_model(model, "<bytes>")
        return model
    if not isinstance(src, (str, os.PathLike)):
        raise ModelError(f"cannot load a model from {type(src).__name__!s} {src!r}: "
                         "give a path to an .onnx file, its bytes or an onnx.ModelProto.")
    path = pathlib.Path(src).expanduser()
    if not path.exists():
        hint = ""
        if path.parent.is_dir():
            near = sorted(p.name for p in path.parent.glob("*.onnx"))[:5]
            if near:
                hint = f" .onnx files in {path.parent}: {', '.join(near)}."
        raise ModelError(f"model file {str(src)!r} does not exist; check the path.{hint}")
    if path.is_dir():
        raise ModelError(f"model path {str(src)!r} is a directory; give the .onnx file inside it.")
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise ModelError(f"cannot read model file {str(src)!r}: {exc}") from exc
    if size == 0:
        raise ModelError(f"model file {str(src)!r} is empty; re-export the model.")
    try:
        model = onnx.load(str(path), load_external_data=load_external)
    except DecodeError as exc:
        raise ModelError(f"model file {str(src)!r} is not a valid ONNX protobuf ({exc}); "
                         "is it really an .onnx file, and was it copied completely?") from exc
    except Exception as exc:  # onnx raises assorted errors (OSError, ValidationError, RuntimeError)
        raise _load_error(src, exc) from exc
    _check_looks_like_model(model, str(src))
    return model


def _load_error(src: object, exc: Exception) -> ModelError:
    """The ModelError for an exception raised while loading `src` (or its external data)."""
    if isinstance(exc, OSError) or "should be stored in" in str(exc) or "external" in str(exc).lower():
        return ModelError(f"model file {str(src)!r} refers to external data that cannot be read "
                          f"({exc}); keep the data file next to the model.")
    return ModelError(f"model file {str(src)!r} cannot be loaded as ONNX: {exc}")


def has_external_data(t: onnx.TensorProto) -> bool:
    """Whether `t`'s data lives in an external file (not loaded)."""
    return t.HasField("data_location") and t.data_location == onnx.TensorProto.EXTERNAL


#: Types whose external data is `itemsize` bytes per element (what deferring needs to check).
_ITEMSIZE: dict[int, int] = {onnx.TensorProto.FLOAT: 4, onnx.TensorProto.DOUBLE: 8, onnx.TensorProto.FLOAT16: 2,
             onnx.TensorProto.BFLOAT16: 2, onnx.TensorProto.INT8: 1, onnx.TensorProto.UINT8: 1,
             onnx.TensorProto.INT16: 2, onnx.TensorProto.UINT16: 2, onnx.TensorProto.INT32: 4,
             onnx.TensorProto.UINT32: 4, onnx.TensorProto.INT64: 8, onnx.TensorProto.UINT64: 8,
             onnx.TensorProto.BOOL: 1}


def _deferrable_bytes(t: onnx.TensorProto, base_dir: str, min_bytes: int) -> int:
    """The data bytes of initializer `t` if it can stay on disk, else 0.

    Only plain cases qualify: external data of a fixed-size type, at least `min_bytes`, in a
    regular file inside `base_dir` (no absolute path, no `..`, no link) that holds exactly the
    bytes the shape needs. Anything else is loaded at once, so it fails (or not) exactly as
    `load_model` does."""
    if not has_external_data(t) or t.HasField("raw_data") or t.data_type not in _ITEMSIZE:
        return 0
    nbytes = _ITEMSIZE[t.data_type]
    for d in t.dims:
        nbytes *= int(d)
    if nbytes < max(min_bytes, 1):
        return 0
    info = {e.key: e.value for e in t.external_data}
    loc = info.get("location", "")
    if not loc or set(info) - {"location", "offset", "length", "checksum"}:
        return 0
    rel = pathlib.PurePath(loc)
    if rel.is_absolute() or rel.drive or ".." in rel.parts or "\\" in loc:
        return 0
    path = os.path.join(base_dir, loc)
    try:
        offset = int(info.get("offset", "0"))
        length = int(info["length"]) if "length" in info else None
        st = os.lstat(path)
    except (ValueError, OSError):
        return 0
    import stat

    if not stat.S_ISREG(st.st_mode) or offset < 0:
        return 0
    available = st.st_size - offset
    if (length if length is not None else available) != nbytes or nbytes > available:
        return 0
    return nbytes


def load_model_deferred(src: PathLike, *, min_model_bytes: int | None = None,
                        min_tensor_bytes: int | None = None
                        ) -> tuple[onnx.ModelProto, pathlib.Path | None]:
    """Load the .onnx file `src` with its big external-data initializers left on disk.

    Main-graph initializers of at least `min_tensor_bytes` (DEFER_MIN_TENSOR_BYTES) whose
    external data is plainly readable (see `_deferrable_bytes`) keep their external reference
    when together they reach `min_model_bytes` (DEFER_MIN_MODEL_BYTES); every other tensor is
    loaded. Returns the model and the directory the deferred tensors are read from, or None
    when nothing was deferred (the model is then exactly what `load_model` returns). Errors
    are `load_model`'s.
    """
    min_model = DEFER_MIN_MODEL_BYTES if min_model_bytes is None else min_model_bytes
    min_tensor = DEFER_MIN_TENSOR_BYTES if min_tensor_bytes is None else min_tensor_bytes
    path = pathlib.Path(src).expanduser()
    model = load_model(path, load_external=False)
    base_dir = os.path.dirname(os.path.abspath(str(path)))  # where onnx.load looks
    sizes = {t.name: _deferrable_bytes(t, base_dir, min_tensor) for t in model.graph.initializer
             if has_external_data(t)}
    deferred = {n for n, b in sizes.items() if b}
    if sum(sizes.values()) < min_model or len(deferred) != sum(
            1 for t in model.graph.initializer if t.name in deferred):  # duplicate names: load all
        deferred = set()
    try:
        for t in model.graph.initializer:
            if has_external_data(t) and t.name not in deferred:
                onnx.external_data_helper.load_external_data_for_tensor(t, base_dir)
        for t in _tensors(model, initializers=False):
            if has_external_data(t):
                onnx.external_data_helper.load_external_data_for_tensor(t, base_dir)
    except Exception as exc:  # noqa: BLE001 - as in load_model
        raise _load_error(src, exc) from exc
    _check_looks_like_model(model, str(src))
    return model, (pathlib.Path(base_dir) if deferred else None)


def tensor_array(t: onnx.TensorProto, base_dir: PathLike | None = None) -> np.ndarray:
    """The value of `t` as a numpy array; a deferred tensor is read from `base_dir` (its data is
    not kept in the model)."""
    from onnx import numpy_helper

    if base_dir is None or not has_external_data(t):
        return numpy_helper.to_array(t)
    try:
        return numpy_helper.to_array(t, str(base_dir))  # onnx 1.23 reads without changing `t`
    except Exception as exc:  # noqa: BLE001 - onnx raises OSError, ValueError, ...
        raise ModelError(f"cannot read the external data of tensor {t.name!r} from "
                         f"{str(base_dir)!r} ({exc}); keep the data file next to the model "
                         "and unchanged while mixq runs.") from exc


def load_deferred(model: onnx.ModelProto, base_dir: PathLike | None,
                  names: Iterable[str] | None = None, *, rebuilt: bool = False) -> None:
    """Load the deferred main-graph initializers of `model` (those in `names`, or all) from
    `base_dir` into the model, as `load_model` would have; no-op when `base_dir` is None.

    `rebuilt`: the model went through onnx's C++ IR (the version converter) since it was
    loaded; the loaded tensors then lose their data_location field, as tensors loaded whole
    would have on that round trip."""
    if base_dir is None:
        return
    wanted = None if names is None else set(names)
    for t in model.graph.initializer:
        if has_external_data(t) and (wanted is None or t.name in wanted):
            load_deferred_tensor(t, base_dir)
            if rebuilt:
                t.ClearField("data_location")


def load_deferred_tensor(t: onnx.TensorProto, base_dir: PathLike) -> None:
    """Load the external data of `t` from `base_dir` into `t` (as onnx.load does)."""
    try:
        onnx.external_data_helper.load_external_data_for_tensor(t, str(base_dir))
    except Exception as exc:  # noqa: BLE001 - onnx raises OSError, ValueError, ...
        raise ModelError(f"cannot read the external data of tensor {t.name!r} from "
                         f"{str(base_dir)!r} ({exc}); keep the data file next to the model "
                         "and unchanged while mixq runs.") from exc


def _check_looks_like_model(model: onnx.ModelProto, where: str) -> None:
    """Reject protobufs that parsed but are clearly not ONNX models (e.g. a text file)."""
    if model.ir_version <= 0 or not (model.graph.node or model.graph.output or model.graph.input):
        raise ModelError(f"{where!s} is not an ONNX model (no IR version or empty graph); "
                         "give an .onnx file exported by an ONNX exporter.")


def model_size(model: onnx.ModelProto, *, external: bool = True) -> int:
    """Bytes the model takes serialized (tensor data included).

    Works above the 2 GiB protobuf limit too (where ``ByteSize()`` raises): the size is then
    the sum of the tensors' sizes plus the rest of the graph (an estimate within a few bytes
    per tensor, which is all the external-data decisions need). Main-graph initializers whose
    data is external (deferred) count as if loaded, so a deferred model measures what the
    loaded one does; `external=False` counts only what is in memory."""
    loaded = {}  # main-graph initializer index -> its size once loaded
    if external:
        for i, t in enumerate(model.graph.initializer):
            if has_external_data(t):
                loaded[i] = _loaded_size(t)
    total = 0
    for i, t in enumerate(model.graph.initializer):
        total += loaded.get(i, 0) or t.ByteSize()
        total += 16
    for t in _tensors(model, initializers=False):
        total += t.ByteSize() + 16
    if total < (1 << 30):  # ByteSize() of a > 2 GiB model serializes it before failing: avoid
        try:
            size = int(model.ByteSize())
        except Exception:  # noqa: BLE001 - upb raises EncodeError, older protobuf ValueError
            pass
        else:
            if not loaded:
                return size
            graph = model.graph.ByteSize()
            grown = graph + sum(_field_size(n) - _field_size(model.graph.initializer[i].ByteSize())
                                for i, n in loaded.items())
            return size - _field_size(graph) + _field_size(grown)
    return int(total + _plain_node_bytes(model))


def _plain_node_bytes(model: onnx.ModelProto) -> int:
    """ByteSize() of the main-graph nodes that hold no tensor or subgraph (those are counted
    with the tensors)."""
    return sum(n.ByteSize() for n in model.graph.node if not any(
        a.type in (onnx.AttributeProto.TENSOR, onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
        for a in n.attribute))


def approx_model_size(model: onnx.ModelProto) -> int:
    """`model_size` without serializing anything big (upb's ByteSize() encodes: 0.2 s for a
    90 MB model): a tensor with raw_data counts its length plus a header, external tensors
    their size once loaded, others their ByteSize(). Within a few hundred bytes per tensor of
    model_size: enough to compare with size thresholds."""
    total = 0
    for t in _tensors(model):
        if has_external_data(t):
            total += _loaded_size(t)
        elif t.HasField("raw_data"):
            total += len(t.raw_data) + len(t.name) + 16 * len(t.dims) + 64
        else:
            total += t.ByteSize()
    return int(total + _plain_node_bytes(model))


def _varint_size(n: int) -> int:
    return max(1, (n.bit_length() + 6) // 7)


def _field_size(n: int) -> int:
    """Serialized size of a length-delimited field of `n` bytes with a one-byte tag (the
    fields involved, TensorProto.raw_data, GraphProto.initializer and ModelProto.graph, all
    have field numbers below 16)."""
    return 1 + _varint_size(n) + n


def tensor_size(t: onnx.TensorProto) -> int:
    """``t.ByteSize()``, counting a deferred (external) tensor as it will be once loaded."""
    return _loaded_size(t) if has_external_data(t) else t.ByteSize()


def _loaded_size(t: onnx.TensorProto) -> int:
    """ByteSize() of external tensor `t` once its data is loaded (as onnx does: raw_data set,
    data_location DEFAULT, external_data cleared)."""
    meta = onnx.TensorProto()
    meta.CopyFrom(t)  # small: the data is not in it
    meta.ClearField("raw_data")
    del meta.external_data[:]
    meta.data_location = onnx.TensorProto.DEFAULT
    info = {e.key: e.value for e in t.external_data}
    try:
        length = int(info["length"])
    except (KeyError, ValueError):  # no length: assume what the shape needs
        length = _ITEMSIZE.get(t.data_type, 1)
        for d in t.dims:
            length *= int(d)
    return meta.ByteSize() + _field_size(length)


def same_path(a: PathLike, b: PathLike) -> bool:
    """Whether two paths name the same file (after resolving links, `~` and `..`)."""
    pa, pb = pathlib.Path(a).expanduser(), pathlib.Path(b).expanduser()
    try:
        if pa.exists() and pb.exists():
            return os.path.samefile(pa, pb)
    except OSError:
        pass
    return pa.resolve() == pb.resolve()


def _protected(protect: PathLike | Iterable[PathLike | None] | None) -> list[PathLike]:
    if protect is None:
        return []
    if isinstance(protect, (str, os.PathLike)):
        return [protect]
    return [p for p in protect if isinstance(p, (str, os.PathLike))]


#: (resolved path, mtime, size, inode) of a model -> the external-data files it names, so that
#: repeated checks (a report, a cache) parse each input model once
_EXTERNAL_FILES: dict[tuple, list[pathlib.Path]] = {}
#: calibration folders are read for these files (mixq.calibration.data)
_DATA_SUFFIXES = (".npy", ".npz")


def external_data_files(model_path: PathLike) -> list[pathlib.Path]:
    """The external-data files the .onnx file `model_path` refers to: the `location` of every
    tensor with external data (initializers and tensor attributes, main graph and subgraphs),
    relative to the model's directory. [] for a file that is missing or does not parse (it is
    then not a model whose data could be overwritten)."""
    path = pathlib.Path(model_path).expanduser()
    try:
        st = path.stat()
        key = (str(path.resolve()), st.st_mtime_ns, st.st_size, st.st_ino, st.st_dev)
    except OSError:
        return []
    if key not in _EXTERNAL_FILES:
        try:
            m = onnx.load(str(path), load_external_data=False)
        except Exception:  # noqa: BLE001 - not a model: it names no data files
            return []
        locs = dict.fromkeys(e.value for t in _tensors(m) if has_external_data(t)
                             for e in t.external_data if e.key == "location")
        _EXTERNAL_FILES[key] = [path.parent / loc for loc in locs]
    return list(_EXTERNAL_FILES[key])


def _same_file(st: os.stat_result, other: PathLike) -> bool:
    """Whether `other` (links followed) is the file whose stat is `st` (same inode and device)."""
    try:
        o = os.stat(pathlib.Path(other).expanduser())
    except (OSError, ValueError):
        return False
    return (o.st_ino, o.st_dev) == (st.st_ino, st.st_dev)


def check_output_path(path: PathLike, *, models: Iterable[PathLike | None] = (),
                      inputs: Iterable[PathLike | None] = (), kind: str = "output",
                      example: str = "model.onnx", written: Iterable[PathLike | None] = ()
                      ) -> pathlib.Path:
    """Refuse (OutputError) an output path that must not be written; return it (user-expanded).

    Every mixq writer calls this before writing. Refused: an existing directory; an existing
    file that is not a regular file (a device such as /dev/null, a FIFO, a socket: replacing it
    would destroy it); and any path that resolves, links followed, to the same file (inode) as
    one of the input `models`, one of their external-data files, or one of the other `inputs`
    (calibration/eval data, labels, configs; for a folder of data, the .npy/.npz files in it).
    `kind` names the output in the message ("output model", "plan JSON", ...); `example` is
    the file name suggested when a directory is given. `written`: models this run already
    wrote (and their external data), protected the same way. None entries are skipped (inputs
    that are not files)."""
    if not isinstance(path, (str, os.PathLike)):  # bytes are a model's contents elsewhere
        raise OutputError(f"the {kind} path must be a file path (str or os.PathLike), got "
                          f"{type(path).__name__}" + (": decode it first, e.g. os.fsdecode(path)"
                                                      if isinstance(path, bytes) else "") + ".")
    out = pathlib.Path(path).expanduser()
    label = f"{kind} path {str(path)!r}"
    if out.is_dir():
        raise OutputError(f"{label} is a directory; give a file name such as "
                          f"{str(out / example)!r}.")
    inputs = list(inputs)
    _check_data_folders(out, label, inputs)
    try:
        st = os.stat(out)
    except (OSError, ValueError):  # missing (or an unreadable parent): nothing there to destroy
        return out
    import stat

    if not stat.S_ISREG(st.st_mode):
        raise OutputError(f"{label} exists and is not a regular file (a device, FIFO or socket); "
                          "mixq writes its outputs by replacing the file, which would destroy "
                          "it. Give the path of a regular file.")
    for role, group in (("input model", models), ("model just written", written)):
        for m in _protected(group):
            if _same_file(st, m):
                raise OutputError(f"{label} is the {role} {str(m)!r}; refusing to overwrite "
                                  "it. Choose a different output path.")
            for f in external_data_files(m):
                if _same_file(st, f):
                    raise OutputError(f"{label} is {str(f)!r}, the external-data file of the "
                                      f"{role} {str(m)!r}; refusing to overwrite it. "
                                      "Choose a different output path.")
    for d in _protected(inputs):
        dp = pathlib.Path(d).expanduser()
        if _same_file(st, dp):
            raise OutputError(f"{label} is the input file {str(d)!r}; refusing to overwrite it. "
                              "Choose a different output path.")
    return out


def _check_data_folders(out: pathlib.Path, label: str, inputs: Iterable[PathLike | None]) -> None:
    """A .npy/.npz output inside an input data folder would overwrite one of its files, or
    join the data the next run reads: refused."""
    if out.suffix.lower() not in _DATA_SUFFIXES:
        return
    try:
        parent = os.stat(out.resolve().parent)
    except (OSError, ValueError):
        return
    for d in _protected(inputs):
        dp = pathlib.Path(d).expanduser()
        if dp.is_dir() and _same_file(parent, dp):
            raise OutputError(f"{label} is a data file in the input folder {str(d)!r}; refusing "
                              "to write it there (the folder is read as data). Choose a "
                              "different output path.")


def write_output(path: PathLike, data: bytes, *, models: Iterable[PathLike | None] = (),
                 inputs: Iterable[PathLike | None] = (), kind: str = "output",
                 example: str = "out.json", written: Iterable[PathLike | None] = ()
                 ) -> pathlib.Path:
    """Write `data` to `path` after `check_output_path`, atomically (a temporary file beside
    it, then a rename: a failed write leaves an existing file untouched), creating a missing
    directory as `save_model` does. Links are written through. Errors are OutputError.
    Returns the resolved path."""
    out = check_output_path(path, models=models, inputs=inputs, kind=kind, example=example,
                            written=written)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(f"cannot create the directory {str(out.parent)!r} for the {kind} "
                          f"{str(path)!r}: {exc}") from exc
    out = out.resolve()
    try:
        _atomic_write(out, data)
    except OSError as exc:
        raise OutputError(f"cannot write the {kind} to {str(path)!r}: {exc}. {_write_hint(exc)}"
                          ) from exc
    return out


def _tensors(model: onnx.ModelProto, *, initializers: bool = True) -> Iterator[onnx.TensorProto]:
    """Every TensorProto holding data in the model: initializers and tensor attributes,
    in the main graph and all subgraphs (without the main graph's initializers when
    `initializers` is False)."""
    def graph_tensors(g: onnx.GraphProto, inits: bool = True) -> Iterator[onnx.TensorProto]:
        if inits:
            yield from g.initializer
        for node in g.node:
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.TENSOR:
                    yield attr.t
                elif attr.type == onnx.AttributeProto.GRAPH:
                    yield from graph_tensors(attr.g)
                elif attr.type == onnx.AttributeProto.GRAPHS:
                    for sub in attr.graphs:
                        yield from graph_tensors(sub)
    yield from graph_tensors(model.graph, initializers)


def save_model(model: onnx.ModelProto, path: PathLike, *, external: bool | None = None,
               protect: PathLike | Iterable[PathLike | None] | None = None,
               inputs: Iterable[PathLike | None] = (),
               size: int | None = None) -> pathlib.Path:
    """Write `model` to `path` atomically and return the resolved path.

    `external=None` stores tensors in `<file name>.data` next to the model only when the
    serialized model would exceed EXTERNAL_THRESHOLD (~1.8 GB); True/False force it. The model
    object is left unchanged. `protect` lists the input models and `inputs` the other input
    files (calibration data...): `check_output_path` refuses (OutputError) to write the model or
    its `.data` file onto one of them, their external data, a directory or a device; an
    unwritable directory is an OutputError too.
    `size`: the model's `model_size` when the caller has it (measuring a big model serializes
    it once more).
    """
    models = _protected(protect)
    inputs = list(inputs)
    out = check_output_path(path, models=models, inputs=inputs, kind="output")
    for t in _tensors(model):
        if t.data_location == onnx.TensorProto.EXTERNAL:
            raise OutputError(f"tensor {t.name!r} still refers to external data that was not loaded; "
                              "load the model with load_model(..., load_external=True) before saving.")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(f"cannot create the output directory {str(out.parent)!r}: {exc}") from exc
    if external is None:
        external = (model_size(model) if size is None else size) > EXTERNAL_THRESHOLD
    out = out.resolve()
    if external:
        check_output_path(out.with_name(out.name + ".data"), models=models, inputs=inputs,
                          kind="external-data")
    try:
        if external:
            _save_external(model, out)
        else:
            _atomic_write(out, model.SerializeToString())
    except OSError as exc:
        raise OutputError(f"cannot write the model to {str(path)!r}: {exc}. {_write_hint(exc)}"
                          ) from exc
    except ValueError as exc:  # protobuf refuses to serialize > 2 GiB
        raise OutputError(f"cannot serialize the model for {str(path)!r} ({exc}); "
                          "save it with external=True.") from exc
    return out


def _write_hint(exc: OSError) -> str:
    """How to fix a failed write, by errno."""
    import errno

    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return "The disk is full: free some space or choose an output directory on another disk."
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return "The directory is not writable: fix its permissions or choose another output path."
    return "Check that the output directory exists, is writable and has free space."


def _write_all(fd: int, data: bytes | bytearray | memoryview) -> None:
    """os.write until every byte is written (os.write may write less than asked)."""
    view = memoryview(data).cast("B")
    step = 1 << 26
    while len(view):
        n = os.write(fd, view[:step])
        view = view[n:]


def _write_temp(out: pathlib.Path, data: bytes | Iterable[bytes]) -> str:
    """Write `data` to a new temporary file in out's directory, fsynced; return its path. The
    temporary file is removed again if anything fails."""
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=str(out.parent))
    try:
        try:
            if isinstance(data, (bytes, bytearray, memoryview)):
                _write_all(fd, data)
            else:
                for chunk in data:
                    _write_all(fd, chunk)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.chmod(tmp, 0o666 & ~_umask())
    except BaseException:
        _unlink_quietly(tmp)
        raise
    return tmp


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _atomic_write(out: pathlib.Path, data: bytes | Iterable[bytes]) -> None:
    """Write `data` to a temporary file in out's directory, fsync it and move it onto `out`;
    on any failure (a full disk...) `out` is untouched and the temporary file is removed."""
    out = pathlib.Path(out)
    tmp = _write_temp(out, data)
    try:
        os.replace(tmp, out)
    except BaseException:
        _unlink_quietly(tmp)
        raise


def _save_external(model: onnx.ModelProto, out: pathlib.Path) -> None:
    """Save with tensor payloads in `<out.name>.data`, without leaving the model modified."""
    data_name = out.name + ".data"
    moved: list[tuple[onnx.TensorProto, bytes, bool]] = []
    chunks: list[bytes] = []
    offset = 0
    try:
        for t in _tensors(model):
            if not t.HasField("raw_data") or len(t.raw_data) < _EXTERNAL_MIN_TENSOR:
                continue
            raw = t.raw_data
            pad = (-offset) % 4096  # page-aligned tensors, as onnx does, allow mmap
            if pad:
                chunks.append(b"\0" * pad)
                offset += pad
            chunks.append(raw)
            moved.append((t, raw, t.HasField("data_location")))
            t.ClearField("raw_data")
            t.data_location = onnx.TensorProto.EXTERNAL
            del t.external_data[:]
            for k, v in (("location", data_name), ("offset", str(offset)), ("length", str(len(raw)))):
                entry = t.external_data.add()
                entry.key, entry.value = k, v
            offset += len(raw)
        # both files are written to temporary names first: a failure (full disk) leaves
        # neither a model without its data nor data without its model
        tmp_data = _write_temp(out.with_name(data_name), chunks)
        del chunks[:]
        try:
            tmp_model = _write_temp(out, model.SerializeToString())
        except BaseException:
            _unlink_quietly(tmp_data)
            raise
        try:
            os.replace(tmp_data, out.with_name(data_name))
            os.replace(tmp_model, out)
        except BaseException:
            _unlink_quietly(tmp_data)
            _unlink_quietly(tmp_model)
            raise
    finally:
        for t, raw, had_location in moved:  # restore the caller's model exactly
            del t.external_data[:]
            t.ClearField("data_location")
            if had_location:
                t.data_location = onnx.TensorProto.DEFAULT
            t.raw_data = raw
