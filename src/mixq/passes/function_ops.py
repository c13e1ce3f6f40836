"""Standard ops that onnxruntime runs at one opset and not at another, expanded into their ONNX
function body before the model's opset is converted.

Some standard ops are ONNX functions that onnxruntime has no kernel for: it expands them at
session creation, but only at the opsets whose function body it can find. Swish (opset 24) runs
in a model of opset 24 and fails in the same model converted to opset 26 ("Could not find an
implementation for Swish(24)"), which the block formats' BitCast needs. Which ops do this is
found empirically, never from a list: a one-node model of the op is probed at the model's opset
and at the target (`mixq.kernels`). An op that runs at the first and not at the second is
replaced, node by node, by the function body ONNX defines for it: exactly what onnxruntime itself
computes for it, so no value changes.
"""
from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto

from ..errors import ModelError
from ..graph import GraphIndex, NameAllocator, PassResult, float_attr, int_attr, model_opset, walk_graphs

__all__ = ["expand_deprecated_group_norm", "expand_function_ops", "stranded_ops"]


def _schema(op_type: str, opset: int) -> onnx.defs.OpSchema | None:
    try:
        return onnx.defs.get_schema(op_type, opset)
    except onnx.defs.SchemaError:
        return None


def _probe_types(ix: GraphIndex, node: onnx.NodeProto) -> tuple[list[int], list[int]]:
    """The element types of `node`'s inputs and outputs as the model records them; float32 where
    it records none (a function op's values are float tensors unless the model says otherwise)."""
    ins = [ix.elem_type(x) or TensorProto.FLOAT for x in node.input]
    first = next((t for t in ins if t), TensorProto.FLOAT)
    outs = [ix.elem_type(x) or first for x in node.output]
    return ins, outs


def _body(schema: Any, opset: int) -> onnx.FunctionProto | None:
    """The context-free function body ONNX gives `schema` for `opset`, if any (the schema is
    typed Any: onnx's stubs lack its function accessors)."""
    versions = [v for v in schema.function_opset_versions if v <= opset]
    if not versions:
        return None
    body = onnx.FunctionProto()
    body.ParseFromString(schema.get_function_with_opset_version(max(versions)))
    return body


def _body_opset(body: onnx.FunctionProto) -> int:
    return next((int(i.version) for i in body.opset_import if i.domain in ("", "ai.onnx")), 0)


def _with_defaults(node: onnx.NodeProto, schema: onnx.defs.OpSchema) -> None:
    """Write the schema's default of every attribute `node` leaves out: a function body reads
    attributes by reference, and an absent one would leave its Constant without a value."""
    have = {a.name for a in node.attribute}
    for name, attr in schema.attributes.items():
        default = attr.default_value
        if name not in have and default.type != onnx.AttributeProto.UNDEFINED:
            node.attribute.append(default)


def expand_function_ops(model: onnx.ModelProto, source: int, target: int,
                        result: PassResult | None = None, *, source_runs: bool = True) -> onnx.ModelProto:
    """Expand, into their ONNX function body, the default-domain nodes (main graph and subgraphs)
    whose op onnxruntime runs at opset `source` and not at `target`. `source_runs=False` (a model
    newer than onnxruntime runs, converted down): every op onnxruntime lacks a kernel for at
    `target`. Returns `model` itself when nothing needs it, else a new model; `result` (when
    given) gets a note per op type. Raises ModelError for such an op that ONNX defines no
    context-free function body for."""
    if source == target:
        return model
    ix = GraphIndex.of(model)
    found: dict[str, onnx.NodeProto] = {}
    for g in walk_graphs(model.graph):
        for n in g.node:
            if n.domain in ("", "ai.onnx") and n.op_type not in found:
                s: Any = _schema(n.op_type, source)
                if s is not None and (s.has_function or s.has_context_dependent_function):
                    found[n.op_type] = n
    if not found:
        return model
    from ..kernels import probe_kernel

    expand: dict[str, tuple[onnx.defs.OpSchema, onnx.FunctionProto]] = {}
    for op, node in sorted(found.items()):
        ins, outs = _probe_types(ix, node)
        after = probe_kernel(node, ins, outs, opset=target)
        if after.ok:
            continue
        if source_runs:
            before = probe_kernel(node, ins, outs, opset=source)
            if not (before.ok and before.verified):
                continue  # not probed in isolation: the whole-model session checks decide
        elif not after.reason.startswith(("no kernel", "This is an invalid model")):
            continue
        schema = _schema(op, source)
        body = None if schema is None else _body(schema, source)
        if schema is None or body is None:
            raise ModelError(
                f"onnxruntime does not run op {op} (node {node.name!r}) at opset {target}, which the "
                f"conversion from opset {source} goes to ({after.reason}), and the function body "
                f"ONNX defines it by depends on the input types, which mixq does not expand. "
                f"Replace {op} by the ops it stands for in the exporter, or export the model at "
                f"opset {target}.")
        expand[op] = (schema, body)
    if not expand:
        return model
    from onnx import inliner

    work = onnx.ModelProto()
    work.CopyFrom(model)
    counts: Counter[str] = Counter()
    for g in walk_graphs(work.graph):
        for n in g.node:
            if n.domain in ("", "ai.onnx") and n.op_type in expand:
                n.domain = ""
                _with_defaults(n, expand[n.op_type][0])
                counts[n.op_type] += 1
    for op, (_, body) in sorted(expand.items()):
        body.domain, body.name = "", op
        work.functions.append(body)
    try:
        work = inliner.inline_selected_functions(work, [("", op) for op in sorted(expand)])
    except RuntimeError as exc:  # a body written for another opset than the model's
        ops = ", ".join(f"{op} (body of opset {_body_opset(b)})" for op, (_, b) in sorted(expand.items()))
        raise ModelError(
            f"onnxruntime does not run {ops} at opset {target}, and its ONNX function body cannot be "
            f"put in a model of opset {source} ({exc}). Export the model at opset {target} or lower, "
            "or replace the op by the ops it stands for.") from exc
    if result is not None:
        import onnxruntime as ort

        for op, k in sorted(counts.items()):
            result.changed += k
            result.notes.append(
                f"{k} x {op} expanded into the ops of its ONNX function body: onnxruntime "
                f"{ort.__version__} does not run {op} at opset {target}, which the conversion from "
                f"{source} goes to (the same values: onnxruntime computes {op} by that body)")
    return work


