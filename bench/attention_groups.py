"""What one target pass costs by the mix of new-token runs in it, with decodes in their own attention group or
merged into the verifying requests' group. A diagnostic, not a benchmark.

On an H200 (bf16, bundled pair, 32 code clients, T = 0; bench/step_stalls.py --trace) the adaptive policy's
verifying passes took 13-15 ms where fixed draft k = 4's took 11.5 ms for twice the tokens and a plain pass
9.5-10 ms: its passes mix decoding requests with verifying ones (and n-gram k's of every length), and a mixed
pass attends in two groups. This times `ModelRunner.execute` on the bundled target for a batch of requests with
contexts of ``--context`` tokens, per mix, both ways (``merge_decodes``), and checks the two give the same
logits. On an H200 (2026-11-28) merged passes took 0.82x the time at k = 0..4 mixed and with n-gram k's of
every length beside decodes, 0.95x at half plain, half k = 4, and the same where every request feeds as many
tokens (bf16 logits within 0.0625 of each other)::

    python -m bench.attention_groups --device cuda --dtype bfloat16

``--short-run`` sets ``SHORT_RUN``, the longest run that attends with the verifying requests where groups merge
(the "merged" column, a GPU's rule; the engine's 17 is the longest verification). At 32, a prose prompt joining a
verifying batch padded every verifying request to its length. Apart (a CPU's rule) twice the pass's longest
verification bounds it, so a prompt of up to 17 tokens may attend apart too; the column ``short_runs_joined_ms`` times
the CPU's rule as it was before (s59: every run up to ``SHORT_RUN`` with the verifying requests), and ``per_length_ms``
short runs in one group per length (``EXACT_SHORT_RUNS``; the JSON's ``one_short_group`` columns, from when that was
on, time the default way instead).
"""

from __future__ import annotations

import argparse
import contextlib
import random
import statistics
import time

import torch

from bench.common import make_engine, save, table
from engine import model_runner
from engine.model_runner import SeqChunk
from engine.models import llama

PROMPT = 28  # a joining prompt's tokens: bench/prompts.py's prose prompts are 23-36 with the chat template
SHORT_PROMPTS = (4, 12)  # short completions prompts, or a long prompt's last chunk


def mixes(batch: int, rng: random.Random) -> dict[str, list[int]]:
    """New tokens per request: plain decode, uniform verification, the mixes an adaptive plan makes, and a prompt
    joining a verifying batch (a negative count: a new request's whole prompt, one logit wanted)."""
    half = batch // 2
    return {
        "plain": [1] * batch,
        "all k=4": [5] * batch,
        "half plain, half k=4": [1] * half + [5] * (batch - half),
        "k=0..4 mixed": [1 + i % 5 for i in range(batch)],
        "a third plain, n-gram k=1..8": [1 if i % 3 == 0 else rng.randint(2, 9) for i in range(batch)],
        "k=2, an eighth n-gram k=8": [9 if i % 8 == 0 else 3 for i in range(batch)],
        f"all k=2, a {PROMPT}-token prompt joining": [3] * batch + [-PROMPT],
        **{f"all k=2, a {n}-token prompt joining": [3] * batch + [-n] for n in SHORT_PROMPTS},
    }


def fed_chunk(request_id: str, num_new: int, context: int, rng: random.Random) -> SeqChunk:
    """``num_new`` random tokens after ``context`` cached ones, a logit for each; a negative ``num_new``: a joining
    prompt of that many tokens (nothing cached, one logit)."""
    tokens = [rng.randrange(1000) for _ in range(abs(num_new))]
    return SeqChunk(request_id, tokens, 0, 1) if num_new < 0 else SeqChunk(request_id, tokens, context, num_new)


def time_ways(runner, chunks: list[SeqChunk], repeats: int, device: torch.device) -> dict[str, tuple[float, list]]:
    """Per way of grouping (`WAYS`): the median milliseconds of the pass, and its logits. The ways take turns every
    repeat, in an order shuffled every repeat: timed one after the other, identical groupings read 5-15% apart on a
    shared VM, and in a fixed order the one timed first read ~4% slower than an identical one after it."""
    synchronize = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    times: dict[str, list[float]] = {way: [] for way in WAYS}
    logits = {}
    for repeat in range(repeats + 2):  # two untimed: first touches
        for way in random.Random(repeat).sample(list(WAYS), len(WAYS)):
            merge, grouping = WAYS[way]
            runner.merge_decodes = merge
            with grouping():
                synchronize()
                start = time.perf_counter()
                logits[way] = runner.execute(chunks)
                synchronize()
            if repeat >= 2:
                times[way].append(1e3 * (time.perf_counter() - start))
    return {way: (statistics.median(times[way]), logits[way]) for way in WAYS}


@contextlib.contextmanager
def verifications_unknown():
    """Group as the runner did before it told verifications apart: every run up to ``SHORT_RUN`` together."""
    build = model_runner.build_attention_metadata
    model_runner.build_attention_metadata = lambda contexts, num_new, device, merge, _num_logits: build(
        contexts, num_new, device, merge)
    try:
        yield
    finally:
        model_runner.build_attention_metadata = build


@contextlib.contextmanager
def per_length():
    """Short runs in one group per length (``EXACT_SHORT_RUNS``, a CPU's rule), whatever the default."""
    own = llama.EXACT_SHORT_RUNS
    llama.EXACT_SHORT_RUNS = True
    try:
        yield
    finally:
        llama.EXACT_SHORT_RUNS = own


WAYS = {"apart": (False, contextlib.nullcontext), "merged": (True, contextlib.nullcontext),
        "short_runs_joined": (False, verifications_unknown),
        "per_length": (False, per_length)}  # (merge_decodes, grouping)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--batch", type=int, default=30)
    ap.add_argument("--context", type=int, default=300, help="tokens each request has in the cache before the pass")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--short-run", type=int, default=llama.SHORT_RUN,
                    help="SHORT_RUN: the longest run that attends with verification where groups merge (%(default)s)")
    args = ap.parse_args()
    llama.SHORT_RUN = args.short_run
    torch.set_num_threads(1)
    engine = make_engine(args.dtype, args.device, max_seq_len=1024, max_running=64)
    runner, device = engine.runner, torch.device(args.device)
    rng = random.Random(0)
    ids = [f"r{i}" for i in range(args.batch + 1)]  # the last one: a joining prompt's
    for request_id in ids:
        runner.cache.allocate(request_id)
        runner.cache.reserve(request_id, args.context + 16)
    rows = []
    with torch.inference_mode():
        for name, num_new in mixes(args.batch, rng).items():
            chunks = [fed_chunk(request_id, n, args.context, rng) for request_id, n in zip(ids, num_new, strict=False)]
            num_new = [abs(n) for n in num_new]
            timed = time_ways(runner, chunks, args.repeats, device)
            (apart, apart_logits), (merged, merged_logits), (joined, _), (lengths, _) = timed.values()
            diff = max(float((a - b).abs().max()) for a, b in zip(apart_logits, merged_logits, strict=True))
            rows.append({"mix": name, "tokens": sum(num_new), "groups_apart_ms": apart, "merged_ms": merged,
                         "merged_vs_apart": merged / apart, "short_runs_joined_ms": joined,
                         "apart_vs_joined": apart / joined, "per_length_ms": lengths,
                         "per_length_vs_apart": lengths / apart, "max_logit_diff": diff})
    print(table(rows, list(rows[0])))
    print(f"saved {save(f'attention_groups_{args.device}_{args.dtype}', {'args': vars(args), 'rows': rows})}")


if __name__ == "__main__":
    main()
