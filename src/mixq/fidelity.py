"""The fidelity guard: does the quantized model still compute what the float one does?

`check_fidelity` runs both models once on the last few calibration samples and scores every
output (SQNR, cosine, top-1 agreement where the output holds class scores, the share of equal
elements where it holds class indices; NaN/inf score worst). When the
model looks broken, or a classifier likely loses more than 5 points of top-1 agreement, a cheap
probe names the quantized tensors that do the most damage: every quantized activation is put
back to float at once (its QuantizeLinear/DequantizeLinear pair, or its block format's function
call, bypassed; under 1 dB gained, none of them is the cause), then a halving descent, noisiest
first, finds the one (or the smallest group) that costs most; the weights get the same treatment
when no activation is named.
"""
from __future__ import annotations

import math
import time
import os
from collections import deque
from dataclasses import dataclass, field
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import numpy as np
import onnx
from onnx import helper

from .config import QuantConfig
from .errors import DataError, MixqError, ModelError
from .evaluate import (ErrorStats, OutputMetrics, class_score_outputs, decision_outputs, make_session,
                       random_ops, value_outputs)
from .graph import with_outputs

#: Below these the model is called broken.
BROKEN_AGREEMENT = 0.90
#: Agreement is judged on the rows that are no near-ties (evaluate.NEAR_TIE) when at least this
#: many are, on every row otherwise.
MIN_DECISIVE_ROWS = 8
BROKEN_SQNR_DB = 10.0
#: Any float output whose error has more power than the output itself is broken, class scores
#: too: its agreement then only shows a class that wins whatever the input (a 2-value
#: regression read as class scores agreed on 94% of rows at -0.2 dB).
BROKEN_FLOOR_DB = 0.0
#: Short of broken, the summary warns that the model likely loses accuracy when a class-score
#: output (one row per sample) is expected to agree on fewer than 1 - LIKELY_DROP of its
#: decisive rows (`OutputMetrics.expected_agreement`): 32 samples show too few flips to count
#: a 5-point drop (two flips is 94 %), the rows' nearness to a flip shows it.
LIKELY_DROP = 0.05
#: How many activation tensors the probe puts back to float (the noisiest ones).
MAX_PROBED = 32
#: Samples the probe runs on (the first of the guard's; exactly these many where the model's batch
#: axis is dynamic, else whole feeds up to at least these many): each probe is a session and a run.
PROBE_SAMPLES = 8
#: Seconds the probe may spend putting tensors back to float (at least one is always probed).
PROBE_BUDGET_S = 10.0
#: A probed tensor is named when putting it back to float gains at least this much output SQNR.
MIN_GAIN_DB = 1.0
#: The runtime check: the quantized model also runs with onnxruntime's default optimizations
#: (its fused 8-bit kernels: QLinearConv, QGemm, MatMulInteger ...) on this many of the guard's
#: samples; it disagrees when it scores RUNTIME_GAP_DB below the QDQ semantics and under
#: RUNTIME_SQNR_DB against float (fused kernels round differently: a few dB is normal).
RUNTIME_SAMPLES = 2
RUNTIME_GAP_DB = 6.0
RUNTIME_SQNR_DB = 30.0


@dataclass
class Culprit:
    """A quantized activation (or weight) and the output SQNR its quantization costs."""

    tensor: str
    producer_op: str  # the op that writes the activation; for a weight, the op that reads it
    sqnr_gain_db: float  # output SQNR with this tensor float minus the quantized model's
    noise_db: float  # the tensor's own SQNR under quantization
    kind: str = "activation"  # or "weight"
    node: str = ""  # for a weight: the node that reads it


@dataclass
class DamageGroup:
    """The smallest group of quantized tensors the probe's descent found that, back to float
    together, gains at least MIN_GAIN_DB while no single one of them does on its path."""

    kind: str  # "activation" or "weight"
    tensors: list[str]
    sqnr_gain_db: float
    narrowed: bool = True  # False: the probe's time ran out before the descent could narrow it further


class ProbeResult(NamedTuple):
    """What `probe_culprits` found."""

    culprits: list[Culprit]
    probed: int  # tensors put back to float one at a time (the group's size when it stopped there)
    together_gain_db: float | None  # the group's gain (None: fewer than two tensors to probe)
    group: int  # tensors in the group
    damage_group: DamageGroup | None = None  # the descent ended on a group, not one tensor


