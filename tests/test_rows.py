"""Row verification (k rows sharing the committed cache) against full recomputation."""

from __future__ import annotations

import torch

from ngspec.contracts import DraftTree
from ngspec.target import TargetModel


def _full_logits(model, ids: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return model(input_ids=torch.tensor([ids])).logits[0]


def test_rows_match_recomputed_logits(tiny):
    target = TargetModel(tiny)
    gen = torch.Generator().manual_seed(1)
    prompt = torch.randint(1, 96, (23,), generator=gen).tolist()
    target.prefill(prompt[:-1])
    rows = [torch.randint(1, 96, (n,), generator=gen).tolist() for n in (4, 4, 2, 0, 4)]
    logits = target.verify_rows(prompt[-1], rows)
    assert logits.shape == (5, 5, 96)
    for r, row in enumerate(rows):
        ref = _full_logits(tiny, prompt + row)[len(prompt) - 1 :]
        torch.testing.assert_close(logits[r, : len(row) + 1], ref, atol=1e-4, rtol=1e-4)


def test_rows_equal_tree_verification_of_the_same_chains(tiny):
    target = TargetModel(tiny)
    gen = torch.Generator().manual_seed(2)
    prompt = torch.randint(1, 96, (17,), generator=gen).tolist()
    rows = [torch.randint(1, 96, (3,), generator=gen).tolist() for _ in range(3)]
    target.prefill(prompt[:-1])
    by_rows = target.verify_rows(prompt[-1], rows)
    target.discard()
    tree = DraftTree(tuple(t for r in rows for t in r), tuple(p for i in range(3) for p in (-1, 3 * i, 3 * i + 1)))
    by_tree = target.verify(prompt[-1], tree)
    for r in range(3):
        torch.testing.assert_close(by_rows[r, 0], by_tree[0], atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(by_rows[r, 1:], by_tree[1 + 3 * r : 4 + 3 * r], atol=1e-4, rtol=1e-4)


def test_commit_row_keeps_that_rows_prefix(tiny):
    """After committing row 1's first two tokens, the next step sees exactly that history."""
    target = TargetModel(tiny)
    gen = torch.Generator().manual_seed(3)
    prompt = torch.randint(1, 96, (12,), generator=gen).tolist()
    rows = [torch.randint(1, 96, (4,), generator=gen).tolist() for _ in range(3)]
    target.prefill(prompt[:-1])
    target.verify_rows(prompt[-1], rows)
    target.commit_row(1, 2)
    assert target.length == len(prompt) + 2
    nxt = rows[1][2]
    after = target.verify(nxt, DraftTree.chain([5, 6]))
    ref = _full_logits(tiny, prompt + rows[1][:2] + [nxt, 5, 6])[len(prompt) + 2 :]
    torch.testing.assert_close(after, ref, atol=1e-4, rtol=1e-4)


def test_discard_after_tree_verify_restores_the_cache(tiny):
    target = TargetModel(tiny)
    prompt = list(range(1, 15))
    target.prefill(prompt[:-1])
    first = target.verify(prompt[-1], DraftTree.chain([7, 8, 9]))
    target.discard()
    again = target.verify(prompt[-1], DraftTree.chain([7, 8, 9]))
    torch.testing.assert_close(first, again)


def test_the_attention_registry_keeps_nothing_of_a_forward(tiny):
    """Row verification binds the committed cache into its attention function for one forward;
    afterwards transformers' registry holds the bare function, not a reference to that cache."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    from ngspec import rows

    target = TargetModel(tiny)
    target.prefill([1, 2, 3, 4])
    target.verify(5, DraftTree((6, 7, 8), (-1, 0, -1)), layout="rows")
    assert ALL_ATTENTION_FUNCTIONS[rows.ATTENTION_NAME] is rows.shared_prefix_attention
