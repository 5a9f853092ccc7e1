"""Drafter options shared by `generate`, `bench` and `tune-tree`, declared once.

Typer has no option groups, so `with_drafting_options` appends these parameters to a command's
signature and hands the command one `Drafting` object instead of twenty arguments. `Drafting`
validates everything before a model is loaded and then loads what the chosen drafters need
(n-gram tables, an EAGLE head, a datastore).
"""

from __future__ import annotations

import functools
import inspect
import typing
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Annotated, Optional

import typer

from ngspec.drafters import NEEDS_HEAD, NEEDS_TABLES, REGISTRY, ROW_DRAFTERS, SEARCHES, DrafterOptions, Resources
from ngspec.errors import NgspecError

PANEL = "Drafter options"
EAGLE = "EAGLE options"
SEARCH = "Search options (search, eagle+search)"


@dataclass(frozen=True)
class Drafting:
    num_draft: Annotated[int, typer.Option("--num-draft", help="trie: most nodes per draft tree; each step keeps as many as pay off under the measured verify cost.", rich_help_panel=PANEL)] = DrafterOptions.num_draft
    ngram_n: Annotated[int, typer.Option("--ngram-n", help="trie: n-gram window n.", rich_help_panel=PANEL)] = DrafterOptions.ngram_n
    prefix_len: Annotated[int, typer.Option("--prefix-len", help="trie, search: max prefix length L_p matched in the context trie (backoff starts here).", rich_help_panel=PANEL)] = DrafterOptions.prefix_len
    trie_update: Annotated[bool, typer.Option("--trie-update/--no-trie-update", help="trie: also insert generated tokens (measured to help; the paper builds from the prompt only).", rich_help_panel=PANEL)] = DrafterOptions.trie_update
    lookup_ngram: Annotated[int, typer.Option("--lookup-ngram", help="prompt-lookup: longest n-gram to match.", rich_help_panel=PANEL)] = DrafterOptions.lookup_ngram
    lookup_tokens: Annotated[int, typer.Option("--lookup-tokens", help="prompt-lookup: tokens copied per draft.", rich_help_panel=PANEL)] = DrafterOptions.lookup_tokens
    k: Annotated[Optional[str], typer.Option("--k", help="Row drafters (context-ngram, unigram, bigram, mixed): rows per step (default: from --profile, else 2 on CPU and 10 on GPU); in bench a list or range (1,2,4 or 1..8) sweeps a (k, w) grid.", rich_help_panel=PANEL)] = None
    w: Annotated[Optional[str], typer.Option("--w", help="Row drafters: tokens per row (default: from --profile, else 1 on CPU and 10 on GPU); in bench a list or range sweeps.", rich_help_panel=PANEL)] = None
    ngram_q: Annotated[int, typer.Option("--ngram-q", help="context-ngram, mixed: match the last q tokens.", rich_help_panel=PANEL)] = DrafterOptions.ngram_q
    bigram_table: Annotated[Optional[Path], typer.Option("--bigram-table", help="unigram/bigram/mixed: table file from `ngspec build-bigram --out` (default: built once per model and cached).", rich_help_panel=PANEL)] = None
    eagle_head: Annotated[Optional[Path], typer.Option("--eagle-head", help="eagle, eagle+search: an EAGLE-1 or EAGLE-3 head directory (public layout; `ngspec train-eagle` makes EAGLE-1 heads).", rich_help_panel=EAGLE)] = None
    tree: Annotated[Optional[str], typer.Option("--tree", help="eagle: dynamic (EAGLE-2: expand the best nodes per depth, keep the best --total-tokens) or static (EAGLE-1 choices, e.g. a shape from `ngspec tune-tree`). Default: static when --tree-choices is given, else dynamic.", rich_help_panel=EAGLE)] = None
    tree_top_k: Annotated[Optional[int], typer.Option("--tree-top-k", help="eagle dynamic: nodes expanded per depth and children per node (default 8).", rich_help_panel=EAGLE)] = None
    tree_depth: Annotated[Optional[int], typer.Option("--tree-depth", help="eagle dynamic: draft depth (default 5).", rich_help_panel=EAGLE)] = None
    total_tokens: Annotated[Optional[int], typer.Option("--total-tokens", help="eagle dynamic: draft nodes kept per step (default 32).", rich_help_panel=EAGLE)] = None
    tree_choices: Annotated[Optional[Path], typer.Option("--tree-choices", help="eagle static: a tree shape, either a JSON list of paths of child ranks ([[0],[1],[0,0]]) or a `tune-tree` output file (default: a 17-node tree).", rich_help_panel=EAGLE)] = None
    draft_vocab: Annotated[int, typer.Option("--draft-vocab", help="eagle, eagle+search: draft over the head's N most frequent tokens (its draft_vocab.json, from train-eagle) plus the prompt's, instead of the whole vocabulary: the LM head is most of EAGLE's drafting time on a CPU. 0 = whole vocabulary (as are heads without that file).", rich_help_panel=EAGLE)] = 8192
    head_int8: Annotated[bool, typer.Option("--head-int8/--head-float32", help="eagle, eagle+search on a CPU with a float32 model: run the head's products (but its fc) and the draft-vocabulary product in int8. They read a quarter of the bytes, 2.6-2.9x faster from a cold cache; drafts change a little, outputs never (BENCHMARKS.md 10p). Ignored on GPUs and for EAGLE-3 heads.", rich_help_panel=EAGLE)] = True
    head_graphs: Annotated[bool, typer.Option("--head-graphs", help="eagle, eagle+search on a CUDA GPU: run the head at fixed shapes and replay each run from a captured CUDA graph, one launch instead of about ninety small operations issued from Python (on a GPU those are most of batched drafting's time). Outputs as without it (drafts up to float rounding). On an H200 at batch size 1 the whole method ran 1.16x the trie with it; at 8-32 rows its gain is within the noise (BENCHMARKS.md 10zs).", rich_help_panel=EAGLE)] = False
    datastore: Annotated[Optional[Path], typer.Option("--datastore", help="search, eagle+search: a datastore from `ngspec build-datastore` (built with this model's tokenizer); without it only the prompt and generated text are searched.", rich_help_panel=SEARCH)] = None
    search_depth: Annotated[int, typer.Option("--search-depth", help="search, eagle+search: tokens in the search branch (well beyond the EAGLE depth).", rich_help_panel=SEARCH)] = DrafterOptions.search_depth
    deepen: Annotated[bool, typer.Option("--deepen/--no-deepen", help="eagle+search: continue the search from the first EAGLE branch and hang the found branch below it (READER's tree deepening).", rich_help_panel=SEARCH)] = DrafterOptions.deepen

    def options(self) -> DrafterOptions:
        """Validated drafter options; --k/--w stay at their defaults (see `rows_options`)."""
        return DrafterOptions(
            self.num_draft, self.ngram_n, self.prefix_len, self.trie_update, self.lookup_ngram, self.lookup_tokens,
            ngram_q=self.ngram_q, search_depth=self.search_depth, deepen=self.deepen,
        )

    def settings(self) -> dict:
        """Every drafter option as given (paths as text), for a report's record of its setup."""
        return {f.name: str(v) if isinstance(v := getattr(self, f.name), Path) else v for f in fields(self)}

    def check(self, drafters: list[str]) -> None:
        """Refuse options no chosen drafter reads (set away from their defaults: `--k 4` for
        the trie was ignored without a word) and missing files, before any model loads."""
        chosen = set(drafters)
        for f in fields(self):
            value = getattr(self, f.name)
            if value != f.default and not READ_BY[f.name] & chosen:
                flag = OFF_FLAGS.get(f.name) if value is False else None
                readers = [name for name in REGISTRY if name in READ_BY[f.name]]
                names = readers[0] if len(readers) == 1 else f"{', '.join(readers[:-1])} and {readers[-1]}"
                raise NgspecError(f"{flag or '--' + f.name.replace('_', '-')} is only used by the {names} drafter{'s' if len(readers) > 1 else ''}")
        if NEEDS_HEAD & chosen:
            if self.eagle_head is None:
                raise NgspecError("the eagle drafters need --eagle-head DIR (an EAGLE-1 or EAGLE-3 head; `ngspec train-eagle` makes EAGLE-1 heads)")
            if not self.eagle_head.is_dir():
                raise NgspecError(f"no EAGLE head directory at {self.eagle_head}")
        if self.datastore is not None and not self.datastore.exists():
            raise NgspecError(f"no datastore at {self.datastore} (build one with `ngspec build-datastore`)")
        self.options()
        self.eagle_options()

    def eagle_options(self):
        from ngspec.drafters.eagle import DEFAULT_CHOICES, EagleOptions, read_choices

        if self.tree == "dynamic" and self.tree_choices is not None:
            raise NgspecError("--tree-choices is the shape of a static tree; the dynamic tree builds its own: use --tree static (or leave --tree out)")
        choices = read_choices(self.tree_choices) if self.tree_choices else DEFAULT_CHOICES
        tree = self.tree or ("static" if self.tree_choices is not None else "dynamic")
        dynamic = {"--tree-top-k": self.tree_top_k, "--tree-depth": self.tree_depth, "--total-tokens": self.total_tokens}
        given = [flag for flag, value in dynamic.items() if value is not None]
        if tree == "static" and given:
            raise NgspecError(f"{', '.join(given)} shape{'s' if len(given) == 1 else ''} the dynamic tree; a static tree's shape is --tree-choices")
        top_k, depth, total = (value if value is not None else default for value, default in zip(dynamic.values(), (EagleOptions.top_k, EagleOptions.depth, EagleOptions.total_tokens)))
        return EagleOptions(tree, top_k, depth, total, choices, self.draft_vocab, self.head_int8, self.head_graphs)

    def resources(self, engine, drafters: list[str]) -> Resources:
        """Load what ``drafters`` need for ``engine``'s model: n-gram tables, the EAGLE drafter
        factory, the datastore (refused when built with another tokenizer)."""
        from ngspec.cli.common import load_eagle, load_tables

        if self.tree_choices is not None:
            from ngspec.drafters.eagle import check_shape_model
            from ngspec.drafters.ngram_tables import model_fingerprint

            check_shape_model(self.tree_choices, engine.loaded.name, model_fingerprint(engine.loaded.model))
        tables = load_tables(engine, drafters, self.bigram_table)
        eagle = load_eagle(engine, self.eagle_head, self.eagle_options()) if NEEDS_HEAD & set(drafters) else None
        store = None
        if self.datastore is not None:
            from ngspec.datastore.index import Datastore

            store = Datastore.open(self.datastore, engine.loaded.tokenizer)
        return Resources(tables, eagle, store)


