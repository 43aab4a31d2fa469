"""Verification of draft tokens against the target model: the speculative-sampling acceptance rule.

A pure module: no model, no cache, no engine state. Tensors in, plain Python lists out: greedy verification
reads the device once per call, sampled verification twice (the acceptance tests' inputs, then the tokens).

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

from engine.sampler import draw_uniforms, sample_inverse_cdf


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
    """Speculative sampling for one request: `verify_sampled_batch` with a batch of one."""
    if draft_token_ids.dim() != 1:
        raise ValueError(f"draft_token_ids must be 1-D [k]; got shape {tuple(draft_token_ids.shape)}")
    return verify_sampled_batch(target_probs, [draft_token_ids.tolist()], [draft_probs], [generator])[0]


def verify_sampled_batch(
    target_probs: torch.Tensor,  # [rows, vocab] float: each request's k_i + 1 rows of p, request after request
    draft_token_ids: list[list[int]],  # per request: the drafted tokens t_0 .. t_{k_i - 1}
    draft_probs: list[torch.Tensor | None],  # per request [k_i, vocab]: draft distribution q; None = deterministic
    generators: list[torch.Generator | None],  # per request, on the target's device; None = the global generator
) -> list[VerifyResult]:
    """Speculative sampling for a batch: each request's output is distributed exactly as sampling from its ``p``.

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

    Randomness: a request with a generator draws exactly ``k + 1`` float64 uniforms from one ``torch.rand`` call
    on it, the first ``k`` for the acceptance tests and the last for the recovered-or-bonus token (inverse-CDF
    sampling), so a seed fixes the result and every call advances the generator by the same amount whatever
    happens. The other requests share one draw from the global generator.

    Cost: the acceptance tests need only ``p_i(t_i)``, ``q_i(t_i)`` and ``u_i``, a few numbers per request, so they
    are read to the host once and run in Python; the vocabulary-wide work (residual, sampling) is one tensor op
    per stage for the whole batch. Per request, the same ops would cost ~100 us of CPU op overhead each.
    """
    num_drafts = [len(d) for d in draft_token_ids]
    starts = _check_sampled_shapes(target_probs, num_drafts, draft_probs, generators)  # request i's first row of p
    p = _as_float(target_probs)
    device, vocab = p.device, p.shape[1]
    uniforms = draw_uniforms([k + 1 for k in num_drafts], generators, device)  # [rows], aligned with p's rows
    with_q = [q for q, k in zip(draft_probs, num_drafts) if q is not None and k]
    q = torch.cat([_as_float(q_i).to(device) for q_i in with_q]) if with_q else None  # [drafts with q, vocab]

    # One read of everything the acceptance tests need: every uniform, p_i(t_i), and q_i(t_i) of draft-model rows
    # (flat indices into the row-major p and q; float32 -> float64 is exact).
    draft_rows = [start + j for start, k in zip(starts, num_drafts) for j in range(k)]
    flat_tokens = [t for d in draft_token_ids for t in d]
    parts = [uniforms]
    if draft_rows:
        parts.append(_flat_take(p, [row * vocab + t for row, t in zip(draft_rows, flat_tokens)]).double())
    if q is not None:
        q_tokens = [t for d, q_i in zip(draft_token_ids, draft_probs) if q_i is not None for t in d]
        parts.append(_flat_take(q, [row * vocab + t for row, t in enumerate(q_tokens)]).double())
    values = torch.cat(parts).tolist() if len(parts) > 1 else uniforms.tolist()
    num_rows, num_drafted = len(draft_rows) + len(num_drafts), len(draft_rows)
    u_host = values[:num_rows]
    num_accepted = _accepted_prefixes(num_drafts, [q_i is not None for q_i in draft_probs],
                                      p_draft=values[num_rows:num_rows + num_drafted],
                                      u_draft=[u_host[row] for row in draft_rows],
                                      q_draft=values[num_rows + num_drafted:])

    # The final token comes from row n: the residual p_n - q_n on a rejection, p_k itself for the bonus.
    # A rejection whose residual has no positive mass can only happen when p_n <= q_n everywhere, i.e. (for
    # normalised rows) p_n == q_n up to rounding. Then the true acceptance probability of every token q can draw
    # is 1, the rejection itself was a rounding artefact of probability ~eps, and the exact residual is undefined
    # (0/0). Sampling from p_n instead is the natural choice: it is the distribution we must match, it always has
    # positive mass, and the error it introduces is bounded by the ~eps rejection mass.
    final_rows = [start + n for start, n in zip(starts, num_accepted)]
    p_row = p.index_select(0, torch.tensor(final_rows, device=device))  # [batch, vocab]
    residual = p_row - _rejected_proposals(p_row, q, draft_token_ids, draft_probs, num_accepted)  # [batch, vocab]
    residual.clamp_(min=0.0)
    final_dist = torch.where(residual.sum(dim=1, keepdim=True) > 0, residual, p_row)  # [batch, vocab]
    final_uniforms = torch.tensor([u_host[s + k] for s, k in zip(starts, num_drafts)], dtype=torch.float64,
                                  device=device)  # [batch]
    final_tokens = sample_inverse_cdf(final_dist, final_uniforms).tolist()  # [batch]
    return [VerifyResult(token_ids=drafts[:n] + [_checked_token(token, vocab)], num_accepted=n)
            for drafts, n, token in zip(draft_token_ids, num_accepted, final_tokens)]


def _accepted_prefixes(num_drafts: list[int], has_q: list[bool], p_draft: list[float], u_draft: list[float],
                       q_draft: list[float]) -> list[int]:
    """Per request, the number of drafts accepted before the first failed test ``u * q(t) < p(t)``.

    Python floats are doubles: the test is the float64 one a tensor version would compute."""
    out, offset, q_offset = [], 0, 0
    for k, with_q in zip(num_drafts, has_q):
        n = 0
        while n < k:
            q_t = q_draft[q_offset + n] if with_q else 1.0
            if not u_draft[offset + n] * q_t < p_draft[offset + n]:
                break
            n += 1
        out.append(n)
        offset += k
        q_offset += k if with_q else 0
    return out


def _flat_take(table: torch.Tensor, flat_indices: list[int]) -> torch.Tensor:
    """Elements of a row-major 2-D tensor by flat index: one index_select instead of advanced indexing."""
    return table.reshape(-1).index_select(0, torch.tensor(flat_indices, device=table.device))


def _rejected_proposals(p_row: torch.Tensor,  # [batch, vocab]
                        q: torch.Tensor | None,  # [drafts with q, vocab]
                        draft_token_ids: list[list[int]], draft_probs: list[torch.Tensor | None],
                        num_accepted: list[int]) -> torch.Tensor:  # [batch, vocab]
    """``q_n`` for each request whose draft ``t_n`` was rejected: the draft model's row, or one_hot(t_n) for a
    deterministic proposal; zero for the bonus, which samples from ``p_k`` itself."""
    q_row = torch.zeros_like(p_row)
    q_index, q_batch, hot_batch, hot_token = [], [], [], []
    offset = 0
    for i, (drafts, q_i, n) in enumerate(zip(draft_token_ids, draft_probs, num_accepted)):
        if n < len(drafts) and q_i is not None:
            q_batch.append(i)
            q_index.append(offset + n)
        elif n < len(drafts):
            hot_batch.append(i)
            hot_token.append(drafts[n])
        offset += len(drafts) if q_i is not None else 0
    if q_batch:
        q_row[q_batch] = q.index_select(0, torch.tensor(q_index, device=p_row.device)).to(p_row.dtype)  # type: ignore[union-attr]
    if hot_batch:
        q_row[hot_batch, hot_token] = 1.0
    return q_row


def _checked_token(token_id: int, vocab_size: int) -> int:
    """The inverse-CDF search runs off the end only when the sampled row had no positive mass (or held NaN)."""
    if not 0 <= token_id < vocab_size:
        raise ValueError("target_probs has a row without positive finite mass; cannot sample from it")
    return token_id


def _as_float(probs: torch.Tensor) -> torch.Tensor:
    """fp32 or fp64 as given; half-precision inputs are promoted so that small probabilities survive."""
    return probs if probs.dtype in (torch.float32, torch.float64) else probs.float()


def _check_sampled_shapes(
    target_probs: torch.Tensor,  # [rows, vocab]
    num_drafts: list[int],
    draft_probs: list[torch.Tensor | None],  # per request [k_i, vocab]
    generators: list[torch.Generator | None],
) -> list[int]:  # each request's first row
    """Returns where each request's rows start; raises on shapes that do not fit together."""
    if not len(draft_probs) == len(generators) == len(num_drafts):
        raise ValueError(f"{len(num_drafts)} draft lists, {len(draft_probs)} draft_probs, {len(generators)} generators")
    num_rows = sum(num_drafts) + len(num_drafts)
    if target_probs.dim() != 2 or target_probs.shape[0] != num_rows:
        raise ValueError(f"target_probs must have shape [{num_rows}, vocab]; got {tuple(target_probs.shape)}")
    for k, q in zip(num_drafts, draft_probs):
        if q is not None and tuple(q.shape) != (k, target_probs.shape[1]):
            raise ValueError(f"draft_probs must have shape {(k, target_probs.shape[1])}; got {tuple(q.shape)}")
    starts = [0]
    for k in num_drafts[:-1]:
        starts.append(starts[-1] + k + 1)
    return starts
