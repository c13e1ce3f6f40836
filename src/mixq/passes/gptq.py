"""GPTQ weight rounding: integer weight codes chosen to minimise the layer's output error on
the calibration data, instead of each weight rounded to its nearest code.

For a layer y = W x, rounding every weight to nearest minimises |W - Wq| element by element;
the output error (W - Wq) x depends on how the rounding errors of one output's weights combine
over the inputs x. GPTQ (Frantar et al., 2022, after Optimal Brain Quantization) rounds the
weight's columns one at a time and spreads each column's rounding error over the columns not yet
rounded, weighted by the inverse of H = sum x x^T (the layer inputs' second moments): a closed
form, no iterations, no learning rate. The scales and zero points are the ones the plan already
chose (qparams), so only the codes change: the output is the same QDQ graph with other integers.

H comes from one streaming onnxruntime pass of the float model over the calibration data (one
batch in memory). For a Conv the inputs are the patches each output reads (im2col, with the
Conv's pads, strides, dilations and groups); each group has its own H. At most `MAX_ROWS`
patches (or tokens) per layer and sample enter H, drawn with a seed of the sample's index, and
H is summed over blocks of `SAMPLE_BLOCK` samples by index (2-D inputs, a row per sample:
`ROW_BLOCK`), each block summed in float32, the blocks in float64 along a tree fixed by the
block index: the same data give the same bytes whatever the batch size, and whatever the
shards the calibration was cut into (`GramTap.shard` / `merge`). Layers that read the same input the same way (attention's
query, key and value projections) share one H.

The pass changes the weight initializers of the prepared model in place to the dequantized
values of the chosen codes; the rewrite quantizes them back to exactly those codes (checked
here). It returns the float weights it replaced, which bias correction then measures against.
"""
from __future__ import annotations

import copy
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx
from onnx import numpy_helper

from .._io import has_external_data
from ..calibration.data import feed_rows
from ..errors import MixqError
from ..formats import QParams, get_format
from ..formats.integer import IntFormat, expand_param
from ..graph import conv_padding, with_outputs
from ..plan.plan import PrecisionPlan

if TYPE_CHECKING:
    from ..fidelity import ModelScore

__all__ = ["GPTQ_DAMP", "GPTQ_BLOCK", "MAX_GRAM_BYTES", "MAX_ROWS", "GramTap", "WeightRounder",
           "WeightRoundingReport", "gptq_round"]

#: Dampening added to H's diagonal, as a fraction of its mean (GPTQ's `percdamp`).
GPTQ_DAMP = 0.01
#: Columns rounded per block before the rest of the weight is updated (a speed knob only).
GPTQ_BLOCK = 128
#: Input rows (patches, tokens) per layer and sample that enter H. (Fewer for the small H of
#: depthwise Convs, 256 for a 3x3, cost EfficientNet-Lite0 A16W8 3 of 216 agreeing images.)
MAX_ROWS = 1024
#: Rows of a 2-D layer input (one sample each) summed into H together.
ROW_BLOCK = 64
#: Samples (of a layer input with rows per sample: tokens, patches) summed into H together.
SAMPLE_BLOCK = 8
#: Multiply-adds one layer's H may take: rows x k^2 grows with the square of the layer's width
#: k, so a wide layer's H comes from its first samples only (by index, whole blocks, at least
#: MIN_SAMPLES). torchcrepe's second Conv reads 128 channels x 64 taps (k = 8192): its H from
#: 512 frames took 150 of the 164 s of calibration; onnxruntime quantizes the model in 3 s.
GRAM_BUDGET = 2 ** 39
#: The fewest samples a capped layer's H comes from (GPTQ's paper calibrates on 128).
MIN_SAMPLES = 64
#: Bytes one layer's H (groups x k x k, float64) may take; a wider layer keeps nearest rounding.
#: The rounding holds several copies of H at once (the dampened and permuted H, its Cholesky
#: factor and inverse): VGG's first classifier layer (k = 25088, H 4.7 GiB) ran a 20 GiB
#: process out of memory there. 512 MiB is k = 8192 (torchcrepe's widest Conv).
MAX_GRAM_BYTES = 2 ** 29


