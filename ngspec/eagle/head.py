"""The EAGLE-1 draft head, and reading and writing it in the public checkpoint layout.

Architecture (EAGLE-1): the input at position i is ``fc([embed(x_{i+1}); f_i])`` where ``f_i`` is
the target's last hidden state (after its final norm, the input of its LM head) at position i and
``x_{i+1}`` the token that followed; one Llama decoder layer without its input norm turns it into a
prediction of ``f_{i+1}``, and the target's own LM head turns that into next-token logits. The
embedding and LM head are the target's (frozen, not stored with the head).

Public layout: a directory with ``config.json`` (a Llama config of the head: hidden size,
intermediate size, heads, vocabulary, ``bias`` for fc) and ``model.safetensors`` or
``pytorch_model.bin`` holding ``fc.weight``, ``fc.bias``, ``layers.0.self_attn.{q,k,v,o}_proj.weight``,
``layers.0.mlp.{gate,up,down}_proj.weight`` and ``layers.0.post_attention_layernorm.weight``
(an ``embed_tokens.weight`` entry, present in some checkpoints, is ignored).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Iterable, Mapping, Sequence

import torch
from torch import nn
from transformers import LlamaConfig, PreTrainedModel
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding, apply_rotary_pos_emb

from ngspec import staging
from ngspec.errors import NgspecError, first_sentence, json_text_problem, short
from ngspec.kv import cache_argument
from ngspec.model_files import field_problem, refuse_directories
from ngspec.models import CONFIG_ERRORS, config_error_message, config_problem

WEIGHTS = ("model.safetensors", "pytorch_model.bin")


class EagleHead(nn.Module):
    """fc over [token embedding; target feature] -> one decoder layer -> predicted next feature."""

    own_lm_head = False  # the target's LM head turns predicted features into logits
    feature_layers = None  # reads the target's last hidden state

    def __init__(self, config: LlamaConfig, bias: bool = True) -> None:
        super().__init__()
        config._attn_implementation = "sdpa"
        self.config = config
        hidden = config.hidden_size
        self.fc = nn.Linear(2 * hidden, hidden, bias=bias)
        layer = LlamaDecoderLayer(config, layer_idx=0)
        layer.input_layernorm = nn.Identity()  # EAGLE-1's first (only) layer has no input norm
        self.layers = nn.ModuleList([layer])
        self.rotary = LlamaRotaryEmbedding(config)

    def project(self, features: torch.Tensor) -> torch.Tensor:
        return features  # the target's features enter `forward` as they are

    def forward(
        self,
        embeds: torch.Tensor,  # [B, T, H] embeddings of the tokens that follow each feature
        features: torch.Tensor,  # [B, T, H] target (or predicted) features
        position_ids: torch.Tensor,  # [B, T]
        attention_mask: torch.Tensor | None = None,  # additive [B, 1, T, past + T]
        cache=None,
        **attention_kwargs,  # for the attention function (`ngspec.eagle.batched`)
    ) -> torch.Tensor:
        h = self.fc(torch.cat([embeds, features], dim=-1))
        return self.layers[0](
            h,
            attention_mask=attention_mask,
            position_ids=position_ids,
            **cache_argument(self.layers[0], cache),
            use_cache=cache is not None,
            position_embeddings=self.rotary(h, position_ids),
            **attention_kwargs,
        )

    def keys_values(self, embeds: torch.Tensor, features: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The keys and values ``forward`` would add to the cache for these pairs, and nothing
        else (see `attention_keys_values`)."""
        h = self.fc(torch.cat([embeds, features], dim=-1))
        return attention_keys_values(self.layers[0].self_attn, h, self.rotary(h, position_ids))


