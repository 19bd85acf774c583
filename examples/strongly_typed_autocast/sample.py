"""End-to-end sample: strongly typed mixed precision on handwritten digits.

Stages:

1. Data: reads the ten handwritten digit images (PGM files, one per digit) and writes the model's input,
   normalised as the model expects, to ``inputs.npz`` in the working folder.
2. FP32 reference: runs the FP32 ONNX model with ONNX Runtime (CPU), prints the predicted digits and saves
   every output as the gold reference (``gold_fp32.npz``).
3. AutoCast: converts the model with ``onnxprec.autocast.convert_to_mixed_precision`` to FP16 or BF16
   (``keep_io_types=False``: inputs and outputs become low precision too), runs it with ONNX Runtime (CPU) and
   compares every output with the gold reference.
4. GPU: where TensorRT is installed, builds a strongly typed engine from the converted model, runs it and
   compares; where ONNX Runtime's CUDA provider is available, runs the converted model on it and compares.
   What cannot run here is skipped with the reason.

Prints ``Sample finished successfully.`` and exits 0 only when every stage that ran passed; exits 1 when a
check failed and 2 on a usage error (a missing data folder, say).

Runs on the CPU in a few seconds, needing only onnxprec's own dependencies (no PyTorch, no scikit-learn).
"""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
import re
import sys
import tempfile
import traceback
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort

from onnxprec import _ort, metrics

_T = TypeVar("_T")

HERE = pathlib.Path(__file__).resolve().parent
DEFAULT_DATA_DIR = HERE / "data"
MODEL_PATH = HERE / "model" / "digits_cnn.onnx"

INPUTS_FILE = "inputs.npz"
GOLD_FILE = "gold_fp32.npz"

# Unit roundoff of each low-precision format, 2^-(significand bits): the largest relative error of a rounding.
UNIT_ROUNDOFF = {"fp16": 2.0**-11, "bf16": 2.0**-8}
# Tolerance on every output element, in units of roundoff relative to the largest gold magnitude:
#   max |converted - gold| <= TOLERANCE_ULPS * unit_roundoff * max |gold|.
# FP16 on ONNX Runtime's CPU stays within about 1 unit here; 16 units leave room for errors that add up
# over the model's five layers and its reductions of up to 512 terms, and for GPU kernels that accumulate in
# low precision. That is 0.78 % of the logit scale for FP16 and 6.25 % for BF16, far below the gap between the
# best and second-best logit of these images (more than 5), so the predicted digits must also be identical.
TOLERANCE_ULPS = 16

_ONNX_TO_NUMPY: dict[int, np.dtype] = {
    onnx.TensorProto.FLOAT: np.dtype(np.float32),
    onnx.TensorProto.FLOAT16: np.dtype(np.float16),
    onnx.TensorProto.BFLOAT16: np.dtype(ml_dtypes.bfloat16),
    onnx.TensorProto.DOUBLE: np.dtype(np.float64),
}

# One PGM header token, after any whitespace and '#' comment lines.
_PGM_HEADER_TOKEN = re.compile(rb"\s*(?:#[^\n]*\n\s*)*(\S+)")


def shown(path: pathlib.Path) -> str:
    """A path as printed: relative to the current folder when it is inside it, else absolute."""
    try:
        return str(path.resolve().relative_to(pathlib.Path.cwd()))
    except ValueError:
        return str(path.resolve())


class UsageError(Exception):
    """A problem with what the user gave (paths, files): reported in one line, exit code 2."""


class StageError(Exception):
    """A stage could not complete or a check failed: reported in one line, the sample then fails."""


class StageSkipped(Exception):
    """A stage cannot run in this environment; the message says why."""


# ------------------------------------------------------------------------------------------------------------
# Stage 1: data
# ------------------------------------------------------------------------------------------------------------


