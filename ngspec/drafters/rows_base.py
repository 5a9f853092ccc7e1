"""Shared base of the row drafters (learning-free n-gram paper): k rows of up to w tokens each,
every row labelled with the strategy that produced it, and the accounting the paper's ablation
needs (rows allocated and tokens accepted per strategy, rank of the accepted row among the k)."""

from __future__ import annotations

from collections import Counter
from typing import Sequence

from ngspec.contracts import DraftContext, DraftTree
from ngspec.errors import NgspecError

Row = tuple[str, tuple[int, ...]]  # (strategy, tokens)


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


class RowDrafter:
    """Subclasses implement `rows(ctx)`; this class merges the rows into the draft tree (the
    engine verifies it as rows or as a tree) and keeps the per-strategy statistics."""

    name = "rows"

    def __init__(self, k: int, w: int) -> None:
        if k < 1 or w < 1:
            raise NgspecError(f"{self.name}: --k and --w must be at least 1 (got k={k}, w={w})")
        self.k, self.w = k, w
        self._last: list[Row] = []
        self.rows_allocated: Counter[str] = Counter()
        self.tokens_accepted: Counter[str] = Counter()
        self.winning_rank: Counter[int] = Counter()

    def rows(self, ctx: DraftContext) -> list[Row]:
        raise NotImplementedError

    def start(self, prompt: Sequence[int]) -> None:
        self._last = []

    def propose(self, ctx: DraftContext) -> DraftTree:
        seen: set[tuple[int, ...]] = set()
        kept: list[Row] = []
        for strategy, row in self.rows(ctx):
            row = tuple(row[: self.w])
            if row and row not in seen:
                seen.add(row)
                kept.append((strategy, row))
            if len(kept) == self.k:
                break
        self._last = kept
        self.rows_allocated.update(s for s, _ in kept)
        return DraftTree.from_paths([row for _, row in kept])

    def observe(self, new_tokens: Sequence[int]) -> None:
        if not self._last:
            return
        accepted = max(len(new_tokens) - 1, 0)  # the last emitted token is the target's own
        best_rank, best = -1, 0
        for rank, (_, row) in enumerate(self._last):
            n = min(common_prefix(row, new_tokens), accepted)
            if n > best:
                best_rank, best = rank, n
        if best:
            self.tokens_accepted[self._last[best_rank][0]] += best
            self.winning_rank[best_rank + 1] += 1
        self._last = []

    def stats(self) -> dict:
        return {
            "rows_allocated": dict(self.rows_allocated),
            "tokens_accepted": dict(self.tokens_accepted),
            "accepted_row_rank": {str(r): n for r, n in sorted(self.winning_rank.items())},
        }
