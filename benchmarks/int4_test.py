"""The INT4 benchmark: storage accounting, an end-to-end run of onnxprec's tools on a tiny stack, the report."""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest

import zoo

from . import int4, report_int4
from .harness import RunConfig
from .int4 import ideal_bytes, quantizable_weights, quantized_storage
from .report_common import load_results


def test_ideal_bytes_counts_half_a_byte_a_weight_and_one_scale_per_block() -> None:
    # K = 576 is 4.5 blocks of 128: 5 scales per column, the last block partial (no padding in the ideal)
    assert ideal_bytes([(576, 10)], 128, zero_point=False) == (4 * 576 * 10 + 5 * 10 * 32) // 8
    assert ideal_bytes([(576, 10)], 128, zero_point=True) == (4 * 576 * 10 + 5 * 10 * 36) // 8
    assert ideal_bytes([(576, 10)], -1, zero_point=False, scale_bits=16) == (4 * 576 * 10 + 10 * 16) // 8


def test_tools_have_distinct_ids_and_commands() -> None:
    for plan in int4.PLANS.values():
        for tools in plan.values():  # every row of a model's table is a different configuration
            assert len({int4.TOOLS[t].user_command() for t in tools}) == len(tools)
    assert all(t.venv in ("project", "anchors", "torch") for t in int4.TOOLS.values())
    assert set(int4.PLANS["all"]) == {int4.LLM, int4.SYNTHETIC}
    # the genai plan runs the compared onnxprec rows on both models; the smollm2 plan is unchanged by it
    assert set(int4.PLANS["genai"][int4.LLM]) <= set(int4.PLANS["genai"][int4.GENAI])
    assert "builder:default" not in int4.PLANS["smollm2"][int4.LLM]
    assert int4.TOOLS["builder:k_quant_mixed"].user_command().endswith("algo_config=k_quant_mixed")


@pytest.fixture(scope="module")
def tiny_stack(tmp_path_factory: pytest.TempPathFactory) -> Path:
    zoo_dir = tmp_path_factory.mktemp("zoo")
    zoo.build_model("matmul_0.002gb", zoo_dir)
    return zoo_dir


@pytest.mark.slow  # runs the harness: a process per measured command
def test_end_to_end_on_a_tiny_stack(tiny_stack: Path, tmp_path: Path) -> None:
    config = RunConfig(
        models=["matmul_0.002gb"],
        tools=["onnxprec:rtn:random", "onnxprec:awq_lite:random"],
        results_dir=tmp_path / "results",
        work_dir=tmp_path,
        zoo_dir=tiny_stack,
        timeout_s=300,
        command="pytest",
        repeats=1,  # one process per tool: every assertion is about a run, none about the rounds' median
    )
    path = int4.run(config)
    assert path.name.startswith("int4-")
    data = json.loads(path.read_text())
    assert data["kind"] == "int4"
    entry = data["models"]["matmul_0.002gb"]
    layers = entry["quantizable_layers"]
    assert layers >= 1
    for tool in config.tools or []:
        rec = entry["tools"][tool]
        assert rec["status"] == "ok", rec.get("error")
        assert rec["peak_rss_mb"] > 0 and rec["wall_s"] > 0
        assert rec["layers"] == layers
        # onnxprec writes exactly the ideal: packed nibbles and one float32 scale per block and column
        assert rec["layer_bytes"] == rec["ideal_bytes"]
    # the work folder (outputs, calibration files) is removed
    assert not list(tmp_path.glob("onnxprec-int4-*"))


