"""The vendor's algorithm configs for `algo_config=[...]`, with its argument names and defaults.

AdaRoundConfig / AdaQuantConfig become mixq finetune configs; AutoMixprecisionConfig becomes the
AutoMixprecision options; BiasCorrectionConfig (mixq's bias_correction); GPTQConfig (mixq's
weight_rounding='gptq'); CLEConfig, SmoothQuantConfig and
QuarotConfig are accepted as objects (the vendor's signatures) and raise "unsupported" with the
reason when a config that holds them is translated.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..errors import ConfigError, did_you_mean
from ..finetune.config import AdaQuantConfig as MixqAdaQuant
from ..finetune.config import AdaRoundConfig as MixqAdaRound
from .finetune_vocab import finetune_from_vendor
from .table import FF_ALIASES

if TYPE_CHECKING:
    from ..config import QuantConfig


class AlgoConfig:
    """Base of the vendor algorithm configs: keyword arguments checked against the signature."""

    _ARGS: dict[str, Any] = {}

    def __init__(self, **kwargs: Any) -> None:
        name = type(self).__name__
        for k in kwargs:
            if k not in self._ARGS:
                raise ConfigError(f"{name}: unknown argument {k!r}." + did_you_mean(k, self._ARGS)
                                  + f" Arguments: {', '.join(self._ARGS)}.")
        self.params = dict(kwargs)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in self.params.items())})"

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other) and self.params == other.params

    __hash__ = None  # type: ignore[assignment]


class _FastFinetuneConfig(AlgoConfig):
    algorithm = ""
    _ARGS = {alias: None for alias in FF_ALIASES}

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.to_mixq()  # checked on creation

    def to_mixq(self) -> MixqAdaRound | MixqAdaQuant:
        """The mixq finetune config."""
        return finetune_from_vendor(self.params, scope=type(self).__name__, algorithm=self.algorithm,
                                    by_alias=True)


class AdaRoundConfig(_FastFinetuneConfig):
    """The vendor's AdaRound config (29 arguments; defaults: 1000 iterations, lr 0.1, batch 1,
    seed 1705472343). See docs/COMPAT.md for what each argument becomes."""

    algorithm = "adaround"


class AdaQuantConfig(_FastFinetuneConfig):
    """The vendor's AdaQuant config (defaults: 3000 iterations, lr 1e-5, batch 1, seed
    1705472343)."""

    algorithm = "adaquant"


class _Unsupported(AlgoConfig):
    why = ""

    def reject(self) -> None:
        raise ConfigError(f"algo_config: {type(self).__name__}: unsupported: {self.why}")


class CLEConfig(AlgoConfig):
    """Cross-layer equalization (mixq.compat.cle): cle_steps passes; the other arguments only at
    their defaults (mixq balances by max |w| without thresholds)."""

    _ARGS = {"cle_balance_method": "max", "cle_steps": 1, "cle_weight_threshold": 0.5,
             "cle_scale_append_bias": True, "cle_scale_use_threshold": True,
             "cle_total_layer_diff_threshold": 1.9e-7}

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        for k, v in self.params.items():
            if k != "cle_steps" and v != self._ARGS[k]:
                raise ConfigError(f"CLEConfig({k}={v!r}): unsupported: mixq balances every Conv pair by max "
                                  "|w| without thresholds (remove it).")
        steps = self.params.get("cle_steps", 1)
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise ConfigError(f"CLEConfig(cle_steps={steps!r}) must be an integer >= 1.")
        self.steps = steps


class SmoothQuantConfig(_Unsupported):
    _ARGS = {"alpha": 0.5}
    why = ("SmoothQuant is not implemented (use 16-bit activations such as Int16Spec, or auto mixed "
           "precision).")


class BiasCorrectionConfig(AlgoConfig):
    """Bias correction (mixq.passes.bias_correction): `bias_correction=True` in mixq's config."""

    _ARGS: dict[str, Any] = {}


