"""Cheap per-layer sensitivity: the error a layer's output takes when that layer alone is quantized
to a candidate format, measured on cached float inputs of the layer.

One onnxruntime pass over a few held-out samples caches every candidate layer's float inputs and
output; then each (layer, format) pair is one single-node model run on those inputs. That costs a
fraction of one full-model evaluation per pair, and needs no full-model run at all.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import helper

from .._shards import Executor, in_worker, shard_bounds
from ..config import QuantConfig
from ..pipeline import Pipeline
from ..plan.ops import semantics
from .workbench import Workbench, relative_l2


@dataclass(frozen=True)
class Candidate:
    """A precision a layer can take: activation and weight formats ('float' for both: the layer
    is left float, see `FLOAT`)."""

    activation: str
    weight: str

    @property
    def label(self) -> str:
        return self.activation if self.activation == self.weight else f"{self.activation}/{self.weight}"

    @property
    def is_float(self) -> bool:
        """Whether the layer is left float (excluded from quantization)."""
        return self.activation == FLOAT_NAME

    @classmethod
    def parse(cls, text: str) -> "Candidate":
        """'int8' (both), 'int16/int8' (activation/weight) or 'float' (the layer left float)."""
        from ..formats import get_format

        if str(text).strip().lower() == FLOAT_NAME:
            return FLOAT
        parts = [p.strip() for p in str(text).split("/")]
        if len(parts) == 1:
            parts = parts * 2
        if len(parts) != 2 or not all(parts):
            from ..errors import ConfigError

            raise ConfigError(f"candidate {text!r}: write FORMAT or ACTIVATION/WEIGHT, e.g. int8 or int16/int8.")
        return cls(get_format(parts[0]).name, get_format(parts[1]).name)


FLOAT_NAME = "float"
#: the widest precision: the layer excluded from quantization (its weights and its own
#: activation inputs stay float)
FLOAT = Candidate(FLOAT_NAME, FLOAT_NAME)


@dataclass
class SensitivityTable:
    """err[layer][candidate label]: relative L2 of the layer output with that layer quantized."""

    layers: list[str]
    candidates: list[str]
    err: dict[str, dict[str, float]] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"layers": self.layers, "candidates": self.candidates, "err": self.err}

    @classmethod
    def from_dict(cls, d: dict) -> "SensitivityTable":
        return cls(list(d["layers"]), list(d["candidates"]), {k: dict(v) for k, v in d["err"].items()})


#: `op_types` entry meaning every op that quantizes something of its own (not a pass-through op,
#: which only carries its input's parameters): element-wise ops, Softmax inputs, Concat, Gather
#: tables...
ALL_OPS = "all"


def candidate_layers(wb: Workbench, config: QuantConfig, op_types: frozenset[str]) -> list[str]:
    """Nodes of `op_types` (or every op with semantics of its own, `ALL_OPS`) that the wide
    config quantizes, in topological order."""
    plan = wb.plan(config)
    every = ALL_OPS in op_types
    inits = {t.name for t in wb.model.graph.initializer}
    out = []
    for n in wb.model.graph.node:
        sem = semantics(n)
        if sem is None or n.name in plan.float_nodes:
            continue
        # a Gather reading a table (an embedding) quantizes that table: a candidate of its own
        table = n.op_type == "Gather" and bool(n.input) and n.input[0] in inits
        if n.op_type in op_types or (every and (not sem.passthrough or table)):
            if any(i in plan.tensors and plan.tensors[i].format is not None for i in n.input):
                out.append(n.name)
    return out


def _capture(wb: Workbench, nodes: list[onnx.NodeProto], max_rows: int) -> list[dict[str, np.ndarray]]:
    """Float values of the candidate layers' activation inputs and outputs on a few samples, one
    dict per held-out feed (at least `max_rows` rows when there are that many). The feeds are
    kept apart, never joined: a model with a fixed batch size (or any batch rule) takes each
    intermediate tensor only in the batch its own feed had."""
    from ..evaluate import make_session

    inits = {t.name for t in wb.model.graph.initializer}
    names = []
    for n in nodes:
        names += [i for i in n.input if i and i not in inits]
        names.append(n.output[0])
    names = list(dict.fromkeys(names))
    m = onnx.ModelProto()
    m.CopyFrom(wb.model)
    have = {o.name for o in m.graph.output}
    graph_inputs = {i.name for i in m.graph.input}
    for nm in names:
        if nm not in have and nm not in graph_inputs:
            m.graph.output.append(helper.make_empty_tensor_value_info(nm))
    sess = make_session(m, optimize=False)
    out_names = [o.name for o in sess.get_outputs()]
    want = [n for n in names if n in out_names]
    chunks: list[dict[str, np.ndarray]] = []
    rows = 0
    for feed in wb.eval_feeds:
        chunk = dict(zip(want, sess.run(want, feed)))
        chunk.update({nm: feed[nm] for nm in names if nm in feed})
        chunks.append(chunk)
        first = next(iter(feed.values()))
        rows += first.shape[0] if first.ndim else 1
        if rows >= max_rows:
            break
    return chunks


def _single_node_model(wb: Workbench, node: onnx.NodeProto) -> onnx.ModelProto:
    g = wb.model.graph
    inits = {t.name: t for t in g.initializer}
    vi = {v.name: v for v in [*g.value_info, *g.input, *g.output]}
    names = list(dict.fromkeys(i for i in node.input if i))  # x * x, Concat(f, f): one input each
    inputs = [vi.get(i) or helper.make_tensor_value_info(i, onnx.TensorProto.FLOAT, None)
              for i in names if i not in inits]
    out = vi.get(node.output[0]) or helper.make_tensor_value_info(node.output[0], onnx.TensorProto.FLOAT, None)
    graph = helper.make_graph([node], f"layer_{node.name}", inputs, [out],
                              [inits[i] for i in names if i in inits])
    m = helper.make_model(graph, opset_imports=list(wb.model.opset_import))
    m.ir_version = wb.model.ir_version
    return onnx.shape_inference.infer_shapes(m)


def _layer_error(tiny: onnx.ModelProto, stats: dict, config: QuantConfig,
                 chunks: list[dict[str, np.ndarray]], out_name: str, threads: int | None = None) -> float:
    """Relative L2 of the layer output with the layer quantized by `config`, run feed by feed
    (the batches the model itself was fed)."""
    from ..evaluate import make_session

    qmodel, _ = Pipeline.of_prepared(tiny, stats).materialize(config)
    # QDQ semantics: with full optimizations a non-VNNI CPU's saturating u8s8 kernels made int8
    # weights measure worse than int4 ones (which no integer kernel takes)
    sess = make_session(qmodel, optimize="basic", threads=threads)
    names = [i.name for i in sess.get_inputs()]
    return relative_l2([(sess.run(None, {nm: c[nm] for nm in names})[0], c[out_name])
                        for c in chunks])


def layer_row(tiny: onnx.ModelProto, stats: dict, base: QuantConfig, candidates: list[Candidate],
              chunks: list[dict[str, np.ndarray]], weightless: bool,
              threads: int | None = None) -> dict[str, float]:
    """err(candidate) of one layer (`tiny`: the layer as a one-node model; `chunks`: its float
    inputs and output per held-out feed): a function of its arguments alone, so that a worker
    computes the same floats (`threads`: onnxruntime's, 1 on a worker sharing the cores)."""
    out_name = tiny.graph.output[0].name
    row: dict[str, float] = {}
    by_activation: dict[str, float] = {}
    for c in candidates:
        if c.is_float:  # a layer left float adds no error of its own
            row[c.label] = 0.0
            continue
        if weightless and c.activation in by_activation:
            row[c.label] = by_activation[c.activation]
            continue
        cfg = base.with_options(activation=c.activation, weight=c.weight, layer_rules=(),
                                tensor_formats=())
        row[c.label] = _layer_error(tiny, stats, cfg, chunks, out_name, threads)
        by_activation.setdefault(c.activation, row[c.label])
    return row


def measure_sensitivity(wb: Workbench, base: QuantConfig, layers: list[str],
                        candidates: list[Candidate], *, max_rows: int = 16,
                        progress=None, executor=None) -> SensitivityTable:
    """err(layer, candidate) for every candidate layer and format (the base config included).
    `executor` (a :class:`mixq.distributed.Executor` with more than one worker): the layers are
    measured in parallel tasks, the same floats."""
    nodes = {n.name: n for n in wb.model.graph.node}
    chosen = [nodes[n] for n in layers]
    chunks = _capture(wb, chosen, max_rows)
    have = set(chunks[0]) if chunks else set()
    inits = {t.name for t in wb.model.graph.initializer}
    labels = [c.label for c in candidates]
    table = SensitivityTable(layers=list(layers), candidates=labels)
    todo = []
    for node in chosen:
        if node.output[0] not in have or any(x not in have for x in node.input
                                             if x and x not in inits):
            continue
        sem = semantics(node)
        w = None if sem is None else sem.weight
        # a layer without a weight: only the activation format matters, measured once each
        weightless = w is None or w >= len(node.input) or node.input[w] not in inits
        todo.append((node, weightless))
    if executor is not None and executor.workers > 1 and len(todo) > 1:
        rows = sensitivity_rows(executor, [(_single_node_model(wb, node),
                                            _layer_chunks(node, chunks), weightless)
                                           for node, weightless in todo],
                                wb.pipeline.stats, base, candidates)
        for i, ((node, _), row) in enumerate(zip(todo, rows)):
            table.err[node.name] = row
            if progress is not None:
                progress(i)
        return table
    for i, (node, weightless) in enumerate(todo):
        table.err[node.name] = layer_row(_single_node_model(wb, node), wb.pipeline.stats, base,
                                         candidates, chunks, weightless)
        if progress is not None:
            progress(i)
    return table


def _layer_chunks(node: onnx.NodeProto, chunks: list[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
    """The captured values one layer reads and writes (what its task needs)."""
    names = {*node.input, node.output[0]}
    return [{k: v for k, v in c.items() if k in names} for c in chunks]


# -- on an executor's workers (see measure_sensitivity) ------------------------------------------
def _sensitivity_task(shared: tuple[dict[str, dict[str, Any]], dict[str, Any],
                                    list[tuple[str, str]]],
                      item: list[tuple[bytes, list[dict[str, np.ndarray]], bool]]
                      ) -> list[dict[str, float]]:
    """Task: the sensitivity rows of a group of layers (see `search.sensitivity.layer_row`)."""
    from ..calibration.stats import TensorStats

    stats, base_dict, cand_pairs = shared
    base, cands = QuantConfig.from_dict(base_dict), [Candidate(a, w) for a, w in cand_pairs]
    rows = []
    for tiny_bytes, chunks, weightless in item:
        tiny = onnx.load_from_string(tiny_bytes)
        names = {*(i for n in tiny.graph.node for i in n.input), *(o.name for o in tiny.graph.output)}
        rows.append(layer_row(tiny, {n: TensorStats.from_dict(stats[n]) for n in names if n in stats},
                              base, cands, chunks, weightless, threads=1 if in_worker() else None))
    return rows


def sensitivity_rows(executor: Executor, layers: Sequence[tuple[onnx.ModelProto,
                                                                 list[dict[str, np.ndarray]], bool]],
                     stats: dict[str, Any], base: Any, candidates: Sequence[Any]) -> list[dict[str, float]]:
    """The sensitivity rows of `layers` ((one-node model, its captured values, weightless)), in
    `2 x workers` groups of layers on `executor`: the same floats as `layer_row` in this
    process."""
    names = {x for tiny, _, _ in layers for n in tiny.graph.node for x in (*n.input, *n.output)}
    shared = ({n: s.to_dict() for n, s in stats.items() if n in names}, base.to_dict(),
              [(c.activation, c.weight) for c in candidates])
    items = [(tiny.SerializeToString(), chunks, weightless) for tiny, chunks, weightless in layers]
    # a few tasks per worker, not one per layer: a layer is milliseconds of work, a task's
    # round trip is not much less
    groups = [items[lo:hi] for lo, hi in shard_bounds(len(items), 2 * executor.workers)]
    return [row for part in executor.map(_sensitivity_task, groups, shared) for row in part]
