"""Verifying k draft rows in one batched forward that shares the committed prefix's KV cache.

The learning-free n-gram paper verifies k rows of w + 1 tokens (the last emitted token followed by w
draft tokens) as a batch of k sequences that all continue the same context. Copying the context's
cache k times would cost more memory traffic than the forward pass itself at long context, so the
rows attend to the single committed cache directly:

* `RowBlockCache` stands in for the model's cache during the forward: each layer stores the rows'
  new keys and values (``[k, kv_heads, w+1, head_dim]``) and hands back only those;
* `shared_prefix_attention`, registered with transformers' `AttentionInterface`, attends every row
  to the shared prefix (one matrix product over all rows' queries, reading the prefix once) and to
  its own earlier tokens, and combines the two parts with one softmax.

The softmax is computed in float32 over the concatenated scores, so the result equals ordinary
attention over ``[prefix; own row]`` up to floating-point rounding.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from functools import partial
from typing import Callable, Iterator

import torch
from transformers import AttentionInterface, PreTrainedModel
from transformers.cache_utils import Cache, DynamicLayer

from ngspec.errors import NgspecError
from ngspec.kv import cache_argument

ATTENTION_NAME = "ngspec_shared_prefix"


class RowBlockCache(Cache):
    """The block being verified, per layer; the committed prefix stays in ``prefix``."""

    def __init__(self, prefix: Cache, num_layers: int) -> None:
        super().__init__(layers=[DynamicLayer() for _ in range(num_layers)])
        self.prefix = prefix

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.prefix.get_seq_length(layer_idx)

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        layer = self.layers[layer_idx]
        layer.keys, layer.values = key_states, value_states
        layer.is_initialized = True
        return key_states, value_states


def shared_prefix_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    shared_prefix: Cache | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """Attention of ``query [k, heads, q, d]`` over the shared prefix plus each row's own keys.

    ``key``/``value`` are the rows' own ``[k, kv_heads, q, d]``; the prefix is the committed cache,
    bound in for the forward (`forward_rows`). Returns ``[k, q, heads, d]`` like transformers'
    attention functions.
    """
    prefix = shared_prefix.layers[module.layer_idx]
    rows, heads, q, dim = query.shape
    if key.shape[-1] != dim or value.shape[-1] != dim:
        raise NgspecError("row verification needs queries, keys and values of one width (not latent attention); use tree verification")
    kv_heads = key.shape[1]
    groups = heads // kv_heads
    scale = scaling if scaling is not None else 1.0 / math.sqrt(dim)
    # queries grouped by the KV head they read: [kv_heads, rows * groups * q, d]
    grouped = query.reshape(rows, kv_heads, groups, q, dim).permute(1, 0, 2, 3, 4).reshape(kv_heads, -1, dim)
    scores_prefix = torch.matmul(grouped, prefix.keys[0].transpose(-1, -2)).float() * scale
    past = scores_prefix.shape[-1]
    scores_prefix = scores_prefix.view(kv_heads, rows, groups, q, past)
    # each row's own block, causal: [kv_heads, rows, groups, q, q]
    own_q = query.reshape(rows, kv_heads, groups * q, dim)
    scores_own = torch.matmul(own_q, key.transpose(-1, -2)).float() * scale
    scores_own = scores_own.view(rows, kv_heads, groups, q, q).permute(1, 0, 2, 3, 4)
    causal = torch.ones(q, q, dtype=torch.bool, device=query.device).triu_(1)
    scores_own = scores_own.masked_fill(causal, float("-inf"))
    top = torch.maximum(scores_prefix.amax(-1, keepdim=True), scores_own.amax(-1, keepdim=True))
    weights_prefix = (scores_prefix - top).exp_()
    weights_own = (scores_own - top).exp_()
    total = weights_prefix.sum(-1, keepdim=True) + weights_own.sum(-1, keepdim=True)
    out = torch.matmul(weights_prefix.to(value.dtype).view(kv_heads, -1, past), prefix.values[0])
    d_v = value.shape[-1]  # narrower than the queries' in multi-head latent attention
    out = out.view(kv_heads, rows, groups, q, d_v).float()
    own_v = value.permute(1, 0, 2, 3)[:, :, None]  # [kv_heads, rows, 1, q, d]
    out = out + torch.matmul(weights_own.to(value.dtype), own_v).float()
    out = (out / total).to(query.dtype)
    # [kv_heads, rows, groups, q, d] -> [rows, q, heads, d]
    return out.permute(1, 3, 0, 2, 4).reshape(rows, q, heads, d_v), None


@contextmanager
def attention_function(module: torch.nn.Module, name: str, function: Callable) -> Iterator[None]:
    """Route ``module``'s attention through ``function``, registered with transformers as ``name``,
    for one forward. The forward's own data is bound into ``function`` (`functools.partial`), so
    it reaches attention even through layers that do not pass keyword arguments on (StableLM's).
    Afterwards the registry holds the bare function again: the bound data (a cache, the head's
    pool rows) is not kept alive by it."""
    AttentionInterface.register(name, function)
    config = module.config
    saved = config._attn_implementation
    config._attn_implementation = name
    try:
        yield
    finally:
        config._attn_implementation = saved
        AttentionInterface.register(name, getattr(function, "func", function))


def forward_rows(model: PreTrainedModel, prefix: Cache, ids: torch.Tensor, **kwargs):
    """The model's output (logits ``[k, t, vocab]``, hidden states if asked) for k rows of t
    tokens ``ids`` that all continue ``prefix`` (a batch-1 cache, left unchanged), and the rows'
    own keys and values."""
    rows, width = ids.shape
    start = prefix.get_seq_length()
    positions = (start + torch.arange(width, device=ids.device)).expand(rows, -1)
    block = RowBlockCache(prefix, len(prefix.layers))
    dtype = next(model.parameters()).dtype
    unused_mask = torch.zeros(rows, 1, width, width, dtype=dtype, device=ids.device)
    with attention_function(model, ATTENTION_NAME, partial(shared_prefix_attention, shared_prefix=prefix)):
        out = model(
            input_ids=ids,
            position_ids=positions,
            attention_mask=unused_mask,  # 4D so that transformers builds none; causality is in the attention
            **cache_argument(model, block),
            use_cache=True,
            **kwargs,
        )
    return out, block
