"""Numerics-aware plan policies: activation tensors a uniform grid would ruin, found from the
prepared graph and the calibration statistics, kept float with the reason in the plan.

Each detector is a pure function returning {tensor: reason}:

- `sentinel_tensors` (a): the range is set by a few huge values (additive attention masks of
  -1e4 .. -3.4e38, padding sentinels): the scale they force rounds every real value to 0; or
  the tensor holds -inf / inf / NaN (a causal mask of -inf), which no grid represents.
- `small_value_inputs` (b): inputs of ops whose output depends on the relative precision of
  small values (Log, Reciprocal, Sqrt, Pow with a negative or fractional exponent, the divisor
  of Div): a grid that rounds small values to 0 sends them to -inf / inf, or to 0 where a root
  would have lifted them.
- `cancellation_inputs` (c): inputs of a Sub/Add whose output is far smaller than its inputs
  (E[x^2] - E[x]^2): the inputs' rounding error is the whole result.
- `concat_range_outputs` (d): a Concat joining ranges more than a factor apart (boxes 0..640
  with probabilities 0..1): one grid for the output leaves the small input a code or two.
- `outlier_tensors` (f): the range is set by rare outliers far above the bulk (a transformer's
  outlier features in its residual stream and FFN outputs): on the planned integer grid the
  99th percentile of the magnitudes gets fewer than a few codes. Clipping the outliers is no
  remedy: the model computes with them.
- `overflow_tensors` (g): activations cast to a float format (bf16, fp16) whose calibrated
  range passes the format's largest finite value (a -3.4e38 mask in bf16, 1e5 in fp16): the
  cast makes them inf, and a Softmax over a fully masked row NaN; or whose bulk sits under its
  smallest normal value (an SI-unit input of 1e-9 in fp16), where the cast rounds to
  subnormals or 0 (`cast_sqnr_db` under `CAST_MIN_DB`). `overflow_constants` the same for
  weights and constants. (c), (g), (h) and (i) read the casts' statistics too (collected
  when calibration data is given); (a), (b), (d) and (f) judge scaled formats (and (b) block
  formats) only.
- `phase_tensors` (h): tensors on the way to a Sin / Cos (a timestep or rotary position
  embedding computed at run time: positions times frequencies), or to a Floor / Ceil / Round (a
  feature bucketized in the graph), whose grid spacing, carried to the phase, is a sizeable
  part of a period or of the unit step: a position of 2000 on an int8 grid moves by 16
  radians, and bf16 spaces 2000 by 8. Every format counts (int, the casts, block formats): the
  spacing at a value is what a period sees, not the relative error.
- `rescaled_inputs` (i): inputs of a Mul / Div by a constant whose largest factor blows the
  input's grid spacing up past a quarter of the output rms (channels of unlike units on one
  grid, each given its own scale right after).
- `channel_scale_outputs` (j): graph outputs with channels (axis 1) far below the loudest one
  in the calibration data (a regression head's first target 80x its others, or targets on
  scales 1 to 64): one grid leaves the quiet channels a few codes, and a rank-2 output's
  argmax, which one loud channel always wins, hides it. Read from the per-channel ranges the
  calibration pass collects for the outputs `channel_axes` names.
- `op_scope_notes` (e): quantized nodes that no integer kernel executes (informational).

`apply_numerics` applies (a)-(d) and (f)-(j) to a plan.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, replace

import numpy as np
import onnx

from ..calibration.stats import TensorStats
from ..formats import get_format
from ..formats.integer import IntFormat
from ..graph import GraphIndex, is_float_type
from .memo import StatsMemo
from .ops import COMPUTE_OPS, semantics
from .plan import PrecisionPlan, TensorPrecision

#: (a) an empty gap of this many binades below the largest values marks a sentinel cluster
SENTINEL_GAP_LOG2 = 8
#: (a) without a gap: 99.9% of the non-zero values this many binades below the absmax
SENTINEL_BULK_LOG2 = 12
#: (a) the gap rule needs a sentinel-sized absmax (-1e4, -1e9, -3.4e38): softmax outputs have
#: gaps too (probabilities of 1e-17), harmless to round
SENTINEL_MIN_LOG2 = 10
#: (a) magnitudes from here up are float-limit sentinels, never real activations (2^100 ~ 1e30)
SENTINEL_ABS_LOG2 = 100
#: (b) upstream tensors with this share of values 2^SMALL_LOG2 below the absmax stay float too
SMALL_SHARE = 0.10
SMALL_LOG2 = 8
#: (b) and a planned upstream tensor whose grid `root_output_sqnr_db` predicts to leave the root
#: op's output under this SQNR (a running sum of energies into a Log: its early steps are a few
#: codes of a grid sized for the last), whatever its share of tiny values
SMALL_MIN_DB = 20.0
#: (b) how many computing ops back from a root the walk looks (data movement does not count)
SMALL_WALK_DEPTH = 8
#: element-wise data movement: each output element is one input element (the walks below follow it)
_MOVES = frozenset({"Identity", "Reshape", "Unsqueeze", "Squeeze", "Flatten", "Transpose", "Expand",
                    "Tile", "Slice", "Gather", "Concat", "Split"})
#: (b) ops that only move data (`SMALL_WALK_DEPTH` does not count them)
_MOVES_DATA = _MOVES | {"Pad", "DepthToSpace", "SpaceToDepth"}
#: (b) ops that pass each element's relative rounding error on to one output element unchanged
#: (data movement, an added epsilon, a scale): the predicted-SQNR rule follows them only; a sum
#: (CumSum, MatMul, a Reduce) averages its terms' errors, and its inputs are left to the share rule
_RELATIVE_KEEP_OPS = _MOVES | {"Cast", "Neg", "Abs", "Relu", "Add", "Sub", "Mul", "Div", "Max", "Clip"}
#: (b) the error, in nepers, of a Log whose input rounded to 0: its epsilon's log, or -inf,
#: in place of the value's (4: a factor of 55)
LOG_LOST = 4.0
#: (c) output rms this many times below the larger input rms is a cancellation
CANCEL_RATIO = 8.0
#: (i) a grid spacing at the input's absmax above 1/this of the output rms is too coarse (what
#: CANCEL_RATIO allows an int8 grid on a bell-shaped input, absmax ~4 rms)
RMS_STEPS = 4.0
#: (d) input absmax ratio above which a Concat output is kept float
CONCAT_RATIO = 16.0

#: (f) fewer codes than this for the 99th percentile of |x| on the planned grid (a rounding
#: error above 10% of the value for all but the largest 1%): outliers set the range
OUTLIER_MIN_CODES = 5.0
OUTLIER_QUANTILE = 0.99
#: (f) and the absmax at least this many times the quantile: on a 4-bit grid (7 codes) a plain
#: bell-shaped tensor already leaves its 99th percentile under 5 codes without any outlier
OUTLIER_MIN_RATIO = 8.0

#: (h) the codes a phase's period must get at least: a Sin / Cos output off by at most 0.012
#: (about 40 dB, what a 16-bit grid gives the rest of a model), a Floor flipping at most 1 in
#: 512 of its inputs; an int8 grid allows phases up to 3, int16 up to 800. What it keeps float
#: is small: positions, timesteps, a bucketized feature
PHASE_CODES = 256.0
#: (h) periodic and step ops, whose output error follows the input's absolute error at any
#: magnitude, and the period it is measured against: Sin / Cos / Tan a turn (Tan half), Floor /
#: Ceil / Round a unit step (a feature bucketized as Floor(age / 10) moves to the next bucket)
PERIODIC_OPS: dict[str, float] = {"Sin": 2 * math.pi, "Cos": 2 * math.pi, "Tan": math.pi,
                                  "Floor": 1.0, "Ceil": 1.0, "Round": 1.0}
#: (h) ops that carry an operand's rounding error to their output scaled, not averaged away:
#: data movement, casts and element-wise arithmetic (MatMul / Gemm only as an outer product
#: with a constant, positions times a frequency row: a layer's sum averages its inputs' errors)
_PHASE_WALK_OPS = _MOVES | {"Cast", "Neg", "Mul", "Div", "Add", "Sub", "MatMul", "Gemm"}

#: (g) the least SQNR a plain cast (fp16, bf16) may leave on a tensor: casts keep 50 dB (bf16)
#: to 70 dB (fp16) on values in their normal range; a tensor of 1e-6 in fp16 keeps 35 dB, one
#: of 1e-9 nothing (an SI-unit input: farads, metres)
CAST_MIN_DB = 40.0

#: (j) the fewest codes of a graph output's grid that each of its channels' absmax must get
CHANNEL_MIN_CODES = 8.0
#: (j) outputs with more channels than this along axis 1 get no per-channel ranges (positions)
CHANNEL_MAX = 4096

POLICIES = ("sentinel", "small_values", "cancellation", "concat", "outliers", "overflow", "phase", "rescaled",
            "channels")


def cast_limit(fmt: str) -> float | None:
    """The largest finite value of a float format applied as a plain cast (bf16, fp16), where
    it is below float32's; None for every other format (scaled formats have a scale for that)."""
    f = get_format(fmt)
    if f.kind != "float" or f.needs_qparams:
        return None
    limit = float(getattr(f, "max_normal", math.inf))
    return limit if limit < float(np.finfo(np.float32).max) else None