@pytest.mark.slow
def test_storage_of_a_quantized_model_matches_its_tensors(tiny_stack: Path, tmp_path: Path) -> None:
    from onnxprec.quantization.int4 import quantize_file

    src = zoo.model_path("matmul_0.002gb", tiny_stack)
    dst = tmp_path / "q.onnx"
    # random weights: every layer at 4 bits (the accuracy guard would keep some at 8 on random data)
    quantize_file(src, dst, calibration_method="rtn", block_size=32, use_zero_point=True, accuracy_guard=False)
    storage = quantized_storage(dst)
    weights = quantizable_weights(src)
    assert storage["layers"] == len(weights)
    assert storage["layer_bytes"] == ideal_bytes(weights, 32, zero_point=True)
    model = onnx.load(str(dst), load_external_data=False)
    assert {n.op_type for n in model.graph.node} >= {"DequantizeLinear", "MatMul"}
    assert storage["file_bytes"] >= storage["layer_bytes"]


def _result(tools: dict[str, dict[str, object]]) -> dict[str, object]:
    return {
        "kind": "int4",
        "date": "2026-11-26T12:00:00",
        "command": "python -m benchmarks int4",
        "machine": {"cpu": "test", "cores": 2},
        "versions": {"project": {"git": "abc"}, "anchors": {}},
        "settings": {"calibration": "c", "evaluation": "e"},
        "models": {
            report_int4.LLM: {"fp32": {"perplexity": 20.0, "file_bytes": 100}, "tools": tools},
            report_int4.SYNTHETIC: {
                "fp32": {"file_bytes": 4 << 30},
                "tools": {"onnxprec:rtn:random": {"status": "ok", "peak_rss_mb": 900.0, "wall_s": 60.0}},
            },
        },
    }


def _row(ppl: float | None, wall: float, block: int = 128, rss: float = 500.0, status: str = "ok") -> dict[str, object]:
    return {
        "tool": {"block_size": block, "zero_point": False, "output_format": "qdq"},
        "status": status,
        "perplexity": ppl,
        "wall_s": wall,
        "convert_s": wall / 2,
        "peak_rss_mb": rss,
        "layer_bytes": 1010,
        "ideal_bytes": 1000,
        "layers": 7,
    }


def test_report_targets_pick_the_best_block_128_method(tmp_path: Path) -> None:
    tools = {
        "modelopt:awq_clip": _row(30.0, 1000.0),
        "onnxprec:rtn": _row(28.0, 8.0),
        "onnxprec:awq_gptq": _row(25.0, 90.0),
        "onnxprec:awq_gptq:b32": _row(22.0, 95.0, block=32),  # more accurate, but not block 128
        "modelopt:awq_lite": {"tool": {"block_size": 128}, "status": "failed", "error": "boom | x", "wall_s": 3.0},
    }
    (tmp_path / "int4-2026-11-26-x.json").write_text(json.dumps(_result(tools)))
    text = "\n".join(report_int4.sections(tmp_path))
    merged = report_int4.merge(load_results(tmp_path, "int4"))
    assert report_int4.best_ours(merged) == "onnxprec:awq_gptq"
    rows = {r[0]: r for r in report_int4.targets(merged)}
    ppl = next(r for k, r in rows.items() if "perplexity increase" in k)
    assert ppl[1].startswith("**0.50×**") and ppl[3] == "✅"  # (25 - 20) / (30 - 20)
    time = next(r for k, r in rows.items() if "time" in k)
    assert time[1].startswith("**0.090×**") and time[3] == "✅"
    size = next(r for k, r in rows.items() if "size" in k)
    assert "+1.00 %" in size[1] and size[3] == "✅"
    assert "**failed**: boom \\| x" in text  # a crash is reported with its message, table-safe
    assert "4 GB MatMul stack" in text


