"""BatchTarget: B sequences decoded together, each with its own draft tree and acceptance.

Every verification appends one block per row (root + tree nodes, padded to the batch's largest
tree) at the same cache offset for all rows, so a step costs no copy. Each row then keeps only its
root and accepted nodes: the other block slots become *holes*, masked out of that row's attention.
``valid[b, s]`` says whether slot ``s`` holds a live entry of row ``b``; a row's positions (for
RoPE) count its live entries only, so holes never shift anything.

With ``packed``, rows whose trees differ in size are verified back to back instead: the
forward's input is every row's root and nodes, ``[1, total]``, so its linear layers and LM head run
on the real tokens only, not on the padding. Attention reads each row's own cache:
`PackedBlockCache` writes the packed keys and values into each row's block slots, and
`packed_attention` attends every row's first slots in one call and a longer row's rest in a call
of its own, under the usual mask (`PackedRows`). The cache, its holes and the mask are as in the
padded layout. Measured on the team's two-core CPU (BENCHMARKS.md 10n), packing lost to padding:
at batch 8 and 1,000 tokens of context attention is a third to a half of a step, and a row's own
call reads its cache a second time. On a GPU a 135M model's step is host work, where the extra
tensor operations per layer would cost more than the padding.

Holes cost memory and attention time, so `rearrange` compacts the cache (one gather per layer puts
every row's live entries last, written back into the layer's own buffer: no second cache); the
loop checks every N steps (`--rearrange-every`) and compacts when that frees enough
(`--rearrange-min-share`). A new prompt is prefilled on its own and written
into a free row; finished rows are dropped.

Sliding-window layers drop the leading slots that hold, for every row, only holes and entries
beyond its window (``dropped``: their slot s is the batch's slot ``s + dropped``). For that to free
anything every row's newest entries must share the last slots: a compaction puts every row's
live entries at the end, and a prompt admitted later is written to end at the last slot (a longer
one puts holes before the other rows).
"""

from __future__ import annotations

import os
from contextlib import nullcontext
from dataclasses import dataclass
from functools import partial
from typing import Callable, Sequence

import torch
from transformers import DynamicCache, PreTrainedModel
from transformers.cache_utils import Cache
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from ngspec.architecture import block_masks, rope_switch, sliding_layers, sliding_window
from ngspec.contracts import DraftTree, table_cost
from ngspec.errors import NgspecError
from ngspec.kv import cache_argument, drop_front, dropped, make_cache, truncate
from ngspec.rows import attention_function
from ngspec.static_verify import MOST_WIDTH, StaticVerify, attended, for_batches, has_room
from ngspec.target import forward_with_features, prepare_model, static_verifier
from ngspec.tree import batch_blocks

PACKED_ATTENTION = "ngspec_packed_rows"


# an attention call of its own for one row, in queries' work (a call's fixed cost): on the AMD VM at
# 1,000 keys a query costs 0.03-0.04 ms a layer per row in an 8-row call, a row's own call of one
# query 0.06 ms and of three 0.13 ms (bench-out/v33/attn_q.py)
ROW_CALL = 1
# what a row attended on its own adds to a packed batch-8 step, in plain batched steps: its cache
# read a second time, and the call's own operations (the AMD VM at 1,000 tokens of context: one
# row of 8 nodes among 7 of none cost 1.32 plain steps against 1.25 for 8 rows of 1; four rows of
# 2 among 4 of none 1.49; bench-out/v33/packed_cost.py)
ROW_ALONE = 0.06


