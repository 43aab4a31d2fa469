"""Sampler transforms on hand-built logits, penalties with drafts, logprobs, and SamplingParams validation."""

from __future__ import annotations

import math

import pytest
import torch

from engine.errors import InvalidRequestError
from engine.sampler import (
    apply_penalties,
    greedy_tokens,
    position_counts,
    processed_probs,
    sample_rows,
    token_logprobs,
    transform_key,
)
from engine.types import SamplingParams, SpeculationOverride

CPU = torch.device("cpu")
PROBS = [0.5, 0.25, 0.125, 0.0625, 0.0625]


def logits_of(probs: list[float]) -> torch.Tensor:
    """[1, vocab] logits whose softmax is exactly ``probs``."""
    return torch.tensor([probs]).log()


def probs_for(params: SamplingParams, probs: list[float] = PROBS) -> list[float]:
    return processed_probs(logits_of(probs), params, None)[0].tolist()


def assert_probs(got: list[float], expected: list[float]) -> None:
    assert got == pytest.approx(expected, abs=1e-6)


# ---------------------------------------------------------------- truncation


def test_no_truncation_is_plain_softmax():
    assert_probs(probs_for(SamplingParams()), PROBS)


def test_temperature_sharpens():
    expected = [p**2 for p in PROBS]  # temperature 0.5 squares the probabilities before renormalising
    assert_probs(probs_for(SamplingParams(temperature=0.5)), [p / sum(expected) for p in expected])


@pytest.mark.parametrize(("top_k", "expected"), [
    (1, [1, 0, 0, 0, 0]),
    (2, [2 / 3, 1 / 3, 0, 0, 0]),
    (3, [4 / 7, 2 / 7, 1 / 7, 0, 0]),
    (5, PROBS),
    (50, PROBS),  # top_k >= vocab disables it
])
def test_top_k(top_k, expected):
    assert_probs(probs_for(SamplingParams(top_k=top_k)), expected)


@pytest.mark.parametrize(("top_p", "expected"), [
    (0.4, [1, 0, 0, 0, 0]),  # the top token is always kept
    (0.6, [2 / 3, 1 / 3, 0, 0, 0]),  # 0.5 < 0.6: the second token is needed
    (0.8, [4 / 7, 2 / 7, 1 / 7, 0, 0]),
    (0.9, [0.5 / 0.9375, 0.25 / 0.9375, 0.125 / 0.9375, 0.0625 / 0.9375, 0]),
    (1.0, PROBS),
])
def test_top_p(top_p, expected):
    assert_probs(probs_for(SamplingParams(top_p=top_p)), expected)


@pytest.mark.parametrize(("min_p", "expected"), [
    (0.3, [2 / 3, 1 / 3, 0, 0, 0]),  # threshold 0.15
    (0.2, [4 / 7, 2 / 7, 1 / 7, 0, 0]),  # threshold 0.1
    (0.1, PROBS),  # threshold 0.05 keeps everything
    (1.0, [1, 0, 0, 0, 0]),
])
def test_min_p(min_p, expected):
    assert_probs(probs_for(SamplingParams(min_p=min_p)), expected)


def test_top_p_applies_to_the_top_k_distribution():
    # after top_k=3 the distribution is [4/7, 2/7, 1/7]; 4/7 < 0.6 so top_p keeps two tokens
    assert_probs(probs_for(SamplingParams(top_k=3, top_p=0.6)), [2 / 3, 1 / 3, 0, 0, 0])


def test_rows_are_processed_independently():
    logits = torch.cat([logits_of(PROBS), logits_of(list(reversed(PROBS)))])
    probs = processed_probs(logits, SamplingParams(top_k=2), None)
    assert_probs(probs[0].tolist(), [2 / 3, 1 / 3, 0, 0, 0])
    assert_probs(probs[1].tolist(), [0, 0, 0, 1 / 3, 2 / 3])


# ---------------------------------------------------------------- penalties


