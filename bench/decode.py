"""Decode throughput of our engine vs transformers on the bundled target (no speculation).

(a) batch-1 greedy tokens/s: our engine vs ``generate``;
(b) aggregate throughput at 1, 4, 16, 32 concurrent requests vs transformers generating them one after another.

    .venv/bin/python -m bench.decode [--new-tokens 128] [--device cpu|cuda] [--dtype float32]
"""

from __future__ import annotations

import argparse

import torch

from bench.common import RESULTS, hf_generate, load_hf, make_engine, median_rate, run_engine, save, set_policy, table
from bench.prompts import code_prompts
from engine.types import SamplingParams


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--concurrency", default="1,4,16,32")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    dtype = getattr(torch, args.dtype)
    engine = make_engine(args.dtype, args.device, max_seq_len=1024, max_running=64, speculation="off")
    set_policy(engine, mode="off")
    hf = load_hf(dtype=dtype, device=args.device)
    prompts = [engine.tokenizer.encode(p) for p in code_prompts(32, max_chars=300)]
    params = SamplingParams(max_tokens=args.new_tokens, temperature=0.0, ignore_eos=True)
    run_engine(engine, prompts[:2], params)  # warm-up
    hf_generate(hf, prompts[0], 8)

    ours1 = [run_engine(engine, [prompts[i]], params) for i in range(args.repeats)]
    theirs1 = [hf_generate(hf, prompts[i], args.new_tokens) for i in range(args.repeats)]
    batch1 = {"ours_tok_s": median_rate(ours1), "hf_tok_s": median_rate(theirs1)}
    batch1["ratio"] = batch1["ours_tok_s"] / batch1["hf_tok_s"]
    print(f"batch 1 greedy: ours {batch1['ours_tok_s']:.1f} tok/s, HF generate {batch1['hf_tok_s']:.1f} tok/s, "
          f"ratio {batch1['ratio']:.2f}x")

    hf_seq_rate = batch1["hf_tok_s"]  # HF one after another: its batch-1 rate, whatever the concurrency
    rows = []
    for n in (int(c) for c in args.concurrency.split(",")):
        result = run_engine(engine, prompts[:n], params)
        rows.append({"concurrency": n, "ours_tok_s": result.tokens_per_s, "hf_sequential_tok_s": hf_seq_rate,
                     "ratio": result.tokens_per_s / hf_seq_rate})
    print(table(rows, ["concurrency", "ours_tok_s", "hf_sequential_tok_s", "ratio"]))
    name = "decode" if (args.device, args.dtype) == ("cpu", "float32") else f"decode_{args.device}_{args.dtype}"
    path = save(name, {"args": vars(args), "batch1": batch1, "concurrency": rows})
    plot(rows, batch1, name)
    print(f"saved {path}")


def plot(rows: list[dict], batch1: dict, name: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    a.bar(["specserve", "HF generate"], [batch1["ours_tok_s"], batch1["hf_tok_s"]], color=["C0", "C1"])
    a.set_title("batch-1 greedy decode")
    a.set_ylabel("tokens/s")
    xs = [r["concurrency"] for r in rows]
    b.plot(xs, [r["ours_tok_s"] for r in rows], "o-", label="specserve (continuous batching)")
    b.plot(xs, [r["hf_sequential_tok_s"] for r in rows], "s--", label="HF generate, sequential")
    b.set_xscale("log", base=2)
    b.set_xlabel("concurrent requests")
    b.set_ylabel("aggregate tokens/s")
    b.legend()
    b.set_title("throughput")
    fig.tight_layout()
    fig.savefig(RESULTS / f"{name}.png", dpi=120)


if __name__ == "__main__":
    main()
