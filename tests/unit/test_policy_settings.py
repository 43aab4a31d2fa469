"""PolicySettings: validation on construction, PATCH merging, JSON round trip."""

from __future__ import annotations

import json

import pytest

from policies import PolicySettings, PolicySettingsError


def test_defaults_are_valid_and_json_round_trip() -> None:
    settings = PolicySettings()
    as_json = json.dumps(settings.to_dict())
    assert PolicySettings.from_dict(json.loads(as_json)) == settings
    assert settings.mode == "auto" and settings.k == 4 and settings.k_max == 8


def test_from_dict_merges_over_base() -> None:
    base = PolicySettings(k_max=6, hysteresis=0.1)
    merged = PolicySettings.from_dict({"ewma_weight": 0.5}, base)
    assert merged.k_max == 6 and merged.hysteresis == 0.1 and merged.ewma_weight == 0.5
    assert base.ewma_weight == 0.3  # frozen base untouched


def test_int_accepted_for_float_and_normalised() -> None:
    settings = PolicySettings.from_dict({"ewma_weight": 1, "draft_cost_per_token": 0})
    assert isinstance(settings.ewma_weight, float) and settings.ewma_weight == 1.0
    assert isinstance(settings.draft_cost_per_token, float)


def test_verify_cost_coefficients_list_becomes_tuple_and_back() -> None:
    settings = PolicySettings.from_dict({"verify_cost_coefficients": [0.01, 0, 2e-4]})
    assert settings.verify_cost_coefficients == (0.01, 0.0, 2e-4)
    assert settings.to_dict()["verify_cost_coefficients"] == [0.01, 0.0, 2e-4]
    assert PolicySettings.from_dict({"verify_cost_coefficients": None}, settings).verify_cost_coefficients is None


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"nonsense": 1}, "nonsense"),
        ({"mode": "turbo"}, "mode"),
        ({"mode": 3}, "mode"),
        ({"k_max": 0}, "k_max"),
        ({"k_max": 17}, "k_max"),
        ({"k_max": True}, "k_max"),  # bool is not an int here
        ({"k_max": 4.0}, "k_max"),
        ({"k": 17}, "k"),
        ({"k": "4"}, "k"),
        ({"ewma_weight": 0.0}, "ewma_weight"),
        ({"ewma_weight": 1.5}, "ewma_weight"),
        ({"ewma_weight": False}, "ewma_weight"),
        ({"prior_alpha_draft": 1.0}, "prior_alpha_draft"),
        ({"prior_alpha_ngram": 0.0}, "prior_alpha_ngram"),
        ({"alpha_floor": 0.95}, "alpha_floor"),
        ({"warmup_rounds": -1}, "warmup_rounds"),
        ({"exploration_rate": 1.1}, "exploration_rate"),
        ({"exploration_max_loss": -0.1}, "exploration_max_loss"),
        ({"hysteresis": float("nan")}, "hysteresis"),
        ({"max_batch_for_speculation": 0}, "max_batch_for_speculation"),
        ({"max_batch_for_speculation": 2.5}, "max_batch_for_speculation"),
        ({"ngram_min_match": 0}, "ngram_min_match"),
        ({"draft_stop_confidence": 1.0}, "draft_stop_confidence"),
        ({"draft_stop_confidence": -0.1}, "draft_stop_confidence"),
        ({"draft_cost_per_token": -1.0}, "draft_cost_per_token"),
        ({"draft_cost_per_token": float("inf")}, "draft_cost_per_token"),
        ({"verify_cost_coefficients": [1.0, 2.0]}, "verify_cost_coefficients"),
        ({"verify_cost_coefficients": [0.0, 0.0, 0.0]}, "verify_cost_coefficients"),
        ({"verify_cost_coefficients": [0.01, True, 0.0]}, "verify_cost_coefficients"),
        ({"max_planning_share": 0.0}, "max_planning_share"),
        ({"max_planning_share": 1.5}, "max_planning_share"),
        ({"max_planning_share": "2%"}, "max_planning_share"),
        ({"seed": -3}, "seed"),
    ],
)
def test_bad_values_raise_naming_the_field(changes: dict, field: str) -> None:
    with pytest.raises(PolicySettingsError, match=field):
        PolicySettings.from_dict(changes)


def test_error_is_a_value_error_and_not_a_mapping_is_rejected() -> None:
    assert issubclass(PolicySettingsError, ValueError)
    with pytest.raises(PolicySettingsError):
        PolicySettings.from_dict([("k", 2)])  # type: ignore[arg-type]


def test_direct_construction_is_validated_too() -> None:
    with pytest.raises(PolicySettingsError, match="k_max"):
        PolicySettings(k_max=True)  # type: ignore[arg-type]


def test_planning_every_step_is_null_share() -> None:
    assert PolicySettings.from_dict({"max_planning_share": None}).max_planning_share is None
    assert PolicySettings.from_dict({"max_planning_share": 1}).max_planning_share == 1.0


def test_k_max_can_be_patched_alone() -> None:
    settings = PolicySettings.from_dict({"k_max": 2})  # k = 4 stays; the policies cap it at k_max
    assert (settings.k, settings.k_max) == (4, 2)


@pytest.mark.parametrize(
    ("mode", "kind"), [("auto", "adaptive"), ("off", "off"), ("draft", "fixed"), ("ngram", "fixed")]
)
def test_policy_kind(mode: str, kind: str) -> None:
    assert PolicySettings(mode=mode).policy_kind == kind
