"""The target's verification forward at fixed shapes, replayed from captured CUDA graphs.

On a GPU a small model's verification is host work: a forward of the default 135M model issues
about two thousand tensor operations from Python, about 17 us each on the H100's host
(BENCHMARKS.md 10e), while the GPU's own work is a fraction of that. A CUDA graph replays a
captured forward in one launch, but only at the shapes and addresses it was captured with. So
`StaticVerify` lays every verification out at bucketed shapes:

- the rows (one for `TargetModel`, a batch's for `BatchTarget`) padded to a power of two; a
  padding row's keys and values go to the cache buffers' spare rows, which hold no sequence (a
  batch's finished rows become such rows where they are: the rows left stay in their buffer
  rows, so a drop moves nothing);
- the block (root and tree, padded to the widest row's) padded to a power of two wide; a padding
  query sees only itself, and no real query sees it;
- the block's keys and values written by index at slots ``start ...`` (a device tensor, so the
  block's start is an input of the graph, not a constant), and attention over the buffers' first
  ``span`` slots (a power of two of at least 256, within their capacity) under a mask made on
  the device from each row's valid slots and its block's visibility.

The host's part of a replay is two copies (the integers; the booleans). Each shape runs eagerly
at its first use, is captured at its second and replayed after (`ngspec.cuda_graphs`); the shapes
of one row count write their logits (and features) into one shared buffer, so a shape keeps no
output of its own. A graph holds the cache buffers by address, so when they are replaced (the
cache grows by doubling, a batch's rows are rearranged into new buffers) every shape is captured
again: a batch compacts rather than grows where that makes room (`BatchTarget.outgrows`), and
`TargetModel` keeps its buffers from prompt to prompt. Off a GPU, or with capture off, the same
fixed-shape forward runs as ordinary operations: that is how the tests check it against the
plain forward. Blocks wider than `MOST_WIDTH` run as the plain forward does.

A wider block is not always the dearer replay: on two GPU visits (H200s) blocks padded to 8 or 16
replayed in 7.6-9.7 ms and blocks padded to 32 or 64 in 5.1-7.7 (BENCHMARKS.md 10zs, 10zzk),
the kernels chosen differing by width. So a block may run padded wider than its own bucket:
`plan_widths` takes each bucket's replay cost as the run's calibration measured it on this device
(`ngspec.perf.costs`) and sends a bucket's blocks to the cheapest bucket at least as wide, where
that is at least `WIDER_MARGIN` cheaper (`wider_widths`). Padding changes no real query's
inputs, so the outputs are those of the block's own bucket.
"""

from __future__ import annotations

import weakref
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Callable

import torch
from transformers import PreTrainedModel
from transformers.cache_utils import Cache

from ngspec.cuda_graphs import Graphs, Slot, bucket, met_once
from ngspec.kv import cache_argument
from ngspec.tree import additive_mask

MOST_WIDTH = 64  # wider blocks (root and nodes) run uncaptured, as the plain forward does
LEAST_SPAN = 256
WIDER_MARGIN = 0.05  # a block is padded to a wider bucket only if that replays at least this much cheaper
WIDTHS = tuple(1 << i for i in range(MOST_WIDTH.bit_length()))  # the block widths a shape may have: 1, 2, ..., 64


def wider_widths(costs: dict[int, float], margin: float = WIDER_MARGIN) -> dict[int, int]:
    """For each width bucket in ``costs`` (its replay's cost, in any unit), the bucket its blocks
    run at: the cheapest one in ``costs`` at least as wide, where that costs at least ``margin``
    less than its own, else its own."""
    plan = {}
    for width in sorted(costs):
        best = min((w for w in costs if w >= width), key=lambda w: (costs[w], w))
        plan[width] = best if costs[best] <= (1.0 - margin) * costs[width] else width
    return plan


_WIDTHS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> {rows: `wider_widths` plan}


def plan_widths(model: PreTrainedModel, rows: int, costs: dict[int, float]) -> dict[int, int]:
    """From now on, pad the blocks of ``model``'s fixed-shape verifications of ``rows`` rows (1: one
    sequence, else a batch's size; also fewer rows that no plan of their own covers) as
    `wider_widths` plans from the buckets' replay ``costs`` measured at that many rows; the plan."""
    plan = wider_widths(costs)
    _WIDTHS.setdefault(model, {})[rows] = plan
    return plan


