"""The ONNX backend node-test sweep: AutoCast (or ModelOpt) on every single-operator test model with FP32 data.

    python -m experiments.node_sweep [--data DIR] [--low fp16|bf16] [--calibration random|own]
                                    [--tool onnxprec|modelopt] [--jobs N] [--timeout S] [--json OUT]
                                    [--cases SUBSTRING ...] [--keep DIR]

**Data.** The ~1,700 test folders (``model.onnx`` + ``test_data_set_*/{input,output}_*.pb``) that ship in the
``onnx`` 1.21.0 wheel under ``onnx/backend/test/data/node/`` (later wheels no longer ship them). Nothing is
downloaded here: pass the folder with ``--data`` (or ``$ONNXPREC_NODE_TESTS``), else the data of an installed
``onnx`` that has it, else ``~/.cache/onnxprec/onnx-node-tests``. To fetch it once::

    pip download --no-deps onnx==1.21.0 -d /tmp/onnx121
    unzip -q /tmp/onnx121/onnx-1.21.0-*.whl 'onnx/backend/test/data/node/*' -d /tmp/onnx121
    cp -r /tmp/onnx121/onnx/backend/test/data/node ~/.cache/onnxprec/onnx-node-tests

**FP32 case.** A test whose graph inputs or outputs carry FP32 data (tensors, or sequences/optionals of them) and
whose original model, run in ONNX Runtime (CPU), gives the test's expected outputs: 1,207 of the 1,287 tests
of onnx 1.21.0 with FP32 I/O in ONNX Runtime 1.32. The other 80 (ops ORT lacks, INT2/INT4 feeds its Python API
cannot take, tests whose expected outputs ORT does not reproduce) say nothing about a converter and are listed
apart as "baseline fails".

**Conversion.** ``keep_io_types=True`` and every other setting at its default; ``--calibration own`` passes the
test's first input set as calibration data, ``random`` (default) lets the tool make its own data.

**Judging.** The converted model runs in ONNX Runtime (CPU) on every input set of the test; when ORT has no
kernel for it (``NOT_IMPLEMENTED``: BF16 on CPU, some FP16 ops) the converted model and the FP32 model both run
in ``onnx.reference`` instead (ORT's FP32 outputs stand in where onnx.reference cannot run the original). A float
output element is right when::

    |converted - expected| <= |fp32 - expected| + tol * (|expected| + rms(expected))

with ``fp32`` the original model's output in the same runtime and ``tol = 10 * eps`` of the low type (FP16:
``10 * 2**-10`` = 0.98%, BF16: ``10 * 2**-7`` = 7.8%): ten units in the last place of the value itself, or
of the output's typical magnitude for elements near zero (sums that cancel). NaN must stay NaN and infinities
must stay the same infinity where the FP32 run has them too. Integer, bool and string outputs must equal the
expected or the FP32 run's output (8- and 16-bit integers, quantized data, may be one step off); shapes must
match exactly. The FP32 baseline is held to the same rule with ``tol = 1e-3``.

**Verdicts.** ``ok``; ``refused`` (the tool raised its user-facing error; the table groups them by message);
``invalid`` (the model fails ``onnx.checker`` with full type inference, changed its I/O names or types, or
ORT rejects it for a reason other than a missing kernel); ``wrong`` (a runtime runs it but an output is
outside the tolerance, or the run itself fails); ``crash`` (any other exception, a hang past ``--timeout``, or
the worker process dying). Each case runs in a pool of worker processes with a per-case timeout, so one hang
or segfault costs only that case.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import datetime as dt
import fnmatch
import json
import logging
import os
import re
import selectors
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

REPO_ROOT = Path(__file__).resolve().parents[1]
CACHE_DATA = Path("~/.cache/onnxprec/onnx-node-tests").expanduser()
EPS = {"fp16": 2.0**-10, "bf16": 2.0**-7}
TOL_ULPS = 10
VERDICTS = ("ok", "refused", "invalid", "wrong", "crash", "baseline fails")

_ML_DTYPE_NAMES: dict[int, str] = {
    TensorProto.BFLOAT16: "bfloat16",
    TensorProto.FLOAT8E4M3FN: "float8_e4m3fn",
    TensorProto.FLOAT8E4M3FNUZ: "float8_e4m3fnuz",
    TensorProto.FLOAT8E5M2: "float8_e5m2",
    TensorProto.FLOAT8E5M2FNUZ: "float8_e5m2fnuz",
}


# --------------------------------------------------------------------------------------------------
# The data


def data_dir(explicit: str | os.PathLike | None = None) -> Path | None:
    """The node-test folder: ``explicit``, ``$ONNXPREC_NODE_TESTS``, an installed onnx's, or the cache; else None."""
    candidates: list[Path] = []
    if explicit is not None:
        return Path(explicit) if Path(explicit).is_dir() else None
    if os.environ.get("ONNXPREC_NODE_TESTS"):
        candidates.append(Path(os.environ["ONNXPREC_NODE_TESTS"]))
    candidates.append(Path(onnx.__file__).parent / "backend" / "test" / "data" / "node")
    candidates.append(CACHE_DATA)
    for path in candidates:
        if path.is_dir() and any(path.glob("test_*/model.onnx")):
            return path
    return None


