"""Value checks of the documented vocabulary: booleans are booleans, lists are lists, numbers are
in range. Each returns the normalized value or raises ConfigError naming the option."""
from __future__ import annotations

import enum
import math
import numbers
import operator
from collections.abc import Callable, Iterable
from typing import Any

from ..errors import ConfigError, did_you_mean

Check = Callable[[str, Any], Any]


def boolean(option: str, value: Any) -> bool:
    if not isinstance(value, bool):
        hint = " (a string is not a boolean: write True or False without quotes)" if isinstance(value, str) else ""
        raise ConfigError(f"{option}={value!r} must be True or False{hint}.")
    return value


def names(option: str, value: Any) -> tuple[str, ...]:
    """A list of names (op types, node or tensor names); a single string is an error."""
    if isinstance(value, (str, bytes)):
        raise ConfigError(f"{option}={value!r} must be a list of names, not a string: write "
                          f"[{value!r}].")
    if isinstance(value, dict) or not isinstance(value, Iterable):
        raise ConfigError(f"{option}={value!r} must be a list of names, e.g. ['Conv', 'MatMul'].")
    out = tuple(value)
    bad = [v for v in out if not isinstance(v, str)]
    if bad:
        raise ConfigError(f"{option} must hold names (strings); got {bad[0]!r}.")
    return out


def number(lo: float = -math.inf, hi: float = math.inf, *, lo_open: bool = False,
           integer: bool = False) -> Check:
    """A number in [lo, hi] (or (lo, hi] with lo_open); `integer` for whole numbers."""
    def check(option: str, value: Any) -> Any:
        kind = "an integer" if integer else "a number"
        ok_type = numbers.Integral if integer else numbers.Real
        if isinstance(value, bool) or not isinstance(value, ok_type):
            raise ConfigError(f"{option}={value!r} must be {kind}.")
        v = operator.index(value) if integer else float(value)  # type: ignore[arg-type]  # Integral checked above
        if not math.isfinite(v) or v < lo or v > hi or (lo_open and v == lo):
            lb = "(" if lo_open else "["
            raise ConfigError(f"{option}={value!r} must be {kind} in {lb}{lo:g}, {hi:g}].")
        return v
    return check


def choice(*allowed: str) -> Check:
    def check(option: str, value: Any) -> str:
        if not isinstance(value, str) or value.lower() not in allowed:
            raise ConfigError(f"{option}={value!r} is not valid; choose one of {', '.join(allowed)}."
                              + did_you_mean(str(value), allowed))
        return value.lower()
    return check


def member(*classes: type[enum.Enum]) -> Check:
    def check(option: str, value: Any) -> enum.Enum:
        if not isinstance(value, classes):
            raise ConfigError(f"{option}={value!r}: expected a member of "
                              f"{' / '.join(c.__name__ for c in classes)}, e.g. "
                              f"{classes[0].__name__}.{next(iter(classes[0])).name}.")
        return value
    return check


def mapping(option: str, value: Any) -> dict:
    if not isinstance(value, dict):
        raise ConfigError(f"{option}={value!r} must be a dict.")
    return value


def anything(option: str, value: Any) -> Any:
    return value


def callable_(option: str, value: Any) -> Any:
    if not callable(value):
        raise ConfigError(f"{option}={value!r} must be a function.")
    return value


def optional(check: Check) -> Check:
    def opt(option: str, value: Any) -> Any:
        return None if value is None else check(option, value)
    return opt


def pair(option: str, value: Any) -> tuple[float, float]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable) or len(tuple(value)) != 2:
        raise ConfigError(f"{option}={value!r} must be a pair of numbers, e.g. (20, 2).")
    a, b = tuple(value)
    return number()(f"{option}[0]", a), number()(f"{option}[1]", b)
