"""`prompt-lookup`: a chain copied from after the most recent earlier match of the last n-gram.

Like transformers' prompt lookup decoding: try n-gram sizes from ``max_ngram`` down to 1 and copy
up to ``num_tokens`` tokens that followed the match (here the most recent match, not the first).
A match says "the text repeats itself at this distance"; when the copied continuation reaches
the end of the context, the chain goes on at the same distance, through the tokens it has just
drafted. In a loop shorter than ``num_tokens`` (a model repeating one or two tokens, say) the most
recent match would otherwise yield only as many tokens as the loop is long.
"""

from __future__ import annotations

from typing import Sequence

from ngspec.contracts import DraftContext, DraftTree


def lookup_chain(tokens: Sequence[int], max_ngram: int, num_tokens: int) -> list[int]:
    """Continuation of the most recent earlier occurrence of the longest matching suffix n-gram,
    continued periodically (at the match's distance) past the end of the context."""
    n_tok = len(tokens)
    for n in range(min(max_ngram, n_tok - 1), 0, -1):
        pattern = list(tokens[n_tok - n :])
        first = pattern[0]
        # scan backwards: the most recent occurrence that ends before the suffix itself
        for start in range(n_tok - n - 1, -1, -1):
            if tokens[start] == first and list(tokens[start : start + n]) == pattern:
                src = start + n  # the context's token at src + j predicts draft token j
                follow: list[int] = []
                for i in range(src, src + num_tokens):
                    follow.append(tokens[i] if i < n_tok else follow[i - n_tok])
                return follow
    return []


class PromptLookupDrafter:
    name = "prompt-lookup"

    def __init__(self, max_ngram: int = 3, num_tokens: int = 10) -> None:
        self.max_ngram = max_ngram
        self.num_tokens = num_tokens

    def start(self, prompt: Sequence[int]) -> None:
        pass

    def propose(self, ctx: DraftContext) -> DraftTree:
        return DraftTree.chain(lookup_chain(ctx.tokens, self.max_ngram, self.num_tokens))

    def observe(self, new_tokens: Sequence[int]) -> None:
        pass
