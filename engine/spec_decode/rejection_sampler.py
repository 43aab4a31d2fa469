"""Verification of draft tokens against the target model: the speculative-sampling acceptance rule.

A pure module: no model, no cache, no engine state. Tensors in, plain Python lists out, with one
device-to-host transfer per call.

Glossary (one verification round of a request that drafted ``k`` tokens ``t_0 .. t_{k-1}``):

- **accepted**: the draft tokens kept, always a prefix ``t_0 .. t_{n-1}`` of the draft (``n = num_accepted``).
- **recovered**: the token sampled at position ``n`` when draft ``t_n`` is the first one rejected. In sampled
  mode it comes from the residual ``norm(max(0, p_n - q_n))``; in greedy mode it is the target's argmax.
- **bonus**: the token sampled from the target's ``p_k`` when all ``k`` drafts were accepted (greedy: argmax).

Every round therefore emits ``num_accepted + 1`` tokens: the accepted prefix and exactly one recovered-or-bonus
token. Position ``i`` of ``target_probs`` / ``target_argmax`` is the target's prediction *after* the context and
the drafts ``t_0 .. t_{i-1}``, so row ``i`` verifies ``t_i`` and row ``k`` yields the bonus.

Why the output is distributed exactly as sampling from the target (Leviathan et al. 2023; Chen et al. 2023):
accepting ``t ~ q`` with probability ``min(1, p(t)/q(t))`` and otherwise sampling from ``norm(max(0, p - q))``
gives ``P(x) = min(q(x), p(x)) + (1 - sum_y min(q(y), p(y))) * max(0, p(x) - q(x)) / sum_y max(0, p(y) - q(y))``
``= min(q(x), p(x)) + max(0, p(x) - q(x)) = p(x)``, because both normalisers equal ``1 - sum_y min(p(y), q(y))``.
A deterministic proposal (n-gram lookup, ``draft_probs is None``) is the special case ``q = one_hot(t)``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.sampler import sample_inverse_cdf


@dataclass(frozen=True)
class VerifyResult:
    """The outcome of verifying one request's drafts."""

    token_ids: list[int]  # accepted draft tokens, then exactly one recovered-or-bonus token
    num_accepted: int  # len(token_ids) == num_accepted + 1


def verify_greedy_batch(
    target_argmax: torch.Tensor,  # [batch, k_max + 1] int: the target's argmax at each verified position
    draft_token_ids: torch.Tensor,  # [batch, k_max] int: drafts, padded past each row's num_draft
    num_draft: torch.Tensor,  # [batch] int: real drafts per row, each in 0..k_max
) -> list[VerifyResult]:
    """Greedy verification for a batch: accept drafts while they equal the target's argmax.

    A row accepts the longest prefix of its first ``num_draft`` drafts that matches ``target_argmax`` and then
    emits the target's argmax at the first mismatch (recovered) or at ``num_draft`` (bonus). Padding past
    ``num_draft`` is never accepted, whatever it holds. Values of ``num_draft`` outside 0..k_max behave as if
    clamped to that range. Vectorised over the batch; one host transfer in all.
    """
    batch, k_max = draft_token_ids.shape
    if tuple(target_argmax.shape) != (batch, k_max + 1):
        raise ValueError(f"target_argmax must have shape {(batch, k_max + 1)}; got {tuple(target_argmax.shape)}")
    if tuple(num_draft.shape) != (batch,):
        raise ValueError(f"num_draft must have shape {(batch,)}; got {tuple(num_draft.shape)}")
    target_argmax = target_argmax.long()
    draft_token_ids = draft_token_ids.to(device=target_argmax.device, dtype=torch.long)
    positions = torch.arange(k_max, device=target_argmax.device)  # [k_max]
    in_draft = positions.unsqueeze(0) < num_draft.to(target_argmax.device).unsqueeze(1)  # [batch, k_max]
    matches = (target_argmax[:, :k_max] == draft_token_ids) & in_draft  # [batch, k_max]
    num_accepted = matches.long().cumprod(dim=1).sum(dim=1)  # [batch]: length of the matching prefix
    final_token = target_argmax.gather(1, num_accepted.unsqueeze(1))  # [batch, 1]: recovered or bonus
    rows = torch.cat([draft_token_ids, num_accepted.unsqueeze(1), final_token], dim=1).tolist()
    return [VerifyResult(token_ids=row[: row[k_max]] + [row[k_max + 1]], num_accepted=row[k_max]) for row in rows]


