"""``FakeEngine``: a deterministic, dependency-free engine that satisfies ``EngineClient``.

Used by the gateway's tests, the e2e tests and demos without weights. Its "model":

* tokenizer: one token per whitespace-separated word; ``<s>`` (BOS) is prepended by ``encode``;
  ``</s>`` in a prompt is the EOS token; role markers ``<|user|>`` etc. come from the chat template.
* greedy decoding (temperature 0) echoes the prompt's content words cyclically; reaching an
  echoed ``</s>`` ends the request with ``stop`` (unless ``ignore_eos``).
* temperature > 0 samples from a fixed word list with ``random.Random(seed)``, so seeds reproduce.
* speculation is simulated: each round drafts ``k`` tokens, accepts a deterministic number of them
  and emits accepted + 1 tokens in one delta, filling ``SpecStats`` like the real engine.

Resources are modelled strictly: a request holds one KV slot from admission until it finishes or
``abort()`` is called. A consumer that drops the stream without ``abort()`` leaks its slot, as a
real engine would keep decoding, so tests can assert that ``kv_used_slots`` returns to 0.

Also here: ``RedisServer``, a private redis-server process for tests (start / stop / restart).
"""

from __future__ import annotations

import asyncio
import random
import socket
import subprocess
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from engine.errors import (
    ContextLengthExceededError,
    EngineDeadError,
    EngineNotReadyError,
    InvalidRequestError,
    QueueFullError,
)
from engine.types import EngineHealth, RequestOutput, SamplingParams, SpecStats, TokenLogprob
from policies.settings import PolicySettingsError

SPECIAL_TOKENS = ("<pad>", "<s>", "</s>", "<|system|>", "<|user|>", "<|assistant|>", "<|developer|>", "<|tool|>")
BOS, EOS = 1, 2
ROLE_TOKENS = {"system": 3, "user": 4, "assistant": 5, "developer": 6, "tool": 7}
NUM_SPECIAL = len(SPECIAL_TOKENS)
SAMPLE_WORDS = (
    "alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliett", "kilo", "lima",
    "mike", "november", "oscar", "papa", "quebec", "romeo", "sierra", "tango", "uniform", "victor", "whiskey",
    "xray", "yankee", "zulu",
)
POLICY_FIELDS: dict[str, type] = {"mode": str, "k": int, "k_max": int, "ewma_weight": float}  # a subset of the real
POLICY_MODES = ("auto", "off", "draft", "ngram")


@dataclass(eq=False)
class _FakeRequest:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    holds_slot: bool = False
    waiting: bool = False
    aborted: bool = False
    admitted: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass
class _Decode:
    """Per-request decoding state of the fake model."""

    echo: list[int]
    rng: random.Random
    output_ids: list[int] = field(default_factory=list)
    text: str = ""
    text_sent: str = ""
    spec: SpecStats = field(default_factory=SpecStats)
    num_rounds: int = 0


