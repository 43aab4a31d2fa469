"""Speculative decoding at batch 1 on the bundled pair: our plain decode, draft proposer at
k = 1..8 (and k = 8 with rounds ended after a draft token of probability < 0.2), n-gram proposer,
and transformers' assisted generation (assistant_model= and prompt_lookup_num_tokens=) on the same
checkpoints, for code and prose, greedy and T=0.7.

    .venv/bin/python -m bench.spec_decode [--new-tokens 128] [--prompts 4]
"""

from __future__ import annotations

import argparse
import time

import torch

from bench.common import hf_generate, load_hf, make_engine, run_engine, save, save_plot, set_policy, table
from bench.prompts import PROSE, code_prompts
from engine.models.loader import DEFAULT_DRAFT
from engine.types import SamplingParams


def measure_cost_ratio(engine, prompt: list[int], reps: int = 30) -> float:
    """c = one draft forward / one target forward, both decoding one token with a warm cache."""
    from engine.model_runner import SeqChunk

    times = {}
    for name, runner in (("target", engine.runner), ("draft", engine.proposers["draft"].runner)):
        runner.cache.allocate("c")
        runner.cache.reserve("c", len(prompt) + reps)
        runner.execute([SeqChunk("c", prompt, 0, 1)])
        start = time.perf_counter()
        for i in range(reps):
            runner.execute([SeqChunk("c", [prompt[-1]], len(prompt) + i, 1)])
        times[name] = (time.perf_counter() - start) / reps
        runner.cache.free("c")
    return times["draft"] / times["target"]


def ours(engine, prompts, temperature, new_tokens, mode, k=4, stop_confidence=0.0) -> dict:
    set_policy(engine, mode=mode, k=k, k_max=max(k, 8), draft_stop_confidence=stop_confidence)
    # no seed: a seeded sampling request drafts the fixed k under `auto` (so that its text reproduces)
    params = SamplingParams(max_tokens=new_tokens, temperature=temperature, ignore_eos=True)
    results = [run_engine(engine, [p], params) for p in prompts]
    seconds, tokens = sum(r.seconds for r in results), sum(r.num_tokens for r in results)
    drafted, accepted = sum(r.drafted for r in results), sum(r.accepted for r in results)
    return {"tok_s": tokens / seconds, "acceptance": accepted / drafted if drafted else None}


def hf(model, prompts, temperature, new_tokens, **kwargs) -> dict:
    sampling = {"do_sample": True, "temperature": temperature} if temperature > 0 else {"do_sample": False}
    torch.manual_seed(0)
    results = [hf_generate(model, p, new_tokens, **sampling, **kwargs) for p in prompts]
    return {"tok_s": sum(r.num_tokens for r in results) / sum(r.seconds for r in results), "acceptance": None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--prompts", type=int, default=4, help="prompts per workload")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    args = ap.parse_args()
    dtype = getattr(torch, args.dtype)
    engine = make_engine(args.dtype, args.device, max_seq_len=1024, max_running=4)
    target, draft = load_hf(dtype=dtype, device=args.device), load_hf(DEFAULT_DRAFT, dtype, args.device)
    draft.generation_config.num_assistant_tokens = 5
    draft.generation_config.num_assistant_tokens_schedule = "constant"
    draft.generation_config.assistant_confidence_threshold = 0.0
    workloads = {"code": code_prompts(args.prompts, max_chars=600),
                 "prose": PROSE[: args.prompts]}
    run_engine(engine, [engine.tokenizer.encode("def f(x):")], SamplingParams(max_tokens=16))  # warm-up
    cost_ratio = measure_cost_ratio(engine, engine.tokenizer.encode(workloads["code"][0]))
    print(f"measured cost ratio c = draft step / target step = {cost_ratio:.3f}")
    rows = []
    for workload, texts in workloads.items():
        prompts = [engine.tokenizer.encode(t) for t in texts]
        for temperature in (0.0, 0.7):
            cell = {"workload": workload, "temperature": temperature}
            runs = {"plain": ours(engine, prompts, temperature, args.new_tokens, "off")}
            for k in range(1, 9):
                runs[f"draft k={k}"] = ours(engine, prompts, temperature, args.new_tokens, "draft", k)
            runs["draft k=8 stop<0.2"] = ours(engine, prompts, temperature, args.new_tokens, "draft", 8, 0.2)
            runs["ngram k=4"] = ours(engine, prompts, temperature, args.new_tokens, "ngram", 4)
            runs["auto"] = ours(engine, prompts, temperature, args.new_tokens, "auto")
            runs["HF generate"] = hf(target, prompts, temperature, args.new_tokens)
            runs["HF assisted"] = hf(target, prompts, temperature, args.new_tokens, assistant_model=draft)
            if temperature == 0.0:  # transformers supports prompt lookup for greedy search only
                runs["HF prompt lookup"] = hf(target, prompts, temperature, args.new_tokens,
                                              prompt_lookup_num_tokens=4)
            plain = runs["plain"]["tok_s"]
            best = max((n for n in runs if n.startswith(("draft", "ngram", "auto"))), key=lambda n: runs[n]["tok_s"])
            hf_best = max(runs[n]["tok_s"] for n in runs if n.startswith("HF") and n != "HF generate")
            for name, r in runs.items():
                rows.append({**cell, "mode": name, "tok_s": r["tok_s"], "vs_plain": r["tok_s"] / plain,
                             "acceptance": r["acceptance"] if r["acceptance"] is not None else "-"})
            print(f"[{workload} T={temperature}] best={best} {runs[best]['tok_s']:.1f} tok/s = "
                  f"{runs[best]['tok_s'] / plain:.2f}x plain, {runs[best]['tok_s'] / hf_best:.2f}x best HF speculative",
                  flush=True)
    print(table(rows, ["workload", "temperature", "mode", "tok_s", "vs_plain", "acceptance"]))
    default = (args.device, args.dtype) == ("cpu", "float32")
    name = "spec_decode" if default else f"spec_decode_{args.device}_{args.dtype}"
    path = save(name, {"args": vars(args), "cost_ratio": cost_ratio, "rows": rows})
    plot(rows, name)
    print(f"saved {path}")


def plot(rows: list[dict], name: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = sorted({(r["workload"], r["temperature"]) for r in rows})
    fig, axes = plt.subplots(1, len(cells), figsize=(5 * len(cells), 4.5), sharey=True)
    for ax, (workload, temperature) in zip(axes, cells):
        sub = [r for r in rows if r["workload"] == workload and r["temperature"] == temperature]
        colors = ["C1" if r["mode"].startswith("HF") else "C0" for r in sub]
        ax.bar([r["mode"] for r in sub], [r["tok_s"] for r in sub], color=colors)
        ax.set_title(f"{workload}, T={temperature}")
        ax.tick_params(axis="x", rotation=75)
    axes[0].set_ylabel("tokens/s (batch 1)")
    fig.tight_layout()
    save_plot(fig, name, dpi=110)


if __name__ == "__main__":
    main()
