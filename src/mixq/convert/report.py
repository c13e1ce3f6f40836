"""ConversionReport and the fidelity measurement (original vs converted model, same inputs)."""
from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto

from ..errors import DataError
from ..evaluate import ErrorStats
from ._rewrite import KeptFloat

__all__ = ["ConversionReport", "OutputFidelity", "OpCount", "KeptFloat", "op_counts", "make_feeds", "fidelity", "sqnr_db", "cosine"]


@dataclass
class OutputFidelity:
    """Agreement of one model output with the original model's: SQNR (dB, inf when equal),
    cosine similarity and the largest absolute difference. `not_compared` says why an output
    has no score (its SQNR and cosine are then NaN): the original's values there give nothing to
    compare with (all 0, or no finite value, on the evaluation inputs), and equal outputs would
    otherwise read as a perfect conversion. Non-numeric outputs (strings) are compared by
    equality: `mismatched` counts the values that differ (SQNR inf when none, else -inf)."""

    name: str
    sqnr_db: float
    cosine: float
    max_abs_err: float
    not_compared: str = ""
    mismatched: int = 0


@dataclass
class OpCount:
    """Nodes of one op type: how many the conversion changed, kept in the source float type
    (reasons in `ConversionReport.kept_float`) or had nothing to convert (no float data: integer
    or shape paths, Constants that became weights)."""

    op_type: str
    nodes: int
    converted: int
    kept_float: int
    untouched: int