def cast_sqnr_db(fmt: str, v: np.ndarray, cnt: np.ndarray) -> float:
    """The SQNR a plain cast to float format `fmt` (fp16, bf16) leaves on magnitudes `v` (> 0)
    counted `cnt` times: a value rounds by its binade's spacing, which stops shrinking at the
    smallest normal (subnormals share the smallest one), and one under half the smallest
    subnormal becomes 0 (all of it lost). Values past the largest finite value are (g)'s other
    half, not counted here."""
    f = get_format(fmt)
    mant = int(getattr(f, "mantissa_bits"))
    min_exp = int(getattr(f, "min_exp"))
    v = v.astype(np.float64)
    c = cnt.astype(np.float64)
    step = np.ldexp(1.0, np.maximum(np.floor(np.log2(v)), min_exp).astype(np.int64) - mant)
    noise = np.where(v < float(getattr(f, "min_subnormal")) / 2, v * v, np.minimum(step * step / 12.0, v * v))
    lw = 2.0 * np.log(v)  # powers scaled by the largest: no underflow of v ** 2 in float64 sums
    w = np.exp(lw - lw.max())
    signal = float(np.sum(c * w))
    err = float(np.sum(c * w * noise / (v * v)))
    return math.inf if err <= 0.0 else 10.0 * math.log10(signal / err)


def reaches_below_float32(fmt: str) -> bool:
    """Whether float format `fmt`'s smallest normal value is above float32's (fp16: 6.1e-5)."""
    return float(getattr(get_format(fmt), "min_normal", 0.0)) > float(np.finfo(np.float32).tiny)


def underflow_db(fmt: str, v: np.ndarray, cnt: np.ndarray) -> float | None:
    """(g) The `cast_sqnr_db` of magnitudes `v` (counted `cnt` times) where it is under
    `CAST_MIN_DB`, else None: their bulk sits so far below `fmt`'s smallest normal that the cast
    loses them. Values that are denormal in float32 itself count for nothing: runtimes flush
    them to 0 (a pruned weight's leftovers of 1e-39)."""
    keep = (v >= float(np.finfo(np.float32).tiny)) & np.isfinite(v)
    if not np.any(keep):
        return None
    db = cast_sqnr_db(fmt, v[keep], cnt[keep])
    return db if db < CAST_MIN_DB else None


def _underflow_reason(fmt: str, v: np.ndarray, cnt: np.ndarray, what: str) -> str | None:
    """(g) Why `what` (magnitudes `v` counted `cnt` times) cannot be cast to `fmt` (`underflow_db`),
    or None."""
    db = underflow_db(fmt, v, cnt)
    if db is None:
        return None
    tiny = float(getattr(get_format(fmt), "min_normal"))
    return (f"under {fmt}'s range: {what} sits below its smallest normal value {tiny:.3g}, where the cast "
            f"rounds to subnormals or 0 (a predicted {max(db, -99.0):.1f} dB SQNR, under the "
            f"{CAST_MIN_DB:.0f} dB a cast keeps on values in its range)")


def _cast_limits(tp: TensorPrecision) -> list[tuple[str, float]]:
    out: list[tuple[str, float]] = []
    for f in dict.fromkeys(tp.formats()):
        limit = cast_limit(f)
        if limit is not None:
            out.append((f, limit))
    return out


def overflow_tensors(plan: PrecisionPlan, stats: dict[str, TensorStats]) -> dict[str, str]:
    """(g) Activations cast to bf16 / fp16 whose finite calibrated values pass the format's
    largest finite value. Infinities already in float stay infinities in the cast: not flagged."""
    out: dict[str, str] = {}
    for name, st in stats.items():
        tp = plan.tensors.get(name)
        if tp is None or tp.role != "activation" or not st.count:
            continue
        absmax = max(abs(st.min), abs(st.max))
        for fmt, limit in _cast_limits(tp):
            if math.isfinite(absmax) and absmax > limit:
                out[name] = (f"beyond {fmt}'s range: |x| reaches {absmax:.4g}, over its largest finite "
                             f"value {limit:.4g}; the cast makes it inf (a fully masked row's Softmax "
                             "then gives NaN)")
                break
            if not reaches_below_float32(fmt):
                continue  # bf16: float32's exponents, nothing under its range that float32 holds
            lo, hi, cnt = st.abs_bins()
            why = _underflow_reason(fmt, np.sqrt(lo * hi), cnt, f"the bulk of |x| (up to {absmax:.3g})")
            if why:
                out[name] = why
                break
    return out


def overflow_constants(plan: PrecisionPlan, model: onnx.ModelProto) -> dict[str, str]:
    """(g) Weights and constants cast to bf16 / fp16 holding finite values past the format's
    largest finite value (a mask constant of float32's lowest value); data on disk is not read."""
    inits = {t.name: t for t in model.graph.initializer}
    out: dict[str, str] = {}
    for name, tp in plan.tensors.items():
        if tp.role not in ("weight", "constant") or name not in inits or tp.reason == "tensor override":
            continue
        limits = _cast_limits(tp)
        if not limits or inits[name].data_location == onnx.TensorProto.EXTERNAL:
            continue
        v = onnx.numpy_helper.to_array(inits[name])
        if v.dtype.kind != "f" or not v.size:
            continue
        finite = np.abs(v[np.isfinite(v)]).astype(np.float64)
        big = float(finite.max(initial=0.0))
        fmt, limit = limits[0]
        if big > limit:
            out[name] = (f"beyond {fmt}'s range: the constant holds {int(np.count_nonzero(finite > limit))} "
                         f"value(s) up to {big:.4g}, over its largest finite value {limit:.4g}; the cast "
                         "makes them inf")
            continue
        if reaches_below_float32(fmt):
            why = _underflow_reason(fmt, finite, np.ones_like(finite), f"the constant (|x| up to {big:.3g})")
            if why:
                out[name] = why
    return out


@dataclass(frozen=True)
class Finding:
    """One tensor a policy keeps float (or a node note), and why."""

    tensor: str
    policy: str
    reason: str
    #: the format the tensor is kept in: float (as it came), or a 16-bit float for a weight
    #: under kept_weights='half'
    kept: str = "float"


def _rms(st: TensorStats) -> float:
    lo, hi, cnt = st.abs_bins()
    if not cnt.size:
        return 0.0
    mid = (lo + hi) / 2
    return float(math.sqrt(float(np.sum(cnt * mid * mid)) / float(np.sum(cnt))))


def sentinel_tensors(stats: dict[str, TensorStats], *, gap_log2: int = SENTINEL_GAP_LOG2,
                     bulk_log2: int = SENTINEL_BULK_LOG2, memo: StatsMemo | None = None) -> dict[str, str]:
    """(a) Tensors holding +-inf or NaN in calibration (a -inf attention mask), and tensors
    whose range is set by a few huge values: an empty gap of `gap_log2` binades
    or more between a cluster at the absmax and at least 1% of the non-zero values below it (an
    additive mask: real scores, then -1e4 or -3.4e38), a float-limit magnitude (>= 2^100), or
    99.9% of the non-zero values more than 2^bulk_log2 below the absmax. Tensors within
    [0, 1] (probabilities, gates) are skipped: their small values are small in absolute terms.
    `memo`: each tensor's verdict is a function of its statistics alone."""
    out: dict[str, str] = {}
    for name, st in stats.items():
        why = (_sentinel_reason(st, gap_log2, bulk_log2) if memo is None else
               memo.get(st, ("sentinel", gap_log2, bulk_log2), lambda: _sentinel_reason(st, gap_log2, bulk_log2)))
        if why is not None:
            out[name] = why
    return out


