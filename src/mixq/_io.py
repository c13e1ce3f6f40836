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
* a path listed in `protect` (the input model) is never overwritten (`OutputError`);
* a missing output directory is created (with its parents); one that cannot be created or
  written to, or a full disk, raises `OutputError` with the fix, and leaves neither a partial
  output nor a temporary file behind.
"""
from __future__ import annotations

import os
import pathlib
import tempfile
from collections.abc import Iterable, Iterator

import onnx
from google.protobuf.message import DecodeError

from .errors import ModelError, OutputError

__all__ = ["load_model", "save_model", "model_size", "EXTERNAL_THRESHOLD", "same_path"]

#: Serialized size (bytes) above which `save_model` stores tensors as external data.
EXTERNAL_THRESHOLD = 1_800_000_000
#: Tensors at least this large (bytes) go to the external data file when external data is used.
_EXTERNAL_MIN_TENSOR = 1024

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
    except (FileNotFoundError, OSError) as exc:
        raise ModelError(f"model file {str(src)!r} refers to external data that cannot be read "
                         f"({exc}); keep the data file next to the model.") from exc
    except Exception as exc:  # onnx raises assorted errors (ValidationError, RuntimeError)
        if "should be stored in" in str(exc) or "external" in str(exc).lower():
            raise ModelError(f"model file {str(src)!r} refers to external data that cannot be read "
                             f"({exc}); keep the data file next to the model.") from exc
        raise ModelError(f"model file {str(src)!r} cannot be loaded as ONNX: {exc}") from exc
    _check_looks_like_model(model, str(src))
    return model


def _check_looks_like_model(model: onnx.ModelProto, where: str) -> None:
    """Reject protobufs that parsed but are clearly not ONNX models (e.g. a text file)."""
    if model.ir_version <= 0 or not (model.graph.node or model.graph.output or model.graph.input):
        raise ModelError(f"{where!s} is not an ONNX model (no IR version or empty graph); "
                         "give an .onnx file exported by an ONNX exporter.")


def model_size(model: onnx.ModelProto) -> int:
    """Bytes the model takes serialized (tensor data included).

    Works above the 2 GiB protobuf limit too (where ``ByteSize()`` raises): the size is then
    the sum of the tensors' sizes plus the rest of the graph (an estimate within a few bytes
    per tensor, which is all the external-data decisions need)."""
    total = 0
    for t in _tensors(model):
        total += t.ByteSize() + 16
    if total < (1 << 30):  # ByteSize() of a > 2 GiB model serializes it before failing: avoid
        try:
            return int(model.ByteSize())
        except Exception:  # noqa: BLE001 - upb raises EncodeError, older protobuf ValueError
            pass
    total += sum(n.ByteSize() for n in model.graph.node if not any(
        a.type in (onnx.AttributeProto.TENSOR, onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
        for a in n.attribute))
    return int(total)


def same_path(a: PathLike, b: PathLike) -> bool:
    """Whether two paths name the same file (after resolving links, `~` and `..`)."""
    pa, pb = pathlib.Path(a).expanduser(), pathlib.Path(b).expanduser()
    try:
        if pa.exists() and pb.exists():
            return os.path.samefile(pa, pb)
    except OSError:
        pass
    return pa.resolve() == pb.resolve()


def _protected(protect: PathLike | Iterable[PathLike] | None) -> list[PathLike]:
    if protect is None:
        return []
    if isinstance(protect, (str, os.PathLike)):
        return [protect]
    return list(protect)


def _tensors(model: onnx.ModelProto) -> Iterator[onnx.TensorProto]:
    """Every TensorProto holding data in the model: initializers and tensor attributes,
    in the main graph and all subgraphs."""
    def graph_tensors(g: onnx.GraphProto) -> Iterator[onnx.TensorProto]:
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
    yield from graph_tensors(model.graph)


def save_model(model: onnx.ModelProto, path: PathLike, *, external: bool | None = None,
               protect: PathLike | Iterable[PathLike] | None = None) -> pathlib.Path:
    """Write `model` to `path` atomically and return the resolved path.

    `external=None` stores tensors in `<file name>.data` next to the model only when the
    serialized model would exceed EXTERNAL_THRESHOLD (~1.8 GB); True/False force it. The model
    object is left unchanged. `protect` lists paths that must not be overwritten (pass the input
    model): writing onto one of them raises OutputError, as does an unwritable directory.
    """
    out = pathlib.Path(path).expanduser()
    for p in _protected(protect):
        if same_path(out, p):
            raise OutputError(f"output path {str(path)!r} is the input model {str(p)!r}; "
                              "refusing to overwrite it. Choose a different --output.")
    if out.is_dir():
        raise OutputError(f"output path {str(path)!r} is a directory; give a file name such as "
                          f"{str(out / 'model.onnx')!r}.")
    for t in _tensors(model):
        if t.data_location == onnx.TensorProto.EXTERNAL:
            raise OutputError(f"tensor {t.name!r} still refers to external data that was not loaded; "
                              "load the model with load_model(..., load_external=True) before saving.")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(f"cannot create the output directory {str(out.parent)!r}: {exc}") from exc
    if external is None:
        external = model_size(model) > EXTERNAL_THRESHOLD
    out = out.resolve()
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