def planned_widths(model: PreTrainedModel) -> dict[int, dict[int, int]]:
    """The width plans in force for ``model``, by rows (`plan_widths`)."""
    return _WIDTHS.get(model, {})


@contextmanager
def unpadded(model: PreTrainedModel):
    """Inside: ``model``'s blocks run at their own buckets (its width plans set aside; a run to
    compare against them)."""
    plans = _WIDTHS.pop(model, None)
    try:
        yield
    finally:
        if plans is not None:
            _WIDTHS[model] = plans


@dataclass(frozen=True)
class Shape:
    """What a captured forward is fixed to: rows, block width, attended slots, and the features
    it keeps (None: none; () the last hidden state; else the layers EAGLE-3 reads)."""

    rows: int
    width: int
    span: int
    features: tuple[int, ...] | None


class _Inputs:
    """A shape's inputs on the device (integers: ids, positions, the block's slots, the buffer
    row of each row; booleans: each row's valid slots, its block's visibility), their staging
    copies on the host (pinned on a GPU, so each is one asynchronous copy) and its graph."""

    def __init__(self, shape: Shape, device: torch.device) -> None:
        r, w, span = shape.rows, shape.width, shape.span
        pinned = device.type == "cuda"
        self.ints = torch.zeros(2 * r * w + w + r, dtype=torch.long, device=device)
        self.bools = torch.zeros(r * span + r * w * w, dtype=torch.bool, device=device)
        self.host_ints = torch.zeros(self.ints.shape, dtype=torch.long, pin_memory=pinned)
        self.host_bools = torch.zeros(self.bools.shape, dtype=torch.bool, pin_memory=pinned)
        self.ids, self.positions, self.slots, self.at, self.valid, self.block = self._views(self.ints, self.bools, shape)
        self._host = self._views(self.host_ints, self.host_bools, shape)
        self._alone = torch.eye(w, dtype=torch.bool).expand(r, w, w)  # each query sees itself
        self.graph: Slot[tuple] = Slot()  # the shape's graph, once captured

    @staticmethod
    def _views(ints: torch.Tensor, bools: torch.Tensor, shape: Shape):
        r, w, span = shape.rows, shape.width, shape.span
        ids, positions, slots, at = ints.split([r * w, r * w, w, r])
        valid, block = bools.split([r * span, r * w * w])
        return ids.view(r, w), positions.view(r, w), slots, at, valid.view(r, span), block.view(r, w, w)

    def fill(self, start: int, ids: torch.Tensor, positions: torch.Tensor, valid: torch.Tensor | None, block: torch.Tensor,
             at: list[int] | None) -> None:
        """This verification's inputs, padded to the shape, each row's in buffer row ``at[row]``
        (None: rows in order), copied to the device."""
        rows, width = ids.shape
        h_ids, h_positions, h_slots, h_at, h_valid, h_block = self._host
        where = slice(rows) if at is None else torch.tensor(at)
        h_ids.zero_()
        h_ids[where, :width] = ids
        h_positions.zero_()
        h_positions[where, :width] = positions
        torch.arange(start, start + h_slots.shape[0], out=h_slots)
        if at is not None:
            h_at[:rows] = where
        h_valid.zero_()
        h_valid[where, :start] = True if valid is None else valid
        h_block.copy_(self._alone)
        h_block[where, :width, :width] = block
        self.ints.copy_(self.host_ints, non_blocking=True)
        self.bools.copy_(self.host_bools, non_blocking=True)


class _SlotWrites(Cache):
    """The cache during a fixed-shape forward: each layer's block written at the input slots of
    its buffers (`GrowableLayer.write_at`), and attention handed their first ``span`` slots."""

    def __init__(self, layers, slots: torch.Tensor, span: int) -> None:
        super().__init__(layers=layers)
        self.slots, self.span = slots, span

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        return self.layers[layer_idx].write_at(self.slots, key_states, value_states, self.span)


def attended(cache, slots: int) -> int:
    """The slots of ``cache`` (`GrowableLayer`s) a fixed-shape forward attends when the block
    ends at slot ``slots``: a power of two of at least `LEAST_SPAN`, within the buffers' capacity."""
    return min(cache.layers[0]._keys.shape[-2], bucket(slots, LEAST_SPAN))


