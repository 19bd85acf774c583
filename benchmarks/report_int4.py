"""The INT4 part of BENCHMARKS.md: the INT4 issue's targets, the SmolLM2 table, CPU latency and the 4 GB stack.

Reads ``benchmarks/results/int4-*.json`` (:mod:`benchmarks.int4`); for every (model, tool) the newest measurement
wins, and the FP32 perplexity and latencies come from the newest run that has them. Formatting is
:mod:`benchmarks.report_common`'s.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .int4 import BIGLLM, GENAI, GENAI_COMPARED, GENAI_FP16, LLM, SYNTHETIC
from .report_common import TEXT, Column, blocks, column_table, load_results, model_label, num, run_lines, size, table

DECODE_RATIO_GOAL = 0.9  # decode tok/s within 10 % of the builder's output of the same size and format
# onnxprec's rows in the builder's format at the builder outputs' sizes, and the builder output each is held to
SAME_SIZE = {
    "onnxprec:awq_gptq:budget86.5:matmulnbits": "builder:default",
    "onnxprec:awq_gptq:budget113.6:matmulnbits": "builder:k_quant_mixed",
}
GENAI_PPL_GOAL = 22.8
GENAI_RATIO_GOAL = 1.2
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
    decode: dict[str, dict[str, dict[str, Any]]]
    """Per base model: onnxruntime-genai decode tokens/s (and prefill ms) of each output, the newest per output."""
    decode_runs: dict[str, dict[int, dict[str, dict[str, Any]]]]
    """Per base model: every run's decode tokens/s (ratios are taken within one run)."""


