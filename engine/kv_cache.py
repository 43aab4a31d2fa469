"""KV cache with rollback: a slotted contiguous backend and a paged block backend.

Both keep, per layer, one flat tensor ``[capacity_tokens, kv_heads, head_dim]`` for K and
one for V; a backend only decides which flat index holds a request's position ``p``:

- slotted: request slot ``s`` owns the contiguous range ``[s * max_seq_len, (s+1) * max_seq_len)``;
- paged: position ``p`` lives in block ``table[p // block_size]`` at offset ``p % block_size``.

Rollback is bookkeeping: ``truncate_to`` lowers the request's length (stale entries are
overwritten by the next write); the paged backend also frees whole blocks past the new end.
"""

from __future__ import annotations

from typing import Protocol

import torch


class OutOfCapacityError(RuntimeError):
    """No free slot or block; the scheduler preempts or waits."""


class KVCache(Protocol):
    layers: list[tuple[torch.Tensor, torch.Tensor]]

    def allocate(self, request_id: str) -> None: ...
    def can_allocate(self, num_tokens: int) -> bool: ...
    def reserve(self, request_id: str, new_len: int) -> None:
        """Make positions [0, new_len) addressable; raises OutOfCapacityError."""
        ...
    def can_reserve(self, request_id: str, new_len: int) -> bool: ...
    def truncate_to(self, request_id: str, new_len: int) -> None: ...
    def free(self, request_id: str) -> None: ...
    def indices(self, request_id: str, length: int) -> torch.Tensor:
        """Flat cache indices of positions [0, length)."""
        ...
    def length(self, request_id: str) -> int: ...
    def __contains__(self, request_id: str) -> bool: ...
    @property
    def num_used_blocks(self) -> int: ...
    @property
    def num_total_blocks(self) -> int: ...
    @property
    def num_requests(self) -> int: ...


def _layer_tensors(num_layers: int, capacity: int, kv_heads: int, head_dim: int,
                   dtype: torch.dtype, device: torch.device) -> list[tuple[torch.Tensor, torch.Tensor]]:
    shape = (capacity, kv_heads, head_dim)
    return [(torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))
            for _ in range(num_layers)]


class SlottedKVCache:
    """One contiguous max_seq_len region per request; a "block" is a whole slot."""

    def __init__(self, num_layers: int, kv_heads: int, head_dim: int, num_slots: int, max_seq_len: int,
                 dtype: torch.dtype, device: torch.device) -> None:
        self.max_seq_len = max_seq_len
        self.layers = _layer_tensors(num_layers, num_slots * max_seq_len, kv_heads, head_dim, dtype, device)
        self.free_slots = list(range(num_slots - 1, -1, -1))
        self.slot_of: dict[str, int] = {}
        self.len_of: dict[str, int] = {}
        self._arange = torch.arange(max_seq_len)

    def can_allocate(self, num_tokens: int) -> bool:
        return bool(self.free_slots) and num_tokens <= self.max_seq_len

    def allocate(self, request_id: str) -> None:
        if request_id in self.slot_of:
            raise ValueError(f"request {request_id!r} already holds a slot")
        if not self.free_slots:
            raise OutOfCapacityError("no free KV slot")
        self.slot_of[request_id] = self.free_slots.pop()
        self.len_of[request_id] = 0

    def can_reserve(self, request_id: str, new_len: int) -> bool:
        return new_len <= self.max_seq_len

    def reserve(self, request_id: str, new_len: int) -> None:
        if new_len > self.max_seq_len:
            raise OutOfCapacityError(f"{new_len} tokens exceed the slot size {self.max_seq_len}")
        self.len_of[request_id] = max(self.len_of[request_id], new_len)

    def truncate_to(self, request_id: str, new_len: int) -> None:
        self.len_of[request_id] = min(self.len_of[request_id], new_len)

    def free(self, request_id: str) -> None:
        slot = self.slot_of.pop(request_id, None)
        if slot is not None:
            self.free_slots.append(slot)
            del self.len_of[request_id]

    def indices(self, request_id: str, length: int) -> torch.Tensor:
        return self._arange[:length] + self.slot_of[request_id] * self.max_seq_len

    def length(self, request_id: str) -> int:
        return self.len_of[request_id]

    def __contains__(self, request_id: str) -> bool:
        return request_id in self.len_of

    @property
    def num_used_blocks(self) -> int:
        return len(self.slot_of)

    @property
    def num_total_blocks(self) -> int:
        return len(self.slot_of) + len(self.free_slots)

    @property
    def num_requests(self) -> int:
        return len(self.slot_of)


