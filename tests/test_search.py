"""The statistical search branch: greedy continuations against brute force, branch placement,
and acceptance through duplicate siblings."""

import math
import random
from collections import Counter

import numpy as np
import pytest
import torch

from ngspec.contracts import DraftContext, DraftTree
from ngspec.datastore import index
from ngspec.datastore.index import Datastore
from ngspec.drafters import search as search_module
from ngspec.drafters.search import HEAD_CREDIT, PROBE_EVERY, SMOOTHING, EagleSearchDrafter, SearchBranch, SearchDrafter, first_branch, path_probs
from ngspec.tree import accepted_path
from ngspec.drafters.trie import NGramTrie, TrieDrafter
from ngspec.verify import accept_greedy

pytestmark = pytest.mark.tiny_llama_only  # the Qwen2 tiny model runs the lossless matrices (conftest)


def brute_greedy(followers: list[list[int]], depth: int, smoothing: float = 0.0) -> tuple[list[int], list[float]]:
    """Token by token, the commonest next token among continuations agreeing so far (ties: the
    smallest id, as the datastore's numpy search picks)."""
    alive = followers
    tokens, probs = [], []
    for d in range(depth):
        nxt = Counter(f[d] for f in alive if len(f) > d)
        if not nxt:
            break
        best = max(sorted(nxt), key=lambda t: nxt[t])
        probs.append(nxt[best] / (len(alive) + smoothing))
        tokens.append(best)
        alive = [f for f in alive if len(f) > d and f[d] == best]
    return tokens, probs


def random_match(rng: random.Random, vocabs: int, doc_len: int, docs: int, context_len: int, max_len: int):
    """Random documents over a vocabulary of 2 to ``vocabs`` - 1 tokens, their datastore, a random
    context and its longest suffix match there (at least one token, at most ``max_len``)."""
    vocab = rng.randrange(2, vocabs)
    documents = [[rng.randrange(vocab) for _ in range(rng.randrange(0, doc_len))] for _ in range(rng.randrange(1, docs))]
    store = Datastore.from_documents(documents, vocab)
    context = [rng.randrange(vocab) for _ in range(rng.randrange(1, context_len))]
    return documents, store, context, store.longest_suffix_match(context, 1, max_len)


@pytest.mark.parametrize("few", [0, 2, 10**9], ids=["numpy", "numpy-then-python", "python"])
def test_datastore_greedy_continuation_matches_brute_force(few, monkeypatch):
    """Both ways of reading the continuations: numpy over many occurrences, lists over a few, and
    numpy handing the occurrences still agreeing over to lists once they are few."""
    monkeypatch.setattr(index, "FEW", few)
    rng = random.Random(0)
    for case in range(300):
        docs, store, context, match = random_match(rng, vocabs=6, doc_len=25, docs=6, context_len=6, max_len=4)
        if match is None:
            continue
        query = context[len(context) - match.length :]
        followers = [
            doc[i + match.length :]
            for doc in docs
            for i in range(len(doc) - match.length + 1)
            if doc[i : i + match.length] == query
        ]
        assert len(followers) == match.count
        depth = rng.randrange(1, 8)
        smoothing = rng.choice([0.0, SMOOTHING])
        tokens, probs = store.greedy_continuation(match, depth, smoothing)
        want_tokens, want_probs = brute_greedy(followers, depth, smoothing)
        assert tokens == want_tokens, f"case {case}"
        assert probs == pytest.approx(want_probs)


def test_a_sampled_continuation_reads_occurrences_across_the_match_not_its_first_ones():
    """Oracle: the true frequencies. "5 6" goes on with 1 twice and with 2 six times; the suffix
    array lists the two "5 6 1" first, so a sample of its first four occurrences would read 1 as
    the commoner (a tie at a half, broken to the smaller id)."""
    store = Datastore.from_documents([[5, 6, 1]] * 2 + [[5, 6, 2]] * 6, 8)
    match = store.longest_suffix_match([5, 6], 2, 2)
    assert match.count == 8
    assert store.greedy_continuation(match, 1, max_occurrences=8) == ([2], [0.75])
    assert store.greedy_continuation(match, 1, max_occurrences=4) == ([2], [0.75])


@pytest.mark.parametrize("few", [0, 3], ids=["numpy", "numpy-then-python"])
def test_a_sampled_continuation_is_the_greedy_one_of_the_occurrences_sampled(few, monkeypatch):
    """Past ``max_occurrences`` (and ``FEW``, up to which every occurrence is read in Python) the
    continuation is brute force's over the evenly spaced occurrences read (suffix-array rows
    lo + i * count // max_occurrences), each followed to its document's end."""
    monkeypatch.setattr(index, "FEW", few)
    rng = random.Random(3)
    for case in range(200):
        _, store, _, match = random_match(rng, vocabs=5, doc_len=40, docs=8, context_len=3, max_len=2)
        if match is None or match.count <= max(few, 2):
            continue
        most = rng.randrange(2, match.count)
        sep, text = store.meta.separator, store.tokens.tolist()
        followers = []
        for row in match.lo + (np.arange(most) * match.count) // most:
            rest = text[int(store.sa[row]) + match.length :]
            followers.append(rest[: rest.index(sep)])
        depth, smoothing = rng.randrange(1, 8), rng.choice([0.0, SMOOTHING])
        tokens, probs = store.greedy_continuation(match, depth, smoothing, max_occurrences=most)
        want_tokens, want_probs = brute_greedy(followers, depth, smoothing)
        assert tokens == want_tokens, f"case {case}"
        assert probs == pytest.approx(want_probs)