@dataclass
class FidelityReport:
    """Quantized vs float outputs on the last calibration samples, and the probe's findings when broken."""

    outputs: list[OutputMetrics] = field(default_factory=list)
    samples: int = 0
    broken: bool = False
    culprits: list[Culprit] = field(default_factory=list)
    probed: int = 0
    #: output SQNR gained with all `group` quantized activations back to float at once (None: not measured)
    together_gain_db: float | None = None
    group: int = 0
    #: the weight probe (run when no activation is named): output SQNR gained with all `weights`
    #: quantized weights back to float at once, and how many probes it ran
    weights_gain_db: float | None = None
    weights: int = 0
    weight_probes: int = 0
    damage_groups: list[DamageGroup] = field(default_factory=list)
    fix_command: str | None = None
    not_checked: str | None = None  # why no comparison was run
    #: the runtime check (None: the model has no 8-bit QuantizeLinear for onnxruntime to fuse):
    #: lowest output SQNR vs float at default optimizations and in the QDQ semantics, same samples
    runtime_sqnr_db: float | None = None
    runtime_qdq_sqnr_db: float | None = None
    #: the random ops the model draws from (op types), seeded alike in both compared models
    random_ops: list[str] = field(default_factory=list)
    #: outputs not compared (strings, sequences, maps), each with its type
    unscored: list[str] = field(default_factory=list)
    #: outputs not compared because float's own values were NaN or inf on every guard sample
    nonfinite: list[str] = field(default_factory=list)

    @property
    def runtime_disagrees(self) -> bool:
        """onnxruntime's default optimizations compute a different (worse) model than the QDQ
        semantics the rest of the report scores."""
        if self.runtime_sqnr_db is None or self.runtime_qdq_sqnr_db is None:
            return False
        return (self.runtime_sqnr_db < RUNTIME_SQNR_DB
                and self.runtime_sqnr_db < self.runtime_qdq_sqnr_db - RUNTIME_GAP_DB)

    @property
    def offset_losses(self) -> list[OutputMetrics]:
        """Outputs whose SQNR on their variation across samples is under BROKEN_SQNR_DB while
        their own SQNR, inflated by their mean, passes it: those on an offset
        (`OutputMetrics.offset_hidden`: values of 250-300 varying by ~1 read 47 dB at A8W8 with
        the variation rounded away), and value outputs (no class scores, whose agreement judges
        them) on a smaller one: an image in 0..255 read 15 dB at MXFP4 and kept 6.4 dB of its
        content (the class sweep's style transfer)."""
        def lost(o: OutputMetrics) -> bool:
            if o.variation_sqnr_db is None or o.decisions or o.variation_sqnr_db >= BROKEN_SQNR_DB:
                return False
            return o.offset_hidden or (o.top1_agreement is None and o.sqnr_db >= BROKEN_SQNR_DB)
        return [o for o in self.outputs if lost(o)]

    @property
    def likely_loss(self) -> OutputMetrics | None:
        """Short of broken: the class-score output expected to lose more than LIKELY_DROP of its
        top-1 agreement (the lowest such), else None."""
        if self.broken:
            return None
        low = [o for o in self.outputs if o.expected_agreement is not None
               and o.decisive_rows >= MIN_DECISIVE_ROWS and o.expected_agreement < 1.0 - LIKELY_DROP]
        return min(low, key=lambda o: o.expected_agreement or 0.0) if low else None

    def worst(self) -> OutputMetrics | None:
        """The output with the lowest SQNR (its quiet part's, where lower: `judged_sqnr_db`)."""
        return min(self.outputs, key=lambda o: o.judged_sqnr_db) if self.outputs else None

    def lines(self, runtime: bool = True) -> list[str]:
        """Markdown lines for the quantize summary (`runtime` False: without the runtime check's
        warning, where the kernel check says the same with its cause)."""
        if self.not_checked:
            return [f"fidelity not checked: {self.not_checked}"]
        # the last calibration samples: the ranges were fit on them too (an in-sample check)
        out = [f"fidelity on the last {self.samples} calibration samples: " + "; ".join(
            (f"{o.name}: values equal to float's: {100 * (o.top1_agreement or 0.0):.1f}% of {o.rows}"
             if o.decisions else
             f"{o.name}: SQNR {o.sqnr_db:.1f} dB"
             + (f" ({o.variation_sqnr_db:.1f} dB on its variation across samples: it sits on an offset)"
                if o.offset_hidden else "")
             + f", cosine {o.cosine:.4f}"
             + (f"; its {o.part.describe()}, on a scale {o.part.gap:.0f}x below the rest, {o.part.sqnr_db:.1f} dB"
                if o.part is not None else "")
             + (f", top-1 agreement {100 * o.top1_agreement:.1f}%" if o.top1_agreement is not None else "")
             + (f" ({100 * o.decisive_agreement:.1f}% on the {o.decisive_rows} rows that are no near-ties)"
                if o.decisive_agreement is not None and o.decisive_rows < o.rows else ""))
            + (f" (another shape than float's on {o.shape_changed} of {o.pairs} samples"
               + ("" if o.decisions else ", compared on the others") + ")" if o.shape_changed else "")
            + (f" ({o.ref_nonfinite} of float's own {o.values} values NaN or inf, left out)"
               if o.ref_nonfinite else "")
            for o in self.outputs)]
        if self.nonfinite:
            out.append(f"WARNING: not compared: {', '.join(self.nonfinite)}: the float model's own output "
                       "is NaN or inf on every guard sample (check the calibration data, or the model)")
        if self.unscored:
            out.append(f"not compared: {', '.join(self.unscored)} (no numeric tensor; the outputs above stand "
                       "for the model)")
        if self.random_ops:
            out.append(f"the model draws random values ({', '.join(self.random_ops)}): the guard compared the "
                       "float and quantized models with each random op seeded alike, on the same draws (the "
                       "written model draws fresh values at every run)")
        for o in self.offset_losses:
            where = ("sits on an offset (its variation across the guard's samples is under a tenth of its "
                     "power) and keeps" if o.offset_hidden else "keeps")
            out.append(f"WARNING: {o.name} {where} {o.variation_sqnr_db:.1f} dB SQNR on its variation across "
                       f"the guard's samples, where its SQNR, which its mean inflates, reads {o.sqnr_db:.1f} dB: "
                       "unless these samples barely differ, the quantized model loses what this output says "
                       "about each input; a 16-bit preset, or the tensors on the offset's path kept wider, "
                       "keeps it")
        likely = self.likely_loss
        if likely is not None:
            out.append(f"WARNING: {likely.name} likely loses more than {100 * LIKELY_DROP:.0f} points of "
                       f"top-1 agreement: from how near the guard's samples' top classes are to "
                       f"being overtaken under the noise this model adds, about "
                       f"{100 * (1.0 - (likely.expected_agreement or 0.0)):.0f}% of samples like them "
                       f"change class ({likely.decisive_flips} of {likely.decisive_rows} changed here); measure it on "
                       "your own data, or keep the tensors below wider")
        if self.broken or likely is not None:
            if self.broken:
                reshaped = any(o.shape_changed for o in self.outputs)
                out.append(f"WARNING: the quantized model looks broken (SQNR < {BROKEN_SQNR_DB:g} dB, of an "
                           "output or of the channels of one on a scale of their own, or "
                           f"agreement < {100 * BROKEN_AGREEMENT:.0f}% on rows that are no near-ties; a "
                           f"Softmax's probabilities are judged by agreement alone, down to "
                           f"{BROKEN_FLOOR_DB:g} dB, where they hold {MIN_DECISIVE_ROWS} rows or more "
                           "and more than one top class"
                           + (f", or outputs of another shape than float's on more than "
                              f"{100 * (1 - BROKEN_AGREEMENT):.0f}% of the samples" if reshaped else "") + ")")
            if self.culprits:
                out.append("most damage from (back to float, output SQNR gain): " + ", ".join(
                    f"{c.tensor} ({f'weight of {c.producer_op} {c.node}' if c.kind == 'weight' else c.producer_op}, "
                    f"+{c.sqnr_gain_db:.1f} dB)" for c in self.culprits))
            for g in self.damage_groups:
                more = f" and {len(g.tensors) - 8} more" if len(g.tensors) > 8 else ""
                why = (f"neither half of them gains {MIN_GAIN_DB:g} dB alone" if g.narrowed else
                       "the probe's time ran out before it could narrow them further")
                out.append(f"most damage from these {len(g.tensors)} {g.kind}s together (back to float, "
                           f"output SQNR gain; {why}): {', '.join(g.tensors[:8])}{more} "
                           f"(+{g.sqnr_gain_db:.1f} dB)")
            if not (self.culprits or self.damage_groups):
                out.append(self._nothing_named())
            if self.weights_gain_db is not None:
                out.append(f"all {self.weights} quantized weights back to float together gain "
                           f"{self.weights_gain_db:+.1f} dB" + ("" if self.weights_gain_db >= MIN_GAIN_DB
                                                                else ": nor is it in the weights alone"))
            if self.fix_command:
                out.append(f"try: {self.fix_command}")
        if runtime and self.runtime_disagrees:
            out.append(f"WARNING: with onnxruntime's default optimizations (its fused integer kernels: "
                       f"QLinearConv, MatMulInteger, MatMulNBits ...) the "
                       f"model scores SQNR {self.runtime_sqnr_db:.1f} dB against float, where the QDQ "
                       f"semantics score {self.runtime_qdq_sqnr_db:.1f} dB on the same samples: the "
                       "runtime computes something else; run with graph optimizations at 'basic' "
                       "or report it with the model")
        return out

    def _nothing_named(self) -> str:
        if self.probed == 0:
            return ("no tensor probed: the model has no QuantizeLinear/DequantizeLinear activation "
                    "pairs to put back to float")
        if self.together_gain_db is not None and not self.together_gain_db >= MIN_GAIN_DB:
            return (f"all {self.group} quantized activations back to float together gain "
                    f"{self.together_gain_db:+.1f} dB: the damage is not in the activations alone")
        together = ("" if self.together_gain_db is None else
                    f"; all {self.group} together {self.together_gain_db:+.1f} dB: the damage is spread")
        return f"no single activation's Q/DQ pair accounts for the damage ({self.probed} probed{together})"

    def to_dict(self) -> dict:
        """JSON-ready form (inf as None)."""
        def num(v: float | None) -> float | None:
            return None if v is None or not math.isfinite(v) else float(v)
        likely = self.likely_loss
        return {"samples": self.samples, "broken": self.broken,
                "likely_loss": None if likely is None else likely.name, "probed": self.probed,
                "together_gain_db": num(self.together_gain_db), "group": self.group,
                "weights_gain_db": num(self.weights_gain_db), "weights": self.weights,
                "weight_probes": self.weight_probes,
                "damage_groups": [{"kind": g.kind, "tensors": list(g.tensors), "narrowed": g.narrowed,
                                   "sqnr_gain_db": num(g.sqnr_gain_db)} for g in self.damage_groups],
                "fix_command": self.fix_command,
                "runtime_sqnr_db": num(self.runtime_sqnr_db),
                "runtime_qdq_sqnr_db": num(self.runtime_qdq_sqnr_db),
                "runtime_disagrees": self.runtime_disagrees,
                "outputs": [{"name": o.name, "sqnr_db": num(o.sqnr_db), "cosine": num(o.cosine),
                             "top1_agreement": num(o.top1_agreement),
                             "decisive_agreement": num(o.decisive_agreement),
                             "decisive_rows": o.decisive_rows,
                             "expected_agreement": num(o.expected_agreement),
                             "variation_sqnr_db": num(o.variation_sqnr_db),
                             "part": None if o.part is None else {
                                 "axis": o.part.axis, "channels": list(o.part.channels), "size": o.part.size,
                                 "gap": float(o.part.gap), "sqnr_db": num(o.part.sqnr_db)}}
                            for o in self.outputs],
                "offset_losses": [o.name for o in self.offset_losses],
                "random_ops": list(self.random_ops),
                "unscored": list(self.unscored),
                "nonfinite": list(self.nonfinite),
                "culprits": [{"tensor": c.tensor, "kind": c.kind, "op": c.producer_op, "node": c.node,
                              "sqnr_gain_db": num(c.sqnr_gain_db)} for c in self.culprits]}


