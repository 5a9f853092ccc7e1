"""`mixed`: the paper's mixed strategy. Fill the k rows with context n-gram rows first (the
context's own repetitions are the most likely to be accepted), then with extended-bigram rows of
the last token. `stats()` reports how many rows each strategy got and how many tokens each got
accepted."""

from __future__ import annotations

from ngspec.contracts import DraftContext
from ngspec.drafters.context_ngram import ContextNgramDrafter
from ngspec.drafters.model_ngram import bigram_rows
from ngspec.drafters.ngram_tables import NgramTables
from ngspec.drafters.rows_base import Row


class MixedDrafter(ContextNgramDrafter):
    name = "mixed"

    def __init__(self, k: int, w: int, tables: NgramTables, q: int = 1) -> None:
        super().__init__(k, w, q)
        self.tables = tables

    def rows(self, ctx: DraftContext) -> list[Row]:
        # more bigram rows than needed: some may repeat a context row and be dropped
        return super().rows(ctx) + bigram_rows(self.tables, ctx.tokens[-1], self.k, self.w)
