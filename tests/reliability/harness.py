"""The reliability harness: real ``specserve serve`` processes (the bundled model pair on CPU), a private
killable redis-server, the server's view (engine stats, request records) and the summary table.

Shared by tests/reliability (the short CI versions) and scripts/reliability.py (the full ones); the scenarios
themselves are in ``scenarios.py`` (load, disconnect storm, Redis fault, drain, replicas) and ``hostile.py``
(bad input, schemathesis, auth). Every wait has a timeout, and everything talks to 127.0.0.1 only.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import openai

from gateway.testing import RedisServer

ROOT = Path(__file__).resolve().parents[2]
MODEL = "specserve-tiny"
API_KEY, OTHER_KEY, ADMIN_KEY = "sk-rel-alpha", "sk-rel-bravo", "sk-rel-admin"
READY_LINE = re.compile(r"specserve ready: http://\S+:(\d+)/v1")
PROMPTS = (
    "Once upon a time", "The quick brown fox", "def fibonacci(n):", "In a distant galaxy",
    "The capital of France is", "import numpy as np", "Dear diary, today", "for i in range(10):",
)
# The real engine on CPU, small enough for a 2-core CI machine (the bundled pair allows 2048).
REAL_ENGINE_ENV = {
    "SPECSERVE_HOST": "127.0.0.1",
    "SPECSERVE_PORT": "0",
    "SPECSERVE_DEVICE": "cpu",
    "SPECSERVE_DTYPE": "float32",
    "SPECSERVE_MAX_SEQ_LEN": "512",
    "SPECSERVE_LOG_LEVEL": "warning",
    "SPECSERVE_API_KEYS": f"{API_KEY},{OTHER_KEY}",
    "SPECSERVE_ADMIN_KEY": ADMIN_KEY,
}
REDIS_RECORD_PREFIX = "specserve:req:"


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


# ---- processes -------------------------------------------------------------------------------------


class KillableRedis(RedisServer):
    """A private redis-server that can also die abruptly (SIGKILL) and come back on the same port."""

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def kill(self) -> None:
        if self._process is not None:
            self._process.kill()
            self._process.wait(timeout=5)
            self._process = None


class ServerProcess:
    """``python -m gateway.cli serve`` (the ``specserve serve`` entry point) in a subprocess.

    Settings come only from ``env`` (SPECSERVE_*; the caller's own SPECSERVE_* variables are dropped).
    stderr is read by a thread (so the pipe never fills) into a bounded tail, where the ready line is found.
    """

    def __init__(self, env: Mapping[str, str], *, name: str = "specserve") -> None:
        self.name = name
        self.env = {**REAL_ENGINE_ENV, **env}
        self.process: subprocess.Popen | None = None
        self.port: int | None = None
        self._log: deque[str] = deque(maxlen=200)
        self._ready = threading.Event()
        self._reader: threading.Thread | None = None

    @property
    def url(self) -> str:
        assert self.port is not None, f"{self.name} is not ready"
        return f"http://127.0.0.1:{self.port}"

    def launch(self) -> ServerProcess:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SPECSERVE_")}
        env.update(self.env, OMP_NUM_THREADS=env.get("OMP_NUM_THREADS", "1"), PYTHONUNBUFFERED="1")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "gateway.cli", "serve"], cwd=ROOT, env=env,
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )
        self._reader = threading.Thread(target=self._read_stderr, name=f"{self.name}-stderr", daemon=True)
        self._reader.start()
        return self

    def _read_stderr(self) -> None:
        assert self.process is not None and self.process.stderr is not None
        for line in self.process.stderr:
            self._log.append(line.rstrip("\n"))
            match = READY_LINE.search(line)
            if match and self.port is None:
                self.port = int(match.group(1))
                self._ready.set()

    def wait_ready(self, timeout_s: float = 180.0) -> ServerProcess:
        deadline = time.monotonic() + timeout_s
        while not self._ready.wait(0.1):
            if self.process is None or self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"{self.name} did not become ready; its stderr ends:\n{self.log_tail()}")
        return self

    def start(self, timeout_s: float = 180.0) -> ServerProcess:
        return self.launch().wait_ready(timeout_s)

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def send_signal(self, sig: int) -> None:
        assert self.process is not None
        self.process.send_signal(sig)

    def wait(self, timeout_s: float) -> int:
        assert self.process is not None
        return self.process.wait(timeout=timeout_s)

    def stop(self, timeout_s: float = 30.0) -> int | None:
        """SIGTERM (a drain), then SIGKILL if it has not exited within ``timeout_s``; the exit code."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        if self._reader is not None:
            self._reader.join(timeout=5)
        return self.process.returncode

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(list(self._log)[-lines:])


def start_all(*servers: ServerProcess, timeout_s: float = 180.0) -> None:
    """Launch the processes together (their models load in parallel), then wait for each to be ready."""
    for server in servers:
        server.launch()
    try:
        for server in servers:
            server.wait_ready(timeout_s)
    except BaseException:
        for server in servers:
            server.stop(timeout_s=5)
        raise


# ---- results -----------------------------------------------------------------------------------------


@dataclass
class ScenarioResult:
    scenario: str
    requests: int = 0
    ok: int = 0
    errors: int = 0
    lost: int = 0
    kv_used_after: int | None = None
    notes: list[str] = field(default_factory=list)
    error_kinds: Counter = field(default_factory=Counter)

    def note(self, text: str) -> None:
        self.notes.append(text)

    def row(self) -> list[str]:
        notes = list(self.notes)
        if self.error_kinds:
            notes.append("errors: " + ", ".join(f"{k} x{n}" for k, n in self.error_kinds.most_common()))
        kv = "-" if self.kv_used_after is None else str(self.kv_used_after)
        return [self.scenario, str(self.requests), str(self.ok), str(self.errors), str(self.lost), kv, "; ".join(notes)]


TABLE_HEADER = ["scenario", "requests", "ok", "errors", "lost", "kv_used_after", "notes"]


def format_table(results: list[ScenarioResult]) -> str:
    rows = [TABLE_HEADER] + [r.row() for r in results]
    widths = [max(len(row[i]) for row in rows) for i in range(len(TABLE_HEADER) - 1)]
    lines = []
    for n, row in enumerate(rows):
        cells = [cell.ljust(width) for cell, width in zip(row, widths)] + [row[-1]]
        lines.append("| " + " | ".join(cells) + " |")
        if n == 0:
            lines.append("|" + "|".join("-" * (w + 2) for w in widths) + "|" + "-" * (len(row[-1]) + 2) + "|")
    return "\n".join(lines)


# ---- the server's view ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    url: str
    api_key: str = API_KEY
    admin_key: str = ADMIN_KEY
    model: str = MODEL


async def engine_stats(target: Target) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=target.url, timeout=10) as http:
        response = await http.get("/admin/stats", headers=auth(target.admin_key))
        response.raise_for_status()
        return response.json()["engine"]


