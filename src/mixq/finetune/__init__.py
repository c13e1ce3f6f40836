"""Fast finetuning after calibration: AdaRound (learned rounding of integer weights) and AdaQuant
(continuous weights under the format's fake quantization, every format), layer by layer.

    from mixq.finetune import AdaRoundConfig, AdaQuantConfig, quantize_with_finetune
    res = quantize_with_finetune("model.onnx", "A8W8", calib, AdaRoundConfig(num_iterations=500))
    print(res.finetune.to_markdown())

or ``mixq.quantize(model, config, calib, finetune=AdaQuantConfig(...))``. The configs are pure
Python; the optimization uses PyTorch on the CPU (``pip install mixq[finetune]``), imported only
when a layer is finetuned. See `core` for the algorithm; the documented QConfig vocabulary that asks for it
(`algo_config=[AdaQuantConfig(...)]`) is `mixq.compat.qconfig`.
"""
from __future__ import annotations

from .api import quantize_with_finetune
from .config import FINETUNE_OP_TYPES, AdaQuantConfig, AdaRoundConfig, EarlyStop
from .core import finetune, find_layers, run_finetune, with_weights
from .report import FinetuneReport, LayerReport, ModelMetric

__all__ = ["AdaQuantConfig", "AdaRoundConfig", "EarlyStop", "FINETUNE_OP_TYPES", "FinetuneReport",
           "LayerReport", "ModelMetric", "finetune", "find_layers", "quantize_with_finetune",
           "run_finetune", "with_weights"]
