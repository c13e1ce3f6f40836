"""The precision plan: for every tensor mixq touches, the format it gets and why.

Built from a config before any graph is changed; the rewrite passes only materialize it. Pure data:
no onnxruntime, JSON round trip.
"""
from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Literal

from ..errors import ConfigError

Role = Literal["activation", "weight", "bias", "constant"]


@dataclass(frozen=True)
class TensorPrecision:
    """How one tensor is represented.

    format: the format where the tensor is produced (None: stays float).
    role: activation (run time), weight (per-channel capable constant), bias, constant.
    channel_axis: per-channel axis of an integer weight (None: per tensor).
    block_axis: axis that blocks of a block format run along.
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


@dataclass(frozen=True)
class PrecisionPlan:
    """Formats for the tensors of one model, plus the nodes left float and why."""

    tensors: dict[str, TensorPrecision]
    float_nodes: dict[str, str] = field(default_factory=dict)
    config_name: str = "custom"

    def calibrated_tensors(self, needs_qparams) -> list[str]:
        """Activation tensors whose statistics must be collected (`needs_qparams(format)`)."""
        out = []
        for t in self.tensors.values():
            if t.role != "activation" or not t.calibrate:
                continue
            fmts = [t.format, *t.consumer_formats.values()]
            if any(f is not None and needs_qparams(f) for f in fmts):
                out.append(t.tensor)
        return out

    def format_counts(self) -> Counter:
        return Counter((t.role, t.format or "float") for t in self.tensors.values())

    def to_json(self) -> str:
        return json.dumps({"version": 1, "config_name": self.config_name,
                           "tensors": [asdict(t) for t in self.tensors.values()],
                           "float_nodes": self.float_nodes}, indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "PrecisionPlan":
        try:
            d = json.loads(text)
            tensors = {t["tensor"]: TensorPrecision(**t) for t in d["tensors"]}
            return cls(tensors=tensors, float_nodes=dict(d.get("float_nodes", {})),
                       config_name=d.get("config_name", "custom"))
        except (KeyError, TypeError, ValueError) as exc:
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
