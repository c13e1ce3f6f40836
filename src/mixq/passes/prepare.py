"""Model preparation before quantization: Constant nodes to initializers, opset upgrade,
BatchNorm folding into Conv, constant folding and shape inference.

Each pass returns the number of things it changed so the report can say what happened.
"""
from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Collection
from dataclasses import dataclass, field

import numpy as np
import onnx
from google.protobuf.message import Message
from onnx import helper, numpy_helper

from .._io import has_external_data, load_deferred_tensor, tensor_array
from ..errors import MixqError, ModelError
from ..evaluate import onnxruntime_max_ir_version
from ..formats.base import MIXQ_DOMAIN
from ..graph import GraphIndex, NameAllocator, PassResult, model_opset, name_matcher, walk_graphs
from .equalize import equalize_imbalanced
from .float16 import compute_float16_in_float32
from .function_ops import expand_deprecated_group_norm, expand_function_ops
from .layer_fold import fold_affine, fold_batchnorm, unfolded_note
from .recognize import RecognizeReport, recognize
from .unfuse import admit_runtime_ops, unfuse

#: The opset mixq emits at: QuantizeLinear/DequantizeLinear with int4/int16 and block_size.
TARGET_OPSET = 21
_FOLD_MAX_ELEMENTS = 1 << 24  # never materialize huge constants while folding


@dataclass
class PrepareReport:
    """What preparation changed."""

    opset_from: int = 0
    opset_to: int = 0
    constants_to_initializers: int = 0
    batchnorms_folded: int = 0
    bias_adds_folded: int = 0
    scales_folded: int = 0
    pads_folded: int = 0
    pairs_equalized: int = 0
    ort_ops_expanded: int = 0
    nodes_folded: int = 0
    notes: list[str] = field(default_factory=list)
    passes: list[PassResult] = field(default_factory=list)
    recognized: RecognizeReport = field(default_factory=RecognizeReport)  # written-out ops fused


def constants_to_initializers(model: onnx.ModelProto) -> int:
    """Turn top-level Constant nodes holding tensors into initializers."""
    g = model.graph
    keep, moved = [], 0
    for n in g.node:
        if n.op_type == "Constant" and n.domain in ("", "ai.onnx") and len(n.attribute) == 1:
            a = n.attribute[0]
            arr = None
            if a.name == "value":
                arr = numpy_helper.to_array(a.t)
            elif a.name == "value_float":
                arr = np.array(a.f, np.float32)
            elif a.name == "value_floats":
                arr = np.array(list(a.floats), np.float32)
            elif a.name == "value_int":
                arr = np.array(a.i, np.int64)
            elif a.name == "value_ints":
                arr = np.array(list(a.ints), np.int64)
            if arr is not None:
                g.initializer.append(numpy_helper.from_array(arr, n.output[0]))
                moved += 1
                continue
        keep.append(n)
    if moved:
        del g.node[:]
        g.node.extend(keep)
        # IR 3 wants every initializer listed as a graph input: the opset converter refused such
        # a model ("Input 1 is undefined!", onnx's own opset-6 test models); IR 4 does not
        model.ir_version = max(model.ir_version, 4)
    return moved


def _function_moves_with(fn: onnx.FunctionProto, target: int) -> bool:
    """Whether no default-domain op of `fn`'s body changes meaning between its opset and `target`."""
    have = next((int(i.version) for i in fn.opset_import if i.domain in ("", "ai.onnx")), target)
    for node in fn.node:
        if node.domain not in ("", "ai.onnx"):
            continue
        try:
            if (onnx.defs.get_schema(node.op_type, have).since_version
                    != onnx.defs.get_schema(node.op_type, target).since_version):
                return False
        except onnx.defs.SchemaError:
            return False
    return True


def convert_opset(model: onnx.ModelProto, target: int, result: PassResult | None = None) -> onnx.ModelProto:
    """onnx.version_converter.convert_version, keeping the model-local functions it drops.

    onnxruntime and the checker want a function's default-domain opset to be the model's, so a
    function moves to `target` with the model when no op of its body changes meaning on the way;
    one whose body does is inlined first and converted with the graph. A standard op that
    onnxruntime runs at the model's opset and not at `target` is first expanded into its ONNX
    function body (`function_ops`; a note in `result` says so)."""
    from onnx import inliner, version_converter

    source = model_opset(model)
    model = expand_function_ops(model, source, target, result, source_runs=source <= MAX_RUNTIME_OPSET)

    stale = [(f.domain, f.name) for f in model.functions if not _function_moves_with(f, target)]
    if stale:
        model = inliner.inline_selected_functions(model, stale)
    new = _convert_skeleton(model, target)
    if new is None:  # a weight did not come back as it went: convert the whole model
        new = version_converter.convert_version(model, target)
    if model.functions and not new.functions:
        new.functions.extend(model.functions)
    for fn in new.functions:
        for imp in fn.opset_import:
            if imp.domain in ("", "ai.onnx"):
                imp.version = target
    return new


def _is_placeholder(t: onnx.TensorProto) -> bool:
    return t.data_location == onnx.TensorProto.EXTERNAL and any(
        e.key == "location" and e.value == _PLACEHOLDER for e in t.external_data)


def _convert_skeleton(model: onnx.ModelProto, target: int) -> onnx.ModelProto | None:
    """onnx.version_converter on a skeleton of `model` (`_skeleton`: its large weights without
    their data), the weights then put back by name: the converter rewrites nodes, never weight
    data, and serializing a 90 MB model into it and back took 0.5 s. None when a weight does not
    come back with the name, type and dims it went with (the caller converts the whole model)."""
    from onnx import version_converter

    new = version_converter.convert_version(_skeleton(model), target)
    originals = {t.name: t for t in model.graph.initializer}
    for t in new.graph.initializer:
        if not _is_placeholder(t):
            continue
        o = originals.get(t.name)
        if o is None or o.data_type != t.data_type or list(o.dims) != list(t.dims):
            return None
        t.CopyFrom(o)
    for n in new.graph.node:  # a weight moved into a node attribute would have no data
        if any(a.type == onnx.AttributeProto.TENSOR and _is_placeholder(a.t) for a in n.attribute):
            return None
    return new


