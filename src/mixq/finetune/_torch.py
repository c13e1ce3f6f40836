"""Lazy access to PyTorch: the only place mixq imports torch (fast finetuning only)."""
from __future__ import annotations

from typing import Any

from ..errors import ConfigError

INSTALL_HINT = "pip install mixq[finetune]"


def require_torch() -> Any:
    """The `torch` module, or ConfigError telling how to install it.

    Fast finetuning (AdaRound / AdaQuant) optimizes weights with PyTorch on the CPU; the rest of
    mixq never imports it."""
    try:
        import torch
    except ImportError as exc:  # pragma: no cover - exercised by a test that hides torch
        raise ConfigError("fast finetuning (AdaRound / AdaQuant) needs PyTorch, which is not "
                          f"installed; install it with `{INSTALL_HINT}` (torch 2.13, CPU is "
                          "enough), or quantize without a finetune config.") from exc
    return torch
