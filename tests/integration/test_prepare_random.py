"""Property test: `prepare` keeps the function of randomly drawn exporter-style graphs.

Every prepare pass (constant, BatchNorm and affine folds, Pad folds, recognition of written-out
HardSwish / HardSigmoid / Mish / GELU / GroupNorm, cross-layer equalization) rewrites the float
model before anything is quantized; a wrong rewrite there is a runnable wrong model that no
later check can tell from quantization noise. So chains of what exporters write around a Conv
(BatchNorm, Mul / Div / Add / Sub by constants of every broadcast shape and operand order, the
written activations in each spelling, torch's GroupNorm, branches that give a tensor, a Conv
output or a weight several readers) are drawn at random, prepared, and run beside the original
in onnxruntime: the outputs agree to float rounding. A node named in the config (`keep_nodes`)
survives every pass."""
from __future__ import annotations

import math

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st
from onnx import helper, numpy_helper

from mixq.pipeline import Pipeline

from ..graphs import run

#: constant shapes for a (1, C, H, W) tensor: broadcast per tensor, per channel (two spellings),
#: along W only (not per channel: no layer folds it) and element-wise
_SHAPES = ["scalar", "one", "chan", "chan3", "width", "full"]
#: args at or above this draw a near miss of a written activation (see _Chain.hardswish)
NEAR = 40


