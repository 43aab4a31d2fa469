"""Does folding each kv head's query heads into one query axis (CPU attention of short runs: verification, draft
catch-ups; `engine.models.llama.Attention._attend_folded`) pay, end to end?

Lockstep runs (bench/policy_sweep.py's engines and traffic) of ``off``, fixed draft k = 2 and ``adaptive``, each
beside a twin whose steps attend per head (``enable_gqa``, as before the fold): folded / per-head throughput per
policy and cell, the median of paired runs, and each policy's ratio to ``off`` both ways. The twins read the same
weights. After each run every policy moves on to the next one's engine (``rotate_policies``), and the per-head
attention goes with the twins' policies. ::

    taskset -c 0 .venv/bin/python -m bench.attention_fold [--cells code:0.7:32,prose:1:32] [--repeats 3]

Measured on a Zen 3 VM (1 thread, 2026-11-30, before this script, with the same twins; docs/goodput-guard.md, s62):
fixed draft k = 2 read 1.045x its per-head twin at 32 prose clients (T = 1; 0.964x -> 1.021x ``off``), 1.032x at 32
code clients (T = 0.7; 1.009x -> 1.058x), 1.026x at 16 code clients (T = 1), 1.013x at 8 prose clients (T = 0.7) and
1.005-1.021x at 2-4; ``off``, whose steps have no short runs but short prompts, 0.990-1.005x. This script, the same day
(``--policies "draft k=2" --repeats 3``, one cell a core; ``attention_fold_code_t07_c32.json``,
``attention_fold_prose_t1_c32.json``): draft k = 2 1.06x its twin at 32 code clients, T = 0.7 (0.979x -> 1.04x ``off``),
1.04x at 32 prose clients, T = 1 (0.963x -> 0.995x); ``off`` 0.996-0.998x.
"""

from __future__ import annotations

from bench.policy_sweep import setting_twin_bench
from engine.models import llama

POLICIES = {"off": {"mode": "off"}, "draft k=2": {"mode": "draft", "k": 2}, "adaptive": {"mode": "auto"}}
PER_HEAD = " (per head)"
CELLS = "prose:1:32,code:0.7:32,code:1:16,prose:0.7:8,code:0:4,prose:0:2"  # default --cells (workload:T:clients)


def main() -> None:
    setting_twin_bench(__doc__, CELLS, POLICIES, PER_HEAD, "attention_fold",
                       (llama, "FOLD_SHORT_RUNS", False, True), "folded/per-head", "per head", "folded",
                       "Folded short-run attention, lockstep")


if __name__ == "__main__":
    main()