def _elem_types(type_proto: onnx.TypeProto, out: set[int]) -> None:
    kind = type_proto.WhichOneof("value")
    if kind == "tensor_type":
        out.add(type_proto.tensor_type.elem_type)
    elif kind == "sparse_tensor_type":
        out.add(type_proto.sparse_tensor_type.elem_type)
    elif kind == "sequence_type":
        _elem_types(type_proto.sequence_type.elem_type, out)
    elif kind == "optional_type":
        _elem_types(type_proto.optional_type.elem_type, out)
    elif kind == "map_type":
        _elem_types(type_proto.map_type.value_type, out)


def has_fp32_io(model: onnx.ModelProto) -> bool:
    """Whether graph inputs or outputs carry FP32 data (tensors, or sequences/optionals of them)."""
    types: set[int] = set()
    for value in (*model.graph.input, *model.graph.output):
        _elem_types(value.type, types)
    return TensorProto.FLOAT in types


def list_cases(root: Path, patterns: Sequence[str] = ()) -> list[Path]:
    """Folders of tests with FP32 graph I/O under ``root``, sorted; ``patterns`` (substrings, globs) pick some."""
    cases = []
    for model_path in sorted(root.glob("test_*/model.onnx")):
        name = model_path.parent.name
        if patterns and not any(
            fnmatch.fnmatch(name, p) if any(c in p for c in "*?[") else p in name for p in patterns
        ):
            continue
        if has_fp32_io(onnx.load(str(model_path), load_external_data=False)):
            cases.append(model_path.parent)
    return cases


def _load_value(path: Path, type_proto: onnx.TypeProto) -> Any:
    data = path.read_bytes()
    if type_proto.HasField("sequence_type"):
        seq = onnx.SequenceProto()
        seq.ParseFromString(data)
        return numpy_helper.to_list(seq)
    if type_proto.HasField("optional_type"):
        opt = onnx.OptionalProto()
        opt.ParseFromString(data)
        return numpy_helper.to_optional(opt)
    tensor = onnx.TensorProto()
    tensor.ParseFromString(data)
    return _to_array(tensor)


def _to_array(tensor: onnx.TensorProto) -> np.ndarray:
    array = numpy_helper.to_array(tensor)
    name = _ML_DTYPE_NAMES.get(tensor.data_type)
    if name is not None and array.dtype.name != name:  # older onnx: raw integer bits
        import ml_dtypes

        array = (
            array.astype(getattr(ml_dtypes, name)) if array.dtype.kind == "f" else array.view(getattr(ml_dtypes, name))
        )
    return array


def load_data_sets(case: Path, model: onnx.ModelProto) -> list[tuple[dict[str, Any], list[Any]]]:
    """``[(feeds by input name, expected outputs in order)]`` for each ``test_data_set_*`` of ``case``."""
    sets = []
    for folder in sorted(case.glob("test_data_set_*")):
        n_in = len(list(folder.glob("input_*.pb")))
        n_out = len(list(folder.glob("output_*.pb")))
        feeds = {
            model.graph.input[i].name: _load_value(folder / f"input_{i}.pb", model.graph.input[i].type)
            for i in range(n_in)
        }
        expected = [_load_value(folder / f"output_{i}.pb", model.graph.output[i].type) for i in range(n_out)]
        sets.append((feeds, expected))
    return sets


# --------------------------------------------------------------------------------------------------
# Running a model: ONNX Runtime, or onnx.reference where ORT has no kernel


class KernelGap(Exception):
    """ONNX Runtime has no kernel for a node of the model (NOT_IMPLEMENTED)."""


_ORT: Any = None


def _ort() -> Any:
    global _ORT
    if _ORT is None:
        import onnxruntime

        onnxruntime.set_default_logger_severity(3)
        _ORT = onnxruntime
    return _ORT


def _ort_value(array: Any, ort: Any) -> Any:
    if isinstance(array, list):
        return [_ort_value(a, ort) for a in array]
    array = np.asarray(array)
    code = next((c for c, n in _ML_DTYPE_NAMES.items() if array.dtype.name == n), None)
    if code is None:
        return array
    raw = np.ascontiguousarray(array).view(np.uint16 if array.dtype.itemsize == 2 else np.uint8)
    return ort.OrtValue.ortvalue_from_numpy_with_onnx_type(raw, onnx_element_type=code)


