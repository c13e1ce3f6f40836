"""The empirical kernel probe behind the bf16/fp16 graph formats."""
from __future__ import annotations

import pytest
from onnx import TensorProto, helper

from mixq.convert.probe import PROBE_CACHE, check_provider, probe_kernel
from mixq.errors import ConfigError

B, F = TensorProto.BFLOAT16, TensorProto.FLOAT


def test_probe_supported_and_cached():
    node = helper.make_node("Transpose", ["a"], ["b"], perm=[1, 0])
    r = probe_kernel(node, [B], [B], opset=17)
    assert r.ok and r.verified
    key = next(k for k in PROBE_CACHE if k[2] == "Transpose" and k[4] == (B,))
    assert PROBE_CACHE[key] is r
    assert probe_kernel(node, [B], [B], opset=17) is r  # served from the cache


def test_probe_schema_forbidden_type_is_verified_unsupported():
    node = helper.make_node("Conv", ["x", "w"], ["y"])  # Conv-11 has no bfloat16 type
    r = probe_kernel(node, [B, B], [B], opset=17, float_in_types=[F, F], float_out_types=[F])
    assert not r.ok and r.verified and r.reason


def test_probe_unknown_types_is_inconclusive():
    node = helper.make_node("Relu", ["x"], ["y"])
    r = probe_kernel(node, [None], [B], opset=17)
    assert r.ok and not r.verified


def test_float_kernel_always_found():
    node = helper.make_node("Add", ["a", "b"], ["c"])
    assert probe_kernel(node, [F, F], [F], opset=17).ok


def test_unknown_provider():
    with pytest.raises(ConfigError, match="Did you mean: CPUExecutionProvider"):
        check_provider("CPUExecutionProvidr")


def test_auto_provider_targets_the_gpu_for_the_native_formats():
    """The bf16 format is documented for onnxruntime-gpu: 'auto' picks CUDA (then ROCm) when
    onnxruntime has it, CPU otherwise; the rounding formats run anywhere and stay on CPU."""
    from mixq.convert.probe import resolve_provider

    gpu = ["TensorrtExecutionProvider", "ROCMExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"]
    assert resolve_provider("auto", native=True, available=gpu) == "CUDAExecutionProvider"
    assert resolve_provider("auto", native=True, available=gpu[1:2] + gpu[3:]) == "ROCMExecutionProvider"
    assert resolve_provider("auto", native=True, available=["CPUExecutionProvider"]) == "CPUExecutionProvider"
    assert resolve_provider("auto", native=False, available=gpu) == "CPUExecutionProvider"
    assert resolve_provider("CPUExecutionProvider", native=True, available=gpu) == "CPUExecutionProvider"
