"""Does rounding 65-256 rows up to multiples of 8, not 32, pay end to end? (`engine.models.llama.ROW_BANDS`; CPU.)

A CPU's packed linears run a row count up to 64 rounded to a multiple of 4, and above that one from a short list,
so that oneDNN builds few kernels (`padded_rows`). A padded row costs what a fed one does. Rounded to 32 from 65
rows, a verification of 16 requests at k = 4 (80 rows) ran at 96 and mixed plans at 32 requests (65-95 rows) paid
fixed draft k = 2's 96. Lockstep runs (bench/policy_sweep.py's engines and traffic) of each policy with the bands as
the module has them beside a twin whose steps round 65-512 rows to 32 (the bands before s77): ratio per policy and
cell, the median of paired runs, and each policy's ratio to ``off`` both ways. ``off`` feeds no more than 64 rows
but where prompts join, and its twin is the noise control. ::

    taskset -c 0 .venv/bin/python -m bench.row_bands [--cells prose:0.7:16,code:0.7:32] [--repeats 3]
"""

from __future__ import annotations

from bench.policy_sweep import setting_twin_bench
from engine.models import llama

POLICIES = {"off": {"mode": "off"}, "draft k=2": {"mode": "draft", "k": 2}, "draft k=4": {"mode": "draft", "k": 4},
            "adaptive": {"mode": "auto"}}
COARSE = " (rounded to 32)"
COARSE_BANDS = ((64, 4), (512, 32))  # the bands before s77
CELLS = "prose:0.7:16,code:0.7:16,prose:0.7:32,code:0.7:32,code:1:32"  # default --cells (workload:T:clients)


def main() -> None:
    setting_twin_bench(__doc__, CELLS, POLICIES, COARSE, "row_bands", (llama, "ROW_BANDS", COARSE_BANDS, None),
                       "by-8/by-32", "rounded to 32", "rounded to 8", "65-256 rows rounded to 8, lockstep")


if __name__ == "__main__":
    main()
