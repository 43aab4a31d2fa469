"""Does attending short runs (verification, draft catch-ups) in one group per length, not all in one group padded to
the longest, pay end to end? (`engine.models.llama._length_class`; a CPU's rule, ``EXACT_SHORT_RUNS``.)

Lockstep runs (bench/policy_sweep.py's engines and traffic) of ``off``, fixed draft k = 2 and ``adaptive``, each
beside a twin whose steps group short runs the other way (``EXACT_SHORT_RUNS`` flipped; the columns read as if
per length were on): per-length / one-group throughput per policy and
cell, the median of paired runs, and each policy's ratio to ``off`` both ways. The twins read the same weights. After
each run every policy moves on to the next one's engine (``rotate_policies``), and the old grouping goes with the
twins' policies. ``off``'s steps have no short runs but short prompts and its twin is the noise control. ::

    taskset -c 0 .venv/bin/python -m bench.attention_lengths [--cells code:0:32,prose:0.7:32] [--repeats 3]

Measured on a Zen 3 VM (1 thread, 2026-12-02, per length flipped on in the twins' place; ``attention_lengths_c32.json``,
``attention_lengths_mixed.json``, 3 runs a cell): per length / one group, ``off`` 0.999-1.02x, fixed draft k = 2
1.00-1.02x, adaptive 1.02x (code T = 0, 32), 0.938x (prose T = 0.7, 32), 1.04x (prose T = 0, 16), 0.926x (code
T = 1, 32). Single passes of mixed k at 16-32 requests took 0.85-0.91x the time (bench/attention_groups.py).
"""

from __future__ import annotations

from bench.common import table
from bench.policy_sweep import (
    rates_of,
    report_twin_bench,
    runs_beside_twins,
    step_with_setting,
    twin_bench,
    twin_cells,
    twin_row,
)
from engine.models import llama

POLICIES = {"off": {"mode": "off"}, "draft k=2": {"mode": "draft", "k": 2}, "adaptive": {"mode": "auto"}}
ONE_GROUP = " (one group)"
CELLS = "code:0:32,prose:0.7:32,prose:0:16,code:1:32,code:0.7:8,prose:1:4"  # default --cells (workload:T:clients)


def main() -> None:
    args, policies, engines = twin_bench(__doc__, CELLS, POLICIES, ONE_GROUP, "attention_lengths")
    for engine in engines.values():
        step_with_setting(engine, "one_group", llama, "EXACT_SHORT_RUNS", not llama.EXACT_SHORT_RUNS)
    tokenizer = next(iter(engines.values())).tokenizer
    rows = []
    for label, clients, prompts, params in twin_cells(args.cells, tokenizer):
        rates = rates_of(runs_beside_twins(engines, prompts, params, clients, args.repeats, ONE_GROUP, "one_group"))
        row = twin_row(label, list(policies), rates, ONE_GROUP, "per-length/one-group", "one group")
        rows.append(row)
        print(table([row], list(row)), flush=True)
    report_twin_bench(args, rows, list(policies), "per-length/one-group", "one group", "per length",
                      "Short runs attending per length, lockstep")


if __name__ == "__main__":
    main()
