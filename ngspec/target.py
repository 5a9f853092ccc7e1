"""TargetModel: the model being decoded, its KV cache, and the three calls the loop makes.

``prefill(prompt)`` fills the cache and returns the logits after the prompt; ``verify(root, tree)``
runs the root token plus a whole draft tree in one forward pass (custom 4D mask and explicit
positions) and returns the logits of every block position; ``commit(path)`` keeps the root and the
accepted nodes in the cache. The cache is owned here and nowhere else.
"""

from __future__ import annotations

import os
from typing import Sequence

import torch
from transformers import DynamicCache, PreTrainedModel

from ngspec.contracts import DraftTree
from ngspec.kv import keep_block, make_cache
from ngspec.tree import attention_mask, position_ids


class TargetModel:
    """One sequence (batch row) decoded by a transformers causal LM."""

    def __init__(self, model: PreTrainedModel) -> None:
        self.model = model.eval()
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.max_length = int(getattr(model.config, "max_position_embeddings", 1 << 30))
        self.cache: DynamicCache | None = None
        self.length = 0  # committed tokens in the cache
        # relative cost of verifying a tree of each size (index = nodes); empty = not measured
        self.verify_cost: tuple[float, ...] = ()
        if self.device.type == "cpu":
            # let SDPA handle grouped-query attention under a custom mask instead of materialising
            # repeated K/V every layer (same logits; faster trees at long context on CPU)
            os.environ.setdefault("TRANSFORMERS_SDPA_FORCE_GQA", "1")

    def _forward(self, ids: torch.Tensor, **kwargs) -> torch.Tensor:
        out = self.model(
            input_ids=ids.to(self.device), past_key_values=self.cache, use_cache=True, **kwargs
        )
        return out.logits[0]

    @torch.inference_mode()
    def prefill(self, prompt: Sequence[int]) -> torch.Tensor:
        """Start a new sequence; returns the next-token logits after the prompt, ``[vocab]``."""
        self.cache = make_cache(self.model.config, capacity=len(prompt) + 512)
        ids = torch.tensor([list(prompt)], dtype=torch.long)
        logits = self._forward(ids, logits_to_keep=1)
        self.length = len(prompt)
        return logits[-1]

    @torch.inference_mode()
    def verify(self, root: int, tree: DraftTree) -> torch.Tensor:
        """Logits ``[1 + tree.size, vocab]`` for the root followed by every tree node."""
        ids = torch.tensor([[root, *tree.tokens]], dtype=torch.long)
        kwargs: dict = {"position_ids": position_ids(tree, self.length).to(self.device)}
        if tree.size:
            kwargs["attention_mask"] = attention_mask(tree, self.length, self.dtype).to(self.device)
        return self._forward(ids, **kwargs)

    @torch.inference_mode()
    def commit(self, path: Sequence[int]) -> None:
        """Keep the root and the accepted nodes ``path`` of the last verified block."""
        assert self.cache is not None, "prefill first"
        keep_block(self.cache, self.length, [0, *(i + 1 for i in path)])
        self.length += 1 + len(path)
