"""Generation mode of ``onnxprec evaluate``: the deployment check through onnxruntime-genai.

Each model is loaded from its onnxruntime-genai folder (``genai_config.json`` beside it) in
``onnxruntime_genai.Model`` and generates greedily from the same prompts, one prompt at a time, one model at a
time (so only one model is in memory). Per model:

- **prefill tokens/s**: prompt tokens / time of ``append_tokens`` plus the first ``generate_next_token`` (the prompt's
  forward pass and the choice of the first new token);
- **decode tokens/s**: the tokens after the first / the time of the remaining ``generate_next_token`` calls (one
  forward pass each);
- **greedy agreement** with the first model: the fraction of generated positions whose token equals the first
  model's (over the longer of the two sequences of each prompt), the first position where they differ, and how
  many prompts gave the very same tokens.

A warm-up generation (untimed) runs before the prompts. Text prompts are encoded once, with the first model's
tokenizer, so that every model starts from the same token ids; token ids can also come from ``--data``.

The provider comes from the first of ``providers``: ``cpu`` clears the config's providers in memory (a CUDA build's
folder runs on the CPU without writing its config), ``cuda[:N]`` asks for the CUDA provider (onnxruntime-genai-cuda).
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from onnxprec._genai import GENAI_CONFIG, has_tokenizer, read_config
from onnxprec._options import fields_in
from onnxprec._progress import progress
from onnxprec._report import SUMMARY, header, timed
from onnxprec.errors import CalibrationDataError, InvalidArgumentError, ModelLoadError, UnsupportedModelError
from onnxprec.evaluate._options import EvaluateOptions
from onnxprec.evaluate._report import ModelsReport, text_table

__all__ = ["DEFAULT_PROMPTS", "GenerationReport", "GenerationResult", "generate_models", "run_generation"]

logger = logging.getLogger(__name__)

DEFAULT_PROMPTS = (
    "The Python language reference describes",
    "Once upon a time, in a small village by the sea,",
    "The three primary colors are",
)
_WARMUP_TOKENS = 2


def import_genai() -> Any:
    """Imports onnxruntime_genai, naming the extra to install when it is missing."""
    try:
        import onnxruntime_genai
    except ImportError:
        raise UnsupportedModelError(
            "Generation needs onnxruntime-genai, which is not installed: pip install 'onnxprec[genai-cpu]' "
            "(or 'onnxprec[genai-gpu]' with onnxruntime-gpu)."
        ) from None
    return onnxruntime_genai


# --------------------------------------------------------------------------------------------------
# Results


@dataclass
class GenerationResult:
    """One model's generation: speed, the tokens it generated and its agreement with the first model."""

    name: str
    folder: str
    model_file: str
    is_reference: bool
    prompt_tokens: int = 0
    generated_tokens: int = 0
    decode_steps: int = 0
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0
    load_seconds: float = 0.0
    sequences: list[list[int]] = field(default_factory=list)
    """The generated token ids of each prompt (the prompt excluded)."""
    texts: list[str] | None = None
    """The generated text of each prompt (None when the folder has no tokenizer)."""
    agreement: float | None = None
    first_divergence: list[int | None] | None = None
    """Per prompt, the first generated position whose token differs from the first model's (None: identical)."""

    @property
    def prefill_tokens_per_s(self) -> float | None:
        return self.prompt_tokens / self.prefill_seconds if self.prefill_seconds > 0 else None

    @property
    def decode_tokens_per_s(self) -> float | None:
        return self.decode_steps / self.decode_seconds if self.decode_seconds > 0 and self.decode_steps else None

    @property
    def identical(self) -> int | None:
        """How many prompts generated exactly the first model's tokens."""
        return None if self.first_divergence is None else sum(d is None for d in self.first_divergence)

    def to_json(self) -> dict[str, Any]:
        def rate(value: float | None) -> float | None:
            return None if value is None or not math.isfinite(value) else round(value, 3)

        return {
            "name": self.name,
            "folder": self.folder,
            "model_file": self.model_file,
            "reference": self.is_reference,
            "prompt_tokens": self.prompt_tokens,
            "generated_tokens": self.generated_tokens,
            "prefill_tokens_per_s": rate(self.prefill_tokens_per_s),
            "decode_tokens_per_s": rate(self.decode_tokens_per_s),
            "seconds": {
                "load": round(self.load_seconds, 4),
                "prefill": round(self.prefill_seconds, 4),
                "decode": round(self.decode_seconds, 4),
            },
            "agreement": None if self.agreement is None else round(self.agreement, 6),
            "first_divergence": self.first_divergence,
            "identical_prompts": self.identical,
            "sequences": self.sequences,
            "texts": self.texts,
        }


