"""The precision plan: for every tensor mixq touches, the format it gets and why.

Built from a config before any graph is changed; the rewrite passes only materialize it. Pure data:
no onnxruntime, JSON round trip.
"""
from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any, Literal

from ..errors import ConfigError

Role = Literal["activation", "weight", "bias", "constant"]


@dataclass(frozen=True)
class TensorPrecision:
    """How one tensor is represented.

    format: the format where the tensor is produced (None: stays float).
    role: activation (run time), weight (per-channel capable constant), bias, constant.
    channel_axis: per-channel axis of an integer weight (None: per tensor).
    block_axis: axis that blocks of a block format run along (and of a per-block integer
        weight, with `block_size`).
    block_size: elements per scale of a per-block integer weight (None: not per block).
    group: tensors of one group share quantization parameters (pass-through ops, NPU Concat);
        the group name is the tensor whose parameters are used.
    calibrate: whether this tensor's statistics are collected (False for pass-through outputs).
    consumer_formats: node name -> format for consumers that read the tensor in another format
        (precision boundaries in mixed-precision plans).
    reason: why this format was chosen.
    """

    tensor: str
    role: Role
    format: str | None
    reason: str
    channel_axis: int | None = None
    block_axis: int | None = None
    group: str | None = None
    calibrate: bool = True
    consumer_formats: dict[str, str] = field(default_factory=dict)
    block_size: int | None = None

    def formats(self) -> list[str]:
        """The formats the tensor is read in: its own and its consumers', Nones left out."""
        return [f for f in [self.format, *self.consumer_formats.values()] if f is not None]


_PRECISION_FIELDS = tuple(f.name for f in fields(TensorPrecision))


@dataclass(frozen=True)
class PrecisionPlan:
    """Formats for the tensors of one model, plus the nodes left float and why.

    Every float tensor of the graph (subgraphs included) is either in `tensors` (with a format,
    or None and the reason it stays float) or in `skipped` with the reason. `config` is the
    whole config that made the plan (`QuantConfig.to_dict()`): replaying the plan uses it, so a
    saved plan gives the same bytes as the config that wrote it."""

    tensors: dict[str, TensorPrecision]
    float_nodes: dict[str, str] = field(default_factory=dict)
    config_name: str = "custom"
    skipped: dict[str, str] = field(default_factory=dict)
    config: dict[str, Any] | None = None

    def calibrated_tensors(self, needs_qparams: Callable[[str], bool]) -> list[str]:
        """Activation tensors whose statistics must be collected (`needs_qparams(format)`)."""
        out = []
        for t in self.tensors.values():
            if t.role != "activation" or not t.calibrate:
                continue
            if any(needs_qparams(f) for f in t.formats()):
                out.append(t.tensor)
        return out

    def format_counts(self) -> Counter[tuple[str, str]]:
        return Counter((t.role, t.format or "float") for t in self.tensors.values())

    def formats(self) -> set[str]:
        """Every format the plan uses (producer and consumer formats)."""
        out = {t.format for t in self.tensors.values() if t.format}
        out |= {f for t in self.tensors.values() for f in t.consumer_formats.values()}
        return out

    def to_json(self) -> str:
        # the fields read directly (dataclasses.asdict deep-copies every value: a search writes
        # a plan of every point for its cache key)
        return json.dumps({"version": 2, "config_name": self.config_name, "config": self.config,
                           "tensors": [{f: dict(t.consumer_formats) if f == "consumer_formats"
                                        else getattr(t, f) for f in _PRECISION_FIELDS}
                                       for t in self.tensors.values()],
                           "float_nodes": self.float_nodes, "skipped": self.skipped},
                          indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "PrecisionPlan":
        try:
            d = json.loads(text)
            if not isinstance(d, dict) or d.get("version") not in (1, 2):
                raise ValueError("no 'version' 1 or 2: not written by `mixq plan -o`")
            tensors = {t["tensor"]: TensorPrecision(**t) for t in d["tensors"]}
            config = d.get("config")
            if config is not None and not isinstance(config, dict):
                raise ValueError("'config' must be an object")
            return cls(tensors=tensors, float_nodes=dict(d.get("float_nodes", {})),
                       config_name=d.get("config_name", "custom"),
                       skipped=dict(d.get("skipped", {})), config=config)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ConfigError(f"not a valid mixq plan JSON: {exc}") from exc

    def table(self) -> str:
        """A Markdown table of tensors, roles, formats and reasons."""
        rows = ["| tensor | role | format | reason |", "|---|---|---|---|"]
        for t in self.tensors.values():
            fmt = t.format or "float"
            if t.consumer_formats:
                fmt += " (" + ", ".join(f"{n}: {f}" for n, f in sorted(t.consumer_formats.items())) + ")"
            rows.append(f"| {t.tensor} | {t.role} | {fmt} | {t.reason} |")
        for n, why in self.float_nodes.items():
            rows.append(f"| (node {n}) | - | float | {why} |")
        for name, why in self.skipped.items():
            rows.append(f"| {name} | - | float (not planned) | {why} |")
        return "\n".join(rows)


def deployed_weight_bytes(initializer_elems: dict[str, int], plan: PrecisionPlan) -> float:
    """Weight bytes a backend stores for `plan`: each constant at its format's average bits per
    element (shared scales included), unplanned or float constants at 32 bits."""
    from ..formats import get_format

    total = 0.0
    for name, n in initializer_elems.items():
        tp = plan.tensors.get(name)
        bits = 32.0 if tp is None or tp.format is None else get_format(tp.format).avg_bits
        total += n * bits / 8.0
    return total
