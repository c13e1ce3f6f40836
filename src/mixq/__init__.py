"""mixq: mixed-precision quantization of ONNX models for stock onnxruntime."""
__version__ = "0.1.0"
