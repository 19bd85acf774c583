"""The onnxruntime-genai deployment check on SmolLM2-135M as the model builder writes it (slow; skips without the zoo).

The folders come from ../shared/zoo/genai/build.sh (in ~/.cache/onnxprec/zoo/genai). INT4 outputs of the FP32 and
FP16 builds must load in ``onnxruntime_genai.Model`` from the folder the tool wrote (config and tokenizer carried)
and generate; the FP16 build's config names CUDA, so its output is written with ``genai_provider="cpu"``.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from onnxprec._genai import GENAI_CONFIG
from onnxprec.evaluate import generate_models
from onnxprec.quantization.int4 import quantize_file

pytest.importorskip("onnxruntime_genai", reason="onnxruntime-genai is not installed (pip install '.[genai-cpu]')")

ZOO = Path(os.environ.get("ONNXPREC_GENAI_ZOO", Path.home() / ".cache/onnxprec/zoo/genai"))
pytestmark = pytest.mark.slow


def _folder(name: str) -> Path:
    folder = ZOO / name
    if not (folder / GENAI_CONFIG).is_file():
        pytest.skip(f"{folder} is absent: build it with ../shared/zoo/genai/build.sh {ZOO}")
    return folder


def _digest(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}


def test_builder_folders_generate_on_the_cpu() -> None:
    fp32, fp16 = _folder("smollm2_fp32"), _folder("smollm2_fp16")
    assert json.loads((fp16 / GENAI_CONFIG).read_text())["model"]["decoder"]["session_options"]["provider_options"]
    before = _digest(fp16)
    report = generate_models([fp32 / "model.onnx", fp16], num_prompts=1, max_new_tokens=12)
    ref, half = report.models
    assert [len(s) for s in ref.sequences] == [12] and [len(s) for s in half.sequences] == [12]
    assert ref.texts is not None and ref.texts[0].strip()
    assert half.agreement is not None and half.first_divergence is not None
    assert _digest(fp16) == before  # the CUDA config was changed in memory only


@pytest.mark.parametrize(
    ("base", "output_format", "provider"),
    [("smollm2_fp32", "qdq", None), ("smollm2_fp32", "matmulnbits", None), ("smollm2_fp16", "matmulnbits", "cpu")],
)
def test_int4_output_folder_loads_and_generates(
    base: str, output_format: str, provider: str | None, tmp_path: Path
) -> None:
    import onnxruntime_genai as og

    source = _folder(base)
    out = tmp_path / "int4"
    out.mkdir()
    report = quantize_file(
        source / "model.onnx",
        out / "model.int4.onnx",
        calibration_method="rtn",
        output_format=output_format,
        genai_provider=provider,
    )
    assert report.genai is not None and report.genai.written and not report.genai.warnings
    config = json.loads((out / GENAI_CONFIG).read_text())
    assert config["model"]["decoder"]["filename"] == "model.int4.onnx"
    if provider == "cpu":
        assert config["model"]["decoder"]["session_options"]["provider_options"] == []
    model = og.Model(str(out))  # the carried config as written, provider included
    tokenizer = og.Tokenizer(model)
    params = og.GeneratorParams(model)
    prompt = tokenizer.encode("The Python language reference describes")
    params.set_search_options(max_length=len(prompt) + 8, do_sample=False)
    generator = og.Generator(model, params)
    generator.append_tokens(prompt)
    while not generator.is_done():
        generator.generate_next_token()
    assert len(generator.get_sequence(0)) == len(prompt) + 8


def test_autocast_fp16_output_folder_generates_like_fp32(tmp_path: Path) -> None:
    import numpy as np

    from onnxprec.autocast import convert_file

    source = _folder("smollm2_fp32")
    out = tmp_path / "fp16"
    out.mkdir()
    ids = np.random.default_rng(0).integers(0, 49152, (2, 32), dtype=np.int64)
    np.savez(tmp_path / "ids.npz", input_ids=ids)
    report = convert_file(source / "model.onnx", out / "model.fp16.onnx", calibration_data=str(tmp_path / "ids.npz"))
    assert report.genai is not None and report.genai.kv_dtype == "float16"
    assert report.genai.changes == ["model.decoder.filename: model.onnx -> model.fp16.onnx"]
    generated = generate_models([source, out], num_prompts=1, max_new_tokens=12)
    assert [len(s) for s in generated.models[1].sequences] == [12]
    divergence = generated.models[1].first_divergence
    assert divergence is not None and (divergence[0] is None or divergence[0] >= 8)
