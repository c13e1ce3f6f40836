"""Folds of what follows a layer into the layer's own weight and bias: a BatchNormalization
(`fold_batchnorm`) and an element-wise op with a per-channel constant (`fold_affine`: an Add of
a bias, how paddle2onnx and tf2onnx write a ConvTranspose's or a Conv's bias; a Mul of a
learned scale). A folded op costs no rounding step of its own once the layer is quantized: its
effect is in the int32 bias and the weight's scales."""

from __future__ import annotations

import os
from collections.abc import Callable

import numpy as np
import onnx
from onnx import numpy_helper

from .._io import tensor_array
from ..graph import GraphIndex, NameAllocator, PassResult, float_attr, int_attr, per_channel, set_attr

__all__ = ["AFFINE_OPS", "BN_HOSTS", "KEPT_REASON", "fold_affine", "fold_batchnorm", "unfolded_note"]

#: Why a node the config names is not folded away.
KEPT_REASON = "named in the config (exclude_nodes or a layer rule): kept as written"


#: The layers a BatchNormalization folds into: their output channel axis is the BN's axis 1.
BN_HOSTS = ("Conv", "ConvTranspose", "Gemm")


def _bn_host_why(host: onnx.NodeProto, inits: dict[str, onnx.TensorProto]) -> str | None:
    """Why BatchNormalization cannot fold into `host` (None: it can)."""
    if len(host.input) < 2 or host.input[1] not in inits:
        return f"the {host.op_type} weight is computed at run time"
    if len(host.input) > 2 and host.input[2] and host.input[2] not in inits:
        return f"the {host.op_type} bias is computed at run time"
    if inits[host.input[1]].data_type != onnx.TensorProto.FLOAT:
        return f"the {host.op_type} weight is not float32"
    return None