class PagedKVCache:
    """Fixed-size blocks from a free list, allocated on demand; a block table per request."""

    def __init__(self, num_layers: int, kv_heads: int, head_dim: int, num_blocks: int, block_size: int,
                 dtype: torch.dtype, device: torch.device) -> None:
        self.block_size = block_size
        self.layers = _layer_tensors(num_layers, num_blocks * block_size, kv_heads, head_dim, dtype, device)
        self.free_blocks = list(range(num_blocks - 1, -1, -1))
        self.tables: dict[str, list[int]] = {}
        self.len_of: dict[str, int] = {}
        self._flat: dict[str, torch.Tensor] = {}  # flat cache index of every position the table covers
        self._total = num_blocks
        self._offsets = torch.arange(block_size)

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def can_allocate(self, num_tokens: int) -> bool:
        return self.blocks_for(num_tokens) <= len(self.free_blocks)

    def allocate(self, request_id: str) -> None:
        if request_id in self.tables:
            raise ValueError(f"request {request_id!r} already holds blocks")
        self.tables[request_id] = []
        self.len_of[request_id] = 0
        self._flat[request_id] = torch.empty(0, dtype=torch.long)

    def can_reserve(self, request_id: str, new_len: int) -> bool:
        return self.blocks_for(new_len) - len(self.tables[request_id]) <= len(self.free_blocks)

    def reserve(self, request_id: str, new_len: int) -> None:
        table = self.tables[request_id]
        needed = self.blocks_for(new_len) - len(table)
        if needed > len(self.free_blocks):
            raise OutOfCapacityError(f"need {needed} KV blocks, {len(self.free_blocks)} free")
        if needed > 0:
            new = [self.free_blocks.pop() for _ in range(needed)]
            table += new
            positions = (torch.tensor(new)[:, None] * self.block_size + self._offsets[None, :]).flatten()
            self._flat[request_id] = torch.cat([self._flat[request_id], positions])
        self.len_of[request_id] = max(self.len_of[request_id], new_len)

    def truncate_to(self, request_id: str, new_len: int) -> None:
        table = self.tables[request_id]
        keep = self.blocks_for(new_len)
        while len(table) > keep:
            self.free_blocks.append(table.pop())
        self._flat[request_id] = self._flat[request_id][: keep * self.block_size]
        self.len_of[request_id] = min(self.len_of[request_id], new_len)

    def free(self, request_id: str) -> None:
        table = self.tables.pop(request_id, None)
        if table is not None:
            self.free_blocks.extend(reversed(table))
            del self.len_of[request_id], self._flat[request_id]

    def indices(self, request_id: str, length: int) -> torch.Tensor:
        return self._flat[request_id][:length]

    def length(self, request_id: str) -> int:
        return self.len_of[request_id]

    def __contains__(self, request_id: str) -> bool:
        return request_id in self.len_of

    @property
    def num_used_blocks(self) -> int:
        return self._total - len(self.free_blocks)

    @property
    def num_total_blocks(self) -> int:
        return self._total

    @property
    def num_requests(self) -> int:
        return len(self.tables)


def make_kv_cache(kind: str, *, num_layers: int, kv_heads: int, head_dim: int, max_running: int,
                  max_seq_len: int, num_blocks: int | None, block_size: int,
                  dtype: torch.dtype, device: torch.device) -> KVCache:
    if kind == "slotted":
        return SlottedKVCache(num_layers, kv_heads, head_dim, max_running, max_seq_len, dtype, device)
    if kind == "paged":
        blocks = num_blocks or max_running * (-(-max_seq_len // block_size))
        return PagedKVCache(num_layers, kv_heads, head_dim, blocks, block_size, dtype, device)
    raise ValueError(f"unknown kv cache kind {kind!r} (slotted|paged)")