def test_a_continuation_read_again_is_remembered_and_forgetting_reads_it_afresh(monkeypatch):
    """The datastore remembers continuations by match and depth (rows and steps meet the same
    common phrase): a second read equals the first without reading the arrays, a caller changing
    what it was handed changes nothing remembered, and `forget` makes the next read go to the
    arrays again (what a timed benchmark run does first)."""
    store = Datastore.from_documents([[5, 6, 1, 2]] * 3 + [[5, 6, 2, 3]], 8)
    match = store.longest_suffix_match([5, 6], 2, 2)
    reads = []  # the occurrences' text read (four occurrences: read in Python)
    real = Datastore._greedy_few
    monkeypatch.setattr(Datastore, "_greedy_few", lambda *a: reads.append(a) or real(*a))
    first = store.greedy_continuation(match, 2, SMOOTHING)
    first[0].append(99)  # the caller's copy
    assert store.greedy_continuation(match, 2, SMOOTHING) == ([1, 2], [3 / 4.5, 3 / 3.5])
    assert len(reads) == 1
    store.greedy_continuation(match, 3, SMOOTHING)  # another depth is another read
    assert len(reads) == 2
    store.forget()
    assert store.greedy_continuation(match, 2, SMOOTHING) == ([1, 2], [3 / 4.5, 3 / 3.5])
    assert len(reads) == 3


def test_trie_greedy_path_follows_the_most_frequent_child():
    trie = NGramTrie(n=8, prefix_len=1)
    trie.extend([1, 2, 3, 1, 2, 3, 1, 2, 4, 1, 5])
    node = trie.match([9, 1])
    tokens, probs = trie.greedy_path(node, 3)
    assert tokens == [2, 3, 1]
    # after "1": 2 three times, 5 once; after "1 2": 3 twice, 4 once; after "1 2 3": 1 twice
    assert probs == pytest.approx([3 / 4, 2 / 3, 2 / 2])


def test_local_match_beats_a_shorter_datastore_match_and_loses_to_a_longer_one():
    store = Datastore.from_documents([[7, 8, 9, 10, 11, 12]], 20)
    search = SearchBranch(store, depth=3, prefix_len=3)
    search.start([9, 10, 13, 14])  # locally "9 10" continues with 13
    source, tokens, _ = search.search([1, 9, 10])  # local matches 2 of 3 tokens, datastore 2 too
    assert (source, tokens) == ("local", [13, 14])
    source, tokens, _ = search.search([8, 9, 10])  # the datastore matches 3 tokens, locally 2
    assert (source, tokens) == ("datastore", [11, 12])
    empty = SearchBranch(None, 3)
    empty.start([1, 2])
    assert empty.search([5]) == ("none", [], [])


def test_weighed_search_keeps_the_branch_worth_more():
    store = Datastore.from_documents([[7, 8, 9, 10, 11, 12]], 20)
    search = SearchBranch(store, depth=3, prefix_len=3)
    search.start([9, 10, 13, 14])
    # the datastore's longer match wins by the paper's rule, but its kind has been bad so far
    worth = {"local": 1.0, "datastore": 0.1}
    source, tokens, _ = search.search([8, 9, 10], value=lambda key, probs: worth[key[0]] * sum(probs))
    assert (source, tokens, search.last_key) == ("local", [13, 14], ("local", 2))
    worth["datastore"] = 5.0
    source, tokens, _ = search.search([8, 9, 10], value=lambda key, probs: worth[key[0]] * sum(probs))
    assert (source, tokens, search.last_key) == ("datastore", [11, 12], ("datastore", 3))


def test_search_drafter_drafts_a_chain_sized_by_cost():
    drafter = SearchDrafter(None, depth=6, prefix_len=2)
    drafter.start([1, 2, 3, 4, 5, 6, 7, 1, 2, 3, 4, 5, 6, 7])
    free = drafter.propose(DraftContext([1, 2, 3, 4, 5, 6, 7, 1, 2], 9, 64))
    assert free.tokens == (3, 4, 5, 6, 7, 1)
    assert free.parents == (-1, 0, 1, 2, 3, 4)
    steep = drafter.propose(DraftContext([1, 2, 3, 4, 5, 6, 7, 1, 2], 9, 64, (1.0, 1.0) + (50.0,) * 10))
    assert steep.size == 1  # only the first token pays off when a second one costs 50 steps


def test_a_datastore_branch_seen_once_grows_less_certain_with_every_token():
    # one occurrence of "7 8" in the store, continued by ten tokens: every conditional frequency
    # is 1, and smoothing each one (as the local trie does) makes the branch's chance decay
    store = Datastore.from_documents([[7, 8, *range(10, 20)], [1, 2, 3]], 30)
    search = SearchBranch(store, depth=10, prefix_len=3)
    search.start([4, 5, 6])
    source, tokens, conditionals = search.search([6, 7, 8])
    assert (source, tokens) == ("datastore", list(range(10, 20)))
    once = 1 / (1 + SMOOTHING)
    assert conditionals == pytest.approx([once] * 10)
    assert path_probs(conditionals)[-1] == pytest.approx(once**10)
    # so where a second token costs a third of a step more, a single occurrence is not followed
    # for long (a flat 0.67 per node once made a 16-token branch look worth 3.4 steps)
    drafter = SearchDrafter(store, depth=10, prefix_len=3)
    drafter.start([4, 5, 6])
    cpu_like = (1.0, 1.02, 1.42, 1.42, 1.62, 1.91, 2.2, 2.36, 2.51, 2.71, 2.9)
    assert drafter.propose(DraftContext([6, 7, 8], 3, 64, cpu_like)).size < 4