def test_report_genai_section_targets_and_ratios(tmp_path: Path) -> None:
    def rounds(*walls: float) -> list[dict[str, object]]:
        return [{"status": "ok", "wall_s": w} for w in walls]

    genai = {
        "onnxprec:awq_gptq:zp": _row(22.5, 100.0),
        "onnxprec:rtn:zp": {**_row(29.0, 12.0, rss=480.0), "rounds": rounds(12.0, 13.0), "file_bytes": 172_800_000},
        "builder:default": _row(29.0, 60.0),
    }
    own = {"onnxprec:rtn:zp": {**_row(28.0, 8.0, rss=400.0), "rounds": rounds(8.0, 9.0)}}
    result = _result({})
    result["models"] = {
        report_int4.GENAI: {
            "fp32": {"perplexity": 19.76, "file_bytes": 540_300_000},
            "tools": genai,
            "genai_decode": {
                "onnxprec:rtn:b32:matmulnbits:all": {"decode_tokens_per_s": 90.0, "rounds": [90.0]},
                "builder:default": {"decode_tokens_per_s": 80.0, "rounds": [80.0]},
            },
        },
        report_int4.LLM: {"fp32": {"perplexity": 20.0}, "tools": own},
    }
    (tmp_path / "int4-2026-11-26-genai.json").write_text(json.dumps(result))
    merged = report_int4.merge(load_results(tmp_path, "int4"))
    assert report_int4.LLM not in merged.rows  # the genai plan's own-export rows stay out of the INT4 table
    text = "\n".join(report_int4.genai_section(merged))
    assert "| awq_gptq (block 128, zero points, QDQ, lm_head excluded) perplexity | **22.50** | ≤ 22.8 | ✅ |" in text
    assert "**1.12×** (90 vs 80 tok/s; median of the per-round ratios 1.12×, rounds 1.12) | ≥ 1× | ✅" in text
    assert "| onnxprec:rtn:zp | 12.0 s / 8.00 s | **1.50×** | 480 / 400 MiB | **1.20×** | ❌ |" in text
    assert "| 540.3 |" in text and "| 172.8 |" in text  # model files in MB of 10^6 bytes


def test_report_is_empty_without_int4_results(tmp_path: Path) -> None:
    assert report_int4.sections(tmp_path) == []


def test_report_fp16_frontier_and_the_decode_goal_at_the_same_size(tmp_path: Path) -> None:
    budget = "onnxprec:awq_gptq:budget86.5:matmulnbits"
    fp32_run = _result({})
    fp32_run["models"] = {
        report_int4.GENAI: {
            "fp32": {"perplexity": 19.76, "file_bytes": 540_300_000},
            "tools": {
                budget: {**_row(22.0, 200.0), "file_bytes": 86_300_000},
                "builder:default": {**_row(29.0, 10.0), "file_bytes": 86_500_000},
            },
            "genai_decode": {
                budget: {
                    "decode_tokens_per_s": 50.0,
                    "rounds": [50.0, 45.0, 60.0],
                    "prefill_ms": 700.0,
                    "prefill_rounds": [700.0, 710.0, 690.0],
                },
                "builder:default": {"decode_tokens_per_s": 55.0, "rounds": [55.0, 60.0, 50.0]},
            },
        }
    }
    fp16_run = _result({})
    fp16_run["date"] = "2026-11-26T13:00:00"
    big, small = (
        {**_row(ppl, 100.0), "tool": {"block_size": 128, "budget_mb": mb, "calibrated": True}, "file_bytes": mb * 1e6}
        for ppl, mb in ((20.3, 113.6), (22.0, 86.5))
    )
    fp16_run["models"] = {
        report_int4.GENAI_FP16: {
            "fp32": {"perplexity": 19.762, "file_bytes": 270_200_000},
            "tools": {"onnxprec:awq_gptq:budget113.6": big, "onnxprec:awq_gptq:budget86.5": small},
            "genai_decode": {
                "fp32": {"decode_tokens_per_s": 9.0, "rounds": [9.0], "prefill_ms": 2000.0, "prefill_rounds": [2000.0]}
            },
        }
    }
    (tmp_path / "int4-2026-11-26-a.json").write_text(json.dumps(fp32_run))
    (tmp_path / "int4-2026-11-27-b.json").write_text(json.dumps(fp16_run))
    merged = report_int4.merge(load_results(tmp_path, "int4"))
    genai = "\n".join(report_int4.genai_section(merged))
    # paired per-round ratios 50/55, 45/60, 60/50 -> median 0.909: within 10 %
    assert "**0.91×** (median of the per-round ratios 0.75, 0.91, 1.20; 50 vs 55 tok/s; 86.3 vs 86.5 MB)" in genai
    assert "| ≥ 0.9× | ✅ |" in genai and "| 700 (700, 710, 690) [I1] |" in genai
    fp16 = "\n".join(report_int4.fp16_section(merged))
    lines = [line for line in fp16.splitlines() if line.startswith("| ")]
    assert (
        lines[1].startswith("| FP16 (builder `-p fp16`) | – | **19.76** | 270.2 |")
        and "| 2000 (2000) [I2] | 9.0 (9.0) [I2] |" in lines[1]
    )
    assert "builder `-p int4` `default`" in lines[2]  # the builder's outputs from the FP32 run, beside the frontier
    assert lines[3].startswith("| onnxprec `awq_gptq:budget86.5` | --size_budget_mb 86.5, sym | 22.00 |")  # by size
    assert lines[4].startswith("| onnxprec `awq_gptq:budget113.6` |")


