"""onnxruntime-genai folders: the config, tokenizer and processing files carried beside a tool's output.

onnxruntime-genai loads a *folder*: ``genai_config.json`` (which file is the decoder, the input/output names, the
head size and KV-head count, the context length, the execution provider and search defaults) and the tokenizer
files next to it. When a tool writes a model that was read from such a folder, :class:`GenaiCarry` copies those
files to the output's folder and updates the copied config where the tool changed what it describes:

- ``model.<part>.filename`` (or a pipeline entry's) when the output file has another name than the input;
- ``session_options.provider_options`` when a provider is asked for (``cpu``: ``[]``; ``cuda``: ``[{"cuda": {}}]``),
  e.g. a CPU run of a folder built for CUDA.

The element types of the KV cache, the logits and the token ids are *not* in the config: onnxruntime-genai 0.18
reads them from the model's inputs and outputs (``past_key_names`` input 0 sets the KV cache type, the logits output
its own), so an AutoCast output with FP16 KV inputs needs no config change. The config's input/output names are
checked against the written model and a mismatch is a warning.

The input folder is never written. When the output sits in the input's folder nothing is carried (a one-line
warning says to write into another folder). Every file is written atomically.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import onnx_ir as ir

from onnxprec._io import atomic_path, write_atomically
from onnxprec.errors import InvalidArgumentError, ModelLoadError

__all__ = [
    "GENAI_CONFIG",
    "GENAI_PROVIDERS",
    "GenaiCarry",
    "genai_folder",
    "has_tokenizer",
    "read_config",
    "set_provider",
]

logger = logging.getLogger(__name__)

GENAI_CONFIG = "genai_config.json"
GENAI_PROVIDERS = ("cpu", "cuda")

# Tokenizer and processing files as Hugging Face, the model builder, Optimum and Olive write them.
_CARRIED = re.compile(
    r"(genai_config\.json|tokenizer.*\.(json|model)|special_tokens_map\.json|added_tokens\.json|"
    r"generation_config\.json|config\.json|chat_template\.(jinja|json)|.*\.jinja|vocab\.(json|txt)|merges\.txt|"
    r"spiece\.model|sentencepiece.*\.model|.*\.tiktoken|.*processor.*\.json|.*processing.*\.json)",
    re.IGNORECASE,
)
# What a tokenizer of onnxruntime-genai (onnxruntime-extensions) can be built from.
_TOKENIZER = re.compile(r"(tokenizer\.json|tokenizer\.model|spiece\.model|sentencepiece.*\.model|vocab\.json)", re.I)
# Model and weight files: never carried (the tool writes its own model; other models are the user's to copy).
_MODEL_FILE = re.compile(r".*\.(onnx|onnx\.data|data|onnx_data|pb|bin|safetensors|pt|pth|ckpt|gguf)", re.IGNORECASE)


def genai_folder(model_path: str | os.PathLike) -> Path | None:
    """The folder of ``model_path`` when it holds a ``genai_config.json``, else None."""
    folder = Path(model_path).parent
    return folder if (folder / GENAI_CONFIG).is_file() else None


def has_tokenizer(folder: str | os.PathLike) -> bool:
    """Whether ``folder`` holds files onnxruntime-genai can build a tokenizer from (``tokenizer.json``...)."""
    path = Path(folder)
    return path.is_dir() and any(_TOKENIZER.fullmatch(p.name) and p.is_file() for p in path.iterdir())


def read_config(folder: str | os.PathLike) -> dict[str, Any]:
    """Reads ``folder/genai_config.json``.

    Raises:
        ModelLoadError: The file is missing, is not JSON, or has no ``model`` object.
    """
    path = Path(folder) / GENAI_CONFIG
    if not path.is_file():
        raise ModelLoadError(
            f"'{Path(folder)}' has no {GENAI_CONFIG}: onnxruntime-genai loads the folder its model builder wrote "
            "(genai_config.json, the model and its tokenizer); pass a model in such a folder."
        )
    try:
        config = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelLoadError(
            f"'{path}' is not readable JSON ({type(e).__name__}: {str(e).splitlines()[0][:120]}): fix it or "
            "regenerate the folder with onnxruntime_genai.models.builder."
        ) from e
    if not isinstance(config, dict) or not isinstance(config.get("model"), dict):
        raise ModelLoadError(
            f"'{path}' has no \"model\" object: it is not an onnxruntime-genai config; fix it or regenerate the "
            "folder with onnxruntime_genai.models.builder."
        )
    return config


def _filename_entries(config: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every ``filename`` of the config's model parts: (where, the object holding it)."""
    for part, value in config["model"].items():
        if not isinstance(value, dict):
            continue
        if isinstance(value.get("filename"), str):
            yield f"model.{part}.filename", value
        for i, stage in enumerate(value.get("pipeline") or []):
            for name, entry in stage.items() if isinstance(stage, dict) else []:
                if isinstance(entry, dict) and isinstance(entry.get("filename"), str):
                    yield f"model.{part}.pipeline[{i}].{name}.filename", entry


