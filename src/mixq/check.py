"""`mixq check`: what mixq can and cannot quantize in a model, and why, before any work is done.

`check_model_support(model)` reads only the graph (a path is loaded without its external data,
so checking a 10 GB model is instant) and reports: op counts per op type with their status
(quantizable / pass-through / left float and why), control-flow subgraphs, dynamic inputs, the
opset and whether mixq converts it, external data, custom domains, and whether the ONNX checker
accepts the model.
"""
from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import onnx

from ._io import load_model
from .errors import ModelError
from .graph import subgraphs
from .passes.prepare import (MAX_RUNTIME_OPSET, TARGET_OPSET, check_float_model, check_input_model, model_opset,
                             repair_output_shapes, undeclared_shapes)
from .passes.unfuse import EXPANDED_OPS, MS_DOMAIN, admit_runtime_ops, needs_admission
from .plan.ops import semantics, unsupported_reason

__all__ = ["OpSupport", "SupportReport", "check_model_support", "custom_op_problems"]

#: Domains onnxruntime implements besides the default one.
ORT_DOMAINS = {"com.microsoft": "onnxruntime contrib op", "ai.onnx.ml": "ONNX-ML op",
               "com.microsoft.nchwc": "onnxruntime internal op", "com.mixq": "mixq function"}

QUANTIZABLE, PASS_THROUGH, LEFT_FLOAT = "quantizable", "pass-through", "left float"


@dataclass(frozen=True)
class OpSupport:
    """One op type: how many nodes, and what mixq does with them."""

    domain: str
    op_type: str
    count: int
    status: str   # QUANTIZABLE | PASS_THROUGH | LEFT_FLOAT
    reason: str

    @property
    def qualified(self) -> str:
        return self.op_type if self.domain in ("", "ai.onnx") else f"{self.domain}.{self.op_type}"


@dataclass
class SupportReport:
    """What `check_model_support` found (see the module docstring)."""

    source: str
    ir_version: int
    opset: int
    opset_action: str
    ops: list[OpSupport] = field(default_factory=list)
    subgraphs: list[tuple[str, str, int]] = field(default_factory=list)   # node, op type, nodes inside
    dynamic_inputs: dict[str, str] = field(default_factory=dict)           # name -> shape
    external_data: dict[str, int] = field(default_factory=dict)            # file -> bytes
    custom_domains: dict[str, str] = field(default_factory=dict)           # domain -> status
    weight_bytes: int = 0
    checker: str = "ok"
    problems: list[str] = field(default_factory=list)

    @property
    def num_nodes(self) -> int:
        return sum(o.count for o in self.ops)

    def count(self, status: str) -> int:
        return sum(o.count for o in self.ops if o.status == status)

    @property
    def ok(self) -> bool:
        """Whether mixq can quantize the model as it is (left-float ops are fine)."""
        return not self.problems

    def table(self) -> str:
        """A Markdown report."""
        lines = [f"## mixq check: {self.source}", "",
                 "| what | value |", "|---|---|",
                 f"| IR version | {self.ir_version} |",
                 f"| opset | {self.opset}: {self.opset_action} |",
                 f"| nodes | {self.num_nodes} ({self.count(QUANTIZABLE)} quantizable, "
                 f"{self.count(PASS_THROUGH)} pass-through, {self.count(LEFT_FLOAT)} left float) |",
                 f"| weights | {self.weight_bytes / 1e6:.3f} MB |",
                 "| external data | " + (", ".join(f"{f} ({b / 1e6:.1f} MB)" for f, b in self.external_data.items())
                                        or "none") + " |",
                 "| dynamic inputs | " + (", ".join(f"{k} {v}" for k, v in self.dynamic_inputs.items())
                                         or "none") + " |",
                 f"| ONNX checker | {self.checker} |"]
        lines += ["", "| op | nodes | status | why |", "|---|---|---|---|"]
        order = {QUANTIZABLE: 0, PASS_THROUGH: 1, LEFT_FLOAT: 2}
        for o in sorted(self.ops, key=lambda o: (order[o.status], -o.count, o.qualified)):
            lines.append(f"| {o.qualified} | {o.count} | {o.status} | {o.reason} |")
        if self.subgraphs:
            lines += ["", "Control flow (subgraphs are left float; quantization around them works):"]
            lines += [f"- {op} node {name!r}: {n} nodes inside" for name, op, n in self.subgraphs]
        if self.custom_domains:
            lines += ["", "Custom domains:"]
            lines += [f"- {d}: {s}" for d, s in sorted(self.custom_domains.items())]
        if self.problems:
            lines += ["", "Problems (quantization fails until they are fixed):"]
            lines += [f"- {p}" for p in self.problems]
        return "\n".join(lines)