#: Newest default-domain opset onnxruntime 1.31 (pinned in pyproject.toml) runs; newer models are
#: converted down to it, since every model mixq writes must run in stock onnxruntime.
MAX_RUNTIME_OPSET = 26


def downgrade_opset(model: onnx.ModelProto, target: int = MAX_RUNTIME_OPSET,
                    result: PassResult | None = None) -> onnx.ModelProto:
    """Convert a model newer than onnxruntime runs down to `target` (no-op otherwise); `result`
    gets the conversion's notes."""
    cur = model_opset(model)
    if cur > onnx.defs.onnx_opset_version():
        raise ModelError(f"the model uses opset {cur} of the default ONNX domain, newer than this "
                         f"onnx ({onnx.__version__}, up to opset {onnx.defs.onnx_opset_version()}) "
                         f"knows; re-export it with opset {target} or lower.")
    if cur <= target:
        return model
    try:
        return convert_opset(model, target, result)
    except MixqError:
        raise
    except Exception as exc:  # the converter raises bare RuntimeErrors naming the op
        raise ModelError(
            f"the model uses opset {cur}, newer than onnxruntime runs (up to {target}), and "
            f"converting it down failed: {exc}. Re-export it with opset {target} or lower.") from exc


def upgrade_opset(model: onnx.ModelProto, target: int = TARGET_OPSET,
                  result: PassResult | None = None) -> onnx.ModelProto:
    """Convert the default-domain opset to `target` (no-op when already there or newer);
    `result` gets the conversion's notes."""
    cur = model_opset(model)
    if cur >= target:
        return downgrade_opset(model, result=result)
    if cur == 0 and not any(n.domain in ("", "ai.onnx") for g in walk_graphs(model.graph) for n in g.node):
        # no default-domain op to convert (a scikit-learn model of ai.onnx.ml ops): the import
        # the QDQ nodes need is added, nothing else changes
        new = onnx.ModelProto()
        new.CopyFrom(model)
        new.opset_import.append(onnx.helper.make_opsetid("", target))
        new.ir_version = max(new.ir_version, 10)
        return new
    try:
        new = convert_opset(model, target, result)
    except MixqError:
        raise
    except Exception as exc:  # the converter raises bare RuntimeErrors naming the op
        raise ModelError(
            f"cannot upgrade the model from opset {cur} to {target}, which quantization needs "
            f"(per-channel and int16 QDQ): {exc}. Upgrade it with your exporter, or run "
            f"onnx.version_converter yourself and fix the op it names.") from exc
    if new.ir_version < 10:
        new.ir_version = 10
    return new


def _init_map(graph: onnx.GraphProto) -> dict[str, onnx.TensorProto]:
    return {t.name: t for t in graph.initializer}


def fold_pad_into_conv(model: onnx.ModelProto, kept: Callable[[str], bool] = lambda name: False) -> int:
    """Fold a zero, constant-mode Pad of the spatial dims into the Convs that alone read it.

    Exporters write TF-style "same" padding as an explicit Pad before the Conv (EfficientNet).
    Left in place it sits between the quantized tensor and the Conv, where a backend's QDQ
    fusion cannot see through it (onnxruntime ran 17 Pads in float between DequantizeLinear
    and QuantizeLinear on EfficientNet-Lite0); as Conv padding it is the same computation."""
    g = model.graph
    inits = _init_map(g)
    ix = GraphIndex.of(model)
    graph_outputs = set(ix.outputs)
    removed: set[int] = set()
    for pad in g.node:
        if pad.op_type != "Pad" or pad.domain not in ("", "ai.onnx") or len(pad.input) < 2 or kept(pad.name):
            continue
        # string attributes compared as bytes: a damaged model's need not be UTF-8
        mode = next((a.s for a in pad.attribute if a.name == "mode"), b"constant")
        readers = ix.consumers(pad.output[0])  # an If/Loop reading it counts: never folded
        if mode != b"constant" or pad.output[0] in graph_outputs or not readers or \
                (len(pad.input) > 3 and pad.input[3]) or pad.input[1] not in inits:
            continue
        if len(pad.input) > 2 and pad.input[2]:
            value = inits.get(pad.input[2])
            if value is None or np.any(numpy_helper.to_array(value) != 0):
                continue
        pads = numpy_helper.to_array(inits[pad.input[1]]).astype(np.int64).reshape(-1)
        rank = pads.size // 2
        if rank < 3 or pads.size != 2 * rank or np.any(pads < 0) or np.any(pads[[0, 1, rank, rank + 1]]):
            continue
        extra = np.concatenate([pads[2:rank], pads[rank + 2:]])
        if not all(r.op_type == "Conv" and r.domain in ("", "ai.onnx") and r.input[0] == pad.output[0]
                   and pad.output[0] not in r.input[1:] for r in readers):
            continue
        if any(next((a.s for a in r.attribute if a.name == "auto_pad"), b"NOTSET") != b"NOTSET"
               for r in readers):
            continue
        for conv in readers:
            attr = next((a for a in conv.attribute if a.name == "pads"), None)
            old = np.array(attr.ints if attr is not None else [0] * extra.size, dtype=np.int64)
            if attr is not None:
                conv.attribute.remove(attr)
            conv.attribute.append(helper.make_attribute("pads", [int(v) for v in old + extra]))
            conv.input[0] = pad.input[0]
        removed.add(id(pad))
    if removed:
        keep = [n for n in g.node if id(n) not in removed]
        del g.node[:]
        g.node.extend(keep)
        remove_unused_initializers(model)
    return len(removed)