@dataclass
class GenerationReport(ModelsReport[GenerationResult]):
    """All models' generation results; :meth:`table` for the terminal, :meth:`to_json` for scripts
    (``--report_json``)."""

    TOOL: ClassVar[str] = "evaluate"

    provider: str = "cpu"
    prompts: list[list[int]] = field(default_factory=list)
    prompt_texts: list[str] | None = None
    max_new_tokens: int = 0

    @property
    def summary(self) -> str:
        """One line: how many models generated from how many prompts, and each one's greedy agreement."""
        parts = [f"{m.name} agreement {m.agreement:.2%}" for m in self.models if m.agreement is not None]
        text = f"Generated with {len(self.models)} model(s) from {len(self.prompts)} prompt(s) on {self.provider}"
        return f"{text}: {', '.join(parts)}" if parts else text

    def to_json(self) -> dict[str, Any]:
        """``tool``, ``onnxprec_version``, ``summary``, ``mode`` (generate), ``provider``, ``max_new_tokens``,
        ``prompts`` (token ids), ``prompt_texts`` (None for token-id prompts), ``reference`` and ``models``: per
        model ``name``, ``folder``, ``model_file``, ``prompt_tokens``, ``generated_tokens``, ``prefill_tokens_per_s``,
        ``decode_tokens_per_s``, ``seconds`` (load, prefill, decode), ``agreement`` (None for the reference),
        ``first_divergence`` (per prompt, None where identical), ``identical_prompts``, ``sequences`` and ``texts``."""
        return {
            **header(self),
            "mode": "generate",
            "provider": self.provider,
            "max_new_tokens": self.max_new_tokens,
            "prompts": self.prompts,
            "prompt_texts": self.prompt_texts,
            "reference": self.reference.name,
            "models": [m.to_json() for m in self.models],
        }

    def table(self) -> str:
        """A plain-text table: one row per model."""
        n = len(self.prompts)

        def fmt(value: float | None, spec: str) -> str:
            return "-" if value is None else spec.format(value)

        def divergence(m: GenerationResult) -> str:
            if m.first_divergence is None:
                return "-"
            found = [d for d in m.first_divergence if d is not None]
            return "none" if not found else str(min(found))

        columns: list[tuple[str, Any]] = [
            ("model", lambda m: m.name + (" (ref)" if m.is_reference else "")),
            ("prefill tok/s", lambda m: fmt(m.prefill_tokens_per_s, "{:.1f}")),
            ("decode tok/s", lambda m: fmt(m.decode_tokens_per_s, "{:.1f}")),
            ("generated", lambda m: str(m.generated_tokens)),
            ("agreement", lambda m: fmt(m.agreement, "{:.2%}")),
            ("first diff", divergence),
            ("identical", lambda m: "-" if m.identical is None else f"{m.identical}/{n}"),
        ]
        lines = text_table(columns, self.models)
        prompt_tokens = sum(len(p) for p in self.prompts)
        lines.append(
            f"(greedy generation through onnxruntime-genai on {self.provider}: {n} prompts, {prompt_tokens} prompt "
            f"tokens, up to {self.max_new_tokens} new tokens each; agreement with {self.reference.name}; first diff: "
            "the earliest generated position that differs)"
        )
        return "\n".join(lines)


# --------------------------------------------------------------------------------------------------
# Models and prompts


@dataclass
class _Folder:
    name: str
    folder: Path
    model_file: str
    overlay: str | None  # a config overlay naming the model file, when it is not the config's decoder file


