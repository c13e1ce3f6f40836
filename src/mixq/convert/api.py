"""`to_bf16` and `to_fp16`: whole-model precision conversion in four output formats."""
from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence

import numpy as np
import onnx
from onnx import TensorProto

from .._io import load_model, model_size
from ..errors import ConfigError, FormatError, MixqError, ModelError, did_you_mean
from ..graph import PassResult
from . import _graph as G
from . import _rewrite as R
from ._rounding import element_type_name
from .report import ConversionReport, fidelity, op_counts

__all__ = ["to_bf16", "to_fp16", "detect_source", "BF16_FORMATS", "FP16_FORMATS", "SOURCES"]

#: Output formats of `to_bf16` (the names of quark's convert_fp32_to_bf16 --format).
BF16_FORMATS = ("with_cast", "bf16", "simulate_bf16", "customqdq")
#: Output formats of `to_fp16`.
FP16_FORMATS = ("with_cast", "fp16", "simulate_fp16")
#: Accepted `source` values.
SOURCES = ("auto", "fp32", "fp16")
_SRC_TYPE = {"fp32": TensorProto.FLOAT, "fp16": TensorProto.FLOAT16}
_MIN_OPSET_BF16 = 13  # Cast to/from bfloat16


def detect_source(model: onnx.ModelProto) -> str:
    """'fp16' if any initializer or graph input is float16, else 'fp32'."""
    g = model.graph
    if any(t.data_type == TensorProto.FLOAT16 for t in g.initializer):
        return "fp16"
    if any(i.type.tensor_type.elem_type == TensorProto.FLOAT16 for i in g.input):
        return "fp16"
    return "fp32"


def _check_choice(value: str, choices: Sequence[str], what: str, exc: type[Exception]) -> str:
    if value not in choices:
        raise exc(f"unknown {what} {value!r}; choose one of {', '.join(choices)}.{did_you_mean(value, choices)}")
    return value


def _resolve_source(model: onnx.ModelProto, source: str, target: int) -> str:
    _check_choice(source, SOURCES, "source precision", ConfigError)
    src = detect_source(model) if source == "auto" else source
    F = _SRC_TYPE[src]
    has = any(t.data_type == F for t in model.graph.initializer) or \
        any(i.type.tensor_type.elem_type == F for i in model.graph.input) or \
        any(o.type.tensor_type.elem_type == F for o in model.graph.output)
    if not has:
        other = "fp16" if src == "fp32" else "fp32"
        if target == TensorProto.FLOAT16:
            raise ModelError(f"the model has no float32 weights, inputs or outputs; to_fp16 / "
                             "convert_fp32_to_fp16 converts float32 models (is it already float16?).")
        raise ModelError(f"the model has no {element_type_name(F)} weights, inputs or outputs, so there is "
                         f"nothing to convert from {src}; is it a {other} model? Use source='{other}' "
                         f"(--from {other}) or python -m mixq.tools.convert_{other}_to_bf16.")
    return src


def _upgrade_opset(model: onnx.ModelProto, minimum: int, notes: list[str]) -> onnx.ModelProto:
    from ..passes.unfuse import STANDARD_SINCE, hold_runtime_onnx_ops, runtime_onnx_ops, unfuse

    opset = G.default_opset(model)
    why = "bfloat16 Cast"
    held_any = bool(runtime_onnx_ops(model))
    if held_any:
        # onnxruntime's own default-domain ops (its LayerNormalization before opset 17) leave the
        # tensors after them untyped: held past the converter to the opset where they are standard
        held = onnx.ModelProto()
        held.CopyFrom(model)
        hold_runtime_onnx_ops(held)
        model, minimum = held, max(minimum, STANDARD_SINCE)
        why = f"onnxruntime's LayerNormalization is standard from {STANDARD_SINCE}"
    if opset >= minimum:
        if held_any:  # at an opset that needs no upgrade (an RMSNorm at opset 18): released all the same
            unfuse(model, PassResult("release"))
        return model
    try:
        from ..passes.prepare import convert_opset

        res = PassResult("opset")
        up = convert_opset(model, minimum, res)
        unfuse(up, res)
        notes += res.notes
    except MixqError:
        raise
    except Exception as exc:
        raise ModelError(f"the model uses opset {opset}; bfloat16 Casts need opset >= {minimum} and the "
                         f"automatic upgrade failed ({exc}). Re-export the model with opset >= {minimum}.") from exc
    notes.append(f"default opset upgraded from {opset} to {minimum} ({why})")
    return up