@dataclass
class ConversionReport:
    """What a conversion did and how close the result is to the original model."""

    format: str
    source: str
    target: str
    provider: str
    nodes_total: int = 0
    nodes_converted: int = 0
    tensors_converted: int = 0
    initializers_converted: int = 0
    casts_inserted: int = 0
    qdq_nodes_inserted: int = 0
    kept_float: list[KeptFloat] = field(default_factory=list)
    size_before: int = 0
    size_after: int = 0
    fidelity: list[OutputFidelity] = field(default_factory=list)
    wall_time_s: float = 0.0
    eval_time_s: float = 0.0
    notes: list[str] = field(default_factory=list)
    op_counts: list[OpCount] = field(default_factory=list)

    @property
    def min_sqnr_db(self) -> float:
        """The worst SQNR of the compared outputs (inf when none was compared or all are exact)."""
        return min((f.sqnr_db for f in self.fidelity if not f.not_compared), default=math.inf)

    @property
    def warnings(self) -> list[str]:
        """`failures`, then the outputs left out of a check that compared others."""
        skipped = [f for f in self.fidelity if f.not_compared]
        if not skipped or len(skipped) == len(self.fidelity):
            return self.failures
        return self.failures + ["not compared: " + "; ".join(f"{f.name!r}: {f.not_compared}" for f in skipped)]

    @property
    def failures(self) -> list[str]:
        """What makes the fidelity check fail (what `strict` refuses): an output below
        BROKEN_SQNR_DB (NaN or inf where the original is finite, or a differing label, scores
        -inf), or no output the check could compare."""
        from ..fidelity import BROKEN_SQNR_DB

        out = []
        broken = [f for f in self.fidelity if not f.not_compared and f.sqnr_db < BROKEN_SQNR_DB]
        for f in broken:
            why = (f"{f.mismatched} values unlike the original's" if f.mismatched
                   else "NaN or inf where the original is finite" if f.sqnr_db == -math.inf
                   else f"{f.sqnr_db:.1f} dB SQNR (cosine {f.cosine:.4f})")
            out.append(f"output {f.name!r} reads {why} against the original model, below "
                       f"{BROKEN_SQNR_DB:g} dB: the converted model is likely broken. The nodes kept in "
                       f"{self.source} are listed below; simulate_{self.target_short} (weights only) tells whether "
                       "the weights or the activations lose it.")
        if self.fidelity and all(f.not_compared for f in self.fidelity):
            out.append("no output was compared, so nothing about this conversion was checked: "
                       + "; ".join(f"{f.name!r}: {f.not_compared}" for f in self.fidelity)
                       + ". Evaluate on inputs that exercise the model (feeds=..., or --shape for "
                         "other random shapes).")
        return out

    @property
    def target_short(self) -> str:
        """'bf16' or 'fp16', as the format names spell the target."""
        return "bf16" if self.target == "bfloat16" else "fp16"

    def to_dict(self) -> dict[str, Any]:
        """Plain data (JSON-serializable except for inf/nan floats)."""
        return asdict(self)

    def kept_float_summary(self) -> list[tuple[str, str, int]]:
        """(op_type, reason, count) of the nodes kept in the source type, most frequent first."""
        c = Counter((k.op_type, k.reason) for k in self.kept_float)
        return [(op, why, n) for (op, why), n in c.most_common()]

    def to_markdown(self) -> str:
        """A Markdown summary: counts, sizes, fidelity per output, nodes kept in float."""
        mb = 1e6  # MB = 10^6 bytes, as in every mixq summary
        ratio = (self.size_after / self.size_before) if self.size_before else float("nan")
        lines = [
            f"## mixq convert: {self.source} -> {self.target} ({self.format})",
            "",
            "| item | value |",
            "|---|---|",
            f"| provider | {self.provider} |",
            f"| nodes (converted / total) | {self.nodes_converted} / {self.nodes_total} |",
            f"| tensors converted | {self.tensors_converted} |",
            f"| weights converted | {self.initializers_converted} |",
            f"| Casts inserted | {self.casts_inserted} |",
        ]
        if self.qdq_nodes_inserted:
            lines.append(f"| QDQ function nodes inserted | {self.qdq_nodes_inserted} |")
        lines += [
            f"| nodes kept in {self.source} | {len(self.kept_float)} |",
            f"| size before -> after | {self.size_before / mb:.2f} MB -> {self.size_after / mb:.2f} MB ({ratio:.2f}x) |",
            f"| conversion time | {self.wall_time_s:.3f} s |",
        ]
        if self.eval_time_s:
            lines.append(f"| fidelity evaluation time | {self.eval_time_s:.3f} s |")
        if not self.fidelity:  # evaluate=False (--no-eval): say so, never leave it to be assumed
            lines += ["", "Fidelity: not checked (evaluate=False, --no-eval): nothing here says that the "
                      "converted model computes what the original does."]
        else:
            lines += ["", "### Fidelity vs the original model", "",
                      "| output | SQNR (dB) | cosine | max abs err |", "|---|---:|---:|---:|"]
            for f in self.fidelity:
                if f.not_compared:
                    lines.append(f"| {f.name} | not compared | - | - |")
                else:
                    lines.append(f"| {f.name} | {f.sqnr_db:.2f} | {f.cosine:.6f} | {f.max_abs_err:.3g} |")
        if self.op_counts and self.format not in ("simulate_bf16", "simulate_fp16"):
            what = "computing in" if self.format in ("bf16", "fp16") else "reading rounded"
            lines += ["", "### Nodes per op type", "",
                      f"converted = {what} {self.target}; untouched = no float data to convert (integer/shape "
                      "paths, Constants that became weights)", "",
                      f"| op type | nodes | converted | kept in {self.source} | untouched |", "|---|---:|---:|---:|---:|"]
            for c in self.op_counts:
                lines.append(f"| {c.op_type} | {c.nodes} | {c.converted} | {c.kept_float} | {c.untouched} |")
        if self.kept_float:
            lines += ["", f"### Nodes kept in {self.source}", "", "| op type | count | reason | e.g. |",
                      "|---|---:|---|---|"]
            for op, why, n in self.kept_float_summary():
                eg = next(k.node for k in self.kept_float if k.op_type == op and k.reason == why)
                lines.append(f"| {op} | {n} | {why} | {eg} |")
        if self.notes:
            lines += ["", "### Notes", ""] + [f"- {n}" for n in self.notes]
        if self.warnings:
            lines += [""] + [f"WARNING: {w}" for w in self.warnings]
        return "\n".join(lines) + "\n"


