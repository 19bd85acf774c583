"""The INT4 part of BENCHMARKS.md: the INT4 issue's targets, the SmolLM2 table, CPU latency and the 4 GB stack.

Reads ``benchmarks/results/int4-*.json`` (:mod:`benchmarks.int4`); for every (model, tool) the newest measurement
wins, and the FP32 perplexity and latencies come from the newest run that has them. Formatting is
:mod:`benchmarks.report_common`'s.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .report_common import TEXT, load_results, model_label, num, run_lines, size, table

LLM = "smollm2_135m"
GENAI = "smollm2_genai"  # the genai plan (benchmarks.int4): the builder's SmolLM2, and the same runs on LLM
GENAI_COMPARED = ("onnxprec:autocast", "onnxprec:rtn:zp", "onnxprec:awq_lite:zp")
GENAI_PPL_GOAL = 22.8
GENAI_RATIO_GOAL = 1.2
SYNTHETIC = "matmul_4gb"
ANCHOR = "modelopt:awq_clip"  # the best anchor (the yardstick)
PERPLEXITY_RATIO_GOAL = 0.6
TIME_RATIO_GOAL = 0.1
RTN_SECONDS_GOAL = 10.0
RSS_GOAL_MB = 1.5 * 1024
SIZE_GOAL = 0.02
SYNTHETIC_RSS_GOAL_MB = 1024.0


@dataclass
class Int4Merged:
    """The newest row of every (model, tool), the run it came from, and per model the newest FP32 and latency."""

    rows: dict[str, dict[str, dict[str, Any]]]
    fp32: dict[str, dict[str, Any]]
    latency: dict[str, tuple[dict[str, Any], int]]
    runs: list[dict[str, Any]]
    compare: dict[str, dict[str, Any]]
    """The genai plan's runs on the zoo export (LLM), kept apart from the INT4 table."""
    decode: dict[str, dict[str, Any]]
    """onnxruntime-genai decode tokens/s of the genai plan's models, the newest per model."""
    decode_runs: dict[int, dict[str, dict[str, Any]]]
    """Every run's decode tokens/s (ratios are taken within one run)."""


def merge(runs: Sequence[dict[str, Any]]) -> Int4Merged:
    rows: dict[str, dict[str, dict[str, Any]]] = {}
    fp32: dict[str, dict[str, Any]] = {}
    lat: dict[str, tuple[dict[str, Any], int]] = {}
    compare: dict[str, dict[str, Any]] = {}
    decode: dict[str, dict[str, Any]] = {}
    decode_runs: dict[int, dict[str, dict[str, Any]]] = {}
    for run in runs:
        genai = GENAI in run.get("models", {})
        for model, entry in run.get("models", {}).items():
            if genai and model == LLM:
                compare.update({t: {**rec, "run": run["number"]} for t, rec in entry.get("tools", {}).items()})
                continue
            fp32[model] = {**entry.get("fp32", {}), "run": run["number"]}
            for tool, rec in entry.get("tools", {}).items():
                rows.setdefault(model, {})[tool] = {**rec, "run": run["number"]}
            if entry.get("latency"):
                lat[model] = (entry["latency"], run["number"])
            decode.update({k: {**v, "run": run["number"]} for k, v in entry.get("genai_decode", {}).items()})
            if entry.get("genai_decode"):
                decode_runs[run["number"]] = entry["genai_decode"]
    return Int4Merged(rows, fp32, lat, list(runs), compare, decode, decode_runs)


def _ours(tool: str) -> bool:
    return tool.startswith("onnxprec:")


def _delta(m: Int4Merged, tool: str) -> float | None:
    rec = m.rows.get(LLM, {}).get(tool, {})
    base = m.fp32.get(LLM, {}).get("perplexity")
    if rec.get("perplexity") is None or base is None:
        return None
    return float(rec["perplexity"] - base)


def best_ours(m: Int4Merged) -> str | None:
    """onnxprec's most accurate block-128 result on SmolLM2 (lowest held-out perplexity)."""
    cands = [
        t
        for t, r in m.rows.get(LLM, {}).items()
        if _ours(t) and r.get("tool", {}).get("block_size") == 128 and r.get("perplexity") is not None
    ]
    return min(cands, key=lambda t: m.rows[LLM][t]["perplexity"]) if cands else None


