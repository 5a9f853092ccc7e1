"""`search` and `eagle+search`: READER's statistical search branch (and `eagle`, which is
`eagle+search` without the branch, so that EAGLE's tree is sized the same way).

Each step the last generated tokens are looked up in two places:

* a local trie of the prompt and everything generated so far (`NGramTrie`, matched on up to
  ``prefix_len`` tokens with backoff), and
* a suffix-array datastore of responses (`--datastore`, from `build-datastore`; longest suffix
  match of up to ``MAX_MATCH`` tokens, at least ``MIN_MATCH``).

The local trie wins whenever it matches all of its ``prefix_len`` tokens (the context is the
better evidence); otherwise the drafters weigh both sources' branches by their expected tokens per
unit of verify cost, each source's estimates calibrated per match length by how they fared so far
(the paper's rule, the longer match wins, is what `SearchBranch.search` does without weights).
The winner's most frequent continuation, chosen token by token, becomes ONE branch of up to
``depth`` tokens. `search` drafts that branch
alone (cut, on a device where verification is not free, to the length that maximises expected
tokens per unit of verify cost); `eagle+search` appends it, unmerged, to the EAGLE tree, so the
tree keeps a fixed shape. With ``deepen`` the search also continues from the context plus the
first EAGLE branch (the top-ranked child at every depth) and hangs a second branch below that
branch's last node (backing off to shorter prefixes of it when nothing is found there); the root
branch stays, so a wrong first EAGLE branch costs nothing but nodes.
"""

from __future__ import annotations

import math
import time
from itertools import accumulate
from operator import mul
from typing import TYPE_CHECKING, Callable, Sequence

from ngspec.contracts import DraftContext, DraftTree
from ngspec.drafters.trie import NUM_DRAFT, Calibration, NGramTrie, best_size
from ngspec.eagle.batched import HOST_WORK, Drafting, drive
from ngspec.tree import accepted_path, depths

if TYPE_CHECKING:
    from ngspec.datastore.index import Datastore
    from ngspec.drafters.eagle import Deeper, EagleDrafter

MIN_MATCH = 2  # shortest datastore match worth following (one token says little in a large store)
MAX_MATCH = 32
SMOOTHING = 0.5  # half an occurrence: a continuation seen once is far from certain
# where the head's gate keeps it off, it still runs every PROBE_EVERY-th step: catching up scores
# its guesses on the skipped positions (`EagleDrafter.caught_up`), so a head that started badly
# can win its place back (about head_cost / PROBE_EVERY of the time, a fraction of a percent). Not
# while the batch verified none of the last nodes the row offered: on two CPU cores a batch of 8
# verifies no draft node on most steps, and the probes there were most of its head runs
# (BENCHMARKS.md 10l)
PROBE_EVERY = 16
# a head level below the root's children that stopped paying is judged without what such levels
# have added (`EagleSearchDrafter._deeper`) after this many head runs without one: rarer than the
# root's probes, since in a batch any row's probe runs the level for all (probing every 16th run,
# eight rows kept a second level running on 40% of batch-8 steps in a GPU-like replay, BENCHMARKS.md 10ze)
LEVEL_PROBE_EVERY = 64
HEAD_SMOOTHING = 0.2  # weight of the newest head run in the running estimate of its seconds
# the gate weighs half the head's cost: at the full cost it kept the head off too often
# (summarization on two CPU cores, side by side with the full weight: x0.6 +1.1%, x0.3 +0.6%,
# x0 +1.8%, x1.5 -1.0%; rag at x0.5 +1.2%; BENCHMARKS.md section 10i). Step by step, what head
# runs add on average is 1.0-1.5x the credited gain (`benchmarks/head_worth.py`, sections 10k and
# 10l), yet running the head on every step loses to this gate in replay; what the gate gets wrong
# is which steps it picks, and no signal known before the head runs picks them better (10l)
HEAD_COST_WEIGHT = 0.5
# the calibration's kind for what the head's first level added where the gate weighed it and it ran
# (a node only that level offered, accepted) against the gate's credit for those runs; apart from
# the levels below it (`EagleSearchDrafter._record_levels`), which the credit does not cover
HEAD_CREDIT = ("head", 1)