def op_counts(original: onnx.ModelProto, converted: Counter[str], kept: Sequence[KeptFloat]) -> list[OpCount]:
    """Per op type of `original`'s main graph: nodes, converted, kept float, untouched; most
    frequent op types first."""
    total = Counter(n.op_type for n in original.graph.node)
    k = Counter(x.op_type for x in kept)
    out = []
    for op, n in total.most_common():
        c = min(converted.get(op, 0), n)
        f = min(k.get(op, 0), n - c)
        out.append(OpCount(op, n, c, f, n - c - f))
    return out


# ----------------------------------------------------------------------------- fidelity

_NP: dict[int, type] = {TensorProto.FLOAT: np.float32, TensorProto.FLOAT16: np.float16, TensorProto.DOUBLE: np.float64,
       TensorProto.INT64: np.int64, TensorProto.INT32: np.int32, TensorProto.INT8: np.int8,
       TensorProto.UINT8: np.uint8, TensorProto.BOOL: np.bool_, TensorProto.INT16: np.int16,
       TensorProto.UINT16: np.uint16, TensorProto.UINT32: np.uint32, TensorProto.UINT64: np.uint64}


#: Largest random evaluation input, in elements (1 GiB of float32).
MAX_FEED_ELEMENTS = 1 << 28


def _check_shape(name: str, shape: list[int], tt) -> None:
    """A DataError unless `shape` is a positive shape of the input's rank and a sane size."""
    example = ",".join(str(d.dim_value) if d.HasField("dim_value") and d.dim_value > 0 else "1"
                       for d in tt.shape.dim) if tt.HasField("shape") else "1,3,224,224"
    if any(d < 1 for d in shape):
        raise DataError(f"--shape {name}={','.join(map(str, shape))}: every dimension must be a positive "
                        f"integer (the size to evaluate with, not -1 or 0), e.g. --shape {name}={example}.")
    if tt.HasField("shape") and len(tt.shape.dim) != len(shape):
        raise DataError(f"--shape {name}={','.join(map(str, shape))} has {len(shape)} dimension(s); input "
                        f"{name!r} has {len(tt.shape.dim)}, e.g. --shape {name}={example}.")
    n = int(np.prod(np.array(shape, dtype=np.float64)))
    if n > MAX_FEED_ELEMENTS:
        raise DataError(f"--shape {name}={','.join(map(str, shape))} asks for {n:,} elements per random "
                        f"evaluation input (limit {MAX_FEED_ELEMENTS:,}); give a smaller shape or --no-eval.")


def make_feeds(model: onnx.ModelProto, shapes: Mapping[str, Sequence[int]] | None = None,
               seed: int = 0) -> dict[str, np.ndarray]:
    """Random inputs for `model`: standard normal floats, zero integers, False booleans.

    Dynamic dimensions are 1 unless `shapes` gives the input's full shape. Raises DataError for
    an input of unknown rank without a shape, or a shape override naming no input."""
    shapes = dict(shapes or {})
    inits = {t.name for t in model.graph.initializer}
    inputs = [i for i in model.graph.input if i.name not in inits]
    unknown = set(shapes) - {i.name for i in inputs}
    if unknown:
        from ..errors import did_you_mean
        bad = sorted(unknown)[0]
        raise DataError(f"--shape names {bad!r}, which is not a model input (inputs: "
                        f"{', '.join(i.name for i in inputs)}).{did_you_mean(bad, [i.name for i in inputs])}")
    rng = np.random.default_rng(seed)
    feeds: dict[str, np.ndarray] = {}
    for vi in inputs:
        tt = vi.type.tensor_type
        dtype = _NP.get(tt.elem_type)
        if dtype is None:
            raise DataError(f"input {vi.name!r} has element type "
                            f"{TensorProto.DataType.Name(tt.elem_type)}, which random feeds do not cover; "
                            "pass feeds= explicitly.")
        if vi.name in shapes:
            shape = [int(d) for d in shapes[vi.name]]
            _check_shape(vi.name, shape, tt)
        elif tt.HasField("shape"):
            shape = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else 1 for d in tt.shape.dim]
        else:
            raise DataError(f"input {vi.name!r} has no shape; give one with --shape {vi.name}=1,3,224,224 "
                            "(or shapes={...}).")
        if np.issubdtype(dtype, np.floating):
            feeds[vi.name] = rng.standard_normal(shape).astype(dtype)
        else:
            feeds[vi.name] = np.zeros(shape, dtype=dtype)
    return feeds


