"""Disconnect storm: clients leave at random points (mid-stream, before headers, mid non-streaming request);
no KV block leaks, no request record stays active, and the server serves afterwards."""

from __future__ import annotations

import re

import pytest

from tests.reliability.harness import Target
from tests.reliability.scenarios import run_disconnect_storm, storm_plan

pytestmark = [pytest.mark.reliability, pytest.mark.timeout(300)]

CI_CLIENTS = 20


def test_the_storm_plan_covers_every_way_of_leaving() -> None:
    assert {d.how for d in storm_plan(CI_CLIENTS, seed=0)} == {"mid_stream", "before_headers", "non_stream"}
    assert storm_plan(CI_CLIENTS, seed=0) == storm_plan(CI_CLIENTS, seed=0)


async def test_disconnect_storm_leaks_nothing(target: Target) -> None:
    result = await run_disconnect_storm(target, clients=CI_CLIENTS, seed=0, max_tokens=128)  # room to see them leave
    assert result.errors == 0, result.row()
    assert result.kv_used_after == 0, result.row()
    assert result.lost == 0, result.row()  # request records still "queued"/"running"
    assert "serves afterwards: yes" in result.notes, result.row()
    left, aborted = (int(re.search(pattern, " ".join(result.notes)).group(1))
                     for pattern in (r"(\d+) left early", r"(\d+) records aborted"))
    assert aborted >= left // 2 > 0, result.row()  # the server saw the disconnects (some finished just before)
