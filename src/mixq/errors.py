"""Error classes. Every error mixq raises for bad user input is a MixqError subclass
whose message names the offending value and how to fix it."""
from __future__ import annotations

import difflib
from collections.abc import Iterable


class MixqError(Exception):
    """Base class of every error mixq raises on purpose."""


class FormatError(MixqError, ValueError):
    """Unknown or malformed numeric format name, or a format used where it cannot be."""


class ConfigError(MixqError, ValueError):
    """Invalid configuration: unknown option, preset, value out of range."""


class ModelError(MixqError, ValueError):
    """The input model cannot be read, validated or rewritten."""


class DataError(MixqError, ValueError):
    """Calibration or evaluation data does not match the model."""


class OutputError(MixqError, OSError):
    """The output cannot be written where asked."""


def did_you_mean(name: str, choices: Iterable[str], n: int = 3) -> str:
    """Return ' Did you mean: a, b?' (or '') listing the closest choices to `name`."""
    choices = [str(c) for c in choices]
    close = difflib.get_close_matches(str(name), choices, n=n, cutoff=0.5)
    if not close:
        lowered = {c.lower(): c for c in choices}
        close = [lowered[c] for c in difflib.get_close_matches(str(name).lower(), list(lowered), n=n, cutoff=0.5)]
    return f" Did you mean: {', '.join(close)}?" if close else ""
