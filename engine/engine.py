"""The engine loop. ``step()`` reads like the algorithm:

    schedule -> plan speculation (policy) -> propose -> verify (one target pass) -> accept -> commit

Every running request is fed in the same target forward pass: prefill chunks, plain
decodes (k = 0: one token) and verifications (k >= 1: last token + k drafts).
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import random
import time
from dataclasses import dataclass

import torch

from engine.config import EngineConfig
from engine.errors import ContextLengthExceededError, InvalidRequestError, QueueFullError
from engine.kv_cache import make_kv_cache
from engine.model_runner import ModelRunner, SeqChunk
from engine.models.int8 import int8_linears
from engine.models.llama import LlamaModel, touch_linears
from engine.models.loader import load_model, read_config, resolve_checkpoint
from engine.models.row_padding import calibrate_row_padding
from engine.models.tokenizer import IncrementalDetokenizer, check_compatible, eos_token_ids, load_tokenizer
from engine.request import Request, RequestStatus
from engine.sampler import greedy_tokens, position_counts, processed_probs, sample_rows, token_logprobs, transform_key
from engine.scheduler import Scheduler
from engine.spec_decode.proposer import Draft, build_proposers
from engine.spec_decode.rejection_sampler import VerifyResult, verify_greedy_batch, verify_sampled_batch
from engine.spec_decode.stats import SpecDecodeStats
from engine.types import EngineHealth, FinishReason, RequestOutput, SamplingParams
from policies import BatchView, Decision, PolicyController, PolicySettings, RequestView, RoundOutcome, StepTiming

log = logging.getLogger("specserve.engine")


@dataclass
class Planned:
    """The speculation plan of one decoding request this step."""

    request: Request
    k: int
    proposer: str
    draft: Draft | None = None
    ngram_match_len: int = 0  # of the n-gram match its proposal would come from (the policy's view of it)

    @property
    def draft_tokens(self) -> list[int]:
        return self.draft.token_ids if self.draft else []


def context_length_error(max_len: int, prompt: int, completion: int) -> ContextLengthExceededError:
    return ContextLengthExceededError(
        f"This model's maximum context length is {max_len} tokens. However, you requested "
        f"{prompt + completion} tokens ({prompt} in the messages, {completion} in the completion). "
        "Please reduce the length of the messages or completion.",
        param="messages",
    )


def _freeze_long_lived_objects() -> None:
    """Hide every object alive now from the cyclic garbage collector (`gc.freeze`, as vLLM does after startup).

    After a warm-up they are the process's own (modules, the tokenizer, the models' Python objects) and live as long
    as it does, yet each full collection walked them all: with the three engines of a sweep loaded, ~345k objects and
    ~200 ms, a stall that fell on whichever step allocated at the time (one in a run of ~200 steps of 32 requests cost
    that run 4%). Frozen, a full collection walks only what serving has made since. The objects are still freed by
    reference counting; only cycles among them would stay."""
    gc.collect()
    gc.freeze()


def _check_same_weights(config: EngineConfig, other: EngineConfig) -> None:
    """An engine may read another's weights only where it would have loaded the very same ones."""
    for field in ("model", "draft_model", "draft_int8", "torch_dtype", "torch_device"):
        if getattr(config, field) != getattr(other, field):
            raise ValueError(f"weights_from: its {field} is {getattr(other, field)!r}, "
                             f"this engine's {getattr(config, field)!r}")