def _sentinel_reason(st: TensorStats, gap_log2: int, bulk_log2: int) -> str | None:
    """`sentinel_tensors`' verdict on one tensor (None: not a sentinel)."""
    if st.inf_count or st.nan_count:
        # no grid holds them: integer codes saturate -inf to a finite value (a -inf attention
        # mask would stop masking), a block format turns the whole block into NaN
        what = " and ".join(f"{n} {k}" for n, k in ((st.inf_count, "infinite"), (st.nan_count, "NaN"))
                            if n)
        return (f"additive mask / sentinel: holds {what} value(s) of {st.count} calibrated "
                "(a -inf mask); a quantized grid cannot represent them")
    if st.empty or (st.min >= 0.0 and st.max <= 1.0):
        return None
    amax = st.absmax
    lo, hi, cnt = st.abs_bins()
    nz = lo > 0  # exact zeros (what a mask leaves unmasked, ReLU's zeros) are not counted
    lo, hi, cnt = lo[nz], hi[nz], cnt[nz]
    if cnt.size == 0:
        return None
    nonzero = float(np.sum(cnt))
    gap, i = 0.0, -1
    if cnt.size > 1:  # the widest gap between consecutive non-empty bins (ascending)
        ratios = np.log2(lo[1:] / np.maximum(hi[:-1], np.finfo(np.float64).tiny))
        i = int(np.argmax(ratios))
        gap = float(ratios[i])
    lower = float(np.sum(cnt[:i + 1])) if i >= 0 else 0.0
    below = float(np.sum(cnt[hi <= amax * 2.0 ** -bulk_log2]))
    if gap >= gap_log2 and lower >= 0.01 * nonzero and amax >= 2.0 ** SENTINEL_MIN_LOG2:
        k = int(math.floor(math.log2(amax / hi[i])))
        return (f"additive mask / sentinel: {100 * lower / nonzero:.1f}% of the non-zero values "
                f"lie 2^{k} below absmax ({amax:.3g}), which {100 - 100 * lower / nonzero:.2g}% set")
    if amax >= 2.0 ** SENTINEL_ABS_LOG2:
        return f"additive mask / sentinel: absmax {amax:.3g} is a float-limit value, not an activation"
    if below >= 0.999 * nonzero and below < nonzero:
        return (f"additive mask / sentinel: {100 * below / nonzero:.1f}% of the non-zero values "
                f"lie 2^{bulk_log2} below absmax ({amax:.3g})")
    return None


def nonfinite_initializers(model: onnx.ModelProto) -> dict[str, tuple[int, int]]:
    """{name: (non-finite values, size)} of the float initializers of `model` holding +-inf or
    NaN; initializers whose data stays on disk are not read. A property of the model alone, so
    a search computes it once for all its plans."""
    out: dict[str, tuple[int, int]] = {}
    for t in model.graph.initializer:
        if t.data_location == onnx.TensorProto.EXTERNAL:
            continue
        v = onnx.numpy_helper.to_array(t)
        if v.dtype.kind == "f":
            bad = v.size - int(np.count_nonzero(np.isfinite(v)))
            if bad:
                out[t.name] = (bad, v.size)
    return out


def nonfinite_constants(plan: PrecisionPlan, model: onnx.ModelProto,
                        nonfinite: dict[str, tuple[int, int]] | None = None) -> dict[str, str]:
    """(a) Planned weights and constants holding +-inf or NaN (a causal mask constant-folded to
    0 / -inf): no grid represents them (`nonfinite`: `nonfinite_initializers(model)`, when the
    caller has it)."""
    if nonfinite is None:
        nonfinite = nonfinite_initializers(model)
    out: dict[str, str] = {}
    for name, (bad, size) in nonfinite.items():
        tp = plan.tensors.get(name)
        if tp is None or tp.role not in ("weight", "constant") or not _gridded(tp, int_only=False) \
                or tp.reason == "tensor override":
            continue
        out[name] = (f"additive mask / sentinel: the constant holds {bad} non-finite value(s) of "
                     f"{size} (a -inf mask); a quantized grid cannot represent them")
    return out


def _scalar(inits: dict[str, onnx.TensorProto], name: str) -> float | None:
    t = inits.get(name)
    if t is None or t.data_location == onnx.TensorProto.EXTERNAL:
        return None
    v = onnx.numpy_helper.to_array(t)
    return float(v.reshape(-1)[0]) if v.size == 1 and v.dtype.kind in "fiu" else None


def small_share(st: TensorStats, log2_below: int = SMALL_LOG2) -> float:
    """Share of the non-zero values more than 2^log2_below below the absmax (what an 8-bit grid
    rounds to 0 or to its first code)."""
    return _share_under(st, st.absmax * 2.0 ** -log2_below)


def _share_under(st: TensorStats, bound: float) -> float:
    """Share of the non-zero values of `st` whose histogram bucket lies at or under `bound`."""
    lo, hi, cnt = st.abs_bins()
    nz = lo > 0
    total = float(np.sum(cnt[nz]))
    if total == 0.0:
        return 0.0
    return float(np.sum(cnt[nz & (hi <= bound)])) / total


def _small_value_roots(model: onnx.ModelProto, inits: dict[str, onnx.TensorProto]
                       ) -> list[tuple[str, str, float | None]]:
    """(b) The run-time inputs of Log, Reciprocal, Sqrt, Pow with a negative or fractional
    exponent (a root: x ** 0.3 compresses an audio feature) and the divisor of Div, each with
    what reads it and the power the op raises it to (None for Log)."""
    roots: list[tuple[str, str, float | None]] = []
    for n in model.graph.node:
        if n.domain not in ("", "ai.onnx"):
            continue
        name, what, power = None, "", None
        if n.op_type in ("Log", "Reciprocal", "Sqrt") and n.input:
            name, what = n.input[0], f"read by {n.op_type} {n.name!r}"
            power = {"Log": None, "Reciprocal": -1.0, "Sqrt": 0.5}[n.op_type]
        elif n.op_type == "Pow" and len(n.input) == 2:
            e = _scalar(inits, n.input[1])
            # a negative power sends 0 to inf; a fractional one lifts small values (1e-4 ** 0.3
            # is 0.06, where 0 ** 0.3 is 0): both need them
            if e is not None and e < 1 and e != 0:
                name, what, power = n.input[0], f"raised to {e:g} by Pow {n.name!r}", e
        elif n.op_type == "Div" and len(n.input) == 2:
            name, what, power = n.input[1], f"divisor of Div {n.name!r}", -1.0
        if name and name not in inits:
            roots.append((name, what, power))
    return roots


def _power_of_one(n: onnx.NodeProto, inits: dict[str, onnx.TensorProto]) -> float | None:
    """e where `n` raises one run-time tensor to a constant power e: x * x (2), Pow(x, e)."""
    if n.domain not in ("", "ai.onnx") or len(n.input) != 2:
        return None
    if n.op_type == "Mul" and n.input[0] == n.input[1] and n.input[0] not in inits:
        return 2.0
    if n.op_type == "Pow" and n.input[0] not in inits:
        e = _scalar(inits, n.input[1])
        return e if e is not None and e != 0 and math.isfinite(e) else None
    return None


def root_output_sqnr_db(st: TensorStats, step: float, power: float | None) -> float:
    """(b) The SQNR a uniform grid of spacing `step` leaves at the output of a root op reading
    the tensor of statistics `st` (directly, or through ops that keep each element's relative
    error: an added epsilon, a scale, a reshape; or raise it to a constant power, which the
    caller folds into `power`), predicted from its histogram: a value v
    rounds with a relative error of step / sqrt(12) / v, and one under half a step to 0 (all
    of it lost). Log turns a
    relative error into an absolute one (a lost value: `LOG_LOST` nepers), judged against the
    spread of log(v); v ** power scales it by |power|, judged against the output's power (a
    divisor's small values weigh most: their quotients are the largest). Exact zeros are on
    every grid and count for nothing."""
    lo, hi, cnt = st.abs_bins()
    nz = lo > 0
    if step <= 0.0 or not np.any(nz):
        return math.inf
    v = np.sqrt(lo[nz] * hi[nz])
    c = cnt[nz].astype(np.float64)
    lost = v < step / 2
    rel2 = np.minimum(step * step / 12.0 / (v * v), 1.0)
    if power is None:
        lv = np.log(v)
        mean = float(np.sum(c * lv) / np.sum(c))
        signal = float(np.sum(c * (lv - mean) ** 2) / np.sum(c))
        noise = float(np.sum(c * np.where(lost, LOG_LOST ** 2, rel2)) / np.sum(c))
    else:
        lw = 2.0 * power * np.log(v)  # weights v ** (2 power), scaled by the largest: no overflow
        w = np.exp(lw - lw.max())
        signal = float(np.sum(c * w))
        noise = float(np.sum(c * w * np.where(lost, 1.0, np.minimum(power * power * rel2, 1.0))))
    if noise <= 0.0:
        return math.inf
    return 10.0 * math.log10(max(signal, 1e-300) / noise)


