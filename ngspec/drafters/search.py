"""`search` and `eagle+search`: READER's statistical search branch.

Each step the last generated tokens are looked up in two places:

* a local trie of the prompt and everything generated so far (`NGramTrie`, matched on up to
  ``prefix_len`` tokens with backoff), and
* a suffix-array datastore of responses (`--datastore`, from `build-datastore`; longest suffix
  match of up to ``MAX_MATCH`` tokens, at least ``MIN_MATCH``).

The source whose match is longer wins (the local one on a tie, and whenever it matches all of its
``prefix_len`` tokens: the context is the better evidence), and its most frequent continuation,
chosen token by token, becomes ONE branch of up to ``depth`` tokens. `search` drafts that branch
alone (cut, on a device where verification is not free, to the length that maximises expected
tokens per unit of verify cost); `eagle+search` appends it, unmerged, to the EAGLE tree, so the
tree keeps a fixed shape. With ``deepen`` the search also continues from the context plus the
first EAGLE branch (the top-ranked child at every depth) and hangs a second branch below that
branch's last node (backing off to shorter prefixes of it when nothing is found there); the root
branch stays, so a wrong first EAGLE branch costs nothing but nodes.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Sequence

from ngspec.contracts import DraftContext, DraftTree
from ngspec.drafters.trie import NGramTrie, best_size
from ngspec.tree import accepted_path

if TYPE_CHECKING:
    from ngspec.datastore.index import Datastore
    from ngspec.drafters.eagle import EagleDrafter

MIN_MATCH = 2  # shortest datastore match worth following (one token says little in a large store)
MAX_MATCH = 32
SMOOTHING = 0.5  # half an occurrence: a continuation seen once is far from certain


class SearchBranch:
    """The search itself: local trie plus optional datastore, one branch per call."""

    def __init__(self, datastore: "Datastore | None", depth: int = 16, prefix_len: int = 3) -> None:
        self.datastore = datastore
        self.depth = depth
        self.prefix_len = prefix_len
        self.found: dict[str, int] = {"local": 0, "datastore": 0, "none": 0}

    def start(self, prompt: Sequence[int]) -> None:
        self.trie = NGramTrie(self.prefix_len + self.depth, self.prefix_len)
        self.trie.extend(prompt)

    def extend(self, tokens: Sequence[int]) -> None:
        self.trie.extend(tokens)

    def search(self, context: Sequence[int], depth: int | None = None) -> tuple[str, list[int], list[float]]:
        """(source, tokens, conditional frequencies) of the branch continuing ``context``."""
        depth = self.depth if depth is None else depth
        if depth <= 0:
            return "none", [], []
        node = self.trie.match(context)
        local_len = self.trie.depth(node) if node is not None else 0
        if self.datastore is not None and local_len < self.prefix_len:
            match = self.datastore.longest_suffix_match(context, MIN_MATCH, MAX_MATCH)
            if match is not None and match.length > local_len:
                tokens, probs = self.datastore.greedy_continuation(match, depth)
                if tokens:
                    return "datastore", tokens, _smoothed(probs, match.count)
        if node is not None:
            tokens, probs = self.trie.greedy_path(node, depth, SMOOTHING * self.prefix_len)
            return "local", tokens, probs
        return "none", [], []

    def count(self, source: str) -> None:
        self.found[source] += 1


def _smoothed(probs: list[float], occurrences: int) -> list[float]:
    """Scale the first conditional frequency as the trie's smoothing would (count / (n + s))."""
    if not probs:
        return probs
    return [probs[0] * occurrences / (occurrences + SMOOTHING)] + probs[1:]


def path_probs(conditionals: list[float]) -> list[float]:
    """Probability of reaching each node of a chain (running product of the conditionals)."""
    out, p = [], 1.0
    for c in conditionals:
        p *= c
        out.append(p)
    return out


class SearchDrafter:
    """`search`: the search branch alone (works for any model, no head needed)."""

    name = "search"

    def __init__(self, datastore: "Datastore | None", depth: int = 16, prefix_len: int = 3) -> None:
        self.search = SearchBranch(datastore, depth, prefix_len)

    def start(self, prompt: Sequence[int]) -> None:
        self.search.start(prompt)

    def propose(self, ctx: DraftContext) -> DraftTree:
        source, tokens, probs = self.search.search(ctx.tokens, min(self.search.depth, ctx.max_nodes))
        size = best_size(path_probs(probs), ctx)
        self.search.count(source if size else "none")
        return DraftTree.chain(tokens[:size])

    def observe(self, new_tokens: Sequence[int]) -> None:
        self.search.extend(new_tokens)

    def stats(self) -> dict:
        return {"search_branch_from": dict(self.search.found)}


def first_branch(tree: DraftTree) -> list[int]:
    """Nodes of the tree's first branch: the first child of the root, its first child, ..."""
    first_child: dict[int, int] = {}
    for i, p in enumerate(tree.parents):
        first_child.setdefault(p, i)
    path, node = [], -1
    while node in first_child:
        node = first_child[node]
        path.append(node)
    return path


def hang(tree: DraftTree, parent: int, tokens: Sequence[int]) -> DraftTree:
    """``tree`` with a chain of ``tokens`` appended below node ``parent`` (-1 = the root), never
    merged with existing children (so the shape stays fixed)."""
    if not tokens:
        return tree
    n = tree.size
    parents = (parent,) + tuple(range(n, n + len(tokens) - 1))
    return DraftTree(tree.tokens + tuple(int(t) for t in tokens), tree.parents + parents)