def _status(node: onnx.NodeProto) -> tuple[str, str]:
    if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
        return PASS_THROUGH, "becomes an initializer: quantized where a quantizable op reads it"
    if node.domain == MS_DOMAIN and node.op_type in EXPANDED_OPS:
        # what quantize does with it (most forms; a declined one is named in its summary)
        return QUANTIZABLE, "onnxruntime fused op: expanded into the standard ops it computes, quantized as those"
    if node.domain in ("", "ai.onnx") and node.op_type == "SimplifiedLayerNormalization":
        return QUANTIZABLE, "onnxruntime's RMSNorm: written out in standard ops, quantized as those"
    sem = semantics(node)
    if sem is None:
        return LEFT_FLOAT, unsupported_reason(node)
    if sem.passthrough:
        return PASS_THROUGH, "moves data: keeps its input's quantization"
    if sem.weight is not None:
        return QUANTIZABLE, "activations and weights (per channel)" + (", int32 bias" if sem.bias is not None else "")
    return QUANTIZABLE, "activations"


def _einsum_status(model: onnx.ModelProto) -> tuple[str, str]:
    """Einsums are quantizable where prepare's recognition pass rewrites them as MatMul (a
    matrix product with a weight, or a batched one of two run-time tensors)."""
    from .passes.recognize import einsum_verdicts

    verdicts = einsum_verdicts(model)
    kept = [v for v in verdicts if v is not None]
    if not kept:
        return QUANTIZABLE, "a matrix product: rewritten as MatMul, activations (and weights)"
    if len(kept) == len(verdicts):
        return LEFT_FLOAT, f"no matrix product ({kept[0]})"
    return QUANTIZABLE, (f"{len(verdicts) - len(kept)} of {len(verdicts)} are matrix products (rewritten "
                         f"as MatMul); the others stay float ({kept[0]})")


def _count_nodes(g: onnx.GraphProto) -> int:
    return sum(1 + sum(_count_nodes(s) for s in subgraphs(n)) for n in g.node)


def _all_nodes(g: onnx.GraphProto):
    for n in g.node:
        yield n
        for s in subgraphs(n):
            yield from _all_nodes(s)


def custom_op_problems(model: onnx.ModelProto) -> dict[str, str]:
    """{domain: status} for every non-default domain used by a node (subgraphs included)."""
    local = {(f.domain, f.name) for f in model.functions}
    out: dict[str, str] = {}
    for n in _all_nodes(model.graph):
        d = n.domain
        if d in ("", "ai.onnx"):
            continue
        if (d, n.op_type) in local:
            out.setdefault(d, "model-local functions (onnxruntime inlines them; left float)")
        elif d == MS_DOMAIN:
            out.setdefault(d, f"{ORT_DOMAINS[d]}s (run by stock onnxruntime; its fused layer ops are expanded "
                              "into standard ops and quantized, the others left float)")
        elif d in ORT_DOMAINS:
            out.setdefault(d, f"{ORT_DOMAINS[d]}s (run by stock onnxruntime; left float)")
        else:
            out[d] = (f"op {d}.{n.op_type} has no implementation in stock onnxruntime: it needs "
                      "its custom op library, so mixq cannot calibrate through it (left float)")
    return out


def _shape(vi: onnx.ValueInfoProto) -> tuple[str, bool]:
    tt = vi.type.tensor_type
    if not tt.HasField("shape"):
        return "(unknown rank)", True
    dims = [str(d.dim_value) if d.HasField("dim_value") else (d.dim_param or "?") for d in tt.shape.dim]
    dynamic = any(not d.HasField("dim_value") for d in tt.shape.dim)
    return "[" + ", ".join(dims) + "]", dynamic