class GPTQConfig(AlgoConfig):
    """GPTQ weight rounding (mixq.passes.gptq): `weight_rounding='gptq'`, perc_damp ->
    `gptq_damp`, act_order -> `gptq_act_order` (the vendor's default False), mse=True ->
    `weight_calibration='minmse'`; block_size changes only how many columns are updated at once.
    bits, group_size, per_channel and weight_symmetric describe the weight grid, which mixq takes
    from the quantization config: given, they must agree with it (see `apply_gptq`)."""

    _ARGS = {"bits": 8, "block_size": 128, "group_size": -1, "perc_damp": 0.01, "act_order": False,
             "per_channel": False, "mse": False, "weight_symmetric": True}

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        p = self.params
        for k in ("act_order", "per_channel", "mse", "weight_symmetric"):
            if k in p and not isinstance(p[k], bool):
                raise ConfigError(f"GPTQConfig({k}={p[k]!r}) must be True or False.")
        for k, low in (("bits", 2), ("block_size", 1), ("group_size", -1)):
            v = p.get(k, self._ARGS[k])
            if isinstance(v, bool) or not isinstance(v, int) or v < low or (k == "group_size" and v == 0):
                raise ConfigError(f"GPTQConfig({k}={v!r}) must be an integer >= {low}"
                                  + (" (-1: no groups)" if k == "group_size" else "") + ".")
        d = p.get("perc_damp", 0.01)
        if isinstance(d, bool) or not isinstance(d, (int, float)) or not 0 < d <= 1:
            raise ConfigError(f"GPTQConfig(perc_damp={d!r}) must be a number in (0, 1], e.g. 0.01.")


def apply_gptq(algos: Any, cfg: "QuantConfig") -> "QuantConfig":
    """`cfg` with the GPTQ options of a (checked) algo_config list; a GPTQConfig whose grid
    arguments disagree with `cfg`'s weights raises, naming both."""
    from ..formats import get_format
    from ..formats.integer import IntFormat
    from ..granularity import PerBlock

    g = next((a for a in (algos or ()) if isinstance(a, GPTQConfig)), None)
    if g is None:
        return cfg
    p = g.params
    fmt = get_format(cfg.weight)
    block = cfg.granularity.size if isinstance(cfg.granularity, PerBlock) else -1
    have = {"bits": fmt.int_bits if isinstance(fmt, IntFormat) else None,
            "weight_symmetric": cfg.weight_symmetric,
            "per_channel": cfg.per_channel_weights, "group_size": block}
    for k, v in have.items():
        if k in p and p[k] != v:
            raise ConfigError(f"GPTQConfig({k}={p[k]!r}) disagrees with the config's weights ({cfg.weight}, "
                              f"{cfg.granularity}, symmetric={cfg.weight_symmetric}): mixq rounds on the grid "
                              "the quantization config gives; set the weight spec there and drop "
                              f"{k} (or give {k}={v!r}).")
    changes: dict[str, Any] = {"weight_rounding": "gptq", "gptq_damp": float(p.get("perc_damp", 0.01)),
                               "gptq_act_order": bool(p.get("act_order", False))}
    if p.get("mse"):
        changes["weight_calibration"] = "minmse"
    return cfg.with_options(**changes)


class QuarotConfig(_Unsupported):
    _ARGS = {"r_matrix_dim": 4096, "use_random_had": False, "r_config_path": None}
    why = "QuaRot rotations are not implemented (use 16-bit activations or auto mixed precision)."


#: AutoMixprecisionConfig argument -> AutoMixprecision key.
AMP_ARGS: dict[str, str] = {
    "target_layer_config": "TargetLayerConfig", "target_op_type": "TargetOpType",
    "subgraph_json": "SubgraphJson", "include_layers": "IncludeLayers", "exclude_layers": "ExcludeLayers",
    "data_size": "DataSize", "metric_output_index": "MetricOutputIndex",
    "metric_distance_fn": "MetricDistanceFn", "metric_evaluate_fn": "MetricEvaluateFn",
    "metric_default": "MetricDefault", "metric_threshold": "MetricThreshold",
    "metric_optimize_object": "MetricOptimizeObject", "sensitivity_cache_file": "SensitivityCacheFile",
    "worker_num": "WorkerNum", "dual_quant_nodes": "DualQuantNodes",
    "no_input_qdq_shared": "NoInputQDQShared", "shared_param_mode": "SharedParamMode",
}
_AMP_DEFAULTS = {"target_op_type": ("Conv", "ConvTranspose", "Gemm", "MatMul"), "subgraph_json": None,
                 "include_layers": None, "exclude_layers": None, "data_size": 0, "metric_output_index": 0,
                 "metric_distance_fn": None, "metric_evaluate_fn": None, "metric_default": "l2",
                 "metric_threshold": 0, "metric_optimize_object": "speed", "sensitivity_cache_file": None,
                 "worker_num": 1, "dual_quant_nodes": False, "no_input_qdq_shared": False,
                 "shared_param_mode": "propagate"}


