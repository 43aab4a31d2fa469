"""One observation, several readers: global speculation counters with vLLM's names.

The engine records each verification round once here (and in the request's own
``SpecStats``); Prometheus, the policy stats and /admin/stats read these totals.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from dataclasses import dataclass, field

from engine.types import ProposerStats


@dataclass
class SpecDecodeStats:
    total: ProposerStats = field(default_factory=ProposerStats)
    by_proposer: dict[str, ProposerStats] = field(default_factory=lambda: defaultdict(ProposerStats))
    # (batch size, tokens fed) -> [steps, total seconds]
    step_time: dict[tuple[int, int], list[float]] = field(default_factory=lambda: defaultdict(lambda: [0, 0.0]))
    num_steps: int = 0
    num_generated_tokens: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def observe(self, proposer: str, num_drafted: int, num_accepted: int) -> None:
        with self.lock:
            self.total.add(num_drafted, num_accepted)
            self.by_proposer[proposer].add(num_drafted, num_accepted)

    @property
    def num_draft_tokens(self) -> int:
        return self.total.num_draft_tokens

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
                "spec_decode_num_drafts": self.total.rounds,
                "spec_decode_num_draft_tokens": self.total.num_draft_tokens,
                "spec_decode_num_accepted_tokens": self.total.num_accepted_tokens,
                "spec_decode_num_accepted_tokens_per_pos": list(self.total.accepted_per_pos),
                "proposers": {
                    name: {"rounds": s.rounds, "drafted_tokens": s.num_draft_tokens,
                           "accepted_tokens": s.num_accepted_tokens,
                           "acceptance_rate": round(s.num_accepted_tokens / s.num_draft_tokens, 4)
                           if s.num_draft_tokens else 0.0}
                    for name, s in self.by_proposer.items()
                },
                "num_steps": self.num_steps,
                "num_generated_tokens": self.num_generated_tokens,
                "step_time": [
                    {"batch_size": b, "num_tokens": t, "steps": n, "mean_seconds": s / n}
                    for (b, t), (n, s) in sorted(self.step_time.items())
                ][-256:],
            }
