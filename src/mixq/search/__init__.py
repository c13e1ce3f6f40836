"""Sensitivity analysis and automatic mixed precision (see `auto_quantize`)."""
from .auto import AutoConfig, AutoResult, auto_quantize, base_from_candidate, parse_candidates
from .sensitivity import Candidate, SensitivityTable
from .strategies import STRATEGIES

__all__ = ["AutoConfig", "AutoResult", "auto_quantize", "Candidate", "SensitivityTable",
           "STRATEGIES", "parse_candidates", "base_from_candidate"]
