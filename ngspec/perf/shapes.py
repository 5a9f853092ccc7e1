"""Named model architectures with random weights, for timing without a download.

A forward pass costs the same whatever the weights are, so `profile-bound --shape llama-7b` builds
the architecture from its published config and fills it with random values. Any transformers
``config.json`` works too (``--shape path/to/config.json`` or a directory holding one).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, PretrainedConfig, PreTrainedModel

from ngspec.errors import NgspecError, json_text_problem
from ngspec.model_files import field_problem
from ngspec.models import CONFIG_ERRORS, check_config, config_error_message

# the published configs, reduced to what sets the cost of a forward pass
SHAPES: dict[str, dict] = {
    "smollm2-135m": dict(model_type="llama", hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                         num_attention_heads=9, num_key_value_heads=3, vocab_size=49152,
                         max_position_embeddings=8192, tie_word_embeddings=True, rope_theta=100000.0),
    "llama-7b": dict(model_type="llama", hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                     num_attention_heads=32, num_key_value_heads=32, vocab_size=32000,
                     max_position_embeddings=4096, tie_word_embeddings=False),
    "mistral-7b": dict(model_type="mistral", hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                       num_attention_heads=32, num_key_value_heads=8, vocab_size=32000,
                       max_position_embeddings=32768, tie_word_embeddings=False, sliding_window=None,
                       rope_theta=1000000.0),
    "llama3-8b": dict(model_type="llama", hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                      num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
                      max_position_embeddings=8192, tie_word_embeddings=False, rope_theta=500000.0),
}


def shape_config(shape: str) -> tuple[str, PretrainedConfig]:
    """(display name, config) for a named shape or a config file/directory."""
    if shape in SHAPES:
        values = dict(SHAPES[shape])
        return shape, AutoConfig.for_model(values.pop("model_type"), **values)
    path = Path(shape)
    if path.is_dir():
        path = path / "config.json"
    if path.suffix.lower() != ".json" or not path.is_file():
        raise NgspecError(f"unknown shape {shape!r}: use one of {', '.join(SHAPES)} or a config.json path")
    try:
        values = json.loads(path.read_text())
        problem = field_problem(values, "config.json") if isinstance(values, dict) else "not a JSON object"
        if problem:
            raise NgspecError(f"cannot read a transformers config from {path}: {problem}")
        model_type = values.pop("model_type")
        config = AutoConfig.for_model(model_type, **values)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise NgspecError(f"cannot read a transformers config from {path}: {json_text_problem(exc)}") from exc
    except KeyError as exc:
        raise NgspecError(f"cannot read a transformers config from {path}: no {exc}") from exc
    except CONFIG_ERRORS as exc:  # transformers' own validation: a size of another type, heads that do not divide
        raise NgspecError(f"cannot read a transformers config from {path}: {config_error_message(exc)}") from exc
    check_config(config, f"shape {str(path)!r}")
    return path.parent.name or path.stem, config


def parameter_count(config: PretrainedConfig) -> int:
    """Parameters of a Llama-style decoder (embeddings counted once when tied)."""
    hidden, inter, layers = config.hidden_size, config.intermediate_size, config.num_hidden_layers
    head_dim = getattr(config, "head_dim", None) or hidden // config.num_attention_heads
    attn = hidden * head_dim * (2 * config.num_attention_heads + 2 * config.num_key_value_heads)
    mlp = 3 * hidden * inter
    norms = 2 * hidden
    embed = config.vocab_size * hidden
    lm_head = 0 if getattr(config, "tie_word_embeddings", False) else embed
    return layers * (attn + mlp + norms) + hidden + embed + lm_head


def random_model(config: PretrainedConfig, device: torch.device, dtype: torch.dtype) -> PreTrainedModel:
    """The architecture with random weights, built directly on ``device``."""
    need = parameter_count(config) * torch.finfo(dtype).bits // 8
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        available = free
    else:
        import os

        available = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
    if need > 0.9 * available:
        raise NgspecError(
            f"the {need / 2**30:.1f} GiB of weights do not fit in the {available / 2**30:.1f} GiB free on {device}; "
            "choose a smaller shape or dtype"
        )
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model.eval()
