"""Does an onnxruntime execution provider have a kernel for an op with given element types?

Answered empirically, never from a hard-coded list (which goes stale with each onnxruntime
release): a one-node model with the node's own attributes and the requested input/output element
types (shapes left unknown) is handed to `onnxruntime.InferenceSession` with only that provider.
Session creation resolves kernels, so it fails with NOT_IMPLEMENTED ("Could not find an
implementation for ...") when the provider lacks one, and with a type error when the ONNX schema
itself forbids the type. Results are cached per process in `PROBE_CACHE`, keyed by
(provider, domain, op_type, opset, input types, output types, cast check) -- a refinement of
(provider, op_type, opset): the same op can have a kernel for one index type and not another.

If even the all-float version of the probe cannot be created (an op whose kernel constructor
needs constant inputs or known shapes), the probe is inconclusive: the answer is "supported,
unverified", and the converter's final whole-model session check decides (a node it names is
moved back to float). That whole-model check is the documented fallback; no table of ops is kept.

Used by the bf16/fp16 converter (which nodes can compute in the target type) and by the opset
conversions (`passes.function_ops`: which function ops stop running at the new opset).
"""
from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass

import onnx
from onnx import helper

from .errors import ConfigError, did_you_mean

__all__ = ["ProbeResult", "probe_kernel", "PROBE_CACHE", "check_provider", "resolve_provider", "GPU_PROVIDERS",
           "session_options"]


@dataclass(frozen=True)
class ProbeResult:
    """Outcome of one probe: `ok` (kernel found or inconclusive), `verified` (the probe decided it)
    and a short `reason` when not ok."""

    ok: bool
    verified: bool
    reason: str = ""


PROBE_CACHE: dict[tuple, ProbeResult] = {}


