"""Running the app under uvicorn with a graceful drain, a loading bar and a ready message."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
import time
from types import FrameType

import uvicorn
from tqdm import tqdm

from gateway.state import GatewayState

logger = logging.getLogger(__name__)

POST_DRAIN_GRACE_S = 5  # uvicorn's own graceful shutdown, after our drain
CUT_GRACE_S = 1.0  # after the drain timeout, how long cut requests get to send their error


class DrainingServer(uvicorn.Server):
    """A ``uvicorn.Server`` whose first SIGTERM/SIGINT drains before stopping.

    The drain sets ``state.draining`` at once (/ready -> 503, new requests -> 503 + Retry-After),
    gives in-flight requests up to ``settings.drain_timeout_s`` to finish, then ends those still open
    with a ``server_shutdown`` error (a 503, or an SSE error event mid-stream; their engine requests are
    aborted) and lets uvicorn stop as usual. A second signal stops at once. The signal is not re-raised
    afterwards, so the process exits 0.
    """

    def __init__(self, config: uvicorn.Config, state: GatewayState) -> None:
        super().__init__(config)
        self.state = state
        self.drain_started_at: float | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: set[asyncio.Task] = set()

    async def serve(self, sockets: list | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    async def startup(self, sockets: list | None = None) -> None:
        await super().startup(sockets)
        if self.started:
            self._spawn(self._announce_when_loaded())

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.drain_started_at is not None or self._loop is None:
            if self.should_exit and sig == signal.SIGINT:
                self.force_exit = True
            self.should_exit = True
            return
        self.drain_started_at = time.monotonic()
        self.state.begin_drain()
        self._loop.call_soon_threadsafe(self._spawn, self._drain())

    def _spawn(self, coro) -> None:  # type: ignore[no-untyped-def]
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _drain(self) -> None:
        timeout = self.state.settings.drain_timeout_s
        logger.info("draining: %d request(s) in flight, up to %.0f s", self.state.num_in_flight, timeout)
        if not await self.state.wait_idle(timeout):
            num_cut = self.state.cut_open_requests()
            logger.warning("drain timeout: ending %d request(s) with a server_shutdown error", num_cut)
            await self.state.wait_idle(CUT_GRACE_S)
        self.should_exit = True

    async def _announce_when_loaded(self) -> None:
        """A progress bar while the engine loads (on a terminal), then the ready line (or the failure)."""
        settings, state = self.state.settings, self.state
        total = 2 if settings.draft_model else 1
        with tqdm(total=total, desc=f"loading {settings.served_model_name}", unit="model", disable=None,
                  file=sys.stderr, leave=False) as bar:
            while state.engine is None and state.load_error is None and not self.should_exit:
                bar.update(min(len(state.load_steps), total) - bar.n)
                await asyncio.sleep(0.1)
        if state.load_error is not None:
            print(f"specserve: failed to load the model: {state.load_error}", file=sys.stderr, flush=True)
            self.should_exit = True
        elif state.engine is not None:
            url = f"http://{settings.public_host}:{self.bound_port()}/v1"
            print(f"specserve ready: {url} (model {state.engine.model_name})", file=sys.stderr, flush=True)

    def bound_port(self) -> int:
        for server in getattr(self, "servers", []):
            for sock in server.sockets:
                return sock.getsockname()[1]
        return self.config.port


def run_server(state: GatewayState, app: object) -> int:
    settings = state.settings
    config = uvicorn.Config(
        app,  # type: ignore[arg-type]
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        timeout_graceful_shutdown=POST_DRAIN_GRACE_S,
        lifespan="on",
    )
    DrainingServer(config, state).run()
    return 1 if state.load_error is not None else 0