_ORT_TYPES = {
    "tensor(bfloat16)": "bfloat16",
    "tensor(float8e4m3fn)": "float8_e4m3fn",
    "tensor(float8e4m3fnuz)": "float8_e4m3fnuz",
    "tensor(float8e5m2)": "float8_e5m2",
    "tensor(float8e5m2fnuz)": "float8_e5m2fnuz",
}


def run_ort(model: onnx.ModelProto, feeds: dict[str, Any]) -> list[Any]:
    """Runs ``model`` in ONNX Runtime on the CPU; BF16/FP8 travel as ml_dtypes arrays.

    Raises:
        KernelGap: ORT has no kernel for a node.
        RuntimeError: ORT rejects the model (message: ORT's first line).
    """
    ort = _ort()
    options = ort.SessionOptions()
    options.log_severity_level = 3
    try:
        session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    except Exception as e:
        text = str(e)
        if "NOT_IMPLEMENTED" in text or "Could not find an implementation" in text:
            raise KernelGap(_first_line(e)) from e
        raise RuntimeError(f"ORT rejects the model: {_first_line(e)}") from e
    try:
        return _run_session(session, feeds, ort)
    except Exception as e:
        text = str(e)
        if "NOT_IMPLEMENTED" in text or re.search(r"(MLFloat16|BFloat16|data type) .*not supported", text):
            raise KernelGap(_first_line(e)) from e  # a kernel without this type at run time (ScatterND...)
        raise


def _run_session(session: Any, feeds: dict[str, Any], ort: Any) -> list[Any]:
    outputs = session.get_outputs()
    special = {o.name: _ORT_TYPES[o.type] for o in outputs if o.type in _ORT_TYPES}
    bound = {k: _ort_value(v, ort) for k, v in feeds.items() if isinstance(v, np.ndarray)}
    if not special and all(isinstance(v, np.ndarray) for v in bound.values()):
        return list(session.run(None, feeds))
    binding = session.io_binding()
    for name, value in feeds.items():
        if name not in bound:
            raise RuntimeError(f"cannot bind input '{name}' of type {type(value).__name__} next to BF16/FP8 values")
        if isinstance(bound[name], np.ndarray):
            binding.bind_cpu_input(name, np.ascontiguousarray(bound[name]))
        else:
            binding.bind_ortvalue_input(name, bound[name])
    for out in outputs:
        binding.bind_output(out.name, "cpu")
    session.run_with_iobinding(binding)
    results = []
    import ml_dtypes

    for out, value in zip(outputs, binding.get_outputs()):
        if out.name in special:
            dtype = np.dtype(getattr(ml_dtypes, special[out.name]))
            shape = tuple(value.shape())
            raw = np.empty(shape, dtype=np.uint16 if dtype.itemsize == 2 else np.uint8)
            if raw.size:
                import ctypes

                ctypes.memmove(raw.ctypes.data, value.data_ptr(), raw.nbytes)
            results.append(raw.view(dtype))
        else:
            results.append(value.numpy())
    return results


def run_reference(model: onnx.ModelProto, feeds: dict[str, Any]) -> list[Any]:
    """Runs ``model`` in ``onnx.reference``."""
    from onnx.reference import ReferenceEvaluator

    return list(ReferenceEvaluator(model).run(None, feeds))


def _first_line(error: BaseException, limit: int = 240) -> str:
    lines = [ln.strip() for ln in str(error).strip().splitlines() if ln.strip()]
    return (lines[0] if lines else type(error).__name__)[:limit]


# --------------------------------------------------------------------------------------------------
# Judging


def _as_float(array: Any) -> np.ndarray:
    return np.asarray(array).astype(np.float64)


def _describe(value: Any) -> str:
    return f"a sequence of {len(value)}" if isinstance(value, list) else type(value).__name__