def small_value_inputs(model: onnx.ModelProto, stats: dict[str, TensorStats] | None = None, *,
                       share: float = SMALL_SHARE,
                       spacing: Callable[[str, float], float | None] | None = None,
                       min_db: float = SMALL_MIN_DB,
                       noise: Callable[[onnx.NodeProto], list[tuple[str, str, float]]] | None = None) -> dict[str, str]:
    """(b) Run-time inputs of Log, Reciprocal, Sqrt, Pow with a negative or fractional exponent
    and the divisor of Div; then, walking back through their producers, every run-time input whose
    statistics hold a small-value population (`share` of the non-zero values more than 2^8
    below the absmax): the quiet bins of a spectrogram reach the Log through the filterbank
    MatMul, and rounding them anywhere upstream sends them to log(eps). The walk goes on through
    tensors without statistics (the output of an STFT or a ReduceSumSquare, left float) to the
    planned ones behind them: a quiet waveform rounded to 0 is a spectrogram of zeros. With
    `spacing` (a tensor's grid spacing at a value, None where it has no grid), a walked tensor
    whose grid `root_output_sqnr_db` predicts to leave the root's output under `min_db` stays
    float too, whatever its share of tiny values. With `noise` (`layer_noise`), the weight or input of a
    layer whose walked output has `share` of its non-zero values under the noise that operand's
    grid adds (`swamped_share`) stays float too, whether the output does or not: a constant-Q
    transform's 8-bit filters leak its loud bins into the quiet ones."""
    inits = {t.name: t for t in model.graph.initializer}
    producer = {o: n for n in model.graph.node for o in n.output if o}
    out: dict[str, str] = {}
    # (tensor, what reads the root, the root's power, depth, whether every op since the root
    # kept relative errors: `_RELATIVE_KEEP_OPS` with one run-time input)
    stack: list[tuple[str, str, float | None, int, bool]] = []
    for name, what, power in _small_value_roots(model, inits):
        if name not in out:
            out[name] = (f"small values matter: {what}; a uniform grid rounds small values to 0 "
                         "and the op turns them into inf")
            stack.append((name, what, power, 0, True))
    passed: set[str] = set()  # uncalibrated tensors walked through (float already: an STFT's output)
    index: GraphIndex | None = None

    def layer_operands(t: str, what: str, depth: int) -> None:
        """Keep float the operands of the layer writing `t` (`depth` ops from the root) whose
        grids' noise hides t's small values; walk on from a kept input."""
        q = producer.get(t)
        if noise is None or q is None or not stats or t not in stats:
            return
        for operand, kind, rms in noise(q):
            if operand in out or (sw := swamped_share(stats[t], rms)) < share:
                continue
            out[operand] = (f"small values matter: {kind} of {q.op_type} {q.name!r}, whose output {t} feeds the "
                            f"tensor {what}; its grid adds noise of about {rms:.3g} to each output, above "
                            f"{100 * sw:.0f}% of that output's non-zero values")
            if kind == "input":
                stack.append((operand, what, None, depth + 1, False))

    for name, what, _, _, _ in list(stack):
        layer_operands(name, what, 0)
    while stats and stack:
        name, what, power, depth, direct = stack.pop()
        p = producer.get(name)
        if p is None or depth >= SMALL_WALK_DEPTH:
            continue
        # data movement computes nothing: a chain of Concats that stacks a transform's octaves
        # one by one puts the first octave as far from the root as the number of octaves
        step_depth = depth if p.op_type in _MOVES_DATA and p.domain in ("", "ai.onnx") else depth + 1
        exponent = _power_of_one(p, inits)
        if exponent is not None:  # x * x, Pow(x, e): relative errors scale by e, and so does the root's power
            power = power * exponent if power is not None else None  # log(x ** e) = e log(x): its SQNR is x's
        else:
            direct = direct and p.op_type in _RELATIVE_KEEP_OPS and p.domain in ("", "ai.onnx") \
                and sum(1 for i in p.input if i and i not in inits) <= 1
        for i in p.input:
            if not i or i in inits or i in out or i in passed:
                continue
            if i not in stats:  # no statistics, no grid: what feeds it may still round the small values
                index = index or GraphIndex.of(model)
                if is_float_type(index.elem_type(i)):  # values, not a shape computed from Shape/Size
                    passed.add(i)
                    stack.append((i, what, power, step_depth, direct))
                continue
            st = stats[i]
            layer_operands(i, what, step_depth)
            sh = small_share(st)
            step = spacing(i, st.absmax) if direct and spacing is not None and math.isfinite(st.absmax) else None
            db = root_output_sqnr_db(st, step, power) if step else math.inf
            if sh >= share:
                out[i] = (f"small values matter: feeds the tensor {what} through {p.op_type} {p.name!r}, "
                          f"and {100 * sh:.0f}% of its non-zero values lie 2^{SMALL_LOG2} below its absmax")
            elif db < min_db:
                out[i] = (f"small values matter: feeds the tensor {what} through {p.op_type} {p.name!r}; "
                          f"its grid (spacing {step:.3g} up to {st.absmax:.4g}) rounds its smaller values "
                          f"so coarsely that the op's output would keep about {db:.0f} dB (needs {min_db:.0f})")
            else:
                continue
            stack.append((i, what, power, step_depth, direct))
    return out


def small_value_candidates(plan: PrecisionPlan, model: onnx.ModelProto, depth: int = 8) -> list[str]:
    """(b) Tensors planned in a block format on the way back from a (b) root through float
    tensors: the calibration pass collects their statistics (block formats need none of their
    own) so that `small_value_inputs` can read them. A block shares one exponent: a quiet
    spectrogram bin beside a loud one in its block rounds to 0 as on an integer grid."""
    blocky = {t for t, tp in plan.tensors.items()
              if any(get_format(f).kind == "block" for f in tp.formats())}
    if not blocky:  # the integer presets' tensors are calibrated anyway
        return []
    inits = {t.name: t for t in model.graph.initializer}
    roots = _small_value_roots(model, inits)
    if not roots:
        return []
    producer = {o: n for n in model.graph.node for o in n.output if o}
    index = GraphIndex.of(model)
    # through float tensors only: a divisor from Shape(x) is no path to x's values
    seen = _ancestors(producer, inits, [r for r, _, _ in roots], depth,
                      keep=lambda i: is_float_type(index.elem_type(i)))
    return sorted(seen & blocky)


def _ancestors(producer: Mapping[str, onnx.NodeProto], inits: Collection[str], t: str | Iterable[str],
               depth: int = 6, keep: Callable[[str], bool] | None = None) -> set[str]:
    """The run-time tensors `depth` producers back from `t` (one tensor or several), `t`
    included; with `keep`, the walk goes through the tensors it accepts only."""
    seen = {t} if isinstance(t, str) else set(t)
    frontier = list(seen)
    for _ in range(depth):
        nxt = []
        for x in frontier:
            p = producer.get(x)
            for i in (p.input if p is not None else []):
                if i and i not in inits and i not in seen and (keep is None or keep(i)):
                    seen.add(i)
                    nxt.append(i)
        frontier = nxt
    return seen


def cancellation_inputs(model: onnx.ModelProto, stats: dict[str, TensorStats], *,
                        ratio: float = CANCEL_RATIO) -> dict[str, str]:
    """(c) Run-time inputs of a Sub/Add whose output rms is more than `ratio` times below the
    larger run-time input rms (catastrophic cancellation), and the tensors between them and
    their nearest common source (E[x^2] and E[x]^2 both come from x: every rounding on the way
    to the Sub lands in the result; x's own rounding only adds to the variance). A run-time
    input minus a constant is one too: features fed unnormalized and standardized in the graph
    (a year, 2020 +- 3, minus 2020) lose all they carry to a grid spanning 0 .. 2023. Casts
    (bf16, fp16) are judged by the same ratio: their rounding is relative to each value, and
    the cancellation multiplies it by the ratio (bf16 spaces 2020 by 8)."""
    inits = {t.name for t in model.graph.initializer}
    producer = {o: n for n in model.graph.node for o in n.output if o}
    out: dict[str, str] = {}
    for n in model.graph.node:
        if n.op_type not in ("Sub", "Add") or n.domain not in ("", "ai.onnx") or len(n.input) != 2:
            continue
        o = n.output[0]
        run = [i for i in n.input if i in stats]
        if o not in stats or not run or any(i not in stats and i not in inits for i in n.input):
            continue
        r_out = _rms(stats[o])
        r_in = max(_rms(stats[i]) for i in run)
        if r_in == 0.0 or r_out * ratio > r_in:
            continue
        k = math.log2(r_in / r_out) if r_out > 0 else math.inf
        why = (f"cancellation: {n.op_type} {n.name!r} outputs rms 2^-{k:.0f} of its inputs'; their "
               "rounding error would be the whole result")
        for i in n.input:  # a constant operand too: a mean of 2020 rounded is the same error
            out.setdefault(i, why)
        if len(run) < 2:
            continue
        a, b = (_ancestors(producer, inits, i) for i in n.input)
        common = a & b
        if common:
            for t in sorted((a | b) - common):
                if t in stats:
                    out.setdefault(t, why + " (on the way from their common source)")
    return out