def _mark(ok: bool | None) -> str:
    return "–" if ok is None else ("✅" if ok else "❌")


def _run_ref(rec: dict[str, Any] | None) -> str:
    return f"[I{rec['run']}]" if rec and "run" in rec else "–"


def targets(m: Int4Merged) -> list[list[str]]:
    rows: list[list[str]] = []
    llm = m.rows.get(LLM, {})
    best = best_ours(m)
    anchor = llm.get(ANCHOR)
    d_best, d_anchor = (_delta(m, best) if best else None), _delta(m, ANCHOR)
    r = d_best / d_anchor if d_best is not None and d_anchor else None
    rows.append(
        [
            "SmolLM2: best method's perplexity increase over FP32 ≤ 0.6× ModelOpt awq_clip's",
            f"**{num(r)}×** ({best}: +{num(d_best, 3)} vs +{num(d_anchor, 3)})" if r is not None else "–",
            f"≤ {PERPLEXITY_RATIO_GOAL}×",
            _mark(None if r is None else r <= PERPLEXITY_RATIO_GOAL),
            _run_ref(llm.get(best) if best else None),
        ]
    )
    t_best = llm.get(best, {}).get("wall_s") if best else None
    t_anchor = anchor.get("wall_s") if anchor else None
    tr = t_best / t_anchor if t_best and t_anchor else None
    rows.append(
        [
            "SmolLM2: best method's whole-process time < 1/10 of ModelOpt awq_clip's",
            f"**{num(tr, 3)}×** ({num(t_best)} s vs {num(t_anchor)} s)" if tr is not None else "–",
            f"< {TIME_RATIO_GOAL}×",
            _mark(None if tr is None else tr < TIME_RATIO_GOAL),
            _run_ref(llm.get(best) if best else None),
        ]
    )
    rtn = llm.get("onnxprec:rtn")
    conv = rtn.get("convert_s") if rtn else None
    rows.append(
        [
            "SmolLM2: RTN in seconds (load, quantize, save)",
            f"**{num(conv)} s** (whole process {num(rtn.get('wall_s'))} s)" if rtn and conv is not None else "–",
            f"≤ {num(RTN_SECONDS_GOAL)} s",
            _mark(None if conv is None else conv <= RTN_SECONDS_GOAL),
            _run_ref(rtn),
        ]
    )
    ours = {t: r for t, r in llm.items() if _ours(t) and r.get("peak_rss_mb")}
    if ours:
        worst = max(ours, key=lambda t: ours[t]["peak_rss_mb"])
        peak = ours[worst]["peak_rss_mb"]
        rows.append(
            [
                f"SmolLM2: peak RSS of every onnxprec method < 1.5 GB ({len(ours)} configurations)",
                f"**{num(peak, 0)} MiB** at most ({worst})",
                "< 1536 MiB",
                _mark(peak < RSS_GOAL_MB),
                _run_ref(ours[worst]),
            ]
        )
    sized = {
        t: r
        for t, r in llm.items()
        if _ours(t) and r.get("ideal_bytes") and r.get("layer_bytes") and r["tool"].get("output_format") == "qdq"
    }
    if sized:
        excess = {t: r["layer_bytes"] / r["ideal_bytes"] - 1 for t, r in sized.items()}
        worst = max(excess, key=lambda t: excess[t])
        rows.append(
            [
                "SmolLM2: quantized layers' size within 2 % of the ideal (4 bits a weight + scales + zero points), "
                "QDQ output",
                f"**{excess[worst] * 100:+.2f} %** at most ({worst})",
                "≤ +2 %",
                _mark(excess[worst] <= SIZE_GOAL),
                _run_ref(sized[worst]),
            ]
        )
    for tool in ("onnxprec:rtn:random", "onnxprec:awq_lite:random"):
        rec = m.rows.get(SYNTHETIC, {}).get(tool)
        if rec is None:
            continue
        peak = rec.get("peak_rss_mb")
        rows.append(
            [
                f"4 GB MatMul stack (external data), {tool.split(':')[1]} with random calibration: peak RSS < 1 GB",
                f"**{num(peak, 0)} MiB**" if peak else f"**{rec.get('status')}**",
                "< 1024 MiB",
                _mark(None if peak is None else peak < SYNTHETIC_RSS_GOAL_MB and rec.get("status") == "ok"),
                _run_ref(rec),
            ]
        )
    return rows


