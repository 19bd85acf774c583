"""The INT4 quantizer's options, each declared once: API keyword (ModelOpt's names), command-line flag and help.

Imports nothing heavy, so the command line can print ``--help`` without loading the pipeline.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from onnxprec._arg_groups import (
    calibration_data_option,
    genai_provider_option,
    input_shapes_option,
    log_level_option,
    regexes_option,
)
from onnxprec._array import DEFAULT_GPU_MEMORY_MB
from onnxprec._options import compile_patterns, option
from onnxprec.errors import InvalidArgumentError
from onnxprec.quantization import _tool
from onnxprec.quantization._tool import EXTRAS

if TYPE_CHECKING:
    from onnxprec.quantization.methods import QuantConfig
    from onnxprec.quantization.select import WeightGroup

__all__ = [
    "DEFAULT_BLOCK_SIZE", "DEFAULT_EXCLUDE", "LLM_BLOCK_SIZE", "METHOD_NAMES", "NO_DATA_LARGE_LLM_METHOD",
    "NO_DATA_LLM_METHOD", "OUTPUT_FORMATS", "Int4Options", "Int4Plan",
]  # fmt: skip

DEFAULT_BLOCK_SIZE = 128
LLM_BLOCK_SIZE = 32
"""An LLM's default block size (:meth:`Int4Options.for_llm`), as onnxruntime-genai's builder and ONNX
Runtime's command line quantize."""
DEFAULT_EXCLUDE = (".*/lm_head",)
"""ModelOpt's default ``nodes_to_exclude`` (its ``/lm_head``, written for ``re.match``): ours for models that are not
LLMs. An LLM's default quantizes its head (:meth:`Int4Options.for_llm`); ``--nodes_to_exclude '.*/lm_head'``
gives ModelOpt's behaviour back."""
NO_DATA_LLM_METHOD = "awq_gptq"
"""The default method without calibration data for an LLM that writes its own calibration text (BENCHMARKS.md,
"The default INT4 method without calibration data", compares it with kquant and awq_lite)."""
NO_DATA_LARGE_LLM_METHOD = "awq_lite"
"""The no-data default of an LLM whose widest 4-bit weight's float64 ``[K, K]`` Gram (GPTQ's Hessian) exceeds
``--stats_memory_mb`` (:meth:`Int4Options.no_data_llm_method`): the calibrated default's method, which needs no
``K x K`` matrix."""
METHOD_NAMES = (
    "rtn", "rtn_clip", "kquant", "hqq", "awq_lite", "awq_clip", "awq_full", "gptq", "awq_gptq",
    "rtn_dq", "rtn_trt", "rtn_trt_dq", "awq_clip_trt",
)  # fmt: skip
OUTPUT_FORMATS = ("qdq", "matmulnbits")