def _session_options(value: Any) -> Iterator[dict[str, Any]]:
    if isinstance(value, dict):
        for key, item in value.items():
            if key == "session_options" and isinstance(item, dict):
                yield item
            else:
                yield from _session_options(item)
    elif isinstance(value, list):
        for item in value:
            yield from _session_options(item)


def set_provider(config: dict[str, Any], provider: str) -> bool:
    """Sets the execution provider of every session in ``config`` (in place); returns whether it changed.

    ``cpu`` empties ``provider_options``; ``cuda`` makes it ``[{"cuda": {...}}]``, keeping options already given.
    """
    if provider not in GENAI_PROVIDERS:
        raise InvalidArgumentError(f"Unknown onnxruntime-genai provider '{provider}': use one of {GENAI_PROVIDERS}.")
    changed = False
    sessions = list(_session_options(config["model"]))
    if not sessions and isinstance(config["model"].get("decoder"), dict):
        sessions = [config["model"]["decoder"].setdefault("session_options", {})]
    for options in sessions:
        old = options.get("provider_options") or []
        if provider == "cpu":
            new: list[Any] = []
        else:
            kept = [entry for entry in old if isinstance(entry, dict) and provider in entry]
            new = kept[:1] or [{provider: {}}]
        if new != old:
            options["provider_options"] = new
            changed = True
    return changed