def _native_note(fmt: str, provider: str, target: int, res: R.RewriteResult) -> list[str]:
    """Why most nodes of a `bf16`/`fp16` conversion stayed float, when the provider lacks kernels."""
    if fmt not in ("bf16", "fp16"):
        return []
    missing = sorted({k.op_type for k in res.kept_float if not k.reason.startswith("numerically fragile")})
    if not missing and provider != "CPUExecutionProvider":
        return [f"The file targets {provider}; CPU onnxruntime has no {element_type_name(target)} kernel for "
                "most converted nodes and may not load it (convert with --provider CPUExecutionProvider for that)."]
    if not missing:
        return []
    tname = element_type_name(target)
    done = ", ".join(sorted(res.converted_ops)) or "none"
    note = (f"{provider} cannot run {len(missing)} op type(s) of this model in {tname} "
            f"({', '.join(missing[:8])}{' ...' if len(missing) > 8 else ''}): those nodes compute in the source "
            f"float type, reading {tname}-stored weights through Casts (the file is smaller, that arithmetic is "
            f"not {tname}); converted op types: {done}.")
    if provider != "CPUExecutionProvider":
        note += (f" The file targets {provider}; CPU onnxruntime has no {tname} kernel for the converted "
                 "nodes and will not load it (convert with --provider CPUExecutionProvider for that).")
    elif target == TensorProto.BFLOAT16:
        note += (" The bf16 format targets onnxruntime-gpu: convert with --provider CUDAExecutionProvider "
                 "(or ROCMExecutionProvider) where it is installed for bfloat16 arithmetic; --format with_cast "
                 "simulates bfloat16 activations on any provider.")
    return [note]


def _convert(model: onnx.ModelProto | str | os.PathLike, fmt: str, target: int, formats: Sequence[str], *,
             source: str, provider: str, evaluate: bool, feeds: Mapping[str, np.ndarray] | None,
             shapes: Mapping[str, Sequence[int]] | None, seed: int, validate: bool, strict: bool = False,
             ) -> tuple[onnx.ModelProto, ConversionReport]:
    from ..kernels import check_provider, resolve_provider

    _check_choice(fmt, formats, "conversion format", FormatError)
    if strict and not evaluate:  # strict judges the fidelity check: without it, it would vouch for nothing
        raise ConfigError("strict=True needs the fidelity check, and evaluate=False (--no-eval) skips it; "
                          "drop one of them.")
    t0 = time.perf_counter()
    original = load_model(model)
    from ..passes.prepare import check_declared, check_float_model, raise_if_damaged  # the quantizer's checks

    raise_if_damaged(original, verb="convert")
    check_float_model(original, verb="convert")
    check_declared(original, verb="convert")
    src = _resolve_source(original, source, target)
    if target == TensorProto.FLOAT16 and src != "fp32":
        raise ModelError("to_fp16 converts float32 models; this one is already float16 (source='fp16').")
    provider = resolve_provider(provider, native=fmt in ("bf16", "fp16"))
    check_provider(provider)
    F = _SRC_TYPE[src]
    notes: list[str] = []
    work = original
    if target == TensorProto.BFLOAT16 and fmt != "simulate_bf16":
        work = _upgrade_opset(original, _MIN_OPSET_BF16, notes)
    elif not fmt.startswith("simulate"):  # lifts only a model holding onnxruntime's own ops
        work = _upgrade_opset(original, 0, notes)
    fragile = target == TensorProto.BFLOAT16  # 8 significant bits: see _fragile
    if fmt.startswith("simulate"):
        res = R.simulate(work, F, target, fragile=fragile)
    elif fmt == "with_cast":
        res = R.qdq(work, F, target, functions=False, fragile=fragile)
    elif fmt == "customqdq":
        res = R.qdq(work, F, target, functions=True, fragile=fragile)
    else:
        res = R.native(work, F, target, provider, validate=validate, fragile=fragile)
    out = res.model
    # value_info of initializers adds nothing and can be stale (the opset converter writes rank-0
    # shapes for Constant outputs that become [1]-shaped initializers): drop it
    inits = {t.name for t in out.graph.initializer}
    keep = [v for v in out.graph.value_info if v.name not in inits]
    if len(keep) != len(out.graph.value_info):
        del out.graph.value_info[:]
        out.graph.value_info.extend(keep)
    if fmt in ("with_cast", "customqdq") and validate:
        from ._session import open_session
        res.serialized_size = open_session(out, provider)[1]  # fail here, not in the user's runtime
    wall = time.perf_counter() - t0
    report = ConversionReport(
        format=fmt, source=src, target=element_type_name(target), provider=provider,
        nodes_total=len(original.graph.node), nodes_converted=res.nodes_converted,
        tensors_converted=res.tensors_converted, initializers_converted=res.initializers_converted,
        casts_inserted=res.casts_inserted, qdq_nodes_inserted=res.qdq_nodes_inserted,
        kept_float=res.kept_float, size_before=model_size(original),
        size_after=res.serialized_size if res.serialized_size is not None else model_size(out),
        wall_time_s=wall, notes=notes + res.notes)
    report.op_counts = op_counts(work, res.converted_ops, res.kept_float)
    report.notes += _native_note(fmt, provider, target, res)
    if res.unverified_ops:
        report.notes.append("kernel probe inconclusive (checked by loading the whole model): "
                            + ", ".join(sorted(res.unverified_ops)))
    if evaluate:
        t1 = time.perf_counter()
        report.fidelity = fidelity(original, out, provider, feeds=feeds, shapes=shapes, seed=seed)
        report.eval_time_s = time.perf_counter() - t1
        if strict and report.failures:
            raise ModelError("the converted model fails its fidelity check (strict): " + " ".join(report.failures))
    return out, report


