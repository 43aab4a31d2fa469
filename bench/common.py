"""Shared benchmark plumbing: run our engine and transformers on the same prompts, save JSON + PNG."""

from __future__ import annotations

import io
import itertools
import json
import platform
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from engine.config import EngineConfig
from engine.engine import LLMEngine
from engine.models.loader import DEFAULT_DRAFT, DEFAULT_TARGET
from engine.types import SamplingParams
from policies.base import BatchView

RESULTS = Path(__file__).resolve().parent / "results"


@dataclass
class RunResult:
    seconds: float
    num_tokens: int
    drafted: int = 0
    accepted: int = 0
    texts: list[str] = field(default_factory=list)
    tpot: float = 0.0  # mean over requests of (finish - first token) / (tokens - 1)

    @property
    def tokens_per_s(self) -> float:
        return self.num_tokens / self.seconds

    @property
    def acceptance(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0


def make_engine(dtype: str = "float32", device: str = "cpu", weights_from: LLMEngine | None = None,
                **overrides) -> LLMEngine:
    draft = overrides.pop("draft_model", DEFAULT_DRAFT)
    config = EngineConfig(model=str(overrides.pop("model", DEFAULT_TARGET)), draft_model=str(draft) if draft else None,
                          dtype=dtype, device=device, **overrides)
    engine = LLMEngine(config, weights_from=weights_from)
    engine.warm_up()  # as the server does: first-touch step times must not train the policy
    return engine


def set_policy(engine: LLMEngine, **settings) -> None:
    engine.policy.update(settings)
    engine.policy.apply_pending()


def run_engine(engine: LLMEngine, prompts: list[list[int]], params: SamplingParams | list[SamplingParams],
               max_in_flight: int | None = None) -> RunResult:
    """Wall time until the last prompt finishes, under continuous batching; ``params`` is one for all prompts
    or one per prompt.

    ``max_in_flight=None``: every prompt is submitted at once. Otherwise at most that many are in flight, and
    each finished request is replaced by the next prompt in the same step, as by ``max_in_flight`` clients
    that each send their next request when the last one completes (vLLM's ``--max-concurrency``).
    """
    return run_engines_lockstep({"": engine}, prompts, params, max_in_flight)[""]


def time_decide(engine: LLMEngine, seconds: list[float], seen: Callable[[BatchView], None] | None = None) -> None:
    """Wrap the engine's policy's ``decide`` so that each call's seconds land in ``seconds``, each batch shown to
    ``seen`` first (if given); ``del engine.policy.decide`` restores the controller's own."""
    decide = engine.policy.decide

    def timed(batch: BatchView):
        if seen is not None:
            seen(batch)
        start = time.perf_counter()
        decisions = decide(batch)
        seconds.append(time.perf_counter() - start)
        return decisions

    engine.policy.decide = timed


def run_engines_lockstep(engines: dict[str, LLMEngine], prompts: list[list[int]],
                         params: SamplingParams | list[SamplingParams],
                         max_in_flight: int | None = None, clients_type: type[_Clients] | None = None,
                         ) -> dict[str, RunResult]:
    """Serve the same traffic (as ``run_engine``) on every engine at once, stepping in turn the one furthest
    behind (by the share of its tokens served), and time each engine by its own steps alone: the seconds a run
    takes are the sum of its engine's step times.

    Why: a shared VM's speed drifts by 10-30% within a minute, so two identical runs taken one after the other
    paired badly (their ratio strayed by 7-14%; in turn, by 0.3%: see bench/policy_sweep.py). Steps of ~20 ms
    taken in turn see the same spells, and kept level by progress the engines all finish together, so a slower
    policy's last steps do not run alone in a later spell. Engines level on progress (identical plain ones, all
    the time) take turns in a random order: broken by the order of ``engines``, the first of four identical
    ``off`` engines ran 2% slower than the others.
    """
    clients_type = clients_type or _Clients  # bench/virtual_clock.py: another clock
    clients = {name: clients_type(engine, prompts, params, max_in_flight) for name, engine in engines.items()}
    busy = list(clients.values())
    ties = random.Random(0)
    while busy:
        behind = min(busy, key=lambda c: (c.num_emitted / c.num_planned, ties.random()))
        if not behind.step():
            busy.remove(behind)
    return {name: c.result() for name, c in clients.items()}


class _Clients:
    """``max_in_flight`` clients driving one engine, on a clock that runs only while it is this engine's turn."""

    def __init__(self, engine: LLMEngine, prompts: list[list[int]], params: SamplingParams | list[SamplingParams],
                 max_in_flight: int | None) -> None:
        self.engine = engine
        self.params = params if isinstance(params, list) else [params] * len(prompts)
        self.queue = list(enumerate(prompts))
        self.num_planned = max(1, sum(p.max_tokens for p in self.params))  # an upper bound: a request may stop early
        self.num_emitted = 0
        self.tag = time.monotonic_ns()
        self.seconds = 0.0
        self.num_tokens = self.drafted = self.accepted = 0
        self.texts: dict[str, str] = {}
        self.first: dict[str, float] = {}
        self.tpots: list[float] = []
        self._cuda = engine.runner.cache.layers[0][0].is_cuda
        self._turn_start = 0.0
        self._timed(lambda: self._submit(len(prompts) if max_in_flight is None else max(1, max_in_flight)))

    def _timed(self, work) -> None:
        self._turn_start = time.perf_counter()
        work()
        if self._cuda:
            torch.cuda.synchronize()
        self.seconds = self._clock()

    def _clock(self) -> float:
        """Seconds this engine has run: its past turns and the current one."""
        return self.seconds + time.perf_counter() - self._turn_start

    def _submit(self, count: int) -> None:
        for _ in range(min(count, len(self.queue))):
            i, ids = self.queue.pop(0)
            self.engine.add_request(f"bench-{self.tag}-{i}", ids, self.params[i])

    def step(self) -> bool:
        """One engine step and the clients' response to it; False once every prompt is served."""
        if not self.engine.has_work():
            return False
        self._timed(self._step)
        return True

    def _step(self) -> None:
        outputs = self.engine.step()
        now = self._clock()
        for out in outputs:
            self.num_emitted += len(out.new_token_ids)
            self.first.setdefault(out.request_id, now)
            self.texts[out.request_id] = self.texts.get(out.request_id, "") + out.new_text
            if out.finished:
                self.num_tokens += out.num_output_tokens
                self.drafted += out.spec.num_draft_tokens
                self.accepted += out.spec.num_accepted_tokens
                if out.num_output_tokens > 1:
                    self.tpots.append((now - self.first[out.request_id]) / (out.num_output_tokens - 1))
        self._submit(sum(out.finished for out in outputs))

    def result(self) -> RunResult:
        return RunResult(self.seconds, self.num_tokens, self.drafted, self.accepted, list(self.texts.values()),
                         statistics.mean(self.tpots) if self.tpots else 0.0)


def median_rate(results: list[RunResult]) -> float:
    return statistics.median(r.tokens_per_s for r in results)


def load_hf(path=DEFAULT_TARGET, dtype=torch.float32, device="cpu"):
    from transformers import LlamaForCausalLM

    return LlamaForCausalLM.from_pretrained(str(path), dtype=dtype).to(device).eval()


def hf_generate(model, ids: list[int], max_new: int, **kwargs) -> RunResult:
    inputs = torch.tensor([ids], device=model.device)
    start = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(inputs, attention_mask=torch.ones_like(inputs), max_new_tokens=max_new,
                             min_new_tokens=max_new, pad_token_id=0, **kwargs)
    if model.device.type == "cuda":
        torch.cuda.synchronize()
    return RunResult(time.perf_counter() - start, out.shape[1] - len(ids))


def environment() -> dict:
    return {"torch": torch.__version__, "threads": torch.get_num_threads(), "machine": platform.machine(),
            "processor": platform.processor() or cpu_model(),
            "cuda": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
            "time": time.strftime("%Y-%m-%dT%H:%M:%S")}


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU's model name and, where /proc/cpuinfo has them, its family, model and stepping (``platform.processor()``
    is empty on Linux): timings differ across hosts, and a VM may name its CPU only "AMD EPYC". Two hosts of that
    name did not time alike: on one (cpu family 25, model 1) fixed draft k = 2 ran 1.05x ``off`` at 32 code clients,
    T = 0.7, where the other had it at 0.94x (docs/goodput-guard.md, s52)."""
    try:
        with cpuinfo.open(encoding="utf-8") as f:  # the first processor's "key: value" lines, up to a blank one
            fields = {key.strip(): value.strip() for key, _, value in
                      (line.partition(":") for line in itertools.takewhile(str.strip, f))}
    except OSError:
        return ""
    kind = ", ".join(f"{key} {fields[key]}" for key in ("cpu family", "model", "stepping") if key in fields)
    name = fields.get("model name", "")
    return f"{name} ({kind})" if name and kind else name


def save_plot(fig, name: str, dpi: int = 110) -> Path:
    """Save a matplotlib figure as ``bench/results/<name>.png`` in a 256-colour palette: a plot has few colours, and
    its palette PNG is a third of the RGBA one's size (the tracked tree must fit the GPU machine's 64 MiB transfer)."""
    from PIL import Image  # matplotlib's own dependency

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi)
    buffer.seek(0)
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.png"
    Image.open(buffer).convert("RGB").quantize(256).save(path, optimize=True)
    return path


def save(name: str, payload: dict) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps({"environment": environment(), **payload}, indent=2, default=str) + "\n")
    return path


def table(rows: list[dict], columns: list[str]) -> str:
    """A markdown table, for the terminal and for notes."""
    def fmt(v):
        return f"{v:.3g}" if isinstance(v, float) else str(v)
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(fmt(r.get(c, "")) for c in columns) + " |" for r in rows]
    return "\n".join(lines)
