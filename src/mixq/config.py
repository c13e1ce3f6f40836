"""Typed, frozen quantization configs and the named presets.

Everything is validated on creation: an unknown format, method or preset raises ConfigError (or
FormatError) naming the value and the valid choices. The documented vocabulary of other tools is
translated into these objects once, in `mixq.compat`.
"""
from __future__ import annotations

import fnmatch
import functools
from dataclasses import InitVar, asdict, dataclass, fields, replace
from typing import Any

from .calibration.observers import ENTROPY_MAX_LEVELS, entropy_too_wide
from .errors import ConfigError, did_you_mean
from .formats import get_format
from .granularity import Granularity, PerChannel, PerTensor, granularity_from
from .graph import names_and_patterns

CALIB_METHODS = ("minmax", "percentile", "entropy", "minmse")
WEIGHT_CALIB_METHODS = ("minmax", "minmse")
POF2_METHODS = ("nonoverflow", "minmse")
BIAS_MODES = ("auto", "int32", "float")
WEIGHT_ROUNDINGS = ("auto", "nearest", "gptq")
#: where a numerics policy keeps a weight off its integer or block grid: 'float' stores it as
#: it came (float32), 'half' in a 16-bit float (`mixq.plan.numerics.half_float_for`)
KEPT_WEIGHTS = ("float", "half")


@dataclass(frozen=True)
class LayerRule:
    """Layer-wise precision: nodes matched by op type or by name (exact or fnmatch pattern) get
    these activation/weight formats (None: keep the global one)."""

    op_types: frozenset[str] = frozenset()
    nodes: tuple[str, ...] = ()
    activation: str | None = None
    weight: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.op_types, str) or isinstance(self.nodes, str):
            raise ConfigError("LayerRule op_types and nodes must be collections of names, not a string.")
        object.__setattr__(self, "op_types", frozenset(self.op_types))
        object.__setattr__(self, "nodes", tuple(self.nodes))
        if not self.op_types and not self.nodes:
            raise ConfigError("a LayerRule needs op_types or nodes to match.")
        if self.activation is None and self.weight is None:
            raise ConfigError("a LayerRule needs an activation or a weight format.")
        for opt in ("activation", "weight"):
            v = getattr(self, opt)
            if v is not None:
                object.__setattr__(self, opt, get_format(v).name)

    def matches(self, op_type: str, node_name: str) -> bool:
        """Whether the rule applies to a node: its op type is listed, or its name is listed or
        matches a listed fnmatch pattern."""
        if op_type in self.op_types:
            return True
        names, globs = _names_and_patterns(self.nodes)
        return node_name in names or any(node_name == p or fnmatch.fnmatchcase(node_name, p) for p in globs)


@functools.lru_cache(maxsize=1024)
def _names_and_patterns(nodes: tuple[str, ...]) -> tuple[frozenset[str], tuple[str, ...]]:
    """A rule's plain node names (looked up) and its fnmatch patterns: a search's rules name
    dozens of nodes, and every node of the graph meets every rule in each plan it builds."""
    return names_and_patterns(nodes)


#: The range_headroom 'auto' gives integer activation grids of at least this many bits.
WIDE_GRID_BITS = 16
WIDE_GRID_HEADROOM = 2.0


def _headroom(value: Any, power_of_two: str | None, option: str = "range_headroom") -> float | str:
    if isinstance(value, str) and value.lower() == "auto":
        return "auto"
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not 1.0 <= float(value) <= 1024.0:
        raise ConfigError(f"{option}={value!r} must be 'auto' or a number in [1, 1024], "
                          "e.g. 2 (1: ranges end at the calibration data's extremes).")
    if power_of_two is not None and float(value) != 1.0:
        raise ConfigError(f"{option}={value!r} cannot be used with power_of_two="
                          f"{power_of_two!r}: power-of-two scales follow the NPU's rule. Drop "
                          f"{option} (or set it to 'auto').")
    return float(value)