def compare(converted: Any, expected: Any, fp32: Any, tol: float, where: str = "output") -> str | None:
    """None if ``converted`` is within tolerance of ``expected`` (see the module doc), else why not."""
    if isinstance(expected, list) or isinstance(converted, list):
        if not isinstance(expected, list) or not isinstance(converted, list) or len(expected) != len(converted):
            return f"{where}: {_describe(converted)}, expected {_describe(expected)}"
        fp32_items = fp32 if isinstance(fp32, list) and len(fp32) == len(expected) else [None] * len(expected)
        for i, (c, e, f) in enumerate(zip(converted, expected, fp32_items)):
            why = compare(c, e, f, tol, f"{where}[{i}]")
            if why:
                return why
        return None
    if expected is None or converted is None:
        return None if expected is None and converted is None else f"{where}: optional presence differs"
    c, e = np.asarray(converted), np.asarray(expected)
    if c.shape != e.shape and fp32 is not None and np.shape(fp32) == c.shape and c.size == e.size:
        c = c.reshape(e.shape)  # the runtime gives the FP32 model the same other shape (onnx.reference's Loop)
    if c.shape != e.shape:
        return f"{where}: shape {list(c.shape)}, expected {list(e.shape)}"
    is_float = e.dtype.kind == "f" or e.dtype.name in _ML_DTYPE_NAMES.values()
    if not is_float:
        if c.dtype.kind == "f" or c.dtype.name in _ML_DTYPE_NAMES.values():
            return f"{where}: dtype {c.dtype}, expected {e.dtype}"
        if np.array_equal(c, e) or (fp32 is not None and np.array_equal(c, np.asarray(fp32))):
            return None
        if e.dtype.kind in "iu" and e.dtype.itemsize <= 2 and np.all(np.abs(c.astype(np.int64) - e) <= 1):
            return None  # quantized data: one step of rounding
        return f"{where}: {int(np.sum(c != e))} of {e.size} values differ"
    if e.size == 0:
        return None
    ce, ee = _as_float(c), _as_float(e)
    fe = _as_float(fp32).reshape(e.shape) if fp32 is not None and np.size(fp32) == e.size else ee
    finite = np.isfinite(ee)
    scale = float(np.sqrt(np.mean(np.square(ee[finite])))) if finite.any() else 0.0
    with np.errstate(invalid="ignore", over="ignore"):
        bound = np.abs(fe - ee) + tol * (np.abs(ee) + scale)
        bad = ~(np.abs(ce - ee) <= bound)
    # NaN / inf where expected: right if the converted output has the same; if FP32 itself misses it, ignore.
    special = ~finite
    same_special = (np.isnan(ee) & np.isnan(ce)) | (np.isinf(ee) & (ce == ee))
    fp32_misses = special & ~((np.isnan(ee) & np.isnan(fe)) | (np.isinf(ee) & (fe == ee)))
    bad = np.where(special, ~same_special & ~fp32_misses, bad)
    # Where FP32 gives NaN/inf although the expected is finite, the converted output is not judged.
    bad &= ~(finite & ~np.isfinite(fe))
    if not bad.any():
        return None
    index = np.unravel_index(int(np.argmax(bad)), bad.shape)
    return (
        f"{where}: {int(bad.sum())} of {e.size} values outside tolerance "
        f"(e.g. {float(ce[index]):.6g} vs expected {float(ee[index]):.6g}, fp32 {float(fe[index]):.6g})"
    )


@dataclass
class CaseResult:
    """The verdict of one case."""

    case: str
    verdict: str
    detail: str = ""
    runtime: str = ""
    seconds: float = 0.0
    warnings: list[str] = field(default_factory=list)
    low_nodes: int = 0  # nodes of the converted model computing in the low type (Casts left out)
    nodes: int = 0


def _io_signature(model: onnx.ModelProto) -> list[tuple[str, str]]:
    sig = []
    for value in (*model.graph.input, *model.graph.output):
        if value.name in {i.name for i in model.graph.initializer}:
            continue
        sig.append((value.name, str(value.type).replace("\n", " ")))
    return sig


def _io_types(model: onnx.ModelProto) -> list[tuple[str, str]]:
    inits = {i.name for i in model.graph.initializer}
    out = []
    for value in (*model.graph.input, *model.graph.output):
        if value.name in inits:
            continue
        types: set[int] = set()
        _elem_types(value.type, types)
        out.append((value.name, f"{value.type.WhichOneof('value')}:{sorted(types)}"))
    return out


def baseline(model: onnx.ModelProto, data_sets: list[tuple[dict[str, Any], list[Any]]]) -> list[list[Any]] | str:
    """The original model's ONNX Runtime outputs per data set, or why they are not the test's expected outputs."""
    try:
        outputs = [run_ort(model, feeds) for feeds, _ in data_sets]
    except Exception as e:
        return f"ORT cannot run the FP32 model: {_first_line(e, 160)}"
    for k, (outs, (_, expected)) in enumerate(zip(outputs, data_sets)):
        for i, (o, x) in enumerate(zip(outs, expected)):
            why = compare(o, x, None, 1e-3, f"set {k} output {i}")
            if why:
                return f"ORT's FP32 output differs from the expected: {why}"
    return outputs


def _checker_passes(model: onnx.ModelProto) -> bool:
    try:
        onnx.checker.check_model(model, full_check=True)
    except Exception:
        return False
    return True