@dataclass
class PackedRows:
    """Where the packed tokens of one forward sit in the padded block ``[rows, width]``: token t at
    flat slot ``index[t] = row * width + slot``; ``attend`` is the model's own attention function.

    Attention costs by queries times keys, so it is not run on the padded block either: on a CPU a
    row of 9 tokens among rows of 1 made every row's attention 9 queries wide, 1.0 ms a layer for 8
    rows at 512 tokens of context against 0.3 ms at 1 query (about a third of a batch-8 step). The
    first ``split`` slots of every row are attended in one call (packed token ``first[i]`` at flat
    slot ``first_slot[i]`` of ``[rows, split]``), and each longer row's remaining slots in a call
    of its own over its own cache rows, a view (``rest``: row, first packed token, count); the
    split is chosen by queries' work (`choose_split`). ``starts[b]``: row b's first packed token."""

    index: torch.Tensor
    rows: int
    width: int
    attend: Callable
    split: int
    first: torch.Tensor
    first_slot: torch.Tensor
    rest: list[tuple[int, int, int]]
    starts: list[int]

    @staticmethod
    def build(sizes: Sequence[int], attend: Callable, device: torch.device) -> "PackedRows":
        """For blocks of ``sizes`` (root + nodes) entries, row after row."""
        width, split = max(sizes), choose_split(sizes)
        index, first, first_slot, rest, starts = [], [], [], [], []
        at = 0
        for b, n in enumerate(sizes):
            starts.append(at)
            index += [b * width + j for j in range(n)]
            first += range(at, at + min(n, split))
            first_slot += [b * split + j for j in range(min(n, split))]
            if n > split:
                rest.append((b, at + split, n - split))
            at += n

        def tensor(values: list[int]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.long, device=device)

        return PackedRows(tensor(index), len(sizes), width, attend, split, tensor(first), tensor(first_slot), rest, starts)

    def padded(self, x: torch.Tensor) -> torch.Tensor:
        """``[1, heads, total, d]`` laid out as ``[rows, heads, width, d]`` (zeros in the padding)."""
        flat = x.new_zeros(self.rows * self.width, x.shape[1], x.shape[3])
        flat[self.index] = x[0].transpose(0, 1)
        return flat.view(self.rows, self.width, x.shape[1], x.shape[3]).transpose(1, 2)


def choose_split(sizes: Sequence[int]) -> int:
    """The block slots attended for every row in one call, the rest row by row: the split among
    the blocks' sizes with the least queries' work (rows x split, plus each longer row's remaining
    slots and its call's `ROW_CALL`), ties to the wider split (fewer calls)."""

    def work(split: int) -> int:
        return len(sizes) * split + sum(n - split + ROW_CALL for n in sizes if n > split)

    return min(sorted(set(sizes), reverse=True), key=work)


class PackedBlockCache(Cache):
    """The batch's cache during a packed forward: the packed keys and values are written into
    every row's block slots, and each layer hands attention the whole padded cache."""

    def __init__(self, cache: DynamicCache, packed: PackedRows) -> None:
        super().__init__(layers=cache.layers)
        self.packed = packed

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        return self.layers[layer_idx].update(self.packed.padded(key_states), self.packed.padded(value_states))


def packed_attention(module, query, key, value, attention_mask, packed: PackedRows, **kwargs):
    """The model's attention for packed queries ``[1, heads, total, d]`` over the padded cache
    ``[rows, kv_heads, past + width, d]`` under the usual ``[rows, 1, width, past + width]`` mask:
    every row's first slots in one call, each longer row's rest in its own (``packed``, bound in
    for the step); the outputs packed as the queries (``[1, total, heads, d]``)."""
    queries = query[0].transpose(0, 1)  # [total, heads, d]
    _, heads, dim = queries.shape
    rows, split = packed.rows, packed.split
    placed = queries.new_zeros(rows * split, heads, dim)
    placed[packed.first_slot] = queries[packed.first]
    placed = placed.view(rows, split, heads, dim).transpose(1, 2)
    got, _ = packed.attend(module, placed, key, value, attention_mask[:, :, :split], **kwargs)
    d_v = value.shape[-1]  # narrower than the queries' in multi-head latent attention
    got = got.reshape(rows * split, heads, d_v)[packed.first_slot]  # [rows, split, heads, d_v] -> packed
    if not packed.rest:
        return got[None], None
    out = queries.new_empty(queries.shape[0], heads, d_v)
    out[packed.first] = got
    for b, at, n in packed.rest:
        own, _ = packed.attend(
            module, queries[at : at + n].transpose(0, 1)[None], key[b : b + 1], value[b : b + 1],
            attention_mask[b : b + 1, :, split : split + n], **kwargs,
        )
        out[at : at + n] = own[0]
    return out[None], None


FOLDED_ATTENTION = "ngspec_folded_gqa"