def judged_agreement(o: OutputMetrics) -> float | None:
    """The top-1 agreement the guard judges an output by: over the rows that are no near-ties
    when at least MIN_DECISIVE_ROWS are (a near-tie flips under any reduced precision: BF16
    EfficientNet-Lite0 flips 4 of 32 texture crops, 3 of them near-ties, at 28.7 dB SQNR),
    over every row otherwise; None for an output that is no class scores."""
    if o.decisive_agreement is not None and o.decisive_rows >= MIN_DECISIVE_ROWS:
        return o.decisive_agreement
    return o.top1_agreement


def is_broken(outputs: list[OutputMetrics]) -> bool:
    """Any output with NaN/inf where float is finite, a value output with another shape than
    float's on more than 1 - BROKEN_AGREEMENT of the samples, a class-score output with top-1
    agreement (`judged_agreement`) below BROKEN_AGREEMENT, or an output below BROKEN_SQNR_DB,
    whole or in its quiet part (`OutputMetrics.judged_sqnr_db`: a detector's class scores
    beside its box coordinates read 6 dB where the whole output read 26).

    Only probabilities (a Softmax's output: `OutputMetrics.probabilities`) are judged by their
    agreement alone, down to BROKEN_FLOOR_DB: near 0 and 1 small, harmless errors give a low
    SQNR (a CTC recognizer at A8W8: 9.5 dB, the same characters), but an error above the
    output's own power is no small error. Where their rows are fewer than MIN_DECISIVE_ROWS, or
    all of one class in float (`OutputMetrics.one_class`: any model that always answered it
    would agree), the agreement vouches for nothing and BROKEN_SQNR_DB judges them too. Other
    outputs of the shape of class scores are logits, or values that merely have that shape (a
    regression head's (N, 4): its argmax decides nothing); their SQNR means what it says (such
    a head agreed on every row with three of its four columns at 4 dB). An output on an offset whose
    variation is lost is warned of (`FidelityReport.offset_losses`), not called broken:
    near-identical samples (video frames) vary less than any grid's noise."""
    def bad(o: OutputMetrics) -> bool:
        if not o.decisions and o.shape_changed > (1.0 - BROKEN_AGREEMENT) * o.pairs:
            return True  # its SQNR is over the other samples only (decisions count them as changed)
        if not o.decisions and o.sqnr_db < BROKEN_FLOOR_DB:
            return True  # whatever the agreement
        agreement = judged_agreement(o)
        vouches = agreement is not None and (o.decisions or (
            o.probabilities and o.rows >= MIN_DECISIVE_ROWS and not o.one_class))
        if not vouches and o.judged_sqnr_db < BROKEN_SQNR_DB:
            return True
        return agreement is not None and agreement < BROKEN_AGREEMENT

    return any(o.sqnr_db == -math.inf or bad(o) for o in outputs)


def _score(names: list[str], refs: list[list[np.ndarray]], gots: list[list[np.ndarray]],
           classes: Mapping[str, int] | set[str] | frozenset[str] | None = None,
           decisions: frozenset[str] | set[str] = frozenset(),
           values: frozenset[str] | set[str] = frozenset()) -> list[OutputMetrics]:
    """Metrics of each output of `names`: `classes` hold class scores along the axis given
    (`class_score_outputs`) whatever their rank, `decisions` class indices (agreement: equal
    elements), `values` no class scores whatever their rank (no agreement read); a set of
    `classes` names outputs with classes along their last axis."""
    axes = dict(classes) if isinstance(classes, Mapping) else {n: -1 for n in classes or ()}
    accs = {n: ErrorStats(decisions=n in decisions, classifier=n not in values, probabilities=n in axes)
            for n in names}
    for ref, got in zip(refs, gots):
        for n, r, q in zip(names, ref, got):
            ax = axes.get(n)
            if ax is not None and r.ndim > 2 and r.shape == q.shape and r.shape[ax] > 1:
                # rows of class scores: a sequence's frames, an image's pixels
                r, q = (np.moveaxis(a, ax, -1).reshape(-1, a.shape[ax]) for a in (r, q))
                accs[n].samples = False  # frames or pixels: no expected loss read from them
            accs[n].update(r, q)
    return [accs[n].result(n) for n in names]


def _block_call(n: onnx.NodeProto) -> bool:
    """A block format's quantize-dequantize: one call of a mixq function, one input, one output."""
    from .formats import MIXQ_DOMAIN

    return n.domain == MIXQ_DOMAIN and len(n.input) == 1 and len(n.output) == 1


def _qdq_pairs(model: onnx.ModelProto) -> dict[str, list[str]]:
    """Activation tensor -> the outputs that stand for it: DequantizeLinear outputs (Q on a
    run-time tensor feeding DQ nodes), or a block format's function call on it."""
    inits = {t.name for t in model.graph.initializer}
    readers: dict[str, list[onnx.NodeProto]] = {}
    for n in model.graph.node:
        for i in n.input:
            readers.setdefault(i, []).append(n)
    out: dict[str, list[str]] = {}
    for n in model.graph.node:
        if _block_call(n) and n.input[0] not in inits:
            out.setdefault(n.input[0], []).append(n.output[0])
            continue
        if n.op_type != "QuantizeLinear" or not n.input or n.input[0] in inits:
            continue
        dqs = [r.output[0] for r in readers.get(n.output[0], []) if r.op_type == "DequantizeLinear"]
        if dqs:
            out.setdefault(n.input[0], []).extend(dqs)
    return out


def _bypass(model: onnx.ModelProto, tensor: str, dq_outs: list[str]) -> onnx.ModelProto:
    """A copy of `model` whose readers of `dq_outs` read `tensor` itself."""
    return _bypass_many(model, {tensor: dq_outs})