def remove_unused_initializers(model: onnx.ModelProto) -> int:
    g = model.graph
    used = {i for n in g.node for i in n.input} | {o.name for o in g.output}
    used |= _subgraph_inputs(g)
    keep = [t for t in g.initializer if t.name in used]
    dropped = len(g.initializer) - len(keep)
    if dropped:
        del g.initializer[:]
        g.initializer.extend(keep)
    return dropped


def _subgraph_inputs(g: onnx.GraphProto) -> set[str]:
    names: set[str] = set()
    for n in g.node:
        for a in n.attribute:
            subs = [a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)
            for sg in subs:
                names |= {i for sn in sg.node for i in sn.input}
                names |= _subgraph_inputs(sg)
    return names


_NONDETERMINISTIC = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike",
                     "Multinomial", "Bernoulli", "Dropout"}


def fold_constants(model: onnx.ModelProto, base_dir: str | os.PathLike | None = None,
                   kept: Callable[[str], bool] = lambda name: False) -> int:
    """Evaluate nodes whose inputs are all initializers and replace them by initializers
    (deferred initializers are read from `base_dir`)."""
    from onnx.reference import ReferenceEvaluator

    g = model.graph
    inits = {t.name: t for t in g.initializer}
    graph_outputs = {o.name for o in g.output}
    folded = 0
    keep: list[onnx.NodeProto] = []
    opsets = {imp.domain: imp.version for imp in model.opset_import}
    for n in g.node:
        foldable = (n.domain in ("", "ai.onnx") and n.op_type not in _NONDETERMINISTIC and not kept(n.name)
                    and n.input and all((not i) or i in inits for i in n.input)
                    and not any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
                                for a in n.attribute)
                    and not any(o in graph_outputs for o in n.output))
        if foldable:
            sizes = [int(np.prod(inits[i].dims)) for i in n.input if i]
            foldable = sum(sizes) <= _FOLD_MAX_ELEMENTS
        if not foldable:
            keep.append(n)
            continue
        try:
            sub = helper.make_model(
                helper.make_graph([n], "fold", [], [helper.make_tensor_value_info(o, onnx.TensorProto.UNDEFINED, None) for o in n.output if o],
                                  [_loaded(inits[i], base_dir) for i in dict.fromkeys(x for x in n.input if x)]),
                opset_imports=[helper.make_opsetid("", opsets.get("", TARGET_OPSET))])
            outs = ReferenceEvaluator(sub).run(None, {})
        except Exception:  # an op the reference evaluator cannot run: just leave it in the graph
            keep.append(n)
            continue
        produced = [o for o in n.output if o]
        if any(np.asarray(v).size > _FOLD_MAX_ELEMENTS for v in outs):
            keep.append(n)
            continue
        for name, val in zip(produced, outs):
            t = numpy_helper.from_array(np.asarray(val), name)
            g.initializer.append(t)
            inits[name] = t
        folded += 1
    if folded:
        del g.node[:]
        g.node.extend(keep)
        remove_unused_initializers(model)
    return folded


#: Above this many tensor bytes, shape inference runs on a copy of the graph without the
#: large tensors' data (protobuf cannot serialize more than 2 GiB, and copying is slow).
_SKELETON_BYTES = 1 << 30
_SKELETON_MIN_TENSOR = 1 << 20
_PLACEHOLDER = "mixq-skeleton-placeholder.bin"


def _loaded(t: onnx.TensorProto, base_dir: str | os.PathLike | None) -> onnx.TensorProto:
    """`t`, or for a deferred tensor a copy with its data loaded from `base_dir`."""
    if base_dir is None or not has_external_data(t):
        return t
    c = onnx.TensorProto()
    c.CopyFrom(t)
    load_deferred_tensor(c, base_dir)
    return c


def _has_external(model: onnx.ModelProto) -> bool:
    return any(has_external_data(t) for t in model.graph.initializer)


def _copy_fields(src: Message, dst: Message, *, skip: str) -> None:
    """Copy every field `src` has set, but `skip`, into `dst` (the same message type)."""
    for fd, value in src.ListFields():
        if fd.name == skip:
            continue
        # FieldDescriptor.is_repeated replaced `label` in newer protobuf releases
        repeated = (fd.is_repeated if hasattr(fd, "is_repeated")
                    else getattr(fd, "label") == fd.LABEL_REPEATED)
        if repeated:
            getattr(dst, fd.name).extend(value)
        elif fd.type == fd.TYPE_MESSAGE:
            getattr(dst, fd.name).CopyFrom(value)
        else:
            setattr(dst, fd.name, value)


