"""mixq: mixed-precision quantization of ONNX models that runs in stock onnxruntime.

Public API:
    quantize(model, config, calibration_data, output_path=...) -> QuantizeResult
    QuantConfig, get_default_config(name), PRESETS
    PrecisionPlan, TensorPrecision, Pipeline (the stages, for clients that run them one by one)
    PerTensor, PerChannel, PerBlock (weight granularity)
    get_format(name), list_formats()
    ModelQuantizer (the documented front door, see mixq.compat)
"""
from .api import QuantizeResult, quantize
from .calibration.data import CalibData
from .config import PRESETS, LayerRule, QuantConfig, get_default_config
from .errors import ConfigError, DataError, FormatError, MixqError, ModelError, OutputError
from .formats import get_format, list_formats
from .granularity import Granularity, PerBlock, PerChannel, PerTensor
from .pipeline import Pipeline
from .plan.plan import PrecisionPlan, TensorPrecision

__version__ = "0.1.0"

__all__ = [
    "quantize", "QuantizeResult", "CalibData", "QuantConfig", "LayerRule", "get_default_config", "PRESETS",
    "PrecisionPlan", "TensorPrecision", "get_format", "list_formats", "Pipeline",
    "Granularity", "PerTensor", "PerChannel", "PerBlock",
    "MixqError", "ConfigError", "DataError", "FormatError", "ModelError", "OutputError",
]