def rescaled_inputs(model: onnx.ModelProto, stats: dict[str, TensorStats],
                    spacing: Callable[[str, float], float | None]) -> dict[str, str]:
    """(i) Run-time inputs of a Mul or Div by a constant whose grid spacing, carried through the
    largest factor the constant applies (max |c| for Mul, max 1/|c| for Div), passes a quarter of
    the output rms, where the rescale evens out channels of unlike ranges (the output rms under
    a quarter of the input's times the factors'). A per-feature scale that differs across
    channels (standardizing features of unlike units: a price's std 40, a latitude's 0.5) leaves
    the small channels of the input a code or two on one grid, and the scale then blows their
    rounding up to their whole range; a gamma scaling even channels does not.
    `spacing(tensor, value)`: the planned format's grid spacing at `value` (None: not gridded)."""
    from onnx import numpy_helper

    inits = {t.name: t for t in model.graph.initializer}
    out: dict[str, str] = {}
    for n in model.graph.node:
        if n.op_type not in ("Mul", "Div") or n.domain not in ("", "ai.onnx") or len(n.input) != 2:
            continue
        slots = [0] if n.op_type == "Div" else [0, 1]  # a Div's divisor is (b)'s business
        for j in slots:
            u, c = n.input[j], n.input[1 - j]
            if u not in stats or c not in inits or n.output[0] not in stats or stats[u].empty:
                continue
            vals = np.abs(numpy_helper.to_array(inits[c]).astype(np.float64)).ravel()
            vals = vals[np.isfinite(vals)]
            if n.op_type == "Div":
                vals = 1.0 / vals[vals > 0]
            if not vals.size:
                continue
            step = spacing(u, stats[u].absmax)
            r_out = _rms(stats[n.output[0]])
            if step is None or r_out == 0.0 or step * float(vals.max()) * RMS_STEPS <= r_out:
                continue
            # the rescale evens out channels of unlike ranges (the output far narrower than the
            # input's rms times the factors'); a LayerNorm's gamma on channels already even keeps
            # each channel's relative rounding, whatever the gamma's spread
            if _rms(stats[u]) * float(np.sqrt(np.mean(vals * vals))) < RMS_STEPS * r_out:
                continue
            out[u] = (f"rescaled: {n.op_type} {n.name!r} scales it by up to {float(vals.max()):.3g} (a constant "
                      f"spanning {float(vals.max() / max(vals.min(), 1e-30)):.3g}x); its grid spacing "
                      f"{step:.3g} becomes {step * float(vals.max()):.3g} there, against an output rms of {r_out:.3g}")
    return out


def concat_range_outputs(model: onnx.ModelProto, stats: dict[str, TensorStats], *,
                         ratio: float = CONCAT_RATIO) -> dict[str, str]:
    """(d) Outputs of a Concat whose inputs' absmax differ by more than `ratio`."""
    out: dict[str, str] = {}
    inits = {t.name for t in model.graph.initializer}
    for n in model.graph.node:
        if n.op_type != "Concat" or n.domain not in ("", "ai.onnx"):
            continue
        amax = [stats[i].absmax for i in n.input if i in stats and not stats[i].empty]
        amax += [0.0 for i in n.input if i in inits]  # constants do not set the ratio
        live = [a for a in amax if a > 0]
        if len(live) < 2 or max(live) <= ratio * min(live):
            continue
        out[n.output[0]] = (f"Concat {n.name!r} joins ranges {max(live):.3g} and {min(live):.3g} "
                            f"({max(live) / min(live):.0f}x apart): one grid would leave the small "
                            "input a few codes (its inputs stay quantized on their own grids)")
    return out


def channel_axes(model: onnx.ModelProto) -> dict[str, int]:
    """The graph outputs (j) reads per channel, {name: 1}: rank 2 or more, a fixed axis-1 length
    of 2 to CHANNEL_MAX (per-channel ranges need the same channels in every batch), and no
    Softmax's probabilities (the guard reads those by agreement, not by parts)."""
    from ..evaluate import class_score_outputs
    from ..graph import static_shape

    probs = class_score_outputs(model)
    out: dict[str, int] = {}
    for o in model.graph.output:
        shape = static_shape(o.type) if o.type.HasField("tensor_type") else None
        if o.name in probs or shape is None or len(shape) < 2 or not is_float_type(o.type.tensor_type.elem_type):
            continue
        n = shape[1]
        if n is not None and 2 <= n <= CHANNEL_MAX:
            out[o.name] = 1
    return out


def channel_scale_outputs(plan: PrecisionPlan, model: onnx.ModelProto, stats: dict[str, TensorStats], *,
                          min_codes: float = CHANNEL_MIN_CODES) -> dict[str, str]:
    """(j) Graph outputs planned on an integer grid with channels (along `channel_axes`) whose
    calibrated absmax gets fewer than `min_codes` codes of the grid the loudest channel sets
    (on int8 a channel 16x below it, on int16 one 4096x below), whether the scales jump (one
    target 80x the others) or spread (targets on scales 1 to 64)."""
    from ..evaluate import channel_runs

    out: dict[str, str] = {}
    for name, axis in channel_axes(model).items():
        st, tp = stats.get(name), plan.tensors.get(name)
        if tp is None or st is None or st.empty or st.channel_min is None or st.channel_max is None \
                or st.axis != axis:
            continue
        ints = [f for f in map(get_format, sorted(set(tp.formats()))) if isinstance(f, IntFormat)]
        if not ints:
            continue
        grid = min(ints, key=lambda f: f.symmetric_limit)  # the coarsest grid it is read on
        amax = np.maximum(np.abs(st.channel_min), np.abs(st.channel_max))
        live = np.isfinite(amax) & (amax > 0)
        if np.count_nonzero(live) < 2:
            continue
        top = float(amax[live].max())
        codes = amax / top * grid.symmetric_limit
        quiet = np.flatnonzero(live & (codes < min_codes))
        if not quiet.size:
            continue
        many = quiet.size > 1
        out[name] = (f"channels: graph output channel{'s' if many else ''} {channel_runs(quiet)} of {amax.size} "
                     f"along axis {axis} reach{'' if many else 'es'} {float(amax[quiet].max()):.3g} at most, "
                     f"{float(codes[quiet].max()):.1f} of the {grid.symmetric_limit:.0f} codes of the {grid.name} "
                     f"grid that channel {int(np.argmax(np.where(live, amax, -1.0)))}'s {top:.3g} sets "
                     f"(needs {min_codes:g})")
    return out


def _quantile_abs(st: TensorStats, q: float) -> float:
    """The q-quantile of the non-zero magnitudes (upper edge of its histogram bin)."""
    lo, hi, cnt = st.abs_bins()
    nz = lo > 0
    hi, cnt = hi[nz], cnt[nz]
    if not cnt.size:
        return 0.0
    c = np.cumsum(cnt)
    return float(hi[min(int(np.searchsorted(c, q * c[-1])), cnt.size - 1)])


def outlier_tensors(plan: PrecisionPlan, stats: dict[str, TensorStats], *,
                    min_codes: float = OUTLIER_MIN_CODES, q: float = OUTLIER_QUANTILE,
                    memo: StatsMemo | None = None) -> dict[str, str]:
    """(f) Activations planned on an integer grid where the `q`-quantile of the non-zero
    magnitudes gets fewer than `min_codes` codes of the grid MinMax would give (absmax at the
    largest code): nearly every value rounds to 0 or one code, and clipping the few outliers
    instead changes what the model computes (a transformer's outlier features). Tensors within
    [0, 1] (probabilities) are skipped; a 16-bit grid gives the same tensors 256 times the codes.
    The absmax must also be OUTLIER_MIN_RATIO times the quantile (implied on 8- and 16-bit grids):
    on a 4-bit grid few codes is the format, not outliers. `memo` keeps each tensor's quantile."""
    out: dict[str, str] = {}
    for name, st in stats.items():
        tp = plan.tensors.get(name)
        if tp is None or st.empty or st.absmax == 0.0 or (st.min >= 0.0 and st.max <= 1.0):
            continue
        names = set(tp.formats())
        fmts = [get_format(f) for f in sorted(names)]
        ints = [f for f in fmts if isinstance(f, IntFormat)]
        if not ints:
            continue
        grid = min(ints, key=lambda f: f.symmetric_limit)  # the coarsest grid it is read on
        quantile = (_quantile_abs(st, q) if memo is None else
                    memo.get(st, ("quantile", q), lambda: _quantile_abs(st, q)))
        codes = quantile / st.absmax * grid.symmetric_limit
        if codes < min_codes and st.absmax >= OUTLIER_MIN_RATIO * quantile:
            out[name] = (f"outliers: {100 * q:g}% of the non-zero values get at most {codes:.1f} of the "
                         f"{grid.symmetric_limit:.0f} codes that absmax {st.absmax:.3g} leaves them on the "
                         f"{grid.name} grid; clipping the outliers would change the model")
    return out