def _bypass_many(model: onnx.ModelProto, pairs: dict[str, list[str]]) -> onnx.ModelProto:
    """A copy of `model` with every tensor of `pairs` back to float (see `_bypass`), or `model`
    itself when `pairs` is empty. A DequantizeLinear (or block call) that writes a graph output
    becomes an Identity of the tensor: the output keeps its name (a regression head's int8
    output grid, the whole damage, was out of the probe's reach)."""
    outputs = {o.name for o in model.graph.output}
    direct = {dq: t for t, dqs in pairs.items() for dq in dqs if dq in outputs}
    back = {dq: t for t, dqs in pairs.items() for dq in dqs if dq not in outputs}
    if not (back or direct):
        return model
    m = _rewired(model, back)
    for n in m.graph.node:
        t = direct.get(n.output[0]) if len(n.output) == 1 else None
        if t is not None and (n.op_type == "DequantizeLinear" or _block_call(n)):
            n.op_type, n.domain = "Identity", ""
            del n.input[:]
            del n.attribute[:]
            n.input.append(t)
    return m


def _rewired(model: onnx.ModelProto, back: dict[str, str],
             extra: list[onnx.TensorProto] | None = None) -> onnx.ModelProto:
    """A copy of `model` (with `extra` initializers added) whose readers of each name in `back`
    read `back[name]` instead; the nodes that wrote those names stay, unread."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    m.graph.initializer.extend(extra or [])
    for n in m.graph.node:
        for k, i in enumerate(n.input):
            if i in back:
                n.input[k] = back[i]
    return m


def _worst_sqnr(model: onnx.ModelProto, names: list[str], refs: list[list[np.ndarray]],
                feeds: list[dict[str, np.ndarray]]) -> float:
    """The lowest output SQNR of `model` (QDQ semantics: basic optimizations) on `feeds`
    against the float outputs `refs`: one session and one run, what each probe costs."""
    s = make_session(model, optimize="basic")
    return min(o.judged_sqnr_db for o in _score(names, refs, [s.run(names, f) for f in feeds]))


def _noise_db(pairs: dict[str, list[str]], qmodel: onnx.ModelProto, feeds: list[dict[str, np.ndarray]]
              ) -> dict[str, float]:
    """Each quantized activation's own SQNR (float value vs its dequantized value), one run."""
    names = [t for t in pairs if pairs[t]]
    extra = [x for t in names for x in (t, pairs[t][0])]
    sess = make_session(with_outputs(qmodel, extra), optimize=False)
    accs = {t: ErrorStats() for t in names}
    for feed in feeds:
        vals = dict(zip(extra, sess.run(extra, feed)))
        for t in names:
            a, b = vals[t], vals[pairs[t][0]]
            if a.shape == b.shape:
                accs[t].update(a, b)
    return {t: accs[t].sqnr_db for t in names}


def _noise_from_stats(pairs: dict[str, list[str]], qmodel: onnx.ModelProto, stats: dict) -> dict[str, float]:
    """Each quantized activation's SQNR estimated from its calibration statistics and its
    QuantizeLinear scale: rms^2 / (step^2 / 12) (no run: measuring it means fetching every
    activation, 23 s for 8 samples of EfficientNet-Lite0)."""
    inits = {t.name: t for t in qmodel.graph.initializer}
    out: dict[str, float] = {}
    for n in qmodel.graph.node:
        t = n.input[0] if n.op_type == "QuantizeLinear" and n.input else None
        if t is None or t not in pairs or t not in stats or t in out or n.input[1] not in inits:
            continue
        scale = onnx.numpy_helper.to_array(inits[n.input[1]])
        if scale.size != 1 or stats[t].empty:
            continue
        step2 = float(scale.reshape(())) ** 2 / 12.0
        # the median magnitude, not the rms: a mask's -3.4e38 would make any step look small
        lo, hi, cnt = stats[t].abs_bins()
        half = np.searchsorted(np.cumsum(cnt), (float(np.sum(cnt)) + 1) / 2) if cnt.size else 0
        mag = float((lo[half] + hi[half]) / 2) if cnt.size else 0.0
        out[t] = 10.0 * math.log10(mag * mag / step2) if mag > 0 and step2 > 0 else -math.inf
    return out