def read_pgm(path: pathlib.Path) -> tuple[np.ndarray, int]:
    """Reads a PGM image (binary P5 or ASCII P2, 8 or 16 bits, ``#`` comments allowed).

    Args:
        path: The ``.pgm`` file.

    Returns:
        ``(pixels, maxval)``: a (height, width) uint16 array and the file's maximum gray value.

    Raises:
        UsageError: The file is not a valid PGM image.
    """
    data = path.read_bytes()
    tokens: list[bytes] = []
    position = 0
    # The header is four whitespace-separated tokens (magic, width, height, maxval); '#' starts a comment.
    while len(tokens) < 4:
        match = _PGM_HEADER_TOKEN.match(data, position)
        if match is None:
            raise UsageError(f"{path}: not a PGM image (truncated header)")
        tokens.append(match.group(1))
        position = match.end()
    magic, width_text, height_text, maxval_text = tokens
    if magic not in (b"P5", b"P2"):
        raise UsageError(f"{path}: not a PGM image (magic {magic[:8]!r}, expected P5 or P2)")
    try:
        width, height, maxval = int(width_text), int(height_text), int(maxval_text)
    except ValueError:
        raise UsageError(f"{path}: not a PGM image (bad width, height or maxval)") from None
    if width < 1 or height < 1 or not 1 <= maxval <= 65535:
        raise UsageError(f"{path}: bad PGM header ({width}x{height}, maxval {maxval})")
    count = width * height
    if magic == b"P5":
        body = data[position + 1 :]  # Exactly one whitespace byte separates maxval from the pixels.
        dtype = np.dtype(np.uint8) if maxval < 256 else np.dtype(">u2")
        if len(body) < count * dtype.itemsize:
            raise UsageError(f"{path}: PGM pixel data is truncated")
        pixels = np.frombuffer(body, dtype=dtype, count=count).astype(np.uint16)
    else:
        try:
            pixels = np.array([int(value) for value in data[position:].split()[:count]], dtype=np.uint16)
        except ValueError:
            raise UsageError(f"{path}: bad ASCII PGM pixel data") from None
        if pixels.size < count:
            raise UsageError(f"{path}: PGM pixel data is truncated")
    if int(pixels.max(initial=0)) > maxval:
        raise UsageError(f"{path}: pixel values exceed maxval {maxval}")
    return pixels.reshape(height, width), maxval


@dataclasses.dataclass(frozen=True)
class Normalisation:
    """How the model wants pixels scaled, ``(pixel / maxval - mean) / std``, from the model's metadata."""

    mean: float
    std: float

    @classmethod
    def from_model(cls, model: onnx.ModelProto) -> Normalisation:
        """Reads ``input_mean`` and ``input_std`` from the model's ``metadata_props``.

        Raises:
            UsageError: The model lacks them (it was not made by this sample's train.py).
        """
        metadata = {entry.key: entry.value for entry in model.metadata_props}
        try:
            return cls(mean=float(metadata["input_mean"]), std=float(metadata["input_std"]))
        except (KeyError, ValueError):
            raise UsageError(
                "the model has no valid input_mean/input_std metadata; use the model made by train.py"
            ) from None


@dataclasses.dataclass(frozen=True)
class Images:
    """The sample's images as a model input batch."""

    names: list[str]
    labels: list[int | None]
    batch: np.ndarray  # float32, (N, 1, H, W), normalised.


def load_images(data_dir: pathlib.Path, height: int, width: int, norm: Normalisation) -> Images:
    """Reads every ``*.pgm`` in ``data_dir`` (sorted by name) into a normalised NCHW float32 batch.

    A file named ``digit_<d>.pgm`` is labelled ``d``; other names have no label.

    Raises:
        UsageError: The folder is missing or empty, or an image is unreadable or of the wrong size.
    """
    if not data_dir.is_dir():
        raise UsageError(f"data folder {data_dir} does not exist (give one with --data_dir)")
    paths = sorted(data_dir.glob("*.pgm"))
    if not paths:
        raise UsageError(f"data folder {data_dir} has no .pgm images")
    names: list[str] = []
    labels: list[int | None] = []
    rows: list[np.ndarray] = []
    for path in paths:
        pixels, maxval = read_pgm(path)
        if pixels.shape != (height, width):
            raise UsageError(f"{path}: image is {pixels.shape[1]}x{pixels.shape[0]}, the model takes {width}x{height}")
        match = re.fullmatch(r"digit_(\d)", path.stem)
        names.append(path.stem)
        labels.append(int(match.group(1)) if match else None)
        rows.append((pixels.astype(np.float32) / maxval - norm.mean) / norm.std)
    batch = np.stack(rows)[:, None, :, :].astype(np.float32)
    return Images(names=names, labels=labels, batch=batch)


def stage_data(data_dir: pathlib.Path, work_dir: pathlib.Path, model: onnx.ModelProto) -> tuple[Images, str]:
    """Stage 1: PGM images -> ``inputs.npz`` holding the model's (only) input.

    Returns:
        The images and the model's input name.
    """
    graph_inputs = [value for value in model.graph.input if value.name not in {i.name for i in model.graph.initializer}]
    if len(graph_inputs) != 1:
        raise UsageError(f"the model has {len(graph_inputs)} inputs; this sample expects one image input")
    dims = graph_inputs[0].type.tensor_type.shape.dim
    if len(dims) != 4 or not (dims[1].dim_value == 1 and dims[2].dim_value > 0 and dims[3].dim_value > 0):
        raise UsageError("the model's input is not a (N, 1, H, W) image batch")
    images = load_images(data_dir, dims[2].dim_value, dims[3].dim_value, Normalisation.from_model(model))
    input_name = graph_inputs[0].name
    np.savez(work_dir / INPUTS_FILE, **{input_name: images.batch})
    print(f"  {len(images.names)} images from {shown(data_dir)}")
    print(f"  wrote {shown(work_dir / INPUTS_FILE)}: {input_name} {images.batch.dtype} {images.batch.shape}")
    return images, input_name


