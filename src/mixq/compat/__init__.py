"""The documented configuration vocabulary, accepted at the edge and translated once into
mixq's typed `QuantConfig` (plus a finetune config and an auto-mixed-precision request).

Code written against the vendor documentation runs with only its import lines changed:

    from mixq.compat import ModelQuantizer, CalibrationMethod, VitisQuantFormat, VitisQuantType
    from mixq.compat import Config, QuantizationConfig, get_default_config, QConfig, QLayerConfig

Every documented name is in one table (`mixq.compat.table`, rendered as docs/COMPAT.md): it maps
to a mixq setting or raises "unsupported: <why> (<what to use instead>)". Unknown names raise
ConfigError with a "did you mean"; values are type-checked; nothing is silently ignored.
"""
from __future__ import annotations

import os
import sys
import types
import warnings
from typing import Any

import numpy as np

from ..config import QuantConfig
from ..config import get_default_config as _mixq_preset
from ..errors import ConfigError
from .algo import (AdaQuantConfig, AdaRoundConfig, AutoMixprecisionConfig, BiasCorrectionConfig, CLEConfig,
                   GPTQConfig, QuarotConfig, SmoothQuantConfig)
from .amp import WalkResult, average_l2, vendor_walk
from .enums import (CalibMethod, CalibrationMethod, ExtendedCalibrationMethod, ExtendedQuantFormat,
                    ExtendedQuantType, Int16Method, LayerWiseMethod, PowerOfTwoMethod, QuantFormat,
                    QuantGranularity, QuantType, ScaleType, VitisQuantFormat, VitisQuantType)
from .finetune_vocab import finetune_from_cli
from .legacy import Config, QuantizationConfig, Translation
from .names import check_names_against_model
from .presets import get_default_config
from .qconfig import QCONFIG_PRESETS, QConfig, qconfig_preset
from .qspecs import SPECS as _SPECS
from .qspecs import DataTypeSpec, QLayerConfig


def translate(config: Any) -> Translation:
    """The Translation of any config ModelQuantizer takes (a compat config, a QuantConfig or a mixq
    preset name)."""
    if isinstance(config, (Config, QuantizationConfig, QConfig)):
        return config.translate()
    if isinstance(config, QuantConfig):
        return Translation(config=config)
    if isinstance(config, str):
        return Translation(config=_mixq_preset(config))
    raise ConfigError(f"ModelQuantizer needs a Config, QuantizationConfig, QConfig, QuantConfig or a "
                      f"mixq preset name, got {type(config).__name__}.")


def _first_samples(data: Any, n: int, model: Any) -> list[dict[str, np.ndarray]]:
    """The first `n` samples (rows) of calibration `data`, as feeds (CalibDataSize): whole feeds,
    the last one cut to the rows still wanted where the model's batch axis is dynamic (a model
    with a fixed batch takes whole feeds: 12 samples for 10 at a batch of 4)."""
    from ..calibration.data import as_feeds
    from ..fidelity import batch_axis_dynamic, count_samples, probe_feeds

    out: list[dict[str, np.ndarray]] = []
    for feed in as_feeds(data, model):
        out.append(feed)
        if count_samples(out) >= n:
            break
    return probe_feeds(out, n, sliceable=batch_axis_dynamic(model))


def _equalized(model_input: Any, data: Any, steps: int) -> Any:
    """The prepared model with cross-layer equalization; checked to compute the same outputs as
    the float model on the first calibration batch (an equalization that changed the function
    would be a wrong model: it raises instead)."""
    from .._io import load_model
    from ..evaluate import make_session
    from ..passes.prepare import prepare
    from .amp import ensure_names
    from .cle import equalize

    prepared, _ = prepare(load_model(model_input))
    ensure_names(prepared)
    eq, n = equalize(prepared, steps)
    if n == 0 or data is None:
        return prepared if n == 0 else eq
    first = data[0] if isinstance(data, list) and data else None
    if first is None:
        return eq
    ref = make_session(prepared, optimize=False).run(None, first)
    got = make_session(eq, optimize=False).run(None, first)
    for r, g in zip(ref, got):
        err = float(np.max(np.abs(np.asarray(r, np.float64) - g)))
        if err > 1e-3 * max(1.0, float(np.max(np.abs(r)))):
            raise ConfigError(f"internal error: cross-layer equalization changed the model's output by "
                              f"{err:.3g}; set include_cle=False and report the model.")
    return eq


