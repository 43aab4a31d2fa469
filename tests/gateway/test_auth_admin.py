"""API keys, the admin key, request records per key, and the admin endpoints."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from gateway.app import create_app
from gateway.auth import ApiKeyAuth, key_id
from gateway.errors import AuthenticationError, PermissionDeniedError
from gateway.settings import GatewaySettings
from gateway.testing import FakeEngine
from tests.gateway.helpers import auth, chat_body, open_client

KEY_A, KEY_B, ADMIN = "sk-alpha", "sk-bravo", "sk-admin"


@pytest.fixture
async def secured(engine: FakeEngine, tmp_path: Path) -> httpx.AsyncClient:
    keys_file = tmp_path / "keys.txt"
    keys_file.write_text(f"# team b\n{KEY_B}\n\n")
    settings = GatewaySettings(api_keys=KEY_A, api_keys_file=str(keys_file), admin_key=ADMIN)
    async with open_client(create_app(settings, engine)) as client:
        yield client


def test_keys_are_kept_only_as_digests() -> None:
    gate = ApiKeyAuth([KEY_A], ADMIN)
    assert KEY_A.encode() not in repr(vars(gate)).encode()
    assert gate.authenticate(f"Bearer {KEY_A}").key_id == key_id(KEY_A) != KEY_A
    with pytest.raises(AuthenticationError):
        gate.authenticate("Bearer sk-wrong")
    with pytest.raises(AuthenticationError):
        gate.authenticate(f"Basic {KEY_A}")
    with pytest.raises(PermissionDeniedError):
        gate.authenticate_admin(f"Bearer {KEY_A}")
    assert gate.authenticate_admin(f"Bearer {ADMIN}").is_admin


async def test_api_requires_a_valid_key(secured: httpx.AsyncClient) -> None:
    missing = await secured.post("/v1/chat/completions", json=chat_body())
    assert missing.status_code == 401
    assert missing.json()["error"]["code"] == "invalid_api_key"
    assert "Authorization" in missing.json()["error"]["message"]
    wrong = await secured.get("/v1/models", headers=auth("sk-nope"))
    assert wrong.status_code == 401 and wrong.json()["error"]["message"] == "Incorrect API key provided."
    for key in (KEY_A, KEY_B, ADMIN):  # env key, file key, and the admin key
        assert (await secured.post("/v1/chat/completions", json=chat_body(), headers=auth(key))).status_code == 200


async def test_admin_needs_the_admin_key(secured: httpx.AsyncClient) -> None:
    assert (await secured.get("/admin/policy")).status_code == 401
    assert (await secured.get("/admin/policy", headers=auth("sk-nope"))).status_code == 401
    forbidden = await secured.get("/admin/stats", headers=auth(KEY_A))
    assert forbidden.status_code == 403 and set(forbidden.json()["error"]) == {"message", "type", "param", "code"}
    assert (await secured.get("/admin/policy", headers=auth(ADMIN))).status_code == 200


async def test_request_records_are_visible_to_their_own_key_only(secured: httpx.AsyncClient) -> None:
    r = await secured.post("/v1/chat/completions", json=chat_body("a b </s>"), headers=auth(KEY_A))
    request_id = r.json()["id"]
    record = (await secured.get(f"/v1/requests/{request_id}", headers=auth(KEY_A))).json()
    assert record["id"] == request_id
    assert record["status"] == "finished"
    assert record["key_id"] == key_id(KEY_A)
    assert record["prompt_tokens"] == 6 and record["completion_tokens"] == 2
    assert record["finish_reason"] == "stop"
    assert record["created"] <= record["first_token_at"] <= record["finished_at"]
    assert record["speculation"]["rounds"] >= 1
    assert record["prompt"] is None and record["output"] is None  # store_prompts is off
    assert KEY_A not in str(record)
    other = await secured.get(f"/v1/requests/{request_id}", headers=auth(KEY_B))
    assert other.status_code == 404
    assert (await secured.get("/v1/requests/chatcmpl-unknown", headers=auth(KEY_A))).status_code == 404


async def test_store_prompts_keeps_prompt_and_output(engine: FakeEngine) -> None:
    async with open_client(create_app(GatewaySettings(store_prompts=True), engine)) as client:
        request_id = (await client.post("/v1/chat/completions", json=chat_body("a b </s>"))).json()["id"]
        record = (await client.get(f"/v1/requests/{request_id}")).json()
    assert record["prompt"] == [{"role": "user", "content": "a b </s>"}]
    assert record["output"] == ["a b"]


async def test_admin_requests_lists_recent_and_active(secured: httpx.AsyncClient) -> None:
    for _ in range(3):
        await secured.post("/v1/completions", json={"model": "specserve-tiny", "prompt": "x"}, headers=auth(KEY_B))
    listing = (await secured.get("/admin/requests?limit=2", headers=auth(ADMIN))).json()
    assert listing["object"] == "list" and len(listing["data"]) == 2
    assert all(r["status"] == "finished" for r in listing["data"])
    active = (await secured.get("/admin/requests?status=active", headers=auth(ADMIN))).json()
    assert active["data"] == []


async def test_policy_get_patch_put(secured: httpx.AsyncClient, engine: FakeEngine) -> None:
    admin = auth(ADMIN)
    current = (await secured.get("/admin/policy", headers=admin)).json()
    assert current["mode"] == "auto"
    patched = await secured.patch("/admin/policy", json={"k": 2, "mode": "draft"}, headers=admin)
    assert patched.status_code == 200 and patched.json()["k"] == 2
    assert engine.policy["mode"] == "draft"
    bad = await secured.patch("/admin/policy", json={"k_max": 99}, headers=admin)
    assert bad.status_code == 400
    assert bad.json()["error"]["param"] == "k_max" and "k_max" in bad.json()["error"]["message"]
    unknown = await secured.patch("/admin/policy", json={"warp": 9}, headers=admin)
    assert unknown.status_code == 400 and unknown.json()["error"]["param"] == "warp"
    assert engine.policy["k"] == 2  # a rejected change leaves the policy alone
    partial_put = await secured.put("/admin/policy", json={"k": 3}, headers=admin)
    assert partial_put.status_code == 400 and "PUT replaces the whole policy" in partial_put.json()["error"]["message"]
    full = {**engine.policy_settings(), "k": 3}
    assert (await secured.put("/admin/policy", json=full, headers=admin)).json() == full
    not_object = await secured.patch("/admin/policy", json=[1], headers=admin)
    assert not_object.status_code == 400


async def test_admin_stats(secured: httpx.AsyncClient) -> None:
    await secured.post("/v1/chat/completions", json=chat_body(), headers=auth(KEY_A))
    stats = (await secured.get("/admin/stats", headers=auth(ADMIN))).json()
    assert stats["engine"]["spec_decode_num_drafts"] >= 1
    assert stats["engine"]["policy"]["mode"] == "auto"
    assert stats["gateway"]["redis"] == "disabled"
    assert stats["gateway"]["draining"] is False


async def test_open_mode_without_keys(client: httpx.AsyncClient) -> None:
    assert (await client.post("/v1/chat/completions", json=chat_body())).status_code == 200
    assert (await client.get("/admin/policy")).status_code == 200
