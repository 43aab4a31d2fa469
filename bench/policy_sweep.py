"""Policy sweep on the real engine and bundled pair: concurrency x temperature x workload, for
``off``, fixed draft k = 2/4/6, fixed n-gram and ``adaptive`` (auto). Reports throughput and
mean time per output token; the plot shows speed-up vs ``off`` per concurrency.

    taskset -c 0 .venv/bin/python -m bench.policy_sweep [--concurrency 1,2,4,8,16,32] [--new-tokens 48]

One cell, to look into it (the JSON keeps each run's histogram of chosen k):

    .venv/bin/python -m bench.policy_sweep --workloads code --temperatures 0.7 --concurrency 16 \
        --policies "draft k=2" --output cell

Concurrency c means c clients, each sending its next request as soon as its last one completes (vLLM's
``--max-concurrency``): a run serves ``--requests-per-client`` x c requests (at least ``--min-requests``,
32) with at most c in flight. Submitting c requests at once and waiting for the last would instead end
every run on a tail of a few stragglers, which no server with steady traffic sees. Even so, each run
starts with c prompts arriving at once and ends draining through small batches; with 2 requests per
client these two phases were a third of a run, and runs of ~1 s (16 requests at 1-8 clients) left two
identical policies (``--twin``) reading < 0.95x each other's "best fixed" in a third of the cells. Hence
4 requests per client and at least 32 per run: steadier traffic, and twice the tokens per measurement.

Output lengths vary as in real traffic: request i asks for a max_tokens drawn (the same for every policy)
from ``--new-tokens`` x [1 - spread, 1 + spread]. With one length for all, plain decode would finish
every wave of requests in the same step while speculation, which advances requests by different
amounts, would end each run draining through small batches: a synchrony no server's traffic has.
``--length-spread 0`` restores equal lengths.

Each policy runs on its own engine, and the engines serve a round's traffic in lockstep
(``bench.common.run_engines_lockstep``): one step at a time, always of the engine furthest behind, each
engine timed by its own steps alone. The ratios are the median over rounds of each round's own ratio.
Why lockstep: a shared VM's speed drifts by 10-30% within a minute, and runs of ~5 s taken one after the
other paired badly: the ratio of two identical ``off`` runs at 32 clients strayed by 7-14% (standard
deviation), fixed draft k = 2 against ``off`` read 0.76-0.86x. Stepped in turn, the two ``off`` engines read
0.993-1.003x each other, and draft k = 2 against ``off`` 0.795-0.815x, at the median of sequential runs
(0.78-0.80x over three sets of four). At 1 client, where plain decode is bound by reading the weights, one
engine per policy (seven sets of weights) did not slow it either: ``off`` ran 130-136 tok/s alone and in
lockstep, and draft k = 4 read 1.72-1.77x it in lockstep against 1.76-1.81x in sequential runs. Each policy
learns from its own traffic alone, as a server running that policy would. The engines read one set of
weights: with a set each, where an engine's weights landed in memory made it up to 3% slower than its twin
(see `make_engines`). Engines still differ a little by themselves (their KV caches), so after every run each
policy, with all it learned, moves on to the next policy's engine (``rotate_policies``).

Timing noise: on a shared 2-vCPU VM, torch's two threads made the same run vary by 20-35%, and the two
vCPUs are not alike (a 512 x 512 matmul: 3.0 ms +-3% on one, 2.2-3.6 ms on the other; fixed n-gram k = 4
read 0.99x ``off`` on one vCPU and 0.95x on the other in the same hour). So the sweep uses one thread by
default (``--threads``); pin it to one CPU, e.g. ``taskset -c 0``, and compare cells run on the same one.

``--twin`` adds two noise controls, each a second copy of a policy judged like the adaptive one. A copy of
``draft k=2`` is judged against the best fixed policy (the copy itself left out of that choice) and against
its original: how often a policy that *is* a fixed one (the best one, in cells where draft k=2 is best)
reads below 0.95x "best fixed" (the best of four noisy medians is biased upwards). A copy of ``off`` is
judged against ``off``: how often a policy that decodes exactly as ``off`` does reads below 1.0x ``off``,
the chance that the ">= 1.0x off" target fails in a cell where plain decode is the best policy there is.

Each cell first runs every policy ``--warmup`` times untimed, as any benchmark warms up. For the
adaptive policy this also stands for the traffic a long-running server has already served: it
has seen the cell's batch size and temperature before (and the cells before it). Its cold runs are kept
in the JSON (``warmup_tok_s``), so the cost of first contact stays visible.
"""