def _skeleton(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of `model` whose large (or deferred) main-graph initializers keep name, type and
    dims but no data (marked external), so that it serializes small; shape inference needs no
    more."""
    sk = onnx.ModelProto()
    _copy_fields(model, sk, skip="graph")  # every field the model has (metadata, doc strings...)
    g, sg = model.graph, sk.graph
    _copy_fields(g, sg, skip="initializer")
    for t in g.initializer:
        if not has_external_data(t) and t.ByteSize() < _SKELETON_MIN_TENSOR:
            sg.initializer.append(t)
            continue
        st = sg.initializer.add()
        st.name, st.data_type = t.name, t.data_type
        st.dims.extend(t.dims)
        st.data_location = onnx.TensorProto.EXTERNAL
        for k, v in (("location", _PLACEHOLDER), ("offset", "0"), ("length", "0")):
            e = st.external_data.add()
            e.key, e.value = k, v
    return sk


def infer_shapes(model: onnx.ModelProto, result: PassResult | None = None) -> onnx.ModelProto:
    """Shape inference that tolerates models above 2 GB. A failure is recorded in `result` (the
    model is returned unchanged: tensors without an inferred type are then left float, each
    with that reason in the plan), never swallowed.

    Models are inferred on a skeleton without the large tensors' data and the inferred
    value_info is copied back (in place), so the model is neither serialized whole nor copied;
    but a model with If/Loop bodies under 1 GiB is inferred whole (new model), so that its
    bodies get their declarations too."""
    from .._io import model_size

    res = result if result is not None else PassResult("infer shapes")
    if _has_subgraphs(model) and not _has_external(model) and model_size(model) <= _SKELETON_BYTES:
        # inference on the whole model: the skeleton's declarations are copied back for the main
        # graph only, and If/Loop bodies keep theirs
        try:
            return onnx.shape_inference.infer_shapes(model, data_prop=True)
        except Exception as exc:
            res.notes.append(f"shape inference failed ({_first_line(exc)}); tensors without a "
                             "known type are left float")
            return model
    # every other model: on a skeleton, declarations copied back (the same declarations, without
    # serializing and copying the weights: 0.35 s on a 90 MB model)
    declare_shapes(model, res, failed="tensors without a known type are left float", replace=True)
    return model


def _has_subgraphs(model: onnx.ModelProto) -> bool:
    return any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
               for n in model.graph.node for a in n.attribute)


def fit_ir_version(model: onnx.ModelProto) -> PassResult:
    """Lower (in place) an IR version newer than onnxruntime reads to the newest it does (the
    onnx package writes its own newest by default, whatever the model uses): onnxruntime
    refuses the whole model otherwise. A model that needs the newer IR's features then fails
    where they are used, with onnxruntime's message."""
    res = PassResult("fit IR version")
    if model.ir_version <= 10:  # every onnxruntime mixq supports reads IR 10
        return res
    top = onnxruntime_max_ir_version()
    if model.ir_version > top:
        res.notes.append(f"IR version {model.ir_version} is newer than onnxruntime reads; "
                         f"written as {top}")
        model.ir_version = top
        res.changed = 1
    return res


def unknown_negative_dims(model: onnx.ModelProto) -> PassResult:
    """Declare unknown (in place) the dims of graph inputs, outputs and value_info given as a
    negative number (some exporters write -1 for "any"; ONNX dims are >= 0 or symbolic):
    shape inference then propagates an unknown dim instead of -1, and onnxruntime plans
    memory from the shapes. The model accepts the same inputs as before; only the graph's
    inputs and outputs are named in the notes."""
    res = PassResult("unknown negative dims")
    io = {v.name for v in [*model.graph.input, *model.graph.output]}
    for v in [*model.graph.input, *model.graph.output, *model.graph.value_info]:
        if not v.type.HasField("tensor_type") or not v.type.tensor_type.HasField("shape"):
            continue
        for k, d in enumerate(v.type.tensor_type.shape.dim):
            if d.HasField("dim_value") and d.dim_value < 0:
                was = d.dim_value
                d.Clear()
                res.changed += 1
                if v.name in io:
                    res.notes.append(f"{v.name}: dim {k} was {was}, not a valid ONNX dim; declared "
                                     "unknown (any size, as onnxruntime read it)")
    return res


def declare_shapes(model: onnx.ModelProto, result: PassResult | None = None, *,
                   failed: str = "shapes left undeclared", replace: bool = False) -> PassResult:
    """Declare in `model.graph.value_info` (in place) the type and shape shape inference gives
    every intermediate tensor not declared yet, inferred on a skeleton (no weight data copied).
    onnxruntime creates a session two to four times faster when the shapes are declared (it
    plans memory from them instead of inferring them node by node): the quantized model loads
    faster for the user, and for every session mixq opens on it. A failed inference leaves the
    model as it is, with a note ending in `failed` (what that means for the caller).
    `replace`: the model's value_info and outputs become the inferred ones (declarations
    inference refined included), as `onnx.shape_inference.infer_shapes` would return them."""
    res = result if result is not None else PassResult("declare shapes")
    try:
        inferred = onnx.shape_inference.infer_shapes(_skeleton(model), data_prop=True)
    except Exception as exc:
        res.notes.append(f"shape inference failed ({_first_line(exc)}); {failed}")
        return res
    g = model.graph
    if replace:
        before = {v.name: v.SerializeToString() for v in g.value_info}
        del g.value_info[:]
        g.value_info.extend(inferred.graph.value_info)
        del g.output[:]  # inference fills unknown output dims too (same outputs, same order)
        g.output.extend(inferred.graph.output)
        res.changed += sum(before.get(v.name) != v.SerializeToString() for v in g.value_info)
        return res
    have = ({v.name for v in g.value_info} | {v.name for v in g.input} | {v.name for v in g.output}
            | {t.name for t in g.initializer})
    new = [v for v in inferred.graph.value_info if v.name not in have]
    g.value_info.extend(new)
    res.changed += len(new)
    return res


def _first_line(exc: BaseException) -> str:
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    return " ".join(lines[:2])[:300] or type(exc).__name__


def undeclared_shapes(model: onnx.ModelProto) -> list[tuple[str, str]]:
    """(kind, name) of the main graph's tensor inputs and outputs that declare no shape, which
    ONNX requires of them (onnxruntime runs without; graph-editing tools write such outputs)."""
    g = model.graph
    inits = {t.name for t in g.initializer}
    return [(kind, v.name) for kind, vs in (("input", g.input), ("output", g.output)) for v in vs
            if v.type.HasField("tensor_type") and not v.type.tensor_type.HasField("shape")
            and v.name not in inits]


def repair_output_shapes(model: onnx.ModelProto) -> PassResult:
    """Replace declared graph-output shapes that shape inference contradicts (a different rank,
    or a different static dim) by the inferred ones, and declare the inferred shape of an
    output that declares none. Exporters sometimes declare a wrong output shape, and graph
    editing tools none; onnxruntime runs such a model, but the checker rejects an output without
    a shape, and one with a wrong shape once a rewrite adds a node before it. In place; declared
    shapes that agree are kept as they are."""
    res = PassResult("repair output shapes")
    g = model.graph
    declared = {o.name: o.type for o in g.output if o.type.tensor_type.HasField("shape")}
    missing = {name for kind, name in undeclared_shapes(model) if kind == "output"}
    if not declared and not missing:
        return res
    probe = onnx.ModelProto()
    for fld in ("ir_version", "opset_import", "functions"):
        if fld == "ir_version":
            probe.ir_version = model.ir_version
        else:
            getattr(probe, fld).extend(getattr(model, fld))
    pg = probe.graph
    pg.node.extend(g.node)
    pg.input.extend(g.input)
    pg.initializer.extend(_shape_only(t) for t in g.initializer)
    pg.sparse_initializer.extend(g.sparse_initializer)
    for o in g.output:
        v = pg.output.add()
        v.name = o.name
        if o.type.HasField("tensor_type"):
            v.type.tensor_type.elem_type = o.type.tensor_type.elem_type
    try:
        inferred = onnx.shape_inference.infer_shapes(probe, data_prop=True)
    except Exception as exc:
        res.decline("model", f"shape inference failed: {_first_line(exc)}")
        return res
    got = {o.name: o.type for o in inferred.graph.output}
    got.update({v.name: v.type for v in inferred.graph.value_info})
    for o in g.output:
        want, inf = declared.get(o.name), got.get(o.name)
        if inf is None or not inf.tensor_type.HasField("shape"):
            continue
        if o.name in missing:
            o.type.tensor_type.shape.CopyFrom(inf.tensor_type.shape)
            res.changed += 1
            dims = [d.dim_value if d.HasField("dim_value") else None for d in inf.tensor_type.shape.dim]
            res.notes.append(f"graph output {o.name!r} declared no shape (ONNX requires one; onnxruntime "
                             f"runs without): declared as the graph computes it, {_dims(dims)}")
            continue
        if want is None:
            continue
        a = [d.dim_value if d.HasField("dim_value") else None for d in want.tensor_type.shape.dim]
        b = [d.dim_value if d.HasField("dim_value") else None for d in inf.tensor_type.shape.dim]
        if len(a) == len(b) and all(x is None or y is None or x == y for x, y in zip(a, b)):
            continue
        o.type.tensor_type.shape.CopyFrom(inf.tensor_type.shape)
        res.changed += 1
        res.notes.append(f"graph output {o.name!r} was declared with shape {_dims(a)}, but the "
                         f"graph computes {_dims(b)}: the declaration is repaired")
    return res


def _dims(d: list[int | None]) -> str:
    return "(" + ", ".join("?" if x is None else str(x) for x in d) + ")"


def _shape_only(t: onnx.TensorProto) -> onnx.TensorProto:
    """Name, type and dims of `t` without its data (shape inference needs no more), except
    small integer tensors, whose values data propagation may need (Reshape targets)."""
    if t.data_type in (onnx.TensorProto.INT64, onnx.TensorProto.INT32) and int(np.prod(t.dims)) <= 64 \
            and not has_external_data(t):
        return t
    c = onnx.TensorProto(name=t.name, data_type=t.data_type, dims=t.dims)
    c.data_location = onnx.TensorProto.EXTERNAL
    for k, v in (("location", _PLACEHOLDER), ("offset", "0"), ("length", "0")):
        e = c.external_data.add()
        e.key, e.value = k, v
    return c


def densify_sparse_initializers(model: onnx.ModelProto) -> PassResult:
    """Turn sparse initializers of the main graph into dense ones (in place): the rewrite and
    onnx's converter work on dense tensors, and a quantized weight is stored dense anyway."""
    res = PassResult("densify sparse initializers")
    g = model.graph
    if not len(g.sparse_initializer):
        return res
    from onnx import numpy_helper as nh

    for sp in g.sparse_initializer:
        values = nh.to_array(sp.values)
        idx = nh.to_array(sp.indices).astype(np.int64)
        dims = tuple(int(d) for d in sp.dims)
        dense = np.zeros(int(np.prod(dims)), dtype=values.dtype)
        if idx.ndim == 2:  # COO coordinates: one row per value
            idx = np.ravel_multi_index(tuple(idx.T), dims) if idx.size else idx.reshape(-1)
        dense[idx.reshape(-1)] = values.reshape(-1)
        g.initializer.append(nh.from_array(dense.reshape(dims), sp.values.name))
        res.changed += 1
    del g.sparse_initializer[:]
    res.notes.append(f"{res.changed} sparse initializers stored dense")
    return res


def check_graph(model: onnx.ModelProto, *, full_check: bool = False, size: int | None = None) -> None:
    """onnx.checker.check_model that also works above 2 GiB: a big model is checked as a
    skeleton file whose large tensors point at an empty placeholder data file (their data is
    not checked, everything else is); so is a model with deferred initializers. `size`: the
    model's mixq._io.model_size when the caller has it (measuring a big model serializes it).
    Raises the checker's own errors."""
    import tempfile

    from .._io import approx_model_size

    if size is None:
        size = approx_model_size(model)
    if size <= _SKELETON_BYTES and not _has_external(model):
        onnx.checker.check_model(model, full_check=full_check)
        return
    with tempfile.TemporaryDirectory(prefix="mixq_check_") as tmp:
        open(os.path.join(tmp, _PLACEHOLDER), "wb").close()
        path = os.path.join(tmp, "skeleton.onnx")
        with open(path, "wb") as f:
            f.write(_skeleton(model).SerializeToString())
        onnx.checker.check_model(path, full_check=full_check)


def _damaged_string(msg: Message, path: str = "model") -> str | None:
    """The path of the first string field in `msg` (or a message inside it) that is not valid
    UTF-8, else None. The ONNX checker never looks; Python's protobuf hands such a field back
    as bytes, and writing it back into any message then raises UnicodeDecodeError deep inside a
    pass (the fuzz target found a node name). Tensors contribute their names only, so that no
    weight is copied."""
    if isinstance(msg, onnx.TensorProto):
        if isinstance(msg.name, bytes):
            return f"{path}.name"
        return None
    for fd, value in msg.ListFields():
        if fd.type == fd.TYPE_STRING:
            if isinstance(value, bytes) or (not isinstance(value, str)
                                            and any(isinstance(v, bytes) for v in value)):
                return f"{path}.{fd.name}"
        elif fd.type == fd.TYPE_MESSAGE:
            items = [value] if isinstance(value, Message) else list(value)  # one, or repeated
            for i, v in enumerate(items):
                where = f"{path}.{fd.name}" if isinstance(value, Message) else f"{path}.{fd.name}[{i}]"
                bad = _damaged_string(v, where)
                if bad:
                    return bad
    return None


def raise_if_damaged(model: onnx.ModelProto, verb: str = "quantize") -> None:
    """Raise ModelError naming the first string field of `model` that is not valid UTF-8.
    `verb`: what the caller does, for the message."""
    bad = _damaged_string(model)
    if bad:
        raise ModelError(f"{bad} is not valid UTF-8: the file is damaged; re-export "
                         f"it and {verb} again.")


def _unknown_element_type(model: onnx.ModelProto) -> tuple[str, str, int] | None:
    """(what, name, code) of the first main-graph input, output, value_info or initializer whose
    element type this onnx does not define (a newer exporter's type, or a damaged file: the
    checker lets such a code through, and every message that names a type would fail on it)."""
    known = set(onnx.TensorProto.DataType.values())
    g = model.graph
    for what, values in (("input", g.input), ("output", g.output), ("value_info", g.value_info)):
        for v in values:
            et = v.type.tensor_type.elem_type if v.type.HasField("tensor_type") else 0
            if et and et not in known:
                return what, v.name, et
    for t in g.initializer:
        if t.data_type and t.data_type not in known:
            return "initializer", t.name, t.data_type
    return None


def check_declared(model: onnx.ModelProto, verb: str = "quantize") -> None:
    """Raise ModelError where the graph declares what the ONNX checker and onnxruntime let
    through but no result can come of: no outputs (its runs return nothing, nothing can be
    checked), or an element type this onnx does not define. `verb`: what the caller does."""
    if not model.graph.output:
        raise ModelError(f"the model declares no graph outputs: it computes nothing a caller can read, "
                         f"so there is nothing to {verb} or to check against float. Declare the tensors "
                         f"it returns (model.graph.output, e.g. onnx.helper.make_tensor_value_info(name, "
                         f"elem_type, dims)) and {verb} again.")
    unknown = _unknown_element_type(model)
    if unknown is not None:
        what, name, code = unknown
        raise ModelError(f"graph {what} {name!r} has element type {code}, which onnx {onnx.__version__} does "
                         f"not define: the file comes from a newer ONNX than this one, or is damaged. "
                         f"Re-export it with standard types, or upgrade onnx and onnxruntime, and {verb} again.")


def check_input_model(model: onnx.ModelProto) -> None:
    """Run the ONNX checker on an input model (on a skeleton without the large tensors' data
    for big models); raises ModelError naming the problem instead of failing later, deep
    inside a pass."""
    raise_if_damaged(model)
    check_declared(model)
    undeclared = undeclared_shapes(model)
    probe = model
    if undeclared:  # the checker's other problems first: a stand-in shape lets it reach them
        probe = onnx.ModelProto()
        probe.CopyFrom(model)
        names = {name for _, name in undeclared}
        for v in [*probe.graph.input, *probe.graph.output]:
            if v.name in names:
                v.type.tensor_type.shape.SetInParent()
    try:
        check_graph(probe)
    except Exception as exc:  # ValidationError, and the C++ checker's other errors
        msg = str(exc).strip().splitlines()
        detail = " ".join(line.strip() for line in msg[:4] if line.strip()).rstrip(".")
        raise ModelError(f"the input model fails the ONNX checker: {detail}. Fix the model "
                         "(re-export it, or run onnx.checker.check_model(model, full_check=True) "
                         "to see every problem) and quantize again.") from exc
    if undeclared:
        kind, name = undeclared[0]
        more = f" (and {len(undeclared) - 1} more)" if len(undeclared) > 1 else ""
        why = "" if kind == "input" else ", and shape inference cannot compute it"
        raise ModelError(f"graph {kind} {name!r}{more} declares no shape, which ONNX requires of the main "
                         f"graph's inputs and outputs{why}. Declare it (onnx.helper.make_tensor_value_info"
                         f"({name!r}, elem_type, [dims, or names for dynamic ones])) and quantize again.")


#: Ops only an already-quantized model holds: the default domain's quantize kernels, and
#: onnxruntime's contrib ones (whose QLinear* and QOrdered* kernels are matched by prefix).
QUANTIZED_OPS = frozenset({"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "QLinearConv",
                           "QLinearMatMul", "ConvInteger", "MatMulInteger"})
_CONTRIB_QUANTIZED_OPS = frozenset({
    "QuantizeLinear", "DequantizeLinear", "QGemm", "QAttention", "QEmbedLayerNormalization",
    "DynamicQuantizeMatMul", "DynamicQuantizeLSTM", "MatMulIntegerToFloat", "MatMulNBits", "MatMulBnb4",
    "GatherBlockQuantized", "QuantizeBFP", "DequantizeBFP"})


def _quantized_op(node: onnx.NodeProto) -> str | None:
    """The op as the error names it, when `node` is a quantized kernel or mixq's own quantize
    function (a mixq output given back); else None."""
    if node.domain in ("", "ai.onnx"):
        return node.op_type if node.op_type in QUANTIZED_OPS else None
    if node.domain == MIXQ_DOMAIN:
        return f"{MIXQ_DOMAIN} function"
    if node.domain == "com.microsoft" and (node.op_type in _CONTRIB_QUANTIZED_OPS
                                           or node.op_type.startswith(("QLinear", "QOrdered"))):
        return f"com.microsoft.{node.op_type}"
    return None


def quantized_nodes(model: onnx.ModelProto) -> list[tuple[onnx.NodeProto, str]]:
    """(node, op) for every quantized kernel in `model`: its graphs, subgraphs and model-local
    functions other than mixq's (whose calls count themselves)."""
    bodies = [list(g.node) for g in walk_graphs(model.graph)]
    bodies += [list(f.node) for f in model.functions if f.domain != MIXQ_DOMAIN]
    return [(n, op) for body in bodies for n in body if (op := _quantized_op(n)) is not None]


def check_float_model(model: onnx.ModelProto, verb: str = "quantize") -> None:
    """Raise ModelError when `model` is already quantized (QDQ or QOperator, by onnxruntime,
    another tool or mixq): quantizing it again would round its values twice, its constant
    DequantizeLinear weights folded back to float and put on new grids, next to the Q/DQ pairs
    it holds; a runnable model that is not what was asked. `verb`: what the caller does to it."""
    found = quantized_nodes(model)
    if not found:
        return
    counts = Counter(op for _, op in found)
    node = found[0][0]
    what = ", ".join(f"{c} x {op}" for op, c in counts.most_common(4))
    if len(counts) > 4:
        what += f" and {len(counts) - 4} other quantized op type(s)"
    mixq_out = f"{MIXQ_DOMAIN} function" in counts
    raise ModelError(
        f"the input model is already quantized: it holds {what} (e.g. {node.op_type} node "
        f"{node.name or '(unnamed)'!r}){': a mixq output' if mixq_out else ''}. mixq {verb}s "
        f"float models (float32, float16, bfloat16): to {verb} this one would round its "
        "values twice, onto grids it did not choose. Give mixq the float model this one was made "
        "from.")


def prepare(model: onnx.ModelProto, *, fold_bn: bool = True, copy: bool = True,
            base_dir: str | os.PathLike | None = None,
            equalize: bool = True, keep_nodes: Collection[str] = ()) -> tuple[onnx.ModelProto, PrepareReport]:
    """Run every preparation pass on a copy of `model` (on `model` itself with copy=False,
    which saves a copy of every weight when the caller owns the model). `base_dir`: where the
    model's deferred initializers are read from (see mixq._io.load_model_deferred); they stay
    deferred unless a fold rewrites them. `equalize`: balance the layer pairs one activation
    grid cannot hold (mixq.passes.equalize.equalize_imbalanced). `keep_nodes`: node names and
    fnmatch patterns a config names (`QuantConfig.named_nodes`): no fold or fusion removes
    such a node, so that the config still finds it."""
    kept = name_matcher(keep_nodes)
    if copy:
        m = onnx.ModelProto()
        m.CopyFrom(model)
    else:
        m = model
    raise_if_damaged(m)  # before any pass copies a string field
    held, ms_imported = admit_runtime_ops(m)  # what onnxruntime wrote, past the checker
    try:  # before the checker, which requires every output's shape
        declared = repair_output_shapes(m)
    except Exception as exc:  # noqa: BLE001 - a model the checker refuses next, saying why
        declared = PassResult("repair output shapes")
        declared.decline("model", f"output shapes not repaired: {_first_line(exc)}")
    group_norm = expand_deprecated_group_norm(m)  # a version the checker refuses
    check_input_model(m)
    check_float_model(m)
    rep = PrepareReport(opset_from=model_opset(m))
    rep.passes += [declared, group_norm]
    rep.notes += declared.notes + group_norm.notes
    # graph inputs that shadow initializers (IR < 4 lists every initializer as an input) make
    # them overridable: drop that first, before a fold or the opset conversion replaces the
    # initializer and leaves its input behind as one the data would have to feed
    init_names = {t.name for t in m.graph.initializer}
    shadow = [i for i in m.graph.input if i.name in init_names]
    if shadow:
        keep = [i for i in m.graph.input if i.name not in init_names]
        del m.graph.input[:]
        m.graph.input.extend(keep)
        m.ir_version = max(m.ir_version, 4)  # the first IR version whose initializers need not be inputs
        rep.notes.append(f"{len(shadow)} initializers were also listed as graph inputs; treated as constants")

    def counted(name: str, n: int) -> int:
        rep.passes.append(PassResult(name, changed=n))
        return n

    dense = densify_sparse_initializers(m)
    rep.passes.append(dense)
    rep.notes += dense.notes
    rep.constants_to_initializers = counted("constants to initializers", constants_to_initializers(m))
    wide = compute_float16_in_float32(m, base_dir)
    rep.passes.append(wide)
    rep.notes += wide.notes
    opset = PassResult("opset")
    m = upgrade_opset(m, result=opset)
    rep.opset_to = model_opset(m)
    opset.in_place = rep.opset_to == rep.opset_from
    opset.changed += int(rep.opset_to != rep.opset_from)
    rep.passes.append(opset)
    rep.notes += opset.notes
    if rep.opset_to < rep.opset_from:
        rep.notes.append(f"opset {rep.opset_from} converted down to {rep.opset_to}, the newest "
                         "onnxruntime runs")
    # before the folds and the equalization: a FusedConv is a Conv to them once expanded
    fused = PassResult("expand onnxruntime fused ops")
    rep.ort_ops_expanded = unfuse(m, fused)
    if ms_imported:
        fused.notes.append("the model uses com.microsoft ops without importing that domain (a model "
                           "onnxruntime's transformer optimizer returned in memory): its opset 1 declared")
    if held:
        fused.notes.append(f"{held} onnxruntime op(s) written in the default domain where the model's opset has "
                           "no such standard op (LayerNormalization before opset 17, SimplifiedLayerNormalization) "
                           "read as onnxruntime defines them")
    rep.passes.append(fused)
    rep.notes += fused.notes + [f"{where}: {why}" for where, why in fused.declined]
    # before the BatchNorm fold: exporters pass a parameter equal to another (an untrained
    # BatchNorm's running mean and its bias) through an Identity
    rep.nodes_folded = counted("fold constants", fold_constants(m, base_dir, kept))
    # the layer folds, to a fixed point: paddle2onnx writes a ConvTranspose's bias as an Add
    # before its BatchNorm (Add, then BN), PP-LCNetV3 a learned scale and shift after a
    # Conv's BatchNorm (BN, then Mul and Add); the declines are the last round's
    affine, bn = _fold_layers(m, base_dir, kept, fold_bn, rep)
    rep.passes.append(affine)
    if fold_bn:
        rep.passes.append(bn)
        rep.notes += unfolded_note(bn)
    # after folding: exporters compute the pads
    rep.pads_folded = counted("fold Pad into Conv", fold_pad_into_conv(m, kept))
    # after the folds: a BatchNorm's scale is in the Conv's weights, whose ranges decide it
    if equalize:
        eq = PassResult("equalize imbalanced layer pairs")
        rep.pairs_equalized = len(equalize_imbalanced(m, eq))
        rep.passes.append(eq)
        rep.notes += eq.notes
    else:  # the option off: say what it changed, so that it is never silently inert
        left = equalize_imbalanced(m, apply=False)
        worst = min(left, key=lambda d: d.before_db) if left else None
        rep.notes.append(
            f"equalization off (equalize=False, or a documented config without CLE): {len(left)} layer pair(s) "
            f"left imbalanced that it would balance (e.g. {worst.first} -> {worst.second}: a predicted "
            f"{worst.before_db:.1f} dB on int8, {worst.after_db:.1f} dB balanced)" if worst is not None else
            "equalization off (equalize=False, or a documented config without CLE): it changed nothing here, "
            "no layer pair being imbalanced enough to be equalized")
    for r in (unknown_negative_dims(m), fit_ir_version(m)):
        rep.passes.append(r)
        rep.notes += r.notes
    inference = PassResult("infer shapes", in_place=False)
    m = infer_shapes(m, inference)
    rep.passes.append(inference)
    rep.notes += inference.notes
    rep.recognized = recognize(m, kept)  # after shape inference: the 1/n and axis checks need shapes
    rep.passes.append(PassResult("recognize", changed=len(rep.recognized.fused)))
    if rep.recognized.fused:
        # a written-out activation or normalisation read its input several times: an Add or Mul
        # before it that declined to fold for its several readers has one reader now
        # (PP-LCNetV3's Conv, Mul, Add, written HardSwish)
        again, again_bn = _fold_layers(m, base_dir, kept, fold_bn, rep)
        if again.changed or again_bn.changed:
            stale = unfolded_note(bn)
            affine.changed += again.changed
            affine.declined, bn.declined = again.declined, again_bn.declined
            bn.changed += again_bn.changed
            if fold_bn:
                rep.notes = [n for n in rep.notes if n not in stale] + unfolded_note(bn)
            written = {o for n in m.graph.node for o in n.output}
            keep_vi = [v for v in m.graph.value_info if v.name in written]
            del m.graph.value_info[:]
            m.graph.value_info.extend(keep_vi)
    if rep.recognized.counts().get("MatMul"):  # an Einsum's Reshapes: new values to give shapes
        m = infer_shapes(m, PassResult("infer shapes", in_place=False))
    # once more on the prepared graph: with its constants folded, inference can follow a
    # Reshape whose target the exporter computed at run time (ddddocr's CTC head declares
    # (1, seqlen) and computes (T, 1, C)); the rewrite's QuantizeLinear before such an output
    # then contradicts the declaration, and the checker refused the quantized model
    late = repair_output_shapes(m)
    if late.changed:
        declared.changed += late.changed
        declared.notes += late.notes
        rep.notes += late.notes
    return m, rep


def _fold_layers(m: onnx.ModelProto, base_dir: str | os.PathLike | None, kept: Callable[[str], bool], fold_bn: bool,
                 rep: PrepareReport) -> tuple[PassResult, PassResult]:
    """The affine and BatchNorm folds into their layers, in rounds until one folds no
    BatchNorm (a BatchNorm folded may free an op after it); their counts are added to `rep`.
    Returns the two passes' results: what each changed over all rounds, the last round's
    declines."""
    affine, bn = PassResult("fold Add / Mul by a constant into its layer"), PassResult("fold BatchNorm")
    changed = {"affine": 0, "bn": 0}
    for _ in range(8):
        affine, bn = PassResult(affine.name), PassResult(bn.name)
        shifts, scales = fold_affine(m, base_dir, affine, kept)
        bn.changed = fold_batchnorm(m, base_dir, bn, kept) if fold_bn else 0
        rep.bias_adds_folded += shifts
        rep.scales_folded += scales
        rep.batchnorms_folded += bn.changed
        changed["affine"] += shifts + scales
        changed["bn"] += bn.changed
        if not bn.changed:
            break
    affine.changed, bn.changed = changed["affine"], changed["bn"]
    if affine.changed or bn.changed:
        remove_unused_initializers(m)
    return affine, bn


def op_counts(model: onnx.ModelProto) -> Counter:
    return Counter(n.op_type for n in model.graph.node)
