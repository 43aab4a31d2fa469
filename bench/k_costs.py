"""What does each drafted token cost at one load, and does the adaptive policy's cost fit know? Ours only (CPU or GPU).

The adaptive policy picks k from a linear step-cost fit (policies/cost_model.py) learned from the steps its own plans
made. Sitting mostly at one k, those steps cannot tell a fed token's cost from verifying's fixed cost, nor a draft
pass's from a round's, and the fit's guess decides k (docs/goodput-guard.md, s52, s68, s76, s77). This measures the
truth at one load: ``--concurrency`` clients (the sweep cell's prompts and output lengths, ``ignore_eos``; a client
whose request finished asks again) decode on one engine per uniform draft k = 0..``--max-k`` (0: plain decode) and on
one adaptive engine, all stepped in turn so a drifting VM's pace reaches each alike. Per k it reports the median
full-batch step that no request joined (whole, target pass, draft passes), the tokens a step emitted and their rate;
beside them, what the adaptive engine's fit predicts for that uniform k at its learned acceptance, and which k its
plans chose::

    taskset -c 0 .venv/bin/python -m bench.k_costs --workload prose --temperature 0.7 --concurrency 16

Where the predicted rates rank the k's unlike the measured ones, the plan drafts the wrong k however well it solves.

Requests of the sweep's lengths, not endless ones: a step's cost grows with its requests' contexts (attention reads
every cached token), and each engine's contexts grew at its own k's pace. At 16 prose requests, T = 0.7, plain steps
of one engine took 11.5 ms at first and ~29 ms 360 steps later; over s77's 150 steps of endless requests a k = 4
engine's contexts grew ~3.5x as fast as plain decode's, so its steps were measured at longer contexts (and with
them, KV reads that verification shares among a request's k + 1 rows).

What it found (2026-12-06; docs/goodput-guard.md, s77, s78). With endless requests (s77, a 2-core Intel Xeon, model 207;
``k_costs_prose_t07_c16.json``, prose T = 0.7, 16 requests, 150 steps): k = 2 1.11x plain decode, k = 1 1.09x, k = 3
1.06x, k = 4 0.96x, and a fit predicting 1.32x, 1.31x, 1.27x at k = 2-4. With the sweep's lengths (s78, a 2-core AMD Zen
4, 300 steps; ``s78_k_costs_*``): prose T = 0.7, 16 requests: k = 1-2 1.00-1.01x plain decode, k = 3 0.97x, k = 4 0.88x,
the fit 1.08x, 1.09x, 1.06x, 1.00x (its plans decoded plainly in 77% of request-steps); code T = 0.7, 8 requests: k =
1-3 1.17x, 1.18x, 1.15x, k = 4 1.10x, k = 5 1.05x, the fit 1.17x, 1.22x, 1.21x, 1.18x, 1.13x. Both fits put the best k
where the clock did (k = 2), 4-8% above the measured gain: they price speculative steps a few percent too cheap. Part of
the gap at k >= 4 is this bench's: its predicted tokens a step are Leviathan's for every request at the full k, while a
request within k tokens of its max_tokens drafts fewer (measured 27.0 against 28.7 predicted at code k = 4, 28.8 against
32.0 at k = 5; 19.8 against 20.1 at k = 2). The adaptive plan itself caps each request's k.
"""

from __future__ import annotations

import argparse
import statistics

import torch

from bench.common import save, save_plot, set_policy, table
from bench.guard_check import record
from bench.policy_sweep import cell_traffic, sweep_engine
from bench.prompts import PROSE, code_prompts
from engine.engine import LLMEngine
from policies.base import StepTiming
from policies.cost_model import DraftPlan
from policies.goodput import expected_tokens

