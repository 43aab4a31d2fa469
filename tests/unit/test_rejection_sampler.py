"""Rejection sampler: greedy batch verification on hand-built inputs, distribution tests, edge cases, seeds."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from scipy import stats

from engine.spec_decode.rejection_sampler import VerifyResult, verify_greedy_batch, verify_sampled, verify_sampled_batch

VOCAB = 10
NUM_DRAWS = 4000
MIN_P_VALUE = 1e-3
# No shrinking: each example costs ~0.3 s, and a failure already prints the offending p and q.
STAT_SETTINGS = settings(
    max_examples=12,
    deadline=None,
    derandomize=True,
    phases=(Phase.explicit, Phase.generate),
    suppress_health_check=[HealthCheck.too_slow],
)


def logits_for(wanted: list[int], vocab: int = VOCAB) -> torch.Tensor:
    """[len(wanted), vocab] logits with +100 on the wanted token of each row and -100 elsewhere."""
    logits = torch.full((len(wanted), vocab), -100.0)
    logits[torch.arange(len(wanted)), torch.tensor(wanted)] = 100.0
    return logits


def seeded(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ---------------------------------------------------------------- greedy


def test_greedy_batch_ragged_rows_and_k0():
    k_max = 3
    target_rows = [
        [5, 6, 7, 8],  # all 3 drafts match -> bonus 8
        [5, 1, 7, 8],  # second draft mismatches -> recovered 1
        [2, 6, 7, 8],  # first draft mismatches -> recovered 2
        [5, 6, 7, 8],  # num_draft == 1: padding matches but must not count -> bonus 6
        [9, 6, 7, 8],  # num_draft == 0 -> just the target's first token
    ]
    target_argmax = torch.stack([logits_for(row).argmax(dim=-1) for row in target_rows])  # [5, k_max + 1]
    draft = torch.tensor([[5, 6, 7]] * 5)  # [5, k_max]
    num_draft = torch.tensor([3, 3, 3, 1, 0])

    results = verify_greedy_batch(target_argmax, draft, num_draft)

    assert results == [
        VerifyResult(token_ids=[5, 6, 7, 8], num_accepted=3),
        VerifyResult(token_ids=[5, 1], num_accepted=1),
        VerifyResult(token_ids=[2], num_accepted=0),
        VerifyResult(token_ids=[5, 6], num_accepted=1),
        VerifyResult(token_ids=[9], num_accepted=0),
    ]
    assert target_argmax.shape[1] == k_max + 1
    assert all(isinstance(t, int) for r in results for t in r.token_ids)


def test_greedy_batch_with_k_max_zero():
    target_argmax = logits_for([4, 2]).argmax(dim=-1).unsqueeze(1)  # [2, 1]
    results = verify_greedy_batch(target_argmax, torch.zeros(2, 0, dtype=torch.long), torch.zeros(2, dtype=torch.long))
    assert results == [VerifyResult([4], 0), VerifyResult([2], 0)]


def test_greedy_batch_mismatch_then_match_stops_at_first_mismatch():
    target_argmax = torch.tensor([[1, 9, 3, 4]])
    results = verify_greedy_batch(target_argmax, torch.tensor([[1, 2, 3]]), torch.tensor([3]))
    assert results == [VerifyResult([1, 9], 1)]


def test_greedy_batch_rejects_bad_shapes():
    with pytest.raises(ValueError, match="target_argmax"):
        verify_greedy_batch(
            torch.zeros(2, 3, dtype=torch.long), torch.zeros(2, 3, dtype=torch.long), torch.zeros(2, dtype=torch.long)
        )
    with pytest.raises(ValueError, match="num_draft"):
        verify_greedy_batch(
            torch.zeros(2, 4, dtype=torch.long), torch.zeros(2, 3, dtype=torch.long), torch.zeros(3, dtype=torch.long)
        )


# ---------------------------------------------------------------- distribution helpers


@st.composite
def distributions(draw, vocab: int, rows: int, allow_zeros: bool) -> torch.Tensor:
    """[rows, vocab] float64 probabilities; some entries exactly 0 (truncation) when allow_zeros."""
    weight = st.floats(0.05, 1.0)
    if allow_zeros:
        weight = st.one_of(st.just(0.0), weight)
    out = []
    for _ in range(rows):
        w = draw(st.lists(weight, min_size=vocab, max_size=vocab).filter(lambda ws: sum(ws) > 0))
        out.append(w)
    probs = torch.tensor(out, dtype=torch.float64)
    return probs / probs.sum(dim=1, keepdim=True)


def fit_failure(counts: np.ndarray, probs: torch.Tensor) -> str | None:
    """Why ``counts`` do not fit ``probs`` (chi-square p-value <= 1e-3, or a p == 0 token drawn), else None.

    Expected counts below 5 are pooled into one bin, as the chi-square approximation needs."""
    expected = probs.double().numpy() * counts.sum()
    if counts[expected == 0].sum() > 0:
        return f"sampled a token with p == 0: counts={counts.tolist()}, p={probs.tolist()}"
    big = expected >= 5
    small = ~big & (expected > 0)
    obs = np.append(counts[big], counts[small].sum())
    exp = np.append(expected[big], expected[small].sum())
    keep = exp > 0
    if keep.sum() < 2:
        return None
    pvalue = stats.chisquare(obs[keep], exp[keep] * obs[keep].sum() / exp[keep].sum()).pvalue
    if pvalue > MIN_P_VALUE:
        return None
    return f"counts={counts.tolist()}, expected={expected.round(1).tolist()}, {pvalue=}"


def assert_matches(counts: np.ndarray, probs: torch.Tensor) -> None:
    failure = fit_failure(counts, probs)
    assert failure is None, failure


def output_fit_failures(results: list[VerifyResult], p: torch.Tensor) -> list[str]:
    """The first output token must be ~ p[0]. With position-wise (context-free) p and q, the token after an
    accepted first draft must again be exact, ~ p[1]; it is checked when enough rounds produced one."""
    vocab = p.shape[1]
    first = np.bincount([r.token_ids[0] for r in results], minlength=vocab)
    second = np.bincount([r.token_ids[1] for r in results if len(r.token_ids) > 1], minlength=vocab)
    checks = [("first token", first, p[0])]
    if second.sum() >= 200:
        checks.append(("second token", second, p[1]))
    return [f"{name}: {why}" for name, counts, probs in checks if (why := fit_failure(counts, probs)) is not None]


def assert_output_distributed_as_target(run: Callable[[torch.Generator], list[VerifyResult]], p: torch.Tensor) -> None:
    """Chi-square checks of ``run``'s outputs against ``p``, retried once with a fresh seed on failure.

    Each example makes up to two checks at significance 1e-3, and hypothesis runs a dozen examples per test, so a
    correct sampler would otherwise fail somewhere now and then by chance; a real bias fails both attempts."""
    failures: list[str] = []
    for seed in (1234, 4321):
        failures = output_fit_failures(run(seeded(seed)), p)
        if not failures:
            return
    pytest.fail("; ".join(failures))


# ---------------------------------------------------------------- distribution tests


@STAT_SETTINGS
@given(data=st.data(), vocab=st.integers(3, 8), k=st.integers(1, 3))
def test_sampled_output_is_distributed_as_target_with_draft_model(data, vocab, k):
    p = data.draw(distributions(vocab, k + 1, allow_zeros=True), label="p")
    q = data.draw(distributions(vocab, k, allow_zeros=True), label="q")

    def run(g: torch.Generator) -> list[VerifyResult]:
        drafts = torch.multinomial(q, NUM_DRAWS, replacement=True, generator=g).T  # [NUM_DRAWS, k], t_i ~ q_i
        results = [verify_sampled(p, drafts[i], q, g) for i in range(NUM_DRAWS)]
        for r, d in zip(results, drafts.tolist()):
            assert len(r.token_ids) == r.num_accepted + 1 and 0 <= r.num_accepted <= k
            assert r.token_ids[: r.num_accepted] == d[: r.num_accepted]
        return results

    assert_output_distributed_as_target(run, p)


@STAT_SETTINGS
@given(data=st.data(), vocab=st.integers(3, 8), k=st.integers(1, 3))
def test_sampled_output_is_distributed_as_target_with_deterministic_proposal(data, vocab, k):
    p = data.draw(distributions(vocab, k + 1, allow_zeros=True), label="p")
    drafts = torch.tensor(data.draw(st.lists(st.integers(0, vocab - 1), min_size=k, max_size=k), label="drafts"))

    def run(g: torch.Generator) -> list[VerifyResult]:
        results = [verify_sampled(p, drafts, None, g) for _ in range(NUM_DRAWS)]
        for r in results:
            assert r.token_ids[: r.num_accepted] == drafts[: r.num_accepted].tolist()
        return results

    assert_output_distributed_as_target(run, p)


def test_acceptance_rate_is_sum_of_min_p_q():
    p = torch.tensor([[0.6, 0.3, 0.1], [0.2, 0.2, 0.6]], dtype=torch.float64)
    q = torch.tensor([[0.2, 0.3, 0.5]], dtype=torch.float64)
    g = seeded(5)
    drafts = torch.multinomial(q[0], NUM_DRAWS, replacement=True, generator=g)
    num_accepted = sum(verify_sampled(p, drafts[i : i + 1], q, g).num_accepted for i in range(NUM_DRAWS))
    expected = torch.minimum(p[0], q[0]).sum().item()  # 0.2 + 0.3 + 0.1 = 0.6
    assert abs(num_accepted / NUM_DRAWS - expected) < 4 * (expected * (1 - expected) / NUM_DRAWS) ** 0.5


# ---------------------------------------------------------------- edge cases


def test_k0_samples_from_first_row():
    p = torch.softmax(logits_for([3]), dim=-1)  # [1, vocab], all mass on 3
    for draft_probs in (None, torch.zeros(0, VOCAB)):
        result = verify_sampled(p, torch.zeros(0, dtype=torch.long), draft_probs, seeded())
        assert result == VerifyResult([3], 0)

    p = torch.tensor([[0.5, 0.0, 0.5]], dtype=torch.float64)
    g = seeded(3)
    counts = np.bincount(
        [verify_sampled(p, torch.zeros(0, dtype=torch.long), None, g).token_ids[0] for _ in range(2000)], minlength=3
    )
    assert_matches(counts, p[0])


def test_target_zero_probability_always_rejects():
    p = torch.tensor([[0.0, 0.5, 0.5], [1 / 3, 1 / 3, 1 / 3]])
    q = torch.tensor([[0.9, 0.05, 0.05]])
    for seed in range(50):
        for draft_probs in (q, None):
            result = verify_sampled(p, torch.tensor([0]), draft_probs, seeded(seed))
            assert result.num_accepted == 0
            assert result.token_ids[0] in (1, 2)


def test_draft_zero_probability_accepts_iff_target_positive_without_nan():
    q = torch.tensor([[0.0, 0.5, 0.5]])
    p_positive = torch.tensor([[0.2, 0.4, 0.4], [0.0, 0.0, 1.0]])
    p_zero = torch.tensor([[0.0, 0.5, 0.5], [0.0, 0.0, 1.0]])
    for seed in range(50):
        assert verify_sampled(p_positive, torch.tensor([0]), q, seeded(seed)) == VerifyResult([0, 2], 1)
        rejected = verify_sampled(p_zero, torch.tensor([0]), q, seeded(seed))
        assert rejected.num_accepted == 0 and rejected.token_ids[0] in (1, 2)


def test_residual_without_positive_mass_falls_back_to_target():
    # Unnormalised p (as rounding can leave it): p <= q everywhere, so max(0, p - q) == 0 after a rejection.
    p = torch.tensor([[0.0, 0.3, 0.3], [1.0, 0.0, 0.0]])
    q = torch.tensor([[0.4, 0.3, 0.3]])
    for seed in range(50):
        result = verify_sampled(p, torch.tensor([0]), q, seeded(seed))
        assert result.num_accepted == 0 and result.token_ids[0] in (1, 2)

    # Deterministic proposal: p is (unnormalised) all on the draft; rejected half the time, residual empty.
    p = torch.tensor([[0.5, 0.0, 0.0], [0.0, 1.0, 0.0]])
    outcomes = {tuple(verify_sampled(p, torch.tensor([0]), None, seeded(seed)).token_ids) for seed in range(50)}
    assert outcomes == {(0,), (0, 1)}


def test_deterministic_rejection_never_recovers_the_rejected_token():
    p = torch.tensor([[0.5, 0.5, 0.0], [0.0, 0.0, 1.0]])
    outcomes = {tuple(verify_sampled(p, torch.tensor([0]), None, seeded(seed)).token_ids) for seed in range(100)}
    assert outcomes == {(0, 2), (1,)}


def test_point_mass_target_on_draft_always_accepts():
    p = torch.softmax(logits_for([1, 2, 3]), dim=-1)  # [3, vocab]
    q = torch.softmax(torch.randn(2, VOCAB, generator=seeded(0)), dim=-1)
    for draft_probs in (None, q):
        for seed in range(20):
            assert verify_sampled(p, torch.tensor([1, 2]), draft_probs, seeded(seed)) == VerifyResult([1, 2, 3], 2)


def test_half_precision_inputs_are_accepted():
    p = torch.tensor([[0.25, 0.75], [0.5, 0.5]], dtype=torch.bfloat16)
    q = torch.tensor([[0.5, 0.5]], dtype=torch.float16)
    result = verify_sampled(p, torch.tensor([1]), q, seeded())
    assert len(result.token_ids) == result.num_accepted + 1


def test_sampled_rejects_bad_shapes():
    with pytest.raises(ValueError, match="target_probs"):
        verify_sampled(torch.rand(2, 4), torch.tensor([0, 1]), None, None)
    with pytest.raises(ValueError, match="draft_probs"):
        verify_sampled(torch.rand(3, 4), torch.tensor([0, 1]), torch.rand(2, 5), None)
    with pytest.raises(ValueError, match="draft_token_ids"):
        verify_sampled(torch.rand(3, 4), torch.tensor([[0, 1]]), None, None)
    with pytest.raises(ValueError, match="generators"):
        verify_sampled_batch(torch.rand(2, 4), [[0]], [None], [])
    with pytest.raises(ValueError, match=r"target_probs must have shape \[5, vocab\]"):
        verify_sampled_batch(torch.rand(4, 4), [[0], [1, 2]], [None, None], [None, None])


# ---------------------------------------------------------------- determinism


def test_same_seed_gives_same_result():
    p = torch.softmax(torch.randn(4, VOCAB, generator=seeded(1)), dim=-1)
    q = torch.softmax(torch.randn(3, VOCAB, generator=seeded(2)), dim=-1)
    drafts = torch.tensor([1, 2, 3])
    for draft_probs in (q, None):
        runs = [[verify_sampled(p, drafts, draft_probs, seeded(seed)) for seed in range(30)] for _ in range(2)]
        assert runs[0] == runs[1]
        assert len({tuple(r.token_ids) for r in runs[0]}) > 1  # different seeds do differ

    g1, g2 = seeded(7), seeded(7)
    seq1 = [verify_sampled(p, drafts, q, g1) for _ in range(20)]
    seq2 = [verify_sampled(p, drafts, q, g2) for _ in range(20)]
    assert seq1 == seq2


def test_target_row_without_mass_is_an_error_not_a_token():
    with pytest.raises(ValueError, match="positive"):
        verify_sampled(torch.zeros(1, 4), torch.zeros(0, dtype=torch.long), None, seeded())
    with pytest.raises(ValueError, match="positive"):
        verify_sampled(torch.tensor([[0.0, 1.0], [0.0, 0.0]]), torch.tensor([1]), None, seeded())


def test_batch_matches_one_request_at_a_time():
    """Mixed batch (draft-model and deterministic proposals, k = 0..3): each seeded request gets the result it
    gets alone, so batching changes neither the distribution nor what a seed reproduces."""
    vocab = 6
    g = seeded(11)
    requests = []
    for k, with_q in [(2, True), (0, False), (3, False), (1, True), (0, True), (3, True)]:
        p = torch.softmax(torch.randn(k + 1, vocab, generator=g), dim=-1)
        q = torch.softmax(torch.randn(k, vocab, generator=g), dim=-1) if with_q else None
        requests.append((p, torch.randint(0, vocab, (k,), generator=g), q))
    for seed in range(40):
        alone = [verify_sampled(p, d, q, seeded(seed * 10 + i)) for i, (p, d, q) in enumerate(requests)]
        batched = verify_sampled_batch(torch.cat([p for p, _, _ in requests]), [d.tolist() for _, d, _ in requests],
                                       [q for _, _, q in requests], [seeded(seed * 10 + i) for i in range(6)])
        assert batched == alone
