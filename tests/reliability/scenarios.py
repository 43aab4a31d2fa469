"""Scenarios against a running server: load, disconnect storm, Redis fault, drain, two replicas.

Each returns a :class:`~tests.reliability.harness.ScenarioResult` (one row of the summary table) or, for the
replica checks, a :data:`~tests.reliability.harness.Check`; sizes are parameters, so the CI tests run short
versions and scripts/reliability.py the full ones.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
import openai

from tests.reliability.harness import (
    OTHER_KEY,
    PROMPTS,
    Check,
    KillableRedis,
    ScenarioResult,
    ServerProcess,
    Target,
    auth,
    poll,
    record_statuses,
    records_by_status,
    redis_record,
    serves,
    wait_engine_idle,
)

# ---- load -----------------------------------------------------------------------------------------------


async def _stream_once(client: openai.AsyncOpenAI, target: Target, chat: bool, prompt: str, max_tokens: int,
                       temperature: float, seed: int) -> tuple[str | None, str | None]:
    """One streaming request through the openai SDK: (finish_reason or None, request id)."""
    common: dict[str, Any] = dict(model=target.model, max_tokens=max_tokens, temperature=temperature, seed=seed,
                                  stream=True)
    if chat:
        stream: Any = await client.chat.completions.create(messages=[{"role": "user", "content": prompt}], **common)
    else:
        stream = await client.completions.create(prompt=prompt, **common)
    finish, request_id = None, None
    async with stream:
        async for chunk in stream:
            request_id = chunk.id
            for choice in chunk.choices:
                finish = choice.finish_reason or finish
    return finish, request_id


async def run_load(target: Target, *, clients: int, requests_per_client: int, max_tokens: int = 12,
                   request_timeout_s: float = 120.0, name: str = "load",
                   on_result: Callable[[str], None] | None = None) -> ScenarioResult:
    """``clients`` concurrent streaming clients, each sending ``requests_per_client`` requests in turn.

    ok: a finish_reason of stop/length arrived; error: an HTTP error, an SSE error event or a bad finish
    ("abort"); lost: the stream ended without a finish_reason or the request timed out. Afterwards the
    engine must be idle with no KV blocks in use, and sampled request records must say "finished".
    """
    result = ScenarioResult(name, requests=clients * requests_per_client)
    request_ids: list[str] = []
    started = time.monotonic()

    def count(outcome: str, kind: str = "") -> None:
        if outcome == "ok":
            result.ok += 1
        elif outcome == "lost":
            result.lost += 1
        else:
            result.errors += 1
            result.error_kinds[kind] += 1
        if on_result is not None:
            on_result(outcome)

    async with openai.AsyncOpenAI(base_url=f"{target.url}/v1", api_key=target.api_key, max_retries=0,
                                  timeout=request_timeout_s) as client:

        async def one(c: int, r: int) -> None:
            chat, temperature = (c + r) % 2 == 1, 0.0 if (c + r) % 3 == 0 else 0.8
            prompt = PROMPTS[(c * requests_per_client + r) % len(PROMPTS)]
            try:
                finish, request_id = await asyncio.wait_for(
                    _stream_once(client, target, chat, prompt, max_tokens, temperature, seed=c * 1000 + r),
                    request_timeout_s)
            except TimeoutError:
                return count("lost")
            except openai.APIStatusError as exc:
                return count("error", f"http {exc.status_code}")
            except openai.APIError as exc:
                return count("error", type(exc).__name__)
            if request_id is not None:
                request_ids.append(request_id)
            if finish in ("stop", "length"):
                count("ok")
            elif finish is None:
                count("lost")
            else:
                count("error", f"finish={finish}")

        async def client_loop(c: int) -> None:
            for r in range(requests_per_client):
                await one(c, r)

        await asyncio.gather(*(client_loop(c) for c in range(clients)))
    elapsed = time.monotonic() - started
    stats = await wait_engine_idle(target)
    result.kv_used_after = stats["kv_used_blocks"]
    result.note(f"{clients} clients x {requests_per_client}, max_tokens {max_tokens}, {elapsed:.1f} s "
                f"({result.requests / max(elapsed, 1e-9):.1f} req/s)")
    sample = request_ids[:: max(1, len(request_ids) // 8)][:8]
    statuses = await record_statuses(target, sample)
    result.note(f"records {statuses.get('finished', 0)}/{len(sample)} finished")
    if stats["num_running"] or stats["num_waiting"]:
        result.note(f"engine not idle: {stats['num_running']} running, {stats['num_waiting']} waiting")
    return result


# ---- disconnect storm -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Departure:
    """How one storm client leaves: after ``num_events`` SSE events, or ``delay_s`` into a request."""

    how: str  # "mid_stream" | "before_headers" | "non_stream"
    chat: bool
    num_events: int = 0
    delay_s: float = 0.0


def storm_plan(clients: int, seed: int) -> list[Departure]:
    rng = random.Random(seed)
    plan = []
    for _ in range(clients):
        how = rng.choices(("mid_stream", "before_headers", "non_stream"), weights=(6, 2, 2))[0]
        plan.append(Departure(how, chat=rng.random() < 0.5, num_events=rng.randint(0, 12),
                              delay_s=rng.uniform(0.0, 0.4)))
    return plan


async def _leave(http: httpx.AsyncClient, target: Target, departure: Departure, max_tokens: int,
                 index: int) -> str:
    """Run one storm client: "left" (disconnected as planned), "finished" (done before it could leave) or an error."""
    prompt = PROMPTS[index % len(PROMPTS)]
    body: dict[str, Any] = {"model": target.model, "max_tokens": max_tokens, "ignore_eos": True,
                            "temperature": 0.7, "seed": index, "stream": departure.how != "non_stream"}
    if departure.chat:
        path, body["messages"] = "/v1/chat/completions", [{"role": "user", "content": prompt}]
    else:
        path, body["prompt"] = "/v1/completions", prompt
    if departure.how == "mid_stream":
        async with http.stream("POST", path, json=body) as response:
            if response.status_code != 200:
                return f"http {response.status_code}"
            num_events = 0
            async for line in response.aiter_lines():
                if line == "data: [DONE]":
                    return "finished"
                if line.startswith("data: "):
                    if '"error"' in line[:20]:
                        return "sse error"
                    num_events += 1
                    if num_events > departure.num_events:
                        return "left"  # leaving the block closes the connection mid-stream
        return "stream cut"
    request = asyncio.ensure_future(http.post(path, json=body))
    done, _ = await asyncio.wait({request}, timeout=departure.delay_s)
    if not done:
        request.cancel()
        with contextlib.suppress(asyncio.CancelledError, httpx.HTTPError):
            await request
        return "left"
    exc = request.exception()
    if exc is not None:
        return type(exc).__name__
    return "finished" if request.result().status_code == 200 else f"http {request.result().status_code}"


async def run_disconnect_storm(target: Target, *, clients: int, seed: int = 0, max_tokens: int = 64,
                               settle_timeout_s: float = 60.0, name: str = "disconnect storm") -> ScenarioResult:
    """``clients`` concurrent clients that each disconnect at a random point (mid-stream, before the
    response headers, or during a non-streaming request). Afterwards no KV block may stay in use, no
    request record may stay active (those are "lost"), and the server must still serve."""
    result = ScenarioResult(name, requests=clients)
    plan = storm_plan(clients, seed)
    limits = httpx.Limits(max_connections=clients + 8, max_keepalive_connections=0)
    started, started_at = time.monotonic(), time.time()
    async with httpx.AsyncClient(base_url=target.url, headers=auth(target.api_key), timeout=60, limits=limits) as http:
        outcomes = await asyncio.gather(
            *(_leave(http, target, departure, max_tokens, i) for i, departure in enumerate(plan)),
            return_exceptions=True)
    for outcome in outcomes:
        kind = outcome if isinstance(outcome, str) else type(outcome).__name__
        if kind in ("left", "finished"):
            result.ok += 1
        else:
            result.errors += 1
            result.error_kinds[kind] += 1
    stats = await wait_engine_idle(target, settle_timeout_s)
    settled = time.monotonic() - started
    result.kv_used_after = stats["kv_used_blocks"]
    result.lost = len(await records_by_status(target, "active"))
    num_aborted = sum(1 for r in await records_by_status(target, "aborted") if r["created"] >= started_at)
    hows = Counter(d.how for d in plan)
    left = sum(1 for o in outcomes if o == "left")
    result.note(f"{left} left early ({', '.join(f'{k} {v}' for k, v in sorted(hows.items()))}); "
                f"{num_aborted} records aborted; settled in {settled:.1f} s")
    if stats["num_running"] or stats["num_waiting"]:
        result.note(f"engine not idle: {stats['num_running']} running, {stats['num_waiting']} waiting")
    result.note("serves afterwards: " + ("yes" if await serves(target) else "NO"))
    return result


# ---- Redis fault ------------------------------------------------------------------------------------------


async def _record_written_after_restart(target: Target, redis_url: str, timeout_s: float) -> tuple[bool, str]:
    """Send requests until one's record lands in Redis (the guard backs off ~1 s after a failure)."""
    deadline = time.monotonic() + timeout_s
    async with openai.AsyncOpenAI(base_url=f"{target.url}/v1", api_key=target.api_key, max_retries=0,
                                  timeout=60) as client:
        while True:
            response = await client.completions.create(model=target.model, prompt="After the outage",
                                                       max_tokens=4, temperature=0)
            record = await asyncio.to_thread(redis_record, redis_url, response.id)
            if record is not None and record.get("status") == "finished":
                return True, response.id
            if time.monotonic() > deadline:
                return False, response.id
            await asyncio.sleep(0.3)