class SearchBranch:
    """The search itself: local trie plus optional datastore, one branch per call."""

    def __init__(self, datastore: "Datastore | None", depth: int = 16, prefix_len: int = 3) -> None:
        self.datastore = datastore
        self.depth = depth
        self.prefix_len = prefix_len
        self.found: dict[str, int] = {"local": 0, "datastore": 0, "none": 0}
        self.last_key: tuple[str, int] = ("none", 0)  # the last branch's source and match length
        self.last_node: int | None = None  # the local trie's node the last search matched
        self.reads = max(MAX_MATCH, prefix_len)  # the context's last tokens a search reads, at most

    def start(self, prompt: Sequence[int]) -> None:
        self.trie = NGramTrie(self.prefix_len + self.depth, self.prefix_len) if self.depth > 0 else None
        if self.trie is not None:
            self.trie.extend(prompt)

    def extend(self, tokens: Sequence[int]) -> None:
        if self.trie is not None:
            self.trie.extend(tokens)

    def search(self, context: Sequence[int], depth: int | None = None, value: Callable[[tuple[str, int], list[float]], float] | None = None) -> tuple[str, list[int], list[float]]:
        """(source, tokens, conditional frequencies) of the branch continuing ``context``;
        ``last_key`` says which source and match length it came from (what its estimates are
        calibrated by), ``last_node`` the local trie's node that ``context`` matched.

        Without ``value`` the datastore's branch wins when its match is longer than the local
        one. With ``value`` (what a branch of that kind and those frequencies is worth, e.g. its
        calibrated expected tokens per unit of verify cost) both are weighed and the better kept:
        in a large store a short match is often a common phrase that the context does not follow.
        """
        depth = self.depth if depth is None else depth
        self.last_key, self.last_node = ("none", 0), None
        if depth <= 0:
            return "none", [], []
        found = []
        node = self.last_node = self.trie.match(context)
        local_len = self.trie.depth(node) if node is not None else 0
        if self.datastore is not None and local_len < self.prefix_len:
            match = self.datastore.longest_suffix_match(context, MIN_MATCH, MAX_MATCH)
            if match is not None and (value is not None or match.length > local_len):
                tokens, probs = self.datastore.greedy_continuation(match, depth, SMOOTHING)
                if tokens:
                    found.append((("datastore", min(match.length, 8)), tokens, probs))
        if node is not None and not (found and value is None):
            tokens, probs = self.trie.greedy_path(node, depth, SMOOTHING * self.prefix_len)
            found.append((("local", local_len), tokens, probs))
        if not found:
            return "none", [], []
        key, tokens, probs = max(found, key=lambda f: value(f[0], f[2])) if value is not None and len(found) > 1 else found[0]
        self.last_key = key
        return key[0], tokens, probs

    def count(self, source: str) -> None:
        self.found[source] += 1


def path_probs(conditionals: list[float]) -> list[float]:
    """Probability of reaching each node of a chain (running product of the conditionals)."""
    return list(accumulate(conditionals, mul))  # the same products, left to right, in C


class SearchDrafter:
    """`search`: the search branch alone (works for any model, no head needed). Where verification
    costs, the branch is cut to the length that maximises expected tokens per unit of verify cost,
    its estimates scaled per source and match length by how well they matched so far (a datastore
    match of two tokens in a large store is often wrong; a long local match rarely is). In a
    batch (``DraftContext.engine_sizes``) the whole branch is offered with those estimates and the
    batch picks the length (`keep`). ``calibration`` may be shared by the drafters of a run's
    prompts (see `Calibration`)."""

    name = "search"

    def __init__(self, datastore: "Datastore | None", depth: int = 16, prefix_len: int = 3, calibration: Calibration | None = None) -> None:
        self.search = SearchBranch(datastore, depth, prefix_len)
        self.calibration = calibration if calibration is not None else Calibration()

    def start(self, prompt: Sequence[int]) -> None:
        self.search.start(prompt)
        self.calibration.next_prompt()
        self._predicted: tuple[tuple[str, int], float] | None = None
        self._raw: list[float] = []  # unscaled chance of reaching each node of the last branch

    def propose(self, ctx: DraftContext) -> DraftTree:
        source, tokens, probs = self.search.search(ctx.tokens, min(self.search.depth, ctx.max_nodes), branch_value(self.calibration, ctx))
        key = self.search.last_key
        reach, size = sized_branch(self.calibration, key, probs, ctx)
        if ctx.engine_sizes:  # offer the whole branch; the batch picks the width
            size = len(tokens)
        self.search.count(source if size else "none")
        self._raw = path_probs(probs)[:size]
        self._predicted = (key, sum(self._raw)) if size else None
        return DraftTree.chain(tokens[:size], reach if ctx.engine_sizes else ())

    def keep(self, size: int) -> None:
        """The engine verifies only the first ``size`` tokens of the last branch offered."""
        self._predicted = (self._predicted[0], sum(self._raw[:size])) if self._predicted and size else None

    def observe(self, new_tokens: Sequence[int]) -> None:
        if self._predicted is not None:
            self.calibration.record(self._predicted[0], len(new_tokens) - 1, self._predicted[1])
            self._predicted = None
        self.search.extend(new_tokens)

    def stats(self) -> dict:
        return {"search_branch_from": dict(self.search.found)}


