"""`trie`: the N-Gram Trie drafter (context trie with sub-prefix insertion and backoff matching).

Construction, as the paper defines it: slide a window of ``n`` tokens over the context; split each
window into a prefix P of ``prefix_len`` tokens and a suffix S; insert every sub-prefix P[j:]
followed by S (j = 0 .. prefix_len-1), counting how often each trie node is passed. Windows that run
past the end of the text are inserted as far as the text goes (the "padded" windows of short
documents).

Window i with sub-prefix j is the path ``text[i+j : i+n]``. Grouping the paths by where they start
(s = i + j) lets the trie grow one token at a time: each start s runs one walker down the trie,
adding at depth d the number of its paths that are at least d long. That makes ``--trie-update``
(inserting generated tokens as they come) the same code as building from the prompt.

Drafting: match the last ``prefix_len`` tokens, backing off one token at a time down to 1; below
the matched node keep the ``num_draft`` most frequent nodes (ties: shallower first, so one
rare deep branch cannot use up the whole budget). A child is never more frequent than its
parent, so best-first selection by count yields a prefix-closed tree.
"""

from __future__ import annotations

import heapq
from typing import Sequence

from ngspec.contracts import DraftContext, DraftTree
from ngspec.tree import most_paying

NUM_DRAFT = 32  # the trie's best nodes offered each step, of which the sizing keeps those that pay


class NGramTrie:
    """Counted trie of context n-grams; node 0 is the root."""

    def __init__(self, n: int = 13, prefix_len: int = 3) -> None:
        if not 1 <= prefix_len < n:
            raise ValueError("need 1 <= prefix_len < n")
        self.n = n
        self.prefix_len = prefix_len
        self.children: list[dict[int, int]] = [{}]
        self.counts: list[int] = [0]
        self.tokens: list[int] = [-1]
        self.depths: list[int] = [0]
        # the node each of the last n - 1 start positions has reached (oldest first): start s's
        # paths are text[s + j : ...] for sub-prefix offsets j = 0 .. min(prefix_len - 1, s)
        self._fronts: list[int] = []
        self._position = 0  # tokens inserted so far
        # what a front adds to each node it passes, oldest first: of the paths through its start,
        # those that reach this deep (below every window's end fewer do)
        self._weights = [min(prefix_len - 1, i) + 1 for i in range(n - 1)]

    def __len__(self) -> int:
        return len(self.counts) - 1

    def depth(self, node: int) -> int:
        return self.depths[node]

    def _child(self, node: int, token: int) -> int:
        kid = self.children[node].get(token)
        if kid is None:
            kid = self.children[node][token] = len(self.counts)
            self.children.append({})
            self.counts.append(0)
            self.tokens.append(token)
            self.depths.append(self.depths[node] + 1)
        return kid

    def extend(self, tokens: Sequence[int]) -> None:
        """Append tokens to the text the trie covers. Each token moves every front one node down
        (a new node where the path is new, numbered in the order nodes appear) and starts a new
        one; the oldest front, n tokens deep, stops. A front at offset i of a full window (i = 0
        the oldest) adds min(prefix_len - 1, i) + 1: its sub-prefixes that are still within one
        window at this depth; in the first n - 1 tokens the same, as fronts are then fewer."""
        children, counts, weights = self.children, self.counts, self._weights
        new_children, new_count, new_label, new_depth = children.append, counts.append, self.tokens.append, self.depths.append
        fronts, position, full = self._fronts, self._position, self.n - 1
        for tok in tokens:
            depth = len(fronts) + 1  # fronts[0]'s depth after this token
            moved = []
            for node, weight in zip(fronts, weights):  # the Python loop every prompt token pays n - 1 times
                kids = children[node]
                kid = kids.get(tok)
                if kid is None:
                    kid = kids[tok] = len(counts)
                    new_children({})
                    new_count(weight)
                    new_label(tok)
                    new_depth(depth)
                else:
                    counts[kid] += weight
                moved.append(kid)
                depth -= 1
            if len(fronts) == full:
                del moved[0]  # n deep: its window ends here
            start = self._child(0, tok)  # a new start: its sub-prefixes begin at it
            counts[start] += min(self.prefix_len - 1, position) + 1
            moved.append(start)
            fronts = moved
            position += 1
        self._fronts, self._position = fronts, position

    def match(self, context: Sequence[int]) -> int | None:
        """Node reached by the longest suffix of ``context`` (<= prefix_len) that has children
        (its depth in the trie is the length of the match)."""
        for m in range(min(self.prefix_len, len(context)), 0, -1):
            node: int | None = 0
            for tok in context[len(context) - m :]:
                node = self.children[node].get(tok)
                if node is None:
                    break
            if node is not None and self.children[node]:
                return node
        return None

    def top_subtree(self, node: int, num_nodes: int, smoothing: float = 0.0) -> tuple[DraftTree, list[float]]:
        """The ``num_nodes`` most likely descendants of ``node`` as a draft tree, nodes in selection
        order (every prefix of it is a tree too), with their estimated path probabilities.

        A child's probability given its parent is count(child) / (count(parent) + smoothing); with
        smoothing 0 the path probability is count / count(node), so selection is by count. A
        positive smoothing makes paths seen once less certain than paths seen many times. A child
        is never more likely than its parent, so best-first selection is prefix-closed; ties go
        to the shallower node, then the earlier-inserted one.
        """
        counts, children, labels = self.counts, self.children, self.tokens
        push, pop = heapq.heappush, heapq.heappop
        base = counts[node] + smoothing
        heap = [(-counts[c] / base, 1, c, -1) for c in children[node].values()]
        heapq.heapify(heap)
        tokens: list[int] = []
        parents: list[int] = []
        probs: list[float] = []
        for index in range(num_nodes):
            if not heap:
                break
            neg_prob, depth, kid, parent = pop(heap)
            tokens.append(labels[kid])
            parents.append(parent)
            probs.append(-neg_prob)
            kids = children[kid]
            if kids:
                denominator, deeper = counts[kid] + smoothing, depth + 1
                for grandkid in kids.values():
                    push(heap, (neg_prob * counts[grandkid] / denominator, deeper, grandkid, index))  # the child's probability, negated
        return DraftTree(tuple(tokens), tuple(parents)), probs

    def greedy_path(self, node: int, depth: int, smoothing: float = 0.0) -> tuple[list[int], list[float]]:
        """The most frequent path below ``node`` (at each step the most frequent child, ties to the
        earlier-inserted one), up to ``depth`` tokens, with each step's conditional frequency."""
        tokens: list[int] = []
        probs: list[float] = []
        count = self.counts.__getitem__  # a C-level key: no Python frame per child
        while len(tokens) < depth and self.children[node]:
            kid = max(self.children[node].values(), key=count)
            probs.append(self.counts[kid] / (self.counts[node] + smoothing))
            tokens.append(self.tokens[kid])
            node = kid
        return tokens, probs


