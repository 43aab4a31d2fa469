"""Load: concurrent streaming clients against the real engine; nothing errors, nothing is lost, KV returns to 0.

The CI version is short (``CI_CLIENTS`` x ``CI_REQUESTS``); ``scripts/reliability.py`` runs 64 x 10.
"""

from __future__ import annotations

import pytest

from tests.reliability.harness import Target
from tests.reliability.scenarios import run_load

pytestmark = [pytest.mark.reliability, pytest.mark.timeout(300)]

CI_CLIENTS, CI_REQUESTS, MAX_TOKENS = 16, 3, 12


@pytest.mark.parametrize(("clients", "requests_per_client"), [(CI_CLIENTS, CI_REQUESTS)])
async def test_concurrent_streams_all_finish_and_free_kv(target: Target, clients: int,
                                                         requests_per_client: int) -> None:
    result = await run_load(target, clients=clients, requests_per_client=requests_per_client, max_tokens=MAX_TOKENS)
    assert (result.errors, result.lost) == (0, 0), result.row()
    assert result.ok == clients * requests_per_client
    assert result.kv_used_after == 0, result.row()
    assert not any(note.startswith("engine not idle") for note in result.notes), result.row()
    records = next(note for note in result.notes if note.startswith("records "))
    finished, sampled = records.split()[1].split("/")
    assert finished == sampled, records