# ------------------------------------------------------------------------------------------------------------
# Running models and comparing outputs
# ------------------------------------------------------------------------------------------------------------


def input_dtypes(model: onnx.ModelProto) -> dict[str, np.dtype]:
    """The numpy dtype of each graph input (float types only; others are fed as they are)."""
    initializers = {init.name for init in model.graph.initializer}
    result = {}
    for value in model.graph.input:
        if value.name in initializers:
            continue
        elem_type = value.type.tensor_type.elem_type
        if elem_type in _ONNX_TO_NUMPY:
            result[value.name] = _ONNX_TO_NUMPY[elem_type]
    return result


def io_types_text(model: onnx.ModelProto) -> str:
    """Describes the graph's inputs and outputs with their element types, e.g. ``image float16 -> ...``."""

    def describe(values: list[onnx.ValueInfoProto]) -> str:
        return ", ".join(
            f"{v.name} {onnx.helper.tensor_dtype_to_np_dtype(v.type.tensor_type.elem_type)}" for v in values
        )

    initializers = {init.name for init in model.graph.initializer}
    inputs = [value for value in model.graph.input if value.name not in initializers]
    return f"{describe(inputs)} -> {describe(list(model.graph.output))}"


def cast_feeds(feeds: Mapping[str, np.ndarray], dtypes: Mapping[str, np.dtype]) -> dict[str, np.ndarray]:
    """Casts each float32 input to the type the model declares (float16, bfloat16, ...)."""
    return {name: array.astype(dtypes.get(name, array.dtype)) for name, array in feeds.items()}


