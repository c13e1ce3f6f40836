"""Names in a config checked against the model: op types must be ONNX op types (or the model's
own), node and tensor names must exist in the model; otherwise ConfigError with the closest
names. `ModelQuantizer.quantize_model` calls it after loading the model."""
from __future__ import annotations

from functools import lru_cache
from typing import Any

import onnx

from ..errors import ConfigError, did_you_mean


@lru_cache(maxsize=1)
def _onnx_op_types() -> frozenset[str]:
    return frozenset(s.name for s in onnx.defs.get_all_schemas_with_history())


def _is_pattern(name: str) -> bool:
    return any(c in name for c in "*?[")


def _names_of(config: Any) -> tuple[set[str], set[str], set[str]]:
    """(op types, node names, tensor names) a config names."""
    from ..config import QuantConfig

    ops: set[str] = set()
    nodes: set[str] = set()
    tensors: set[str] = set()
    translation = config.translate() if hasattr(config, "translate") else None
    cfg = translation.config if translation is not None else config
    if translation is not None:
        ops |= set(translation.op_types)
        nodes |= {n for n in translation.node_names if n not in {t for t, _ in cfg.tensor_formats}}
        ft = translation.finetune
        if ft is not None:
            nodes |= set(ft.include_layers or ()) | set(ft.exclude_layers)
    if isinstance(cfg, QuantConfig):
        ops |= set(cfg.op_types or ()) | set(cfg.exclude_op_types)
        nodes |= set(cfg.exclude_nodes)
        for r in cfg.layer_rules:
            ops |= set(r.op_types)
            nodes |= set(r.nodes)
        tensors |= {t for t, _ in cfg.tensor_formats}
    return ops, {n for n in nodes if not _is_pattern(n)}, tensors


def check_names_against_model(config: Any, model: onnx.ModelProto) -> None:
    """Raise ConfigError for an op type that is no ONNX op type (nor one of the model's), or a node
    name the model does not have (the model as given, or as mixq names its unnamed nodes), with the
    closest names. `config`: a compat config (QuantizationConfig, Config, QConfig) or a QuantConfig."""
    ops, nodes, _ = _names_of(config)
    if nodes:
        from .amp import ensure_names

        named = onnx.ModelProto()
        named.graph.node.extend(model.graph.node)
        ensure_names(named)
        extra_names = {n.name for n in named.graph.node}
    else:
        extra_names = set()
    model_ops = {n.op_type for n in model.graph.node}
    known_ops = _onnx_op_types() | model_ops
    for op in sorted(ops):
        if op not in known_ops:
            raise ConfigError(f"op type {op!r} is not an ONNX op type." + did_you_mean(op, known_ops)
                              + " (op types are case-sensitive, e.g. 'Conv', 'MatMul').")
    node_names = {n.name for n in model.graph.node if n.name} | extra_names
    for name in sorted(nodes):
        if name not in node_names:
            raise ConfigError(f"node {name!r} is not in the model." + did_you_mean(name, node_names)
                              + " (check the node names with `mixq inspect` or Netron).")
    # tensor names are checked on the prepared graph by the quantizer itself (api._check_plan)