def test_position_counts_include_the_drafts_before_each_position():
    counts = position_counts([1, 1, 3], [2, 1], 5, CPU)
    assert counts.tolist() == [
        [0, 2, 0, 1, 0],
        [0, 2, 1, 1, 0],
        [0, 3, 1, 1, 0],
    ]
    assert position_counts([], [], 4, CPU).tolist() == [[0, 0, 0, 0]]
    assert position_counts([], [3, 3], 4, CPU).tolist() == [[0, 0, 0, 0], [0, 0, 0, 1], [0, 0, 0, 2]]


def test_penalties_follow_openai_semantics():
    logits = torch.zeros(1, 4)
    counts = torch.tensor([[0.0, 1.0, 3.0, 0.0]])
    params = SamplingParams(frequency_penalty=0.5, presence_penalty=0.25)
    # logit -= frequency * count + presence * (count > 0)
    assert apply_penalties(logits, params, counts).tolist() == [[0.0, -0.75, -1.75, 0.0]]
    negative = SamplingParams(frequency_penalty=-1.0)
    assert apply_penalties(logits, negative, counts).tolist() == [[0.0, 1.0, 3.0, 0.0]]
    assert apply_penalties(logits, SamplingParams(), counts) is logits  # no penalties: untouched
    assert apply_penalties(logits, params, None) is logits


def test_penalties_per_position_with_drafts():
    vocab = 5
    logits = torch.zeros(3, vocab)
    counts = position_counts([0], [2, 2], vocab, CPU)
    params = SamplingParams(frequency_penalty=1.0, presence_penalty=1.0)
    penalised = apply_penalties(logits, params, counts)
    assert penalised[:, 0].tolist() == [-2.0, -2.0, -2.0]
    assert penalised[:, 2].tolist() == [0.0, -2.0, -3.0]  # the drafted 2s count as if emitted
    probs = processed_probs(logits, params, counts)
    assert probs[0, 2] > probs[1, 2] > probs[2, 2]
    assert torch.allclose(probs.sum(dim=-1), torch.ones(3))


def test_greedy_tokens_see_penalties():
    logits = torch.tensor([[1.0, 0.9, 0.0], [1.0, 0.9, 0.0]])
    counts = position_counts([], [0], 3, CPU)  # position 1 follows a drafted token 0
    params = SamplingParams(temperature=0.0, presence_penalty=0.5)
    assert greedy_tokens(logits, params, counts).tolist() == [0, 1]
    assert greedy_tokens(logits, SamplingParams(temperature=0.0), None).tolist() == [0, 0]


def test_sample_rows_is_reproducible_with_a_seeded_generator():
    probs = torch.tensor([PROBS, PROBS])
    a = [sample_rows(probs, [torch.Generator().manual_seed(3), None])[0] for _ in range(5)]
    b = [sample_rows(probs, [torch.Generator().manual_seed(3), None])[0] for _ in range(5)]
    assert a == b
    assert sample_rows(torch.tensor([[0.0, 0.0, 1.0], [0.0, 1.0, 0.0]]), [None, None]) == [2, 1]


def test_sample_rows_follows_each_row_distribution():
    """Chi-square over 4000 draws of a batch whose rows differ: each row keeps its own distribution."""
    rows = torch.tensor([[0.5, 0.3, 0.2, 0.0], [0.1, 0.1, 0.1, 0.7]])
    counts = torch.zeros(2, 4)
    torch.manual_seed(0)
    for _ in range(4000):
        for row, token in enumerate(sample_rows(rows, [None, None])):
            counts[row, token] += 1
    for row in range(2):
        expected = rows[row] * 4000
        support = expected > 0
        assert counts[row, ~support].sum() == 0  # zero-probability tokens never drawn
        chi2 = float(((counts[row, support] - expected[support]) ** 2 / expected[support]).sum())
        assert chi2 < 16.3  # 3 degrees of freedom at most, p = 0.001


def test_transform_key_groups_rows_that_process_alike():
    base = SamplingParams(temperature=0.8, top_p=0.9)
    assert transform_key(base) == transform_key(SamplingParams(temperature=0.8, top_p=0.9, max_tokens=7))
    assert transform_key(base) != transform_key(SamplingParams(temperature=0.8))
    assert transform_key(SamplingParams(temperature=0.0)) is None  # greedy: argmax, no distribution
    assert transform_key(SamplingParams(temperature=0.8, presence_penalty=0.5)) is None  # per-request history