def folded_gqa_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, folded_masks=None, **kwargs):
    """Grouped-query attention with each key/value head's query heads folded into its queries:
    ``query [rows, heads, q, d]`` read as ``[rows, kv_heads, groups * q, d]`` against the cache as
    it is, under the layer's mask repeated per group: folded once a step for every layer
    (``folded_masks``, bound in for the step, by the unfolded mask's id: a sliding-window
    model's layers get one of two masks), else here (a model that slices the masks).
    PyTorch's CPU SDPA with ``enable_gqa`` (what transformers runs for q > 1) took 0.49 ms a layer
    for 8 rows of 2 queries at 1,000 keys, and 0.35 ms folded; 0.69 and 0.52 ms at 4 queries
    (bench-out/v33/gqa_pack.py). transformers folds the same way itself at one query."""
    rows, heads, q, dim = query.shape
    kv_heads = key.shape[1]
    if attention_mask.shape[1] != 1:  # a mask per head (Doge): attention as transformers runs it
        return ALL_ATTENTION_FUNCTIONS["sdpa"](module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs)
    groups = heads // kv_heads
    folded = query.reshape(rows, kv_heads, groups * q, dim)
    mask = (folded_masks or {}).get(id(attention_mask))
    if mask is None or mask.shape[2] != groups * q:
        mask = fold_mask(attention_mask, groups)
    out = torch.nn.functional.scaled_dot_product_attention(folded, key, value, attn_mask=mask, scale=scaling)
    # [rows, q, heads, d_v], contiguous as transformers' own attention returns it (AFMoE views it);
    # values may be narrower than queries (multi-head latent attention)
    return out.reshape(rows, heads, q, value.shape[-1]).transpose(1, 2).contiguous(), None


def fold_mask(mask: torch.Tensor, groups: int) -> torch.Tensor:
    """``[rows, 1, q, keys]`` repeated for `folded_gqa_attention`'s ``groups * q`` queries."""
    rows, _, q, keys = mask.shape
    return mask[:, :, None].expand(rows, 1, groups, q, keys).reshape(rows, 1, groups * q, keys)


