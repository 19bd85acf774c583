"""onnxprec: make ONNX models smaller and faster while keeping them accurate."""

__version__ = "0.1.0"

__all__ = ["__version__"]