def merge(runs: Sequence[dict[str, Any]]) -> Int4Merged:
    rows: dict[str, dict[str, dict[str, Any]]] = {}
    fp32: dict[str, dict[str, Any]] = {}
    lat: dict[str, tuple[dict[str, Any], int]] = {}
    compare: dict[str, dict[str, Any]] = {}
    decode: dict[str, dict[str, dict[str, Any]]] = {}
    decode_runs: dict[str, dict[int, dict[str, dict[str, Any]]]] = {}
    for run in runs:
        genai = GENAI in run.get("models", {})
        for model, entry in run.get("models", {}).items():
            if entry.get("providers", "cpu") != "cpu":  # a decode-only run on a GPU (int4 --decode-from): apart
                model = f"{model}@{entry['providers']}"
            if genai and model == LLM:
                compare.update({t: {**rec, "run": run["number"]} for t, rec in entry.get("tools", {}).items()})
                continue
            fp32[model] = {**entry.get("fp32", {}), "run": run["number"]}
            for tool, rec in entry.get("tools", {}).items():
                rows.setdefault(model, {})[tool] = {**rec, "run": run["number"]}
            if entry.get("latency"):
                lat[model] = (entry["latency"], run["number"])
            speeds = entry.get("genai_decode", {})
            decode.setdefault(model, {}).update({k: {**v, "run": run["number"]} for k, v in speeds.items()})
            if speeds:
                decode_runs.setdefault(model, {})[run["number"]] = speeds
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

    def goal(what: str, measured: str | None, limit: str, ok: bool | None, rec: dict[str, Any] | None) -> None:
        rows.append([what, "–" if measured is None else measured, limit, _mark(ok), _run_ref(rec)])

    llm = m.rows.get(LLM, {})
    best = best_ours(m)
    anchor, ours_best = llm.get(ANCHOR), llm.get(best) if best else None
    d_best, d_anchor = (_delta(m, best) if best else None), _delta(m, ANCHOR)
    r = d_best / d_anchor if d_best is not None and d_anchor else None
    goal(
        "SmolLM2: best method's perplexity increase over FP32 ≤ 0.6× ModelOpt awq_clip's",
        None if r is None else f"**{num(r)}×** ({best}: +{num(d_best, 3)} vs +{num(d_anchor, 3)})",
        f"≤ {PERPLEXITY_RATIO_GOAL}×",
        None if r is None else r <= PERPLEXITY_RATIO_GOAL,
        ours_best,
    )
    t_best, t_anchor = (ours_best or {}).get("wall_s"), (anchor or {}).get("wall_s")
    tr = t_best / t_anchor if t_best and t_anchor else None
    goal(
        "SmolLM2: best method's whole-process time < 1/10 of ModelOpt awq_clip's",
        None if tr is None else f"**{num(tr, 3)}×** ({num(t_best)} s vs {num(t_anchor)} s)",
        f"< {TIME_RATIO_GOAL}×",
        None if tr is None else tr < TIME_RATIO_GOAL,
        ours_best,
    )
    rtn = llm.get("onnxprec:rtn")
    conv = rtn.get("convert_s") if rtn else None
    goal(
        "SmolLM2: RTN in seconds (load, quantize, save)",
        f"**{num(conv)} s** (whole process {num(rtn.get('wall_s'))} s)" if rtn and conv is not None else None,
        f"≤ {num(RTN_SECONDS_GOAL)} s",
        None if conv is None else conv <= RTN_SECONDS_GOAL,
        rtn,
    )
    ours = {t: r for t, r in llm.items() if _ours(t) and r.get("peak_rss_mb")}
    if ours:
        worst = max(ours, key=lambda t: ours[t]["peak_rss_mb"])
        peak = ours[worst]["peak_rss_mb"]
        goal(f"SmolLM2: peak RSS of every onnxprec method < 1.5 GB ({len(ours)} configurations)",
             f"**{num(peak, 0)} MiB** at most ({worst})", "< 1536 MiB", peak < RSS_GOAL_MB, ours[worst])  # fmt: skip
    qdq = lambda r: r["tool"].get("output_format") == "qdq"  # noqa: E731
    excess = {t: e for t, r in llm.items() if _ours(t) and (e := _excess(r)) is not None and qdq(r)}
    if excess:
        worst = max(excess, key=lambda t: excess[t])
        goal("SmolLM2: quantized layers' size within 2 % of the ideal (4 bits a weight + scales + zero points), "
             "QDQ output", f"**{excess[worst] * 100:+.2f} %** at most ({worst})", "≤ +2 %",
             excess[worst] <= SIZE_GOAL, llm[worst])  # fmt: skip
    for tool in ("onnxprec:rtn:random", "onnxprec:awq_lite:random", "onnxprec:kquant:budget800:random"):
        if (rec := m.rows.get(SYNTHETIC, {}).get(tool)) is None:
            continue
        peak = rec.get("peak_rss_mb")
        how = tool.split(":")[1] + (" under --size_budget_mb 800" if "budget" in tool else "")
        goal(f"4 GB MatMul stack (external data), {how} with random calibration: peak RSS < 1 GB",
             f"**{num(peak, 0)} MiB**" if peak else f"**{rec.get('status')}**", "< 1024 MiB",
             None if peak is None else peak < SYNTHETIC_RSS_GOAL_MB and rec.get("status") == "ok", rec)  # fmt: skip
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


def _failed(rec: dict[str, Any]) -> str:
    return f"**{rec.get('status')}**: " + str(rec.get("error", "")).replace("|", "\\|")[:140]


def _excess(rec: dict[str, Any]) -> float | None:
    """How far the quantized layers' bytes are above the ideal (0.01: 1 %), None when not measured."""
    lb, ib = rec.get("layer_bytes"), rec.get("ideal_bytes")
    return lb / ib - 1 if lb and ib else None


# columns over the (tool, row) pairs of one model
_TOOL: Column = ("Tool, method", lambda x: _label(x[0]))
_CONFIG: Column = ("block, scale", lambda x: _config(x[1]))
_TIME: Column = ("time s", lambda x: num(x[1].get("wall_s")))
_RUN: Column = ("run", lambda x: _run_ref(x[1]))
_FILES: Column = ("model files MB", lambda x: f"{x[1]['file_bytes'] / 1e6:.1f}" if x[1].get("file_bytes") else "–")


