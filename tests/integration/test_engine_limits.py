"""LLMEngine on the bundled pair: request limits, finish reasons, the sequence-length guard, KV hygiene.

The bundled weights may be placeholders, so nothing here depends on what the models say: expected
outputs are always taken from a reference run of the same engine.
"""

from __future__ import annotations

import itertools

import pytest

from engine.config import EngineConfig
from engine.engine import LLMEngine
from engine.errors import ContextLengthExceededError, InvalidRequestError, QueueFullError
from engine.types import RequestOutput, SamplingParams, SpeculationOverride
from tests.conftest import DRAFT, TARGET

MAX_SEQ_LEN = 256
PROMPT = "def fibonacci(n):\n    if n < 2:\n        return n\n"
_ids = itertools.count()


def config(**overrides) -> EngineConfig:
    base = dict(model=str(TARGET), draft_model=str(DRAFT), device="cpu", dtype="float32", max_seq_len=MAX_SEQ_LEN,
                max_running=8, speculation="draft", k=4, k_max=8)
    base.update(overrides)
    return EngineConfig(**base)


@pytest.fixture(scope="module")
def engine() -> LLMEngine:
    return LLMEngine(config())


@pytest.fixture(autouse=True)
def no_leaks(request):
    """Every test leaves the shared engine idle with both KV caches empty."""
    yield
    if "engine" not in request.fixturenames:
        return
    eng: LLMEngine = request.getfixturevalue("engine")
    leftover = list(eng.requests)
    for rid in leftover:
        eng.abort(rid)
    assert not leftover, f"requests left behind: {leftover}"
    assert_caches_empty(eng)


def assert_caches_empty(eng: LLMEngine) -> None:
    assert eng.runner.cache.num_used_blocks == 0 and eng.runner.cache.num_requests == 0
    if "draft" in eng.proposers:
        draft_cache = eng.proposers["draft"].cache
        assert draft_cache.num_used_blocks == 0 and draft_cache.num_requests == 0
    assert not eng.has_work()


def new_id() -> str:
    return f"req-{next(_ids)}"


def run(eng: LLMEngine, max_steps: int = 2000) -> dict[str, list[RequestOutput]]:
    outputs: dict[str, list[RequestOutput]] = {}
    for _ in range(max_steps):
        if not eng.has_work():
            break
        for out in eng.step():
            outputs.setdefault(out.request_id, []).append(out)
    assert not eng.has_work(), "the engine did not finish"
    return outputs


def generate(eng: LLMEngine, prompt_ids: list[int], params: SamplingParams) -> tuple[list[int], str, RequestOutput]:
    rid = new_id()
    eng.add_request(rid, prompt_ids, params)
    outs = run(eng)[rid]
    assert outs[-1].finished and all(not o.finished for o in outs[:-1])
    return [t for o in outs for t in o.new_token_ids], "".join(o.new_text for o in outs), outs[-1]


def prompt_ids(eng: LLMEngine, text: str = PROMPT) -> list[int]:
    return eng.tokenizer.encode(text)


def greedy(**kwargs) -> SamplingParams:
    return SamplingParams(temperature=0.0, **kwargs)


# ---------------------------------------------------------------- rejected requests


def test_prompt_longer_than_the_context(engine):
    with pytest.raises(ContextLengthExceededError) as info:
        engine.add_request(new_id(), [10] * (MAX_SEQ_LEN + 1), greedy(max_tokens=1))
    assert "maximum context length is 256 tokens" in info.value.message
    assert info.value.param is not None
    with pytest.raises(ContextLengthExceededError) as info:  # prompt + max_tokens is what counts
        engine.add_request(new_id(), [10] * 250, greedy(max_tokens=7))
    assert "maximum context length" in info.value.message and "257 tokens" in info.value.message
    assert isinstance(info.value, InvalidRequestError)  # a 400 for the gateway
    assert not engine.requests


@pytest.mark.parametrize("ids", [[], [-1, 5], [5, 4096], [5, 10**9]])
def test_bad_token_ids(engine, ids):
    with pytest.raises(InvalidRequestError) as info:
        engine.add_request(new_id(), ids, greedy(max_tokens=4))
    assert info.value.param == "prompt"
    assert not engine.requests


def test_duplicate_request_id(engine):
    rid = new_id()
    engine.add_request(rid, prompt_ids(engine), greedy(max_tokens=2))
    with pytest.raises(InvalidRequestError) as info:
        engine.add_request(rid, prompt_ids(engine), greedy(max_tokens=2))
    assert info.value.param == "request_id"
    run(engine)


def test_queue_full():
    eng = LLMEngine(config(draft_model=None, max_waiting=2, speculation="off", max_seq_len=64, max_running=2))
    ids = prompt_ids(eng)
    eng.add_request("a", ids, greedy(max_tokens=2))
    eng.add_request("b", ids, greedy(max_tokens=2))
    for rid in ("c", "d"):
        with pytest.raises(QueueFullError, match="queue is full"):
            eng.add_request(rid, ids, greedy(max_tokens=2))
    eng.step()  # both are admitted: the queue has room again
    eng.add_request("c", ids, greedy(max_tokens=2))
    outputs = run(eng)
    assert {rid for rid, outs in outputs.items() if outs[-1].finished} == {"a", "b", "c"}
    assert_caches_empty(eng)