def check_model_support(model: onnx.ModelProto | str | os.PathLike) -> SupportReport:
    """What mixq can and cannot quantize in `model` (a ModelProto or a path), and why.

    Raises ModelError only when the file cannot be read as ONNX at all; everything else (a model
    failing the checker, an opset too new, unknown custom ops) is reported in `problems`."""
    source = "<ModelProto>"
    if not isinstance(model, onnx.ModelProto):
        source = str(model)
        model = load_model(model, load_external=False)  # the graph only: instant on huge models
    g = model.graph
    opset = model_opset(model)
    if opset > onnx.defs.onnx_opset_version():
        action = f"newer than onnx {onnx.__version__} knows (up to {onnx.defs.onnx_opset_version()})"
    elif opset > MAX_RUNTIME_OPSET:
        action = f"converted down to {MAX_RUNTIME_OPSET} (the newest onnxruntime runs)"
    elif opset < TARGET_OPSET:
        action = f"upgraded to {TARGET_OPSET} (needed for per-channel and int16 QDQ)"
    else:
        action = "used as is"
    rep = SupportReport(source=source, ir_version=int(model.ir_version), opset=opset, opset_action=action)
    if opset > onnx.defs.onnx_opset_version():
        rep.problems.append(f"opset {opset} is newer than onnx {onnx.__version__} supports; "
                            f"re-export the model with opset {MAX_RUNTIME_OPSET} or lower")
    if opset and opset < 7:
        rep.problems.append(f"opset {opset} is too old for the ONNX version converter to upgrade "
                            "reliably; re-export the model with opset 13 or newer")

    counts: Counter = Counter((n.domain, n.op_type) for n in g.node)
    first: dict[tuple[str, str], onnx.NodeProto] = {}
    for n in g.node:
        first.setdefault((n.domain, n.op_type), n)
    for (dom, op), c in counts.items():
        status, why = _einsum_status(model) if (dom, op) in (("", "Einsum"), ("ai.onnx", "Einsum")) \
            else _status(first[(dom, op)])
        rep.ops.append(OpSupport(dom, op, c, status, why))
    for n in g.node:
        subs = list(subgraphs(n))
        if subs:
            rep.subgraphs.append((n.name or f"<unnamed {n.op_type}>", n.op_type,
                                  sum(_count_nodes(s) for s in subs)))

    inits = {t.name for t in g.initializer}
    for vi in g.input:
        if vi.name in inits:
            continue
        shape, dynamic = _shape(vi)
        if dynamic:
            rep.dynamic_inputs[vi.name] = shape

    for t in g.initializer:
        if t.data_location == onnx.TensorProto.EXTERNAL:
            info = {e.key: e.value for e in t.external_data}
            loc = info.get("location", "?")
            length = int(info.get("length", 0) or 0)
            if not length:
                n_el = 1
                for d in t.dims:
                    n_el *= d
                length = n_el * onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize \
                    if t.data_type not in (onnx.TensorProto.STRING, onnx.TensorProto.UNDEFINED) else 0
            rep.external_data[loc] = rep.external_data.get(loc, 0) + length
            rep.weight_bytes += length
        else:
            rep.weight_bytes += t.ByteSize()
    rep.weight_bytes += sum(a.t.ByteSize() for n in g.node if n.op_type == "Constant"
                            for a in n.attribute if a.type == onnx.AttributeProto.TENSOR)
    if rep.external_data and source != "<ModelProto>":
        base = Path(source).expanduser().parent
        for loc in rep.external_data:
            if not (base / loc).is_file():
                rep.problems.append(f"external data file {loc!r} is missing next to the model; "
                                    "copy it into the model's folder")

    rep.custom_domains = custom_op_problems(model)
    for problem in rep.custom_domains.values():
        if "custom op library" in problem:
            rep.problems.append(f"{problem}; calibrated presets fail, cast/block presets leave it float")

    try:
        check_float_model(model)
    except ModelError as exc:
        rep.problems.append(str(exc))
    try:
        if rep.external_data and source != "<ModelProto>":
            # the C++ checker reads the file itself: external data is checked, never loaded
            try:
                onnx.checker.check_model(str(Path(source).expanduser()))
            except Exception as exc:  # noqa: BLE001 - reported below
                raise ModelError(f"the input model fails the ONNX checker: {exc}") from exc
        else:
            if needs_admission(model):  # what onnxruntime wrote, read as quantize reads it
                admitted = onnx.ModelProto()
                admitted.CopyFrom(model)
                admit_runtime_ops(admitted)
                model = admitted
            if any(kind == "output" for kind, _ in undeclared_shapes(model)):
                # quantize declares the shapes inference computes; what is left is the problem
                declared = onnx.ModelProto()
                declared.CopyFrom(model)
                fixed = repair_output_shapes(declared)
                model = declared
                if fixed.changed:
                    rep.checker = f"ok once {fixed.changed} output shapes are declared (quantize declares them)"
            check_input_model(model)
    except Exception as exc:  # noqa: BLE001 - reported, not raised
        rep.checker = "fails"
        rep.problems.append(str(exc))
    return rep
