"""Helpers for tests: tiny hand-built models, ORT runs (through :mod:`onnxprec._ort`), and ../shared data."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import os
import subprocess
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from onnxprec._ort import Session, create_session, import_onnxruntime

__all__ = [
    "REFERENCE_CACHE",
    "SHARED",
    "make_genai_folder",
    "make_model",
    "reference_path",
    "reference_perplexity",
    "run",
    "run_cli",
    "run_each",
    "shared_path",
    "tensor_info",
]

F = TensorProto.FLOAT
F16 = TensorProto.FLOAT16
BF16 = TensorProto.BFLOAT16

# ../shared beside the project root (tests skip when it is absent, e.g. on a fresh clone)
SHARED = Path(os.environ.get("ONNXPREC_SHARED", Path(__file__).resolve().parents[3] / "shared"))

# Reference results measured once from the files they name (e.g. a float LLM's perplexity), reused while those hold
REFERENCE_CACHE = Path(
    os.environ.get("ONNXPREC_REFERENCE_CACHE", Path.home() / ".cache" / "onnxprec" / "reference-outputs")
)


def shared_path(*parts: str) -> Path | None:
    """A path under ../shared, or None when it does not exist."""
    path = SHARED.joinpath(*parts)
    return path if path.exists() else None


class _Terminal(io.StringIO):
    """Captured text that says it is a terminal (as stdout and stderr are when a user types the command)."""

    def isatty(self) -> bool:
        return True


def run_cli(*args: str, module: str = "onnxprec", terminal: bool = False) -> subprocess.CompletedProcess[str]:
    """Runs a command line in this process, as ``python -m <module> <args>`` would: exit code, stdout, stderr.

    The command line's code path is the same as in a new process (``onnxprec.cli`` parses, configures logging and
    turns user errors into one line and exit code 2), without an interpreter start and imports per call. Logging
    is restored afterwards. Tests that check the process itself (a console script, imports at start-up) spawn one.

    Args:
        *args: The arguments after the module.
        module: ``onnxprec`` (or ``onnxprec.cli``) for the ``onnxprec`` command, else a tool's package, e.g.
            ``onnxprec.autocast`` or ``onnxprec.quantization.int4``.
        terminal: stdout and stderr say they are a terminal (``isatty()``), as when a user types the command.
    """
    from onnxprec import cli

    def entry(argv: Sequence[str]) -> int:
        if module in ("onnxprec", "onnxprec.cli"):
            return cli.main(argv)
        words = next(w for w, m, _ in cli.TOOLS if m.rsplit("._", 1)[0] == module)
        return cli.tool_main(words, argv, prog=f"python -m {module}")

    root, package = logging.getLogger(), logging.getLogger("onnxprec")
    saved = (root.handlers[:], root.level, package.level)
    out, err = (_Terminal(), _Terminal()) if terminal else (io.StringIO(), io.StringIO())
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = entry(list(args))
            except SystemExit as e:  # argparse: --help, --version, a bad flag
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
        package.setLevel(saved[2])
    return subprocess.CompletedProcess([sys.executable, "-m", module, *args], code, out.getvalue(), err.getvalue())


# What a tool's process imports before it reads its arguments: loaded once in the fork server of run_forked.
_TOOL_MODULES = (
    "onnxprec.cli",
    "onnxprec.autocast._api",
    "onnxprec.quantization.int8._api",
    "onnxprec.quantization.int4._api",
    "onnxprec.preprocess._api",
    "onnxprec.evaluate._api",
    "onnxprec.debug.dump",
    "onnxprec.debug.compare",
    "onnxruntime",
)


def _forked_tool(module: str, args: list[str], cwd: str, env: dict[str, str], out: str, err: str, code: str) -> None:
    """The child of :func:`run_forked`: ``python -m <module> <args>`` in ``cwd`` with ``env``, stdout and stderr to
    files, and its exit code, as the process's, to the file ``code`` too (the fork server's report of it can be lost:
    multiprocessing then gives 255)."""
    import runpy

    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    for fd, path in ((1, out), (2, err)):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(target, fd)
        os.close(target)
    sys.argv = [module, *args]
    sys.path[0] = cwd  # as ``python -m`` sets it
    status = 1  # an exception other than SystemExit: multiprocessing's exit code for it
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        status = 0
    except SystemExit as e:
        status = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        raise
    finally:
        with open(code, "w") as f:
            f.write(str(status))


def run_forked(
    module: str, args: Sequence[str], *, cwd: str | os.PathLike, env: dict[str, str], timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """Runs ``python -m <module> <args>`` as a process of its own, forked from a server that has imported the tools.

    The process has its own exit code, stdout and stderr and runs the command line's code from its start (parsing,
    logging, one-line errors); what it saves is the interpreter's start and the imports, each case.
    For tests that run many command lines each in its own process.
    """
    import multiprocessing
    import tempfile

    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(list(_TOOL_MODULES))
    with tempfile.TemporaryDirectory(prefix="onnxprec-forked-") as folder:
        out, err, code = (os.path.join(folder, name) for name in ("stdout", "stderr", "code"))
        child = context.Process(target=_forked_tool, args=(module, list(args), str(cwd), env, out, err, code))
        child.start()
        child.join(timeout)
        if child.exitcode is None:
            child.kill()
            child.join()
            raise subprocess.TimeoutExpired([module, *args], timeout)
        with open(out, encoding="utf-8", errors="replace") as o, open(err, encoding="utf-8", errors="replace") as e:
            stdout, stderr = o.read(), e.read()
        status = child.exitcode
        if os.path.exists(code):
            with open(code) as f:
                status = int(f.read() or status)
    return subprocess.CompletedProcess([sys.executable, "-m", module, *args], status, stdout, stderr)


def tensor_info(name: str, elem_type: int = F, shape: Sequence[int | str | None] | None = None) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem_type, shape)


def make_model(
    nodes: Sequence[onnx.NodeProto],
    inputs: Sequence[onnx.ValueInfoProto],
    outputs: Sequence[onnx.ValueInfoProto],
    initializers: dict[str, np.ndarray] | None = None,
    *,
    opset: int = 17,
    extra_opsets: dict[str, int] | None = None,
    ir_version: int = 8,
) -> onnx.ModelProto:
    """A checked model from nodes and numpy initializers."""
    inits = [numpy_helper.from_array(np.asarray(v), name=k) for k, v in (initializers or {}).items()]
    graph = helper.make_graph(list(nodes), "test", list(inputs), list(outputs), inits)
    opsets = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, v) for d, v in (extra_opsets or {}).items()]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = ir_version
    return model


def tf2onnx_block(seed: int = 0) -> onnx.ModelProto:
    """tf2onnx's NHWC pattern: each Conv between Transposes, bias and BatchNorm as Add/Sub/Mul/Add on the last axis,
    ReLU, a residual Add in NHWC, and a ReduceMean over H and W at the end."""
    rng = np.random.default_rng(seed)
    c = 6
    inits: dict[str, np.ndarray] = {}
    nodes = []

    def conv(name: str, source: str, relu: bool) -> str:
        inits[f"{name}_w"] = rng.standard_normal((c, c, 3, 3)).astype(np.float32) * 0.3
        for part in ("bias", "mean", "beta"):
            inits[f"{name}_{part}"] = rng.standard_normal(c).astype(np.float32)
        inits[f"{name}_scale"] = (np.abs(rng.standard_normal((1, 1, 1, c))) + 0.5).astype(np.float32)
        nodes.extend([
            helper.make_node("Transpose", [source], [f"{name}_nchw"], perm=[0, 3, 1, 2], name=f"{name}_t_in"),
            helper.make_node("Conv", [f"{name}_nchw", f"{name}_w"], [f"{name}_y"], pads=[1, 1, 1, 1], name=name),
            helper.make_node("Transpose", [f"{name}_y"], [f"{name}_nhwc"], perm=[0, 2, 3, 1], name=f"{name}_t_out"),
            helper.make_node("Add", [f"{name}_nhwc", f"{name}_bias"], [f"{name}_b"], name=f"{name}_add"),
            helper.make_node("Sub", [f"{name}_b", f"{name}_mean"], [f"{name}_m"], name=f"{name}_sub"),
            helper.make_node("Mul", [f"{name}_m", f"{name}_scale"], [f"{name}_s"], name=f"{name}_mul"),
            helper.make_node("Add", [f"{name}_s", f"{name}_beta"], [f"{name}_bn"], name=f"{name}_add2"),
        ])  # fmt: skip
        if not relu:
            return f"{name}_bn"
        nodes.append(helper.make_node("Relu", [f"{name}_bn"], [f"{name}_r"], name=f"{name}_relu"))
        return f"{name}_r"

    stem = conv("stem", "x", relu=True)
    branch = conv("conv2", conv("conv1", stem, relu=True), relu=False)
    nodes.append(helper.make_node("Add", [stem, branch], ["residual"], name="residual"))
    nodes.append(helper.make_node("Relu", ["residual"], ["block"], name="block_relu"))
    nodes.append(helper.make_node("ReduceMean", ["block"], ["pooled"], axes=[1, 2], keepdims=0, name="pool"))
    return make_model(nodes, [tensor_info("x", F, [1, 8, 8, c])], [tensor_info("pooled", F, [1, c])], inits)


def qdq_conv(weight: np.ndarray) -> onnx.ModelProto:
    """A QDQ Conv of ``weight`` ``[out, in, 3, 3]`` on x ``[1, in, 8, 8]``: quantize x (uint8), a per-channel INT8
    weight, Conv, quantize the output, dequantize; the QDQ group ONNX Runtime's CPU provider fuses into one
    QLinearConv (the input's QuantizeLinear and the output's DequantizeLinear stay: the interface is float)."""
    out, channels = weight.shape[:2]
    scale = (np.abs(weight).reshape(out, -1).max(1) / 127).astype(np.float32)
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"], name="q_x"),
        helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"], name="dq_x"),
        helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["wd"], axis=0, name="dq_w"),
        helper.make_node("Conv", ["xd", "wd"], ["y0"], pads=[1, 1, 1, 1], name="conv"),
        helper.make_node("QuantizeLinear", ["y0", "ys", "yz"], ["yq"], name="q_y"),
        helper.make_node("DequantizeLinear", ["yq", "ys", "yz"], ["y"], name="dq_y"),
    ]
    weights = {
        "wq": np.round(weight / scale[:, None, None, None]).astype(np.int8),
        "ws": scale,
        "wz": np.zeros(out, np.int8),
        "xs": np.float32(0.02),
        "xz": np.uint8(128),
        "ys": np.float32(0.1),
        "yz": np.uint8(128),
    }
    inputs, outputs = [tensor_info("x", F, [1, channels, 8, 8])], [tensor_info("y", F, [1, out, 8, 8])]
    return make_model(nodes, inputs, outputs, weights)


def dynamic_int8_matmuls(count: int, seed: int = 0) -> onnx.ModelProto:
    """ONNX Runtime's dynamic INT8 MatMul pattern (``quantize_dynamic``'s), ``count`` MatMuls of x ``[2, 16]``
    sharing one DynamicQuantizeLinear: MatMulInteger with a per-column INT8 weight, Cast, times both scales."""
    rng = np.random.default_rng(seed)
    nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"], name="quantize_x")]
    weights: dict[str, np.ndarray] = {}
    outputs = []
    for i in range(count):
        w = rng.standard_normal((16, 8)).astype(np.float32)
        scale = (np.abs(w).max(0) / 127).astype(np.float32)
        weights |= {f"wq{i}": np.round(w / scale).astype(np.int8), f"ws{i}": scale, f"wz{i}": np.zeros(8, np.int8)}
        nodes += [
            helper.make_node("MatMulInteger", ["xq", f"wq{i}", "xz", f"wz{i}"], [f"acc{i}"], name=f"matmul{i}"),
            helper.make_node("Cast", [f"acc{i}"], [f"accf{i}"], to=F, name=f"cast{i}"),
            helper.make_node("Mul", ["xs", f"ws{i}"], [f"scale{i}"], name=f"scale{i}"),
            helper.make_node("Mul", [f"accf{i}", f"scale{i}"], [f"y{i}"], name=f"rescale{i}"),
        ]
        outputs.append(tensor_info(f"y{i}", F, [2, 8]))
    return make_model(nodes, [tensor_info("x", F, [2, 16])], outputs, weights)


def run(model: onnx.ModelProto | str | Path, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """Runs a model on ONNX Runtime CPU (default optimizations, idle threads not spinning: a test's CPU seconds, not
    its latency); float inputs are cast to the model's input types, and BF16/FP8 outputs come back as ml_dtypes
    arrays (see :class:`onnxprec._ort.Session`)."""
    return _test_session(model).run(feeds)


def _test_session(model: onnx.ModelProto | str | Path) -> Session:
    return create_session(model, optimization="all", what="the test model", spinning=False)


def reference_path(name: str, files: Sequence[Path], *inputs: object, suffix: str = "json") -> Path:
    """Where a reference result measured from ``files`` (a float model and its external data) on ``inputs`` is kept:
    under :data:`REFERENCE_CACHE`, keyed by the files' names, sizes and modification times, ``inputs`` and the
    versions of onnxruntime and numpy."""
    stats = [(file.name, file.stat().st_size, file.stat().st_mtime_ns) for file in files]
    versions = [import_onnxruntime().__version__, np.__version__]
    key = hashlib.sha256(repr([*stats, *inputs, *versions]).encode()).hexdigest()[:16]
    return REFERENCE_CACHE / f"{name}-{key}.{suffix}"


def reference_perplexity(model: Path, windows: np.ndarray) -> float:
    """The perplexity of the float LLM ``model`` on ``windows`` (``[W, T]`` token ids, one window a run, ONNX Runtime
    CPU), measured once in a child process (its session does not stay in the test's process) and kept at
    :func:`reference_path`."""
    ids_digest = hashlib.sha256(np.ascontiguousarray(windows).tobytes()).hexdigest()
    files = sorted(model.parent.glob(f"{model.name}*"))  # the model and its external data
    cached = reference_path(f"{model.stem}-perplexity", files, ids_digest)
    if not cached.exists():
        cached.parent.mkdir(parents=True, exist_ok=True)
        ids = cached.with_suffix(".ids.npy")
        np.save(ids, windows)
        code = "import sys; from onnxprec._testing import _write_perplexity; _write_perplexity(*sys.argv[1:])"
        subprocess.run([sys.executable, "-c", code, str(model), str(ids), str(cached)], check=True)
        ids.unlink()
    return float(json.loads(cached.read_text())["perplexity"])


def _write_perplexity(model: str, ids: str, out: str) -> None:
    """:func:`reference_perplexity`'s child: the perplexity written atomically to ``out``."""
    from onnxprec.metrics import Perplexity

    session = create_session(Path(model), optimization="all", what="the reference model", spinning=False)
    perplexity = Perplexity()
    windows = np.load(ids)
    for window in windows:
        perplexity.update(session.run({"input_ids": window[None]})[0], window[None])
    partial = Path(out).with_suffix(".part")
    partial.write_text(json.dumps({"model": model, "windows": len(windows), "perplexity": perplexity.value}))
    partial.replace(out)


def run_each(model: onnx.ModelProto | str | Path, batches: Iterable[dict[str, np.ndarray]]) -> list[list[np.ndarray]]:
    """:func:`run` on each of ``batches``, through one session."""
    session = _test_session(model)
    return [session.run(feeds) for feeds in batches]


def _byte_level_tokenizer() -> dict:
    """A byte-level BPE ``tokenizer.json`` without merges: 3 special tokens, then one token per byte (GPT-2's map)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    extra = iter(range(256, 512))
    chars = {b: chr(b if b in printable else next(extra)) for b in range(256)}
    specials = ["<unk>", "<s>", "</s>"]
    vocab = {token: i for i, token in enumerate([*specials, *(chars[b] for b in range(256))])}
    level = {"add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {
                "id": i,
                "content": s,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": True,
            }
            for i, s in enumerate(specials)
        ],
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", **level},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", **level},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": vocab,
            "merges": [],
        },
    }


def make_genai_folder(
    folder: Path, *, name: str = "model.onnx", tokenizer: bool = True, provider: str = "cpu", seed: int = 0
) -> Path:
    """A tiny decoder that onnxruntime-genai loads and generates with, in ``folder`` with its genai_config.json.

    One layer: token embedding, K/V projections appended to the past KV (``past_key_values.0.key/value``
    ``[batch, 1, past, 16]`` -> ``present.0.*``), the mean of the values mixed back in, and ``logits`` over 260 ids
    (ids 3-258 are bytes with the byte-level ``tokenizer.json`` written when ``tokenizer``). Its MatMul weights
    (K 32 and 16) quantize at block size 16. ``provider``: the config's provider (``cpu`` or ``cuda``).

    Returns:
        The model's path.
    """
    vocab, hidden, head = 260, 32, 16
    rng = np.random.default_rng(seed)
    weights: dict[str, np.ndarray] = {
        "E": rng.standard_normal((vocab, hidden)).astype(np.float32),
        "Wk": (0.3 * rng.standard_normal((hidden, head))).astype(np.float32),
        "Wv": (0.3 * rng.standard_normal((hidden, head))).astype(np.float32),
        "Wc": (0.3 * rng.standard_normal((head, hidden))).astype(np.float32),
        "Wo": rng.standard_normal((hidden, vocab)).astype(np.float32),
        "axis1": np.array([1], np.int64),
        "axis2": np.array([2], np.int64),
    }
    node = helper.make_node
    nodes = [
        node("Gather", ["E", "input_ids"], ["emb"], name="embed"),
        node("MatMul", ["emb", "Wk"], ["k"], name="k_proj"),
        node("Unsqueeze", ["k", "axis1"], ["k4"], name="k_heads"),
        node("Concat", ["past_key_values.0.key", "k4"], ["present.0.key"], axis=2, name="k_cache"),
        node("MatMul", ["emb", "Wv"], ["v"], name="v_proj"),
        node("Unsqueeze", ["v", "axis1"], ["v4"], name="v_heads"),
        node("Concat", ["past_key_values.0.value", "v4"], ["present.0.value"], axis=2, name="v_cache"),
        node("ReduceMean", ["present.0.value", "axis2"], ["mean"], keepdims=1, name="mean"),
        node("Squeeze", ["mean", "axis1"], ["mean3"], name="mean3"),
        node("MatMul", ["mean3", "Wc"], ["context"], name="c_proj"),
        node("Add", ["emb", "context"], ["h"], name="residual"),
        node("MatMul", ["h", "Wo"], ["logits"], name="lm_head"),
    ]
    past: list[int | str | None] = ["batch_size", 1, "past_sequence_length", head]
    total: list[int | str | None] = ["batch_size", 1, "total_sequence_length", head]
    inputs = [
        tensor_info("input_ids", TensorProto.INT64, ["batch_size", "sequence_length"]),
        tensor_info("attention_mask", TensorProto.INT64, ["batch_size", "total_sequence_length"]),
        tensor_info("past_key_values.0.key", F, past),
        tensor_info("past_key_values.0.value", F, past),
    ]
    outputs = [
        tensor_info("logits", F, ["batch_size", "sequence_length", vocab]),
        tensor_info("present.0.key", F, total),
        tensor_info("present.0.value", F, total),
    ]
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    onnx.save(make_model(nodes, inputs, outputs, weights, opset=18), path)
    providers: list = [] if provider == "cpu" else [{provider: {"enable_cuda_graph": "0"}}]
    config = {
        "model": {
            "bos_token_id": 1,
            "context_length": 64,
            "decoder": {
                "session_options": {"log_id": "onnxruntime-genai", "provider_options": providers},
                "filename": name,
                "head_size": head,
                "hidden_size": hidden,
                "inputs": {
                    "input_ids": "input_ids",
                    "attention_mask": "attention_mask",
                    "past_key_names": "past_key_values.%d.key",
                    "past_value_names": "past_key_values.%d.value",
                },
                "outputs": {
                    "logits": "logits",
                    "present_key_names": "present.%d.key",
                    "present_value_names": "present.%d.value",
                },
                "num_attention_heads": 1,
                "num_hidden_layers": 1,
                "num_key_value_heads": 1,
            },
            "eos_token_id": 2,
            "pad_token_id": 2,
            "type": "llama",
            "vocab_size": vocab,
        },
        "search": {"do_sample": False, "max_length": 64, "num_beams": 1, "past_present_share_buffer": False},
    }
    (folder / "genai_config.json").write_text(json.dumps(config, indent=4))
    if tokenizer:
        (folder / "tokenizer.json").write_text(json.dumps(_byte_level_tokenizer()))
        (folder / "tokenizer_config.json").write_text(
            json.dumps(
                {
                    "bos_token": "<s>",
                    "eos_token": "</s>",
                    "unk_token": "<unk>",
                    "tokenizer_class": "GPT2Tokenizer",
                    "model_max_length": 64,
                }
            )
        )
        (folder / "chat_template.jinja").write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    return path


def tiny_decoder(
    attention: str = "gqa",
    *,
    layers: int = 2,
    heads: int = 2,
    kv_heads: int = 1,
    head_size: int = 16,
    vocab: int = 16,
    max_positions: int = 32,
    symbolic_head: bool = True,
    static_present: bool = False,
    position_ids: bool = False,
    window: int = 0,
    state: bool = False,
    seed: int = 0,
) -> onnx.ModelProto:
    """A tiny random-weight causal decoder with a KV cache, laid out as onnxruntime-genai's builder writes them.

    Inputs ``input_ids`` and ``attention_mask`` ``[batch_size, (total_)sequence_length]``, ``past_key_values.N.key``
    and ``.value`` ``[batch_size, kv heads, past_sequence_length, head size]`` (the head size named ``kv_cache_dim``
    when ``symbolic_head``), and ``position_ids`` with a position embedding table when asked; outputs ``logits`` and
    ``present.N.key/value`` (static head sizes with ``static_present``). ``window``: layer 0 is a sliding-window
    GroupQueryAttention whose cache is a ring buffer of ``window`` positions (``sliding_window_cache``, as the
    builder writes gemma2's); ``state``: a fixed-size state ``past.0.conv`` ``[batch_size, 4, 2]`` carried to
    ``present.0.conv`` (as LFM2's convolution state). ``attention``:

    - ``gqa``: ``com.microsoft::GroupQueryAttention`` on a packed QKV MatMul, rotary inside (cos/sin caches of
      ``max_positions`` rows), ``seqlens_k`` and ``total_sequence_length`` computed from the mask as the builder
      does (ReduceSum - 1 -> Cast int32; Shape -> Gather -> Cast int32);
    - ``mha``: ``com.microsoft::MultiHeadAttention`` (``kv_heads`` = ``heads``), causal;
    - ``concat``: plain ONNX: the past concatenated with this step's keys/values (no attention).
    """
    rng = np.random.default_rng(seed)
    hidden = heads * head_size
    kv = heads if attention != "gqa" else kv_heads
    i64, i32 = TensorProto.INT64, TensorProto.INT32
    weights: dict[str, np.ndarray] = {
        "embed": rng.standard_normal((vocab, hidden)).astype(np.float32),
        "lm_head": (rng.standard_normal((hidden, vocab)) / np.sqrt(hidden)).astype(np.float32),
        "one": np.array([1], np.int64),
        "one_scalar": np.array(1, np.int64),
    }
    head_dim: int | str = "kv_cache_dim" if symbolic_head else head_size
    inputs = [
        tensor_info("input_ids", i64, ["batch_size", "sequence_length"]),
        tensor_info("attention_mask", i64, ["batch_size", "total_sequence_length"]),
    ]
    outputs = [tensor_info("logits", F, ["batch_size", "sequence_length", vocab])]
    nodes = [helper.make_node("Gather", ["embed", "input_ids"], ["h0"], name="embed")]
    if position_ids:
        inputs.append(tensor_info("position_ids", i64, ["batch_size", "sequence_length"]))
        weights["wpe"] = rng.standard_normal((max_positions, hidden)).astype(np.float32)
        nodes += [
            helper.make_node("Gather", ["wpe", "position_ids"], ["pos"], name="positions"),
            helper.make_node("Add", ["h0", "pos"], ["h0p"], name="add_positions"),
        ]
    hidden_state = "h0p" if position_ids else "h0"
    caches = ["cos_cache", "sin_cache"]
    if attention == "gqa":
        angles = np.arange(max_positions)[:, None] / (10000 ** (np.arange(0, head_size, 2) / head_size))[None, :]
        weights["cos_cache"] = np.cos(angles).astype(np.float32)
        weights["sin_cache"] = np.sin(angles).astype(np.float32)
        weights["index_1"] = np.array(1, np.int64)
        nodes += [
            helper.make_node("ReduceSum", ["attention_mask", "one"], ["mask_sum"], keepdims=0, name="mask_sum"),
            helper.make_node("Sub", ["mask_sum", "one"], ["seqlens"], name="seqlens"),
            helper.make_node("Cast", ["seqlens"], ["seqlens_k"], to=i32, name="seqlens_k"),
            helper.make_node("Shape", ["attention_mask"], ["mask_shape"], name="mask_shape"),
            helper.make_node("Gather", ["mask_shape", "index_1"], ["total"], axis=0, name="total"),
            helper.make_node("Cast", ["total"], ["total_sequence_length"], to=i32, name="total_i32"),
        ]
    for layer in range(layers):
        past_k, past_v = f"past_key_values.{layer}.key", f"past_key_values.{layer}.value"
        present_k, present_v = f"present.{layer}.key", f"present.{layer}.value"
        sliding = bool(window) and layer == 0 and attention == "gqa"
        for past, present in ((past_k, present_k), (past_v, present_v)):
            length = "sliding_length" if sliding else "sequence_length"
            inputs.append(tensor_info(past, F, ["batch_size", kv, f"past_{length}", head_dim]))
            present_head = head_size if static_present else head_dim
            outputs.append(tensor_info(present, F, ["batch_size", kv, f"total_{length}", present_head]))
        ring: dict[str, Any] = {"local_window_size": window, "sliding_window_cache": 1} if sliding else {}
        out = f"attn{layer}"
        if attention == "gqa":
            weights[f"qkv{layer}"] = rng.standard_normal((hidden, (heads + 2 * kv) * head_size)).astype(np.float32)
            nodes += [
                helper.make_node("MatMul", [hidden_state, f"qkv{layer}"], [f"qkv_out{layer}"], name=f"qkv{layer}"),
                helper.make_node(
                    "GroupQueryAttention",
                    [f"qkv_out{layer}", "", "", past_k, past_v, "seqlens_k", "total_sequence_length", *caches],
                    [out, present_k, present_v],
                    domain="com.microsoft",
                    num_heads=heads,
                    kv_num_heads=kv,
                    do_rotary=1,
                    name=f"gqa{layer}",
                    **ring,
                ),
            ]
        elif attention == "mha":
            for proj in "qkv":
                weights[f"w{proj}{layer}"] = rng.standard_normal((hidden, hidden)).astype(np.float32)
                nodes.append(
                    helper.make_node(
                        "MatMul", [hidden_state, f"w{proj}{layer}"], [f"{proj}{layer}"], name=f"{proj}{layer}"
                    )
                )
            nodes.append(
                helper.make_node(
                    "MultiHeadAttention",
                    [f"q{layer}", f"k{layer}", f"v{layer}", "", "", "", past_k, past_v],
                    [out, present_k, present_v],
                    domain="com.microsoft",
                    num_heads=heads,
                    unidirectional=1,
                    name=f"mha{layer}",
                )
            )
        else:  # concat: [B, S, hidden] -> [B, heads, S, head] appended to the past
            weights["split_shape"] = np.array([0, 0, heads, head_size], np.int64)
            nodes += [
                helper.make_node("Reshape", [hidden_state, "split_shape"], [f"h4_{layer}"], name=f"split{layer}"),
                helper.make_node("Transpose", [f"h4_{layer}"], [f"k{layer}"], perm=[0, 2, 1, 3], name=f"heads{layer}"),
                helper.make_node("Concat", [past_k, f"k{layer}"], [present_k], axis=2, name=f"concat_k{layer}"),
                helper.make_node("Concat", [past_v, f"k{layer}"], [present_v], axis=2, name=f"concat_v{layer}"),
                helper.make_node("Identity", [hidden_state], [out], name=f"attn{layer}"),
            ]
        weights[f"wo{layer}"] = (rng.standard_normal((hidden, hidden)) / np.sqrt(hidden)).astype(np.float32)
        nodes += [
            helper.make_node("MatMul", [out, f"wo{layer}"], [f"o{layer}"], name=f"o_proj{layer}"),
            helper.make_node("Add", [hidden_state, f"o{layer}"], [f"h{layer + 1}"], name=f"residual{layer}"),
        ]
        hidden_state = f"h{layer + 1}"
    nodes.append(helper.make_node("MatMul", [hidden_state, "lm_head"], ["logits"], name="lm_head"))
    if state:
        inputs.append(tensor_info("past.0.conv", F, ["batch_size", 4, 2]))
        outputs.append(tensor_info("present.0.conv", F, ["batch_size", 4, 2]))
        nodes.append(helper.make_node("Identity", ["past.0.conv"], ["present.0.conv"], name="conv_state"))
    del weights["one_scalar"]
    return make_model(nodes, inputs, outputs, weights, extra_opsets={"com.microsoft": 1})
