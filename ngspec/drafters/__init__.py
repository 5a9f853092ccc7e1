"""Drafter registry: name -> factory. The command layer picks drafters by name only."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ngspec.contracts import Drafter
from ngspec.errors import NgspecError


@dataclass(frozen=True)
class DrafterOptions:
    """Every drafter option the CLI exposes; each drafter reads the ones it needs."""

    num_draft: int = 32  # trie: most nodes per tree (each step keeps those that pay off)
    ngram_n: int = 13  # trie: window length n
    prefix_len: int = 3  # trie: max prefix L_p (and backoff start)
    trie_update: bool = True  # trie: also insert generated tokens (measured to help)
    lookup_ngram: int = 3  # prompt-lookup: longest n-gram to match
    lookup_tokens: int = 10  # prompt-lookup: draft length

    def __post_init__(self) -> None:
        checks = {
            "--num-draft": self.num_draft >= 1,
            "--ngram-n": self.ngram_n >= 2,
            "--prefix-len": 1 <= self.prefix_len < self.ngram_n,
            "--lookup-ngram": self.lookup_ngram >= 1,
            "--lookup-tokens": self.lookup_tokens >= 1,
        }
        bad = [name for name, ok in checks.items() if not ok]
        if bad:
            raise NgspecError(
                f"invalid drafter option(s): {', '.join(bad)} (need num-draft >= 1, ngram-n >= 2, "
                "1 <= prefix-len < ngram-n, lookup-ngram >= 1, lookup-tokens >= 1)"
            )


def _vanilla(opts: DrafterOptions) -> Drafter:
    from ngspec.drafters.vanilla import VanillaDrafter

    return VanillaDrafter()


def _prompt_lookup(opts: DrafterOptions) -> Drafter:
    from ngspec.drafters.prompt_lookup import PromptLookupDrafter

    return PromptLookupDrafter(max_ngram=opts.lookup_ngram, num_tokens=opts.lookup_tokens)


def _trie(opts: DrafterOptions) -> Drafter:
    from ngspec.drafters.trie import TrieDrafter

    return TrieDrafter(
        n=opts.ngram_n,
        prefix_len=opts.prefix_len,
        num_draft=opts.num_draft,
        update=opts.trie_update,
    )


REGISTRY: dict[str, Callable[[DrafterOptions], Drafter]] = {
    "vanilla": _vanilla,
    "prompt-lookup": _prompt_lookup,
    "trie": _trie,
}


def make_drafter(name: str, opts: DrafterOptions | None = None) -> Drafter:
    if name not in REGISTRY:
        raise NgspecError(f"unknown drafter {name!r}; choose one of: {', '.join(REGISTRY)}")
    return REGISTRY[name](opts or DrafterOptions())
