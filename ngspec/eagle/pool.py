"""The EAGLE head's KV cache for every row of a batch in one buffer, and attention over it.

Every drafter made by one `eagle_factory` takes a row of the factory's `HeadPool`: keys and values
``[rows, kv_heads, capacity, head_dim]``, grown by doubling in either dimension. A row belongs to
its drafter (a `PoolRow`) until the drafter is dropped; then the next prompt's drafter reuses it.
Because the rows share one buffer, a head forward over several rows' calls
(`ngspec.eagle.batched.run_calls`) writes all their new keys and values with one indexed copy and
runs ONE scaled-dot-product attention over the calling rows, queries padded to the longest call and
a mask made of each row's visible prefix and its call's own block. Before, each row appended to its
own cache, built its own mask and ran its own attention, which is what a host-bound GPU pays for
per row (BENCHMARKS.md, section 10c: 32 attention calls a step at batch 8).
"""

from __future__ import annotations

import heapq
import weakref
from typing import Sequence

import torch


class HeadPool:
    """Rows of head cache in one buffer; rows are handed out by `row` and come back when their
    `PoolRow` is dropped."""

    def __init__(self) -> None:
        self.keys: torch.Tensor | None = None  # [rows, kv_heads, capacity, head_dim]
        self.values: torch.Tensor | None = None
        self._free: list[int] = []  # rows handed back (a heap: the lowest is reused first)
        self.rows_made = 0  # rows ever handed out (the most in use at once)
        self.static_runs = None  # a `ngspec.eagle.graphs.StaticRuns` that runs the rows' head calls, if any

    def row(self) -> "PoolRow":
        if self._free:
            index = heapq.heappop(self._free)
        else:
            index, self.rows_made = self.rows_made, self.rows_made + 1
        row = PoolRow(self, index)
        weakref.finalize(row, heapq.heappush, self._free, index)
        return row

    @property
    def rows_in_use(self) -> int:
        return self.rows_made - len(self._free)

    def reserve(self, rows: int, length: int, like: torch.Tensor) -> None:
        """Room for ``rows`` rows of ``length`` entries, shaped (kv heads, head dim), typed and
        placed like ``like`` ``[.., kv_heads, .., head_dim]``; grows by doubling, keeping what is
        held."""
        if self.keys is None:
            shape = (max(rows, 1), like.shape[-3], max(length, 64), like.shape[-1])
            self.keys, self.values = like.new_zeros(shape), like.new_zeros(shape)
            return
        have_rows, _, have_len, _ = self.keys.shape
        if rows <= have_rows and length <= have_len:
            return
        shape = (_grown(rows, have_rows), self.keys.shape[1], _grown(length, have_len), self.keys.shape[3])
        keys, values = self.keys.new_zeros(shape), self.values.new_zeros(shape)
        keys[:have_rows, :, :have_len] = self.keys
        values[:have_rows, :, :have_len] = self.values
        self.keys, self.values = keys, values


def _grown(need: int, have: int) -> int:
    """``have``, or where it must grow, at least double it."""
    return have if need <= have else max(need, 2 * have)