def _rss(unit: str = " MiB") -> Callable[[tuple[str, dict[str, Any]]], str]:
    return lambda x: f"{num(x[1]['peak_rss_mb'], 0)}{unit}" if x[1].get("peak_rss_mb") else "–"


def llm_table(m: Int4Merged) -> str:
    d_anchor = _delta(m, ANCHOR)
    fp32 = m.fp32.get(LLM, {})
    first = ["FP32 (no quantization)", "–", f"**{num(fp32.get('perplexity'), 3)}**", *["–"] * 4]
    first += [size(fp32.get("file_bytes")) + " (whole file)", _run_ref(fp32)]
    columns: tuple[Column, ...] = (
        _TOOL,
        _CONFIG,
        ("held-out ppl", lambda x: _ppl(x[1]) if x[1].get("status") == "ok" else _failed(x[1])),
        ("Δ vs FP32", lambda x: f"+{num(d, 3)}" if (d := _delta(m, x[0])) is not None else "–"),
        (
            "Δ / awq_clip's Δ",
            lambda x: f"{num(d / d_anchor)}×" if (d := _delta(m, x[0])) is not None and d_anchor else "–",
        ),
        _TIME,
        ("peak RSS", _rss()),
        (
            "quantized layers: size vs ideal",
            lambda x: (
                "–"
                if (e := _excess(x[1])) is None
                else f"{size(x[1]['layer_bytes'])} ({e * 100:+.1f} %, {x[1].get('layers')} layers)"
            ),
        ),
        _RUN,
    )
    return column_table(columns, m.rows.get(LLM, {}).items(), [first]) or ""


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

    def ms(part: str, key: str) -> float | None:
        return lat.get(part, {}).get(key, {}).get("median_ms")

    def speedup(part: str, base: str) -> Column:
        return (
            "speed-up vs FP32" if base == "fp32" else "vs ModelOpt awq_clip",
            lambda k: f"{num(b / t)}×" if (t := ms(part, k)) and (b := ms(part, base)) else "–",
        )

    failed = lambda k: ms("prefill", k) is None and ms("decode", k) is None  # noqa: E731
    prefill = lambda k: lat["prefill"][k].get("error", "failed")[:80] if failed(k) else num(ms("prefill", k), 3)  # noqa: E731
    columns: tuple[Column, ...] = (
        ("Model", lambda k: "FP32" if k == "fp32" else _label(k)),
        ("prefill [1,256] ms", prefill),
        speedup("prefill", "fp32"),
        speedup("prefill", ANCHOR),
        ("1-token forward ms", lambda k: num(ms("decode", k), 3)),
        speedup("decode", "fp32"),
        speedup("decode", ANCHOR),
    )
    heading = f"### ONNX Runtime CPU latency, SmolLM2-135M — run [I{run}]"
    return [heading, "", TEXT["int4.latency"], "", column_table(columns, lat.get("prefill", {})) or "", ""]


def synthetic_table(m: Int4Merged) -> list[str]:
    rows_in = m.rows.get(SYNTHETIC, {})
    if not rows_in:
        return []
    columns: tuple[Column, ...] = (
        _TOOL,
        (
            "status",
            lambda x: (
                x[1].get("status", "?") + ("" if x[1].get("status") == "ok" else f": {x[1].get('error', '')[:100]}")
            ),
        ),
        _TIME,
        ("peak RSS", _rss()),
        ("output size", lambda x: size(x[1].get("file_bytes"))),
        ("layers vs ideal", lambda x: "–" if (e := _excess(x[1])) is None else f"{e * 100:+.1f} %"),
        _RUN,
    )
    fp_bytes = m.fp32.get(SYNTHETIC, {}).get("file_bytes")
    heading = f"### {model_label(SYNTHETIC)}: {size(fp_bytes)} of FP32 weights in external data"
    return [heading, "", column_table(columns, rows_in.items()) or "", ""]


