"""Which engine steps stall, and is it the first time the step's shape ran? A diagnostic, not a benchmark.

On an H200 (bf16, bundled pair, 8 code clients, T = 0) the adaptive policy read 0.71x ``off`` in three runs
whose few speculative request-steps (8-31 a run, in runs of ~1500) took 30-50% of the run's time, while every
fixed policy sped up. The cause, found with this script and bench/first_touch.py on an H100 (2026-11-27): each
attention shape (batch, queries, context) a process had not run yet cost ~50 ms, cuDNN's plan for it (now
avoided: `engine.models.llama.avoid_cudnn_attention`). A sweep run repeats its traffic, so the fixed policies
met their shapes again and ran fast from the second run, while the adaptive one, drafting now and then with
varying k beside plain requests, kept meeting new ones (its slowest steps in a later run: 75-83 ms, ~6 ms the
median). This script serves one sweep cell with ``off``, a fixed policy and ``adaptive`` in lockstep, records
every step's time with its shape (tokens fed to the target, batch size, draft passes, draft batch size; not the
attention's context), and reports per policy the steps slower than ``--factor`` x the median of steps of the
same batch size and kind (plain or speculative), how many of those ran a shape for the first time in the
process, the median plain step, the policy's mean ``decide`` time and the five slowest steps::

    python -m bench.step_stalls --device cuda --dtype bfloat16 --workload code --temperature 0 --concurrency 8
"""

from __future__ import annotations

import argparse
import statistics
from collections import defaultdict

import torch

from bench.common import run_engines_lockstep, save, table, time_decide
from bench.policy_sweep import POLICIES, add_cell_arguments, make_engines, one_cell_traffic
from policies.base import StepTiming

SEEN: set[tuple[str, tuple[int, ...]]] = set()  # (model, shape) pairs the process has run


def shapes(timing: StepTiming) -> list[tuple[str, tuple[int, ...]]]:
    """The forward passes a step ran: the target's (tokens fed) and, if it drafted, the draft model's."""
    passes = [("target", (timing.num_tokens,))]
    if timing.num_draft_passes:
        passes.append(("draft", (timing.num_draft_requests, timing.num_draft_passes,
                                 timing.num_draft_catch_up_tokens > 0)))
    return passes


def record(engine, steps: list[dict]) -> None:
    """Wrap the engine's policy so that every step timing lands in ``steps`` with whether its shapes were new and
    how long the policy's ``decide`` took."""
    observe_step = engine.policy.observe_step

    def observe(timing: StepTiming) -> None:
        passes = shapes(timing)
        new = [shape for shape in passes if shape not in SEEN]
        SEEN.update(new)
        steps.append({"batch": timing.batch_size, "speculative": timing.speculative, "seconds": timing.step_seconds,
                      "new_shape": bool(new), "prefill": timing.num_prefilling > 0, "shapes": passes,
                      "decide_seconds": decide_seconds.pop() if decide_seconds else 0.0,
                      "target_seconds": timing.target_seconds, "draft_seconds": timing.draft_seconds,
                      "tokens": timing.num_tokens, "generated": timing.num_generated,
                      "draft_tokens": timing.num_draft_tokens, "catch_up": timing.num_draft_catch_up_tokens})
        observe_step(timing)

    decide_seconds: list[float] = []
    engine.policy.observe_step = observe
    time_decide(engine, decide_seconds)


def stalls(steps: list[dict], factor: float) -> dict:
    """Steps over ``factor`` x the median of their (batch size, kind), and the share of time they took."""
    medians = {key: statistics.median(s["seconds"] for s in group) for key, group in _groups(steps).items()}
    slow = [s for s in steps if s["seconds"] > factor * medians[_key(s)]]
    total = sum(s["seconds"] for s in steps)
    plain = [s["seconds"] for s in steps if not s["speculative"] and not s["prefill"]]
    return {"plain_step_ms": 1e3 * statistics.median(plain) if plain else 0.0,
            "decide_ms": 1e3 * statistics.fmean(s["decide_seconds"] for s in steps) if steps else 0.0,
            "slowest": [(round(s["seconds"] * 1e3, 1), round(s["seconds"] / medians[_key(s)], 1), s["new_shape"],
                         s["shapes"]) for s in sorted(steps, key=lambda s: -s["seconds"])[:5]],
            "steps": len(steps), "speculative_steps": sum(s["speculative"] for s in steps), "stalls": len(slow),
            "stalls_on_new_shapes": sum(s["new_shape"] for s in slow),
            "new_shape_steps": sum(s["new_shape"] for s in steps),
            "stall_time_share": sum(s["seconds"] for s in slow) / total if total else 0.0}


def _key(step: dict) -> tuple[int, bool, bool]:
    return step["batch"], step["speculative"], step["prefill"]


def _groups(steps: list[dict]) -> dict[tuple, list[dict]]:
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for s in steps:
        groups[_key(s)].append(s)
    return groups


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_cell_arguments(ap, fixed="ngram k=4", runs=4)
    ap.add_argument("--factor", type=float, default=3.0, help="a stall: this many times its kind's median")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--trace", action="store_true", help="also save every step of every run (for offline analysis)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    engines = make_engines({name: POLICIES[name] for name in ("off", args.fixed, "adaptive")}, args.dtype, args.device)
    tokenizer = next(iter(engines.values())).tokenizer
    prompts, params = one_cell_traffic(tokenizer, args.workload, args.temperature, args.concurrency)
    rows, trace = [], []
    for run in range(args.runs):
        steps: dict[str, list[dict]] = {name: [] for name in engines}
        for name, engine in engines.items():
            record(engine, steps[name])
        results = run_engines_lockstep(engines, prompts, params, max_in_flight=args.concurrency)
        for name, engine in engines.items():
            del engine.policy.observe_step, engine.policy.decide  # the controller's own methods again
            rows.append({"run": run, "policy": name, "tok_s": results[name].tokens_per_s,
                         "vs_off": results[name].tokens_per_s / results["off"].tokens_per_s,
                         **stalls(steps[name], args.factor)})
        if args.trace:
            trace.append(steps)
    columns = ["run", "policy", "tok_s", "vs_off", "steps", "speculative_steps", "stalls", "stalls_on_new_shapes",
               "new_shape_steps", "stall_time_share", "plain_step_ms", "decide_ms"]
    print(table(rows, columns))
    for row in rows:  # the slowest steps: ms, x their kind's median, a first shape?, the passes they ran
        print(row["run"], row["policy"], row["slowest"])
    name = f"step_stalls_{args.device.replace(':', '')}_{args.workload}_c{args.concurrency}"
    print(f"saved {save(name, {'args': vars(args), 'rows': rows, **({'trace': trace} if args.trace else {})})}")


if __name__ == "__main__":
    main()
