"""The LLM corpus: its models' builds and the sweep of every tool over them."""

from onnxprec._lazy_sympy import defer_sympy

defer_sympy()  # before onnx-ir: a sweep worker (a process per case) imports sympy only if a tool evaluates shapes
