"""onnxruntime-genai folders: what the tools carry beside their output, and that the result loads and generates."""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

import numpy as np
import onnx
import pytest

from onnxprec._genai import GENAI_CONFIG, GenaiCarry, has_tokenizer, read_config, set_provider
from onnxprec._testing import make_genai_folder
from onnxprec.autocast import convert_file
from onnxprec.errors import ModelLoadError
from onnxprec.preprocess import PreprocessOptions, preprocess_file
from onnxprec.quantization.int4 import quantize_file

CARRIED = ["chat_template.jinja", "tokenizer.json", "tokenizer_config.json", GENAI_CONFIG]


def _digest(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}


def _generate(folder: Path, prompt: list[int], length: int = 12) -> list[int]:
    og = pytest.importorskip("onnxruntime_genai", reason="onnxruntime-genai is not installed (the genai extras)")
    config = og.Config(str(folder))
    config.clear_providers()
    model = og.Model(config)
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=length, do_sample=False)
    generator = og.Generator(model, params)
    generator.append_tokens(np.array(prompt, np.int32))
    while not generator.is_done():
        generator.generate_next_token()
    return [int(t) for t in generator.get_sequence(0)]


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    return make_genai_folder(tmp_path / "in").parent


def test_int4_output_gets_the_folder_and_generates(folder: Path, tmp_path: Path) -> None:
    before = _digest(folder)
    out = tmp_path / "out"
    out.mkdir()
    report = quantize_file(
        folder / "model.onnx", out / "model.int4.onnx", calibration_method="rtn", block_size=16, nodes_to_exclude=[]
    )
    assert _digest(folder) == before  # the input folder is never written
    assert report.genai is not None
    assert sorted(report.genai.files) == sorted(CARRIED)
    for name in CARRIED[:-1]:
        assert (out / name).read_bytes() == (folder / name).read_bytes()
    config = json.loads((out / GENAI_CONFIG).read_text())
    assert config["model"]["decoder"]["filename"] == "model.int4.onnx"
    expected = json.loads((folder / GENAI_CONFIG).read_text())
    expected["model"]["decoder"]["filename"] = "model.int4.onnx"
    assert config == expected  # nothing else changed
    assert report.genai.changes == ["model.decoder.filename: model.onnx -> model.int4.onnx"]
    assert report.to_json()["genai"]["files"] == report.genai.files
    assert sorted(p.name for p in out.iterdir()) == sorted([*CARRIED, "model.int4.onnx"])  # no temporary files
    assert len(_generate(out, [5, 6, 7])) == 12


def test_autocast_fp16_kv_is_read_from_the_model(folder: Path, tmp_path: Path) -> None:
    out = tmp_path / "fp16"
    out.mkdir()
    report = convert_file(folder / "model.onnx", out / "model.onnx", data_max=float("inf"))
    assert report.genai is not None and report.genai.written
    kv = {i.name: i.type.tensor_type.elem_type for i in onnx.load(out / "model.onnx").graph.input}
    assert kv["past_key_values.0.key"] == onnx.TensorProto.FLOAT16
    assert report.genai.kv_dtype == "float16"
    assert report.genai.changes == []  # same file name; genai reads the KV type from the model
    assert json.loads((out / GENAI_CONFIG).read_text()) == json.loads((folder / GENAI_CONFIG).read_text())
    reference, fp16 = _generate(folder, [5, 6, 7]), _generate(out, [5, 6, 7])
    assert fp16[:3] == [5, 6, 7] and len(fp16) == len(reference)


def test_preprocess_carries_and_sets_the_provider(tmp_path: Path) -> None:
    source = make_genai_folder(tmp_path / "cuda", provider="cuda")
    before = _digest(source.parent)
    out = tmp_path / "cpu"
    out.mkdir()
    report = preprocess_file(source, out / "model.pre.onnx", PreprocessOptions(genai_provider="cpu"))
    assert report.genai is not None
    config = json.loads((out / GENAI_CONFIG).read_text())
    assert config["model"]["decoder"]["session_options"]["provider_options"] == []
    assert config["model"]["decoder"]["filename"] == "model.pre.onnx"
    assert "provider: cpu" in report.genai.changes
    assert report.to_json()["genai"]["changes"] == report.genai.changes
    assert _digest(source.parent) == before
    original = json.loads((source.parent / GENAI_CONFIG).read_text())
    assert original["model"]["decoder"]["session_options"]["provider_options"] == [{"cuda": {"enable_cuda_graph": "0"}}]
    assert len(_generate(out, [9, 10])) == 12