async def run_redis_fault(target: Target, redis_server: KillableRedis, *, clients: int, requests_per_client: int,
                          max_tokens: int = 12, outage_s: float = 2.0,
                          server: ServerProcess | None = None, name: str = "redis fault") -> ScenarioResult:
    """Kill Redis (SIGKILL) once a quarter of a load has completed and restart it ``outage_s`` later on the
    same port (empty: no persistence); every request of that load must complete. Then state writes must
    resume (a new request's record lands in Redis) and a second, smaller load must complete with its
    records readable through the API. The process must still be alive."""
    num_done = 0
    quarter = asyncio.Event()
    total = clients * requests_per_client

    def on_result(_: str) -> None:
        nonlocal num_done
        num_done += 1
        if num_done >= max(1, total // 4):
            quarter.set()

    load = asyncio.ensure_future(run_load(target, clients=clients, requests_per_client=requests_per_client,
                                          max_tokens=max_tokens, name=name, on_result=on_result))
    notes = []
    try:
        await asyncio.wait_for(quarter.wait(), timeout=300)
        redis_server.kill()
        done_at_kill = num_done
        await asyncio.sleep(outage_s / 2)
        async with httpx.AsyncClient(base_url=target.url, timeout=10) as http:
            ready = await http.get("/ready")
            notes.append(f"/ready during outage: {ready.status_code} redis={ready.json().get('redis')}")
        await asyncio.sleep(outage_s / 2)
        notes.append(f"killed after {done_at_kill}/{total} requests; {num_done - done_at_kill} completed "
                     f"during the {outage_s:g} s outage")
    finally:
        if not redis_server.running:  # restart whatever happened above
            await asyncio.to_thread(redis_server.start)
    during = await load
    written, request_id = await _record_written_after_restart(target, redis_server.url, timeout_s=15)
    notes.append("state writes resumed: " + ("yes" if written else f"NO (no record of {request_id} in Redis)"))
    after = await run_load(target, clients=clients, requests_per_client=max(1, requests_per_client // 2),
                           max_tokens=max_tokens, name=name)
    result = ScenarioResult(name, requests=during.requests + after.requests, ok=during.ok + after.ok,
                            errors=during.errors + after.errors, lost=during.lost + after.lost,
                            kv_used_after=after.kv_used_after, error_kinds=during.error_kinds + after.error_kinds)
    result.notes = notes + [f"during: {during.notes[0]}", f"after restart: {after.notes[0]}",
                            f"after restart: {after.notes[1]}"]
    async with httpx.AsyncClient(base_url=target.url, timeout=10) as http:
        ready = await http.get("/ready")
    result.note(f"/ready after: {ready.status_code} redis={ready.json().get('redis')}")
    if server is not None:
        result.note("process alive: " + ("yes" if server.alive() else "NO"))
    return result


# ---- drain ---------------------------------------------------------------------------------------------------


async def run_drain(server: ServerProcess, target: Target, *, max_tokens: int = 200,
                    exit_timeout_s: float = 60.0, name: str = "drain (SIGTERM)") -> ScenarioResult:
    """SIGTERM while a stream is in flight: /ready -> 503 draining at once, new requests -> 503 with
    Retry-After, the stream still finishes ([DONE], finish_reason length), then the process exits 0."""
    result = ScenarioResult(name)
    events: list[str] = []
    first_event = asyncio.Event()
    body = {"model": target.model, "prompt": "Long story:", "max_tokens": max_tokens, "ignore_eos": True,
            "temperature": 0, "stream": True}

    async def stream(http: httpx.AsyncClient) -> None:
        async with http.stream("POST", "/v1/completions", json=body, headers=auth(target.api_key)) as response:
            async for line in response.aiter_lines():
                if line.startswith("data: "):
                    events.append(line[6:])
                    first_event.set()

    checks: list[tuple[str, bool]] = []
    async with httpx.AsyncClient(base_url=target.url, timeout=exit_timeout_s) as http:
        streaming = asyncio.ensure_future(stream(http))
        await asyncio.wait_for(first_event.wait(), timeout=60)
        server.send_signal(signal.SIGTERM)
        drain_started = time.monotonic()

        async def draining() -> bool:
            ready = await http.get("/ready")
            return ready.status_code == 503 and ready.json()["status"] == "draining"

        checks.append(("/ready 503 draining", await poll(draining, timeout_s=2.0)))
        result.note(f"/ready draining after {time.monotonic() - drain_started:.2f} s")
        refused = await http.post("/v1/completions", headers=auth(target.api_key),
                                  json={"model": target.model, "prompt": "x", "max_tokens": 2})
        refused_ok = refused.status_code == 503 and "retry-after" in refused.headers
        checks.append(("new request 503 + Retry-After", refused_ok))
        checks.append(("stream still running at refusal", not streaming.done()))
        try:
            await asyncio.wait_for(streaming, timeout=exit_timeout_s)
        except (httpx.HTTPError, TimeoutError) as exc:
            result.note(f"stream failed: {type(exc).__name__}")
    finished = len(events) >= 2 and events[-1] == "[DONE]" \
        and json.loads(events[-2])["choices"][0]["finish_reason"] == "length"
    checks.append(("in-flight stream finished", finished))
    try:
        code = await asyncio.to_thread(server.wait, exit_timeout_s)
    except subprocess.TimeoutExpired:
        code = None
    checks.append(("exit code 0", code == 0))
    result.note(f"exit code {code} after {time.monotonic() - drain_started:.1f} s; stream events {len(events)}")
    result.requests = 2  # the in-flight stream and the refused request
    result.ok = int(finished) + int(refused_ok)
    result.lost = int(not finished)
    for what, passed in checks:
        if not passed:
            result.errors += 1
            result.error_kinds[what] += 1
    return result


# ---- multi-replica ------------------------------------------------------------------------------------------


async def seconds_until_window_has(room_s: float, window_s: int = 60) -> float:
    """Rate limits count in fixed one-minute windows: wait so that the next ``room_s`` stay in one window."""
    into = time.time() % window_s
    if window_s - into < room_s:
        await asyncio.sleep(window_s - into + 0.05)
        return window_s - into
    return 0.0


async def check_policy_sync(a: Target, b: Target, timeout_s: float = 1.0) -> Check:
    """A policy PATCH through A's admin endpoint shows on B's GET /admin/policy within ``timeout_s``."""
    admin = auth(a.admin_key)
    async with httpx.AsyncClient(timeout=30) as http:
        before = (await http.get(f"{b.url}/admin/policy", headers=admin)).json()
        new_k = 2 if before.get("k") != 2 else 3
        patched = await http.patch(f"{a.url}/admin/policy", json={"k": new_k}, headers=admin)
        changed_at = time.monotonic()

        async def b_has_it() -> bool:
            return (await http.get(f"{b.url}/admin/policy", headers=admin)).json().get("k") == new_k

        seen = await poll(b_has_it, timeout_s=timeout_s, interval_s=0.05)
        waited = time.monotonic() - changed_at
    detail = f"PATCH k={new_k} on A -> {patched.status_code}; B's GET shows " + (
        f"it after {waited:.2f} s" if seen else f"k={before.get('k')} still after {waited:.2f} s")
    return (f"policy PATCH on A seen on B within {timeout_s:g} s", patched.status_code == 200 and seen, detail)


async def check_shared_state(a: Target, b: Target) -> Check:
    """A request made on A has its record readable on B with the same key, and a 404 for another key."""
    async with httpx.AsyncClient(timeout=30) as http:
        made = await http.post(f"{a.url}/v1/completions", headers=auth(a.api_key),
                               json={"model": a.model, "prompt": "Shared", "max_tokens": 4, "temperature": 0})
        request_id = made.json().get("id", "?")
        same_key = await http.get(f"{b.url}/v1/requests/{request_id}", headers=auth(a.api_key))
        other_key = await http.get(f"{b.url}/v1/requests/{request_id}", headers=auth(OTHER_KEY))
    passed = made.status_code == 200 and same_key.status_code == 200 and other_key.status_code == 404 \
        and same_key.json()["status"] == "finished"
    return ("A's request record readable on B (same key; 404 for another)", passed,
            f"made on A -> {made.status_code}; on B: same key -> {same_key.status_code}, "
            f"other key -> {other_key.status_code}")


async def check_shared_rate_limit(a: Target, b: Target, *, rate_limit_rpm: int, rate_key: str) -> Check:
    """With ``rate_limit_rpm`` on both, that many requests pass (half on A, half on B) and the next gets 429."""
    await seconds_until_window_has(10.0)
    on_a = (rate_limit_rpm + 1) // 2
    targets = [a] * on_a + [b] * (rate_limit_rpm + 1 - on_a)
    codes = []
    async with httpx.AsyncClient(timeout=30) as http:
        for target in targets:
            response = await http.post(f"{target.url}/v1/completions", headers=auth(rate_key),
                                       json={"model": a.model, "prompt": "Limit", "max_tokens": 2})
            codes.append(response.status_code)
    expected = [200] * rate_limit_rpm + [429]
    return (f"rate limit {rate_limit_rpm}/min shared", codes == expected,
            f"{on_a} on A then {len(targets) - on_a} on B: {codes}")


async def run_multi_replica(a: Target, b: Target, *, rate_limit_rpm: int, rate_key: str,
                            name: str = "two replicas, one Redis") -> ScenarioResult:
    """Two gateway processes sharing one Redis: policy, request state and rate limits are shared."""
    checks = [await check_policy_sync(a, b), await check_shared_state(a, b),
              await check_shared_rate_limit(a, b, rate_limit_rpm=rate_limit_rpm, rate_key=rate_key)]
    result = ScenarioResult(name, requests=len(checks))
    for what, passed, detail in checks:
        result.note(f"{what}: {detail}")
        if passed:
            result.ok += 1
        else:
            result.errors += 1
            result.error_kinds[what] += 1
    return result