def _label(tool: str) -> str:
    family, _, rest = tool.partition(":")
    name = {
        "onnxprec": "onnxprec",
        "modelopt": "ModelOpt",
        "ort": "ORT MatMulNBitsQuantizer",
        "builder": "onnxruntime-genai builder `-p int4`",
    }.get(family, family)
    return f"{name} `{rest}`" if rest else name


def _config(rec: dict[str, Any]) -> str:
    t = rec.get("tool", {})
    block = t.get("block_size")
    b = "per-channel" if block is not None and block <= 0 else str(block)
    if t.get("budget_mb"):  # each layer's precision chosen within the budget
        b = f"--size_budget_mb {t['budget_mb']:g}" + ("" if t.get("calibrated") else ", no data")
    return f"{b}, {'asym' if t.get('zero_point') else 'sym'}" + (
        ", MatMulNBits" if t.get("output_format") == "matmulnbits" else ""
    )


def llm_table(m: Int4Merged) -> str:
    llm = m.rows.get(LLM, {})
    base = m.fp32.get(LLM, {}).get("perplexity")
    d_anchor = _delta(m, ANCHOR)
    header = [
        "Tool, method",
        "block, scale",
        "held-out ppl",
        "Δ vs FP32",
        "Δ / awq_clip's Δ",
        "time s",
        "peak RSS",
        "quantized layers: size vs ideal",
        "run",
    ]
    rows = [
        [
            "FP32 (no quantization)",
            "–",
            f"**{num(base, 3)}**",
            "–",
            "–",
            "–",
            "–",
            size(m.fp32.get(LLM, {}).get("file_bytes")) + " (whole file)",
            _run_ref(m.fp32.get(LLM)),
        ]
    ]
    for tool, rec in llm.items():
        if rec.get("status") != "ok":
            err = str(rec.get("error", "")).replace("|", "\\|")[:140]
            rows.append(
                [
                    _label(tool),
                    _config(rec),
                    f"**{rec.get('status')}**: {err}",
                    "–",
                    "–",
                    num(rec.get("wall_s")),
                    "–",
                    "–",
                    _run_ref(rec),
                ]
            )
            continue
        d = _delta(m, tool)
        ppl = _ppl(rec)
        lb, ib = rec.get("layer_bytes"), rec.get("ideal_bytes")
        sz = f"{size(lb)} ({(lb / ib - 1) * 100:+.1f} %, {rec.get('layers')} layers)" if lb and ib else "–"
        rows.append(
            [
                _label(tool),
                _config(rec),
                ppl,
                f"+{num(d, 3)}" if d is not None else "–",
                f"{num(d / d_anchor)}×" if d is not None and d_anchor else "–",
                num(rec.get("wall_s")),
                f"{num(rec.get('peak_rss_mb'), 0)} MiB" if rec.get("peak_rss_mb") else "–",
                sz,
                _run_ref(rec),
            ]
        )
    return table(header, rows)


def _ppl(rec: dict[str, Any]) -> str:
    """A row's held-out perplexity, with the KL divergence from the FP32 logits and top-1 agreement when measured."""
    if rec.get("perplexity") is None:
        return str(rec.get("perplexity_error", "–"))
    extra = f" (KL {num(rec['kl'], 4)}, top-1 {rec['top1'] * 100:.1f} %)" if rec.get("kl") is not None else ""
    return num(rec["perplexity"], 3) + extra


def latency_table(m: Int4Merged) -> list[str]:
    if LLM not in m.latency:
        return []
    lat, run = m.latency[LLM]
    pre, dec = lat.get("prefill", {}), lat.get("decode", {})
    base_p, base_d = pre.get("fp32", {}).get("median_ms"), dec.get("fp32", {}).get("median_ms")
    anchor_p, anchor_d = pre.get(ANCHOR, {}).get("median_ms"), dec.get(ANCHOR, {}).get("median_ms")
    rows = []
    for key in pre:
        p, d = pre[key].get("median_ms"), dec.get(key, {}).get("median_ms")
        if p is None and d is None:
            rows.append([_label(key) if key != "fp32" else "FP32", pre[key].get("error", "failed")[:80], *["–"] * 5])
            continue
        rows.append(
            [
                "FP32" if key == "fp32" else _label(key),
                num(p, 3),
                f"{num(base_p / p)}×" if p and base_p else "–",
                f"{num(anchor_p / p)}×" if p and anchor_p else "–",
                num(d, 3),
                f"{num(base_d / d)}×" if d and base_d else "–",
                f"{num(anchor_d / d)}×" if d and anchor_d else "–",
            ]
        )
    header = [
        "Model",
        "prefill [1,256] ms",
        "speed-up vs FP32",
        "vs ModelOpt awq_clip",
        "1-token forward ms",
        "speed-up vs FP32",
        "vs ModelOpt awq_clip",
    ]
    return [
        f"### ONNX Runtime CPU latency, SmolLM2-135M — run [I{run}]",
        "",
        TEXT["int4.latency"],
        "",
        table(header, rows),
        "",
    ]