def test_output_in_the_input_folder_carries_nothing(folder: Path, caplog: pytest.LogCaptureFixture) -> None:
    before = _digest(folder)
    with caplog.at_level(logging.WARNING, logger="onnxprec"):
        report = quantize_file(
            folder / "model.onnx", folder / "model.int4.onnx", calibration_method="rtn", block_size=16
        )
    assert report.genai is None
    after = _digest(folder)
    assert after.pop("model.int4.onnx")
    assert after == before  # the input's config is untouched
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "write into another folder" in warnings[0]


def test_no_genai_folder_no_carry(tmp_path: Path) -> None:
    path = make_genai_folder(tmp_path / "in")
    (path.parent / GENAI_CONFIG).unlink()
    (tmp_path / "out").mkdir()
    report = quantize_file(path, tmp_path / "out" / "q.onnx", calibration_method="rtn", block_size=16)
    assert report.genai is None and report.to_json()["genai"] is None
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["q.onnx"]


def test_config_naming_another_file_is_not_carried(tmp_path: Path) -> None:
    path = make_genai_folder(tmp_path / "in", name="decoder.onnx")
    other = path.with_name("other.onnx")
    other.write_bytes(path.read_bytes())
    (tmp_path / "out").mkdir()
    assert GenaiCarry.plan(other, tmp_path / "out" / "q.onnx") is None
    assert GenaiCarry.plan(path, tmp_path / "out" / "q.onnx") is not None


def test_another_models_config_in_the_output_folder_is_kept(folder: Path, tmp_path: Path) -> None:
    out = make_genai_folder(tmp_path / "other", name="theirs.onnx", seed=1).parent
    before = _digest(out)
    report = quantize_file(folder / "model.onnx", out / "mine.onnx", calibration_method="rtn", block_size=16)
    assert report.genai is not None and not report.genai.written
    assert "belongs to another model" in report.genai.warnings[0]
    after = _digest(out)
    assert after.pop("mine.onnx")
    assert after == before


@pytest.mark.slow
def test_a_rerun_replaces_its_own_config(folder: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    quantize_file(folder / "model.onnx", out / "q.onnx", calibration_method="rtn", block_size=16)
    report = quantize_file(folder / "model.onnx", out / "q.onnx", calibration_method="rtn", block_size=16)
    assert report.genai is not None and report.genai.written


def test_a_broken_config_fails_before_the_work(folder: Path, tmp_path: Path) -> None:
    (folder / GENAI_CONFIG).write_text("{not json")
    (tmp_path / "out").mkdir()
    with pytest.raises(ModelLoadError, match=r"genai_config\.json. is not readable JSON \(JSONDecodeError"):
        quantize_file(folder / "model.onnx", tmp_path / "out" / "q.onnx", calibration_method="rtn", block_size=16)
    assert list((tmp_path / "out").iterdir()) == []


def test_missing_io_names_are_reported(folder: Path, tmp_path: Path) -> None:
    config = json.loads((folder / GENAI_CONFIG).read_text())
    config["model"]["decoder"]["inputs"]["past_key_names"] = "past.%d.k"
    (folder / GENAI_CONFIG).write_text(json.dumps(config))
    (tmp_path / "out").mkdir()
    report = quantize_file(folder / "model.onnx", tmp_path / "out" / "q.onnx", calibration_method="rtn", block_size=16)
    assert report.genai is not None
    assert any("e.g. 'past.0.k'" in w for w in report.genai.warnings)


def test_set_provider_and_read_config(tmp_path: Path) -> None:
    folder = make_genai_folder(tmp_path / "f", provider="cuda", tokenizer=False).parent
    assert not has_tokenizer(folder)
    config = read_config(folder)
    assert set_provider(config, "cuda") is False  # already cuda: its options are kept
    assert set_provider(config, "cpu") is True
    assert config["model"]["decoder"]["session_options"]["provider_options"] == []
    assert set_provider(config, "cuda") is True
    assert config["model"]["decoder"]["session_options"]["provider_options"] == [{"cuda": {}}]
    with pytest.raises(ModelLoadError, match=r"has no genai_config\.json"):
        read_config(tmp_path)
