"""Pre-processing for quantization: ONNX Runtime's ``quant_pre_process`` steps, at any model size.

The pipeline, one step per function, each logging what it changed::

    load (weights mapped) -> upgrade opset (ORT's opset <= 10 rule, or --opset, verified by running)
      -> symbolic shape inference -> ONNX Runtime basic optimization -> ONNX shape inference -> save

Where ONNX Runtime's own ``quant_pre_process`` fails, this one does not:

- Shape inference (symbolic and ONNX) runs on the graph structure with the large weights declared as inputs
  (:func:`onnxprec._protobuf.structure_proto`): no weight is read or copied, so size does not matter.
- The optimizer gets the weights by file reference and writes its result with external initializers in a
  temporary folder beside the output, so a model above 2 GB is optimized and saved like any other.
- Symbolic shape inference is "prone to fail" (unknown contrib ops, some transformer graphs): the shapes it
  found are kept, a warning names the node where it stopped, and ONNX shape inference continues. It never
  leaves ``sym_shape_infer_temp.onnx`` in the working folder.
- The input model and its data files are never overwritten; the output is written atomically.

Its public names are listed once, in ``onnxprec.preprocess.__all__``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir

from onnxprec import _ort, _report, metrics
from onnxprec._graph import FileNames, all_graphs
from onnxprec._io import (
    ModelSource,
    atomic_path,
    check_output_path,
    exceeds_protobuf_limit,
    load_model,
    save_model,
    sibling_path,
)
from onnxprec._ops import default_opset, normalized_domain, opsets_by_domain
from onnxprec._options import fields_in
from onnxprec._protobuf import proto_graphs, structure_proto
from onnxprec._report import SUMMARY
from onnxprec._tool import FileRun, ModelTool
from onnxprec.calibration_data import CalibrationArgs, CalibrationData
from onnxprec.errors import CalibrationDataError, InvalidArgumentError, OnnxprecError, UnsupportedModelError
from onnxprec.passes import UpgradeOpsetPass
from onnxprec.preprocess._options import PreprocessOptions
from onnxprec.preprocess.report import PreprocessReport, StepReport, measured_step
from onnxprec.validate import task_check

logger = logging.getLogger(__name__)

# Protobuf cannot serialize a message above 2 GiB: above this many weight bytes the output gets external data.
# Opset conversions must keep every float output within this relative L2 error on random inputs.
_OPSET_RTOL = 1e-4
# Metadata ONNX Runtime's quantizer looks for (``model_has_pre_process_metadata``).
_METADATA = ("onnx.quant.pre_process", "onnxruntime.quant")


# --------------------------------------------------------------------------------------------------
# Shapes inferred on the weight-stripped structure, copied back by name


def _value_infos(graph: onnx.GraphProto) -> Iterator[onnx.ValueInfoProto]:
    """Every value_info, input and output of a graph and its subgraphs."""
    for g in proto_graphs(graph):
        yield from g.input
        yield from g.value_info
        yield from g.output


def _merge_shapes(model: ir.Model, proto: onnx.ModelProto) -> None:
    """Copies the types and shapes of ``proto`` (the inferred structure of ``model``) onto its values by name.

    Cheaper than deserializing the inferred model again, and the weights are never touched.
    """
    values: dict[str, ir.Value] = {}
    for graph in all_graphs(model.graph):
        outputs = [out for node in graph for out in node.outputs]
        for value in [*graph.inputs, *outputs]:
            if value.name and not value.is_initializer():
                values.setdefault(str(value.name), value)
    for info in _value_infos(proto.graph):
        target = values.get(info.name)
        if target is None or not info.type.HasField("tensor_type") or not info.type.tensor_type.elem_type:
            continue
        shape = ir.serde.deserialize_type_proto_for_shape(info.type)
        if shape is not None:
            target.shape = shape
        if target.type is None:
            target.type = ir.serde.deserialize_type_proto_for_type(info.type)


# --------------------------------------------------------------------------------------------------
# Steps


def _random_outputs(model: ir.Model, providers: list[str]) -> tuple[dict[str, np.ndarray], list[np.ndarray]]:
    """Realistic random inputs the model runs on, and its outputs on them (retries other dynamic sizes)."""

    def run(batches: CalibrationData) -> tuple[dict[str, np.ndarray], list[np.ndarray]]:
        feeds = batches.first
        session = _ort.create_session(model, providers=providers, optimization="none", low_memory=True)
        try:
            return feeds, [np.asarray(out) for out in session.run(feeds)]
        except Exception as e:  # ONNX Runtime's own exception types: try other sizes
            raise CalibrationDataError(_ort.first_line(e)) from None

    return CalibrationArgs().run(model, run)


def _check_same_outputs(
    expected: list[np.ndarray], got: list[np.ndarray], names: list[str], before: int, after: int, fix: str
) -> None:
    for name, ref, out in zip(names, expected, got):
        if ref.shape != out.shape:
            raise UnsupportedModelError(
                f"The opset {before} -> {after} conversion changed the shape of output '{name}' "
                f"({list(ref.shape)} -> {list(out.shape)}) on random inputs: {fix}."
            )
        if np.issubdtype(ref.dtype, np.floating) or ref.dtype.kind == "V":
            stats = metrics.ErrorStats()
            stats.update(ref, out)
            ref_nonfinite = int((~np.isfinite(ref.astype(np.float64))).sum())
            if stats.rel_l2 > _OPSET_RTOL or stats.nonfinite != ref_nonfinite:
                raise UnsupportedModelError(
                    f"The opset {before} -> {after} conversion changed output '{name}' on random inputs "
                    f"(relative L2 error {stats.rel_l2:.2e} > {_OPSET_RTOL:g}, {stats.nonfinite} non-finite values "
                    f"instead of {ref_nonfinite}): {fix}."
                )
        elif not np.array_equal(ref, out):
            raise UnsupportedModelError(
                f"The opset {before} -> {after} conversion changed output '{name}' on random inputs: {fix}."
            )


def _resize_outputs(model: ir.Model) -> set[str]:
    """Output names of Upsample and Resize nodes (all graphs) of a model at opset <= 10."""
    return {
        str(node.outputs[0].name)
        for node in model.graph.all_nodes()
        if node.op_type in ("Upsample", "Resize") and not node.domain and node.outputs
    }


def _keep_resize_semantics(model: ir.Model, names: set[str]) -> int:
    """Gives Resize nodes made from opset <= 10 Upsample/Resize their old semantics.

    The ONNX version converter leaves Resize-11's defaults (half_pixel, round_prefer_floor), which move the
    sampled pixels for non-integer scales; Upsample and Resize-10 sample at ``floor(out / scale)``
    (asymmetric coordinates, floor). ONNX Runtime's ``ReplaceUpsampleWithResize`` has the same defect.
    """
    fixed = 0
    for node in model.graph.all_nodes():
        if node.op_type == "Resize" and node.outputs and node.outputs[0].name in names:
            node.attributes["coordinate_transformation_mode"] = ir.AttrString(
                "coordinate_transformation_mode", "asymmetric"
            )
            node.attributes["nearest_mode"] = ir.AttrString("nearest_mode", "floor")
            fixed += 1
    return fixed


def _upgrade_opset(model: ir.Model, options: PreprocessOptions, step: StepReport) -> None:
    """ORT's rule (opset <= 10 is converted to 11, Upsample becomes Resize) and ``--opset``, verified by running.

    The model is run before and after on the same random inputs; outputs must agree within 1e-4 relative L2.
    Without ``--opset`` (the automatic opset <= 10 step), a model that does not run on random inputs is
    converted unverified, with a warning.
    """
    current = default_opset(model)
    old = current <= 10 and "" in opsets_by_domain(model)  # as ORT: only models that import the default domain
    target = max(options.opset or 0, 11 if old else 0)
    if target <= current:
        step.skipped = f"the model is at opset {current}" + (
            f", not below --opset {options.opset}" if options.opset is not None else ""
        )
        return
    resize = _resize_outputs(model) if old else set()
    feeds, expected = _outputs_before_upgrade(model, options, step, current, target)
    UpgradeOpsetPass(target)(model)
    if resize:
        logger.info(
            "%d Upsample/Resize nodes keep their opset-%d sampling (asymmetric, floor)",
            _keep_resize_semantics(model, resize),
            current,
        )
    if feeds:
        _verify_upgrade(model, options, feeds, expected, current, target, old)


def _outputs_before_upgrade(
    model: ir.Model, options: PreprocessOptions, step: StepReport, current: int, target: int
) -> tuple[dict[str, np.ndarray], list[np.ndarray]]:
    """Random feeds and the model's outputs on them before the upgrade; none (with a warning) when the model does
    not run on random inputs and the upgrade is ORT's automatic one (an explicit ``--opset`` raises instead)."""
    try:
        return _random_outputs(model, list(options.providers))
    except CalibrationDataError as error:
        e = error.__cause__ or error  # the run's own failure, not advice about flags this tool lacks
        if options.opset is not None:
            raise UnsupportedModelError(
                f"Cannot verify the opset {current} -> {target} conversion: the model does not run on random "
                f"inputs ({e}); upgrade it yourself with onnx.version_converter and check the result."
            ) from None
        step.warn(
            f"The opset {current} -> {target} conversion is not verified: the model does not run on "
            f"random inputs ({e}).",
        )
        return {}, []