def sized_branch(calibration: Calibration, key: tuple[str, int], conditionals: list[float], ctx: DraftContext) -> tuple[list[float], int]:
    """The branch's calibrated chance of reaching each of its nodes, and the length that maximises
    expected tokens per unit of verify cost."""
    reach = calibration.scaled(key, path_probs(conditionals))
    return reach, best_size(reach, ctx)


def branch_value(calibration: Calibration, ctx: DraftContext) -> Callable[[tuple[str, int], list[float]], float]:
    """What a branch is worth alone: its calibrated expected tokens per unit of verify cost at the
    best length (with a flat cost, its calibrated expected tokens)."""

    def value(key: tuple[str, int], conditionals: list[float]) -> float:
        return _rate(calibration.scaled(key, path_probs(conditionals)), ctx)

    return value


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


class EagleSearchDrafter:
    """`eagle+search`: the EAGLE tree plus one search branch at the root, and with ``deepen`` a
    second one hung below the first EAGLE branch.

    With a flat verify cost (a GPU far from its compute bound) the tree keeps its fixed shape, as
    READER does (a branch token equal to an EAGLE sibling's stays a separate node). Where
    verification is not free (``DraftContext.verify_cost``, e.g. on a CPU):

    * the head runs only when it pays: the search branch is found first, and when the tokens EAGLE
      would add (its top guess's acceptance rate so far, times the chance the branch's first token
      is wrong) are worth less than half the head's own cost (`_head_cost`, measured;
      ``HEAD_COST_WEIGHT``) plus a node,
      the step drafts the branch alone and the head catches up on the skipped positions next time
      (where its guesses are scored, teacher-forced, so the rate keeps learning; and it runs at
      least every ``PROBE_EVERY``-th step, so a closed gate can open again, unless the batch
      verified none of the last nodes the row offered); when it runs, it
      expands a level deeper only when the chain expected there, scaled by what that level has
      added so far, would pay for its nodes and the level's own run (`_deeper`), so on a CPU,
      where trees are a node or two, it mostly runs one level;
    * the branch is merged into the EAGLE nodes it repeats, and so is the local trie's tree, sized
      as the `trie` drafter sizes its own (its second guesses at a fork); each node gets an
      estimated chance of acceptance (the head's path probability, or the branch's running product of continuation
      frequencies, each scaled by how well that kind of estimate matched real acceptance so far:
      EAGLE's, and the search's per source and match length), and the tree keeps the number of
      most likely nodes that maximises expected tokens per unit of verify cost (in a batch,
      ``DraftContext.engine_sizes``: all nodes, most likely first, and the batch picks how many,
      `keep`). A child is never more likely than its parent, so the kept nodes always form a tree.

    `alone` is the `eagle` drafter: the same with no search branch, so that EAGLE's tree is sized
    by the same rule (on a flat cost it is EAGLE's whole tree, unchanged).
    """

    name = "eagle+search"
    needs_features = True
    clock: Callable[[], float] = staticmethod(time.perf_counter)  # times the head's runs
    # where nodes cost, the local trie's best nodes merged in as well: at most this many (the
    # trie drafter's default budget), of which those that pay under the verify cost
    local_tree_nodes = NUM_DRAFT

    def __init__(
        self, eagle: "EagleDrafter", datastore: "Datastore | None", depth: int = 16, prefix_len: int = 3, deepen: bool = False,
        calibration: Calibration | None = None,
    ) -> None:
        self.eagle = eagle
        # keys: "eagle", and the search's (source, match length); may be shared by a run's prompts
        self.calibration = calibration if calibration is not None else Calibration()
        self.feature_layers = getattr(eagle, "feature_layers", None)  # EAGLE-3: the target layers its head reads
        self.search = SearchBranch(datastore, depth, prefix_len)
        self.deepen = deepen
        self.deepened = 0
        self.skipped = 0  # steps drafted without running the head

    @classmethod
    def alone(cls, eagle: "EagleDrafter", calibration: Calibration | None = None) -> "EagleSearchDrafter":
        """`eagle`: EAGLE's tree alone, sized like eagle+search's where verification costs (the
        head runs when its top guess pays for itself and a node; the most likely nodes that pay
        are kept); with a flat cost, EAGLE's whole tree."""
        drafter = cls(eagle, None, depth=0, calibration=calibration)
        drafter.name = "eagle"
        return drafter

    def start(self, prompt: Sequence[int]) -> None:
        self.eagle.start(prompt)
        self.search.start(prompt)
        self.calibration.next_prompt()
        self._top1 = [0, 0]  # EAGLE's drafted top guesses: right, scored
        self._since_head = 0  # steps skipped since the head last ran
        self._last: tuple[DraftTree, list, list[float], list[int]] | None = None  # tree, keys, unscaled estimates, head-only depths
        self._eagle_top: int | None = None
        self._head_runs = 0
        self._head_seconds = 0.0  # a head run's seconds, smoothed (the prompt's first run left out)
        self._unverified = False  # in a batch: none of the last nodes offered was verified (`keep`)
        self._level_predicted: dict[int, float] = {}  # this step's head levels below the root: depth -> chain predicted there
        self._since_level = 0  # head runs since one ran a level below the root's children
        self._credit: float | None = None  # the credit of this step's head run (`_head_pays`), recorded once it is verified
        self._first_level = [0, 0.0]  # where the gate weighed the head and it ran: first-level nodes added, credited

    def _head_cost(self, ctx: DraftContext) -> float:
        """One head run's cost (a level of its tree: the forward and its top-k) relative to a plain
        target step: measured (a tree's seconds over its runs, over the loop's
        `DraftContext.step_seconds`) once both are known, else `EagleDrafter.head_cost`, the weights
        it reads. On the AMD VM a run took about 3.3 ms against a 28 ms step, 0.12 steps; the
        weights say 0.07 (the rest is the Python and small products around the layers)."""
        if self._head_seconds and ctx.step_seconds:
            return self._head_seconds / ctx.step_seconds
        return getattr(self.eagle, "head_cost", 0.0)

    def _timed_head(self, seconds: float, cold: bool = False) -> None:
        """One head run took ``seconds`` (a tree's time over its runs). Not measured: the prompt's
        first run (the head's prefill) and ``cold`` ones, which ran a fixed shape for the first
        time or captured it (`ngspec.cuda_graphs`: many times a replay; on the seventh GPU visit
        such runs were a third of a 32-row batch's head runs, and the gate took them in)."""
        self._head_runs += 1
        if self._head_runs == 1 or cold:
            return
        self._head_seconds = seconds if not self._head_seconds else self._head_seconds + HEAD_SMOOTHING * (seconds - self._head_seconds)

    def _head_cold(self) -> int:
        """The head's runs at a new fixed shape so far (`ngspec.cuda_graphs.Graphs.cold`; 0 without
        fixed shapes): in a batch every row's run is one forward, so a row sees the others' too."""
        static = getattr(getattr(self.eagle, "pool", None), "static_runs", None)
        return 0 if static is None else static.graphs.cold

    def _top1_rate(self) -> float:
        """How often EAGLE's top guess has been right so far (from a prior of one in two): the
        guesses it drafted, and, teacher-forced, those at the positions it caught up on (skipped
        steps, and accepted tokens after a step's first; `EagleDrafter.caught_up`)."""
        right, scored = self._top_guesses()
        return (1 + right) / (2 + scored)

    def _credited_gain(self, reach: list[float], n: int) -> float:
        """The tokens the gate credits a head run with, next to a branch of ``n`` nodes reached
        with chances ``reach``: the head's top-guess rate so far times the chance the branch's
        first token is wrong."""
        return self._top1_rate() * (1.0 - (reach[0] if n else 0.0))

    def _head_pays(self, conditionals: list[float], key: tuple[str, int], ctx: DraftContext) -> bool:
        """Whether a head run beside the search branch pays for itself and its node, by its credit
        (`_credited_gain`, kept for `observe` to set against what the run's first level added)."""
        reach, n = sized_branch(self.calibration, key, conditionals, ctx)  # what the branch alone would draft
        expected = 1.0 + sum(reach[:n])
        self._credit = self._credited_gain(reach, n)
        gain = self._weighed_credit(self._credit)
        head = HEAD_COST_WEIGHT * self._head_cost(ctx)
        return (expected + gain) / (ctx.cost(n + 1) + head) > expected / ctx.cost(n)

    def _weighed_credit(self, credit: float) -> float:
        """The credit the gate weighs: as credited. (`benchmarks/reader_ab.py`'s ``cal`` arms scale
        it by what the head's first level added where it ran, `HEAD_CREDIT`'s record.)"""
        return credit

    def _deeper(self, found: tuple[str, list[int], list[float]], key: tuple[str, int], ctx: DraftContext) -> "Deeper":
        """Where nodes cost: whether the head's next level is worth its run. It is when the chain
        it is expected to add below its best node to expand (that node's chance times the head's
        top-guess rate so far, per level left), scaled by what the head's levels at that depth have
        added so far (`_record_levels`), would be among the nodes that pay next to the tree so far
        merged with the search branch, with the run itself paid for (``HEAD_COST_WEIGHT`` times
        `_head_cost`, as at the root); otherwise the head stops there.

        Without the scale and the run's cost the second level of the fifth GPU visit's shapes ran
        on nearly every step, and in a replay with GPU-like verify costs it saved 0-3% of the steps
        at batch 8 (the deepened search branch offers the same tokens below the head's first guess)
        and 3% at batch 1, for a second head run a step (BENCHMARKS.md 10ze). After
        ``LEVEL_PROBE_EVERY`` head runs without a deeper level, one is judged without them, so a
        level that stopped paying can win its place back."""
        rate = self._top1_rate()
        probe = self._since_level >= LEVEL_PROBE_EVERY
        run = 0.0 if probe else HEAD_COST_WEIGHT * self._head_cost(ctx)

        def deeper(tree: DraftTree, scores: list[float], frontier: float, levels: int) -> bool:
            draft = _Draft(tree, scores, self.calibration)
            level = max(draft.only, default=0) + 1  # the depth of the nodes this run drafts
            draft.add(-1, found[1], found[2], key, merge=True)
            now = sorted(draft.probs, reverse=True)
            chance = self.calibration.scaled("eagle", [math.exp(frontier)])[0]
            raw = [chance * rate**i for i in range(1, levels + 1)]
            below = raw if probe else self.calibration.scaled(("level", level), raw)
            if _rate(sorted(now + below, reverse=True), ctx, run) <= _rate(now, ctx):
                return False
            self._level_predicted[level] = raw[0]
            return True

        return deeper

    def _record_levels(self, accepted: set[int], levels: list[int]) -> None:
        """What each head level below the root's children added this step: the accepted nodes that
        only that level drafted (``levels``: a node's depth in the head's tree, 0 where the search
        branch or the local tree offered it too), against the chain `_deeper` predicted there
        (unscaled), recorded in the calibration under ("level", depth)."""
        for level, predicted in self._level_predicted.items():
            self.calibration.record(("level", level), sum(1 for i in accepted if levels[i] == level), predicted)
        self._level_predicted = {}

    def propose(self, ctx: DraftContext) -> DraftTree:
        return drive(self.drafting(ctx))

    def drafting(self, ctx: DraftContext) -> Drafting:
        """`propose` as a generator of the head's runs (see `EagleDrafter.drafting`)."""
        depth = min(self.search.depth, ctx.max_nodes)
        branches = 2 if self.deepen else 1
        costly = bool(ctx.verify_cost)
        value = branch_value(self.calibration, ctx)
        found = self.search.search(ctx.tokens, depth, value)
        root_key, root_node = self.search.last_key, self.search.last_node
        self._eagle_top = None
        self._level_predicted = {}
        self._credit = None
        probe = self._since_head >= PROBE_EVERY and not self._unverified
        pays = self._head_pays(found[2], root_key, ctx) if costly else True  # a probe's run is credited too
        if not probe and not pays:
            self.eagle.defer(ctx)
            self._credit = None  # no run to record
            self.skipped += 1
            self._since_head += 1
            tree, scores = DraftTree(), []
            yield HOST_WORK  # in a batch, the tree is assembled while the other rows' heads run
        else:
            self._since_head = 0
            small = DraftContext(ctx.tokens, ctx.prompt_len, max(ctx.max_nodes - branches * depth, 0), ctx.verify_cost, ctx.features)
            started, cold = self.clock(), self._head_cold()
            tree = yield from self.eagle.drafting(small, self._deeper(found, root_key, ctx) if costly else None)
            self._timed_head((self.clock() - started) / max(1, getattr(self.eagle, "last_runs", 1)), self._head_cold() != cold)
            self._since_level = 0 if self._level_predicted else self._since_level + 1
            scores = getattr(self.eagle, "last_scores", [0.0] * tree.size)[: tree.size]
            self._eagle_top = tree.tokens[0] if tree.size else None  # nodes come by depth, then rank
        self._last = self._assemble(ctx, found, root_key, root_node, tree, scores)
        tree = self._last[0]
        if tree.size:  # verified unless the batch cuts it (`keep`); an empty tree says nothing new
            self._unverified = False
        return tree

    def _assemble(
        self, ctx: DraftContext, found: tuple[str, list[int], list[float]], root_key: tuple[str, int], root_node: int | None,
        tree: DraftTree, scores: list[float],
    ) -> tuple[DraftTree, list, list[float], list[int]]:
        """The step's tree from EAGLE's (``tree``, ``scores``; empty when the head did not run) and
        the root's search branch ``found``: the branch hung at the root, where nodes cost the local
        trie's tree below ``root_node`` (the context's match there) merged in, with ``deepen`` a
        branch below EAGLE's first one, and where nodes cost the most likely nodes kept. Also each
        node's kind of estimate and unscaled estimate (what `observe` records in the calibration),
        and its depth in EAGLE's tree where only the head drafted it (else 0; `_record_levels`)."""
        costly = bool(ctx.verify_cost)
        draft = _Draft(tree, scores, self.calibration)

        def add(parent: int, source: str, tokens: list[int], conditionals: list[float], key: tuple[str, int]) -> bool:
            self.search.count(source)
            return draft.add(parent, tokens, conditionals, key, merge=costly)

        add(-1, *found, root_key)
        if costly:
            self._add_local_tree(draft, ctx, root_node)
        if self.deepen and scores:
            depth, value = min(self.search.depth, ctx.max_nodes), branch_value(self.calibration, ctx)
            branch = first_branch(tree)  # EAGLE's own tree: branches are hung on `draft.tree`
            tail = list(ctx.tokens[-self.search.reads :])  # all a search reads of the context
            for j in range(len(branch), 0, -1):
                found = self.search.search(tail + [tree.tokens[i] for i in branch[:j]], depth, value)
                if add(branch[j - 1], *found, self.search.last_key):
                    self.deepened += 1
                    break
        probs, keys, raw, only = draft.probs, draft.keys, draft.raw, draft.only
        if not costly:
            return draft.tree, keys, raw, only
        # the most likely nodes: as many as pay, or, for the batch to size, all best first
        keep = _by_likelihood(probs) if ctx.engine_sizes else _most_likely(probs, ctx)
        tree = _subtree(draft.tokens, draft.parents, keep, [probs[i] for i in keep] if ctx.engine_sizes else ())
        return tree, [keys[i] for i in keep], [raw[i] for i in keep], [only[i] for i in keep]

    def _add_local_tree(self, draft: "_Draft", ctx: DraftContext, node: int | None) -> None:
        """Where nodes cost: the local trie's most likely continuations, as many as pay under the
        verify cost on their own (what the `trie` drafter offers: on two CPU cores a few nodes, on
        a GPU's near-flat cost up to its 32), merged into the draft like the branch, so that a step
        never has fewer good candidates than the trie alone; the sizing of the whole draft keeps
        those that pay beside the others. (The search branch is one chain; on a CPU where a second
        and third node are cheap, the trie's second guesses at a fork were worth more than the
        chain's tail. A fixed 8 nodes had left the whole method drafting fewer tokens per call
        than the trie on a GPU: BENCHMARKS.md section 10c.)"""
        if node is None:
            return
        trie = self.search.trie
        tree, reach = trie.top_subtree(node, min(self.local_tree_nodes, ctx.max_nodes), SMOOTHING * self.search.prefix_len)
        key = ("local", trie.depth(node))
        size = best_size(self.calibration.scaled(key, reach), ctx)  # nodes come best first: every prefix is a tree
        draft.add_tree(tree.truncated(size, max_depth=size), reach[:size], key)

    def keep(self, size: int) -> None:
        """The engine verifies only the first ``size`` nodes of the last tree offered."""
        self._unverified = not size
        if self._last is not None:
            tree, keys, raw, only = self._last
            self._last = (tree.truncated(size, max_depth=size), keys[:size], raw[:size], only[:size])

    def observe(self, new_tokens: Sequence[int]) -> None:
        self.eagle.observe(new_tokens)
        self.search.extend(new_tokens)
        if self._eagle_top is not None:
            self._top1[0] += int(new_tokens[0] == self._eagle_top)
            self._top1[1] += 1
            self._eagle_top = None
        if self._last is not None:
            tree, keys, raw, only = self._last
            accepted = set(accepted_path(tree, list(new_tokens)[:-1]))
            for node, (key, p) in enumerate(zip(keys, raw)):
                self.calibration.record(key, node in accepted, p)
            self._record_levels(accepted, only)
            if self._credit is not None and not self._unverified:
                added = any(only[i] == 1 for i in accepted)
                self.calibration.record(HEAD_CREDIT, added, self._credit)
                self._first_level[0] += added
                self._first_level[1] += self._credit
            self._last = None
        self._credit = None

    def _top_guesses(self) -> tuple[int, int]:
        """EAGLE's top guesses so far, drafted and caught up on: (right, scored)."""
        right, scored = getattr(self.eagle, "caught_up", (0, 0))
        return self._top1[0] + right, self._top1[1] + scored

    def stats(self) -> dict:
        head = {"head_skipped": self.skipped, "head_top_guess": list(self._top_guesses()), "head_first_level": [self._first_level[0], round(self._first_level[1], 3)]}
        if self.search.depth == 0:  # `alone`
            return head
        return {"search_branch_from": dict(self.search.found), "deepened": self.deepened, **head}