def verify_sampled(
    target_probs: torch.Tensor,  # [k + 1, vocab] float: the target's processed distribution p at each position
    draft_token_ids: torch.Tensor,  # [k] int: the drafted tokens t_0 .. t_{k-1}
    draft_probs: torch.Tensor | None,  # [k, vocab] float: processed draft distribution q; None = deterministic
    generator: torch.Generator | None,  # on target_probs.device; None = torch's global generator
) -> VerifyResult:
    """Speculative sampling for one request: the output is distributed exactly as sampling from ``p``.

    ``p`` (and ``q``) must be the distributions the tokens are actually sampled from: after temperature, top-k,
    top-p, min-p and penalties. Rows need not be exactly normalised, but each must be finite with positive mass.

    - ``t_i`` is accepted with probability ``min(1, p_i(t_i) / q_i(t_i))``, tested as ``u_i * q_i(t_i) < p_i(t_i)``
      with ``u_i ~ U[0, 1)`` so that no division happens: ``p(t) == 0`` (truncated by the target) always rejects;
      ``q(t) == 0`` (the draft could not have sampled ``t``; seen only with inconsistent inputs) accepts iff
      ``p(t) > 0``, the limit of ``min(1, p/q)`` as ``q -> 0``, and never produces NaN.
    - On the first rejection at ``n`` the recovered token is sampled from ``norm(max(0, p_n - q_n))``.
    - With ``draft_probs=None`` the proposal is a point mass at ``t_i``: accept with probability ``p_i(t_i)``; the
      recovered token is sampled from ``p_n`` with ``t_n``'s mass removed.
    - If all ``k`` drafts are accepted, the bonus is sampled from ``p_k``; ``k == 0`` just samples from ``p_0``.

    Randomness: exactly ``k + 1`` float64 uniforms from one ``torch.rand`` call on ``generator``, the first ``k``
    for the acceptance tests and the last for the recovered-or-bonus token (inverse-CDF sampling), so a seed fixes
    the result and every call advances the generator by the same amount whatever happens.
    """
    num_draft = draft_token_ids.shape[0]
    _check_sampled_shapes(target_probs, draft_token_ids, draft_probs)
    p = _as_float(target_probs)  # [k + 1, vocab]
    uniforms = torch.rand(num_draft + 1, generator=generator, device=p.device, dtype=torch.float64)  # [k + 1]
    if num_draft == 0:
        token = sample_inverse_cdf(p[0], uniforms[:1])  # [1]
        return VerifyResult(token_ids=[_checked_token(int(token.item()), p.shape[1])], num_accepted=0)

    drafts = draft_token_ids.to(device=p.device, dtype=torch.long)  # [k]
    p_draft = p[:num_draft].gather(1, drafts.unsqueeze(1)).squeeze(1)  # [k]: p_i(t_i)
    q = None if draft_probs is None else _as_float(draft_probs).to(p.device)  # [k, vocab]
    q_draft = torch.ones_like(p_draft) if q is None else q.gather(1, drafts.unsqueeze(1)).squeeze(1)  # [k]
    accepted = uniforms[:num_draft] * q_draft < p_draft  # [k]
    num_accepted = accepted.long().cumprod(dim=0).sum().view(1)  # [1]: index of the first rejection, or k

    # The final token comes from row n = num_accepted: the residual p_n - q_n on a rejection, p_k for the bonus.
    # Everything stays on the device (no .item()), so the only sync is the .tolist() at the end.
    p_row = p.index_select(0, num_accepted).squeeze(0)  # [vocab]
    draft_row = num_accepted.clamp(max=num_draft - 1)  # [1]: a valid row of q even when n == k
    if q is None:
        q_row = torch.zeros_like(p_row).scatter_(0, drafts.index_select(0, draft_row), 1.0)  # [vocab]: one_hot(t_n)
    else:
        q_row = q.index_select(0, draft_row).squeeze(0)  # [vocab]
    is_rejection = num_accepted < num_draft  # [1]: False for the bonus, which samples from p_k itself
    residual = (p_row - q_row * is_rejection).clamp_(min=0.0)  # [vocab]
    # A rejection whose residual has no positive mass can only happen when p_n <= q_n everywhere, i.e. (for
    # normalised rows) p_n == q_n up to rounding. Then the true acceptance probability of every token q can draw
    # is 1, the rejection itself was a rounding artefact of probability ~eps, and the exact residual is
    # undefined (0/0). Sampling from p_n instead is the natural choice: it is the distribution we must match, it
    # always has positive mass, and the error it introduces is bounded by the ~eps rejection mass.
    has_residual = residual.sum() > 0  # [] bool
    final_dist = torch.where(has_residual, residual, p_row)  # [vocab]
    final_token = sample_inverse_cdf(final_dist, uniforms[num_draft:])  # [1]

    out = torch.cat([num_accepted, final_token, drafts]).tolist()
    n = out[0]
    return VerifyResult(token_ids=out[2 : 2 + n] + [_checked_token(out[1], p.shape[1])], num_accepted=n)


def _checked_token(token_id: int, vocab_size: int) -> int:
    """The inverse-CDF search runs off the end only when the sampled row had no positive mass (or held NaN)."""
    if not 0 <= token_id < vocab_size:
        raise ValueError("target_probs has a row without positive finite mass; cannot sample from it")
    return token_id


def _as_float(probs: torch.Tensor) -> torch.Tensor:
    """fp32 or fp64 as given; half-precision inputs are promoted so that small probabilities survive."""
    return probs if probs.dtype in (torch.float32, torch.float64) else probs.float()


def _check_sampled_shapes(
    target_probs: torch.Tensor,  # [k + 1, vocab]
    draft_token_ids: torch.Tensor,  # [k]
    draft_probs: torch.Tensor | None,  # [k, vocab]
) -> None:
    if draft_token_ids.dim() != 1:
        raise ValueError(f"draft_token_ids must be 1-D [k]; got shape {tuple(draft_token_ids.shape)}")
    num_draft = draft_token_ids.shape[0]
    if target_probs.dim() != 2 or target_probs.shape[0] != num_draft + 1:
        raise ValueError(f"target_probs must have shape [{num_draft + 1}, vocab]; got {tuple(target_probs.shape)}")
    if draft_probs is not None and tuple(draft_probs.shape) != (num_draft, target_probs.shape[1]):
        raise ValueError(
            f"draft_probs must have shape {(num_draft, target_probs.shape[1])}; got {tuple(draft_probs.shape)}"
        )
