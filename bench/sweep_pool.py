"""Pool policy sweeps (bench/policy_sweep.py's JSONs) into a confidence interval per cell.

One sweep gives a cell three paired rounds, and at 16-32 clients, where plain decode is about as fast as any
speculation, adaptive and ``off`` differ by less than those rounds spread: an exact copy of ``off`` read below
1.0x ``off`` in a third of such cells (``--twin``). A single sweep's median cannot tell "adaptive is slower"
from "this round was unlucky". Sweeps of the same code on the same host pool: every round ran all policies in
lockstep, so each is one paired observation of log(policy / off). Per cell this prints their geometric mean
and a t-interval (95% by default) for

- adaptive vs ``off``: the cell is *below off* only if the whole interval is below 1.0;
- adaptive vs the best fixed policy: the fixed one with the highest pooled mean vs ``off`` (the best of four
  is biased upwards, as in the sweep), paired round by round;
- the ``off`` twin vs ``off``, where the sweeps ran it: what noise alone reads.

    .venv/bin/python -m bench.sweep_pool bench/results/s83_high_code_r1.json.gz \\
        bench/results/s83_high_code_r2.json.gz --output pooled

Sweeps must share their traffic settings and host (checked); pool only sweeps of the same policy code. An A/B sweep's
rounds pool too: its variants ("adaptive (...)", bench/policy_sweep.py's ``VARIANTS``) are never the best fixed policy.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import statistics
from collections import defaultdict
from pathlib import Path

from scipy import stats

from bench.common import save, save_plot, table
from bench.policy_sweep import OFF_TWIN, is_fixed

SAME_IN_ALL = ("new_tokens", "length_spread", "requests_per_client", "min_requests", "device", "dtype", "threads",
               "draft_quantization")  # absent (None) in sweeps from before the int8 draft: their drafts ran float32

Cell = tuple[str, float, int]  # workload, temperature, concurrency
Round = dict[str, float]  # policy -> tokens/s of one lockstep round


def load_rounds(paths: list[Path]) -> dict[Cell, list[Round]]:
    """Every timed round of every sweep, per cell; refuses sweeps whose traffic or host differ."""
    docs = [_sweep(path) for path in paths]
    for key in SAME_IN_ALL:
        values = {str(doc["args"].get(key)) for doc in docs}
        if len(values) > 1:
            raise SystemExit(f"the sweeps differ in --{key.replace('_', '-')} ({', '.join(sorted(values))}): "
                             "pool only sweeps of the same traffic")
    hosts = {doc["environment"].get("processor") for doc in docs}
    if len(hosts) > 1:
        raise SystemExit(f"the sweeps ran on different hosts ({', '.join(map(str, sorted(hosts)))}): their timings "
                         "do not pool")
    rounds: dict[Cell, list[Round]] = defaultdict(list)
    for doc in docs:
        per_cell: dict[Cell, dict[str, list[float]]] = defaultdict(dict)
        for row in doc["rows"]:
            per_cell[(row["workload"], row["temperature"], row["concurrency"])][row["policy"]] = row["runs_tok_s"]
        for cell, rates in per_cell.items():
            rounds[cell] += [dict(zip(rates, values, strict=True)) for values in zip(*rates.values(), strict=True)]
    return dict(rounds)


def _sweep(path: Path) -> dict:
    try:
        # older sweeps are kept gzipped (the repository's tree must fit the GPU machine's transfer)
        doc = json.loads(gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_text())
    except (OSError, EOFError, json.JSONDecodeError) as error:
        raise SystemExit(f"{path}: not readable as JSON ({error})") from None
    if not isinstance(doc, dict) or not {"args", "environment", "rows"} <= doc.keys():
        raise SystemExit(f"{path}: not a policy_sweep result (needs its args, environment and rows)")
    return doc


def interval(log_ratios: list[float], confidence: float) -> dict[str, float | int]:
    """Geometric mean of the paired ratios and its t-interval (needs two rounds or more)."""
    n = len(log_ratios)
    mean = statistics.fmean(log_ratios)
    half = stats.t.ppf(0.5 + confidence / 2, n - 1) * statistics.stdev(log_ratios) / math.sqrt(n)
    return {"mean": math.exp(mean), "low": math.exp(mean - half), "high": math.exp(mean + half), "rounds": n}


def paired(rounds: list[Round], policy: str, other: str, confidence: float) -> dict[str, float | int] | None:
    logs = [math.log(r[policy] / r[other]) for r in rounds if policy in r and other in r]
    return interval(logs, confidence) if len(logs) >= 2 else None


def summarize(cell: Cell, rounds: list[Round], confidence: float) -> dict:
    names = {name for r in rounds for name in r if is_fixed(name)}
    fixed = {name: vs_off for name in names if (vs_off := paired(rounds, name, "off", confidence))}
    if not fixed:
        raise SystemExit(f"{cell}: no fixed policy ran two rounds or more beside off")
    best = max(fixed, key=lambda name: fixed[name]["mean"])
    out = {"workload": cell[0], "temperature": cell[1], "concurrency": cell[2], "rounds": len(rounds),
           "adaptive_vs_off": paired(rounds, "adaptive", "off", confidence), "best_fixed": best,
           "best_fixed_vs_off": fixed[best], "adaptive_vs_best_fixed": paired(rounds, "adaptive", best, confidence)}
    if twin := paired(rounds, OFF_TWIN, "off", confidence):
        out["off_twin_vs_off"] = twin
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("sweeps", nargs="+", type=Path,
                    help="policy_sweep JSONs, plain or gzipped (bench/results/*.json, *.json.gz)")
    ap.add_argument("--confidence", type=float, default=0.95)
    ap.add_argument("--output", default="sweep_pool", help="name of the JSON and PNG in bench/results/")
    args = ap.parse_args()
    if not 0.0 < args.confidence < 1.0:
        raise SystemExit("--confidence must be in (0, 1)")
    cells = [summarize(cell, rounds, args.confidence) for cell, rounds in sorted(load_rounds(args.sweeps).items())
             if len(rounds) >= 2]
    if not cells:
        raise SystemExit("no cell has two rounds or more: pool more sweeps, or sweeps with --repeats >= 2")
    print(table([flat(c) for c in cells], list(flat(cells[0]))))
    below_off = [c for c in cells if c["adaptive_vs_off"]["high"] < 1.0]
    under_best = [c for c in cells if c["adaptive_vs_best_fixed"]["high"] < 0.95]
    print(f"{len(cells)} cells, {min(c['rounds'] for c in cells)}-{max(c['rounds'] for c in cells)} paired rounds "
          f"each; adaptive's mean >= 1.0x off in {sum(c['adaptive_vs_off']['mean'] >= 1.0 for c in cells)}, "
          f"its {args.confidence:.0%} interval wholly below 1.0x off in {len(below_off)}"
          f"{' (' + ', '.join(label(c) for c in below_off) + ')' if below_off else ''}, wholly below 0.95x best "
          f"fixed in {len(under_best)}{' (' + ', '.join(label(c) for c in under_best) + ')' if under_best else ''}")
    path = save(args.output, {"args": {**vars(args), "sweeps": [str(p) for p in args.sweeps]}, "cells": cells})
    plot(cells, args.output)
    print(f"saved {path}")


def flat(cell: dict) -> dict:
    """One table row: each interval as 'mean [low, high]'."""
    return {key: f"{v['mean']:.3f} [{v['low']:.3f}, {v['high']:.3f}]" if isinstance(v, dict) else v
            for key, v in cell.items()}


def label(cell: dict) -> str:
    return f"{cell['workload']} T={cell['temperature']} c={cell['concurrency']}"


def plot(cells: list[dict], output: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = sorted({(c["workload"], c["temperature"]) for c in cells})
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 4), sharey=True, squeeze=False)
    for ax, (workload, temperature) in zip(axes[0], panels):
        sub = [c for c in cells if (c["workload"], c["temperature"]) == (workload, temperature)]
        for key, name, shift in (("adaptive_vs_off", "adaptive", 1.0), ("best_fixed_vs_off", "best fixed", 0.96),
                                 ("off_twin_vs_off", "off (twin)", 1.04)):
            points = [(c["concurrency"] * shift, c[key]) for c in sub if key in c]
            if points:
                means = [v["mean"] for _, v in points]
                errors = [[v["mean"] - v["low"] for _, v in points], [v["high"] - v["mean"] for _, v in points]]
                ax.errorbar([x for x, _ in points], means, yerr=errors, fmt="o" if shift == 1.0 else ".",
                            label=name, capsize=2)
        ax.axhline(1.0, color="gray", linewidth=0.8)
        ax.set_xscale("log", base=2)
        ax.set_title(f"{workload}, T={temperature}")
        ax.set_xlabel("concurrency")
    axes[0][0].set_ylabel("throughput vs off (pooled, with interval)")
    axes[0][-1].legend(fontsize=7)
    fig.tight_layout()
    save_plot(fig, output, dpi=110)


if __name__ == "__main__":
    main()
