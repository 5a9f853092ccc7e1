"""What a model's attention must offer the engine, and the sliding-window masks some families need.

The engine verifies a draft tree in one forward: explicit position ids, its own 4D mask, and a KV
cache it can cut back when drafts are rejected. A model is refused, with one clear message, when
its attention cannot take that: ALiBi models place tokens by cache index rather than position
(BLOOM, MPT, Falcon with ``alibi``), recurrent and linear-attention layers keep a state that a
rejected draft cannot be taken back from (Mamba, Jamba, Qwen3-Next), and chunked attention
(Llama 4) needs masks the engine does not build; a model that numbers positions its own way
(RoBERTa's start after the padding index) would see explicit positions differently. Rotary
frequencies that switch with a forward's longest position (longrope) bound how deep a block may
reach (`rope_switch`).

Sliding-window layers (Mistral v0.1, Phi-3-mini-4k, Gemma 2 and 3, Qwen2 with its window on)
attend only to the last ``sliding_window`` positions. transformers keeps only those in a sliding
layer's cache, which a verification block cannot use: a rejected draft would already have pushed
out entries the next step needs. So sliding layers keep what a block may still see, and get a mask
that also hides the keys more than the window back, counted in positions, not cache slots (a
batch's slots hold padding and holes): key j is visible from query i when
``pos(j) > pos(i) - window``, as in transformers' ``sliding_window_overlay``. A sliding layer's
entries are dropped once every later query is past them (`ngspec.target` for one sequence,
`ngspec.batch_target` for the slots every row of a batch is past), so its memory and attention
work do not grow with the context, and its mask starts where its cache does (``sliding_from``).
"""

from __future__ import annotations

import inspect

import torch
from transformers import DynamicCache, PreTrainedModel
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

from ngspec.errors import NgspecError
from ngspec.kv import cache_argument, make_cache
from ngspec.tree import additive_mask

LAYER_TYPES = ("full_attention", "sliding_attention")


def check_architecture(model: PreTrainedModel) -> None:
    """Raise `NgspecError` naming why ``model``'s attention cannot verify draft trees, if it cannot.
    A model that passed is marked and not probed again (`_probe`)."""
    if getattr(model, "_ngspec_architecture_checked", False):
        return
    config = model.config
    name = type(model).__name__
    if "position_ids" not in inspect.signature(type(model).forward).parameters or getattr(config, "alibi", False):
        raise NgspecError(
            f"{name} does not take position ids (ALiBi or recurrent), so a draft tree cannot be verified in one "
            "forward: ngspec supports models with rotary or learned positions (Llama, Qwen, Mistral, Gemma, Phi, GPT-2, ...)"
        )
    other = sorted(set(getattr(config, "layer_types", None) or ()) - set(LAYER_TYPES))
    if other:
        raise NgspecError(
            f"{name} has {', '.join(other)} layers: ngspec verifies drafts through full and sliding-window attention "
            "only (a recurrent state cannot be taken back from a rejected draft; chunked masks are not built)"
        )
    layers = {type(layer).__name__ for layer in DynamicCache(config=config).layers if type(layer) not in (DynamicLayer, DynamicSlidingWindowLayer)}
    if layers:
        raise NgspecError(f"{name}'s cache has {', '.join(sorted(layers))} layers, which ngspec cannot cut back after a rejected draft")
    why = _probe(model)
    if why:
        raise NgspecError(f"{name} {why}")
    model._ngspec_architecture_checked = True


@torch.inference_mode()
def _probe(model: PreTrainedModel) -> str | None:
    """Why six tokens through the model do not behave as verifying a draft tree needs, or None.
    Four small forwards (0.27 s for the default model on two CPU cores), that also guard code
    loaded with ``--trust-remote-code``: the six tokens with positions 0-5 and a cache, which must
    then hold their keys and values, and without either (a model that numbers positions its own
    way); and under a causal mask that hides the first three tokens from the last three, whose
    logits must then be those of the last three alone at positions 3-5 under a causal mask (a model
    that ignores or refuses a custom mask would verify trees wrongly; an encoder used as a decoder,
    attending both ways by itself, passes, as it decodes as plain decoding does)."""
    device = next(model.parameters()).device
    ids = (torch.arange(1, 7, device=device) % model.get_input_embeddings().weight.shape[0])[None]
    positions = torch.arange(6, device=device)[None]

    def same(a, b) -> bool:
        return torch.allclose(a.float(), b.float(), rtol=1e-3, atol=1e-3)

    cache = make_cache(model.config, capacity=8)
    try:
        given = model(input_ids=ids, position_ids=positions, **cache_argument(model, cache), use_cache=True).logits
    except Exception as exc:  # noqa: BLE001 - whatever the model's own code raises
        return f"does not run with explicit positions and a transformers cache ({type(exc).__name__} in its forward: {exc})"
    if not same(model(input_ids=ids, use_cache=False).logits, given):
        return (
            "numbers positions its own way (RoBERTa-style models start after the padding index), so tokens "
            "verified at explicit positions 0, 1, 2, ... would not match its plain decoding"
        )
    if any(layer.keys is None or layer.keys.shape[-2] != 6 for layer in cache.layers):
        return "does not keep its keys and values in transformers' cache, so a verified block cannot continue a cached context"
    window = sliding_window(model)

    def masked(visible: torch.Tensor, at: slice) -> torch.Tensor:
        masks = block_masks(model.config, visible[None], positions[:, at], positions[:, :0], window, given.dtype)
        return model(input_ids=ids[:, at], position_ids=positions[:, at], attention_mask=masks, use_cache=False).logits[0]

    causal = torch.ones(6, 6, dtype=torch.bool, device=device).tril()
    hidden = causal.clone()
    hidden[3:, :3] = False
    try:
        apart = masked(hidden, slice(0, 6))[3:]
    except Exception as exc:  # noqa: BLE001 - whatever the model's own code raises
        return f"does not take a custom 4D attention mask ({type(exc).__name__} in its forward), which verifying a draft tree needs"
    if not same(apart, masked(causal[:3, :3], slice(3, 6))):
        return "does not honour a custom 4D attention mask, which verifying a draft tree needs"
    return None


