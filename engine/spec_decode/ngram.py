"""Prompt-lookup proposal at the token level: find the sequence's current suffix earlier in the sequence and
propose what followed it there. No model, no engine dependencies; one ``NgramIndex`` per request."""

from __future__ import annotations

from collections.abc import Sequence


class NgramIndex:
    """Per-request incremental index over prompt+output token ids: maps each n-gram (for n in [min_n, max_n]) to
    the most recent position where it ENDED, *excluding* the current suffix, so lookups are O(max_n) per step,
    not O(length).

    Invariant: ``_last_end`` holds every n-gram that ends at or before position ``len - 2``, mapped to the
    exclusive end of its most recent such occurrence (the position where its continuation starts). The n-grams
    ending at the newest token (the current suffixes) are inserted only when the next token arrives, so a
    lookup of a suffix can never find the suffix itself. Earlier occurrences may overlap the suffix
    (``a a a`` matches ``a a`` one position back), which is what makes periodic text cheap to predict.
    """

    def __init__(self, min_n: int = 2, max_n: int = 4) -> None:
        if min_n < 1:
            raise ValueError(f"min_n must be >= 1; got {min_n}")
        if max_n < min_n:
            raise ValueError(f"max_n must be >= min_n; got min_n={min_n}, max_n={max_n}")
        self.min_n = min_n
        self.max_n = max_n
        self._token_ids: list[int] = []
        self._last_end: dict[tuple[int, ...], int] = {}  # n-gram -> exclusive end of its latest earlier occurrence

    def __len__(self) -> int:
        return len(self._token_ids)

    def extend(self, token_ids: Sequence[int]) -> None:
        """Append tokens (the prompt first, then each step's accepted tokens). O(max_n) n-grams per token."""
        for token_id in token_ids:
            self._index_current_suffixes()
            self._token_ids.append(int(token_id))

    def match_len(self) -> int:
        """The largest n in [min_n, max_n] whose last-n suffix occurred earlier; 0 if none."""
        match = self._longest_match()
        return 0 if match is None else match[0]

    def propose(self, k: int) -> list[int]:
        """Up to ``k`` tokens that followed the most recent earlier occurrence of the longest matching suffix.

        Returns ``[]`` when no suffix of length min_n..max_n occurred before, or when ``k <= 0``. When the
        continuation runs into the end of the sequence, copying *continues*: the proposal treats the sequence as
        periodic with period ``len - start`` (``x y x y`` proposes ``x y x y ...``), so the result always has
        exactly ``k`` tokens when there is a match. Drafts are verified anyway; a repeating loop is exactly where
        long drafts pay off.
        """
        match = None if k <= 0 else self._longest_match()
        if match is None:
            return []
        start = match[1]
        tokens = self._token_ids
        length = len(tokens)
        proposal: list[int] = []
        for i in range(start, start + k):
            proposal.append(tokens[i] if i < length else proposal[i - length])
        return proposal

    def _longest_match(self) -> tuple[int, int] | None:
        """(n, start of the continuation) for the longest suffix found earlier, or None."""
        tokens = self._token_ids
        for n in range(min(self.max_n, len(tokens)), self.min_n - 1, -1):
            start = self._last_end.get(tuple(tokens[-n:]))
            if start is not None:
                return n, start
        return None

    def _index_current_suffixes(self) -> None:
        """Record the n-grams ending at the newest token; called just before a token is appended after it."""
        tokens = self._token_ids
        end = len(tokens)
        for n in range(self.min_n, min(self.max_n, end) + 1):
            self._last_end[tuple(tokens[end - n : end])] = end
