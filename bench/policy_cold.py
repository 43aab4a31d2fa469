"""What a policy's ``decide`` costs on the caches that the model's passes flushed. A diagnostic, not a benchmark.

A policy decides right after the previous step's passes have streamed the weights (tens of MB) through the CPU's
caches, so its Python finds little of its own state there: on a Zen 4 host (prose, T = 0.7, one client) the
adaptive policy's ``decide`` took 106 us in the engine's steps (median), 13 us when replayed on the same batches
back to back, and 68 us replayed after a 64 MB buffer was written between calls; ``off``'s 6, 0.9 and 22 us
(docs/goodput-guard.md, s83). So its cost is set by how much memory it touches (objects, code, the interpreter's
own paths) more than by how many operations it runs, and a change meant to make it cheaper is timed cold, as
here. A flush of the data caches recovers only part of what the steps pay: the passes also evict code, branch
history and TLB entries.

This script serves one sweep cell with ``off``, a fixed policy and ``adaptive`` in lockstep (one untimed run,
then ``--runs``), records each policy's ``decide`` seconds in the engine's steps, keeps the batches it saw at
the cell's concurrency, and replays them, warm (back to back) and cold (after ``--flush-mb`` MB were written).
Replays go on changing the policy's state (its choices, streaks, random draws), as its steps would::

    python -m bench.policy_cold --workload prose --temperature 0.7 --concurrency 1
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from bench.common import run_engines_lockstep, save, save_plot, table, time_decide
from bench.policy_sweep import POLICIES, add_cell_arguments, make_engines, one_cell_traffic
from policies.base import BatchView

MAX_BATCHES = 400  # batches kept per policy for the replays


def record(engine, seconds: list[float], batches: list[BatchView], batch_size: int) -> None:
    """Time the engine's policy's ``decide`` in its steps, and keep the batches of ``batch_size`` requests."""

    def keep(batch: BatchView) -> None:
        if len(batch.requests) == batch_size and len(batches) < MAX_BATCHES:
            batches.append(batch)

    time_decide(engine, seconds, keep)


def replay(decide, batches: list[BatchView], flush: torch.Tensor | None) -> float:
    """Mean seconds of ``decide`` over ``batches``, each call after ``flush`` was written (if given)."""
    total = 0.0
    for batch in batches:
        if flush is not None:
            flush.add_(1.0)
        start = time.perf_counter()
        decide(batch)
        total += time.perf_counter() - start
    return total / len(batches)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_cell_arguments(ap, fixed="draft k=4", runs=2)
    ap.set_defaults(workload="prose", temperature=0.7, concurrency=1)
    ap.add_argument("--flush-mb", type=int, default=64, help="written between cold calls: more than the L3 cache")
    ap.add_argument("--output", default="policy_cold")
    args = ap.parse_args()
    torch.set_num_threads(1)
    engines = make_engines({name: POLICIES[name] for name in ("off", args.fixed, "adaptive")}, "float32", "cpu")
    prompts, params = one_cell_traffic(next(iter(engines.values())).tokenizer, args.workload, args.temperature,
                                       args.concurrency)
    run_engines_lockstep(engines, prompts, params, max_in_flight=args.concurrency)  # untimed
    seconds: dict[str, list[float]] = {name: [] for name in engines}
    batches: dict[str, list[BatchView]] = {name: [] for name in engines}
    for name, engine in engines.items():
        record(engine, seconds[name], batches[name], args.concurrency)
    for _ in range(args.runs):
        run_engines_lockstep(engines, prompts, params, max_in_flight=args.concurrency)
    flush = torch.zeros(args.flush_mb * 2**20 // 4)
    rows = []
    for name, engine in engines.items():
        del engine.policy.decide  # the controller's own method again
        if not batches[name]:
            continue
        warm = min(replay(engine.policy.decide, batches[name], None) for _ in range(3))
        cold = min(replay(engine.policy.decide, batches[name], flush) for _ in range(2))
        rows.append({"policy": name, "in_steps_median_us": 1e6 * statistics.median(seconds[name]),
                     "in_steps_mean_us": 1e6 * statistics.fmean(seconds[name]), "warm_us": 1e6 * warm,
                     "cold_us": 1e6 * cold, "batches": len(batches[name])})
    print(table(rows, ["policy", "in_steps_median_us", "in_steps_mean_us", "warm_us", "cold_us", "batches"]))
    path = save(args.output, {"args": vars(args), "rows": rows})
    plot(rows, args)
    print(f"saved {path}")


def plot(rows: list[dict], args: argparse.Namespace) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    kinds = [("in_steps_median_us", "in the engine's steps (median)"), ("warm_us", "replayed warm"),
             ("cold_us", f"replayed after a {args.flush_mb} MB flush")]
    width = 0.8 / len(kinds)
    for i, (key, label) in enumerate(kinds):
        ax.bar([j + i * width for j in range(len(rows))], [row[key] for row in rows], width, label=label)
    ax.set_xticks([j + width for j in range(len(rows))], [row["policy"] for row in rows])
    ax.set_ylabel("decide (us)")
    ax.set_title(f"decide's cost, {args.workload} T={args.temperature}, {args.concurrency} clients")
    ax.legend()
    fig.tight_layout()
    save_plot(fig, args.output)


if __name__ == "__main__":
    main()
