"""Does running the draft model's linears as int8 (engine/models/int8.py, a CPU engine's default) pay, end to end?

Lockstep runs (bench/policy_sweep.py's engines and traffic) of ``off``, fixed draft k = 2 and k = 4 and ``adaptive``,
each beside a twin whose draft model runs oneDNN's packed float32 linears (``--draft-quantization none``): int8 /
float throughput per policy and cell, the median of paired runs, each policy's ratio to ``off`` both ways, and the
draft's acceptance both ways (its numerics can change acceptance, never the text). The int8 engines read one set of
weights, the float twins one float draft model. After each run every policy moves on to the next one's engine
(``rotate_policies``), and the float draft goes with the twins' policies. ``off``'s twin is the noise control. ::

    taskset -c 0 .venv/bin/python -m bench.draft_int8 [--cells code:1:1,prose:0.7:16] [--repeats 3]

Measured on a Zen 3 VM (AMD EPYC, cpu family 25, model 1; 1 thread, 2026-12-01; ``draft_int8_code.json`` and
``draft_int8_prose.json``, one a core, 3 runs a cell): int8 / float for fixed draft k = 2 1.03-1.08x, k = 4
1.02-1.11x, adaptive 1.04-1.10x, ``off`` 0.996-1.011x (noise); the draft's acceptance alike both ways (fixed
policies: within 0.03, sampling luck). Fixed draft k = 2 against ``off``: 1.33x -> 1.44x at 1 code client (T = 1),
1.22x -> 1.30x at 2 prose clients (T = 0), 1.08x -> 1.13x at 16 prose clients (T = 1), 1.03x -> 1.09x at 32 prose
clients (T = 0.7); adaptive 1.01x -> 1.10x and 1.01x -> 1.06x at those last two.
"""

from __future__ import annotations

import statistics

import torch

from bench.common import table
from bench.policy_sweep import (
    rates_of,
    report_twin_bench,
    runs_beside_twins,
    twin_bench,
    twin_cells,
    twin_row,
)
from engine.engine import LLMEngine
from engine.models.llama import LlamaModel, touch_linears
from engine.models.loader import DEFAULT_DRAFT, load_model
from engine.models.row_padding import calibrate_row_padding

POLICIES = {"off": {"mode": "off"}, "draft k=2": {"mode": "draft", "k": 2}, "draft k=4": {"mode": "draft", "k": 4},
            "adaptive": {"mode": "auto"}}
FLOAT = " (float draft)"
CELLS = "code:1:1,prose:0:2,code:0.7:4,prose:1:8,code:1:16,prose:0.7:32"  # default --cells (workload:T:clients)


def float_draft() -> LlamaModel:
    """The bundled draft model with packed float32 linears, as ``--draft-quantization none`` loads it, warmed up."""
    model, _ = load_model(DEFAULT_DRAFT, torch.float32, torch.device("cpu"))
    calibrate_row_padding(model)
    touch_linears(model, 2048)
    return model


def draft_in_float(engine: LLMEngine, model: LlamaModel) -> None:
    """Make ``engine``'s draft proposer run ``model`` while its ``float_draft`` is set (on by this call), its own
    (int8) draft model otherwise. Set between runs only: a request's draft cache holds one model's keys and values."""
    runner = engine.proposers["draft"].runner
    own, step = runner.model, engine.step
    engine.float_draft = True

    def stepped():
        runner.model = model if engine.float_draft else own
        return step()

    engine.step = stepped


def main() -> None:
    args, policies, engines = twin_bench(__doc__, CELLS, POLICIES, FLOAT, "draft_int8")
    model = float_draft()
    for engine in engines.values():
        draft_in_float(engine, model)
    tokenizer = next(iter(engines.values())).tokenizer
    rows = []
    for label, clients, prompts, params in twin_cells(args.cells, tokenizer):
        runs = runs_beside_twins(engines, prompts, params, clients, args.repeats, FLOAT, "float_draft")
        row = twin_row(label, list(policies), rates_of(runs), FLOAT, "int8/float", "float")
        for name in policies:
            if name != "off":
                row[f"{name} acceptance"] = statistics.mean(run.acceptance for run in runs[name])
                row[f"{name} acceptance, float"] = statistics.mean(run.acceptance for run in runs[name + FLOAT])
        rows.append(row)
        print(table([row], list(row)), flush=True)
    report_twin_bench(args, rows, list(policies), "int8/float", "float", "int8", "Int8 draft linears, lockstep")


if __name__ == "__main__":
    main()