def _fold_into_host(host: onnx.NodeProto, w: np.ndarray, bias: np.ndarray | None,
                    factor: np.ndarray, shift: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`host`'s weight and bias with y = factor * host(x) + shift folded in (float64 math).
    Gemm: the output columns of B (and beta * C, after which beta is 1); ConvTranspose: weight
    axis 1 within each group; Conv: weight axis 0."""
    w64 = w.astype(np.float64)
    if host.op_type == "Gemm":
        col = factor if int_attr(host, "transB", 0) == 0 else factor[:, None]
        beta = float_attr(host, "beta", 1.0)
        c = np.zeros(factor.shape) if bias is None else beta * bias.astype(np.float64)
        if c.size == factor.size:  # a (1, N) or scalar-per-column C: one value per output, 1-D
            c = c.reshape(-1)
        return w64 * col, c * factor + shift
    if host.op_type == "ConvTranspose":
        groups = int_attr(host, "group", 1)
        per_in, per_out = w.shape[0] // groups, w.shape[1]
        scale = factor.reshape(groups, per_out)[np.arange(w.shape[0]) // per_in]
        new_w = w64 * scale.reshape(*scale.shape, *([1] * (w.ndim - 2)))
    else:
        new_w = w64 * factor.reshape(-1, *([1] * (w.ndim - 1)))
    b = np.zeros(factor.shape) if bias is None else bias.astype(np.float64)
    return new_w, b * factor + shift


def fold_batchnorm(model: onnx.ModelProto, base_dir: str | os.PathLike | None = None,
                   result: PassResult | None = None, kept: Callable[[str], bool] = lambda name: False) -> int:
    """Fold BatchNormalization into a preceding Conv, ConvTranspose or Gemm (`BN_HOSTS`) whose
    output only feeds it (deferred initializers are read from `base_dir`). In place; declined
    folds are recorded in `result` with the reason. Uses count subgraph reads: a weight an If
    branch also reads is never changed behind the branch's back. The initializers it leaves
    unread are the caller's to remove."""
    g = model.graph
    ix = GraphIndex.of(model)
    inits = ix.initializers
    graph_outputs = set(ix.outputs)
    removed: set[int] = set()
    folded = 0
    names: NameAllocator | None = None  # built on the first fold: most models have no BN
    for bn in g.node:
        if bn.op_type != "BatchNormalization" or bn.domain not in ("", "ai.onnx"):
            continue
        host = ix.producer(bn.input[0])
        why = None
        if kept(bn.name):
            why = KEPT_REASON
        elif len([o for o in bn.output if o]) != 1 or int_attr(bn, "training_mode", 0):
            why = "it computes running statistics (training mode)"
        elif host is None or host.op_type not in BN_HOSTS or host.domain not in ("", "ai.onnx"):
            why = (f"fed by {host.op_type} {host.name!r}" if host is not None else "fed by a graph input") + \
                  f", not by a {' / '.join(BN_HOSTS)}"
        elif len(ix.consumers(bn.input[0])) != 1 or bn.input[0] in graph_outputs:
            why = f"the {host.op_type} output has other uses"
        elif not all(x in inits for x in bn.input[1:5]):
            why = "its parameters are computed at run time"
        elif len(ix.consumers(host.input[1])) != 1:
            why = f"the {host.op_type} weight is shared with another node (or a subgraph)"
        else:
            why = _bn_host_why(host, inits)
        if why is not None or host is None:
            if result is not None:
                result.decline(bn.name or bn.output[0], why or "not fed by a layer")
            continue
        gamma, beta, mean, var = (tensor_array(inits[x], base_dir).astype(np.float64) for x in bn.input[1:5])
        factor = gamma / np.sqrt(var + float_attr(bn, "epsilon", 1e-5))
        w_t = inits[host.input[1]]
        has_bias = len(host.input) > 2 and bool(host.input[2])
        bias = tensor_array(inits[host.input[2]], base_dir) if has_bias else None
        new_w, new_b = _fold_into_host(host, tensor_array(w_t, base_dir), bias, factor, beta - mean * factor)
        w_t.CopyFrom(numpy_helper.from_array(new_w.astype(np.float32), w_t.name))
        if names is None:
            names = NameAllocator.for_model(model)
        bias_name = names.exact(f"{host.input[1]}_bnfold_bias")
        _take_over(g, host, numpy_helper.from_array(new_b.astype(np.float32), bias_name), bn.output[0])
        removed.add(id(bn))
        folded += 1
    _drop(g, removed)
    return folded


def unfolded_note(bn: PassResult) -> list[str]:
    """One note for the BatchNormalizations the fold declined, by reason (they run float)."""
    if not bn.declined:
        return []
    by_why: dict[str, list[str]] = {}
    for where, why in bn.declined:
        by_why.setdefault(why, []).append(where)
    parts = [f"{len(w)} {why} (e.g. {w[0]!r})" for why, w in sorted(by_why.items(), key=lambda kv: -len(kv[1]))]
    return [f"{len(bn.declined)} BatchNormalization(s) not folded, run in float between quantized "
            f"neighbours: " + "; ".join(parts)]


def _take_over(g: onnx.GraphProto, host: onnx.NodeProto, bias: onnx.TensorProto, output: str) -> None:
    """After a fold: `host` reads `bias` (added to the graph; for a Gemm it holds beta * C, so
    beta is 1) and writes `output`, the folded node's."""
    g.initializer.append(bias)
    while len(host.input) < 3:
        host.input.append("")
    host.input[2] = bias.name
    if host.op_type == "Gemm":
        set_attr(host, "beta", 1.0)
    host.output[0] = output


def _drop(g: onnx.GraphProto, removed: set[int]) -> None:
    if removed:
        keep = [n for n in g.node if id(n) not in removed]
        del g.node[:]
        g.node.extend(keep)


#: The element-wise ops with a constant that fold into the layer before them: Add / Sub join its
#: bias, Mul / Div scale its weight and bias.
AFFINE_OPS = ("Add", "Sub", "Mul", "Div")


def _channels(host: onnx.NodeProto, w_t: onnx.TensorProto) -> tuple[int, int]:
    """(output rank, output channels) of a BN_HOSTS layer with weight `w_t`."""
    if host.op_type == "Gemm":
        return 2, int(w_t.dims[0] if int_attr(host, "transB", 0) else w_t.dims[1])
    if host.op_type == "ConvTranspose":
        return len(w_t.dims), int(w_t.dims[1] * int_attr(host, "group", 1))
    return len(w_t.dims), int(w_t.dims[0])


def fold_affine(model: onnx.ModelProto, base_dir: str | os.PathLike | None = None,
                result: PassResult | None = None, kept: Callable[[str], bool] = lambda name: False
                ) -> tuple[int, int]:
    """Fold an element-wise op with a per-channel float constant (shape (C,1,..,1), (1,C,1,..),
    a scalar) into the Conv, ConvTranspose or Gemm before it whose output only feeds it: an Add
    (or `x - c`) joins the layer's bias, how paddle2onnx and tf2onnx write a bias; a Mul (or
    `x / c`) scales the layer's weight and bias, how PP-LCNetV3's learnable affine blocks, a
    layer scale or a rescaling are written. Chains fold one op after another (Conv, Mul, Add),
    up to an op whose output several nodes read (declined, with why).
    In place; returns (Adds / Subs folded, Muls / Divs folded). The initializers it leaves
    unread are the caller's to remove. An op whose constant varies along another axis is left as
    it is, silently: it is no bias or scale but an ordinary product or sum."""
    g = model.graph
    ix = GraphIndex.of(model)
    inits = dict(ix.initializers)
    graph_outputs = set(ix.outputs)
    moved: dict[str, onnx.NodeProto] = {}  # an output a fold gave to its host: the host writes it now
    removed: set[int] = set()
    made: set[str] = set()  # the biases this pass wrote: read by their host alone
    counts = {"shift": 0, "scale": 0}
    names: NameAllocator | None = None
    for op in g.node:
        if op.op_type not in AFFINE_OPS or op.domain not in ("", "ai.onnx") or len(op.input) != 2:
            continue
        commutes = op.op_type in ("Add", "Mul")
        const = next((i for i in op.input if i in inits), None) if commutes else \
            (op.input[1] if op.input[1] in inits else None)
        flow = next((i for i in op.input if i != const), None)
        if const is None or not flow:
            continue
        host = moved.get(flow) or ix.producer(flow)
        if host is None or host.op_type not in BN_HOSTS or host.domain not in ("", "ai.onnx"):
            continue
        c_t, w_t = inits[const], inits.get(host.input[1]) if len(host.input) > 1 else None
        if w_t is None or c_t.data_type != onnx.TensorProto.FLOAT or w_t.data_type != onnx.TensorProto.FLOAT:
            continue
        rank, channels = _channels(host, w_t)
        c = per_channel(tensor_array(c_t, base_dir), rank, channels)
        if c is None:
            continue
        kind = "scale" if op.op_type in ("Mul", "Div") else "shift"
        why = None
        if kept(op.name):
            why = KEPT_REASON
        elif len(ix.consumers(flow)) != 1 or flow in graph_outputs or host.output[0] != flow:
            why = f"the {host.op_type} output has other uses"
        elif len(ix.consumers(op.output[0])) + (op.output[0] in graph_outputs) > 1:
            why = (f"its output has several readers, which the {host.op_type}'s own output would get: "
                   "onnxruntime's x86 integer kernels run a layer whose signed int8 output has several "
                   "readers in float (PP-OCRv4 rec A8W8: 22 -> 31 ms)")
        elif len(host.input) > 2 and host.input[2] and host.input[2] not in inits:
            why = f"the {host.op_type} bias is computed at run time"
        elif len(host.input) > 2 and host.input[2] and host.input[2] not in made \
                and len(ix.consumers(host.input[2])) != 1:
            why = f"the {host.op_type} bias is shared with another node"
        elif host.op_type == "Gemm" and len(host.input) > 2 and host.input[2] \
                and len(inits[host.input[2]].dims) > 1 and inits[host.input[2]].dims[0] != 1:
            why = "the Gemm's C varies along its rows"
        elif kind == "scale" and len(ix.consumers(host.input[1])) != 1:
            why = f"the {host.op_type} weight is shared with another node (or a subgraph)"
        elif op.op_type == "Div" and not np.all(c != 0):
            why = "it divides by 0 in some channel"
        if why is not None:
            if result is not None:
                result.decline(op.name or op.output[0], why)
            continue
        has_bias = len(host.input) > 2 and bool(host.input[2])
        bias = tensor_array(inits[host.input[2]], base_dir) if has_bias else None
        c64 = c.astype(np.float64)
        factor = (1.0 / c64 if op.op_type == "Div" else c64) if kind == "scale" else np.ones(channels)
        shift = (-c64 if op.op_type == "Sub" else c64) if kind == "shift" else np.zeros(channels)
        new_w, new_b = _fold_into_host(host, tensor_array(w_t, base_dir), bias, factor, shift)
        if kind == "scale":
            w_t.CopyFrom(numpy_helper.from_array(new_w.astype(np.float32), w_t.name))
        if names is None:
            names = NameAllocator.for_model(model)
        bias_name = names.exact(f"{host.input[1]}_{'scaled' if kind == 'scale' else 'added'}_bias")
        inits[bias_name] = numpy_helper.from_array(new_b.astype(np.float32), bias_name)
        made.add(bias_name)
        _take_over(g, host, inits[bias_name], op.output[0])
        moved[op.output[0]] = host
        removed.add(id(op))
        counts[kind] += 1
    _drop(g, removed)
    return counts["shift"], counts["scale"]
