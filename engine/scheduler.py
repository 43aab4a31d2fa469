"""Continuous batching: admit, chunk prefills, keep decodes fed, preempt when KV runs out.

``schedule()`` returns a ``SchedulerOutput``, the one typed seam between the scheduler
and the engine step: which requests decode (and so may verify drafts), which prefill
which chunk. Decodes are scheduled first so long prompts never starve them; the rest
of the step's token budget goes to prefill chunks, continuing ones before new admissions.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from engine.kv_cache import KVCache
from engine.request import Request, RequestStatus


@dataclass(frozen=True)
class PrefillChunk:
    request: Request
    start: int
    num_tokens: int

    @property
    def is_last(self) -> bool:
        """The chunk reaches the newest token, so its last logits sample the next token."""
        return self.start + self.num_tokens == self.request.num_tokens


@dataclass
class SchedulerOutput:
    decodes: list[Request] = field(default_factory=list)
    prefills: list[PrefillChunk] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)

    @property
    def is_empty(self) -> bool:
        return not self.decodes and not self.prefills


class Scheduler:
    def __init__(self, cache: KVCache, *, max_running: int, max_waiting: int, max_num_batched_tokens: int,
                 on_evict: Callable[[Request], None] | None = None) -> None:
        self.cache = cache
        self.max_running = max_running
        self.max_waiting = max_waiting
        self.budget = max_num_batched_tokens
        self.on_evict = on_evict or (lambda request: None)  # e.g. free the draft model's cache too
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []

    def add(self, request: Request) -> None:
        self.waiting.append(request)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.budget
        for request in list(self.running):
            if request.is_prefilling or request not in self.running:
                continue
            while not self.cache.can_reserve(request.request_id, request.num_tokens):
                victim = self.running[-1]
                self.preempt(victim, out)
                if victim is request:
                    break
            else:
                self.cache.reserve(request.request_id, request.num_tokens)
                out.decodes.append(request)
                budget -= 1
        for request in self.running:
            if request.is_prefilling and budget > 0:
                budget -= self._schedule_prefill(request, budget, out)
        while self.waiting and budget > 0 and len(self.running) < self.max_running:
            request = self.waiting[0]
            if not self.cache.can_allocate(min(request.num_tokens, budget)):
                break
            self.waiting.popleft()
            self.cache.allocate(request.request_id)
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            budget -= self._schedule_prefill(request, budget, out)
        return out

    def _schedule_prefill(self, request: Request, budget: int, out: SchedulerOutput) -> int:
        start = request.num_computed
        n = min(request.num_tokens - start, budget)
        while n > 0 and not self.cache.can_reserve(request.request_id, start + n):
            n //= 2
        if n == 0:
            return 0
        self.cache.reserve(request.request_id, start + n)
        out.prefills.append(PrefillChunk(request, start, n))
        return n

    def preempt(self, request: Request, out: SchedulerOutput) -> None:
        """Recompute preemption: drop the request's cache, requeue it first; its tokens are kept."""
        self.running.remove(request)
        self.cache.free(request.request_id)
        self.on_evict(request)
        request.num_computed = 0
        request.num_preemptions += 1
        request.status = RequestStatus.WAITING
        self.waiting.appendleft(request)
        out.preempted.append(request)
        if request in out.decodes:
            out.decodes.remove(request)

    def remove(self, request: Request) -> None:
        """Retire a finished or aborted request and free its cache at once."""
        if request in self.running:
            self.running.remove(request)
        elif request in self.waiting:
            self.waiting.remove(request)
        self.cache.free(request.request_id)
        self.on_evict(request)

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)