def runs_list(m: Int4Merged) -> list[str]:
    out = []
    for r in m.runs:
        data = r["settings"]
        settings = f"data: {data.get('calibration', '')}; perplexity on {data.get('evaluation', '')}"
        if data.get("card"):
            settings = f"onnxruntime-genai {data.get('genai')} decode and prefill only, {data['providers']}: "
            settings += data["card"]
        out += [*run_lines(r, f"I{r['number']}", settings), ""]
    return out


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


PREFILL_TOKENS = 256


def _decode_cell(m: Int4Merged, model: str) -> Callable[[str], str]:
    """A row's decode tokens/s: median (every round; against the builder default measured in that run)."""
    speeds, runs = m.decode.get(model, {}), m.decode_runs.get(model, {})

    def cell(key: str) -> str:
        d = speeds.get(key, {})
        if "error" in d:
            return "failed: " + d["error"][:80].replace("|", "\\|")
        t = d.get("decode_tokens_per_s")
        r = _ratio(t, runs.get(d.get("run", -1), {}).get("builder:default", {}).get("decode_tokens_per_s"))
        rounds = ", ".join(num(x, 1) for x in d.get("rounds", []))
        vs = f"; {num(r)}× builder default in that run" if r is not None else ""
        return f"{num(t, 1)} ({rounds}{vs}) [I{d['run']}]" if t else "–"

    return cell


def _prefill_cell(m: Int4Merged, model: str) -> Callable[[str], str]:
    """A row's prefill time of one 256-token prompt in onnxruntime-genai: median ms (every round)."""
    speeds = m.decode.get(model, {})

    def cell(key: str) -> str:
        d = speeds.get(key, {})
        if d.get("prefill_ms") is None:
            return "–"
        rounds = ", ".join(num(x, 1) for x in d.get("prefill_rounds", []))  # 1 decimal under 10 ms (a GPU's)
        return f"{num(d['prefill_ms'], 1)} ({rounds}) [I{d['run']}]"

    return cell


def _card(m: Int4Merged, key: str) -> str | None:
    """The GPU (``H100``) of the newest decode-only run behind ``m.decode[key]``, None for CPU runs."""
    runs = {d.get("run") for d in m.decode.get(key, {}).values()}
    cards = [r["settings"].get("card") for r in m.runs if r["number"] in runs and r["settings"].get("card")]
    return cards[-1].removeprefix("NVIDIA ").split()[0] if cards else None


# The size-budget issue's goals on the builder's FP32 SmolLM2: (row, what, perplexity at most)
BUDGET_GOALS = (
    ("onnxprec:awq_gptq:budget113.6", "`--calibration_method awq_gptq --size_budget_mb 113.6` perplexity", 21.0),
    ("onnxprec:awq_gptq:budget86.5", "`--size_budget_mb 86.5` (awq_gptq) perplexity", 24.0),
    ("onnxprec:awq_gptq:budget86.5:nodata", "`--size_budget_mb 86.5` without data (the default, awq_gptq) perplexity",
     27.0),
)  # fmt: skip
BUDGET_SECONDS_GOAL, BUDGET_RSS_GOAL_MB = 240.0, 1.5 * 1024


