"""Unit tests see the adaptive policy's plans and the cost model's refits take no time, so that no measured hiccup
makes it reuse a plan (`AdaptivePolicy._hold`) or put a refit off (`CostModel._refit_due`), and every decision stays a
function of the test's inputs; tests of reuse and of the refits' budget set their own clocks."""

from __future__ import annotations

import pytest

from policies import AdaptivePolicy, CostModel


@pytest.fixture(autouse=True)
def policy_work_takes_no_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(AdaptivePolicy, "clock", staticmethod(lambda: 0.0))
    monkeypatch.setattr(CostModel, "clock", staticmethod(lambda: 0.0))


@pytest.fixture
def without_trials(monkeypatch: pytest.MonkeyPatch) -> None:
    """For tests of the guard's other rules from 3 requests on: there a trial would route the steps first."""
    monkeypatch.setattr("policies.guard.TRIAL_BUCKET", 99)
    monkeypatch.setattr("policies.guard.REJECTION_TRIAL_BUCKET", 99)
