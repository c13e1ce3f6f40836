"""The empirical kernel probe behind the bf16/fp16 graph formats."""
from __future__ import annotations

import pytest
from onnx import TensorProto, helper

from mixq.kernels import PROBE_CACHE, check_provider, probe_kernel
from mixq.errors import ConfigError

B, F = TensorProto.BFLOAT16, TensorProto.FLOAT


def test_probe_supported_and_cached():
    PROBE_CACHE.clear()  # another test may have probed a Transpose already (another key, same op)
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
    from mixq.kernels import resolve_provider

    gpu = ["TensorrtExecutionProvider", "ROCMExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"]
    assert resolve_provider("auto", native=True, available=gpu) == "CUDAExecutionProvider"
    assert resolve_provider("auto", native=True, available=gpu[1:2] + gpu[3:]) == "ROCMExecutionProvider"
    assert resolve_provider("auto", native=True, available=["CPUExecutionProvider"]) == "CPUExecutionProvider"
    assert resolve_provider("auto", native=False, available=gpu) == "CPUExecutionProvider"
    assert resolve_provider("CPUExecutionProvider", native=True, available=gpu) == "CPUExecutionProvider"


def test_native_traces_a_fused_node_without_kernel_back_to_our_nodes():
    """onnxruntime's optimizer can fuse converted nodes into one op that has no bf16 kernel; its
    error names neither our nodes nor their op type. A halving search finds the node(s) to keep
    float. Simulated with a session factory that fails while nodes t3 and t4 both compute in
    bf16 (as a fusion of the two would), since CPU onnxruntime fuses none of its bf16 ops."""
    import numpy as np
    import onnx
    from onnx import numpy_helper

    from mixq.convert._rewrite import native
    from mixq.convert._session import open_session

    nodes = [helper.make_node("Transpose", [f"h{i}"], [f"h{i + 1}"], name=f"t{i}", perm=[1, 0]) for i in range(8)]
    nodes.append(helper.make_node("MatMul", ["h8", "w"], ["y"], name="mm"))
    g = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("h0", F, [4, 4])],
                          [helper.make_tensor_value_info("y", F, [4, 4])],
                          initializer=[numpy_helper.from_array(np.eye(4, dtype=np.float32), "w")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    calls = []

    def factory(model, provider):
        calls.append(1)
        inferred = onnx.shape_inference.infer_shapes(model)
        types = {v.name: v.type.tensor_type.elem_type for v in inferred.graph.value_info}
        types.update({o.name: o.type.tensor_type.elem_type for o in inferred.graph.output})
        out = {n.name: n.output[0] for n in model.graph.node}
        if types.get(out["t3"]) == B and types.get(out["t4"]) == B:
            raise RuntimeError("[ONNXRuntimeError] : 9 : NOT_IMPLEMENTED : Could not find an implementation "
                               "for FusedTranspose(1) node with name 'fused_0'")
        return open_session(model, provider)

    res = native(m, F, B, "CPUExecutionProvider", session_factory=factory)
    kept = {k.node: k.reason for k in res.kept_float}
    culprit = kept.keys() & {"t3", "t4"}
    assert len(culprit) == 1, kept  # one node of the pair suffices
    why = kept[culprit.pop()]
    assert "fuses it" in why and "FusedTranspose" in why
    assert len([n for n in res.converted_node_names if n.startswith("t")]) == 7
    assert len(calls) <= 2 + 2 * 3 + 1 + 1  # first try, search (8 suspects), final try
