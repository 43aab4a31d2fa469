"""Hostile input and access: explicit bad bodies, schemathesis over the public API, and auth on /admin.

Nothing may get a 5xx or take the server down; each bad request gets a clear 4xx.
"""

from __future__ import annotations

import contextlib
import json
import re
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx

from tests.reliability.harness import MODEL, OTHER_KEY, ScenarioResult, Target, auth

# ---- bad input ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BadCase:
    name: str
    path: str
    body: bytes
    expect: frozenset[int]  # acceptable statuses
    code: str | None = None  # the expected error code, if any


def _json(payload: Any) -> bytes:
    return json.dumps(payload).encode()


def bad_input_cases(model: str = MODEL, *, big_mb: int = 10, nesting: int = 100_000) -> list[BadCase]:
    """Explicit hostile bodies: none may get a 5xx; each gets a clear 4xx."""
    big_prompt = "hello " * (big_mb * 1024 * 1024 // 6)
    chat = {"model": model, "messages": [{"role": "user", "content": "Hi"}]}
    return [
        BadCase(f"{big_mb} MB JSON body", "/v1/completions", _json({"model": model, "prompt": big_prompt}),
                frozenset({400, 413})),
        BadCase("invalid UTF-8 in the body", "/v1/completions",
                b'{"model": "' + model.encode() + b'", "prompt": "caf\xc3\x28 \xff\xfe"}', frozenset({400})),
        BadCase("invalid UTF-8 in a chat message", "/v1/chat/completions",
                b'{"model": "' + model.encode() + b'", "messages": [{"role": "user", "content": "\xed\xa0\x80"}]}',
                frozenset({400})),
        BadCase("lone surrogate in a prompt", "/v1/completions",
                b'{"model": "' + model.encode() + b'", "prompt": "a \\ud800 b", "max_tokens": 2}', frozenset({400})),
        BadCase("lone surrogate in a chat message", "/v1/chat/completions",
                b'{"model": "' + model.encode() + b'", "messages": [{"role": "user", "content": "\\udfff"}]}',
                frozenset({400})),
        BadCase("lone surrogate in the model name", "/v1/completions",
                b'{"model": "m\\ud800", "prompt": "Hi", "max_tokens": 2}', frozenset({400})),
        BadCase("huge max_tokens", "/v1/completions", _json({"model": model, "prompt": "Hi", "max_tokens": 10**9}),
                frozenset({400}), code="context_length_exceeded"),
        BadCase("huge max_tokens (chat)", "/v1/chat/completions", _json({**chat, "max_tokens": 2**63}),
                frozenset({400}), code="context_length_exceeded"),
        BadCase("n = 0", "/v1/completions", _json({"model": model, "prompt": "Hi", "n": 0}), frozenset({400})),
        BadCase("n = 129", "/v1/chat/completions", _json({**chat, "n": 129}), frozenset({400})),
        BadCase("n = -1", "/v1/completions", _json({"model": model, "prompt": "Hi", "n": -1}), frozenset({400})),
        BadCase(f"{nesting} nested lists", "/v1/completions",
                b'{"model": "' + model.encode() + b'", "prompt": ' + b"[" * nesting + b"]" * nesting + b"}",
                frozenset({400, 413, 422})),
        BadCase(f"{nesting} nested objects", "/v1/chat/completions", b'{"a":' * nesting + b"1" + b"}" * nesting,
                frozenset({400, 413, 422})),
        BadCase("not JSON", "/v1/completions", b"model=specserve-tiny&prompt=hi", frozenset({400})),
        BadCase("NaN temperature", "/v1/completions",
                b'{"model": "' + model.encode() + b'", "prompt": "Hi", "temperature": NaN}', frozenset({400})),
        BadCase("token id out of vocabulary", "/v1/completions",
                _json({"model": model, "prompt": [10**12, 1], "max_tokens": 2}), frozenset({400})),
    ]


@dataclass
class CaseOutcome:
    case: BadCase
    status: int | None
    code: str | None
    seconds: float

    @property
    def passed(self) -> bool:
        return self.status in self.case.expect and (self.case.code is None or self.code == self.case.code)


async def run_bad_input(target: Target, cases: list[BadCase] | None = None,
                        name: str = "bad input") -> tuple[ScenarioResult, list[CaseOutcome]]:
    cases = cases if cases is not None else bad_input_cases(target.model)
    result = ScenarioResult(name, requests=len(cases))
    outcomes = []
    headers = {**auth(target.api_key), "Content-Type": "application/json"}
    async with httpx.AsyncClient(base_url=target.url, timeout=120) as http:
        for case in cases:
            started = time.monotonic()
            try:
                response = await http.post(case.path, content=case.body, headers=headers)
            except httpx.HTTPError as exc:
                outcomes.append(CaseOutcome(case, None, type(exc).__name__, time.monotonic() - started))
            else:
                code = None
                with contextlib.suppress(ValueError, KeyError, TypeError, AttributeError):
                    code = response.json()["error"]["code"]
                outcomes.append(CaseOutcome(case, response.status_code, code, time.monotonic() - started))
        health = await http.get("/health")
    for outcome in outcomes:
        if outcome.passed:
            result.ok += 1
        else:
            result.errors += 1
            result.error_kinds[f"{outcome.case.name} -> {outcome.status}"] += 1
    slowest = max(outcomes, key=lambda o: o.seconds)
    result.note(f"slowest: {slowest.case.name} {slowest.seconds:.1f} s -> {slowest.status}")
    result.note(f"/health after: {health.status_code}")
    return result, outcomes


# ---- schemathesis -----------------------------------------------------------------------------------------

PUBLIC_PATHS = r"^/(v1/.*|health|ready|metrics)$"


def bound_cost(body: Any, max_tokens: int = 16, max_n: int = 2) -> Any:
    """Keep a generated body cheap for a real CPU engine: valid max_tokens/n are capped; invalid ones are kept."""
    if isinstance(body, dict):
        for name in ("max_tokens", "max_completion_tokens"):
            value = body.get(name)
            if type(value) is int and max_tokens < value <= 100_000:
                body[name] = max_tokens
        value = body.get("n")
        if type(value) is int and max_n < value <= 128:
            body["n"] = max_n
    return body


CHAT_ROLES = ("system", "developer", "user", "assistant")


def make_plausible(body: Any, model: str) -> None:
    """Steer a schema-valid body past the checks the schema cannot express (the served model, known roles),
    so positive examples reach the engine instead of all stopping at a 404 or a 400."""
    if not isinstance(body, dict):
        return
    if "model" in body:
        body["model"] = model
    for i, message in enumerate(body.get("messages") or []):
        if isinstance(message, dict) and message.get("role") not in CHAT_ROLES:
            message["role"] = CHAT_ROLES[i % len(CHAT_ROLES)]


@dataclass
class FuzzReport:
    num_examples: int = 0
    statuses: Counter = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)  # one reproduction per operation that got a 5xx
    per_operation: dict[str, int] = field(default_factory=dict)


