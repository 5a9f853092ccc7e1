"""Row drafters (context-ngram, unigram, bigram, mixed): definitions by brute force, statistics."""

from __future__ import annotations

import random

import numpy as np
import pytest

from ngspec.contracts import DraftContext
from ngspec.drafters import DrafterOptions, make_drafter
from ngspec.drafters.context_ngram import QgramIndex, context_rows
from ngspec.drafters.ngram_tables import NgramTables, extend
from ngspec.errors import NgspecError


def brute_context_rows(tokens, q, k, w):
    """Straight from the definition: every earlier occurrence of the last q tokens, the w tokens
    after it, counted; most frequent first, ties to the most recent occurrence."""
    suffix = tokens[-q:]
    found = {}
    for end in range(q, len(tokens)):
        if tokens[end - q : end] == suffix:
            follow = tuple(tokens[end : end + w])
            count, _ = found.get(follow, (0, -1))
            found[follow] = (count + 1, end)
    return sorted(found, key=lambda f: (-found[f][0], -found[f][1]))[:k]


@pytest.mark.parametrize("q", [1, 2, 3])
def test_context_rows_match_the_definition(q):
    rng = random.Random(q)
    for _ in range(300):
        vocab = rng.choice([3, 5, 12])
        tokens = [rng.randrange(vocab) for _ in range(rng.randrange(1, 60))]
        k, w = rng.randrange(1, 6), rng.randrange(1, 5)
        index = QgramIndex(q)
        # grow the index in random steps, as generation does
        cut = rng.randrange(0, len(tokens) + 1)
        index.sync(tokens[:cut])
        index.sync(tokens)
        expected = brute_context_rows(tokens, q, k, w) if len(tokens) >= q else []
        assert context_rows(tokens, index, k, w) == expected


def small_tables(vocab=20, top=4, width=6, seed=0):
    rng = np.random.default_rng(seed)
    bigram = np.stack([rng.permutation(vocab)[:top] for _ in range(vocab)])
    return NgramTables("test", rng.permutation(vocab), bigram, extend(bigram, width))


def ctx(tokens):
    return DraftContext(list(tokens), 1, 64)


def test_bigram_and_unigram_rows():
    tables = small_tables()
    opts = DrafterOptions(k=3, w=4)
    tree = make_drafter("bigram", opts, tables).propose(ctx([5, 7]))
    rows = [tables.extended[7, j, :4].tolist() for j in range(3)]
    assert sorted(map(list, _paths(tree))) == sorted(rows)
    uni = make_drafter("unigram", opts, tables).propose(ctx([5, 7]))
    assert sorted(map(list, _paths(uni))) == sorted(tables.chain(int(t), 4) for t in tables.unigram[:3])


def _paths(tree):
    from ngspec.tree import root_to_leaf_paths

    return [[tree.tokens[i] for i in p] for p in root_to_leaf_paths(tree)]


def test_mixed_fills_with_context_rows_first_then_bigram():
    tables = small_tables()
    drafter = make_drafter("mixed", DrafterOptions(k=4, w=2), tables)
    tokens = [1, 2, 3, 9, 1, 2, 4, 9, 1]  # after 1: (2, 3) and (2, 4), most recent (2, 4) first
    drafter.start(tokens)
    tree = drafter.propose(ctx(tokens))
    kinds = [s for s, _ in drafter._last]
    assert kinds[:2] == ["context", "context"] and set(kinds[2:]) == {"bigram"} and len(kinds) == 4
    assert [r for _, r in drafter._last[:2]] == [(2, 4), (2, 3)]
    assert tree.size <= 8


def test_statistics_count_rows_accepted_tokens_and_rank():
    tables = small_tables()
    drafter = make_drafter("context-ngram", DrafterOptions(k=3, w=3), tables)
    tokens = [1, 5, 6, 1, 7, 8, 1]  # rows after 1: (7, 8, 1) then (5, 6, 1)
    drafter.start(tokens)
    drafter.propose(ctx(tokens))
    drafter.observe([5, 6, 2])  # second row, 2 tokens accepted, then the bonus token
    stats = drafter.stats()
    assert stats["rows_allocated"] == {"context": 2}
    assert stats["tokens_accepted"] == {"context": 2}
    assert stats["accepted_row_rank"] == {"2": 1}
    drafter.propose(ctx(tokens + [5, 6, 2]))
    drafter.observe([9])  # nothing accepted
    assert drafter.stats()["accepted_row_rank"] == {"2": 1}


def test_duplicate_rows_are_dropped_and_k_w_validated():
    tables = small_tables()
    drafter = make_drafter("context-ngram", DrafterOptions(k=5, w=1))
    tokens = [1, 2, 1, 2, 1]
    drafter.start(tokens)
    assert drafter.propose(ctx(tokens)).size == 1
    for bad in (dict(k=0), dict(w=0), dict(ngram_q=0)):
        with pytest.raises(NgspecError):
            DrafterOptions(**bad)
    with pytest.raises(NgspecError, match="needs the model's n-gram tables"):
        make_drafter("bigram", DrafterOptions())
    assert make_drafter("bigram", DrafterOptions(), tables).name == "bigram"