class _Draft:
    """A tree being assembled from the head's nodes and search branches: each node's calibrated
    chance of acceptance (``probs``), its unscaled estimate (``raw``, what calibration records),
    the kind of estimate it is (``keys``: "eagle", or the search's source and match length) and,
    for a node only the head drafted, its depth in the head's tree (``only``; 0 once a branch
    repeats it, and for the branches' own nodes). Nodes are kept in lists, and each parent's first
    child with a token in a dict, so that hanging a branch costs its own length, not the tree's (at a
    GPU's sizing, where the local tree hangs a dozen paths a step, that took a fifth off the
    search's host time, BENCHMARKS.md 10zf)."""

    def __init__(self, tree: DraftTree, scores: list[float], calibration: Calibration) -> None:
        self.calibration = calibration
        self.tokens, self.parents = list(tree.tokens), list(tree.parents)
        self._kids: dict[tuple[int, int], int] = {}  # (parent, token) -> its first such child
        for i, parent_token in enumerate(zip(self.parents, self.tokens)):
            self._kids.setdefault(parent_token, i)
        self.raw = [math.exp(s) for s in scores]
        self.probs = calibration.scaled("eagle", self.raw)
        self.keys: list = ["eagle"] * tree.size
        self.only = depths(tree)

    @property
    def tree(self) -> DraftTree:
        return DraftTree(tuple(self.tokens), tuple(self.parents))

    def add(self, parent: int, tokens: list[int], conditionals: list[float], key: tuple[str, int], merge: bool) -> bool:
        """Hang a branch below ``parent`` (-1 = the root); False when it is empty. With ``merge``
        (where nodes are paid for), a branch token that a child already drafts is that node (with
        the higher of the two estimates), not a second copy of it."""
        if not tokens:
            return False
        above, above_raw = (self.probs[parent], self.raw[parent]) if parent >= 0 else (1.0, 1.0)
        reach = path_probs(conditionals)
        scaled = self.calibration.scaled(key, reach)
        self._hang(parent, [int(t) for t in tokens], [above * p for p in scaled], [above_raw * r for r in reach], key, merge)
        return True

    def add_tree(self, tree: DraftTree, reach: list[float], key: tuple[str, int]) -> None:
        """Merge ``tree`` (a trie's: no two siblings share a token), hung at the root, with each
        node's chance of being reached ``reach``: the same as adding its root-to-leaf paths in turn
        with ``merge`` (a node's conditional chance is its reach over its parent's), node by node.
        The paths would place each node when its subtree's first leaf comes, ancestors first, so
        the nodes are visited in that order and the draft numbers them as the paths would."""
        parents, tokens, n = tree.parents, tree.tokens, tree.size
        chance: list[float] = []  # as a path's running product of conditionals computes it
        for p, parent in zip(reach, parents):
            chance.append(p if parent < 0 else chance[parent] * (p / reach[parent]))
        scaled = self.calibration.scaled(key, chance)
        first = [n] * n  # each node's subtree's first leaf (children come after their parent)
        for node in range(n - 1, -1, -1):
            if first[node] == n:
                first[node] = node
            parent = parents[node]
            if parent >= 0 and first[node] < first[parent]:
                first[parent] = first[node]
        kids, probs, only = self._kids, self.probs, self.only
        placed = [-1] * n  # a node of ``tree`` -> its node in the draft
        for node in sorted(range(n), key=first.__getitem__):  # stable: a path's nodes top down
            parent = parents[node]
            at, token = placed[parent] if parent >= 0 else -1, tokens[node]
            kid = kids.get((at, token))
            if kid is None:  # a new node
                kid = kids[at, token] = len(self.tokens)
                self.tokens.append(token)
                self.parents.append(at)
                probs.append(scaled[node])
                self.raw.append(chance[node])
                self.keys.append(key)
                only.append(0)
            else:  # a node the draft has: the higher estimate, and no longer the head's alone
                if scaled[node] > probs[kid]:
                    probs[kid] = scaled[node]
                only[kid] = 0
            placed[node] = kid

    def _hang(self, parent: int, tokens: list[int], probs: list[float], raws: list[float], key: tuple[str, int], merge: bool) -> list[int]:
        """Hang a chain of ``tokens`` (estimates ``probs``, unscaled ``raws``) below ``parent``;
        the draft's node of each. With ``merge`` the chain's leading tokens that a child already
        drafts are that node (its estimate the higher of the two, and no longer the head's alone);
        the rest are new nodes, each the child of the one before, so none of them repeats a node
        and they are appended without looking."""
        nodes: list[int] = []
        i = 0
        while merge and i < len(tokens):
            kid = self._kids.get((parent, tokens[i]))
            if kid is None:
                break
            self.probs[kid] = max(self.probs[kid], probs[i])
            self.only[kid] = 0
            nodes.append(kid)
            parent, i = kid, i + 1
        added = len(tokens) - i
        if not added:
            return nodes
        # the rest as new nodes in one go (lists extended in C: a GPU-sized step hangs a few dozen)
        new, rest = len(self.tokens), tokens[i:]
        ids = range(new, new + added)
        self._kids.setdefault((parent, rest[0]), new)
        self._kids.update(zip(zip(ids, rest[1:]), ids[1:]))  # below a new node nothing is drafted yet
        self.tokens += rest
        self.parents.append(parent)
        self.parents += ids[:-1]
        self.probs += probs[i:]
        self.raw += raws[i:]
        self.keys += [key] * added
        self.only += [0] * added
        return nodes + list(ids)


