"""Loads the CUDA libraries of the pip nvidia packages for onnxruntime-gpu (GPU machine only; see run_8b.sh)."""

import os

if os.environ.get("G8B_PRELOAD"):
    try:
        import onnxruntime

        onnxruntime.preload_dlls()
    except Exception as error:  # a missing library shows when the CUDA session is made
        print(f"sitecustomize: onnxruntime.preload_dlls failed: {error}")
