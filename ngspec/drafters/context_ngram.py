"""`context-ngram`: rows copied from after every earlier occurrence of the last q tokens.

All earlier occurrences of the last q tokens of the context (q = 1 by default, which the paper found
best) are each followed by up to w tokens; identical continuations are counted, and the k most
frequent become rows, ties going to the most recent. The index of q-grams grows with the context,
so a step costs one dictionary lookup plus the occurrences of that q-gram.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Sequence

from ngspec.contracts import DraftContext
from ngspec.drafters.rows_base import Row, RowDrafter
from ngspec.errors import NgspecError


class QgramIndex:
    """End positions of every q-gram of a growing token list."""

    def __init__(self, q: int) -> None:
        self.q = q
        self.ends: dict[tuple[int, ...], list[int]] = defaultdict(list)
        self.last_end = q - 1  # the q-grams ending at or before this position are indexed

    def sync(self, tokens: Sequence[int]) -> None:
        """Index the q-grams of the tokens appended since the last call."""
        for end in range(self.last_end + 1, len(tokens) + 1):
            self.ends[tuple(tokens[end - self.q : end])].append(end)
        self.last_end = max(self.last_end, len(tokens))


def context_rows(tokens: Sequence[int], index: QgramIndex, k: int, w: int) -> list[tuple[int, ...]]:
    """The k most frequent w-token continuations of the last q-gram (ties: most recent first)."""
    if len(tokens) < index.q:
        return []
    counts: dict[tuple[int, ...], int] = {}
    recency: dict[tuple[int, ...], int] = {}
    for end in index.ends.get(tuple(tokens[len(tokens) - index.q :]), ()):
        follow = tuple(tokens[end : end + w])
        if follow:  # the current occurrence (at the very end) has nothing after it
            counts[follow] = counts.get(follow, 0) + 1
            recency[follow] = end
    ranked = sorted(counts, key=lambda c: (-counts[c], -recency[c]))
    return ranked[:k]


class ContextNgramDrafter(RowDrafter):
    name = "context-ngram"

    def __init__(self, k: int, w: int, q: int = 1) -> None:
        super().__init__(k, w)
        if q < 1:
            raise NgspecError(f"--ngram-q must be at least 1 (got {q})")
        self.q = q
        self.index = QgramIndex(q)

    def start(self, prompt: Sequence[int]) -> None:
        super().start(prompt)
        self.index = QgramIndex(self.q)

    def rows(self, ctx: DraftContext) -> list[Row]:
        self.index.sync(ctx.tokens)
        return [("context", row) for row in context_rows(ctx.tokens, self.index, self.k, self.w)]
