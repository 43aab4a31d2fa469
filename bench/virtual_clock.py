"""A GPU's step costs on the CPU engine: each step is charged what a linear fit measured on a GPU says it costs.

The adaptive policy's shortfall in the H200's 32-client code cell (0.90-0.93x fixed n-gram k = 4) could not be
studied on a GPU, lent for 15 minutes a session. This runs that traffic on the CPU engine and the bundled pair (the
same tokens, acceptance and policy decisions) in lockstep, but times every step on a virtual clock:

    target pass   a + b * batch + c * tokens fed + g * [the step verifies] + p * prefill tokens
    draft model   f + passes * (d + e * draft users) + h * catch-up tokens
    host          the step's work outside both passes, regressed on the H200's traced steps (``--host 0``: none)
    policy        the policy's own measured seconds on this CPU (``--policy-time 0``: none)
    first touch   ``--first-touch`` ms for a target pass at a token count new to the process (default none: warm-up
                  touches every count since 2026-11-28, `engine.models.llama.touch_linears`; before, 0.7 on the H200)

The defaults are the H200's fit of 2026-11-28 (bf16, bundled pair). Each policy's cost model learns from the
virtual times, which are exactly its model's form: where the adaptive policy still trails a fixed one, the cause is
not a mispriced step. First findings (32 code clients, T = 0, 3 runs each; docs/goodput-guard.md, and this tool's
own runs in `bench/results/virtual_clock_code_c32_t0_policy_time_{0,1}.json`: adaptive 0.973x / 0.916x n-gram
k = 4 with the policy's time uncharged / charged, the short-match settings 1.025x / 0.949x):
with the policy's time charged, adaptive read 0.913x n-gram k = 4 (the H200: 0.91x); uncharged, 0.977x, so two
thirds of the gap was the policy's own work (~0.6-0.8 ms a step at 32 requests, against ~10 ms virtual steps);
considering n-gram matches of every length (their short ones' acceptance learned apart) took its decisions to
1.029x (policies/acceptance.py).

    taskset -c 0 .venv/bin/python -m bench.virtual_clock [--policy-time 0] [--policies "ngram k=4,draft k=4"]
"""

from __future__ import annotations

import argparse
import statistics

import torch

from bench.common import _Clients, run_engines_lockstep, save, save_plot, table
from bench.policy_sweep import POLICIES, VARIANTS, cell_traffic, make_engines
from bench.prompts import PROSE, code_prompts
from engine.engine import LLMEngine
from policies.base import StepTiming

# H200, bf16, bundled pair, 2026-11-28 (policy_sweep_cuda_code_c32_t0_h200_merged.json, its last fit); seconds
H200 = {"a": 6.47e-3, "b": 36e-6, "c": 3.6e-6, "g": 1.07e-3, "p": 2e-6,
        "f": 1.27e-3, "d": 2.18e-3, "e": 64e-6, "h": 2.2e-6}
# the H200's traced steps (step_stalls_cuda_code_c32_h200_merged): what a step took beyond both passes, in seconds
# per request, per verifying step, per step drafting with the model, per token fed and per token emitted
HOST = {"batch": 17e-6, "verifies": 58e-6, "drafts": 270e-6, "tokens": 5e-6, "generated": 11e-6}


TOUCHED_COUNTS: set[int] = set()  # token counts a target pass of this process has run (see ``--first-touch``)


def target_seconds(timing: StepTiming, costs: dict[str, float]) -> float:
    decoded = timing.num_tokens - timing.num_prefill_tokens
    return (costs["a"] + costs["b"] * timing.batch_size + costs["c"] * decoded + costs["p"] * timing.num_prefill_tokens
            + (costs["g"] if timing.speculative else 0.0))


def draft_seconds(timing: StepTiming, costs: dict[str, float]) -> float:
    if not timing.num_draft_requests:
        return 0.0
    return (costs["f"] + timing.num_draft_passes * (costs["d"] + costs["e"] * timing.num_draft_requests)
            + costs["h"] * timing.num_draft_catch_up_tokens)


def host_seconds(timing: StepTiming, scale: float) -> float:
    return scale * (HOST["batch"] * timing.batch_size + HOST["verifies"] * timing.speculative
                    + HOST["drafts"] * (timing.num_draft_requests > 0) + HOST["tokens"] * timing.num_tokens
                    + HOST["generated"] * timing.num_generated)


