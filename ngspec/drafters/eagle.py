"""`eagle`: draft trees from an EAGLE-1 or EAGLE-3 head, static (EAGLE-1 choices) or dynamic
(EAGLE-2).

The head keeps its own KV cache of the accepted context: each step it first consumes the pairs
(target feature at position i, token at i + 1) of the newly committed positions, which predicts
the feature at the root and so the root's children. Deeper nodes are expanded layer by layer:
a node's pair is (its parent's predicted feature, its own token), attending to the cache and its
ancestors' entries through a tree mask. After drafting, the tree's entries are dropped from the
head's cache (a length change).

* dynamic (EAGLE-2): at each depth the ``top_k`` highest-scoring nodes (score = sum of log-probs
  along the path) are expanded into ``top_k`` children each; at the end the ``total_tokens``
  best-scoring nodes form the tree (prefix-closed, since a child never scores above its parent).
* static (EAGLE-1): a fixed list of choice paths (``[0]``, ``[0, 1]``, ... = ranks of the
  children at each depth) picks the same positions of the head's top-k every step.

`EagleDrafter` drafts the head's whole tree; the registry's `eagle` drafter wraps it in
`ngspec.drafters.search.EagleSearchDrafter.alone`, which sizes that tree by the verify cost where
verification is not free (and `tune-tree` and `train-eagle`'s evaluation use the whole tree).
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Generator, Sequence

import torch

from ngspec.contracts import DraftContext, DraftTree
from ngspec.cpu_linear import KernelPlan, planned_product, share_plan
from ngspec.eagle import int8
from ngspec.eagle.batched import Drafting, HeadCall, drive
from ngspec.eagle.head import EagleHead
from ngspec.eagle.graphs import StaticRuns
from ngspec.eagle.pool import HeadPool
from ngspec.eagle.vocab import SharedVocab, Top, TopCall
from ngspec.errors import NgspecError, json_text_problem

MAX_SCORED = 32  # caught-up pairs scored per head run (bounds the extra LM-head rows)

# a small EAGLE-1-style static tree: ranks of children along each path
DEFAULT_CHOICES: tuple[tuple[int, ...], ...] = (
    (0,), (1,), (2,), (3,),
    (0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (2, 0),
    (0, 0, 0), (0, 0, 1), (0, 1, 0), (1, 0, 0),
    (0, 0, 0, 0), (0, 0, 0, 1), (0, 0, 0, 0, 0),
)


def read_shape(path: Path) -> tuple[tuple[tuple[int, ...], ...], dict]:
    """A static tree file: a JSON list of paths of child ranks, e.g. ``[[0], [1], [0, 0]]``, or
    a `tune-tree` output (an object whose ``choices`` is such a list, with the model, device and
    batch size it was tuned for); every path's parent path must be listed too."""
    try:
        raw = json.loads(Path(path).read_text())
        meta = raw if isinstance(raw, dict) else {}
        if meta and "choices" not in meta:
            raise ValueError("an object without 'choices'")
        paths = meta["choices"] if meta else raw
        if not isinstance(paths, list) or not all(isinstance(p, list) for p in paths):
            raise ValueError(f"got {json.dumps(paths)[:60]}")
        choices = tuple(tuple(_rank(r) for r in p) for p in paths)
    except FileNotFoundError:
        raise NgspecError(f"no tree-choices file at {path}") from None
    except IsADirectoryError:
        raise NgspecError(f"{path} is a directory; --tree-choices takes a JSON file (from tune-tree)") from None
    except (json.JSONDecodeError, TypeError, ValueError, KeyError, UnicodeDecodeError) as exc:  # JSON's and codecs' errors in the file's words
        raise NgspecError(f"{path}: expected a JSON list of lists of child ranks or a tune-tree file ({json_text_problem(exc)})") from None
    if not choices:
        raise NgspecError(f"{path}: the tree has no nodes")
    return check_choices(choices, str(path)), {k: v for k, v in meta.items() if k != "choices"}


