"""Shared benchmark plumbing: run our engine and transformers on the same prompts, save JSON + PNG."""

from __future__ import annotations

import json
import platform
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from engine.config import EngineConfig
from engine.engine import LLMEngine
from engine.models.loader import DEFAULT_DRAFT, DEFAULT_TARGET
from engine.types import SamplingParams

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


def make_engine(dtype: str = "float32", device: str = "cpu", **overrides) -> LLMEngine:
    draft = overrides.pop("draft_model", DEFAULT_DRAFT)
    config = EngineConfig(model=str(overrides.pop("model", DEFAULT_TARGET)), draft_model=str(draft) if draft else None,
                          dtype=dtype, device=device, **overrides)
    engine = LLMEngine(config)
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
    limit = len(prompts) if max_in_flight is None else max(1, max_in_flight)
    queue = list(enumerate(prompts))
    tag = time.monotonic_ns()

    def submit(count: int) -> None:
        for _ in range(min(count, len(queue))):
            i, ids = queue.pop(0)
            engine.add_request(f"bench-{tag}-{i}", ids, params[i] if isinstance(params, list) else params)

    start = time.perf_counter()
    submit(limit)
    num_tokens = drafted = accepted = 0
    texts: dict[str, str] = {}
    first: dict[str, float] = {}
    tpots = []
    while engine.has_work():
        outputs = engine.step()
        now = time.perf_counter()
        for out in outputs:
            first.setdefault(out.request_id, now)
            texts[out.request_id] = texts.get(out.request_id, "") + out.new_text
            if out.finished:
                num_tokens += out.num_output_tokens
                drafted += out.spec.num_draft_tokens
                accepted += out.spec.num_accepted_tokens
                if out.num_output_tokens > 1:
                    tpots.append((now - first[out.request_id]) / (out.num_output_tokens - 1))
        submit(sum(out.finished for out in outputs))
    if engine.runner.cache.layers[0][0].is_cuda:
        torch.cuda.synchronize()
    return RunResult(time.perf_counter() - start, num_tokens, drafted, accepted, list(texts.values()),
                     statistics.mean(tpots) if tpots else 0.0)


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


def cpu_model() -> str:
    """The CPU's model name (``platform.processor()`` is empty on Linux): timings differ across hosts."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        return ""


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