# ---------------------------------------------------------------- logprobs


class StubTokenizer:
    def decode(self, ids):
        return "".join(f"<{i}>" for i in ids)


def test_token_logprobs_values_and_shape():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0], [0.0, 0.0, 3.0, 0.0]])
    out = token_logprobs(logits, [1, 2], 3, StubTokenizer())
    logp = torch.log_softmax(logits, dim=-1)
    assert len(out) == 2
    assert [o.token_id for o in out] == [1, 2] and [o.token for o in out] == ["<1>", "<2>"]
    assert out[0].logprob == pytest.approx(logp[0, 1].item())
    assert out[1].logprob == pytest.approx(logp[1, 2].item())
    assert [t[0] for t in out[0].top] == [0, 1, 2]
    assert [t[1] for t in out[0].top] == ["<0>", "<1>", "<2>"]
    assert [t[2] for t in out[0].top] == pytest.approx(logp[0, :3].tolist())
    assert out[1].top[0][0] == 2 and len(out[1].top) == 3
    assert all(math.exp(o.logprob) <= 1.0 for o in out)


def test_token_logprobs_without_alternatives():
    out = token_logprobs(torch.zeros(1, 4), [3], 0, StubTokenizer())
    assert len(out) == 1 and out[0].top == () and out[0].logprob == pytest.approx(math.log(0.25))


# ---------------------------------------------------------------- validation


@pytest.mark.parametrize(("kwargs", "param"), [
    ({"temperature": -0.1}, "temperature"),
    ({"temperature": 2.5}, "temperature"),
    ({"temperature": float("nan")}, "temperature"),
    ({"top_p": 0.0}, "top_p"),
    ({"top_p": 1.01}, "top_p"),
    ({"top_p": -0.5}, "top_p"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": -3}, "max_tokens"),
    ({"max_tokens": 2.5}, "max_tokens"),
    ({"min_p": 1.5}, "min_p"),
    ({"presence_penalty": 2.5}, "presence_penalty"),
    ({"frequency_penalty": -2.5}, "frequency_penalty"),
    ({"seed": 2**64}, "seed"),
    ({"seed": -(2**63) - 1}, "seed"),
    ({"seed": 1.5}, "seed"),
    ({"stop": ("",)}, "stop"),
    ({"stop": tuple(str(i) for i in range(17))}, "stop"),
])
def test_sampling_params_validation(kwargs, param):
    with pytest.raises(InvalidRequestError) as info:
        SamplingParams(**kwargs)
    assert info.value.param == param
    assert param in info.value.message


@pytest.mark.parametrize("logprobs", [-1, 21])
def test_bad_logprobs(logprobs):
    with pytest.raises(InvalidRequestError) as info:
        SamplingParams(logprobs=logprobs)
    assert info.value.param in ("logprobs", "top_logprobs")


@pytest.mark.parametrize(("kwargs", "param"), [
    ({"mode": "fast"}, "speculation.mode"),
    ({"max_k": -1}, "speculation.max_k"),
    ({"max_k": 65}, "speculation.max_k"),
    ({"max_k": 2.0}, "speculation.max_k"),
    ({"max_k": True}, "speculation.max_k"),
])
def test_speculation_override_validation(kwargs, param):
    with pytest.raises(InvalidRequestError) as info:
        SpeculationOverride(**kwargs)
    assert info.value.param == param


def test_valid_params():
    params = SamplingParams(max_tokens=1, temperature=0.0, top_p=1.0, logprobs=20, stop=("x",),
                            speculation=SpeculationOverride(mode="off", max_k=0))
    assert params.greedy and not params.has_penalties
    assert SamplingParams(presence_penalty=0.1).has_penalties and not SamplingParams().greedy
    for seed in (-(2**63), -1, 0, 2**64 - 1):  # the whole range torch.Generator.manual_seed takes
        torch.Generator().manual_seed(SamplingParams(seed=seed).seed)
