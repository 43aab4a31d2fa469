"""Is acceptance the same at every draft position? Leviathan's E[tokens] against what rounds of every k emit.

Leviathan prices a draft of k tokens at (1 - alpha^(k+1)) / (1 - alpha), alpha being a pooled rate (accepted /
(accepted + failures), policies/acceptance.py), as if every position accepted alike. (Since s69 the adaptive policy
prices the first position apart from the later ones, from what it found here.) This
serves a sweep cell's traffic (bench/policy_sweep.py) with fixed draft k = ``--k`` and, from its full rounds,
reads what a round of every shorter k' would have emitted (min(accepted, k') + 1: a draft token's verdict depends
only on the tokens before it), each position's acceptance given the ones before it were accepted, and the i.i.d.
prediction from the alpha that rounds of k' teach the estimator. ::

    taskset -c 0 .venv/bin/python -m bench.acceptance_positions [--k 6] [--concurrency 4]

What it found on the bundled pair (2026-11-29, Intel Xeon, 4 clients, 32 requests a cell, 300-400 full rounds each,
``acceptance_positions.json``): acceptance by position is flat or rises, most where passages differ most (prose, T = 0:
0.65 at the first position, 0.73-0.97 after), since a passage that rejects early leaves the later positions to the
easier ones. So the pooled alpha misprices a round's tokens: at k = 2-4, within 1% for code and for prose at
T = 0.7, ~1% for prose at T = 1 and 1.6-2.6% at T = 0; priced with the alpha that rounds of 6 teach, by 0-2% for code
and up to 3% and 10% for prose. Neighbouring k are overstated about alike, so the choice between them moves little;
priced by position, adaptive ran 1.01x itself at prose, T = 0 (docs/goodput-guard.md, s69).
"""

from __future__ import annotations

import argparse

import torch

from bench.common import run_engines_lockstep, save, save_plot, table
from bench.policy_sweep import cell_traffic, make_engines
from bench.prompts import PROSE, code_prompts
from policies.goodput import expected_tokens


def position_rates(accepted: list[int], k: int) -> list[float]:
    """Per position j = 1..k: of the rounds that accepted j - 1 tokens or more, the share that accepted j."""
    rates = []
    for j in range(1, k + 1):
        tried = sum(1 for m in accepted if m >= j - 1)
        rates.append(sum(1 for m in accepted if m >= j) / tried if tried else float("nan"))
    return rates


def pooled_alpha(accepted: list[int], k: int) -> float:
    """The estimator's rate over rounds of ``k`` drafted tokens: accepted / (accepted + failures)."""
    successes = sum(min(m, k) for m in accepted)
    failures = sum(1 for m in accepted if m < k)
    return successes / (successes + failures)


def cell_report(accepted: list[int], k: int) -> dict:
    alpha_k = pooled_alpha(accepted, k)
    rows = []
    for shorter in range(1, k + 1):
        emitted = sum(min(m, shorter) + 1 for m in accepted) / len(accepted)
        alpha = pooled_alpha(accepted, shorter)
        rows.append({"k": shorter, "emitted": emitted, "alpha_at_k": alpha,
                     "iid_over_emitted": expected_tokens(alpha, shorter) / emitted,
                     "iid_of_longest_over_emitted": expected_tokens(alpha_k, shorter) / emitted})
    return {"rounds": len(accepted), "position_rates": position_rates(accepted, k), "by_k": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--k", type=int, default=6, help="the fixed draft length whose full rounds are read")
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--temperatures", default="0,0.7,1.0")
    ap.add_argument("--workloads", default="code,prose")
    ap.add_argument("--new-tokens", type=int, default=48)
    ap.add_argument("--output", default="acceptance_positions")
    args = ap.parse_args()
    torch.set_num_threads(1)
    engines = make_engines({"draft": {"mode": "draft", "k": args.k}}, "float32", "cpu")
    controller = engines["draft"].policy
    rounds: list[int] = []
    observe = controller.observe

    def record(outcome) -> None:
        if outcome.num_drafted == args.k:  # a round the request's end cut short says nothing of the deeper positions
            rounds.append(outcome.num_accepted)
        observe(outcome)

    controller.observe = record
    tokenizer = engines["draft"].tokenizer
    texts = {"code": code_prompts(args.requests, max_chars=500), "prose": PROSE}
    cells = []
    for workload in args.workloads.split(","):
        for temperature in (float(t) for t in args.temperatures.split(",")):
            prompts, params = cell_traffic(tokenizer, texts[workload], args.requests, temperature, args.new_tokens,
                                           0.5)
            rounds.clear()
            run_engines_lockstep(engines, prompts, params, max_in_flight=args.concurrency)
            cells.append({"workload": workload, "temperature": temperature, **cell_report(rounds, args.k)})
    rows = [{"cell": f"{c['workload']} T={c['temperature']}", "rounds": c["rounds"],
             "rates": " ".join(f"{q:.2f}" for q in c["position_rates"]),
             **{f"iid/emitted k={r['k']}": r["iid_over_emitted"] for r in c["by_k"]}} for c in cells]
    print(table(rows, list(rows[0])))
    save(args.output, {"args": vars(args), "cells": cells})
    plot(cells, args.output)


def plot(cells: list[dict], output: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (rates, errors) = plt.subplots(1, 2, figsize=(11, 4))
    for cell in cells:
        label = f"{cell['workload']} T={cell['temperature']}"
        positions = range(1, len(cell["position_rates"]) + 1)
        rates.plot(positions, cell["position_rates"], marker="o", label=label)
        errors.plot([r["k"] for r in cell["by_k"]], [r["iid_over_emitted"] for r in cell["by_k"]], marker="o",
                    label=label)
    rates.set(xlabel="draft position", ylabel="acceptance given the earlier ones", title="Acceptance by position")
    errors.axhline(1.0, color="grey", linewidth=0.8)
    errors.set(xlabel="k", ylabel="Leviathan E[tokens] / emitted", title="i.i.d. prediction from alpha learned at k")
    rates.legend(fontsize=7)
    fig.tight_layout()
    save_plot(fig, output)


if __name__ == "__main__":
    main()