def _rank(value) -> int:
    """A child rank as written: a JSON integer (1.5, "1" or true is a mistake, not rank 1)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"a rank must be an integer, got {value!r}")
    return value


def read_choices(path: Path) -> tuple[tuple[int, ...], ...]:
    return read_shape(path)[0]


def check_shape_model(path: Path, model_name: str, fingerprint: str | None = None) -> None:
    """Refuse a tune-tree file tuned for another model: by the model's fingerprint where the file
    records one (`ngram_tables.model_fingerprint`: its config and weights, so the same model
    given by name or by path is the same model), else by the name it was given."""
    meta = read_shape(path)[1]
    tuned_for, tuned_print = meta.get("model"), meta.get("model_fingerprint")
    tuned_for = tuned_for if isinstance(tuned_for, str) else None  # an edited file's null or number names no model
    if tuned_print is not None and fingerprint is not None:
        if tuned_print != fingerprint:
            named = f"model {tuned_for!r}" if tuned_for is not None else "another model"
            raise NgspecError(f"{path} was tuned for {named}, whose config or weights differ from those of {model_name!r}; "
                              "run `ngspec tune-tree` for this model")
        return
    if tuned_for is not None and tuned_for != model_name:
        raise NgspecError(f"{path} was tuned for model {tuned_for!r}, not {model_name!r}; run `ngspec tune-tree` for this model")


def check_choices(choices: Sequence[tuple[int, ...]], where: str = "tree choices") -> tuple[tuple[int, ...], ...]:
    seen = set(choices)
    for p in choices:
        if not p or any(r < 0 for r in p):
            raise NgspecError(f"{where}: paths must be non-empty lists of ranks >= 0 (got {list(p)})")
        if len(p) > 1 and p[:-1] not in seen:
            raise NgspecError(f"{where}: path {list(p)} is listed without its parent {list(p[:-1])}")
    return tuple(sorted(seen, key=lambda p: (len(p), p)))


@dataclass(frozen=True)
class EagleOptions:
    tree: str = "dynamic"  # dynamic (EAGLE-2) or static (EAGLE-1 choices)
    top_k: int = 8
    depth: int = 5
    total_tokens: int = 32
    choices: tuple[tuple[int, ...], ...] = DEFAULT_CHOICES
    draft_vocab: int = 8192  # > 0: draft over the head's N most frequent tokens plus the prompt's
    head_int8: bool = True  # on a CPU float32 target: the head's products in int8 (`ngspec.eagle.int8`)
    head_graphs: bool = False  # the head's runs at fixed shapes, replayed as CUDA graphs on a GPU (`ngspec.eagle.graphs`)

    def __post_init__(self) -> None:
        if self.tree not in ("dynamic", "static"):
            raise NgspecError(f"--tree must be dynamic or static (got {self.tree!r})")
        if self.top_k < 1 or self.depth < 1 or self.total_tokens < 1:
            raise NgspecError("--tree-top-k, --tree-depth and --total-tokens must be at least 1")
        if self.draft_vocab < 0:
            raise NgspecError("--draft-vocab must be >= 0 (0 = the whole vocabulary)")
        # every path's parent listed, in the order the drafter walks them (shape files are checked
        # as they are read; this covers choices built in Python)
        object.__setattr__(self, "choices", check_choices(self.choices))


@dataclass
class _Node:
    token: int
    parent: int  # index into the node list, -1 = the root
    depth: int
    score: float
    cache_slot: int = -1  # position of this node's entry in the head cache once expanded
    choice: tuple[int, ...] = ()  # static trees: the node's path of child ranks


class EagleDrafter:
    """Drafts with an EAGLE-1 head (its predicted features go through the target's LM head) or an
    EAGLE-3 head (fused low/mid/high target features in, its own LM head and ``d2t`` map out);
    the tree search is the same."""

    name = "eagle"
    needs_features = True

    def __init__(
        self, head: EagleHead, embed: torch.nn.Module, lm_head: torch.nn.Module, opts: EagleOptions, vocab: Sequence[int] | None = None,
        target_params: int = 0, plan: KernelPlan | None = None, shared: SharedVocab | None = None, pool: HeadPool | None = None,
    ) -> None:
        """``vocab``: the head's draft vocabulary, most frequent first (its first
        ``opts.draft_vocab`` are used); ``plan``: the target's CPU kernel plan, for the product over
        it; ``shared``: what the rows of one factory share, built from those when not given;
        ``pool``: the head cache it takes a row of (the factory's, so that a batch's rows attend in
        one call; a pool of its own when not given)."""
        self.head, self.embed, self.lm_head, self.opts = head, embed, lm_head, opts
        self._levels = _static_levels(opts.choices) if opts.tree == "static" else []
        self.target_params = target_params
        self.head_cost = 0.0  # one head step relative to a target step (weights read), see `start`
        self.param = next(head.parameters())
        self.feature_layers = head.feature_layers  # EAGLE-3: the target layers it reads
        self.shared = shared if shared is not None else _shared_vocab(head, lm_head, opts, vocab, plan)
        self.pool = pool if pool is not None else HeadPool()

    def start(self, prompt: Sequence[int]) -> None:
        self.cache = self.pool.row()
        self.length = 0  # committed pairs in the head cache
        self.last_runs = 0
        self._pending: list[torch.Tensor] = []  # features of committed pairs not yet in the cache
        # the head's top guess, teacher-forced, at generated positions it caught up on (all but
        # the newest pair of each run: see `_consume`): [right, scored], for callers that gate it
        self.caught_up = [0, 0]
        self.vocab = self.shared.for_prompt(prompt)  # the draft vocabulary and the prompt's other tokens
        if self.target_params:
            # a drafting step at batch 1 reads the head and its LM-head rows as a target step reads
            # the whole model: the ratio of the two is what the head costs where weights dominate
            # (int8 weights, `ngspec.eagle.int8`, read a quarter of the bytes of float32 ones)
            hidden = self.lm_head.weight.shape[1]
            rows = 0 if self.head.own_lm_head else int8.float_numbers(self.shared.size * hidden, self.shared.shared_int8) + len(self.vocab.extra) * hidden
            self.head_cost = (int8.float_equivalent(self.head) + rows) / self.target_params

    def observe(self, new_tokens: Sequence[int]) -> None:
        pass

    def _run(
        self, tokens: list[int], features: torch.Tensor, positions: list[int], seen: int, block: list[list[int]] | None, keep_from: int = 0,
    ) -> Generator[HeadCall, torch.Tensor, torch.Tensor]:
        """The head's output for these pairs (from pair ``keep_from`` on; what each sees as in
        `HeadCall`): asks whoever drives `drafting` to run it."""
        self.last_runs += 1
        return (yield HeadCall(self.head, self.embed, self.cache, tokens, features, positions, seen, block, keep_from))

    def defer(self, ctx: DraftContext) -> None:
        """Draft nothing this step: keep the newly committed pairs for the next `propose`, which
        runs the head over all of them in one forward (a caller that skips the head when another
        source drafts well enough)."""
        if ctx.features is None or len(ctx.features) == 0:
            raise NgspecError("the eagle drafter needs the target's features (the engine did not pass them)")
        self._pending.append(ctx.features.clone())

    def _consume(self, ctx: DraftContext) -> Generator[HeadCall, torch.Tensor, tuple[torch.Tensor, torch.Tensor | None, list[int]]]:
        """Append the newly committed pairs (and any deferred ones). Returns the head's prediction
        of the root's feature, and the predicted features and true next tokens at the earlier
        pairs whose next token is generated text (at most ``MAX_SCORED``), for `caught_up`.

        Pair i (feature at position p, token at p + 1) predicts the token at p + 2. Only the
        newest pair's prediction is a guess drafted this step; every earlier pair's next token is
        known, so the head's top guess there is scored for free in the root's LM-head product."""
        feats = ctx.features
        if feats is None or len(feats) == 0:
            raise NgspecError("the eagle drafter needs the target's features (the engine did not pass them)")
        if self._pending:
            feats, self._pending = torch.cat([*self._pending, feats.to(self._pending[0].dtype)]), []
        start = len(ctx.tokens) - 1 - len(feats)
        assert start == self.length == self.cache.length, "the head cache and the committed context went out of step"
        m = len(feats)
        feats = self.head.project(feats.to(self.param.dtype))
        first = max(ctx.prompt_len - start - 2, m - 1 - MAX_SCORED, 0)  # pairs whose next token is generated
        truth = list(ctx.tokens[start + first + 2 : start + m + 1])
        # only the predictions read here are computed: the newest pair's and the scored ones (a
        # prompt's other pairs only give the head cache their keys and values)
        out = yield from self._run(list(ctx.tokens[start + 1 : start + 1 + m]), feats, list(range(start, start + m)), self.length, None, first if truth else m - 1)
        self.length += m
        return out[-1], (out[:-1] if truth else None), truth

    def propose(self, ctx: DraftContext) -> DraftTree:
        return drive(self.drafting(ctx))

    def drafting(self, ctx: DraftContext, deeper: "Deeper | None" = None) -> Drafting:
        """`propose` as a generator that yields each head run (`HeadCall`) and is sent its output,
        so that a batch can run every row's calls in one forward (`propose_together`).

        ``deeper`` (optional) is asked before each level below the root's children is expanded,
        with the tree so far, its nodes' scores, the best score among the nodes about to be
        expanded and the number of levels left; when it answers False the tree stops there (a
        caller that keeps only the nodes that pay for their verification, and needs no deeper
        ones). Its drivers (`drive`, `propose_together`) run it in inference mode."""
        self.last_runs = 0  # head runs of this tree (one per level run, the catching up included)
        root_feature, scored, truth = yield from self._consume(ctx)
        base = self.length  # head cache length before the tree
        nodes: list[_Node] = []
        outputs: dict[int, torch.Tensor] = {-1: root_feature}  # node -> predicted feature below it

        def children(parents: list[int], k: int) -> Generator[TopCall, Top, list[list[tuple[int, float]]]]:
            """Top-k next tokens and log-probs below each parent (one LM-head product for all,
            asked of whoever drives `drafting`; the first one also scores the caught-up pairs'
            guesses)."""
            nonlocal scored
            feats, extra = [outputs[p] for p in parents], 0
            if scored is not None:
                feats, extra, scored = [*scored.unbind(0), *feats], len(scored), None
            ids, values = yield TopCall(self.vocab, feats, k)
            if extra:
                self.caught_up[0] += sum(int(g[0] == t) for g, t in zip(ids[:extra], truth))
                self.caught_up[1] += extra
            return [list(zip(i, v)) for i, v in zip(ids[extra:], values[extra:])]

        def expand(batch: list[int]) -> Generator[HeadCall, torch.Tensor, None]:
            """Run the head on these nodes' pairs, recording each one's predicted feature."""
            if not batch:
                return
            for i, n in enumerate(batch):
                nodes[n].cache_slot = self.cache.length + i
            block = []  # each node sees the committed context and its own and its ancestors' entries
            for n in batch:
                cols, a = [], n
                while a != -1:
                    if nodes[a].cache_slot >= 0:
                        cols.append(nodes[a].cache_slot - base)
                    a = nodes[a].parent
                block.append(cols)
            feats = torch.stack([outputs[nodes[n].parent] for n in batch])
            positions = [base + nodes[n].depth - 1 for n in batch]
            out = yield from self._run([nodes[n].token for n in batch], feats, positions, base, block)
            outputs.update(zip(batch, out.unbind(0)))  # one view per node, in one operation

        if self.opts.tree == "dynamic":
            layer = []
            for tok, lp in (yield from children([-1], self.opts.top_k))[0]:
                nodes.append(_Node(tok, -1, 1, lp))
                layer.append(len(nodes) - 1)
            for depth in range(2, self.opts.depth + 1):
                chosen = sorted(layer, key=lambda n: -nodes[n].score)[: self.opts.top_k]
                if deeper is not None and not _wanted(deeper, nodes, nodes[chosen[0]].score, self.opts.depth - depth + 1):
                    break
                yield from expand(chosen)
                layer = []
                for n, kids in zip(chosen, (yield from children(chosen, self.opts.top_k))):
                    for tok, lp in kids:
                        nodes.append(_Node(tok, n, depth, nodes[n].score + lp))
                        layer.append(len(nodes) - 1)
            order = sorted(range(len(nodes)), key=lambda n: (-nodes[n].score, nodes[n].depth, n))
            keep = set(order[: min(self.opts.total_tokens, ctx.max_nodes)])
        else:
            by_path: dict[tuple[int, ...], int] = {(): -1}
            for depth, (prefixes, widest, ranks_below) in enumerate(self._levels, start=1):
                if depth > 1 and deeper is not None and not _wanted(deeper, nodes, max(nodes[by_path[q]].score for q in prefixes), len(self._levels) - depth + 1):
                    break
                yield from expand([by_path[q] for q in prefixes if q])  # the root's feature is already known
                for prefix, ranks, kids in zip(prefixes, ranks_below, (yield from children([by_path[q] for q in prefixes], widest))):
                    parent = by_path[prefix]
                    for r in ranks:
                        tok, lp = kids[r]
                        score = lp + (nodes[parent].score if parent >= 0 else 0.0)
                        nodes.append(_Node(tok, parent, depth, score, choice=prefix + (r,)))
                        by_path[prefix + (r,)] = len(nodes) - 1
            keep = set(range(min(len(nodes), ctx.max_nodes)))  # created by depth: prefix-closed
        self.cache.crop(base)  # drop the tree's entries from the head cache
        order = sorted(keep, key=lambda n: (nodes[n].depth, n))
        self.last_choices = [nodes[n].choice for n in order]  # static: each node's rank path (tune-tree)
        self.last_scores = [nodes[n].score for n in order]  # log-probability of each node's path
        return _tree(nodes, order)


def _static_levels(choices: Sequence[tuple[int, ...]]) -> list[tuple[list[tuple[int, ...]], int, list[list[int]]]]:
    """A static tree's levels, worked out once per drafter: for each depth, the prefixes expanded
    (sorted), the widest rank asked below them plus one, and each prefix's child ranks (sorted)."""
    levels = []
    for depth in range(1, max(len(p) for p in choices) + 1):
        level = [p for p in choices if len(p) == depth]
        prefixes = sorted({p[:-1] for p in level})
        levels.append((prefixes, max(p[-1] for p in level) + 1, [sorted(p[-1] for p in level if p[:-1] == q) for q in prefixes]))
    return levels


