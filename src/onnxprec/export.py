"""Export a PyTorch module to a checked ONNX file.

:func:`export_torch` wraps :func:`torch.onnx.export` with the checks a model handed to onnxprec should pass
before it is converted: the ONNX checker (``full_check``, which includes strict shape inference) and a numeric
comparison of ONNX Runtime's outputs with PyTorch's on the same inputs. The file is written atomically, so a
failed export never leaves a half-written or unchecked model at ``path``.

PyTorch is an optional dependency (``pip install 'onnxprec[torch]'``); it is imported only when
:func:`export_torch` is called.

The TorchScript-based exporter (``dynamo=False``) is used: it writes the requested opset directly, while the
``torch.export``-based exporter of PyTorch 2.9+ starts at opset 18 and down-converts, and fails on some
dynamic-batch models that the TorchScript exporter handles.
"""

from __future__ import annotations

import io
import logging
import os
import pathlib
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx

from onnxprec import _ort, metrics
from onnxprec._io import write_atomically

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

__all__ = ["ExportMismatchError", "export_torch"]

_BATCH_DIM_NAME = "batch"

# Messages that the TorchScript exporter of PyTorch 2.9+ prints on every call. They announce its deprecation;
# export_torch chose it on purpose (see the module docstring), so they are noise for its callers.
_EXPORTER_NOISE = (
    r".*legacy TorchScript-based ONNX export.*",
    r".*The feature will be removed.*",
)


class ExportMismatchError(RuntimeError):
    """ONNX Runtime's outputs for the exported model differ from PyTorch's beyond the tolerance."""


def _import_torch() -> Any:
    """Imports PyTorch, with an install hint when it is missing.

    Returns:
        The ``torch`` module.

    Raises:
        ImportError: PyTorch is not installed.
    """
    try:
        import torch
    except ImportError as err:  # `sys.modules["torch"] = None` also lands here.
        raise ImportError("export_torch needs PyTorch: pip install 'onnxprec[torch]'") from err
    return torch


def _as_tensor_tuple(torch_mod: Any, values: Any, what: str) -> tuple[torch.Tensor, ...]:
    """Normalises a tensor or a (nested) sequence of tensors to a flat tuple of tensors.

    Args:
        torch_mod: The ``torch`` module.
        values: A tensor, or a list or tuple of tensors (nested lists and tuples are flattened).
        what: What ``values`` are, for error messages ("example_inputs", "model outputs").

    Returns:
        The tensors, in order.

    Raises:
        TypeError: Something other than a tensor was found.
    """
    if isinstance(values, torch_mod.Tensor):
        return (values,)
    if isinstance(values, (list, tuple)):
        flat: list[torch.Tensor] = []
        for item in values:
            flat.extend(_as_tensor_tuple(torch_mod, item, what))
        return tuple(flat)
    raise TypeError(f"{what} must be a torch.Tensor or a list/tuple of them, got {type(values).__name__}")


def _default_names(prefix: str, count: int) -> list[str]:
    """Returns ``[prefix]`` for one tensor, else ``[prefix_0, prefix_1, ...]``."""
    if count == 1:
        return [prefix]
    return [f"{prefix}_{index}" for index in range(count)]


def _check_names(names: Sequence[str] | None, count: int, what: str) -> list[str]:
    """Validates user-given input or output names, or makes default ones.

    Args:
        names: The names given, or None for defaults.
        count: How many tensors there are.
        what: "input" or "output".

    Returns:
        One unique name per tensor.

    Raises:
        ValueError: Wrong number of names, or duplicates.
    """
    if names is None:
        return _default_names(what, count)
    names = list(names)
    if len(names) != count:
        raise ValueError(f"{what}_names has {len(names)} names but the model has {count} {what}s")
    if len(set(names)) != len(names):
        raise ValueError(f"{what}_names has duplicate names: {names}")
    return names