@dataclass
class WeightRoundingReport:
    """What GPTQ did: per weight, its layer's output error on the calibration data relative to
    round-to-nearest's (H-weighted, < 1 is better); weights left to nearest rounding and why."""

    rounded: dict[str, float] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    samples: int = 0
    original: dict[str, np.ndarray] = field(default_factory=dict, repr=False)
    nearest_because: str | None = None  # weight_rounding='auto' could not run GPTQ, or measured it worse: why
    #: weight_rounding='auto': the whole model's scores (`fidelity.ModelScore`) with GPTQ and with
    #: nearest rounding, and on how many of the guard's samples (None: not compared)
    compared: tuple[ModelScore, ModelScore, int] | None = None
    #: weight_rounding='auto' kept GPTQ without a comparison: why
    not_compared: str | None = None
    #: weights whose layer's H came from its first samples only (GRAM_BUDGET): how many
    capped: dict[str, int] = field(default_factory=dict)

    def lines(self) -> list[str]:
        """Markdown lines for the quantize summary."""
        if self.nearest_because is not None:
            return [f"weights rounded to nearest, not GPTQ: {self.nearest_because}"]
        if not self.rounded and not self.skipped:
            return ["GPTQ: no Conv/Gemm/MatMul with constant integer weights"]
        out = []
        if self.rounded:
            r = np.asarray(list(self.rounded.values()))
            out.append(f"GPTQ: {len(self.rounded)} weights rounded from the input statistics of "
                       f"{self.samples} samples (layer output error vs nearest rounding: median "
                       f"{np.median(r):.2f}, worst {r.max():.2f})")
        if self.capped:
            names = sorted(self.capped)
            out.append(f"GPTQ: {len(names)} wide layer(s) measured on their first {min(self.capped.values())} "
                       f"samples (H's rows x width^2 within {GRAM_BUDGET:.1e} multiply-adds): "
                       + ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else ""))
        if self.not_compared is not None:
            out.append(f"GPTQ kept, not compared with nearest rounding: {self.not_compared}")
        if self.compared is not None:
            g, n, k = self.compared
            out.append(f"GPTQ kept: {g.text()} on the guard's {k} samples; nearest rounding: {n.text()}")
        out += [f"GPTQ skipped: {k}: {v}" for k, v in self.skipped.items()]
        return out


@dataclass
class _Target:
    node: onnx.NodeProto
    weight: str
    kind: str  # "conv" | "gemm" | "matmul"
    groups: int = 1
    gram: np.ndarray | None = None  # (groups, k, k), float64
    finite: bool = True  # False: an input value was inf or NaN
    #: samples (by index) whose rows enter H: all (None) or the first ones (`sample_cap`)
    cap: int | None = None


def _ints(node: onnx.NodeProto, name: str, default: list[int]) -> list[int]:
    a = next((a for a in node.attribute if a.name == name), None)
    return list(a.ints) if a is not None and a.ints else list(default)


def _int(node: onnx.NodeProto, name: str, default: int) -> int:
    a = next((a for a in node.attribute if a.name == name), None)
    return int(a.i) if a is not None else default


def _str(node: onnx.NodeProto, name: str, default: str) -> str:
    a = next((a for a in node.attribute if a.name == name), None)
    return a.s.decode() if a is not None else default


def _targets(model: onnx.ModelProto, plan: PrecisionPlan) -> tuple[list[_Target], dict[str, str]]:
    """Every Conv / Gemm / MatMul whose constant weight the plan puts on an integer grid."""
    inits = {t.name: t for t in model.graph.initializer}
    readers = Counter(i for n in model.graph.node for i in n.input)
    out, skipped = [], {}
    for n in model.graph.node:
        if n.op_type not in ("Conv", "Gemm", "MatMul") or len(n.input) < 2:
            continue
        w = n.input[1]
        tp = plan.tensors.get(w)
        if tp is None or tp.role != "weight" or tp.format is None:
            continue
        if not isinstance(get_format(tp.format), IntFormat):
            skipped[w] = f"{tp.format} is not an integer grid (GPTQ rounds integer codes)"
        elif w not in inits:
            skipped[w] = "the weight is not a constant"
        elif readers.get(w, 0) > 1:
            skipped[w] = "the weight is shared by several nodes (one rounding cannot fit each)"
        elif has_external_data(inits[w]):
            skipped[w] = "the weight stays in its external data file (a big model)"
        elif inits[w].data_type != onnx.TensorProto.FLOAT:
            skipped[w] = "the weight is not float32"
        elif n.op_type == "Conv" and _str(n, "auto_pad", "NOTSET") not in (
                "NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER"):
            skipped[w] = "unknown auto_pad"
        elif 0 in inits[w].dims:
            skipped[w] = "the weight is empty"
        elif n.op_type == "Conv" and len(inits[w].dims) < 3:
            skipped[w] = "a Conv weight of rank < 3"
        elif n.op_type in ("Gemm", "MatMul") and len(inits[w].dims) != 2:
            skipped[w] = "a MatMul weight of rank != 2 (batched weights)"
        elif (size := gram_bytes(n.op_type.lower(), n, list(inits[w].dims))) > MAX_GRAM_BYTES:
            skipped[w] = (f"its layer is too wide: H (the input statistics GPTQ solves with) would take "
                          f"{size / 2**30:.1f} GiB, over the {MAX_GRAM_BYTES / 2**20:.0f} MiB a layer may "
                          "(the rounding holds several copies); nearest rounding")
        else:
            kind = n.op_type.lower()
            t = _Target(n, w, kind, _int(n, "group", 1) if kind == "conv" else 1)
            t.cap = sample_cap(t, list(inits[w].dims), _static_rows(model, n, kind))
            out.append(t)
    return out, skipped


def _static_rows(model: onnx.ModelProto, node: onnx.NodeProto, kind: str) -> int:
    """The rows a sample gives the layer's H at most, from the output's declared shape (its
    positions, or tokens); MAX_ROWS where a dim is unknown."""
    shape = next((v.type.tensor_type.shape for v in [*model.graph.value_info, *model.graph.output]
                  if v.name == node.output[0]), None)
    if shape is None:
        return MAX_ROWS
    dims = [d.dim_value if d.HasField("dim_value") else None for d in shape.dim]
    inner = dims[2:] if kind == "conv" else dims[1:-1]
    known = [d for d in inner if d is not None]
    if len(known) != len(inner) or not dims:
        return MAX_ROWS
    return max(1, min(MAX_ROWS, int(np.prod(known)) if known else 1))


