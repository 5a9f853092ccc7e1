"""`mixed`: the paper's mixed strategy. Fill the k rows with context n-gram rows first (the
context's own repetitions are the most likely to be accepted), then with extended-bigram rows of
the last token. `stats()` reports how many rows each strategy got and how many tokens each got
accepted."""

from __future__ import annotations

from typing import Sequence

from ngspec.contracts import DraftContext
from ngspec.drafters.context_ngram import QgramIndex, context_rows
from ngspec.drafters.model_ngram import bigram_rows
from ngspec.drafters.ngram_tables import NgramTables
from ngspec.drafters.rows_base import Row, RowDrafter


class MixedDrafter(RowDrafter):
    name = "mixed"

    def __init__(self, k: int, w: int, tables: NgramTables, q: int = 1) -> None:
        super().__init__(k, w)
        self.tables, self.q = tables, q
        self.index = QgramIndex(q)

    def start(self, prompt: Sequence[int]) -> None:
        super().start(prompt)
        self.index = QgramIndex(self.q)

    def rows(self, ctx: DraftContext) -> list[Row]:
        self.index.sync(ctx.tokens)
        context = [("context", row) for row in context_rows(ctx.tokens, self.index, self.k, self.w)]
        # more bigram rows than needed: some may repeat a context row and be dropped
        return context + bigram_rows(self.tables, ctx.tokens[-1], self.k, self.w)
