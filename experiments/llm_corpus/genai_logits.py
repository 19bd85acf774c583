"""Teacher-forced logits of a genai folder through onnxruntime-genai, for the models plain ORT sessions cannot run.

    python -m experiments.llm_corpus.genai_logits FOLDER IDS.npy OUT.npy [--provider cuda|cpu]

ORT's CUDA GroupQueryAttention with ``sliding_window_cache=1`` (the builder's Gemma2 and GPT-OSS in FP16) needs past
and present to share one buffer of capacity ``local_window_size``, which only onnxruntime-genai feeds: the sweep's
ORT sessions cannot run those models on CUDA. This feeds each window (rows of IDS.npy) one token at a time to a
genai generator and stacks the logits of every step, ``[windows, tokens, vocab]`` in float32: the logits a prefill
of the whole window would give. Run it in a Python that has onnxruntime-genai (CUDA build for ``cuda``).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

from onnxprec._genai import GENAI_PROVIDERS, set_provider


def genai_logits(folder: Path, ids: np.ndarray, provider: str) -> np.ndarray:
    """``[windows, tokens, vocab]`` float32 logits of ``folder`` (a copy with its provider set) on ``ids``."""
    import onnxruntime_genai as og

    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "m"
        shutil.copytree(folder, copy)
        config_path = copy / "genai_config.json"
        config = json.loads(config_path.read_text())
        set_provider(config, provider)
        config_path.write_text(json.dumps(config))
        model = og.Model(str(copy))
        out = []
        for window in ids:
            params = og.GeneratorParams(model)
            params.set_search_options(do_sample=False)
            generator = og.Generator(model, params)
            steps = []
            for token in window:
                generator.append_tokens(np.array([[int(token)]], np.int32))
                logits = np.asarray(generator.get_output("logits"))
                if logits.dtype == np.uint16:  # BF16 logits come back as their bits
                    import ml_dtypes

                    logits = logits.view(ml_dtypes.bfloat16)
                steps.append(logits.astype(np.float32).reshape(-1)[-config_size(config) :])
            out.append(np.stack(steps))
        return np.stack(out)


def config_size(config: dict) -> int:
    """The vocabulary size genai_config.json gives (the last axis of the logits)."""
    return int(config["model"]["vocab_size"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder", type=Path)
    ap.add_argument("ids", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--provider", default="cuda", choices=GENAI_PROVIDERS)
    a = ap.parse_args(argv)
    np.save(a.out, genai_logits(a.folder, np.load(a.ids), a.provider))
    return 0


if __name__ == "__main__":
    sys.exit(main())
