"""`bench --batch-size`'s summary: throughput over rounds, ratios to vanilla, per-row tokens per
call and the rows that match the reference, on hand-made rounds."""

import pytest

from ngspec.bench.batched import BatchRound, summarise_batched, versus


def test_summary_of_hand_made_rounds():
    reference = [[1, 2, 3], [4, 5]]
    runs = {
        "vanilla": [BatchRound(10.0, 100, 100, 0.0, 4.0, reference), BatchRound(12.0, 100, 100, 0.0, 4.0, reference)],
        "trie": [BatchRound(8.0, 100, 50, 0.4, 4.0, reference), BatchRound(8.0, 100, 50, 0.4, 4.0, [[1, 2, 3], [4, 6]])],
    }
    by = {s.arm: s for s in summarise_batched(runs, reference)}
    assert by["vanilla"].speedup == 1.0 and by["vanilla"].tokens_per_call == 1.0 and by["vanilla"].exact_match == 1.0
    trie = by["trie"]
    assert trie.tokens_per_second == pytest.approx(200 / 16)
    assert trie.speedup == pytest.approx((200 / 16) / (200 / 22))  # totals, not a mean of rounds
    assert trie.round_speedups == pytest.approx([10 / 8, 12 / 8])
    assert trie.tokens_per_call == 2.0
    assert trie.draft_share == pytest.approx(0.8 / 16) and trie.prefill_share == pytest.approx(8 / 16)
    assert trie.exact_match == 0.75  # one row of four differs
    (pair,) = versus(list(by.values()), "trie")
    assert pair["arm"] == "vanilla" and pair["ratio"] == pytest.approx((200 / 22) / (200 / 16))
    assert pair["per_round"] == pytest.approx([8 / 10, 8 / 12])
