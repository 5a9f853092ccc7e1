"""KV cache surgery on transformers' `DynamicCache`: keep the accepted entries of a verify block.

After a verification forward the cache holds ``start`` committed positions followed by the whole
block (root + tree nodes). Committing moves the kept block entries next to the committed ones with
one gather per layer and drops the rest; rollback is just that length change.
"""

from __future__ import annotations

from typing import Sequence

import torch
from transformers import DynamicCache


def keep_block(cache: DynamicCache, start: int, offsets: Sequence[int]) -> None:
    """Keep block entries ``offsets`` (relative to ``start``, ascending) and drop the others."""
    n_keep = len(offsets)
    contiguous = list(offsets) == list(range(n_keep))
    if not contiguous:
        src = torch.as_tensor(offsets, dtype=torch.long) + start
    for layer in cache.layers:
        if not contiguous:
            src_dev = src.to(layer.keys.device)
            layer.keys[:, :, start : start + n_keep] = layer.keys.index_select(2, src_dev)
            layer.values[:, :, start : start + n_keep] = layer.values.index_select(2, src_dev)
        layer.keys = layer.keys[:, :, : start + n_keep]
        layer.values = layer.values[:, :, : start + n_keep]


def cache_length(cache: DynamicCache) -> int:
    return int(cache.get_seq_length())
