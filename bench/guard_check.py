"""Does the goodput guard's figure agree with whole runs? A check of its measurement, not of the policy.

Serves one sweep cell (bench/policy_sweep.py's traffic) with ``off`` and a speculative policy in lockstep,
records every step each engine timed, and feeds all of them, in the order they ran, to a fresh guard
(policies/guard.py): it then has as many plain steps as speculative ones, so its figure of speculation over
plain decode is what its measurement method reads with plenty of data. Printed beside it: the whole runs'
ratio (what a user gets) and the same ratio from steps that no prompt joined, per batch size::

    taskset -c 0 .venv/bin/python -m bench.guard_check --workload prose --temperature 0.7 --concurrency 16

A guard figure above the whole runs' ratio means the measurement favours speculation; where the two sides of
1.0 differ, the adaptive policy speculates at a loss (or declines a gain) however well it plans. With
``--policy adaptive`` the policy runs as usual (its own guard learns from its own steps) and the check's guard
judges its speculation as the policy plans it.

What it found (prose, T = 0.7, one CPU thread of an AMD EPYC VM): fixed draft k = 2 read 0.947x ``off`` over
whole runs at 16 clients and the guard 0.895x (0.869 and 0.840 at 32); the adaptive policy at 8 clients read
1.059x whole and 1.184x to the guard. The guard judges steady steps, and a run's start and drain differ.
"""

from __future__ import annotations

import argparse
import statistics
from collections import defaultdict
from collections.abc import Callable

import torch

from bench.common import run_engines_lockstep, save
from bench.policy_sweep import POLICIES, cell_traffic, make_engines
from bench.prompts import PROSE, code_prompts
from policies.base import StepTiming
from policies.guard import GoodputGuard
from policies.guard_figures import batch_bucket


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", choices=("code", "prose"), default="prose")
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--policy", default="draft k=2", choices=[p for p in POLICIES if p != "off"],
                    help="the speculative policy; adaptive's own guard learns as usual, the check's guard sees all")
    ap.add_argument("--new-tokens", type=int, default=48)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--output", default="guard_check")
    args = ap.parse_args()
    torch.set_num_threads(1)
    engines = make_engines({"off": POLICIES["off"], args.policy: POLICIES[args.policy]}, "float32", "cpu")
    steps: list[tuple[str, StepTiming]] = []
    for name, engine in engines.items():
        engine.policy.observe_step = record(engine.policy.observe_step, name, steps)
    tokenizer = engines["off"].tokenizer
    num_requests = max(32, 4 * args.concurrency)
    texts = code_prompts(num_requests, max_chars=500) if args.workload == "code" else PROSE
    prompts, params = cell_traffic(tokenizer, texts, num_requests, args.temperature, args.new_tokens, 0.5)
    run_engines_lockstep(engines, prompts, params, max_in_flight=args.concurrency)  # warm-up
    steps.clear()
    ratios = []
    for _ in range(args.runs):
        results = run_engines_lockstep(engines, prompts, params, max_in_flight=args.concurrency)
        ratios.append(results[args.policy].tokens_per_s / results["off"].tokens_per_s)
    guard = GoodputGuard()
    for _, timing in steps:
        guard.observe(timing, args.temperature)
    bucket = batch_bucket(args.concurrency)
    figure = next(b for b in guard.summary() if b["batch_sizes"][1] == max(1, 2 ** bucket))
    report = {"args": vars(args), "whole_run_ratios": ratios, "guard_bucket": figure,
              "unjoined_by_batch_size": unjoined_rates(steps, args.policy)}
    print(f"whole runs, {args.policy} / off: {', '.join(f'{r:.3f}' for r in ratios)} "
          f"(median {statistics.median(ratios):.3f})")
    for route, by_t in figure["speculative"].items():
        for t, arm in by_t.items():
            print(f"guard, batch {figure['batch_sizes']}, {route} at T {t}: {arm['vs_plain']:.3f}x plain "
                  f"({arm['steps']} steps)")
    for size, row in sorted(report["unjoined_by_batch_size"].items()):
        print(f"batch {size}: steps without prompts joining: {row}")
    print(f"saved {save(args.output, report)}")


def record(observe_step: Callable[[StepTiming], None], name: str,
           steps: list[tuple[str, StepTiming]]) -> Callable[[StepTiming], None]:
    """``observe_step`` that also appends each timing, with the engine's ``name``, to ``steps``."""
    def observe(timing: StepTiming) -> None:
        steps.append((name, timing))
        observe_step(timing)
    return observe


def unjoined_rates(steps: list[tuple[str, StepTiming]], policy: str) -> dict[int, dict]:
    """Per batch size: tokens/s of each policy's steps that no prompt joined, their ratio, and the share of each
    policy's steps that prompts joined."""
    sums: dict[tuple[str, int], list[float]] = defaultdict(lambda: [0.0, 0.0, 0, 0])
    for name, timing in steps:
        row = sums[(name, timing.batch_size)]
        row[3] += 1
        if not timing.num_prefilling:
            row[0] += timing.num_generated
            row[1] += timing.step_seconds
            row[2] += 1
    out: dict[int, dict] = {}
    for size in sorted({size for _, size in sums}):
        plain, spec = sums.get(("off", size)), sums.get((policy, size))
        if not plain or not spec or plain[2] < 3 or spec[2] < 3:
            continue
        out[size] = {"ratio": round((spec[0] / spec[1]) / (plain[0] / plain[1]), 3),
                     "steps": [plain[2], spec[2]],
                     "joined_share": [round(1 - plain[2] / plain[3], 2), round(1 - spec[2] / spec[3], 2)]}
    return out


if __name__ == "__main__":
    main()
