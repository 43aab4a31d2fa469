"""Sampling exactness: speculative sampling draws from the same distribution as plain sampling.

Thousands of independent draws of the first generated tokens, plain vs each proposer, compared with
two-sample chi-square tests (T=0.7 and T=1.0, top-p 0.9) on the second and third tokens, which come
from a verification round with k = 2 (max_tokens=4). The draft is tested on a prompt where draft and
target disagree most (total variation 0.65 at the first position), so a biased acceptance rule shows;
the n-gram proposer on a prompt that repeats itself, so it has something to propose.
"""

from __future__ import annotations

from collections import Counter

import pytest
from scipy.stats import chi2_contingency

from engine.config import EngineConfig
from engine.engine import LLMEngine
from engine.types import SamplingParams
from tests.conftest import DEVICES, DRAFT, TARGET

DRAWS = 1200
PROMPTS = {"draft": "import", "ngram": "x = 1\ny = 2\nx = 1\ny = 2\nx = 1\ny ="}


@pytest.fixture(scope="module", params=DEVICES)
def engine(request) -> LLMEngine:
    return LLMEngine(EngineConfig(model=str(TARGET), draft_model=str(DRAFT), dtype="float32", device=request.param,
                                  max_seq_len=64, max_running=256, max_waiting=DRAWS,
                                  max_num_batched_tokens=4096, speculation="off"))


def draw(engine: LLMEngine, mode: str, prompt: str, temperature: float, seed_base: int,
         stop_confidence: float = 0.0) -> tuple[list, int]:
    engine.policy.update({"mode": mode, "k": 2, "draft_stop_confidence": stop_confidence})
    engine.policy.apply_pending()
    ids = engine.tokenizer.encode(prompt)
    params = [SamplingParams(max_tokens=4, temperature=temperature, top_p=0.9, seed=seed_base + i, ignore_eos=True)
              for i in range(DRAWS)]
    for i, p in enumerate(params):
        engine.add_request(f"{mode}-{i}", ids, p)
    tokens: dict[str, list[int]] = {}
    drafted = 0
    while engine.has_work():
        for out in engine.step():
            tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
            if out.finished:
                drafted += out.spec.num_draft_tokens
    return [t[:3] for t in tokens.values()], drafted


def two_sample_pvalue(a: Counter, b: Counter) -> float:
    """Chi-square on the contingency table; categories too rare to test are pooled into one."""
    common = [k for k in set(a) | set(b) if a[k] + b[k] >= 10]
    rows = [[a[k] for k in common], [b[k] for k in common]]
    rows[0].append(sum(a.values()) - sum(rows[0]))
    rows[1].append(sum(b.values()) - sum(rows[1]))
    if rows[0][-1] + rows[1][-1] == 0:
        rows = [r[:-1] for r in rows]
    return chi2_contingency(rows).pvalue


@pytest.mark.slow
@pytest.mark.parametrize("temperature", [0.7, 1.0])
@pytest.mark.parametrize("mode", ["draft", "ngram"])
def test_speculative_sampling_matches_plain(engine, temperature, mode):
    plain, _ = draw(engine, "off", PROMPTS[mode], temperature, seed_base=0)
    spec, drafted = draw(engine, mode, PROMPTS[mode], temperature, seed_base=100_000)
    assert drafted > DRAWS // 4, f"{mode} barely speculated ({drafted} draft tokens)"
    for position in (1, 2):  # tokens from the verification round (position 0 comes from prefill)
        pvalue = two_sample_pvalue(Counter(t[position] for t in plain), Counter(t[position] for t in spec))
        assert pvalue > 1e-3, f"{mode} at T={temperature}: token {position} differs from plain sampling"


@pytest.mark.slow
def test_draft_rounds_stopped_by_confidence_match_plain(engine):
    """The draft ends a round after a token it gave < 0.5: round lengths then depend on the draft's samples,
    which must not bias the output (the stop looks at the draft's own outputs only)."""
    plain, _ = draw(engine, "off", PROMPTS["draft"], 1.0, seed_base=0)
    spec, drafted = draw(engine, "draft", PROMPTS["draft"], 1.0, seed_base=200_000, stop_confidence=0.5)
    assert drafted > DRAWS // 4, f"the draft barely speculated ({drafted} draft tokens)"
    for position in (1, 2):
        pvalue = two_sample_pvalue(Counter(t[position] for t in plain), Counter(t[position] for t in spec))
        assert pvalue > 1e-3, f"token {position} differs from plain sampling"
