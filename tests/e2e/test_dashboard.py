"""The admin dashboard (GET /admin/ui): its cookie auth over HTTP, and the page itself in a real headless Chromium
driven by Selenium against a uvicorn server with a slow FakeEngine under streaming load."""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import openai
import pytest

from gateway.settings import GatewaySettings
from gateway.testing import FakeEngine
from tests.e2e.conftest import API_KEY, LiveServer, start_live_server

ADMIN_KEY = "sk-e2e-admin"
MODEL = "specserve-tiny"
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
CHROMIUM_FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
    "--window-size=1440,1120",
)


class MeteredFakeEngine(FakeEngine):
    """A FakeEngine whose stats() also carries what the real engine reports and the dashboard plots:
    ``num_generated_tokens``, per-proposer totals and the policy's histogram of chosen k."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.num_generated_tokens = 0
        self.proposer_totals: dict[str, list[int]] = {}  # name -> [rounds, drafted, accepted]
        self.chosen_k = [0] * 17

    def _round_size(self, request, state) -> int:  # noqa: ANN001
        rounds = {name: s.rounds for name, s in state.spec.by_proposer.items()}
        drafted, accepted = self.num_draft_tokens, self.num_accepted_tokens
        size = super()._round_size(request, state)
        k = self.num_draft_tokens - drafted
        self.chosen_k[k] += 1
        for name, s in state.spec.by_proposer.items():
            if s.rounds != rounds.get(name, 0):
                totals = self.proposer_totals.setdefault(name, [0, 0, 0])
                totals[0] += 1
                totals[1] += k
                totals[2] += self.num_accepted_tokens - accepted
        return size

    def _step(self, request, state) -> tuple[list[int], str | None]:  # noqa: ANN001
        new_ids, finish = super()._step(request, state)
        self.num_generated_tokens += len(new_ids)
        return new_ids, finish

    def stats(self) -> dict:
        stats = super().stats()
        stats["num_generated_tokens"] = self.num_generated_tokens
        stats["proposers"] = {
            name: {"rounds": r, "drafted_tokens": d, "accepted_tokens": a,
                   "acceptance_rate": round(a / d, 4) if d else 0.0}
            for name, (r, d, a) in self.proposer_totals.items()
        }
        highest = max((k for k, count in enumerate(self.chosen_k) if count), default=0)
        num_steps = sum(self.chosen_k)
        stats["policy"]["settings"] = self.policy_settings()
        stats["policy"]["chosen_k"] = {
            "histogram": self.chosen_k[: max(self.policy["k_max"], highest) + 1],
            "num_request_steps": num_steps,
            "plain_decode_fraction": self.chosen_k[0] / num_steps if num_steps else None,
        }
        return stats


@pytest.fixture(scope="module")
def dashboard_server() -> Iterator[LiveServer]:
    with pytest.MonkeyPatch.context() as env:
        for name in [n for n in os.environ if n.startswith("SPECSERVE_")]:
            env.delenv(name)
        engine = MeteredFakeEngine(token_delay_s=0.04, max_model_len=256, max_running=6)
        server = start_live_server(engine, GatewaySettings(api_keys=API_KEY, admin_key=ADMIN_KEY, keepalive_s=1))
        yield server
        server.stop()


def admin_policy(server: LiveServer) -> dict:
    response = httpx.get(f"{server.url}/admin/policy", headers={"Authorization": f"Bearer {ADMIN_KEY}"})
    response.raise_for_status()
    return response.json()


def test_dashboard_auth_header_query_key_and_cookie(dashboard_server: LiveServer) -> None:
    with httpx.Client(base_url=dashboard_server.url, timeout=10) as client:
        assert client.get("/admin/ui").status_code == 401
        assert client.get("/admin/ui", headers={"Authorization": f"Bearer {API_KEY}"}).status_code == 403
        assert client.get("/admin/ui", params={"key": API_KEY}).status_code == 403
        assert client.get("/admin/ui", params={"key": "sk-wrong"}).status_code == 401
        assert not client.cookies
        assert client.get("/admin/static/dashboard.js").status_code == 401

        page = client.get("/admin/ui", headers={"Authorization": f"Bearer {ADMIN_KEY}"})
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assert "default-src 'self'" in page.headers["content-security-policy"]

        login = client.get("/admin/ui", params={"key": ADMIN_KEY})
        assert login.status_code == 303 and login.headers["location"] == "ui"
        cookie = login.headers["set-cookie"].lower()
        assert "httponly" in cookie and "samesite=strict" in cookie and "path=/admin" in cookie
        assert client.get("/admin/ui").status_code == 200  # the cookie now authenticates the page ...
        assert client.get("/admin/stats").json()["engine"]["num_running"] == 0  # ... and the admin API
        assert client.get("/admin/static/dashboard.css").headers["content-type"].startswith("text/css")
        assert client.get("/admin/static/dashboard.js").status_code == 200
        assert client.get("/admin/static/secrets.txt").status_code == 404

    wrong_cookie = httpx.get(f"{dashboard_server.url}/admin/stats", headers={"Cookie": f"specserve_admin={API_KEY}"})
    assert wrong_cookie.status_code == 403


def chromium_paths() -> tuple[str, str]:
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver") or next((p for p in ("/usr/bin/chromedriver",) if Path(p).exists()), None)
    if browser is None or driver is None:
        pytest.skip("needs Debian's chromium and chromium-driver (apt-get install -y chromium chromium-driver; "
                    ".ci/run installs them)")
    return browser, driver


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[object]:
    webdriver = pytest.importorskip("selenium.webdriver", reason="needs the selenium package (dev extras)")
    from selenium.webdriver.chrome.service import Service

    browser_path, driver_path = chromium_paths()
    options = webdriver.ChromeOptions()
    options.binary_location = browser_path  # with both paths given, selenium-manager is never run
    for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'chromium-profile'}"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=driver_path), options=options)
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


class Traffic:
    """Streaming chat requests from a few threads until stopped; half ask for the n-gram proposer."""

    def __init__(self, server: LiveServer, num_threads: int = 4) -> None:
        self.client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0, timeout=30)
        self.stop_event = threading.Event()
        self.num_completed = 0
        self.errors: list[BaseException] = []
        self.threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(num_threads)]

    def __enter__(self) -> Traffic:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_event.set()
        for thread in self.threads:
            thread.join(timeout=30)

    def _run(self, index: int) -> None:
        extra = {"speculation": {"mode": "ngram"}} if index % 2 else {}
        words = " ".join(["alpha", "bravo", "charlie", "delta", "echo"][: 2 + index])
        while not self.stop_event.is_set():
            try:
                stream = self.client.chat.completions.create(
                    model=MODEL, messages=[{"role": "user", "content": f"tell me about {words}"}], stream=True,
                    max_tokens=48, temperature=0.8, seed=index + self.num_completed, extra_body=extra)
                for _ in stream:
                    pass
                self.num_completed += 1
            except Exception as exc:  # noqa: BLE001 - reported by the test
                self.errors.append(exc)
                return


def wait_for(condition: Callable[[], object], timeout_s: float, what: str) -> object:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        result = condition()
        if result:
            return result
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_dashboard_in_chromium(dashboard_server: LiveServer, browser) -> None:  # noqa: ANN001
    from selenium.webdriver.common.by import By

    driver = browser
    engine = dashboard_server.engine
    driver.get(f"{dashboard_server.url}/admin/ui?key={ADMIN_KEY}")
    assert driver.current_url.endswith("/admin/ui"), "the key is moved into a cookie and out of the address bar"

    def figure(element_id: str) -> str | None:
        return driver.find_element(By.ID, element_id).get_attribute("data-value")

    wait_for(lambda: figure("running") == "0", 30, "the first stats poll")

    with Traffic(dashboard_server) as traffic:
        seen = {"running": 0.0, "tokens-per-s": 0.0, "kv-usage": 0.0, "points": 0}

        def figures_updated() -> bool:
            for name in ("running", "tokens-per-s", "kv-usage"):
                seen[name] = max(seen[name], float(figure(name) or 0))
            chart = driver.find_element(By.ID, "acceptance-chart")
            seen["points"] = int(chart.get_attribute("data-num-points") or 0)
            return all(seen[name] > 0 for name in ("running", "tokens-per-s", "kv-usage")) and seen["points"] >= 3

        wait_for(figures_updated, 60, f"live figures (so far {seen})")
        assert 0 < float(figure("acceptance")) <= 1
        assert int(driver.find_element(By.ID, "k-histogram").get_attribute("data-num-bars")) == 9  # k = 0..k_max 8
        legend = driver.find_element(By.ID, "acceptance-legend")
        wait_for(lambda: "draft" in legend.text and "ngram" in legend.text, 20, "a series per proposer")

        field = wait_for(lambda: driver.find_elements(By.ID, "policy-k_max"), 30, "the policy form")[0]
        message = driver.find_element(By.ID, "policy-message")
        field.clear()
        field.send_keys("99")
        driver.find_element(By.ID, "policy-apply").click()
        wait_for(lambda: "error" in message.get_attribute("class"), 20, "the rejection to show")
        assert "k_max: must be in 1..16" in message.text and "400" in message.text
        assert engine.policy_settings()["k_max"] == 8

        field.clear()
        field.send_keys("5")
        driver.find_element(By.ID, "policy-apply").click()
        wait_for(lambda: "ok" in message.get_attribute("class").split(), 20, "the success note")
        assert "k_max = 5" in message.text
        assert admin_policy(dashboard_server)["k_max"] == 5
        assert engine.policy_settings()["k_max"] == 5
        histogram = driver.find_element(By.ID, "k-histogram")
        wait_for(lambda: histogram.get_attribute("data-num-bars") == "6", 20, "the histogram to follow k_max = 5")

        time.sleep(4)  # a few more seconds of chart before the picture
        ARTIFACTS.mkdir(exist_ok=True)
        assert driver.save_screenshot(str(ARTIFACTS / "dashboard.png"))

    assert not traffic.errors, traffic.errors
    assert traffic.num_completed > 0
    errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE" and "/admin/policy" not in e["message"]]
    assert not errors, errors  # the one expected SEVERE entry is the 400 of the rejected PATCH

