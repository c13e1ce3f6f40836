"""Compare a quantized model with its float original in onnxruntime.

Metrics per output: SQNR (dB), cosine similarity, max absolute error, and top-1 agreement for
classifier-like outputs (rank 2, more than one class), with the agreement to expect from how
near each row's top class is to being overtaken under the noise it shows (`flip_exposure`).
Everything streams batch by batch.
"""
from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import onnx
from onnx import helper

from .errors import DataError, ModelError
from .graph import is_float_type, walk_graphs

#: Ops that draw new random values at every run (a VAE's sampling, diffusion noise, stochastic
#: depth kept in an export): mixq's comparison sessions seed them (`seed_random_ops`)
RANDOM_OPS = frozenset({"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike",
                        "Bernoulli", "Multinomial"})


#: Byte strings every serialized `RANDOM_OPS` node holds (RandomNormal covers RandomNormalLike):
#: a serialized model without them is not parsed to look
_RANDOM_OP_KEYS = (b"RandomNormal", b"RandomUniform", b"Bernoulli", b"Multinomial")


def random_ops(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """The default-domain `RANDOM_OPS` nodes of `model`, main graph and subgraphs, in order."""
    return [n for g in walk_graphs(model.graph) for n in g.node
            if n.op_type in RANDOM_OPS and n.domain in ("", "ai.onnx")]


def seed_random_ops(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` itself when it draws no random values, else a copy whose k-th random node (in
    graph order) without a `seed` attribute gets seed k + 1: a float model and its quantized
    copy then draw the same values run for run, and comparing them measures the quantization,
    not two independent draws (a VAE whose decoder reads mu + sigma * RandomNormalLike read
    broken at every preset, 10 dB, float against float included). The user's model keeps its
    random ops as written; only mixq's comparison sessions are seeded."""
    if not random_ops(model):
        return model
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for k, n in enumerate(random_ops(out)):
        if not any(a.name == "seed" for a in n.attribute):
            n.attribute.append(helper.make_attribute("seed", float(k + 1)))
    return out


@functools.lru_cache(maxsize=1)
def onnxruntime_max_ir_version() -> int:
    """The newest ONNX IR version the installed onnxruntime loads (probed once on a one-node
    model; onnxruntime does not publish it)."""
    import onnxruntime as ort

    g = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "ir",
                          [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])],
                          [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])])
    so = ort.SessionOptions()
    so.log_severity_level = 4
    best = 3
    for ir in range(3, onnx.IR_VERSION + 1):
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=ir)
        try:
            ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
        except Exception:  # onnxruntime's own error type: this IR version is too new
            break
        best = ir
    return best


def seeded_source(model: onnx.ModelProto | bytes | str) -> onnx.ModelProto | bytes | str:
    """What an onnxruntime session of `model` should load: `seed_random_ops` of a ModelProto, or
    of a serialized model that holds random ops (found by `_RANDOM_OP_KEYS` before any parse);
    a path as it is (its weights may lie beside it). onnxruntime draws unseeded random values
    from a seed of its own per process: a VAE's calibration statistics, and so its quantized
    bytes, changed from one run of the same command to the next."""
    if isinstance(model, bytes):
        if not any(k in model for k in _RANDOM_OP_KEYS):
            return model
        parsed = onnx.ModelProto()
        parsed.ParseFromString(model)
        seeded = seed_random_ops(parsed)
        return model if seeded is parsed else seeded.SerializeToString()
    if isinstance(model, onnx.ModelProto):
        return seed_random_ops(model)
    return model


def make_session(model: onnx.ModelProto | str | bytes, *, optimize: bool | str = True, threads: int | None = None,
                 providers: tuple[str, ...] = ("CPUExecutionProvider",)):
    """An onnxruntime session with default (True), disabled (False) or basic ("basic") graph
    optimizations. "basic" folds constants (weight DequantizeLinear included) but fuses no QDQ
    group into an integer kernel, so it computes the model's QDQ semantics, fast: what search
    decisions are made on (CPU integer kernels differ by machine, e.g. u8s8 saturation without
    VNNI). Random ops are seeded (`seeded_source`): every session mixq compares draws the
    same values run for run."""
    import onnxruntime as ort

    model = seeded_source(model)
    so = ort.SessionOptions()
    so.log_severity_level = 3
    if optimize == "basic":
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    elif optimize is not True and optimize is not False:
        raise ValueError(f"optimize={optimize!r}: True, False or 'basic'")
    elif not optimize:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    if threads:
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
    src = model if isinstance(model, (str, bytes)) else model.SerializeToString()
    return ort.InferenceSession(src, so, providers=list(providers))


#: A row is a near-tie when its float top-1 class leads the runner-up by at most this fraction
#: of the two scores' magnitudes: half a bfloat16 ulp on each (2**-8 of their sum), the rounding
#: of the scores alone. Any reduced precision may flip such a row, so its flip says nothing
#: about the quantizer (photo crops of textures, ambiguous inputs).
NEAR_TIE = 2.0 ** -8


# -- how near each row's top-1 class is to flipping ----------------------------------------------
#: the runner-up classes whose overtaking counts towards a sample's flip risk
COMPETITORS = 5
#: a sample is near a tie when its top-1 lead is within this many noise spreads
NEAR_BAND = 3.0


def _rows(a: np.ndarray) -> np.ndarray:
    a = np.asarray(a, dtype=np.float64)
    # the row length spelled out: -1 cannot be inferred for zero rows (a batch of 0)
    return a.reshape(1, 1) if a.ndim == 0 else a.reshape(a.shape[0], int(np.prod(a.shape[1:])))


def _upper_normal_tail(z: np.ndarray) -> np.ndarray:
    """P(N(0, 1) > z), elementwise."""
    erfc = np.frompyfunc(math.erfc, 1, 1)
    return np.asarray(0.5 * erfc(z / math.sqrt(2.0)), dtype=np.float64)


@dataclass(frozen=True)
class FlipExposure:
    """How exposed each output row's top-1 class is to a plan's output noise.

    risk: the probability that the row's float top-1 class is overtaken under noise of the size
      the plan shows on this row (see `flip_exposure`), 1 for a row with a non-finite value;
    near: whether the row's lead over its runner-up is within NEAR_BAND noise spreads."""

    risk: np.ndarray
    near: np.ndarray

    @staticmethod
    def concat(parts: list["FlipExposure"]) -> "FlipExposure":
        if not parts:
            return FlipExposure(np.zeros(0), np.zeros(0, dtype=bool))
        return FlipExposure(np.concatenate([p.risk for p in parts]),
                            np.concatenate([p.near for p in parts]))


def flip_exposure(quantized: np.ndarray, reference: np.ndarray,
                  competitors: int = COMPETITORS) -> FlipExposure:
    """The `FlipExposure` of each row (sample) of a quantized output against the float one.

    A row's noise is e = quantized - reference; the lead of the top-1 class over a runner-up
    moves by the difference of two entries of e, whose spread is taken as sqrt(2) * std(e) over
    the row (a shift of the whole row changes no ranking). Its risk is the sum, over its
    `competitors` closest runner-ups, of P(N(0, 1) > lead / spread) (at most 1): a near-tie
    flips under little noise whether or not it flipped this time; a row led by a wide margin
    does not."""
    f, q = _rows(reference), _rows(quantized)
    n, c = f.shape
    if c < 2 or n == 0:
        return FlipExposure(np.zeros(n), np.zeros(n, dtype=bool))
    bad = ~(np.all(np.isfinite(f), axis=1) & np.all(np.isfinite(q), axis=1))
    f = np.where(np.isfinite(f), f, 0.0)
    e = np.where(np.isfinite(q), q, 0.0) - f
    k = min(int(competitors), c - 1)
    top = np.argpartition(-f, k, axis=1)[:, :k + 1]
    vals = -np.sort(-np.take_along_axis(f, top, axis=1), axis=1)
    lead = vals[:, :1] - vals[:, 1:]  # >= 0, closest runner-up first
    spread = math.sqrt(2.0) * np.std(e, axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.where(spread[:, None] > 0, lead / spread[:, None], np.inf)
    risk = np.minimum(_upper_normal_tail(z).sum(axis=1), 1.0)
    risk[bad] = 1.0
    return FlipExposure(risk, (z[:, 0] < NEAR_BAND) | bad)


#: Samples (rows of axis 0) an output's variation is measured over, at least.
MIN_VARIATION_SAMPLES = 4
#: An output's channels along one axis fall into two parts, each read on its own, where their
#: rms, in order, jumps by at least this factor (boxes of 0..640 beside scores of 0..1): the
#: SQNR of the whole output is then the loud part's, and hides the quiet part's loss
PART_GAP = 16.0
#: Axes of at most this many channels are split into parts (longer ones are positions, frames)
PART_MAX_CHANNELS = 4096
#: ... and the split must hold in every sample: each quiet channel's rms in any sample at least
#: this factor below each loud channel's in any other. A quantity concatenated beside another is
#: quiet in every sample (scores beside boxes); the rows of a text detector's probability map
#: are not (a background row of one page is a text row of the next), nor an image's
PART_SAMPLE_GAP = 4.0
#: An output whose variation SQNR is this far below its SQNR sits on an offset (`offset_hidden`).
OFFSET_DB = 10.0


@dataclass
class OutputMetrics:
    """Agreement of one output with the float reference. For class-score outputs (rank 2),
    `top1_agreement` over every row, and `decisive_agreement` over the `decisive_rows` rows that
    are no near-ties (see NEAR_TIE)."""

    name: str
    sqnr_db: float
    cosine: float
    max_abs_err: float
    top1_agreement: float | None = None
    decisive_agreement: float | None = None
    decisive_rows: int = 0
    rows: int = 0
    #: the agreement to expect on the decisive rows from their flip risks (`flip_exposure`: how
    #: near each row's top-1 class is to being overtaken under the noise its scores show), a
    #: steadier estimate than counting the few flips a small sample shows; None where the rows
    #: are no samples (a sequence's frames) or the output is no class scores
    expected_agreement: float | None = None
    #: the output holds decisions (class indices): `top1_agreement` is the share of its elements
    #: equal to float's, over `rows` elements; its SQNR and cosine compare index values
    decisions: bool = False
    #: samples whose output had another shape than float's (a detector's box count after NMS),
    #: of `pairs` compared: the SQNR and cosine are over the others
    shape_changed: int = 0
    pairs: int = 0
    #: the SQNR on the output's variation across samples (`ErrorStats.variation_sqnr_db`)
    variation_sqnr_db: float | None = None
    #: the quiet part of an output whose channels lie on two scales (`ErrorStats.quiet_part`):
    #: which channels, and their own SQNR; None where no axis splits so
    part: "QuietPart | None" = None
    #: of the `values` elements compared, those where float's own output is NaN or inf: left
    #: out of every metric (an output that is all such says nothing: `all_nonfinite`)
    ref_nonfinite: int = 0
    values: int = 0
    #: the class scores are probabilities (a Softmax/LogSoftmax wrote them), not logits or
    #: values of unknown meaning that merely have the shape of class scores
    probabilities: bool = False
    #: float's top-1 is one class on every row compared: an agreement over them measures
    #: nothing (a model that always answered that class would agree on every row)
    one_class: bool = False

    @property
    def all_nonfinite(self) -> bool:
        """Float's own output was NaN or inf everywhere: nothing was compared."""
        return self.values > 0 and self.ref_nonfinite == self.values

    @property
    def judged_sqnr_db(self) -> float:
        """The SQNR an output is judged by: its own, or its quiet part's where that is lower
        (scores of 0..1 beside boxes of 0..640 lost at 6 dB while the whole reads 26)."""
        return self.sqnr_db if self.part is None else min(self.sqnr_db, self.part.sqnr_db)

    @property
    def offset_hidden(self) -> bool:
        """The output sits on an offset that hides its error: its variation across samples is
        under a tenth of its power, and so its SQNR on that variation OFFSET_DB or more below
        its SQNR."""
        return (self.variation_sqnr_db is not None and not self.decisions
                and self.variation_sqnr_db <= self.sqnr_db - OFFSET_DB)

    @property
    def decisive_flips(self) -> int:
        """How many of the decisive rows changed their top-1 class."""
        return round((1.0 - (self.decisive_agreement or 0.0)) * self.decisive_rows)


class QuietPart(NamedTuple):
    """Channels of an output, along `axis`, whose rms lies `gap` times or more below the rest:
    a quantity on a scale of its own concatenated beside a louder one; `sqnr_db` is theirs."""

    axis: int
    channels: tuple[int, ...]
    size: int
    gap: float
    sqnr_db: float

    def describe(self) -> str:
        """'channels 4..21 of 22 along axis 1'."""
        return (f"channel{'s' if len(self.channels) > 1 else ''} {channel_runs(self.channels)} of {self.size} "
                f"along axis {self.axis}")


def channel_runs(channels: Iterable[int]) -> str:
    """Sorted channel indices as runs, the first four shown: '1..3', '0, 2, 5..9, 12, ...'."""
    idx = [int(c) for c in channels]
    runs: list[str] = []
    start = prev = idx[0]
    for c in [*idx[1:], None]:
        if c is not None and c == prev + 1:
            prev = c
            continue
        runs.append(str(start) if start == prev else f"{start}..{prev}")
        if c is not None:
            start = prev = c
    return ", ".join(runs[:4]) + (", ..." if len(runs) > 4 else "")


def quiet_part(sig: np.ndarray, noise: np.ndarray, axis: int, gap: float = PART_GAP,
               lo: np.ndarray | None = None, hi: np.ndarray | None = None) -> QuietPart | None:
    """The quiet part of one axis from its channels' signal and noise powers (sums over the
    other axes and the samples): the channels below the largest jump of `gap` or more in their
    rms, sorted (channels that are 0 in float everywhere take no part). With `lo` / `hi` (each
    channel's least and greatest power in one sample) the split must hold in every sample
    (PART_SAMPLE_GAP). None without such a jump."""
    live = np.flatnonzero(sig > 0)
    if live.size < 2:
        return None
    order = live[np.argsort(-sig[live], kind="stable")]
    rms = np.sqrt(sig[order])
    jumps = rms[:-1] / rms[1:]
    k = int(np.argmax(jumps))
    if not jumps[k] >= gap:
        return None
    if lo is not None and hi is not None and \
            not float(np.max(hi[order[k + 1:]])) * PART_SAMPLE_GAP ** 2 <= float(np.min(lo[order[:k + 1]])):
        return None
    quiet = np.sort(order[k + 1:])
    s, n = float(sig[quiet].sum()), float(noise[quiet].sum())
    db = math.inf if n == 0.0 else 10.0 * math.log10(s / n)
    return QuietPart(axis, tuple(int(c) for c in quiet), int(sig.size), float(jumps[k]), db)


def spread_part(sig: np.ndarray, noise: np.ndarray, axis: int, gap: float = PART_GAP) -> QuietPart | None:
    """The worst of the channels whose rms lies `gap` times or more below the loudest channel's,
    with no jump between the scales (targets of a regression head on scales 1 to 60: the whole
    output read 27-36 dB while its quietest target kept 1-5 dB). Read for rank-2 outputs, whose
    channels are quantities of their own, and without the per-sample split `quiet_part` asks
    (a zero-mean target's rms in one row is anything down to 0). None where no channel lies
    that far below."""
    live = np.flatnonzero(sig > 0)
    if live.size < 2:
        return None
    top = float(np.max(sig[live]))
    quiet = live[sig[live] * gap * gap <= top]
    if not quiet.size:
        return None
    with np.errstate(divide="ignore"):
        db = np.where(noise[quiet] > 0, 10.0 * np.log10(sig[quiet] / np.maximum(noise[quiet], 1e-300)), np.inf)
    c = int(quiet[int(np.argmin(db))])
    return QuietPart(axis, (c,), int(sig.size), math.sqrt(top / float(sig[c])), float(np.min(db)))


@dataclass
class ErrorStats:
    """Streaming error statistics of an output against its reference (float64 sums), plus top-1
    agreement for classifier-like outputs.

    Pairs where the reference is NaN/inf are left out (the float model's own doing). A NaN/inf
    in the compared output where the reference is finite (`bad`) scores worst: SQNR -inf,
    cosine 0, max error inf, and its row counts as a top-1 disagreement."""

    sig: float = 0.0
    noise: float = 0.0
    dot: float = 0.0
    nb: float = 0.0
    maxerr: float = 0.0
    agree: int = 0
    rows: int = 0
    classifier: bool = True
    bad: int = 0
    near: int = 0  # rows whose float top-1 lead is a near-tie (NEAR_TIE)
    agree_decisive: int = 0  # agreeing rows among the others
    ref_bad: int = 0  # elements where the reference is NaN/inf (left out)
    values: int = 0  # elements compared, those included
    risk_decisive: float = 0.0  # the sum of their flip risks (flip_exposure)
    #: rows are samples, whose flip risks give the expected agreement; False for a sequence's
    #: frames (no risk read: a CTC recognizer's frames flip without changing the text)
    samples: bool = True
    #: the output holds decisions (the class indices an ArgMax or TopK wrote): its agreement is
    #: the share of elements equal to float's (each one a decision; no scores, no flip risk)
    decisions: bool = False
    #: the output holds probabilities (a Softmax wrote it): no quiet part is read from its
    #: classes (those near 0 are quiet by what they say, not by a scale of their own)
    probabilities: bool = False
    #: float's top-1 class on the first row compared, and whether another row's differs
    first_top: int = -1
    top_varies: bool = False
    pairs: int = 0
    #: pairs whose shapes differ (a detector's box count after NMS): no element-wise error is
    #: defined between them, so they add to no sum; a decision output compares what both hold
    shape_changed: int = 0
    #: each element's sum over the samples (rows of axis 0) and their count, for the output's
    #: variation across samples (`variation_sqnr_db`); None once a sample's shape differs
    esum: np.ndarray | None = None
    en: int = 0
    eshape_varies: bool = False
    #: per axis (from 1) of at most PART_MAX_CHANNELS channels: each channel's signal and noise
    #: power over the other axes and the samples (`quiet_part`); an axis whose length changes
    #: between samples is dropped
    chan: dict[int, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    chan_dropped: set[int] = field(default_factory=set)
    #: the rank of the samples `chan` was read from (0: none yet, -1: several)
    rank: int = 0
    #: per axis: each channel's least and greatest signal power in one sample (row of axis 0)
    chan_range: dict[int, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # a decision output is judged by its equal elements whatever op wrote it (a frame
        # count a Div computed is no value output: it was reported as "0.0% of 0")
        if self.decisions:
            self.classifier = True

    def update(self, ref: np.ndarray, got: np.ndarray) -> "ErrorStats":
        ref, got = np.asarray(ref), np.asarray(got)
        self.pairs += 1
        if ref.shape != got.shape:
            return self._changed(ref, got)
        r, q = ref.astype(np.float64), got.astype(np.float64)
        ref_ok = np.isfinite(r)
        broken = ref_ok & ~np.isfinite(q)
        self.bad += int(np.count_nonzero(broken))
        self.values += r.size
        self.ref_bad += r.size - int(np.count_nonzero(ref_ok))
        finite = ref_ok & ~broken
        r, q = np.where(finite, r, 0.0), np.where(finite, q, 0.0)  # zeros add nothing to a sum
        self.sig += float(np.sum(r * r))
        self.noise += float(np.sum((r - q) ** 2))
        self._channels(r, q)
        if r.ndim and not self.eshape_varies:
            if self.esum is None:
                self.esum = r.sum(axis=0)
            elif self.esum.shape == r.shape[1:]:
                self.esum += r.sum(axis=0)
            else:  # samples of another shape: no element is the same element across them
                self.esum, self.eshape_varies = None, True
            self.en += r.shape[0]
        self.dot += float(np.sum(r * q))
        self.nb += float(np.sum(q * q))
        if r.size:
            self.maxerr = max(self.maxerr, float(np.max(np.abs(r - q))))
        if self.decisions:
            self.agree += int(np.count_nonzero(ref == got))
            self.rows += ref.size
        elif ref.ndim == 2 and ref.shape[1] > 1:
            # a row where float's own scores hold NaN/inf has no top-1 to agree with: left out
            # (two NaN rows "agreed" on class 0, and an all-NaN output read 100 %)
            ok = np.all(ref_ok, axis=1)
            top = np.argmax(ref, 1)
            same = top == np.argmax(got, 1)
            same &= ~np.any(broken.reshape(ref.shape), axis=1) & ok
            top2 = np.partition(r, -2, axis=1)[:, -2:]
            near = ((top2[:, 1] - top2[:, 0]) <= NEAR_TIE * (np.abs(top2[:, 1]) + np.abs(top2[:, 0]))) & ok
            self.agree += int(np.sum(same))
            self._tops(top[ok])
            self.near += int(np.sum(near))
            self.agree_decisive += int(np.sum(same & ~near))
            if self.samples:
                risk = np.where(ok, flip_exposure(got, ref).risk, 0.0)
                self.risk_decisive += float(np.sum(risk[~near & ok]))
            self.rows += int(np.count_nonzero(ok))
        else:
            self.classifier = False
        return self

    def _tops(self, top: np.ndarray) -> None:
        """Note whether float's top-1 class varies over the rows seen (`top_varies`)."""
        if self.top_varies or not top.size:
            return
        if self.first_top < 0:
            self.first_top = int(top[0])
        self.top_varies = bool(np.any(top != self.first_top))

    def _channels(self, r: np.ndarray, q: np.ndarray) -> None:
        """Add each axis's per-channel signal and noise powers (see `chan`)."""
        if r.ndim < 2 or r.size == 0:
            return
        self.rank = r.ndim if self.rank in (0, r.ndim) else -1  # -1: samples of several ranks
        e2 = (r - q) ** 2
        s2 = r * r
        for axis in range(1, r.ndim):
            n = r.shape[axis]
            if axis in self.chan_dropped or not 2 <= n <= PART_MAX_CHANNELS:
                continue
            inner = tuple(a for a in range(1, r.ndim) if a != axis)
            had = self.chan.get(axis)
            if had is not None and had[0].shape != (n,):
                del self.chan[axis]
                self.chan_range.pop(axis, None)
                self.chan_dropped.add(axis)
                continue
            per = s2.sum(axis=inner)  # (samples, channels)
            s, e = per.sum(axis=0), e2.sum(axis=inner).sum(axis=0)
            self.chan[axis] = (s, e) if had is None else (had[0] + s, had[1] + e)
            lo, hi = per.min(axis=0), per.max(axis=0)
            was = self.chan_range.get(axis)
            self.chan_range[axis] = (lo, hi) if was is None else (np.minimum(was[0], lo), np.maximum(was[1], hi))

    def quiet_parts(self) -> list[QuietPart]:
        """The quiet part (`quiet_part`) of each axis whose channels split into two scales; for
        an output of rank 2 (rows of K quantities), else the columns far below the loudest
        (`spread_part`)."""
        out = []
        for axis, (sg, ns) in sorted(self.chan.items()):
            p = quiet_part(sg, ns, axis, PART_GAP, *self.chan_range[axis])
            if p is None and axis == 1 and self.rank == 2:
                p = spread_part(sg, ns, axis)
            if p is not None:
                out.append(p)
        return out

    def quiet_part(self) -> QuietPart | None:
        """The quietest part (lowest SQNR) over the axes whose channels split into two scales
        (`quiet_parts`); None where none does, or where the whole output is already worse."""
        parts = self.quiet_parts()
        if not parts or self.bad:
            return None
        worst = min(parts, key=lambda p: p.sqnr_db)
        return worst if worst.sqnr_db < self.sqnr_db else None

    def _changed(self, ref: np.ndarray, got: np.ndarray) -> "ErrorStats":
        """A pair of different shapes: a decision output's leading rows are compared as far as
        both hold them (selected boxes in score order), every other row counts as changed;
        class-score rows count as disagreeing."""
        self.shape_changed += 1
        if self.decisions:
            self.rows += max(ref.size, got.size)
            if ref.ndim == got.ndim >= 1 and ref.shape[1:] == got.shape[1:]:
                k = min(ref.shape[0], got.shape[0])
                self.agree += int(np.count_nonzero(ref[:k] == got[:k]))
        elif ref.ndim == 2 and ref.shape[1] > 1:
            self.rows += ref.shape[0]
        return self

    @property
    def sqnr_db(self) -> float:
        """10*log10(signal / noise): inf without noise, -inf for noise on a zero signal, for
        any NaN/inf where the reference is finite, or when no pair had float's shape."""
        if self.bad or (self.pairs and self.shape_changed == self.pairs):
            return -math.inf
        if self.noise == 0.0:
            return math.inf
        if self.sig == 0.0:
            return -math.inf
        return 10.0 * math.log10(self.sig / self.noise)

    @property
    def variation_sqnr_db(self) -> float | None:
        """10*log10(variation / noise), the variation being each element's spread around its
        mean over the samples: the SQNR of what the output says about each input. An output
        on a large offset (kelvins, absolute positions) has an SQNR the offset inflates; this
        one is not. None without MIN_VARIATION_SAMPLES samples of one shape, or no variation."""
        if self.esum is None or self.en < MIN_VARIATION_SAMPLES or self.bad:
            return None
        var = self.sig - float(np.sum(self.esum * self.esum)) / self.en
        if not var > 1e-12 * self.sig:
            return None
        return math.inf if self.noise == 0.0 else 10.0 * math.log10(var / self.noise)

    @property
    def cosine(self) -> float:
        """Cosine similarity (1.0 for two all-zero outputs, 0.0 when only one is or when the
        output has NaN/inf where the reference is finite)."""
        if self.bad or (self.pairs and self.shape_changed == self.pairs):
            return 0.0
        if self.sig == 0.0 or self.nb == 0.0:
            return float(self.sig == self.nb)
        return self.dot / math.sqrt(self.sig * self.nb)

    def result(self, name: str) -> OutputMetrics:
        top1 = self.agree / self.rows if self.classifier and self.rows else None
        decisive = self.rows - self.near if self.classifier and not self.decisions else 0
        return OutputMetrics(name, self.sqnr_db, float(self.cosine),
                             math.inf if self.bad else self.maxerr, top1,
                             self.agree_decisive / decisive if decisive else None, decisive,
                             self.rows if self.classifier else 0,
                             1.0 - self.risk_decisive / decisive if decisive and self.samples else None,
                             self.decisions, self.shape_changed, self.pairs, self.variation_sqnr_db,
                             None if self.decisions or (top1 is not None and self.probabilities)
                             else self.quiet_part(),
                             self.ref_bad, self.values, self.probabilities,
                             top1 is not None and not self.decisions and not self.top_varies)


@dataclass
class Comparison:
    """Metrics of every output, plus label accuracy when labels were given."""

    outputs: list[OutputMetrics] = field(default_factory=list)
    accuracy_float: float | None = None
    accuracy_quant: float | None = None
    samples: int = 0

    def first(self) -> OutputMetrics:
        return self.outputs[0]


#: Ops that carry an output's values from the op that computed them, unchanged.
_CARRIERS = ("QuantizeLinear", "DequantizeLinear", "Identity", "Reshape", "Flatten", "Squeeze",
             "Unsqueeze", "Cast")


class Writer(NamedTuple):
    """The node that computed a graph output's values, which of its outputs it is, and whether
    a reshape lay between (the axes may have moved)."""

    node: onnx.NodeProto
    slot: int
    reshaped: bool


def output_writers(model: onnx.ModelProto) -> dict[str, Writer]:
    """Graph output -> its `Writer`, looked through the ops that carry values unchanged (Q/DQ,
    casts, reshapes: `_CARRIERS`); outputs no node writes (inputs, constants) are left out."""
    producer = {o: (n, k) for n in model.graph.node for k, o in enumerate(n.output)}
    out = {}
    for o in model.graph.output:
        n, k = producer.get(o.name, (None, 0))
        reshaped = False
        while n is not None and n.op_type in _CARRIERS and n.input:
            reshaped |= n.op_type in ("Reshape", "Flatten", "Squeeze", "Unsqueeze")
            n, k = producer.get(n.input[0], (None, 0))
        if n is not None:
            out[o.name] = Writer(n, k, reshaped)
    return out


def class_score_outputs(model: onnx.ModelProto) -> dict[str, int]:
    """Graph outputs written by a Softmax/LogSoftmax, and the axis their classes lie along (-1:
    the last): over the last axis through Q/DQ nodes, casts and reshapes, whatever the rank (a
    CTC recognizer's (B, T, C); an opset-12 Softmax(axis=2) upgraded to Reshape -> Softmax ->
    Reshape); over another axis only where no reshape lies between, as a segmentation model's
    per-pixel classes (N, C, H, W) over axis 1."""
    ranks = {v.name: len(v.type.tensor_type.shape.dim) for v in [*model.graph.value_info, *model.graph.output]
             if v.type.tensor_type.HasField("shape")}
    out = {}
    for o, (n, _, reshaped) in output_writers(model).items():
        if n.op_type in ("Softmax", "LogSoftmax"):
            axis = next((a.i for a in n.attribute if a.name == "axis"), -1)
            rank = ranks.get(n.output[0])
            if axis == -1 or (rank is not None and axis == rank - 1):
                out[o] = -1
            elif not reshaped and rank is not None and -rank <= axis < rank:
                out[o] = axis % rank
    return out


def decision_outputs(model: onnx.ModelProto) -> set[str]:
    """Graph outputs that hold decisions: class indices written by an ArgMax / ArgMin, or the
    indices output of a TopK (through casts and reshapes), and every integer or boolean output
    (the boxes a NonMaxSuppression selected, counts, masks). Their SQNR says nothing (class 3
    for class 4 is a small error in value, a whole one in meaning), so the guard judges them by
    the share of elements equal to float's."""
    written = {o for o, w in output_writers(model).items()
               if w.node.op_type in ("ArgMax", "ArgMin") or (w.node.op_type == "TopK" and w.slot == 1)}
    return written | {o.name for o in model.graph.output
                      if o.type.tensor_type.elem_type and not is_float_type(o.type.tensor_type.elem_type)}


#: Ops whose output, even of rank 2, holds no class scores: normalized embeddings (Div by a norm
#: or a token count, LpNormalization), BERT's Tanh pooler, joined values (Concat: boxes and
#: scores side by side), and independent probabilities (Sigmoid: a multi-label head, a VAE's
#: pixels; each is thresholded on its own, an argmax across them decides nothing: a VAE
#: reconstruction at MXFP8, 33 dB on fresh samples, read 93.8 % "agreement" and broken). An
#: argmax over an embedding's dimensions decides nothing either. Not the Reduce* ops: a global
#: average pool (ReduceMean over H and W) writes a classifier's logits (the guard sweep's U-Net;
#: its U8S8 likely-loss warning went when ReduceMean was listed).
_VALUE_WRITERS = frozenset({"Div", "LpNormalization", "Tanh", "Concat", "Sigmoid", "HardSigmoid"})


def value_outputs(model: onnx.ModelProto) -> set[str]:
    """Graph outputs judged by SQNR whatever their rank, never by a top-1 agreement: those a
    `_VALUE_WRITERS` op wrote, and a TopK's values (sorted along their last axis, so column 0
    is every row's top-1 by construction and an agreement on it is 100 % whatever the model
    does), and the rows a gather picks by indices a selection computed (`_selected_by`). A
    sentence embedding, L2-normalized in the graph, read "top-1 agreement 87.5 %"
    over its 384 dimensions at A8W8 (cosine 0.975) and was called broken."""
    producer = {o: n for n in model.graph.node for o in n.output if o}
    return {o for o, w in output_writers(model).items()
            if (w.node.op_type == "TopK" and w.slot == 0) or w.node.op_type in _VALUE_WRITERS
            or _selected_by(w.node, producer) is not None}


#: Ops whose output picks elements by the data: which boxes survive, which classes rank first
_SELECTORS = frozenset({"NonMaxSuppression", "TopK", "ArgMax", "ArgMin", "NonZero"})
#: Ops that read a tensor's elements at indices (or a mask) given as their second input
_GATHERS = frozenset({"Gather", "GatherElements", "GatherND", "Compress"})


def _selected_by(node: onnx.NodeProto, producer: Mapping[str, onnx.NodeProto], depth: int = 16) -> str | None:
    """The `_SELECTORS` op type whose output reaches `node`'s indices when `node` is a gather
    (the boxes a NonMaxSuppression kept, gathered from every candidate), else None. Such an
    output's rows follow the selection: an argmax over a box's four coordinates decides
    nothing (a detector with NMS in its graph read "top-1 agreement 85.6 %" on its kept boxes at
    A8W8 and was called broken, its selection 91.9 % equal to float's)."""
    if node.op_type not in _GATHERS or len(node.input) < 2:
        return None
    seen: set[int] = set()  # nodes by identity: names may be empty
    frontier = [node.input[1]]
    for _ in range(depth):
        nxt: list[str] = []
        for t in frontier:
            p = producer.get(t)
            if p is None or id(p) in seen:
                continue
            if p.op_type in _SELECTORS:
                return p.op_type
            seen.add(id(p))
            nxt.extend(i for i in p.input if i)
        frontier = nxt
    return None


def _loaded(model, role: str, **kw):
    """`make_session`, with a ModelError naming the model (`role`) where onnxruntime refuses it."""
    try:
        return make_session(model, **kw)
    except Exception as exc:  # noqa: BLE001 - onnxruntime raises its own exception types
        raise ModelError(f"the {role} model does not load in onnxruntime: {exc}. Both models are run "
                         "in stock onnxruntime; a model from a newer exporter (IR version or opset "
                         "above what this onnxruntime supports) can be converted down, or run with a "
                         "newer onnxruntime.") from exc


def compare(float_model, quant_model, feeds: Iterable[dict[str, np.ndarray]], *,
            labels: np.ndarray | None = None, optimize: bool = True, output_index: int | None = None,
            float_session=None, threads: int | None = None) -> Comparison:
    """Run both models on `feeds` and compare their outputs (ModelError where one does not load
    in onnxruntime, DataError where the quantized model lacks one of the float model's outputs)."""
    fs = float_session or _loaded(float_model, "float", optimize=True, threads=threads)
    qs = _loaded(quant_model, "quantized", optimize=optimize, threads=threads)
    names = [o.name for o in fs.get_outputs()]
    q_names = [o.name for o in qs.get_outputs()]
    missing = [n for n in names if n not in q_names]
    if missing:
        raise DataError(f"the quantized model has no output {missing[0]!r} of the float model's "
                        f"{', '.join(map(repr, names))} (it has {', '.join(q_names)}): "
                        "compare a model with its own quantized version.")
    if output_index is not None:
        names = [names[output_index]]
    # what each output holds, read from the quantized graph where it is at hand
    decisions = decision_outputs(quant_model) if isinstance(quant_model, onnx.ModelProto) else set()
    values = value_outputs(quant_model) if isinstance(quant_model, onnx.ModelProto) else set()
    probs = class_score_outputs(quant_model) if isinstance(quant_model, onnx.ModelProto) else {}
    accs = {n: ErrorStats(decisions=n in decisions, classifier=n not in values, probabilities=n in probs)
            for n in names}
    correct_f = correct_q = seen = 0
    for feed in feeds:
        ref = fs.run(names, feed)
        got = qs.run(names, feed)
        for n, r, q in zip(names, ref, got):
            accs[n].update(r, q)
        if labels is not None:
            b = ref[0].shape[0]
            lab = labels[seen:seen + b]
            correct_f += int(np.sum(np.argmax(ref[0], 1) == lab))
            correct_q += int(np.sum(np.argmax(got[0], 1) == lab))
        seen += next(iter(feed.values())).shape[0] if feed else 0
    cmp = Comparison([accs[n].result(n) for n in names], samples=seen)
    if labels is not None and seen:
        cmp.accuracy_float, cmp.accuracy_quant = correct_f / seen, correct_q / seen
    return cmp


def sqnr_between_optimization_levels(quant_model, feeds: Iterable[dict[str, np.ndarray]]) -> float:
    """SQNR (dB) of the model run with optimizations disabled vs with default optimizations.

    A low value means onnxruntime's fused kernels compute something different from the QDQ
    semantics (e.g. int8 saturation on CPUs without VNNI)."""
    a = make_session(quant_model, optimize=False)
    b = make_session(quant_model, optimize=True)
    acc = ErrorStats()
    name = a.get_outputs()[0].name
    for feed in feeds:
        acc.update(a.run([name], feed)[0], b.run([name], feed)[0])
    return acc.result(name).sqnr_db
