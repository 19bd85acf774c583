"""Raise the default-domain opset to a minimum (never lowers it)."""

from __future__ import annotations

import logging

import onnx_ir as ir

from onnxprec._ops import DEFAULT_DOMAINS, default_opset, is_ort_onnx_domain_op, min_ir_version
from onnxprec.errors import UnsupportedModelError

__all__ = ["OpsetUpgradeError", "UpgradeOpsetPass"]

logger = logging.getLogger(__name__)

_ASIDE = "onnxprec.ort_onnx_domain"


class OpsetUpgradeError(UnsupportedModelError):
    """The version converter failed, or changed the graph's inputs or outputs (e.g. Scan-8's batch axis): the
    model it leaves behind is not the user's model; load it again."""


def _interface(model: ir.Model) -> list[tuple[str, str, str]]:
    """Name, type and shape of each graph input (initializers left out) and output."""
    return [(str(v.name), str(v.type), str(v.shape)) for v in _interface_values(model)]


def _interface_values(model: ir.Model) -> list[ir.Value]:
    return [v for v in model.graph.inputs if not v.is_initializer()] + list(model.graph.outputs)


def _keep_declared_shapes(model: ir.Model, declared: dict[str, tuple[str, ir.Shape | None]]) -> None:
    """Gives back each input's and output's declared shape where the conversion only refined it (a symbolic or
    unknown dim made static, or a shape added), so that the user's interface stays as it was written."""
    for value in _interface_values(model):
        if str(value.name) not in declared:
            continue
        kind, shape = declared[str(value.name)]
        if kind != str(value.type) or value.shape == shape or not _refines(value.shape, shape):
            continue
        logger.debug("Kept %s's declared shape %s (the upgrade inferred %s)", value.name, shape, value.shape)
        value.shape = None if shape is None else ir.Shape(list(shape))


def _refines(new: ir.Shape | None, old: ir.Shape | None) -> bool:
    """Whether ``new`` only says more than ``old``: the same static dims where ``old`` has them."""
    if old is None:
        return True
    if new is None or len(new) != len(old):
        return False
    return all(not isinstance(o, int) or o == n for o, n in zip(old, new))


def _imports_default_domain(model: ir.Model) -> bool:
    return bool(set(model.opset_imports) & DEFAULT_DOMAINS) or any(
        n.domain in DEFAULT_DOMAINS for n in model.graph.all_nodes()
    )


def _convert(model: ir.Model, current: int, target: int) -> None:
    """onnxscript's version converter from ``current`` to ``target`` (its fallback to the C API included), its
    warnings silenced, with ONNX Runtime's contrib ops of the ONNX domain set aside meanwhile."""
    from onnxscript import version_converter  # slow import: only when needed

    converter_logger = logging.getLogger("onnxscript.version_converter")
    level = converter_logger.level
    converter_logger.setLevel(logging.ERROR)  # it warns when it falls back to the C API: not our user's concern
    # ONNX Runtime's contrib ops of the ONNX domain are no ONNX ops: the converter would fail on them. They keep
    # their meaning at any opset (LayerNormalization became ONNX's own at 17 with the same contract), so they
    # wait in a private domain meanwhile.
    aside = [n for n in model.graph.all_nodes() if is_ort_onnx_domain_op(n.op_type, n.domain, current)]
    for node in aside:
        node.domain = _ASIDE
    if aside:
        model.opset_imports[_ASIDE] = 1
    try:
        version_converter.convert_version(model, target, fallback=True)
    except Exception as e:
        raise OpsetUpgradeError(
            f"Could not upgrade the model from opset {current} to {target} ({e}); "
            f"upgrade it yourself (onnx.version_converter) or pass --opset {current} to convert at "
            "the model's own opset."
        ) from e
    finally:
        converter_logger.setLevel(level)
        for node in model.graph.all_nodes():  # the converter's C fallback rebuilds the nodes: look them up
            if node.domain == _ASIDE:
                node.domain = ""
        model.opset_imports.pop(_ASIDE, None)


def _check_interface(
    before: list[tuple[str, str, str]], after: list[tuple[str, str, str]], current: int, target: int
) -> None:
    """Raises :class:`OpsetUpgradeError` when the conversion changed the graph's inputs or outputs."""
    if after == before:
        return
    changed = (
        next(f"{a[0]}: {a[1]} {a[2]} -> {b[1]} {b[2]}" for a, b in zip(before, after) if a != b)
        if len(after) == len(before)
        else "the number of inputs/outputs"
    )
    raise OpsetUpgradeError(
        f"Upgrading the model from opset {current} to {target} would change its inputs or outputs ({changed})"
    )


class UpgradeOpsetPass(ir.passes.InPlacePass):
    """Converts the model to ``target`` opset with onnxscript's version converter when it is lower.

    Raises :class:`OpsetUpgradeError` when the conversion fails or changes the model's inputs or outputs (the
    model is then left half converted: load it again); a declared shape the conversion only refined (a symbolic
    dim it inferred as static) is given back as declared. A model that does not use the default domain (an
    ``ai.onnx.ml``-only model) only gets the import, for the Casts a conversion may add. The IR version is kept
    unless the new opset needs a newer one (ONNX Runtime releases reject IR versions newer than they know, so we
    never raise it gratuitously).
    """

    def __init__(self, target: int) -> None:
        super().__init__()
        self.target = target

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        current = default_opset(model)
        if current >= self.target:
            return ir.passes.PassResult(model, modified=False)
        if not _imports_default_domain(model):
            # e.g. an ai.onnx.ml-only model: nothing to convert, only an import for the Casts to come
            model.opset_imports[""] = self.target
            model.ir_version = max(model.ir_version or 0, min_ir_version(self.target))
            logger.info("Added the default domain at opset %d (the model imported only other domains)", self.target)
            return ir.passes.PassResult(model, modified=True)
        before = _interface(model)
        declared = {str(v.name): (str(v.type), v.shape) for v in _interface_values(model)}
        _convert(model, current, self.target)
        reached = default_opset(model)
        if reached != self.target:
            raise OpsetUpgradeError(
                f"Could not upgrade the model from opset {current} to {self.target} (the ONNX version converter "
                f"failed); upgrade it yourself or pass --opset {current} to convert at the model's own opset."
            )
        _keep_declared_shapes(model, declared)
        _check_interface(before, _interface(model), current, self.target)
        needed = min_ir_version(self.target)
        if model.ir_version < needed:
            model.ir_version = needed
        logger.info("Upgraded opset %d -> %d", current, self.target)
        return ir.passes.PassResult(model, modified=True)
