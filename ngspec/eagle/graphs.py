"""The EAGLE head's batched runs at fixed shapes, replayed from captured CUDA graphs.

On a GPU a head run (`ngspec.eagle.batched.run_calls`) is about a hundred small kernels, each
launched by Python: at batch 8 the host spends milliseconds a step issuing them while the GPU
waits (BENCHMARKS.md 10zd-10zf: the whole method's drafting is its whole batch-8 gap to the trie
there). A CUDA graph replays a captured run's kernels in one launch, but only at the shapes and
addresses it was captured with. So `StaticRuns` lays every run out at bucketed shapes:

- the calls' pairs padded to ``pairs`` (a power of two); a padding pair writes its key and value
  to a spare row of the head's pool, which no drafter is given, and its output is never read;
- the queries placed in ``[pool rows, longest, ...]`` (``longest`` a power of two) and attention
  run over every row of the pool up to ``width`` entries (a power of two, within the pool's
  capacity), each pair seeing what `HeadCall` says it sees (its row's first ``seen`` entries and
  its block), made on the device from index lists padded to ``seen_entries``;
- the host's part of a run is one copy of those index lists and one of the features.

Each shape runs eagerly at its first use, is captured at its second and replayed after
(`ngspec.cuda_graphs`). A graph holds the pool's buffers by address, so when the pool grows
(doubling, `HeadPool.reserve`) every graph is dropped and shapes are captured again. Off a GPU,
or with ``capture=False``, the same fixed-shape run executes as ordinary operations: that is how
the tests check it against `run_calls`. Runs too large for a graph (a long prompt's catching up is
mostly cached by `_cache_unread` first) run as `run_calls` does.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Sequence

import torch

from ngspec.cuda_graphs import Graphs, Slot, bucket, met_once
from ngspec.eagle.batched import HeadCall, _cache_unread, run_calls
from ngspec.eagle.pool import HeadPool
from ngspec.rows import attention_function

ATTENTION_NAME = "ngspec_head_static"
MOST_PAIRS = 512  # beyond these (or MOST_SEEN visible entries) a run is not worth a graph
MOST_SEEN = 1 << 14
LEAST_WIDTH = 256


@dataclass(frozen=True)
class Shape:
    """What a captured run is fixed to: pairs (padded), the longest call's pairs, visible entries
    beyond the rows' prefixes, and attention width (entries per row)."""

    pairs: int
    longest: int
    seen_entries: int
    width: int


class _Buffers:
    """A shape's inputs on the device: every index list in one integer tensor (one copy a run),
    and the features; and its graph."""

    def __init__(self, shape: Shape, rows: int, hidden: int, param: torch.Tensor) -> None:
        m, v = shape.pairs, shape.seen_entries
        self.ints = torch.zeros(5 * m + rows + 3 * v, dtype=torch.long, device=param.device)
        parts = self.ints.split([m, m, m, m, m, rows, v, v, v])
        # a pair's row: where its key and value go and where its query sits
        self.tokens, self.positions, self.row, self.slot, self.query_place, self.prefix, self.vis_row, self.vis_query, self.vis_slot = parts
        self.features = torch.zeros(m, hidden, dtype=param.dtype, device=param.device)
        self.slots = torch.arange(shape.width, device=param.device)
        self.graph: Slot[torch.Tensor] = Slot()  # the shape's graph, once captured


def static_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, pool: HeadPool | None = None, bufs: _Buffers | None = None, shape: Shape | None = None, **kwargs):
    """`ngspec.eagle.batched.head_attention` at a fixed shape: every pair's key and value written
    to its (row, slot) of the pool, its query to its (row, place) among ``[pool rows, longest]``
    queries, and one attention over all pool rows' first ``width`` entries, each query seeing its
    row's prefix and its block. Queries of rows without a call see nothing; their outputs (like a
    padding pair's) are never read."""
    b = bufs
    pool.keys[b.row, :, b.slot] = key[0].transpose(0, 1)
    pool.values[b.row, :, b.slot] = value[0].transpose(0, 1)
    rows = pool.keys.shape[0]
    q = query.new_zeros(rows, query.shape[1], shape.longest, query.shape[3])
    q[b.row, :, b.query_place] = query[0].transpose(0, 1)
    mask = b.slots[None, None, :] < b.prefix[:, None, None]
    mask = mask.expand(rows, shape.longest, shape.width).clone()
    mask[b.vis_row, b.vis_query, b.vis_slot] = mask.new_ones(())  # a device value: a Python True is a host copy, which a capture refuses
    keys, values = pool.keys[:, :, : shape.width], pool.values[:, :, : shape.width]
    out = torch.nn.functional.scaled_dot_product_attention(q, keys, values, attn_mask=mask[:, None], scale=scaling, enable_gqa=True)
    return out.transpose(1, 2)[b.row, b.query_place][None], None