def has_room(cache, start: int, width: int) -> bool:
    """Whether a block ``width`` wide written at slot ``start`` fits ``cache``'s buffers at its
    fixed shape (rounded up to a power of two wide), so that `StaticVerify.run` keeps them (and so
    its graphs) instead of growing them."""
    return start + bucket(width, 1) <= cache.layers[0]._keys.shape[-2]


def cold_runs(target) -> int:
    """The verifications of ``target`` (a `TargetModel` or `BatchTarget`) so far that ran a fixed
    shape for the first time or captured it (`ngspec.cuda_graphs.Graphs.cold`; 0 without fixed
    shapes): many times a replay's time, so a loop that learns what its steps cost leaves them out."""
    return 0 if target.static is None else target.static.graphs.cold


_BATCHES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def for_batches(model: PreTrainedModel, make: Callable[[], "StaticVerify"]) -> "StaticVerify":
    """The `StaticVerify` a model's batches share (made by ``make`` the first time): one batch
    after another, each reuses the last one's cache buffers and so its graphs."""
    static = _BATCHES.get(model)
    if static is None:
        static = _BATCHES[model] = make()
    return static


def batches_static(model: PreTrainedModel) -> "StaticVerify | None":
    """The `StaticVerify` the model's batches share, if they ran with `--target-graphs`."""
    return _BATCHES.get(model)


