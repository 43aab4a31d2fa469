"""Redis fault: Redis is killed mid-load and restarted; requests keep completing, state writes resume."""

from __future__ import annotations

import pytest

from tests.reliability.harness import KillableRedis, ServerProcess, Target
from tests.reliability.scenarios import run_redis_fault

pytestmark = [pytest.mark.reliability, pytest.mark.timeout(300)]


async def test_redis_killed_mid_load_then_restarted(target: Target, real_server: ServerProcess,
                                                    reliability_redis: KillableRedis) -> None:
    result = await run_redis_fault(target, reliability_redis, clients=8, requests_per_client=8, max_tokens=12,
                                   outage_s=1.0, server=real_server)
    assert (result.errors, result.lost) == (0, 0), result.row()
    assert result.kv_used_after == 0
    assert "state writes resumed: yes" in result.notes, result.row()
    assert "process alive: yes" in result.notes
    assert any("during outage: 200 redis=down" in note for note in result.notes), result.row()
    assert "/ready after: 200 redis=ok" in result.notes, result.row()
    records_after = next(note for note in result.notes if note.startswith("after restart: records"))
    finished, sampled = records_after.split()[3].split("/")
    assert finished == sampled, records_after
