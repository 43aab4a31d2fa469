"""One observation, several readers: global speculation counters with vLLM's names.

The engine records each verification round once here (and in the request's own
``SpecStats``); Prometheus, the policy stats and /admin/stats read these totals.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from dataclasses import dataclass, field


@dataclass
class SpecDecodeStats:
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)
    by_proposer: dict[str, list[int]] = field(default_factory=lambda: defaultdict(lambda: [0, 0, 0]))
    # (batch size, tokens fed) -> [steps, total seconds]
    step_time: dict[tuple[int, int], list[float]] = field(default_factory=lambda: defaultdict(lambda: [0, 0.0]))
    num_steps: int = 0
    num_generated_tokens: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def observe(self, proposer: str, num_drafted: int, num_accepted: int) -> None:
        with self.lock:
            self.num_drafts += 1
            self.num_draft_tokens += num_drafted
            self.num_accepted_tokens += num_accepted
            if len(self.accepted_per_pos) < num_drafted:
                self.accepted_per_pos.extend([0] * (num_drafted - len(self.accepted_per_pos)))
            for pos in range(num_accepted):
                self.accepted_per_pos[pos] += 1
            totals = self.by_proposer[proposer]
            totals[0] += 1
            totals[1] += num_drafted
            totals[2] += num_accepted

    def observe_step(self, batch_size: int, num_tokens: int, seconds: float, num_generated: int) -> None:
        with self.lock:
            self.num_steps += 1
            self.num_generated_tokens += num_generated
            entry = self.step_time[(batch_size, num_tokens)]
            entry[0] += 1
            entry[1] += seconds

    def snapshot(self) -> dict:
        with self.lock:
            return {
                "spec_decode_num_drafts": self.num_drafts,
                "spec_decode_num_draft_tokens": self.num_draft_tokens,
                "spec_decode_num_accepted_tokens": self.num_accepted_tokens,
                "spec_decode_num_accepted_tokens_per_pos": list(self.accepted_per_pos),
                "proposers": {
                    name: {"rounds": r, "drafted_tokens": d, "accepted_tokens": a,
                           "acceptance_rate": round(a / d, 4) if d else 0.0}
                    for name, (r, d, a) in self.by_proposer.items()
                },
                "num_steps": self.num_steps,
                "num_generated_tokens": self.num_generated_tokens,
                "step_time": [
                    {"batch_size": b, "num_tokens": t, "steps": n, "mean_seconds": s / n}
                    for (b, t), (n, s) in sorted(self.step_time.items())
                ][-256:],
            }