class AutoMixprecisionConfig(AlgoConfig):
    """The vendor's auto mixed precision config: its options become AutoMixprecision keys (default
    values are left out: they ask for nothing)."""

    _ARGS = {"target_layer_config": None, **_AMP_DEFAULTS}

    def __init__(self, target_layer_config: Any = None, **kwargs: Any) -> None:
        super().__init__(target_layer_config=target_layer_config, **kwargs)
        if target_layer_config is None:
            raise ConfigError("AutoMixprecisionConfig needs target_layer_config=QLayerConfig(...).")

    def to_extra(self) -> dict[str, Any]:
        """The AutoMixprecision dict."""
        out: dict[str, Any] = {}
        for k, v in self.params.items():
            if k in _AMP_DEFAULTS and _AMP_DEFAULTS[k] == v or v is None:
                continue
            if k == "data_size" and v == 0:
                continue
            out[AMP_ARGS[k]] = list(v) if k == "target_op_type" else v
        return out


ALGO_CONFIGS: dict[str, type[AlgoConfig]] = {c.__name__: c for c in (
    AdaRoundConfig, AdaQuantConfig, CLEConfig, SmoothQuantConfig, BiasCorrectionConfig, GPTQConfig,
    QuarotConfig, AutoMixprecisionConfig)}


def cle_steps(algos: Any) -> int:
    """Passes of cross-layer equalization a (checked) algo_config list asks for (0: none)."""
    return next((a.steps for a in (algos or ()) if isinstance(a, CLEConfig)), 0)


def wants_bias_correction(algos: Any) -> bool:
    """Whether a (checked) algo_config list holds a BiasCorrectionConfig."""
    return any(isinstance(a, BiasCorrectionConfig) for a in (algos or ()))


def split_algo_config(algos: Any, scope: str = "algo_config") -> tuple[Any, dict[str, Any] | None]:
    """(the mixq finetune config or None, the AutoMixprecision dict or None) of an algo_config
    list (CLEConfig: see `cle_steps`); unsupported algorithms raise."""
    if algos is None:
        return None, None
    if isinstance(algos, (str, bytes, dict)) or not hasattr(algos, "__iter__"):
        raise ConfigError(f"{scope} must be a list of algorithm configs, e.g. [AdaQuantConfig()], "
                          f"not {algos!r}.")
    ft: Any = None
    amp: dict[str, Any] | None = None
    for a in algos:
        if isinstance(a, _FastFinetuneConfig):
            new = a.to_mixq()
        elif isinstance(a, (MixqAdaRound, MixqAdaQuant)):
            new = a
        elif isinstance(a, AutoMixprecisionConfig):
            if amp is not None:
                raise ConfigError(f"{scope}: give at most one AutoMixprecisionConfig.")
            amp = a.to_extra()
            continue
        elif isinstance(a, _Unsupported):
            a.reject()
            continue
        elif isinstance(a, (CLEConfig, BiasCorrectionConfig, GPTQConfig)):  # cle_steps, wants_bias_correction, apply_gptq
            continue
        else:
            raise ConfigError(f"{scope}: {type(a).__name__} is not an algorithm config; use "
                              f"{', '.join(ALGO_CONFIGS)}.")
        if ft is not None:
            raise ConfigError(f"{scope}: give at most one of AdaRoundConfig / AdaQuantConfig (the vendor "
                              "keeps one of them; mixq asks you to choose).")
        ft = new
    return ft, amp
