"""The N-gram trie against a brute-force reading of the paper's definition."""

import pytest
import random
from collections import Counter

from ngspec.contracts import DraftContext
from ngspec.drafters.trie import Calibration, NGramTrie, TrieDrafter


def brute_force_counts(text, n, prefix_len):
    """Insert P[j:] + S for every window (windows past the end are cut at the end of the text)
    and count every path prefix: the count of the trie node at that path."""
    counts = Counter()
    for i in range(len(text)):
        window = text[i : i + n]
        for j in range(prefix_len):
            path = tuple(window[j:])
            for d in range(1, len(path) + 1):
                counts[path[:d]] += 1
    return counts


def trie_counts(trie):
    out = {}
    stack = [(0, ())]
    while stack:
        node, path = stack.pop()
        for tok, kid in trie.children[node].items():
            out[path + (tok,)] = trie.counts[kid]
            stack.append((kid, path + (tok,)))
    return out


def test_hand_worked_example():
    # text "a b a b c" with n = 3, L_p = 2: windows aba, bab, abc, bc, c
    a, b, c = 1, 2, 3
    trie = NGramTrie(n=3, prefix_len=2)
    trie.extend([a, b, a, b, c])
    counts = trie_counts(trie)
    # paths inserted: aba ba | bab ab | abc bc | bc c | c
    assert counts[(a,)] == 3 and counts[(a, b)] == 3 and counts[(a, b, a)] == 1 and counts[(a, b, c)] == 1
    assert counts[(b,)] == 4 and counts[(b, a)] == 2 and counts[(b, a, b)] == 1 and counts[(b, c)] == 2
    assert counts[(c,)] == 2
    assert len(counts) == 9


def random_cases(seed, vocab, shortest, cases=200):
    """(rng, n, prefix_len, text) of random small tries' settings and texts."""
    rng = random.Random(seed)
    for _ in range(cases):
        n = rng.randrange(2, 8)
        yield rng, n, rng.randrange(1, n), [rng.randrange(vocab) for _ in range(rng.randrange(shortest, 40))]


def test_counts_equal_brute_force_on_random_texts():
    for rng, n, prefix_len, text in random_cases(0, 5, 0):
        trie = NGramTrie(n, prefix_len)
        cut = rng.randrange(len(text) + 1)
        trie.extend(text[:cut])  # incremental insertion equals building at once
        trie.extend(text[cut:])
        assert trie_counts(trie) == dict(brute_force_counts(text, n, prefix_len))


def test_nodes_are_numbered_in_the_order_they_appear():
    """Ties between equally frequent nodes go to the lower id (`top_subtree`, `greedy_path`), so
    the numbering is part of what the drafter proposes: a node's id follows the first time its
    path is read, by the position of its last token, then by the position it starts at; a node's
    children iterate in id order."""
    for _, n, prefix_len, text in random_cases(1, 4, 1):
        trie = NGramTrie(n, prefix_len)
        for i in range(0, len(text), 5):
            trie.extend(text[i : i + 5])
        paths = {}
        for start in range(len(text)):
            for end in range(start, min(start + n, len(text))):
                paths.setdefault(tuple(text[start : end + 1]), (end, start))
        by_id = [None] * (len(trie.counts))
        stack = [(0, ())]
        while stack:
            node, path = stack.pop()
            assert list(trie.children[node].values()) == sorted(trie.children[node].values())
            for tok, kid in trie.children[node].items():
                by_id[kid] = path + (tok,)
                stack.append((kid, path + (tok,)))
        assert by_id[1:] == sorted(paths, key=paths.get)


def test_match_backs_off_to_shorter_suffixes():
    trie = NGramTrie(n=4, prefix_len=3)
    trie.extend([1, 2, 3, 4, 5, 6])
    assert trie.tokens[trie.match([1, 2, 3])] == 3  # full prefix found
    node = trie.match([9, 9, 5])  # only the last token matches
    assert trie.tokens[node] == 5 and 6 in trie.children[node]
    assert trie.match([7, 8, 9]) is None
    assert trie.match([9, 6]) is None  # 6 ends the text: no continuation


def test_top_subtree_takes_most_frequent_prefix_closed():
    trie = NGramTrie(n=4, prefix_len=1)
    trie.extend([1, 2, 3, 9, 1, 2, 3, 9, 1, 2, 4, 9, 1, 5])
    tree, counts = trie.top_subtree(trie.match([1]), 4)
    # below "1": "2" (3 times), "2 3" and "2 3 9" (twice), then "2 4" or "5" (once each; the
    # shallower "5" wins the tie)
    assert tree.tokens == (2, 3, 9, 5) and tree.parents == (-1, 0, 1, -1)
    # "1" occurs 4 times: probabilities are count / count(match)
    assert counts == pytest.approx([3 / 4, 2 / 4, 2 / 4, 1 / 4])
    for i, p in enumerate(tree.parents):
        assert p < i


def test_drafter_uses_generated_tokens_only_with_update():
    prompt = [1, 2, 3, 4]
    for update, expect_draft in ((False, False), (True, True)):
        drafter = TrieDrafter(n=4, prefix_len=2, num_draft=4, update=update)
        drafter.start(prompt)
        drafter.observe([7, 8, 9, 7])
        tree = drafter.propose(DraftContext(prompt + [7, 8, 9, 7], 4, 10))
        assert (tree.size > 0) == expect_draft
        if expect_draft:
            assert tree.tokens[:2] == (8, 9)