def _budget_goals(rows: dict[str, dict[str, Any]]) -> list[list[str]]:
    """The size-budget goals: perplexity at each size, and the 113.6 MB run's time and peak RSS."""
    out = []
    for tool, what, goal in BUDGET_GOALS:
        rec = rows.get(tool, {})
        ppl = rec.get("perplexity")
        size_mb = (rec.get("file_bytes") or 0) / 1e6
        measured = f"**{num(ppl, 3)}** ({size_mb:.1f} MB) {_run_ref(rec)}" if ppl is not None else "–"
        out.append([what, measured, f"≤ {goal}", _mark(None if ppl is None else ppl <= goal)])
    rec = rows.get("onnxprec:awq_gptq:budget113.6", {})
    wall, rss = rec.get("wall_s"), rec.get("peak_rss_mb")
    ok = None if not wall or not rss else wall < BUDGET_SECONDS_GOAL and rss < BUDGET_RSS_GOAL_MB
    measured = f"**{num(wall)} s, {num(rss, 0)} MiB** {_run_ref(rec)}" if ok is not None else "–"
    limit = f"< {BUDGET_SECONDS_GOAL:.0f} s, < {BUDGET_RSS_GOAL_MB:.0f} MiB"
    return [
        *out,
        ["the 113.6 MB run (sensitivity included): whole-process time and peak RSS", measured, limit, _mark(ok)],
    ]


