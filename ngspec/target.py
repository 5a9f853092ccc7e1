"""TargetModel: the model being decoded, its KV cache, and the three calls the loop makes.

``prefill(prompt)`` fills the cache and returns the logits after the prompt; ``verify(root, tree)``
runs the root token plus a whole draft tree in one forward pass (custom 4D mask and explicit
positions) and returns the logits of every block position; ``commit(path)`` keeps the root and the
accepted nodes in the cache. ``verify_rows``/``commit_row`` do the same for k draft rows verified
as a batch that shares the committed cache (see `ngspec.rows`). The cache is owned here and nowhere
else.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Sequence

import torch
from transformers import DynamicCache, PreTrainedModel

from ngspec.architecture import block_masks, check_architecture, rope_switch, sliding_layers, sliding_window
from ngspec.contracts import DraftTree
from ngspec.errors import NgspecError, env_switch
from ngspec.kv import cache_argument, drop_front, dropped, keep_block, make_cache, truncate
from ngspec.cpu_linear import tune_linears
from ngspec.rows import RowBlockCache, forward_rows
from ngspec.static_verify import StaticVerify
from ngspec.tree import block_positions, block_visibility, root_to_leaf_paths, visibility


def forward_with_features(call: Callable[..., Any], model: PreTrainedModel, keep: bool, layers: tuple[int, ...] | None) -> tuple[Any, torch.Tensor | None]:
    """Run ``call`` (a forward of ``model``, taking extra keyword arguments) and return its output
    and, when ``keep``, the features an EAGLE head reads, ``[B, T, F]`` (`select_features`).

    EAGLE-1's last hidden state (the LM head's input) is read from the base model's output by one
    hook, removed afterwards. Asking transformers for hidden states instead installs a capturing
    hook on every decoder layer and attention module for good, which made every later forward of
    the default model 0.3 ms (1.2-1.6%) slower on the AMD VM, drafters without a head included; and,
    asked for all of them, it keeps every layer's (a 1,187-token prefill took 17% longer). EAGLE-3
    reads several layers, so it asks transformers for those (``output_hidden_states`` by index)."""
    if not keep:
        return call(), None
    if layers is not None:
        out = call(output_hidden_states=list(layers))
        return out, select_features(out.hidden_states, layers)
    seen: list[torch.Tensor] = []
    hook = model.get_decoder().register_forward_hook(lambda module, args, out: seen.append(out.last_hidden_state))
    try:
        out = call()
    finally:
        hook.remove()
    return out, seen[-1]


def select_features(hidden_states: tuple[torch.Tensor, ...], layers: tuple[int, ...] | None) -> torch.Tensor:
    """What EAGLE heads read, ``[B, T, F]``: the last hidden state (EAGLE-1, ``layers`` None) or
    the concatenated hidden states at ``layers`` (EAGLE-3's low, mid and high features)."""
    if layers is None:
        return hidden_states[-1]
    return torch.cat([hidden_states[i] for i in layers], dim=-1)


def decode_attention(device: torch.device) -> None:
    """On a GPU, keep PyTorch's SDPA off its cuDNN backend (unless ``NGSPEC_CUDNN_ATTENTION`` is on: 1, true, yes, on).

    On the first H100 run (BENCHMARKS.md section 10) unmasked bf16 decoding steps took about 80 ms
    against 28 ms in float32 and 49 ms for tree steps, which pass a custom mask. That fits PyTorch
    2.10+ preferring cuDNN attention on Hopper for unmasked bf16 inputs, with cuDNN building an
    execution plan per shape while decoding grows the key length every step (inferred, not
    profiled). Measured on the second visit (section 10b, `benchmarks/sdpa_backends.py`): plain
    bf16 steps 3.1x faster with cuDNN off, transformers' `generate` 2.3x. The switch is
    process-wide, so transformers' own `generate` in `bench` runs the same kernels as ngspec."""
    if device.type == "cuda" and not env_switch("NGSPEC_CUDNN_ATTENTION"):
        torch.backends.cuda.enable_cudnn_sdp(False)


def prepare_model(model: PreTrainedModel) -> tuple[PreTrainedModel, torch.device, torch.dtype, int]:
    """The model in eval mode, its device, dtype and context window. On CPU, let SDPA handle
    grouped-query attention under a custom mask instead of materialising repeated K/V every layer
    (same logits; faster trees at long context), and give float32 linear layers the fastest
    product for each row count on this CPU (`ngspec.cpu_linear`); on a GPU, keep attention off
    cuDNN (`decode_attention`). A model whose attention cannot verify trees is refused
    (`check_architecture`)."""
    check_architecture(model.eval())
    param = next(model.parameters())
    if param.device.type == "cpu":
        os.environ.setdefault("TRANSFORMERS_SDPA_FORCE_GQA", "1")
    decode_attention(param.device)
    tune_linears(model)
    return model.eval(), param.device, param.dtype, context_window(model)


def context_window(model: PreTrainedModel) -> int:
    """The most positions ``model`` was made for (its config's ``max_position_embeddings``; a config
    without one: no limit)."""
    return int(getattr(model.config, "max_position_embeddings", 1 << 30))


def static_verifier(model: PreTrainedModel, window: int | None, device: torch.device, capture: bool | None) -> StaticVerify:
    """`StaticVerify` for ``model``, capturing on a GPU unless ``capture`` says otherwise; a model
    with sliding-window layers is refused (their caches drop leading slots, which fixed shapes
    do not follow)."""
    if window:
        raise NgspecError("--target-graphs needs a model whose layers all use full attention (this one has sliding-window layers)")
    return StaticVerify(model, device.type == "cuda" if capture is None else capture)


class TargetModel:
    """One sequence (batch row) decoded by a transformers causal LM."""

    def __init__(self, model: PreTrainedModel) -> None:
        self.model, self.device, self.dtype, self.max_length = prepare_model(model)
        self.vocab = model.get_input_embeddings().num_embeddings  # token ids it can read
        self.window = sliding_window(model)  # of sliding-window layers, if any
        self.sliding = sliding_layers(model.config) if self.window else ()
        self.rope_switch = rope_switch(model.config)  # where longrope frequencies switch, if they do
        self.cache: DynamicCache | None = None
        self._row_block: RowBlockCache | None = None
        self._rows_paths: list[list[int]] | None = None  # set while a tree verified as rows awaits commit
        self.keep_features = False  # also keep last hidden states of committed positions (EAGLE)
        self.feature_layers: tuple[int, ...] | None = None  # EAGLE-3: hidden states to concatenate
        self._pending: list[torch.Tensor] = []
        self._block_hidden: torch.Tensor | None = None
        self._rows_hidden: torch.Tensor | None = None
        self.length = 0  # committed tokens in the cache
        # context length -> relative cost of verifying a tree of each size (index = nodes); a table
        # applies from its context length up to the next one; empty = not measured
        self.cost_tables: dict[int, tuple[float, ...]] = {}
        self.static: StaticVerify | None = None  # tree verification at fixed shapes (`use_graphs`)

    def use_graphs(self, capture: bool | None = None) -> StaticVerify:
        """Verify trees at fixed shapes from now on, replayed from captured CUDA graphs
        (``capture``, by default on a GPU only; `ngspec.static_verify`)."""
        self.static = static_verifier(self.model, self.window, self.device, capture)
        return self.static

    def verify_cost(self, context: int | None = None) -> tuple[float, ...]:
        """The cost table for ``context`` cached tokens (default: the current length)."""
        if not self.cost_tables:
            return ()
        context = self.length if context is None else context
        below = [c for c in self.cost_tables if c <= context]
        return self.cost_tables[max(below) if below else min(self.cost_tables)]

    def take_features(self) -> torch.Tensor | None:
        """Last hidden states (the LM head's input) of the positions committed since the previous
        call, ``[m, hidden]`` (only kept when ``keep_features`` is set, for EAGLE drafters)."""
        if not self._pending:
            return None
        features = torch.cat(self._pending) if len(self._pending) > 1 else self._pending[0]
        self._pending = []
        return features

    def _forward(self, ids: torch.Tensor, **kwargs) -> torch.Tensor:
        out, features = forward_with_features(
            lambda **extra: self.model(input_ids=ids.to(self.device), **cache_argument(self.model, self.cache), use_cache=True, **kwargs, **extra),
            self.model, self.keep_features, self.feature_layers,
        )
        self._block_hidden = features[0] if features is not None else None
        return out.logits[0]

    @torch.inference_mode()
    def prefill(self, prompt: Sequence[int]) -> torch.Tensor:
        """Start a new sequence; returns the next-token logits after the prompt, ``[vocab]``."""
        if self.static is not None and self.cache is not None:  # the same buffers, which the graphs hold
            truncate(self.cache, 0)
        else:
            self.cache = make_cache(self.model.config, capacity=len(prompt) + 512)
        self._row_block, self._rows_paths = None, None
        ids = torch.tensor([list(prompt)], dtype=torch.long)
        logits = self._forward(ids, logits_to_keep=1)
        self._pending = [self._block_hidden] if self.keep_features else []
        self.length = len(prompt)
        self._drop_unseen()
        return logits[-1]

    @torch.inference_mode()
    def verify(self, root: int, tree: DraftTree, layout: str = "tree") -> torch.Tensor:
        """Logits ``[1 + tree.size, vocab]`` for the root followed by every tree node.

        ``layout="tree"`` runs the tree as one row under a tree mask; ``"rows"`` runs each
        root-to-leaf path as its own row of a batch sharing the cache (`verify_rows`) and gathers
        the same per-node logits, so acceptance and `commit` work the same either way.
        """
        self._rows_paths = None
        if layout == "rows" and tree.size:
            return self._verify_tree_as_rows(root, tree)
        ids = torch.tensor([[root, *tree.tokens]], dtype=torch.long)
        positions = torch.tensor([block_positions(tree, self.length)], dtype=torch.long)
        if self.static is not None:
            if self.static.fits(1 + tree.size):
                features = (self.feature_layers or ()) if self.keep_features else None
                logits, hidden = self.static.run(self.cache, self.length, ids, positions, None, visibility(tree)[None], features)
                self._block_hidden = hidden[0] if hidden is not None else None
                return logits[0]
            truncate(self.cache, self.length)  # the committed entries only (`commit` leaves the extent to fixed shapes)
        kwargs: dict = {"position_ids": positions.to(self.device)}
        if tree.size or self.window:  # a lone root: transformers' causal mask, unless layers slide
            kwargs["attention_mask"] = self._tree_mask(tree, positions)
        return self._forward(ids, **kwargs)

    def _tree_mask(self, tree: DraftTree, positions: torch.Tensor):
        """The block's mask over the cache and the tree (per layer type for sliding windows)."""
        past = torch.arange(self.length)[None] if self.window else None
        masks = block_masks(self.model.config, block_visibility(tree, self.length), positions, past, self.window, self.dtype, self.dropped)
        # built on the host and copied over once each, as a host-bound GPU step wants
        return {kind: m.to(self.device) for kind, m in masks.items()} if isinstance(masks, dict) else masks.to(self.device)

    def _verify_tree_as_rows(self, root: int, tree: DraftTree) -> torch.Tensor:
        paths = root_to_leaf_paths(tree)
        logits = self.verify_rows(root, [[tree.tokens[i] for i in p] for p in paths])
        row_of = torch.zeros(tree.size + 1, dtype=torch.long)
        col_of = torch.zeros(tree.size + 1, dtype=torch.long)
        for r in range(len(paths) - 1, -1, -1):  # a node shared by several rows: the first one's
            for depth, node in enumerate(paths[r]):
                row_of[node + 1], col_of[node + 1] = r, depth + 1
        self._rows_paths = paths
        return logits[row_of.to(logits.device), col_of.to(logits.device)]

    @torch.inference_mode()
    def commit(self, path: Sequence[int]) -> None:
        """Keep the root and the accepted nodes ``path`` of the last verified block."""
        assert self.cache is not None, "prefill first"
        if self._rows_paths is not None:
            row = next(r for r, p in enumerate(self._rows_paths) if p[: len(path)] == list(path))
            self._rows_paths = None
            self.commit_row(row, len(path))
            return
        keep = [0, *(i + 1 for i in path)]
        # at fixed shapes the extent is left to the next fixed-shape forward (any other path
        # cuts it first, `verify`)
        keep_block(self.cache, self.length, keep, cut=self.static is None)
        if self.keep_features:
            self._pending.append(self._block_hidden[keep])
        self.length += 1 + len(path)
        self._drop_unseen()

    def _drop_unseen(self) -> None:
        """Drop the sliding layers' entries that no later query can see (positions up to
        ``length - window``: the next block starts at ``length``), once a window's worth has
        gathered, so those layers hold at most about two windows, as transformers' own cache holds
        one, and attend over no more. Each drop copies what is left once per window of tokens."""
        if not self.window:
            return
        unseen = self.length - self.window + 1 - self.dropped
        if unseen < self.window:
            return
        drop_front(self.cache, self.sliding, unseen)

    @property
    def dropped(self) -> int:
        """Leading positions the sliding layers' caches no longer hold."""
        return dropped(self.cache, self.sliding)

    @torch.inference_mode()
    def verify_rows(self, root: int, rows: Sequence[Sequence[int]]) -> torch.Tensor:
        """Logits ``[k, 1 + w, vocab]`` for k rows ``[root, *row]`` (rows padded to the longest
        one, which changes nothing before the padding), all continuing the committed cache."""
        assert self.cache is not None, "prefill first"
        if self.window:
            raise NgspecError("row verification needs a model whose layers all use full attention; use tree verification")
        if self.static is not None:
            truncate(self.cache, self.length)  # the committed entries only (see `verify`)
        width = max((len(r) for r in rows), default=0)
        ids = torch.tensor([[root, *r, *[root] * (width - len(r))] for r in rows], dtype=torch.long)
        blocks = []  # the rows' own keys and values, beside the output `forward_with_features` reads

        def forward(**extra):
            out, block = forward_rows(self.model, self.cache, ids.to(self.device), **extra)
            blocks.append(block)
            return out

        out, self._rows_hidden = forward_with_features(forward, self.model, self.keep_features, self.feature_layers)
        self._row_block = blocks[-1]
        return out.logits

    @torch.inference_mode()
    def commit_row(self, row: int, accepted: int) -> None:
        """Keep the root and the first ``accepted`` tokens of row ``row`` of the last `verify_rows`."""
        assert self._row_block is not None, "verify_rows first"
        for layer, block in zip(self.cache.layers, self._row_block.layers):
            layer.update(block.keys[row : row + 1, :, : accepted + 1], block.values[row : row + 1, :, : accepted + 1])
        if self.keep_features:
            self._pending.append(self._rows_hidden[row, : accepted + 1])
        self.length += 1 + accepted
        self._row_block = None

    def discard(self) -> None:
        """Forget the last verified block (tree or rows) without committing anything."""
        if self.cache is not None:
            truncate(self.cache, self.length)
        self._row_block = None
        self._rows_paths = None