def run_onnxruntime(session: _ort.Session, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Runs a session and returns every output as float32 (or its own type when not floating point).

    ONNX Runtime's numpy interface has no bfloat16; onnxprec's :class:`~onnxprec._ort.Session` passes bfloat16
    tensors as raw 16-bit OrtValues through io-binding and returns them as ``ml_dtypes.bfloat16`` arrays, and it
    casts float32 feeds to the model's input types.

    Args:
        session: The session, from :func:`onnxprec._ort.create_session`.
        feeds: Input arrays.

    Returns:
        Output name -> array.
    """
    values = session.run(feeds)
    return {name: _to_float32(value) for name, value in zip(session.output_names, values, strict=True)}


def _to_float32(array: np.ndarray) -> np.ndarray:
    """Floating-point arrays (float16, bfloat16, float64) -> float32; others unchanged."""
    if array.dtype in (np.float16, np.float64, ml_dtypes.bfloat16):
        return array.astype(np.float32)
    return array


def compare_with_gold(
    outputs: Mapping[str, np.ndarray],
    gold: Mapping[str, np.ndarray],
    precision: str,
    logits_name: str,
) -> list[str]:
    """Checks every output against the FP32 gold reference.

    Checks: the same outputs with the same shapes; all values finite; for each output
    ``max |out - gold| <= TOLERANCE_ULPS * unit_roundoff(precision) * max |gold|``; and the predicted digits
    (argmax of ``logits_name``) identical to the gold ones.

    Returns:
        One line per check result, to print.

    Raises:
        StageError: A check failed (the message lists every failure).
    """
    lines: list[str] = []
    failures: list[str] = []
    if set(outputs) != set(gold):
        raise StageError(f"outputs {sorted(outputs)} differ from the gold reference's {sorted(gold)}")
    agreement: float | None = None
    for name, reference in gold.items():
        actual = outputs[name]
        if actual.shape != reference.shape:
            failures.append(f"{name}: shape {actual.shape}, gold {reference.shape}")
            continue
        errors = metrics.compare(reference, actual, top1=name == logits_name)
        if name == logits_name:
            agreement = errors["top1"]  # argmax over the last axis: the predicted digits
        if errors["nonfinite"]:
            failures.append(f"{name}: {errors['nonfinite']} values are not finite")
            continue
        scale = float(np.max(np.abs(reference)))
        exponent = int(np.log2(UNIT_ROUNDOFF[precision]))
        tolerance = TOLERANCE_ULPS * UNIT_ROUNDOFF[precision] * scale
        diff = errors["max_abs"]
        verdict = "ok" if diff <= tolerance else "TOO LARGE"
        lines.append(
            f"{name}: max |diff| vs FP32 = {diff:.4g}, tolerance {tolerance:.4g} "
            f"= {TOLERANCE_ULPS} x 2^{exponent} x max |gold| {scale:.4g}: {verdict}"
        )
        if diff > tolerance:
            failures.append(f"{name}: max |diff| {diff:.4g} exceeds tolerance {tolerance:.4g}")
    if agreement is not None:
        images = len(gold[logits_name])
        same = round(agreement * images)
        lines.append(f"predictions identical to FP32: {same}/{images}")
        if same != images:
            failures.append(f"{images - same} predictions differ from FP32")
    if failures:
        for line in lines:
            print(f"  {line}")
        raise StageError("; ".join(failures))
    return lines


def print_predictions(images: Images, logits: np.ndarray) -> None:
    """Prints one line per image: its name, its label and the predicted digit."""
    predicted = logits.argmax(axis=1)
    for name, label, digit in zip(images.names, images.labels, predicted, strict=True):
        label_text = "?" if label is None else str(label)
        print(f"  {name:<12} label {label_text}  predicted {int(digit)}")


def predictions_text(logits: np.ndarray) -> str:
    """The predicted digits, space-separated."""
    return " ".join(str(int(digit)) for digit in logits.argmax(axis=1))


def create_session(model_path: pathlib.Path, provider: str, what: str) -> _ort.Session:
    """An ONNX Runtime session on ``provider`` (``CPUExecutionProvider``, ``CUDAExecutionProvider``) with ONNX
    Runtime's default optimizations, through onnxprec's runtime layer (quiet logs; errors raise).

    Raises:
        onnxprec.errors.UnsupportedModelError: ONNX Runtime cannot load the model.
    """
    short = {name: key for key, name in _ort.PROVIDER_NAMES.items()}[provider]
    return _ort.create_session(model_path, providers=[short], optimization="all", what=what)


def _error_text(err: BaseException) -> str:
    """The error's message and that of the ONNX Runtime error it replaced, if any (onnxprec's message keeps
    only the first 300 characters of ONNX Runtime's)."""
    context = err.__context__
    return f"{err}\n{context}" if context is not None else str(err)


def _skip_if_no_bf16_kernel(err: Exception, provider: str, precision: str) -> None:
    """Turns ONNX Runtime's "no kernel for this node" error on a bf16 model into a plain skip.

    ONNX Runtime has few bf16 kernels (its CPU provider has none for Conv; its CUDA provider none for MaxPool),
    so a bf16 model that is valid ONNX may not run on it. That is a gap in the runtime, not an error in the
    conversion. ONNX Runtime reports it in two ways: ``NOT_IMPLEMENTED : Could not find an implementation for
    Conv(22)`` when the CPU provider lacks the kernel, and ``Provider type for MaxPool node with name '...' is
    not set`` when neither the CUDA provider nor its CPU fallback has it.

    Raises:
        StageSkipped: The error is such a gap and the model is bf16. Otherwise this returns.
    """
    if precision != "bf16":
        return
    for pattern in (
        r"Could not find an implementation for (\w+\(\d+\))",
        r"Provider type for (\w+) node .* is not set",
    ):
        match = re.search(pattern, _error_text(err))
        if match:
            raise StageSkipped(
                f"ONNX Runtime {ort.__version__}'s {provider} has no bf16 kernel for {match.group(1)}, so the "
                "bf16 model cannot run on it and this numeric check is skipped (a strongly typed TensorRT "
                "engine runs bf16: stage 4a)"
            ) from None


# ------------------------------------------------------------------------------------------------------------
# Stage 2: FP32 reference
# ------------------------------------------------------------------------------------------------------------


def stage_fp32(
    model_path: pathlib.Path, images: Images, input_name: str, work_dir: pathlib.Path
) -> dict[str, np.ndarray]:
    """Stage 2: runs the FP32 model on ONNX Runtime's CPU provider and saves the gold references."""
    session = create_session(model_path, "CPUExecutionProvider", "the FP32 model")
    gold = run_onnxruntime(session, {input_name: images.batch})
    logits = gold[session.output_names[0]]
    print(f"  {shown(model_path)} on ONNX Runtime {ort.__version__} (CPUExecutionProvider)")
    print_predictions(images, logits)
    predicted = logits.argmax(axis=1)
    labelled = [index for index, label in enumerate(images.labels) if label is not None]
    if labelled:
        correct = sum(images.labels[index] == int(predicted[index]) for index in labelled)
        print(f"  {correct}/{len(labelled)} labelled images classified correctly")
    np.savez(work_dir / GOLD_FILE, **gold)
    shapes = ", ".join(f"{name} {value.shape}" for name, value in gold.items())
    print(f"  wrote gold references {shown(work_dir / GOLD_FILE)}: {shapes}")
    return gold


# ------------------------------------------------------------------------------------------------------------
# Stage 3: AutoCast and ONNX Runtime on the CPU
# ------------------------------------------------------------------------------------------------------------


def stage_convert(model_path: pathlib.Path, precision: str, work_dir: pathlib.Path) -> pathlib.Path:
    """Stage 3a: converts the model with onnxprec's AutoCast and saves it.

    Returns:
        The converted model's path.
    """
    try:
        from onnxprec.autocast import convert_to_mixed_precision
    except ImportError as err:
        raise StageError(
            f"onnxprec.autocast.convert_to_mixed_precision cannot be imported ({err}); install onnxprec "
            "(pip install -e <repo root>)"
        ) from None
    converted = convert_to_mixed_precision(onnx_path=str(model_path), low_precision_type=precision, keep_io_types=False)
    if not isinstance(converted, onnx.ModelProto):
        raise StageError(f"convert_to_mixed_precision returned {type(converted).__name__}, not an onnx.ModelProto")
    onnx.checker.check_model(converted, full_check=True)
    out_path = work_dir / f"{model_path.stem}.{precision}.onnx"
    onnx.save(converted, out_path)

    low_type = {"fp16": onnx.TensorProto.FLOAT16, "bf16": onnx.TensorProto.BFLOAT16}[precision]
    initializer_types = [init.data_type for init in converted.graph.initializer]
    casts = sum(node.op_type == "Cast" for node in converted.graph.node)
    print(f"  convert_to_mixed_precision(low_precision_type={precision!r}, keep_io_types=False)")
    print(f"  wrote {shown(out_path)} (passes onnx.checker full_check)")
    print(
        f"  {len(converted.graph.node)} nodes ({casts} Cast); initializers: "
        f"{initializer_types.count(low_type)} {precision}, "
        f"{initializer_types.count(onnx.TensorProto.FLOAT)} fp32"
    )
    print(f"  I/O: {io_types_text(converted)}")
    return out_path


def stage_onnxruntime(
    converted_path: pathlib.Path,
    provider: str,
    feeds: Mapping[str, np.ndarray],
    gold: Mapping[str, np.ndarray],
    precision: str,
) -> None:
    """Runs the converted model on an ONNX Runtime provider and compares it with the gold references.

    Raises:
        StageSkipped: The provider can't run this model here (no bf16 kernels on the CPU; CUDA unusable).
        StageError: A check failed.
    """
    try:
        session = create_session(converted_path, provider, "the converted model")
    except Exception as err:
        _skip_if_no_bf16_kernel(err, provider, precision)
        raise StageError(f"{err} (on {provider})") from None
    if provider not in session.inner.get_providers():
        raise StageSkipped(
            f"{provider} is installed but could not be initialised (no GPU, or CUDA/cuDNN libraries "
            f"missing); the session got {session.inner.get_providers()}"
        )
    try:
        outputs = run_onnxruntime(session, feeds)  # float32 feeds: the session casts them to the input types
    except Exception as err:
        _skip_if_no_bf16_kernel(err, provider, precision)
        raise StageError(f"ONNX Runtime failed to run the converted model on {provider}: {err}") from None
    logits_name = session.output_names[0]
    print(f"  ONNX Runtime {ort.__version__} ({provider}): predictions {predictions_text(outputs[logits_name])}")
    for line in compare_with_gold(outputs, gold, precision, logits_name):
        print(f"  {line}")


# ------------------------------------------------------------------------------------------------------------
# Stage 4: TensorRT (strongly typed) and ONNX Runtime CUDA
# ------------------------------------------------------------------------------------------------------------


class CudaRuntime:
    """The few CUDA runtime calls that running a TensorRT engine needs, through cuda-python's bindings."""

    def __init__(self, cudart: Any) -> None:
        """Wraps cuda-python's runtime module (``cuda.bindings.runtime``, or ``cuda.cudart`` before 12.6)."""
        self._rt = cudart

    @classmethod
    def load(cls) -> CudaRuntime | None:
        """Returns a CudaRuntime, or None where cuda-python is not installed."""
        try:
            from cuda.bindings import runtime as cudart
        except ImportError:
            try:
                from cuda import cudart
            except ImportError:
                return None
        return cls(cudart)

    def _check(self, result: tuple[Any, ...]) -> Any:
        """Checks a call's ``(error, *values)`` result and returns its value, if any."""
        error, *values = result
        if error != self._rt.cudaError_t.cudaSuccess:
            raise StageError(f"CUDA call failed: {error}")
        return values[0] if values else None

    def malloc(self, nbytes: int) -> int:
        """Allocates device memory; returns its address."""
        return int(self._check(self._rt.cudaMalloc(max(nbytes, 1))))

    def free(self, address: int) -> None:
        """Frees device memory."""
        self._check(self._rt.cudaFree(address))

    def to_device(self, address: int, array: np.ndarray) -> None:
        """Copies a contiguous host array to device memory."""
        kind = self._rt.cudaMemcpyKind.cudaMemcpyHostToDevice
        self._check(self._rt.cudaMemcpy(address, array.ctypes.data, array.nbytes, kind))

    def to_host(self, array: np.ndarray, address: int) -> None:
        """Copies device memory into a contiguous host array."""
        kind = self._rt.cudaMemcpyKind.cudaMemcpyDeviceToHost
        self._check(self._rt.cudaMemcpy(array.ctypes.data, address, array.nbytes, kind))

    def create_stream(self) -> Any:
        """Creates a CUDA stream."""
        return self._check(self._rt.cudaStreamCreate())

    def synchronize(self, stream: Any) -> None:
        """Waits until the work queued on a stream is done."""
        self._check(self._rt.cudaStreamSynchronize(stream))

    def destroy_stream(self, stream: Any) -> None:
        """Destroys a stream."""
        self._check(self._rt.cudaStreamDestroy(stream))


def _trt_to_numpy(trt: Any, data_type: Any) -> np.dtype:
    """Maps a TensorRT DataType to a numpy dtype (bfloat16 via ml_dtypes)."""
    table = {
        "FLOAT": np.float32,
        "HALF": np.float16,
        "BF16": ml_dtypes.bfloat16,
        "INT8": np.int8,
        "UINT8": np.uint8,
        "INT32": np.int32,
        "INT64": np.int64,
        "BOOL": np.bool_,
    }
    for name, dtype in table.items():
        if hasattr(trt.DataType, name) and data_type == getattr(trt.DataType, name):
            return np.dtype(dtype)
    raise StageError(f"TensorRT data type {data_type} is not handled by this sample")


def build_strongly_typed_engine(trt: Any, converted_path: pathlib.Path, feeds: Mapping[str, np.ndarray]) -> Any:
    """Parses the converted ONNX model into a strongly typed network and builds an engine.

    With ``NetworkDefinitionCreationFlag.STRONGLY_TYPED`` (TensorRT 10; always on in TensorRT 11, where the
    flag is accepted and ignored) every tensor keeps the type the ONNX model gives it: TensorRT does not
    choose precisions itself, so the engine runs exactly the mixed precision that AutoCast decided.

    Args:
        trt: The ``tensorrt`` module.
        converted_path: The converted ONNX model.
        feeds: The inputs the engine will be run on; a dynamic batch gets a profile of 1 to their batch size.

    Returns:
        The deserialized ``ICudaEngine``.

    Raises:
        StageError: Parsing or building failed.
    """
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    flags = 0
    if hasattr(trt.NetworkDefinitionCreationFlag, "STRONGLY_TYPED"):
        flags |= 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(converted_path)):
        errors = "; ".join(str(parser.get_error(index)) for index in range(parser.num_errors))
        raise StageError(f"TensorRT could not parse {converted_path}: {errors}")

    config = builder.create_builder_config()
    profile = builder.create_optimization_profile()
    dynamic = False
    for index in range(network.num_inputs):
        tensor = network.get_input(index)
        shape = tuple(feeds[tensor.name].shape)
        if any(dim < 0 for dim in tensor.shape):
            profile.set_shape(tensor.name, (1, *shape[1:]), shape, shape)  # min, opt, max
            dynamic = True
    if dynamic:
        config.add_optimization_profile(profile)
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise StageError("TensorRT failed to build the engine (its log above says why)")
    return trt.Runtime(logger).deserialize_cuda_engine(serialized)