# ---------------------------------------------------------------- finish reasons


def test_max_tokens_gives_length(engine):
    tokens, text, final = generate(engine, prompt_ids(engine), greedy(max_tokens=5, ignore_eos=True))
    assert len(tokens) == 5 and final.num_output_tokens == 5
    assert final.finish_reason == "length" and final.num_prompt_tokens == len(prompt_ids(engine))
    assert text == engine.tokenizer.decode(tokens, skip_special_tokens=True)


@pytest.fixture(scope="module")
def reference(engine) -> tuple[list[int], str]:
    """What the engine says, greedily and ignoring EOS, for PROMPT: (tokens, text)."""
    tokens, text, final = generate(engine, prompt_ids(engine), greedy(max_tokens=12, ignore_eos=True))
    assert final.finish_reason == "length"
    return tokens, text


def test_stop_token_ids_give_stop(engine, reference):
    tokens_ref, _ = reference
    stop_token = tokens_ref[3]
    first = tokens_ref.index(stop_token)
    params = greedy(max_tokens=12, ignore_eos=True, stop_token_ids=(stop_token,))
    tokens, _, final = generate(engine, prompt_ids(engine), params)
    assert final.finish_reason == "stop"
    assert tokens == tokens_ref[: first + 1]  # the stop token itself is reported, nothing after it


def test_stop_string_gives_stop_and_cuts_the_text(engine, reference):
    tokens_ref, text_ref = reference
    assert len(text_ref) >= 6, f"need some text to pick a stop string from: {text_ref!r}"
    stop = text_ref[3:6]
    tokens, text, final = generate(engine, prompt_ids(engine), greedy(max_tokens=12, ignore_eos=True, stop=(stop,)))
    assert final.finish_reason == "stop"
    assert text == text_ref[: text_ref.index(stop)]
    assert tokens == tokens_ref[: len(tokens)] and len(tokens) < 12


def test_eos_stops_unless_ignore_eos(engine, reference, monkeypatch):
    tokens_ref, _ = reference
    monkeypatch.setattr(engine, "eos_ids", engine.eos_ids | {tokens_ref[4]})
    first_eos = next(i for i, t in enumerate(tokens_ref) if t in engine.eos_ids)  # <= 4
    tokens, _, final = generate(engine, prompt_ids(engine), greedy(max_tokens=12))
    assert final.finish_reason == "stop" and tokens == tokens_ref[: first_eos + 1]
    tokens, _, final = generate(engine, prompt_ids(engine), greedy(max_tokens=12, ignore_eos=True))
    assert final.finish_reason == "length" and tokens == tokens_ref


def test_logprobs_are_reported_per_token(engine):
    rid = new_id()
    engine.add_request(rid, prompt_ids(engine), greedy(max_tokens=6, ignore_eos=True, logprobs=2))
    outs = run(engine)[rid]
    for out in outs:
        assert out.logprobs is not None and len(out.logprobs) == len(out.new_token_ids)
        for lp, tok in zip(out.logprobs, out.new_token_ids):
            assert lp.token_id == tok and lp.logprob <= 0.0 and len(lp.top) == 2
            assert lp.top[0][2] >= lp.top[1][2]
            assert lp.logprob == pytest.approx(lp.top[0][2], abs=1e-4)  # greedy: the chosen token is the top one


# ---------------------------------------------------------------- the sequence-length guard


def watch_reserves(monkeypatch, cache, limit: int, seen: list[int]) -> None:
    original = cache.reserve

    def reserve(request_id: str, new_len: int) -> None:
        seen.append(new_len)
        assert new_len <= limit, f"reserved {new_len} positions, past max_seq_len {limit}"
        original(request_id, new_len)

    monkeypatch.setattr(cache, "reserve", reserve)


def test_request_near_max_seq_len_never_overflows(engine, monkeypatch):
    eng = engine
    eng.policy.update({"mode": "draft", "k": 8})  # draft as much as allowed
    max_tokens = 8
    ids = (prompt_ids(eng) * 40)[: MAX_SEQ_LEN - max_tokens]
    reserved: list[int] = []
    watch_reserves(monkeypatch, eng.runner.cache, MAX_SEQ_LEN, reserved)
    watch_reserves(monkeypatch, eng.proposers["draft"].cache, MAX_SEQ_LEN, reserved)
    planned: list[tuple[int, int]] = []  # (k, remaining tokens) of every speculation round
    proposer = eng.proposers["draft"]
    original_propose = proposer.propose

    def propose(requests, ks):
        planned.extend((k, r.remaining_tokens) for r, k in zip(requests, ks))
        return original_propose(requests, ks)

    monkeypatch.setattr(proposer, "propose", propose)
    try:
        tokens, _, final = generate(eng, ids, greedy(max_tokens=max_tokens, ignore_eos=True))
    finally:
        eng.policy.update({"mode": "draft", "k": 4})
        eng.policy.apply_pending()
    assert final.finish_reason == "length" and len(tokens) == max_tokens
    assert len(ids) + len(tokens) == MAX_SEQ_LEN and max(reserved) <= MAX_SEQ_LEN
    assert planned, "speculation never ran"
    assert all(1 <= k <= remaining - 1 for k, remaining in planned)  # k shrinks as the end approaches
    assert_caches_empty(eng)


