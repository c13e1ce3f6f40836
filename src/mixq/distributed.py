"""Independent tasks on local processes or a Ray cluster: sharded calibration (and the search).

An :class:`Executor` runs ``fn(shared, item)`` for every item and returns the results in item
order. ``shared`` (the model bytes and the data) is sent once per `map` call, never once per
task: a :class:`ProcessExecutor` writes it to one temporary file its workers read once each, a
:class:`RayExecutor` puts it into the object store once (``ray.put``) and every task receives
the reference. Task functions are module-level functions (they are pickled by reference) and
return plain data (dicts, lists, numbers), so a result never depends on where it was computed.

Sharded calibration (:func:`calibrate_sharded`) cuts the calibration feeds into contiguous
shards, collects :class:`~mixq.calibration.stats.TensorStats` of every shard on a worker and
merges them in shard order. The statistics are exact and their merge is plain integer addition
plus min/max, so the merged statistics, and the quantized model, are the same bytes for any
shard count.

    from mixq.distributed import executor_from
    with executor_from(workers=2) as ex:
        mixq.quantize("model.onnx", "A8W8", data, executor=ex)
"""
from __future__ import annotations

import os
import hashlib
import pickle
import tempfile
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar, runtime_checkable

import numpy as np
import onnx

from .errors import ConfigError, MixqError

__all__ = ["Executor", "SerialExecutor", "ProcessExecutor", "RayExecutor", "WorkerError",
           "executor_from", "shard_bounds", "calibrate_sharded", "SplitMetric",
           "evaluate_plans", "RELATIVE_L2", "sensitivity_rows", "plan_outputs"]

T = TypeVar("T")
R = TypeVar("R")

#: How to get Ray, named in every error about it.
RAY_INSTALL = "pip install 'mixq[ray]'"


class WorkerError(MixqError, RuntimeError):
    """A worker process died and the task could not be completed on another one."""


@runtime_checkable
class Executor(Protocol):
    """Runs independent tasks; `workers` is how many run at once (and how many shards the
    calibration data is cut into)."""

    workers: int

    def map(self, fn: Callable[[Any, T], R], items: Sequence[T], shared: Any = None) -> list[R]:
        """``[fn(shared, item) for item in items]``, in item order. `fn` must be a module-level
        function; `shared` is sent to the workers once per call."""
        ...

    def close(self) -> None:
        """Release the workers (idempotent)."""
        ...


class _ContextMixin:
    def close(self) -> None:  # pragma: no cover - overridden where there is something to free
        return None

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _name(fn: Any) -> str:
    return str(getattr(fn, "__name__", None) or getattr(getattr(fn, "func", None), "__name__", fn))


def _check_workers(workers: Any, what: str = "workers") -> int:
    if isinstance(workers, bool) or not isinstance(workers, (int, np.integer)) or workers < 1:
        raise ConfigError(f"{what} must be a positive integer, got {workers!r}")
    return int(workers)


class SerialExecutor(_ContextMixin):
    """Runs the tasks in this process, one after another. `workers` is only how many tasks the
    work is split into: ``SerialExecutor(3)`` reproduces the splitting of a 3-worker run."""

    def __init__(self, workers: int = 1) -> None:
        self.workers = _check_workers(workers)

    def map(self, fn: Callable[[Any, T], R], items: Sequence[T], shared: Any = None) -> list[R]:
        return [fn(shared, it) for it in items]

    def __repr__(self) -> str:
        return f"SerialExecutor({self.workers})"


# -- local processes ---------------------------------------------------------------------------
# set in worker processes (local or Ray): only there are parsed models kept between tasks
_IN_WORKER = False

# the shared object a worker process read last: (token, object); one map call's shared data is
# read once per worker, not once per task
_WORKER_SHARED: tuple[str, Any] | None = None


def _digest(shared: Any) -> tuple[str, bytes]:
    """(content digest, pickle) of a shared object."""
    blob = pickle.dumps(shared, protocol=pickle.HIGHEST_PROTOCOL)
    return hashlib.sha256(blob).hexdigest(), blob


