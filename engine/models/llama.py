"""Our Llama-architecture model: RMSNorm, RoPE (incl. Llama-3 scaling), GQA, SwiGLU.

The forward pass takes a *ragged* batch flattened to one token axis: every request
contributes its own number of new tokens (1 for decode, k+1 for verification, a chunk
for prefill) at its own positions. Attention reads each request's whole context from the
KV cache through gather indices built once per step (`AttentionMetadata`), so the model
does not know whether the cache is slotted or paged.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class LlamaArgs:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict | None
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool = False
    mlp_bias: bool = False


# new-token runs up to this long attend together: the longest verification (k + 1, k <= 16); longer ones (prefill
# chunks) apart, so that no verifying request is padded to a prefill chunk's length. At 32 the sweep's prose prompts
# (23-36 tokens with the chat template) mostly fell below it: a joined step of 32 requests verifying k = 2
# beside one 28-token prompt took 57.6 ms of the target's time, against 36-38 ms attending apart (one CPU thread).
# On a CPU, where the runner says which runs are verifications, the bound is twice the pass's longest verification.
SHORT_RUN = 17
# CPU: short runs attend with each kv head's query heads folded into one query axis (`Attention._attend_folded`);
# bench/attention_fold.py turns it off for a twin engine's steps, to compare
FOLD_SHORT_RUNS = True
# CPU: short runs attend in one group per length (`_length_class`), none padded to a longer one. Its cost is what the
# step-cost model, linear in fed tokens, assumes: in one padded group, an adaptive plan's mixed k's made its speculative
# steps at 17-32 requests 1.09-1.12x what the model predicted (1.0 at smaller batches), and so it drafted too long
# (k = 3 where k = 2 wins); per length 0.98-0.99x (code T = 0, 32 clients, Zen 4). bench/attention_lengths.py turns it
# off for a twin engine's steps, to compare
EXACT_SHORT_RUNS = True


@dataclass
class AttentionGroup:
    """Requests whose queries share one attention call, padded to the group's longest new-token run.

    token_index: [group_tokens]          rows of the flat token axis the group's queries sit at (None: all)
    gather_index: [batch, max_ctx]       flat cache index of each request's context (padded)
    mask: [batch, 1, max_new, max_ctx]   True where query i of request b may attend to key j (None: all keys)
    scatter_index: [group_tokens]        position of every group token in the [batch * max_new] padded grid
    """

    token_index: torch.Tensor | None
    gather_index: torch.Tensor
    mask: torch.Tensor | None
    scatter_index: torch.Tensor
    batch_size: int
    max_new: int
    uniform: bool = False  # all requests feed max_new tokens (pure decode, equal-k verification): no padding
    _folded_masks: dict = field(default_factory=dict, repr=False)  # heads per kv head -> `folded_mask`

    @property
    def gather_flat(self) -> torch.Tensor:
        return self.gather_index.view(-1)

    def folded_mask(self, heads_per_kv: int) -> torch.Tensor | None:
        """The mask for queries folded by `Attention._attend_folded` (``[batch, kv_heads, heads_per_kv * max_new,
        head_dim]``, the query heads of one kv head one after another): each query row's mask once per head of its kv
        head. Built once a pass, for all layers."""
        if self.mask is None:
            return None
        mask = self._folded_masks.get(heads_per_kv)
        if mask is None:
            mask = self._folded_masks[heads_per_kv] = self.mask.repeat(1, 1, heads_per_kv, 1)
        return mask


@dataclass
class AttentionMetadata:
    """Where each fed token writes its K/V (``write_index``: [num_tokens]) and how queries are grouped.

    Decoding requests (one new token), short runs (verification's k + 1 tokens) and prefill chunks (by length,
    `_length_class`) attend in separate groups, since a group pads every request to its longest run: padding a
    batch of decodes to one speculating request's k + 1 query rows multiplied the whole batch's attention
    work (CPU, 16 requests: 142 us -> 396 us per layer for k = 2), and padding 30 verifying requests to a
    150-token prefill chunk beside them made a step shared with prefill 26 ms (50%) slower than the same
    step decoding plainly, for ~18 more tokens. On a GPU decodes join the short runs' group (``merge_decodes``).
    """

    write_index: torch.Tensor
    groups: list[AttentionGroup]


def build_attention_metadata(
    context_indices: list[torch.Tensor], num_new: list[int], device: torch.device, merge_decodes: bool = False,
    num_logits: list[int] | None = None,
) -> AttentionMetadata:
    """context_indices[b]: flat cache indices of request b's whole context (old + new tokens).

    ``merge_decodes``: decoding requests attend in the short runs' group, padded to its longest run, where
    there is one (see `ModelRunner`: on a GPU a second group costs more than the padding).
    ``num_logits``: logits wanted per run; a run scored at every token is a verification. Where it is given and
    groups are not merged, a short run over twice the longest verification (a short prompt, a long prompt's last
    chunk) attends apart too, as prefill chunks do: 30 requests verifying k = 2 beside a 10-17 token prompt took
    6-20% less time apart (one CPU thread), while a 4-5 token prompt was 3-11% cheaper joining them.
    """
    writes = [idx[idx.numel() - n:] for idx, n in zip(context_indices, num_new)]
    short_run = SHORT_RUN
    if num_logits is not None and not merge_decodes:
        longest = max((n for n, scored in zip(num_new, num_logits) if n == scored > 1), default=SHORT_RUN)
        short_run = min(SHORT_RUN, 2 * longest)
    exact = EXACT_SHORT_RUNS and not merge_decodes
    classes = [_length_class(n, short_run, exact) for n in num_new]
    if merge_decodes and 1 in classes:
        classes = [max(c, 1) for c in classes]
    present = sorted(set(classes))
    if len(present) == 1:
        groups = [_attention_group(context_indices, num_new, None, device)]
    else:
        starts = [0, *itertools.accumulate(num_new)]
        groups = []
        for length_class in present:
            members = [b for b, c in enumerate(classes) if c == length_class]
            rows = torch.cat([torch.arange(starts[b], starts[b + 1]) for b in members])
            groups.append(_attention_group([context_indices[b] for b in members], [num_new[b] for b in members],
                                           rows.to(device), device))
    return AttentionMetadata(write_index=torch.cat(writes).to(device), groups=groups)


def _length_class(num_new: int, short_run: int, exact_short_runs: bool = False) -> int:
    """0: a decode; 1: a short run of up to ``short_run`` tokens (verification, a draft's catch-up), or with
    ``exact_short_runs`` one class per length (2 .. ``short_run``); above ``short_run``, prefill chunks, one class per
    doubling of length, so that none is padded to over twice its length: a 50-token prompt padded to a 200-token one
    beside it made a step of 32 verifying requests 80 ms, against 68 ms attending apart (one CPU thread).

    Exact short runs are a CPU's rule (``EXACT_SHORT_RUNS``): there a group's cost is its padded grid, not its calls.
    An adaptive plan mixes k's (n-gram k = 8 beside draft k = 2, plain decode beside both), and one long run pads every
    verifying request to it: at 16-32 requests over 300-400-token contexts (one thread) passes of k = 0..4 mixed took
    0.85-0.91x the time in one group per length, k = 2 with an eighth at k = 8 0.86-0.91x, uniform k the same; at 4-8
    requests within noise (`bench/attention_groups.py`)."""
    if num_new <= short_run:
        return num_new if exact_short_runs and num_new > 1 else int(num_new > 1)
    return short_run + (num_new - 1).bit_length()


def _attention_group(
    context_indices: list[torch.Tensor], num_new: list[int], token_index: torch.Tensor | None, device: torch.device
) -> AttentionGroup:
    batch = len(num_new)
    max_new = max(num_new)
    if max_new == 1:
        return _decode_group(context_indices, token_index, device)
    ctx_len = torch.tensor([idx.numel() for idx in context_indices])
    new_len = torch.tensor(num_new)
    uniform = min(num_new) == max_new
    gather = torch.nn.utils.rnn.pad_sequence(context_indices, batch_first=True)
    # query i of request b sits at position ctx - n + i and sees keys 0..that position
    query_pos = (ctx_len - new_len)[:, None] + torch.arange(max_new)[None, :]
    mask = torch.arange(gather.shape[1])[None, None, :] <= query_pos[:, :, None]
    if uniform:  # no padded queries: the group's token rows already are the [batch, max_new] grid
        scatter = torch.arange(batch * max_new)
    else:
        is_pad_query = torch.arange(max_new)[None, :] >= new_len[:, None]
        mask[is_pad_query] = False
        mask[..., 0] |= is_pad_query  # padded query rows attend somewhere harmless (never read)
        scatter = (torch.arange(batch)[:, None] * max_new + torch.arange(max_new)[None, :])[~is_pad_query]
    return AttentionGroup(
        token_index=token_index,
        gather_index=gather.to(device),
        mask=mask.unsqueeze(1).to(device),
        scatter_index=scatter.to(device),
        batch_size=batch,
        max_new=max_new,
        uniform=uniform,
    )


def _decode_group(context_indices: list[torch.Tensor], token_index: torch.Tensor | None,
                  device: torch.device) -> AttentionGroup:
    """One new token per request: its query sees the whole context, so only padding needs a mask.

    The draft model runs such a step k times per round; at batch 1 on CPU the general builder's
    padding and causal mask took ~70 us of a ~1.4 ms pass.
    """
    lengths = [idx.numel() for idx in context_indices]
    if min(lengths) == max(lengths):
        gather, mask = torch.stack(context_indices), None
    else:
        gather = torch.nn.utils.rnn.pad_sequence(context_indices, batch_first=True)
        mask = (torch.arange(gather.shape[1])[None, :] < torch.tensor(lengths)[:, None])[:, None, None, :].to(device)
    batch = len(lengths)
    return AttentionGroup(token_index=token_index, gather_index=gather.to(device), mask=mask,
                          scatter_index=torch.arange(batch, device=device), batch_size=batch, max_new=1, uniform=True)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32:  # one fused kernel; same arithmetic as the generic path below
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rope_inv_freq(args: LlamaArgs) -> torch.Tensor:
    dim = args.head_dim
    inv_freq = 1.0 / (args.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    scaling = args.rope_scaling or {}
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "llama3":
        factor = scaling["factor"]
        low, high = scaling.get("low_freq_factor", 1.0), scaling.get("high_freq_factor", 4.0)
        old_len = scaling["original_max_position_embeddings"]
        low_wavelen, high_wavelen = old_len / low, old_len / high
        wavelen = 2 * math.pi / inv_freq
        smooth = (old_len / wavelen - low) / (high - low)
        scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
        mid = (1 - smooth) * scaled / factor + smooth * scaled
        is_mid = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        inv_freq = torch.where(is_mid, mid, scaled)
    elif kind == "linear":
        inv_freq = inv_freq / scaling["factor"]
    elif kind != "default":
        raise ValueError(f"unsupported rope_scaling type {kind!r}")
    return inv_freq.float()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x: [tokens, heads, head_dim]; cos/sin: [tokens, 1, head_dim]; rotate-half convention as HF
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class Attention(nn.Module):
    def __init__(self, args: LlamaArgs) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = args.num_heads, args.num_kv_heads, args.head_dim
        self.q_size = args.num_heads * args.head_dim
        self.kv_size = args.num_kv_heads * args.head_dim
        self.qkv_proj = nn.Linear(args.hidden_size, self.q_size + 2 * self.kv_size, bias=args.attention_bias)
        self.o_proj = nn.Linear(self.q_size, args.hidden_size, bias=args.attention_bias)

    def forward(self, x, cos, sin, k_cache, v_cache, meta: AttentionMetadata) -> torch.Tensor:
        qkv = self.qkv_proj(x)
        # q and k heads are adjacent in the fused projection: rotate them in one go
        qk = apply_rope(qkv[:, : self.q_size + self.kv_size].view(-1, self.num_heads + self.num_kv_heads,
                                                                   self.head_dim), cos, sin)
        q, k = qk[:, : self.num_heads], qk[:, self.num_heads:]
        v = qkv[:, self.q_size + self.kv_size:].view(-1, self.num_kv_heads, self.head_dim)
        k_cache.index_copy_(0, meta.write_index, k.to(k_cache.dtype))
        v_cache.index_copy_(0, meta.write_index, v.to(v_cache.dtype))
        if len(meta.groups) == 1:
            return self.o_proj(self._attend(q, k_cache, v_cache, meta.groups[0]))
        out = q.new_empty(q.shape[0], self.q_size)
        for group in meta.groups:
            out.index_copy_(0, group.token_index, self._attend(q.index_select(0, group.token_index),
                                                               k_cache, v_cache, group))
        return self.o_proj(out)

    def _attend(self, q, k_cache, v_cache, group: AttentionGroup) -> torch.Tensor:
        """The group's queries ``[tokens, heads, head_dim]`` over their contexts -> ``[tokens, q_size]``."""
        # gather each request's context: [batch, kv_heads, max_ctx, head_dim] (index_select: far faster than x[idx])
        shape = (group.batch_size, -1, self.num_kv_heads, self.head_dim)
        keys = k_cache.index_select(0, group.gather_flat).view(shape).transpose(1, 2).to(q.dtype)
        values = v_cache.index_select(0, group.gather_flat).view(shape).transpose(1, 2).to(q.dtype)
        if group.uniform:  # every request feeds max_new tokens: the token axis already is the padded grid
            queries = q.reshape(group.batch_size, group.max_new, self.num_heads, self.head_dim).transpose(1, 2)
        else:
            padded = q.new_zeros(group.batch_size * group.max_new, self.num_heads, self.head_dim)
            padded[group.scatter_index] = q
            queries = padded.view(group.batch_size, group.max_new, self.num_heads, self.head_dim).transpose(1, 2)
        if 1 < group.max_new <= SHORT_RUN and FOLD_SHORT_RUNS and not queries.is_cuda:
            out = self._attend_folded(queries, keys, values, group)
        else:
            out = F.scaled_dot_product_attention(queries, keys, values, attn_mask=group.mask,
                                                 enable_gqa=self.num_kv_heads != self.num_heads)
        out = out.transpose(1, 2).reshape(group.batch_size * group.max_new, self.q_size)
        return out if group.uniform else out[group.scatter_index]

    def _attend_folded(self, queries, keys, values, group: AttentionGroup) -> torch.Tensor:
        """``queries`` ``[batch, heads, max_new, head_dim]`` attended as ``[batch, kv_heads, heads_per_kv * max_new,
        head_dim]``: the query heads of each kv head fold into one query axis, so that one attention call per kv head
        serves them all, without ``enable_gqa``'s per-head work. CPU, for short runs (verification, a draft catch-up).

        One thread, the bundled target (6 heads, 2 kv heads), 60-110 token contexts, attention's time a pass (K/V
        gathers included, medians of 10 rounds taken in turn): 32 requests verifying k = 2 0.67-0.74x, 8 requests
        0.70-0.86x. Fixed draft k = 2 in lockstep with itself unfolded (3-4 runs; bench/attention_fold.py): 1.045x at
        32 prose clients (T = 1), 1.032x at 32 code clients (T = 0.7), 1.026x at 16 code clients (T = 1), 1.013x at 8
        prose clients, 1.005-1.021x at 2-4. Decodes (one query a request) gained nothing steady (0.91-1.03x at 32,
        1.13-1.37x slower at 2), nor did prefill chunks (0.97-1.03x at 40-150 tokens, whose mask would grow by the
        heads per kv head): they keep ``enable_gqa``. Results differ in rounding only (~6e-7 here); neither way gives
        a query row bitwise the same result at every query count and padded context length."""
        batch, _, max_new, head_dim = queries.shape
        heads_per_kv = self.num_heads // self.num_kv_heads
        folded = queries.reshape(batch, self.num_kv_heads, heads_per_kv * max_new, head_dim)
        out = F.scaled_dot_product_attention(folded, keys, values, attn_mask=group.folded_mask(heads_per_kv))
        return out.view(batch, self.num_heads, max_new, head_dim)


class MLP(nn.Module):
    def __init__(self, args: LlamaArgs) -> None:
        super().__init__()
        self.intermediate = args.intermediate_size
        self.gate_up_proj = nn.Linear(args.hidden_size, 2 * args.intermediate_size, bias=args.mlp_bias)
        self.down_proj = nn.Linear(args.intermediate_size, args.hidden_size, bias=args.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).split(self.intermediate, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, args: LlamaArgs) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps)
        self.self_attn = Attention(args)
        self.post_attention_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps)
        self.mlp = MLP(args)

    def forward(self, x, cos, sin, k_cache, v_cache, meta) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, k_cache, v_cache, meta)
        return x + self.mlp(self.post_attention_layernorm(x))