def attention_keys_values(attn: nn.Module, x: torch.Tensor, position_embeddings: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys (rotated) and values ``[B, kv_heads, T, d]`` of a Llama attention layer's input ``x``,
    as `LlamaAttention` caches them. A one-layer head's keys and values depend on its input alone,
    so pairs whose prediction nobody reads (a prompt's, but for its last) need no more than this:
    no queries, attention or MLP (`ngspec.eagle.batched.run_calls`)."""
    shape = (*x.shape[:-1], -1, attn.head_dim)
    keys = attn.k_proj(x).view(shape).transpose(1, 2)
    values = attn.v_proj(x).view(shape).transpose(1, 2)
    cos, sin = position_embeddings
    return apply_rotary_pos_emb(keys, keys, cos, sin)[1], values


def last_layer(target: PreTrainedModel) -> nn.Module | None:
    """``target``'s last decoder layer (``layers``, GPT-2's ``h``), or None if it has no list of them."""
    decoder = target.get_decoder()
    for name in ("layers", "h", "blocks"):
        layers = getattr(decoder, name, None)
        if isinstance(layers, nn.ModuleList) and len(layers):
            return layers[-1]
    return None


def head_config_for(target: PreTrainedModel) -> LlamaConfig:
    """A head shaped like one layer of ``target`` (same hidden size, heads and vocabulary)."""
    tc = target.config
    q_proj = getattr(getattr(last_layer(target), "self_attn", None), "q_proj", None)
    return LlamaConfig(
        hidden_size=tc.hidden_size,
        intermediate_size=getattr(tc, "intermediate_size", None) or 4 * tc.hidden_size,
        num_attention_heads=tc.num_attention_heads,
        num_key_value_heads=getattr(tc, "num_key_value_heads", None) or tc.num_attention_heads,
        head_dim=getattr(tc, "head_dim", None) or tc.hidden_size // tc.num_attention_heads,
        vocab_size=tc.vocab_size,
        rms_norm_eps=getattr(tc, "rms_norm_eps", 1e-6),
        rope_theta=getattr(tc, "rope_theta", None) or (getattr(tc, "rope_parameters", None) or {}).get("rope_theta", 10000.0),
        max_position_embeddings=getattr(tc, "max_position_embeddings", 2048),
        num_hidden_layers=1,
        tie_word_embeddings=False,
        attention_bias=getattr(q_proj, "bias", None) is not None,
    )


def init_from_target(head: EagleHead, target: PreTrainedModel) -> None:
    """Start training from something sensible: fc passes the feature through (plus a small random
    mix of the embedding) and the decoder layer copies the target's last layer with its output
    projections zeroed, so the untrained head predicts "the same feature again" and each branch
    starts from weights that already read this model's features.

    Only what the target names and shapes as Llama does is copied. The rest keeps its random
    start (biases 0): Phi-3's fused projections, GPT-2's blocks, and Gemma's norms, which scale
    by one plus their weight and sit elsewhere in the layer."""
    last = last_layer(target)
    layer = head.layers[0]
    for name in ("self_attn", "mlp", "post_attention_layernorm"):
        source = getattr(last, name, None)
        gemma_norm = name.endswith("layernorm") and type(source).__name__.startswith("Gemma")
        target_part = source.state_dict() if source is not None and not gemma_norm else {}
        with torch.no_grad():
            for key, value in getattr(layer, name).state_dict().items():
                if key in target_part and target_part[key].shape == value.shape:
                    value.copy_(target_part[key])
                elif key.endswith("bias"):  # e.g. Qwen2 has no o_proj bias
                    value.zero_()
    hidden = head.config.hidden_size
    with torch.no_grad():
        layer.self_attn.o_proj.weight.zero_()
        layer.mlp.down_proj.weight.zero_()
        head.fc.weight.normal_(0.0, 0.02)
        head.fc.weight[:, hidden:].copy_(torch.eye(hidden))
        if head.fc.bias is not None:
            head.fc.bias.zero_()


def check_matches(config: LlamaConfig, target: PreTrainedModel, where: Path | str) -> None:
    tc = target.config
    if config.hidden_size != tc.hidden_size:
        raise NgspecError(f"EAGLE head {where} has hidden size {config.hidden_size}, the model has {tc.hidden_size}")
    if config.vocab_size != tc.vocab_size:
        raise NgspecError(f"EAGLE head {where} has a {config.vocab_size}-token vocabulary, the model has {tc.vocab_size}")


def save_head(head: EagleHead, directory: Path) -> None:
    """Write ``config.json`` and ``model.safetensors`` in the public EAGLE-1 layout."""
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    config = head.config.to_dict()
    config.update({"architectures": ["LlamaForCausalLM"], "bias": head.fc.bias is not None, "ngspec_eagle": 1})
    state = {k: v.detach().contiguous().cpu() for k, v in head.state_dict().items() if not k.startswith("rotary.")}
    staging.write_text(directory / "config.json", json.dumps(config, indent=2, default=str))
    with staging.staged_file(directory / "model.safetensors") as tmp:
        save_file(state, str(tmp))


DRAFT_VOCAB = "draft_vocab.json"
SAVED = ("config.json", "model.safetensors", DRAFT_VOCAB)  # what `save_head` and `save_draft_vocab` write


def ranked_tokens(responses: Iterable[Sequence[int]], prior: Mapping[int, int] | None = None) -> list[tuple[int, int]]:
    """(token, count) over ``responses`` plus ``prior`` counts (a head being fine-tuned keeps the
    vocabulary of its first corpus), most frequent first (ties by first appearance)."""
    counts = Counter(int(t) for r in responses for t in r)
    counts.update(prior or {})
    return counts.most_common()


def save_draft_vocab(directory: Path, responses: Iterable[Sequence[int]], prior: Mapping[int, int] | None = None) -> None:
    """Write the tokens of the training responses, most frequent first, with their counts: the
    drafter can restrict the LM head to the top ones (``--draft-vocab N``), which on a CPU is most
    of EAGLE's drafting time (every depth reads the whole LM-head matrix otherwise)."""
    ranked = ranked_tokens(responses, prior)
    staging.write_text(directory / DRAFT_VOCAB, json.dumps({"ids": [t for t, _ in ranked], "counts": [c for _, c in ranked]}))


def draft_vocab_counts(directory: Path) -> dict[int, int] | None:
    """The head's draft vocabulary as {token: count in its training responses}, most frequent
    first (None when it has none)."""
    path = Path(directory) / DRAFT_VOCAB
    if not path.is_file():
        return None
    try:
        raw = json.loads(path.read_text())
        if not isinstance(raw, dict) or not isinstance(raw.get("ids"), list) or not isinstance(raw.get("counts", []), list):
            raise ValueError("expected an object with an 'ids' list and a 'counts' list")
        ids = [int(t) for t in raw["ids"]]
        counts = [int(c) for c in raw.get("counts", [1] * len(ids))]
        if len(counts) != len(ids):
            raise ValueError(f"{len(ids)} ids but {len(counts)} counts")
    except (json.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError, UnicodeDecodeError) as exc:
        raise NgspecError(f"{path} is damaged ({exc}); delete it to draft over the whole vocabulary") from None
    return dict(zip(ids, counts))


def load_draft_vocab(directory: Path) -> list[int] | None:
    """Token ids of the head's draft vocabulary, most frequent first (None when it has none)."""
    counts = draft_vocab_counts(directory)
    return None if counts is None else list(counts)


def _read_weights(directory: Path) -> dict[str, torch.Tensor]:
    for name in WEIGHTS:
        path = directory / name
        if not path.is_file():
            continue
        try:
            if name.endswith(".safetensors"):
                from safetensors.torch import load_file

                return load_file(str(path))
            return torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:  # truncated or foreign files raise many kinds of errors
            raise NgspecError(f"cannot read {path}: it is damaged, cut short or not a weights file ({first_sentence(exc)}); "
                              "copy the head again, or train one with `ngspec train-eagle`") from None
    raise NgspecError(f"no weights in {directory}: expected one of {', '.join(WEIGHTS)}")


def head_config(directory: Path, raw: dict, ignored: tuple[str, ...] = ()) -> LlamaConfig:
    """The Llama config of a one-layer head from its ``config.json`` (``ignored`` keys dropped, and
    its dtype: a head takes its target's, and a name torch lacks failed in Python's words)."""
    dropped = ("architectures", "model_type", "dtype", "torch_dtype", *ignored)
    known = {k: v for k, v in raw.items() if not k.startswith("_") and k not in dropped}
    problem = field_problem(known, "config.json")  # LlamaConfig would fail on it in Python's words
    if problem:
        raise NgspecError(f"{directory}/config.json is not a Llama-style head config ({problem})")
    try:
        config = LlamaConfig(**known)
    except CONFIG_ERRORS as exc:
        raise NgspecError(f"{directory}/config.json is not a Llama-style head config ({config_error_message(exc)})") from None
    problem = config_problem(config)  # its sizes and activation, as a model's config is checked
    if problem:
        raise NgspecError(f"{directory}/config.json is not a Llama-style head config (it gives {problem})")
    config.num_hidden_layers = 1
    return config


def checked_state(head: nn.Module, weights: dict[str, torch.Tensor], directory: Path, kind: str) -> dict[str, torch.Tensor]:
    """``weights`` without the entries heads never use (embeddings, rotary buffers), refused with
    the reason when names or shapes differ from ``head``'s, in ``head``'s dtypes."""
    state = {k: v for k, v in weights.items() if not k.startswith("embed_tokens.") and not k.startswith("rotary.")}
    expected = {k: v for k, v in head.state_dict().items() if not k.startswith("rotary.")}
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        raise NgspecError(
            f"{directory} is not an {kind} head: "
            + (f"missing {', '.join(missing[:4])}" if missing else "")
            + ("; " if missing and unexpected else "")
            + (f"unexpected {', '.join(unexpected[:4])}" if unexpected else "")
        )
    for key, tensor in state.items():
        if tensor.shape != expected[key].shape:
            raise NgspecError(f"{directory}: {key} has shape {tuple(tensor.shape)}, expected {tuple(expected[key].shape)}")
    return {k: v.to(expected[k].dtype) for k, v in state.items()}


def load_head(directory: Path, target: PreTrainedModel):
    """Read an EAGLE-1 or EAGLE-3 head in the public layout and check that it fits ``target``."""
    directory = Path(directory)
    if not directory.is_dir():
        raise NgspecError(f"no EAGLE head directory at {directory}")
    refuse_directories(directory, ("config.json", *WEIGHTS), "copy the head again, or train one with `ngspec train-eagle`")
    try:
        raw = json.loads((directory / "config.json").read_text())
    except FileNotFoundError:
        raise NgspecError(f"{directory} has no config.json; an EAGLE head directory holds config.json and its weights") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise NgspecError(f"{directory}/config.json is damaged ({json_text_problem(exc)})") from None
    if not isinstance(raw, dict):
        raise NgspecError(f"{directory}/config.json must hold a JSON object (a head's config), not {short(raw)}")
    weights = _read_weights(directory)
    from ngspec.eagle.head3 import build_eagle3, is_eagle3

    if is_eagle3(weights, raw):
        return build_eagle3(directory, raw, weights, target)
    config = head_config(directory, raw, ("bias", "ngspec_eagle"))
    check_matches(config, target, directory)
    head = EagleHead(config, bias="fc.bias" in weights)
    state = checked_state(head, weights, directory, "EAGLE-1")
    head.load_state_dict(state, strict=False)
    param = next(target.parameters())
    return head.to(device=param.device, dtype=param.dtype).eval()
