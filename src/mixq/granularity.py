"""How finely a constant's quantization parameters vary: one per tensor, one per output channel,
or one per block of elements along the reduction axis. One value object per choice, shared by
the config, the plan and the parameter choice (no `per_channel: bool` flags)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Union

from .errors import ConfigError


@dataclass(frozen=True)
class PerTensor:
    """One scale (and zero point) for the whole tensor."""

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "per_tensor"}


@dataclass(frozen=True)
class PerChannel:
    """One scale per output channel. `axis` None: the op's own output-channel axis (Conv: 0,
    ConvTranspose: 1, Gemm: by transB, MatMul: the last axis of a 2-D weight)."""

    axis: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "per_channel", "axis": self.axis}


@dataclass(frozen=True)
class PerBlock:
    """One scale per block of `size` consecutive elements along the reduction axis (`axis` None:
    the op's own; Conv: input channels, MatMul: K), one block row per output channel: what
    opset 21's blocked DequantizeLinear stores (int4/int8 weights of LLM-style deployments)."""

    size: int
    axis: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.size, bool) or not isinstance(self.size, int) or not 2 <= self.size <= 4096:
            raise ConfigError(f"PerBlock(size={self.size!r}): the block size must be an integer "
                              "in [2, 4096], e.g. 32 or 128.")

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "per_block", "size": self.size, "axis": self.axis}


Granularity = Union[PerTensor, PerChannel, PerBlock]


def granularity_from(value: Any) -> Granularity:
    """A Granularity from an object, a dict (`to_dict` form, JSON configs) or a short string
    ('per_tensor', 'per_channel', 'per_block:32')."""
    if isinstance(value, (PerTensor, PerChannel, PerBlock)):
        return value
    if isinstance(value, dict):
        d = dict(value)
        kind = d.pop("kind", None)
        try:
            if kind == "per_tensor" and not d:
                return PerTensor()
            if kind == "per_channel":
                return PerChannel(**d)
            if kind == "per_block":
                return PerBlock(**d)
        except TypeError as exc:
            raise ConfigError(f"granularity {value!r}: {exc}") from exc
        raise ConfigError(f"granularity {value!r}: 'kind' must be per_tensor, per_channel or "
                          "per_block (with 'size').")
    if isinstance(value, str):
        v = value.strip().lower()
        if v == "per_tensor":
            return PerTensor()
        if v == "per_channel":
            return PerChannel()
        if v.startswith("per_block:"):
            try:
                return PerBlock(int(v.split(":", 1)[1]))
            except ValueError as exc:
                raise ConfigError(f"granularity {value!r}: write per_block:SIZE, e.g. per_block:32.") from exc
    raise ConfigError(f"granularity {value!r}: use PerTensor(), PerChannel(), PerBlock(size) or "
                      "one of 'per_tensor', 'per_channel', 'per_block:32'.")
