"""Convert a float32 model to bfloat16.

    python -m mixq.tools.convert_fp32_to_bf16 --input A.onnx --output B.onnx \\
        --format with_cast|bf16|simulate_bf16|customqdq [--provider auto|CPUExecutionProvider|CUDAExecutionProvider]

Prints a Markdown report (converted nodes, Casts, nodes kept in float and why, size, fidelity).
"""
from __future__ import annotations

import sys
from collections.abc import Sequence

from mixq.convert.cli import convert_main


def main(argv: Sequence[str] | None = None) -> int:
    """Run the tool on `argv` (default: sys.argv[1:]); returns the exit status."""
    return convert_main(argv, target="bf16", source="auto", prog="python -m mixq.tools.convert_fp32_to_bf16")


if __name__ == "__main__":
    sys.exit(main())