def _resolve(source: str | os.PathLike) -> _Folder:
    """The onnxruntime-genai folder of a model path (a ``.onnx`` file in the folder, or the folder itself)."""
    path = Path(source)
    if not path.exists():
        raise ModelLoadError(f"Model '{path}' does not exist: check the model paths.")
    folder = path if path.is_dir() else path.parent
    config = read_config(folder)
    decoder = config["model"].get("decoder")
    configured = decoder.get("filename") if isinstance(decoder, dict) else None
    if not isinstance(configured, str):
        raise ModelLoadError(
            f"'{folder / GENAI_CONFIG}' has no model.decoder.filename: onnxruntime-genai cannot tell which file is "
            "the decoder; fix the config."
        )
    model_file = configured if path.is_dir() else path.name
    overlay = None
    if model_file != configured:
        overlay = json.dumps({"model": {"decoder": {"filename": model_file}}})
    if not (folder / model_file).is_file():
        raise ModelLoadError(
            f"'{folder / GENAI_CONFIG}' names '{model_file}', which is not in '{folder}': copy the model there or fix "
            "model.decoder.filename."
        )
    stem = model_file[: -len(".onnx")] if model_file.endswith(".onnx") else model_file
    return _Folder(f"{folder.name}/{stem}", folder, model_file, overlay)


def _provider(providers: Sequence[str]) -> tuple[str, str | None]:
    """(``cpu`` or ``cuda``, the CUDA device id) from the first of ``providers``."""
    first = str(providers[0] if providers else "cpu").lower()
    kind, _, device = first.partition(":")
    if kind not in ("cpu", "cuda") or (device and not device.isdigit()):
        raise InvalidArgumentError(
            f"Generation runs on cpu or cuda[:N] (onnxruntime-genai's providers here), got '{providers[0]}': "
            "pass --providers cpu or --providers cuda:0."
        )
    return kind, device or None


def _load(og: Any, entry: _Folder, provider: tuple[str, str | None]) -> Any:
    """``onnxruntime_genai.Model`` of a folder on the provider, from an in-memory config (the folder is not written)."""
    try:
        config = og.Config(str(entry.folder))
        if entry.overlay:
            config.overlay(entry.overlay)
        config.clear_providers()
        kind, device = provider
        if kind == "cuda":
            config.append_provider("cuda")
            if device is not None:
                config.set_provider_option("cuda", "device_id", device)
        return og.Model(config)
    except Exception as e:  # onnxruntime-genai raises RuntimeError (or OSError) with its own message
        from onnxprec._ort import first_line

        hint = (
            "install onnxprec[genai-gpu] (onnxruntime-genai-cuda) or pass --providers cpu"
            if provider[0] == "cuda"
            else "check that genai_config.json matches the model"
        )
        raise ModelLoadError(
            f"onnxruntime-genai cannot load '{entry.folder / entry.model_file}': {first_line(e, 200)}; {hint}."
        ) from None


def _id_prompts(data: Any) -> list[list[int]]:
    """Token-id prompts from ``data``: an ``.npy`` of ids ``[N, seq]``, an ``.npz`` with ``input_ids``, or an array."""
    if isinstance(data, (str, os.PathLike)):
        path = Path(data)
        if not path.is_file():
            raise CalibrationDataError(f"--calibration_data '{path}' does not exist: check the path.")
        try:
            loaded = np.load(path, allow_pickle=False)
            if isinstance(loaded, np.lib.npyio.NpzFile):
                with loaded:
                    if "input_ids" not in loaded.files:
                        raise CalibrationDataError(
                            f"--data '{path}' has no 'input_ids' array (it has {sorted(loaded.files)}): generation "
                            "needs token ids."
                        )
                    loaded = loaded["input_ids"]
        except CalibrationDataError:
            raise
        except Exception as e:
            raise CalibrationDataError(
                f"Cannot read token ids from '{path}' ({type(e).__name__}): save them with np.save (int [N, seq])."
            ) from None
        data = loaded
    array = np.asarray(data)
    if array.ndim == 1:
        array = array[None]
    if array.dtype.kind not in "iu" or array.ndim != 2 or array.shape[1] == 0:
        raise CalibrationDataError(
            f"Generation prompts from --data must be integer token ids [N, seq], got {array.dtype} {list(array.shape)}."
        )
    return [[int(t) for t in row] for row in array]


def _prompts(og: Any, first: _Folder, model: Any, options: EvaluateOptions) -> tuple[list[list[int]], list[str] | None]:
    if options.prompts and options.data is not None:
        raise InvalidArgumentError("Give generation prompts as text (--prompts) or as token ids (--data), not both.")
    if options.data is not None:
        ids = _id_prompts(options.data)
        if options.prompt_tokens:
            ids = [row[: int(options.prompt_tokens)] for row in ids]
        texts = None
    else:
        texts = list(options.prompts or DEFAULT_PROMPTS)
        if options.num_prompts:
            texts = texts[: int(options.num_prompts)]
        tokenizer = og.Tokenizer(model)
        ids = [[int(t) for t in tokenizer.encode(text)] for text in texts]
        empty = [text for text, row in zip(texts, ids) if not row]
        if empty:
            raise InvalidArgumentError(f"Prompt {empty[0]!r} encodes to no tokens: give a longer prompt.")
    if options.num_prompts:
        ids = ids[: int(options.num_prompts)]
    return ids, texts


