"""The self-repetition metric: how much of a response can be copied from its own history.

For input X and response Y: pointer p = 0; find the largest L such that Y[p:p+L] occurs as a
contiguous run inside X + Y[:p]; p += max(L, 1); count one step. The metric is |Y| / steps: the
acceptance length of search-only speculation with an unbounded tree over all history, i.e. the
ceiling against which a search drafter's tokens per call is judged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence


def _as_text(tokens: Sequence[int]) -> str:
    # one code point per token id: str.find then searches token runs in C
    return "".join(map(chr, tokens))


@dataclass(frozen=True)
class SelfRepetition:
    tokens: int
    steps: int
    match_lengths: tuple[int, ...]  # L of every step (0 when nothing matched)

    @property
    def value(self) -> float:
        return self.tokens / self.steps if self.steps else 0.0


def self_repetition(inp: Sequence[int], response: Sequence[int]) -> SelfRepetition:
    """The metric of one (input, response) pair, with the length found at every step."""
    text = _as_text(list(inp) + list(response))
    base = len(inp)
    n = len(response)
    p, lengths = 0, []
    while p < n:
        history = text[: base + p]
        length = 0
        while p + length < n and history.find(text[base + p : base + p + length + 1]) != -1:
            length += 1
        lengths.append(length)
        p += max(length, 1)
    return SelfRepetition(n, len(lengths), tuple(lengths))