@dataclass
class Int4Options(_tool.QuantizationOptions):
    """All INT4 settings, validated once. The first eight are ModelOpt's ``int4.quantize`` arguments."""

    TITLE = "INT4 options (ModelOpt names)"
    TOOL = "INT4"
    FORMER_SUFFIX = ".int4"

    calibration_method: str | None = option(
        None,
        choices=METHOD_NAMES,
        help="rtn (no data), rtn_clip (RTN with a per-block MSE clip search, no data), kquant (llama.cpp's "
        "weighted least-squares scale search, no data), hqq (half-quadratic lp fit, no data), awq_lite (AWQ scale "
        "search), awq_clip (output-aware clip search), awq_full (awq_lite then awq_clip), gptq (GPTQ with error "
        "propagation), awq_gptq (awq_lite scales then GPTQ); rtn_dq, rtn_trt, rtn_trt_dq and awq_clip_trt are "
        "ModelOpt aliases (default: awq_lite with calibration data, as ModelOpt; without data, awq_gptq on text an LLM "
        "writes itself (awq_lite when GPTQ's float64 KxK Hessian, held on the host, would exceed "
        "--stats_memory_mb), kquant for other models). Without data, an LLM calibrates AWQ and GPTQ on text it writes "
        "itself (other models on random inputs).",
    )
    calibration_data_reader: Any = calibration_data_option(
        "Calibration inputs",
        flags=("-d", "--calibration_data", "--calibration_data_path"),
        note="AWQ and GPTQ need representative data",
    )
    calibration_eps: Sequence[str] = _tool.calibration_eps_option()
    genai_provider: str | None = genai_provider_option()
    use_external_data_format: bool = _tool.external_data_option(
        flags=("--external_data", "--use_external_data_format"),
        doc="Save the weights in ``<output>.data`` (``quantize_file``; automatic above 2 GB). ``quantize`` returns "
        "a ModelProto: save it with ``onnx.save(..., save_as_external_data=True)``.",
    )
    use_zero_point: bool = option(
        False,
        help="Asymmetric quantization: UINT4 weights with UINT4 zero points (default: symmetric INT4, all 16 levels).",
    )
    positive_scales: bool = option(
        False,
        help="Symmetric scales always positive (max(-min/8, max/7) per block), for runtimes that reject negative "
        "scales such as TensorRT; the *_trt methods imply it (default: a block whose largest magnitude is positive "
        "may get a negative scale that puts it on level -8, as ONNX Runtime's RTN does, when that is more accurate).",
    )
    block_size: int | None = option(
        None,
        help="Weights per scale along K: a power of two >= 16, or -1 for one scale per output channel (default: 128; "
        "32 for an LLM without layer options).",
    )
    nodes_to_exclude: Sequence[str] | None = _tool.nodes_to_exclude_option(
        "the node name, its output name and its weight name",
        "; give the flag with no pattern to quantize every layer (default: '.*/lm_head', ModelOpt's; none under "
        "--size_budget_mb; for an LLM without layer options none, the embedding quantized too and an untied head at 8 "
        "bits: --nodes_to_exclude '.*/lm_head' restores ModelOpt's behaviour)",
        flags=("--nodes_to_exclude", "-ne"),
    )
    quantize_embeddings: bool = option(
        False,
        help="Also quantize embedding Gathers block-wise along the hidden axis (GatherBlockQuantized for "
        "matmulnbits, DequantizeLinear -> Gather for qdq), as onnxruntime-genai's builder does; a tied lm_head then "
        "shares the quantized table. Implied by --size_budget_mb and by an LLM without layer options.",
    )
    size_budget_mb: float | None = option(
        None,
        metavar="MB",
        help="The output's model files (.onnx plus external data) are at most this many MB (10^6 bytes): each weight "
        "gets INT4 at block 128, 64 or 32, INT8, or float when tiny, the most sensitive bytes promoted first "
        "(sensitivity: the Hessian-weighted output error on the calibration data; without it, on text an LLM writes "
        "itself, or random data, "
        "scaled by a few real runs' KL divergence of the logits).",
    )
    log_level: str = log_level_option()
    output_format: str | None = option(
        None,
        choices=OUTPUT_FORMATS,
        help="qdq: DequantizeLinear(INT4) -> MatMul at opset >= 21 (DirectML, TensorRT, QNN; ONNX Runtime fuses it "
        "on CPU and CUDA); matmulnbits: com.microsoft::MatMulNBits (ONNX Runtime) (default: qdq; matmulnbits for an "
        "LLM without layer options, as onnxruntime-genai's builder writes it).",
    )
    accuracy_level: int = option(
        4,
        choices=(0, 1, 2, 3, 4),
        help="MatMulNBits compute type for the activations: 4 int8 (the fast CPU path), 1 fp32, 2 fp16, 3 bf16, "
        "0 unset (matmulnbits only; for qdq ONNX Runtime's session option sets it).",
    )
    awqlite_alpha_step: float = option(0.1, help="Step of the AWQ-lite exponent grid 0..1.")
    awqclip_alpha_step: float = option(0.05, help="Step of the AWQ-clip ratio grid.")
    awqclip_alpha_min: float = option(0.5, help="Smallest AWQ-clip ratio.")
    awqclip_bsz_col: int = option(1024, help="Output columns processed at once by the AWQ-clip search (memory).")
    gptq_damp: float = _tool.gptq_damp_option(
        0.1, "default: 0.1, larger than the usual 0.01: it generalizes better from a few thousand calibration tokens"
    )
    gptq_act_order: bool = option(False, help="GPTQ: quantize input channels in order of decreasing activation.")
    gptq_sequential: bool = option(
        False,
        help="GPTQ and AWQ: calibrate the layer inputs a few at a time (about one transformer block), each on the "
        "model whose earlier layers are already quantized (default: every input on the float model; one pass over "
        "the data per few inputs instead of per --stats_memory_mb).",
    )
    layers_8bit: Sequence[str] | None = regexes_option(
        "Regexes (like --nodes_to_exclude) of MatMul, Gemm or Gather layers quantized to INT8 "
        "instead (they win over --nodes_to_exclude, e.g. --layers_8bit '.*lm_head')."
    )
    block_size_8bit: int | None = option(
        None,
        help="Block size of the INT8 layers: a power of two >= 16, or -1 per output channel (default: the largest "
        "power of two <= 128 that divides K, so MatMulNBits needs no padding; per channel if none does).",
    )
    calibration_batch_size: int | None = _tool.calibration_batch_size_option(
        1, "bounds the memory of each run; 0 or None: as given"
    )
    sample_tokens: int = _tool.sample_tokens_option("layer input for the AWQ and AWQ-clip losses")
    stats_memory_mb: int = option(
        256,
        group=EXTRAS,
        help="Memory for activation statistics (MiB); layers whose statistics do not fit together are calibrated in "
        "several passes over the data. On the CPU it also sets --segment_mb's default, half of it.",
    )
    segment_mb: int | None = option(
        None,
        group=EXTRAS,
        help="Weights per ONNX Runtime session (MiB): a model with more weights runs segment by segment, in pieces "
        "of at most this many, in calibration and in the check of the output (default: on the CPU half of "
        "--stats_memory_mb in calibration and 192 in the check; 1024 on a GPU provider, where each session costs "
        "seconds).",
    )
    accuracy_guard: bool = option(
        True,
        group=EXTRAS,
        help="Turn the accuracy guard off (default: on for a model that is not a language model and holds at most 1 GiB"
        " of weights: the result is measured against the float model on every calibration batch, or on synthetic "
        "inputs without data, by the bounds of each output's task metric (top-1 agreement >= 0.98 for class "
        "scores, identical CTC strings >= 0.99; cosine >= 0.95 for plain float outputs); when it misses them, the "
        "weights with the largest error go to 8 bits, then to float (at most a quarter of the weights' bytes); "
        "when that is not enough the model is written for inspection and the command exits with code 3. A language"
        " model or a larger one is checked on its first calibration batch and warned about). Off, the check still "
        "runs and warns.",
        doc="Hold a model that is not a language model, with at most 1 GiB of weights, to INT4's guard bounds "
        "(``onnxprec.quantization.int4._guard.BOUNDS``: INT8's, plain float outputs at cosine >= 0.95) on every "
        "calibration batch (synthetic inputs without data): the weights with the largest error go to 8 bits, then "
        "to float (at most a quarter of the weights' bytes); a result that still misses them is written for "
        "inspection and :class:`~onnxprec.errors.AccuracyGuardError` (carrying the report) is raised. False, and "
        "for language models and larger ones: the written result is checked on one batch and a miss is warned "
        "about.",
    )
    input_shapes: str | Mapping[str, Sequence[int]] | None = input_shapes_option(group=EXTRAS)
    gpu_memory_mb: int = option(
        DEFAULT_GPU_MEMORY_MB,
        group=EXTRAS,
        help="With a GPU in --calibration_eps (cuda, trt) and CuPy installed (onnxprec[gpu-math]), RTN, k-quant, "
        "HQQ, AWQ-lite and GPTQ compute on that GPU, holding at most this many MiB of its memory (a GPTQ weight that "
        "would need more runs in numpy); 0 keeps the arithmetic in numpy.",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        from onnxprec.quantization.algorithms.rtn import effective_block_size
        from onnxprec.quantization.methods import method_spec

        # Without data: kquant (AWQ on random data is worse than RTN), unless the pipeline finds an LLM that writes
        # its own calibration text: then NO_DATA_LLM_METHOD on that text (the run's Int4Plan.with_method).
        self.default_method = self.calibration_method is None
        if self.calibration_method is None:
            self.calibration_method = "awq_lite" if self.calibration_data_reader is not None else "kquant"
        self.method, self.spec = method_spec(self.calibration_method)
        self.block_given = self.block_size is not None
        if self.block_size is None:
            self.block_size = DEFAULT_BLOCK_SIZE
        if not isinstance(self.block_size, int) or isinstance(self.block_size, bool):
            raise InvalidArgumentError(f"block_size must be an integer, got {self.block_size!r}.")
        effective_block_size(1 << 30, self.block_size)  # raises for 48, 8, 0...
        if self.block_size_8bit is not None:
            effective_block_size(1 << 30, self.block_size_8bit)
        self.format_given = self.output_format is not None
        if self.output_format is None:
            self.output_format = "qdq"
        if self.output_format not in OUTPUT_FORMATS:
            raise InvalidArgumentError(
                f"Unknown output_format '{self.output_format}': use {' or '.join(OUTPUT_FORMATS)}."
            )
        if self.accuracy_level not in (0, 1, 2, 3, 4):
            raise InvalidArgumentError(f"accuracy_level must be 0..4, got {self.accuracy_level!r}.")
        for name in ("awqlite_alpha_step", "awqclip_alpha_step"):
            step = getattr(self, name)
            if not 0 < step <= 1:
                raise InvalidArgumentError(f"{name} must be in (0, 1], got {step!r}.")
        if not 0 < self.awqclip_alpha_min <= 1:
            raise InvalidArgumentError(f"awqclip_alpha_min must be in (0, 1], got {self.awqclip_alpha_min!r}.")
        if self.gpu_memory_mb < 0:
            raise InvalidArgumentError(f"gpu_memory_mb must be 0 or positive, got {self.gpu_memory_mb!r}.")
        if self.segment_mb is not None and self.segment_mb < 1:
            raise InvalidArgumentError(f"segment_mb must be a positive integer, got {self.segment_mb!r}.")
        for name in ("awqclip_bsz_col", "stats_memory_mb"):
            if getattr(self, name) < 1:
                raise InvalidArgumentError(f"{name} must be a positive integer, got {getattr(self, name)!r}.")
        _tool.check_gptq_damp(self.gptq_damp)
        if self.size_budget_mb is not None and not self.size_budget_mb > 0:
            raise InvalidArgumentError(f"size_budget_mb must be a positive number, got {self.size_budget_mb!r}.")
        # Nothing said about which layers and how: an LLM gets for_llm() once the pipeline has seen it
        self.llm_defaults = (
            self.nodes_to_exclude is None
            and not self.quantize_embeddings
            and self.size_budget_mb is None
            and self.layers_8bit is None
        )
        if self.nodes_to_exclude is None:  # under a budget the lm_head competes for bytes like any layer
            self.nodes_to_exclude = () if self.size_budget_mb is not None else DEFAULT_EXCLUDE
        self.exclude_patterns = compile_patterns(self.nodes_to_exclude, "nodes_to_exclude")
        self.eight_bit_patterns = compile_patterns(self.layers_8bit, "layers_8bit")

    def for_llm(self) -> Int4Options:
        """These options with the defaults for an LLM (a model with ``logits`` that writes its own text), which depart
        from ModelOpt's ``nodes_to_exclude=[r"/lm_head"]``: every MatMul quantized, the embedding too (a tied head
        shares its table), at block 32 (onnxruntime-genai's builder's) unless ``block_size`` was given, written as
        MatMulNBits and GatherBlockQuantized unless ``output_format`` was given (ONNX Runtime dequantizes a QDQ
        embedding table at every step on CPU); a new object, ``self`` is left as it is. The pipeline then puts an
        untied head at 8 bits."""
        return dataclasses.replace(
            self,
            nodes_to_exclude=(),
            quantize_embeddings=True,
            block_size=self.block_size if self.block_given else LLM_BLOCK_SIZE,
            output_format=self.output_format if self.format_given else "matmulnbits",
        )

    def with_method(self, name: str) -> Int4Options:
        """These options with the calibration method ``name`` (the default's choice once the model is known); a new
        object, ``self`` is left as it is."""
        return dataclasses.replace(self, calibration_method=name)

    def no_data_llm_method(self, widest_k: int) -> tuple[str, str]:
        """The default method of an LLM without calibration data whose widest 4-bit weight has ``widest_k`` input
        channels, and why: :data:`NO_DATA_LLM_METHOD`, or :data:`NO_DATA_LARGE_LLM_METHOD` when that weight's
        float64 Gram (GPTQ factorises several such matrices at once) exceeds ``--stats_memory_mb``."""
        gram = widest_k * widest_k * 8
        if gram <= self.stats_memory_mb * 1024 * 1024:
            return NO_DATA_LLM_METHOD, ""
        return NO_DATA_LARGE_LLM_METHOD, (
            f"{NO_DATA_LLM_METHOD}'s GPTQ needs a float64 [K, K] Hessian of {gram / 2**20:.0f} MiB for a weight with "
            f"K={widest_k} input channels (and about five such matrices to factorise it), over --stats_memory_mb "
            f"{self.stats_memory_mb}; raise it or pass --calibration_method {NO_DATA_LLM_METHOD} to use GPTQ"
        )

    @property
    def segment_bytes(self) -> int:
        """Weights per ONNX Runtime session in the calibration runs: ``--segment_mb``, else on the CPU half of
        ``--stats_memory_mb``, so that the statistics and one session's weights stay within about the whole of it (a
        model with at most this many bytes of weights runs in one session; a larger one segment by segment), and on
        a GPU provider :data:`onnxprec._ort.DEVICE_SESSION_BYTES`."""
        from onnxprec import _ort

        if self.segment_mb is not None:
            return self.segment_mb * 1024 * 1024
        return _ort.session_weight_bytes(self.calibration_eps, self.stats_memory_mb * 1024 * 1024 // 2)

    @property
    def check_segment_bytes(self) -> int | None:
        """Weights per session when the written output is checked: ``--segment_mb``, else None (the runner's
        default for the providers)."""
        return None if self.segment_mb is None else self.segment_mb * 1024 * 1024

    @property
    def format(self) -> str:
        """The output format (resolved: ``output_format`` is None only before validation)."""
        assert self.output_format is not None
        return self.output_format

    @property
    def method_name(self) -> str:
        """The method as given (aliases kept), after the default is resolved."""
        assert self.calibration_method is not None
        return self.calibration_method

    def block_of(self, target: WeightGroup) -> int:
        """The block size of a weight: a size budget's choice, else the run's (INT4) or ``--block_size_8bit``'s
        (INT8)."""
        if target.block_size is not None:
            return target.block_size
        return (self.block_size or DEFAULT_BLOCK_SIZE) if target.bits == 4 else self.block_8bit(target.k)

    def block_8bit(self, k: int) -> int:
        """The block size of an INT8 weight with ``k`` input channels."""
        if self.block_size_8bit is not None:
            return self.block_size_8bit
        return next((b for b in (128, 64, 32, 16) if k % b == 0), -1)

    def quant_config(self) -> Any:
        """The :class:`~onnxprec.quantization.methods.QuantConfig` of these options."""
        from onnxprec._array import backend
        from onnxprec.quantization.methods import QuantConfig

        alphas = _grid(0.0, 1.0, self.awqlite_alpha_step)
        ratios = tuple(sorted(_grid(self.awqclip_alpha_min, 1.0, self.awqclip_alpha_step), reverse=True))
        return QuantConfig(
            block_size=self.block_size or DEFAULT_BLOCK_SIZE,
            symmetric=not self.use_zero_point,
            positive_scales=self.positive_scales or "_trt" in self.method_name,
            alpha_grid=alphas,
            clip_ratios=ratios,
            clip_chunk_columns=self.awqclip_bsz_col,
            gptq_damp=self.gptq_damp,
            gptq_act_order=self.gptq_act_order,
            backend=backend(self.calibration_eps, memory_limit_mb=self.gpu_memory_mb),
        )


@dataclass(frozen=True)
class Int4Plan:
    """What one INT4 run does: the caller's options with the defaults chosen for the model resolved, a value that a
    step replaces (:meth:`for_llm`, :meth:`with_method`) and never changes; the caller's options object is never
    written. The report's ``method``, ``block_size`` and ``output_format`` are the plan's."""

    options: Int4Options
    """The settings the steps read: the caller's object until a default is chosen for this model, then a new one."""
    default_method: bool
    """No method was given: the run chooses one (without data, an LLM's :data:`NO_DATA_LLM_METHOD`, else kquant)."""
    config: QuantConfig
    """The numerics of :attr:`options`."""
    llm: bool = False
    """Whether an LLM's defaults were taken (:meth:`Int4Options.for_llm`)."""

    @classmethod
    def of(cls, options: Int4Options) -> Int4Plan:
        """The plan of the caller's options, before the model is seen."""
        return cls(options, options.default_method, options.quant_config())

    def for_llm(self) -> Int4Plan:
        """This plan with an LLM's defaults (:meth:`Int4Options.for_llm`)."""
        options = self.options.for_llm()
        return dataclasses.replace(self, options=options, config=options.quant_config(), llm=True)

    def with_method(self, name: str) -> Int4Plan:
        """This plan with the calibration method ``name``."""
        options = self.options.with_method(name)
        return dataclasses.replace(self, options=options, config=options.quant_config())

    @property
    def method(self) -> str:
        """The resolved method (aliases mapped to the method they run)."""
        method: str = self.options.method
        return method


def _grid(low: float, high: float, step: float) -> tuple[float, ...]:
    """``low, low + step, ...`` up to ``high`` inclusive (rounded to avoid 0.30000000000000004)."""
    count = round((high - low) / step + 1e-9)
    values = [round(low + i * step, 6) for i in range(count + 1)]
    if values[-1] < high - 1e-9:
        values.append(high)
    return tuple(v for v in values if v <= high + 1e-9)