def _verify_upgrade(
    model: ir.Model,
    options: PreprocessOptions,
    feeds: dict[str, np.ndarray],
    expected: list[np.ndarray],
    current: int,
    target: int,
    old: bool,
) -> None:
    """Runs the upgraded model on the same feeds; its outputs must agree with ``expected`` within the tolerance."""
    session = _ort.create_session(
        model, providers=list(options.providers), optimization="none", low_memory=True, what="the upgraded model"
    )
    try:
        got = [np.asarray(out) for out in session.run(feeds)]
    except Exception as e:
        raise UnsupportedModelError(
            f"ONNX Runtime cannot run the model converted to opset {target} ({_ort.first_line(e)}): upgrade it "
            "yourself with onnx.version_converter and check the result."
        ) from None
    fix = "the ONNX version converter mis-converted an op: convert the model yourself and check the result" + (
        f", or omit --opset to keep opset {current}" if not old else ""
    )
    _check_same_outputs(expected, got, session.output_names, current, target, fix)
    logger.info(
        "Opset %d -> %d: outputs agree within %g relative L2 on random inputs %s",
        current,
        target,
        _OPSET_RTOL,
        {k: list(v.shape) for k, v in feeds.items()},
    )


def _first_unknown_node(proto: onnx.ModelProto) -> str:
    """The first main-graph node one of whose outputs has no inferred type (where symbolic inference stopped)."""
    infos = (*proto.graph.value_info, *proto.graph.input, *proto.graph.output)
    known = {vi.name for vi in infos if vi.type.tensor_type.HasField("shape")}
    known |= {t.name for t in proto.graph.initializer}
    for node in proto.graph.node:
        if any(name and name not in known for name in node.output):
            domain = f"{node.domain}." if node.domain and node.domain != "ai.onnx" else ""
            return f"node '{node.name or node.output[0]}' ({domain}{node.op_type})"
    return "an unknown node"