def low_precision_nodes(model: onnx.ModelProto, low: str) -> tuple[int, int]:
    """``(nodes computing in the low type, nodes)``, Casts left out, subgraphs included."""
    code = TensorProto.FLOAT16 if low == "fp16" else TensorProto.BFLOAT16
    with contextlib.suppress(Exception):
        model = onnx.shape_inference.infer_shapes(model)
    low_count = total = 0

    def visit(graph: onnx.GraphProto) -> None:
        nonlocal low_count, total
        types = {v.name: v.type for v in (*graph.input, *graph.output, *graph.value_info)}
        types.update({t.name: onnx.helper.make_tensor_type_proto(t.data_type, None) for t in graph.initializer})
        for node in graph.node:
            for attr in node.attribute:
                for sub in [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs):
                    visit(sub)
            if node.op_type == "Cast":
                continue
            total += 1
            found: set[int] = set()
            for name in (*node.input, *node.output):
                if name in types:
                    _elem_types(types[name], found)
            low_count += code in found

    visit(model.graph)
    return low_count, total


def _reference_reproduces(model: onnx.ModelProto, data_sets: list[tuple[dict[str, Any], list[Any]]]) -> bool:
    """Whether onnx.reference runs the FP32 ``model`` and gives the test's expected outputs."""
    try:
        for feeds, expected in data_sets:
            outputs = run_reference(model, feeds)
            if len(outputs) != len(expected) or any(compare(o, x, None, 1e-3) for o, x in zip(outputs, expected)):
                return False
    except Exception:
        return False
    return True


def judge(
    original: onnx.ModelProto,
    converted: onnx.ModelProto,
    data_sets: list[tuple[dict[str, Any], list[Any]]],
    low: str,
    fp32_outputs: list[list[Any]],
    judge_with: str = "ort",
) -> tuple[str, str, str]:
    """``(verdict, detail, runtime)`` of a converted model; ``judge_with="reference"`` takes the outputs of
    ``onnx.reference`` (true per-op rounding: ORT's CPU provider runs FP16 ops it has no kernel for in FP32)
    once ORT has loaded the model, for the tests whose FP32 model onnx.reference reproduces."""
    try:
        onnx.checker.check_model(converted, full_check=True)
    except Exception as e:
        if _checker_passes(original):  # else ONNX rejects the test model itself (MVN-13): ORT judges alone
            return "invalid", f"onnx.checker: {_first_line(e)}", ""
    if _io_types(converted) != _io_types(original):
        return "invalid", f"I/O changed: {_io_types(converted)} != {_io_types(original)}", ""
    tol = TOL_ULPS * EPS[low]
    runtime = "ort"
    try:
        outputs = [run_ort(converted, feeds) for feeds, _ in data_sets]
    except KernelGap:
        runtime = "reference"
    except RuntimeError as e:
        if "ORT rejects" in str(e):
            return "invalid", _first_line(e), runtime
        return "wrong", f"ORT run fails: {_first_line(e)}", runtime
    except Exception as e:
        return "wrong", f"ORT run fails: {_first_line(e)}", runtime
    if runtime == "reference" or (judge_with == "reference" and _reference_reproduces(original, data_sets)):
        # Where ORT ran the converted model, onnx.reference judges only the tests whose FP32 model it reproduces
        # (it cannot run Det in FP16, Scan-8, some optionals): those stay judged by ORT.
        try:
            by_reference = [run_reference(converted, feeds) for feeds, _ in data_sets]
        except Exception as e:
            if runtime == "reference":  # ORT has no kernel either: nothing runs the model
                return "wrong", f"onnx.reference run fails: {type(e).__name__}: {_first_line(e)}", runtime
            by_reference = None  # an onnx.reference gap (Det in FP16): ORT's outputs stand
        if by_reference is not None:
            runtime, outputs = "reference", by_reference
            with contextlib.suppress(Exception):  # else ORT's FP32 outputs stand in
                fp32_outputs = [run_reference(original, feeds) for feeds, _ in data_sets]
    for k, ((_, expected), outs, fp32) in enumerate(zip(data_sets, outputs, fp32_outputs)):
        if len(outs) != len(expected):
            return "wrong", f"{len(outs)} outputs, expected {len(expected)}", runtime
        for i, (c, x, f) in enumerate(zip(outs, expected, fp32)):
            why = compare(c, x, f, tol, f"set {k} output {i}")
            if why:
                return "wrong", why, runtime
    return "ok", "", runtime


# --------------------------------------------------------------------------------------------------
# The tools


class Refusal(Exception):
    """The tool refused the model with its user-facing error."""


class _Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        with contextlib.suppress(Exception):
            self.lines.append(f"{record.levelname} {record.getMessage()}"[:300])