def phase_paths(model: onnx.ModelProto, depth: int = 8,
                elem_type: Callable[[str], int | None] | None = None) -> dict[str, list[str]]:
    """(h) For each run-time input of a `PERIODIC_OPS` op: the tensors whose rounding reaches it
    scaled (itself, and what `_PHASE_WALK_OPS` compute it from, constants included), walking
    back at most `depth` ops; the walk stops at integer tensors (a Cast from int64 positions)
    and at a MatMul / Gemm that is not an outer product with a constant (a layer).
    `elem_type`: a tensor's element type where the caller knows them (default: read from the
    model's value_info, which shape inference has filled)."""
    inits = {t.name: t for t in model.graph.initializer}
    producer = {o: n for n in model.graph.node for o in n.output if o}
    index: GraphIndex | None = None
    out: dict[str, list[str]] = {}
    for n in model.graph.node:
        if n.op_type not in PERIODIC_OPS or n.domain not in ("", "ai.onnx") or not n.input \
                or n.input[0] in inits or n.input[0] in out:
            continue
        seen = [n.input[0]]
        frontier = [n.input[0]]
        for _ in range(depth):
            nxt = []
            for t in frontier:
                p = producer.get(t)
                if p is None or p.op_type not in _PHASE_WALK_OPS or p.domain not in ("", "ai.onnx"):
                    continue
                ins = [i for i in p.input if i]
                if p.op_type == "Gather":
                    ins = ins[:1]  # the indices are integers
                if p.op_type in ("MatMul", "Gemm") and not _outer_product(p, inits):
                    continue
                if p.op_type in ("Reshape", "Slice", "Expand", "Tile", "Unsqueeze", "Squeeze", "Split"):
                    ins = ins[:1]  # shapes, axes and starts
                for i in ins:
                    if i in seen:
                        continue
                    if elem_type is None:
                        index = index or GraphIndex.of(model)
                        elem_type = index.elem_type
                    if not is_float_type(elem_type(i) or 0):
                        continue
                    seen.append(i)
                    if i not in inits:
                        nxt.append(i)
            frontier = nxt
        out[n.input[0]] = seen
    return out


def _outer_product(node: onnx.NodeProto, inits: dict[str, onnx.TensorProto]) -> bool:
    """A MatMul / Gemm with a constant operand whose contracted dimension is 1."""
    a, b = (node.input[0], node.input[1]) if len(node.input) > 1 else ("", "")
    trans = {x.name: x.i for x in node.attribute}
    if b in inits and len(inits[b].dims) >= 2:
        return int(inits[b].dims[-1 if trans.get("transB") else -2]) == 1
    if a in inits and len(inits[a].dims) >= 2:
        return int(inits[a].dims[-2 if trans.get("transA") else -1]) == 1
    return False


def grid_spacing(fmt_name: str, value: float) -> float:
    """The spacing of format `fmt_name`'s grid at `value`, for a tensor whose largest magnitude
    is `value` (integer grids: absmax / symmetric limit; scaled floats: the top binade's spacing
    once `value` is scaled to the largest finite value; casts and block formats: the spacing of
    the binade `value` lies in). Values round by half of it at most; a block format's largest
    code can sit below the binade's top, where values clip by up to twice the spacing (OCP
    MXFP8: elements end at 1.75 times the binade's base)."""
    f = get_format(fmt_name)
    if value <= 0.0:
        return 0.0
    if isinstance(f, IntFormat):
        return value / f.symmetric_limit
    e = math.floor(math.log2(value))
    if f.kind == "float" and f.needs_qparams:  # scaled: `value` maps to the largest finite value
        top = float(getattr(f, "max_normal"))
        return value * math.ldexp(1.0, math.floor(math.log2(top)) - int(getattr(f, "mantissa_bits"))) / top
    if f.kind == "float":
        return math.ldexp(1.0, e - int(getattr(f, "mantissa_bits")))
    if getattr(f, "element", "int") == "int":
        return math.ldexp(1.0, e - int(getattr(f, "mant_bits")) + 1)
    return math.ldexp(1.0, e - int(getattr(f, "element_format").mantissa_bits))


def phase_tensors(plan: PrecisionPlan, model: onnx.ModelProto, stats: dict[str, TensorStats], *,
                  codes: float = PHASE_CODES) -> dict[str, str]:
    """(h) Planned tensors (activations, weights, constants) on a `phase_paths` walk whose
    format's spacing at the phase's absmax leaves the op's period (`PERIODIC_OPS`) fewer than
    `codes` codes: the phase is off by up to half a spacing, whatever its magnitude. The phase's
    own statistics give the absmax (the calibration pass collects them, see `phase_inputs`)."""
    periods: dict[str, float] = {}
    for n in model.graph.node:
        if n.op_type in PERIODIC_OPS and n.domain in ("", "ai.onnx") and n.input:
            periods[n.input[0]] = min(periods.get(n.input[0], math.inf), PERIODIC_OPS[n.op_type])
    out: dict[str, str] = {}
    for phase, path in phase_paths(model).items():
        st = stats.get(phase)
        period = periods.get(phase, 2 * math.pi)
        max_step = period / codes
        unit = "a period" if period != 1.0 else "a unit step"
        if st is None or st.empty or not math.isfinite(st.absmax) or st.absmax == 0.0:
            continue
        for t in path:
            tp = plan.tensors.get(t)
            if tp is None or t in out:
                continue
            fmts = sorted(set(tp.formats()))
            if not fmts:
                continue
            worst = max(fmts, key=lambda f: grid_spacing(f, st.absmax))
            step = grid_spacing(worst, st.absmax)
            if step > max_step:
                out[t] = (f"phase: reaches a periodic or step op's input {phase} (up to {st.absmax:.4g}) "
                          f"scaled; the {worst} grid spaces values that large {step:.3g} apart, "
                          f"{period / step:.1f} codes {unit} (needs {codes:.0f})")
    return out


def phase_inputs(plan: PrecisionPlan, model: onnx.ModelProto) -> list[str]:
    """(h) The periodic ops' inputs whose statistics `phase_tensors` needs: those with a planned
    tensor on their walk (statistics the calibration pass collects whatever their format)."""
    return [p for p, path in phase_paths(model).items()
            if any((tp := plan.tensors.get(t)) is not None and _gridded(tp, int_only=False) for t in path)]


#: Op types whose QDQ form onnxruntime (and the usual NPU compilers) execute as integer kernels.
INTEGER_KERNEL_OPS = frozenset({
    "Conv", "ConvTranspose", "MatMul", "Gemm", "Add", "Mul", "AveragePool", "GlobalAveragePool",
    "Concat", "Sigmoid", "LeakyRelu", "Softmax", "Relu", "Clip", "MaxPool", "Resize", "Gather",
    "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Slice", "Split", "Pad",
    "Identity", "DepthToSpace", "SpaceToDepth", "HardSigmoid", "HardSwish", "Expand", "Tile",
    "ReduceMax", "ReduceMin", "GlobalMaxPool", "LayerNormalization", "InstanceNormalization",
    "Gelu", "Tanh", "PRelu", "Where",
})


def op_scope_notes(plan: PrecisionPlan, model: onnx.ModelProto) -> dict[str, str]:
    """(e) Quantized nodes whose op has no integer kernel: they run as DequantizeLinear -> float
    op -> QuantizeLinear (rounding error, no speed-up). Informational; the plan is unchanged."""
    planned = {n for n, tp in plan.tensors.items() if tp.role == "activation" and tp.format is not None}
    out: dict[str, str] = {}
    for n in model.graph.node:
        if n.op_type in INTEGER_KERNEL_OPS or n.name in plan.float_nodes:
            continue
        if n.output and n.output[0] in planned:
            out[n.name] = (f"{n.op_type} has no integer kernel in onnxruntime: it runs in float "
                           "between DequantizeLinear and QuantizeLinear")
    return out


def _gridded(tp: TensorPrecision, int_only: bool, blocks: bool = False) -> bool:
    """Planned in any format; with `int_only` in an integer one; with `blocks` in an integer or
    a block one (not a cast, which keeps every value's own exponent)."""
    fmts = tp.formats()
    if blocks:
        return any(get_format(f).kind in ("int", "block") for f in fmts)
    if int_only:
        return any(get_format(f).kind == "int" for f in fmts)
    return bool(fmts)


def _spacing(acts: dict[str, TensorPrecision]) -> Callable[[str, float], float | None]:
    """The coarsest grid spacing, at a value, of the formats a tensor is planned in; None for a
    tensor planned in none."""
    def spacing(name: str, value: float) -> float | None:
        tp = acts.get(name)
        fmts = [] if tp is None else tp.formats()
        return max(grid_spacing(f, value) for f in fmts) if fmts else None
    return spacing