def test_datastore_branch_conditionals_are_smoothed_by_the_occurrences_at_each_depth():
    # "7 8" twice: once continued by 9 9, once by 9 5; at depth 1 both agree (2 of 2), at depth 2
    # one of the two
    store = Datastore.from_documents([[7, 8, 9, 9], [7, 8, 9, 5]], 20)
    search = SearchBranch(store, depth=2, prefix_len=3)
    search.start([1])
    _, tokens, conditionals = search.search([6, 7, 8])
    assert tokens[0] == 9
    assert conditionals == pytest.approx([2 / (2 + SMOOTHING), 1 / (2 + SMOOTHING)])


def test_first_branch():
    tree = DraftTree((5, 6, 7, 8), (-1, -1, 0, 2))
    assert first_branch(tree) == [0, 2, 3]


def test_a_draft_hangs_branches_and_merges_only_where_asked():
    """Unmerged (a flat cost), a branch is a new chain beside its twin; merged, it walks the
    children it repeats (the first of duplicate siblings) and hangs the rest below the last, with
    each node's estimate the higher of the two."""
    from ngspec.drafters.trie import Calibration

    draft = search_module._Draft(DraftTree((5, 6, 7, 8), (-1, -1, 0, 2)), [-1.0] * 4, Calibration())
    assert draft.add(2, [8, 10], [0.5, 0.5], ("local", 2), merge=False)
    assert draft.tree == DraftTree((5, 6, 7, 8, 8, 10), (-1, -1, 0, 2, 2, 4))  # a sibling of node 3, never merged into it
    assert not draft.add(-1, [], [], ("local", 2), merge=True)
    assert draft.add(-1, [5, 7, 8, 11], [0.9, 0.9, 0.9, 0.9], ("local", 2), merge=True)
    assert draft.tree.tokens[6:] == (11,) and draft.tree.parents[6] == 3  # below the first 8, not its twin
    assert draft.probs[0] == pytest.approx(0.9) and draft.probs[3] == pytest.approx(0.9**3)
    assert draft.probs[4] == pytest.approx(math.exp(-1.0) * 0.5)  # the twin is untouched
    assert draft.only == [0, 1, 0, 0, 0, 0, 0]  # what a branch repeats is no longer the head's alone


def test_a_tree_merged_at_once_is_its_paths_merged_one_by_one():
    """`_Draft.add_tree` against its oracle, `_Draft.add` of each root-to-leaf path in turn: the
    same nodes in the same order, with the same estimates, over trees that share nodes with the
    draft at several depths (and one that shares none)."""
    import random

    from ngspec.drafters.trie import Calibration
    from ngspec.tree import root_to_leaf_paths

    rng = random.Random(7)
    calibration = Calibration()
    calibration.record(("local", 2), 3.0, 5.0)  # a scale that is not 1
    for _ in range(40):
        base = DraftTree.from_paths([[rng.randrange(4) for _ in range(rng.randrange(1, 4))] for _ in range(3)])
        scores = [math.log(rng.uniform(0.05, 0.9)) for _ in range(base.size)]
        local = DraftTree.from_paths([[rng.randrange(4) for _ in range(rng.randrange(1, 5))] for _ in range(rng.randrange(1, 5))])
        reach = []
        for p in local.parents:  # a child never more likely than its parent
            reach.append((reach[p] if p >= 0 else 1.0) * rng.uniform(0.2, 1.0))
        at_once, oracle = (search_module._Draft(base, scores, calibration) for _ in range(2))
        at_once.add_tree(local, reach, ("local", 2))
        for path in root_to_leaf_paths(local):
            probs = [reach[i] for i in path]
            oracle.add(-1, [local.tokens[i] for i in path], [p / q for p, q in zip(probs, [1.0] + probs[:-1])], ("local", 2), merge=True)
        assert at_once.tree == oracle.tree
        assert (at_once.probs, at_once.raw, at_once.keys, at_once.only) == (oracle.probs, oracle.raw, oracle.keys, oracle.only)


def test_greedy_acceptance_takes_the_longer_of_duplicate_siblings():
    # root -> 4 (eagle, shallow) and root -> 4 -> 5 -> 6 (a search branch with the same first token)
    tree = DraftTree((4, 4, 5, 6), (-1, -1, 1, 2))
    preds = [4, 9, 5, 6, 8]  # argmax after the root and after every node
    logits = torch.nn.functional.one_hot(torch.tensor(preds), 10).float()
    verdict = accept_greedy(tree, logits)
    assert verdict.path == (1, 2, 3)
    assert verdict.tokens == (4, 5, 6, 8)


class FixedEagle:
    """Stands in for the EAGLE drafter: a fixed tree, recording the node cap it was given."""

    name = "eagle"

    def __init__(self, tree: DraftTree, head_cost: float = 0.0) -> None:
        self.tree, self.caps, self.deferred, self.head_cost, self.deeper = tree, [], 0, head_cost, []

    def start(self, prompt):
        pass

    def defer(self, ctx):
        self.deferred += 1

    def drafting(self, ctx, deeper=None):  # a tree without head runs
        self.caps.append(ctx.max_nodes)
        self.deeper.append(deeper)
        return self.tree
        yield

    def observe(self, new_tokens):
        pass