def test_smoothing_trusts_repeated_paths_more_than_single_ones():
    trie = NGramTrie(n=4, prefix_len=1)
    trie.extend([5, 6, 7, 8, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3])
    _, once = trie.top_subtree(trie.match([5]), 3, smoothing=1.0)
    _, thrice = trie.top_subtree(trie.match([1]), 2, smoothing=1.0)
    assert once == pytest.approx([1 / 2, 1 / 4, 1 / 8])  # 1 / (1 + 1) per level
    assert thrice[0] == pytest.approx(3 / 4) and thrice[1] == pytest.approx(3 / 4 * 3 / 4)


def test_offered_tree_is_the_whole_tree_best_first_and_keep_sets_what_is_calibrated():
    text = [1, 2, 3, 4, 1, 2, 3, 5, 1, 2, 3, 4, 1, 2]
    steep = (1.0, 1.0, 3.0) + (9.0,) * 10
    alone, offering = TrieDrafter(n=5, prefix_len=2, num_draft=6), TrieDrafter(n=5, prefix_len=2, num_draft=6)
    for d in (alone, offering):
        d.start(text)
    sized = alone.propose(DraftContext(text, len(text), 10, steep))
    offered = offering.propose(DraftContext(text, len(text), 10, steep, engine_sizes=True))
    assert 0 < sized.size < offered.size <= 6
    assert offered.truncated(sized.size, sized.size) == sized  # cost sizing keeps a prefix of the offer
    assert list(offered.gains) == sorted(offered.gains, reverse=True) and offered.gains[0] <= 1.0
    offering.keep(sized.size)
    alone.observe([3, 9])
    offering.observe([3, 9])  # one draft accepted: both record it against the same prediction
    assert offering.calibration._totals == alone.calibration._totals


def test_calibration_starts_neutral_and_tracks_accepted_over_predicted():
    cal = Calibration()
    assert cal.scale(3) == 1.0
    cal.record(3, accepted=1, predicted=3)  # (1 + prior) / (3 + 1), prior the global rate (1 + 1) / (3 + 1)
    assert cal.scale(3) == pytest.approx((1 + 0.5) / 4)
    for _ in range(50):
        cal.record(3, accepted=0.5, predicted=1)
    assert cal.scale(3) == pytest.approx(0.5, abs=0.02)


def test_calibration_may_scale_up_but_not_past_its_cap():
    cal = Calibration()
    for _ in range(20):
        cal.record(1, accepted=2, predicted=1)  # estimates that under-rate what gets accepted
    assert 1.5 < cal.scale(1) <= Calibration.MAX_SCALE
    for _ in range(200):
        cal.record(2, accepted=10, predicted=0.1)
    assert cal.scale(2) == Calibration.MAX_SCALE


def test_calibration_new_kind_starts_from_its_source_record():
    """A match length not seen yet starts from what its source has shown, not from trust."""
    cal = Calibration()
    for length in (2, 3):
        for _ in range(20):
            cal.record(("datastore", length), accepted=0, predicted=1)
    fresh = cal.scale(("datastore", 5))
    assert fresh < 0.1
    assert cal.scale(("local", 5)) == 1.0  # another source is untouched
    assert cal.scale(("datastore", 2)) < fresh  # its own record, with the source's as the prior


def test_trie_scaled_estimates_never_exceed_one():
    cal_up = TrieDrafter(n=6, prefix_len=2, num_draft=8)
    cal_up.start([1, 2, 3, 4, 1, 2, 3, 4])
    for _ in range(30):
        cal_up.calibration.record(2, accepted=3, predicted=1)
    ctx = DraftContext([1, 2, 3, 4, 1, 2], 6, 8, (1.0,) * 9, engine_sizes=True)
    tree = cal_up.propose(ctx)
    assert tree.size and all(0 < g <= 1.0 for g in tree.gains)


def test_a_new_prompt_weighs_what_earlier_prompts_showed_at_half():
    cal = Calibration()
    cal.record(2, accepted=0, predicted=4)
    cal.next_prompt()
    assert cal._totals == {2: (0, 2), (): (0, 2)}
    # (0 + prior) / (2 + 1), the prior being every kind's (0 + 1) / (2 + 1)
    assert cal.scale(2) == pytest.approx(1 / 9)
    Calibration().next_prompt()  # nothing to carry: a no-op


def test_trie_drafters_sharing_a_calibration_carry_it_from_prompt_to_prompt():
    """A drafter whose trees kept failing on one prompt hands the next prompt's drafter its
    distrust: that one drafts a smaller tree at first than a drafter starting from scratch."""
    text = [1, 2, 3, 4, 1, 2, 3, 5, 1, 2, 3, 4, 1, 2]
    ctx = DraftContext(text, len(text), 10, (1.0, 1.02, 1.04, 1.06) + (1.5,) * 10)
    shared = Calibration()
    first = TrieDrafter(n=5, prefix_len=2, num_draft=6, calibration=shared)
    first.start(text)
    assert first.propose(ctx).size
    first.observe([99])  # nothing accepted
    for _ in range(5):
        first.propose(ctx)
        first.observe([99])
    second, fresh = (TrieDrafter(n=5, prefix_len=2, num_draft=6, calibration=c) for c in (shared, None))
    for d in (second, fresh):
        d.start(text)
    assert second.calibration is shared and fresh.calibration is not shared
    assert second.propose(ctx).size < fresh.propose(ctx).size
