"""The common shape of every numeric format: the Format protocol, quantization parameters,
rounding modes and the ONNX emission record. Pure: numpy and onnx protos only."""
from __future__ import annotations

import abc
import enum
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
import onnx

#: Domain of the model-local functions mixq emits for formats ONNX has no native op for.
MIXQ_DOMAIN = "com.mixq"
MIXQ_DOMAIN_VERSION = 1


class Rounding(enum.Enum):
    """How a value exactly half-way between two representable values is rounded."""

    HALF_EVEN = "half_even"  # IEEE default; what QuantizeLinear does
    HALF_AWAY = "half_away"  # half away from zero; what BFP hardware often does


@dataclass(frozen=True)
class QParams:
    """Affine quantization parameters of one tensor.

    `scale` and `zero_point` are scalars (per tensor), 1-D along `axis` (per channel) or have the
    tensor's shape with `axis` divided into blocks of `block_size` (per block).
    """

    scale: np.ndarray
    zero_point: np.ndarray
    axis: int | None = None
    block_size: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "scale", np.asarray(self.scale, dtype=np.float32))
        object.__setattr__(self, "zero_point", np.asarray(self.zero_point, dtype=np.int64))


@dataclass
class Emission:
    """ONNX pieces that implement one quantize-dequantize of one tensor."""

    nodes: list[onnx.NodeProto] = field(default_factory=list)
    initializers: list[onnx.TensorProto] = field(default_factory=list)
    functions: list[onnx.FunctionProto] = field(default_factory=list)
    opsets: dict[str, int] = field(default_factory=dict)

    def extend(self, other: "Emission") -> None:
        self.nodes += other.nodes
        self.initializers += other.initializers
        known = {(f.domain, f.name) for f in self.functions}
        self.functions += [f for f in other.functions if (f.domain, f.name) not in known]
        for dom, ver in other.opsets.items():
            self.opsets[dom] = max(ver, self.opsets.get(dom, 0))


#: A tensor's static shape: ints where known, None where not.
Shape = tuple[int | None, ...]


class Format(abc.ABC):
    """A numeric format: a frozen spec that knows its name, widths, reference and ONNX."""

    name: str
    kind: ClassVar[str]  # "int" | "float" | "block"
    #: The default-domain opset its ONNX needs; a model gets upgraded to it when the format is used.
    onnx_opset: ClassVar[int] = 21

    @property
    @abc.abstractmethod
    def bits(self) -> int:
        """Storage bits of one element."""

    @property
    @abc.abstractmethod
    def avg_bits(self) -> float:
        """Bits per element including shared scales/exponents (for size budgets)."""

    @property
    @abc.abstractmethod
    def needs_qparams(self) -> bool:
        """Whether a scale (and zero point) must be calibrated before use."""

    @abc.abstractmethod
    def fake_quant(self, x: np.ndarray, qparams: QParams | None = None, *, axis: int | None = None,
                   rounding: Rounding = Rounding.HALF_EVEN) -> np.ndarray:
        """Quantize-dequantize `x` (float32 in, float32 out)."""

    @abc.abstractmethod
    def emit(self, input_name: str, output_name: str, *, qparams: QParams | None = None,
             axis: int | None = None, prefix: str, shape: Shape | None = None) -> Emission:
        """ONNX computing `fake_quant` of a run-time tensor, bit-exactly in onnxruntime.

        `shape`: the tensor's static shape where known (None for unknown dims); a format may
        emit a specialized, faster form for it (block formats do when the axis is aligned)."""

    @abc.abstractmethod
    def emit_weight(self, w: np.ndarray, output_name: str, *, qparams: QParams | None = None,
                    axis: int | None = None, prefix: str) -> Emission:
        """ONNX producing `fake_quant(w)` from a constant, stored compactly where ONNX can."""

    def __str__(self) -> str:
        return self.name