ADAPTIVE = "adaptive"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", choices=("code", "prose"), default="prose")
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--max-k", type=int, default=4)
    ap.add_argument("--steps", type=int, default=300, help="steps each engine takes; the first 10 are not counted")
    ap.add_argument("--new-tokens", type=int, default=48,
                    help="mean max_tokens of the requests (the sweep's); a finished request's client asks again")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--output", default=None, help="name of the JSON and PNG in bench/results/")
    args = ap.parse_args()
    torch.set_num_threads(1)
    n, temperature = args.concurrency, args.temperature
    source = sweep_engine(args.dtype, args.device)
    engines: dict[str | int, LLMEngine] = {}
    for k in [*range(args.max_k + 1), ADAPTIVE]:
        engines[k] = sweep_engine(args.dtype, args.device, weights_from=source)
        mode = {"mode": "auto"} if k == ADAPTIVE else {"mode": "off"} if k == 0 else {"mode": "draft", "k": k}
        set_policy(engines[k], **mode)
    texts = PROSE if args.workload == "prose" else code_prompts(n, max_chars=500)
    prompts, params = cell_traffic(source.tokenizer, texts, n, temperature, args.new_tokens, 0.5)
    steps: list[tuple[str, StepTiming]] = []
    for name, engine in engines.items():
        engine.policy.observe_step = record(engine.policy.observe_step, str(name), steps)
        for client in range(n):
            engine.add_request(request_id(name, client, 0), prompts[client], params[client])
    for _ in range(args.steps):
        for name, engine in engines.items():
            for output in engine.step():
                if output.finished:  # its client asks again: contexts stay as long as the sweep's
                    client, run = client_and_run(output.request_id)
                    engine.add_request(request_id(name, client, run + 1), prompts[client], params[client])
    adaptive = engines[ADAPTIVE].policy
    fit = adaptive.learned.cost_model.coefficients()
    alpha, lead = adaptive.learned.acceptance.by_position("", "draft", temperature)
    rows = []
    for k in range(args.max_k + 1):
        measured = steady([timing for name, timing in steps if name == str(k)], n)
        predicted_seconds = fit.step_seconds(n, n * (k + 1), DraftPlan(k, n) if k else None, verifies=k > 0)
        rows.append({"k": k, "steps": len(measured),
                     "step_ms": 1e3 * statistics.median(t.step_seconds for t in measured),
                     "target_ms": 1e3 * statistics.median(t.target_seconds for t in measured),
                     "draft_ms": 1e3 * statistics.median(t.draft_seconds for t in measured),
                     "tokens_per_step": statistics.mean(t.num_generated for t in measured),
                     "predicted_ms": 1e3 * predicted_seconds,
                     "predicted_tokens_per_step": n * expected_tokens(alpha, k, lead)})
    for row in rows:
        row["tok_s"] = 1e3 * row["tokens_per_step"] / row["step_ms"]
        row["vs_plain"] = row["tok_s"] / rows[0]["tok_s"]
        row["predicted_vs_plain"] = (row["predicted_tokens_per_step"] / row["predicted_ms"]) / (
            rows[0]["predicted_tokens_per_step"] / rows[0]["predicted_ms"])
    chosen = adaptive.stats()["chosen_k"]["histogram"]
    print(table(rows, list(rows[0])))
    print(f"adaptive: request-steps per chosen k {chosen}; its fit {fit}; draft alpha {alpha:.3f}, lead {lead:.2f}")
    best, believed = (max(rows, key=lambda row: row[key])["k"] for key in ("vs_plain", "predicted_vs_plain"))
    print(f"best measured k = {best}; the fit's best k = {believed}")
    output = args.output or f"k_costs_{args.workload}_t{args.temperature:g}_c{n}".replace(".", "")
    save(output, {"args": vars(args), "rows": rows, "adaptive_chosen_k": chosen, "fit": vars(fit),
                  "alpha": alpha, "lead": lead})
    plot(rows, output, f"{args.workload}, T = {temperature:g}, {n} requests")


def request_id(engine: str | int, client: int, run: int) -> str:
    return f"k-costs-{engine}-{client}-{run}"


def client_and_run(request_id: str) -> tuple[int, int]:
    """The client that sent a `request_id` and which of its requests it was."""
    client, run = request_id.rsplit("-", 2)[1:]
    return int(client), int(run)


def steady(timings: list[StepTiming], batch_size: int) -> list[StepTiming]:
    """The full-batch steps without prefill, after the first 10 (the draft model's first catch-up among them): those
    that no request joined (a joining request's step feeds its prompt)."""
    return [t for t in timings[10:] if t.batch_size == batch_size and not t.num_prefilling]


def plot(rows: list[dict], output: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    ks = [row["k"] for row in rows]
    ax.plot(ks, [row["vs_plain"] for row in rows], marker="o", label="measured")
    ax.plot(ks, [row["predicted_vs_plain"] for row in rows], marker="s", linestyle="--",
            label="adaptive's fit predicts")
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set(xlabel="uniform draft k (0: plain decode)", ylabel="tokens/s over plain decode", title=title)
    ax.legend()
    fig.tight_layout()
    save_plot(fig, output)


if __name__ == "__main__":
    main()
