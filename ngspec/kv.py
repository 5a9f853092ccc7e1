"""KV cache storage: growable preallocated layers, and keeping the accepted entries of a block.

transformers' `DynamicLayer` concatenates on every step, allocating and copying the whole cache each
time (about 40% of a CPU decoding step for the default model at 800 tokens of context). Our
`GrowableLayer` keeps keys and values as views into buffers that grow by doubling, so appending is
a copy of the new entries only and rollback is a length change.

After a verification forward the cache holds ``start`` committed positions followed by the whole
block (root + tree nodes). Committing moves the kept block entries next to the committed ones with
one gather per layer and drops the rest.

A sliding-window layer may also drop its oldest entries once no later query can see them
(`drop_front`); its ``dropped`` count maps positions to its slots (slot = position - dropped), so
committing and cutting back work on every layer alike.
"""

from __future__ import annotations

import inspect
from functools import cache as memoise
from typing import Sequence

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer


class GrowableLayer(DynamicLayer):
    """A `DynamicLayer` whose ``keys``/``values`` are views into buffers grown by doubling: the
    first ``rows`` rows of the buffers and their first ``used`` slots. A batch's rows come and go
    within the buffers' rows (`add_rows`, `move_rows`, `keep_rows`), so neither copies the cache.
    The rows in use are held as views of their own (``_k``, ``_v``, made when first read and kept
    until the rows change), so that a step's append costs the same tensor operations whether or
    not the buffers have spare rows (on a GPU a small model's step is paid per operation).
    ``keys`` and ``values`` themselves, views of those up to ``_used`` slots, are made when read:
    at fixed shapes (`ngspec.static_verify`) most steps read neither, and making them cost two
    operations a layer a step."""

    _keys = _values = _key_view = _value_view = _key_rows = _value_rows = None
    _rows = _used = 0

    @property
    def _k(self) -> torch.Tensor | None:
        """The buffers' first ``_rows`` rows (made when read, then kept until the rows change)."""
        if self._key_rows is None and self._keys is not None:
            self._key_rows = self._keys[: self._rows]
        return self._key_rows

    @property
    def _v(self) -> torch.Tensor | None:
        if self._value_rows is None and self._values is not None:
            self._value_rows = self._values[: self._rows]
        return self._value_rows

    @property
    def keys(self) -> torch.Tensor | None:
        if self._key_view is None and self._k is not None:
            self._key_view = self._k[:, :, : self._used]
        return self._key_view

    @keys.setter
    def keys(self, tensor: torch.Tensor | None) -> None:
        self._key_view = tensor
        if tensor is not None and tensor.dim() == 4:
            self._used = tensor.shape[-2]

    @property
    def values(self) -> torch.Tensor | None:
        if self._value_view is None and self._v is not None:
            self._value_view = self._v[:, :, : self._used]
        return self._value_view

    @values.setter
    def values(self, tensor: torch.Tensor | None) -> None:
        self._value_view = tensor

    def __init__(self, capacity: int = 512) -> None:
        super().__init__()
        self.capacity = capacity
        self.dropped = 0  # leading positions dropped (`drop_front`): slot = position - dropped

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        super().lazy_initialization(key_states, value_states)
        self._keys = self._values = None
        self._reserve(key_states, value_states, max(self.capacity, key_states.shape[-2]), 0)

    def _use_rows(self, rows: int, used: int) -> None:
        """The first ``rows`` rows and ``used`` slots of the buffers are the entries (their views
        made when read: a batch's finished rows dropped at fixed shapes touch none)."""
        self._rows, self._key_rows, self._value_rows = rows, None, None
        self._use_slots(used)

    def _use_slots(self, used: int) -> None:
        """The rows' first ``used`` slots are the entries (their views made when read)."""
        self._used, self._key_view, self._value_view = used, None, None

    def _reserve(self, key_states: torch.Tensor, value_states: torch.Tensor, size: int, used: int, row_room: int = 0) -> None:
        """New buffers of ``size`` slots and at least ``row_room`` rows (and as many as the old
        ones or ``key_states`` have), holding the first ``used`` slots of the current entries."""
        rows, heads, _, k_dim = key_states.shape
        room = max(rows, row_room, self._keys.shape[0] if self._keys is not None else 0)
        # zeros, not whatever the memory held: attention at fixed shapes (`ngspec.static_verify`)
        # reads slots never written, under a mask, and a masked NaN still makes NaN
        keys = key_states.new_zeros(room, heads, size, k_dim)
        values = value_states.new_zeros(room, heads, size, value_states.shape[-1])
        if used:
            keys[:rows, :, :used] = self.keys
            values[:rows, :, :used] = self.values
        self._keys, self._values = keys, values
        self._use_rows(rows, used)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        start = self._used
        end = start + key_states.shape[-2]
        if end > self._keys.shape[-2]:
            self._reserve(key_states, value_states, max(end, 2 * self._keys.shape[-2]), start)
        self._k[:, :, start:end] = key_states
        self._v[:, :, start:end] = value_states
        self.keys, self.values = self._k[:, :, :end], self._v[:, :, :end]
        return self.keys, self.values

    def make_room(self, rows: int, size: int) -> None:
        """Buffers of at least ``rows`` rows and ``size`` slots (slots by doubling), the entries kept."""
        capacity = self._keys.shape[-2]
        if rows <= self._keys.shape[0] and size <= capacity:
            return
        self._reserve(self.keys, self.values, capacity if size <= capacity else max(size, 2 * capacity), self._used, row_room=rows)

    def write_at(self, slots: torch.Tensor, key_states: torch.Tensor, value_states: torch.Tensor, span: int) -> tuple[torch.Tensor, torch.Tensor]:
        """A write at fixed shapes: ``key_states`` ``[r, heads, len(slots), d]`` into the buffers'
        first r rows (spare rows included) at ``slots``, a device tensor, so the block's start is
        an input, not a constant; returns those rows' first ``span`` slots. The entries do not
        change until `hold` says how far they reach."""
        rows = key_states.shape[0]
        keys, values = self._keys[:rows], self._values[:rows]
        keys.index_copy_(2, slots, key_states)
        values.index_copy_(2, slots, value_states)
        return keys[:, :, :span], values[:, :, :span]

    def move_slots(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Every row's entries at slots ``src`` copied to slots ``dst`` (device tensors; read
        before any is written), two operations a buffer; the entries' extent is left as it is."""
        self._k.index_copy_(2, dst, self._k.index_select(2, src))
        self._v.index_copy_(2, dst, self._v.index_select(2, src))

    def hold(self, rows: int, used: int) -> None:
        """The entries are the buffers' first ``rows`` rows and ``used`` slots (after `write_at`);
        the rows' own views are kept when their number has not changed, and the entries' views
        are made when read (on a host-bound GPU every operation a step counts)."""
        if self._rows != rows:
            self._use_rows(rows, used)
        else:
            self._use_slots(used)

    def replace(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Hold ``keys`` and ``values`` instead (a batch's entries compacted or moved), written
        into this layer's buffers when they fit, else into new ones that replace them: either way
        the old entries are freed layer by layer, never a second cache at once."""
        rows, used = keys.shape[0], keys.shape[-2]
        if rows > self._keys.shape[0] or used > self._keys.shape[-2]:
            self._keys = self._values = self._key_rows = self._value_rows = self.keys = self.values = None  # free this layer's buffers first
            self._reserve(keys, values, max(used + 512, self.capacity), 0)
        self._keys[:rows, :, :used] = keys
        self._values[:rows, :, :used] = values
        self._use_rows(rows, used)

    def add_rows(self, n: int, rows_wanted: int | None = None) -> None:
        """``n`` more rows of holes (zeros: a hole is never attended, but its value still meets a
        zero weight, which must not be NaN), in the buffers' spare rows; when they have none, new
        buffers take the entries: with ``rows_wanted`` rows (the rows the batch will hold) if that
        is enough, else twice the rows."""
        rows, used = self._rows, self._used
        if rows + n > self._keys.shape[0]:
            room = rows_wanted if rows_wanted and rows_wanted >= rows + n else max(rows + n, 2 * self._keys.shape[0])
            self._reserve(self.keys, self.values, self._keys.shape[-2], used, row_room=room)
        self._keys[rows : rows + n, :, :used] = 0
        self._values[rows : rows + n, :, :used] = 0
        self._use_rows(rows + n, used)

    def move_rows(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Row ``src[i]``'s entries to row ``dst[i]`` (distinct rows; only these rows are copied,
        their slots past the entries too: two operations a buffer, not four with views)."""
        self._keys.index_copy_(0, dst, self._keys.index_select(0, src))
        self._values.index_copy_(0, dst, self._values.index_select(0, src))

    def keep_rows(self, n: int, lazy: bool = False) -> None:
        """Only the first ``n`` rows stay (views: nothing is copied), their views made now (the
        plain forward's next append reads them) or, ``lazy``, when read (at fixed shapes a
        batch's step may read none)."""
        self._use_rows(n, self._used)
        if not lazy:
            self._key_rows, self._value_rows = self._keys[:n], self._values[:n]

    def drop_front(self, n: int) -> None:
        """Drop the first ``n`` entries (ones no later query may see), moving the rest into a
        buffer twice their size (plus room for a block), so the memory they held is freed."""
        keys, values = self.keys[:, :, n:], self.values[:, :, n:]
        kept = keys.shape[-2]
        self.keys, self.values = keys, values  # views into the old buffers, copied out by _reserve
        self._reserve(keys, values, 2 * kept + 64, kept)
        self.dropped += n


def dropped(cache: DynamicCache | None, layers: Sequence[int]) -> int:
    """The leading positions ``layers`` (sliding ones, dropping together) no longer hold."""
    return cache.layers[layers[0]].dropped if cache is not None and layers else 0


def drop_front(cache: DynamicCache, layers: Sequence[int], n: int) -> None:
    """Drop the first ``n`` entries of each of ``layers`` (`GrowableLayer.drop_front`)."""
    for i in layers:
        cache.layers[i].drop_front(n)


def cache_argument(module: torch.nn.Module, cache) -> dict:
    """The keyword that hands ``cache`` to ``module``'s forward: transformers 5.24 renamed
    ``past_key_values`` to ``cache`` (the old name warns, and goes in 5.40); modules that do not
    know the new name (older transformers, remote code) still get ``past_key_values``."""
    return {_cache_keyword(type(module)): cache}


@memoise
def _cache_keyword(module_type: type) -> str:
    accepted = inspect.signature(module_type.forward).parameters  # follows transformers' renaming wrapper
    return "cache" if "cache" in accepted and "past_key_values" not in accepted else "past_key_values"


def make_cache(config, capacity: int) -> DynamicCache:
    """A `DynamicCache` of `GrowableLayer`s, sliding-window layers included: those keep their whole
    history too, and their masks hide what lies beyond the window (`ngspec.architecture`)."""
    cache = DynamicCache(config=config)
    cache.layers = [GrowableLayer(capacity) for _ in cache.layers]
    return cache


def keep_block(cache: DynamicCache, start: int, offsets: Sequence[int], cut: bool = True) -> None:
    """Keep block entries ``offsets`` (relative to ``start``, ascending): moved next to the
    entries before the block (two operations a buffer, `GrowableLayer.move_slots`) and, with
    ``cut``, the others dropped. Without it the extent is left to the next write (fixed shapes,
    `ngspec.static_verify`: most steps then touch no view)."""
    n_keep = len(offsets)
    contiguous = list(offsets) == list(range(n_keep))
    slots: dict = {}  # (first slot, device) -> the kept entries' slots and theirs to be: made and copied once, not per layer
    for layer in cache.layers:
        first = start - layer.dropped  # the block's first slot in this layer
        if not contiguous:
            where = (first, layer._k.device)
            if where not in slots:
                moves = torch.tensor([first + o for o in offsets] + list(range(first, first + n_keep)), dtype=torch.long, device=where[1])
                slots[where] = moves.split(n_keep)
            layer.move_slots(*slots[where])
        if cut:
            layer.keys = layer.keys[:, :, : first + n_keep]
            layer.values = layer.values[:, :, : first + n_keep]


def truncate(cache: DynamicCache, length: int) -> None:
    """Drop every entry after the first ``length`` positions (a view change with growable layers)."""
    for layer in cache.layers:
        end = length - getattr(layer, "dropped", 0)
        if layer.keys is not None and layer.keys.shape[-2] > end:
            layer.keys = layer.keys[:, :, :end]
            layer.values = layer.values[:, :, :end]
