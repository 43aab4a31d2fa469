"""The full reliability run: starts a private redis-server and a real ``specserve serve`` (the bundled pair on
CPU, on a free port), runs every scenario against it and prints a summary table:

    scenario | requests | ok | errors | lost | kv_used_after | notes

Scenarios: load (64 streaming clients x 10 requests), disconnect storm (100 clients), Redis killed mid-load and
restarted, bad input (explicit hostile bodies, then schemathesis against the real server and in-process), auth
on every /admin route, two replicas sharing one Redis (policy, request state, rate limit), and last a SIGTERM
drain with a stream in flight. tests/reliability runs short versions of the same scenarios in CI.

    .venv/bin/python scripts/reliability.py              # the full run (minutes on 2 CPU cores)
    .venv/bin/python scripts/reliability.py --quick      # the CI sizes
    .venv/bin/python scripts/reliability.py --only load,storm

Exit status 0 when every row has 0 errors, 0 lost and 0 KV blocks in use afterwards. Only 127.0.0.1 is used;
every loop is bounded and every scenario has a timeout.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.reliability.harness import (  # noqa: E402
    ADMIN_KEY,
    API_KEY,
    OTHER_KEY,
    KillableRedis,
    ScenarioResult,
    ServerProcess,
    Target,
    auth,
    format_table,
    start_all,
    wait_engine_idle,
)
from tests.reliability.hostile import (  # noqa: E402
    FuzzReport,
    admin_routes,
    bound_cost,
    fuzz_public_api,
    run_auth,
    run_bad_input,
)
from tests.reliability.scenarios import (  # noqa: E402
    run_disconnect_storm,
    run_drain,
    run_load,
    run_multi_replica,
    run_redis_fault,
)

SCENARIOS = ("load", "storm", "redis", "bad_input", "fuzz", "auth", "replicas", "drain")
RATE_KEY = "sk-rel-limited"


@dataclass(frozen=True)
class Sizes:
    clients: int = 64
    requests_per_client: int = 10
    max_tokens: int = 12
    storm_clients: int = 100
    storm_max_tokens: int = 64
    fault_clients: int = 16
    fault_requests_per_client: int = 8
    fuzz_examples_real: int = 25  # per operation and generation mode, against the real engine
    fuzz_examples_fake: int = 150  # per operation and generation mode, in-process with FakeEngine
    scenario_timeout_s: float = 600.0


QUICK = Sizes(clients=16, requests_per_client=3, storm_clients=20, storm_max_tokens=48, fault_clients=8,
              fault_requests_per_client=6, fuzz_examples_real=8, fuzz_examples_fake=40)


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="the CI sizes instead of the full ones")
    ap.add_argument("--clients", type=int, help="load: concurrent streaming clients (full: 64)")
    ap.add_argument("--requests", type=int, help="load: requests per client (full: 10)")
    ap.add_argument("--storm", type=int, help="disconnect storm: clients (full: 100)")
    ap.add_argument("--max-tokens", type=int, help="load: max_tokens per request (default 12)")
    ap.add_argument("--only", help=f"comma-separated subset of: {', '.join(SCENARIOS)}")
    args = ap.parse_args()
    unknown = set((args.only or "").split(",")) - set(SCENARIOS) - {""}
    if unknown:
        ap.error(f"unknown scenario(s): {', '.join(sorted(unknown))}")
    return args


def sizes_from(args: argparse.Namespace) -> Sizes:
    base = QUICK if args.quick else Sizes()
    overrides = {name: value for name, value in (("clients", args.clients), ("requests_per_client", args.requests),
                                                 ("storm_clients", args.storm), ("max_tokens", args.max_tokens))
                 if value is not None}
    return Sizes(**{**base.__dict__, **overrides})


async def guarded(name: str, scenario: Callable[[], Awaitable[ScenarioResult]], timeout_s: float) -> ScenarioResult:
    """Run one scenario with a timeout; a crash or timeout becomes a failed row instead of ending the run."""
    started = time.monotonic()
    print(f"-- {name} ...", file=sys.stderr, flush=True)
    try:
        result = await asyncio.wait_for(scenario(), timeout_s)
    except Exception as exc:  # noqa: BLE001 - reported in the table
        result = ScenarioResult(name, errors=1)
        result.note(f"scenario failed: {type(exc).__name__}: {str(exc)[:300]}")
    print(f"   {name}: {time.monotonic() - started:.1f} s", file=sys.stderr, flush=True)
    return result


async def with_kv(target: Target, result: ScenarioResult) -> ScenarioResult:
    if result.kv_used_after is None:
        result.kv_used_after = (await wait_engine_idle(target, timeout_s=30))["kv_used_blocks"]
    return result


async def bad_input(target: Target) -> ScenarioResult:
    result, outcomes = await run_bad_input(target)
    big = next(o for o in outcomes if o.case.name.endswith("MB JSON body"))
    if big.status != 413:
        result.note(f"no body-size limit: a 10 MB body -> {big.status} after {big.seconds:.1f} s of parsing and "
                    "tokenizing on the event loop")
    return await with_kv(target, result)


async def fuzz_real(target: Target, examples: int) -> ScenarioResult:
    import schemathesis

    def call(case: Any) -> Any:
        bound_cost(case.body)
        return case.call(base_url=target.url, headers=auth(target.api_key), timeout=60)

    schema = schemathesis.openapi.from_url(f"{target.url}/openapi.json")
    report = await asyncio.to_thread(fuzz_public_api, schema, max_examples=examples, call=call, model=target.model)
    result = fuzz_result("schemathesis (real server)", report)
    result.note(f"schemathesis {schemathesis.__version__}, <= {examples} examples/operation/mode, "
                "max_tokens <= 16, n <= 2")
    return await with_kv(target, result)


async def fuzz_fake(examples: int) -> ScenarioResult:
    import schemathesis

    from gateway.app import create_app
    from gateway.settings import GatewaySettings
    from gateway.testing import FakeEngine

    engine = FakeEngine(max_model_len=256)
    schema = schemathesis.openapi.from_asgi("/openapi.json", create_app(GatewaySettings(), engine))
    report = await asyncio.to_thread(fuzz_public_api, schema, max_examples=examples, call=lambda case: case.call(),
                                     prepare=lambda case: bound_cost(case.body, max_tokens=64, max_n=8))
    result = fuzz_result("schemathesis (in-process, FakeEngine)", report)
    result.note(f"<= {examples} examples/operation/mode; kv = the FakeEngine's slots")
    result.kv_used_after = engine.kv_used_slots
    return result


def fuzz_result(name: str, report: FuzzReport) -> ScenarioResult:
    num_5xx = sum(n for status, n in report.statuses.items() if status >= 500)
    result = ScenarioResult(name, requests=report.num_examples, ok=report.num_examples - num_5xx, errors=num_5xx)
    result.note("statuses " + " ".join(f"{s}:{n}" for s, n in sorted(report.statuses.items())))
    result.notes += report.failures
    return result


async def auth_scenario(target: Target) -> ScenarioResult:
    from gateway.app import create_app
    from gateway.settings import GatewaySettings
    from gateway.testing import FakeEngine

    routes = admin_routes(create_app(GatewaySettings(), FakeEngine()))
    return await with_kv(target, await run_auth(target, routes))


async def replicas() -> ScenarioResult:
    redis_server = KillableRedis().start()
    env = {"SPECSERVE_REDIS_URL": redis_server.url, "SPECSERVE_RATE_LIMIT_RPM": "3",
           "SPECSERVE_API_KEYS": f"{API_KEY},{OTHER_KEY},{RATE_KEY}", "SPECSERVE_ADMIN_KEY": ADMIN_KEY}
    a, b = ServerProcess(env, name="replica-a"), ServerProcess(env, name="replica-b")
    try:
        await asyncio.to_thread(start_all, a, b)
        return await run_multi_replica(Target(a.url), Target(b.url), rate_limit_rpm=3, rate_key=RATE_KEY)
    finally:
        await asyncio.to_thread(a.stop, 10)
        await asyncio.to_thread(b.stop, 10)
        redis_server.stop()


async def run(sizes: Sizes, only: set[str]) -> list[ScenarioResult]:
    redis_server = KillableRedis().start()
    server = ServerProcess({"SPECSERVE_REDIS_URL": redis_server.url}, name="reliability-server")
    results: list[ScenarioResult] = []
    try:
        await asyncio.to_thread(server.start)
        target = Target(server.url)
        print(f"server ready at {server.url} (redis {redis_server.url})", file=sys.stderr, flush=True)
        plan: list[tuple[str, str, Callable[[], Awaitable[ScenarioResult]]]] = [
            ("load", "load", lambda: run_load(target, clients=sizes.clients, max_tokens=sizes.max_tokens,
                                              requests_per_client=sizes.requests_per_client)),
            ("storm", "disconnect storm", lambda: run_disconnect_storm(
                target, clients=sizes.storm_clients, max_tokens=sizes.storm_max_tokens)),
            ("redis", "redis fault", lambda: run_redis_fault(
                target, redis_server, clients=sizes.fault_clients, max_tokens=sizes.max_tokens, server=server,
                requests_per_client=sizes.fault_requests_per_client)),
            ("bad_input", "bad input", lambda: bad_input(target)),
            ("fuzz", "schemathesis (real server)", lambda: fuzz_real(target, sizes.fuzz_examples_real)),
            ("fuzz", "schemathesis (in-process)", lambda: fuzz_fake(sizes.fuzz_examples_fake)),
            ("auth", "auth", lambda: auth_scenario(target)),
            ("replicas", "two replicas, one Redis", replicas),
            ("drain", "drain (SIGTERM)", lambda: run_drain(server, target, max_tokens=300)),
        ]
        for key, name, scenario in plan:
            if not only or key in only:
                results.append(await guarded(name, scenario, sizes.scenario_timeout_s))
    finally:
        await asyncio.to_thread(server.stop, 10)
        redis_server.stop()
    return results


def main() -> int:
    args = parse_args()
    for name in [n for n in os.environ if n.startswith("SPECSERVE_")]:  # settings come from this script only
        del os.environ[name]
    sizes = sizes_from(args)
    only = {s for s in (args.only or "").split(",") if s}
    started = time.monotonic()
    results = asyncio.run(run(sizes, only))
    print(format_table(results))
    print(f"\n{len(results)} scenarios in {time.monotonic() - started:.0f} s "
          f"({'quick' if args.quick else 'full'} sizes: {sizes})")
    failed = [r.scenario for r in results if r.errors or r.lost or (r.kv_used_after or 0)]
    if failed:
        print("FAILED: " + ", ".join(failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