def convert(tool: str, model_path: Path, low: str, calibration: dict[str, Any] | None) -> onnx.ModelProto:
    """Converts with ``keep_io_types=True`` and defaults.

    Raises:
        Refusal: onnxprec's user-facing error (ModelOpt has none: its exceptions count as crashes).
    """
    if tool == "onnxprec":
        from onnxprec.autocast import convert_to_mixed_precision
        from onnxprec.errors import OnnxprecError

        try:
            return convert_to_mixed_precision(
                str(model_path), low_precision_type=low, keep_io_types=True, calibration_data=calibration
            )
        except OnnxprecError as e:
            raise Refusal(f"{type(e).__name__}: {_first_line(e, 400)}") from e
    if tool == "modelopt":
        from modelopt.onnx.autocast import convert_to_mixed_precision as modelopt_convert

        return modelopt_convert(
            onnx_path=str(model_path), low_precision_type=low, keep_io_types=True, calibration_data=calibration
        )
    raise ValueError(f"unknown tool {tool}")


def run_case(
    case: Path, tool: str, low: str, calibration: str, keep: Path | None = None, judge_with: str = "ort"
) -> CaseResult:
    """Converts and judges one case (in this process)."""
    start = time.perf_counter()
    result = CaseResult(case.name, "crash")
    capture = _Capture()
    logging.getLogger().addHandler(capture)
    try:
        model_path = case / "model.onnx"
        original = onnx.load(str(model_path))
        data_sets = load_data_sets(case, original)
        base = baseline(original, data_sets)
        if isinstance(base, str):
            result.verdict, result.detail = "baseline fails", base
            return result
        fp32_outputs = base
        feeds = dict(data_sets[0][0]) if calibration == "own" and data_sets else None
        try:
            converted = convert(tool, model_path, low, feeds)
        except Refusal as e:
            result.verdict, result.detail = "refused", str(e)
            return result
        except Exception as e:
            where = traceback.extract_tb(e.__traceback__)[-1]
            result.verdict = "crash"
            result.detail = f"{type(e).__name__}: {_first_line(e)} [{Path(where.filename).name}:{where.lineno}]"
            return result
        result.verdict, result.detail, result.runtime = judge(
            original, converted, data_sets, low, fp32_outputs, judge_with
        )
        result.low_nodes, result.nodes = low_precision_nodes(converted, low)
        if keep is not None and result.verdict != "ok":
            keep.mkdir(parents=True, exist_ok=True)
            onnx.save(converted, str(keep / f"{case.name}.{low}.onnx"))
    except Exception as e:
        result.verdict, result.detail = "crash", f"sweep: {type(e).__name__}: {_first_line(e)}"
    finally:
        logging.getLogger().removeHandler(capture)
        result.warnings = capture.lines[:10]
        result.seconds = round(time.perf_counter() - start, 3)
    return result


# --------------------------------------------------------------------------------------------------
# Worker processes with a per-case timeout


def _serve(args: argparse.Namespace) -> int:
    """Worker loop: one case folder per stdin line, one JSON result per line on the protocol fd."""
    protocol = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # what the tools print goes to the worker's log, not into the protocol
    sys.stdout = sys.stderr
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    import warnings

    warnings.simplefilter("ignore")
    keep = Path(args.keep) if args.keep else None
    for line in sys.stdin:
        case = Path(line.strip())
        result = run_case(case, args.tool, args.low, args.calibration, keep, args.judge)
        protocol.write(json.dumps(asdict(result)) + "\n")
    return 0


@dataclass
class _Worker:
    process: subprocess.Popen[str]
    case: Path | None = None
    started: float = 0.0
    buffer: str = ""


def _python_for(tool: str, python: str | None) -> str:
    if python:
        return python
    if tool == "modelopt":
        from zoo.anchors_env import ANCHOR_VENV

        return str(ANCHOR_VENV / "bin" / "python")
    return sys.executable


