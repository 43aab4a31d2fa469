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
