"""`python -m tests.e2e.fake_server [drain_timeout_s]`: the real serving path (DrainingServer, signals,
ready line on stderr) with a FakeEngine, so process-level tests need no weights."""

from __future__ import annotations

import sys

from gateway.app import create_app
from gateway.server import run_server
from gateway.settings import GatewaySettings
from gateway.testing import FakeEngine


def main() -> int:
    drain_timeout_s = float(sys.argv[1]) if len(sys.argv) > 1 else 30.0
    settings = GatewaySettings(port=0, drain_timeout_s=drain_timeout_s, log_level="warning")
    app = create_app(settings, FakeEngine(token_delay_s=0.01, max_model_len=1024))
    return run_server(app.state.gateway, app)


if __name__ == "__main__":
    sys.exit(main())