def _same_size_goals(m: Int4Merged, key: str = GENAI) -> list[list[str]]:
    """Decode speed of onnxprec's budget outputs in MatMulNBits against the builder output of the same size, in
    the same run: the median of the per-round ratios (``key``: the CPU runs, or ``GENAI@cuda``'s on a GPU)."""
    out = []
    speeds, runs, card = m.decode.get(key, {}), m.decode_runs.get(key, {}), _card(m, key)
    for ours_id, builder_id in SAME_SIZE.items():
        ours = speeds.get(ours_id, {})
        builder = runs.get(ours.get("run", -1), {}).get(builder_id, {})
        paired = sorted(a / b for a, b in zip(ours.get("rounds", []), builder.get("rounds", [])) if b)
        ratio = paired[len(paired) // 2] if paired else None
        mb = [(m.rows.get(GENAI, {}).get(t, {}).get("file_bytes") or 0) / 1e6 for t in (ours_id, builder_id)]
        what = f"onnxprec `{ours_id.partition(':')[2]}` decode tok/s vs {_label(builder_id)} (same size and format"
        what += f"; {card}, CUDA)" if card else ")"
        measured = (
            f"**{num(ratio)}×** (median of the per-round ratios {', '.join(num(x) for x in paired)}; "
            f"{num(ours.get('decode_tokens_per_s'), 1)} vs {num(builder.get('decode_tokens_per_s'), 1)} tok/s; "
            f"{mb[0]:.1f} vs {mb[1]:.1f} MB)"
        )
        ok = None if ratio is None else ratio >= DECODE_RATIO_GOAL
        out.append([what, measured if ok is not None else "–", f"≥ {DECODE_RATIO_GOAL}×", _mark(ok)])
    return out


def nodata_section(m: Int4Merged) -> list[str]:
    """The default method without calibration data: each no-data row against kquant's (the previous default) at the
    same budget, with the runs they come from."""
    rows_in = {t: r for t, r in m.rows.get(GENAI, {}).items() if t.endswith(":nodata") and r.get("status") == "ok"}
    if not rows_in:
        return []

    def budget(tool: str) -> str:
        return next((p[len("budget") :] for p in tool.split(":") if p.startswith("budget")), "")

    def base(tool: str) -> dict[str, Any]:
        b = budget(tool)
        return rows_in.get(f"onnxprec:kquant:budget{b}:nodata" if b else "onnxprec:kquant:nodata", {})

    def versus(x: tuple[str, dict[str, Any]], key: str, fmt: Callable[[float, float], str]) -> str:
        ref = base(x[0])
        a, b = x[1].get(key), ref.get(key)
        return "–" if a is None or b is None or ref is x[1] else fmt(a, b)

    columns: tuple[Column, ...] = (
        ("method", lambda x: f"`{x[0].split(':')[1]}`"),
        ("size budget", lambda x: f"{budget(x[0])} MB" if budget(x[0]) else "none (lm_head in float)"),
        ("ppl (8-15)", lambda x: _ppl(x[1])),
        _FILES,
        _TIME,
        ("peak RSS MiB", _rss("")),
        ("ppl vs kquant", lambda x: versus(x, "perplexity", lambda a, b: f"{a - b:+.2f}")),
        (
            "time vs kquant (same run)",
            lambda x: (
                versus(x, "wall_s", lambda a, b: f"{a / b:.2f}×")
                if base(x[0]).get("run") == x[1].get("run")
                else "other run"
            ),
        ),
        _RUN,
    )
    ordered = sorted(rows_in.items(), key=lambda x: (budget(x[0]) == "", budget(x[0]), x[1].get("wall_s") or 0))
    return blocks("### The default INT4 method without calibration data", TEXT["int4.nodata"],
                  column_table(columns, ordered) or "")  # fmt: skip


def fp16_section(m: Int4Merged) -> list[str]:
    """The size/perplexity frontier on the builder's FP16 SmolLM2, beside the builder's INT4 outputs."""
    rows_in = m.rows.get(GENAI_FP16, {})
    if not rows_in:
        return []
    fp = m.fp32.get(GENAI_FP16, {})
    dec, pre = _decode_cell(m, GENAI_FP16), _prefill_cell(m, GENAI_FP16)
    builder = {t: r for t, r in m.rows.get(GENAI, {}).items() if t.startswith("builder:")}
    base = ["FP16 (builder `-p fp16`)", "–", f"**{num(fp.get('perplexity'), 3)}**"]
    base += [f"{(fp.get('file_bytes') or 0) / 1e6:.1f}", "–", "–", pre("fp32"), dec("fp32"), _run_ref(fp)]
    ok = lambda x: x[1].get("status") == "ok"  # noqa: E731
    columns: tuple[Column, ...] = (
        ("Tool, method", lambda x: _label(x[0])),
        ("block, scale", lambda x: _config(x[1]) if not x[0].endswith(":zp") else "128, asym (no budget)"),
        ("ppl (8-15)", lambda x: _ppl(x[1]) if ok(x) else _failed(x[1])),
        _FILES,
        _TIME,
        ("peak RSS MiB", _rss("")),
        (f"prefill {PREFILL_TOKENS} tok ms", lambda x: pre(x[0]) if x[0] in rows_in else "–"),
        ("decode tok/s", lambda x: dec(x[0]) if x[0] in rows_in else "–"),
        _RUN,
    )
    ordered = sorted(rows_in.items(), key=lambda x: x[1].get("file_bytes") or 0)
    return blocks(
        "### SmolLM2-135M FP16 base (builder `-p fp16`): the size/perplexity frontier",
        TEXT["int4.genai_fp16"],
        column_table(columns, [*builder.items(), *ordered], [base]) or "",
    )


def genai_section(m: Int4Merged) -> list[str]:
    """The builder's SmolLM2 (KV cache, contrib ops): every INT4 row, the targets, and the time/RSS comparison
    with the same onnxprec runs on the zoo export."""
    rows_in = m.rows.get(GENAI, {})
    if not rows_in:
        return []
    fp = m.fp32.get(GENAI, {})

    dec, pre = _decode_cell(m, GENAI), _prefill_cell(m, GENAI)
    card, gpu = _card(m, f"{GENAI}@cuda"), (_prefill_cell(m, f"{GENAI}@cuda"), _decode_cell(m, f"{GENAI}@cuda"))
    fp32 = ["FP32 (builder `-p fp32 -e cpu`)", "–", f"**{num(fp.get('perplexity'), 3)}**"]
    fp32 += [f"{(fp.get('file_bytes') or 0) / 1e6:.1f}", "–", "–", pre("fp32"), dec("fp32")]
    fp32 += [*(f("fp32") for f in gpu if card), _run_ref(fp)]
    autocast = lambda x: x[0] == "onnxprec:autocast"  # noqa: E731
    ok = lambda x: x[1].get("status") == "ok"  # noqa: E731
    columns: tuple[Column, ...] = (
        ("Tool, method", lambda x: "onnxprec AutoCast FP16 (default flags)" if autocast(x) else _label(x[0])),
        ("block, scale", lambda x: "FP16" if autocast(x) and ok(x) else _config(x[1])),
        ("ppl (8-15)", lambda x: _ppl(x[1]) if ok(x) else _failed(x[1])),
        _FILES,
        _TIME,
        ("peak RSS MiB", _rss("")),
        (f"prefill {PREFILL_TOKENS} tok ms", lambda x: pre(x[0])),
        ("decode tok/s", lambda x: dec(x[0])),
        *(((f"{card} prefill {PREFILL_TOKENS} tok ms", lambda x: gpu[0](x[0])),) if card else ()),
        *(((f"{card} decode tok/s", lambda x: gpu[1](x[0])),) if card else ()),
        _RUN,
    )
    gptq = rows_in.get("onnxprec:awq_gptq:zp", {}).get("perplexity")
    speeds = m.decode.get(GENAI, {})
    ours = speeds.get("onnxprec:rtn:b32:matmulnbits:all", {})
    # the builder default measured in the same run (a later run may have measured it again)
    same_run = m.decode_runs.get(GENAI, {}).get(ours.get("run", -1), {}).get("builder:default")
    builder = {**same_run, "run": ours["run"]} if same_run else speeds.get("builder:default", {})
    speed = _ratio(ours.get("decode_tokens_per_s"), builder.get("decode_tokens_per_s"))
    paired = sorted(a / b for a, b in zip(ours.get("rounds", []), builder.get("rounds", [])) if b)
    paired_median = paired[len(paired) // 2] if paired and ours.get("run") == builder.get("run") else None
    ppl_goal = ["awq_gptq (block 128, zero points, QDQ, lm_head excluded) perplexity", f"**{num(gptq, 3)}**"]
    goals = [
        [*ppl_goal, f"≤ {GENAI_PPL_GOAL}", _mark(None if gptq is None else gptq <= GENAI_PPL_GOAL)],
        [
            "onnxprec rtn MatMulNBits block 32 sym, every layer (`:all`, the builder's format) decode tok/s vs "
            "builder default INT4",
            f"**{num(speed)}×** ({num(ours.get('decode_tokens_per_s'), 1)} vs "
            f"{num(builder.get('decode_tokens_per_s'), 1)} tok/s; median of the per-round ratios "
            f"{num(paired_median)}×, rounds {', '.join(num(x) for x in paired)})",
            "≥ 1×",
            _mark(None if speed is None else speed >= 1.0 and (paired_median or 1.0) >= 1.0),
        ],
        *_budget_goals(rows_in),
        *_same_size_goals(m),
        *(_same_size_goals(m, f"{GENAI}@cuda") if card else []),
    ]
    pairs = [(t, rows_in.get(t, {}), m.compare.get(t, {})) for t in GENAI_COMPARED]
    ratio = lambda x, key: _ratio(x[1].get(key), x[2].get(key))  # noqa: E731
    rounds = lambda rec: ", ".join(f"{num(r.get('wall_s'))}" for r in rec.get("rounds", []))  # noqa: E731

    def within(x: tuple[str, dict[str, Any], dict[str, Any]]) -> str:
        tr, rr = ratio(x, "wall_s"), ratio(x, "peak_rss_mb")
        return _mark(None if tr is None or rr is None else max(tr, rr) <= GENAI_RATIO_GOAL)

    compare: tuple[Column, ...] = (
        ("Tool", lambda x: x[0]),
        ("time (median)", lambda x: f"{num(x[1].get('wall_s'))} s / {num(x[2].get('wall_s'))} s"),
        ("ratio", lambda x: f"**{num(ratio(x, 'wall_s'))}×**"),
        ("peak RSS", lambda x: f"{num(x[1].get('peak_rss_mb'), 0)} / {num(x[2].get('peak_rss_mb'), 0)} MiB"),
        ("ratio", lambda x: f"**{num(ratio(x, 'peak_rss_mb'))}×**"),
        ("", within),
        ("time per round, builder / own", lambda x: f"{rounds(x[1])} / {rounds(x[2])}"),
    )
    return blocks(
        "### SmolLM2-135M built by onnxruntime-genai's builder (KV cache, GroupQueryAttention, contrib ops)",
        TEXT["int4.genai"],
        column_table(columns, rows_in.items(), [fp32]) or "",
        table(["Target (KV-cache issue)", "Measured", "Goal", ""], goals),
        "Same onnxprec runs on the builder model and on our own export (`smollm2_135m.onnx`, no KV cache), "
        "alternating round by round in one run: builder / own export (target ≤ 1.2× for both time and peak RSS).",
        column_table(compare, pairs) or "",
    )


def _bigllm_table(m: Int4Merged, model: str) -> str:
    """One billion-parameter LLM's rows: FP32 first, then by size."""
    fp32 = m.fp32.get(model, {})
    base = fp32.get("perplexity")
    speeds = m.decode.get(model, {})

    def decode(key: str) -> str:
        d = speeds.get(key, {})
        if d.get("error"):
            return "fails: " + str(d["error"])[:60]
        tokens = num(d.get("decode_tokens_per_s"), 1) if d.get("decode_tokens_per_s") is not None else "–"
        return f"{tokens} / {num(d.get('prefill_ms'), 0)}" if d.get("prefill_ms") is not None else tokens

    def delta(rec: dict[str, Any]) -> str:
        return f"+{num(rec['perplexity'] - base, 3)}" if rec.get("perplexity") and base else "–"

    first = ["FP32 (builder `-p fp32 -e cpu`)", f"{fp32.get('file_bytes', 0) / 1e6:.0f}", num(base, 3), "–", "–",
             "–", decode("fp32"), _run_ref(fp32)]  # fmt: skip
    columns: tuple[Column, ...] = (
        ("Tool", lambda x: f"{_label(x[0])}<br>`{x[1].get('user_command', '')}`"),
        ("model files MB", lambda x: f"{x[1]['file_bytes'] / 1e6:.0f}" if x[1].get("file_bytes") else "–"),
        ("held-out ppl", lambda x: _ppl(x[1]) if x[1].get("status") == "ok" else _failed(x[1])),
        ("Δ vs FP32", lambda x: delta(x[1])),
        _TIME,
        ("peak RSS", _rss()),
        ("decode tok/s / prefill ms", lambda x: decode(x[0])),
        _RUN,
    )
    ordered = sorted(m.rows.get(model, {}).items(), key=lambda x: x[1].get("file_bytes") or 0)
    return column_table(columns, ordered, [first]) or ""


def bigllm_section(m: Int4Merged) -> list[str]:
    """The billion-parameter LLMs (``--plan bigllm``): one table per model."""
    out: list[str] = []
    for model in BIGLLM:
        if m.rows.get(model):
            out += blocks(f"### {model_label(model)}", _bigllm_table(m, model))
    return blocks("## INT4 on billion-parameter LLMs", TEXT["int4.bigllm"]) + out if out else []


def sections(results_dir: Path) -> list[str]:
    """The INT4 part of BENCHMARKS.md (empty without INT4 results)."""
    runs = load_results(results_dir, "int4")
    if not runs:
        return []
    m = merge(runs)
    out = blocks("## INT4 weight-only quantization (INT4 issue)", TEXT["int4.intro"]) + runs_list(m)
    out += blocks("### Targets (INT4 issue)", table(["Target", "Measured", "Goal", "", "run"], targets(m)))
    out += blocks(f"### {model_label(LLM)}: accuracy, time, memory, size", llm_table(m), TEXT["int4.llm.notes"])
    out += latency_table(m) + synthetic_table(m) + genai_section(m) + nodata_section(m) + fp16_section(m)
    return out + bigllm_section(m)
