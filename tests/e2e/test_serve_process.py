"""Process-level behaviour: SIGTERM drains then exits 0; `specserve serve` reports a failed load and exits 1."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]
READY = re.compile(r"specserve ready: http://(\S+):(\d+)/v1 \(model (\S+)\)")


def spawn(args: list[str]) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECSERVE_")}
    env["OMP_NUM_THREADS"] = "1"
    return subprocess.Popen(args, cwd=ROOT, env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)


def wait_ready(process: subprocess.Popen, timeout_s: float = 30) -> str:
    deadline = time.monotonic() + timeout_s
    assert process.stderr is not None
    seen = []
    while time.monotonic() < deadline:
        line = process.stderr.readline()
        seen.append(line)
        match = READY.search(line)
        if match:
            return f"http://127.0.0.1:{match.group(2)}"
        if not line and process.poll() is not None:
            break
    raise AssertionError("the server never printed its ready line; stderr:\n" + "".join(seen))


@pytest.fixture
def fake_server() -> Iterator[tuple[subprocess.Popen, str]]:
    process = spawn([sys.executable, "-m", "tests.e2e.fake_server", "10"])
    try:
        yield process, wait_ready(process)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def stream_in_background(url: str, max_tokens: int) -> tuple[threading.Thread, list[str], threading.Event]:
    lines: list[str] = []
    started = threading.Event()

    def run() -> None:
        body = {"model": "specserve-tiny", "prompt": "a b c", "temperature": 0, "max_tokens": max_tokens,
                "stream": True}
        try:
            with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=30) as response:
                for line in response.iter_lines():
                    if line.startswith("data: "):
                        lines.append(line[6:])
                        started.set()
        except httpx.HTTPError:  # the server cut the stream (drain timeout)
            lines.append("<cut>")

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, lines, started


def test_sigterm_drains_in_flight_streams_then_exits_0(fake_server: tuple[subprocess.Popen, str]) -> None:
    process, url = fake_server
    thread, lines, started = stream_in_background(url, max_tokens=150)  # ~1.5 s at 10 ms/token
    assert started.wait(10)
    process.send_signal(signal.SIGTERM)
    time.sleep(0.2)
    ready = httpx.get(f"{url}/ready")
    assert ready.status_code == 503 and ready.json()["status"] == "draining"
    refused = httpx.post(f"{url}/v1/completions", json={"model": "specserve-tiny", "prompt": "x"})
    assert refused.status_code == 503 and "retry-after" in refused.headers
    thread.join(timeout=15)
    assert lines[-1] == "[DONE]"
    assert json.loads(lines[-2])["choices"][0]["finish_reason"] == "length"
    assert process.wait(timeout=15) == 0


def test_drain_timeout_ends_long_streams_with_an_error_event(tmp_path: Path) -> None:
    process = spawn([sys.executable, "-m", "tests.e2e.fake_server", "0.5"])
    try:
        url = wait_ready(process)
        thread, lines, started = stream_in_background(url, max_tokens=1000)  # ~10 s: longer than the drain
        assert started.wait(10)
        began = time.monotonic()
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=10) == 0
        assert time.monotonic() - began < 8  # 0.5 s drain, then uvicorn's own shutdown
        thread.join(timeout=5)
        assert not thread.is_alive() and "[DONE]" not in lines
        error = json.loads(lines[-1])["error"]  # the cut stream says why it ended
        assert error["code"] == "server_shutdown" and error["type"] == "service_unavailable_error"
        assert all(choice["finish_reason"] is None for line in lines[:-1] for choice in json.loads(line)["choices"])
    finally:
        if process.poll() is None:
            process.kill()


def test_cli_serve_reports_a_failed_load(tmp_path: Path) -> None:
    process = spawn([sys.executable, "-m", "gateway.cli", "serve", "--port", "0", "--model", str(tmp_path / "none"),
                     "--draft-model", "none"])
    _, err = process.communicate(timeout=60)
    assert process.returncode == 1, err
    assert "failed to load the model" in err