class FakeEngine:
    def __init__(
        self,
        *,
        model_name: str = "specserve-tiny",
        max_model_len: int = 256,
        vocab_size: int = 32000,
        max_running: int = 8,
        max_waiting: int = 16,
        token_delay_s: float = 0.0,
        prefill_delay_s: float = 0.0,
        spec_k: int = 4,
        ready: bool = True,
    ) -> None:
        self.model_name = model_name
        self.max_model_len = max_model_len
        self.vocab_size = vocab_size
        self.max_running = max_running
        self.max_waiting = max_waiting
        self.token_delay_s = token_delay_s
        self.prefill_delay_s = prefill_delay_s
        self.ready = ready
        self.loop_alive = True
        self.fail_on_start: Exception | None = None  # raised by generate() before the first item
        self.fail_after_outputs: int | None = None  # raise EngineDeadError after this many outputs
        self.num_running = 0
        self.num_waiting = 0
        self.kv_used_slots = 0
        self.submitted: list[tuple[str, list[int], SamplingParams]] = []
        self.aborted: list[str] = []
        self.policy: dict = {"mode": "auto", "k": spec_k, "k_max": 8, "ewma_weight": 0.3}
        self.num_drafts = 0
        self.num_draft_tokens = 0
        self.num_accepted_tokens = 0
        self.accepted_per_pos = [0] * 8
        self._requests: dict[str, _FakeRequest] = {}
        self._waiters: list[_FakeRequest] = []
        self._words = list(SPECIAL_TOKENS)
        self._ids = {w: i for i, w in enumerate(self._words)}
        for word in SAMPLE_WORDS:
            self._token_id(word)

    # -- tokenizer -------------------------------------------------------------------------------
    def _token_id(self, word: str) -> int:
        if word not in self._ids:
            self._ids[word] = len(self._words)
            self._words.append(word)
        return self._ids[word]

    def _word(self, token_id: int) -> str:
        return self._words[token_id] if token_id < len(self._words) else f"tok{token_id}"

    def encode(self, prompt: str) -> list[int]:
        return [BOS] + [self._token_id(w) for w in prompt.split()]

    def apply_chat_template(self, messages: list[dict]) -> list[int]:
        if not messages:
            raise InvalidRequestError("messages must contain at least one message", param="messages")
        ids = [BOS]
        for i, message in enumerate(messages):
            role, content = message.get("role"), message.get("content")
            if role not in ROLE_TOKENS:
                raise InvalidRequestError(f"messages[{i}].role {role!r} is not supported", param=f"messages[{i}].role")
            if not isinstance(content, str):
                raise InvalidRequestError(f"messages[{i}].content must be text", param=f"messages[{i}].content")
            ids += [ROLE_TOKENS[role]] + [self._token_id(w) for w in content.split()]
        return ids + [ROLE_TOKENS["assistant"]]

    def decode(self, token_ids: list[int]) -> str:
        return " ".join(self._word(t) for t in token_ids if t not in (0, BOS, EOS))

    # -- requests --------------------------------------------------------------------------------
    async def generate(
        self, request_id: str, prompt_token_ids: list[int], params: SamplingParams
    ) -> AsyncIterator[RequestOutput]:
        self._check_request(request_id, prompt_token_ids, params)
        request = _FakeRequest(request_id, list(prompt_token_ids), params)
        self._requests[request_id] = request
        self.submitted.append((request_id, list(prompt_token_ids), params))
        try:
            await self._admit(request)
            async for output in self._decode(request):
                yield output
        finally:
            if request.waiting:
                self._waiters.remove(request)
                request.waiting = False
                self.num_waiting -= 1
            self._requests.pop(request_id, None)

    def _check_request(self, request_id: str, prompt: list[int], params: SamplingParams) -> None:
        if self.fail_on_start is not None:
            raise self.fail_on_start
        if not self.loop_alive:
            raise EngineDeadError("engine loop is dead")
        if not self.ready:
            raise EngineNotReadyError("engine is not ready")
        if request_id in self._requests:
            raise InvalidRequestError(f"duplicate request id {request_id!r}")
        if not prompt:
            raise InvalidRequestError("prompt must not be empty", param="prompt")
        if any(not 0 <= t < self.vocab_size for t in prompt):
            raise InvalidRequestError(f"token ids must be in [0, {self.vocab_size})", param="prompt")
        if len(prompt) + params.max_tokens > self.max_model_len:
            raise ContextLengthExceededError(
                f"{len(prompt)} prompt + {params.max_tokens} completion tokens exceed {self.max_model_len}"
            )

    async def _admit(self, request: _FakeRequest) -> None:
        if self.num_running < self.max_running and not self._waiters:
            self._take_slot(request)
            return
        if self.num_waiting >= self.max_waiting:
            raise QueueFullError(f"waiting queue is full ({self.max_waiting} requests)")
        request.waiting = True
        self.num_waiting += 1
        self._waiters.append(request)
        await request.admitted.wait()

    def _take_slot(self, request: _FakeRequest) -> None:
        request.holds_slot = True
        self.num_running += 1
        self.kv_used_slots += 1
        request.admitted.set()

    def _release_slot(self, request: _FakeRequest) -> None:
        if not request.holds_slot:
            return
        request.holds_slot = False
        self.num_running -= 1
        self.kv_used_slots -= 1
        if self._waiters and self.num_running < self.max_running:
            nxt = self._waiters.pop(0)
            nxt.waiting = False
            self.num_waiting -= 1
            self._take_slot(nxt)

    async def abort(self, request_id: str) -> None:
        request = self._requests.get(request_id)
        if request is None:
            return
        self.aborted.append(request_id)
        request.aborted = True
        if request.waiting:
            self._waiters.remove(request)
            request.waiting = False
            self.num_waiting -= 1
        self._release_slot(request)
        request.admitted.set()  # wakes a waiting request, which then finishes as aborted

    # -- the "model" -----------------------------------------------------------------------------
    async def _decode(self, request: _FakeRequest) -> AsyncIterator[RequestOutput]:
        params = request.params
        state = _Decode(
            echo=[t for t in request.prompt_token_ids if t == EOS or t >= NUM_SPECIAL],
            rng=random.Random(params.seed) if params.seed is not None else random.Random(),
        )
        if self.prefill_delay_s:
            await asyncio.sleep(self.prefill_delay_s)
        num_outputs = 0
        while True:
            if request.aborted or not self.loop_alive:
                if not self.loop_alive:
                    raise EngineDeadError("engine loop died")
                yield self._output(request, state, [], "abort", [])
                return
            new_ids, finish = self._step(request, state)
            num_outputs += 1
            if self.fail_after_outputs is not None and num_outputs > self.fail_after_outputs:
                self._release_slot(request)
                raise EngineDeadError("engine loop died (injected)")
            logprobs = self._logprobs(new_ids, len(state.output_ids) - len(new_ids), params)
            yield self._output(request, state, new_ids, finish, logprobs)
            if finish is not None:
                self._release_slot(request)
                return
            if self.token_delay_s:
                await asyncio.sleep(self.token_delay_s * max(1, len(new_ids)))

    def _round_size(self, request: _FakeRequest, state: _Decode) -> int:
        """Tokens this step emits; records the simulated speculation round in ``state.spec``."""
        override = request.params.speculation
        mode = override.mode if override is not None and override.mode != "auto" else self.policy["mode"]
        k = int(self.policy["k"])
        if override is not None and override.max_k is not None:
            k = min(k, override.max_k)
        if mode == "off" or k == 0:
            state.spec.num_plain_steps += 1
            return 1
        proposer = "ngram" if mode == "ngram" else "draft"
        num_accepted = (state.num_rounds * 3 + len(request.prompt_token_ids)) % (k + 1)
        state.num_rounds += 1
        state.spec.add(proposer, k, num_accepted)
        self.num_drafts += 1
        self.num_draft_tokens += k
        self.num_accepted_tokens += num_accepted
        if len(self.accepted_per_pos) < k:
            self.accepted_per_pos.extend([0] * (k - len(self.accepted_per_pos)))
        for pos in range(num_accepted):
            self.accepted_per_pos[pos] += 1
        return num_accepted + 1

    def _step(self, request: _FakeRequest, state: _Decode) -> tuple[list[int], str | None]:
        params = request.params
        new_ids: list[int] = []
        for _ in range(self._round_size(request, state)):
            token = self._next_token(state, params)
            if token == EOS and not params.ignore_eos:
                return new_ids, "stop"
            state.output_ids.append(token)
            new_ids.append(token)
            state.text = self.decode(state.output_ids)
            for stop in params.stop:
                cut = state.text.find(stop, max(0, len(state.text_sent) - len(stop)))
                if cut >= 0:
                    state.text = state.text[:cut]
                    return new_ids, "stop"
            if len(state.output_ids) >= params.max_tokens:
                return new_ids, "length"
        return new_ids, None

    def _next_token(self, state: _Decode, params: SamplingParams) -> int:
        if params.temperature > 0:
            return self._ids[state.rng.choice(SAMPLE_WORDS)]
        if not state.echo:
            return EOS
        return state.echo[len(state.output_ids) % len(state.echo)]

    def _logprobs(self, new_ids: list[int], start: int, params: SamplingParams) -> list[TokenLogprob] | None:
        if params.logprobs is None:
            return None
        result = []
        for i, token_id in enumerate(new_ids):
            text = self._token_text(token_id, first=start + i == 0)
            logprob = -0.25 * ((start + i) % 4) - 0.01
            alternatives = [(token_id, text, logprob)]
            for j in range(1, params.logprobs):
                alt = NUM_SPECIAL + (token_id + j) % len(SAMPLE_WORDS)
                alternatives.append((alt, self._token_text(alt, first=start + i == 0), logprob - 1.0 - j))
            result.append(TokenLogprob(token_id, text, logprob, tuple(alternatives[: params.logprobs])))
        return result

    def _token_text(self, token_id: int, *, first: bool) -> str:
        word = "" if token_id == EOS else self._word(token_id)
        return word if first else " " + word

    def _output(
        self, request: _FakeRequest, state: _Decode, new_ids: list[int], finish: str | None, logprobs: list | None
    ) -> RequestOutput:
        delta = state.text[len(state.text_sent):]
        state.text_sent = state.text
        return RequestOutput(
            request_id=request.request_id,
            new_token_ids=new_ids,
            new_text=delta,
            num_prompt_tokens=len(request.prompt_token_ids),
            num_output_tokens=len(state.output_ids),
            finished=finish is not None,
            finish_reason=finish,  # type: ignore[arg-type]
            logprobs=logprobs,
            spec=state.spec if finish is not None else None,
        )

    # -- health, stats, policy -------------------------------------------------------------------
    def health(self) -> EngineHealth:
        return EngineHealth(
            ready=self.ready,
            loop_alive=self.loop_alive,
            num_running=self.num_running,
            num_waiting=self.num_waiting,
            kv_used_blocks=self.kv_used_slots,
            kv_total_blocks=self.max_running,
        )

    def stats(self) -> dict:
        return {
            "num_running": self.num_running,
            "num_waiting": self.num_waiting,
            "kv_used_blocks": self.kv_used_slots,
            "kv_total_blocks": self.max_running,
            "spec_decode_num_drafts": self.num_drafts,
            "spec_decode_num_draft_tokens": self.num_draft_tokens,
            "spec_decode_num_accepted_tokens": self.num_accepted_tokens,
            "spec_decode_num_accepted_tokens_per_pos": list(self.accepted_per_pos),
            "policy": {"mode": self.policy["mode"], "k": self.policy["k"], "num_rounds": self.num_drafts,
                       "cost_model": {"prediction_audit": {
                           "plain": [{"batch_sizes": [5, 8], "measured_over_predicted": 1.0, "steps": 40}],
                           "verify": [{"batch_sizes": [5, 8], "measured_over_predicted": 1.12, "steps": 30}],
                           "draft": []}},
                       "chosen_k": {"plain_by_cause": {"capped": self.num_drafts, "plan": 3}}},
        }

    def policy_settings(self) -> dict:
        return dict(self.policy)

    def update_policy(self, changes: dict) -> dict:
        """PATCH, validated like ``policies.settings.PolicySettings``: errors start with the field name."""
        updated = dict(self.policy)
        for name, value in changes.items():
            kind = POLICY_FIELDS.get(name)
            if kind is None:
                raise PolicySettingsError(f"{name}: unknown setting (known: {', '.join(sorted(POLICY_FIELDS))})")
            if kind is float and isinstance(value, int) and not isinstance(value, bool):
                value = float(value)
            if not isinstance(value, kind) or isinstance(value, bool):
                raise PolicySettingsError(f"{name}: must be {kind.__name__}; got {value!r}")
            updated[name] = value
        if updated["mode"] not in POLICY_MODES:
            raise PolicySettingsError(f"mode: must be one of {', '.join(POLICY_MODES)}; got {updated['mode']!r}")
        if not 1 <= updated["k_max"] <= 16:
            raise PolicySettingsError(f"k_max: must be in 1..16; got {updated['k_max']}")
        if not 1 <= updated["k"] <= updated["k_max"]:
            raise PolicySettingsError(f"k: must be in 1..k_max ({updated['k_max']}); got {updated['k']}")
        if not 0.0 < updated["ewma_weight"] <= 1.0:
            raise PolicySettingsError(f"ewma_weight: must be in (0, 1]; got {updated['ewma_weight']}")
        self.policy = updated
        return dict(updated)

    def kill(self) -> None:
        """Simulate the engine loop dying: running requests fail with EngineDeadError."""
        self.loop_alive = False


class RedisServer:
    """A private ``redis-server`` on a free local port, for tests: start, stop (to simulate an outage), restart."""

    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()
        self._process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 5.0) -> RedisServer:
        self._process = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as sock:
                    sock.sendall(b"PING\r\n")
                    if sock.recv(16).startswith(b"+PONG"):
                        return self
            except OSError:
                time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"redis-server did not start on port {self.port}")

    def stop(self) -> None:
        if self._process is not None:
            self._process.terminate()
            self._process.wait(timeout=5)
            self._process = None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