class PoolRow:
    """One drafter's head cache: row ``index`` of ``pool``, its first ``length`` entries."""

    def __init__(self, pool: HeadPool, index: int) -> None:
        self.pool, self.index, self.length = pool, index, 0

    def append(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Add entries ``[1, kv_heads, m, head_dim]`` after the row's ``length``."""
        m = keys.shape[-2]
        self.pool.reserve(self.index + 1, self.length + m, keys)
        self.pool.keys[self.index, :, self.length : self.length + m] = keys[0]
        self.pool.values[self.index, :, self.length : self.length + m] = values[0]
        self.length += m

    def crop(self, length: int) -> None:
        """Keep the first ``length`` entries (the rest is overwritten by later appends)."""
        self.length = min(self.length, length)

    @property
    def keys(self) -> torch.Tensor:
        return self.pool.keys[self.index : self.index + 1, :, : self.length]

    @property
    def values(self) -> torch.Tensor:
        return self.pool.values[self.index : self.index + 1, :, : self.length]


def pooled_attention(
    rows: Sequence[PoolRow], seen: Sequence[int], blocks: Sequence[Sequence[Sequence[int]]],
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scaling: float | None,
) -> torch.Tensor:
    """Attention for calls of several rows of one pool, in one call.

    ``query``, ``key``, ``value`` ``[1, heads or kv_heads, M, d]`` hold the calls' pairs one call
    after another; call c has ``len(blocks[c])`` pairs, whose entries are appended to
    ``rows[c]``; its pair i sees the row's first ``seen[c]`` entries and the entries
    ``seen[c] + j`` for j in ``blocks[c][i]`` (the row's entries after the prefix, the call's
    own included). Returns ``[1, M, heads, d]``."""
    pool = rows[0].pool
    sizes = [len(b) for b in blocks]
    ends = [r.length + m for r, m in zip(rows, sizes)]
    width, longest = max(ends), max(sizes)
    # attention runs over the calling rows only, in pool order: a view of the pool where they are
    # neighbours, else a gathered copy (on the team's two-core CPU, 2 rows of 8 with 900 entries
    # each: 0.32 ms gathered against 1.0 ms over all 8; BENCHMARKS.md 10q)
    indices = sorted(r.index for r in rows)
    used = len(indices)
    pool.reserve(indices[-1] + 1, width, key)
    place_of = {index: b for b, index in enumerate(indices)}
    # each pair's row (counted among the calling rows), slot in the cache and place among its
    # row's queries; then every (row, query, slot) a query sees beyond its row's prefix
    row_of, pool_row, slot, place, vis_row, vis_query, vis_slot = [], [], [], [], [], [], []
    prefix = [0] * used
    for r, s, block in zip(rows, seen, blocks):
        b = place_of[r.index]
        prefix[b] = s
        row_of += [b] * len(block)
        pool_row += [r.index] * len(block)
        slot += range(r.length, r.length + len(block))
        place += range(len(block))
        for i, cols in enumerate(block):
            vis_row += [b] * len(cols)
            vis_query += [i] * len(cols)
            vis_slot += [s + c for c in cols]
    dev = key.device
    at = torch.tensor([row_of, slot, place, pool_row], device=dev)
    vis = torch.tensor([vis_row, vis_query, vis_slot], device=dev)

    pool.keys[at[3], :, at[1]] = key[0].transpose(0, 1)  # [M, kv_heads, d] at (pool row, slot)
    pool.values[at[3], :, at[1]] = value[0].transpose(0, 1)
    for r, end in zip(rows, ends):
        r.length = end
    if indices[-1] - indices[0] + 1 == used:
        keys, values = pool.keys[indices[0] : indices[0] + used, :, :width], pool.values[indices[0] : indices[0] + used, :, :width]
    else:
        chosen = torch.tensor(indices, device=dev)
        keys, values = pool.keys[:, :, :width].index_select(0, chosen), pool.values[:, :, :width].index_select(0, chosen)

    q = query.new_zeros(used, query.shape[1], longest, query.shape[3])
    q[at[0], :, at[2]] = query[0].transpose(0, 1)
    mask = torch.arange(width, device=dev)[None, None, :] < torch.tensor(prefix, device=dev)[:, None, None]
    mask = mask.expand(used, longest, width).clone()  # [used, longest, width]: the prefixes...
    mask[vis[0], vis[1], vis[2]] = True  # ...and each pair's own part of the rest
    # padding queries may see nothing: their outputs are never read
    out = torch.nn.functional.scaled_dot_product_attention(q, keys, values, attn_mask=mask[:, None], scale=scaling, enable_gqa=True)
    return out.transpose(1, 2)[at[0], at[2]][None]
