"""Convert a float32 model to float16.

    python -m mixq.tools.convert_fp32_to_fp16 --input A.onnx --output B.onnx \\
        [--format fp16|with_cast|simulate_fp16] [--provider auto|CPUExecutionProvider|CUDAExecutionProvider]

`fp16` (default) stores weights as FLOAT16 and computes in float16 where the provider has kernels;
model inputs/outputs stay float32.
"""
from __future__ import annotations

import sys
from collections.abc import Sequence

from mixq.convert.cli import convert_main


def main(argv: Sequence[str] | None = None) -> int:
    """Run the tool on `argv` (default: sys.argv[1:]); returns the exit status."""
    return convert_main(argv, target="fp16", source="fp32", source_choice=False,
                        prog="python -m mixq.tools.convert_fp32_to_fp16")


if __name__ == "__main__":
    sys.exit(main())