def test_eagle_search_appends_one_branch_and_deepens_below_the_first_eagle_branch():
    history = [1, 2, 3, 4, 5, 6, 1, 2, 3, 4, 5, 6]
    eagle_tree = DraftTree((3, 9, 4), (-1, -1, 0))  # first branch: 3 -> 4
    drafter = EagleSearchDrafter(FixedEagle(eagle_tree), None, depth=2, prefix_len=2)
    drafter.start(history)
    ctx = DraftContext(history + [1, 2], 14, 10)
    tree = drafter.propose(ctx)
    assert drafter.eagle.caps == [8]  # the branch's nodes are reserved
    assert tree.tokens == (3, 9, 4, 3, 4) and tree.parents == (-1, -1, 0, -1, 3)
    deep = EagleSearchDrafter(FixedEagle(eagle_tree), None, depth=2, prefix_len=2, deepen=True)
    deep.start(history)
    tree = deep.propose(ctx)
    # the root branch stays; searched from "... 1 2 3 4", "5 6" hangs below the first branch's
    # last node (node 2)
    assert tree.tokens == (3, 9, 4, 3, 4, 5, 6) and tree.parents == (-1, -1, 0, -1, 3, 2, 5)
    assert deep.eagle.caps == [6]
    assert deep.stats()["deepened"] == 1


class ScoredEagle(FixedEagle):
    """A fixed tree with the head's path log-probabilities."""

    def __init__(self, tree, scores, head_cost=0.0):
        super().__init__(tree, head_cost)
        self.last_scores = scores


def test_eagle_search_keeps_the_most_likely_nodes_when_verification_costs():
    history = [1, 2, 3, 4, 5, 6, 1, 2, 3, 4, 5, 6]
    eagle_tree = DraftTree((3, 9, 4, 7), (-1, -1, 0, 2))
    scores = [math.log(0.9), math.log(0.01), math.log(0.5), math.log(0.001)]
    ctx = DraftContext(history + [1, 2], 14, 20)
    free = EagleSearchDrafter(ScoredEagle(eagle_tree, scores), None, depth=3, prefix_len=2)
    free.start(history)
    assert free.propose(ctx).size == 7  # flat cost: the fixed shape
    steep = EagleSearchDrafter(ScoredEagle(eagle_tree, scores), None, depth=3, prefix_len=2)
    steep.start(history)
    cost = (1.0,) * 5 + (100.0,) * 20  # four nodes are free, a fifth costs 100 steps
    tree = steep.propose(DraftContext(ctx.tokens, ctx.prompt_len, 20, cost))
    # the branch "3 4 5" merged into EAGLE's 3 -> 4 and went on below it; the least likely EAGLE
    # node (7, below 4) was dropped first
    assert tree.tokens == (3, 9, 4, 5) and tree.parents == (-1, -1, 0, 2)
    for i, p in enumerate(tree.parents):
        assert p < i
    steep.observe([3, 4, 8])  # two accepted: calibration counts them, from the unscaled estimates
    assert steep.calibration._totals["eagle"][0] == 2
    assert steep.calibration._totals["eagle"][1] == pytest.approx(0.9 + 0.01 + 0.5)
    assert steep.calibration._totals[("local", 2)][0] == 0  # 5 was not accepted


def test_eagle_search_runs_the_head_only_when_it_pays():
    history = [1, 2, 3, 4, 5, 6] * 4
    eagle_tree = DraftTree((3, 9), (-1, -1))
    cost = (1.0, 1.0, 1.0, 1.0, 1.2, 1.4, 1.6) + (2.0,) * 20
    eagle = ScoredEagle(eagle_tree, [math.log(0.6), math.log(0.1)], head_cost=0.3)
    drafter = EagleSearchDrafter(eagle, None, depth=3, prefix_len=2)
    drafter.start(history)
    # a sure local match ("1 2" was always followed by "3 4 5"): the head's guess adds too little
    tree = drafter.propose(DraftContext(history + [1, 2], len(history), 20, cost))
    assert eagle.deferred == 1 and eagle.caps == [] and tree.tokens == (3, 4, 5)
    assert drafter.stats()["head_skipped"] == 1
    drafter.observe([3, 4, 5, 6])
    # nothing to search from: the head runs (and would have caught up on the skipped positions)
    tree = drafter.propose(DraftContext(history + [1, 2, 3, 4, 5, 6, 77], len(history), 20, cost))
    assert eagle.deferred == 1 and len(eagle.caps) == 1 and tree.tokens[0] == 3
    # where verification is free the head always runs (the paper's fixed shape)
    drafter.observe([3, 99])
    drafter.propose(DraftContext(history + [1, 2], len(history), 20))
    assert eagle.deferred == 1 and len(eagle.caps) == 2


def test_the_head_gate_weighs_the_heads_measured_time_against_the_loops_step():
    """The weights say the head is free (head_cost 0); timed, a run takes 10 plain steps, and
    from then on the gate keeps it off where nothing else would. The prompt's first run (the
    head's prefill) is left out of the measurement."""
    history = [1, 2, 3, 4, 5, 6] * 4
    eagle = ScoredEagle(DraftTree((3, 9), (-1, -1)), [math.log(0.6), math.log(0.1)], head_cost=0.0)
    drafter = EagleSearchDrafter(eagle, None, depth=3, prefix_len=2)
    ticks = iter(range(0, 1000, 10))
    drafter.clock = lambda: next(ticks)  # every run takes 10 seconds
    drafter.start(history)
    cost = (1.0, 1.0, 1.2) + (2.0,) * 20
    nothing = history + [77]  # nothing to search from: a free head always pays
    for _ in range(2):
        drafter.propose(DraftContext(nothing, len(history), 20, cost, step_seconds=1.0))
        drafter.observe([3, 99])
    assert len(eagle.caps) == 2 and drafter._head_seconds == 10
    drafter.propose(DraftContext(nothing, len(history), 20, cost))  # no step measured yet: the weights' estimate
    assert len(eagle.caps) == 3
    drafter.observe([3, 99])
    drafter.propose(DraftContext(nothing, len(history), 20, cost, step_seconds=1.0))
    assert len(eagle.caps) == 3 and eagle.deferred == 1
    drafter.observe([3, 99])
    drafter.propose(DraftContext(nothing, len(history), 20, cost, step_seconds=100.0))  # a slow target: 0.1 steps
    assert len(eagle.caps) == 4