# the drafters that read each option
EAGLE_OPTIONS = ("eagle_head", "tree", "tree_top_k", "tree_depth", "total_tokens", "tree_choices", "draft_vocab", "head_int8", "head_graphs")
READ_BY: dict[str, frozenset[str]] = {
    "num_draft": frozenset({"trie"}),
    "ngram_n": frozenset({"trie"}),
    "prefix_len": frozenset({"trie"}) | SEARCHES,
    "trie_update": frozenset({"trie"}),
    "lookup_ngram": frozenset({"prompt-lookup"}),
    "lookup_tokens": frozenset({"prompt-lookup"}),
    "k": ROW_DRAFTERS,
    "w": ROW_DRAFTERS,
    "ngram_q": frozenset({"context-ngram", "mixed"}),
    "bigram_table": NEEDS_TABLES,
    **dict.fromkeys(EAGLE_OPTIONS, NEEDS_HEAD),
    "datastore": SEARCHES,
    "search_depth": SEARCHES,
    "deepen": frozenset({"eagle+search"}),
}
OFF_FLAGS = {"trie_update": "--no-trie-update", "head_int8": "--head-float32"}  # a switch on by default, set off


def with_drafting_options(command):
    """Append `Drafting`'s fields to ``command``'s options; it receives them as ``drafting``."""
    sig = inspect.signature(command, eval_str=True)  # the command's own annotations, evaluated
    names = [f.name for f in fields(Drafting)]
    hints = typing.get_type_hints(Drafting, include_extras=True)  # keeps the typer.Option metadata
    added = [
        inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default, annotation=hints[f.name])
        for f in fields(Drafting)
    ]
    own = [p for p in sig.parameters.values() if p.name != "drafting"]
    # keep the command's own options first; every parameter here has a default
    params = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in own] + added

    @functools.wraps(command)
    def wrapper(**kwargs):
        drafting = Drafting(**{name: kwargs.pop(name) for name in names})
        return command(drafting=drafting, **kwargs)

    wrapper.__signature__ = sig.replace(parameters=params)
    wrapper.__annotations__ = {p.name: p.annotation for p in params}
    del wrapper.__wrapped__  # typer must read the new signature, not the original's
    return wrapper


def single_value(spec: str | None, name: str) -> int | None:
    """--k/--w in commands that take one value."""
    if spec is None:
        return None
    try:
        value = int(spec)
    except ValueError:
        raise NgspecError(f"--{name} takes one number here (got {spec!r}); sweeps are for `ngspec bench`") from None
    return value