def _process_task(fn: Callable[[Any, Any], Any], token: str, path: str | None, item: Any) -> Any:
    """Runs in a worker process: `fn(shared, item)` with the shared object of `token`."""
    global _WORKER_SHARED, _IN_WORKER
    _IN_WORKER = True
    if path is None:
        return fn(None, item)
    if _WORKER_SHARED is None or _WORKER_SHARED[0] != token:
        _WORKER_SHARED = None  # drop the previous call's data before reading the next
        with open(path, "rb") as f:
            _WORKER_SHARED = (token, pickle.load(f))  # written by this module, never user files
    return fn(_WORKER_SHARED[1], item)


class ProcessExecutor(_ContextMixin):
    """`workers` local processes (spawn context: a fresh interpreter each, no forked
    onnxruntime threads). The pool starts on the first `map` and lives until `close()`; a task
    whose worker died is run again once in a new pool, then :class:`WorkerError`."""

    def __init__(self, workers: int, *, retries: int = 1) -> None:
        self.workers = _check_workers(workers)
        self.retries = int(retries)
        self._pool: ProcessPoolExecutor | None = None
        self._tmp: tempfile.TemporaryDirectory | None = None

    def _get_pool(self) -> ProcessPoolExecutor:
        if self._pool is None:
            import multiprocessing

            self._pool = ProcessPoolExecutor(max_workers=self.workers,
                                             mp_context=multiprocessing.get_context("spawn"))
        return self._pool

    def map(self, fn: Callable[[Any, T], R], items: Sequence[T], shared: Any = None) -> list[R]:
        items = list(items)
        token, path = "", None
        if shared is not None:
            # the file is named by its content: a search's rounds send the same model and
            # feeds again and again, and each worker keeps what it read last
            token, blob = _digest(shared)
            if self._tmp is None:
                self._tmp = tempfile.TemporaryDirectory(prefix="mixq_shared_")
            path = os.path.join(self._tmp.name, f"{token}.pkl")
            if not os.path.exists(path):
                for old in Path(self._tmp.name).glob("*.pkl"):
                    old.unlink()
                with open(path, "wb") as f:
                    f.write(blob)
            del blob
        results: dict[int, Any] = {}
        for attempt in range(self.retries + 1):
            pool = self._get_pool()
            todo = [i for i in range(len(items)) if i not in results]
            futures = {i: pool.submit(_process_task, fn, token, path, items[i]) for i in todo}
            try:
                for i, fut in futures.items():
                    results[i] = fut.result()
                break
            except KeyboardInterrupt:
                self._shutdown_pool(wait=False)
                raise
            except BrokenProcessPool as e:
                # a worker died (killed, out of memory): finished results are kept
                for i, fut in futures.items():
                    if fut.done() and not fut.cancelled() and fut.exception() is None:
                        results[i] = fut.result()
                self._shutdown_pool()
                if attempt == self.retries:
                    raise WorkerError(f"a worker process died running {_name(fn)} "
                                      f"({len(items) - len(results)} of {len(items)} tasks "
                                      f"unfinished after {self.retries + 1} attempts); check "
                                      "the memory per worker or use fewer workers") from e
        return [results[i] for i in range(len(items))]

    def _shutdown_pool(self, wait: bool = True) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=wait, cancel_futures=True)
            self._pool = None

    def close(self) -> None:
        self._shutdown_pool()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __repr__(self) -> str:
        return f"ProcessExecutor({self.workers})"


# -- Ray ---------------------------------------------------------------------------------------
def _import_ray() -> Any:
    try:
        import ray
    except ImportError as e:
        raise ConfigError(f"--ray (RayExecutor) needs Ray, which is not installed: {RAY_INSTALL}"
                          ) from e
    return ray


def _ray_task(fn: Callable[[Any, Any], Any], shared: Any, item: Any) -> Any:
    """Runs in a Ray worker; Ray resolves `shared` (an ObjectRef argument) from the object
    store: numpy arrays in it are read in place, not copied."""
    global _IN_WORKER
    _IN_WORKER = True
    return fn(shared, item)