from __future__ import annotations

import argparse
import random
import statistics
from collections import Counter
from collections.abc import Iterator

import torch

from bench.common import RunResult, make_engine, run_engines_lockstep, save, save_plot, set_policy, table
from bench.prompts import PROSE, code_prompts
from engine.config import DRAFT_QUANTIZATION
from engine.engine import LLMEngine
from engine.types import SamplingParams

POLICIES = {
    "adaptive": {"mode": "auto"},
    "off": {"mode": "off"},
    "draft k=2": {"mode": "draft", "k": 2},
    "draft k=4": {"mode": "draft", "k": 4},
    "draft k=6": {"mode": "draft", "k": 6},
    "ngram k=4": {"mode": "ngram", "k": 4},
}
# adaptive policies with other settings, for A/B runs (``--policies``); not run by default, judged like ``adaptive``
VARIANTS = {
    "adaptive (long matches)": {"mode": "auto", "ngram_min_match": 3, "ngram_long_match": 3},  # the old defaults
    "adaptive (hysteresis=0.1)": {"mode": "auto", "hysteresis": 0.1},
    "adaptive (no guard)": {"mode": "auto", "goodput_guard": False},
    "adaptive (plan every step)": {"mode": "auto", "max_planning_share": None},
    "adaptive (k_max=2)": {"mode": "auto", "k_max": 2},  # is the plan's longer k worth its draft passes?
    "adaptive (no probes)": {"mode": "auto", "guard_probe_rate": 0.0},  # what do the guard's probes cost?
    "adaptive (plan share 0.5%)": {"mode": "auto", "max_planning_share": 0.005},  # fewer plans at 1-8 clients?
    "adaptive (no k probes)": {"mode": "auto", "k_probe_rate": 0.0},  # does the cost fit need steps of two k's?
    "adaptive (k probes 1/4)": {"mode": "auto", "k_probe_rate": 0.25},  # do more of them tell c from g?
    "adaptive (no exploration)": {"mode": "auto", "exploration_rate": 0.0},  # what do k = 0 requests' probes cost?
}
TWIN, TWIN_OF = "draft k=2 (twin)", "draft k=2"
OFF_TWIN = "off (twin)"  # a copy of ``off``: the noise control of the ">= 1.0x off" target