def _descend(order: list[str], sqnr_of: Callable[[list[str]], float], base_db: float, all_db: float,
             deadline: float | None) -> tuple[list[str], float, bool]:
    """A halving descent from `order` (its output SQNR with every member back to float: `all_db`)
    toward the member that costs the output most. Each level runs the first half; when that
    half holds less than the half of the group's removable noise that additive noises would
    give it, the second half is run too, and the descent follows the half that gains more,
    while it still gains MIN_GAIN_DB (every step is measured: noise that compounds through the
    network is not additive, and an inferred share can point the wrong way). Returns the group
    it stopped at (one tensor, or the smallest group on the path that still gains that much),
    its measured output SQNR, and whether it got there (False: `deadline` passed first): one
    to two runs a level, about log2(len(order)) levels, where one run per member would be
    len(order)."""
    def removed(db: float) -> float:  # noise power taken away, relative to the base's signal
        return n0 - (10.0 ** (-db / 10.0) if db != math.inf else 0.0)

    n0 = 10.0 ** (-base_db / 10.0)
    group, group_db = order, all_db
    finished = True
    while len(group) > 1:
        if deadline is not None and time.perf_counter() >= deadline:
            finished = False
            break
        a, b = group[:len(group) // 2], group[len(group) // 2:]
        a_db = sqnr_of(a)
        pick, pick_db = a, a_db
        if removed(a_db) < removed(group_db) / 2:
            b_db = sqnr_of(b)
            if b_db > a_db:
                pick, pick_db = b, b_db
        if not pick_db - base_db >= MIN_GAIN_DB:
            break
        group, group_db = pick, pick_db
    return group, group_db, finished


def probe_culprits(qmodel: onnx.ModelProto, names: list[str], refs: list[list[np.ndarray]],
                   feeds: list[dict[str, np.ndarray]], *, max_probed: int = MAX_PROBED, top: int = 3,
                   stats: dict | None = None, budget_s: float | None = PROBE_BUDGET_S,
                   base_sqnr_db: float | None = None) -> ProbeResult:
    """Which quantized activations cost the worst output most (a `ProbeResult`).

    Every activation's Q/DQ pair is bypassed at once first: under MIN_GAIN_DB, none of them is
    the cause (quantization noises add up), one run. Otherwise `_descend` over all of them,
    noisiest first, ends on the one that costs most (then the other `max_probed` noisiest are
    put back one at a time, and the `top` that gain MIN_GAIN_DB are named) or on the smallest
    group that still gains it (the damage is spread; named as a group). The noise is estimated
    from the calibration `stats` where given, else measured in one run. Probing stops once
    `budget_s` seconds are spent (at least one tensor is probed): a probe is a session and a
    run, and a detector at full resolution spent a minute on 32 single probes.
    `base_sqnr_db`: the worst output SQNR of `qmodel` itself on `feeds` where the caller has it
    (saves a session and a run)."""
    pairs = _qdq_pairs(qmodel)
    if not pairs:
        return ProbeResult([], 0, None, 0)
    noise = _noise_from_stats(pairs, qmodel, stats) if stats else {}
    if not noise:
        noise = _noise_db(pairs, qmodel, feeds)
    noisy = sorted(pairs, key=lambda t: (noise.get(t, math.inf), t))  # every activation, noisiest first
    order = [t for t in noisy if t in noise][:max_probed]
    producer = {o: n.op_type for n in qmodel.graph.node for o in n.output}
    # a graph output's grid is named by the output, not by its float tensor's name of mixq's
    outputs = {o.name for o in qmodel.graph.output}
    shown = {t: dq for t, dqs in pairs.items() for dq in dqs if dq in outputs}

    def worst_sqnr(model: onnx.ModelProto) -> float:
        return _worst_sqnr(model, names, refs, feeds)

    t0 = time.perf_counter()
    base = worst_sqnr(qmodel) if base_sqnr_db is None else base_sqnr_db
    together = None
    found: list[Culprit] = []
    size = len(noisy)
    if len(noisy) > 1:
        group = _bypass_many(qmodel, {t: pairs[t] for t in noisy})
        if group is not qmodel:
            all_db = worst_sqnr(group)
            together = all_db - base
            if not together >= MIN_GAIN_DB or not math.isfinite(base):  # NaN included
                return ProbeResult([], len(noisy), together, len(noisy))
            deadline = None if budget_s is None else t0 + budget_s
            path, path_db, finished = _descend(
                noisy, lambda g: worst_sqnr(_bypass_many(qmodel, {t: pairs[t] for t in g})), base, all_db,
                deadline)
            gain = path_db - base
            if len(path) > 1 and gain >= MIN_GAIN_DB and (finished or len(path) < len(noisy)):
                # spread (or out of time after narrowing at least once): name the group
                return ProbeResult([], 0, together, len(noisy),
                                   DamageGroup("activation", [shown.get(t, t) for t in path], gain, finished))
            if len(path) == 1 and gain >= MIN_GAIN_DB:
                found.append(Culprit(shown.get(path[0], path[0]), producer.get(path[0], "graph input"), gain,
                                     noise.get(path[0], math.nan)))
                order = [t for t in order if t != path[0]]
    probed = len(found)
    for t in order:
        if budget_s is not None and probed and time.perf_counter() - t0 > budget_s:
            break
        probed += 1
        variant = _bypass(qmodel, t, pairs[t])
        if variant is qmodel:
            continue
        gain = worst_sqnr(variant) - base
        if math.isnan(gain):
            continue
        found.append(Culprit(shown.get(t, t), producer.get(t, "graph input"), gain, noise[t]))
    found.sort(key=lambda c: -c.sqnr_gain_db if math.isfinite(c.sqnr_gain_db) else -math.inf)
    named = [c for c in found if c.sqnr_gain_db >= MIN_GAIN_DB][:top]
    return ProbeResult(named, probed, together, size if together is not None else 0)


def fix_command(culprits: list[Culprit], *, preset: str | None, model_path: str | None,
                calib_path: str | None, formats: tuple[str, str] | None = None,
                classifier: bool = False) -> str:
    """The `mixq auto` command that searches a mixed plan between a wide base and the preset's
    formats, over these ops. The base is wider than the preset where it can be: int16/int8 over
    8-bit integers, int16/int16 over 16-bit activations with narrower weights (A16W8: its loss is
    in the weights), bf16 over block formats, float over 16-bit formats. Its target: at most a
    1-point drop of top-1 agreement for a `classifier` (class scores, one row per sample: what
    its user measures), else a relative L2 of 0.1."""
    from .formats import get_format

    ops = sorted({"Conv", "ConvTranspose", "Gemm", "MatMul"} | {c.producer_op for c in culprits
                                                                 if c.producer_op != "graph input"})
    act, wgt = formats or ("int8", "int8")
    fa, fw = get_format(act), get_format(wgt)
    if fa.kind == "int" and fa.bits < 16:
        base = "int16/int8" if fw.kind == "int" and fw.bits <= 8 else f"int16/{wgt}"
    elif fa.kind == "int" and fw.kind == "int" and fw.bits < 16:
        base = "int16/int16"
    elif fa.kind == "block":
        base = "bf16"
    else:
        base = "float"
    return (f"mixq auto {model_path or 'MODEL.onnx'} OUT.onnx --calib {calib_path or 'CALIB.npz'} "
            f"--candidates {base},{act}/{wgt}" + (f" --preset {preset}" if preset else "")
            + f" --op-types {','.join(ops)}"
            + (" --metric agreement --target 0.01" if classifier else " --l2-target 0.1"))


def _rows(feed: dict[str, np.ndarray]) -> int:
    v = next(iter(feed.values()), None)
    return int(v.shape[0]) if v is not None and v.ndim else 1


def count_samples(feeds: list[dict[str, np.ndarray]]) -> int:
    """Samples in `feeds` (the first input's leading axis; 1 for a scalar feed)."""
    return sum(_rows(f) for f in feeds)


def batch_axis_dynamic(model: onnx.ModelProto) -> bool:
    """True when every graph input has a leading axis of no fixed size (rows can be sliced)."""
    inits = {t.name for t in model.graph.initializer}
    inputs = [i for i in model.graph.input if i.name not in inits]
    for i in inputs:
        t = i.type.tensor_type
        if not t.HasField("shape") or not t.shape.dim or t.shape.dim[0].HasField("dim_value"):
            return False
    return bool(inputs)


def probe_feeds(feeds: list[dict[str, np.ndarray]], samples: int, *, sliceable: bool
                ) -> list[dict[str, np.ndarray]]:
    """The first `samples` samples of `feeds`: whole feeds until they hold that many, the last one
    cut to its first rows when `sliceable` (and every input of it has those rows)."""
    out: list[dict[str, np.ndarray]] = []
    held = 0
    for f in feeds:
        if held >= samples:
            break
        need, rows = samples - held, _rows(f)
        if sliceable and need < rows and all(v.ndim and v.shape[0] == rows for v in f.values()):
            f = {k: v[:need] for k, v in f.items()}
            rows = need
        out.append(f)
        held += rows
    return out


#: The weight probe puts float weights back beside the quantized ones: at most this many bytes.
WEIGHT_PROBE_BYTES = 2**28


def float_weights(qmodel: onnx.ModelProto, float_model: onnx.ModelProto
                  ) -> dict[str, tuple[str, np.ndarray]]:
    """The DequantizeLinear output of each quantized weight (an initializer of rank >= 2; or a
    block format's function call on a stored weight) -> (the float weight's name, its values),
    matched through the node that reads it: the node of the same name reads the float weight at
    the same input slot in the prepared float model."""
    from onnx import numpy_helper

    f_inits = {t.name: t for t in float_model.graph.initializer}
    f_nodes = {n.name: n for n in float_model.graph.node if n.name}
    q_inits = {t.name: t for t in qmodel.graph.initializer}
    readers: dict[str, list[tuple[onnx.NodeProto, int]]] = {}
    for n in qmodel.graph.node:
        for j, i in enumerate(n.input):
            readers.setdefault(i, []).append((n, j))
    out: dict[str, tuple[str, np.ndarray]] = {}
    for n in qmodel.graph.node:
        dq = n.op_type == "DequantizeLinear"
        w = q_inits.get(n.input[0]) if (dq or _block_call(n)) and n.input else None
        if w is None or (dq and len(w.dims) < 2):
            continue
        for r, j in readers.get(n.output[0], []):
            fn = f_nodes.get(r.name)
            src = fn.input[j] if fn is not None and j < len(fn.input) else None
            # a block format's constant is stored packed: the float weight is found by its reader
            if src in f_inits and len(f_inits[src].dims) >= 2 and (not dq or tuple(f_inits[src].dims) == tuple(w.dims)):
                out[n.output[0]] = (src, numpy_helper.to_array(f_inits[src]))
                break
    return out


def _with_float_weights(model: onnx.ModelProto, group: list[str],
                        weights: dict[str, tuple[str, np.ndarray]]) -> onnx.ModelProto:
    """A copy of `model` whose readers of each DequantizeLinear output in `group` read the float
    weight instead (an initializer beside the quantized one)."""
    from onnx import numpy_helper

    back = {dq: f"{dq}/float" for dq in group}
    return _rewired(model, back, [numpy_helper.from_array(weights[dq][1], back[dq]) for dq in group])


def probe_weights(qmodel: onnx.ModelProto, names: list[str], refs: list[list[np.ndarray]],
                  feeds: list[dict[str, np.ndarray]], weights: dict[str, tuple[str, np.ndarray]], *,
                  base_sqnr_db: float, budget_s: float | None = PROBE_BUDGET_S
                  ) -> tuple[list[Culprit], DamageGroup | None, int, float | None]:
    """Which quantized weights cost the worst output most: every weight back to float at once
    first (under MIN_GAIN_DB: the weights are not the cause, stop), then `_descend` in graph
    order down to one weight (a culprit) or the smallest group that still gains MIN_GAIN_DB.
    Returns (culprits, damage group, runs, the gain of all weights together; None when not
    probed)."""
    if not weights or not math.isfinite(base_sqnr_db):
        return [], None, 0, None
    t0 = time.perf_counter()
    runs = 0

    def sqnr(group: list[str]) -> float:
        nonlocal runs
        runs += 1
        return _worst_sqnr(_with_float_weights(qmodel, group, weights), names, refs, feeds)

    order = list(weights)
    all_db = sqnr(order)
    together = all_db - base_sqnr_db
    if not together >= MIN_GAIN_DB:
        return [], None, runs, together
    path, path_db, finished = _descend(order, sqnr, base_sqnr_db, all_db,
                                       None if budget_s is None else t0 + budget_s)
    gain = path_db - base_sqnr_db
    if not gain >= MIN_GAIN_DB:
        return [], None, runs, together
    if len(path) > 1:
        return [], DamageGroup("weight", [weights[dq][0] for dq in path], gain, finished), runs, together
    src, w = weights[path[0]]
    reader = next((n for n in qmodel.graph.node if path[0] in n.input), None)
    return [Culprit(src, reader.op_type if reader is not None else "?", gain,
                    _weight_noise_db(qmodel, path[0], w), kind="weight",
                    node=reader.name if reader is not None else "")], None, runs, together


def _weight_noise_db(qmodel: onnx.ModelProto, dq_out: str, w: np.ndarray) -> float:
    """The quantized weight's own SQNR: the node that dequantizes it (a DequantizeLinear, or a
    block format's function call) alone, run, against the float values."""
    node = next(n for n in qmodel.graph.node if dq_out in n.output)
    inits = [t for t in qmodel.graph.initializer if t.name in set(node.input)]
    g = helper.make_graph([node], "weight", [], [helper.make_tensor_value_info(dq_out, onnx.TensorProto.FLOAT,
                                                                             None)], inits)
    m = helper.make_model(g, opset_imports=list(qmodel.opset_import), ir_version=qmodel.ir_version,
                          functions=list(qmodel.functions))
    got = make_session(m, optimize=False).run([dq_out], {})[0].astype(np.float64)
    err = float(np.sum((got - w) ** 2))
    return 10.0 * math.log10(float(np.sum(w.astype(np.float64) ** 2)) / err) if err > 0 else math.inf


def probe_budget(size: int) -> int:
    """How many tensors the probe puts back to float for a model of `size` bytes: each is a
    session and a run (EfficientNet-Lite0, 18 MB: 32 probes took 4 minutes on 2 busy cores)."""
    return MAX_PROBED if size < 2**21 else 8 if size < 2**25 else 4


def check_fidelity(float_model: onnx.ModelProto | bytes | str, qmodel: onnx.ModelProto | str,
                   feeds: list[dict[str, np.ndarray]], *, probe: bool = True, max_probed: int = MAX_PROBED,
                   preset: str | None = None, model_path: str | None = None,
                   calib_path: str | None = None, formats: tuple[str, str] | None = None,
                   stats: dict | None = None, runs: Runs | None = None) -> FidelityReport:
    """Score `qmodel` against `float_model` on `feeds` (one onnxruntime run of each; keep the
    feeds small, e.g. <= 64 samples; `runs`: those runs, already made on these feeds). When
    broken or likely to lose accuracy (`FidelityReport.likely_loss`) and `probe`, name the
    tensors that do the most damage and the `mixq auto` command that would fix them (`stats`:
    the calibration statistics, name -> TensorStats, which rank the tensors to probe without a
    run)."""
    sessions: dict[str, Any] = {}

    def fs() -> Any:  # sessions only where a run is still needed
        if "f" not in sessions:
            try:
                sessions["f"] = make_session(float_model, optimize=True)
            except Exception as exc:  # noqa: BLE001 - onnxruntime raises its own exception types
                raise ModelError(f"{FLOAT_LOAD_FAILED}: {exc}") from exc
        return sessions["f"]

    def qs() -> Any:  # the QDQ semantics (constants folded, no integer fusions)
        if "q" not in sessions:
            try:
                sessions["q"] = make_session(qmodel, optimize="basic")
            except Exception as exc:  # noqa: BLE001
                raise ModelError(f"internal error: the quantized model does not load in onnxruntime "
                                 f"({exc}); nothing was written. Please report it with the model.") from exc
        return sessions["q"]

    def run_all(session: Callable[[], Any], quantized: bool) -> list[Any]:
        out = []
        for k, f in enumerate(feeds):
            try:
                out.append(session().run(names, f))
            except MixqError:
                raise
            except Exception as exc:  # noqa: BLE001 - onnxruntime raises its own exception types
                shapes = ", ".join(f"{n}: {tuple(np.shape(v))}" for n, v in f.items())
                if quantized:  # the float model ran on this sample: the rewrite is at fault
                    raise ModelError(f"internal error: the quantized model fails in onnxruntime on the "
                                     f"guard's sample {k} (input shapes {shapes}), where the float model "
                                     f"runs: {exc}; nothing was written. Please report it with the "
                                     "model.") from exc
                raise DataError(f"onnxruntime failed running the float model on the guard's sample "
                                f"{k} (input shapes {shapes}): {exc}") from exc
        return out

    if runs is not None and runs.feeds is feeds:
        names, refs, gots = runs.names, runs.refs, runs.got
    else:
        names = _numeric_outputs(fs())
        refs = run_all(fs, quantized=False) if names else []
        gots = run_all(qs, quantized=True) if names else []
    if not names:
        return FidelityReport(not_checked="the model has no numeric tensor output")
    if not any(np.any(r) for rs in [*refs, *gots] for r in rs):  # 0 against 0 would score perfect
        return FidelityReport(not_checked="the float model's outputs are all 0 on the guard's samples "
                                          "(and the quantized model's too): nothing to compare; check "
                                          "the model or the data")
    q = qmodel if isinstance(qmodel, onnx.ModelProto) else onnx.load(qmodel)
    rep = FidelityReport(outputs=_score(names, refs, gots, class_score_outputs(q), decision_outputs(q),
                                              value_outputs(q)),
                         samples=count_samples(feeds),
                         random_ops=sorted({n.op_type for n in random_ops(q)}),
                         unscored=[f"{o.name} ({_type_name(o.type)})" for o in q.graph.output if o.name not in names])
    rep.nonfinite = [o.name for o in rep.outputs if o.all_nonfinite]
    if rep.nonfinite and len(rep.nonfinite) == len(rep.outputs):
        return FidelityReport(not_checked="the float model's outputs are NaN or inf on every one of the "
                                          f"guard's {rep.samples} samples: nothing to compare; check the "
                                          "calibration data (or the model)", samples=rep.samples,
                              nonfinite=rep.nonfinite)
    rep.outputs = [o for o in rep.outputs if not o.all_nonfinite]
    rep.broken = is_broken(rep.outputs)
    runtime = None
    if _fusable(q):  # the samples of the runtime check, scored after the probe (below)
        rf = probe_feeds(feeds, RUNTIME_SAMPLES, sliceable=batch_axis_dynamic(q))
        whole = all(a is b for a, b in zip(rf, feeds))
        runtime = (rf, refs[:len(rf)] if whole else [fs().run(names, f) for f in rf],
                   gots[:len(rf)] if whole else [qs().run(names, f) for f in rf])
    if (rep.broken or rep.likely_loss is not None) and probe:
        pf = probe_feeds(feeds, PROBE_SAMPLES, sliceable=batch_axis_dynamic(q))
        whole = all(a is b for a, b in zip(pf, feeds))  # no feed cut: its outputs are at hand
        prefs = refs[:len(pf)] if whole else [fs().run(names, f) for f in pf]
        pgots = gots[:len(pf)] if whole else [qs().run(names, f) for f in pf]
        base = min(o.judged_sqnr_db for o in _score(names, prefs, pgots))
        t0 = time.perf_counter()
        acts = probe_culprits(q, names, prefs, pf, max_probed=max_probed, stats=stats, base_sqnr_db=base)
        rep.culprits, rep.probed, rep.together_gain_db, rep.group = acts[:4]
        rep.damage_groups = [acts.damage_group] if acts.damage_group else []
        named = rep.culprits or rep.damage_groups
        weights = _probe_weights_of(q, float_model) if not named else {}
        if weights:  # the activations name nothing: are the weights the cause?
            left = max(0.0, PROBE_BUDGET_S - (time.perf_counter() - t0))
            found, wgroup, rep.weight_probes, rep.weights_gain_db = probe_weights(
                q, names, prefs, pf, weights, base_sqnr_db=base, budget_s=left)
            rep.weights = len(weights)
            rep.culprits += found
            rep.damage_groups += [wgroup] if wgroup else []
        rep.fix_command = fix_command(rep.culprits, preset=preset, model_path=model_path,
                                      calib_path=calib_path, formats=formats,
                                      classifier=any(o.expected_agreement is not None and not o.one_class
                                                     for o in rep.outputs))
    if runtime is not None:
        rf, rrefs, rgots = runtime
        sessions.clear()  # one session in memory at a time: the optimized one holds prepacked weights
        try:
            opt = make_session(qmodel, optimize=True)
        except Exception as exc:  # noqa: BLE001 - onnxruntime raises its own exception types
            raise ModelError(f"internal error: the quantized model loads in onnxruntime with basic "
                             f"optimizations but not with its default ones ({exc}); nothing was written. "
                             "Please report it with the model.") from exc
        rep.runtime_sqnr_db = min(o.sqnr_db for o in _score(names, rrefs, [opt.run(names, f) for f in rf]))
        rep.runtime_qdq_sqnr_db = min(o.sqnr_db for o in _score(names, rrefs, rgots))
    return rep


def _type_name(tp: onnx.TypeProto) -> str:
    """A short ONNX type name: tensor(string), seq(map(int64,tensor(float)))."""
    kind = tp.WhichOneof("value")
    if kind == "tensor_type":
        return f"tensor({onnx.helper.tensor_dtype_to_np_dtype(tp.tensor_type.elem_type).name})" \
            if tp.tensor_type.elem_type != onnx.TensorProto.STRING else "tensor(string)"
    if kind == "sequence_type":
        return f"seq({_type_name(tp.sequence_type.elem_type)})"
    if kind == "map_type":
        key = onnx.helper.tensor_dtype_to_np_dtype(tp.map_type.key_type).name \
            if tp.map_type.key_type != onnx.TensorProto.STRING else "string"
        return f"map({key},{_type_name(tp.map_type.value_type)})"
    return kind or "unknown"


def _numeric_outputs(sess: object) -> list[str]:
    """The outputs scored: numeric tensors (strings, sequences and maps are not)."""
    return [o.name for o in sess.get_outputs()  # type: ignore[attr-defined]
            if o.type.startswith("tensor(") and o.type != "tensor(string)"]


#: A perfect output (quantized = float) counts as this many dB in `score_models`.
SQNR_CAP_DB = 200.0


@dataclass
class Runs:
    """The float model's and one quantized model's outputs on the same feeds (one run each, in
    the guard's settings), which the guard reuses instead of running both again."""

    feeds: list[dict[str, np.ndarray]]
    names: list[str]
    refs: list[list[np.ndarray]]
    got: list[list[np.ndarray]]


@dataclass(frozen=True)
class ModelScore:
    """How near one quantized model's outputs are to float's on some feeds, as
    weight_rounding='auto' compares two models: the mean SQNR (dB, a perfect output counting
    SQNR_CAP_DB) of the outputs that hold values, and the mean share of equal elements of those
    that hold decisions (`decision_outputs`: class indices, whose SQNR would measure how far
    apart two class numbers are). None: no such output."""

    sqnr_db: float | None
    agreement: float | None
    #: outputs left out: 0 or non-finite on every feed in float and in this model alike
    empty: tuple[str, ...] = ()

    def text(self) -> str:
        """'mean output SQNR 31.20 dB', 'decisions equal to float's: 96.9%', or both."""
        parts = ([] if self.sqnr_db is None else [f"mean output SQNR {self.sqnr_db:.2f} dB"]) + \
            ([] if self.agreement is None else [f"decisions equal to float's: {100 * self.agreement:.1f}%"])
        return ", ".join(parts) or "no numeric output"


def score_models(float_model: onnx.ModelProto | bytes | str, qmodels: list[onnx.ModelProto],
                 feeds: list[dict[str, np.ndarray]]) -> list[tuple[ModelScore, Runs]]:
    """Each of `qmodels` scored against `float_model` on `feeds` (one float run for all), in
    the QDQ semantics the guard scores (NaN / inf where float is finite: SQNR -inf, an element
    that differs), with the runs it took."""
    fs = make_session(float_model, optimize=True)
    names = _numeric_outputs(fs)
    refs = [fs.run(names, f) for f in feeds]
    del fs
    out = []
    for q in qmodels:
        qs = make_session(q, optimize="basic")
        got = [qs.run(names, f) for f in feeds]
        ms = _score(names, refs, got, decisions=decision_outputs(q))
        # an output 0 (or non-finite) on every feed in both models scores the cap for any rounding
        empty = {j for j in range(len(names)) if holds_nothing([r[j] for r in refs], [g[j] for g in got])}
        values = [min(m.sqnr_db, SQNR_CAP_DB) for j, m in enumerate(ms) if not m.decisions and j not in empty]
        decided = [m.top1_agreement for m in ms if m.decisions and m.top1_agreement is not None]
        out.append((ModelScore(float(np.mean(values)) if values else None,
                               float(np.mean(decided)) if decided else None,
                               tuple(names[j] for j in sorted(empty))), Runs(feeds, names, refs, got)))
    return out


def holds_nothing(refs: list[np.ndarray], got: list[np.ndarray]) -> bool:
    """Whether a float output of the reference model has no nonzero finite value on any feed,
    and the other model's is 0 there too: nothing a score could tell apart (the quantizer's
    rounding comparison and the converters' fidelity check)."""
    for r, g in zip(refs, got):
        r, g = np.asarray(r), np.asarray(g)
        if r.dtype.kind not in "fc" or r.shape != g.shape:  # integers are decisions: compared exactly
            return False
        finite = np.isfinite(r)
        if np.any(r[finite]) or np.any(g[finite]):
            return False
    return True


def _fusable(q: onnx.ModelProto) -> bool:
    """Whether onnxruntime may fuse integer kernels: a QuantizeLinear to 8 bits (its zero point,
    or no zero point: uint8) in the main graph, or a DequantizeLinear of an integer constant
    read by a MatMul whose other input comes from no DequantizeLinear (its default
    optimizations run that as MatMulNBits, which quantizes the float input on the fly: NeMo's
    front end wrote NaN that way, finite values with basic optimizations)."""
    eight = {onnx.TensorProto.INT8, onnx.TensorProto.UINT8}
    inits = {t.name: t.data_type for t in q.graph.initializer}
    consts = {n.output[0]: n.attribute[0].t.data_type for n in q.graph.node
              if n.op_type == "Constant" and n.attribute and n.attribute[0].type == onnx.AttributeProto.TENSOR}
    dq_const = {n.output[0] for n in q.graph.node if n.op_type == "DequantizeLinear" and n.input
                and (n.input[0] in inits or n.input[0] in consts)}
    dq_any = {n.output[0] for n in q.graph.node if n.op_type == "DequantizeLinear"}
    for n in q.graph.node:
        if n.op_type == "MatMul" and len(n.input) == 2 and n.input[1] in dq_const and n.input[0] not in dq_any:
            return True
    for n in q.graph.node:
        if n.op_type != "QuantizeLinear" or n.domain not in ("", "ai.onnx"):
            continue
        if len(n.input) < 3 or not n.input[2]:  # no zero point: output_dtype, uint8 by default
            if next((a.i for a in n.attribute if a.name == "output_dtype"), 0) in (0, *eight):
                return True
        elif inits.get(n.input[2], consts.get(n.input[2])) in eight:
            return True
    return False


def _probe_weights_of(q: onnx.ModelProto, float_model: onnx.ModelProto | bytes | str
                      ) -> dict[str, tuple[str, np.ndarray]]:
    """`float_weights` of the float model in memory (none for a model whose weights stay on
    disk, or whose float weights would take over WEIGHT_PROBE_BYTES beside the quantized ones)."""
    if isinstance(float_model, bytes):
        fm = onnx.load_from_string(float_model)
    elif isinstance(float_model, onnx.ModelProto):
        fm = float_model
    else:
        return {}
    weights = float_weights(q, fm)
    if sum(w.nbytes for _, w in weights.values()) > WEIGHT_PROBE_BYTES:
        return {}
    return weights


#: Samples the guard in `quantize` compares on (the last ones of the calibration data).
GUARD_SAMPLES = 32


class HeldBack:
    """The guard's samples, kept while the calibration pass reads data that cannot be read again
    (a data reader, a generator): the last feeds holding at least `samples` samples, as
    `held_back_feeds` takes them from a list, and the first feed (the kernel check's). A
    calibration tap (`names`: the model's inputs); each feed is copied as it passes, since a
    reader may refill one buffer. Memory: those feeds, and one more batch."""

    def __init__(self, model: onnx.ModelProto, samples: int = GUARD_SAMPLES) -> None:
        from .calibration.data import input_specs_from_model

        self._specs = input_specs_from_model(model)
        self.names = [s.name for s in self._specs]
        self.samples = samples
        self.first: dict[str, np.ndarray] | None = None
        self.complete = False
        self._kept: deque[dict[str, np.ndarray]] = deque()
        self._held = 0

    def update(self, values: dict[str, np.ndarray], rows: int) -> None:
        """One batch of the pass (`values`: its feed); `rows` is not needed (a feed's first
        input tells, as for a list)."""
        self.add({n: np.array(values[n], copy=True) for n in self.names if n in values})

    def add(self, feed: dict[str, np.ndarray]) -> None:
        """Keep `feed`; drop the oldest feeds the last `samples` samples do not need."""
        if self.first is None:
            self.first = feed
        self._kept.append(feed)
        self._held += _rows(feed)
        while len(self._kept) > 1 and self._held - _rows(self._kept[0]) >= self.samples:
            self._held -= _rows(self._kept.popleft())

    def finish(self) -> None:
        """After the pass's last batch: the feeds are the data's last ones."""
        self.complete = True

    def read(self, data: object) -> None:
        """A pass of its own over `data` (arrays split in feeds of 8 samples)."""
        from .calibration.data import FeedSource

        for feed in FeedSource(data, self._specs, batch_size=8):
            self.add(feed)
        self.finish()

    @property
    def feeds(self) -> list[dict[str, np.ndarray]]:
        """The last feeds, at least `samples` samples (all of them where the data holds fewer)."""
        return list(self._kept)


def held_back_feeds(data: object, model: onnx.ModelProto, *, samples: int = GUARD_SAMPLES,
                    kept: HeldBack | None = None) -> list[dict[str, np.ndarray]] | None:
    """The last `samples` samples of the calibration data as feeds: read again from data that
    can be (feeds, arrays, a file or a folder, also inside a CalibData), else those `kept` during
    the calibration pass; None where neither can be had (a one-shot reader read by a pass that
    kept nothing)."""
    from .calibration.data import readable_twice

    if not readable_twice(data):
        return kept.feeds if kept is not None and kept.complete else None
    tail = HeldBack(model, samples)
    tail.read(data)
    return tail.feeds


#: how the guard reports a float model onnxruntime refuses to load (the caller may then tell
#: whether the user's file loads at all: Pipeline.raise_if_source_fails)
FLOAT_LOAD_FAILED = "onnxruntime cannot load the float model the guard compares against"


def float_reference(model: object, prepared: onnx.ModelProto, base_dir: object) -> bytes | str | None:
    """What the guard compares against: the prepared float model serialized (before the
    rewrite changes it in place), or the model's path when its weights stay on disk (None
    when neither can be had: over 2 GiB in memory)."""
    if base_dir is not None and isinstance(model, (str, os.PathLike)):
        return str(model)
    from ._io import approx_model_size

    if approx_model_size(prepared) >= 2**31 - 1 - 2**20:  # a margin for the estimate
        return None
    return prepared.SerializeToString()


def guard(float_model: onnx.ModelProto | bytes | str | None, qmodel: onnx.ModelProto, data: object, *,
          config: QuantConfig, model_path: str | None, size: int, custom_ops: bool = False,
          stats: dict | None = None, kept: HeldBack | None = None, runs: Runs | None = None,
          watch: Any = None) -> FidelityReport:
    """What `quantize` runs last: the comparison on the last calibration samples (`kept`: those
    the calibration pass kept, for data that cannot be read again; `runs`: both models' runs on
    them, made before; `watch`: a tap, as calibration.variety.InputExtremes, fed the samples
    compared on); a report saying why not, where it cannot run."""
    if custom_ops:
        return FidelityReport(not_checked="the model has ops onnxruntime cannot run here")
    if float_model is None:
        return FidelityReport(not_checked="the float model is over 2 GiB in memory (run `mixq eval`)")
    if data is None:
        return FidelityReport(not_checked="no calibration data to compare on")
    if size >= 2**31 - 1:
        return FidelityReport(not_checked="the quantized model is over 2 GiB (run `mixq eval`)")
    feeds = runs.feeds if runs is not None else held_back_feeds(data, qmodel, kept=kept)
    if feeds is None:
        return FidelityReport(not_checked="the calibration data is a one-shot reader that no calibration "
                                          "pass here read (run `mixq eval` on held-out data)")
    if watch is not None:
        for f in feeds:
            watch.update(f)
    from .config import PRESETS

    calib = str(data) if isinstance(data, (str, os.PathLike)) else None
    preset = config.name if config.name.upper() in PRESETS else None
    return check_fidelity(float_model, qmodel, feeds, probe=True, max_probed=probe_budget(size),
                          preset=preset, model_path=model_path, calib_path=calib,
                          formats=(config.activation, config.weight), stats=stats, runs=runs)