class LLMEngine:
    def __init__(self, config: EngineConfig, policy: PolicyController | None = None, progress=None,
                 weights_from: LLMEngine | None = None) -> None:
        """``weights_from``: an engine of the same models, dtype and device whose weights this one reads too (they
        are never written); its KV caches, scheduler and policy are its own. For benchmarks that run one engine
        per policy: see bench/policy_sweep.py `make_engines`."""
        self.config = config
        self.model_path = resolve_checkpoint(config.model)
        if weights_from is not None:
            _check_same_weights(config, weights_from.config)
        model_config = read_config(self.model_path)
        self.max_seq_len = min(config.max_seq_len, model_config.get("max_position_embeddings", config.max_seq_len))
        self.runner = self._load_runner(self.model_path, weights_from.model if weights_from else None)
        self.tokenizer = load_tokenizer(self.model_path)
        self.eos_ids = eos_token_ids(self.tokenizer, model_config)
        self.model = self.runner.model
        if progress:
            progress("target loaded")
        draft_runner = None
        self.draft_model: LlamaModel | None = None
        if config.draft_model:
            draft_path = resolve_checkpoint(config.draft_model)
            draft_runner = self._load_runner(draft_path, weights_from.draft_model if weights_from else None,
                                             int8=config.draft_int8)
            self.draft_model = draft_runner.model
            check_compatible(self.tokenizer, load_tokenizer(draft_path), self.model_path, draft_path,
                             self.model.args.vocab_size, self.draft_model.args.vocab_size)
            if progress:
                progress("draft loaded")
        self.proposers = build_proposers(config, draft_runner=draft_runner)
        self.scheduler = Scheduler(self.runner.cache, max_running=config.max_running,
                                   max_waiting=config.max_waiting,
                                   max_num_batched_tokens=config.max_num_batched_tokens, on_evict=self._evict)
        self.policy = policy or PolicyController(
            PolicySettings(mode=config.speculation, k=config.k, k_max=config.k_max, seed=config.seed))
        self.policy.set_target_rows(self.runner.linear_rows if self.runner.pads_rows else None)
        self.stats = SpecDecodeStats()
        self.requests: dict[str, Request] = {}
        self._seeds = random.Random(config.seed)

    def warm_up(self) -> None:
        """Take each kind of step once (plain decode, draft-model and n-gram speculation, greedy and sampled
        verification) on two short requests, then make the policy forget what it learned and reset the stats.

        A new process pays for first touches (allocator growth, lazy initialisation) in its first steps, and
        learned from, they fitted a draft model far dearer than it is (3.5 ms a pass instead of ~1, plus
        3-4.6 ms per verifying step instead of 0): of 3 new engines warmed up without forgetting, then serving
        4 clients of prose at T = 1, all 3 decoded plainly for a whole run (400 steps), as did 4 of 10 warmed
        up by two short greedy requests; with the warm-up forgotten, none of 10 did (one started drafting late).
        Call it before serving, with no request running. On a CPU it first times the models' linears at small row
        counts (`calibrate_row_padding`). It also has oneDNN (CPU) or cuBLAS (CUDA) build or pick their kernels for
        every row count a step can feed (`touch_linears`).
        """
        if self.requests:
            raise RuntimeError("warm_up() needs an idle engine")
        for name, model in (("target", self.model), ("draft", self.draft_model)):
            table = calibrate_row_padding(model) if model is not None else None
            if table is not None:
                log.info("%s model on this CPU: row counts run padded %s", name,
                         {rows: padded for rows, padded in enumerate(table) if padded != rows} or "nowhere")
        settings = self.policy.settings
        prompt = self.tokenizer.encode("warm up, warm up, warm up, warm up, warm up") or [0]
        for mode in ("off", *self.proposers):
            for temperature in (0.0, 1.0):
                self.policy.replace(dataclasses.replace(settings, mode=mode, k=min(2, settings.k_max)))
                params = SamplingParams(max_tokens=8, temperature=temperature, ignore_eos=True,
                                        seed=0 if temperature else None)  # seeded: the engine's own seeds stay unused
                for i in range(2):
                    self.add_request(f"warm-up-{mode}-{temperature}-{i}", prompt, params)
                while self.has_work():
                    self.step()
        for model in (self.model, self.draft_model):
            if model is not None:
                touch_linears(model, self.config.max_num_batched_tokens)
        self.policy.replace(settings)
        self.policy.apply_pending()
        self.policy.forget_learned()
        self.stats = SpecDecodeStats()
        _freeze_long_lived_objects()

    def _load_runner(self, path, model: LlamaModel | None = None, int8: bool = False) -> ModelRunner:
        """A model (``model``, already loaded, or the checkpoint at ``path``, its linears int8 with ``int8``) with a KV
        cache of its own, sized by the engine config (the draft's like the target's)."""
        config = self.config
        if model is None:
            model, _ = load_model(path, config.torch_dtype, config.torch_device, int8=int8)
            if int8:
                log.info("draft model %s: %s linears", path.name, "int8" if int8_linears(model) else
                         "float (this torch has no dynamic int8 linear)")
        args = model.args
        cache = make_kv_cache(config.kv_cache, num_layers=args.num_layers, kv_heads=args.num_kv_heads,
                              head_dim=args.head_dim, dtype=config.torch_dtype, device=config.torch_device,
                              max_running=config.max_running, max_seq_len=self.max_seq_len,
                              num_blocks=config.num_kv_blocks, block_size=config.block_size)
        tokens_per_block = config.block_size if config.kv_cache == "paged" else self.max_seq_len
        if cache.num_total_blocks * tokens_per_block < self.max_seq_len:
            raise ValueError("num_kv_blocks is too small to hold one request of max_seq_len tokens")
        return ModelRunner(model, cache, config.torch_device)

    # ------------------------------------------------------------------ requests

    def add_request(self, request_id: str, prompt_ids: list[int], params: SamplingParams) -> Request:
        if request_id in self.requests:
            raise InvalidRequestError(f"request id {request_id!r} is already running", param="request_id")
        if not prompt_ids:
            raise InvalidRequestError("the prompt must contain at least one token", param="prompt")
        vocab = self.model.args.vocab_size
        if any(not 0 <= t < vocab for t in prompt_ids):
            raise InvalidRequestError(f"prompt token ids must be in [0, {vocab})", param="prompt")
        if len(prompt_ids) + params.max_tokens > self.max_seq_len:
            raise context_length_error(self.max_seq_len, len(prompt_ids), params.max_tokens)
        if self.scheduler.num_waiting >= self.config.max_waiting:
            raise QueueFullError(f"the engine's queue is full ({self.config.max_waiting} waiting requests)")
        generator = None
        if not params.greedy:
            seed = params.seed if params.seed is not None else self._seeds.getrandbits(63)
            generator = torch.Generator(device=self.config.torch_device).manual_seed(seed)
        request = Request(request_id, list(prompt_ids), params, generator,
                          IncrementalDetokenizer(self.tokenizer, prompt_ids, params.stop))
        self.requests[request_id] = request
        self.scheduler.add(request)
        return request

    def abort(self, request_id: str) -> RequestOutput | None:
        request = self.requests.get(request_id)
        if request is None:
            return None
        self._finish(request, "abort")
        return self._collect([request])[0]

    def has_work(self) -> bool:
        return self.scheduler.has_work

    # ------------------------------------------------------------------ the step

    def step(self) -> list[RequestOutput]:
        self.policy.apply_pending()
        sched = self.scheduler.schedule()
        if sched.is_empty:
            return self._collect(list(self.requests.values()))
        start = time.perf_counter()
        plans = self._plan(sched.decodes, num_prefilling=len(sched.prefills))
        draft_seconds, num_draft_requests, num_catch_up = self._propose(plans)
        verify_start = time.perf_counter()
        chunks = [SeqChunk(p.request.request_id, [p.request.last_token] + p.draft_tokens,
                           p.request.num_computed, 1 + len(p.draft_tokens)) for p in plans]
        chunks += [SeqChunk(c.request.request_id, c.request.tokens(c.start, c.start + c.num_tokens), c.start,
                            1 if c.is_last else 0) for c in sched.prefills]
        logits = self.runner.execute(chunks)
        results = self._verify(plans, logits[: len(plans)])
        target_seconds = time.perf_counter() - verify_start
        num_generated = 0
        for plan, result, rows in zip(plans, results, logits):
            self._observe_round(plan, result)
            plan.request.num_computed += 1 + result.num_accepted
            num_generated += self._commit(plan.request, result.token_ids, rows)
        for chunk, rows in zip(sched.prefills, logits[len(plans):]):
            request = chunk.request
            request.num_computed = chunk.start + chunk.num_tokens
            if chunk.is_last:
                token = self._sample_one(request, rows)
                num_generated += self._commit(request, [token], rows)
        num_tokens = sum(len(c.token_ids) for c in chunks)
        step_seconds = time.perf_counter() - start
        if plans:  # a step of prefill chunks alone is nobody's decode: speculation or not, it costs the same
            self.policy.observe_step(StepTiming(
                batch_size=len(plans), num_tokens=num_tokens, target_seconds=target_seconds,
                num_draft_tokens=sum(len(p.draft_tokens) for p in plans if p.proposer == "draft"),
                draft_seconds=draft_seconds, num_draft_requests=num_draft_requests,
                num_draft_catch_up_tokens=num_catch_up,
                num_draft_passes=max((len(p.draft_tokens) for p in plans if p.proposer == "draft"), default=0),
                step_seconds=step_seconds, num_generated=num_generated,
                num_prefill_tokens=sum(c.num_tokens for c in sched.prefills), num_prefilling=len(sched.prefills)))
        self.stats.observe_step(len(chunks), num_tokens, step_seconds, num_generated)
        return self._collect(list(self.requests.values()))

    def _plan(self, decodes: list[Request], num_prefilling: int) -> list[Planned]:
        """Ask the policy for k and proposer per request, then apply the hard limits."""
        if not decodes:
            return []
        ngram, draft = self.proposers["ngram"], self.proposers.get("draft")
        k_max = self.policy.settings.k_max
        views = []
        for r in decodes:
            override = r.params.speculation
            cap = min(k_max, r.remaining_tokens - 1, self.max_seq_len - r.num_tokens)
            if override is not None and override.max_k is not None:
                cap = min(cap, override.max_k)
            views.append(RequestView(
                request_id=r.request_id, temperature=r.params.temperature, num_output_tokens=len(r.output_ids),
                max_k=max(0, cap), ngram_match_len=ngram.match_len(r),
                override_mode=override.mode if override else "auto", draft_available=draft is not None,
                draft_lag=draft.lag(r) if draft is not None else 0, num_remaining_tokens=r.remaining_tokens))
        decisions = self.policy.decide(BatchView(tuple(views), num_waiting=self.scheduler.num_waiting,
                                                 num_prefilling=num_prefilling))
        plans = []
        cache = self.runner.cache
        for r, view, decision in zip(decodes, views, decisions):
            if self._needs_fixed_plan(r):
                decision = Decision(self.policy.settings.k, "draft" if "draft" in self.proposers else "ngram")
            k = min(decision.k, view.max_k) if decision.proposer in self.proposers else 0
            while k > 0 and not cache.can_reserve(r.request_id, r.num_tokens + k):
                k -= 1
            if k > 0:  # take the room now, so the next requests of this batch see it as used
                cache.reserve(r.request_id, r.num_tokens + k)
            plans.append(Planned(r, k, decision.proposer, ngram_match_len=view.ngram_match_len))
        return plans

    def _needs_fixed_plan(self, request: Request) -> bool:
        """A seeded sampling request must reproduce its text whatever the load and the learned statistics.

        Speculative sampling draws its random numbers along the rounds it runs, so the text a seed
        gives depends on the k of every round. Under the adaptive policy such a request therefore
        drafts the configured fixed k every round instead of a load-dependent one (unless the request
        chose a mode itself, or speculation is off).
        """
        override = request.params.speculation
        return (request.params.seed is not None and not request.params.greedy
                and self.policy.settings.mode == "auto" and (override is None or override.mode == "auto"))

    def _propose(self, plans: list[Planned]) -> tuple[float, int, int]:
        """Fill each plan's draft; returns (draft-model seconds, draft-model batch size, tokens the draft model
        caught up on: its lazy prefill, and what it missed while its requests decoded plainly)."""
        draft_seconds, num_draft_requests, num_catch_up = 0.0, 0, 0
        for name, proposer in self.proposers.items():
            group = [p for p in plans if p.k > 0 and p.proposer == name]
            if not group:
                continue
            if name == "draft":
                proposer.stop_confidence = self.policy.settings.draft_stop_confidence
            start = time.perf_counter()
            for plan, draft in zip(group, proposer.propose([p.request for p in group], [p.k for p in group])):
                plan.draft = draft
            if name == "draft":
                draft_seconds, num_draft_requests = time.perf_counter() - start, len(group)
                num_catch_up = proposer.catch_up_tokens
        return draft_seconds, num_draft_requests, num_catch_up

    def _verify(self, plans: list[Planned], logits: list[torch.Tensor]) -> list[VerifyResult]:
        """Greedy requests are verified together, then sampling requests together; results in plan order."""
        greedy = [i for i, p in enumerate(plans) if p.request.params.greedy]
        sampled = [i for i, p in enumerate(plans) if not p.request.params.greedy]
        results: list[VerifyResult | None] = [None] * len(plans)
        for indices, verify in ((greedy, self._verify_greedy), (sampled, self._verify_sampled)):
            if indices:
                for i, result in zip(indices, verify([plans[i] for i in indices], [logits[i] for i in indices])):
                    results[i] = result
        return results  # type: ignore[return-value]

    def _verify_greedy(self, plans: list[Planned], logits: list[torch.Tensor]) -> list[VerifyResult]:
        drafts = [p.draft_tokens for p in plans]
        targets = self._greedy_targets(plans, logits)
        width = max(map(len, drafts))
        return verify_greedy_batch(torch.tensor([t + [0] * (width + 1 - len(t)) for t in targets]),
                                   torch.tensor([d + [0] * (width - len(d)) for d in drafts], dtype=torch.long),
                                   torch.tensor([len(d) for d in drafts]))

    def _verify_sampled(self, plans: list[Planned], logits: list[torch.Tensor]) -> list[VerifyResult]:
        drafts = [p.draft_tokens for p in plans]
        return verify_sampled_batch(self._target_probs([p.request for p in plans], logits, drafts), drafts,
                                    [p.draft.probs if p.draft else None for p in plans],
                                    [p.request.generator for p in plans])

    def _target_probs(self, requests: list[Request], logits: list[torch.Tensor],
                      drafts: list[list[int]]) -> torch.Tensor:  # [rows, vocab], request after request
        """Every sampling request's processed target distributions, stacked; requests whose transforms match go
        through `processed_probs` as one batch (per request, its dozen small ops cost more than the rows)."""
        pieces: list[torch.Tensor | None] = [None] * len(requests)
        groups: dict[tuple, list[int]] = {}
        for j, request in enumerate(requests):
            key = transform_key(request.params)
            if key is None:  # penalties: each position counts the drafts before it
                pieces[j] = processed_probs(logits[j], request.params, self._counts(request, drafts[j]))
            else:
                groups.setdefault(key, []).append(j)
        for group in groups.values():
            probs = processed_probs(torch.cat([logits[j] for j in group]), requests[group[0]].params, None)
            if len(group) == len(requests):  # the usual case: one transform for all, already in order
                return probs
            for j, rows in zip(group, probs.split([logits[j].shape[0] for j in group])):
                pieces[j] = rows
        return torch.cat(pieces)  # type: ignore[arg-type]

    def _greedy_targets(self, plans: list[Planned], logits: list[torch.Tensor]) -> list[list[int]]:
        """The target's argmax at every verified position of each plan; one argmax for the whole batch
        unless a request has penalties (those depend on its own drafts)."""
        if any(p.request.params.has_penalties for p in plans):
            return [greedy_tokens(rows, p.request.params, self._counts(p.request, p.draft_tokens)).tolist()
                    for p, rows in zip(plans, logits)]
        flat = torch.cat(logits).argmax(dim=-1).tolist()
        out, start = [], 0
        for rows in logits:
            out.append(flat[start: start + rows.shape[0]])
            start += rows.shape[0]
        return out

    def _counts(self, request: Request, drafts: list[int]) -> torch.Tensor | None:
        if not request.params.has_penalties:
            return None
        return position_counts(request.output_ids, drafts, self.model.args.vocab_size, self.config.torch_device)

    def _sample_one(self, request: Request, logits: torch.Tensor) -> int:
        params = request.params
        if params.greedy:
            return int(greedy_tokens(logits, params, self._counts(request, []))[0])
        return sample_rows(processed_probs(logits, params, self._counts(request, [])), [request.generator])[0]

    def _observe_round(self, plan: Planned, result: VerifyResult) -> None:
        request, drafted = plan.request, len(plan.draft_tokens)
        if drafted == 0:
            request.spec.num_plain_steps += 1
            return
        request.spec.add(plan.proposer, drafted, result.num_accepted)
        self.stats.observe(plan.proposer, drafted, result.num_accepted)
        self.policy.observe(RoundOutcome(request.request_id, plan.proposer,  # type: ignore[arg-type]
                                         request.params.temperature, drafted, result.num_accepted,
                                         plan.ngram_match_len if plan.proposer == "ngram" else 0))

    # ------------------------------------------------------------------ commit and outputs

    def _commit(self, request: Request, token_ids: list[int], logits: torch.Tensor) -> int:
        """Append accepted tokens in order, stopping at the first stop condition; roll caches back."""
        emitted = []
        for token in token_ids:
            request.output_ids.append(token)
            emitted.append(token)
            reason = self._stop_reason(request, token)
            if reason is not None:
                self._finish(request, reason)
                break
        if request.params.logprobs is not None:
            request.pending_logprobs += token_logprobs(logits[: len(emitted)], emitted, request.params.logprobs,
                                                       self.tokenizer)
        request.pending_ids += emitted
        if not request.finished:
            self.runner.cache.truncate_to(request.request_id, request.num_computed)
            for proposer in self.proposers.values():
                proposer.on_committed(request)
        return len(emitted)

    def _stop_reason(self, request: Request, token: int) -> FinishReason | None:
        params = request.params
        if token in params.stop_token_ids or (not params.ignore_eos and token in self.eos_ids):
            return "stop"
        delta, stopped = request.detokenizer.add([token])
        request.pending_text += delta
        if stopped:
            return "stop"
        if request.remaining_tokens <= 0 or request.num_tokens >= self.max_seq_len:
            return "length"
        return None

    def _finish(self, request: Request, reason: FinishReason) -> None:
        if request.finished:
            return
        request.status = RequestStatus.FINISHED
        request.finish_reason = reason
        if reason != "abort":
            request.pending_text += request.detokenizer.flush()
        self.scheduler.remove(request)
        self.policy.forget(request.request_id)

    def _evict(self, request: Request) -> None:
        for proposer in self.proposers.values():
            proposer.remove_request(request)

    def _collect(self, requests: list[Request]) -> list[RequestOutput]:
        outputs = []
        for r in requests:
            if not (r.pending_ids or r.pending_text or r.finished):
                continue
            outputs.append(RequestOutput(
                request_id=r.request_id, new_token_ids=r.pending_ids, new_text=r.pending_text,
                num_prompt_tokens=r.num_prompt_tokens, num_output_tokens=len(r.output_ids), finished=r.finished,
                finish_reason=r.finish_reason, logprobs=r.pending_logprobs if r.params.logprobs is not None else None,
                spec=r.spec if r.finished else None))
            r.pending_ids, r.pending_text, r.pending_logprobs = [], "", []
            if r.finished:
                self.requests.pop(r.request_id, None)
        return outputs

    # ------------------------------------------------------------------ introspection

    def health(self) -> EngineHealth:
        cache = self.runner.cache
        return EngineHealth(ready=True, loop_alive=True, num_running=self.scheduler.num_running,
                            num_waiting=self.scheduler.num_waiting, kv_used_blocks=cache.num_used_blocks,
                            kv_total_blocks=cache.num_total_blocks)

    def snapshot(self) -> dict:
        h = self.health()
        return {"num_running": h.num_running, "num_waiting": h.num_waiting, "kv_used_blocks": h.kv_used_blocks,
                "kv_total_blocks": h.kv_total_blocks, **self.stats.snapshot(), "policy": self.policy.stats()}