def synthetic_table(m: Int4Merged) -> list[str]:
    rows_in = m.rows.get(SYNTHETIC, {})
    if not rows_in:
        return []
    fp = m.fp32.get(SYNTHETIC, {})
    rows = []
    for tool, rec in rows_in.items():
        lb, ib = rec.get("layer_bytes"), rec.get("ideal_bytes")
        rows.append(
            [
                _label(tool),
                rec.get("status", "?") + (f": {rec.get('error', '')[:100]}" if rec.get("status") != "ok" else ""),
                num(rec.get("wall_s")),
                f"{num(rec.get('peak_rss_mb'), 0)} MiB" if rec.get("peak_rss_mb") else "–",
                size(rec.get("file_bytes")),
                f"{(lb / ib - 1) * 100:+.1f} %" if lb and ib else "–",
                _run_ref(rec),
            ]
        )
    return [
        f"### {model_label(SYNTHETIC)}: {size(fp.get('file_bytes'))} of FP32 weights in external data",
        "",
        table(["Tool, method", "status", "time s", "peak RSS", "output size", "layers vs ideal", "run"], rows),
        "",
    ]


def runs_list(m: Int4Merged) -> list[str]:
    out = []
    for r in m.runs:
        data = r["settings"]
        settings = f"data: {data.get('calibration', '')}; perplexity on {data.get('evaluation', '')}"
        out += [*run_lines(r, f"I{r['number']}", settings), ""]
    return out


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def genai_section(m: Int4Merged) -> list[str]:
    """The builder's SmolLM2 (KV cache, contrib ops): every INT4 row, the targets, and the time/RSS comparison
    with the same onnxprec runs on the zoo export."""
    rows_in = m.rows.get(GENAI, {})
    if not rows_in:
        return []
    fp = m.fp32.get(GENAI, {})

    def dec(key: str) -> str:
        d = m.decode.get(key, {})
        if "error" in d:
            return "failed: " + d["error"][:80].replace("|", "\\|")
        t = d.get("decode_tokens_per_s")
        r = _ratio(t, m.decode_runs.get(d.get("run", -1), {}).get("builder:default", {}).get("decode_tokens_per_s"))
        rounds = ", ".join(num(x, 1) for x in d.get("rounds", []))
        vs = f"; {num(r)}× builder default in that run" if r is not None else ""
        return f"{num(t, 1)} ({rounds}{vs}) [I{d['run']}]" if t else "–"

    rows = [["FP32 (builder `-p fp32 -e cpu`)", "–", f"**{num(fp.get('perplexity'), 3)}**"]]
    rows[0] += [f"{(fp.get('file_bytes') or 0) / 1e6:.1f}", "–", "–", dec("fp32"), _run_ref(fp)]
    for tool, rec in rows_in.items():
        if tool == "onnxprec:autocast":
            label = "onnxprec AutoCast FP16 (default flags)"
        else:
            label = _label(tool)
        if rec.get("status") != "ok":
            err = str(rec.get("error", "")).replace("|", "\\|")[:140]
            rows.append([label, _config(rec), f"**{rec.get('status')}**: {err}", "–", num(rec.get("wall_s")), "–"])
            rows[-1] += ["–", _run_ref(rec)]
            continue
        ppl = _ppl(rec)
        rss = f"{num(rec.get('peak_rss_mb'), 0)}" if rec.get("peak_rss_mb") else "–"
        mb = f"{rec['file_bytes'] / 1e6:.1f}" if rec.get("file_bytes") else "–"
        cfg = "FP16" if tool == "onnxprec:autocast" else _config(rec)
        rows.append([label, cfg, ppl, mb, num(rec.get("wall_s")), rss, dec(tool), _run_ref(rec)])
    gptq = rows_in.get("onnxprec:awq_gptq:zp", {}).get("perplexity")
    ours, builder = m.decode.get("onnxprec:rtn:b32:matmulnbits:all", {}), m.decode.get("builder:default", {})
    speed = _ratio(ours.get("decode_tokens_per_s"), builder.get("decode_tokens_per_s"))
    paired = sorted(a / b for a, b in zip(ours.get("rounds", []), builder.get("rounds", [])) if b)
    paired_median = paired[len(paired) // 2] if paired and ours.get("run") == builder.get("run") else None
    goals = [
        [
            "awq_gptq (block 128, zero points, QDQ, lm_head excluded) perplexity",
            f"**{num(gptq, 3)}**",
            f"≤ {GENAI_PPL_GOAL}",
            _mark(None if gptq is None else gptq <= GENAI_PPL_GOAL),
        ],
        [
            "onnxprec rtn MatMulNBits block 32 sym, every layer (`:all`, the builder's format) decode tok/s vs "
            "builder default INT4",
            f"**{num(speed)}×** ({num(ours.get('decode_tokens_per_s'), 1)} vs "
            f"{num(builder.get('decode_tokens_per_s'), 1)} tok/s; median of the per-round ratios "
            f"{num(paired_median)}×, rounds {', '.join(num(x) for x in paired)})",
            "≥ 1×",
            _mark(None if speed is None else speed >= 1.0 and (paired_median or 1.0) >= 1.0),
        ],
    ]
    compare = []
    for tool in GENAI_COMPARED:
        g, z = rows_in.get(tool, {}), m.compare.get(tool, {})
        tr, rr = _ratio(g.get("wall_s"), z.get("wall_s")), _ratio(g.get("peak_rss_mb"), z.get("peak_rss_mb"))
        compare.append(
            [
                tool,
                f"{num(g.get('wall_s'))} s / {num(z.get('wall_s'))} s",
                f"**{num(tr)}×**",
                f"{num(g.get('peak_rss_mb'), 0)} / {num(z.get('peak_rss_mb'), 0)} MiB",
                f"**{num(rr)}×**",
                _mark(None if tr is None or rr is None else max(tr, rr) <= GENAI_RATIO_GOAL),
                ", ".join(f"{num(x.get('wall_s'))}" for x in g.get("rounds", []))
                + " / "
                + ", ".join(f"{num(x.get('wall_s'))}" for x in z.get("rounds", [])),
            ]
        )
    return [
        "### SmolLM2-135M built by onnxruntime-genai's builder (KV cache, GroupQueryAttention, contrib ops)",
        "",
        TEXT["int4.genai"],
        "",
        table(
            [
                "Tool, method",
                "block, scale",
                "ppl (8-15)",
                "model files MB",
                "time s",
                "peak RSS MiB",
                "decode tok/s",
                "run",
            ],
            rows,
        ),
        "",
        table(["Target (KV-cache issue)", "Measured", "Goal", ""], goals),
        "",
        "Same onnxprec runs on the builder model and on our own export (`smollm2_135m.onnx`, no KV cache), "
        "alternating round by round in one run: builder / own export (target ≤ 1.2× for both time and peak RSS).",
        "",
        table(["Tool", "time (median)", "ratio", "peak RSS", "ratio", "", "time per round, builder / own"], compare),
        "",
    ]


def sections(results_dir: Path) -> list[str]:
    """The INT4 part of BENCHMARKS.md (empty without INT4 results)."""
    runs = load_results(results_dir, "int4")
    if not runs:
        return []
    m = merge(runs)
    out = [
        "## INT4 weight-only quantization (INT4 issue)",
        "",
        TEXT["int4.intro"],
        "",
        *runs_list(m),
        "### Targets (INT4 issue)",
        "",
        table(["Target", "Measured", "Goal", "", "run"], targets(m)),
        "",
        f"### {model_label(LLM)}: accuracy, time, memory, size",
        "",
        llm_table(m),
        "",
        TEXT["int4.llm.notes"],
        "",
        *latency_table(m),
        *synthetic_table(m),
        *genai_section(m),
    ]
    return out