def fuzz_public_api(schema: Any, *, max_examples: int, call: Callable[[Any], Any], model: str = MODEL,
                    prepare: Callable[[Any], None] | None = None) -> FuzzReport:
    """Drive every public operation of a schemathesis schema in positive and negative generation modes
    (deterministically: hypothesis derandomized), recording statuses and every 5xx with a reproduction.

    In positive mode bodies are made plausible first (:func:`make_plausible`), so more of them reach the engine.
    """
    from hypothesis import HealthCheck, given, settings
    from hypothesis.errors import Unsatisfiable
    from schemathesis import GenerationMode

    report = FuzzReport()

    def fuzz(operation: Any, mode: GenerationMode) -> None:
        label = f"{operation.method.upper()} {operation.path}"
        failures: list[str] = []

        @settings(max_examples=max_examples, deadline=None, derandomize=True, database=None,
                  suppress_health_check=list(HealthCheck), report_multiple_bugs=False)
        @given(case=operation.as_strategy(generation_mode=mode))
        def run(case: Any) -> None:
            if mode == GenerationMode.POSITIVE:
                make_plausible(case.body, model)
            if prepare is not None:
                prepare(case)
            response = call(case)
            report.num_examples += 1
            report.per_operation[label] = report.per_operation.get(label, 0) + 1
            report.statuses[response.status_code] += 1
            if response.status_code >= 500 and not failures:
                failures.append(f"{label} ({mode.value}) -> {response.status_code} {response.text[:300]!r}\n"
                                f"    reproduce: {case.as_curl_command()}")

        with contextlib.suppress(Unsatisfiable):  # e.g. no negative examples for an operation without inputs
            run()
        report.failures.extend(failures)

    for result in schema.include(path_regex=PUBLIC_PATHS).get_all_operations():
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            fuzz(result.ok(), mode)
    return report


