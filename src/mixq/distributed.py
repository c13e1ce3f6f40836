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

import multiprocessing.context as mpc
import os
import pickle
import tempfile
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import onnx

from ._shards import Executor, Shared, check_workers, mark_worker, shard_bounds, shared_token, shared_value
from .calibration.sharded import calibrate_sharded
from .errors import ConfigError, MixqError
from .pipeline import model_from_shared, shared_form
from .search.sensitivity import sensitivity_rows
from .search.workbench import plan_outputs

__all__ = ["Executor", "Shared", "SerialExecutor", "ProcessExecutor", "RayExecutor", "WorkerError",
           "executor_from", "shard_bounds", "calibrate_sharded", "SplitMetric",
           "evaluate_plans", "RELATIVE_L2", "sensitivity_rows", "plan_outputs", "WORKER_THREADS_ENV"]

T = TypeVar("T")
R = TypeVar("R")

#: How to get Ray, named in every error about it.
RAY_INSTALL = "pip install 'mixq[ray]'"


class WorkerError(MixqError, RuntimeError):
    """A worker process died and the task could not be completed on another one."""


class _ContextMixin:
    def close(self) -> None:  # pragma: no cover - overridden where there is something to free
        return None

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _name(fn: Any) -> str:
    return str(getattr(fn, "__name__", None) or getattr(getattr(fn, "func", None), "__name__", fn))


class SerialExecutor(_ContextMixin):
    """Runs the tasks in this process, one after another. `workers` is only how many tasks the
    work is split into: ``SerialExecutor(3)`` reproduces the splitting of a 3-worker run."""

    def __init__(self, workers: int = 1) -> None:
        self.workers = check_workers(workers)

    def map(self, fn: Callable[[Any, T], R], items: Sequence[T], shared: Any = None) -> list[R]:
        return [fn(shared, it) for it in items]

    def __repr__(self) -> str:
        return f"SerialExecutor({self.workers})"


# -- local processes ---------------------------------------------------------------------------
# the shared object a worker process read last: (token, object); one map call's shared data is
# read once per worker, not once per task
_WORKER_SHARED: tuple[str, Any] | None = None


def _process_task(fn: Callable[[Any, Any], Any], token: str, path: str | None, item: Any) -> Any:
    """Runs in a worker process: `fn(shared, item)` with the shared object of `token`."""
    global _WORKER_SHARED
    mark_worker()
    if path is None:
        return fn(None, item)
    if _WORKER_SHARED is None or _WORKER_SHARED[0] != token:
        _WORKER_SHARED = None  # drop the previous call's data before reading the next
        with open(path, "rb") as f:
            _WORKER_SHARED = (token, pickle.load(f))  # written by this module, never user files
    return fn(_WORKER_SHARED[1], item)


#: Thread counts a local worker process starts with (unless this process's environment sets
#: them): one compute thread per worker, as Ray gives each task. Two workers whose BLAS runs
#: a thread per core each contend on the cores (GPTQ's grams took 2x longer that way).
WORKER_THREADS_ENV = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def _spawn_one_thread(start: Callable[[], None]) -> None:
    """`start()` a spawned process with WORKER_THREADS_ENV set to 1 where unset (the child
    copies the environment when it starts; this process's is restored at once)."""
    added = [k for k in WORKER_THREADS_ENV if k not in os.environ]
    try:
        for k in added:
            os.environ[k] = "1"
        start()
    finally:
        for k in added:
            os.environ.pop(k, None)


class _OneThreadProcess(mpc.SpawnProcess):
    """A spawned worker process started by `_spawn_one_thread`."""

    def start(self) -> None:
        _spawn_one_thread(super().start)


class _OneThreadContext(mpc.SpawnContext):
    """The spawn context of the local workers (module level: its processes are pickled)."""

    Process = _OneThreadProcess


class ProcessExecutor(_ContextMixin):
    """`workers` local processes (spawn context: a fresh interpreter each, no forked
    onnxruntime threads; one BLAS / OpenMP thread each, see WORKER_THREADS_ENV). The pool
    starts on the first `map` and lives until `close()`; a task whose worker died is run again
    once in a new pool, then :class:`WorkerError`."""

    def __init__(self, workers: int, *, retries: int = 1) -> None:
        self.workers = check_workers(workers)
        self.retries = int(retries)
        self._pool: ProcessPoolExecutor | None = None
        self._tmp: tempfile.TemporaryDirectory | None = None

    def _get_pool(self) -> ProcessPoolExecutor:
        if self._pool is None:
            self._pool = ProcessPoolExecutor(max_workers=self.workers, mp_context=_OneThreadContext())
        return self._pool

    def map(self, fn: Callable[[Any, T], R], items: Sequence[T], shared: Any = None) -> list[R]:
        items = list(items)
        token, path = "", None
        if shared is not None:
            # the file is named by its content: a search's rounds send the same model and
            # feeds again and again, and each worker keeps what it read last
            token = shared_token(shared)
            if self._tmp is None:
                self._tmp = tempfile.TemporaryDirectory(prefix="mixq_shared_")
            path = os.path.join(self._tmp.name, f"{token}.pkl")
            if not os.path.exists(path):
                for old in Path(self._tmp.name).glob("*.pkl"):
                    old.unlink()
                with open(path + ".part", "wb") as f:  # named by its token only once whole
                    pickle.dump(shared_value(shared), f, protocol=pickle.HIGHEST_PROTOCOL)
                os.replace(path + ".part", path)
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
    mark_worker()
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
        self.workers = check_workers(workers) if workers is not None else max(1, cpus)
        self._remote = ray.remote(max_retries=self.max_retries, retry_exceptions=False)(_ray_task)

    def map(self, fn: Callable[[Any, T], R], items: Sequence[T], shared: Any = None) -> list[R]:
        ray = self._ray
        # once: every task gets the reference; the same content again (a search's next round)
        # reuses the object already in the store
        token = shared_token(shared)
        if self._shared is None or self._shared[0] != token:
            self._shared = None  # the old object can go from the store
            self._shared = (token, ray.put(shared_value(shared)))
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
    n = check_workers(workers, "--workers")
    return SerialExecutor(1) if n == 1 else ProcessExecutor(n)


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


def _evaluate_task(shared: tuple[tuple[bytes, dict[str, dict[str, Any]], str | None], str,
                                 SplitMetric, Any],
                   item: tuple[str, dict[str, Any], int, int]) -> list[Any]:
    """Task: the metric rows of feeds ``[lo, hi)`` for one candidate (plan JSON, config dict)."""
    model_part, key, metric, state = shared
    plan_json, config, lo, hi = item
    return list(metric.per_feed(state, model_from_shared(model_part, plan_json, config, key), lo, hi))


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
    model_part, key = shared_form(pipe)
    items = [(plan.to_json(), cfg.to_dict(), lo, hi) for plan, cfg in candidates
             for lo, hi in bounds]
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

    from .evaluate import seed_random_ops

    feeds, ref = state
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    # one task per core (Ray gives a task one CPU): one thread, and no spinning between runs
    so.intra_op_num_threads = 1
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    sess = ort.InferenceSession(seed_random_ops(model).SerializeToString(), so, providers=["CPUExecutionProvider"])
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