def find_numerics(plan: PrecisionPlan, model: onnx.ModelProto, stats: dict[str, TensorStats],
                  policies: tuple[str, ...] = POLICIES, *,
                  nonfinite: dict[str, tuple[int, int]] | None = None,
                  memo: StatsMemo | None = None) -> list[Finding]:
    """The activation tensors of `plan` that policies (a)-(d) and (f)-(j) keep float, first reason wins
    (tensors the user set with tensor_formats are left as set); `nonfinite` as in
    `nonfinite_constants`; `memo` (kept by the caller across the plans of one set of statistics)
    remembers what each tensor's statistics alone decide."""
    unknown = set(policies) - set(POLICIES)
    if unknown:
        from ..errors import ConfigError

        raise ConfigError(f"unknown numerics policy {sorted(unknown)[0]!r}; choose from {', '.join(POLICIES)}")
    acts = {n: tp for n, tp in plan.tensors.items() if tp.role == "activation"}
    every = {n: s for n, s in stats.items() if n in acts}
    # (a)-(d), (f) judge the grids of scaled formats; the statistics of casts are for (g)
    cal = {n: s for n, s in every.items()
           if any(get_format(f).needs_qparams for f in acts[n].formats())}
    # (b) judges block formats too: a block's shared exponent rounds its small values to 0
    blocks = {n: s for n, s in every.items()
              if any(get_format(f).kind == "block" for f in acts[n].formats())}
    found: dict[str, Finding] = {}
    if "sentinel" in policies:
        found.update((t, Finding(t, "sentinel", why)) for t, why in nonfinite_constants(plan, model, nonfinite).items())
    if "overflow" in policies:
        found.update((t, Finding(t, "overflow", why)) for t, why in overflow_constants(plan, model).items()
                     if t not in found)
    detectors = {
        "sentinel": lambda: sentinel_tensors(cal, memo=memo),
        # the predicted-SQNR rule reads integer and scaled grids (a block's exponent is local)
        "small_values": lambda: small_value_inputs(model, {**cal, **blocks}, spacing=_spacing({n: acts[n] for n in cal}),
                                                   noise=layer_noise(plan, model, every)),
        "cancellation": lambda: cancellation_inputs(model, every),
        "rescaled": lambda: rescaled_inputs(model, every, _spacing(acts)),
        "concat": lambda: concat_range_outputs(model, cal),
        "outliers": lambda: outlier_tensors(plan, cal, memo=memo),
        "overflow": lambda: overflow_tensors(plan, every),
        "phase": lambda: phase_tensors(plan, model, stats),
        "channels": lambda: channel_scale_outputs(plan, model, cal),
    }
    for pol in POLICIES:
        if pol not in policies:
            continue
        for t, why in detectors[pol]().items():
            # (b), (c) and (h) flag constants too (a layer's weight, the constants on the way)
            tp = plan.tensors.get(t) if pol in ("phase", "cancellation", "small_values") else acts.get(t)
            if tp is None or t in found or not _gridded(tp, int_only=pol in ("outliers", "channels"),
                                                        blocks=pol == "small_values") \
                    or tp.reason == "tensor override":  # the user's word wins
                continue
            found[t] = Finding(t, pol, why)
    return list(found.values())


def _float_input_weights(model: onnx.ModelProto, plan: PrecisionPlan, tensors: dict[str, TensorPrecision],
                         flagged: dict[str, Finding]) -> dict[str, tuple[str, str]]:
    """Integer weights of the MatMul/Gemm nodes whose input was on a grid in `plan` and is float
    in `tensors` (a policy kept it, or the source a pass-through carries, float): onnxruntime
    runs DequantizeLinear(int8 weight) -> MatMul with a float input as MatMulNBits, which
    quantizes that input on the fly (measured: a log-mel model fell from cosine 1.00 to 0.88;
    NeMo's front end, whose mel filterbank reads the STFT power through a Transpose, wrote NaN
    at A16W8 with onnxruntime's default optimizations, finite values with basic ones)."""
    def gridded(tp: TensorPrecision | None) -> bool:
        return tp is not None and tp.format is not None and get_format(tp.format).kind == "int"

    out: dict[str, tuple[str, str]] = {}
    for n in model.graph.node:
        if n.op_type not in ("MatMul", "Gemm") or len(n.input) < 2:
            continue
        x, was = n.input[0], plan.tensors.get(n.input[0])
        if not gridded(was) or gridded(tensors.get(x)):
            continue
        tp = plan.tensors.get(n.input[1])
        if tp is not None and tp.role in ("weight", "constant") and tp.format is not None \
                and get_format(tp.format).kind == "int":  # a block weight runs as its function's ops
            root = flagged.get(x) or (flagged.get(was.group) if was is not None and was.group else None) \
                or next(iter(flagged.values()))
            out[n.input[1]] = (root.policy,
                               f"weight of {n.op_type} {n.name!r}, whose input {x} is kept float "
                               "(onnxruntime would quantize that input on the fly: MatMulNBits)")
    return out


def _passthrough_inputs(model: onnx.ModelProto, plan: PrecisionPlan, flagged: dict[str, Finding]) -> dict[str, str]:
    """Flagged activations produced by a pass-through op (MaxPool, Reshape, ...) from an input
    that stays quantized in an integer format: {tensor: that input}. Their values lie on the
    input's grid, so re-quantizing them with its parameters is exact; left float instead, the
    DequantizeLinear -> MaxPool -> float pattern makes onnxruntime's QDQ propagation (extended
    optimizations) form a QuantizeLinear whose output type and zero point disagree."""
    out: dict[str, str] = {}
    for n in model.graph.node:
        if not n.output or n.output[0] not in flagged or not n.input:
            continue
        sem = semantics(n)
        src = plan.tensors.get(n.input[0])
        if sem is None or not sem.passthrough or src is None or src.tensor in flagged or src.format is None \
                or src.role != "activation" or get_format(src.format).kind != "int" \
                or (src.group is not None and src.group in flagged):  # the grid it shares is kept float
            continue
        out[n.output[0]] = src.group or src.tensor
    return out


#: a tensor goes to float16 (a weight kept off its grid, a layer the search widens) only below
#: this magnitude (its largest finite value is 65504; the margin leaves room for values
#: calibration did not see)
FP16_SAFE_ABSMAX = 2.0 ** 14


def half_float_for(w: np.ndarray) -> str | None:
    """The 16-bit float that stores weight `w` without harm: float16 (10 mantissa bits) when its
    magnitudes stay under `FP16_SAFE_ABSMAX` and the cast keeps `CAST_MIN_DB` on them, else
    bfloat16 (float32's range, 7 mantissa bits) when that keeps it; None (stay float32) when
    neither does or `w` holds inf / NaN (a sentinel no rounding may move)."""
    if w.dtype.kind != "f" or not w.size or not np.all(np.isfinite(w)):
        return None
    mag = np.abs(w[w != 0]).astype(np.float64)
    if not mag.size:
        return "fp16"
    ones = np.ones_like(mag)
    for fmt in ("fp16", "bf16"):
        limit = cast_limit(fmt)
        top = FP16_SAFE_ABSMAX if fmt == "fp16" else limit
        if top is not None and float(mag.max()) < top and cast_sqnr_db(fmt, mag, ones) >= CAST_MIN_DB:
            return fmt
    return None


def _half_noise_ok(plan: PrecisionPlan, model: onnx.ModelProto, stats: Mapping[str, TensorStats],
                   weight: str, fmt: str) -> bool:
    """Whether (b)'s operand rule passes weight `weight` in the 16-bit float `fmt`: in every
    layer that reads it, the noise that format adds to each output (`layer_noise`, on its
    spacing at each channel's peak) hides under `SMALL_SHARE` of the output's non-zero values.
    A float format keeps a value's own exponent, but a filter's stopband output is a
    cancellation: its weights' rounding error, relative to the weights, not to the output,
    still leaks the loud bins into the quiet ones (a constant-Q transform in float16: 26 dB
    where float32 filters keep 44). A layer without statistics for its output is not judged:
    the weight stays float32."""
    tp = plan.tensors[weight]
    trial = replace(plan, tensors={**plan.tensors, weight: replace(tp, format=fmt, consumer_formats={})})
    noise = layer_noise(trial, model, stats)
    readers = [n for n in model.graph.node if len(n.input) > 1 and n.input[1] == weight]
    if not readers:
        return False
    for n in readers:
        out = stats.get(n.output[0]) if n.output else None
        rms = [r for operand, kind, r in noise(n) if operand == weight and kind == "weight"]
        if out is None or not rms or swamped_share(out, rms[0]) >= SMALL_SHARE:
            return False
    return True


