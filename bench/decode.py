"""Decode throughput of our engine vs transformers on the bundled target (no speculation).

(a) batch-1 greedy tokens/s: our engine vs ``generate``;
(b) aggregate throughput at 1, 4, 16, 32 concurrent requests vs transformers generating them one after another.

    .venv/bin/python -m bench.decode [--new-tokens 128] [--device cpu|cuda] [--dtype float32]

On a GPU, ``--shape llama-3.2-3b`` (or llama-3.2-1b) runs both on a randomly initialised model of that
shape instead (bench/random_model.py; written once to --shape-dir) and reports the fraction of the HBM
bandwidth roofline: weight bytes read per decode step / step time, over the card's bandwidth:

    python -m bench.decode --device cuda --dtype bfloat16 --shape llama-3.2-3b --concurrency 1,16
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from bench.common import hf_generate, load_hf, make_engine, median_rate, run_engine, save, save_plot, set_policy, table
from bench.prompts import code_prompts
from bench.random_model import SHAPES, random_prompts, write_random_checkpoint
from engine.models.loader import DEFAULT_DRAFT, DEFAULT_TARGET
from engine.types import SamplingParams


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--concurrency", default="1,4,16,32")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--shape", choices=sorted(SHAPES), help="a randomly initialised model of this shape")
    ap.add_argument("--shape-dir", type=Path, help="where the random checkpoint is written (default build/<shape>)")
    ap.add_argument("--hbm-gbps", type=float, help="memory bandwidth for the roofline (default: known cards)")
    args = ap.parse_args()
    dtype = getattr(torch, args.dtype)
    levels = [int(c) for c in args.concurrency.split(",")]
    model = DEFAULT_TARGET
    if args.shape:
        model = args.shape_dir or Path("build") / args.shape
        if not (model / "config.json").is_file():
            write_random_checkpoint(model, args.shape, dtype, args.device)
    engine = make_engine(args.dtype, args.device, model=model, draft_model=None if args.shape else DEFAULT_DRAFT,
                         max_seq_len=1024, max_running=max(levels), speculation="off")
    set_policy(engine, mode="off")
    hf = load_hf(model, dtype=dtype, device=args.device)
    if args.shape:
        prompts = random_prompts(max(levels), 128, engine.model.args.vocab_size)
    else:
        prompts = [engine.tokenizer.encode(p) for p in code_prompts(max(levels), max_chars=300)]
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
    for n in levels:
        result = run_engine(engine, prompts[:n], params)
        rows.append({"concurrency": n, "ours_tok_s": result.tokens_per_s, "hf_sequential_tok_s": hf_seq_rate,
                     "ratio": result.tokens_per_s / hf_seq_rate})
    roofline = add_roofline(rows, engine, args.hbm_gbps or known_bandwidth_gbps(args.device))
    print(table(rows, ["concurrency", "ours_tok_s", "hf_sequential_tok_s", "ratio", *roofline]))
    name = "decode" if (args.device, args.dtype) == ("cpu", "float32") else f"decode_{args.device}_{args.dtype}"
    name += f"_{args.shape}" if args.shape else ""
    path = save(name, {"args": vars(args), "batch1": batch1, "concurrency": rows})
    plot(rows, batch1, name)
    print(f"saved {path}")


def known_bandwidth_gbps(device: str) -> float | None:
    """HBM bandwidth of the cards we are lent (SXM figures), else None: no roofline without a number."""
    if not device.startswith("cuda") or not torch.cuda.is_available():
        return None
    name = torch.cuda.get_device_name()
    return 4800.0 if "H200" in name else 2000.0 if "H100 PCIe" in name else 3350.0 if "H100" in name else None


def add_roofline(rows: list[dict], engine, hbm_gbps: float | None) -> list[str]:
    """Per row: weight bytes per decode step / step time, and that over the bandwidth; returns the new columns.

    A decode step reads every weight once whatever the batch, so at small batches this is the bound.
    The step time is concurrency / aggregate tokens per second (prefill included: a slight underestimate).
    """
    weight_bytes = sum(p.numel() * p.element_size() for p in engine.model.parameters())
    for row in rows:
        step_seconds = row["concurrency"] / row["ours_tok_s"]
        row["weight_gb_per_s"] = weight_bytes / step_seconds / 1e9
        if hbm_gbps:
            row["roofline_fraction"] = row["weight_gb_per_s"] / hbm_gbps
    return ["weight_gb_per_s", "roofline_fraction"] if hbm_gbps else ["weight_gb_per_s"]


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
    save_plot(fig, name, dpi=120)


if __name__ == "__main__":
    main()