def _string_values(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _string_values(item)
    elif isinstance(value, list):
        for item in value:
            yield from _string_values(item)


@dataclass
class GenaiCarry:
    """The onnxruntime-genai files carried from the input model's folder to the output's folder.

    Made by :meth:`plan` before a tool does its work (a broken config fails fast), written by :meth:`write`
    after the model is saved; ``to_json()`` is the report's ``genai`` entry.
    """

    source: Path
    destination: Path
    config: dict[str, Any]
    files: list[str] = field(default_factory=list)
    changes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    kv_dtype: str | None = None
    """The KV cache's element type in the written model (onnxruntime-genai reads it there, not in the config)."""
    written: bool = False

    @classmethod
    def plan(
        cls, input_path: str | os.PathLike, output_path: str | os.PathLike, provider: str | None = None
    ) -> GenaiCarry | None:
        """What to carry from ``input_path``'s folder to ``output_path``'s, or None when nothing is carried.

        Nothing is carried when the input's folder has no ``genai_config.json``, when the output is in the input's
        folder, or when the config does not name the input file (each logged as one line).

        Raises:
            ModelLoadError: The input's ``genai_config.json`` is not a readable config.
            InvalidArgumentError: ``provider`` is not one of :data:`GENAI_PROVIDERS`.
        """
        if provider is not None and provider not in GENAI_PROVIDERS:
            raise InvalidArgumentError(
                f"Unknown onnxruntime-genai provider '{provider}': use one of {', '.join(GENAI_PROVIDERS)}."
            )
        source_model, output = Path(input_path), Path(output_path)
        folder = genai_folder(source_model)
        if folder is None:
            if provider is not None:
                logger.warning(
                    "--genai_provider %s is ignored: '%s' has no %s beside it.", provider, source_model, GENAI_CONFIG
                )
            return None
        config = read_config(folder)
        destination = output.resolve().parent
        if destination == folder.resolve():
            logger.warning(
                "The output is in the input's onnxruntime-genai folder '%s': %s and the tokenizer files are not "
                "carried (that would overwrite the input's config); write into another folder to get a folder "
                "onnxruntime-genai loads.",
                folder,
                GENAI_CONFIG,
            )
            return None
        if not any(entry["filename"] == source_model.name for _, entry in _filename_entries(config)):
            named = sorted({entry["filename"] for _, entry in _filename_entries(config)})
            logger.warning(
                "%s in '%s' names %s, not the input '%s': the onnxruntime-genai files are not carried.",
                GENAI_CONFIG,
                folder,
                named or "no model file",
                source_model.name,
            )
            return None
        carry = cls(source=folder, destination=destination, config=copy.deepcopy(config))
        for where, entry in _filename_entries(carry.config):
            if entry["filename"] == source_model.name and output.name != source_model.name:
                carry.changes.append(f"{where}: {entry['filename']} -> {output.name}")
                entry["filename"] = output.name
        if provider is not None and set_provider(carry.config, provider):
            carry.changes.append(f"provider: {provider}")
        referenced = {value for value in _string_values(config) if "/" not in value and "\\" not in value}
        for path in sorted(folder.iterdir()):
            if not path.is_file() or path.name == GENAI_CONFIG or _MODEL_FILE.fullmatch(path.name):
                continue
            if _CARRIED.fullmatch(path.name) or path.name in referenced:
                carry.files.append(path.name)
        carry.files.append(GENAI_CONFIG)
        return carry

    def write(self, model: ir.Model | None = None) -> None:
        """Copies the files and writes the updated config into the output's folder (each file atomically).

        Args:
            model: The model as saved: its input/output names are checked against the config's (warnings), and its
                KV cache type is reported.
        """
        config_path = self.destination / GENAI_CONFIG
        if config_path.is_file():
            self._check_not_another_model(config_path)
        for name in self.files:
            if name == GENAI_CONFIG:
                write_atomically(config_path, json.dumps(self.config, indent=4) + "\n")
            else:
                with atomic_path(self.destination / name) as tmp:
                    shutil.copyfile(self.source / name, tmp)
        if self.files:
            if model is not None:
                self._check_io(model)
            for _where, entry in _filename_entries(self.config):
                if not (self.destination / entry["filename"]).is_file():
                    self.warnings.append(
                        f"{GENAI_CONFIG} also names '{entry['filename']}', which is not in '{self.destination}': "
                        "copy it there (or run the tool on it with the same output folder)."
                    )
            self.written = True
        for warning in self.warnings:
            logger.warning("%s", warning)
        logger.info("%s", self.summary)

    def _check_not_another_model(self, existing: Path) -> None:
        """Refuses to replace the config of another model that sits in the output folder."""
        try:
            other = json.loads(existing.read_text())
            names = {entry["filename"] for _, entry in _filename_entries(other)}
        except (OSError, ValueError, TypeError, KeyError, AttributeError):
            return  # not a config we can read: it is replaced
        ours = {entry["filename"] for _, entry in _filename_entries(self.config)}
        others = sorted(n for n in names - ours if (self.destination / n).is_file())
        if others:
            self.warnings.append(
                f"'{existing}' belongs to another model ({', '.join(others)}): the onnxruntime-genai files are not "
                "carried; write the output into a folder of its own."
            )
            self.files = []

    def _check_io(self, model: ir.Model) -> None:
        decoder = self.config["model"].get("decoder")
        if not isinstance(decoder, dict):
            return
        names = {str(v.name) for v in model.graph.inputs} | {str(v.name) for v in model.graph.outputs}
        layers = int(decoder.get("num_hidden_layers") or 0)
        wanted: list[str] = []
        for group in ("inputs", "outputs"):
            for key, pattern in (decoder.get(group) or {}).items():
                if not isinstance(pattern, str):
                    continue
                if "%d" in pattern:
                    wanted += [pattern % i for i in range(layers)]
                elif key in ("input_ids", "logits"):  # the others are optional (genai feeds what the model has)
                    wanted.append(pattern)
        missing = [name for name in wanted if name not in names]
        if missing:
            self.warnings.append(
                f"The model lacks {len(missing)} input/output names {GENAI_CONFIG} gives (e.g. '{missing[0]}'): "
                "onnxruntime-genai will not run it; fix the names in the config."
            )
        past = (decoder.get("inputs") or {}).get("past_key_names")
        if isinstance(past, str) and "%d" in past:
            first = past % 0
            for value in model.graph.inputs:
                if value.name == first and value.dtype is not None:
                    self.kv_dtype = str(value.dtype.numpy().name)

    @property
    def summary(self) -> str:
        if not self.written:
            return f"onnxruntime-genai files not carried to '{self.destination}'"
        changed = f"; config: {', '.join(self.changes)}" if self.changes else ""
        kv = f"; KV cache {self.kv_dtype}" if self.kv_dtype else ""
        return f"Carried {', '.join(self.files)} to '{self.destination}'{changed}{kv}"

    def to_json(self) -> dict[str, Any]:
        """``source`` and ``destination`` folders, the ``files`` carried, the config ``changes``, the model's
        ``kv_dtype`` and ``warnings``."""
        return {
            "source": str(self.source),
            "destination": str(self.destination),
            "files": list(self.files) if self.written else [],
            "changes": list(self.changes),
            "kv_dtype": self.kv_dtype,
            "warnings": list(self.warnings),
        }
