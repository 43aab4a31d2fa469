"""Measure the bundled pair for MODEL_CARD.md: greedy acceptance of draft vs target on held-out
code and prose prompts, through the real engine (fixed draft proposer), per draft position.

    .venv/bin/python scripts/eval_pair.py [--k 4] [--new-tokens 128] [--prompts 20]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import make_engine, run_engine, set_policy  # noqa: E402
from bench.prompts import PROSE, code_prompts  # noqa: E402
from engine.types import SamplingParams  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--prompts", type=int, default=20)
    args = ap.parse_args()
    engine = make_engine("float32", "cpu", max_seq_len=1024, max_running=32)
    report = {}
    for workload, texts in (("code", code_prompts(args.prompts, max_chars=600)), ("prose", PROSE)):
        prompts = [engine.tokenizer.encode(t) for t in texts]
        for temperature in (0.0, 0.7):
            for mode in ("draft", "ngram"):
                set_policy(engine, mode=mode, k=args.k)
                before = engine.stats.snapshot()
                result = run_engine(engine, prompts, SamplingParams(max_tokens=args.new_tokens,
                                                                    temperature=temperature, seed=0))
                after = engine.stats.snapshot()
                per_pos = [a - b for a, b in zip(after["spec_decode_num_accepted_tokens_per_pos"],
                                                 before["spec_decode_num_accepted_tokens_per_pos"] + [0] * 16)]
                rounds = after["spec_decode_num_drafts"] - before["spec_decode_num_drafts"]
                key = f"{workload} T={temperature} {mode}"
                report[key] = {"acceptance": round(result.acceptance, 3), "rounds": rounds,
                               "accepted_per_position": [round(p / rounds, 3) for p in per_pos] if rounds else [],
                               "tokens_per_round": round((result.accepted + rounds) / rounds, 2) if rounds else None}
                print(key, report[key], flush=True)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
