"""Does attending short runs (verification, draft catch-ups) in one group per length, not all in one group padded to
the longest, pay end to end? (`engine.models.llama._length_class`; a CPU's rule, ``EXACT_SHORT_RUNS``.)

Lockstep runs (bench/policy_sweep.py's engines and traffic) of ``off``, fixed draft k = 2 and ``adaptive``, each
attending per length (``EXACT_SHORT_RUNS`` on for its steps, whatever the default) beside a twin whose steps group
short runs in one group: per-length / one-group throughput per policy and cell, the median of paired runs, and each
policy's ratio to ``off`` both ways. The twins read the same weights. After each run every policy moves on to the next
one's engine (``rotate_policies``), and the one group goes with the twins' policies. ``off``'s steps have no short
runs but short prompts, and its twin is the noise control. ::

    taskset -c 0 .venv/bin/python -m bench.attention_lengths [--cells code:0:32,prose:0.7:32] [--repeats 3]

Measured on a Zen 3 VM (1 thread, 2026-12-02, ``attention_lengths_c32.json``,
``attention_lengths_mixed.json``, 3 runs a cell): per length / one group, ``off`` 0.999-1.02x, fixed draft k = 2
1.00-1.02x, adaptive 1.02x (code T = 0, 32), 0.938x (prose T = 0.7, 32), 1.04x (prose T = 0, 16), 0.926x (code
T = 1, 32). Single passes of mixed k at 16-32 requests took 0.85-0.91x the time (bench/attention_groups.py).
On a Zen 4 VM (2026-12-02, ``attention_lengths_zen4_a.json``, ``_b.json``, ``--policies off,adaptive``, 6 runs a cell):
``off`` 0.997-1.003x, adaptive 1.03x (code T = 0, 32), 1.00x (prose T = 0, 16), 1.02x (prose T = 0.7, 32), 0.991x
(code T = 1, 32). There, in a policy sweep cell (code T = 0, 32 clients), adaptive's speculative steps at 17-32
requests took 1.09-1.12x what its cost model predicted in one group, 0.98-0.99x per length, which is now the default.
"""

from __future__ import annotations

from bench.policy_sweep import setting_twin_bench
from engine.models import llama

POLICIES = {"off": {"mode": "off"}, "draft k=2": {"mode": "draft", "k": 2}, "adaptive": {"mode": "auto"}}
ONE_GROUP = " (one group)"
CELLS = "code:0:32,prose:0.7:32,prose:0:16,code:1:32,code:0.7:8,prose:1:4"  # default --cells (workload:T:clients)


def main() -> None:
    setting_twin_bench(__doc__, CELLS, POLICIES, ONE_GROUP, "attention_lengths",
                       (llama, "EXACT_SHORT_RUNS", False, True), "per-length/one-group", "one group", "per length",
                       "Short runs attending per length, lockstep")


if __name__ == "__main__":
    main()