def _symbolic_shapes(model: ir.Model, options: PreprocessOptions, step: StepReport) -> ir.Model:
    """ONNX Runtime's symbolic shape inference on the weight-stripped graph; never fatal."""
    if default_opset(model) < 7:
        step.skipped = "symbolic shape inference needs opset 7 or newer"
        return model
    try:
        from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference
    except ImportError as e:
        step.skipped = f"it needs sympy and onnxruntime ({e}); pip install sympy"
        step.warn(f"Symbolic shape inference skipped: {step.skipped}.")
        return model
    stripped = structure_proto(model)  # weights above 1 KiB become graph inputs: nothing is read
    inference = SymbolicShapeInference(options.int_max, options.auto_merge, options.guess_output_rank, options.verbose)
    # The loop of SymbolicShapeInference.infer_shapes, which on an incomplete result writes
    # sym_shape_infer_temp.onnx into the working folder and raises, losing what it inferred.
    complete = False
    try:
        inference._preprocess(stripped)
        while inference.run_:
            complete = inference._infer_impl()
        inference._update_output_from_vi()
        result: onnx.ModelProto = inference.out_mp_
    except Exception as e:  # ORT raises anything from its handlers (AssertionError, KeyError, sympy errors)
        why = f"{type(e).__name__}: {_ort.first_line(e, 200)}"
        step.skipped = f"it failed: {why}"
        step.warn(f"Symbolic shape inference failed ({why}); continuing with ONNX shape inference.")
        return model
    if not complete:
        step.warn(
            f"Symbolic shape inference is incomplete: it stopped at {_first_unknown_node(result)}; the shapes it "
            "found are kept and ONNX shape inference continues.",
        )
    _merge_shapes(model, result)
    return model


