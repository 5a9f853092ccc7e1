"""`unigram` and `bigram`: rows from the model-derived tables (see `ngram_tables`).

* `bigram`: the extended bigram of the last token: its top-k next tokens, each continued greedily
  to w tokens.
* `unigram`: the k highest-ranked unigram tokens, each continued greedily with the bigram to w
  tokens; the same rows every step, whatever the context.
"""

from __future__ import annotations

from ngspec.contracts import DraftContext
from ngspec.drafters.ngram_tables import NgramTables
from ngspec.drafters.rows_base import Row, RowDrafter


def bigram_rows(tables: NgramTables, last: int, k: int, w: int) -> list[Row]:
    if not 0 <= last < tables.vocab_size:
        return []
    chains = tables.extended[last, :k, :w]
    return [("bigram", tuple(int(t) for t in row)) for row in chains]


class BigramDrafter(RowDrafter):
    name = "bigram"

    def __init__(self, k: int, w: int, tables: NgramTables) -> None:
        super().__init__(k, w)
        self.tables = tables

    def rows(self, ctx: DraftContext) -> list[Row]:
        return bigram_rows(self.tables, ctx.tokens[-1], self.k, self.w)


class UnigramDrafter(RowDrafter):
    name = "unigram"

    def __init__(self, k: int, w: int, tables: NgramTables) -> None:
        super().__init__(k, w)
        self._rows = [("unigram", tuple(tables.chain(int(t), w))) for t in tables.unigram[:k]]

    def rows(self, ctx: DraftContext) -> list[Row]:
        return self._rows