class RayExecutor(_ContextMixin):
    """Tasks on a Ray cluster: ``ray.init(address=address)`` (``None``: a running cluster named
    by RAY_ADDRESS, else a new local one; ``"auto"``: the cluster this machine belongs to;
    ``"ray://host:10001"``: a remote one). When Ray is already initialized in this process, that
    cluster is used and left running. `shared` goes to the object store once per `map`
    (``ray.put``); a task whose worker or node dies is retried `max_retries` times by Ray
    (exceptions raised by the task itself are not retried: they are errors in the input).
    `workers`: the cluster's CPUs unless given. `init_kwargs` go to ``ray.init``."""

    def __init__(self, address: str | None = None, *, max_retries: int = 3,
                 workers: int | None = None, **init_kwargs: Any) -> None:
        ray = _import_ray()
        self._ray = ray
        self.max_retries = int(max_retries)
        self._owned = False
        self._shared: tuple[str, Any] | None = None
        if not ray.is_initialized():
            try:
                ray.init(address=address or None, **init_kwargs)
            except ConnectionError as e:
                raise ConfigError(f"cannot connect to the Ray cluster at {address!r}: {e}. Start "
                                  "one with `ray start --head` or pass no address for a local "
                                  "one.") from e
            self._owned = True
        cpus = int(ray.cluster_resources().get("CPU", 1))
        self.workers = _check_workers(workers) if workers is not None else max(1, cpus)
        self._remote = ray.remote(max_retries=self.max_retries, retry_exceptions=False)(_ray_task)

    def map(self, fn: Callable[[Any, T], R], items: Sequence[T], shared: Any = None) -> list[R]:
        ray = self._ray
        # once: every task gets the reference; the same content again (a search's next round)
        # reuses the object already in the store
        token = _digest(shared)[0]
        if self._shared is None or self._shared[0] != token:
            self._shared = None  # the old object can go from the store
            self._shared = (token, ray.put(shared))
        ref = self._shared[1]
        refs = [self._remote.remote(fn, ref, it) for it in items]
        try:
            return list(ray.get(refs))
        except ray.exceptions.RayTaskError as e:
            cause = e.as_instanceof_cause()
            if isinstance(cause, MixqError):
                raise cause from None  # a DataError in a shard reads as it would serially
            raise
        except (ray.exceptions.WorkerCrashedError, ray.exceptions.NodeDiedError) as e:
            raise WorkerError(f"a Ray worker died running {_name(fn)} after "
                              f"{self.max_retries} retries: {e}") from e
        except KeyboardInterrupt:
            # an interrupted search keeps its best plan: the tasks still running are not needed
            for r in refs:
                ray.cancel(r, force=True)
            raise

    def close(self) -> None:
        self._shared = None
        if self._owned and self._ray.is_initialized():
            self._ray.shutdown()
        self._owned = False

    def __repr__(self) -> str:
        return f"RayExecutor(workers={self.workers})"


def executor_from(workers: int | None = None, ray: str | bool | None = None) -> Executor | None:
    """The executor of the `--workers N` / `--ray [ADDRESS]` options: None (one process, the
    default), a :class:`ProcessExecutor` (N > 1), or a :class:`RayExecutor` (`ray`: an address,
    or True / "" for a local cluster or the one RAY_ADDRESS names)."""
    if ray is not None and ray is not False:
        if workers is not None:
            raise ConfigError("--workers and --ray exclude each other: --workers N runs N local "
                              "processes, --ray runs tasks on a Ray cluster (its CPUs)")
        return RayExecutor(None if ray is True or ray == "" else str(ray))
    if workers is None:
        return None
    n = _check_workers(workers, "--workers")
    return SerialExecutor(1) if n == 1 else ProcessExecutor(n)


