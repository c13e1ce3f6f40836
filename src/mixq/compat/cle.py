"""Cross-layer equalization (`include_cle`, the vendor's default): every equalizable Conv pair
balanced, run by `mixq.compat.ModelQuantizer` on the prepared graph (BatchNorms already folded
into the Convs), before quantization. The pass itself is `mixq.passes.equalize`, which the
quantizer also runs on the pairs whose imbalance one activation grid cannot hold."""
from __future__ import annotations

from ..passes.equalize import equalize

__all__ = ["equalize"]
