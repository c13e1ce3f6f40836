"""What every parallel piece of mixq shares, below everything that uses it: the `Executor`
protocol (implemented in :mod:`mixq.distributed`), contiguous shards, content digests of shared
data, and whether this process is a worker. It imports nothing of mixq but its errors, so the
calibration, the pipeline and the search can hand work to an executor without importing the
executors (and the executors' tasks can import them)."""
from __future__ import annotations

import hashlib
import pickle
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar, runtime_checkable

import numpy as np

from .errors import ConfigError

T = TypeVar("T")
R = TypeVar("R")

# set in worker processes (local or Ray): only there are parsed models kept between tasks, and
# onnxruntime runs one thread (the workers share the cores)
_IN_WORKER = False


def mark_worker() -> None:
    """Called by the executors' task wrappers in the process that runs a task."""
    global _IN_WORKER
    _IN_WORKER = True


def in_worker() -> bool:
    """Whether this process runs tasks for an executor (not the driver)."""
    return _IN_WORKER


@runtime_checkable
class Executor(Protocol):
    """Runs independent tasks; `workers` is how many run at once (and how many shards the
    calibration data is cut into)."""

    workers: int

    def map(self, fn: Callable[[Any, T], R], items: Sequence[T], shared: Any = None) -> list[R]:
        """``[fn(shared, item) for item in items]``, in item order. `fn` must be a module-level
        function; `shared` is sent to the workers once per call (a `Shared`: its value, sent
        only when its token is new to them; `fn` reads a Shared through `shared_value`, so an
        executor may also pass it on as it is)."""
        ...

    def close(self) -> None:
        """Release the workers (idempotent)."""
        ...


def check_workers(workers: Any, what: str = "workers") -> int:
    if isinstance(workers, bool) or not isinstance(workers, (int, np.integer)) or workers < 1:
        raise ConfigError(f"{what} must be a positive integer, got {workers!r}")
    return int(workers)


@dataclass(frozen=True)
class Shared:
    """A map call's shared data whose content digest the caller knows already (made from the
    digests of what it holds): executors find the copy their workers hold by `token`, and
    pickle `value` only to send it. A search sends the same model and feeds in every round."""

    value: Any
    token: str


def digest(shared: Any) -> tuple[str, bytes]:
    """(content digest, pickle) of a shared object."""
    blob = pickle.dumps(shared, protocol=pickle.HIGHEST_PROTOCOL)
    return hashlib.sha256(blob).hexdigest(), blob


def shared_token(shared: Any) -> str:
    """`digest(shared)[0]`, without pickling a `Shared`."""
    return shared.token if isinstance(shared, Shared) else digest(shared)[0]


def shared_value(shared: Any) -> Any:
    """What the tasks receive: a `Shared`'s value, anything else as it is."""
    return shared.value if isinstance(shared, Shared) else shared


def shard_bounds(n_items: int, shards: int) -> list[tuple[int, int]]:
    """`shards` contiguous, non-empty ``[lo, hi)`` ranges covering ``range(n_items)`` (fewer when
    there are fewer items), sizes differing by at most one."""
    k = max(1, min(check_workers(shards, "shards"), n_items))
    edges = [(n_items * i) // k for i in range(k + 1)]
    return [(edges[i], edges[i + 1]) for i in range(k)]