def run_tensorrt(converted_path: pathlib.Path, feeds: Mapping[str, np.ndarray]) -> tuple[dict[str, np.ndarray], str]:
    """Builds a strongly typed TensorRT engine from the converted model and runs it once.

    Args:
        converted_path: The converted ONNX model.
        feeds: Input arrays, already of the model's input types.

    Returns:
        ``(outputs as float32, description of the engine's I/O types)``.

    Raises:
        StageSkipped: cuda-python (for device memory) is missing.
        StageError: Building or running failed.
    """
    import tensorrt as trt

    cuda = CudaRuntime.load()
    if cuda is None:
        raise StageSkipped(
            f"TensorRT {trt.__version__} is installed but cuda-python, needed for device memory, is not: "
            "pip install cuda-python"
        )
    engine = build_strongly_typed_engine(trt, converted_path, feeds)
    context = engine.create_execution_context()

    names = [engine.get_tensor_name(index) for index in range(engine.num_io_tensors)]
    inputs = [name for name in names if engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT]
    host: dict[str, np.ndarray] = {}
    for name in inputs:
        dtype = _trt_to_numpy(trt, engine.get_tensor_dtype(name))
        if feeds[name].dtype != dtype:
            raise StageError(f"engine input {name} is {dtype}, the ONNX model's is {feeds[name].dtype}")
        host[name] = np.ascontiguousarray(feeds[name])
        context.set_input_shape(name, host[name].shape)
    outputs = [name for name in names if name not in inputs]
    for name in outputs:
        shape = tuple(context.get_tensor_shape(name))
        host[name] = np.empty(shape, dtype=_trt_to_numpy(trt, engine.get_tensor_dtype(name)))
    io_text = ", ".join(f"{name} {engine.get_tensor_dtype(name)}" for name in names)

    device: dict[str, int] = {}
    stream = cuda.create_stream()
    try:
        for name, array in host.items():
            device[name] = cuda.malloc(array.nbytes)
            context.set_tensor_address(name, device[name])
        for name in inputs:
            cuda.to_device(device[name], host[name])
        if not context.execute_async_v3(stream_handle=int(stream)):
            raise StageError("TensorRT execution failed (its log above says why)")
        cuda.synchronize(stream)
        for name in outputs:
            cuda.to_host(host[name], device[name])
    finally:
        for address in device.values():
            cuda.free(address)
        cuda.destroy_stream(stream)
    return {name: _to_float32(host[name]) for name in outputs}, io_text


