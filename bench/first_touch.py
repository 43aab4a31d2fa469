"""What a shape the process has not run yet costs on this device, by kind. A diagnostic, not a benchmark.

A GPU may pay on the first call of each new shape (a library building a plan or picking a kernel for it), and a
serving engine meets new shapes all the time: contexts grow every step, batch sizes and draft lengths vary. On
an H100 (torch 2.11), masked bf16 attention went to cuDNN, which took ~50 ms for each new shape (a repeat:
0.3 ms); see `engine.models.llama.avoid_cudnn_attention`. This times, after the bundled target is loaded as the
engine loads it, the first and a repeated call of the target's linear layers at new token counts and of masked
attention at new (batch, queries, context) shapes::

    python -m bench.first_touch --device cuda --dtype bfloat16
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import torch
import torch.nn.functional as F

from bench.common import save, table
from engine.models.loader import DEFAULT_TARGET, load_model


def first_and_repeat(call, device: torch.device) -> tuple[float, float]:
    """Milliseconds of a first call and of the same call repeated."""
    synchronize = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    times = []
    for _ in range(2):
        synchronize()
        start = time.perf_counter()
        call()
        synchronize()
        times.append(1e3 * (time.perf_counter() - start))
    return times[0], times[1]


def linear_calls(model, rows: int, device: torch.device, dtype: torch.dtype):
    layer = model.layers[0]
    x = torch.randn(rows, model.args.hidden_size, device=device, dtype=dtype)
    return lambda: (layer.self_attn.qkv_proj(x), layer.mlp(x))


def masked_attention_call(model, shape: tuple[int, int, int], device: torch.device, dtype: torch.dtype):
    args, (batch, queries, context) = model.args, shape
    q = torch.randn(batch, args.num_heads, queries, args.head_dim, device=device, dtype=dtype)
    kv = torch.randn(batch, args.num_kv_heads, context, args.head_dim, device=device, dtype=dtype)
    mask = torch.rand(batch, 1, queries, context, device=device) > 0.1
    return lambda: F.scaled_dot_product_attention(q, kv, kv, attn_mask=mask,
                                                  enable_gqa=args.num_kv_heads != args.num_heads)


def summary(kind: str, timed: list[tuple[object, float, float]]) -> dict:
    firsts, repeats = [t[1] for t in timed], [t[2] for t in timed]
    worst = max(timed, key=lambda t: t[1])
    return {"kind": kind, "shapes": len(timed), "first_median_ms": statistics.median(firsts),
            "first_max_ms": worst[1], "worst_shape": str(worst[0]), "repeat_median_ms": statistics.median(repeats)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--shapes", type=int, default=60, help="new shapes timed per kind")
    args = ap.parse_args()
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    model, _ = load_model(DEFAULT_TARGET, dtype, device)
    rng = random.Random(0)
    with torch.inference_mode():
        first_and_repeat(linear_calls(model, 1, device, dtype), device)  # the process's own first touches
        first_and_repeat(masked_attention_call(model, (1, 2, 16), device, dtype), device)
        rows = rng.sample(range(2, 300), args.shapes)
        linear = [(n, *first_and_repeat(linear_calls(model, n, device, dtype), device)) for n in rows]
        shapes = {(rng.randint(1, 32), rng.randint(2, 9), rng.randint(20, 400)) for _ in range(args.shapes)}
        attention = [(s, *first_and_repeat(masked_attention_call(model, s, device, dtype), device)) for s in shapes]
    results = [summary("linear layers (rows)", linear),
               summary("masked attention (batch, queries, context)", attention)]
    print(table(results, list(results[0])))
    name = f"first_touch_{args.device.replace(':', '')}_{args.dtype}"
    print(f"saved {save(name, {'args': vars(args), 'rows': results})}")


if __name__ == "__main__":
    main()