@dataclass
class Verified:
    """A verification forward's logits: ``[rows, width, vocab]`` padded, or ``[1, total, vocab]``
    packed (row b's block after row b-1's); ``sizes`` are the blocks' lengths (root + nodes)."""

    logits: torch.Tensor
    sizes: list[int]
    packed: bool

    def greedy(self) -> list[list[int]]:
        """Every row's argmax at each block index (one argmax and one copy for all rows)."""
        best = self.logits.argmax(dim=-1).tolist()
        if not self.packed:
            return [row[:n] for row, n in zip(best, self.sizes)]
        out, start = [], 0
        for n in self.sizes:
            out.append(best[0][start : start + n])
            start += n
        return out

    def row(self, b: int) -> torch.Tensor:
        """Row b's logits ``[size, vocab]``."""
        if not self.packed:
            return self.logits[b, : self.sizes[b]]
        start = sum(self.sizes[:b])
        return self.logits[0, start : start + self.sizes[b]]


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
    def __init__(self, model: PreTrainedModel, packed: bool = False, rows_wanted: int | None = None) -> None:
        """``packed``: verify rows of different sizes back to back; ``rows_wanted``: the rows it
        will hold (a batch's size, when enough prompts wait), so that the cache's buffers take
        them at once when the second row comes, not by doubling."""
        self.model, self.device, self.dtype, self.max_length = prepare_model(model)
        self.vocab = model.get_input_embeddings().num_embeddings  # token ids it can read
        implementation = model.config._attn_implementation
        if packed and ALL_ATTENTION_FUNCTIONS.get_interface(implementation, None) is None:
            raise NgspecError(
                f"--batch-layout packed runs the model's attention through transformers' registry, which has no "
                f"{implementation!r} attention ({type(model).__name__}): use --batch-layout padded"
            )
        self.packed = packed
        self.rows_wanted = rows_wanted
        # query heads per key/value head, folded into the queries of tree steps on a CPU
        # (`folded_gqa_attention`; 1: not folded)
        config = model.config
        heads, kv_heads = getattr(config, "num_attention_heads", 1), getattr(config, "num_key_value_heads", None) or getattr(config, "num_attention_heads", 1)
        fold = self.device.type == "cpu" and os.environ.get("NGSPEC_FOLD_GQA", "1") != "0" and config._attn_implementation == "sdpa"
        self.fold_groups = heads // kv_heads if fold and heads % kv_heads == 0 else 1
        self.window = sliding_window(model)  # of sliding-window layers, if any
        self.sliding = sliding_layers(config) if self.window else ()
        self.rope_switch = rope_switch(config)  # where longrope frequencies switch, if they do
        self.keep_features = False
        self.feature_layers: tuple[int, ...] | None = None
        # prompts admitted together are prefilled in forwards of at most this many tokens (0: one
        # prompt a forward); the batch loop sets it (`BatchConfig.prefill_tokens`)
        self.prefill_tokens = 0
        self.prefill_forwards = 0
        self.cache: DynamicCache | None = None
        self.valid = torch.zeros(0, 0, dtype=torch.bool)  # [rows, slots]
        self.lengths: list[int] = []  # live entries per row (= its committed tokens)
        self.pending: list[list[torch.Tensor]] = []  # per row: features of newly committed positions
        # the last verified block: its start slot, width, features ``[entries, F]`` and, per row,
        # the entry of its root there
        self._block: tuple[int, int, torch.Tensor | None, list[int]] | None = None
        self.static: StaticVerify | None = None  # verification at fixed shapes (`use_graphs`)
        # at fixed shapes, once `drop` has left rows in place: row b's entries are in the cache
        # buffers' row at[b] (None: in row b)
        self.at: list[int] | None = None

    def use_graphs(self, capture: bool | None = None) -> StaticVerify:
        """Verify at fixed shapes from now on, replayed from captured CUDA graphs (``capture``, by
        default on a GPU only; `ngspec.static_verify`); the padded layout only. The model's
        batches share one `StaticVerify`, and each starts from the last one's cache buffers, so
        the shapes it captured are replayed, not captured again."""
        if self.packed:
            raise NgspecError("--target-graphs verifies the padded layout: leave out --batch-layout packed")
        self.static = for_batches(self.model, lambda: static_verifier(self.model, self.window, self.device, capture))
        return self.static

    @property
    def rows(self) -> int:
        return len(self.lengths)

    @property
    def slots(self) -> int:
        return self.valid.shape[1]

    @property
    def dropped(self) -> int:
        """Leading slots the sliding layers no longer hold: every row's entries there are past its window."""
        return dropped(self.cache, self.sliding)

    def use(self) -> CacheUse:
        return CacheUse(self.slots, sum(self.lengths), self.rows)

    def freeable_share(self) -> float:
        """The share of slots `rearrange` would free: the cache keeps the longest row's live
        entries, so the holes of shorter rows (a shorter prompt's padding) stay."""
        return 1.0 - max(self.lengths) / self.slots if self.slots else 0.0

    def compaction_pays(self, min_share: float) -> bool:
        """Whether to `rearrange` now: it frees at least ``min_share`` of the slots and, at fixed
        shapes, the next step's forward would then attend fewer of them. A fixed-shape forward
        attends a power of two of slots however many hold holes (`static_verify.attended`), and
        compacting into the same buffers frees no memory, so there holes cost nothing until the
        cache crosses into the next power of two."""
        if self.freeable_share() < min_share:
            return False
        if self.static is None:
            return True
        return attended(self.cache, max(self.lengths) + 1) < attended(self.cache, self.slots + 1)

    def outgrows(self, width: int) -> bool:
        """At fixed shapes: whether a block ``width`` wide (root and nodes) would outgrow the
        cache's buffers, where compacting first (`rearrange`, into the same buffers) makes room.
        Growing replaces the buffers, and every graph captured over them is dropped and captured
        again: at 32 rows on a GPU, a dozen captures of tens of milliseconds each (BENCHMARKS.md
        10zt). Each step appends a block as wide as the widest row's, so slots fill with holes
        faster than rows grow, and `compaction_pays` keeps the holes until the attended span would
        shrink."""
        if self.static is None or width > MOST_WIDTH:  # a wider block runs as the plain forward does
            return False
        return not has_room(self.cache, self.slots, width) and has_room(self.cache, max(self.lengths), width)

    # -- rows in and out ---------------------------------------------------------------------------

    @torch.inference_mode()
    def admit(self, prompt: Sequence[int], row: int | None = None) -> torch.Tensor:
        """Prefill ``prompt`` on its own and place it in ``row`` (a finished row's slot) or a new
        last row; returns the next-token logits after the prompt."""
        return self.admit_many([prompt], [row])[0]

    @torch.inference_mode()
    def admit_many(self, prompts: Sequence[Sequence[int]], rows: Sequence[int | None]) -> list[torch.Tensor]:
        """`admit` for several prompts, in order (a None row: a new last row), each prompt's
        next-token logits. With ``prefill_tokens`` > 0, consecutive prompts are prefilled together
        in forwards of at most that many tokens, padding included (on a host-bound GPU a prefill
        costs about what a decoding step does, whatever its rows); a prompt's own forward gives
        the same logits and entries up to float rounding, as different shapes do."""
        self._straighten()
        out: list[torch.Tensor] = []
        i = 0
        while i < len(prompts):
            j = i + 1
            while j < len(prompts) and (j + 1 - i) * max(len(p) for p in prompts[i : j + 1]) <= self.prefill_tokens:
                j += 1
            out += self._prefill(prompts[i:j], rows[i:j])
            i = j
        return out

    def _prefill(self, prompts: Sequence[Sequence[int]], rows: Sequence[int | None]) -> list[torch.Tensor]:
        """One forward for ``prompts``, right-padded to the longest (a pad comes after every real
        token of its row, so the causal mask keeps it out of them), each placed in its row."""
        self.prefill_forwards += 1
        lengths = [len(p) for p in prompts]
        width = max(lengths)
        own = make_cache(self.model.config, capacity=width)
        ids = torch.tensor([list(p) + [0] * (width - len(p)) for p in prompts], device=self.device)
        ends = sorted({n - 1 for n in lengths})
        keep = 1 if ends == [width - 1] else torch.tensor(ends, device=self.device)  # the LM head on the prompts' last positions only
        out, features = forward_with_features(
            lambda **extra: self.model(input_ids=ids, **cache_argument(self.model, own), use_cache=True, logits_to_keep=keep, **extra),
            self.model, self.keep_features, self.feature_layers,
        )
        # placed one by one: a prompt alone, and under sliding layers (each prompt ends at the last
        # slot, an offset of its own); else together, after the first row where it makes the cache
        first = len(prompts) if len(prompts) == 1 or self.window else int(self.cache is None)
        for i in range(first):
            self._place(own, i, lengths[i], rows[i], None if features is None else features[i, : lengths[i]])
        if first < len(prompts):
            self._place_together(own, first, lengths[first:], rows[first:], features)
        return [out.logits[i, -1 if isinstance(keep, int) else ends.index(n - 1)] for i, n in enumerate(lengths)]

    def _place_together(self, own: DynamicCache, first: int, lengths: Sequence[int], rows: Sequence[int | None], features: torch.Tensor | None) -> None:
        """`_place` for the prefill's rows from ``first`` on at once (no sliding layers): each
        layer's entries by one indexed write for all of them, padding included (about 600 tensor
        operations a row placed one by one, BENCHMARKS.md 10zp). A row's slots past its prompt get
        its padding's entries: finite values its valid map marks as holes, as any row's unused
        slots are."""
        width = max(lengths)
        if width > self.slots:
            self._grow(width - self.slots)
        new = sum(r is None for r in rows)
        if new:
            self._add_row(new)
        added = iter(range(self.rows - new, self.rows))
        rows = [next(added) if r is None else r for r in rows]
        index = torch.tensor(rows)
        on_device = index.to(self.device)
        for layer, src in zip(self.cache.layers, own.layers):
            layer.keys[on_device, :, :width] = src.keys[first:, :, :width]
            layer.values[on_device, :, :width] = src.values[first:, :, :width]
        self.valid[index] = False
        self.valid[index, :width] = torch.arange(width) < torch.tensor(lengths)[:, None]
        for i, (row, n) in enumerate(zip(rows, lengths), first):
            self.lengths[row] = n
            self.pending[row] = [] if features is None else [features[i, :n]]

    def _place(self, own: DynamicCache, i: int, n: int, row: int | None, features: torch.Tensor | None) -> None:
        """Row ``i``'s first ``n`` entries of the prefill cache ``own`` into ``row`` (None: a new last row)."""
        if self.cache is None:
            self.cache = (self.static and self.static.reusable()) or make_cache(self.model.config, capacity=n + 512)
            for layer, src in zip(self.cache.layers, own.layers):
                layer.update(src.keys[i : i + 1, :, :n], src.values[i : i + 1, :, :n])
            self.valid = torch.ones(1, n, dtype=torch.bool)
            self.lengths, self.pending = [n], [[]]
            row = 0
        else:
            at = 0
            if self.window:  # the prompt ends at the last slot, beside the other rows' newest entries
                if n > self.slots:
                    self._grow_front(n - self.slots, max(0, n - self.window + 1))
                at = self.slots - n
            elif n > self.slots:
                self._grow(n - self.slots)
            if row is None:
                self._add_row()
                row = self.rows - 1
            for layer, src in zip(self.cache.layers, own.layers):
                first = max(at, layer.dropped)  # entries before a sliding layer's first slot are past the window
                layer.keys[row, :, first - layer.dropped : at + n - layer.dropped] = src.keys[i, :, first - at : n]
                layer.values[row, :, first - layer.dropped : at + n - layer.dropped] = src.values[i, :, first - at : n]
            self.valid[row] = False
            self.valid[row, at : at + n] = True
            self.lengths[row] = n
            self.pending[row] = []
        if features is not None:
            self.pending[row] = [features]

    def _grow(self, extra: int) -> None:
        """Append ``extra`` empty slots to every row (holes until something is written there)."""
        for layer in self.cache.layers:
            b, h, _, d = layer.keys.shape
            layer.update(layer.keys.new_zeros(b, h, extra, d), layer.values.new_zeros(b, h, extra, layer.values.shape[-1]))
        self.valid = torch.cat([self.valid, torch.zeros(self.rows, extra, dtype=torch.bool)], dim=1)

    def _grow_front(self, extra: int, hold_from: int) -> None:
        """Put ``extra`` empty slots before every row's (holes), so that a longer prompt ends at
        the last slot as the others do; the sliding layers then hold the slots from ``hold_from``
        on (that prompt's first entry within its window) or from where they held them, whichever
        is first: slots they did not hold are only added as far as that needs."""
        sliding = set(self.sliding)
        held_from = min(self.dropped + extra, hold_from)
        for i, layer in enumerate(self.cache.layers):
            now = held_from if i in sliding else 0
            pad = layer.dropped + extra - now
            if pad:
                layer.replace(*(torch.cat([t.new_zeros(*t.shape[:2], pad, t.shape[3]), t], dim=2) for t in (layer.keys, layer.values)))
            layer.dropped = now
        self.valid = torch.cat([torch.zeros(self.rows, extra, dtype=torch.bool), self.valid], dim=1)

    def _add_row(self, n: int = 1) -> None:
        """``n`` new last rows of holes, in the cache buffers' spare rows (made for ``rows_wanted``
        rows, else by doubling: filling a batch of B rows copies the cache once or about once, not
        B times, which took 3.6% of a batch-32 run on two CPU cores, BENCHMARKS.md 10zd)."""
        for layer in self.cache.layers:
            layer.add_rows(n, self.rows_wanted)
        self.valid = torch.cat([self.valid, torch.zeros(n, self.slots, dtype=torch.bool)])
        self.lengths += [0] * n
        self.pending += [[] for _ in range(n)]

    @torch.inference_mode()
    def drop(self, keep: Sequence[int]) -> list[int]:
        """Keep only rows ``keep``; the others are finished. Returns the kept rows in their new
        order: each kept row beyond the new row count takes a finished row's place, so only those
        rows are copied (copying the whole cache to drop a row took 2.6% of a batch-32 run on two
        CPU cores, BENCHMARKS.md 10zd). At fixed shapes nothing is copied: the kept rows stay in
        their buffer rows (``at``) and the finished ones' become padding rows of the forward,
        until something reads the cache by row (`_straighten`)."""
        kept = set(keep)
        n = len(kept)
        movers = iter(sorted(b for b in kept if b >= n))
        order = [b if b in kept else next(movers) for b in range(n)]
        if self.static is not None:
            at = [b if self.at is None else self.at[b] for b in order]
            self.at = None if at == list(range(n)) else at
            if self.at is None:  # the last rows finished: the layers hold their first n rows, as `_straighten` leaves them
                for layer in self.cache.layers:
                    layer.keep_rows(n, lazy=True)
        else:
            self._gather_rows(order)
            for layer in self.cache.layers:
                layer.keep_rows(n)
        self.valid = self.valid[order]
        self.lengths = [self.lengths[b] for b in order]
        self.pending = [self.pending[b] for b in order]
        return order

    def _straighten(self) -> None:
        """Rows that `drop` left in place at fixed shapes moved to buffer rows 0, 1, ... (each
        moved row copied once), before anything reads or writes the cache by row: admitting,
        compacting, a forward too wide for a fixed shape."""
        if self.at is None:
            return
        self._gather_rows(self.at)
        for layer in self.cache.layers:
            layer.keep_rows(self.rows, lazy=True)
        self.at = None

    def _gather_rows(self, source: list[int]) -> None:
        """Buffer row ``source[b]``'s entries into buffer row b, for every b where they differ
        (all read before any is written): only the rows that move are copied."""
        moved = [b for b, a in enumerate(source) if a != b]
        if not moved:
            return
        src = torch.tensor([source[b] for b in moved], dtype=torch.long, device=self.device)
        dst = torch.tensor(moved, dtype=torch.long, device=self.device)
        for layer in self.cache.layers:
            layer.move_rows(src, dst)

    @torch.inference_mode()
    def rearrange(self) -> None:
        """Compact the cache: every row's live entries last, in order, ending at the last slot (a
        shorter row starts with holes); other holes dropped. Every row's newest entries then share
        the last slots, so the sliding layers keep only the last ``window - 1`` slots (all of them,
        if fewer)."""
        self._straighten()
        width = max(self.lengths)
        order = torch.argsort(self.valid.to(torch.int8), dim=1, stable=True)[:, -width:]  # holes first, live slots last
        order = order.to(self.device)[:, None, :, None]
        held_from = width - min(width, self.window - 1) if self.window else 0
        # a slot a sliding layer no longer holds has only entries past their row's window, which
        # its mask hides: any entry will do there
        sliding_order = (order[:, :, held_from:] - self.dropped).clamp(min=0) if self.sliding else None
        sliding = set(self.sliding)
        for i, layer in enumerate(self.cache.layers):
            index = sliding_order if i in sliding else order
            layer.replace(*(t.gather(2, index.expand(t.shape[0], t.shape[1], index.shape[2], t.shape[3])) for t in (layer.keys, layer.values)))
            if i in sliding:
                layer.dropped = held_from
        self.valid = torch.arange(width)[None, :] >= width - torch.tensor(self.lengths)[:, None]

    # -- one verification step ---------------------------------------------------------------------

    def step_cost(self, table: Sequence[float], sizes: Sequence[int]) -> float:
        """A step's cost in plain batched steps when its rows verify ``sizes`` nodes: padded (or
        every row the same size), the table at the widest; packed, the table at the mean nodes per
        row, and `ROW_ALONE` more for each row attended on its own."""
        if not (self.packed and len(set(sizes)) > 1):
            return table_cost(table, max(sizes))
        if not table:
            return 1.0
        blocks = [1 + n for n in sizes]
        split = choose_split(blocks)
        return table_cost(table, sum(sizes) / len(sizes)) + ROW_ALONE * sum(1 for n in blocks if n > split)

    @torch.inference_mode()
    def verify(self, roots: Sequence[int], trees: Sequence[DraftTree]) -> Verified:
        """One forward over every row's root and tree, padded to the largest tree, or packed
        (``packed`` and trees of different sizes).

        The inputs are built in a number of tensor operations that does not grow with the rows
        or the nodes (`batch_blocks`; the cached part of the mask is the valid map broadcast on
        the device): on a GPU a 135M model's step is host work, about 17 us per operation."""
        start, rows = self.slots, self.rows
        ids, positions, block = batch_blocks(roots, trees, self.lengths)
        width = ids.shape[1]
        sizes = [1 + t.size for t in trees]
        padded_roots = [b * width for b in range(rows)]  # each row's root entry, in the padded layout
        if self.static is not None and self.static.fits(width):
            features = (self.feature_layers or ()) if self.keep_features else None
            logits, hidden = self.static.run(self.cache, start, ids, positions, self.valid, block, features, self.rows_wanted or 1, self.at)
            return self._verified(start, width, logits, hidden, padded_roots, sizes, False)
        self._straighten()
        valid = self.valid.to(self.device)
        visible = torch.cat([valid[:, None, :].expand(rows, width, start), block.to(self.device)], dim=2)
        # a cached entry's position: its order among the row's valid slots (sliding windows only)
        past = valid.cumsum(1) - 1 if self.window else None
        attention_mask = block_masks(self.model.config, visible, positions.to(self.device), past, self.window, self.dtype, self.dropped)
        packed = self.packed and min(sizes) < width
        if packed:
            attend = ALL_ATTENTION_FUNCTIONS[self.model.config._attn_implementation]
            rows_of = PackedRows.build(sizes, attend, self.device)
            index = rows_of.index.to(ids.device)
            ids, positions = ids.view(-1)[index][None], positions.view(-1)[index][None]
            cache, roots_at = PackedBlockCache(self.cache, rows_of), rows_of.starts
            attention = attention_function(self.model, PACKED_ATTENTION, partial(packed_attention, packed=rows_of))
        else:
            cache, roots_at = self.cache, padded_roots
            attention = nullcontext()
            if self.fold_groups > 1 and width > 1:
                layer_masks = attention_mask.values() if isinstance(attention_mask, dict) else (attention_mask,)
                folded = {id(m): fold_mask(m, self.fold_groups) for m in layer_masks}
                attention = attention_function(self.model, FOLDED_ATTENTION, partial(folded_gqa_attention, folded_masks=folded))
        with attention:
            out, features = forward_with_features(
                lambda **extra: self.model(
                    input_ids=ids.to(self.device), position_ids=positions.to(self.device),
                    attention_mask=attention_mask,
                    **cache_argument(self.model, cache), use_cache=True, **extra,
                ),
                self.model, self.keep_features, self.feature_layers,
            )
        return self._verified(start, width, out.logits, features, roots_at, sizes, packed)

    def _verified(self, start: int, width: int, logits: torch.Tensor, features: torch.Tensor | None, roots_at: list[int], sizes: list[int], packed: bool) -> Verified:
        """The block's slots are holes until `commit` keeps the accepted ones."""
        self.valid = torch.cat([self.valid, torch.zeros(self.rows, width, dtype=torch.bool)], dim=1)
        flat = features.reshape(-1, features.shape[-1]) if features is not None else None
        self._block = (start, width, flat, roots_at)
        return Verified(logits, sizes, packed)

    def discard(self) -> None:
        """Forget the last verified block without keeping anything (cost measurements)."""
        start = self._block[0]
        truncate(self.cache, start)
        self.valid = self.valid[:, :start]
        self._block = None

    @torch.inference_mode()
    def commit(self, paths: Sequence[Sequence[int]]) -> None:
        """Keep each row's root and accepted nodes ``paths[b]`` of the last verified block (one
        write to the valid map and one gather of the features for all rows)."""
        start, _, hidden, roots_at = self._block
        rows, slots, entries = [], [], []
        for b, path in enumerate(paths):
            kept = [0, *(i + 1 for i in path)]
            rows += [b] * len(kept)
            slots += kept
            entries += [roots_at[b] + s for s in kept]
            self.lengths[b] += len(kept)
        self.valid[rows, [start + s for s in slots]] = True
        if hidden is not None:
            kept = hidden[torch.tensor(entries, device=hidden.device)]
            for b, part in enumerate(kept.split([1 + len(p) for p in paths])):
                self.pending[b].append(part)
        self._block = None
        self._drop_unseen()

    def _drop_unseen(self) -> None:
        """Drop the sliding layers' leading slots once a window's worth holds, for every row,
        only holes and entries past its window (positions up to ``length - window``): the slots
        before the earliest of the rows' first entries still within their windows. Checked only
        once the sliding layers hold two windows (a cumulative sum over the valid map)."""
        if not self.window or self.slots - self.dropped < 2 * self.window:
            return
        counts = self.valid.cumsum(1)  # live entries up to each slot, per row
        needed = (torch.tensor(self.lengths) - self.window + 2).clamp(min=1)  # ... up to a row's first within its window
        drop = int((counts < needed[:, None]).sum(1).min()) - self.dropped
        if drop < self.window:
            return
        drop_front(self.cache, self.sliding, drop)

    @torch.inference_mode()
    def take_features(self, row: int) -> torch.Tensor | None:
        if not self.pending[row]:
            return None
        features = torch.cat(self.pending[row])
        self.pending[row] = []
        return features
