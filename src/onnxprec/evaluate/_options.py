"""Evaluation options, each declared once: API keyword, command-line flag and help.

Nothing heavy is imported here, so ``--help`` is fast.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from onnxprec._arg_groups import calibration_data_option, providers_option
from onnxprec._options import ToolOptions, option
from onnxprec.errors import InvalidArgumentError

__all__ = ["OPTIMIZATION_LEVELS", "EvaluateOptions"]

OPTIMIZATION_LEVELS = ("none", "basic", "all")
_GENERATION = "generation (--generate, through onnxruntime-genai)"


@dataclass
class EvaluateOptions(ToolOptions):
    """All evaluation settings, validated once (the models themselves are the API's first argument)."""

    TITLE = "evaluation options"

    data: Any = calibration_data_option(
        "Inputs",
        flags=("-d", "--calibration_data", "--data"),
        default="one batch of realistic random data",
        more_formats=(
            "an .npy of token ids [N, seq] (token windows for a causal LM)",
            "an ``.npy`` of token ids ``[N, seq]`` (token windows)",
        ),
    )
    reference: Any = option(
        None,
        flags=("--reference", "--reference_model"),
        metavar="MODEL",
        help="The model the others are compared with: one of the models (path or name) or another model file, "
        "e.g. the float model of quantized ones: agreement, and for causal LMs the KL divergence of the logits and "
        "top-1 agreement (default: the first model).",
    )
    labels: Any = option(
        None,
        metavar="PATH",
        help="Class ids (.npy, one per sample in data order; negative ids are ignored): top-1/top-5 accuracy.",
        doc="Class ids (a path to an ``.npy`` or an array), one per sample in data order (negative ids are "
        "ignored): top-1/top-5 accuracy of the first float output.",
    )
    providers: Sequence[str] = providers_option("the evaluation")
    batch_size: int | None = option(
        None,
        metavar="N",
        help="Split each batch of the data into runs of at most this many samples (default: as stored).",
    )
    perplexity: bool = option(
        None,
        help="Report perplexity; an error if a model is not a causal LM (default: automatic when a model has "
        "input_ids and [batch, seq, vocab] logits (an output named like 'logits')).",
        doc="Report perplexity: True requires causal LMs, False never, None (default) for every model with "
        "``input_ids`` and ``[batch, seq, vocab]`` logits (an output whose name contains ``logits``).",
    )
    latency_runs: int = option(
        0,
        metavar="N",
        help="Timed runs of each model on the first batch, interleaved, after warm-up (default 0: no latency; "
        "10 gives a stable median).",
    )
    profile_runs: int = option(
        0,
        metavar="N",
        help="Runs of each model on the first batch in a session of its own with ONNX Runtime's profiler on, after "
        "one warm-up: per kernel op type the nodes and kernel time, the nodes that ran in integer kernels "
        "(QLinearConv, MatMulIntegerToFloat...) with their share of kernel time, and the Q/DQ nodes left unfused "
        "(default 0: no profile; 3 is enough).",
    )
    custom_op_libs: Sequence[str] = option(
        (),
        flags=("--custom_op_lib",),
        nargs="*",
        metavar="PATH",
        help="Custom op libraries (.so/.dll) registered on every session.",
    )
    optimization: str = option(
        "all",
        choices=OPTIMIZATION_LEVELS,
        help="ONNX Runtime graph optimization level of the sessions (all: as deployed).",
    )
    generate: bool = option(
        False,
        group=_GENERATION,
        help="Generation mode: load each model's onnxruntime-genai folder (genai_config.json beside it) in "
        "onnxruntime_genai.Model, generate greedily from the same prompts, and report prefill and decode tokens/s "
        "and greedy agreement with the first model (instead of perplexity and latency); runs on the first of "
        "--providers (cpu or cuda[:N]).",
        doc="Generation mode (:func:`onnxprec.evaluate.generate_models`): each model's onnxruntime-genai folder "
        "generates greedily from the same prompts; prefill and decode tokens/s and greedy agreement with the first "
        "model.",
    )
    prompts: Sequence[str] = option(
        (),
        nargs="+",
        metavar="TEXT",
        group=_GENERATION,
        help="--generate: prompts as text, encoded with the first model's tokenizer (default without --data: "
        "three short English prompts).",
    )
    max_new_tokens: int = option(
        32,
        metavar="N",
        group=_GENERATION,
        help="--generate: tokens to generate after each prompt (fewer when a model emits its end token).",
    )
    prompt_tokens: int | None = option(
        None,
        metavar="N",
        group=_GENERATION,
        help="--generate with --data token ids: the first N tokens of each row are its prompt (default: the row).",
    )
    num_prompts: int | None = option(
        None,
        metavar="N",
        group=_GENERATION,
        help="--generate: use only the first N prompts (rows of --data, or --prompts).",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.batch_size is not None and int(self.batch_size) <= 0:
            raise InvalidArgumentError(f"batch_size must be a positive integer, got {self.batch_size}.")
        for name in ("latency_runs", "profile_runs"):
            value = getattr(self, name)
            if isinstance(value, bool) or int(value) < 0:
                raise InvalidArgumentError(f"{name} must be an integer >= 0, got {value}.")
        for name in ("max_new_tokens", "prompt_tokens", "num_prompts"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or int(value) <= 0):
                raise InvalidArgumentError(f"{name} must be a positive integer, got {value}.")
        if self.optimization not in OPTIMIZATION_LEVELS:
            raise InvalidArgumentError(f"optimization must be one of {OPTIMIZATION_LEVELS}, got {self.optimization!r}.")