def is_fixed(name: str) -> bool:
    """Whether a policy of a sweep may be its "best fixed" one: not ``off``, a twin (noise controls), the adaptive
    policy or one of its A/B variants ("adaptive (...)", `VARIANTS`)."""
    return name not in ("off", TWIN, OFF_TWIN) and not name.startswith("adaptive")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--concurrency", default="1,2,4,8,16,32")
    ap.add_argument("--temperatures", default="0,0.7,1.0")
    ap.add_argument("--workloads", default="code,prose")
    ap.add_argument("--policies", default=",".join(POLICIES),
                    help="a subset of the policies, comma-separated (off and adaptive are always run)")
    ap.add_argument("--new-tokens", type=int, default=48, help="mean max_tokens of the requests")
    ap.add_argument("--length-spread", type=float, default=0.5,
                    help="max_tokens spread uniformly over new-tokens x [1 - spread, 1 + spread]")
    ap.add_argument("--requests-per-client", type=int, default=4, help="each run serves this many requests per client")
    ap.add_argument("--min-requests", type=int, default=32,
                    help="requests per run at the lowest concurrencies: at T > 0, fewer leave a run to sampling luck")
    ap.add_argument("--repeats", type=int, default=3, help="runs per cell and policy; the median is reported")
    ap.add_argument("--warmup", type=int, default=1, help="untimed runs per cell and policy before the repeats")
    ap.add_argument("--output", default="policy_sweep", help="name of the JSON and PNG in bench/results/")
    ap.add_argument("--twin", action="store_true", help="add copies of draft k=2 and off as noise controls (see above)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--draft-quantization", default="auto", choices=DRAFT_QUANTIZATION,
                    help="the draft model's linears (auto: int8 on a CPU, engine/models/int8.py)")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch CPU threads (0: torch's default); one thread times a shared VM far more steadily")
    args = ap.parse_args()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    levels = [int(c) for c in args.concurrency.split(",")]
    num_texts = max(args.min_requests, args.requests_per_client * max(levels))
    code, prose = code_prompts(num_texts, max_chars=500), PROSE
    workloads = {name: texts for name, texts in {"code": code, "prose": prose}.items()
                 if name in args.workloads.split(",")}
    if not workloads:
        raise SystemExit("--workloads: name code and/or prose")
    known = POLICIES | VARIANTS
    unknown = set(args.policies.split(",")) - set(known)
    if unknown:
        raise SystemExit(f"--policies: unknown {', '.join(sorted(unknown))} (known: {', '.join(known)})")
    policies = {name: known[name] for name in known
                if name in ("adaptive", "off") or name in args.policies.split(",")}
    if len(policies) < 3:
        raise SystemExit("--policies: name at least one fixed policy to compare the adaptive one with")
    if args.twin:
        policies[TWIN] = policies[TWIN_OF] = POLICIES[TWIN_OF]
        policies[OFF_TWIN] = POLICIES["off"]
    engines = make_engines(policies, args.dtype, args.device, args.draft_quantization)
    tokenizer = next(iter(engines.values())).tokenizer
    rows, summary = [], []
    for workload, texts in workloads.items():
        for temperature in (float(t) for t in args.temperatures.split(",")):
            for n in levels:
                # at least --min-requests different prompts per run: one sampled text alone would make a cell's
                # throughput mostly the luck of that sample's acceptance, and with 8 of them two identical
                # policies (the twin) still read 0.93-1.12x each other at 1-2 clients, T > 0
                num_requests = max(args.min_requests, args.requests_per_client * n)
                prompts, params = cell_traffic(tokenizer, texts, num_requests, temperature, args.new_tokens,
                                               args.length_spread)
                cell = {"workload": workload, "temperature": temperature, "concurrency": n}
                runs: dict[str, list[RunResult]] = {name: [] for name in policies}
                chosen_k: dict[str, list[list[int]]] = {name: [] for name in policies}
                plain_causes: dict[str, list[dict[str, int]]] = {name: [] for name in policies}
                policy_share: dict[str, list[float]] = {name: [] for name in policies}  # of each run's seconds
                deciding_share: dict[str, list[float]] = {name: [] for name in policies}  # its `decide` alone
                guard_after_runs: list[list[dict]] = []  # the adaptive policy's guard at the cell's load, per run
                # and what its plans rest on, per run: the step-cost fit and the acceptance it has learned
                model_after_runs: list[dict] = []
                for _ in range(args.warmup + args.repeats):
                    before = {name: engine.policy.stats() for name, engine in engines.items()}
                    results = run_engines_lockstep(engines, prompts, params, max_in_flight=n)
                    afters = {name: engine.policy.stats() for name, engine in engines.items()}
                    for name, after in afters.items():
                        runs[name].append(results[name])
                        start = before[name]["chosen_k"]["histogram"]
                        chosen_k[name].append([count - (start[k] if k < len(start) else 0)
                                               for k, count in enumerate(after["chosen_k"]["histogram"])])
                        plain_causes[name].append(dict(Counter(after["chosen_k"]["plain_by_cause"])
                                                       - Counter(before[name]["chosen_k"]["plain_by_cause"])))
                        spent = {kind: seconds - before[name]["policy_seconds"][kind]
                                 for kind, seconds in after["policy_seconds"].items()}  # in this run
                        policy_share[name].append(round(sum(spent.values()) / results[name].seconds, 5))
                        deciding_share[name].append(round(spent["deciding"] / results[name].seconds, 5))
                    stats = afters["adaptive"]
                    guard_after_runs.append(guard_at_load(stats, n))
                    model_after_runs.append({"cost_model": stats["cost_model"], "acceptance": stats["acceptance"]})
                    rotate_policies(engines)
                warmups = {name: rs[: args.warmup] for name, rs in runs.items()}
                runs = {name: rs[args.warmup:] for name, rs in runs.items()}
                # the median run of each policy: a best-of would favour whichever side has more runs to pick
                # from, and "best fixed" already picks the best of four policies
                results = {name: sorted(rs, key=lambda r: r.tokens_per_s)[len(rs) // 2] for name, rs in runs.items()}
                for name, r in results.items():
                    rows.append({**cell, "policy": name, "tok_s": r.tokens_per_s, "tpot_ms": 1000 * r.tpot,
                                 "vs_off": r.tokens_per_s / results["off"].tokens_per_s,
                                 "acceptance": round(r.acceptance, 3),
                                 "runs_tok_s": [round(run.tokens_per_s, 1) for run in runs[name]],
                                 "warmup_tok_s": [round(run.tokens_per_s, 1) for run in warmups[name]],
                                 # request-steps per chosen k (0 = plain), warm-up runs first
                                 "chosen_k": chosen_k[name],
                                 # plain request-steps by cause (policies/controller.py), warm-up runs first
                                 "plain_by_cause": plain_causes[name],
                                 # the policy's own work (deciding, learning) over the run's seconds, warm-ups first
                                 "policy_share": policy_share[name],
                                 # of which choosing k (``decide``): the adaptive policy's plans run right after the
                                 # passes, on caches they flushed (docs/goodput-guard.md, s83)
                                 "deciding_share": deciding_share[name],
                                 **({"guard": guard_after_runs, "model": model_after_runs}
                                    if name == "adaptive" else {})})
                summary.append(verdict := summarize_cell(cell, runs))
                print(f"[{workload} T={temperature} c={n}] off {results['off'].tokens_per_s:.0f} tok/s, "
                      f"best fixed ({verdict['best_fixed']}) {results[verdict['best_fixed']].tokens_per_s:.0f}, "
                      f"adaptive {results['adaptive'].tokens_per_s:.0f} = {verdict['adaptive_vs_best_fixed']:.2f}x "
                      f"best fixed, {verdict['adaptive_vs_off']:.3f}x off (paired)"
                      + (f"; twins: {TWIN} {verdict['twin_vs_best_fixed']:.2f}x best fixed, "
                         f"{OFF_TWIN} {verdict['off_twin_vs_off']:.3f}x off" if args.twin else "")
                      + "".join(f"; {variant} {verdict[f'{variant}_vs_best_fixed']:.2f}x best fixed, "
                                f"{verdict[f'{variant}_vs_adaptive']:.3f}x adaptive"
                                for variant in VARIANTS if variant in runs), flush=True)
                print(f"  adaptive's cost model, measured / predicted seconds near {n} requests: "
                      + audit_at_load(stats["cost_model"]["prediction_audit"], n), flush=True)
                print("  policy work, share of each run (median): " + ", ".join(
                    f"{name} {statistics.median(shares[args.warmup:]):.2%}" for name, shares in policy_share.items()),
                    flush=True)
                print("  adaptive's plain request-steps by cause, timed runs: " + plain_share(
                    plain_causes["adaptive"][args.warmup:], chosen_k["adaptive"][args.warmup:]), flush=True)
    print(table(rows, ["workload", "temperature", "concurrency", "policy", "tok_s", "tpot_ms", "vs_off", "acceptance"]))
    twin_columns = ["twin_vs_best_fixed", "twin_vs_original", "off_twin_vs_off"] if args.twin else []
    print(table(summary, ["workload", "temperature", "concurrency", "best_fixed", "adaptive_vs_best_fixed",
                          "adaptive_vs_off", "spread", *twin_columns]))
    near_best = sum(c["adaptive_vs_best_fixed"] >= 0.95 for c in summary)
    not_below_off = sum(c["adaptive_vs_off"] >= 1.0 for c in summary)
    near_off = sum(c["adaptive_vs_off"] >= 0.95 for c in summary)
    cells = len(summary)
    geomean = {key: statistics.geometric_mean(c[key] for c in summary)
               for key in ("adaptive_vs_best_fixed", "adaptive_vs_off")}
    print(f"adaptive >= 0.95x best fixed in {near_best}/{cells} cells, >= 1.0x off in {not_below_off}/{cells} "
          f"(>= 0.95x off in {near_off}/{cells}); geomean {geomean['adaptive_vs_best_fixed']:.3f}x best fixed, "
          f"{geomean['adaptive_vs_off']:.3f}x off")
    if args.twin:
        twin_near_best = sum(c["twin_vs_best_fixed"] >= 0.95 for c in summary)
        twin_close = sum(abs(c["twin_vs_original"] - 1.0) <= 0.05 for c in summary)
        print(f"noise control ({TWIN}): >= 0.95x best fixed in {twin_near_best}/{cells} cells, within 5% of "
              f"its original in {twin_close}/{cells}; geomean "
              f"{statistics.geometric_mean(c['twin_vs_best_fixed'] for c in summary):.3f}x best fixed")
        off_twin_not_below = sum(c["off_twin_vs_off"] >= 1.0 for c in summary)
        print(f"noise control ({OFF_TWIN}): >= 1.0x off in {off_twin_not_below}/{cells} cells, "
              f"{min(c['off_twin_vs_off'] for c in summary):.3f}-{max(c['off_twin_vs_off'] for c in summary):.3f}x off")
    path = save(args.output, {"args": vars(args), "rows": rows, "summary": summary})
    plot(rows, args.output)
    print(f"saved {path}")


# per (dtype, device, draft quantization): the engine whose weights sweep engines read
_WEIGHTS: dict[tuple[str, str, str], LLMEngine] = {}


def plain_share(causes: list[dict[str, int]], chosen_k: list[list[int]]) -> str:
    """Plain request-steps by cause (policies/controller.py ``plain_by_cause``) as shares of all request-steps, summed
    over runs: where adaptive decoded plainly and why, at a glance in a sweep's log."""
    total = sum(sum(histogram) for histogram in chosen_k)
    summed = sum(map(Counter, causes), Counter())  # adding Counters drops the causes that counted nothing
    return ", ".join(f"{cause} {count / total:.1%}" for cause, count in summed.most_common()) or "none"


def make_engines(policies: dict[str, dict], dtype: str, device: str,
                 draft_quantization: str = "auto") -> dict[str, LLMEngine]:
    """One engine per policy: each learns from its own traffic alone, as a server running that policy would.

    They all read one set of weights, loaded once by an engine that serves no policy. With a set of its own,
    an engine's speed depended on where its weights landed in memory: of four ``off`` engines in lockstep
    (prose, T = 0.7, 32 clients, 6 runs), the first made ran 1.1-3.1% slower than the other three in all 18
    ratios (made after an engine that was then freed, it still did, presumably in the freed memory), and those three
    strayed from one another by up to 2%. Reading the first one's weights, the other three read 0.992-1.015x
    it, 15 of 18 ratios within 0.5%. Shared weights are also what a server has: the weights its next step reads
    are those its last step read, not another engine's."""
    key = (dtype, device, draft_quantization)
    source = _WEIGHTS.get(key)
    if source is None:
        source = _WEIGHTS[key] = sweep_engine(dtype, device, draft_quantization=draft_quantization)
    engines = {name: sweep_engine(dtype, device, source, draft_quantization) for name in policies}
    for name, settings in policies.items():
        set_policy(engines[name], **{"k": 4, **settings})
    return engines


def sweep_engine(dtype: str = "float32", device: str = "cpu", weights_from: LLMEngine | None = None,
                 draft_quantization: str = "auto") -> LLMEngine:
    """An engine as every sweep cell runs them (room for 64 requests of up to 1024 tokens)."""
    return make_engine(dtype, device, weights_from, max_seq_len=1024, max_running=64, max_num_batched_tokens=2048,
                       draft_quantization=draft_quantization)


def rotate_policies(engines: dict[str, LLMEngine]) -> None:
    """Move each policy, with all it learned, on to the next policy's engine (between runs: none is in flight).

    Engines differ in speed by themselves: of three identical ``off`` engines in lockstep (prose, T = 0.7, 32
    clients, 9 runs), one read 1.000-1.008x the first in 8 of 9 runs (median 1.004), the other 0.999-1.003x.
    That is as large as the gap between two policies that both decode plainly, so each policy takes every
    engine in turn and no policy keeps a fast or a slow one for a whole sweep."""
    names = list(engines)
    moved = {name: engines[names[(i + 1) % len(names)]] for i, name in enumerate(names)}
    controllers = {name: engine.policy for name, engine in engines.items()}
    for name, engine in moved.items():
        engine.policy = controllers[name]
    engines.update(moved)


def runs_beside_twins(engines: dict[str, LLMEngine], prompts: list[list[int]], params: list[SamplingParams],
                      clients: int, repeats: int, twin_suffix: str, twin_flag: str) -> dict[str, list[RunResult]]:
    """Each engine name's results of ``repeats`` lockstep runs, after one untimed, with every policy beside a twin
    (its name + ``twin_suffix``) whose engine's steps differ while the engine's ``twin_flag`` attribute is set. The
    flags are set anew before each run, since ``rotate_policies`` moves the policies across engines after each."""
    runs: dict[str, list[RunResult]] = {name: [] for name in engines}
    for run in range(repeats + 1):
        for name, engine in engines.items():
            setattr(engine, twin_flag, name.endswith(twin_suffix))
        results = run_engines_lockstep(engines, prompts, params, max_in_flight=clients)
        rotate_policies(engines)
        if run:
            for name, result in results.items():
                runs[name].append(result)
    return runs


def step_with_setting(engine: LLMEngine, twin_flag: str, module, name: str, twin_value, own_value=None) -> None:
    """Make ``engine``'s steps run with ``module.<name>`` (a module setting shared by every engine of the process,
    restored after each step) set to ``twin_value`` while the engine's ``twin_flag`` attribute is set (on by this
    call), to ``own_value`` otherwise (None: as the module has it): the twins of `runs_beside_twins` that differ by
    such a setting."""
    step = engine.step
    setattr(engine, twin_flag, True)

    def stepped():
        before = getattr(module, name)
        value = twin_value if getattr(engine, twin_flag) else own_value
        setattr(module, name, before if value is None else value)
        try:
            return step()
        finally:
            setattr(module, name, before)

    engine.step = stepped


def setting_twin_bench(description: str, cells: str, policies: dict[str, dict], twin_suffix: str, output: str,
                       setting: tuple, gain: str, twin: str, own: str, title: str) -> None:
    """A whole benchmark of every policy beside a twin whose steps run with a module setting changed (``setting``:
    module, name, the twins' value, the policies' own value or None), from the command line (`twin_bench`) to its
    report (`report_twin_bench`)."""
    args, chosen, engines = twin_bench(description, cells, policies, twin_suffix, output)
    for engine in engines.values():
        step_with_setting(engine, "setting_twin", *setting)
    tokenizer = next(iter(engines.values())).tokenizer
    rows = []
    for label, clients, prompts, params in twin_cells(args.cells, tokenizer):
        rates = rates_of(runs_beside_twins(engines, prompts, params, clients, args.repeats, twin_suffix,
                                           "setting_twin"))
        row = twin_row(label, list(chosen), rates, twin_suffix, gain, twin)
        rows.append(row)
        print(table([row], list(row)), flush=True)
    report_twin_bench(args, rows, list(chosen), gain, twin, own, title)


def rates_of(runs: dict[str, list[RunResult]]) -> dict[str, list[float]]:
    """Tokens/s of each name's runs."""
    return {name: [run.tokens_per_s for run in results] for name, results in runs.items()}


def twin_bench(description: str, cells: str, policies: dict[str, dict], twin_suffix: str,
               output: str) -> tuple[argparse.Namespace, dict[str, dict], dict[str, LLMEngine]]:
    """The command line of a benchmark that runs policies beside twins (``--cells``, ``--policies``, ``--repeats``,
    ``--output``), and what it asks for: (args, the policies run, ``off`` first, an engine per policy and twin),
    on one torch thread."""
    ap = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cells", default=cells, help="workload:temperature:clients, comma-separated")
    ap.add_argument("--policies", default=",".join(policies), help=f"among {', '.join(policies)} (off is always run)")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs per cell, after one untimed")
    ap.add_argument("--output", default=output)
    args = ap.parse_args()
    torch.set_num_threads(1)
    chosen = {name: policies[name] for name in ["off", *args.policies.split(",")] if name in policies}
    engines = make_engines({name + twin: settings for name, settings in chosen.items() for twin in ("", twin_suffix)},
                           "float32", "cpu")
    return args, chosen, engines


def twin_cells(cells: str, tokenizer) -> Iterator[tuple[str, int, list[list[int]], list[SamplingParams]]]:
    """Each ``workload:temperature:clients`` of ``cells`` (comma-separated): its label, clients and a sweep cell's
    traffic, for benchmarks that run every policy beside a twin (`runs_beside_twins`)."""
    for cell in cells.split(","):
        workload, temperature, clients = cell.split(":")
        texts = PROSE if workload == "prose" else code_prompts(64, max_chars=500)
        prompts, params = cell_traffic(tokenizer, texts, max(32, 4 * int(clients)), float(temperature), 48, 0.5)
        yield f"{workload} T={temperature} c={clients}", int(clients), prompts, params


def twin_row(label: str, policies: list[str], rates: dict[str, list[float]], twin_suffix: str, gain: str,
             twin: str) -> dict:
    """A cell's row (`plot_beside_twins` reads it): each policy's median tokens/s, its rate over its twin's
    (``"<policy> <gain>"``), and each speculative policy's over ``off``'s, its own way and its twin's."""
    row: dict = {"cell": label}
    for name in policies:
        row[f"{name} tok/s"] = statistics.median(rates[name])
        row[f"{name} {gain}"] = paired_median(rates[name], rates[name + twin_suffix])
        if name != "off":
            row[f"{name}/off"] = paired_median(rates[name], rates["off"])
            row[f"{name}/off, {twin}"] = paired_median(rates[name + twin_suffix], rates["off" + twin_suffix])
    return row


def report_twin_bench(args: argparse.Namespace, rows: list[dict], policies: list[str], gain: str, twin: str,
                      own: str, title: str) -> None:
    """A twin benchmark's end: its table, its JSON and its plot (`plot_beside_twins`) under ``args.output``."""
    print(table(rows, list(rows[0])))
    save(args.output, {"args": vars(args), "cells": rows})
    plot_beside_twins(rows, policies, args.output, gain, twin, own, title)


def plot_beside_twins(rows: list[dict], policies: list[str], output: str, gain: str, twin: str, own: str,
                      title: str) -> None:
    """Two panels from `runs_beside_twins` cells: each policy's throughput over its twin's (row key
    ``"<policy> <gain>"``), and each speculative policy's ratio to ``off``, its own way (``"<policy>/off"``,
    labelled ``own``) beside its twin's (``"<policy>/off, <twin>"``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (gains, vs_off) = plt.subplots(1, 2, figsize=(12, 4.5))
    cells = [row["cell"] for row in rows]
    width = 0.8 / len(policies)
    for i, name in enumerate(policies):
        gains.bar([c + i * width for c in range(len(cells))], [row[f"{name} {gain}"] for row in rows], width,
                  label=name)
    gains.axhline(1.0, color="grey", linewidth=0.8)
    gains.set(ylabel=f"throughput, {gain.replace('/', ' / ')}", title=title, ylim=(0.9, None))
    gains.set_xticks(range(len(cells)), cells, rotation=30, ha="right")
    gains.legend()
    speculative = [name for name in policies if name != "off"]
    bar = 0.8 / (2 * len(speculative))
    for i, name in enumerate(speculative):
        for j, (suffix, hatch) in enumerate((("", None), (f", {twin}", "//"))):
            vs_off.bar([c + (2 * i + j) * bar for c in range(len(cells))], [row[f"{name}/off{suffix}"] for row in rows],
                       bar, label=name + (suffix or f", {own}"), hatch=hatch, color=f"C{i + 1}",
                       alpha=0.6 if j else 1.0)
    vs_off.axhline(1.0, color="grey", linewidth=0.8)
    vs_off.set(ylabel="throughput / off", title="Speculation against plain decode", ylim=(0.8, None))
    vs_off.set_xticks(range(len(cells)), cells, rotation=30, ha="right")
    vs_off.legend(fontsize=8)
    fig.tight_layout()
    save_plot(fig, output)


def paired_median(rates: list[float], others: list[float]) -> float:
    """The median of the runs' ratios (each run's engines stepped in lockstep)."""
    return statistics.median(rate / other for rate, other in zip(rates, others, strict=True))


def guard_at_load(stats: dict, concurrency: int) -> list[dict]:
    """The goodput guard's figures in a policy's ``stats`` for the batch sizes a cell of ``concurrency`` clients runs at
    most of its time: its own bucket and the one below (the batch drains through it). What the guard measured is why
    a cell speculated or not, and the chosen-k histograms alone cannot tell a stuck verdict from a fair one."""
    return [bucket for bucket in stats["goodput_guard"] if near_load(bucket, concurrency)]


def near_load(bucket: dict, concurrency: int) -> bool:
    """Whether a batch-size bucket of the policy's stats is the one of ``concurrency`` or the one below it."""
    low, high = bucket["batch_sizes"]
    return high >= concurrency // 2 and low <= concurrency


def audit_at_load(audit: dict[str, list[dict]], concurrency: int) -> str:
    """The cost model's prediction audit (policies/cost_audit.py) at the bucket of ``concurrency`` and the one below:
    whether the plans priced this cell's steps right, at a glance in a sweep's log."""
    near = [(kind, bucket) for kind, buckets in audit.items() for bucket in buckets if near_load(bucket, concurrency)]
    return "; ".join(f"{kind} {bucket['batch_sizes'][0]}-{bucket['batch_sizes'][1]}: "
                     f"{bucket['measured_over_predicted']:.2f} ({bucket['steps']} steps)"
                     for kind, bucket in near) or "none"


def add_cell_arguments(ap: argparse.ArgumentParser, fixed: str, runs: int) -> None:
    """The options of a one-cell diagnostic (bench/step_stalls.py, bench/policy_cold.py): the cell, the fixed policy
    run beside ``off`` and ``adaptive``, and how many runs it times."""
    ap.add_argument("--workload", choices=["code", "prose"], default="code")
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--fixed", default=fixed, help="the fixed policy beside off and adaptive")
    ap.add_argument("--runs", type=int, default=runs)


def one_cell_traffic(tokenizer, workload: str, temperature: float,
                     concurrency: int) -> tuple[list[list[int]], list[SamplingParams]]:
    """A sweep cell's traffic (`cell_traffic`) as `main` serves it: as many requests, 48 new tokens on average."""
    num_requests = max(32, 4 * concurrency)
    texts = code_prompts(num_requests, max_chars=500) if workload == "code" else PROSE
    return cell_traffic(tokenizer, texts, num_requests, temperature, 48, 0.5)


def cell_traffic(tokenizer, texts: list[str], num_requests: int, temperature: float, new_tokens: int,
                 spread: float) -> tuple[list[list[int]], list[SamplingParams]]:
    """A cell's prompts (the texts in turn) and their sampling parameters (lengths from `output_lengths`)."""
    prompts = [tokenizer.encode(texts[i % len(texts)]) for i in range(num_requests)]
    # no seed: a seeded sampling request drafts a fixed k under `auto` (reproducibility), so seeds would turn the
    # adaptive policy into fixed k = 4 at T > 0
    params = [SamplingParams(max_tokens=length, temperature=temperature, ignore_eos=True)
              for length in output_lengths(num_requests, new_tokens, spread)]
    return prompts, params


def output_lengths(num_requests: int, mean: int, spread: float) -> list[int]:
    """Evenly spaced over mean x [1 - spread, 1 + spread], in a fixed shuffled order (the same in every run)."""
    if not 0.0 <= spread < 1.0:
        raise SystemExit("--length-spread must be in [0, 1)")
    low, high = mean * (1.0 - spread), mean * (1.0 + spread)
    step = (high - low) / max(1, num_requests - 1)
    lengths = [max(1, round(low + i * step)) for i in range(num_requests)]
    random.Random(0).shuffle(lengths)
    return lengths


def summarize_cell(cell: dict, runs: dict[str, list[RunResult]]) -> dict:
    """Adaptive vs off and vs the best fixed policy (highest median), each as the median of paired per-round
    ratios; ``spread``: the median over policies of (max - min) / median of their runs, the cell's noise.
    With the twins (noise controls) run: the draft twin vs the best fixed policy and vs its original, the ``off`` twin
    vs ``off``, alike."""
    median = statistics.median
    rates = {name: [r.tokens_per_s for r in rs] for name, rs in runs.items()}
    fixed = [name for name in rates if is_fixed(name)]
    best_fixed = max(fixed, key=lambda name: median(rates[name]))

    def paired(name: str, other: str) -> float:
        return median([a / b for a, b in zip(rates[name], rates[other], strict=True)])

    spread = median([(max(v) - min(v)) / median(v) for v in rates.values()])
    summary = {**cell, "best_fixed": best_fixed, "adaptive_vs_best_fixed": paired("adaptive", best_fixed),
               "adaptive_vs_off": paired("adaptive", "off"), "spread": spread}
    if TWIN in rates:
        summary |= {"twin_vs_best_fixed": paired(TWIN, best_fixed), "twin_vs_original": paired(TWIN, TWIN_OF)}
    if OFF_TWIN in rates:
        summary["off_twin_vs_off"] = paired(OFF_TWIN, "off")
    for variant in VARIANTS.keys() & rates.keys():
        summary[f"{variant}_vs_best_fixed"] = paired(variant, best_fixed)
        summary[f"{variant}_vs_adaptive"] = paired(variant, "adaptive")
    return summary


def plot(rows: list[dict], output: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = sorted({(r["workload"], r["temperature"]) for r in rows})
    fig, axes = plt.subplots(1, len(cells), figsize=(4.2 * len(cells), 4), sharey=True, squeeze=False)
    axes = axes[0]
    for ax, (workload, temperature) in zip(axes, cells):
        for name in POLICIES:
            sub = [r for r in rows if (r["workload"], r["temperature"], r["policy"]) == (workload, temperature, name)]
            ax.plot([r["concurrency"] for r in sub], [r["vs_off"] for r in sub], "o-" if name == "adaptive" else ".--",
                    label=name, linewidth=2.5 if name == "adaptive" else 1)
        ax.axhline(1.0, color="gray", linewidth=0.8)
        ax.set_xscale("log", base=2)
        ax.set_title(f"{workload}, T={temperature}")
        ax.set_xlabel("concurrency")
    axes[0].set_ylabel("throughput vs off")
    axes[-1].legend(fontsize=7)
    fig.tight_layout()
    save_plot(fig, output, dpi=110)


if __name__ == "__main__":
    main()