@pytest.mark.slow
def test_report_gpu_decode_columns_from_a_decode_only_run(tmp_path: Path) -> None:
    budget = "onnxprec:awq_gptq:budget86.5:matmulnbits"
    cpu = {"decode_tokens_per_s": 50.0, "rounds": [50.0], "prefill_ms": 700.0, "prefill_rounds": [700.0]}
    cpu_run = _result({})
    cpu_run["models"] = {
        report_int4.GENAI: {
            "fp32": {"perplexity": 19.76, "file_bytes": 540_300_000},
            "tools": {budget: {**_row(22.0, 200.0), "file_bytes": 86_300_000}, "builder:default": _row(29.0, 10.0)},
            "genai_decode": {budget: cpu, "builder:default": cpu},
        }
    }
    gpu_run = _result({})  # what `int4 --decode-from DIR --providers cuda` writes: no rows, no FP32
    gpu_run["date"] = "2026-11-27T00:30:00"
    gpu_run["settings"].update(providers="cuda", card="NVIDIA H100 80GB HBM3", genai="0.18.0")
    speeds = {"rounds": [400.0, 300.0, 500.0], "prefill_ms": 5.0, "prefill_rounds": [5.0, 6.0, 4.0]}
    gpu_run["models"] = {
        report_int4.GENAI: {
            "providers": "cuda",
            "genai_decode": {
                budget: {**speeds, "decode_tokens_per_s": 400.0},
                "builder:default": {**speeds, "decode_tokens_per_s": 400.0, "rounds": [200.0, 300.0, 400.0]},
            },
        }
    }
    (tmp_path / "int4-2026-11-26-a.json").write_text(json.dumps(cpu_run))
    (tmp_path / "int4-2026-11-27-gpu.json").write_text(json.dumps(gpu_run))
    merged = report_int4.merge(load_results(tmp_path, "int4"))
    assert merged.fp32[report_int4.GENAI]["perplexity"] == 19.76  # the GPU run replaces neither FP32 nor CPU speeds
    text = "\n".join(report_int4.genai_section(merged))
    assert "| decode tok/s | H100 prefill 256 tok ms | H100 decode tok/s | run |" in text
    row = next(line for line in text.splitlines() if line.startswith(f"| onnxprec `{budget.partition(':')[2]}`"))
    assert "| 700 (700) [I1] | 50 (50; 1.00× builder default in that run) [I1] | 5.0 (5.0, 6.0, 4.0) [I2] |" in row
    assert "| 400 (400, 300, 500; 1.00× builder default in that run) [I2] | [I1] |" in row
    # per-round ratios 400/200, 300/300, 500/400 -> median 1.25
    assert "(same size and format; H100, CUDA) | **1.25×** (median of the per-round ratios 1.00, 1.25, 2.00;" in text
    assert "onnxruntime-genai 0.18.0 decode and prefill only, cuda: NVIDIA H100 80GB HBM3" in "\n".join(
        report_int4.runs_list(merged)
    )