def _choice(option: str, value: str, allowed: tuple[str, ...]) -> str:
    v = str(value).lower()
    if v not in allowed:
        raise ConfigError(f"{option}={value!r} is not valid; choose one of {', '.join(allowed)}."
                          + did_you_mean(v, allowed))
    return v


@dataclass(frozen=True)
class QuantConfig:
    """How to quantize a model.

    activation / weight: format names (see `mixq.formats.list_formats()`), chosen independently.
    calibration: range method for activations: minmax | percentile | entropy | minmse.
    minmse_min_gain: with calibration='minmse' (or power_of_two='minmse') on integer
        activations, a range is clipped only where that lowers the tensor's expected
        quantization error at least this many times below the MinMax range's (1: whenever it
        lowers it at all). A small modelled gain at
        the tensor was often a loss at the output on the bench models (docs/ACCURACY.md).
    range_headroom: how many times an integer activation range is widened, away from zero,
        where its calibration method left it unclipped (MinMax always; the other methods where
        the range they chose covers every value seen). The calibration data is a sample: unseen
        inputs go past its extremes (a confident class score past the largest one calibrated
        on), and a range that ends there clips them. 'auto' (the default): 2 on integer grids
        of 16 bits or more, where the one bit it costs leaves an error far below the 8-bit
        weights' (EfficientNet-Lite0 S16S16: 98.15 -> 100 % agreement on unseen crops), and 1
        (none) on narrower grids, where a bit is often the larger error. A number >= 1 applies
        to every integer activation range; 1 turns it off. Not with power_of_two. The widening
        stops at the interval the producing op bounds its output to (Softmax, Sigmoid, Tanh,
        a Clip's constants: mixq.plan.ops.bounded_tensors).
    output_headroom: the same widening for the tensors that define the output
        (mixq.plan.ops.output_defining_tensors: the graph outputs and what they are computed
        from through ops that pass extremes on, e.g. the logits a Softmax or an ArgMax reads),
        where it is more than range_headroom's: their largest values are the
        answer (the class, the box at the image's edge), and unseen inputs clipped there are a
        silent loss the guard, scoring samples the ranges were calibrated on, cannot see; but on
        an 8-bit grid the wider step flips close calls (docs/ACCURACY.md section 8 measures
        both). 'auto' (the default): as range_headroom; a number H widens those tensors H
        times on every integer grid, where range_headroom widens less (1.5: the 8-bit
        measurements' choice for small calibration sets). Not with power_of_two.
    weight_calibration: range method for integer weights and constants: minmax | minmse; None
        follows `calibration` (minmse when it is minmse, else minmax).
    power_of_two: None, or 'nonoverflow' | 'minmse' to use power-of-two scales (NPU presets).
    granularity: how finely integer weight scales vary: PerTensor(), PerChannel() (the
        default: one scale per output channel) or PerBlock(size) (one per block of `size`
        elements along the reduction axis, opset-21 blocked DequantizeLinear).
    per_channel: shorthand accepted at construction: True = PerChannel(), False = PerTensor().
    activation_symmetric / weight_symmetric: zero point 0 (or the unsigned midpoint).
    bias: 'auto' (int32 when activations and weights are integer, else float), 'int32', 'float'.
    op_types: op types to quantize (None: every op type mixq knows); exclude_op_types and
        exclude_nodes remove some.
    reduce_range: integer weights use one bit less (int8 -> [-64, 63]) so that onnxruntime's
        fused int8 kernels cannot saturate on x86 CPUs without VNNI.
    share_concat_scales: Concat inputs and output share one scale (what NPU compilers want).
    quantize_outputs: quantize the outputs of quantized ops (graph outputs included).
    fuse_activations: the output of a Conv/ConvTranspose/Gemm/MatMul/Add read only by Relu/Clip
        is not calibrated: backends run the pair as one kernel. Under integer formats it is
        quantized with the activation output's parameters, which changes no value and gives
        onnxruntime its DQ -> Conv -> Q pattern (QLinearConv); under block and float formats
        it stays float.
    layer_rules: layer-wise precision, later rules win (see LayerRule).
    tensor_formats: tensor-wise precision: (tensor name, format) pairs; the tensor is in that
        format everywhere (weights and activations alike).
    numerics_policies: after calibration, keep float the tensors a uniform grid would break
        (additive masks and sentinels, inputs of Log/Reciprocal/Sqrt/Div, cancelling
        subtractions, Concats of very different ranges, ranges set by outlier features),
        each with its reason in the plan
        (docs/ACCURACY.md); False quantizes them as asked.
    kept_weights: how the weights those policies keep off their grid are stored: 'float' (the
        default: as they came, float32) or 'half': in float16, or bfloat16 where float16's
        range or precision would not hold them (`mixq.plan.numerics.half_float_for`), half
        the bytes. Applies to the weights whose layer's small outputs matter (policy b:
        only where that policy's noise rule, judged again in the 16-bit format, passes it; a
        filter's stopband can need float32) and to those whose layer input a policy keeps
        float; `mixq auto` uses 'half' by default (AutoConfig.kept_weights).
    equalize: before planning, balance the layer pairs (Conv, MatMul, Gemm, with Relu-like
        ops between) whose channels' ranges are too far apart for one activation grid
        (cross-layer equalization, exact in float; chosen from the weights,
        mixq.passes.equalize); False leaves every pair as it is.
    quantize_tail: quantize the post-processing tail too: the nodes after the last
        Conv/ConvTranspose/Gemm/MatMul on the way to an output (a detector's box decode and
        score Sigmoid, a final Softmax or normalization; mixq.plan.ops.postprocess_tail).
        False (the default) leaves them float with the reason in the plan, as deployment flows
        run post-processing on the host: a uniform grid over decoded values puts a detector's
        boxes pixels off. A layer rule that names a tail node quantizes it all the same.
    bias_correction: each Conv/Gemm with integer weights takes into its bias the mean error its
        quantized weight adds to the output, (Wq - W) E[x], with E[x] measured in a second float
        pass over the calibration data (mixq.passes.bias_correction; not with finetuning, which
        fits the layers itself).
    weight_rounding: how integer weights of Conv/Gemm/MatMul are rounded onto their grid:
        'nearest' (each weight to its nearest code), 'gptq' (codes chosen to minimise the
        layer's output error on the calibration data, from its inputs' second moments measured
        in the calibration pass; mixq.passes.gptq) or 'auto' (the default: gptq where it can
        run and where the whole model scores no worse with it on the guard's samples than with
        nearest rounding; nearest elsewhere, with the reason in the summary: weights left in
        their external data file, finetuning, measured worse). The scales are the same.
    gptq_damp: with 'gptq', the dampening added to the input second moments' diagonal, as a
        fraction of its mean (0.01; larger is closer to nearest rounding).
    gptq_act_order: with 'gptq', round the inputs with the most energy first.
    dual_quant_nodes: at a precision boundary, the consumers in another format read both
        quantization nodes in series (producer's then consumer's format), so that backend
        compilers see both; otherwise they read one conversion node from the float tensor.
    """

    activation: str = "int8"
    weight: str = "int8"
    calibration: str = "minmax"
    minmse_min_gain: float = 1.0
    range_headroom: float | str = "auto"
    output_headroom: float | str = "auto"
    weight_calibration: str | None = None
    percentile: float = 99.999
    power_of_two: str | None = None
    granularity: Granularity = PerChannel()
    activation_symmetric: bool = False
    weight_symmetric: bool = True
    bias: str = "auto"
    op_types: frozenset[str] | None = None
    exclude_op_types: frozenset[str] = frozenset()
    exclude_nodes: frozenset[str] = frozenset()
    reduce_range: bool = False
    share_concat_scales: bool = False
    quantize_outputs: bool = True
    fuse_activations: bool = True
    layer_rules: tuple[LayerRule, ...] = ()
    tensor_formats: tuple[tuple[str, str], ...] = ()
    dual_quant_nodes: bool = False
    numerics_policies: bool = True
    kept_weights: str = "float"
    equalize: bool = True
    quantize_tail: bool = False
    bias_correction: bool = False
    weight_rounding: str = "auto"
    gptq_damp: float = 0.01
    gptq_act_order: bool = True
    name: str = "custom"
    per_channel: InitVar[bool | None] = None

    def __post_init__(self, per_channel: bool | None = None) -> None:
        if per_channel is not None:
            if not isinstance(per_channel, bool):
                raise ConfigError(f"per_channel={per_channel!r} must be True or False.")
            object.__setattr__(self, "granularity", PerChannel() if per_channel else PerTensor())
        object.__setattr__(self, "granularity", granularity_from(self.granularity))
        for opt in ("reduce_range", "share_concat_scales", "quantize_outputs", "fuse_activations",
                    "dual_quant_nodes", "activation_symmetric", "weight_symmetric",
                    "numerics_policies", "equalize", "quantize_tail", "bias_correction", "gptq_act_order"):
            if not isinstance(getattr(self, opt), bool):
                raise ConfigError(f"{opt}={getattr(self, opt)!r} must be True or False.")
        if isinstance(self.percentile, bool) or not isinstance(self.percentile, (int, float)):
            raise ConfigError(f"percentile={self.percentile!r} must be a number in (50, 100], "
                              "e.g. 99.999.")
        g = self.minmse_min_gain
        if isinstance(g, bool) or not isinstance(g, (int, float)) or not 1.0 <= float(g) <= 1e6:
            raise ConfigError(f"minmse_min_gain={g!r} must be a number in [1, 1e6], e.g. 1.5 (1: MinMSE "
                              "clips whenever it lowers the expected error; for no clipping at all, "
                              "calibration='minmax').")
        object.__setattr__(self, "minmse_min_gain", float(g))
        object.__setattr__(self, "range_headroom", _headroom(self.range_headroom, self.power_of_two))
        object.__setattr__(self, "output_headroom",
                           _headroom(self.output_headroom, self.power_of_two, "output_headroom"))
        d = self.gptq_damp
        if isinstance(d, bool) or not isinstance(d, (int, float)) or not 0.0 < float(d) <= 1.0:
            raise ConfigError(f"gptq_damp={d!r} must be a number in (0, 1], e.g. 0.01.")
        object.__setattr__(self, "gptq_damp", float(d))
        object.__setattr__(self, "weight_rounding",
                           _choice("weight_rounding", self.weight_rounding, WEIGHT_ROUNDINGS))
        object.__setattr__(self, "kept_weights", _choice("kept_weights", self.kept_weights, KEPT_WEIGHTS))
        # canonicalize names so that equal configs compare equal
        object.__setattr__(self, "activation", get_format(self.activation).name)
        object.__setattr__(self, "weight", get_format(self.weight).name)
        object.__setattr__(self, "calibration", _choice("calibration", self.calibration, CALIB_METHODS))
        if self.weight_calibration is not None:
            w = _choice("weight_calibration", self.weight_calibration, WEIGHT_CALIB_METHODS)
            # the method `calibration` implies is spelled None: equal configs compare equal
            object.__setattr__(self, "weight_calibration", None if w == self._implied_weight_method() else w)
        if self.power_of_two is not None:
            object.__setattr__(self, "power_of_two",
                               _choice("power_of_two", self.power_of_two, POF2_METHODS))
        object.__setattr__(self, "bias", _choice("bias", self.bias, BIAS_MODES))
        if not 50.0 < float(self.percentile) <= 100.0:
            raise ConfigError(f"percentile={self.percentile} must be in (50, 100], e.g. 99.999.")
        act = get_format(self.activation)
        if self.calibration == "entropy" and self.power_of_two is None and act.kind == "int" \
                and 2 ** act.bits > ENTROPY_MAX_LEVELS:
            raise ConfigError(f"activation={act.name!r}: {entropy_too_wide(2 ** act.bits)}")
        for opt in ("op_types", "exclude_op_types", "exclude_nodes"):
            v = getattr(self, opt)
            if v is not None:
                if isinstance(v, str):
                    raise ConfigError(f"{opt} must be a collection of names, not the string {v!r}.")
                object.__setattr__(self, opt, frozenset(v))
        self._post_mixed()

    def _post_mixed(self) -> None:
        rules = tuple(self.layer_rules)
        if not all(isinstance(r, LayerRule) for r in rules):
            raise ConfigError("layer_rules must be LayerRule objects.")
        object.__setattr__(self, "layer_rules", rules)
        tf = self.tensor_formats
        if isinstance(tf, str):
            raise ConfigError("tensor_formats must be (tensor name, format) pairs or a dict "
                              f"{{tensor: format}}, not the string {tf!r}.")
        items = list(tf.items() if isinstance(tf, dict) else tf)
        pairs: dict[str, str] = {}
        for item in items:
            if isinstance(item, str) or not isinstance(item, (tuple, list)) or len(item) != 2 \
                    or not isinstance(item[0], str):
                raise ConfigError(f"tensor_formats entry {item!r} is not a (tensor name, format) "
                                  "pair, e.g. ('conv1.weight', 'int16').")
            tensor, fmt = item
            name = get_format(fmt).name
            if tensor in pairs and pairs[tensor] != name:
                raise ConfigError(f"tensor {tensor!r} is given two formats, {pairs[tensor]} and {name}.")
            pairs[str(tensor)] = name
        object.__setattr__(self, "tensor_formats", tuple(sorted(pairs.items())))

    @property
    def weight_method(self) -> str:
        """The range method of integer weights (`weight_calibration`, else from `calibration`)."""
        return self.weight_calibration or self._implied_weight_method()

    def _implied_weight_method(self) -> str:
        return "minmse" if self.calibration == "minmse" else "minmax"

    def excludes_node(self, name: str) -> bool:
        """Whether exclude_nodes names node `name`, exactly or by an fnmatch pattern (the names
        check accepts patterns that match a node: each must also exclude what it matches)."""
        names, globs = _names_and_patterns(tuple(sorted(self.exclude_nodes)))
        return name in names or any(fnmatch.fnmatchcase(name, p) for p in globs)

    def named_nodes(self) -> tuple[str, ...]:
        """The node names and fnmatch patterns this config names (exclude_nodes and the layer
        rules'): preparation keeps such nodes as written (no fold or fusion removes them)."""
        return tuple(sorted({*self.exclude_nodes, *(n for r in self.layer_rules for n in r.nodes)}))

    def headroom_for(self, fmt: Any, output: bool = False) -> float:
        """The factor an unclipped activation range in format `fmt` (a Format) is widened by;
        `output`: of a tensor that defines the model's output (`output_headroom`)."""
        if self.power_of_two or fmt.kind != "int":
            return 1.0
        if self.range_headroom == "auto":
            h = WIDE_GRID_HEADROOM if fmt.bits >= WIDE_GRID_BITS else 1.0
        else:
            h = float(self.range_headroom)
        if not output:
            return h
        return h if self.output_headroom == "auto" else max(h, float(self.output_headroom))

    #: Options `why_inert` knows: each changes an output only under some formats.
    SCOPED_OPTIONS = ("calibration", "percentile", "minmse_min_gain", "range_headroom", "output_headroom",
                      "weight_calibration", "power_of_two", "granularity", "activation_symmetric", "weight_symmetric",
                      "reduce_range", "share_concat_scales", "bias_correction", "gptq_damp",
                      "gptq_act_order", "quantize_tail", "kept_weights")

    def why_inert(self, option: str, *, activations_only: bool = False) -> str | None:
        """Why `option` can change no output under this config's formats (its activation and
        weight formats, those of its layer rules and tensor formats), or None where it can.
        `activations_only`: `calibration` counts as the activations' range method only (the
        CLI's --calib-method), not also as the weights' where weight_calibration is None."""
        acts = [get_format(f) for f in {self.activation, *(r.activation for r in self.layer_rules if r.activation),
                                         *(f for _, f in self.tensor_formats)}]
        weights = [get_format(f) for f in {self.weight, *(r.weight for r in self.layer_rules if r.weight),
                                           *(f for _, f in self.tensor_formats)}]
        ranged = any(f.needs_qparams and not (self.power_of_two and f.kind == "int") for f in acts)
        int_w = any(f.kind == "int" for f in weights)
        scaled_w = any(f.needs_qparams for f in weights)
        names = ", ".join(sorted({f.name for f in acts + weights}))
        no_range = (f"no activation format takes a calibrated range ({names}"
                    + (": power-of-two scales follow their own rule" if self.power_of_two else "") + ")")
        if option == "calibration":
            if ranged:
                return None
            if int_w and self.weight_calibration is None and not activations_only:
                return None  # it sets the integer weights' method
            return no_range
        if option in ("percentile", "minmse_min_gain"):
            method = "percentile" if option == "percentile" else "minmse"
            if option == "minmse_min_gain" and self.power_of_two == "minmse" \
                    and any(f.kind == "int" for f in acts):
                return None  # it decides when a power-of-two scale clips
            if not ranged:
                return no_range
            return None if self.calibration == method else f"it applies to calibration='{method}', not '{self.calibration}'"
        if option in ("range_headroom", "output_headroom"):
            wide = any(f.kind == "int" and f.needs_qparams for f in acts) and not self.power_of_two
            return None if wide else f"it widens integer activation ranges, and there are none ({names})"
        if option in ("activation_symmetric", "share_concat_scales"):
            return None if any(f.needs_qparams for f in acts) else f"no activation format has a scale ({names})"
        if option == "power_of_two":
            return None if any(f.kind == "int" for f in acts + weights) else f"no format is an integer grid ({names})"
        if option in ("granularity", "weight_symmetric"):
            return None if scaled_w else f"no weight format has a scale of its own ({names})"
        if option in ("weight_calibration", "reduce_range", "bias_correction"):
            return None if int_w else f"no weight format is an integer grid ({names})"
        if option in ("gptq_damp", "gptq_act_order"):
            if not int_w:
                return f"GPTQ rounds integer weights, and no weight format is an integer grid ({names})"
            return "weight_rounding='nearest' runs no GPTQ" if self.weight_rounding == "nearest" else None
        if option == "kept_weights":
            if not self.numerics_policies:
                return "numerics_policies=False keeps no weight off its grid"
            gridded = any(f.kind in ("int", "block") for f in weights)
            return None if gridded else f"no weight format is an integer or block grid ({names})"
        if option == "quantize_tail":
            from .plan.ops import COMPUTE_OPS

            if self.op_types is not None and self.op_types <= COMPUTE_OPS:
                return (f"the tail is what follows the last {'/'.join(sorted(COMPUTE_OPS))}, and op_types "
                        f"({', '.join(sorted(self.op_types))}) quantizes none of it")
            return None
        raise ConfigError(f"why_inert: unknown option {option!r}." + did_you_mean(option, self.SCOPED_OPTIONS))

    def inert_changes(self, reference: "QuantConfig", *, activations_only: bool = False) -> dict[str, str]:
        """The options this config sets differently from `reference` (the preset or config it
        was made from) that change no output here, with why (`why_inert`)."""
        out = {}
        for option in self.SCOPED_OPTIONS:
            if getattr(self, option) != getattr(reference, option):
                why = self.why_inert(option, activations_only=activations_only)
                if why is not None:
                    out[option] = why
        return out

    @property
    def per_channel_weights(self) -> bool:
        """Whether integer weights get more than one scale (per channel or per block)."""
        return not isinstance(self.granularity, PerTensor)

    def formats_for(self, op_type: str, node_name: str) -> tuple[str, str, str]:
        """(activation format, weight format, reason) of one node under the layer rules."""
        act, w, why = self.activation, self.weight, f"preset {self.name}" if self.name != "custom" else "config"
        for i, r in enumerate(self.layer_rules):
            if r.matches(op_type, node_name):
                act = r.activation or act
                w = r.weight or w
                why = f"layer rule {i} ({', '.join(sorted(r.op_types)) or ', '.join(r.nodes)})"
        return act, w, why

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form (`from_dict` inverts it)."""
        d = asdict(self)
        d["granularity"] = self.granularity.to_dict()
        for k in ("op_types", "exclude_op_types", "exclude_nodes"):
            if d[k] is not None:
                d[k] = sorted(d[k])
        d["layer_rules"] = [{**asdict(r), "op_types": sorted(r.op_types), "nodes": list(r.nodes)}
                            for r in self.layer_rules]
        d["tensor_formats"] = [list(p) for p in self.tensor_formats]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "QuantConfig":
        """Build from a dict (e.g. a JSON config file); unknown keys raise ConfigError. A key
        'preset' starts from that preset."""
        d = dict(d)
        base = get_default_config(d.pop("preset")) if "preset" in d else cls()
        if "layer_rules" in d:
            rules = []
            for r in d["layer_rules"]:
                if not isinstance(r, dict):
                    raise ConfigError("each layer rule must be an object with op_types/nodes/activation/weight.")
                unknown = set(r) - {"op_types", "nodes", "activation", "weight"}
                if unknown:
                    k = sorted(unknown)[0]
                    raise ConfigError(f"unknown layer rule key {k!r}."
                                      + did_you_mean(k, ["op_types", "nodes", "activation", "weight"]))
                rules.append(LayerRule(**r))
            d["layer_rules"] = tuple(rules)
        if "tensor_formats" in d and isinstance(d["tensor_formats"], list):
            pairs = d["tensor_formats"]
            if not all(isinstance(p, (list, tuple)) and len(p) == 2 for p in pairs):
                raise ConfigError("tensor_formats must be a list of [tensor name, format] pairs.")
            d["tensor_formats"] = tuple(tuple(p) for p in pairs)
        for k in ("op_types", "exclude_op_types", "exclude_nodes"):
            if isinstance(d.get(k), list):
                d[k] = frozenset(d[k])
        try:
            return base.with_options(**d)
        except TypeError as exc:  # a value of the wrong type inside a JSON config
            raise ConfigError(f"invalid config value: {exc}. Check the types of the config's "
                              "fields (names are strings, lists are lists).") from exc

    def with_options(self, **changes: Any) -> "QuantConfig":
        """A copy with some options changed; unknown option names raise ConfigError."""
        known = [f.name for f in fields(self)] + ["per_channel"]
        for k in changes:
            if k not in known:
                raise ConfigError(f"unknown config option {k!r}." + did_you_mean(k, known)
                                  + f" Options: {', '.join(known)}.")
        return replace(self, **changes)


def _checked_init(init: Any) -> Any:
    """QuantConfig's generated __init__, with unknown keyword names refused as a ConfigError
    with a "did you mean" (a misspelled `activaton=` was a bare TypeError)."""
    import functools

    known = [f.name for f in fields(QuantConfig)] + ["per_channel"]

    @functools.wraps(init)
    def __init__(self: QuantConfig, *args: Any, **kwargs: Any) -> None:
        for k in kwargs:
            if k not in known:
                raise ConfigError(f"unknown config option {k!r}." + did_you_mean(k, known)
                                  + f" Options: {', '.join(known)}.")
        if args:
            raise ConfigError("QuantConfig takes keyword arguments only, e.g. "
                              "QuantConfig(activation='int16', weight='int8').")
        init(self, **kwargs)
    return __init__


QuantConfig.__init__ = _checked_init(QuantConfig.__init__)  # type: ignore[method-assign]


def _p(name: str, **kw: Any) -> QuantConfig:
    return QuantConfig(name=name, **kw)


#: What the block-format presets quantize: the operands (inputs and weights, not outputs) of the
#: compute ops, as block-format hardware does (MX / BFP matrix engines accumulate in fp32;
#: vector ops such as LayerNorm, Softmax and the element-wise arithmetic run in higher
#: precision). Quantizing every op instead made MXFP8 unusable on a transformer (PP-OCRv4 rec:
#: 0 % character accuracy, bench/mx_scope_bench.py) and tripled the simulated calls.
BLOCK_PRESET_OPS = frozenset({"Conv", "ConvTranspose", "MatMul", "Gemm"})


def _block(name: str, fmt: str) -> QuantConfig:
    return QuantConfig(name=name, activation=fmt, weight=fmt, op_types=BLOCK_PRESET_OPS,
                       quantize_outputs=False)


#: The integer presets' activation ranges: MinMSE where clipping lowers a tensor's expected
#: error at least 1.5 times, MinMax elsewhere; weights MinMax per channel (as the vendor's
#: A8W8/A16W8 and onnxruntime). Measured on the bench models (docs/ACCURACY.md): plain MinMSE
#: cost EfficientNet-Lite0 A8W8 6 points of agreement and MinMSE weights 3 at A16W8, while
#: MinMax activations cost PP-OCRv4 rec A8W8 14 points.
_INT_RANGES: dict[str, Any] = {"calibration": "minmse", "minmse_min_gain": 1.5,
                               "weight_calibration": "minmax"}

#: Named presets. Integer presets use symmetric int8 weights per channel.
PRESETS: dict[str, QuantConfig] = {
    "XINT8": _p("XINT8", activation="int8", weight="int8", calibration="minmse",
                power_of_two="minmse", activation_symmetric=True, share_concat_scales=True),
    "A8W8": _p("A8W8", activation="int8", weight="int8", activation_symmetric=True, **_INT_RANGES),
    "A16W8": _p("A16W8", activation="int16", weight="int8", activation_symmetric=True,
                **_INT_RANGES),
    "U8S8": _p("U8S8", activation="uint8", weight="int8", **_INT_RANGES),
    "S16S16": _p("S16S16", activation="int16", weight="int16", calibration="minmax",
                 activation_symmetric=True),
    "BF16": _p("BF16", activation="bf16", weight="bf16"),
    "FP16": _p("FP16", activation="fp16", weight="fp16"),
    "BFP16": _block("BFP16", "bfp16"),
    "MXINT8": _block("MXINT8", "mxint8"),
    "MXFP8_E4M3": _block("MXFP8_E4M3", "mxfp8_e4m3"),
    "MXFP8_E5M2": _block("MXFP8_E5M2", "mxfp8_e5m2"),
    "MXFP6_E3M2": _block("MXFP6_E3M2", "mxfp6_e3m2"),
    "MXFP6_E2M3": _block("MXFP6_E2M3", "mxfp6_e2m3"),
    "MXFP4": _block("MXFP4", "mxfp4"),
    "MX4": _block("MX4", "mx4"),
    "MX6": _block("MX6", "mx6"),
    "MX9": _block("MX9", "mx9"),
}


def get_default_config(name: str) -> QuantConfig:
    """The preset called `name` (case-insensitive), e.g. 'XINT8', 'A8W8', 'A16W8', 'MXFP4'."""
    key = str(name).upper().replace("-", "_")
    if key not in PRESETS:
        raise ConfigError(f"unknown preset {name!r}." + did_you_mean(key, PRESETS)
                          + f" Presets: {', '.join(PRESETS)}.")
    return PRESETS[key]