def test_the_loop_tells_drafters_what_a_plain_step_takes(tiny):
    from ngspec.decode import DecodeConfig, generate
    from ngspec.target import TargetModel

    seen = []

    class Recording:
        name = "recording"

        def start(self, prompt):
            pass

        def propose(self, ctx):
            seen.append(ctx.step_seconds)
            return DraftTree()

        def observe(self, new_tokens):
            pass

    target = TargetModel(tiny)
    generate(target, Recording(), [5, 6, 7, 8], DecodeConfig(max_new_tokens=6))
    assert seen[0] == 0.0 and all(s > 0 for s in seen[1:]) and len(seen) == 5


def test_the_head_goes_deeper_only_when_the_chain_expected_below_would_pay():
    history = [1, 2, 3, 4, 5, 6] * 4
    eagle = ScoredEagle(DraftTree((3,), (-1,)), [math.log(0.9)])
    drafter = EagleSearchDrafter.alone(eagle)
    drafter.start(history)
    cpu = (1.0, 1.02, 1.42, 1.42, 1.62) + (1.9,) * 20  # a second node costs 40% of a step
    drafter.propose(DraftContext(history + [7], len(history), 20, cpu))
    deeper = eagle.deeper[-1]
    top = DraftTree((3, 9), (-1, -1))
    scores = [math.log(0.9), math.log(0.05)]
    # the head's prior top-guess rate (a half): 0.45 and 0.225 below the 0.9 node do not pay for 40%
    assert not deeper(top, scores, math.log(0.9), 2)
    drafter._top1 = [8, 8]  # its top guesses have all held: with the prior, 90% (0.81 and 0.73 do)
    drafter.propose(DraftContext(history + [7], len(history), 20, cpu))
    assert eagle.deeper[-1](top, scores, math.log(0.9), 2)
    assert not eagle.deeper[-1](top, scores, math.log(0.2), 2)  # but not below a 0.2 node
    drafter.propose(DraftContext(history + [7], len(history), 20))
    assert eagle.deeper[-1] is None  # a flat cost: EAGLE's whole tree, every level


def test_eagle_alone_is_sized_like_eagle_search_without_a_branch():
    history = [1, 2, 3, 4, 5, 6] * 4
    eagle_tree = DraftTree((3, 9, 4, 7), (-1, -1, 0, 2))
    scores = [math.log(0.9), math.log(0.01), math.log(0.5), math.log(0.001)]
    ctx = DraftContext(history + [1, 2], len(history), 20)
    free = EagleSearchDrafter.alone(ScoredEagle(eagle_tree, scores))
    free.start(history)
    assert free.name == "eagle"
    assert free.propose(ctx) == eagle_tree  # flat cost: EAGLE's whole tree, no branch ("3 4 5" is there to find)
    assert free.eagle.caps == [20]  # no nodes reserved for a branch
    steep = EagleSearchDrafter.alone(ScoredEagle(eagle_tree, scores))
    steep.start(history)
    cost = (1.0, 1.0, 1.0, 1.5) + (3.0,) * 20  # two nodes are free, a third costs half a step
    tree = steep.propose(DraftContext(ctx.tokens, ctx.prompt_len, 20, cost))
    assert tree.tokens == (3, 4) and tree.parents == (-1, 0)  # the two most likely, still a tree
    steep.observe([3, 4, 8])
    assert steep.calibration._totals["eagle"] == (2, pytest.approx(0.9 + 0.5))
    # its top guess, 3, was right; its first level added that node, credited the prior rate, a half
    assert steep.stats() == {"head_skipped": 0, "head_top_guess": [1, 1], "head_first_level": [1, 0.5]}


def costly_head_alone():
    """`eagle` with a sure-looking head that costs 30% of a step, where a node costs 10%."""
    eagle = ScoredEagle(DraftTree((3,), (-1,)), [math.log(0.9)], head_cost=0.3)
    drafter = EagleSearchDrafter.alone(eagle)
    drafter.start(HISTORY)
    return eagle, drafter, (1.0, 1.1) + (2.0,) * 20


HISTORY = [1, 2, 3, 4, 5, 6] * 4


def test_eagle_alone_drafts_nothing_when_its_top_guess_does_not_pay():
    history = HISTORY
    eagle, drafter, cost = costly_head_alone()
    for step in range(8):  # its guesses are always wrong: the rate falls from the prior's half
        ctx = DraftContext(history + [50] * step, len(history), 20, cost)
        tree = drafter.propose(ctx)
        drafter.observe([50])
    # (accepted + 1) / (tried + 2) below the head's cost plus a node's: the step drafts nothing
    assert tree.size == 0 and eagle.deferred >= 1
    assert drafter.stats()["head_skipped"] == eagle.deferred


def test_the_gate_weighs_half_the_heads_cost(monkeypatch):
    """Nothing to search from, the head's rate at its prior (a half), a node costing 10% of a
    step: its guess pays when the weighed cost of a run is under 0.4 steps. A run costing 0.6
    steps is weighed at 0.3 (the guess alone understates what a run drafts), and so it runs; at
    the full weight it would not."""
    cost = (1.0, 1.1) + (2.0,) * 20
    for weight, runs in ((search_module.HEAD_COST_WEIGHT, 1), (1.0, 0)):
        monkeypatch.setattr(search_module, "HEAD_COST_WEIGHT", weight)
        eagle = ScoredEagle(DraftTree((3,), (-1,)), [math.log(0.9)], head_cost=0.6)
        drafter = EagleSearchDrafter.alone(eagle)
        drafter.start(HISTORY)
        drafter.propose(DraftContext(HISTORY + [50], len(HISTORY), 20, cost))
        assert len(eagle.caps) == runs


