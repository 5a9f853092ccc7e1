"""Drafter registry: name -> factory. The command layer picks drafters by name only."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Optional

from ngspec.contracts import Drafter
from ngspec.errors import NgspecError

if TYPE_CHECKING:
    from ngspec.datastore.index import Datastore
    from ngspec.drafters.eagle import EagleDrafter
    from ngspec.drafters.ngram_tables import NgramTables
    from ngspec.drafters.trie import Calibration


@dataclass(frozen=True)
class DrafterOptions:
    """Every drafter option the CLI exposes; each drafter reads the ones it needs."""

    num_draft: int = 32  # trie: most nodes per tree (each step keeps those that pay off)
    ngram_n: int = 13  # trie: window length n
    prefix_len: int = 3  # trie: max prefix L_p (and backoff start)
    trie_update: bool = True  # trie: also insert generated tokens (measured to help)
    lookup_ngram: int = 3  # prompt-lookup: longest n-gram to match
    lookup_tokens: int = 10  # prompt-lookup: draft length
    k: int = 4  # row drafters: rows per step
    w: int = 4  # row drafters: tokens per row
    ngram_q: int = 1  # context-ngram / mixed: length of the matched suffix
    search_depth: int = 16  # search, eagle+search: tokens in the search branch
    deepen: bool = False  # eagle+search: hang the search branch below the first EAGLE branch

    def __post_init__(self) -> None:
        checks = {  # option: (holds, what it needs)
            "--num-draft": (self.num_draft >= 1, ">= 1"),
            "--ngram-n": (self.ngram_n >= 2, ">= 2"),
            "--prefix-len": (1 <= self.prefix_len < self.ngram_n, f"from 1 to --ngram-n - 1 ({self.ngram_n - 1})"),
            "--lookup-ngram": (self.lookup_ngram >= 1, ">= 1"),
            "--lookup-tokens": (self.lookup_tokens >= 1, ">= 1"),
            "--k": (self.k >= 1, ">= 1"),
            "--w": (self.w >= 1, ">= 1"),
            "--ngram-q": (self.ngram_q >= 1, ">= 1"),
            "--search-depth": (self.search_depth >= 1, ">= 1"),
        }
        bad = [f"{name} must be {need} (got {getattr(self, name[2:].replace('-', '_'))})" for name, (ok, need) in checks.items() if not ok]
        if bad:
            raise NgspecError("; ".join(bad))


@dataclass(frozen=True)
class Resources:
    """What some drafters need beyond options: the model's n-gram tables (unigram, bigram,
    mixed), a ready EAGLE drafter factory (eagle, eagle+search) and a datastore (search,
    eagle+search; optional), and the calibration of a drafter's estimates carried across the
    prompts of a run (trie, search, eagle, eagle+search; see `Calibration`)."""

    tables: Optional["NgramTables"] = None
    eagle: Optional[Callable[[], "EagleDrafter"]] = None
    datastore: Optional["Datastore"] = None
    calibration: Optional["Calibration"] = None


def _vanilla(opts: DrafterOptions, res: Resources) -> Drafter:
    from ngspec.drafters.vanilla import VanillaDrafter

    return VanillaDrafter()


def _prompt_lookup(opts: DrafterOptions, res: Resources) -> Drafter:
    from ngspec.drafters.prompt_lookup import PromptLookupDrafter

    return PromptLookupDrafter(max_ngram=opts.lookup_ngram, num_tokens=opts.lookup_tokens)


def _trie(opts: DrafterOptions, res: Resources) -> Drafter:
    from ngspec.drafters.trie import TrieDrafter

    return TrieDrafter(
        n=opts.ngram_n,
        prefix_len=opts.prefix_len,
        num_draft=opts.num_draft,
        update=opts.trie_update,
        calibration=res.calibration,
    )


def _context_ngram(opts: DrafterOptions, res: Resources) -> Drafter:
    from ngspec.drafters.context_ngram import ContextNgramDrafter

    return ContextNgramDrafter(opts.k, opts.w, opts.ngram_q)


def _unigram(opts: DrafterOptions, res: Resources) -> Drafter:
    from ngspec.drafters.model_ngram import UnigramDrafter

    return UnigramDrafter(opts.k, opts.w, res.tables)


def _bigram(opts: DrafterOptions, res: Resources) -> Drafter:
    from ngspec.drafters.model_ngram import BigramDrafter

    return BigramDrafter(opts.k, opts.w, res.tables)


def _mixed(opts: DrafterOptions, res: Resources) -> Drafter:
    from ngspec.drafters.mixed import MixedDrafter

    return MixedDrafter(opts.k, opts.w, res.tables, opts.ngram_q)


def _eagle(opts: DrafterOptions, res: Resources) -> Drafter:
    from ngspec.drafters.search import EagleSearchDrafter

    return EagleSearchDrafter.alone(res.eagle(), res.calibration)


def _search(opts: DrafterOptions, res: Resources) -> Drafter:
    from ngspec.drafters.search import SearchDrafter

    return SearchDrafter(res.datastore, opts.search_depth, opts.prefix_len, res.calibration)


def _eagle_search(opts: DrafterOptions, res: Resources) -> Drafter:
    from ngspec.drafters.search import EagleSearchDrafter

    return EagleSearchDrafter(res.eagle(), res.datastore, opts.search_depth, opts.prefix_len, opts.deepen, res.calibration)


REGISTRY: dict[str, Callable[[DrafterOptions, Resources], Drafter]] = {
    "vanilla": _vanilla,
    "prompt-lookup": _prompt_lookup,
    "trie": _trie,
    "context-ngram": _context_ngram,
    "unigram": _unigram,
    "bigram": _bigram,
    "mixed": _mixed,
    "eagle": _eagle,
    "search": _search,
    "eagle+search": _eagle_search,
}
NEEDS_TABLES = frozenset({"unigram", "bigram", "mixed"})  # model-derived tables (`build-bigram`)
NEEDS_HEAD = frozenset({"eagle", "eagle+search"})  # an EAGLE draft head (--eagle-head)
ROW_DRAFTERS = frozenset({"context-ngram", "unigram", "bigram", "mixed"})  # sized by --k and --w
SEARCHES = frozenset({"search", "eagle+search"})  # read --datastore (optional)


def check_drafter(name: str) -> None:
    if not isinstance(name, str) or name not in REGISTRY:  # a list is unhashable: a TypeError in `in`
        raise NgspecError(f"unknown drafter {name!r}; choose one of: {', '.join(REGISTRY)}")


def make_drafter(
    name: str,
    opts: DrafterOptions | None = None,
    tables: "NgramTables | None" = None,
    eagle: Callable | None = None,
    datastore: "Datastore | None" = None,
    calibration: "Calibration | None" = None,
) -> Drafter:
    """A fresh drafter; ``tables`` (from `ngram_tables.cached_tables`) for the model-derived ones,
    ``eagle`` (a factory holding a loaded head) for eagle and eagle+search, ``datastore`` for the
    search drafters; ``calibration`` carried from the drafters of a run's earlier prompts (give the
    drafters of one run the same one; drafters that do not calibrate ignore it)."""
    check_drafter(name)
    if name in NEEDS_TABLES and tables is None:
        raise NgspecError(f"the {name} drafter needs the model's n-gram tables")
    if name in NEEDS_HEAD and eagle is None:
        raise NgspecError(f"the {name} drafter needs an EAGLE head (--eagle-head DIR; `ngspec train-eagle` makes one)")
    return REGISTRY[name](opts or DrafterOptions(), Resources(tables, eagle, datastore, calibration))