def stranded_ops(model: onnx.ModelProto, source: int, target: int) -> dict[str, str]:
    """The default-domain ops of `model` (main graph and subgraphs) that onnxruntime runs at
    opset `source` and not at `target`, and that have no ONNX function body to expand (those
    `expand_function_ops` handles): {op type: why}. RoiAlign runs at opset 21 and has no kernel
    for its opset-22 version, which a model converted to 26 gets. Probed empirically, one node
    per op type (`mixq.kernels`, cached)."""
    if target <= source:
        return {}
    from ..kernels import probe_kernel

    ix = GraphIndex.of(model)
    seen: dict[str, onnx.NodeProto] = {}
    for g in walk_graphs(model.graph):
        for n in g.node:
            if n.domain in ("", "ai.onnx") and n.op_type not in seen:
                seen[n.op_type] = n
    out: dict[str, str] = {}
    for op, node in sorted(seen.items()):
        s: Any = _schema(op, target)
        if s is None or s.has_function or s.has_context_dependent_function:
            continue
        old: Any = _schema(op, source)
        if old is not None and old.since_version == s.since_version:
            continue  # the same version of the op at both opsets: the same kernel
        ins, outs = _probe_types(ix, node)
        after = probe_kernel(node, ins, outs, opset=target)
        if after.ok or not after.verified:
            continue
        before = probe_kernel(node, ins, outs, opset=source)
        if before.ok and before.verified and not _converted_runs(node, ins, outs, source, target):
            out[op] = f"no kernel for its opset-{s.since_version} version"
    return out


def _converted_runs(node: onnx.NodeProto, ins: list[int], outs: list[int], source: int, target: int) -> bool:
    """Whether the one-node model of `node` at `source`, converted to `target` as the model
    will be (an attribute that became an input: ReduceMean's axes at 18, Dropout's ratio at 12;
    Upsample replaced by Resize), loads in onnxruntime: the node as written at `target` may not,
    where the converted one does. A conversion that fails counts as no: the model's own
    conversion says why."""
    from onnx import version_converter

    from ..kernels import _one_node_model, _try

    model = _one_node_model(node, ins, outs, [onnx.helper.make_opsetid("", source)])
    try:
        converted = version_converter.convert_version(model, target)
    except Exception:  # noqa: BLE001 - the converter raises bare RuntimeErrors
        return False
    return not _try(converted, "CPUExecutionProvider")


def expand_deprecated_group_norm(model: onnx.ModelProto) -> PassResult:
    """GroupNormalization at opsets 18-20 (scale and bias per group), written as the ops it
    computes: x reshaped to (N, G, -1), InstanceNormalization with the group's scale and bias,
    reshaped back to Shape(x). In place, every graph.

    ONNX deprecated that version (its scale and bias are per group where opset 21's are per
    channel), so the checker refuses a model that holds it, and the opset converter has no
    adapter to 21 for it: converted, the per-group scale meets opset 21's per-channel broadcast
    and the model fails at run time. onnxruntime still runs it. The expansion is exact (the
    same statistics over the same elements, the same affine), valid at every opset, and
    `passes.recognize` fuses it back into GroupNormalization-21 once the model is at opset 21
    and the channel count is known."""
    result = PassResult("expand GroupNormalization-18")
    opset = model_opset(model)
    if not 18 <= opset < 21:
        return result
    names = NameAllocator.for_model(model)
    for g in walk_graphs(model.graph):
        out: list[onnx.NodeProto] = []
        for n in g.node:
            if n.op_type != "GroupNormalization" or n.domain not in ("", "ai.onnx") or len(n.input) != 3:
                out.append(n)
                continue
            base = n.name or n.output[0]
            groups = int_attr(n, "num_groups", 0)
            target = names.value(base, "groups")
            g.initializer.append(onnx.numpy_helper.from_array(np.array([0, groups, -1], np.int64), target))
            r, norm, shape = (names.value(base, s) for s in ("grouped", "normalized", "shape"))
            out += [onnx.helper.make_node("Reshape", [n.input[0], target], [r], name=names.value(base, "reshape")),
                    onnx.helper.make_node("InstanceNormalization", [r, n.input[1], n.input[2]], [norm],
                                          name=names.value(base, "instancenorm"),
                                          epsilon=float_attr(n, "epsilon", 1e-5)),
                    onnx.helper.make_node("Shape", [n.input[0]], [shape], name=names.value(base, "shape_of")),
                    onnx.helper.make_node("Reshape", [norm, shape], [n.output[0]], name=names.value(base, "back"))]
            result.changed += 1
        if result.changed:
            del g.node[:]
            g.node.extend(out)
    if result.changed:
        result.notes.append(f"{result.changed} GroupNormalization(s) of opset {opset} (deprecated by ONNX: "
                            "scale and bias per group) written as Reshape, InstanceNormalization, Reshape")
    return result
