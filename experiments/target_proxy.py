"""Validates the sensitivity proxy of ``--target_accuracy`` against each node's exact output error.

``python -m experiments.target_proxy [--model minilm_l6_v2] [--target rel_l2<=1e-3] [--json out.json]``

On a zoo model and its real inputs, in the emulation session of :mod:`onnxprec.autocast.target`:

* the exact sensitivity of every candidate: the output error when it alone is low (everything else FP32), one
  emulated run per node;
* the proxies: readers over distance to the outputs (what ``--target_accuracy`` uses), the distance alone, the
  node's own rounding error (``||round(y) - y||² / ||y||²`` on the FP32 activations), and the topological order;
* for each ordering, how many nodes must stay FP32 (most sensitive first) for the emulated output error, scaled to
  the default's real error as the search scales it, to meet the target; and the rank correlation with the exact
  sensitivities.

The fewer nodes an ordering needs, the better it ranks; the exact order is the bound a one-pass proxy can reach.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

import numpy as np

import zoo
from onnxprec import sensitivity
from onnxprec._io import load_model
from onnxprec.autocast import masks, pipeline, target
from onnxprec.autocast._options import AutoCastOptions
from onnxprec.autocast.classify import classify
from onnxprec.autocast.emulator import Emulator
from onnxprec.autocast.rules import RuleContext
from onnxprec.observers import FirstBatchObserver
from onnxprec.reference import run_reference


def _ranks(values: np.ndarray) -> np.ndarray:
    return np.argsort(np.argsort(values, kind="stable"), kind="stable").astype(float)


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.corrcoef(_ranks(a), _ranks(b))[0, 1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="minilm_l6_v2")
    ap.add_argument("--target", default="rel_l2<=1e-3")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    tick = time.perf_counter()
    feeds = zoo.inputs(args.model)
    options = AutoCastOptions(calibration_data=feeds, keep_io_types=True, target_accuracy=args.target)
    model = load_model(zoo.model_path(args.model))
    pipeline._sanitize(model, options)
    regions = masks.find_mask_regions(model)
    keep = target.ReferenceOutputs()
    reference = pipeline._reference_run(model, options, masks.sentinel_thresholds(regions), keep)
    pipeline._fill_types(model, reference)
    for region in regions:
        region.rewrite(options.low, reference.stats)
    rules, includes = pipeline._rules(options)
    ctx = RuleContext(stats=masks.stats_past_sentinels(reference.stats, regions, options.low))
    decisions = classify(model, low=options.low, rules=rules, includes=includes, ctx=ctx, plugins=options.plugins)
    problem = target.Problem.of(model, decisions, options, rules, includes, ctx, keep, pipeline._converted_clone)
    fixed_low, candidates, _ = target._split(problem)
    moving = [n for n in candidates if decisions[n].low]
    fixed_low |= {n for n in candidates if not decisions[n].low}
    emulator = Emulator(model, fixed_low, moving, options.low, keep_io_types=True)
    n = len(moving)
    out = str(model.graph.outputs[0].name)

    def error(low: set[int]) -> float:
        m = target._measure(problem.target, problem.reference, emulator.run(low))
        return float(m.errors[out]["rel_l2"])

    real_default = target._measure_real(problem, problem.build(decisions)).errors[out]["rel_l2"]
    emulated_default = error(set(range(n)))
    bound = next(b.value for b in problem.target.bounds if b.metric == "rel_l2")
    scaled_bound = bound * emulated_default / real_default

    exact = np.array([error({i}) ** 2 for i in range(n)])  # each node low alone
    distance = sensitivity.distance_to_outputs(model)
    proxy = sensitivity.structural(model)
    observer = FirstBatchObserver({str(v.name) for node in moving for v in node.outputs})
    run_reference(model, [reference.first_feeds], observers=[observer])
    own = []
    for node in moving:
        e = r = 0.0
        for v in node.outputs:
            y = observer.arrays.get(str(v.name))
            if y is not None and np.issubdtype(y.dtype, np.floating):
                low = y.astype(np.float16).astype(np.float64)
                e += float(((low - y) ** 2).sum())
                r += float((y.astype(np.float64) ** 2).sum())
        own.append(e / r if r else 0.0)
    orders = {
        "exact (one run per node)": exact,
        "readers / distance to the outputs (used)": np.array([proxy[node] for node in moving], float),
        "distance to the outputs": -np.array([distance[node] for node in moving], float),
        "own rounding error": np.array(own),
        "topological order (input first)": -np.arange(n, dtype=float),
    }

    def fp32_needed(key: np.ndarray) -> int:
        ranked = list(np.argsort(-key, kind="stable"))
        good, bad = n, 0
        while good - bad > 1:
            k = (good + bad) // 2
            if error(set(range(n)) - set(ranked[:k])) <= scaled_bound:
                good = k
            else:
                bad = k
        return good

    rows = []
    for name, key in orders.items():
        rows.append({"ordering": name, "fp32_nodes": fp32_needed(key), "spearman_vs_exact": spearman(key, exact)})
    result = {
        "model": args.model,
        "target": args.target,
        "candidates": n,
        "default_rel_l2_real": real_default,
        "default_rel_l2_emulated": emulated_default,
        "orderings": rows,
        "seconds": time.perf_counter() - tick,
        "emulated_runs": emulator.runs,
    }
    emulator.close()
    print(f"{args.model}: {n} candidates, default rel L2 {real_default:.4g} (emulated {emulated_default:.4g})")
    print(f"{'ordering':45s} {'FP32 nodes to meet ' + args.target:>28s} {'Spearman vs exact':>18s}")
    for row in rows:
        print(f"{row['ordering']:45s} {row['fp32_nodes']:28d} {row['spearman_vs_exact']:18.2f}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
