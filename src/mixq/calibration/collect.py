"""Collect :class:`TensorStats` of model tensors with one streaming onnxruntime pass.

The model is copied with every requested intermediate tensor added as a graph output and run
with graph optimizations disabled (so intermediate names survive), one feed at a time; each
output array updates its statistics and is dropped at once, so memory is bounded by one batch
(plus the model). Initializers are read directly (never run); requested graph inputs are taken
from the feeds. Tensors inside subgraphs (If/Loop/Scan bodies), unknown names and non-numeric
tensors are reported in :attr:`CollectResult.skipped` with the reason.
"""
from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from mixq._io import approx_model_size, has_external_data, model_size, tensor_array, tensor_size
from mixq.errors import DataError, ModelError, did_you_mean
from mixq.evaluate import onnxruntime_max_ir_version

from .data import FeedSource, feed_rows, input_specs_from_model
from .stats import TensorStats

__all__ = ["CollectResult", "collect_stats"]

#: Models whose serialized size exceeds this are handed to onnxruntime as a file with external
#: data (protobuf cannot serialize more than 2 GiB). Module-level so tests can lower it.
EXTERNAL_DATA_THRESHOLD = 1_800_000_000

_NUMERIC = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16,
            onnx.TensorProto.DOUBLE}


class CollectResult(dict):
    """``{tensor name: TensorStats}`` of the collected tensors, plus what could not be collected.

    Attributes: ``stats`` (self, as a plain dict view), ``skipped`` ``{name: reason}``,
    ``num_batches`` (feeds run).
    """

    def __init__(self, stats: dict[str, TensorStats] | None = None,
                 skipped: dict[str, str] | None = None, num_batches: int = 0) -> None:
        super().__init__(stats or {})
        self.skipped: dict[str, str] = dict(skipped or {})
        self.num_batches = num_batches

    @property
    def stats(self) -> dict[str, TensorStats]:
        return dict(self)

    def __repr__(self) -> str:
        return (f"CollectResult({len(self)} tensors, {len(self.skipped)} skipped, "
                f"{self.num_batches} batches)")


def _load(model: onnx.ModelProto | str | os.PathLike) -> onnx.ModelProto:
    if isinstance(model, onnx.ModelProto):
        return model
    path = Path(model)
    if not path.is_file():
        raise ModelError(f"model file {path} does not exist")
    try:
        return onnx.load(str(path))
    except Exception as e:  # noqa: BLE001 - onnx raises several kinds
        raise ModelError(f"cannot read ONNX model {path}: {e}") from e


def _subgraph_names(graph: onnx.GraphProto) -> set[str]:
    """Names produced inside subgraphs of `graph` (any depth)."""
    out: set[str] = set()
    for node in graph.node:
        for attr in node.attribute:
            subs = list(attr.graphs) + ([attr.g] if attr.HasField("g") else [])
            for g in subs:
                for n in g.node:
                    out.update(o for o in n.output if o)
                out.update(i.name for i in g.input)
                out.update(_subgraph_names(g))
    return out


