"""What fast finetuning did: per-layer reconstruction loss before/after, wall time, and the
model-level fidelity before/after."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from .config import HELD_OUT_MIN_ROWS


@dataclass
class LayerReport:
    """One finetuned layer.

    loss_before: reconstruction MSE (mean over every output element) of the plain quantized
        layer against the float layer's output, on the `held_out` cached rows the weights were
        not fit on (on all `samples` where there were too few to spare one, held_out 0);
        loss_after: the same with the finetuned weights that are written back (never worse: a
        layer that does not improve there keeps its plain quantized weights, `kept_plain`).
    """

    node: str
    op_type: str
    weight: str
    weight_format: str
    algorithm: str
    loss_before: float
    loss_after: float
    iterations: int
    samples: int
    seconds: float
    kept_plain: bool = False
    stopped_early: bool = False
    held_out: int = 0

    @property
    def improvement_db(self) -> float:
        """10 log10(loss_before / loss_after): how much the layer's error shrank, in dB."""
        if self.loss_after <= 0 or self.loss_before <= 0:
            return math.inf if self.loss_before > 0 else 0.0
        return 10.0 * math.log10(self.loss_before / self.loss_after)


@dataclass
class ModelMetric:
    """Fidelity of one model output to the float model (SQNR in dB, top-1 agreement)."""

    output: str
    sqnr_db: float
    top1_agreement: float | None = None

    def worse_than(self, other: "ModelMetric") -> bool:
        """Lower SQNR without a higher top-1 agreement (where both have one)."""
        top1_up = (self.top1_agreement is not None and other.top1_agreement is not None
                   and self.top1_agreement > other.top1_agreement)
        return self.sqnr_db < other.sqnr_db and not top1_up

    def __str__(self) -> str:
        top1 = f", top-1 {100 * self.top1_agreement:.2f}%" if self.top1_agreement is not None else ""
        return f"SQNR {self.sqnr_db:.2f} dB{top1}"


@dataclass
class FinetuneReport:
    """The report of one `finetune` run (`to_markdown()` prints it)."""

    algorithm: str
    layers: list[LayerReport] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    total_seconds: float = 0.0
    metric_before: ModelMetric | None = None
    metric_after: ModelMetric | None = None
    config: Any = None
    notes: list[str] = field(default_factory=list)
    #: why the model keeps its plain quantized weights though layers were finetuned (None: it
    #: has the finetuned ones)
    plain_because: str | None = None

    @property
    def layer_seconds(self) -> float:
        """Wall time spent in the layers (data collection + optimization)."""
        return sum(r.seconds for r in self.layers)

    def to_markdown(self) -> str:
        """Markdown: one row per layer, totals, the model metric before/after and skipped layers."""
        lines = [f"## mixq fast finetuning: {self.algorithm}", "",
                 "| layer | op | weight format | samples (fit + held out) | iterations | loss before | "
                 "loss after | gain (dB) | time (s) |",
                 "|---|---|---|---|---|---|---|---|---|"]
        for r in self.layers:
            flag = " (kept plain)" if r.kept_plain else (" (early stop)" if r.stopped_early else "")
            lines.append(f"| {r.node}{flag} | {r.op_type} | {r.weight_format} | {r.samples - r.held_out} + "
                         f"{r.held_out} | {r.iterations} | "
                         f"{r.loss_before:.4g} | {r.loss_after:.4g} | {r.improvement_db:.2f} | {r.seconds:.2f} |")
        before = sum(r.loss_before for r in self.layers)
        after = sum(r.loss_after for r in self.layers)
        lines.append(f"| **total** ({len(self.layers)} layers) | | | | "
                     f"{sum(r.iterations for r in self.layers)} | {before:.4g} | {after:.4g} | | "
                     f"{self.layer_seconds:.2f} |")
        lines += ["", "Losses are on the held-out rows, which the layer's weights were not fit on."
                  + (f" {unheld}" if (unheld := self._unheld()) else ""),
                  "", f"Total wall time: {self.total_seconds:.2f} s."]
        if self.metric_before is not None and self.metric_after is not None:
            lines += ["", "| model output (on the calibration data, which the weights were fit on) | before "
                      "| after |", "|---|---|---|",
                      f"| {self.metric_before.output} | {self.metric_before} | {self.metric_after} |"]
        if self.plain_because is not None:
            lines += ["", f"Not kept: {self.plain_because}."]
        if self.skipped:
            lines += ["", "Not finetuned: " + "; ".join(f"{n}: {why}" for n, why in self.skipped.items())]
        for note in self.notes:
            lines.append(f"- {note}")
        return "\n".join(lines)

    def _unheld(self) -> str:
        """Which layers had too few rows to hold any out ('' where none)."""
        bare = [r.node for r in self.layers if not r.held_out]
        if not bare:
            return ""
        shown = ", ".join(bare[:3]) + (f" and {len(bare) - 3} more" if len(bare) > 3 else "")
        return (f"{len(bare)} layer(s) had too few cached rows to hold any out (under {HELD_OUT_MIN_ROWS}) and "
                f"were judged on the rows they were fit on, where a gain may not carry to new inputs: {shown}.")

    def lines(self) -> list[str]:
        """What the quantize summary says about the finetuning (to_markdown has the table)."""
        if not self.layers:
            return [f"{self.algorithm}: " + ("; ".join(self.notes) or "no layer finetuned")]
        kept = [r for r in self.layers if r.kept_plain]
        held = sum(1 for r in self.layers if r.held_out)
        text = (f"{self.algorithm}: {len(self.layers) - len(kept)} of {len(self.layers)} layer(s) finetuned"
                + (f", {len(kept)} kept their plain weights (no clear gain on rows held out of the fit)" if kept else "")
                + f"; {held} of {len(self.layers)} judged on held-out rows")
        if self.metric_before is not None and self.metric_after is not None:
            text += (f"; {self.metric_before.output}: {self.metric_before} -> {self.metric_after} on the "
                     "calibration data, which the weights were fit on")
        out = [text + " (`QuantizeResult.finetune.to_markdown()`)"]
        if self.plain_because is not None:
            out.append(f"{self.algorithm} not kept: {self.plain_because}")
        if unheld := self._unheld():
            out.append(unheld)
        return out


__all__ = ["FinetuneReport", "LayerReport", "ModelMetric"]
