"""The head cache pooled over a batch's rows (`ngspec.eagle.pool`): rows handed out and back,
growth that keeps what is held, and one attention call for several rows equal to each row's
attention over its own entries."""

from __future__ import annotations

import gc

import pytest
import torch

from ngspec.eagle.pool import HeadPool, pooled_attention

KV, HEADS, D = 2, 4, 8


def _entries(m, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(1, KV, m, D, generator=g), torch.randn(1, KV, m, D, generator=g)


def test_rows_are_handed_back_when_dropped_and_the_lowest_is_reused():
    pool = HeadPool()
    a, b, c = pool.row(), pool.row(), pool.row()
    assert [a.index, b.index, c.index] == [0, 1, 2]
    del a, c
    gc.collect()
    assert pool.rows_in_use == 1
    assert pool.row().index == 0  # the lowest free row first (dropped again at once)
    d, e = pool.row(), pool.row()
    assert {d.index, e.index} == {0, 2}
    assert pool.row().index == 3


def test_growth_keeps_every_rows_entries():
    pool = HeadPool()
    rows = [pool.row() for _ in range(2)]
    held = []
    for r, m in zip(rows, (5, 70)):  # 70 entries outgrow the first capacity (64)
        k, v = _entries(m, r.index)
        r.append(k, v)
        held.append((k, v))
    third = pool.row()  # a third row outgrows the first two rows
    third.append(*_entries(3, 9))
    for r, (k, v) in zip(rows, held):
        torch.testing.assert_close(r.keys, k)
        torch.testing.assert_close(r.values, v)
    assert pool.keys.shape[0] >= 3 and pool.keys.shape[2] >= 70


def test_crop_then_append_overwrites_the_dropped_entries():
    row = HeadPool().row()
    k, v = _entries(6, 1)
    row.append(k, v)
    row.crop(4)
    k2, v2 = _entries(2, 2)
    row.append(k2, v2)
    torch.testing.assert_close(row.keys, torch.cat([k[:, :, :4], k2], dim=2))
    torch.testing.assert_close(row.values, torch.cat([v[:, :, :4], v2], dim=2))


def _alone(keys, values, q, visible, scale):
    """Oracle: plain softmax attention of one row's queries over its own entries."""
    k = keys[0].repeat_interleave(HEADS // KV, dim=0)  # [heads, L, d]
    v = values[0].repeat_interleave(HEADS // KV, dim=0)
    scores = (q[0] @ k.transpose(1, 2)) * scale
    scores = scores.masked_fill(~visible[None], float("-inf"))
    return (scores.softmax(-1) @ v).transpose(0, 1)  # [m, heads, d]


CALLS = {  # row: (seen, block)
    0: (9, [[0], [0, 1], [0, 2]]),  # a tree under the whole cache: node 2 skips node 1
    1: (3, [[0], [0, 1]]),  # causal over two new pairs
    3: (10, [[0, 2], [1, 3]]),  # past 12 entries: its prefix of 10, entry 10 or 11, and itself
}


@pytest.mark.parametrize("callers", [(0, 1, 3), (1, 3), (3,), (1, 0)], ids=["rows-0-1-3", "rows-1-3", "row-3-alone", "neighbours-out-of-order"])
def test_one_call_for_several_rows_equals_each_row_alone(callers):
    """Rows of different lengths, pool rows without a call (row 2, and the first ones: the calling
    rows are gathered, or viewed where they are neighbours, in any call order); a causal
    call (the whole cache seen), a tree-shaped block over a prefix, and a call that sees only part
    of what comes after its prefix."""
    pool = HeadPool()
    rows = [pool.row() for _ in range(4)]
    for r, n in zip(rows, (9, 3, 5, 12)):
        r.append(*_entries(n, 10 + r.index))
    seen = [CALLS[c][0] for c in callers]
    blocks = [CALLS[c][1] for c in callers]
    callers = [rows[c] for c in callers]
    sizes = [len(b) for b in blocks]
    g = torch.Generator().manual_seed(0)
    m = sum(sizes)
    query = torch.randn(1, HEADS, m, D, generator=g)
    key, value = torch.randn(1, KV, m, D, generator=g), torch.randn(1, KV, m, D, generator=g)
    before = [(r.keys.clone(), r.values.clone()) for r in callers]
    untouched = (rows[2].keys.clone(), rows[2].values.clone())

    out = pooled_attention(callers, seen, blocks, query, key, value, 0.5)

    assert out.shape == (1, m, HEADS, D)
    start = 0
    for r, s, block, (k0, v0) in zip(callers, seen, blocks, before):
        n = len(block)
        keys = torch.cat([k0, key[:, :, start : start + n]], dim=2)
        values = torch.cat([v0, value[:, :, start : start + n]], dim=2)
        torch.testing.assert_close(r.keys, keys)
        torch.testing.assert_close(r.values, values)
        visible = torch.zeros(n, keys.shape[2], dtype=torch.bool)
        visible[:, :s] = True
        for i, cols in enumerate(block):
            visible[i, [s + c for c in cols]] = True
        expected = _alone(keys, values, query[:, :, start : start + n], visible, 0.5)
        torch.testing.assert_close(out[0, start : start + n], expected, rtol=1e-5, atol=1e-5)
        start += n
    torch.testing.assert_close(rows[2].keys, untouched[0])
    torch.testing.assert_close(rows[2].values, untouched[1])