# asked before each deeper level: (tree so far, its scores, best score to expand, levels left)
Deeper = Callable[[DraftTree, list[float], float, int], bool]


def _wanted(deeper: Deeper, nodes: list[_Node], frontier: float, levels: int) -> bool:
    """``deeper``'s answer for the tree so far (nodes are created level by level, parents first)."""
    return deeper(_tree(nodes, list(range(len(nodes)))), [n.score for n in nodes], frontier, levels)


def _tree(nodes: list[_Node], order: list[int]) -> DraftTree:
    """The kept nodes, in ``order`` (parents before children), as a DraftTree."""
    index = {n: i for i, n in enumerate(order)}
    tokens, parents = [], []
    for n in order:
        p = nodes[n].parent
        assert p == -1 or p in index, "kept nodes must be prefix-closed"
        tokens.append(nodes[n].token)
        parents.append(index[p] if p != -1 else -1)
    return DraftTree(tuple(tokens), tuple(parents))


def eagle_factory(target_model, head: EagleHead, opts: EagleOptions, vocab: Sequence[int] | None = None):
    """A drafter factory over one loaded head and the target's embedding and LM head; ``vocab``
    (the head's draft vocabulary, most frequent first; None for heads that have none) is used when
    ``opts.draft_vocab`` > 0 and the LM head has no bias. On a CPU the head's layers and the
    draft-vocabulary product run the target's kernel plan (`ngspec.cpu_linear.share_plan`)."""
    embed = target_model.get_input_embeddings()
    lm_head = target_model.get_output_embeddings()
    dtype = lm_head.weight.dtype
    if next(head.parameters()).dtype != dtype:  # a head fresh from float32 training, a bfloat16 target
        head = copy.deepcopy(head).to(dtype).eval()
    if getattr(lm_head, "bias", None) is not None:
        vocab = None
    target_params = sum(p.numel() for p in target_model.parameters())
    quantized = opts.head_int8 and int8.applies(target_model, head)
    if quantized:
        head = int8.int8_head(head)
    plan = share_plan(target_model, head)
    shared = _shared_vocab(head, lm_head, opts, vocab, plan, quantized)  # gathered once for every drafter (row) of this factory
    if opts.tree == "static" and (rank := max(max(p) for p in opts.choices)) >= shared.size:
        raise NgspecError(f"the static tree asks for a child of rank {rank}, but the head drafts over {shared.size} tokens; use ranks below {shared.size}")
    pool = HeadPool()  # every drafter's head cache is a row of it, so a batch's rows attend together
    if opts.head_graphs:  # off a GPU the fixed shapes run uncaptured (how the tests check them)
        pool.static_runs = StaticRuns(head, embed, pool, capture=next(head.parameters()).is_cuda)

    def make() -> EagleDrafter:
        return EagleDrafter(head, embed, lm_head, opts, target_params=target_params, shared=shared, pool=pool)

    make.pool = pool  # the drafters' shared head cache, and its fixed-shape runs (`head_graphs`) for reports
    return make


def head_graphs_report(factory) -> str | None:
    """What an `eagle_factory`'s head runs at fixed shapes (``EagleOptions.head_graphs``) captured
    and replayed so far, and why capturing stopped if it did; None for a factory without them."""
    static = getattr(getattr(factory, "pool", None), "static_runs", None)
    return None if static is None else static.report()


def _shared_vocab(head: EagleHead, lm_head: torch.nn.Module, opts: EagleOptions, vocab: Sequence[int] | None, plan: KernelPlan | None, quantized: bool = False) -> SharedVocab:
    """What the drafters of one head score over: the first ``opts.draft_vocab`` tokens of
    ``vocab``, read from the LM head with the target's kernel ``plan``, or ``quantized`` in int8
    (see `SharedVocab.build`)."""
    draft = list(vocab[: opts.draft_vocab]) if vocab is not None and opts.draft_vocab else None
    return SharedVocab.build(head, lm_head, draft, lambda x, w: planned_product(x, w, plan), shared_int8=quantized)
