"""How often does speculation change greedy output in bfloat16? (float32 is the control.)

Speculation is exact: greedy text with it equals greedy text without it, and the tests check that
in float32. In bfloat16 the verification pass computes a position with another batch shape (k + 1
rows per request instead of 1, other neighbours), so its logits differ in the last bits, and where
the two best tokens are nearly tied the argmax can flip. From there the text differs (a greedy
continuation that is just as valid within bf16 rounding). Every batching engine shows this, with or
without speculation; this script measures how often it happens here.

Per dtype: the reference is plain decode of each prompt alone (batch 1). Against it: plain decode of
all prompts together (the batch-shape effect without speculation), draft k=4 and n-gram k=4 together.
Reported per configuration: requests identical to the reference, and flips per 1000 tokens (diverged
requests / tokens generated up to the first divergence).

    .venv/bin/python -m bench.bf16_divergence [--prompts 32] [--new-tokens 64]
"""

from __future__ import annotations

import argparse

from bench.common import make_engine, save, save_plot, set_policy, table
from bench.prompts import PROSE, code_prompts
from engine.engine import LLMEngine
from engine.types import SamplingParams

CONFIGS = {
    "plain, batched": {"mode": "off"},
    "draft k=4, batched": {"mode": "draft", "k": 4},
    "ngram k=4, batched": {"mode": "ngram", "k": 4},
}


def generate(engine: LLMEngine, prompts: list[list[int]], params: SamplingParams) -> list[list[int]]:
    """Greedy token ids of every prompt, all submitted at once."""
    ids = [f"div-{i}" for i in range(len(prompts))]
    out: dict[str, list[int]] = {rid: [] for rid in ids}
    for rid, prompt in zip(ids, prompts):
        engine.add_request(rid, prompt, params)
    while engine.has_work():
        for o in engine.step():
            out[o.request_id].extend(o.new_token_ids)
    return [out[rid] for rid in ids]


def first_divergence(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def compare(reference: list[list[int]], other: list[list[int]]) -> dict:
    positions = [first_divergence(r, o) for r, o in zip(reference, other)]
    diverged = [p for p in positions if p is not None]
    exposure = sum(len(r) if p is None else p + 1 for r, p in zip(reference, positions))
    return {"requests": len(reference), "identical": len(reference) - len(diverged),
            "first_divergence_positions": diverged,
            "flips_per_1000_tokens": 1000 * len(diverged) / exposure if exposure else 0.0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=32, help="half code, half prose")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    half = args.prompts // 2
    texts = code_prompts(half, max_chars=400) + [PROSE[i % len(PROSE)] for i in range(args.prompts - half)]
    params = SamplingParams(max_tokens=args.new_tokens, temperature=0.0, ignore_eos=True)
    rows = []
    for dtype in args.dtypes.split(","):
        engine = make_engine(dtype, args.device, max_running=64, max_num_batched_tokens=4096)
        prompts = [engine.tokenizer.encode(t) for t in texts]
        set_policy(engine, mode="off")
        reference = [generate(engine, [p], params)[0] for p in prompts]
        for name, settings in CONFIGS.items():
            set_policy(engine, **settings)
            result = compare(reference, generate(engine, prompts, params))
            rows.append({"dtype": dtype, "config": name, **result})
            print(f"[{dtype}] {name}: {result['identical']}/{result['requests']} identical, "
                  f"{result['flips_per_1000_tokens']:.2f} flips per 1000 tokens", flush=True)
    print(table(rows, ["dtype", "config", "requests", "identical", "flips_per_1000_tokens"]))
    name = "bf16_divergence" if args.device == "cpu" else f"bf16_divergence_{args.device.replace(':', '')}"
    path = save(name, {"args": vars(args), "rows": rows})
    plot(rows, name)
    print(f"saved {path}")


def plot(rows: list[dict], name: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.5))
    labels = [f"{r['dtype']}\n{r['config']}" for r in rows]
    ax.bar(range(len(rows)), [r["identical"] / r["requests"] for r in rows], color="tab:blue")
    ax.set_xticks(range(len(rows)), labels, fontsize=6)
    ax.set_ylabel("requests identical to batch-1 plain")
    ax.set_ylim(0, 1.05)
    fig.tight_layout()
    save_plot(fig, name, dpi=110)


if __name__ == "__main__":
    main()