def test_a_head_run_records_whether_a_node_only_its_first_level_offered_was_accepted():
    """What the gate credited a head run with, against what its first level added: the calibration
    keeps it (`HEAD_CREDIT`) and `stats` counts it ("head_first_level": added, credited)."""
    cost = (1.0,) * 8 + (2.0,) * 20
    alone = EagleSearchDrafter.alone(ScoredEagle(DraftTree((3,), (-1,)), [math.log(0.9)]))
    alone.start(HISTORY)
    alone.propose(DraftContext(HISTORY + [50], len(HISTORY), 20, cost))
    alone.observe([3, 99])  # its own node, accepted: credited the prior rate, a half
    assert alone.calibration._totals[HEAD_CREDIT] == (1, pytest.approx(0.5))
    alone.propose(DraftContext(HISTORY + [50, 3, 99], len(HISTORY), 20, cost))
    alone.observe([7])  # not accepted; credited 2/3, the rate after one right guess
    assert alone.calibration._totals[HEAD_CREDIT] == (1, pytest.approx(0.5 + 2 / 3))
    assert alone.stats()["head_first_level"] == [1, pytest.approx(0.5 + 2 / 3, abs=1e-3)]
    # the head's 3 is also the search branch's first token ("1 2" went on as "3 4 5"): the node
    # accepted is not the head's alone
    both = EagleSearchDrafter(ScoredEagle(DraftTree((3,), (-1,)), [math.log(0.9)]), None, depth=3, prefix_len=2)
    both.start(HISTORY)
    both.propose(DraftContext(HISTORY + [1, 2], len(HISTORY), 20, cost))
    both.observe([3, 4, 5, 6])
    added, credited = both.calibration._totals[HEAD_CREDIT]
    assert added == 0 and 0 < credited < 0.5
    # a step the batch verified none of records nothing; nor does a step without the head, nor one
    # where verification is free (no gate weighed the head)
    cut = EagleSearchDrafter.alone(ScoredEagle(DraftTree((3,), (-1,)), [math.log(0.9)]))
    cut.start(HISTORY)
    cut.propose(DraftContext(HISTORY + [50], len(HISTORY), 20, cost, engine_sizes=True))
    cut.keep(0)
    cut.observe([3])
    eagle, closed, steep = costly_head_alone()
    closed.propose(DraftContext(HISTORY + [50], len(HISTORY), 20, (1.0, 5.0) + (9.0,) * 20))
    closed.observe([50])
    free = EagleSearchDrafter.alone(ScoredEagle(DraftTree((3,), (-1,)), [math.log(0.9)]))
    free.start(HISTORY)
    free.propose(DraftContext(HISTORY + [50], len(HISTORY), 20))
    free.observe([3, 99])
    assert not eagle.caps
    for drafter in (cut, closed, free):
        assert HEAD_CREDIT not in drafter.calibration._totals and drafter.stats()["head_first_level"] == [0, 0.0]


def test_a_closed_head_gate_still_probes_and_reopens_on_caught_up_guesses():
    history = HISTORY
    eagle, drafter, cost = costly_head_alone()
    ran = []
    for step in range(40):  # wrong every time it drafts, and nothing learned in between
        runs = len(eagle.caps)
        drafter.propose(DraftContext(history + [50] * step, len(history), 20, cost))
        ran.append(len(eagle.caps) > runs)
        drafter.observe([50])
    first_skip = ran.index(False)
    # closed, the head still runs every PROBE_EVERY-th step (and would catch up on the rest)
    assert [i for i in range(first_skip, 40) if ran[i]] == list(range(first_skip + PROBE_EVERY, 40, PROBE_EVERY + 1))
    eagle.caught_up = [30, 30]  # the probe's catch-up: its guesses at 30 skipped positions held
    drafter.propose(DraftContext(history + [50] * 40, len(history), 20, cost))
    assert ran[-1] is False and len(eagle.caps) == sum(ran) + 1  # the gate is open again
    assert drafter.stats()["head_top_guess"] == [30, sum(ran) + 30]


def test_no_probe_while_the_batch_verifies_none_of_the_rows_tree():
    history = HISTORY

    def head_runs(cut_to: int | None) -> list[bool]:
        """The head's runs over 40 batch steps whose joint width cuts the row's tree to ``cut_to``
        nodes (None: the batch keeps the tree whole)."""
        eagle = ScoredEagle(DraftTree((3,), (-1,)), [math.log(0.9)], head_cost=0.3)  # always wrong
        drafter = EagleSearchDrafter(eagle, None, depth=3, prefix_len=2)  # the branch: "50 50 50"
        drafter.start(history)
        cost = (1.0, 1.1) + (2.0,) * 20
        ran = []
        for step in range(40):
            runs = len(eagle.caps)
            tree = drafter.propose(DraftContext(history + [50] * step, len(history), 20, cost, engine_sizes=True))
            if cut_to is not None and tree.size > cut_to:
                drafter.keep(cut_to)
            ran.append(len(eagle.caps) > runs)
            drafter.observe([50])
        return ran

    def longest_skip(ran: list[bool]) -> int:
        return max(len(run) for run in "".join("x" if r else "." for r in ran).split("x"))

    # kept whole, the closed gate still lets the head run every PROBE_EVERY-th step; cut to nothing
    # by the batch, the row drafts on without its head (its gate still decides on its own)
    assert longest_skip(head_runs(None)) == PROBE_EVERY
    assert longest_skip(head_runs(0)) > 2 * PROBE_EVERY


