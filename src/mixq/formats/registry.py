"""Format names: the grammar, the registry of named formats and the parser hook.

Names are case-insensitive; every format has one canonical name with
``get_format(f.name) == f``. Element formats:

* integers ``int4 uint4 int8 uint8 int16 uint16 int32 uint32``; a trailing ``n`` selects the
  narrow range (``int8n`` = [-127, 127], ``uint8n`` = [1, 255]); ``int8(narrow)`` is accepted
  as an alias of ``int8n``;
* floats ``fp16 bf16 fp8_e4m3fn fp8_e5m2 fp6_e3m2 fp6_e2m3 fp4_e2m1`` (aliases: ``float16``,
  ``bfloat16``, the ml_dtypes spellings ``float8_e4m3fn``, ``float6_e3m2fn`` ..., and the
  ``fn``-suffixed fp6/fp4 names).

Other modules (block formats) add grammar with :func:`register_parser`.
"""
from __future__ import annotations

import re
from collections.abc import Callable, Iterable

from mixq.errors import FormatError, did_you_mean

from .base import Format
from .floating import FP_FORMATS
from .integer import INT_FORMATS

#: A parser maps a lower-cased, stripped name to a Format, returns None when the name is not
#: in its grammar, and raises FormatError when it is but is malformed (bad parameters).
Parser = Callable[[str], "Format | None"]

_NAMED: dict[str, Format] = {}
_ALIASES: dict[str, str] = {}
_PARSERS: list[Parser] = []


def register_format(fmt: Format, *aliases: str) -> None:
    """Make `fmt` known by its canonical name (and `aliases`) and listed by list_formats()."""
    _NAMED[fmt.name.lower()] = fmt
    for a in aliases:
        _ALIASES[a.lower()] = fmt.name.lower()


def register_parser(parser: Parser, formats: Iterable[Format] = ()) -> None:
    """Add a parser for a parametric grammar (e.g. ``bfp(block=16,exp=8,mant=4)``).

    `formats` are the named formats of that family, listed by list_formats() and offered in
    "did you mean" hints. Parsers run after the exact-name lookup, in registration order."""
    if parser not in _PARSERS:
        _PARSERS.append(parser)
    for f in formats:
        register_format(f)


def _canon(name: str) -> str:
    s = re.sub(r"\s+", "", name.lower())
    return re.sub(r"\(narrow\)$", "n", s)  # int8(narrow) -> int8n


def get_format(name: "str | Format") -> Format:
    """The Format called `name` (case-insensitive); a Format is returned as is.

    Raises FormatError naming the string, the valid names and the closest matches."""
    if isinstance(name, Format):
        return name
    if not isinstance(name, str):
        raise FormatError(f"format name must be a string, got {type(name).__name__} {name!r}")
    key = _canon(name)
    key = _ALIASES.get(key, key)
    if key in _NAMED:
        return _NAMED[key]
    for parse in _PARSERS:
        fmt = parse(key)
        if fmt is not None:
            return fmt
    names = format_names()
    raise FormatError(f"unknown numeric format {name!r}; valid formats: {', '.join(names)}."
                      + did_you_mean(name.strip(), names + sorted(_ALIASES)))


def format_names() -> list[str]:
    """Canonical names of every listed format, in list_formats() order."""
    return [f.name for f in list_formats()]


def list_formats() -> list[Format]:
    """Every named format (parametric grammars contribute their named members)."""
    return list(dict.fromkeys(_NAMED.values()))


_f: Format
for _f in INT_FORMATS.values():
    register_format(_f)
for _f in FP_FORMATS.values():
    register_format(_f)
register_format(FP_FORMATS["fp16"], "float16", "half")
register_format(FP_FORMATS["bf16"], "bfloat16")
register_format(FP_FORMATS["fp8_e4m3fn"], "float8_e4m3fn", "fp8_e4m3", "e4m3")
register_format(FP_FORMATS["fp8_e5m2"], "float8_e5m2", "e5m2")
register_format(FP_FORMATS["fp6_e3m2"], "float6_e3m2fn", "fp6_e3m2fn")
register_format(FP_FORMATS["fp6_e2m3"], "float6_e2m3fn", "fp6_e2m3fn")
register_format(FP_FORMATS["fp4_e2m1"], "float4_e2m1fn", "fp4_e2m1fn", "fp4")