async def wait_engine_idle(target: Target, timeout_s: float = 30.0) -> dict[str, Any]:
    """Poll /admin/stats until nothing runs, waits or holds KV blocks; the last stats either way."""
    deadline = time.monotonic() + timeout_s
    while True:
        stats = await engine_stats(target)
        idle = stats["kv_used_blocks"] == 0 and stats["num_running"] == 0 and stats["num_waiting"] == 0
        if idle or time.monotonic() > deadline:
            return stats
        await asyncio.sleep(0.1)


async def records_by_status(target: Target, status: str) -> list[dict[str, Any]]:
    """Request records (newest first, up to 1000) with a status; "active" means queued or running, i.e. a
    request that never finished or was never closed."""
    async with httpx.AsyncClient(base_url=target.url, timeout=10) as http:
        response = await http.get("/admin/requests", params={"status": status, "limit": 1000},
                                  headers=auth(target.admin_key))
        response.raise_for_status()
        return response.json()["data"]


async def record_statuses(target: Target, request_ids: list[str]) -> Counter:
    """GET /v1/requests/{id} for each id (with the key that made them): a count of statuses (or HTTP codes)."""
    statuses: Counter = Counter()
    async with httpx.AsyncClient(base_url=target.url, timeout=10, headers=auth(target.api_key)) as http:
        for request_id in request_ids:
            response = await http.get(f"/v1/requests/{request_id}")
            statuses[response.json()["status"] if response.status_code == 200 else f"http {response.status_code}"] += 1
    return statuses


async def serves(target: Target, max_tokens: int = 4) -> bool:
    """One plain request completes."""
    async with openai.AsyncOpenAI(base_url=f"{target.url}/v1", api_key=target.api_key, max_retries=0,
                                  timeout=60) as client:
        response = await client.completions.create(model=target.model, prompt="Hello", max_tokens=max_tokens,
                                                   temperature=0)
    return response.choices[0].finish_reason in ("stop", "length")


Check = tuple[str, bool, str]  # (what, passed, detail)


async def poll(check: Callable[[], Awaitable[bool]], timeout_s: float, interval_s: float = 0.02) -> bool:
    """Await ``check()`` until it is true (True) or ``timeout_s`` has passed (False)."""
    deadline = time.monotonic() + timeout_s
    while not await check():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(interval_s)
    return True


def redis_record(redis_url: str, request_id: str) -> dict[str, Any] | None:
    """A request's record read straight from Redis (not through a gateway), or None."""
    import redis

    client = redis.Redis.from_url(redis_url, socket_timeout=2, decode_responses=True)
    try:
        raw = client.get(REDIS_RECORD_PREFIX + request_id)
    finally:
        client.close()
    return json.loads(raw) if raw else None
