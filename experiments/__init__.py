"""Reliability sweeps and one-off studies (not benchmarks: their results are in RELIABILITY.md or explain a design).

* :mod:`experiments.node_sweep`: AutoCast (or ModelOpt) on every ONNX backend node test.
* :mod:`experiments.llm_corpus`: every tool on tiny decoders of 21 architectures (build and sweep).
* :mod:`experiments.target_proxy`: the accuracy search's sensitivity proxy against each node's exact error.
* :mod:`experiments.int8_effnet`: EfficientNet-Lite0 INT8 accuracy on held-out real images and latency.
* :mod:`experiments.gpu_prepare` and ``experiments/gpu_latency.py``: the CUDA latency run behind BENCHMARKS.md's GPU
  tables (bundles made here, timed on the GPU machine).

Their stored results are in ``experiments/results``.
"""