def _used_domains(model: ir.Model) -> set[str]:
    domains = {normalized_domain(node.domain) for node in model.graph.all_nodes()}
    for function in model.functions.values():
        domains.add(normalized_domain(function.domain))
        domains |= {normalized_domain(node.domain) for node in function}
    return domains


def _optimize(model: ir.Model, folder: Path, step: StepReport) -> ir.Model:
    """ONNX Runtime's basic-level optimizer; its result is written with external initializers to ``folder``."""
    optimized = folder / "optimized.onnx"
    domains = set(model.opset_imports)
    try:
        # low memory: no pre-packed copies of the weights; external initializers: the optimized model can exceed
        # 2 GB (ORT's own quant_pre_process fails there)
        session = _ort.create_session(
            model, optimization="basic", low_memory=True, optimized_model_path=optimized, what="the model"
        )
        del session
    except UnsupportedModelError as e:
        step.skipped = _ort.first_line(e, 240)  # "ONNX Runtime cannot load the model: <its first line>"
        step.warn(f"Graph optimization skipped: {step.skipped}.")
        return model
    result = load_model(optimized)
    # ORT declares every domain it knows (ai.onnx.ml, com.microsoft.nchwc, ...): keep only those in use.
    used = _used_domains(result)
    for domain in list(result.opset_imports):
        if normalized_domain(domain) not in used and domain not in domains:
            del result.opset_imports[domain]
    return result


def _onnx_shapes(model: ir.Model, step: StepReport) -> ir.Model:
    """ONNX shape inference on the weight-stripped graph (as ``infer_shapes_path`` does, at any size)."""
    try:
        inferred = onnx.shape_inference.infer_shapes(structure_proto(model))
    except Exception as e:  # onnx raises InferenceError, ValidationError or RuntimeError
        step.skipped = f"it failed: {_ort.first_line(e, 200)}"
        step.warn(f"ONNX shape inference {step.skipped}; the model is saved with the shapes known so far.")
        return model
    _merge_shapes(model, inferred)
    return model


# --------------------------------------------------------------------------------------------------
# Saving


def _save(model: ir.Model, output: Path, options: PreprocessOptions, protected: set[Path]) -> bool:
    """Saves atomically; returns whether weights went to external data.

    ``save_as_external_data`` with ``all_tensors_to_one_file`` writes one file (``external_data_location``,
    default ``<output name>.data``); without it one file per tensor, named after the tensor, as ONNX does.
    Above 2 GB of weights the output gets one external data file even when not asked for.
    """
    external = options.save_as_external_data
    one_file = options.all_tensors_to_one_file or not external
    if not external and exceeds_protobuf_limit(model):
        external = True
        logger.warning(
            "The weights exceed the 2 GB protobuf limit: saving them as external data in '%s' "
            "(--save_as_external_data --all_tensors_to_one_file).",
            options.external_data_location or output.name + ".data",
        )
    if not external:
        save_model(model, output, external_data=False, protected=protected)
        return False
    threshold = options.external_data_size_threshold
    if one_file:
        location = options.external_data_location or output.name + ".data"
        check_output_path(output.parent / location, protected, flag="--external_data_location", data_file=False)
        save_model(
            model, output, external_data=True, protected=protected, data_location=location, size_threshold=threshold
        )
        return True
    written: list[Path] = []
    try:
        file_name = FileNames()
        for graph in all_graphs(model.graph):
            for value in graph.initializers.values():
                tensor = value.const_value
                if tensor is None:
                    continue
                if tensor.nbytes > threshold and tensor.dtype != ir.DataType.STRING:
                    name = file_name(str(value.name))
                    path = output.parent / name
                    check_output_path(path, protected, flag="--output", data_file=False)
                    value.const_value = ir.external_data.convert_tensors_to_external(
                        [tensor], base_dir=output.parent, relative_path=name
                    )[0]
                    written.append(path)
                elif isinstance(tensor, ir.ExternalTensor):  # small, mapped from a temporary file: embed
                    value.const_value = ir.Tensor(tensor.numpy().copy(), dtype=tensor.dtype, name=value.name)
        with atomic_path(output) as tmp:
            ir.save(model, tmp)
    except BaseException:
        for path in written:
            with contextlib.suppress(OSError):
                os.remove(path)
        raise
    return True