def sweep(
    cases: Sequence[Path],
    *,
    tool: str = "onnxprec",
    low: str = "fp16",
    calibration: str = "random",
    jobs: int = 2,
    timeout: float = 180.0,
    python: str | None = None,
    keep: Path | None = None,
    log_dir: Path | None = None,
    progress: bool = True,
    judge_with: str = "ort",
) -> list[CaseResult]:
    """Runs every case in a pool of ``jobs`` worker processes; a case past ``timeout`` seconds kills its worker."""
    command = [_python_for(tool, python), "-m", "experiments.node_sweep", "--serve", "--tool", tool, "--low", low]
    command += ["--calibration", calibration, "--judge", judge_with] + (["--keep", str(keep)] if keep else [])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])))
    env.setdefault("OMP_NUM_THREADS", "1")
    log_dir = log_dir or Path(tempfile.mkdtemp(prefix="node-sweep-logs-"))
    pending = collections.deque(cases)
    results: list[CaseResult] = []
    selector = selectors.DefaultSelector()
    spawned = 0

    def spawn() -> _Worker:
        nonlocal spawned
        spawned += 1
        log = open(log_dir / f"worker-{spawned}.log", "w")  # noqa: SIM115 (closed with the process)
        process = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True, cwd=REPO_ROOT, env=env
        )
        log.close()
        worker = _Worker(process)
        selector.register(process.stdout, selectors.EVENT_READ, worker)  # type: ignore[arg-type]
        return worker

    def assign(worker: _Worker) -> None:
        if not pending:
            worker.case = None
            assert worker.process.stdin is not None
            worker.process.stdin.close()
            return
        worker.case = pending.popleft()
        worker.started = time.perf_counter()
        assert worker.process.stdin is not None
        worker.process.stdin.write(f"{worker.case}\n")
        worker.process.stdin.flush()

    def retire(worker: _Worker, verdict: str, detail: str) -> None:
        assert worker.case is not None
        results.append(
            CaseResult(worker.case.name, verdict, detail, seconds=round(time.perf_counter() - worker.started, 3))
        )
        selector.unregister(worker.process.stdout)  # type: ignore[arg-type]
        with contextlib.suppress(OSError):
            worker.process.kill()
        worker.process.wait()
        report(results[-1])

    total = len(cases)

    def report(result: CaseResult) -> None:
        if progress:
            mark = "" if result.verdict == "ok" else f"  {result.detail[:150]}"
            print(f"[{len(results)}/{total}] {result.case}: {result.verdict}{mark}", file=sys.stderr, flush=True)

    workers = [spawn() for _ in range(max(1, min(jobs, total)))]
    for worker in workers:
        assign(worker)
    active = [w for w in workers if w.case is not None]
    while active:
        now = time.perf_counter()
        wait = max(0.05, min(timeout - (now - w.started) for w in active))
        for key, _ in selector.select(timeout=wait):
            worker = key.data
            chunk = os.read(worker.process.stdout.fileno(), 1 << 16).decode()
            if not chunk:  # the worker died
                code = worker.process.wait()
                if worker.case is not None:
                    retire(worker, "crash", f"worker process died (exit code {code})")
                    replacement = spawn()
                    active[active.index(worker)] = replacement
                    assign(replacement)
                continue
            worker.buffer += chunk
            while "\n" in worker.buffer:
                line, worker.buffer = worker.buffer.split("\n", 1)
                results.append(CaseResult(**json.loads(line)))
                report(results[-1])
                assign(worker)
        for i, worker in enumerate(list(active)):
            if worker.case is None:
                continue
            if time.perf_counter() - worker.started > timeout:
                retire(worker, "crash", f"timeout after {timeout:g} s")
                replacement = spawn()
                active[i] = replacement
                assign(replacement)
        active = [w for w in active if w.case is not None]
    for worker in workers:
        with contextlib.suppress(Exception):
            worker.process.wait(timeout=10)
    order = {case.name: i for i, case in enumerate(cases)}
    return sorted(results, key=lambda r: order.get(r.case, 0))


# --------------------------------------------------------------------------------------------------
# The table


def cause(detail: str) -> str:
    """A message with names and numbers masked, so that refusals of the same kind group together."""
    text = re.sub(r"'[^']*'", "'…'", detail)
    text = re.sub(r"\[[^\]]*\]", "[…]", text)
    text = re.sub(r"\b\d+(\.\d+)?(e[-+]?\d+)?\b", "N", text)
    return text[:140]


def table(results: Sequence[CaseResult], title: str, *, examples: int = 2, causes: int = 12) -> str:
    """A Markdown table of verdicts, then the causes of each failing verdict with example tests."""
    counted = [r for r in results if r.verdict != "baseline fails"]
    n = len(counted)
    by_verdict = collections.Counter(r.verdict for r in results)
    lines = [f"**{title}**: {by_verdict['ok']}/{n} ok ({100.0 * by_verdict['ok'] / max(n, 1):.1f}%)", ""]
    lines += ["| verdict | cases |", "| --- | ---: |"]
    lines += [f"| {v} | {by_verdict[v]} |" for v in VERDICTS if by_verdict[v] or v == "ok"]
    some_low = sum(1 for r in results if r.verdict == "ok" and r.low_nodes)
    low = sum(r.low_nodes for r in results if r.verdict == "ok")
    total = sum(r.nodes for r in results if r.verdict == "ok")
    lines.append(
        f"| (ok with a node in low precision / low-precision nodes of ok cases) | {some_low} / {low} of {total} |"
    )
    for verdict in VERDICTS[1:]:
        group = [r for r in results if r.verdict == verdict]
        if not group:
            continue
        grouped: dict[str, list[str]] = collections.defaultdict(list)
        for r in group:
            key = "outside tolerance" if verdict == "wrong" and "tolerance" in r.detail else cause(r.detail)
            grouped[key].append(r.case)
        lines += ["", f"{verdict} ({len(group)}):", "", "| cases | cause | examples |", "| ---: | --- | --- |"]
        ordered = sorted(grouped.items(), key=lambda kv: -len(kv[1]))
        for text, names in ordered[:causes]:
            shown = ", ".join(f"`{x}`" for x in names[:examples])
            lines.append(f"| {len(names)} | {text.replace('|', '/')} | {shown} |")
        rest = sum(len(v) for _, v in ordered[causes:])
        if rest:
            lines.append(f"| {rest} | ({len(ordered) - causes} other causes) | |")
    return "\n".join(lines)