def _width(kind: str, node: onnx.NodeProto, wdims: list[int]) -> int:
    """k, the inputs each output of the layer sums over: H is (groups, k, k)."""
    if kind == "conv":
        return int(np.prod(wdims[1:]))
    return int(wdims[1] if kind == "gemm" and _int(node, "transB", 0) else wdims[0])


def gram_bytes(kind: str, node: onnx.NodeProto, wdims: list[int]) -> int:
    """The bytes of the layer's H in float64."""
    groups = _int(node, "group", 1) if kind == "conv" else 1
    return groups * _width(kind, node, wdims) ** 2 * 8


def sample_cap(t: _Target, wdims: list[int], rows: int) -> int | None:
    """The samples whose rows enter `t`'s H (None: all): as many as keep rows x k^2 within
    GRAM_BUDGET, in whole SAMPLE_BLOCKs, at least MIN_SAMPLES; a property of the layer and
    the model's shapes alone, so the same samples count whatever the batches or shards.
    Layers that read one row per sample (a Gemm's) are never capped."""
    if t.kind != "conv" and rows <= 1:  # a row per sample: H grows by k^2 a sample, and
        return None                       # ROW_BLOCK rows share a product
    k = _width(t.kind, t.node, wdims)
    cost = rows * k * k * t.groups
    if cost * MIN_SAMPLES > GRAM_BUDGET:
        return MIN_SAMPLES
    cap = GRAM_BUDGET // cost
    return None if cap > 1 << 40 else int(-(-cap // SAMPLE_BLOCK) * SAMPLE_BLOCK)


def _pick(n: int, rng: np.random.Generator) -> np.ndarray:
    """Sorted indices of at most MAX_ROWS of n rows (all of them when n is small enough)."""
    return np.arange(n) if n <= MAX_ROWS else np.sort(rng.choice(n, MAX_ROWS, replace=False))


class _Patches:
    """Where a Conv's outputs read its input, for inputs of one spatial size: the pads (auto_pad
    resolved), the output positions and the flat offsets of the kernel taps in a padded sample.
    Worked out once per layer and input size (not per sample: a small model's calibration spent
    most of its GPTQ time in that Python). Where a sample's output positions all enter H, each
    tap's patches are one strided slice of the unpadded input (its window of valid positions
    worked out here, zeros outside it): no padded copy and no index lookups, the same values in
    the same layout as a gather would copy."""

    def __init__(self, node: onnx.NodeProto, kshape: list[int], groups: int, spatial: tuple[int, ...]) -> None:
        nd = len(kshape)
        self.spatial = spatial
        self.strides = _ints(node, "strides", [1] * nd)
        dil = _ints(node, "dilations", [1] * nd)
        span = [(k - 1) * d + 1 for k, d in zip(kshape, dil)]
        pads = conv_padding(_str(node, "auto_pad", "NOTSET"), _ints(node, "pads", [0] * 2 * nd), spatial,
                            kshape, self.strides, dil)
        self.pads = pads if any(b or e for b, e in pads) else None
        size = [s + b + e for s, (b, e) in zip(spatial, pads)]
        self.size = int(np.prod(size))
        self.out = tuple((p - sp) // st + 1 for p, sp, st in zip(size, span, self.strides))
        self.groups, self.taps = groups, int(np.prod(kshape))
        # flat indices into one sample's (C, prod(size)) of each kernel tap, and of each output
        # position's first tap along each dim
        self.step = [int(np.prod(size[d + 1:])) for d in range(nd)]
        self.offs = np.zeros(self.taps, np.int64)
        grid = np.indices(kshape).reshape(nd, -1)
        for d in range(nd):
            self.offs += grid[d] * (dil[d] * self.step[d])
        # per tap: the output positions that read inside the input (a box, None where none does)
        # and the strided slices of the unpadded input they read
        self._slices: list[tuple[tuple[slice, ...], tuple[slice, ...]] | None] = []
        self._full = True  # every tap reads inside the input at every position (no zeros to write)
        for t in range(self.taps):
            box, src = [], []
            for d in range(nd):
                o = int(grid[d, t]) * dil[d] - pads[d][0]  # input index of position 0's tap
                st = self.strides[d]
                lo = -(o // st) if o < 0 else 0  # first position p with p * st + o >= 0
                hi = min(self.out[d], (spatial[d] - 1 - o) // st + 1) if spatial[d] - 1 - o >= 0 else 0
                box.append(slice(lo, max(lo, hi)))
                src.append(slice(lo * st + o, (hi - 1) * st + o + 1, st) if hi > lo else slice(0, 0))
            if any(b.stop <= b.start for b in box):
                self._slices.append(None)
                self._full = False
                continue
            self._full = self._full and all(b.start == 0 and b.stop == n for b, n in zip(box, self.out))
            self._slices.append((tuple(box), tuple(src)))

    def padded(self, x: np.ndarray) -> np.ndarray:
        """The batch x (N, C, *spatial) with the Conv's padding (x itself where it has none)."""
        if self.pads is None:
            return x
        return np.pad(x, [(0, 0), (0, 0), *self.pads])

    def rows(self, x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """(groups, rows, cin_g * prod(kernel)) patches that the Conv's outputs read from the
        batch x (N, C, *spatial), in the weight's (cin_g, *kernel) order (a transposed view of
        one contiguous (C, K, rows) copy, rows sample-major); at most MAX_ROWS output positions,
        drawn before any patch is copied."""
        n, c = x.shape[:2]
        out_shape = (n,) + self.out
        count = int(np.prod(out_shape))
        if count <= MAX_ROWS:  # every position: a strided slice per tap
            xc = np.moveaxis(x, 1, 0)  # (C, N, *spatial), a view
            dst = np.empty((c, self.taps) + out_shape, np.float32) if self._full else \
                np.zeros((c, self.taps) + out_shape, np.float32)
            for t, sl in enumerate(self._slices):
                if sl is not None:
                    dst[(slice(None), t, slice(None)) + sl[0]] = xc[(slice(None), slice(None)) + sl[1]]
            patches = dst.reshape(c, self.taps, count)
        else:
            pos = np.unravel_index(_pick(count, rng), out_shape)
            base = pos[0] * self.size  # the sample, in (C, N * prod(size))
            for d in range(len(self.out)):
                base = base + pos[1 + d] * (self.strides[d] * self.step[d])
            idx = self.offs[:, None] + base[None, :]
            xp = self.padded(x)
            # one take copies exactly the patches, channels outermost: no copy is transposed after
            flat = xp[0].reshape(c, -1) if n == 1 else np.moveaxis(xp.reshape(n, c, -1), 1, 0).reshape(c, -1)
            patches = np.take(flat, idx, axis=1)  # (C, K, rows)
        return patches.reshape(self.groups, c // self.groups * self.taps, -1).transpose(0, 2, 1)


class GramTap:
    """The layer inputs' second moments H of every GPTQ target of `plan`, accumulated from the
    batches a calibration run shows it (`names`: the tensors it reads; `update` per batch) or
    from a run of its own (`run`).

    Each sample's rows wait in a block of SAMPLE_BLOCK samples by index (ROW_BLOCK for 2-D
    inputs, a row per sample) carried across batches; a full block is summed in float32 (with
    a power-of-two rescale where a value could overflow) and the blocks are added in float64 in
    a tree fixed by their index (`_TreeSum`): no sum depends on the batch size, nor on how the
    samples were cut into shards. Targets that read one input through the same view (kind,
    transA, or the Conv's kernel, pads, strides, dilations and groups) share one H.

    Sharded (`shard` on a worker, `merge` in the driver): a shard sums the blocks that lie
    wholly inside it and sends back the rows of the samples of blocks that cross its edges;
    the driver completes those blocks and adds everything in the same tree, so H is the same
    bytes as one pass over all samples."""

    def __init__(self, model: onnx.ModelProto, plan: PrecisionPlan) -> None:
        self.targets, self.skipped = _targets(model, plan)
        self._shapes = {t.name: tuple(t.dims) for t in model.graph.initializer}
        self.names = sorted({t.node.input[0] for t in self.targets})
        self.samples = 0
        self.complete = False
        # one accumulating target per distinct view of an input; the others copy its H at finish
        self._owner: dict[int, int] = {}
        seen: dict[tuple[object, ...], int] = {}
        for ti, t in enumerate(self.targets):
            self._owner[ti] = seen.setdefault(self._view(t), ti)
        self._pending: dict[int, _Block] = {}
        self._sums: dict[int, _TreeSum] = {}
        # a shard's samples [lo, hi) of `total` (None: one pass over everything); the rows of
        # samples whose block crosses the shard's edges, per target, in sample order
        self._span: tuple[int, int, int] | None = None
        self._edges: dict[int, list[tuple[int, np.ndarray]]] = {}
        self._block: dict[int, int] = {}  # samples per block of each target (by its input's rank)
        self._patches: dict[int, _Patches] = {}  # each Conv's geometry for the last input size it saw

    def _view(self, t: _Target) -> tuple[object, ...]:
        """What H depends on besides the data: the input and how the layer reads it."""
        if t.kind == "conv":
            attrs = tuple((a.name, tuple(a.ints), a.s, a.i) for a in sorted(t.node.attribute, key=lambda a: a.name)
                          if a.name in ("pads", "strides", "dilations", "auto_pad", "group"))
            return (t.node.input[0], "conv", self._shapes[t.weight][1:], attrs)
        return (t.node.input[0], "rows", t.kind == "gemm" and _int(t.node, "transA", 0) == 1)

    def update(self, values: dict[str, np.ndarray], rows: int) -> None:
        """Add one batch of `rows` samples; `values`: the batch's tensors of `names`."""
        first = self.samples
        for ti, t in enumerate(self.targets):
            if self._owner[ti] != ti or t.node.input[0] not in values:
                continue
            v = np.asarray(values[t.node.input[0]], dtype=np.float32)
            if t.kind == "gemm" and _int(t.node, "transA", 0):
                v = v.T
            block = self._block[ti] = ROW_BLOCK if v.ndim == 2 else SAMPLE_BLOCK
            geo = None
            if t.kind == "conv":
                geo = self._patches.get(ti)
                if geo is None or geo.spatial != tuple(v.shape[2:]):  # one geometry a layer: memory stays bounded
                    geo = self._patches[ti] = _Patches(t.node, list(self._shapes[t.weight][2:]), t.groups,
                                                       tuple(v.shape[2:]))
            for j in range(v.shape[0]):
                if t.cap is not None and first + j >= t.cap:
                    break  # a wide layer: its first samples only (GRAM_BUDGET)
                if v.ndim == 2:  # one row per sample
                    r = v[j:j + 1][None]
                else:
                    rng = np.random.default_rng([ti, first + j])
                    if geo is not None:  # a Conv
                        r = geo.rows(v[j:j + 1], rng)
                    else:
                        x = v[j].reshape(-1, v.shape[-1])
                        r = x[_pick(x.shape[0], rng)][None]
                self._take(ti, first + j, r, block)
        self.samples += rows

    def finish(self) -> None:
        """After the last batch: the samples still pending enter H; shared grams are handed out.
        (A shard only closes its blocks: `merge` finishes in the driver.)"""
        for ti in list(self._pending):
            self._flush(ti)
        if self._span is not None:
            return
        for ti, s in self._sums.items():
            self.targets[ti].gram = s.total()
        self._hand_out()

    def _hand_out(self) -> None:
        for ti, owner in self._owner.items():
            if owner != ti:
                self.targets[ti].gram = self.targets[owner].gram
                self.targets[ti].finite = self.targets[owner].finite
        self.complete = True

    def run(self, model: onnx.ModelProto, feeds: Iterable[dict[str, np.ndarray]]) -> None:
        """A float run of `model` of its own over `feeds` (where no calibration run fed it)."""
        from ..evaluate import make_session

        inputs = {i.name for i in model.graph.input}
        fetch = [x for x in self.names if x not in inputs]
        # no graph optimization, as the calibration pass: fused kernels round differently, and
        # the grams (and codes) must not depend on which pass measured them
        sess = make_session(with_outputs(model, fetch).SerializeToString(), optimize=False)
        for feed in feeds:
            values = dict(zip(fetch, sess.run(fetch, feed))) if fetch else {}
            values.update({k: v for k, v in feed.items() if k in self.names})
            self.update(values, feed_rows(feed))
        self.finish()

    # -- shards --------------------------------------------------------------------------------
    def shard(self, lo: int, hi: int, total: int) -> GramTap:
        """An empty copy of this tap (no grams yet) that accumulates the samples ``[lo, hi)`` of
        `total`, for a worker: its batches are given as usual (`update`), from sample `lo` on."""
        if self.samples or self._pending or self._sums:
            raise MixqError("GramTap.shard: the tap has seen samples already (shard an empty tap)")
        if not 0 <= lo <= hi <= total:
            raise MixqError(f"GramTap.shard: samples [{lo}, {hi}) are not within 0..{total}")
        part = copy.copy(self)
        part.targets = [replace(t) for t in self.targets]
        part._pending, part._sums, part._edges, part._block, part._patches = {}, {}, {}, {}, {}
        part.samples, part._span = lo, (lo, hi, total)
        return part

    def partial(self) -> dict[str, Any]:
        """A shard's result after its pass, as plain data: per accumulating target, its tree's
        pieces (aligned runs of whole blocks and their float64 sums), the rows of its edge
        samples, and whether every value was finite."""
        if self._span is None:
            raise MixqError("GramTap.partial is the result of a shard (see GramTap.shard)")
        lo, hi, _ = self._span
        if self.samples != hi:
            raise MixqError(f"GramTap shard of samples [{lo}, {hi}) saw {self.samples - lo} samples")
        for ti in list(self._pending):
            self._flush(ti)
        out = {}
        for ti, t in enumerate(self.targets):
            if self._owner[ti] == ti:
                s = self._sums.get(ti)
                out[str(ti)] = {"pieces": list(s.stack) if s is not None else [],
                                "edges": self._edges.get(ti, []), "finite": t.finite,
                                "block": self._block.get(ti, 0)}
        return {"lo": lo, "hi": hi, "targets": out}

    def merge(self, partials: Sequence[dict[str, Any]]) -> None:
        """The grams of the shards' `partial` results (in any order, covering every sample once):
        the blocks that crossed shard edges are completed here from their rows, and every block
        enters the same tree as in one pass. The tap is then `complete`."""
        if self.samples or self._pending or self._sums:
            raise MixqError("GramTap.merge needs an empty tap (the shards' own)")
        parts = sorted(partials, key=lambda p: int(p["lo"]))
        edge = 0
        for p in parts:
            if int(p["lo"]) != edge:
                raise MixqError(f"GramTap.merge: the shards do not cover samples {edge}..{int(p['lo'])}")
            edge = int(p["hi"])
        self.samples = edge
        for ti, t in enumerate(self.targets):
            if self._owner[ti] != ti:
                continue
            got = [p["targets"][str(ti)] for p in parts if str(ti) in p["targets"]]
            t.finite = all(bool(g["finite"]) for g in got)
            pieces = [tuple(pc) for g in got for pc in g["pieces"]]
            rows = [e for g in got for e in g["edges"]]
            block = next((int(g["block"]) for g in got if g["block"]), SAMPLE_BLOCK)
            by_block: dict[int, list[np.ndarray]] = {}
            for idx, r in sorted(rows, key=lambda e: int(e[0])):
                by_block.setdefault(int(idx) // block, []).append(r)
            for bid, rs in by_block.items():
                b = _Block()
                for r in rs:
                    self._add(t, b, r)
                pieces.append((bid, 1, self._leaf(t, b)))
            tree = _TreeSum()
            for start, size, value in sorted(pieces, key=lambda pc: int(pc[0])):
                tree.push(int(start), int(size), value)
            t.gram = tree.total()
        self._hand_out()

    # -- accumulation --------------------------------------------------------------------------
    def _take(self, ti: int, idx: int, r: np.ndarray, block: int) -> None:
        """Sample `idx`'s rows r (groups, rows, k) into target ti's block of `block` samples by
        index (or, in a shard, kept as an edge row where the block crosses the shard's edge)."""
        bid = idx // block
        if self._span is not None:
            lo, hi, total = self._span
            if bid * block < lo or min(bid * block + block, total) > hi:
                self._edges.setdefault(ti, []).append((idx, r))
                return
        b = self._pending.get(ti)
        if b is not None and b.bid != bid:  # a block left incomplete (not in a shard)
            self._flush(ti)
            b = None
        if b is None:
            b = self._pending[ti] = _Block(bid=bid)
        self._add(self.targets[ti], b, r)
        end = bid * block + block
        if self._span is not None:
            end = min(end, self._span[2])
        if idx + 1 == end:
            self._flush(ti)

    def _add(self, t: _Target, b: _Block, r: np.ndarray) -> None:
        """One sample's rows into block b: its product now where it has at least as many rows
        as H has columns (the rows are then dropped), else its rows, for one product of the
        block's rows put together."""
        if r.shape[1] >= r.shape[2]:
            g = self._gram32(t, b, r)
            if g is not None:
                b.g = g if b.g is None else np.add(b.g, g, out=b.g)
        else:
            b.parts.append(r)

    def _flush(self, ti: int) -> None:
        """Target ti's pending block (full, or the last one) into its tree, in float64."""
        b = self._pending.pop(ti, None)
        if b is None:
            return
        leaf = self._leaf(self.targets[ti], b)
        self._sums.setdefault(ti, _TreeSum()).push(b.bid, 1, leaf)

    def _leaf(self, t: _Target, b: _Block) -> np.ndarray | None:
        """Block b's sum in float64: its float32 products, then the rescaled ones."""
        if b.parts:
            g = self._gram32(t, b, b.parts[0] if len(b.parts) == 1 else np.concatenate(b.parts, axis=1))
            if g is not None:
                b.g = g if b.g is None else b.g + g
            b.parts = []
        leaf = None if b.g is None else b.g.astype(np.float64)
        if b.h64 is not None:
            leaf = b.h64 if leaf is None else leaf + b.h64
        return leaf

    @staticmethod
    def _gram32(t: _Target, b: _Block, r: np.ndarray) -> np.ndarray | None:
        """r^T r in float32; None where it went into b's float64 part already (rescaled by a
        power of two, exact, since the products or their sums could over- or underflow float32)
        or r holds inf / NaN (t is marked)."""
        big = max(abs(float(r.max())), abs(float(r.min()))) if r.size else 0.0
        if not np.isfinite(big):
            t.finite = False
            return None
        e = int(np.ceil(np.log2(big))) if big > 0 else 0
        if -30 <= e <= 40:  # no rescale needed: it would change no bit
            return np.matmul(r.transpose(0, 2, 1), r)
        rs = r / np.float32(2.0 ** e)
        g64 = np.matmul(rs.transpose(0, 2, 1), rs).astype(np.float64) * (4.0 ** e)
        b.h64 = g64 if b.h64 is None else b.h64 + g64
        return None


@dataclass
class _Block:
    """A target's samples of one block so far: its index, the float32 sum of their products,
    the rows still to be multiplied, the float64 sum of the rescaled products."""

    bid: int = 0
    g: np.ndarray | None = None
    parts: list[np.ndarray] = field(default_factory=list)
    h64: np.ndarray | None = None


class _TreeSum:
    """A float64 sum of blocks 0..n-1 whose rounding depends on n only: each aligned run of
    2^j blocks is the sum of its two halves, and [0, n) is the sum, left to right, of its
    largest aligned runs. Pieces (start block, blocks, sum) are pushed in order; two adjacent
    halves of one aligned run are added as soon as both are there, so whoever summed a run
    (one pass, or a shard) the total gets the same bits. None is an empty sum."""

    def __init__(self) -> None:
        self.stack: list[tuple[int, int, np.ndarray | None]] = []

    def push(self, start: int, size: int, value: np.ndarray | None) -> None:
        self.stack.append((start, size, value))
        while len(self.stack) >= 2:
            s1, n1, v1 = self.stack[-2]
            s2, n2, v2 = self.stack[-1]
            if n1 != n2 or s1 % (2 * n1) or s1 + n1 != s2:
                break
            self.stack[-2:] = [(s1, 2 * n1, _add64(v1, v2))]

    def total(self) -> np.ndarray | None:
        out: np.ndarray | None = None
        for _, _, v in self.stack:
            out = _add64(out, v)
        return out


def _add64(a: np.ndarray | None, b: np.ndarray | None) -> np.ndarray | None:
    if a is None:
        return b
    return a if b is None else a + b


def _layout(t: _Target, w: np.ndarray) -> tuple[np.ndarray, Callable[[np.ndarray], np.ndarray]]:
    """The weight as (groups, rows, k) and the function that puts such an array back."""
    shape = w.shape
    if t.kind == "conv":
        cout = shape[0]
        return (w.reshape(t.groups, cout // t.groups, -1),
                lambda a: a.reshape(shape))
    trans = t.kind == "gemm" and _int(t.node, "transB", 0)
    if trans:  # (N, K): rows are outputs already
        return w[None], lambda a: a[0]
    return w.T[None], lambda a: a[0].T


def _lower_inverse(low: np.ndarray, base: int = 64) -> np.ndarray:
    """The inverse of the lower-triangular matrices `low` (g, n, n), by halves: the inverse of
    [[A, 0], [C, D]] is [[A^-1, 0], [-D^-1 C A^-1, D^-1]] (matrix products, a third of the
    work of a general inverse; numpy has no triangular inverse)."""
    n = low.shape[-1]
    if n <= base:
        return np.tril(np.linalg.inv(low))  # (LU leaves rounding dust above the diagonal)
    m = n // 2
    a, d = _lower_inverse(low[:, :m, :m], base), _lower_inverse(low[:, m:, m:], base)
    out = np.zeros_like(low)
    out[:, :m, :m], out[:, m:, m:] = a, d
    out[:, m:, :m] = -np.matmul(d, np.matmul(low[:, m:, :m], a))
    return out


def _upper_cholesky_of_inverse(h: np.ndarray) -> np.ndarray:
    """Upper-triangular u with u^T u = inv(h), for symmetric positive definite h (g, k, k),
    without forming inv(h): with J the reversal of the order, J h J = L L^T gives
    inv(h) = (J L^-1 J)^T (J L^-1 J), and J L^-1 J is upper triangular (3x faster than
    cholesky(inv(h)) at k = 1536; the same factor to 1e-15)."""
    return np.ascontiguousarray(_lower_inverse(np.linalg.cholesky(h[:, ::-1, ::-1]))[:, ::-1, ::-1])


def _gptq(w: np.ndarray, h: np.ndarray, s: np.ndarray, z: np.ndarray, lo: float, hi: float,
          damp: float, block: int, act_order: bool = True) -> tuple[np.ndarray, float, float]:
    """GPTQ codes of w (g, r, k) for the grams h (g, k, k) on the grid (s, z, [lo, hi]) of the
    same shape as w; with the H-weighted error of nearest rounding and of these codes."""
    g, _, k = w.shape
    w = w.astype(np.float64)
    s = s.astype(np.float64)
    z = z.astype(np.float64)
    h = h.copy()
    diag = np.einsum("gii->gi", h)
    dead = diag <= 0
    idx = np.arange(k)
    h[:, idx, idx] += np.where(dead, 1.0, 0.0) + damp * np.maximum(diag.mean(axis=1, keepdims=True), 1e-30)
    # act order: the columns with the largest input energy first (their errors get spread over
    # the most columns); scales are fixed, so the order changes only which codes are chosen
    order = np.argsort(-np.einsum("gii->gi", h), axis=1, kind="stable") if act_order \
        else np.broadcast_to(idx, (g, k))
    # columns as rows (g, k, r): each step reads and updates contiguous memory
    take = lambda a: np.ascontiguousarray(  # noqa: E731
        np.take_along_axis(a, order[:, None, :], axis=2).transpose(0, 2, 1))
    wt, st, zt = take(w), take(s), take(z)
    hp = np.take_along_axis(np.take_along_axis(h, order[:, :, None], axis=1), order[:, None, :], axis=2)
    u = _upper_cholesky_of_inverse(hp)  # inv(hp) = u^T u
    ud = np.einsum("gii->gi", u)
    qt = np.empty_like(wt)
    for b0 in range(0, k, block):
        b1 = min(b0 + block, k)
        err = np.empty((g, b1 - b0, wt.shape[2]))
        for i in range(b0, b1):
            col = wt[:, i]
            code = np.clip(np.rint(col / st[:, i]) + zt[:, i], lo, hi)
            qt[:, i] = code
            e = (col - (code - zt[:, i]) * st[:, i]) / ud[:, i, None]
            wt[:, i + 1:b1] -= u[:, i, i + 1:b1, None] * e[:, None, :]
            err[:, i - b0] = e
        if b1 < k:
            wt[:, b1:] -= np.matmul(u[:, b0:b1, b1:].transpose(0, 2, 1), err)
    codes = np.empty_like(w)
    np.put_along_axis(codes, order[:, None, :], qt.transpose(0, 2, 1), axis=2)
    nearest = np.clip(np.rint(w / s) + z, lo, hi)

    def cost(c: np.ndarray) -> float:
        d = w - (c - z) * s
        return float(np.sum(np.matmul(d, h) * d))
    return codes, cost(nearest), cost(codes)


def _int_format(plan: PrecisionPlan, weight: str) -> IntFormat | None:
    tp = plan.tensors.get(weight)
    fmt = get_format(tp.format) if tp is not None and tp.format is not None else None
    return fmt if isinstance(fmt, IntFormat) else None


def _round_one(t: _Target, w: np.ndarray, qp: QParams, fmt: IntFormat, damp: float, act_order: bool,
               block: int) -> tuple[np.ndarray, float] | str:
    """The dequantized GPTQ weight of `t` on the grid (`fmt`, `qp`) with its H-weighted layer
    output error relative to nearest rounding's; or why it keeps nearest rounding."""
    if not t.finite:
        return "its input held inf or NaN in the calibration run"
    if t.gram is None:
        return "its input was not seen in the calibration run"
    s = expand_param(qp.scale, w.shape, qp.axis, qp.block_size).astype(np.float32)
    z = expand_param(qp.zero_point, w.shape, qp.axis, qp.block_size).astype(np.float32)
    s, z = np.broadcast_to(s, w.shape), np.broadcast_to(z, w.shape)
    wl, back = _layout(t, w)
    if t.gram.shape != (wl.shape[0], wl.shape[2], wl.shape[2]):
        return f"its input's shape does not match the weight {list(w.shape)}"
    lo, hi = (float(b) for b in fmt._fbounds)
    try:
        codes, before, after = _gptq(wl, t.gram, _layout(t, s)[0], _layout(t, z)[0], lo, hi,
                                     damp, block, act_order)
    except np.linalg.LinAlgError:
        return "its input's second moments are singular even after dampening"
    q = back(codes.astype(np.float32))
    new = fmt.dequantize(q, qp).astype(np.float32)
    if not np.array_equal(fmt.quantize(new, qp), q):
        raise MixqError(f"internal error: GPTQ codes of {t.weight} do not survive requantization")
    return new, (after / before if before > 0 else 1.0)


def gptq_round(model: onnx.ModelProto, plan: PrecisionPlan, qparams: dict[str, QParams],
               tap: GramTap, *, damp: float = GPTQ_DAMP, act_order: bool = True,
               block: int = GPTQ_BLOCK) -> WeightRoundingReport:
    """Replace, in place, the integer-planned Conv / Gemm / MatMul weights of `model` by the
    dequantized GPTQ codes on their `qparams` grid (see the module docstring), from the grams
    of a finished `tap`. Targets whose weight `plan` no longer puts on an integer grid (a
    numerics policy kept it float) are left alone."""
    rep = WeightRoundingReport(skipped=dict(tap.skipped), samples=tap.samples)
    inits = {t.name: t for t in model.graph.initializer}
    for t in tap.targets:
        fmt = _int_format(plan, t.weight)
        if fmt is None or t.weight not in qparams:
            continue
        w = numpy_helper.to_array(inits[t.weight]).astype(np.float32)
        got = _round_one(t, w, qparams[t.weight], fmt, damp, act_order, block)
        if isinstance(got, str):
            rep.skipped[t.weight] = got
            continue
        rep.original[t.weight] = w
        inits[t.weight].CopyFrom(numpy_helper.from_array(got[0], t.weight))
        rep.rounded[t.weight] = got[1]
        if t.cap is not None and t.cap < tap.samples:
            rep.capped[t.weight] = t.cap
    return rep


class WeightRounder:
    """GPTQ-rounded weights for any plan of one calibrated model: what a search applies to each
    plan it builds. A weight's codes depend only on its grid and its layer's input statistics
    (not on the other layers' formats), so each (weight, grid) is rounded once."""

    def __init__(self, model: onnx.ModelProto, tap: GramTap, *, damp: float = GPTQ_DAMP,
                 act_order: bool = True, block: int = GPTQ_BLOCK) -> None:
        inits = {t.name: t for t in model.graph.initializer}
        self._targets = {t.weight: t for t in tap.targets}
        self._float = {w: numpy_helper.to_array(inits[w]).astype(np.float32) for w in self._targets}
        self._done: dict[tuple[object, ...], np.ndarray | None] = {}
        self.damp, self.act_order, self.block = damp, act_order, block

    def __bool__(self) -> bool:
        return bool(self._targets)

    def weights(self, plan: PrecisionPlan, qparams: dict[str, QParams]) -> dict[str, np.ndarray]:
        """Weight name -> its GPTQ-rounded float values for `plan`'s integer weights (the rewrite
        quantizes them to GPTQ's codes); weights GPTQ skips are not listed (nearest)."""
        out = {}
        for w, t in self._targets.items():
            fmt, qp = _int_format(plan, w), qparams.get(w)
            if fmt is None or qp is None:
                continue
            key = (w, fmt.name, qp.axis, qp.block_size, np.asarray(qp.scale).tobytes(),
                   np.asarray(qp.zero_point).tobytes())
            if key not in self._done:
                got = _round_one(t, self._float[w], qp, fmt, self.damp, self.act_order, self.block)
                self._done[key] = None if isinstance(got, str) else got[0]
            new = self._done[key]
            if new is not None:
                out[w] = new
        return out