class PackedLinear(nn.Module):
    """A ``Linear`` whose weight oneDNN reordered once, at load, into its own blocked layout (CPU only).

    Decode and verification multiply a few rows (1-32) by every weight once per step. MKL's plain GEMM,
    which ``F.linear`` calls for float32, re-lays the weight out on every call and, on AMD CPUs, takes a
    slow path; oneDNN's prepacked inner product ran the bundled target's projections 2-3.5x faster at
    1-32 rows (float32 and bfloat16 alike). Results differ from ``F.linear`` only in rounding.

    They also do not depend on the row count: each row comes out bitwise the same at 1-64 rows (every linear of the
    bundled target, on an Intel Xeon, 2026-11-30), where ``F.linear``'s move with it (by up to 6e-5 on one 384 x 1152
    projection). With MKL, a request's logits would depend on what shares its batch and on whether it verifies
    drafts, and float32 greedy output would no longer be the target's alone. That has a price where MKL's one-row
    GEMV is fast: on that Xeon a pass through the target's linears took 2.1 ms packed against 1.2 ms with
    ``F.linear`` at 1-2 rows (2 threads), 13-16% more at 4-8 rows, level from 16 on; a batch-size hint at packing
    did not help.

    ``row_padding``: the row count each count up to its length runs at (index: rows), shared by a model's
    linears and set by `engine.models.row_padding.calibrate_row_padding`; None: exact up to 16 rows.
    """

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        weight = linear.weight.detach()
        self.weight_dtype = weight.dtype
        self.bias = None if linear.bias is None else linear.bias.detach()
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight, None)  # opaque: not a parameter
        self.row_padding: tuple[int, ...] | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.shape[0]
        padded = padded_rows(rows, self.row_padding)
        if padded != rows:
            x = F.pad(x, (0, 0, 0, padded - rows))
        return self.multiply(x)[:rows]

    def multiply(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` times the weight (plus bias) at exactly ``x``'s row count."""
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")


def packed_linears(model: nn.Module) -> list[PackedLinear]:
    """``model``'s packed linears, in the order its forward pass meets them (none on CUDA)."""
    return [module for module in model.modules() if isinstance(module, PackedLinear)]


EXACT_ROWS = 16  # row counts up to this run as they are, or as a model's calibrated `PackedLinear.row_padding` says
# (up to rows, rounded up to a multiple of): the row counts above EXACT_ROWS that packed linears run at; beyond, 256
ROW_BANDS: tuple[tuple[int, int], ...] = ((64, 4), (256, 8), (512, 32))


def padded_rows(rows: int, row_padding: tuple[int, ...] | None = None) -> int:
    """The row count oneDNN sees for ``rows`` input rows: up to 16, as ``row_padding`` says (None: exact), then
    rounded up as ``ROW_BANDS`` says (to 4, 8, 32), and beyond them to 256.

    oneDNN builds a kernel per (rows, in, out) on first use (~0.4 ms) and keeps 1024 of them. A
    speculating batch feeds sum(k_i + 1) rows and every prefill chunk its own length, so exact row
    counts kept building kernels and evicting each other; these ~66 sizes per weight shape fit (the
    bundled target has 5 shapes; its draft model runs int8, unpacked). A padded row costs what a fed one does:
    rounded to 32 from 65 rows, a verification of 16 requests at k = 4 (80 rows) ran at 96, and mixed plans at 32
    requests (k = 1-2: 65-95 rows) paid fixed k = 2's 96 rows (docs/goodput-guard.md, s77).
    """
    if rows <= EXACT_ROWS:
        return row_padding[rows] if row_padding is not None and rows < len(row_padding) else rows
    for limit, step in ROW_BANDS:
        if rows <= limit:
            return -(-rows // step) * step
    return -(-rows // 256) * 256


_TOUCHED_SHAPES: set[tuple] = set()  # (device, in, out, dtype, bias, rows) run by `touch_linears`


def touch_linears(model: nn.Module, max_rows: int) -> None:
    """Run each linear shape of ``model`` once at every row count a step can feed up to ``max_rows``, so that the
    libraries build or pick their kernels now rather than in served steps. Engines of one process share the
    kernels, so whichever met a count first paid for it, and shapes touched once are not touched again.

    CPU: oneDNN builds a kernel per row count its packed linears see (`padded_rows`). A forward pass at a row count
    new to the process took 2-3.5 ms more on the bundled target (5.5-25 ms a pass) and 2 ms more on the draft
    (1.3-3.3 ms), once per count. Speculative steps meet the most new counts (k + 1 rows a verifying request, a
    catch-up's whole lag in the draft's first pass): in a new process, fixed draft k = 2 ran its first run at 8 code
    clients at 0.96-1.01x ``off`` without this, 1.065-1.075x with it (later runs ~1.07-1.14x). A CPU model without
    packed linears (MKL's GEMM builds nothing per count) is left alone.

    CUDA: cuBLAS picks a kernel per row count on its first call. On an H200 (bf16, 2026-11-28, bench/first_touch.py)
    the bundled target's first layer took 0.91 ms at a new count against 0.22 ms repeated, and at 32 code clients
    (T = 0) the adaptive policy, whose plans feed ever new counts, met 41 in its second run of the same traffic,
    2.5% of that run's time (bench/step_stalls.py), where fixed policies met none: they had met theirs in the first.
    Every count up to ``max_rows`` is touched, once per distinct (in, out, dtype, bias) shape."""
    touches = [(module, module.weight_dtype, torch.device("cpu"),
                sorted({padded_rows(rows, module.row_padding) for rows in range(1, max_rows + 1)}))
               for module in packed_linears(model)]
    on_cuda = [module for module in model.modules() if isinstance(module, nn.Linear) and module.weight.is_cuda]
    touches += [(module, module.weight.dtype, module.weight.device, range(1, max_rows + 1)) for module in on_cuda]
    # a model's layers share a few shapes: one module of each is touched
    shapes = {(str(device), linear.in_features, linear.out_features, dtype, linear.bias is not None):
              (linear, dtype, device, counts) for linear, dtype, device, counts in touches}
    with torch.inference_mode():
        for shape, (linear, dtype, device, counts) in shapes.items():
            for rows in counts:
                if (*shape, rows) not in _TOUCHED_SHAPES:
                    linear(torch.zeros(rows, linear.in_features, dtype=dtype, device=device))
                    _TOUCHED_SHAPES.add((*shape, rows))
    if on_cuda:
        torch.cuda.synchronize()


def avoid_cudnn_attention() -> None:
    """Take cuDNN out of the process's attention backends (flash, memory-efficient and math attention remain).

    Where a mask is given (ragged contexts, verification), torch 2.11 on an H100 sends bf16 attention to cuDNN
    first, which builds an execution plan for each new (batch, queries, context) shape: ~50 ms a shape, up to
    0.6 s, where a repeat takes 0.3 ms. A server's contexts grow every step, so nearly every step meets a new
    shape: on the bundled pair, 8 code clients ran 163 tokens/s in a new process against 850 on traffic whose
    shapes it had seen, and the adaptive policy, whose plans keep making new shapes, read 0.71-0.76x ``off``
    (H200, H100). Process-wide: choosing backends around each forward pass (``sdpa_kernel``) costs ~11 us a pass.
    """
    torch.backends.cuda.enable_cudnn_sdp(False)


def pack_linears_for_cpu(model: nn.Module) -> bool:
    """Swap every ``nn.Linear`` of a CPU model for a :class:`PackedLinear`; False (and no change) when
    this torch build lacks oneDNN's prepacked linear or it disagrees with ``F.linear`` on a probe."""
    try:
        probe = nn.Linear(8, 16, dtype=next(model.parameters()).dtype)
        x = torch.randn(3, 8, dtype=probe.weight.dtype)
        ok = torch.allclose(PackedLinear(probe)(x), probe(x), rtol=1e-2, atol=1e-3)
    except (AttributeError, RuntimeError):
        return False
    if not ok:
        return False
    replace_linears(model, PackedLinear)
    return True


def replace_linears(model: nn.Module, make: Callable[[nn.Linear], nn.Module]) -> None:
    """Put ``make(linear)`` in the place of every ``nn.Linear`` of ``model``."""
    for parent in list(model.modules()):
        for name, child in parent.named_children():
            if isinstance(child, nn.Linear):
                setattr(parent, name, make(child))


class LlamaModel(nn.Module):
    """Causal LM. ``forward`` returns logits only for ``logits_index`` rows of the flat token axis."""

    def __init__(self, args: LlamaArgs) -> None:
        super().__init__()
        self.args = args
        self.embed_tokens = nn.Embedding(args.vocab_size, args.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(args) for _ in range(args.num_layers))
        self.norm = RMSNorm(args.hidden_size, args.rms_norm_eps)
        self.lm_head = nn.Linear(args.hidden_size, args.vocab_size, bias=False)
        if args.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.register_buffer("inv_freq", rope_inv_freq(args), persistent=False)

    def rope(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions.float()[:, None] * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)[:, None, :]
        return emb.cos().to(dtype), emb.sin().to(dtype)

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,  # [num_tokens]
        positions: torch.Tensor,  # [num_tokens]
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],  # per layer: [cache_tokens, kv_heads, head_dim] x 2
        meta: AttentionMetadata,
        logits_index: torch.Tensor,  # [num_logits] rows of the flat token axis to project
    ) -> torch.Tensor:  # [num_logits, vocab] float32
        x = self.embed_tokens(input_ids)
        cos, sin = self.rope(positions, x.dtype)
        for layer, (k_cache, v_cache) in zip(self.layers, kv_caches):
            x = layer(x, cos, sin, k_cache, v_cache, meta)
        x = self.norm(x[logits_index])
        return self.lm_head(x).float()