def _context_length(folder: Path) -> int | None:
    config = read_config(folder)
    value = config["model"].get("context_length") or (config.get("search") or {}).get("max_length")
    return int(value) if isinstance(value, (int, float)) else None


def _check_text_prompts(first: _Folder, options: EvaluateOptions) -> None:
    if options.data is None and not has_tokenizer(first.folder):
        raise InvalidArgumentError(
            f"'{first.folder}' has no tokenizer files (tokenizer.json or tokenizer.model), so text prompts cannot be "
            "encoded: copy the tokenizer files beside genai_config.json, or give token ids with --data ids.npy."
        )


# --------------------------------------------------------------------------------------------------
# Generation


def _generate_one(og: Any, model: Any, prompt: list[int], max_new_tokens: int) -> tuple[list[int], float, float]:
    """Greedy generation from one prompt: (new tokens, prefill seconds, decode seconds)."""
    params = og.GeneratorParams(model)
    params.set_search_options(do_sample=False, num_beams=1, max_length=len(prompt) + max_new_tokens)
    generator = og.Generator(model, params)
    with timed() as prefill:
        generator.append_tokens(np.asarray(prompt, dtype=np.int32))
        if not generator.is_done():
            generator.generate_next_token()
    with timed() as decode:
        while not generator.is_done():
            generator.generate_next_token()
    sequence = [int(t) for t in generator.get_sequence(0)]
    del generator
    return sequence[len(prompt) :], prefill.seconds, decode.seconds


def _agreement(reference: list[list[int]], candidate: list[list[int]]) -> tuple[float, list[int | None]]:
    equal = total = 0
    first: list[int | None] = []
    for ref, cand in zip(reference, candidate):
        common = min(len(ref), len(cand))
        same = [ref[i] == cand[i] for i in range(common)]
        equal += sum(same)
        total += max(len(ref), len(cand))
        diverged = next((i for i, s in enumerate(same) if not s), None)
        if diverged is None and len(ref) != len(cand):
            diverged = common
        first.append(diverged)
    return (equal / total if total else 1.0), first


def _run_model(
    og: Any,
    entry: _Folder,
    model: Any,
    result: GenerationResult,
    prompts: list[list[int]],
    max_new_tokens: int,
) -> None:
    try:
        _generate_one(og, model, prompts[0], _WARMUP_TOKENS)
        for prompt in progress(prompts, f"Generating ({entry.name})", "prompt"):
            tokens, prefill, decode = _generate_one(og, model, prompt, max_new_tokens)
            result.sequences.append(tokens)
            result.prompt_tokens += len(prompt)
            result.generated_tokens += len(tokens)
            result.decode_steps += max(len(tokens) - 1, 0)
            result.prefill_seconds += prefill
            result.decode_seconds += decode
    except Exception as e:
        from onnxprec._ort import first_line

        raise UnsupportedModelError(
            f"onnxruntime-genai failed while generating with '{entry.folder / entry.model_file}': "
            f"{first_line(e, 200)}; check that the model runs in onnxruntime (onnxprec evaluate without --generate)."
        ) from None
    if has_tokenizer(entry.folder):
        tokenizer = og.Tokenizer(model)
        result.texts = [str(tokenizer.decode(np.asarray(tokens, dtype=np.int32))) for tokens in result.sequences]