def to_bf16(model: onnx.ModelProto | str | os.PathLike, fmt: str = "bf16", *, source: str = "auto",
            provider: str = "auto", evaluate: bool = True,
            feeds: Mapping[str, np.ndarray] | None = None, shapes: Mapping[str, Sequence[int]] | None = None,
            seed: int = 0, validate: bool = True, strict: bool = False) -> tuple[onnx.ModelProto, ConversionReport]:
    """Convert a float32 or float16 model to bfloat16 in one of four formats.

    fmt:
      * ``with_cast``: a Cast pair (to bfloat16 and back) on every float activation, weights
        rounded to bfloat16 values; runs on any provider.
      * ``bf16``: the graph computes in bfloat16, weights stored as BFLOAT16; graph inputs and
        outputs keep their type (Casts at the boundary). Nodes `provider` has no bfloat16
        kernel for (probed, including the nodes onnxruntime's optimizer would form: written-out
        normalizations stay float) stay in float with Casts around them (listed in the report).
        `provider` 'auto' targets CUDA/ROCm when this onnxruntime has them (the format is meant
        for onnxruntime-gpu), else CPU, where few ops have bfloat16 kernels.
      * ``simulate_bf16``: weights rounded to bfloat16 values, stored in the source type.
      * ``customqdq``: like with_cast with model-local functions ``com.mixq.BFloat16Quantize`` /
        ``BFloat16Dequantize`` (bodies: Cast) instead of Casts; weights stored as BFLOAT16 behind a
        BFloat16Dequantize. Runs in stock onnxruntime, no custom op library.

    source: ``auto`` (float16 if any weight or input is float16), ``fp32`` or ``fp16``: only tensors
    of that type are converted. `evaluate` compares both models on `feeds` (default: random inputs,
    dynamic dims 1 or `shapes`). `validate` loads the result in onnxruntime before returning.
    `strict` raises a ModelError instead of returning a model that fails its fidelity check (an
    output below 10 dB SQNR or a differing label, or no output compared: ConversionReport.failures).
    The input model is never modified. Returns (converted model, ConversionReport).
    """
    return _convert(model, fmt, TensorProto.BFLOAT16, BF16_FORMATS, source=source, provider=provider,
                    evaluate=evaluate, feeds=feeds, shapes=shapes, seed=seed, validate=validate, strict=strict)


def to_fp16(model: onnx.ModelProto | str | os.PathLike, fmt: str = "fp16", *, source: str = "auto",
            provider: str = "auto", evaluate: bool = True,
            feeds: Mapping[str, np.ndarray] | None = None, shapes: Mapping[str, Sequence[int]] | None = None,
            seed: int = 0, validate: bool = True, strict: bool = False) -> tuple[onnx.ModelProto, ConversionReport]:
    """Convert a float32 model to float16: ``fp16`` (graph in float16, weights stored FLOAT16,
    float32 model inputs/outputs; nodes without a float16 kernel on `provider` stay float32 with
    Casts), ``with_cast`` (Cast pairs, rounded weights) or ``simulate_fp16`` (rounded weights).
    Weights beyond the float16 range saturate to +-65504 (counted in the report notes). Other
    arguments as in `to_bf16`."""
    if source not in ("auto", "fp32"):
        _check_choice(source, ("auto", "fp32"), "source precision for to_fp16", ConfigError)
    return _convert(model, fmt, TensorProto.FLOAT16, FP16_FORMATS, source="fp32" if source == "auto" else source,
                    provider=provider, evaluate=evaluate, feeds=feeds, shapes=shapes, seed=seed,
                    validate=validate, strict=strict)