def sqnr_db(ref: np.ndarray, out: np.ndarray) -> float:
    """Signal-to-quantization-noise ratio 10*log10(sum ref^2 / sum (ref-out)^2), in dB."""
    return ErrorStats().update(ref, out).sqnr_db


def cosine(ref: np.ndarray, out: np.ndarray) -> float:
    """Cosine similarity of the flattened arrays (1.0 for two all-zero arrays)."""
    return ErrorStats().update(np.ravel(ref), np.ravel(out)).cosine


def fidelity(original: onnx.ModelProto, converted: onnx.ModelProto, provider: str,
             feeds: Mapping[str, np.ndarray] | None = None,
             shapes: Mapping[str, Sequence[int]] | None = None, seed: int = 0) -> list[OutputFidelity]:
    """Run both models on the same inputs (`feeds`, or random ones) and compare every output
    (random ops seeded alike in both: the same draws, `mixq.evaluate.seed_random_ops`)."""
    from ..evaluate import seed_random_ops
    from ._session import make_session

    feeds = dict(feeds) if feeds is not None else make_feeds(original, shapes, seed)
    ref_sess = make_session(seed_random_ops(original), provider)
    names = [o.name for o in ref_sess.get_outputs()]
    try:
        ref = ref_sess.run(None, feeds)
    except Exception as exc:
        raise DataError(f"the original model does not run on the evaluation inputs ({exc}); "
                        "give input shapes with --shape NAME=d0,d1,... or pass feeds.") from exc
    out = make_session(seed_random_ops(converted), provider).run(names, feeds)
    res = []
    for n, r, o in zip(names, ref, out):
        r, o = np.asarray(r), np.asarray(o)
        if r.dtype.kind not in "fciub" and r.size:  # strings: equal or not
            bad = int(np.count_nonzero(r != o)) if r.shape == o.shape else max(r.size, o.size)
            res.append(OutputFidelity(n, -math.inf if bad else math.inf, math.nan if bad else 1.0, math.nan,
                                      mismatched=bad))
            continue
        why = _nothing_to_compare(r, o)
        if why:
            res.append(OutputFidelity(n, math.nan, math.nan, math.nan, not_compared=why))
            continue
        st = ErrorStats().update(np.ravel(r), np.ravel(o))
        res.append(OutputFidelity(n, st.sqnr_db, st.cosine, st.maxerr))
    return res


def _nothing_to_compare(ref: np.ndarray, got: np.ndarray) -> str:
    """Why `ref` gives nothing to compare `got` with ('' when it does): no finite value, or 0
    wherever it is finite while `got` is 0 there too (a converted value where the original reads
    0 is an error and is scored)."""
    from ..fidelity import holds_nothing

    if ref.size == 0:
        return "the output is empty on the evaluation inputs"
    if not holds_nothing([ref], [got]):
        return ""
    if not np.isfinite(ref).any():
        return "the original's output holds no finite value on the evaluation inputs"
    return "the original's output is 0 everywhere on the evaluation inputs, and the converted one too"