class VirtualClock:
    """Makes one engine's policy learn from virtual step times, and keeps the virtual seconds of its current turn
    (the policy's own work aside: `VirtualClients` adds it)."""

    def __init__(self, engine: LLMEngine, costs: dict[str, float], host: float, policy_time: float,
                 first_touch: float = 0.0) -> None:
        self.turn_seconds = 0.0
        self.stepped = False  # whether the turn's step had decodes (and so a StepTiming)
        controller, stats = engine.policy, engine.stats
        observe_step, observe_stats = controller.observe_step, stats.observe_step

        def virtual_observe_step(timing: StepTiming) -> None:
            target, draft = target_seconds(timing, costs), draft_seconds(timing, costs)
            if timing.num_tokens not in TOUCHED_COUNTS:  # the process's first pass at this count
                TOUCHED_COUNTS.add(timing.num_tokens)
                target += first_touch
            seconds = target + draft + host_seconds(timing, host)
            self.turn_seconds += seconds
            self.stepped = True
            observe_step(StepTiming(**{**timing.__dict__, "target_seconds": target, "draft_seconds": draft,
                                       "step_seconds": seconds}))

        def virtual_observe_stats(num_chunks: int, num_tokens: int, seconds: float, num_generated: int) -> None:
            if not self.stepped:  # prompt chunks alone
                self.turn_seconds += costs["a"] + costs["p"] * num_tokens
            observe_stats(num_chunks, num_tokens, seconds, num_generated)

        controller.observe_step = virtual_observe_step  # type: ignore[method-assign]
        stats.observe_step = virtual_observe_stats  # type: ignore[method-assign]
        self.policy_seconds = lambda: policy_time * controller.policy_seconds


class VirtualClients(_Clients):
    """`bench.common._Clients` on the virtual clock: a turn costs its step's virtual seconds and the policy's work."""

    def _timed(self, work) -> None:
        clock = self.engine.virtual_clock  # type: ignore[attr-defined]
        clock.turn_seconds, clock.stepped = 0.0, False
        policy_before = clock.policy_seconds()
        work()
        self.seconds += clock.turn_seconds + clock.policy_seconds() - policy_before

    def _clock(self) -> float:
        return self.seconds + self.engine.virtual_clock.turn_seconds  # type: ignore[attr-defined]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--policies", default="off,ngram k=4,draft k=4,adaptive",
                    help="comma-separated names of bench.policy_sweep's POLICIES and VARIANTS")
    ap.add_argument("--workload", default="code", choices=("code", "prose"))
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3, help="timed runs after one warm-up run")
    ap.add_argument("--policy-time", type=float, default=1.0, help="charge the policy's own seconds times this")
    ap.add_argument("--host", type=float, default=1.0, help="charge the host's work outside the passes times this")
    ap.add_argument("--first-touch", type=float, default=0.0,
                    help="ms charged to a target pass at a token count new to the process (an untouched GPU's)")
    ap.add_argument("--output", default="virtual_clock")
    args = ap.parse_args()
    torch.set_num_threads(1)
    known = POLICIES | VARIANTS
    names = args.policies.split(",")
    unknown = [name for name in names if name not in known]
    if unknown or "off" not in names:
        raise SystemExit(f"--policies: name off and known policies ({', '.join(known)}); unknown: {unknown}")
    engines = make_engines({name: known[name] for name in names}, "float32", "cpu")
    for engine in engines.values():
        engine.virtual_clock = VirtualClock(engine, H200, args.host, args.policy_time,
                                             args.first_touch / 1e3)  # type: ignore[attr-defined]
    texts = code_prompts(4 * args.concurrency, max_chars=500) if args.workload == "code" else PROSE
    num_requests = max(32, 4 * args.concurrency)
    prompts, params = cell_traffic(next(iter(engines.values())).tokenizer, texts, num_requests, args.temperature,
                                   48, 0.5)
    rates: dict[str, list[float]] = {name: [] for name in names}
    for run in range(1 + args.repeats):
        results = run_engines_lockstep(engines, prompts, params, args.concurrency, VirtualClients)
        if run:  # the first run warms up
            for name in names:
                rates[name].append(results[name].tokens_per_s)
        print(f"run {run}: " + ", ".join(f"{name} {results[name].tokens_per_s:.0f}" for name in names), flush=True)
    rows = []
    for name in names:
        stats = engines[name].policy.stats()
        rows.append({"policy": name, "tok_s": statistics.median(rates[name]),
                     "vs_off": statistics.median(a / b for a, b in zip(rates[name], rates["off"], strict=True)),
                     "runs_tok_s": [round(rate, 1) for rate in rates[name]],
                     "policy_seconds": stats["policy_seconds"], "chosen_k": stats["chosen_k"]})
    print(table(rows, ["policy", "tok_s", "vs_off"]))
    save(args.output, {"args": vars(args), "costs": H200, "host": HOST, "rows": rows})
    plot(rows, args)


def plot(rows: list[dict], args: argparse.Namespace) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.bar([row["policy"] for row in rows], [row["vs_off"] for row in rows], color="tab:blue")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_ylabel("throughput vs off (virtual H200 clock)")
    ax.set_title(f"{args.workload} T={args.temperature} c={args.concurrency}, policy time x{args.policy_time}")
    plt.setp(ax.get_xticklabels(), rotation=20, ha="right")
    fig.tight_layout()
    save_plot(fig, args.output, dpi=110)


if __name__ == "__main__":
    main()