def session_options(optimize: bool = False):
    """Quiet onnxruntime session options (errors only); graph optimizations off unless asked."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    if not optimize:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return so


#: Providers `resolve_provider('auto')` prefers for the native formats, in order (the bf16 format
#: targets onnxruntime-gpu, as the vendor documents).
GPU_PROVIDERS = ("CUDAExecutionProvider", "ROCMExecutionProvider")


def resolve_provider(provider: str, native: bool, available: list[str] | None = None) -> str:
    """The execution provider a conversion targets. 'auto': for the native formats (bf16, fp16,
    which compute in the target type) the first of GPU_PROVIDERS this onnxruntime has, else CPU;
    for the others (which run on any provider) CPU. Any other name is returned unchanged."""
    if provider != "auto":
        return provider
    if native:
        import onnxruntime as ort

        avail = ort.get_available_providers() if available is None else available
        for p in GPU_PROVIDERS:
            if p in avail:
                return p
    return "CPUExecutionProvider"


def check_provider(provider: str) -> None:
    """Raise ConfigError unless onnxruntime in this environment has execution provider `provider`."""
    import onnxruntime as ort

    avail = ort.get_available_providers()
    if provider not in avail:
        raise ConfigError(f"execution provider {provider!r} is not available in this onnxruntime "
                          f"(available: {', '.join(avail)}).{did_you_mean(provider, avail)}")


def short_error(exc: BaseException) -> str:
    """The informative part of an onnxruntime error message, one line."""
    msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    msg = re.sub(r"^\[ONNXRuntimeError\] : \d+ : \w+ : ", "", msg)
    if "Could not find an implementation" in msg:
        return "no kernel: " + msg
    return msg[:200]


def _slots(names: Sequence[str], types: Sequence[int | None], prefix: str) -> tuple[list[str], list]:
    """The probe node's value names for `names` (empty ones kept empty: an optional slot left
    out) and the graph inputs/outputs that declare them with `types`."""
    out, infos = [], []
    for k, (name, t) in enumerate(zip(names, types)):
        out.append(f"{prefix}{k}" if name else "")
        if name:
            infos.append(helper.make_tensor_value_info(f"{prefix}{k}", t or onnx.TensorProto.UNDEFINED, None))
    return out, infos


def _one_node_model(node: onnx.NodeProto, in_types: Sequence[int | None],
                    out_types: Sequence[int | None], opset_imports) -> onnx.ModelProto:
    names, inputs = _slots(node.input, in_types, "i")
    onames, outs = _slots(node.output, out_types, "o")
    n = helper.make_node(node.op_type, names, onames, domain=node.domain, name="probe")
    n.attribute.extend(node.attribute)
    g = helper.make_graph([n], "probe", inputs, outs)
    m = helper.make_model(g, opset_imports=list(opset_imports))
    m.ir_version = 10
    return m


def _try(model: onnx.ModelProto, provider: str, detect_cast_insertion: bool = False) -> str:
    """'' if a session can be created, else the short error. With `detect_cast_insertion`, also
    fail when onnxruntime made the node run in float32 by inserting Casts around it (what its CPU
    provider does for float16 nodes it has no float16 kernel for)."""
    import onnxruntime as ort

    so = session_options()
    with tempfile.TemporaryDirectory(prefix="mixq_probe_") as tmp:
        if detect_cast_insertion:
            so.optimized_model_filepath = os.path.join(tmp, "opt.onnx")
        try:
            ort.InferenceSession(model.SerializeToString(), sess_options=so, providers=[provider])
        except Exception as exc:  # onnxruntime raises its own exception classes
            return short_error(exc)
        if detect_cast_insertion:
            before = sum(n.op_type == "Cast" for n in model.graph.node)
            try:
                after = sum(n.op_type == "Cast" for n in onnx.load(so.optimized_model_filepath).graph.node)
            except Exception:
                return ""
            if after > before:
                return "no kernel: onnxruntime would insert Casts and compute it in float32"
    return ""


def probe_kernel(node: onnx.NodeProto, in_types: Sequence[int | None], out_types: Sequence[int | None], *,
                 opset: int, provider: str = "CPUExecutionProvider",
                 float_in_types: Sequence[int | None] | None = None,
                 float_out_types: Sequence[int | None] | None = None,
                 opset_imports=None, detect_cast_insertion: bool = False) -> ProbeResult:
    """Whether `provider` can run `node` with inputs/outputs of the given ONNX element types.

    `float_in_types`/`float_out_types` are the node's original types, probed only when the
    requested types fail, to tell "no kernel for this type" (verified) from "this op cannot be
    probed in isolation" (inconclusive -> ok, unverified). Types None (unknown) make the probe
    inconclusive too. `detect_cast_insertion` (used for float16 targets) also counts as
    unsupported a node onnxruntime would wrap in Casts to compute in float32."""
    key = (provider, node.domain, node.op_type, opset, tuple(in_types), tuple(out_types), detect_cast_insertion)
    hit = PROBE_CACHE.get(key)
    if hit is not None:
        return hit
    if any(t is None for n, t in zip(node.input, in_types) if n) or \
            any(t is None for n, t in zip(node.output, out_types) if n):
        res = ProbeResult(True, False, "element types unknown; not probed")
        PROBE_CACHE[key] = res
        return res
    imports = opset_imports or [helper.make_opsetid(node.domain or "", opset)]
    err = _try(_one_node_model(node, in_types, out_types, imports), provider, detect_cast_insertion)
    if not err:
        res = ProbeResult(True, True)
    elif float_in_types is not None and float_out_types is not None and \
            all(t is not None for t in list(float_in_types) + list(float_out_types)):
        ferr = _try(_one_node_model(node, float_in_types, float_out_types, imports), provider)
        res = ProbeResult(False, True, err) if not ferr else ProbeResult(True, False, f"probe inconclusive: {ferr}")
    else:
        res = ProbeResult(False, True, err)
    PROBE_CACHE[key] = res
    return res
