"""Which row count a CPU model's packed linears run each small batch at, as measured on this host at warm-up.

Decode and verification feed a model a few rows per step, and each linear then streams its whole weight from
memory for them. What oneDNN takes for that is not monotone in the rows: on a Zen 4 VM (2 cores, float32) the
bundled target's linears, run in a forward pass's order, took 3.6-4.0 ms at 1-2 rows, 2.75-2.9 ms at 4-6 and
3.5-3.9 ms at 7-8 (its weights, 44 MB, never stay in cache); its draft model's (6 MB, which its k passes in a row
keep in cache) grew from 0.24-0.30 ms at 1 row to 0.40-0.43 ms at 8. Padded to 4-6 rows, plain decode at 1 and 2
requests ran 1.09x and 1.13-1.17x faster (bench/row_padding.py, in lockstep with exact rows). So each model's
linears are timed once per process at every row count up to ``EXACT_ROWS``, and a count runs at a larger one where
that was clearly faster, in two timings (`confirmed_padding`). Padded rows are zeros and are cut off again: a
row's result differs only in rounding, as it does between any two row counts.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence

import torch
from torch import nn

from engine.models.llama import EXACT_ROWS, PackedLinear, packed_linears

PADDING_GAIN = 0.15  # a larger row count is taken only where it ran this much faster
NEAR_BEST = 0.03  # ... and then the fewest rows within this share of the fastest count
TIMING_ROUNDS = 7  # each count's time is its median of this many passes, taken in turn with the other counts

_CALIBRATED: dict[tuple, tuple[int, ...]] = {}  # per model's linear shapes and dtype: its row padding, once a process


def calibrate_row_padding(model: nn.Module) -> tuple[int, ...] | None:
    """Time ``model``'s packed linears at each row count up to ``EXACT_ROWS`` and set the padding that
    `padding_table` makes of it on all of them; the table, or None for a model without packed linears (CUDA). A
    second model of the same shapes and dtype in the process (another engine of the same pair) reuses the table."""
    linears = packed_linears(model)
    if not linears:
        return None
    key = (linears[0].weight_dtype,
           *((linear.in_features, linear.out_features, linear.bias is not None) for linear in linears))
    table = _CALIBRATED.get(key)
    if table is None:
        table = _CALIBRATED[key] = confirmed_padding(linears)
    for linear in linears:
        linear.row_padding = table
    return table


def confirmed_padding(linears: list[PackedLinear]) -> tuple[int, ...]:
    """`padding_table` of a timing of every count up to ``EXACT_ROWS``, less each padding that the table of a second
    timing, of the counts involved, does not make too. Where the counts cost about alike, one timing's noise
    pads now and then: on an Intel Xeon at 2 threads (1-6 rows within 10% of each other), 2 of 10 timings padded (1-2
    rows to 4, 3 to 5), as did one engine's warm-up (1-2 to 4), and batch-1 decode then ran 0.90x its exact rows."""
    table = padding_table(time_row_counts(linears, range(1, EXACT_ROWS + 1)))
    padded = [rows for rows, target in enumerate(table) if target != rows]
    if not padded:
        return table
    again = padding_table(time_row_counts(linears, sorted({*padded, *(table[rows] for rows in padded)})))
    return tuple(target if target == rows or again[rows] != rows else rows for rows, target in enumerate(table))


def time_row_counts(linears: list[PackedLinear], counts: Sequence[int],
                    rounds: int = TIMING_ROUNDS) -> dict[int, float]:
    """Seconds of one pass through ``linears`` in order (as a forward pass meets them) per row count: the median
    of ``rounds``, the counts taken in turn so that a slow spell of the host touches all of them alike. The first
    pass of each count, where oneDNN builds its kernel, is not timed. (Over 5 rounds the fastest pass, a lucky one,
    padded the draft model's 11 rows to 12 and 4 to 5 in one process of a busy VM, where none of them pays.)"""
    inputs = {rows: {linear.in_features: torch.zeros(rows, linear.in_features, dtype=linear.weight_dtype)
                     for linear in linears} for rows in counts}
    passes: dict[int, list[float]] = {rows: [] for rows in counts}
    with torch.inference_mode():
        for timed in [False] + [True] * rounds:
            for rows in counts:
                start = time.perf_counter()
                for linear in linears:
                    linear.multiply(inputs[rows][linear.in_features])
                if timed:
                    passes[rows].append(time.perf_counter() - start)
    return {rows: statistics.median(seconds) for rows, seconds in passes.items()}


def padding_table(seconds: dict[int, float]) -> tuple[int, ...]:
    """Per row count (index; 0 unused): the count it runs at. A count keeps its own unless a larger one measured
    ran ``PADDING_GAIN`` faster; then it takes the fewest rows within ``NEAR_BEST`` of the fastest larger count."""
    counts = sorted(seconds)
    table = list(range(max(counts) + 1))
    for rows in counts:
        larger = [count for count in counts if count >= rows]
        fastest = min(seconds[count] for count in larger)
        if fastest < (1.0 - PADDING_GAIN) * seconds[rows]:
            table[rows] = next(count for count in larger if seconds[count] <= (1.0 + NEAR_BEST) * fastest)
    return tuple(table)