class ModelQuantizer:
    """The documented front door: `ModelQuantizer(config).quantize_model(in, out, reader)`.

    `result` is the QuantizeResult (or, for an AutoMixprecision walk, the WalkResult, whose
    `quantize_result` is the QuantizeResult of the chosen plan)."""

    def __init__(self, config: Any) -> None:
        self.translation = translate(config)
        self.config: QuantConfig = self.translation.config
        self._source = config
        self.result: Any = None

    def quantize_model(self, model_input: str | os.PathLike | Any, model_output: str | os.PathLike,
                       calibration_data_reader: Any = None) -> Any:
        """Quantize `model_input` into `model_output`; returns the ModelProto written."""
        import onnx

        from .._io import check_output_path
        from ..api import quantize

        tr = self.translation
        # before any work, and against the user's file: CLE below hands quantize an equalized
        # copy in memory, which alone would not protect the input file from model_output
        check_output_path(model_output, kind="model_output",
                          models=[None if isinstance(model_input, onnx.ModelProto) else model_input],
                          inputs=[calibration_data_reader] if isinstance(calibration_data_reader,
                                                                         (str, os.PathLike)) else [])
        model = model_input if isinstance(model_input, onnx.ModelProto) else \
            onnx.load(os.fspath(model_input), load_external_data=False)
        check_names_against_model(self._source if not isinstance(self._source, str) else self.config, model)
        data = calibration_data_reader
        if tr.calib_samples is not None and data is not None:
            data = _first_samples(data, tr.calib_samples, model)
        elif (tr.finetune is not None or tr.flags.get("cle")) and data is not None and hasattr(data, "get_next"):
            # finetuning reads the data once per layer, CLE's check once more: a one-shot reader
            # is read once, here
            from ..calibration.data import as_feeds

            data = list(as_feeds(data, model))
        if tr.flags.get("cle"):
            model_input = _equalized(model_input, data, int(tr.flags.get("cle_steps") or 1))
        if tr.amp is not None:
            self.result = vendor_walk(model_input, self.config, tr.amp, data, output_path=model_output,
                                      finetune=tr.finetune)
            qres = self.result.quantize_result
        else:
            self.result = qres = quantize(model_input, self.config, data, output_path=model_output,
                                          finetune=tr.finetune)
        if tr.print_summary:
            print(self.result.summary() if hasattr(self.result, "summary") else qres.summary())
        if not tr.ignore_warnings:
            for w in qres.warnings:
                warnings.warn(w, stacklevel=2)
        return qres.model


def __getattr__(name: str) -> Any:
    """The vendor's `*_QCONFIG` objects, built on access (unsupported ones raise)."""
    if name in QCONFIG_PRESETS:
        return qconfig_preset(name)
    raise AttributeError(f"module 'mixq.compat' has no attribute {name!r}")


globals().update(_SPECS)

#: `quark.onnx.X` attribute access of the documented snippets: `from mixq.compat import quark`.
quark = types.SimpleNamespace(onnx=sys.modules[__name__])

__all__ = ["quark", "QConfig", "QLayerConfig", "DataTypeSpec", "AdaQuantConfig", "AdaRoundConfig",
           "AutoMixprecisionConfig", "CLEConfig", "SmoothQuantConfig", "BiasCorrectionConfig", "GPTQConfig",
           "QuarotConfig", *_SPECS, "QuantType", "ExtendedQuantType", "VitisQuantType", "QuantFormat",
           "ExtendedQuantFormat", "VitisQuantFormat", "CalibrationMethod", "PowerOfTwoMethod", "Int16Method",
           "LayerWiseMethod", "ExtendedCalibrationMethod", "CalibMethod", "ScaleType", "QuantGranularity",
           "QuantizationConfig", "Config", "ModelQuantizer", "get_default_config", "translate", "Translation",
           "check_names_against_model", "finetune_from_cli", "average_l2", "vendor_walk", "WalkResult"]