class StaticVerify:
    """One model's verification forwards at fixed shapes, captured as CUDA graphs when
    ``capture``; ``graphs`` counts captures and replays, ``unbucketed`` the forwards too wide."""

    def __init__(self, model: PreTrainedModel, capture: bool) -> None:
        self.model = model
        param = next(model.parameters())
        self.device, self.dtype = param.device, param.dtype
        self.graphs = Graphs("the target's verification", capture, self.device)
        self._shapes: dict[Shape, _Inputs] = {}
        self._buffers: tuple | None = None  # the cache buffers the shapes were made for
        # (what, rows, trailing shape, dtype) -> [rows, MOST_WIDTH, ...]: the outputs every shape of those rows writes
        self._outputs: dict[tuple, torch.Tensor] = {}
        self.cache = None  # the cache it last ran on, whose buffers its graphs hold (`reusable`)
        self.made = self.unbucketed = 0  # shapes made (over all buffers), forwards too wide for one

    def reusable(self):
        """The cache it last ran on, emptied, for a new batch to fill: its buffers are the ones
        the graphs hold, so nothing is captured again (None if there is none)."""
        cache, self.cache = self.cache, None
        if cache is not None:
            for layer in cache.layers:
                layer.hold(1, 0)
        return cache

    def report(self) -> str:
        """One line: shapes, captures and replays, forwards too wide for a shape, the outputs' memory."""
        once = met_once(inputs.graph for inputs in self._shapes.values())
        wider = "; ".join(f"{rows} row{'s' if rows > 1 else ''}: " + ", ".join(f"{w} as {to}" for w, to in plan.items() if to != w)
                          for rows, plan in sorted(planned_widths(self.model).items()) if any(to != w for w, to in plan.items()))
        return (f"{self.graphs.report()}; {self.made} shapes made ({once} of the present buffers' met once), "
                f"{self.unbucketed} forwards too wide for one; "
                f"outputs {self.output_bytes() / 2**20:.0f} MiB; blocks padded wider: {wider or 'none'}")

    def output_bytes(self) -> int:
        """The bytes of the output buffers the shapes share."""
        return sum(t.numel() * t.element_size() for t in self._outputs.values())

    def _shared(self, what: str, value: torch.Tensor) -> torch.Tensor:
        """``value`` ``[rows, width, ...]`` copied into the buffer that every shape of its rows
        shares, ``[rows, MOST_WIDTH, ...]``; the copy's view. A captured forward then keeps no
        output of its own: its logits, allocated from the graphs' pool during the capture, are
        free for the next capture to reuse (each replay rewrites them before the copy, and only
        the buffer is read, before the next replay). Before, every shape kept its own logits, rows
        x width x vocabulary floats: at 32 rows, the seven widths of one span came to 32 x 127 x
        49,152 x 4 bytes = 800 MB for the default model, and a run meets several spans; the
        buffer is 32 x 64 x 49,152 x 4 = 403 MB in all. A buffer is made at a shape's first
        forward, which is never a capture (a shape runs eagerly first)."""
        r, w = value.shape[:2]
        key = (what, r, tuple(value.shape[2:]), value.dtype)
        buffer = self._outputs.get(key)
        if buffer is None:
            buffer = self._outputs[key] = value.new_empty(r, MOST_WIDTH, *value.shape[2:])
        view = buffer[:, :w]
        view.copy_(value)
        return view

    def fits(self, width: int) -> bool:
        fits = width <= MOST_WIDTH
        self.unbucketed += not fits
        return fits

    @torch.inference_mode()
    def run(self, cache, start: int, ids: torch.Tensor, positions: torch.Tensor, valid: torch.Tensor | None, block: torch.Tensor,
            features: tuple[int, ...] | None = None, least_rows: int = 1, at: list[int] | None = None,
            ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The plain verification forward's logits ``[rows, width, vocab]`` (and the features
        `forward_with_features` gives, if ``features`` is not None: () the last hidden state,
        else those layers') for blocks ``ids``/``positions`` ``[rows, width]`` (host tensors)
        at slots ``start ...`` of ``cache`` (`GrowableLayer`s), each row seeing its ``valid``
        slots ``[rows, start]`` (None: all of them) and its block as ``block`` ``[rows, width,
        width]`` says; the cache then holds the block, as the plain forward leaves it. Row b's
        entries are in buffer row ``at[b]`` (None: row b; a batch's rows stay where they are
        when others finish, the buffer rows between them padding). Rows are padded to at least
        ``least_rows`` (a batch's size: its last rows, draining, need no shapes of their own)."""
        rows, width = ids.shape
        held = rows if at is None else max(at) + 1  # the buffer rows the entries span
        r = bucket(held, least_rows)
        w = self._width(cache, start, width, r)
        self.cache = cache
        layers = cache.layers
        for layer in layers:
            layer.make_room(r, start + w)
        buffers = (layers[0]._keys.shape, tuple(t.data_ptr() for layer in layers for t in (layer._keys, layer._values)))
        if buffers != self._buffers:  # new buffers: the graphs point at the old ones
            self._shapes.clear()
            self.graphs.dropped()
            self._buffers = buffers
        span = attended(cache, start + w)
        shape = Shape(r, w, span, features)
        inputs = self._shapes.get(shape)
        if inputs is None:
            self.made += 1
            inputs = self._shapes[shape] = _Inputs(shape, self.device)
        inputs.fill(start, ids, positions, valid, block, at)
        out = self.graphs.run(inputs.graph, partial(self._forward, cache, inputs, shape))
        for layer in layers:
            layer.hold(held, start + width)
        logits, kept = out
        if at is not None:  # each row's outputs from its buffer row, in the rows' order
            rows_at = inputs.at[:rows]
            return logits.index_select(0, rows_at)[:, :width], None if kept is None else kept.index_select(0, rows_at)[:, :width]
        return logits[:rows, :width].clone(), None if kept is None else kept[:rows, :width].clone()

    def _width(self, cache, start: int, width: int, rows: int) -> int:
        """The width a block ``width`` wide at slot ``start`` runs at, ``rows`` rows padded: its
        bucket, or a wider one as planned for that many rows (else for the fewest planned rows
        above: padding costs more at more rows; `plan_widths`), where the buffers have room for it
        (growing them would drop every graph)."""
        own = bucket(width, 1)
        plans = planned_widths(self.model)
        at = rows if rows in plans else min((n for n in plans if n > rows), default=None)
        wide = own if at is None else plans[at].get(own, own)
        return wide if wide == own or has_room(cache, start, wide) else own

    def _forward(self, cache, inputs: _Inputs, shape: Shape) -> tuple[torch.Tensor, torch.Tensor | None]:
        from ngspec.target import forward_with_features  # ngspec.target builds on this module

        seen = inputs.valid[:, None, :].expand(shape.rows, shape.width, shape.span).clone()
        seen[:, :, inputs.slots] = inputs.block
        mask = additive_mask(seen[:, None], self.dtype)
        writes = _SlotWrites(cache.layers, inputs.slots, shape.span)
        keep, layers = shape.features is not None, (shape.features or None)
        out, kept = forward_with_features(
            lambda **extra: self.model(
                input_ids=inputs.ids, position_ids=inputs.positions, attention_mask=mask,
                **cache_argument(self.model, writes), use_cache=True, **extra,
            ),
            self.model, keep, layers,
        )
        return self._shared("logits", out.logits), None if kept is None else self._shared("features", kept)
