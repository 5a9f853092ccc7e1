"""BatchTarget: B sequences decoded together, each with its own draft tree and acceptance.

Every verification appends one block per row (root + tree nodes, padded to the batch's largest
tree) at the same cache offset for all rows, so a step costs no copy. Each row then keeps only its
root and accepted nodes: the other block slots become *holes*, masked out of that row's attention.
``valid[b, s]`` says whether slot ``s`` holds a live entry of row ``b``; a row's positions (for
RoPE) count its live entries only, so holes never shift anything.

Holes cost memory and attention time, so `rearrange` compacts the cache (one gather per layer puts
every row's live entries first, written back into the layer's own buffer: no second cache); the
loop checks every N steps (`--rearrange-every`) and compacts when that frees enough
(`--rearrange-min-share`). A new prompt is prefilled on its own and written
into a free row; finished rows are dropped.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from transformers import DynamicCache, PreTrainedModel

from ngspec.contracts import DraftTree
from ngspec.kv import cache_argument, make_cache, replace_entries, truncate
from ngspec.target import forward_with_features, prepare_model
from ngspec.tree import additive_mask, batch_blocks


@dataclass
class CacheUse:
    """Cache occupancy, for the rearrangement report."""

    slots: int  # cache slots per row (the shared length)
    live: int  # live entries summed over rows
    rows: int

    @property
    def hole_share(self) -> float:
        total = self.slots * self.rows
        return 1.0 - self.live / total if total else 0.0


class BatchTarget:
    def __init__(self, model: PreTrainedModel) -> None:
        self.model, self.device, self.dtype, self.max_length = prepare_model(model)
        self.keep_features = False
        self.feature_layers: tuple[int, ...] | None = None
        self.cache: DynamicCache | None = None
        self.valid = torch.zeros(0, 0, dtype=torch.bool)  # [rows, slots]
        self.lengths: list[int] = []  # live entries per row (= its committed tokens)
        self.pending: list[list[torch.Tensor]] = []  # per row: features of newly committed positions
        self._block: tuple[int, int, torch.Tensor | None] | None = None  # (start slot, width, hidden)

    @property
    def rows(self) -> int:
        return len(self.lengths)

    @property
    def slots(self) -> int:
        return self.valid.shape[1]

    def use(self) -> CacheUse:
        return CacheUse(self.slots, sum(self.lengths), self.rows)

    def freeable_share(self) -> float:
        """The share of slots `rearrange` would free: the cache keeps the longest row's live
        entries, so the holes of shorter rows (a shorter prompt's padding) stay."""
        return 1.0 - max(self.lengths) / self.slots if self.slots else 0.0

    # -- rows in and out ---------------------------------------------------------------------------

    @torch.inference_mode()
    def admit(self, prompt: Sequence[int], row: int | None = None) -> torch.Tensor:
        """Prefill ``prompt`` on its own and place it in ``row`` (a finished row's slot) or a new
        last row; returns the next-token logits after the prompt."""
        own = make_cache(self.model.config, capacity=len(prompt))
        out, features = forward_with_features(
            lambda **extra: self.model(
                input_ids=torch.tensor([list(prompt)], device=self.device), **cache_argument(self.model, own), use_cache=True, logits_to_keep=1, **extra,
            ),
            self.model, self.keep_features, self.feature_layers,
        )
        n = len(prompt)
        if self.cache is None:
            self.cache = make_cache(self.model.config, capacity=n + 512)
            for layer, src in zip(self.cache.layers, own.layers):
                layer.update(src.keys, src.values)
            self.valid = torch.ones(1, n, dtype=torch.bool)
            self.lengths, self.pending = [n], [[]]
            row = 0
        else:
            if n > self.slots:
                self._grow(n - self.slots)
            if row is None:
                self._add_row()
                row = self.rows - 1
            for layer, src in zip(self.cache.layers, own.layers):
                layer.keys[row, :, :n] = src.keys[0]
                layer.values[row, :, :n] = src.values[0]
            self.valid[row] = False
            self.valid[row, :n] = True
            self.lengths[row] = n
            self.pending[row] = []
        if features is not None:
            self.pending[row] = [features[0]]
        return out.logits[0, -1]

    def _grow(self, extra: int) -> None:
        """Append ``extra`` empty slots to every row (holes until something is written there)."""
        for layer in self.cache.layers:
            b, h, _, d = layer.keys.shape
            layer.update(layer.keys.new_zeros(b, h, extra, d), layer.values.new_zeros(b, h, extra, layer.values.shape[-1]))
        self.valid = torch.cat([self.valid, torch.zeros(self.rows, extra, dtype=torch.bool)], dim=1)

    def _add_row(self) -> None:
        replace_entries(self.cache, lambda t: torch.cat([t, t.new_zeros(1, *t.shape[1:])]))
        self.valid = torch.cat([self.valid, torch.zeros(1, self.slots, dtype=torch.bool)])
        self.lengths.append(0)
        self.pending.append([])

    @torch.inference_mode()
    def drop(self, keep: Sequence[int]) -> None:
        """Keep only rows ``keep`` (in this order); the others are finished."""
        keep = list(keep)
        rows = torch.tensor(keep, dtype=torch.long, device=self.device)
        replace_entries(self.cache, lambda t: t.index_select(0, rows))
        self.valid = self.valid[keep]
        self.lengths = [self.lengths[i] for i in keep]
        self.pending = [self.pending[i] for i in keep]

    @torch.inference_mode()
    def rearrange(self) -> None:
        """Compact the cache: every row's live entries first, in order; holes dropped."""
        width = max(self.lengths)
        order = torch.argsort((~self.valid).to(torch.int8), dim=1, stable=True)[:, :width]  # live slots first
        order = order.to(self.device)[:, None, :, None]
        replace_entries(self.cache, lambda t: t.gather(2, order.expand(t.shape[0], t.shape[1], width, t.shape[3])))
        self.valid = torch.arange(width)[None, :] < torch.tensor(self.lengths)[:, None]

    # -- one verification step ---------------------------------------------------------------------

    @torch.inference_mode()
    def verify(self, roots: Sequence[int], trees: Sequence[DraftTree]) -> torch.Tensor:
        """One forward over every row's root and tree; the logits ``[rows, width, vocab]``, of
        which row b's first ``1 + trees[b].size`` are its block's (the rest is padding).

        The inputs are built in a number of tensor operations that does not grow with the rows
        or the nodes (`batch_blocks`; the cached part of the mask is the valid map broadcast on
        the device): on a GPU a 135M model's step is host work, about 17 us per operation."""
        start, rows = self.slots, self.rows
        ids, positions, block = batch_blocks(roots, trees, self.lengths)
        width = ids.shape[1]
        past = self.valid.to(self.device)[:, None, :].expand(rows, width, start)
        visible = torch.cat([past, block.to(self.device)], dim=2)
        mask = additive_mask(visible[:, None], self.dtype)
        out, features = forward_with_features(
            lambda **extra: self.model(
                input_ids=ids.to(self.device), position_ids=positions.to(self.device), attention_mask=mask,
                **cache_argument(self.model, self.cache), use_cache=True, **extra,
            ),
            self.model, self.keep_features, self.feature_layers,
        )
        self.valid = torch.cat([self.valid, torch.zeros(rows, width, dtype=torch.bool)], dim=1)
        self._block = (start, width, features)
        return out.logits

    def discard(self) -> None:
        """Forget the last verified block without keeping anything (cost measurements)."""
        start, _, _ = self._block
        truncate(self.cache, start)
        self.valid = self.valid[:, :start]
        self._block = None

    @torch.inference_mode()
    def commit(self, paths: Sequence[Sequence[int]]) -> None:
        """Keep each row's root and accepted nodes ``paths[b]`` of the last verified block (one
        write to the valid map and one gather of the features for all rows)."""
        start, _, hidden = self._block
        rows, slots = [], []
        for b, path in enumerate(paths):
            rows += [b] * (1 + len(path))
            slots += [0, *(i + 1 for i in path)]
            self.lengths[b] += 1 + len(path)
        self.valid[rows, [start + s for s in slots]] = True
        if hidden is not None:
            kept = hidden[torch.tensor(rows, device=hidden.device), torch.tensor(slots, device=hidden.device)]
            for b, part in enumerate(kept.split([1 + len(p) for p in paths])):
                self.pending[b].append(part)
        self._block = None

    @torch.inference_mode()
    def take_features(self, row: int) -> torch.Tensor | None:
        if not self.pending[row]:
            return None
        features = torch.cat(self.pending[row])
        self.pending[row] = []
        return features
