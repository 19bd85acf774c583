"""onnxprec evaluate --generate: greedy generation through onnxruntime-genai on tiny genai folders."""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from onnxprec._options import signature_mismatches
from onnxprec._testing import make_genai_folder
from onnxprec.errors import InvalidArgumentError, ModelLoadError, UnsupportedModelError
from onnxprec.evaluate import EvaluateOptions, generate_models
from onnxprec.evaluate._generate import import_genai
from onnxprec.quantization.int4 import quantize_file

og = pytest.importorskip("onnxruntime_genai", reason="onnxruntime-genai is not installed (pip install '.[genai-cpu]')")


def _digest(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}


def _greedy(folder: Path, prompt: list[int], new: int) -> list[int]:
    """Direct onnxruntime-genai greedy generation: the tokens after the prompt."""
    config = og.Config(str(folder))
    config.clear_providers()
    model = og.Model(config)
    params = og.GeneratorParams(model)
    params.set_search_options(do_sample=False, max_length=len(prompt) + new)
    generator = og.Generator(model, params)
    generator.append_tokens(np.array(prompt, np.int32))
    while not generator.is_done():
        generator.generate_next_token()
    return [int(t) for t in generator.get_sequence(0)][len(prompt) :]


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("generate")
    reference = make_genai_folder(root / "fp32")
    (root / "int4").mkdir()
    quantize_file(reference, root / "int4" / "model.onnx", calibration_method="rtn", block_size=16, nodes_to_exclude=[])
    return reference.parent, root / "int4"


def test_tokens_speed_and_agreement(folders: tuple[Path, Path]) -> None:
    fp32, int4 = folders
    report = generate_models([fp32 / "model.onnx", int4], ["Hello there", "ab"], max_new_tokens=10)
    ref, cand = report.models
    assert ref.is_reference and ref.name == "fp32/model" and cand.name == "int4/model"
    assert report.prompts == [[75, 104, 111, 111, 114, 35, 119, 107, 104, 117, 104], [100, 101]]  # bytes + 3
    for result, folder in ((ref, fp32), (cand, int4)):
        assert result.sequences == [_greedy(folder, p, 10) for p in report.prompts]
        assert result.prompt_tokens == 13 and result.generated_tokens == sum(map(len, result.sequences))
        assert result.decode_steps == result.generated_tokens - 2
        assert result.prefill_tokens_per_s is not None and result.prefill_tokens_per_s > 0
        assert result.decode_tokens_per_s is not None and result.decode_tokens_per_s > 0
        assert result.texts is not None and len(result.texts) == 2
    equal = sum(a == b for r, c in zip(ref.sequences, cand.sequences) for a, b in zip(r, c))
    assert cand.agreement == pytest.approx(equal / 20)
    expected = [
        next((i for i, (a, b) in enumerate(zip(r, c)) if a != b), None) for r, c in zip(ref.sequences, cand.sequences)
    ]
    assert cand.first_divergence == expected
    assert ref.agreement is None
    data = report.to_json()
    assert data["mode"] == "generate" and data["models"][1]["agreement"] == pytest.approx(cand.agreement, abs=1e-6)
    table = report.table()
    assert "decode tok/s" in table and "fp32/model (ref)" in table


def test_same_model_agrees_and_a_file_the_config_does_not_name_loads(
    folders: tuple[Path, Path], tmp_path: Path
) -> None:
    fp32, _ = folders
    copy = tmp_path / "fp32"
    shutil.copytree(fp32, copy)
    shutil.copyfile(copy / "model.onnx", copy / "other.onnx")
    before = _digest(copy)
    report = generate_models([copy, copy / "other.onnx"], max_new_tokens=8)
    other = report["fp32/other"]
    assert other.model_file == "other.onnx"
    assert other.agreement == 1.0 and other.identical == 3 and other.first_divergence == [None] * 3
    assert _digest(copy) == before  # the config is overlaid in memory, never written


def test_token_id_prompts_from_data(folders: tuple[Path, Path], tmp_path: Path) -> None:
    fp32, _ = folders
    ids = np.arange(3, 3 + 40, dtype=np.int64).reshape(4, 10)
    np.save(tmp_path / "ids.npy", ids)
    report = generate_models([fp32], data=tmp_path / "ids.npy", prompt_tokens=6, num_prompts=3, max_new_tokens=5)
    assert report.prompts == ids[:3, :6].tolist() and report.prompt_texts is None
    assert report.models[0].sequences == [_greedy(fp32, p, 5) for p in report.prompts]
    np.savez(tmp_path / "ids.npz", input_ids=ids[:1])
    assert generate_models([fp32], data=tmp_path / "ids.npz", max_new_tokens=2).prompts == ids[:1].tolist()


def test_cpu_run_of_a_cuda_folder(tmp_path: Path) -> None:
    path = make_genai_folder(tmp_path / "cuda", provider="cuda")
    before = _digest(path.parent)
    report = generate_models([path], ["hi"], max_new_tokens=4, providers=["cpu"])
    assert report.provider == "cpu" and len(report.models[0].sequences[0]) == 4
    assert _digest(path.parent) == before


def test_errors(tmp_path: Path, folders: tuple[Path, Path]) -> None:
    fp32, _ = folders
    plain = tmp_path / "plain"
    plain.mkdir()
    shutil.copyfile(fp32 / "model.onnx", plain / "model.onnx")
    with pytest.raises(
        ModelLoadError, match=r"^'.*plain' has no genai_config\.json: onnxruntime-genai loads the folder"
    ):
        generate_models([plain / "model.onnx"])
    bare = make_genai_folder(tmp_path / "bare", tokenizer=False)
    with pytest.raises(InvalidArgumentError, match=r"has no tokenizer files .* give token ids with --data ids\.npy"):
        generate_models([bare], ["text"])
    assert generate_models([bare], data=np.array([[5, 6, 7]]), max_new_tokens=2).models[0].texts is None
    with pytest.raises(InvalidArgumentError, match="not both"):
        generate_models([fp32], ["x"], data=np.array([[5, 6]]))
    with pytest.raises(InvalidArgumentError, match=r"Generation runs on cpu or cuda\[:N\]"):
        generate_models([fp32], ["x"], providers=["trt"])
    with pytest.raises(InvalidArgumentError, match=r"passes the context length of 'fp32/model' \(64\)"):
        generate_models([fp32], ["x"], max_new_tokens=100)
    with pytest.raises(ModelLoadError, match="does not exist"):
        generate_models([tmp_path / "nope.onnx"])


def test_missing_genai_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "onnxruntime_genai", None)
    with pytest.raises(UnsupportedModelError, match=r"pip install 'onnxprec\[genai-cpu\]'"):
        import_genai()


def test_cli(folders: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from onnxprec.cli import main

    fp32, int4 = folders
    out = tmp_path / "gen.json"
    code = main(["evaluate", str(fp32 / "model.onnx"), str(int4 / "model.onnx"), "--generate", "--prompts", "Hi",
                 "--max_new_tokens", "6", "--report_json", str(out)])  # fmt: skip
    assert code == 0
    data = json.loads(out.read_text())
    assert data["mode"] == "generate" and [m["name"] for m in data["models"]] == ["fp32/model", "int4/model"]
    assert "prefill tok/s" in capsys.readouterr().out


def test_api_matches_the_options() -> None:
    assert signature_mismatches(generate_models, EvaluateOptions, skip=("models", "data", "providers")) == []