class Calibration:
    """How well estimated acceptance has matched real acceptance so far, per kind of estimate (a
    match length, a source, or a (source, match length) pair): new estimates of a kind are scaled
    by (accepted + prior) / (predicted + 1), at most ``MAX_SCALE``, and clipped at 1 (`scaled`). The prior is what the kind's parent has shown so far (for a pair, its
    source; otherwise all kinds together), neutral (1) before anything is recorded: a new match
    length of a source that has kept failing starts from that source's record, not from trust.
    Scales above 1 are allowed because the smoothed frequencies under-estimate copies (a path seen
    once in the prompt is accepted far more often than its 0.4). Record the unscaled estimates, or
    the scale feeds on itself.

    One calibration may serve several prompts of a run (pass it to the drafter of each): at every
    new prompt (`next_prompt`) the evidence so far is weighed by ``CARRY``, so a prompt starts from
    what the run has shown (a datastore whose short matches kept failing on earlier answers is not
    trusted again at first) and its own steps soon outweigh it."""

    MAX_SCALE = 4.0
    CARRY = 0.5  # replay over Spec-Bench rag: 0.1-1.0 all give +3% tokens per unit of verify cost

    def __init__(self) -> None:
        self._totals: dict = {}  # kind -> (accepted, predicted)
        self._scales: dict = {}  # kind -> its scale, until the next record (a batch step asks each a few dozen times)

    @staticmethod
    def _parent(key):
        return key[0] if isinstance(key, tuple) and key else ()

    def _rate(self, key, prior: float) -> float:
        accepted, predicted = self._totals.get(key, (0.0, 0.0))
        return (accepted + prior) / (predicted + 1.0)

    def scale(self, key) -> float:
        scale = self._scales.get(key)
        if scale is None:
            scale = self._scales[key] = min(self.MAX_SCALE, self._rate(key, self._rate(self._parent(key), 1.0)))
        return scale

    def scaled(self, key, estimates) -> list[float]:
        """``estimates`` of this kind, scaled and clipped at 1 (so a child's never exceeds its
        parent's when the parent's did not)."""
        scale = self.scale(key)
        return [x if (x := p * scale) < 1.0 else 1.0 for p in estimates]  # min(1.0, x) without a call per node

    def record(self, key, accepted: float, predicted: float) -> None:
        if self._scales:
            self._scales = {}
        for kind in (key, self._parent(key)):
            a, p = self._totals.get(kind, (0.0, 0.0))
            self._totals[kind] = (a + accepted, p + predicted)

    def next_prompt(self) -> None:
        """A new prompt starts: what earlier prompts showed counts ``CARRY`` times as much."""
        self._totals = {kind: (a * self.CARRY, p * self.CARRY) for kind, (a, p) in self._totals.items()}
        self._scales = {}