def _value_infos(model: onnx.ModelProto) -> dict[str, onnx.ValueInfoProto]:
    """Shape-inferred value infos by name (best effort: {} where inference fails)."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # noqa: BLE001 - inference is an optimization only
        return {}
    g = inferred.graph
    return {vi.name: vi for vi in list(g.value_info) + list(g.output) + list(g.input)}


def _augmented_session(m: onnx.ModelProto, fetch: list[str], graph_outputs: set[str],
                       vis: dict[str, onnx.ValueInfoProto], big: bool, tmp: Path,
                       providers: Sequence[Any] | None, intra_op_threads: int | None,
                       base_dir: str | os.PathLike | None = None, prepack: bool = True):
    """An onnxruntime session of `m` with every name in `fetch` exposed as a graph output, and
    a function restoring `m` (call it once the session is no longer needed).

    A big model (> EXTERNAL_DATA_THRESHOLD) is changed in place instead of copied: its large
    initializers are handed to onnxruntime as in-memory external initializers (the proto keeps
    only their names and shapes meanwhile), so the weights are held once, not three times, and
    nothing is written to disk.

    Deferred initializers (external data, see mixq._io.load_model_deferred) are read by
    onnxruntime itself from `base_dir`, which maps the file: they are never in our memory.
    `prepack=False` keeps onnxruntime from copying the MatMul weights into packed buffers."""
    if big:
        aug = m  # no protobuf copy of > 2 GiB; changed in place and restored below
    else:
        aug = onnx.ModelProto()
        aug.CopyFrom(m)
    n_before = len(aug.graph.output)
    for name in fetch:
        if name in graph_outputs:
            continue
        vi = vis.get(name)
        new = onnx.ValueInfoProto()
        if vi is not None and vi.type.tensor_type.elem_type:
            new.CopyFrom(vi)
        else:
            new.name = name  # onnxruntime infers the type of a bare output
        aug.graph.output.append(new)
    ir = aug.ir_version  # restored on a big model, which is changed in place
    # onnx's helper writes IR versions newer than onnxruntime reads
    aug.ir_version = min(ir, onnxruntime_max_ir_version())
    if not big:
        return _session(aug.SerializeToString(), providers, intra_op_threads,
                        external_dir=base_dir, prepack=prepack), lambda: None

    moved: list[tuple[onnx.TensorProto, bytes, bool]] = []

    def restore() -> None:
        while moved:
            t, raw, had_location = moved.pop()
            del t.external_data[:]
            t.ClearField("data_location")
            if had_location:
                t.data_location = onnx.TensorProto.DEFAULT
            t.raw_data = raw
        del aug.graph.output[n_before:]
        aug.ir_version = ir

    try:
        names, values = [], []
        for t in aug.graph.initializer:
            dtype = _ORT_NUMPY.get(t.data_type)
            if dtype is None or not t.HasField("raw_data") or t.ByteSize() < _IN_MEMORY_MIN_BYTES:
                continue
            raw = t.raw_data
            arr: np.ndarray = np.frombuffer(raw, dtype=dtype).reshape(tuple(t.dims))
            moved.append((t, raw, t.HasField("data_location")))
            t.ClearField("raw_data")
            t.data_location = onnx.TensorProto.EXTERNAL
            for k, v in (("location", "mixq-in-memory"), ("offset", "0"), ("length", str(len(raw)))):
                e = t.external_data.add()
                e.key, e.value = k, v
            names.append(t.name)
            values.append(arr)
        try:
            data = aug.SerializeToString()
        except Exception as e:  # noqa: BLE001 - EncodeError / ValueError above 2 GiB
            raise ModelError("the model is too large to hand to onnxruntime for calibration "
                             f"(over 2 GiB outside its main-graph initializers: {e}); keep large "
                             "tensors as initializers of the main graph.") from e
        sess = _session(data, providers, intra_op_threads, external=(names, values),
                        external_dir=base_dir, prepack=prepack)
    except BaseException:
        restore()
        raise
    return sess, restore


#: numpy dtypes of tensors handed to onnxruntime in memory (big models).
_ORT_NUMPY: dict[int, type] = {onnx.TensorProto.FLOAT: np.float32, onnx.TensorProto.FLOAT16: np.float16,
              onnx.TensorProto.DOUBLE: np.float64, onnx.TensorProto.INT8: np.int8,
              onnx.TensorProto.UINT8: np.uint8, onnx.TensorProto.INT32: np.int32,
              onnx.TensorProto.INT64: np.int64}
_IN_MEMORY_MIN_BYTES = 1 << 20


def _handed_over(t: onnx.TensorProto) -> bool:
    """Whether a big model's initializer `t` reaches onnxruntime as an external initializer (in
    memory, or deferred and mapped from its file) rather than inside the model bytes."""
    return (t.data_type in _ORT_NUMPY and (t.HasField("raw_data") or has_external_data(t))
            and tensor_size(t) >= _IN_MEMORY_MIN_BYTES)


def _all_initializers(graph: onnx.GraphProto) -> list[onnx.TensorProto]:
    """Initializers of `graph` and of all its subgraphs."""
    out = list(graph.initializer)
    for node in graph.node:
        for attr in node.attribute:
            for g in list(attr.graphs) + ([attr.g] if attr.HasField("g") else []):
                out += _all_initializers(g)
    return out


#: how a calibration session that onnxruntime refuses to build is reported (the caller may then
#: tell whether the model as given loads at all)
LOAD_FAILED = "onnxruntime cannot load the model for calibration"
#: how a calibration batch onnxruntime fails on starts its message (Pipeline.calibrate reads it)
RUN_FAILED = "onnxruntime failed on calibration batch"


def _session(model_bytes_or_path: bytes | str, providers: Sequence[Any] | None,
             intra_op_threads: int | None, external: tuple[list[str], list[np.ndarray]] | None = None,
             external_dir: str | os.PathLike | None = None, prepack: bool = True):
    import onnxruntime as ort

    so = ort.SessionOptions()
    if external_dir is not None:
        # deferred initializers: onnxruntime maps them from the data file next to the model
        # (a model given as bytes has no directory of its own)
        so.add_session_config_entry("session.model_external_initializers_file_folder_path",
                                    str(external_dir))
    if not prepack:
        # big model: weights are used in place; prepacking would copy every MatMul weight again
        so.add_session_config_entry("session.disable_prepacking", "1")
    if external is not None and external[0]:
        so.add_external_initializers(list(external[0]),
                                     [ort.OrtValue.ortvalue_from_numpy(a) for a in external[1]])
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 3
    # the statistics are computed between runs on this thread: idle ORT workers must not spin
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if intra_op_threads is not None:
        so.intra_op_num_threads = int(intra_op_threads)
    prov = list(providers) if providers else ["CPUExecutionProvider"]
    from ..evaluate import seeded_source  # random ops seeded: the same statistics on every run

    source = seeded_source(model_bytes_or_path)
    try:
        return ort.InferenceSession(source, sess_options=so, providers=prov)
    except Exception as e:  # noqa: BLE001 - ORT raises its own exception types
        raise ModelError(f"{LOAD_FAILED}: {e}") from e


def collect_stats(model: onnx.ModelProto | str | os.PathLike, tensor_names: Iterable[str],
                  data: Any, *, providers: Sequence[Any] | None = None,
                  progress: Callable[[int], Any] | None = None,
                  intra_op_threads: int | None = None, batch_size: int = 1,
                  axes: dict[str, int] | None = None,
                  base_dir: str | os.PathLike | None = None, tap: Any = None) -> CollectResult:
    """Statistics of `tensor_names` over all of `data`, in one streaming onnxruntime pass.

    Parameters
    ----------
    model: ModelProto or path (external data is loaded from beside the file).
    tensor_names: graph inputs, intermediate tensors, graph outputs or initializers.
    data: anything :func:`mixq.calibration.data.as_feeds` accepts.
    providers: onnxruntime execution providers (default CPU).
    progress: called with the 0-based index of every batch once it has been processed.
    intra_op_threads: onnxruntime intra-op threads (default: onnxruntime's choice).
    batch_size: rows per run when array data is split along a dynamic batch axis (does not
        change the statistics).
    axes: optional ``{name: axis}`` to also collect per-channel min/max of those tensors.
    base_dir: the directory deferred initializers of `model` (external data left on disk by
        mixq._io.load_model_deferred) are read from; onnxruntime maps them from there.
    tap: an observer of the same pass (mixq.passes.gptq.GramTap, mixq.fidelity.HeldBack), or a
        tuple of them: each one's `names` are fetched too (no statistics), its
        `update(values, rows)` sees them per batch, its `finish()` runs after the last one.

    Returns a :class:`CollectResult` (a dict ``{name: TensorStats}`` with ``.skipped``).
    Raises DataError for bad data, ModelError when the model cannot be read or run.
    """
    m = _load(model)
    names = list(dict.fromkeys(tensor_names))
    axes = dict(axes or {})
    g = m.graph
    inits = {t.name: t for t in g.initializer}
    graph_inputs = {vi.name for vi in g.input if vi.name not in inits}
    graph_outputs = {vo.name for vo in g.output}
    produced = {o for n in g.node for o in n.output if o}
    sub = _subgraph_names(g)
    result = CollectResult()

    to_fetch: list[str] = []
    from_feed: list[str] = []
    for name in names:
        if name in inits:
            t = inits[name]
            if t.data_type not in _NUMERIC:
                result.skipped[name] = (f"initializer of type "
                                        f"{onnx.TensorProto.DataType.Name(t.data_type)} is not a "
                                        "float tensor")
                continue
            result[name] = TensorStats.from_array(tensor_array(t, base_dir), axis=axes.get(name))
        elif name in graph_inputs:
            from_feed.append(name)
        elif name in produced:
            to_fetch.append(name)
        elif name in sub:
            result.skipped[name] = ("tensor is inside a subgraph (If/Loop/Scan body); "
                                    "collecting subgraph tensors is not supported")
        else:
            known = list(produced | graph_inputs | set(inits))
            result.skipped[name] = f"no tensor of this name in the model graph.{did_you_mean(name, known)}"

    taps = _taps(tap)
    tap_names = [n for n in dict.fromkeys(n for t in taps for n in t.names) if n in produced or n in graph_inputs]
    to_fetch += [n for n in tap_names if n in produced and n not in to_fetch]
    if not to_fetch and not from_feed and not tap_names:
        return result

    # decided as if deferred weights were loaded: deferring them never changes the session
    # (prepacking changes MatMul rounding), so never the statistics
    big = approx_model_size(m) > EXTERNAL_DATA_THRESHOLD  # a threshold: nothing encoded
    in_memory = big and model_size(m, external=False) > EXTERNAL_DATA_THRESHOLD
    prepack = not (big and any(_handed_over(t) for t in g.initializer))
    with tempfile.TemporaryDirectory(prefix="mixq_calib_") as tmp:
        # shape inference tells the types up front (non-float tensors are skipped before the
        # run); for a >2 GiB model the run-time dtype check does that instead
        vis = _value_infos(m) if (to_fetch and not big) else {}
        fetch = []
        for name in to_fetch:
            vi = vis.get(name)
            if vi is not None and not vi.type.HasField("tensor_type"):
                result.skipped[name] = "not a tensor (sequence/map/optional)"
                continue
            et = vi.type.tensor_type.elem_type if vi is not None else 0
            if et and et not in _NUMERIC:
                result.skipped[name] = (f"tensor of type {onnx.TensorProto.DataType.Name(et)} "
                                        "is not a float tensor")
            else:
                fetch.append(name)
        if not fetch and not from_feed and not tap_names:
            return result
        sess, restore = _augmented_session(m, fetch, graph_outputs, vis, in_memory, Path(tmp), providers,
                                           intra_op_threads, base_dir, prepack=prepack
                                           ) if fetch else (None, lambda: None)
        set_total = getattr(progress, "set_total", None)  # a mixq._progress.Progress
        if callable(set_total):
            set_total(_bounded_count(data, input_specs_from_model(m), batch_size))
        try:
            _run(result, m, sess, fetch, from_feed, data, batch_size, axes, progress,
                 taps=taps, stat_names=set(names))
        finally:
            del sess
            import gc

            gc.collect()  # the session (and the weights it was handed) must go before restore()
            restore()
    # keep the requested order
    return CollectResult({n: result[n] for n in names if n in result},
                         {n: why for n, why in result.skipped.items() if n in names}, result.num_batches)


def _array_shape(path: Path, member: str | None = None) -> tuple[int, ...] | None:
    """The shape of a .npy file (or of `member` of a .npz) read from its header only."""
    import zipfile

    def header(f: Any) -> tuple[int, ...] | None:
        version = np.lib.format.read_magic(f)
        read = {(1, 0): np.lib.format.read_array_header_1_0,
                (2, 0): np.lib.format.read_array_header_2_0}.get(version)
        return tuple(read(f)[0]) if read is not None else None

    try:
        if member is None:
            with open(path, "rb") as f:
                return header(f)
        with zipfile.ZipFile(path) as z, z.open(member + ".npy") as zf:
            return header(zf)
    except (OSError, ValueError, KeyError, zipfile.BadZipFile):
        return None


def _file_shapes(path: Path, names: list[str]) -> dict[str, tuple[int, ...] | None] | None:
    if path.suffix.lower() == ".npy":
        return {names[0]: _array_shape(path)} if len(names) == 1 else None
    if path.suffix.lower() == ".npz":
        return {n: _array_shape(path, n) for n in names}
    return None


def _bounded_count(data: Any, specs: Sequence[Any], batch_size: int) -> int | None:
    """count_batches of calibration `data`, capped by the sample bound the pass applies."""
    from .data import CalibData, sample_bound

    raw = data.data if isinstance(data, CalibData) else data
    if isinstance(data, CalibData) and data.batch_size is not None:
        batch_size = data.batch_size
    total, bound = count_batches(raw, specs, batch_size), sample_bound(data)
    return total if total is None or bound is None else min(total, bound)


def count_batches(data: Any, specs: Sequence[Any], batch_size: int = 1) -> int | None:
    """How many feeds `data` gives (the progress total), from lengths and array headers only
    (nothing is read); None where it is not known before reading (readers, generators) or
    the data does not match the model (the pass itself then reports why)."""
    names = [s.name for s in specs]
    if not names:
        return None
    if isinstance(data, (list, tuple)):
        return len(data)
    if isinstance(data, np.ndarray):
        groups = [{names[0]: data.shape}] if len(names) == 1 else []
    elif isinstance(data, dict):
        groups = [{k: np.shape(v) for k, v in data.items()}]
    elif isinstance(data, (str, os.PathLike)):
        path = Path(data)
        files = (sorted(p for p in path.iterdir() if p.is_file() and p.suffix.lower() in (".npy", ".npz"))
                 if path.is_dir() else [path])
        groups = [_file_shapes(f, names) for f in files]  # type: ignore[misc]
    else:
        return None
    total = 0
    for shapes in groups:
        counts = set()
        for s in specs:
            shape = (shapes or {}).get(s.name)
            if shape is None or s.shape is None:
                return None
            rank = len(s.shape)
            if len(shape) == rank + 1:
                counts.add(shape[0])
            elif len(shape) == rank and rank:
                d0 = s.shape[0]
                step = d0 if isinstance(d0, int) and d0 > 0 else batch_size
                counts.add(-(-shape[0] // step))
            elif len(shape) == rank:
                continue  # a scalar input: the same in every feed
            else:
                return None
        if len(counts) > 1:
            return None
        total += counts.pop() if counts else 1
    return total


def _run(result: CollectResult, m: onnx.ModelProto, sess: Any, fetch: list[str],
         from_feed: list[str], data: Any, batch_size: int, axes: dict[str, int],
         progress: Callable[[int], Any] | None, *, taps: tuple[Any, ...] = (),
         stat_names: set[str] | None = None) -> None:
    """The calibration pass: statistics of `fetch` (run) and `from_feed` (fed) into `result`
    (only those in `stat_names`, when given); each tap's tensors to that tap per batch."""
    out_names = [o.name for o in sess.get_outputs()] if sess is not None else []
    missing = [n for n in fetch if n not in out_names]
    for n in missing:
        if stat_names is None or n in stat_names:
            result.skipped[n] = "onnxruntime does not expose this tensor as an output"
    fetch = [n for n in fetch if n not in missing]
    tapped = {n for t in taps for n in t.names}
    stats = {n: TensorStats(axis=axes.get(n)) for n in fetch + from_feed
             if stat_names is None or n in stat_names}
    specs = input_specs_from_model(m)
    feed_names = {s.name for s in specs}
    non_float: dict[str, str] = {}
    i_batch = -1
    for i_batch, feed in enumerate(FeedSource(data, specs, batch_size=batch_size)):
        for n in from_feed:
            _update(stats, non_float, n, feed[n])
        values = {n: feed[n] for n in tapped if n in feed}
        if fetch:
            try:
                outs = sess.run(fetch, {k: v for k, v in feed.items() if k in feed_names})
            except Exception as e:  # noqa: BLE001 - ORT raises its own exception types
                raise DataError(f"{RUN_FAILED} {i_batch} (input "
                                "shapes " + ", ".join(f"{k}: {tuple(v.shape)}"
                                                      for k, v in feed.items())
                                + f"): {e}") from e
            for n, arr in zip(fetch, outs):
                if n in stats:
                    _update(stats, non_float, n, arr)
                if n in tapped:
                    values[n] = arr
            del outs
        if taps:
            rows = feed_rows(feed)
            for t in taps:
                t.update({n: values[n] for n in t.names if n in values}, rows)
        del feed, values
        if progress is not None:
            progress(i_batch)
    result.num_batches = i_batch + 1
    for t in taps:
        t.finish()
    for n in list(stats):
        if n in non_float:
            result.skipped[n] = non_float[n]
        else:
            result[n] = stats[n]


def _taps(tap: Any) -> tuple[Any, ...]:
    """The observers `tap` names: none, one, or a tuple of them (None entries dropped)."""
    return tuple(t for t in (tap if isinstance(tap, tuple) else (tap,)) if t is not None)


def _update(stats: dict[str, TensorStats], non_float: dict[str, str], name: str, arr: Any) -> None:
    if name in non_float:
        return
    a = np.asarray(arr)
    if a.dtype.kind != "f" and a.dtype.name != "bfloat16":
        non_float[name] = f"tensor of dtype {a.dtype} is not a float tensor"
        return
    stats[name].update(a)
