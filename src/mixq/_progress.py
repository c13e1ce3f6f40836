"""Progress of long steps on stderr: what people expect from a command-line tool.

* In a terminal: a tqdm bar, with the total and an ETA when the total is known.
* In a pipe or a log file (stderr is not a TTY): one plain line every few seconds, e.g.
  ``calibrating: 40/256 batches, 3.1 s, eta 12 s``, so a piped run is never silent for long.
  The interval is MIXQ_PROGRESS_INTERVAL seconds (default 5; 0 prints on every step).
* ``set_quiet(True)`` (the CLI's ``--quiet``) or MIXQ_QUIET=1 silences it.

Library calls (mixq.quantize ...) report progress only through the callbacks they are given;
the CLI builds those from `Progress`.
"""
from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from typing import IO, Any, TypeVar

__all__ = ["Progress", "StageProgress", "set_quiet", "is_quiet", "interval", "track"]

T = TypeVar("T")

_quiet = False


def set_quiet(quiet: bool = True) -> None:
    """Silence (or restore) every progress display of this process."""
    global _quiet
    _quiet = bool(quiet)


def is_quiet() -> bool:
    """Whether progress is silenced (set_quiet, or MIXQ_QUIET set to a non-empty value but 0)."""
    return _quiet or os.environ.get("MIXQ_QUIET", "") not in ("", "0")


def interval() -> float:
    """Seconds between two plain progress lines (MIXQ_PROGRESS_INTERVAL, default 5)."""
    raw = os.environ.get("MIXQ_PROGRESS_INTERVAL", "")
    try:
        value = float(raw) if raw else 5.0
    except ValueError:
        return 5.0  # a display setting: a bad value must not stop a quantization run
    return value if value >= 0 else 5.0


def _seconds(s: float) -> str:
    if s < 60:
        return f"{s:.1f} s"
    m, s = divmod(int(round(s)), 60)
    return f"{m} min {s:02d} s" if m < 60 else f"{m // 60} h {m % 60:02d} min"


class Progress:
    """Progress of one step: ``update()`` per item (or ``set(n)``), ``close()`` at the end.

    Also usable as the ``progress(i)`` callback of mixq.quantize / collect_stats (called with
    the 0-based index of each batch). `total` may be set later (``set_total``); without it
    the display shows the count and the elapsed time only. `eta`: False where the total is
    an upper bound rather than the expected count (a search that may stop early)."""

    def __init__(self, desc: str, total: int | None = None, unit: str = "batches", *,
                 eta: bool = True, stream: IO[str] | None = None) -> None:
        self.desc, self.total, self.unit, self.eta = desc, total, unit, eta
        self.n = 0
        # the heartbeat speaks only while the step runs: from its total (or first item) on,
        # until the last item (a callback handed to quantize() exists before calibration starts
        # and after it ends)
        self._started = total is not None
        self._shown: int | None = None  # the count the last plain line showed
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = not is_quiet()
        self._t0 = self._last = time.monotonic()
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._bar: Any = None
        self._thread: threading.Thread | None = None
        if not self.enabled:
            return
        tty = bool(getattr(self.stream, "isatty", lambda: False)())
        if tty:
            from tqdm import tqdm

            self._bar = tqdm(total=total, desc=desc, unit=f" {unit}", file=self.stream,
                             leave=False, dynamic_ncols=True)
        else:
            self._interval = interval()
            if self._interval > 0:  # heartbeat: a line every interval even between steps
                self._thread = threading.Thread(target=self._beat, daemon=True)
                self._thread.start()

    # ------------------------------------------------------------------ updates
    def set_total(self, total: int | None) -> None:
        """The number of items expected (None: unknown); the step has started."""
        self.total = total
        self._started = True
        if self._bar is not None:
            self._bar.total = total
            self._bar.refresh()

    def set(self, n: int) -> None:
        """`n` items are done."""
        with self._lock:
            delta, self.n = n - self.n, n
            self._started = True
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.update(delta)
        elif time.monotonic() - self._last >= self._interval:
            self._emit()

    def update(self, k: int = 1) -> None:
        """`k` more items are done."""
        self.set(self.n + k)

    def __call__(self, index: int) -> None:
        """The callback form: item `index` (0-based) is done."""
        self.set(index + 1)

    def line(self) -> str:
        """The plain progress line, e.g. 'calibrating: 40/256 batches, 3.1 s, eta 12 s'."""
        el = time.monotonic() - self._t0
        count = f"{self.n}/{self.total}" if self.total else f"{self.n}"
        text = f"{self.desc}: {count} {self.unit}, {_seconds(el)}"
        if self.eta and self.total and 0 < self.n < self.total:
            text += f", eta {_seconds(el / self.n * (self.total - self.n))}"
        return text

    def _emit(self) -> None:
        with self._lock:
            self._last = time.monotonic()
            self._shown = self.n
            try:
                self.stream.write(self.line() + "\n")
                self.stream.flush()
            except (OSError, ValueError):  # stderr closed: progress is not worth failing for
                self.enabled = False

    def _beat(self) -> None:
        while not self._closed.wait(self._interval / 2):
            running = self._started and not (self.total and self.n >= self.total)
            if running and time.monotonic() - self._last >= self._interval:
                self._emit()

    # ------------------------------------------------------------------ end
    def close(self) -> None:
        """End the display (in a pipe, a final line when lines were printed and the last one
        is out of date)."""
        if self._closed.is_set():
            return
        self._closed.set()
        if self._thread is not None:
            self._thread.join()
        if self._bar is not None:
            self._bar.close()
        elif self.enabled and self._shown is not None and self._shown != self.n:
            self._emit()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def track(items: Iterable[T], desc: str, total: int | None = None, unit: str = "batches") -> Iterator[T]:
    """Iterate over `items` showing progress (the total from ``len(items)`` when it has one)."""
    if total is None and hasattr(items, "__len__"):
        total = len(items)  # type: ignore[arg-type]
    with Progress(desc, total, unit) as p:
        for item in items:
            yield item
            p.update()


class StageProgress:
    """The ``progress(stage, i, n)`` callback of mixq.auto_quantize: one `Progress` per stage.

    `no_eta`: stages whose `n` is an upper bound (the search may stop early)."""

    def __init__(self, no_eta: Iterable[str] = ("evaluate",)) -> None:
        self.no_eta = set(no_eta)
        self.stage: str | None = None
        self.current: Progress | None = None

    def __call__(self, stage: str, i: int, n: int) -> None:
        if stage != self.stage or self.current is None:
            self.close()
            self.stage = stage
            self.current = Progress(stage, n, "steps", eta=stage not in self.no_eta)
        elif n != self.current.total:
            self.current.set_total(n)
        self.current.set(i)

    def close(self) -> None:
        """End the current stage's display."""
        if self.current is not None:
            self.current.close()
            self.current = None


def stdout_closed() -> int:
    """The reader of stdout went away (`mixq ... | head -1`): stop quietly, as other command
    line tools do. Later writes (and the flush at exit) go to /dev/null instead of raising."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # stdout is not a real file: nothing left to flush there
        pass
    return 0
