"""FP32/FP16 -> BF16 (and FP32 -> FP16) whole-model conversion.

```python
from mixq.convert import to_bf16, to_fp16
model, report = to_bf16("model.onnx", "bf16")      # or "with_cast" | "simulate_bf16" | "customqdq"
print(report.to_markdown())
```
Command line: ``python -m mixq.tools.convert_fp32_to_bf16 --input A --output B --format F`` (and
``convert_fp16_to_bf16``, ``convert_fp32_to_fp16``), or ``mixq convert bf16 ...``.
"""
from .api import BF16_FORMATS, FP16_FORMATS, SOURCES, detect_source, to_bf16, to_fp16
from ..kernels import PROBE_CACHE, probe_kernel
from .report import ConversionReport, KeptFloat, OutputFidelity

__all__ = ["to_bf16", "to_fp16", "detect_source", "ConversionReport", "KeptFloat", "OutputFidelity",
           "BF16_FORMATS", "FP16_FORMATS", "SOURCES", "probe_kernel", "PROBE_CACHE"]