class _Chain:
    """A (1, C, H, W) chain under construction: nodes, initializers, fresh names."""

    def __init__(self, c: int, hw: int, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.c, self.hw = c, hw
        self._n = 0

    def name(self, base: str) -> str:
        self._n += 1
        return f"{base}{self._n}"

    def const(self, value: np.ndarray | float, base: str = "k", dtype: type = np.float32) -> str:
        n = self.name(base)
        self.inits.append(numpy_helper.from_array(np.asarray(value, dtype), n))
        return n

    def node(self, op: str, inputs: list[str], **attrs: object) -> str:
        out = self.name(op.lower())
        self.nodes.append(helper.make_node(op, inputs, [out], name=f"{op.lower()}_{len(self.nodes)}", **attrs))
        return out

    def shaped(self, kind: str, nonzero: bool) -> np.ndarray:
        c, hw = self.c, self.hw
        shape = {"scalar": (), "one": (1,), "chan": (1, c, 1, 1), "chan3": (c, 1, 1),
                 "width": (1, 1, 1, hw), "full": (1, c, hw, hw)}[kind]
        v = self.rng.uniform(0.5, 2.0, shape) * self.rng.choice([-1.0, 1.0], shape)
        return v if nonzero else self.rng.standard_normal(shape) * 0.5

    def clip6(self, t: str) -> str:
        return self.node("Clip", [t, self.const(0.0, "lo"), self.const(6.0, "hi")])

    # -- the ops a chain draws from -------------------------------------------------------------
    def conv(self, src: str, arg: int) -> str:
        oc, depthwise, bias = self.c if arg % 2 else max(1, arg % 5 + 1), arg % 3 == 0, arg % 4 != 1
        groups = self.c if depthwise else 1
        oc = self.c if depthwise else oc
        w = self.const(self.rng.standard_normal((oc, self.c // groups, 3, 3)) * 0.3, "w")
        ins = [src, w] + ([self.const(self.rng.standard_normal(oc) * 0.1, "b")] if bias else [])
        out = self.node("Conv", ins, pads=[1, 1, 1, 1], group=groups)
        self.c = oc
        return out

    def bn(self, src: str, arg: int) -> str:
        c = self.c
        ps = [self.const(v) for v in (self.rng.uniform(0.5, 2, c), self.rng.standard_normal(c) * 0.3,
                                      self.rng.standard_normal(c) * 0.5, self.rng.uniform(0.3, 2, c))]
        return self.node("BatchNormalization", [src, *ps])

    def arith(self, op: str, src: str, arg: int) -> str:
        k = self.const(self.shaped(_SHAPES[arg % len(_SHAPES)], nonzero=op in ("Mul", "Div")))
        const_first = arg // len(_SHAPES) % 2 == 1 and op != "Div"
        return self.node(op, [k, src] if const_first else [src, k])

    # a draw of arg >= NEAR writes one constant of a written activation off by a little: a near
    # miss, which the recognisers must leave as written
    def hardswish(self, src: str, arg: int) -> str:
        spelling, off = arg % 4, arg >= NEAR
        if spelling == 3:  # torch before opset 14
            g = self.node("HardSigmoid", [src], alpha=1.0 / 6.0, beta=0.4 if off else 0.5)
            return self.node("Mul", [src, g])
        r6 = self.clip6(self.node("Add", [src, self.const(2.5 if off and arg % 3 == 0 else 3.0)]))
        six = 5.0 if off and arg % 3 else 6.0
        if spelling == 0:  # paddle2onnx: x * relu6(x + 3), then / 6
            return self.node("Div", [self.node("Mul", [src, r6]), self.const(six)])
        if spelling == 1:
            return self.node("Mul", [src, self.node("Div", [r6, self.const(six)])])
        return self.node("Mul", [self.node("Mul", [r6, self.const(1.0 / six)]), src])

    def gate(self, src: str, arg: int) -> str:
        """relu6(x + 3) / 6 gating another tensor (squeeze-excitation style)."""
        g = self.node("Div", [self.clip6(self.node("Add", [src, self.const(3.0)])),
                              self.const(5.0 if arg >= NEAR else 6.0)])
        return self.node("Mul", [self.node("Relu", [src]), g])

    def mish(self, src: str, arg: int) -> str:
        if arg % 2:
            sp = self.node("Softplus", [src])
        else:  # tf2onnx: log(exp(x) + 1)
            one = self.const(2.0 if arg >= NEAR else 1.0)
            sp = self.node("Log", [self.node("Add", [self.node("Exp", [src]), one])])
        t = self.node("Tanh", [sp])
        return self.node("Mul", [t, src] if arg % 3 else [src, t])

    def gelu(self, src: str, arg: int) -> str:
        e = self.node("Erf", [self.node("Div", [src, self.const(1.3 if arg >= NEAR else math.sqrt(2.0))])])
        return self.node("Mul", [self.node("Mul", [src, self.node("Add", [e, self.const(1.0)])]), self.const(0.5)])

    def groupnorm(self, src: str, arg: int) -> str:
        """nn.GroupNorm as torch exports it: reshaped to (N, G, -1), InstanceNormalization with
        scale 1 and bias 0 (or the groups scaled by 2 inside it), reshaped back by Shape(x), times
        gamma, plus beta."""
        c = self.c
        groups = [g for g in (1, 2, c) if c % g == 0][arg % (2 if c % 2 else 3)] if c > 1 else 1
        r = self.node("Reshape", [src, self.const([0, groups, -1], "shape", np.int64)])
        n = self.node("InstanceNormalization", [r, self.const(np.full(groups, 2.0 if arg >= NEAR else 1.0)),
                                                self.const(np.zeros(groups))], epsilon=1e-5)
        y = self.node("Reshape", [n, self.node("Shape", [src])])
        if arg % 4:
            y = self.node("Mul", [y, self.const(self.rng.uniform(0.5, 2, (c, 1, 1)))])
        if arg % 3:
            y = self.node("Add", [y, self.const(self.rng.standard_normal((c, 1, 1)) * 0.5)])
        return y

    # -- the first wave's failure classes (issue 16), drawn into chains ---------------------------
    def concat_ranges(self, src: str, arg: int) -> str:
        """A detector head: box-like values (tens to hundreds) and Sigmoid scores (0..1)
        concatenated along the channels, one tensor of two ranges."""
        boxes = self.node("Mul", [src, self.const(float(10 ** (1 + arg % 3)))])
        out = self.node("Concat", [boxes, self.node("Sigmoid", [src])], axis=1)
        self.c *= 2
        return out

    def masked_softmax(self, src: str, arg: int) -> str:
        """An additive attention mask (-1e4 or the float minimum where masked) before a Softmax
        over the last axis: the mask sets the tensor's range, the scores sit far above it."""
        mask = np.zeros((1, 1, 1, self.hw), np.float32)
        mask[..., self.hw // 2:] = -1e4 if arg % 2 else np.finfo(np.float32).min
        return self.node("Softmax", [self.node("Add", [src, self.const(mask)])], axis=-1)

    def layernorm_var(self, src: str, arg: int) -> str:
        """LayerNorm over the last axis written out with the variance as E[x^2] - E[x]^2 (JAX),
        or as E[(x - mean)^2]: the first cancels once its terms are rounded."""
        mean = self.node("ReduceMean", [src], axes=[-1])  # opset 17: axes as an attribute
        centered = self.node("Sub", [src, mean])
        if arg % 2:
            var = self.node("Sub", [self.node("ReduceMean", [self.node("Mul", [src, src])], axes=[-1]),
                                    self.node("Mul", [mean, mean])])
        else:
            var = self.node("ReduceMean", [self.node("Mul", [centered, centered])], axes=[-1])
        std = self.node("Sqrt", [self.node("Add", [var, self.const(1e-5)])])
        return self.node("Div", [centered, std])

    def layernorm_jax(self, src: str, arg: int) -> str:
        """flax's LayerNorm as jax2tf writes it, over the width (the last axis) or the channels:
        sums with keepdims=0 times 1/n, the variance as max(0, E[x^2] - E[x]^2), both put back by
        a Reshape and an Expand to constant shapes, rsqrt times a scale along the axis, then a
        shift. A near miss puts the reduced axis back in another place (a different function:
        the mean broadcast along H), which must stay as written."""
        axis = 3 if arg % 2 else 1
        n = self.hw if axis == 3 else self.c
        kept = [1, self.c, self.hw, 1] if axis == 3 else [1, 1, self.hw, self.hw]
        if arg >= NEAR and axis == 3 and self.hw > 1:
            kept = [1, self.c, 1, self.hw]
        target = self.const([0, *kept[1:]], "shape", np.int64)  # 0: the batch as it comes
        spread = self.const(kept, "shape", np.int64)

        def back(t: str) -> str:
            r = self.node("Reshape", [t, target])
            return self.node("Expand", [r, spread]) if arg % 3 else r

        ax = self.const([axis], "axes", np.int64)
        mean = self.node("Mul", [self.node("ReduceSum", [src, ax], keepdims=0), self.const(1.0 / n)])
        ex2 = self.node("Mul", [self.node("ReduceSum", [self.node("Mul", [src, src]), ax], keepdims=0),
                                self.const(1.0 / n)])
        var = self.node("Max", [self.const(0.0), self.node("Sub", [ex2, self.node("Mul", [mean, mean])])])
        inv = self.node("Reciprocal", [self.node("Sqrt", [self.node("Add", [back(var), self.const(1e-6)])])])
        pshape = (self.hw,) if axis == 3 else (self.c, 1, 1)
        scaled = self.node("Mul", [inv, self.const(self.rng.uniform(0.5, 2, pshape))])
        y = self.node("Mul", [self.node("Sub", [src, back(mean)]), scaled])
        return self.node("Add", [y, self.const(self.rng.standard_normal(pshape) * 0.3)])

    def gelu_jax(self, src: str, arg: int) -> str:
        """tanh-GELU as jax2tf writes it: 0.044715 x^3 as x * (x * (0.044715 * x)); a near miss
        has another coefficient."""
        c3 = self.node("Mul", [src, self.node("Mul", [src, self.node("Mul", [
            self.const(0.05 if arg >= NEAR else 0.044715), src])])])
        inner = self.node("Mul", [self.const(math.sqrt(2.0 / math.pi)), self.node("Add", [src, c3])])
        cdf = self.node("Mul", [self.const(0.5), self.node("Add", [self.const(1.0), self.node("Tanh", [inner])])])
        return self.node("Mul", [src, cdf])

    def log_magnitude(self, src: str, arg: int) -> str:
        """A spectrogram's Log of a magnitude: small values carry the information."""
        return self.node("Log", [self.node("Add", [self.node("Mul", [src, src]), self.const(1e-6)])])

    def silu(self, src: str, arg: int) -> str:
        return self.node("Mul", [src, self.node("Sigmoid", [src])])

    def relu6(self, src: str, arg: int) -> str:
        return self.clip6(src)

    def residual(self, src: str, arg: int) -> str:
        """src read twice: by a Conv keeping the channels (then an affine by constants), and by
        the Add that joins it back."""
        c = self.c
        w = self.const(self.rng.standard_normal((c, c, 3, 3)) * 0.3, "w")
        y = self.node("Conv", [src, w], pads=[1, 1, 1, 1])
        y = self.arith(["Mul", "Add", "Div", "Sub"][arg % 4], y, arg // 4)
        return self.node("Add", [src, y])

    def branch(self, src: str, arg: int) -> str:
        """A Conv output read twice (by an affine by a constant and by the Add that joins them),
        or one weight, or one bias, read by two Convs (the first followed by the affine): no fold
        may change what the other reader sees."""
        c, shared = self.c, arg % 3
        w = self.const(self.rng.standard_normal((c, c, 3, 3)) * 0.3, "w")
        b = self.const(self.rng.standard_normal(c) * 0.1, "b")
        y = self.node("Conv", [src, w, b], pads=[1, 1, 1, 1])
        op = ["Mul", "Add", "Div", "Sub"][arg // 3 % 4]
        if shared == 0:
            return self.node("Add", [y, self.arith(op, y, arg // 12)])
        w2 = w if shared == 1 else self.const(self.rng.standard_normal((c, c, 3, 3)) * 0.3, "w")
        b2 = b if shared == 2 else self.const(self.rng.standard_normal(c) * 0.1, "b")
        other = self.node("Conv", [src, w2, b2], pads=[1, 1, 1, 1])
        return self.node("Add", [self.arith(op, y, arg // 12), other])


_OPS = {"conv": _Chain.conv, "bn": _Chain.bn,
        "mul": lambda ch, s, a: ch.arith("Mul", s, a), "div": lambda ch, s, a: ch.arith("Div", s, a),
        "add": lambda ch, s, a: ch.arith("Add", s, a), "sub": lambda ch, s, a: ch.arith("Sub", s, a),
        "hardswish": _Chain.hardswish, "gate": _Chain.gate, "mish": _Chain.mish, "gelu": _Chain.gelu,
        "silu": _Chain.silu, "relu6": _Chain.relu6, "residual": _Chain.residual, "groupnorm": _Chain.groupnorm,
        "branch": _Chain.branch, "concat_ranges": _Chain.concat_ranges, "masked_softmax": _Chain.masked_softmax,
        "layernorm_var": _Chain.layernorm_var, "log_magnitude": _Chain.log_magnitude,
        "layernorm_jax": _Chain.layernorm_jax, "gelu_jax": _Chain.gelu_jax}


def _build(ops: list[tuple[str, int]], c: int, hw: int, seed: int, fanout: int) -> onnx.ModelProto:
    ch = _Chain(c, hw, seed)
    src = "x"
    outs = []
    for k, (op, arg) in enumerate(ops):
        src = _OPS[op](ch, src, arg)
        outs.append((src, ch.c))
    # one intermediate may also be a graph output (a reader outside the graph: no fold may move it)
    extra = [outs[fanout % len(outs)]] if fanout and outs[fanout % len(outs)][0] != src else []
    g = helper.make_graph(ch.nodes, "exported", [helper.make_tensor_value_info("x", 1, [1, c, hw, hw])],
                          [helper.make_tensor_value_info(o, 1, [1, oc, hw, hw]) for o, oc in [outs[-1], *extra]],
                          ch.inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.checker.check_model(m, full_check=True)
    return m


def _agree(want: np.ndarray, got: np.ndarray) -> bool:
    """Equal to float rounding: the folds reorder float32 products and sums."""
    if want.shape != got.shape or not np.array_equal(np.isfinite(want), np.isfinite(got)):
        return False
    fin = np.isfinite(want)
    scale = float(np.max(np.abs(want[fin]), initial=0.0))
    return bool(np.all(np.abs(want[fin] - got[fin]) <= 1e-4 * scale + 1e-5))


_OP = st.tuples(st.sampled_from(sorted(_OPS)), st.integers(0, 47))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow],
          phases=[Phase.explicit, Phase.reuse, Phase.generate], derandomize=True)
@given(ops=st.lists(_OP, min_size=1, max_size=7), c=st.integers(1, 4), hw=st.integers(2, 5),
       seed=st.integers(0, 1000), fanout=st.integers(0, 8), keep=st.integers(-1, 30))
# a learned affine after a Conv and BatchNorm, then a written HardSwish: PP-LCNet's block
@example(ops=[("conv", 1), ("bn", 0), ("mul", 0), ("add", 0), ("hardswish", 0)], c=3, hw=4, seed=1,
         fanout=0, keep=-1)
# a constant minus the Conv's output (not a bias), and a Div whose constant varies along W
@example(ops=[("conv", 2), ("sub", 9), ("conv", 1), ("div", 4)], c=2, hw=3, seed=2, fanout=0, keep=-1)
def test_prepare_keeps_the_function_of_random_exported_chains(ops, c, hw, seed, fanout, keep):
    m = _build(ops, c, hw, seed, fanout)
    names = [n.name for n in m.graph.node]
    kept = [names[keep % len(names)]] if keep >= 0 else []
    pipe = Pipeline.load(m, keep_nodes=kept)
    prepared = pipe.model
    onnx.checker.check_model(prepared, full_check=True)
    assert [o.name for o in prepared.graph.output] == [o.name for o in m.graph.output]
    assert {n.name for n in prepared.graph.node} >= set(kept), kept  # a named node survives
    rng = np.random.default_rng(seed)
    for _ in range(2):
        feed = {"x": (rng.standard_normal((1, c, hw, hw)) * 2.5).astype(np.float32)}
        want = run(m, feed, optimize=False)
        got = run(prepared, feed, optimize=False)
        for o, w, g in zip(m.graph.output, want, got):
            assert _agree(w, g), (o.name, float(np.max(np.abs(w - g))),
                                  [p.name for p in pipe.prepare_report.passes if p.changed])


@pytest.mark.parametrize("act,arg,fused", [("hardswish", 0, "HardSwish"), ("hardswish", 1, "HardSwish"),
                                            ("hardswish", 2, "HardSwish"), ("hardswish", 3, "HardSwish"),
                                            ("mish", 0, "Mish"), ("mish", 1, "Mish"), ("gelu", 0, "Gelu"),
                                            ("gelu_jax", 0, "Gelu"), ("layernorm_jax", 1, "LayerNormalization"),
                                            ("groupnorm", 1, "GroupNormalization")])
def test_a_written_activation_after_a_learned_affine_leaves_one_node(act, arg, fused):
    """The property test's chains are what the recognisers match, and the layer folds run again
    after any fusion: a written activation read its input twice, so the learned shift before it
    declined to fold for its several readers until the activation was one node."""
    m = _build([("conv", 1), ("bn", 0), ("mul", 0), ("add", 0), (act, arg)], 3, 4, 1, 0)
    ops = [n.op_type for n in Pipeline.load(m).model.graph.node]
    assert ops == ["Conv", fused], ops