# -- sharded calibration -----------------------------------------------------------------------
def shard_bounds(n_items: int, shards: int) -> list[tuple[int, int]]:
    """`shards` contiguous, non-empty ``[lo, hi)`` ranges covering ``range(n_items)`` (fewer when
    there are fewer items), sizes differing by at most one."""
    k = max(1, min(_check_workers(shards, "shards"), n_items))
    edges = [(n_items * i) // k for i in range(k + 1)]
    return [(edges[i], edges[i + 1]) for i in range(k)]


def _calib_shard(shared: tuple[bytes, list[str], list[dict[str, np.ndarray]], str | None],
                 bounds: tuple[int, int]) -> tuple[dict[str, dict[str, Any]], dict[str, str], int]:
    """Task: statistics of one shard of the feeds, as plain data
    (``{name: TensorStats.to_dict()}``, ``{name: why skipped}``, feeds run)."""
    from .calibration.collect import collect_stats

    model_bytes, names, feeds, base_dir = shared
    lo, hi = bounds
    res = collect_stats(onnx.load_from_string(model_bytes), names, feeds[lo:hi],
                        base_dir=base_dir)
    return {n: s.to_dict() for n, s in res.items()}, dict(res.skipped), res.num_batches


def calibrate_sharded(model: onnx.ModelProto, tensor_names: Sequence[str], data: Any,
                      executor: Executor, *, shards: int | None = None,
                      base_dir: str | os.PathLike | None = None,
                      progress: Callable[[int], Any] | None = None) -> Any:
    """:func:`mixq.calibration.collect.collect_stats` of `data` split into `shards` (default
    ``executor.workers``) contiguous shards run on `executor`, merged in shard order: the same
    statistics as one pass. Initializers are read once here, not per shard. The data is read
    here once (every feed validated) and sent to the workers once. `progress` is called with
    every batch index once its shard's results are back. Returns a CollectResult."""
    from .calibration.collect import CollectResult, collect_stats
    from .calibration.data import FeedSource
    from .calibration.stats import TensorStats

    names = list(dict.fromkeys(tensor_names))
    inits = {t.name for t in model.graph.initializer}
    # initializers (and unknown names) need no data: once, here
    local = collect_stats(model, [n for n in names if n in inits], None, base_dir=base_dir)
    run_names = [n for n in names if n not in inits]
    feeds = [{k: np.asarray(v) for k, v in f.items()}
             for f in FeedSource(data, model)] if run_names else []
    merged: dict[str, TensorStats] = {}
    skipped: dict[str, str] = dict(local.skipped)
    n_batches = 0
    if run_names:
        bounds = shard_bounds(len(feeds), shards if shards is not None else executor.workers)
        shared = (model.SerializeToString(), run_names, feeds,
                  None if base_dir is None else str(base_dir))
        set_total = getattr(progress, "set_total", None)  # a mixq._progress.Progress
        if callable(set_total):
            set_total(len(feeds))
        for part_stats, part_skipped, nb in executor.map(_calib_shard, bounds, shared):
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
    out = {**local.stats, **{n: s for n, s in merged.items() if n not in skipped}}
    return CollectResult({n: out[n] for n in names if n in out}, skipped, n_batches)


# -- candidate evaluations (the search) ---------------------------------------------------------
@dataclass(frozen=True)
class SplitMetric:
    """A metric a search scores candidate models with, computed feed by feed so that the
    evaluation data can be split over workers without changing a bit of the result.

    per_feed(state, model, lo, hi): one plain-data row per evaluation feed in ``[lo, hi)``
        (e.g. squared error and squared reference of that feed; a correct-prediction count);
    combine(state, rows): the metric from the rows of every feed, in feed order (runs in the
        driver; the same rows in the same order give the same float whatever the split).
    Both must be module-level functions (they are pickled by reference)."""

    per_feed: Callable[[Any, onnx.ModelProto, int, int], list[Any]]
    combine: Callable[[Any, list[Any]], float]


# the pipeline a worker built last, by the digest of (model, statistics): a search's rounds
# evaluate many plans of one calibrated model
_WORKER_PIPE: tuple[str, Any] | None = None


def _model_of(shared: tuple[bytes, dict[str, dict[str, Any]], str | None], plan_json: str,
              config: dict[str, Any], key: str | None = None) -> onnx.ModelProto:
    """The quantized model of (plan, config) rebuilt on a worker from the shipped prepared
    model and statistics: the same bytes as the driver's. `key`: the digest of `shared`, under
    which the parsed pipeline is kept for the next task."""
    global _WORKER_PIPE
    from .calibration.stats import TensorStats
    from .config import QuantConfig
    from .passes.prepare import PrepareReport
    from .pipeline import Pipeline
    from .plan.plan import PrecisionPlan

    if key is not None and _WORKER_PIPE is not None and _WORKER_PIPE[0] == key:
        pipe = _WORKER_PIPE[1]
    else:
        model_bytes, stats, base_dir = shared
        _WORKER_PIPE = None
        pipe = Pipeline(onnx.load_from_string(model_bytes), PrepareReport(),
                        base_dir=None if base_dir is None else Path(base_dir),
                        stats={n: TensorStats.from_dict(d) for n, d in stats.items()})
        if key is not None and _IN_WORKER:
            _WORKER_PIPE = (key, pipe)
    plan, cfg = PrecisionPlan.from_json(plan_json), QuantConfig.from_dict(config)
    return pipe.rewrite(plan, pipe.qparams(plan, cfg), cfg)[0]


def _evaluate_task(shared: tuple[tuple[bytes, dict[str, dict[str, Any]], str | None], str,
                                 SplitMetric, Any],
                   item: tuple[str, dict[str, Any], int, int]) -> list[Any]:
    """Task: the metric rows of feeds ``[lo, hi)`` for one candidate (plan JSON, config dict)."""
    model_part, key, metric, state = shared
    plan_json, config, lo, hi = item
    return list(metric.per_feed(state, _model_of(model_part, plan_json, config, key), lo, hi))


def evaluate_plans(pipe: Any, candidates: Sequence[tuple[Any, Any]], metric: SplitMetric,
                   state: Any, n_feeds: int, executor: Executor, *,
                   shards: int | None = None) -> list[float]:
    """The metric of every ``(PrecisionPlan, QuantConfig)`` in `candidates`, in order.

    `pipe` (a calibrated mixq Pipeline) supplies the prepared model and the statistics; they,
    `metric` and `state` (e.g. the evaluation feeds and the float outputs; `n_feeds` of them)
    go to the workers once. Each candidate's evaluation feeds are cut into `shards` contiguous
    shards (default: enough tasks to keep every worker busy), one task per (candidate, shard);
    a task rebuilds the candidate's model from the same statistics (the same bytes as in one
    process) and returns per-feed rows, which `metric.combine` reduces in feed order: the same
    floats as one process, whatever the shard count."""
    from .formats import get_format

    for plan, _ in candidates:  # every statistic a candidate needs must have been collected
        need = plan.calibrated_tensors(lambda f: get_format(f).needs_qparams)
        lacking = [n for n in need if n not in pipe.stats and n not in pipe.calib_skipped]
        if lacking:
            raise ConfigError(f"candidate plan needs statistics of {lacking[0]!r} (and "
                              f"{len(lacking) - 1} more) that were not collected: run "
                              "pipe.calibrate(plan, data) for every candidate first")
    if not candidates:
        return []
    k = shards if shards is not None else -(-executor.workers // len(candidates))
    bounds = shard_bounds(n_feeds, k)
    model_part = (pipe.model.SerializeToString(), {n: s.to_dict() for n, s in pipe.stats.items()},
                  None if pipe.base_dir is None else str(pipe.base_dir))
    items = [(plan.to_json(), cfg.to_dict(), lo, hi) for plan, cfg in candidates
             for lo, hi in bounds]
    key = _digest(model_part)[0]
    rows = executor.map(_evaluate_task, items, (model_part, key, metric, state))
    out = []
    for c in range(len(candidates)):
        per_feed = [r for part in rows[c * len(bounds):(c + 1) * len(bounds)] for r in part]
        out.append(float(metric.combine(state, per_feed)))
    return out


def _l2_rows(state: tuple[list[dict[str, np.ndarray]], list[np.ndarray]], model: onnx.ModelProto,
             lo: int, hi: int) -> list[tuple[float, float]]:
    """Per feed: (sum of squared error of the first output against the float one, sum of
    squared float output), float64."""
    import onnxruntime as ort

    feeds, ref = state
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    # one task per core (Ray gives a task one CPU): one thread, and no spinning between runs
    so.intra_op_num_threads = 1
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    rows = []
    for f, r in zip(feeds[lo:hi], ref[lo:hi]):
        out = sess.run(None, f)[0].astype(np.float64)
        r64 = np.asarray(r, dtype=np.float64)
        rows.append((float(np.sum((out - r64) ** 2)), float(np.sum(r64 ** 2))))
    return rows


def _l2_combine(state: Any, rows: list[tuple[float, float]]) -> float:
    num = float(sum(r[0] for r in rows))
    den = float(sum(r[1] for r in rows))
    return float(np.sqrt(num / den)) if den > 0 else float(np.sqrt(num))


#: Relative L2 error of the first output against the float model's, over the evaluation feeds
#: (``state = (feeds, float first outputs)``).
RELATIVE_L2 = SplitMetric(_l2_rows, _l2_combine)


# -- the search's parallel pieces: per-layer sensitivities, candidate models' outputs -----------
def _sensitivity_task(shared: tuple[dict[str, dict[str, Any]], dict[str, Any],
                                    list[tuple[str, str]]],
                      item: list[tuple[bytes, list[dict[str, np.ndarray]], bool]]
                      ) -> list[dict[str, float]]:
    """Task: the sensitivity rows of a group of layers (see `search.sensitivity.layer_row`)."""
    from .calibration.stats import TensorStats
    from .config import QuantConfig
    from .search.sensitivity import Candidate, layer_row

    stats, base_dict, cand_pairs = shared
    base, cands = QuantConfig.from_dict(base_dict), [Candidate(a, w) for a, w in cand_pairs]
    rows = []
    for tiny_bytes, chunks, weightless in item:
        tiny = onnx.load_from_string(tiny_bytes)
        names = {*(i for n in tiny.graph.node for i in n.input), *(o.name for o in tiny.graph.output)}
        rows.append(layer_row(tiny, {n: TensorStats.from_dict(stats[n]) for n in names if n in stats},
                              base, cands, chunks, weightless, threads=1 if _IN_WORKER else None))
    return rows


def sensitivity_rows(executor: Executor, layers: Sequence[tuple[onnx.ModelProto,
                                                                 list[dict[str, np.ndarray]], bool]],
                     stats: dict[str, Any], base: Any, candidates: Sequence[Any]) -> list[dict[str, float]]:
    """The sensitivity rows of `layers` ((one-node model, its captured values, weightless)), one
    task per layer on `executor`: the same floats as `layer_row` in this process."""
    names = {x for tiny, _, _ in layers for n in tiny.graph.node for x in (*n.input, *n.output)}
    shared = ({n: s.to_dict() for n, s in stats.items() if n in names}, base.to_dict(),
              [(c.activation, c.weight) for c in candidates])
    items = [(tiny.SerializeToString(), chunks, weightless) for tiny, chunks, weightless in layers]
    # a few tasks per worker, not one per layer: a layer is milliseconds of work, a task's
    # round trip is not much less
    groups = [items[lo:hi] for lo, hi in shard_bounds(len(items), 2 * executor.workers)]
    return [row for part in executor.map(_sensitivity_task, groups, shared) for row in part]


def _outputs_task(shared: tuple[tuple[bytes, dict[str, dict[str, Any]], str | None], str,
                                list[dict[str, np.ndarray]], int],
                  item: tuple[str, dict[str, Any]]) -> list[np.ndarray]:
    """Task: output `index` of one candidate (plan JSON, config dict) on every evaluation feed,
    computed as `Workbench.outputs` computes it."""
    from .evaluate import make_session

    model_part, key, feeds, index = shared
    plan_json, config = item
    # one thread per worker: the workers share the cores (onnxruntime computes each output
    # element the same way whatever its thread count)
    sess = make_session(_model_of(model_part, plan_json, config, key), optimize="basic",
                        threads=1 if _IN_WORKER else None)
    name = sess.get_outputs()[index].name
    return [sess.run([name], f)[0] for f in feeds]


def plan_outputs(executor: Executor, pipe: Any, candidates: Sequence[tuple[Any, Any]],
                 feeds: list[dict[str, np.ndarray]], output_index: int) -> list[list[np.ndarray]]:
    """Output `output_index` on every feed of each ``(PrecisionPlan, QuantConfig)``, one task
    per candidate: the same arrays as ``Workbench.outputs`` of the materialized model (the model
    is rebuilt on the worker from the same prepared model and statistics, byte for byte).
    The prepared model, statistics and feeds are shared (sent once, reused while unchanged)."""
    model_part = (pipe.model.SerializeToString(), {n: s.to_dict() for n, s in pipe.stats.items()},
                  None if pipe.base_dir is None else str(pipe.base_dir))
    key = _digest(model_part)[0]
    items = [(plan.to_json(), cfg.to_dict()) for plan, cfg in candidates]
    return executor.map(_outputs_task, items, (model_part, key, feeds, output_index))