class EagleSearchDrafter:
    """`eagle+search`: the EAGLE tree plus one search branch at the root, and with ``deepen`` a
    second one hung below the first EAGLE branch.

    With a flat verify cost (a GPU far from its compute bound) the tree keeps its fixed shape, as
    READER does (a branch token equal to an EAGLE sibling's stays a separate node). Where
    verification is not free (``DraftContext.verify_cost``, e.g. on a CPU), the branch is merged
    into the EAGLE nodes it repeats, each node gets an estimated chance of acceptance (the head's
    path probability, or the search branch's running product of continuation frequencies, each
    scaled by how well that source's estimates matched real acceptance so far), and the tree keeps
    the number of most likely nodes that maximises expected tokens per unit of verify cost. A
    child is never more likely than its parent, so the kept nodes always form a tree.
    """

    name = "eagle+search"
    needs_features = True

    def __init__(self, eagle: "EagleDrafter", datastore: "Datastore | None", depth: int = 16, prefix_len: int = 3, deepen: bool = False) -> None:
        self.eagle = eagle
        self.search = SearchBranch(datastore, depth, prefix_len)
        self.deepen = deepen
        self.deepened = 0
        # per source: [accepted, predicted] (a neutral prior)
        self._totals = {"eagle": [1.0, 1.0], "search": [1.0, 1.0]}
        self._last: tuple[DraftTree, list[str], list[float]] | None = None

    def start(self, prompt: Sequence[int]) -> None:
        self.eagle.start(prompt)
        self.search.start(prompt)
        self._last = None

    def _scale(self, source: str) -> float:
        accepted, predicted = self._totals[source]
        return min(1.0, accepted / predicted)

    def propose(self, ctx: DraftContext) -> DraftTree:
        depth = min(self.search.depth, ctx.max_nodes)
        branches = 2 if self.deepen else 1
        small = DraftContext(ctx.tokens, ctx.prompt_len, max(ctx.max_nodes - branches * depth, 0), ctx.verify_cost, ctx.features)
        tree = self.eagle.propose(small)
        scores = getattr(self.eagle, "last_scores", [0.0] * tree.size)[: tree.size]
        probs = [math.exp(s) * self._scale("eagle") for s in scores]
        sources = ["eagle"] * tree.size

        costly = bool(ctx.verify_cost)

        def add(parent: int, context: Sequence[int]) -> bool:
            nonlocal tree
            source, tokens, conditionals = self.search.search(context, depth)
            self.search.count(source)
            if not tokens:
                return False
            above = probs[parent] if parent >= 0 else 1.0
            branch = [above * p * self._scale("search") for p in path_probs(conditionals)]
            if costly:
                # where nodes are paid for, a branch token that an EAGLE child already drafts is
                # that node (with the higher of the two estimates), not a second copy of it
                while tokens:
                    kid = next((i for i, (t, p) in enumerate(zip(tree.tokens, tree.parents)) if p == parent and t == tokens[0]), None)
                    if kid is None:
                        break
                    probs[kid] = max(probs[kid], branch[0])
                    parent, tokens, branch = kid, tokens[1:], branch[1:]
            tree = hang(tree, parent, tokens)
            probs.extend(branch)
            sources.extend(["search"] * len(tokens))
            return True

        add(-1, ctx.tokens)
        if self.deepen and tree.size:
            branch = first_branch(DraftTree(tree.tokens[: len(scores)], tree.parents[: len(scores)]))
            for j in range(len(branch), 0, -1):
                if add(branch[j - 1], list(ctx.tokens) + [tree.tokens[i] for i in branch[:j]]):
                    self.deepened += 1
                    break
        if ctx.verify_cost:
            tree, sources, probs = _most_likely(tree, sources, probs, ctx)
        self._last = (tree, sources, probs)
        return tree

    def observe(self, new_tokens: Sequence[int]) -> None:
        self.eagle.observe(new_tokens)
        self.search.extend(new_tokens)
        if self._last is not None:
            tree, sources, probs = self._last
            for node in accepted_path(tree, list(new_tokens)[:-1]):
                self._totals[sources[node]][0] += 1
            for source, p in zip(sources, probs):
                self._totals[source][1] += p
            self._last = None

    def stats(self) -> dict:
        return {"search_branch_from": dict(self.search.found), "deepened": self.deepened}


def _most_likely(tree: DraftTree, sources: list[str], probs: list[float], ctx: DraftContext) -> tuple[DraftTree, list[str], list[float]]:
    """Keep the most likely nodes, as many as maximise expected tokens per unit of verify cost."""
    order = sorted(range(tree.size), key=lambda i: (-probs[i], i))
    size = best_size([probs[i] for i in order], ctx)
    keep = sorted(order[:size])
    index = {old: new for new, old in enumerate(keep)}
    parents = []
    for i in keep:
        p = tree.parents[i]
        assert p == -1 or p in index, "a kept node's parent is kept (never less likely)"
        parents.append(index.get(p, -1))
    return DraftTree(tuple(tree.tokens[i] for i in keep), tuple(parents)), [sources[i] for i in keep], [probs[i] for i in keep]
