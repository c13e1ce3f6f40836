"""FastFinetune keys and the vendor's AdaRoundConfig / AdaQuantConfig arguments, translated into
mixq's own finetune configs (`mixq.finetune.AdaRoundConfig` / `AdaQuantConfig`).

The vendor defaults are kept where mixq has the option (seed 1705472343, batch size 1,
AdaRound: 1000 iterations at lr 0.1, AdaQuant: 3000 at 1e-5), so that the three spellings of
one request (QConfig algo_config, include_fast_ft + FastFinetune, `mixq quantize --finetune`)
build the same config and write the same bytes.
"""
from __future__ import annotations

from typing import Any

from ..errors import ConfigError, did_you_mean
from ..finetune.config import FINETUNE_OP_TYPES, AdaQuantConfig, AdaRoundConfig
from .table import FF_ALIASES, FF_ENTRIES, VENDOR_FT_OPS, Ctx, lookup

#: Per-algorithm vendor defaults of the options mixq keeps.
ALGO_DEFAULTS: dict[str, dict[str, Any]] = {
    "adaround": {"NumIterations": 1000, "LearningRate": 0.1, "UpdateBias": False},
    "adaquant": {"NumIterations": 3000, "LearningRate": 1e-5, "UpdateBias": True},
}
_ADAROUND_ONLY = ("RegParam", "BetaRange", "WarmStart")


def finetune_from_vendor(params: Any, *, scope: str = "FastFinetune", algorithm: str | None = None,
                         by_alias: bool = False) -> AdaRoundConfig | AdaQuantConfig:
    """The mixq finetune config of a FastFinetune dict (CamelCase keys) or of the vendor's
    Ada*Config keyword arguments (`by_alias`: snake_case names, `algorithm` fixed by the class)."""
    if not isinstance(params, dict):
        raise ConfigError(f"{scope} must be a dict of options, got {params!r}.")
    table = FF_ALIASES if by_alias else FF_ENTRIES
    values: dict[str, Any] = {}
    ctx = Ctx()
    for key, value in params.items():
        entry = lookup(table, key, scope)
        label = f"{scope}({key}=...)" if by_alias else f"{scope}[{key!r}]"
        if entry.kind == "unsupported":
            entry.run(ctx, value, label)
            continue
        values[entry.name] = entry.check(label, value)
    algo = algorithm or values.get("OptimAlgorithm", "adaround")
    d = {**ALGO_DEFAULTS[algo], **values}
    ops = d.get("TargetOpType")
    if ops is None or set(ops) == set(VENDOR_FT_OPS):
        op_types = FINETUNE_OP_TYPES
    else:
        bad = [o for o in ops if o not in FINETUNE_OP_TYPES]
        if bad:
            raise ConfigError(f"{scope} TargetOpType {bad[0]!r}: unsupported: mixq finetunes "
                              f"{', '.join(sorted(FINETUNE_OP_TYPES))} only (remove {bad[0]!r})."
                              + did_you_mean(bad[0], FINETUNE_OP_TYPES))
        op_types = frozenset(ops)
    data_size = d.get("DataSize", 1e9)
    common: dict[str, Any] = dict(
        num_iterations=d["NumIterations"], learning_rate=d["LearningRate"],
        batch_size=d.get("BatchSize", 1), early_stop=d.get("EarlyStop", False),
        output_index=d.get("OutputIndex", 0), seed=d.get("FixedSeed", 1705472343),
        max_samples=None if data_size >= 1e9 else int(data_size), op_types=op_types)
    if algo == "adaround":
        if d["UpdateBias"]:
            raise ConfigError(f"{scope} UpdateBias=True with AdaRound: unsupported: mixq's AdaRound learns "
                              "the rounding of the weights only (use OptimAlgorithm='adaquant' to update biases).")
        return AdaRoundConfig(**common, reg_param=d.get("RegParam", 0.01),
                              beta_range=tuple(d.get("BetaRange", (20.0, 2.0))),
                              warm_start=d.get("WarmStart", 0.2))
    for k in _ADAROUND_ONLY:
        if k in values:
            raise ConfigError(f"{scope} {k} applies to AdaRound only; remove it for AdaQuant.")
    return AdaQuantConfig(**common, update_bias=d["UpdateBias"])


def finetune_from_cli(algorithm: str, iterations: int | None, learning_rate: float | None
                      ) -> AdaRoundConfig | AdaQuantConfig:
    """`mixq quantize --finetune ALGO --ft-iters N --ft-lr X`: the FastFinetune request with these
    keys (every other option at the vendor's default, as the config spellings)."""
    params: dict[str, Any] = {"OptimAlgorithm": algorithm}
    if iterations is not None:
        params["NumIterations"] = iterations
    if learning_rate is not None:
        params["LearningRate"] = learning_rate
    return finetune_from_vendor(params, scope="--finetune")
