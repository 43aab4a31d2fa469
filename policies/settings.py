"""Runtime-tunable speculation policy parameters.

`PolicySettings` is frozen and validated on construction, so a settings object that exists is a
valid one; the controller swaps whole objects between engine steps instead of mutating fields.
`from_dict` gives PATCH semantics for an admin endpoint: a partial JSON object merged over a base.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

POLICY_MODES: tuple[str, ...] = ("auto", "off", "draft", "ngram")
K_LIMIT = 16


class PolicySettingsError(ValueError):
    """A settings value is unknown, of the wrong type or out of range; the message names the field."""


@dataclass(frozen=True)
class PolicySettings:
    """Parameters of the speculation policies.

    mode: auto = adaptive policy; off = plain decode; draft / ngram = fixed policy with that proposer.
    The effective k of a request is always capped by ``k_max`` and by the engine's ``RequestView.max_k``.
    """

    mode: str = "auto"
    k: int = 4  # draft length of the fixed modes, 1..16 (capped by k_max)
    k_max: int = 8  # largest k any policy chooses, 1..16
    ewma_weight: float = 0.3  # weight of the newest round in a request's acceptance estimate, (0, 1]
    prior_alpha_draft: float = 0.7  # acceptance assumed for the draft model before anything is observed, (0, 1)
    prior_alpha_ngram: float = 0.5  # same for the n-gram proposer, (0, 1)
    alpha_floor: float = 0.05  # lowest acceptance estimate used, [0, 0.9]
    warmup_rounds: int = 3  # a request's own estimate is blended with the global prior for this many rounds
    exploration_rate: float = 0.02  # chance per planned step that a request at k = 0 probes k = 1..2, [0, 1]
    exploration_max_loss: float = 0.005  # expected goodput fraction that probing may cost, [0, 1]
    # chance per planned speculating step that every speculating request drafts one token more than planned, so
    # the step-cost fit sees more than one k (see policies/adaptive.py), [0, 1]
    k_probe_rate: float = 0.0625
    hysteresis: float = 0.03  # relative gain a new choice needs over the previous one, [0, 1]
    max_batch_for_speculation: int | None = None  # above this many running requests: plain decode; None = no cap
    goodput_guard: bool = True  # veto speculation at batch sizes where it measurably ran slower than plain decode
    guard_probe_rate: float = 0.05  # chance per step that the guard tries the arm it currently rejects, [0, 1]
    draft_stop_confidence: float = 0.0  # the draft model stops a round early after a token it gave less, [0, 1)
    ngram_min_match: int = 1  # auto mode considers the n-gram proposer from this match length on, >= 1
    ngram_long_match: int = 4  # shorter n-gram matches learn their own acceptance ("ngram_short"), >= 1
    draft_cost_per_token: float | None = None  # seconds per draft pass; overrides the whole draft fit, >= 0
    verify_cost_coefficients: tuple[float, float, float] | None = None  # (a, b, c) s; overrides the target fit
    # share of the step time auto's plans may take, on average: a dearer plan is reused for the steps between, (0, 1];
    # None = plan every step
    max_planning_share: float | None = 0.02
    seed: int = 0  # seeds the exploration draws

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            _normalise(self, field.name)
        _check(self.mode in POLICY_MODES, "mode", f"must be one of {', '.join(POLICY_MODES)}; got {self.mode!r}")
        _check(1 <= self.k_max <= K_LIMIT, "k_max", f"must be in 1..{K_LIMIT}; got {self.k_max}")
        _check(1 <= self.k <= K_LIMIT, "k", f"must be in 1..{K_LIMIT}; got {self.k}")
        _check(0.0 < self.ewma_weight <= 1.0, "ewma_weight", f"must be in (0, 1]; got {self.ewma_weight}")
        for name in ("prior_alpha_draft", "prior_alpha_ngram"):
            value = getattr(self, name)
            _check(0.0 < value < 1.0, name, f"must be in (0, 1); got {value}")
        _check(0.0 <= self.alpha_floor <= 0.9, "alpha_floor", f"must be in [0, 0.9]; got {self.alpha_floor}")
        _check(0 <= self.warmup_rounds <= 1000, "warmup_rounds", f"must be in 0..1000; got {self.warmup_rounds}")
        for name in ("exploration_rate", "exploration_max_loss", "k_probe_rate", "hysteresis", "guard_probe_rate"):
            value = getattr(self, name)
            _check(0.0 <= value <= 1.0, name, f"must be in [0, 1]; got {value}")
        if self.max_batch_for_speculation is not None:
            _check(self.max_batch_for_speculation >= 1, "max_batch_for_speculation", "must be >= 1 or null")
        _check(0.0 <= self.draft_stop_confidence < 1.0, "draft_stop_confidence",
               f"must be in [0, 1); got {self.draft_stop_confidence}")
        _check(self.ngram_min_match >= 1, "ngram_min_match", f"must be >= 1; got {self.ngram_min_match}")
        _check(self.ngram_long_match >= 1, "ngram_long_match", f"must be >= 1; got {self.ngram_long_match}")
        if self.draft_cost_per_token is not None:
            _check(self.draft_cost_per_token >= 0.0, "draft_cost_per_token", "must be >= 0 or null")
        if self.verify_cost_coefficients is not None:
            a, b, c = self.verify_cost_coefficients
            _check(a > 0.0 and b >= 0.0 and c >= 0.0, "verify_cost_coefficients", "need a > 0, b >= 0, c >= 0")
        if self.max_planning_share is not None:
            _check(0.0 < self.max_planning_share <= 1.0, "max_planning_share",
                   f"must be in (0, 1] or null; got {self.max_planning_share}")
        _check(self.seed >= 0, "seed", f"must be >= 0; got {self.seed}")

    @classmethod
    def from_dict(cls, changes: Mapping[str, Any], base: PolicySettings | None = None) -> PolicySettings:
        """``base`` (default: the defaults) with the fields in ``changes`` replaced; unknown fields are errors."""
        if not isinstance(changes, Mapping):
            raise PolicySettingsError(f"settings must be an object; got {type(changes).__name__}")
        known = {field.name for field in dataclasses.fields(cls)}
        for name in changes:
            if name not in known:
                raise PolicySettingsError(f"{name}: unknown setting (known: {', '.join(sorted(known))})")
        return dataclasses.replace(base or cls(), **changes)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able values (tuples become lists)."""
        out = dataclasses.asdict(self)
        if self.verify_cost_coefficients is not None:
            out["verify_cost_coefficients"] = list(self.verify_cost_coefficients)
        return out

    @property
    def policy_kind(self) -> str:
        """off | fixed | adaptive: which policy class serves this mode."""
        return {"off": "off", "auto": "adaptive"}.get(self.mode, "fixed")