# --------------------------------------------------------------------------------------------------
# Public API


def default_output_path(input_model_path: str | os.PathLike) -> Path:
    """``<name>.pre.onnx`` beside the input."""
    return sibling_path(input_model_path, ".pre")


def _opset(model: ir.Model, options: PreprocessOptions, step: StepReport, folder: Path) -> ir.Model:
    _upgrade_opset(model, options, step)
    return model


def _symbolic(model: ir.Model, options: PreprocessOptions, step: StepReport, folder: Path) -> ir.Model:
    return _symbolic_shapes(model, options, step)


def _optimized(model: ir.Model, options: PreprocessOptions, step: StepReport, folder: Path) -> ir.Model:
    return _optimize(model, folder, step)


def _onnx_shaped(model: ir.Model, options: PreprocessOptions, step: StepReport, folder: Path) -> ir.Model:
    return _onnx_shapes(model, step)


STEPS: tuple[tuple[str, str | None, Callable[[ir.Model, PreprocessOptions, StepReport, Path], ir.Model]], ...] = (
    ("opset", None, _opset),
    ("symbolic shape inference", "skip_symbolic_shape", _symbolic),
    ("ONNX Runtime optimization (basic)", "skip_optimization", _optimized),
    ("ONNX shape inference", "skip_onnx_shape", _onnx_shaped),
)
"""Pre-processing's pipeline: (name in the report, the option that skips it, the step), in order."""


def _write(run: FileRun[PreprocessOptions]) -> tuple[ir.Model, PreprocessReport]:
    """Loads the model, runs :data:`STEPS` (each measured by :func:`_step`) and saves the result."""
    options = run.options
    report = PreprocessReport(input_path=run.source_path, output_path=run.output)
    holder = [run.load()]
    if options.skip_optimization and options.skip_onnx_shape and options.skip_symbolic_shape and not options.opset:
        logger.warning("All three steps are skipped: the model is saved with pre-processing metadata only.")
    # The optimizer's output (as large as the model) is written beside the output, not to a RAM-backed /tmp.
    with tempfile.TemporaryDirectory(prefix=".onnxprec-preprocess-", dir=run.output.resolve().parent) as tmp:
        for name, skip, function in STEPS:
            with measured_step(name, report, holder) as step:
                if skip is not None and getattr(options, skip):
                    step.skipped = skip
                else:
                    holder[0] = function(holder[0], options, step, Path(tmp))
        model = holder[0]
        model.metadata_props[_METADATA[0]] = _METADATA[1]
        with _report.timed() as saving:
            report.external_data = _save(model, run.output, options, run.protected)
        logger.info(
            "Saved %s%s [%.2f s]",
            run.output,
            " with external data" if report.external_data else "",
            saving.seconds,
            extra=SUMMARY,
        )
    return model, report


def _finish(run: FileRun[PreprocessOptions], model: ir.Model, report: PreprocessReport) -> None:
    _check_result(run.source, run.output, report)
    report.seconds = run.clock.seconds


TOOL: ModelTool[PreprocessOptions, PreprocessReport] = ModelTool(
    PreprocessOptions,
    _write,
    suffix=lambda options: ".pre",
    name="preprocess",
    function="preprocess_file",
    output_flag="--output",
    finish=_finish,
)
"""Pre-processing on the tool base (:class:`onnxprec._tool.ModelTool`): ``preprocess_file``."""


def preprocess_file(
    input_model: ModelSource, output_model_path: str | os.PathLike, options: PreprocessOptions
) -> PreprocessReport:
    """Runs the steps :class:`PreprocessOptions` asks for and saves the result (see :func:`quant_pre_process`)."""
    return TOOL.run_file(input_model, output_model_path, options=options)


_CHECK_RTOL = 1e-3
"""Pre-processing only rewrites the graph: an output that moves by more than this relative L2 error is warned about."""


