"""Does running few rows padded to a faster row count (engine/models/row_padding.py) pay, on this CPU?

Two parts, in one process on one core:

1. Each bundled model's prepacked linears, one pass in a forward pass's order, per row count 1-16 (the warm-up's
   own timing, with more rounds), and the padding the warm-up would choose from it.
2. Lockstep runs (bench/policy_sweep.py's engines and traffic) of ``off``, fixed draft k = 2 and ``adaptive``, each
   beside a twin whose models run every row count exactly: padded / exact throughput per policy and concurrency,
   the median of paired runs. The twins read the same weights; a twin's steps take the padding off the shared
   linears and put it back. After each run every policy moves on to the next one's engine (``rotate_policies``),
   and the exact rows go with the twins' policies. ::

    taskset -c 0 .venv/bin/python -m bench.row_padding [--workload prose] [--temperature 1.0] [--concurrency 1,2,3,4,8]

Measured on a Zen 4 VM (2 cores, 2026-11-29; ``row_padding_prose.json``, ``--workload prose --temperature 1``, and
``row_padding_code.json``, ``--workload code --temperature 0``): plain decode ran 1.085-1.091x its exact twin at 1
client and 1.145-1.169x at 2, 1.014-1.031x at 3-4; fixed draft k = 2 and adaptive 1.00-1.03x at 1-4
(docs/goodput-guard.md, s56).
"""

from __future__ import annotations

import argparse
import statistics

import torch

from bench.common import save, save_plot, table
from bench.policy_sweep import cell_traffic, make_engines, paired_median, rates_of, runs_beside_twins
from bench.prompts import PROSE, code_prompts
from engine.engine import LLMEngine
from engine.models.llama import EXACT_ROWS, PackedLinear, packed_linears
from engine.models.row_padding import padding_table, time_row_counts

POLICIES = {"off": {"mode": "off"}, "draft k=2": {"mode": "draft", "k": 2}, "adaptive": {"mode": "auto"}}
EXACT = " (exact rows)"


def run_exactly(engine: LLMEngine, linears: list[PackedLinear]) -> None:
    """Make ``engine``'s steps run ``linears`` (shared with other engines) at exact row counts while its
    ``exact_rows`` is set (on by this call)."""
    step = engine.step
    engine.exact_rows = True

    def exact_step():
        if not engine.exact_rows:
            return step()
        tables = [linear.row_padding for linear in linears]
        for linear in linears:
            linear.row_padding = None
        try:
            return step()
        finally:
            for linear, padding in zip(linears, tables, strict=True):
                linear.row_padding = padding

    engine.step = exact_step


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", choices=("code", "prose"), default="prose")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--concurrency", default="1,2,3,4,8")
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=4, help="timed runs per concurrency, after one untimed")
    ap.add_argument("--rounds", type=int, default=15, help="timing rounds of part 1")
    ap.add_argument("--output", default="row_padding")
    args = ap.parse_args()
    torch.set_num_threads(1)
    engines = make_engines({name + twin: settings for name, settings in POLICIES.items() for twin in ("", EXACT)},
                           "float32", "cpu")
    first = next(iter(engines.values()))
    # a CPU draft model's linears run int8 by default (engine/models/int8.py), which pads nothing
    models = {name: model for name, model in (("target", first.model), ("draft", first.draft_model))
              if packed_linears(model)}
    passes = {}
    for name, model in models.items():
        seconds = time_row_counts(packed_linears(model), range(1, EXACT_ROWS + 1), rounds=args.rounds)
        passes[name] = {"ms": {rows: 1e3 * s for rows, s in seconds.items()}, "table": padding_table(seconds),
                        "warm_up_table": packed_linears(model)[0].row_padding}
        print(f"{name}: " + ", ".join(f"{rows}: {ms:.2f}" for rows, ms in passes[name]["ms"].items())
              + f" ms; padding now {passes[name]['table']}, at warm-up {passes[name]['warm_up_table']}", flush=True)
    linears = [linear for model in models.values() for linear in packed_linears(model)]
    for engine in engines.values():
        run_exactly(engine, linears)
    texts = PROSE if args.workload == "prose" else code_prompts(args.requests, max_chars=500)
    prompts, params = cell_traffic(first.tokenizer, texts, args.requests, args.temperature, 48, 0.5)
    rows = []
    for clients in (int(c) for c in args.concurrency.split(",")):
        rates = rates_of(runs_beside_twins(engines, prompts, params, clients, args.repeats, EXACT, "exact_rows"))
        row = {"clients": clients}
        for name in POLICIES:
            row[f"{name} tok/s"] = statistics.median(rates[name])
            row[f"{name} padded/exact"] = paired_median(rates[name], rates[name + EXACT])
        row["adaptive/off"] = paired_median(rates["adaptive"], rates["off"])
        row["adaptive/off, exact"] = paired_median(rates["adaptive" + EXACT], rates["off" + EXACT])
        rows.append(row)
        print(table([row], list(row)), flush=True)
    print(table(rows, list(rows[0])))
    save(args.output, {"args": vars(args), "linear_passes": passes, "runs": rows})
    plot(passes, rows, args.output)


def plot(passes: dict, rows: list[dict], output: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (times, ratios) = plt.subplots(1, 2, figsize=(11, 4))
    for name, part in passes.items():
        counts = list(part["ms"])
        times.plot(counts, list(part["ms"].values()), marker="o", label=f"{name} model")
    times.set(xlabel="rows", ylabel="ms per pass of its linears", title="Prepacked linears by row count")
    times.legend()
    clients = [row["clients"] for row in rows]
    for name in POLICIES:
        ratios.plot(clients, [row[f"{name} padded/exact"] for row in rows], marker="o", label=name)
    ratios.axhline(1.0, color="grey", linewidth=0.8)
    ratios.set(xlabel="clients", ylabel="throughput, padded / exact rows", title="Padded row counts, lockstep")
    ratios.legend()
    fig.tight_layout()
    save_plot(fig, output)


if __name__ == "__main__":
    main()
