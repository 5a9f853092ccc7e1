"""The self-repetition metric: how much of a response can be copied from its own history.

For input X and response Y: pointer p = 0; find the largest L such that Y[p:p+L] occurs as a
contiguous run inside X + Y[:p] (or, when a datastore is given, inside the datastore); p += max(L, 1);
count one step. The metric is |Y| / steps: the acceptance length of search-only speculation with
an unbounded tree over all history, i.e. the ceiling against which a search drafter's tokens per
call is judged.

If Y[p:p+L] occurs, so does every shorter prefix, so L is found by galloping then binary search;
each probe of the history is one `str.find` over one code point per token (C speed).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol, Sequence


class Searchable(Protocol):
    def occurs(self, query: Sequence[int]) -> bool: ...


def _as_text(tokens: Sequence[int]) -> str:
    return "".join(map(chr, tokens))


@dataclass(frozen=True)
class SelfRepetition:
    tokens: int
    steps: int
    match_lengths: tuple[int, ...]  # L of every step (0 when nothing matched)

    @property
    def value(self) -> float:
        return self.tokens / self.steps if self.steps else 0.0


def longest(occurs: Callable[[int], bool], limit: int) -> int:
    """Largest L in [0, limit] with occurs(L), for a monotone predicate (occurs(0) is true)."""
    if limit == 0 or not occurs(1):
        return 0
    lo, step = 1, 2
    while step <= limit and occurs(step):
        lo, step = step, step * 2
    hi = min(step, limit + 1)  # occurs(lo) holds; occurs(hi) fails or hi is past the limit
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if occurs(mid):
            lo = mid
        else:
            hi = mid
    return lo


def self_repetition(inp: Sequence[int], response: Sequence[int], datastore: Searchable | None = None) -> SelfRepetition:
    """The metric of one (input, response) pair, with the length found at every step."""
    response = list(response)
    text = _as_text(list(inp) + response)
    base, n = len(inp), len(response)
    p, lengths = 0, []
    while p < n:
        end = base + p
        length = longest(lambda L: text.find(text[end : end + L], 0, end) != -1, n - p)
        if datastore is not None and length < n - p:
            from_store = longest(lambda L: datastore.occurs(response[p : p + L]), n - p)
            length = max(length, from_store)
        lengths.append(length)
        p += max(length, 1)
    return SelfRepetition(n, len(lengths), tuple(lengths))