def stage_tensorrt(
    converted_path: pathlib.Path,
    feeds: Mapping[str, np.ndarray],
    gold: Mapping[str, np.ndarray],
    precision: str,
) -> None:
    """Stage 4a: a strongly typed TensorRT engine of the converted model, compared with the gold outputs."""
    try:
        import tensorrt
    except ImportError:
        raise StageSkipped("TensorRT is not installed (import tensorrt failed)") from None
    except Exception as err:  # A broken install (missing CUDA libraries) fails with other errors.
        raise StageSkipped(f"TensorRT cannot be loaded: {err}") from None
    converted = onnx.load(converted_path)
    outputs, io_text = run_tensorrt(converted_path, cast_feeds(feeds, input_dtypes(converted)))
    logits_name = converted.graph.output[0].name
    print(f"  TensorRT {tensorrt.__version__} strongly typed engine; I/O: {io_text}")
    print(f"  predictions {predictions_text(outputs[logits_name])}")
    for line in compare_with_gold(outputs, gold, precision, logits_name):
        print(f"  {line}")


def stage_onnxruntime_cuda(
    converted_path: pathlib.Path,
    feeds: Mapping[str, np.ndarray],
    gold: Mapping[str, np.ndarray],
    precision: str,
) -> None:
    """Stage 4b: the converted model on ONNX Runtime's CUDA provider, compared with the gold references."""
    available = ort.get_available_providers()
    if "CUDAExecutionProvider" not in available:
        raise StageSkipped(
            "ONNX Runtime's CUDAExecutionProvider is not available (this onnxruntime has "
            f"{', '.join(available)}; install onnxruntime-gpu on a machine with an NVIDIA GPU)"
        )
    if hasattr(ort, "preload_dlls"):
        ort.preload_dlls()  # Loads CUDA/cuDNN from the nvidia-* pip packages, where they are installed.
    stage_onnxruntime(converted_path, "CUDAExecutionProvider", feeds, gold, precision)