def best_size(gains: list[float], ctx: DraftContext) -> int:
    """Number of leading nodes maximising expected tokens per unit of verify cost."""
    return most_paying(gains, ctx.verify_cost)


class TrieDrafter:
    """Drafts from an `NGramTrie` of the prompt (and, with ``update``, of the generated text).

    Tree size is chosen per step: a node's chance of acceptance is the product of the trie's
    conditional frequencies along its path (smoothed, so a path seen once is less certain than one
    seen ten times), scaled per match length by how well these estimates have matched real
    acceptance so far in this sequence; the tree keeps the number of nodes that maximises expected
    tokens per unit of measured verify cost (``DraftContext.cost``). With no cost table (a
    GPU-like flat cost) that is the whole ``num_draft`` budget. In a batch
    (``DraftContext.engine_sizes``) the whole tree is offered best first with those chances and
    the batch picks the size (`keep`). ``calibration`` (per match length) may be shared by the
    drafters of a run's prompts, so each prompt starts from what the earlier ones showed.
    """

    name = "trie"

    def __init__(self, n: int = 13, prefix_len: int = 3, num_draft: int = NUM_DRAFT, update: bool = True, calibration: Calibration | None = None):
        self.n = n
        self.prefix_len = prefix_len
        self.num_draft = num_draft
        self.update = update
        self.calibration = calibration if calibration is not None else Calibration()
        self._reset([])

    def start(self, prompt: Sequence[int]) -> None:
        self.calibration.next_prompt()
        self._reset(prompt)

    def _reset(self, prompt: Sequence[int]) -> None:
        self.trie = NGramTrie(self.n, self.prefix_len)
        self.trie.extend(prompt)
        self._predicted = 0.0  # expected accepted drafts of the last tree (unscaled)
        self._match_len = 0  # length of the match the last tree hangs from
        self._probs: list[float] = []  # unscaled estimates of the last tree offered best first

    def propose(self, ctx: DraftContext) -> DraftTree:
        self._predicted = 0.0
        node = self.trie.match(ctx.tokens)
        if node is None:
            return DraftTree()
        # half an occurrence's weight: paths seen once are far from certain (replay-tuned)
        smoothing = 0.5 * self.prefix_len
        tree, probs = self.trie.top_subtree(node, min(self.num_draft, ctx.max_nodes), smoothing)
        self._match_len = self.trie.depth(node)
        scaled = self.calibration.scaled(self._match_len, probs)
        if ctx.engine_sizes:  # offer the whole tree, best first; the batch picks the width
            self._probs = probs
            self._predicted = sum(probs)
            return DraftTree(tree.tokens, tree.parents, tuple(scaled))
        size = best_size(scaled, ctx)
        self._predicted = sum(probs[:size])
        return tree.truncated(size, max_depth=size)

    def keep(self, size: int) -> None:
        """The engine verifies only the first ``size`` nodes of the last tree offered."""
        self._predicted = sum(self._probs[:size])

    def observe(self, new_tokens: Sequence[int]) -> None:
        if self._predicted:
            self.calibration.record(self._match_len, len(new_tokens) - 1, self._predicted)
            self._predicted = 0.0
        if self.update:
            self.trie.extend(new_tokens)
