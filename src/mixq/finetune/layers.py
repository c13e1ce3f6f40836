"""ONNX Conv / ConvTranspose / Gemm / MatMul re-implemented with torch functional ops.

`LayerSpec.from_node(node)` reads the attributes once (strides, pads incl. asymmetric and
auto_pad, dilations, group, output_padding, output_shape, transA/transB, alpha/beta);
`spec.forward(x, w, b)` computes the node's output for an activation `x` with weight `w` and
optional bias `b` (torch tensors), matching onnxruntime up to float32 summation order (tested).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import onnx
from onnx import helper

from ..errors import ModelError
from ..graph import conv_padding
from ._torch import require_torch


def _attrs(node: onnx.NodeProto) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for a in node.attribute:
        v = helper.get_attribute_value(a)
        out[a.name] = v.decode() if isinstance(v, bytes) else v
    return out


@dataclass(frozen=True)
class LayerSpec:
    """What one layer computes, independent of its weight values."""

    op_type: str
    name: str
    attrs: dict[str, Any]

    @classmethod
    def from_node(cls, node: onnx.NodeProto) -> "LayerSpec":
        if node.op_type not in ("Conv", "ConvTranspose", "Gemm", "MatMul"):
            raise ModelError(f"node {node.name!r}: fast finetuning cannot re-implement {node.op_type}")
        return cls(node.op_type, node.name, _attrs(node))

    @property
    def channel_dim(self) -> int:
        """Dimension of the output that indexes output channels (for the AdaRound loss)."""
        return 1 if self.op_type in ("Conv", "ConvTranspose") else -1

    # -- forward -------------------------------------------------------------------------------
    def forward(self, x: Any, w: Any, b: Any | None = None) -> Any:
        if self.op_type == "Conv":
            return self._conv(x, w, b)
        if self.op_type == "ConvTranspose":
            return self._conv_transpose(x, w, b)
        if self.op_type == "Gemm":
            return self._gemm(x, w, b)
        torch = require_torch()
        return torch.matmul(x, w)

    def _spatial(self, w: Any) -> tuple[int, list[int], list[int], list[int]]:
        nd = w.dim() - 2
        if nd not in (1, 2, 3):
            raise ModelError(f"node {self.name!r}: {self.op_type} with {nd} spatial dimensions is not "
                             "supported by fast finetuning (1 to 3 are)")
        a = self.attrs
        k = list(a.get("kernel_shape", list(w.shape[2:])))
        strides = list(a.get("strides", [1] * nd))
        dil = list(a.get("dilations", [1] * nd))
        return nd, k, strides, dil

    def _conv(self, x: Any, w: Any, b: Any | None) -> Any:
        torch = require_torch()
        F = torch.nn.functional
        nd, k, strides, dil = self._spatial(w)
        a = self.attrs
        padding = conv_padding(a.get("auto_pad", "NOTSET"), list(a.get("pads", [0] * (2 * nd))),
                               list(x.shape[2:]), k, strides, dil)
        begin, end = [lo for lo, _ in padding], [hi for _, hi in padding]
        conv = (F.conv1d, F.conv2d, F.conv3d)[nd - 1]
        group = int(a.get("group", 1))
        if begin == end:
            return conv(x, w, b, stride=strides, padding=begin, dilation=dil, groups=group)
        pad = []
        for i in reversed(range(nd)):  # F.pad: last dimension first
            pad += [begin[i], end[i]]
        return conv(F.pad(x, pad), w, b, stride=strides, padding=0, dilation=dil, groups=group)

    def _conv_transpose(self, x: Any, w: Any, b: Any | None) -> Any:
        torch = require_torch()
        F = torch.nn.functional
        nd, k, strides, dil = self._spatial(w)
        a = self.attrs
        group = int(a.get("group", 1))
        out_pad = list(a.get("output_padding", [0] * nd))
        auto_pad = a.get("auto_pad", "NOTSET")
        in_sp = list(x.shape[2:])
        full = [strides[i] * (in_sp[i] - 1) + out_pad[i] + (k[i] - 1) * dil[i] + 1 for i in range(nd)]
        out_shape = a.get("output_shape")
        if out_shape is None and auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            out_shape = [in_sp[i] * strides[i] for i in range(nd)]
        if out_shape is not None:
            out_shape = list(out_shape)[-nd:]
            begin, end = [], []
            for i in range(nd):
                total = full[i] - out_shape[i]
                if auto_pad == "SAME_UPPER":
                    begin.append(total // 2)
                    end.append(total - total // 2)
                else:
                    begin.append(total - total // 2)
                    end.append(total // 2)
        elif auto_pad == "VALID":
            begin, end = [0] * nd, [0] * nd
        else:
            pads = list(a.get("pads", [0] * (2 * nd)))
            begin, end = pads[:nd], pads[nd:]
        convt = (F.conv_transpose1d, F.conv_transpose2d, F.conv_transpose3d)[nd - 1]
        # torch's output_padding must be < stride or dilation; compute without it and pad instead
        y = convt(x, w, None, stride=strides, padding=0, output_padding=0, groups=group, dilation=dil)
        pad = []
        for i in reversed(range(nd)):
            pad += [0, out_pad[i]]
        if any(out_pad):
            y = F.pad(y, pad)
        sl = [slice(None), slice(None)]
        for i in range(nd):
            size = y.shape[2 + i]
            lo = begin[i]
            hi = size - end[i]
            if lo < 0 or end[i] < 0:
                raise ModelError(f"node {self.name!r}: ConvTranspose with negative padding is not "
                                 "supported by fast finetuning")
            sl.append(slice(lo, hi))
        y = y[tuple(sl)]
        if b is not None:
            y = y + b.reshape((1, -1) + (1,) * nd)
        return y

    def _gemm(self, x: Any, w: Any, b: Any | None) -> Any:
        torch = require_torch()
        a = self.attrs
        if a.get("transA", 0):
            x = x.transpose(0, 1)
        wt = w.transpose(0, 1) if a.get("transB", 0) else w
        y = torch.matmul(x, wt)
        alpha, beta = float(a.get("alpha", 1.0)), float(a.get("beta", 1.0))
        if alpha != 1.0:
            y = y * alpha
        if b is not None:
            y = y + (b * beta if beta != 1.0 else b)
        return y


__all__ = ["LayerSpec"]