def compare_runs(paths: Sequence[str]) -> str:
    """A Markdown table of several ``--json`` results side by side: verdict counts per run."""
    runs = [json.loads(Path(p).read_text()) for p in paths]
    heads = []
    for run in runs:
        label = f"{run['tool']} {run['low']} {run['calibration']}" + (
            " (onnx.reference)" if run.get("judge") == "reference" else ""
        )
        heads.append(label)
    lines = ["| | " + " | ".join(heads) + " |", "| --- |" + " ---: |" * len(runs)]
    for verdict in VERDICTS:
        counts = [sum(1 for c in run["cases"] if c["verdict"] == verdict) for run in runs]
        lines.append(f"| {verdict} | " + " | ".join(str(n) for n in counts) + " |")
    judged = [sum(1 for c in run["cases"] if c["verdict"] != "baseline fails") for run in runs]
    lines.append("| FP32 cases | " + " | ".join(str(n) for n in judged) + " |")
    some = [sum(1 for c in run["cases"] if c["verdict"] == "ok" and c.get("low_nodes")) for run in runs]
    lines.append("| ok with a node in low precision | " + " | ".join(str(n) for n in some) + " |")
    lines.append("| wall time (2 jobs) | " + " | ".join(f"{run['seconds']:.0f} s" for run in runs) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiments.node_sweep", description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=None, help="node-test folder (default: $ONNXPREC_NODE_TESTS, onnx's, the cache)")
    ap.add_argument("--low", choices=("fp16", "bf16"), default="fp16")
    ap.add_argument("--calibration", choices=("random", "own"), default="random")
    ap.add_argument("--tool", choices=("onnxprec", "modelopt"), default="onnxprec")
    ap.add_argument(
        "--judge",
        choices=("ort", "reference"),
        default="ort",
        help="runtime whose outputs are judged (reference: onnx.reference, true FP16 rounding of every op)",
    )
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=180.0, help="seconds per case before its worker is killed")
    ap.add_argument(
        "--python", default=None, help="interpreter of the workers (default: this one; modelopt: anchors venv)"
    )
    ap.add_argument("--json", default=None, help="write every case's verdict and the summary here")
    ap.add_argument("--cases", nargs="*", default=(), help="only tests whose name contains one of these (or globs)")
    ap.add_argument("--keep", default=None, help="save converted models that are not ok into this folder")
    ap.add_argument(
        "--compare", nargs="+", metavar="JSON", help="print the verdict counts of --json results side by side"
    )
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.serve:
        return _serve(args)
    if args.compare:
        print(compare_runs(args.compare))
        return 0
    root = data_dir(args.data)
    if root is None:
        print(
            "error: no ONNX node-test data: pass --data DIR (see `python -m experiments.node_sweep --help` for "
            "how to unpack it from the onnx 1.21.0 wheel)",
            file=sys.stderr,
        )
        return 2
    cases = list_cases(root, args.cases)
    start = time.perf_counter()
    results = sweep(
        cases,
        tool=args.tool,
        low=args.low,
        calibration=args.calibration,
        jobs=args.jobs,
        timeout=args.timeout,
        python=args.python,
        keep=Path(args.keep) if args.keep else None,
        judge_with=args.judge,
    )
    seconds = time.perf_counter() - start
    title = f"{args.tool} {args.low}, calibration {args.calibration}" + (
        ", judged by onnx.reference" if args.judge == "reference" else ""
    )
    text = table(results, title)
    print(text)
    print(f"\n{len(cases)} cases in {seconds:.0f} s with {args.jobs} jobs")
    if args.json:
        summary = collections.Counter(r.verdict for r in results)
        payload = {
            "date": dt.datetime.now().isoformat(timespec="seconds"),
            "command": " ".join(["python -m experiments.node_sweep", *(argv if argv is not None else sys.argv[1:])]),
            "tool": args.tool,
            "low": args.low,
            "calibration": args.calibration,
            "judge": args.judge,
            "data": str(root),
            "seconds": round(seconds, 1),
            "jobs": args.jobs,
            "summary": dict(summary),
            "cases": [asdict(r) for r in results],
        }
        Path(args.json).write_text(json.dumps(payload, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