def sliding_window(model: PreTrainedModel) -> int | None:
    """The window transformers' own cache gives the model's sliding layers, or None. That cache,
    not the layers, decides what plain decoding sees: a config with a ``sliding_window`` makes
    every layer a sliding one there, even a Llama's, whose own masks never slide."""
    windows = {layer.sliding_window for layer in _sliding_cache_layers(model.config).values()}
    return min(windows) if windows else None


def sliding_layers(config) -> tuple[int, ...]:
    """The indices of the layers `sliding_window` applies to (the ones given its mask)."""
    return tuple(_sliding_cache_layers(config))


def _sliding_cache_layers(config) -> dict:
    return {i: layer for i, layer in enumerate(DynamicCache(config=config).layers) if isinstance(layer, DynamicSlidingWindowLayer)}


def rope_switch(config) -> int | None:
    """The position count at which the model's rotary frequencies switch for a whole forward, or
    None. transformers' ``longrope`` (Phi-3 and Phi-4 with 128k contexts) uses its short factors
    while a forward's longest position is within ``original_max_position_embeddings`` and its long
    factors for every token of a forward that reaches past it. Plain decoding computes each
    position by itself, so a block that straddles the switch would differ from it (by 0.04-0.06 in
    the logits of a tiny model), and a batch would switch every row when its longest row does."""
    params = getattr(config, "rope_parameters", None) or {}
    sets = [params] if "rope_type" in params else [p for p in params.values() if isinstance(p, dict)]
    switches = [int(p["original_max_position_embeddings"]) for p in sets if p.get("rope_type") == "longrope" and p.get("original_max_position_embeddings")]
    return min(switches, default=None)


def rope_depth(position: int, switch: int | None, limit: int) -> int:
    """The deepest draft node (at most ``limit``) a block rooted at ``position`` may hold so that
    it does not straddle the switch (`rope_switch`): the whole block before it, or all past it."""
    if switch is None or position >= switch:
        return limit
    return min(limit, switch - 1 - position)


def block_masks(config, visible: torch.Tensor, positions: torch.Tensor, past_positions: torch.Tensor, window: int | None, dtype: torch.dtype, sliding_from: int = 0):
    """The ``attention_mask`` a verification forward takes, from what its block sees,
    ``visible [rows, q, past + q]``, its positions ``[rows, q]`` and those of the cached entries
    ``[rows, past]``: the additive mask alone, or with the sliding layers' own (`within_window`),
    one per layer type where the model names its layers' types (Gemma, Qwen2), else the sliding
    one for every layer (Mistral, Phi-3). The sliding layers' caches start at slot
    ``sliding_from`` (their older entries dropped), so their mask does too."""
    if not window:
        return additive_mask(visible[:, None], dtype)
    keys = torch.cat([past_positions, positions], dim=1)[:, sliding_from:]
    sliding = additive_mask(within_window(visible[:, :, sliding_from:], positions, keys, window)[:, None], dtype)
    if getattr(config, "layer_types", None) is None:
        return sliding
    return {"full_attention": additive_mask(visible[:, None], dtype), "sliding_attention": sliding}


def within_window(visible: torch.Tensor, query_positions: torch.Tensor, key_positions: torch.Tensor, window: int) -> torch.Tensor:
    """``visible [rows, q, keys]`` also hiding keys ``window`` or more positions before their
    query; positions ``[rows, q]`` and ``[rows, keys]``."""
    return visible & (key_positions[:, None, :] > query_positions[:, :, None] - window)