class StaticRuns:
    """One head's runs over one pool at fixed shapes, captured as CUDA graphs when ``capture``.

    ``graphs`` counts captures and replays and says why capturing stopped, if it did (the runs
    then go on uncaptured); ``unbucketed`` counts runs left to `run_calls`."""

    def __init__(self, head: torch.nn.Module, embed: torch.nn.Module, pool: HeadPool, capture: bool) -> None:
        self.head, self.embed, self.pool = head, embed, pool
        self.param = next(head.parameters())
        self.graphs = Graphs("the EAGLE head's runs", capture, self.param.device)
        self._shapes: dict[Shape, _Buffers] = {}
        self._pool_buffer: torch.Tensor | None = None  # the pool's keys the shapes were made for
        self.unbucketed = 0

    @property
    def shapes(self) -> int:
        """Shapes made for the pool's present buffers (each captured at its second run, when capturing)."""
        return len(self._shapes)

    def report(self) -> str:
        """One line: captures and replays, shapes for the pool's present buffers, runs too large for one."""
        once = met_once(bufs.graph for bufs in self._shapes.values())
        return f"{self.graphs.report()}; {self.shapes} shapes for the pool's present buffers ({once} met once), {self.unbucketed} runs too large for one"

    @torch.inference_mode()
    def run(self, calls: Sequence[HeadCall]) -> list[torch.Tensor]:
        """What `run_calls` returns for ``calls`` (one per row of this pool)."""
        assert all(c.block is not None or c.seen == c.cache.length for c in calls), "a causal call sees its row's whole cache"
        calls = [_cache_unread(c, self.param) for c in calls]
        sizes = [len(c.tokens) for c in calls]
        visible = [c.visible() for c in calls]
        entries = sum(len(cols) for v in visible for cols in v)
        if sum(sizes) > MOST_PAIRS or entries > MOST_SEEN:
            self.unbucketed += 1
            return run_calls(calls)
        pool = self.pool
        ends = [c.cache.length + m for c, m in zip(calls, sizes)]
        pool.reserve(pool.rows_made + 1, max(ends), self._like())  # and a spare row, which no drafter holds
        if pool.keys is not self._pool_buffer:  # grown: the graphs point at the old buffers
            self._shapes.clear()
            self.graphs.dropped()
            self._pool_buffer = pool.keys
        rows, capacity = pool.keys.shape[0], pool.keys.shape[2]
        shape = Shape(bucket(sum(sizes), 8), bucket(max(sizes), 2), bucket(entries, 16), min(capacity, bucket(max(ends), LEAST_WIDTH)))
        bufs = self._shapes.get(shape)
        if bufs is None:
            bufs = self._shapes[shape] = _Buffers(shape, rows, self.head.config.hidden_size, self.param)
        bufs.ints.copy_(torch.tensor(_layout(calls, sizes, visible, shape, rows), pin_memory=bufs.ints.is_cuda), non_blocking=True)
        features = calls[0].features if len(calls) == 1 else torch.cat([c.features for c in calls])
        bufs.features[: len(features)].copy_(features)
        out = self.graphs.run(bufs.graph, partial(self._forward, bufs, shape))
        for c, end in zip(calls, ends):
            c.cache.length = end
        return list(out[: sum(sizes)].clone().split(sizes))

    def _like(self) -> torch.Tensor:
        """A tensor typed, placed and shaped (kv heads, head dim) as the pool's entries."""
        if self.pool.keys is not None:
            return self.pool.keys
        config = self.head.config
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        return self.param.new_empty(1, config.num_key_value_heads, 1, head_dim)

    def _forward(self, bufs: _Buffers, shape: Shape) -> torch.Tensor:
        """The run at ``shape`` from ``bufs``' inputs: its output."""
        embeds = self.embed(bufs.tokens[None]).to(self.param.dtype)
        with attention_function(self.head, ATTENTION_NAME, partial(static_attention, pool=self.pool, bufs=bufs, shape=shape)):
            return self.head(embeds, bufs.features[None], bufs.positions[None], None, None)[0]


def _layout(calls: Sequence[HeadCall], sizes: list[int], visible: list[list[list[int]]], shape: Shape, rows: int) -> list[int]:
    """`_Buffers.ints` for these calls: each pair's token, position, pool row, slot and place
    among its row's queries, padded to ``shape.pairs`` with pairs of the spare (last) row; each
    pool row's visible prefix (0 for rows without a call); and every (row, query, slot) a query
    sees beyond its prefix, padded to ``shape.seen_entries`` with the spare row's."""
    spare = rows - 1
    tokens, positions, row, slot, query_place = [], [], [], [], []
    prefix = [0] * rows
    vis_row, vis_query, vis_slot = [], [], []
    for c, m, cols_of in zip(calls, sizes, visible):
        r = c.cache.index
        tokens += c.tokens
        positions += c.positions
        row += [r] * m
        slot += range(c.cache.length, c.cache.length + m)
        query_place += range(m)
        prefix[r] = c.seen
        for i, cols in enumerate(cols_of):
            vis_row += [r] * len(cols)
            vis_query += [i] * len(cols)
            vis_slot += [c.seen + j for j in cols]
    pad, filler = shape.pairs - sum(sizes), shape.seen_entries - len(vis_row)
    parts = (  # in `_Buffers`' order
        tokens + [0] * pad, positions + [0] * pad, row + [spare] * pad, slot + [0] * pad, query_place + [0] * pad, prefix,
        vis_row + [spare] * filler, vis_query + [0] * filler, vis_slot + [0] * filler,
    )
    return [i for part in parts for i in part]