def _halve_kept_weights(plan: PrecisionPlan, model: onnx.ModelProto, stats: Mapping[str, TensorStats],
                        tensors: dict[str, TensorPrecision], names: Iterable[str],
                        judged: Collection[str]) -> dict[str, str]:
    """`kept_weights='half'`, in place: the weights in `names` (kept float by a policy whose
    concern is a uniform or block grid) stored in the 16-bit float `half_float_for` picks,
    those in `judged` ((b)'s) only where its noise rule passes that format (`_half_noise_ok`):
    {weight: format}."""
    inits = {t.name: t for t in model.graph.initializer}
    out: dict[str, str] = {}
    for name in names:
        tp, init = tensors.get(name), inits.get(name)
        if tp is None or tp.role != "weight" or tp.format is not None or init is None \
                or init.data_location == onnx.TensorProto.EXTERNAL:
            continue
        fmt = half_float_for(onnx.numpy_helper.to_array(init))
        if fmt is None or (name in judged and not _half_noise_ok(plan, model, stats, name, fmt)):
            continue
        tensors[name] = replace(tp, format=fmt, block_size=None,
                                reason=tp.reason.replace("kept float:", f"kept in {fmt} (kept_weights='half'):", 1))
        out[name] = fmt
    return out


def apply_numerics(plan: PrecisionPlan, model: onnx.ModelProto, stats: dict[str, TensorStats], *,
                   enabled: bool = True, policies: tuple[str, ...] = POLICIES,
                   nonfinite: dict[str, tuple[int, int]] | None = None, memo: StatsMemo | None = None,
                   kept_weights: str = "float") -> tuple[PrecisionPlan, list[Finding]]:
    """A new plan with the activation tensors the policies flag left float (format None, no
    consumer formats), each with its reason ("kept float: ..."), and the findings. Tensors that
    only reuse a flagged tensor's parameters (pass-through outputs, fused pre-activations of
    its group) are left float with it. `enabled=False` returns the plan unchanged; `nonfinite`
    as in `nonfinite_constants`, `memo` as in `find_numerics`; `kept_weights` one of
    `mixq.config.KEPT_WEIGHTS`: with 'half', a weight (b) keeps off its grid (where (b)'s
    rule, judged again in the 16-bit format, passes it) or one whose input is kept float is
    stored in a 16-bit float instead of float32 (`half_float_for`)."""
    from ..config import KEPT_WEIGHTS

    if kept_weights not in KEPT_WEIGHTS:
        from ..errors import ConfigError

        raise ConfigError(f"kept_weights={kept_weights!r}: choose one of {', '.join(KEPT_WEIGHTS)}.")
    if not enabled:
        return plan, []
    findings = find_numerics(plan, model, stats, policies, nonfinite=nonfinite, memo=memo)
    if not findings:
        return plan, []
    tensors = dict(plan.tensors)
    flagged = {f.tensor: f for f in findings}
    moved = _passthrough_inputs(model, plan, flagged)
    for name, f in flagged.items():
        if name in moved:  # its values are on its input's grid already: stay there, exactly
            root = plan.tensors[moved[name]]
            tensors[name] = replace(tensors[name], format=root.format, consumer_formats={}, calibrate=False,
                                    group=root.tensor,
                                    reason=f"kept on {root.tensor}'s {root.format} grid (a pass-through of it): "
                                           f"{f.reason}")
            continue
        tensors[name] = replace(tensors[name], format=None, consumer_formats={}, reason=f"kept float: {f.reason}")
    for name, tp in plan.tensors.items():  # parameter sharers that calibrate nothing themselves
        if name in flagged or tp.role != "activation" or tp.calibrate or tp.group not in flagged:
            continue
        tensors[name] = replace(tp, format=None, consumer_formats={},
                                reason=f"kept float with {tp.group}: {flagged[tp.group].reason}")
    _drop_new_islands(plan, model, tensors)
    # the weights a float format may suit: (b)'s (a grid rounds their small values to 0; judged
    # again in that format) and those whose input is float (any grid was good enough for them
    # but none may sit beside a float input: a 16-bit float is finer than the one planned)
    judged = [f.tensor for f in findings if f.policy == "small_values"]
    halvable = list(judged)
    for name, (pol, why) in _float_input_weights(model, plan, tensors, flagged).items():
        if name in flagged:  # a policy kept it float already, for its own reason
            continue
        tensors[name] = replace(tensors[name], format=None, consumer_formats={}, reason=f"kept float: {why}")
        findings.append(Finding(name, pol, why))
        halvable.append(name)
    if kept_weights == "half":
        halved = _halve_kept_weights(plan, model, stats, tensors, halvable, frozenset(judged))
        findings = [replace(f, kept=halved[f.tensor]) if f.tensor in halved else f for f in findings]
    return replace(plan, tensors=tensors), findings


def _fan_in(n: onnx.NodeProto, w: np.ndarray) -> int:
    """Products per output element of layer `n` with weight `w` (the weight's size over its
    output channels, on the axis `ops.semantics` gives)."""
    sem = semantics(n)
    axis = (sem.weight_channel_axis if sem is not None and sem.weight_channel_axis is not None else 0) % w.ndim
    return max(1, w.size // max(1, w.shape[axis]))


def layer_noise(plan: PrecisionPlan, model: onnx.ModelProto, stats: Mapping[str, TensorStats]
                ) -> Callable[[onnx.NodeProto], list[tuple[str, str, float]]]:
    """(b) For a layer node with a constant weight: (operand, "weight" or "input", the rms of
    the noise that operand's planned grid adds to each output element) for each operand on a
    grid. The weight's: spacing / sqrt(12) * sqrt(fan-in) * the input's rms; the input's: its
    spacing / sqrt(12) * the weight's L2 norm per output channel (spacings and norms averaged
    in power over the output channels). Neither shrinks with the output: a small output of a
    dot product is a cancellation (a filter's stopband), and rounding errors do not cancel with
    it. A pass-through input (a Reshape of the waveform) is read on its source's statistics."""
    inits = {t.name: t for t in model.graph.initializer}
    memo: dict[str, tuple[float, float]] = {}  # weight -> (weight factor, mean squared channel norm)

    def noise(n: onnx.NodeProto) -> list[tuple[str, str, float]]:
        if n.op_type not in COMPUTE_OPS or n.domain not in ("", "ai.onnx") or len(n.input) < 2 \
                or n.input[1] not in inits:
            return []
        x, w_name = n.input[0], n.input[1]
        xp, tp = plan.tensors.get(x), plan.tensors.get(w_name)
        src = x if x in stats or xp is None or not xp.group else xp.group
        st = stats.get(src)
        if st is None or tp is None or tp.role not in ("weight", "constant"):
            return []
        if w_name not in memo:
            w = onnx.numpy_helper.to_array(inits[w_name]).astype(np.float64)
            if w.ndim < 2 or not w.size:
                return []
            fan_in = _fan_in(n, w)
            ch = tp.channel_axis % w.ndim if tp.channel_axis is not None else None
            others = tuple(a for a in range(w.ndim) if a != ch)
            peaks = np.abs(w).max(axis=others).ravel() if ch is not None else np.array([np.abs(w).max()])
            step2 = float(np.mean([grid_spacing(tp.formats()[0], float(v)) ** 2 for v in peaks])) \
                if tp.formats() else 0.0
            memo[w_name] = (math.sqrt(step2 / 12.0 * fan_in), float(np.sum(w * w)) * fan_in / w.size)
        w_factor, norm2 = memo[w_name]
        out = []
        if w_factor > 0.0:
            out.append((w_name, "weight", w_factor * _rms(st)))
        fmts = xp.formats() if xp is not None else []
        if fmts and math.isfinite(st.absmax) and st.absmax > 0.0:
            step = max(grid_spacing(f, st.absmax) for f in fmts)
            out.append((x, "input", step / math.sqrt(12.0) * math.sqrt(norm2)))
        return out
    return noise


def swamped_share(st: TensorStats, noise: float) -> float:
    """Share of the non-zero values of `st` under half the step of a grid whose rounding noise
    is `noise` (sqrt(3) * noise): what an added noise of that rms hides."""
    return _share_under(st, math.sqrt(3.0) * noise) if noise > 0.0 else 0.0


def _drop_new_islands(plan: PrecisionPlan, model: onnx.ModelProto, tensors: dict[str, TensorPrecision]) -> None:
    """The quantized islands without a layer that the policies' float tensors cut off (the
    plan's own were dropped when it was built: `plan.rules.layerless_islands`), in place: a
    waveform's pre-emphasis left on an int8 grid between the graph input and an STFT Conv whose
    input a policy keeps float (kaldi's front end at A8W8: 12 dB on its log-mel features)."""
    from ..config import LayerRule
    from .rules import layerless_islands

    rules = [LayerRule(**{k: v for k, v in r.items() if k in ("op_types", "nodes", "activation", "weight")})
             for r in (plan.config or {}).get("layer_rules", [])]
    named = {n.name for n in model.graph.node if any(r.nodes and r.matches("", n.name) for r in rules)}
    keep = {t for t, tp in plan.tensors.items() if tp.reason == "tensor override"}
    ix = GraphIndex.of(model)
    found = layerless_islands(ix, tensors, lambda n: plan.float_nodes.get(n.name), keep, named)
    for t, why in found.items():
        tensors[t] = replace(tensors[t], format=None, consumer_formats={}, calibrate=False, reason=why)
