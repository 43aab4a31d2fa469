"""PolicyController: staged runtime changes, kept statistics, JSON stats, thread safety."""

from __future__ import annotations

import json
import threading

import pytest

from policies import (
    AdaptivePolicy,
    BatchView,
    FixedPolicy,
    OffPolicy,
    PolicyController,
    PolicySettings,
    PolicySettingsError,
    RequestView,
    RoundOutcome,
    StepTiming,
    build_policy,
)

BATCH = BatchView(tuple(RequestView(f"r{i}", 0.0, 0, 8, 0) for i in range(4)))


@pytest.mark.parametrize(("mode", "cls"), [("auto", AdaptivePolicy), ("off", OffPolicy), ("draft", FixedPolicy)])
def test_build_policy(mode: str, cls: type) -> None:
    assert isinstance(build_policy(PolicySettings(mode=mode)), cls)


def test_plain_request_steps_are_counted_by_cause() -> None:
    """A request the engine capped at k = 0, one that asked for plain decode, and what the policy says of the rest:
    fixed n-gram lookups without a match, the operator's load limit, mode ``off``."""
    views = (RequestView("capped", 0.0, 0, 0, 3), RequestView("asks", 0.0, 0, 8, 3, override_mode="off"),
             RequestView("no match", 0.0, 0, 8, 0), RequestView("drafts", 0.0, 0, 8, 3))
    controller = PolicyController(PolicySettings(mode="ngram", k=2))
    assert [d.k for d in controller.decide(BatchView(views))] == [0, 0, 0, 2]
    controller.update({"max_batch_for_speculation": 3})
    controller.decide(BatchView(views))
    controller.update({"mode": "off"})
    controller.decide(BatchView(views))
    assert controller.stats()["chosen_k"]["plain_by_cause"] == {
        "capped": 3, "request": 3, "no_proposal": 1, "load_limit": 2, "off": 2}


def test_update_is_staged_until_applied() -> None:
    controller = PolicyController(PolicySettings(mode="draft", k=2))
    staged = controller.update({"k": 3})
    assert staged.k == 3 and controller.settings.k == 2 and controller.pending_settings == staged
    assert controller.update({"k_max": 5}).k == 3  # a second PATCH merges over the staged one
    assert controller.apply_pending() is True
    assert (controller.settings.k, controller.settings.k_max) == (3, 5)
    assert controller.apply_pending() is False


def test_decide_applies_pending_settings_first() -> None:
    controller = PolicyController(PolicySettings(mode="draft", k=2))
    controller.update({"mode": "off"})
    assert {d.k for d in controller.decide(BATCH)} == {0}
    assert controller.name == "off"


def test_invalid_update_stages_nothing() -> None:
    controller = PolicyController()
    with pytest.raises(PolicySettingsError, match="ewma_weight"):
        controller.update({"ewma_weight": 2})
    with pytest.raises(PolicySettingsError, match="bogus"):
        controller.update({"bogus": 1})
    assert controller.pending_settings is None


def test_replace_starts_from_defaults() -> None:
    controller = PolicyController(PolicySettings(k_max=4, hysteresis=0.2))
    controller.replace({"mode": "off"})
    controller.apply_pending()
    assert controller.settings == PolicySettings(mode="off")


def test_learned_state_survives_any_settings_change() -> None:
    controller = PolicyController(PolicySettings(mode="draft"))
    for _ in range(10):
        controller.observe(RoundOutcome("r", "draft", 0.0, 4, 4))
        controller.observe_step(StepTiming(8, 40, 0.02, 32, 0.004, 8, 4))
    before = controller.stats()
    for changes in ({"mode": "off"}, {"mode": "auto"}, {"ewma_weight": 0.5}):
        controller.update(changes)
        controller.apply_pending()
    after = controller.stats()
    assert after["acceptance"] == before["acceptance"]
    assert after["cost_model"]["num_observations"] == 10
    assert after["num_tracked_requests"] == 1
    controller.forget("r")
    assert controller.stats()["num_tracked_requests"] == 0


def test_forget_learned_starts_over_with_the_same_settings() -> None:
    controller = PolicyController(PolicySettings(mode="auto", k_max=6))
    controller.decide(BATCH)
    for _ in range(10):
        controller.observe(RoundOutcome("r0", "draft", 0.0, 4, 1))
        controller.observe_step(StepTiming(4, 20, 0.02, 16, 0.004, 4, 4, step_seconds=0.03, num_generated=8))
    controller.forget_learned()
    stats = controller.stats()
    assert stats["num_steps"] == 0 and stats["chosen_k"]["histogram"] == [0] * 7
    assert stats["policy_seconds"] == {"deciding": 0.0, "learning": 0.0}
    assert stats["acceptance"]["draft"]["num_rounds"] == 0 and stats["num_tracked_requests"] == 0
    assert stats["cost_model"]["num_observations"] == 0 and stats["goodput_guard"] == []
    assert controller.settings == PolicySettings(mode="auto", k_max=6) and controller.name == "adaptive"


def test_stats_are_json_and_count_decisions() -> None:
    controller = PolicyController(PolicySettings(mode="draft", k=3, k_max=4))
    controller.decide(BATCH)
    controller.update({"mode": "off"})
    controller.decide(BATCH)
    stats = json.loads(json.dumps(controller.stats()))
    assert stats["chosen_k"]["histogram"] == [4, 0, 0, 4, 0]
    assert stats["chosen_k"]["plain_decode_fraction"] == pytest.approx(0.5)
    assert stats["chosen_k"]["by_proposer"] == {"draft": 4, "ngram": 0} and stats["chosen_k"]["reused_plan_steps"] == 0
    assert stats["chosen_k"]["k_probe_steps"] == 0
    assert stats["mode"] == "off" and stats["policy"] == "off" and stats["num_steps"] == 2
    assert set(stats["acceptance"]) == {"draft", "ngram", "ngram_short"}
    assert "verify_seconds" in stats["cost_model"]
    assert stats["policy_seconds"]["deciding"] > 0 and stats["policy_seconds"]["learning"] == 0
    assert controller.policy_seconds == pytest.approx(sum(stats["policy_seconds"].values()))


def test_concurrent_updates_while_the_engine_steps() -> None:
    controller = PolicyController()
    errors: list[BaseException] = []

    def operator() -> None:
        try:
            for i in range(200):
                controller.update({"mode": ("auto", "draft", "off")[i % 3], "k_max": 1 + i % 8})
                controller.stats()
        except Exception as exc:  # surfaced by the assertion below
            errors.append(exc)

    thread = threading.Thread(target=operator)
    thread.start()
    for step in range(200):
        decisions = controller.decide(BATCH)
        assert len(decisions) == len(BATCH.requests)
        assert all(d.k <= controller.settings.k_max for d in decisions)
        controller.observe_step(StepTiming(4, 4 + sum(d.k for d in decisions), 0.01 + step * 1e-6))
    thread.join()
    assert not errors


def test_the_engines_row_count_prices_the_fit_and_outlives_forgetting() -> None:
    controller = PolicyController()
    controller.set_target_rows(lambda tokens: -(-tokens // 4) * 4)
    assert controller.learned.cost_model.coefficients().target_rows(33) == 36
    controller.forget_learned()
    assert controller.learned.cost_model.coefficients().target_rows(33) == 36
    assert controller.learned.cost_model.fit_summary()["per_token_is_per_row"]
