"""`vanilla`: proposes nothing, so every step is one plain decoding step (the baseline)."""

from __future__ import annotations

from typing import Sequence

from ngspec.contracts import DraftContext, DraftTree


class VanillaDrafter:
    name = "vanilla"

    def start(self, prompt: Sequence[int]) -> None:
        pass

    def propose(self, ctx: DraftContext) -> DraftTree:
        return DraftTree()

    def observe(self, new_tokens: Sequence[int]) -> None:
        pass