# ------------------------------------------------------------------------------------------------------------
# Driver
# ------------------------------------------------------------------------------------------------------------


def run_stage(step: str, title: str, results: list[tuple[str, str]], action: Callable[[], _T]) -> _T | None:
    """Runs one stage, prints its outcome and records ``(step, passed|skipped|FAILED)``.

    Args:
        step: The stage's number, e.g. ``3a``.
        title: What the stage does.
        results: The outcomes so far; this stage's is appended.
        action: The stage itself.

    Returns:
        What the stage returned, or None when it was skipped or failed.
    """
    print(f"\n[{step}] {title}")
    try:
        value = action()
    except StageSkipped as skip:
        print(f"  SKIPPED: {skip}")
        results.append((step, "skipped"))
        return None
    except (StageError, UsageError, onnx.checker.ValidationError) as err:
        print(f"  FAILED: {err}")
        results.append((step, "FAILED"))
        return None
    except Exception as err:  # An unexpected error is a bug somewhere: keep the traceback for the report.
        print(f"  FAILED: {type(err).__name__}: {err}")
        traceback.print_exc(file=sys.stderr)
        results.append((step, "FAILED"))
        return None
    print("  passed")
    results.append((step, "passed"))
    return value


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Parses the command line."""
    parser = argparse.ArgumentParser(
        description="onnxprec sample: strongly typed mixed precision (AutoCast) on handwritten digits. "
        "Runs the FP32 model, converts it to FP16 or BF16, and checks the converted model on ONNX Runtime "
        "(CPU) and, where available, on a strongly typed TensorRT engine and ONNX Runtime's CUDA provider.",
    )
    parser.add_argument(
        "--data_dir",
        type=pathlib.Path,
        default=DEFAULT_DATA_DIR,
        help="folder of 8x8 PGM digit images, digit_<d>.pgm (default: the sample's data/ folder)",
    )
    parser.add_argument(
        "--working_dir",
        type=pathlib.Path,
        default=None,
        help="folder for inputs.npz, the gold references and the converted model; created if missing "
        "(default: a new temporary folder, kept after the run)",
    )
    parser.add_argument(
        "--precision",
        choices=list(UNIT_ROUNDOFF),
        default="fp16",
        help="low-precision type for AutoCast (default: fp16)",
    )
    return parser.parse_args(argv)


def prepare_working_dir(working_dir: pathlib.Path | None) -> pathlib.Path:
    """Creates the working folder (a fresh temporary one when none was given)."""
    if working_dir is None:
        return pathlib.Path(tempfile.mkdtemp(prefix="onnxprec-sample-"))
    if working_dir.exists() and not working_dir.is_dir():
        raise UsageError(f"--working_dir {working_dir} exists and is not a folder")
    try:
        working_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UsageError(f"cannot create --working_dir {working_dir}: {err.strerror}") from None
    return working_dir


def main(argv: list[str] | None = None) -> int:
    """Runs the sample.

    Args:
        argv: Command-line arguments (default: ``sys.argv[1:]``).

    Returns:
        0 when every stage that ran passed, 1 when one failed, 2 on a usage error.
    """
    args = parse_args(argv)
    try:
        if not args.data_dir.is_dir():
            raise UsageError(f"data folder {args.data_dir} does not exist (give one with --data_dir)")
        if not MODEL_PATH.is_file():
            raise UsageError(f"the sample's model {MODEL_PATH} is missing (make it with train.py)")
        work_dir = prepare_working_dir(args.working_dir)
        model = onnx.load(MODEL_PATH)
        print(f"onnxprec strongly typed AutoCast sample: {args.precision}, working folder {shown(work_dir)}")
        print("\n[1] Data")
        images, input_name = stage_data(args.data_dir, work_dir, model)
    except UsageError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    results: list[tuple[str, str]] = [("1", "passed")]
    print("  passed")

    feeds = {input_name: images.batch}
    gold = run_stage(
        "2",
        "FP32 model on ONNX Runtime: gold references",
        results,
        lambda: stage_fp32(MODEL_PATH, images, input_name, work_dir),
    )
    if gold is not None:
        converted_path = run_stage(
            "3a",
            f"AutoCast to {args.precision}",
            results,
            lambda: stage_convert(MODEL_PATH, args.precision, work_dir),
        )
        if converted_path is not None:
            run_stage(
                "3b",
                f"{args.precision} model on ONNX Runtime (CPU) vs FP32",
                results,
                lambda: stage_onnxruntime(converted_path, "CPUExecutionProvider", feeds, gold, args.precision),
            )
            run_stage(
                "4a",
                f"{args.precision} model as a strongly typed TensorRT engine (GPU) vs FP32",
                results,
                lambda: stage_tensorrt(converted_path, feeds, gold, args.precision),
            )
            run_stage(
                "4b",
                f"{args.precision} model on ONNX Runtime CUDA (GPU) vs FP32",
                results,
                lambda: stage_onnxruntime_cuda(converted_path, feeds, gold, args.precision),
            )

    print("\nSummary: " + ", ".join(f"[{step}] {outcome}" for step, outcome in results))
    failed = [step for step, outcome in results if outcome == "FAILED"]
    if failed:
        print(f"Sample FAILED: stage {', '.join(failed)} failed (see above)", file=sys.stderr)
        return 1
    print("Sample finished successfully.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