# ---------------------------------------------------------------- KV hygiene


def test_abort_frees_both_caches_at_once(engine):
    ids = prompt_ids(engine)
    a, b = new_id(), new_id()
    engine.add_request(a, ids, greedy(max_tokens=80, ignore_eos=True))
    engine.add_request(b, ids, SamplingParams(temperature=0.8, seed=1, max_tokens=80, ignore_eos=True))
    for _ in range(3):
        engine.step()
    draft_cache = engine.proposers["draft"].cache
    assert engine.runner.cache.num_used_blocks > 0 and draft_cache.num_used_blocks > 0
    out = engine.abort(a)
    assert out is not None and out.finished and out.finish_reason == "abort" and out.request_id == a
    assert a not in engine.runner.cache and a not in draft_cache and a not in engine.requests
    out = engine.abort(b)
    assert out is not None and out.finish_reason == "abort"
    assert engine.runner.cache.num_used_blocks == 0 and draft_cache.num_used_blocks == 0
    assert engine.abort(a) is None and engine.abort("never-added") is None
    assert engine.step() == []


def test_abort_of_a_waiting_request(engine):
    rid = new_id()
    engine.add_request(rid, prompt_ids(engine), greedy(max_tokens=4))
    out = engine.abort(rid)
    assert out is not None and out.finish_reason == "abort" and out.num_output_tokens == 0
    assert not engine.has_work()


def test_mixed_workload_finishes_and_frees_everything(engine):
    ids = prompt_ids(engine)
    params = [
        greedy(max_tokens=8, ignore_eos=True),
        SamplingParams(temperature=0.8, top_p=0.9, seed=3, max_tokens=8),
        SamplingParams(temperature=1.0, top_k=20, min_p=0.05, seed=4, max_tokens=8, presence_penalty=0.5,
                       frequency_penalty=0.5),
        greedy(max_tokens=8, frequency_penalty=1.0, speculation=SpeculationOverride(mode="ngram")),
        greedy(max_tokens=8, speculation=SpeculationOverride(mode="off")),
        SamplingParams(temperature=0.7, seed=5, max_tokens=8, logprobs=3,
                       speculation=SpeculationOverride(mode="draft", max_k=2)),
        greedy(max_tokens=1),
    ]
    rids = []
    for i, p in enumerate(params):
        rid = new_id()
        rids.append(rid)
        engine.add_request(rid, ids[: 5 + 3 * i] if i % 2 else ids, p)
    outputs = run(engine)
    for rid, p in zip(rids, params):
        final = outputs[rid][-1]
        assert final.finished and final.finish_reason in ("stop", "length")
        n = sum(len(o.new_token_ids) for o in outputs[rid])
        assert n == final.num_output_tokens <= p.max_tokens
    assert_caches_empty(engine)


def test_preemption_under_kv_pressure_still_completes():
    """Two requests need more KV than exists: one is preempted, recomputed, and both finish correctly."""
    eng = LLMEngine(config(draft_model=None, speculation="off", max_running=2, max_seq_len=40, num_kv_blocks=5,
                           block_size=8))
    ids = prompt_ids(eng)
    params = greedy(max_tokens=14, ignore_eos=True)  # 20-odd tokens: 3 of the 5 blocks each
    alone = [generate(eng, ids[: 6 + i], params)[0] for i in range(2)]
    requests = [eng.add_request(f"p{i}", ids[: 6 + i], params) for i in range(2)]
    outputs = run(eng)
    assert sum(r.num_preemptions for r in requests) > 0
    for i in range(2):
        assert [t for o in outputs[f"p{i}"] for t in o.new_token_ids] == alone[i]
    assert_caches_empty(eng)


def test_speculation_under_kv_pressure_never_over_reserves():
    """Drafts of several requests compete for the last free blocks: each plan must see the others' reservations."""
    eng = LLMEngine(config(max_running=2, max_seq_len=32, num_kv_blocks=8, block_size=4, k=4))
    ids = prompt_ids(eng)
    requests = [eng.add_request(f"s{i}", ids[: 5 + i], greedy(max_tokens=20, ignore_eos=True)) for i in range(2)]
    outputs = run(eng)  # raised OutOfCapacityError from the draft reservation before the fix
    for r in requests:
        final = outputs[r.request_id][-1]
        assert final.finish_reason == "length" and final.num_output_tokens == 20
        assert sum(len(o.new_token_ids) for o in outputs[r.request_id]) == 20
    assert sum(r.spec.rounds for r in requests) > 0 and sum(r.num_preemptions for r in requests) > 0
    assert_caches_empty(eng)
