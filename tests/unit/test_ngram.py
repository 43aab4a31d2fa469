"""NgramIndex: prompt-lookup proposals on hand-written sequences, and a property test against brute force."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.spec_decode.ngram import NgramIndex


def index_of(tokens: list[int], min_n: int = 2, max_n: int = 4) -> NgramIndex:
    index = NgramIndex(min_n=min_n, max_n=max_n)
    index.extend(tokens)
    return index


def brute_force(tokens: list[int], min_n: int, max_n: int, k: int) -> tuple[int, list[int]]:
    """O(length^2) reference: (match_len, proposal) by scanning every earlier end position."""
    length = len(tokens)
    for n in range(max_n, min_n - 1, -1):
        if n > length:
            continue
        suffix = tokens[length - n :]
        starts = [end for end in range(n, length) if tokens[end - n : end] == suffix]  # ends before the suffix's
        if starts:
            proposal: list[int] = []
            for i in range(max(starts), max(starts) + k):
                proposal.append(tokens[i] if i < length else proposal[i - length])
            return n, proposal
    return 0, []


def test_repeated_phrase_proposes_its_continuation():
    # "the quick brown fox jumps . the quick" -> "brown fox jumps"
    index = index_of([1, 2, 3, 4, 5, 9, 1, 2])
    assert index.match_len() == 2
    assert index.propose(3) == [3, 4, 5]
    assert len(index) == 8


def test_longest_n_is_preferred_over_a_more_recent_shorter_match():
    # suffix [7, 1, 2]: the trigram occurred at the start (-> 3); the bigram [1, 2] more recently (-> 4).
    index = index_of([7, 1, 2, 3, 0, 1, 2, 4, 0, 7, 1, 2])
    assert index.match_len() == 3
    assert index.propose(1) == [3]
    assert index_of([7, 1, 2, 3, 0, 1, 2, 4, 0, 7, 1, 2], max_n=2).propose(1) == [4]


def test_most_recent_occurrence_is_preferred():
    index = index_of([1, 2, 3, 1, 2, 4, 1, 2])
    assert index.propose(1) == [4]


def test_no_match_proposes_nothing():
    index = index_of([1, 2, 3, 4, 5])
    assert index.match_len() == 0
    assert index.propose(4) == []
    empty = NgramIndex()
    assert len(empty) == 0 and empty.match_len() == 0 and empty.propose(3) == []


def test_only_the_suffix_itself_is_not_a_match():
    index = index_of([5, 6])
    assert index.propose(2) == []  # [5, 6] occurs only as the suffix
    index.extend([5, 6])
    assert index.propose(2) == [5, 6]


def test_k_truncates_and_k_zero_is_empty():
    index = index_of([1, 2, 3, 4, 5, 6, 1, 2])
    assert index.propose(2) == [3, 4]
    assert index.propose(0) == []
    assert index.propose(-1) == []


def test_continuation_into_the_end_keeps_copying_periodically():
    index = index_of([8, 9, 8, 9])
    assert index.propose(5) == [8, 9, 8, 9, 8]
    index = index_of([4, 4, 4])  # overlapping earlier occurrence of [4, 4]
    assert index.match_len() == 2
    assert index.propose(3) == [4, 4, 4]


def test_min_n_bounds_the_match():
    assert index_of([1, 2, 3, 1], min_n=2).propose(2) == []
    assert index_of([1, 2, 3, 1], min_n=1).propose(2) == [2, 3]


def test_incremental_extend_with_lookups_in_between():
    index = NgramIndex(min_n=1, max_n=3)
    index.extend([1, 2, 3])
    assert index.propose(2) == []
    index.extend([1])
    assert index.match_len() == 1 and index.propose(2) == [2, 3]
    index.extend([2])
    assert index.match_len() == 2 and index.propose(2) == [3, 1]
    index.extend([])
    assert len(index) == 5


@pytest.mark.parametrize(("min_n", "max_n"), [(0, 2), (-1, 3), (3, 2)])
def test_invalid_n_range_is_rejected(min_n, max_n):
    with pytest.raises(ValueError):
        NgramIndex(min_n=min_n, max_n=max_n)


@settings(max_examples=150, deadline=None, derandomize=True)
@given(
    chunks=st.lists(st.lists(st.integers(0, 3), max_size=8), max_size=8),
    min_n=st.integers(1, 3),
    extra_n=st.integers(0, 2),
    k=st.integers(0, 6),
)
def test_incremental_index_matches_brute_force(chunks, min_n, extra_n, k):
    max_n = min_n + extra_n
    index = NgramIndex(min_n=min_n, max_n=max_n)
    seen: list[int] = []
    for chunk in chunks:
        index.extend(chunk)
        seen.extend(chunk)
        assert len(index) == len(seen)
        assert (index.match_len(), index.propose(k)) == brute_force(seen, min_n, max_n, k)

    from_scratch = index_of(seen, min_n=min_n, max_n=max_n)
    assert (from_scratch.match_len(), from_scratch.propose(k)) == (index.match_len(), index.propose(k))
