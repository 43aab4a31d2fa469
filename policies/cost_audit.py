"""How far the cost model's predictions miss the steps it then measures, per kind of step and batch size.

The planner weighs speculation by the fit's predicted step times, and a fit made mostly of plain steps can
misprice speculative ones (it once erred by ~10% there, see policies/adaptive.py). Its residual spread alone
does not say which way, nor on which steps. So every observed step is first predicted with the coefficients
the planner used for it, and the ratio measured / predicted is averaged per kind of step (an EWMA of its log:
a step the host stalled in, which the fit leaves out, moves a geometric mean less than an arithmetic one):

- ``plain``: the target's pass of a step that verified no drafts;
- ``verify``: the target's pass of a step that did;
- ``draft``: the draft model's passes, where it proposed.

A ratio over 1 there means the model prices that kind of step too cheap, under 1 too dear. First readings, on a
2-core Intel Xeon VM, code T = 0.7: near 1 at one request (plain 1.02, verify 0.96, draft 0.91), but at 32 requests
right after a cell at one, verify 1.45 and draft 1.63 (30 and 8 steps): the window still held the single request's
per-token cost, and the goodput guard, not the plan, kept those steps plain. A fit weighted towards rows of the
current batch size did worse on the replayed steps (its verify errors at 17-32 requests 0.15 -> 0.56, in log).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from policies.guard_figures import batch_bucket, bucket_sizes

AUDIT_WEIGHT = 0.02  # the newest step's weight in a ratio's EWMA: about the last 50 steps of its kind count
STEP_KINDS = ("plain", "verify", "draft")


@dataclass
class _Ratio:
    mean_log: float = 0.0
    steps: int = 0

    def add(self, ratio: float) -> None:
        self.steps += 1
        weight = max(AUDIT_WEIGHT, 1.0 / self.steps)  # a plain mean at first
        self.mean_log += (math.log(ratio) - self.mean_log) * weight


class PredictionAudit:
    """Measured / predicted seconds per (kind of step, batch-size bucket), for operators and benchmarks."""

    def __init__(self) -> None:
        self._ratios: dict[tuple[str, int], _Ratio] = {}

    def record(self, kind: str, batch_size: int, measured: float, predicted: float) -> None:
        if predicted <= 0.0 or measured <= 0.0:
            return
        key = (kind, batch_bucket(batch_size))
        ratio = self._ratios.get(key)
        if ratio is None:
            ratio = self._ratios[key] = _Ratio()
        ratio.add(measured / predicted)

    def summary(self) -> dict[str, list[dict[str, Any]]]:
        """Per kind of step: one entry per batch-size bucket seen, smallest first."""
        out: dict[str, list[dict[str, Any]]] = {kind: [] for kind in STEP_KINDS}
        for (kind, bucket), ratio in sorted(self._ratios.items(), key=lambda item: item[0][1]):
            out[kind].append({"batch_sizes": bucket_sizes(bucket), "steps": ratio.steps,
                              "measured_over_predicted": round(math.exp(ratio.mean_log), 4)})
        return out
