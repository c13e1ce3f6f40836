"""Convert a float16 model to bfloat16.

    python -m mixq.tools.convert_fp16_to_bf16 --input A.onnx --output B.onnx \\
        --format with_cast|bf16|simulate_bf16|customqdq [--provider auto|CPUExecutionProvider|CUDAExecutionProvider]

Cast pairs go float16 -> bfloat16 -> float16; model inputs/outputs stay float16.
"""
from __future__ import annotations

import sys
from collections.abc import Sequence

from mixq.convert.cli import convert_main


def main(argv: Sequence[str] | None = None) -> int:
    """Run the tool on `argv` (default: sys.argv[1:]); returns the exit status."""
    return convert_main(argv, target="bf16", source="fp16", prog="python -m mixq.tools.convert_fp16_to_bf16")


if __name__ == "__main__":
    sys.exit(main())