def _run_torch(torch_mod: Any, model: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> list[np.ndarray]:
    """Runs the model without gradients and returns its outputs as float-or-int numpy arrays."""
    with torch_mod.no_grad():
        outputs = _as_tensor_tuple(torch_mod, model(*inputs), "model outputs")
    return [output.detach().cpu().numpy() for output in outputs]


def _run_onnxruntime(
    session: _ort.Session, input_names: Sequence[str], inputs: tuple[torch.Tensor, ...]
) -> list[np.ndarray]:
    """Runs the exported model's ONNX Runtime session on the given tensors."""
    feeds = {name: tensor.detach().cpu().numpy() for name, tensor in zip(input_names, inputs, strict=True)}
    return session.run(feeds)


def _compare(
    expected: Sequence[np.ndarray],
    actual: Sequence[np.ndarray],
    output_names: Sequence[str],
    atol: float,
    rtol: float,
    label: str,
) -> None:
    """Checks ONNX Runtime's outputs against PyTorch's.

    Args:
        expected: PyTorch's outputs.
        actual: ONNX Runtime's outputs, in the same order.
        output_names: The outputs' names, for messages.
        atol: Absolute tolerance.
        rtol: Relative tolerance (``|a - e| <= atol + rtol * |e|`` elementwise, as in numpy.allclose).
        label: Which inputs were used, for messages.

    Raises:
        ExportMismatchError: Shapes differ, or a value is outside the tolerance.
    """
    for name, exp, act in zip(output_names, expected, actual, strict=True):
        if exp.shape != act.shape:
            raise ExportMismatchError(
                f"output '{name}' ({label}): ONNX Runtime gave shape {act.shape}, PyTorch gave {exp.shape}"
            )
        if exp.size == 0:
            continue
        max_abs_diff = metrics.max_abs(exp, act)
        if not np.allclose(act.astype(np.float64), exp.astype(np.float64), atol=atol, rtol=rtol, equal_nan=True):
            raise ExportMismatchError(
                f"output '{name}' ({label}): ONNX Runtime differs from PyTorch, "
                f"max abs diff {max_abs_diff:.3g} (atol={atol:g}, rtol={rtol:g}); "
                "the exported graph does not compute what the module does"
            )
        logger.debug("output '%s' (%s): max abs diff vs PyTorch %.3g", name, label, max_abs_diff)


def _grow_batch(torch_mod: Any, inputs: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    """Returns the inputs with one more row along dim 0 (the first row repeated), to test a dynamic batch."""
    return tuple(torch_mod.cat([tensor, tensor[:1]], dim=0) for tensor in inputs)


def export_torch(
    model: torch.nn.Module,
    example_inputs: torch.Tensor | Sequence[torch.Tensor],
    path: str | os.PathLike[str],
    opset: int = 17,
    input_names: Sequence[str] | None = None,
    output_names: Sequence[str] | None = None,
    static_batch: int | None = None,
    *,
    atol: float = 1e-4,
    rtol: float = 1e-3,
) -> pathlib.Path:
    """Exports a PyTorch module to ONNX, checks the result, and writes it atomically.

    The module is exported in eval mode (dropout off, batch norm on its running statistics); its previous
    training/eval mode is restored afterwards. Dimension 0 of every input and output is dynamic and named
    ``"batch"`` unless ``static_batch`` is given, in which case every shape is static and dimension 0 is
    ``static_batch`` (as NPU-style targets need, usually with ``static_batch=1``).

    Before anything is written the exported model must pass ``onnx.checker.check_model(full_check=True)`` and
    ONNX Runtime (CPU) must reproduce PyTorch's outputs on ``example_inputs`` within ``atol``/``rtol``; with a
    dynamic batch it must also do so for a batch one row larger, which proves the batch dimension really is
    dynamic. Models whose serialized size exceeds protobuf's 2 GB limit are not supported.

    Args:
        model: The module to export. Its ``forward`` takes the tensors of ``example_inputs`` positionally and
            returns a tensor or a tuple/list of tensors.
        example_inputs: One tensor, or a sequence of tensors, used to trace the module and to check the
            export.
        path: Where to write the ``.onnx`` file; parent folders are created.
        opset: The ONNX opset (default and recommended: 17).
        input_names: Names for the graph inputs (default ``input`` or ``input_0, input_1, ...``).
        output_names: Names for the graph outputs (default ``output`` or ``output_0, output_1, ...``).
        static_batch: Fix dimension 0 to this size and make all shapes static. The example inputs must then
            have exactly this batch size.
        atol: Absolute tolerance of the ONNX Runtime vs PyTorch check.
        rtol: Relative tolerance of the ONNX Runtime vs PyTorch check.

    Returns:
        The path written, as a :class:`pathlib.Path`.

    Raises:
        ImportError: PyTorch is not installed.
        TypeError: ``model`` is not a ``torch.nn.Module``, or the inputs or outputs are not tensors.
        ValueError: Bad names, a bad ``static_batch``, or example inputs whose batch size does not match it.
        onnx.checker.ValidationError: The exported model is not valid ONNX.
        onnxprec.errors.UnsupportedModelError: ONNX Runtime cannot load the exported model.
        ExportMismatchError: ONNX Runtime's outputs differ from PyTorch's beyond the tolerance.
    """
    torch_mod = _import_torch()
    if not isinstance(model, torch_mod.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    inputs = _as_tensor_tuple(torch_mod, example_inputs, "example_inputs")
    if not inputs:
        raise ValueError("example_inputs is empty: give at least one tensor")
    out_path = pathlib.Path(path)

    if static_batch is not None:
        if isinstance(static_batch, bool) or not isinstance(static_batch, int) or static_batch < 1:
            raise ValueError(f"static_batch must be a positive int, got {static_batch!r}")
        for index, tensor in enumerate(inputs):
            if tensor.dim() == 0 or tensor.shape[0] != static_batch:
                raise ValueError(
                    f"static_batch={static_batch} but example input {index} has shape {tuple(tensor.shape)}: "
                    f"give example inputs whose dimension 0 is {static_batch}"
                )
    elif any(tensor.dim() == 0 for tensor in inputs):
        raise ValueError("a dynamic batch needs every example input to have a dimension 0 (got a scalar)")

    was_training = model.training
    model.eval()
    try:
        expected = _run_torch(torch_mod, model, inputs)
        in_names = _check_names(input_names, len(inputs), "input")
        out_names = _check_names(output_names, len(expected), "output")
        dynamic_axes: dict[str, dict[int, str]] | None = None
        if static_batch is None:
            dynamic_axes = {name: {0: _BATCH_DIM_NAME} for name in (*in_names, *out_names)}

        buffer = io.BytesIO()
        with warnings.catch_warnings():
            for pattern in _EXPORTER_NOISE:
                warnings.filterwarnings("ignore", message=pattern)
            torch_mod.onnx.export(
                model,
                inputs,
                buffer,
                dynamo=False,
                opset_version=opset,
                input_names=in_names,
                output_names=out_names,
                dynamic_axes=dynamic_axes,
                do_constant_folding=True,
            )
        model_bytes = buffer.getvalue()

        proto = onnx.load_from_string(model_bytes)
        onnx.checker.check_model(proto, full_check=True)
        # ONNX Runtime's default optimizations: the check runs the model as its users will.
        session = _ort.create_session(model_bytes, optimization="all", what="the exported model")
        actual = _run_onnxruntime(session, in_names, inputs)
        _compare(expected, actual, out_names, atol, rtol, "example inputs")
        if static_batch is None:
            grown = _grow_batch(torch_mod, inputs)
            _compare(
                _run_torch(torch_mod, model, grown),
                _run_onnxruntime(session, in_names, grown),
                out_names,
                atol,
                rtol,
                f"batch {grown[0].shape[0]}, to check the dynamic batch",
            )
    finally:
        model.train(was_training)

    out_path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(out_path, model_bytes)
    batch_text = "dynamic batch" if static_batch is None else f"static batch {static_batch}"
    logger.info(
        "Exported %s to %s (opset %d, %s, %d bytes)",
        type(model).__name__,
        out_path,
        opset,
        batch_text,
        len(model_bytes),
    )
    return out_path
