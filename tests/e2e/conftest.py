from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import uvicorn

from gateway.app import create_app
from gateway.settings import GatewaySettings
from gateway.testing import FakeEngine

API_KEY = "sk-e2e"


@dataclass
class LiveServer:
    """A real uvicorn server on a free port, in a background thread, serving a FakeEngine."""

    engine: FakeEngine
    server: uvicorn.Server
    thread: threading.Thread

    @property
    def port(self) -> int:
        return self.server.servers[0].sockets[0].getsockname()[1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


def start_live_server(engine: FakeEngine, settings: GatewaySettings) -> LiveServer:
    config = uvicorn.Config(create_app(settings, engine), host="127.0.0.1", port=0, log_level="warning",
                            lifespan="on", timeout_graceful_shutdown=2)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="e2e-uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.01)
    return LiveServer(engine, server, thread)


@pytest.fixture(scope="module")
def live_server() -> Iterator[LiveServer]:
    with pytest.MonkeyPatch.context() as env:
        for name in [n for n in os.environ if n.startswith("SPECSERVE_")]:
            env.delenv(name)
        engine = FakeEngine(token_delay_s=0.002, max_model_len=256)
        server = start_live_server(engine, GatewaySettings(api_keys=API_KEY, keepalive_s=1))
        yield server
        server.stop()