# ---- auth ---------------------------------------------------------------------------------------------------


def _walk_routes(routes: list[Any]) -> Iterator[Any]:
    """Every endpoint route, through included routers (FastAPI >= 0.16x wraps them) and mounts."""
    for route in routes:
        nested = getattr(getattr(route, "original_router", None), "routes", None) or getattr(route, "routes", None)
        if nested is not None and not hasattr(route, "endpoint"):
            yield from _walk_routes(nested)
        else:
            yield route


def admin_routes(app: Any) -> list[tuple[str, str]]:
    """(method, path) of every /admin route of an app, from ``app.routes``."""
    found = set()
    for route in _walk_routes(app.routes):
        path, methods = getattr(route, "path", ""), getattr(route, "methods", None) or set()
        if path.startswith("/admin"):
            found |= {(method, path) for method in methods - {"HEAD", "OPTIONS"}}
    return sorted(found)


async def run_auth(target: Target, routes: list[tuple[str, str]], name: str = "auth") -> ScenarioResult:
    """Every admin route: no key -> 401, a wrong key -> 401, a user key -> 403, and (GETs only, so nothing
    changes) the admin key is let through (no 401/403/5xx); a request's record: its own key -> 200,
    another user key -> 404."""
    checks: list[tuple[str, str, int, bool]] = []  # (what, expected, got, passed)

    def expect(what: str, expected: int, got: int) -> None:
        checks.append((what, str(expected), got, got == expected))

    async with httpx.AsyncClient(base_url=target.url, timeout=30) as http:
        for method, path in routes:
            url = re.sub(r"\{[^}]+\}", "x", path)
            body = {} if method in ("PATCH", "PUT", "POST") else None
            for who, headers, expected in (("no key", {}, 401), ("wrong key", auth("sk-wrong"), 401),
                                           ("user key", auth(target.api_key), 403)):
                response = await http.request(method, url, json=body, headers=headers)
                expect(f"{method} {path} {who}", expected, response.status_code)
            if method == "GET":
                got = (await http.get(url, headers=auth(target.admin_key))).status_code
                passed = got not in (401, 403) and got < 500
                checks.append((f"{method} {path} admin key", "not 401/403/5xx", got, passed))
        made = await http.post("/v1/completions", headers=auth(target.api_key),
                               json={"model": target.model, "prompt": "Mine", "max_tokens": 2, "temperature": 0})
        request_id = made.json()["id"]
        for who, key, expected in (("own key", target.api_key, 200), ("other user key", OTHER_KEY, 404)):
            response = await http.get(f"/v1/requests/{request_id}", headers=auth(key))
            expect(f"GET /v1/requests/{{id}} {who}", expected, response.status_code)
    result = ScenarioResult(name, requests=len(checks))
    for what, expected, got, passed in checks:
        if passed:
            result.ok += 1
        else:
            result.errors += 1
            result.error_kinds[f"{what}: {got}, expected {expected}"] += 1
    result.note(f"{len(routes)} admin routes: " + ", ".join(f"{m} {p}" for m, p in routes))
    return result