def test_accepted_path_takes_the_longest_matching_path():
    tree = DraftTree((4, 4, 5, 6), (-1, -1, 1, 2))
    assert accepted_path(tree, [4, 5, 6]) == [1, 2, 3]
    assert accepted_path(tree, [4, 9]) == [0]
    assert accepted_path(tree, [8]) == []


def test_where_nodes_cost_the_local_tries_second_guesses_join_the_draft():
    history = [1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 7, 8]  # "1 2" went on as "3 4" twice, as "7 8" once
    ctx_tokens = history + [1, 2]
    eagle = ScoredEagle(DraftTree((9,), (-1,)), [math.log(0.05)])
    drafter = EagleSearchDrafter(eagle, None, depth=4, prefix_len=2)
    drafter.start(history)
    three_free = (1.0, 1.0, 1.0, 1.0) + (5.0,) * 30
    tree = drafter.propose(DraftContext(ctx_tokens, len(history), 20, three_free))
    # 3 (0.5) and 4 (0.33) from the branch, then the trie's second guess 7 (0.25) beats the
    # branch's third token 1 (0.22) and EAGLE's 9 (0.05)
    assert tree.tokens == (3, 4, 7) and tree.parents == (-1, 0, -1)
    flat = EagleSearchDrafter(ScoredEagle(DraftTree((9,), (-1,)), [math.log(0.05)]), None, depth=4, prefix_len=2)
    flat.start(history)
    assert 7 not in flat.propose(DraftContext(ctx_tokens, len(history), 20)).tokens  # the fixed shape: one branch


def _paths(tree: DraftTree) -> set[tuple[int, ...]]:
    """Every node's path of tokens from the root."""
    out = set()
    for i in range(tree.size):
        path, node = [], i
        while node != -1:
            path.append(tree.tokens[node])
            node = tree.parents[node]
        out.add(tuple(reversed(path)))
    return out


@pytest.mark.parametrize("slope", [0.001, 0.4], ids=["near-flat", "steep"])
def test_the_local_tree_is_the_trie_drafters_tree(slope):
    """Oracle: the `trie` drafter on the same context and cost. "1 2" went on twelve ways, so on a
    near-flat cost (a GPU) its tree has more than 8 nodes, and every one of them is in the whole
    method's tree too (a fixed 8-node local tree had left it drafting less than the trie there);
    on a steep one both keep a few."""
    history = []
    for k in range(12):
        history += [1, 2, 20 + k, 40 + k] * (12 - k)  # continuation k seen 12 - k times
    ctx = DraftContext(history + [1, 2], len(history), 40, tuple(1.0 + slope * n for n in range(41)))
    trie = TrieDrafter(prefix_len=2)
    trie.start(history)
    expected = trie.propose(ctx)
    drafter = EagleSearchDrafter(ScoredEagle(DraftTree(), []), None, depth=11, prefix_len=2)  # a trie of order 13, as the trie drafter's
    drafter.start(history)
    got = drafter.propose(ctx)
    assert _paths(expected) <= _paths(got)
    assert (expected.size > 8) == (slope < 0.01)


@pytest.mark.parametrize("name", ["trie", "search", "eagle", "eagle+search"])
def test_the_registry_hands_a_runs_calibration_to_every_calibrating_drafter(name):
    from ngspec.drafters import make_drafter
    from ngspec.drafters.trie import Calibration

    shared = Calibration()
    drafter = make_drafter(name, eagle=lambda: ScoredEagle(DraftTree(), []), calibration=shared)
    assert drafter.calibration is shared
    assert make_drafter(name, eagle=lambda: ScoredEagle(DraftTree(), [])).calibration is not shared


def test_a_deeper_level_pays_for_its_own_head_run():
    """On a near-flat cost the chain expected below a 0.2 node pays for its verification, but not
    for a head run that costs 0.6 plain steps (weighed by HEAD_COST_WEIGHT)."""
    history = [1, 2, 3, 4, 5, 6] * 4
    top = DraftTree((3, 9), (-1, -1))
    scores = [math.log(0.9), math.log(0.05)]
    for head_cost, runs in ((0.0, True), (0.6, False)):
        eagle = ScoredEagle(DraftTree((3,), (-1,)), [math.log(0.9)], head_cost=head_cost)
        drafter = EagleSearchDrafter.alone(eagle)
        drafter.start(history)
        drafter._top1 = [8, 8]
        drafter.propose(DraftContext(history + [7], len(history), 20, NEAR_FLAT))
        assert eagle.deeper[-1](top, scores, math.log(0.2), 2) is runs


NEAR_FLAT = (1.0,) + tuple(1.0 + 0.004 * n for n in range(1, 25))  # a GPU's verify cost


class LevelEagle(ScoredEagle):
    """Asks ``deeper`` before its second level, as the EAGLE drafter does, and drafts the level
    (node 4 below 3) only when told to."""

    def __init__(self, head_cost):
        super().__init__(DraftTree((3, 9, 4), (-1, -1, 0)), [math.log(0.9), math.log(0.05), math.log(0.8)], head_cost)
        self.levels = 0

    def drafting(self, ctx, deeper=None):
        self.caps.append(ctx.max_nodes)
        if deeper is None or deeper(DraftTree((3, 9), (-1, -1)), self.last_scores[:2], math.log(0.9), 1):
            self.levels += 1
            return self.tree
        return DraftTree((3, 9), (-1, -1))
        yield


