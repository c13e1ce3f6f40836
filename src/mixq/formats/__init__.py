"""Numeric formats: typed specs, name grammar, NumPy reference and ONNX emission.

``get_format(name)`` / ``list_formats()`` are the entry points; see docs/ARCHITECTURE.md."""
from __future__ import annotations

from .base import MIXQ_DOMAIN, MIXQ_DOMAIN_VERSION, Emission, Format, QParams, Rounding, Shape
from .floating import FP_FORMATS, FloatFormat
from .integer import INT_FORMATS, IntFormat, expand_param, pof2_scale
from .registry import format_names, get_format, list_formats, register_format, register_parser

from . import block  # noqa: E402,F401  (registers the block-format grammar on import)

__all__ = [
    "MIXQ_DOMAIN", "MIXQ_DOMAIN_VERSION", "Emission", "Format", "QParams", "Rounding", "Shape",
    "FloatFormat", "FP_FORMATS", "IntFormat", "INT_FORMATS", "expand_param", "pof2_scale",
    "format_names", "get_format", "list_formats", "register_format", "register_parser",
]
