"""Auth on the real server: every /admin route (enumerated from the app's routes) refuses a missing or wrong
key (401) and a user key (403); a user key cannot read another key's request state (404)."""

from __future__ import annotations

import pytest

from gateway.app import create_app
from gateway.settings import GatewaySettings
from gateway.testing import FakeEngine
from tests.reliability.harness import Target
from tests.reliability.hostile import admin_routes, run_auth

pytestmark = [pytest.mark.reliability, pytest.mark.timeout(120)]


def test_admin_routes_are_enumerated_from_the_app() -> None:
    app = create_app(GatewaySettings(), FakeEngine())
    routes = admin_routes(app)
    assert ("GET", "/admin/stats") in routes and ("PATCH", "/admin/policy") in routes
    documented = {(method.upper(), path) for path, item in app.openapi()["paths"].items() if path.startswith("/admin")
                  for method in item}
    assert documented <= set(routes)


async def test_admin_routes_need_the_admin_key_and_records_stay_private(target: Target) -> None:
    routes = admin_routes(create_app(GatewaySettings(), FakeEngine()))
    result = await run_auth(target, routes)
    assert result.errors == 0, result.row()
    assert result.ok == result.requests >= 3 * len(routes) + 2
