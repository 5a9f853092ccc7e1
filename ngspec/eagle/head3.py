"""The EAGLE-3 draft head and its public checkpoint layout.

Architecture (EAGLE-3): the target's hidden states at three depths (the inputs of layers 2, L//2
and L-3 of an L-layer model: low, mid and high features) are concatenated and fused by
``fc`` (3·H_target -> H). One decoder layer reads ``[input_layernorm(embed(x_{i+1}));
hidden_norm(h_i)]`` (2·H wide: its q/k/v projections take 2·H inputs), adds the attention output
to ``h_i`` and runs the usual post-attention norm and MLP. Its output is both the next step's
``h`` (deeper draft positions feed it back, with no ``fc``) and, through the head's own ``norm``
and ``lm_head`` over a reduced draft vocabulary, the next-token logits; ``d2t[i]`` maps draft id i
to target id ``i + d2t[i]``.

Public layout: ``config.json`` (a Llama config of the head with ``draft_vocab_size``, and
optionally ``target_hidden_size``) and ``model.safetensors`` or ``pytorch_model.bin`` with
``fc.weight``, ``midlayer.{hidden_norm,input_layernorm,post_attention_layernorm}.weight``,
``midlayer.self_attn.{q,k,v,o}_proj.weight``, ``midlayer.mlp.{gate,up,down}_proj.weight``,
``norm.weight``, ``lm_head.weight``, ``d2t`` and ``t2d`` (``embed_tokens.weight``, present in
some checkpoints, is ignored: the target's embedding is used).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn
from transformers import LlamaConfig, PreTrainedModel
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRMSNorm, LlamaRotaryEmbedding

from ngspec.eagle.head import attention_keys_values
from ngspec.errors import NgspecError
from ngspec.kv import cache_argument


def feature_layers(num_layers: int) -> tuple[int, int, int]:
    """Indices into transformers' ``hidden_states`` (0 = embeddings, i = input of layer i) of
    EAGLE-3's low, mid and high features; models under 6 layers (tests) use (1, L//2, L-1)."""
    if num_layers >= 6:
        return 2, num_layers // 2, num_layers - 3
    return 1, max(1, num_layers // 2), max(1, num_layers - 1)


class Eagle3Head(nn.Module):
    own_lm_head = True

    def __init__(self, config: LlamaConfig, target_hidden: int | None = None) -> None:
        super().__init__()
        config._attn_implementation = "sdpa"
        self.config = config
        hidden = config.hidden_size
        self.target_hidden = target_hidden or hidden
        self.fc = nn.Linear(3 * self.target_hidden, hidden, bias=False)
        layer = LlamaDecoderLayer(config, layer_idx=0)
        attn = layer.self_attn
        for name in ("q_proj", "k_proj", "v_proj"):
            old = getattr(attn, name)
            setattr(attn, name, nn.Linear(2 * hidden, old.out_features, bias=old.bias is not None))
        layer.hidden_norm = LlamaRMSNorm(hidden, eps=config.rms_norm_eps)
        self.midlayer = layer
        self.norm = LlamaRMSNorm(hidden, eps=config.rms_norm_eps)
        self.lm_head = nn.Linear(hidden, config.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(config.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.zeros(config.vocab_size, dtype=torch.bool))
        self.rotary = LlamaRotaryEmbedding(config)

    def project(self, features: torch.Tensor) -> torch.Tensor:
        """The fused low/mid/high target features, ready for `forward`."""
        return self.fc(features)

    def forward(self, embeds, hidden, position_ids, attention_mask=None, cache=None, **attention_kwargs) -> torch.Tensor:
        layer = self.midlayer
        x = torch.cat([layer.input_layernorm(embeds), layer.hidden_norm(hidden)], dim=-1)
        attn, _ = layer.self_attn(
            hidden_states=x,
            position_embeddings=self.rotary(hidden, position_ids),
            attention_mask=attention_mask,
            **cache_argument(layer.self_attn, cache),
            **attention_kwargs,
        )
        h = hidden + attn
        return h + layer.mlp(layer.post_attention_layernorm(h))

    def keys_values(self, embeds, hidden, position_ids) -> tuple[torch.Tensor, torch.Tensor]:
        """The keys and values ``forward`` would add to the cache for these pairs, and nothing else."""
        layer = self.midlayer
        x = torch.cat([layer.input_layernorm(embeds), layer.hidden_norm(hidden)], dim=-1)
        return attention_keys_values(layer.self_attn, x, self.rotary(hidden, position_ids))

    def draft_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(hidden))

    def draft_to_target(self) -> torch.Tensor:
        """Target token id of every draft-vocabulary entry."""
        return torch.arange(len(self.d2t), device=self.d2t.device) + self.d2t


def head3_config_for(target: PreTrainedModel, draft_vocab_size: int) -> LlamaConfig:
    from ngspec.eagle.head import head_config_for

    config = head_config_for(target)
    config.draft_vocab_size = draft_vocab_size
    return config


def is_eagle3(weights: dict, raw_config: dict) -> bool:
    return any(k.startswith("midlayer.") for k in weights) or "d2t" in weights or "draft_vocab_size" in raw_config


def build_eagle3(directory: Path, raw: dict, weights: dict[str, torch.Tensor], target: PreTrainedModel) -> Eagle3Head:
    """An `Eagle3Head` from a public checkpoint's config and weights, checked against ``target``."""
    from ngspec.eagle.head import checked_state, head_config

    tc = target.config
    config = head_config(directory, raw, ("target_hidden_size",))
    config.draft_vocab_size = int(raw.get("draft_vocab_size") or raw.get("vocab_size") or tc.vocab_size)
    target_hidden = int(raw.get("target_hidden_size") or config.hidden_size)
    if target_hidden != tc.hidden_size:
        raise NgspecError(f"EAGLE-3 head {directory} reads features of hidden size {target_hidden}, the model has {tc.hidden_size}")
    if config.hidden_size != tc.hidden_size:
        raise NgspecError(f"EAGLE-3 head {directory} has hidden size {config.hidden_size}; it must equal the model's ({tc.hidden_size}) to share its embedding")
    if config.vocab_size != tc.vocab_size:
        raise NgspecError(f"EAGLE-3 head {directory} has a {config.vocab_size}-token vocabulary, the model has {tc.vocab_size}")
    head = Eagle3Head(config, target_hidden)
    weights = dict(weights)
    weights.setdefault("d2t", torch.zeros(config.draft_vocab_size, dtype=torch.long))  # a head over the whole vocabulary
    weights.setdefault("t2d", torch.zeros(config.vocab_size, dtype=torch.bool))
    state = checked_state(head, weights, directory, "EAGLE-3")
    targets = torch.arange(config.draft_vocab_size) + state["d2t"].long()
    if len(targets) and (int(targets.min()) < 0 or int(targets.max()) >= tc.vocab_size):
        raise NgspecError(f"{directory}: d2t maps draft ids outside the model's {tc.vocab_size}-token vocabulary")
    head.load_state_dict(state, strict=False)
    param = next(target.parameters())
    head = head.to(device=param.device, dtype=param.dtype).eval()  # d2t/t2d keep their integer dtypes
    head.feature_layers = feature_layers(tc.num_hidden_layers)
    return head


def save_head3(head: Eagle3Head, directory: Path, filename: str = "model.safetensors") -> None:
    """Write an EAGLE-3 head in the public layout (``model.safetensors`` or ``pytorch_model.bin``)."""
    directory.mkdir(parents=True, exist_ok=True)
    config = head.config.to_dict()
    config.update({"architectures": ["LlamaForCausalLMEagle3"], "draft_vocab_size": head.config.draft_vocab_size,
                   "target_hidden_size": head.target_hidden})
    (directory / "config.json").write_text(json.dumps(config, indent=2, default=str))
    state = {k: v.detach().contiguous().cpu() for k, v in head.state_dict().items() if not k.startswith("rotary.")}
    if filename.endswith(".safetensors"):
        from safetensors.torch import save_file

        save_file(state, str(directory / filename))
    else:
        torch.save(state, directory / filename)
