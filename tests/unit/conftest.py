"""Unit tests see the adaptive policy's plans take no time, so that no measured hiccup makes it reuse a plan
(`AdaptivePolicy._hold`) and every decision stays a function of the test's inputs; tests of reuse set their own."""

from __future__ import annotations

import pytest

from policies import AdaptivePolicy


@pytest.fixture(autouse=True)
def plans_take_no_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(AdaptivePolicy, "clock", staticmethod(lambda: 0.0))
