"""The `off` and `fixed` policies."""

from __future__ import annotations

from policies import BatchView, Decision, FixedPolicy, OffPolicy, PolicySettings, RequestView, RoundOutcome


def view(request_id: str = "r", max_k: int = 8, match: int = 0, **kw) -> RequestView:
    return RequestView(request_id, 0.0, 0, max_k, match, **kw)


def test_off_ignores_request_overrides() -> None:
    batch = BatchView((view("a"), view("b", override_mode="draft")))
    assert OffPolicy().decide(batch) == [Decision(0), Decision(0)]


def test_fixed_draft_caps_k_and_follows_overrides() -> None:
    policy = FixedPolicy(PolicySettings(mode="draft", k=5, k_max=6))
    batch = BatchView(
        (
            view("a"),
            view("short", max_k=2),
            view("off", override_mode="off"),
            view("ngram", match=3, override_mode="ngram"),
            view("ngram-nomatch", override_mode="ngram"),
            view("nodraft", draft_available=False),
        )
    )
    assert policy.decide(batch) == [
        Decision(5, "draft"),
        Decision(2, "draft"),
        Decision(0),
        Decision(5, "ngram"),
        Decision(0),
        Decision(0),
    ]


def test_fixed_k_is_capped_by_k_max() -> None:
    policy = FixedPolicy(PolicySettings(mode="ngram", k=8, k_max=3))
    assert policy.decide(BatchView((view(match=1),))) == [Decision(3, "ngram")]


def test_fixed_respects_the_load_limit() -> None:
    policy = FixedPolicy(PolicySettings(mode="draft", max_batch_for_speculation=1))
    assert policy.decide(BatchView((view("a"), view("b")))) == [Decision(0), Decision(0)]


def test_reconfigure_switches_the_proposer_and_keeps_learning() -> None:
    policy = FixedPolicy(PolicySettings(mode="draft"))
    policy.observe(RoundOutcome("r", "draft", 0.0, 4, 4))
    policy.reconfigure(PolicySettings(mode="ngram"))
    assert policy.decide(BatchView((view(match=2),))) == [Decision(4, "ngram")]
    assert policy.acceptance.num_tracked_requests == 1