def run_generation(
    models: str | os.PathLike | Sequence[str | os.PathLike], options: EvaluateOptions
) -> GenerationReport:
    """:func:`generate_models` with the settings as one object (e.g. built from command-line flags)."""
    sources = [models] if isinstance(models, (str, os.PathLike)) else list(models)
    if not sources:
        raise InvalidArgumentError("No model to evaluate: pass at least one model.")
    for source in sources:
        if not isinstance(source, (str, os.PathLike)):
            raise InvalidArgumentError(
                "Generation loads models from their onnxruntime-genai folders: pass paths, not in-memory models."
            )
    if options.labels is not None or options.reference is not None or options.perplexity:
        raise InvalidArgumentError(
            "--labels, --reference and --perplexity do not apply to --generate (the first model is the reference): "
            "run them without --generate."
        )
    entries = [_resolve(source) for source in sources]
    names = [e.name for e in entries]
    for i, entry in enumerate(entries):
        if names.count(entry.name) > 1:
            entry.name = f"{entry.name}#{i}"
    provider = _provider(list(options.providers))
    if options.data is None:
        _check_text_prompts(entries[0], options)
    og = import_genai()
    report = GenerationReport(provider=provider[0] + (f":{provider[1]}" if provider[1] else ""))
    report.max_new_tokens = int(options.max_new_tokens)
    for index, entry in enumerate(entries):
        result = GenerationResult(entry.name, str(entry.folder), entry.model_file, is_reference=index == 0)
        with timed() as loading:
            model = _load(og, entry, provider)
        result.load_seconds = loading.seconds
        if index == 0:
            report.prompts, report.prompt_texts = _prompts(og, entry, model, options)
            if not report.prompts:
                raise CalibrationDataError("No generation prompt: give at least one (--prompts or --data).")
        context = _context_length(entry.folder)
        longest = max(len(p) for p in report.prompts) + report.max_new_tokens
        if context is not None and longest > context:
            raise InvalidArgumentError(
                f"A prompt of {longest - report.max_new_tokens} tokens plus {report.max_new_tokens} new tokens passes "
                f"the context length of '{entry.name}' ({context}): use a smaller --prompt_tokens or --max_new_tokens."
            )
        _run_model(og, entry, model, result, report.prompts, report.max_new_tokens)
        del model
        if index > 0:
            result.agreement, result.first_divergence = _agreement(report.models[0].sequences, result.sequences)
        report.models.append(result)
        logger.info("%s", _summary(result), extra=SUMMARY)  # the table says it too
    return report


def _summary(result: GenerationResult) -> str:
    parts = [
        f"{result.name}{' (reference)' if result.is_reference else ''}: {result.generated_tokens} tokens generated",
        f"prefill {result.prefill_tokens_per_s or 0:.1f} tok/s",
        f"decode {result.decode_tokens_per_s or 0:.1f} tok/s",
    ]
    if result.agreement is not None:
        parts.append(f"greedy agreement {result.agreement:.2%} ({result.identical}/{len(result.sequences)} identical)")
    return "; ".join(parts)


def generate_models(
    models: str | os.PathLike | Sequence[str | os.PathLike],
    prompts: Sequence[str] = (),
    *,
    data: Any = None,
    providers: Sequence[str] | None = None,
    max_new_tokens: int = 32,
    prompt_tokens: int | None = None,
    num_prompts: int | None = None,
) -> GenerationReport:
    """Greedy generation through onnxruntime-genai, model by model on the same prompts (``evaluate --generate``).

    Args:
        models: Models in onnxruntime-genai folders (a ``.onnx`` beside ``genai_config.json``, or the folder); the
            first is the reference. A file the config does not name is loaded in its place (in memory).
        prompts: --generate: prompts as text, encoded with the first model's tokenizer (default without --data:
            three short English prompts).
        data: Token-id prompts instead of text: an ``.npy`` of ids ``[N, seq]``, an ``.npz`` with ``input_ids``, or
            an integer array.
        providers: ONNX Runtime providers for the evaluation: ``cpu``, ``cuda:N``, ``trt``, ``dml``.
        max_new_tokens: --generate: tokens to generate after each prompt (fewer when a model emits its end token).
        prompt_tokens: --generate with --data token ids: the first N tokens of each row are its prompt (default:
            the row).
        num_prompts: --generate: use only the first N prompts (rows of --data, or --prompts).

    Returns:
        The report: per model prefill and decode tokens/s, the generated tokens and texts, and greedy agreement
        with the first model; ``table()`` for a terminal and ``to_json()`` for scripts.

    Raises:
        OnnxprecError: A model outside an onnxruntime-genai folder, text prompts without a tokenizer, a missing
            onnxruntime-genai, or a bad argument; the message says how to fix it.
    """
    values = fields_in(EvaluateOptions, locals())
    if providers is None:
        del values["providers"]
    options = EvaluateOptions(**values, generate=True)
    return run_generation(models, options)