def _check_result(source: ModelSource, output: Path, report: PreprocessReport) -> None:
    """Runs the input and the written output on realistic random data and records each output's task metric; warns
    when an output moved (pre-processing only rewrites the graph), and when the check cannot run (a model that runs
    on no random inputs: pre-processing takes no data to fix that, and the output is written). A model given in
    memory was rewritten in place: there is nothing to compare it with."""
    if not isinstance(source, (str, os.PathLike)):
        return
    try:
        summary, _ = task_check(load_model(source), output)
    except OnnxprecError as e:
        logger.warning("Pre-processing result not checked against the input: %s", e)
        return
    report.check = {"random_data": True, "metric": summary.describe(), **summary.to_json()}
    worst = summary.worst_rel_l2
    if worst is not None and not worst <= _CHECK_RTOL:
        logger.warning("Pre-processing moved the outputs on random data: %s", summary.describe())


def quant_pre_process(
    input_model_path: ModelSource | None = None,
    output_model_path: str | os.PathLike | None = None,
    skip_optimization: bool = False,
    skip_onnx_shape: bool = False,
    skip_symbolic_shape: bool = False,
    auto_merge: bool = False,
    int_max: int = 2**31 - 1,
    guess_output_rank: bool = False,
    verbose: int = 0,
    save_as_external_data: bool = False,
    all_tensors_to_one_file: bool = False,
    external_data_location: str | None = None,
    external_data_size_threshold: int = 1024,
    *,
    input_model: ModelSource | None = None,
    opset: int | None = None,
    providers: Sequence[str] | None = None,
) -> PreprocessReport:
    """Shape inference and graph optimization before quantization: ONNX Runtime's ``quant_pre_process``.

    Same arguments, defaults and steps as ``onnxruntime.quantization.shape_inference.quant_pre_process``
    (symbolic shape inference, ONNX Runtime basic optimization, ONNX shape inference; opset <= 10 is converted
    to 11), for models of any size: above 2 GB, with contrib ops, with If/Loop subgraphs. A failing symbolic
    shape inference is a warning, not an error. Every step logs what it changed.

    Args:
        input_model_path: The model: a path, an ``onnx.ModelProto`` or an ``onnx_ir.Model`` (an ``onnx_ir.Model``
            is modified in place by an opset upgrade).
        output_model_path: Where to write the result (never the input or its data files).
        skip_optimization: Skip the ONNX Runtime graph optimization (basic level: constant folding,
            Conv+BatchNormalization and other fusions).
        skip_onnx_shape: Skip ONNX shape inference.
        skip_symbolic_shape: Skip ONNX Runtime's symbolic shape inference (best for transformers; needs sympy).
        auto_merge: Symbolic shape inference: merge symbolic dims automatically when they conflict.
        int_max: Symbolic shape inference: integers from this value on are boundless (e.g. Slice ends).
        guess_output_rank: Symbolic shape inference: unknown ops get the rank of their first input.
        verbose: Symbolic shape inference's own logs: 0 off, 1 warnings, 3 detailed.
        save_as_external_data: Save the weights as external data beside the output.
        all_tensors_to_one_file: With --save_as_external_data: all weights in one file (otherwise one file per
            tensor, as ONNX does).
        external_data_location: Name of the one external data file, relative to the output (default: <output
            name>.data).
        external_data_size_threshold: Tensors larger than this many bytes go to external data.
        opset: Upgrade the default-domain opset to this version (e.g. 21 for INT4 DequantizeLinear), verified by
            running the model before and after on the same random inputs (never lowered).
        input_model: ONNX Runtime 1.20's name of ``input_model_path`` (give one of the two).
        providers: ONNX Runtime providers for the --opset check: ``cpu``, ``cuda:N``, ``trt``, ``dml``.

    Returns:
        The report: each step's node counts, op-type changes and shapes newly known (``to_json()``).

    Raises:
        OnnxprecError: A bad argument, model or output path, or an opset upgrade that changed the outputs
            (then nothing is written); the message says how to fix it.
    """
    values = fields_in(PreprocessOptions, locals())
    if providers is None:
        del values["providers"]
    options = PreprocessOptions(**values)
    if (input_model_path is None) == (input_model is None):
        raise InvalidArgumentError("Give the model as input_model_path (or input_model), exactly once.")
    if output_model_path is None:
        raise InvalidArgumentError("output_model_path is required: where to write the pre-processed model.")
    source = input_model_path if input_model_path is not None else input_model
    assert source is not None
    return preprocess_file(source, output_model_path, options)