def test_a_level_that_adds_nothing_beyond_the_search_stops_running_and_is_probed_again():
    """Each level run is scored by the accepted nodes only that level drafted: a level whose nodes
    are rejected (or that the search branch repeats) earns nothing, its expected chain is scaled
    down and it stops running; after LEVEL_PROBE_EVERY head runs without it, it is judged
    unscaled and uncharged once, and what it adds then counts again."""
    history = [1, 2, 3, 4, 5, 6] * 4
    eagle = LevelEagle(head_cost=0.2)
    drafter = EagleSearchDrafter.alone(eagle)
    drafter.start(history)
    drafter._top1 = [8, 8]
    ctx = DraftContext(history + [7], len(history), 20, NEAR_FLAT)
    since = 0
    for _ in range(12):
        levels = eagle.levels
        drafter.propose(ctx)
        since = 0 if eagle.levels > levels else since + 1
        drafter.observe([3, 8, 1])  # the level's node (4, below 3) was wrong
    assert 1 <= eagle.levels < 6 and drafter.calibration.scale(("level", 2)) < 0.2
    assert len(eagle.caps) == 12 and drafter._since_level == since  # head runs since the level last ran
    drafter._since_level = search_module.LEVEL_PROBE_EVERY
    drafter.propose(ctx)
    assert drafter._since_level == 0 and drafter._last[0].tokens == (3, 9, 4)  # the probe ran the level
    drafter.observe([3, 4, 1])  # and its node was accepted: it counts for the level
    accepted, _ = drafter.calibration._totals[("level", 2)]
    assert accepted == 1


def test_only_nodes_no_branch_repeats_count_for_the_heads_levels():
    from ngspec.drafters.trie import Calibration

    calibration = Calibration()
    draft = search_module._Draft(DraftTree((3, 9, 4, 7), (-1, -1, 0, 0)), [-0.1, -3.0, -0.5, -2.0], calibration)
    assert draft.only == [1, 1, 2, 2]
    draft.add(-1, [3, 4, 5], [0.9, 0.8, 0.5], ("local", 2), merge=True)  # repeats 3 -> 4, then 5 is new
    assert draft.only == [0, 1, 0, 2, 0]


def test_the_heads_measured_cost_is_per_run():
    """A tree of two head runs that took 10 seconds costs 5 seconds a run: the root's gate and
    each deeper level pay for one run each."""
    history = [1, 2, 3, 4, 5, 6] * 4
    eagle = ScoredEagle(DraftTree((3,), (-1,)), [math.log(0.6)])
    eagle.last_runs = 2
    drafter = EagleSearchDrafter(eagle, None, depth=3, prefix_len=2)
    ticks = iter(range(0, 1000, 10))
    drafter.clock = lambda: next(ticks)
    drafter.start(history)
    for _ in range(2):  # the first run (the head's prefill of the prompt) is left out
        drafter.propose(DraftContext(history + [77], len(history), 20, (1.0, 1.0, 1.2), step_seconds=100.0))
        drafter.observe([3, 99])
    assert drafter._head_seconds == 5 and drafter._head_cost(DraftContext((), 0, 0, step_seconds=100.0)) == 0.05


def test_a_head_run_at_a_new_fixed_shape_is_not_timed():
    """With the head's runs at fixed shapes (`--head-graphs`), a run that met a new shape (run
    eagerly the first time, captured the second: many times a replay) is left out of the head's
    measured cost, as the prompt's first run is; the runs after it are timed again."""
    from types import SimpleNamespace

    history = [1, 2, 3, 4, 5, 6] * 4
    eagle = ScoredEagle(DraftTree((3,), (-1,)), [math.log(0.6)])
    graphs = SimpleNamespace(cold=0)
    eagle.pool = SimpleNamespace(static_runs=SimpleNamespace(graphs=graphs))
    drafter = EagleSearchDrafter(eagle, None, depth=3, prefix_len=2)
    seconds = iter([0, 1, 10, 110, 200, 202])  # runs of 1 s (the prefill), 100 s (a capture), 2 s

    def clock():
        now = next(seconds)
        graphs.cold += now == 110  # the clock read after the capture: the run met a new shape
        return now

    drafter.clock = clock
    drafter.start(history)
    ctx = DraftContext(history + [77], len(history), 20, (1.0, 1.0, 1.2), step_seconds=100.0)
    for _ in range(3):
        drafter.propose(ctx)
        drafter.observe([3, 99])
    assert drafter._head_runs == 3 and drafter._head_seconds == 2


def test_the_eagle_drafter_counts_its_head_runs(tiny):
    from ngspec.drafters.eagle import EagleDrafter, EagleOptions
    from ngspec.eagle.head import EagleHead
    from transformers import LlamaConfig

    cfg = tiny.config
    head = EagleHead(LlamaConfig(hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size, num_attention_heads=cfg.num_attention_heads,
                                 num_key_value_heads=cfg.num_key_value_heads, vocab_size=cfg.vocab_size, max_position_embeddings=cfg.max_position_embeddings)).eval()
    drafter = EagleDrafter(head, tiny.get_input_embeddings(), tiny.get_output_embeddings(), EagleOptions("dynamic", top_k=2, depth=3, total_tokens=6, draft_vocab=0))
    prompt = [5, 6, 7, 8]
    drafter.start(prompt)
    feats = torch.zeros(len(prompt) - 1, cfg.hidden_size)
    drafter.propose(DraftContext(prompt, len(prompt), 6, (), feats))
    assert drafter.last_runs == 3  # the prompt's pairs (and the root's children), then two levels