_INT_FIELDS = {"k", "k_max", "warmup_rounds", "ngram_min_match", "ngram_long_match", "seed"}
_FLOAT_FIELDS = {
    "ewma_weight", "prior_alpha_draft", "prior_alpha_ngram", "alpha_floor",
    "exploration_rate", "exploration_max_loss", "k_probe_rate", "hysteresis", "guard_probe_rate",
    "draft_stop_confidence",
}  # fmt: skip
_OPTIONAL_INT_FIELDS = {"max_batch_for_speculation"}
_OPTIONAL_FLOAT_FIELDS = {"draft_cost_per_token", "max_planning_share"}


def _normalise(settings: PolicySettings, name: str) -> None:
    """Type-check one field; ints are accepted for floats (JSON has one number type), bools never."""
    value = getattr(settings, name)
    if name == "mode":
        _check(isinstance(value, str), name, f"must be a string; got {type(value).__name__}")
    elif name == "goodput_guard":
        _check(isinstance(value, bool), name, f"must be true or false; got {value!r}")
    elif name in _INT_FIELDS or (name in _OPTIONAL_INT_FIELDS and value is not None):
        _check(_is_int(value), name, f"must be an integer; got {value!r}")
    elif name in _FLOAT_FIELDS or (name in _OPTIONAL_FLOAT_FIELDS and value is not None):
        _check(_is_number(value), name, f"must be a number; got {value!r}")
        object.__setattr__(settings, name, float(value))
    elif name == "verify_cost_coefficients" and value is not None:
        ok = isinstance(value, (list, tuple)) and len(value) == 3 and all(_is_number(v) for v in value)
        _check(ok, name, f"must be null or three numbers [a, b, c]; got {value!r}")
        object.__setattr__(settings, name, tuple(float(v) for v in value))


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _check(ok: bool, name: str, message: str) -> None:
    if not ok:
        raise PolicySettingsError(f"{name}: {message}")
