"""`quantize_with_finetune`: the quantization pipeline with AdaRound / AdaQuant before the rewrite."""
from __future__ import annotations

import os
from typing import Any

from ..errors import ConfigError
from .config import AdaQuantConfig, AdaRoundConfig


def quantize_with_finetune(model: Any, config: Any, calibration_data: Any,
                           finetune_config: AdaRoundConfig | AdaQuantConfig | None = None,
                           output_path: str | os.PathLike | None = None, **quantize_options: Any) -> Any:
    """Quantize `model` like `mixq.quantize`, finetuning the weights layer by layer first.

    `config`: a QuantConfig, a preset name, or a compat QConfig (whose algo_config supplies the
    finetune config when `finetune_config` is None). `finetune_config`: an AdaRoundConfig or
    AdaQuantConfig. Other keyword options go to `mixq.quantize`. Returns its QuantizeResult,
    with the FinetuneReport in `result.finetune`.
    """
    from ..api import quantize

    ft = finetune_config if finetune_config is not None else getattr(config, "finetune_config", None)
    if ft is None:
        raise ConfigError("quantize_with_finetune needs finetune_config=AdaRoundConfig(...) or "
                          "AdaQuantConfig(...) (or a QConfig with algo_config=[...]); use "
                          "mixq.quantize to quantize without finetuning.")
    if not isinstance(ft, (AdaRoundConfig, AdaQuantConfig)):
        raise ConfigError(f"finetune_config must be an AdaRoundConfig or AdaQuantConfig, got "
                          f"{type(ft).__name__}.")
    if calibration_data is None:
        raise ConfigError("fast finetuning needs calibration_data (the layer inputs and float "
                          "targets come from it).")
    return quantize(model, config, calibration_data, output_path=output_path, finetune=ft,
                    **quantize_options)


__all__ = ["quantize_with_finetune"]