def _rate(probs: list[float], ctx: DraftContext, run: float = 0.0) -> float:
    """Expected tokens per unit of verify cost (plus ``run``, a head run's cost in plain steps)
    of the best number of leading nodes."""
    n = best_size(probs, ctx)
    return (1.0 + sum(probs[:n])) / (ctx.cost(n) + run)


def _by_likelihood(probs: list[float]) -> list[int]:
    """Node indices, most likely first (ties in tree order): a child is never more likely than its
    parent, so every prefix of this order is a tree."""
    return sorted(range(len(probs)), key=probs.__getitem__, reverse=True)  # stable: ties stay in order


def _most_likely(probs: list[float], ctx: DraftContext) -> list[int]:
    """Indices of the most likely nodes, as many as maximise expected tokens per unit of verify
    cost, in tree order."""
    order = _by_likelihood(probs)
    return sorted(order[: best_size([probs[i] for i in order], ctx)])


def _subtree(tokens: Sequence[int], parents: Sequence[int], keep: list[int], gains: Sequence[float] = ()) -> DraftTree:
    """The nodes ``keep`` of the tree ``tokens``, ``parents`` (every kept node's parent kept, and
    before it) as a tree."""
    index = {old: new for new, old in enumerate(keep)}
    index[-1] = -1
    kept = [parents[i] for i in keep]
    assert all(p in index for p in kept), "a kept node's parent is kept (never less likely)"
    return DraftTree(tuple([tokens[i] for i in keep]), tuple([index[p] for p in kept]), tuple(gains))
