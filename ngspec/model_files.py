"""Checks of the files a model directory holds, before transformers reads them.

transformers fails on a damaged or hand-edited file with a Python error that names neither the
file nor the field ("'int' object is not a mapping", "'int' object has no attribute 'items'",
"unhashable type: 'list'", a codec error). `check_model_files` refuses such a file first, naming
both. Fields transformers checks itself are left to it; `ngspec.models.config_error_message` words
its refusals.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from ngspec.errors import NULL, NgspecError, json_kinds, json_text_problem, short

# what transformers reads from a model directory as JSON objects, and as text
MODEL_JSON_FILES = ("config.json", "generation_config.json", "tokenizer_config.json", "tokenizer.json", "special_tokens_map.json")
MODEL_TEXT_FILES = ("chat_template.jinja",)
MODEL_WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")

MORE_TOKENS = ("extra_special_tokens", "additional_special_tokens")  # a list of tokens, or an object of named ones
SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token")
# JSON types of the fields transformers (or ngspec's EOS lookup) reads without checking them; each
# other type was found to end in a Python error by editing the default model's files
FIELD_TYPES: dict[str, dict[str, tuple[type, ...]]] = {
    "config.json": {
        "model_type": (str,), "id2label": (dict, NULL), "num_labels": (int,), "dtype": (str, dict, NULL), "torch_dtype": (str, dict, NULL),
        "quantization_config": (dict, NULL), "auto_map": (dict,), "layer_types": (list, NULL),
    },
    "generation_config.json": {"eos_token_id": (int, list, NULL), "pad_token_id": (int, NULL)},
    "tokenizer_config.json": {
        "tokenizer_class": (str, NULL), "model_max_length": (int, float, NULL), "added_tokens_decoder": (dict,),
        "model_input_names": (list,), "auto_map": (dict, list), **{name: (str, dict, NULL) for name in SPECIAL_TOKENS},
        **{name: (list, dict, NULL) for name in MORE_TOKENS},
    },
    "special_tokens_map.json": {
        **{name: (str, dict, NULL) for name in SPECIAL_TOKENS}, "extra_special_tokens": (list, dict, NULL), "additional_special_tokens": (list, NULL),
    },
    "tokenizer.json": {"version": (str,), "added_tokens": (list,), "model": (dict,), **{part: (dict, NULL) for part in ("normalizer", "pre_tokenizer", "post_processor", "decoder", "truncation", "padding")}},
}


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_token(value: object) -> bool:
    """An added token as transformers saves it: an object with its text as "content"."""
    return isinstance(value, dict) and isinstance(value.get("content"), str)


def _wrong(entries, fits) -> list:
    """The first of ``entries`` that does not ``fits``, in a list (empty when all fit): a wrong
    entry may be null, so None cannot also mean that none was found."""
    return [entry for entry in entries if not fits(entry)][:1]


def _torch_dtype(name: str) -> bool:
    import torch

    return isinstance(getattr(torch, name, None), torch.dtype)


def _entries_problem(name: str, key: str, value: object) -> str | None:
    """What is wrong inside field ``key`` of file ``name`` when its own JSON type is right (None
    when nothing is)."""
    if key in SPECIAL_TOKENS and isinstance(value, dict):
        if name == "tokenizer_config.json" and not (_is_token(value) and value.get("__type") == "AddedToken"):
            return f'{key} as a JSON object must be an AddedToken ({{"__type": "AddedToken", "content": ...}}), not {short(value)}'
        if not _is_token(value):  # special_tokens_map.json takes one without its "__type"
            return f'{key} as a JSON object must give the token\'s "content" string, not {short(value)}'
    if key in MORE_TOKENS and isinstance(value, (list, dict)):
        entries = value.values() if isinstance(value, dict) else value
        if wrong := _wrong(entries, lambda entry: isinstance(entry, (str, dict))):  # transformers: "Special token a has to be either str or AddedToken but got: <class 'int'>"
            return f"each entry of {key} must be a string or a token's JSON object, not {short(wrong[0])}"
        named = value.values() if isinstance(value, dict) else ()  # named tokens as objects are read only as AddedTokens
        if wrong := _wrong(named, lambda entry: not isinstance(entry, dict) or entry.get("__type") == "AddedToken"):
            return f'each token named in {key} must be a string or an AddedToken ({{"__type": "AddedToken", "content": ...}}), not {short(wrong[0])}'
    if key in ("id2label", "added_tokens_decoder") and isinstance(value, dict):
        for index in value:  # transformers turns them into ints
            if not re.fullmatch(r"\s*-?\d+\s*", index):
                return f"{key}'s keys must be whole numbers (ids), not {short(index)}"
    if key == "added_tokens_decoder" and isinstance(value, dict):
        if wrong := _wrong(value.values(), _is_token):
            return f'each entry of {key} must be a JSON object with the token\'s "content" string, not {short(wrong[0])}'
    if key == "added_tokens" and isinstance(value, list):
        if wrong := _wrong(value, lambda entry: _is_token(entry) and _whole(entry.get("id"))):
            return f'each entry of {key} must be a JSON object with its "id" number and "content" string, not {short(wrong[0])}'
    if key in ("dtype", "torch_dtype") and isinstance(value, str) and not _torch_dtype(value):  # transformers: getattr(torch, value)
        return f"{key} must name a torch dtype (float32, bfloat16, float16, ...), not {short(value)}"
    if key == "auto_map" and isinstance(value, list) and not (  # a tokenizer's (slow, fast) classes
            len(value) == 2 and all(isinstance(v, (str, NULL)) for v in value) and any(isinstance(v, str) for v in value)):
        return f"{key} as a list must name the tokenizer's two classes (slow, fast; one may be null), not {short(value)}"
    if key == "eos_token_id" and isinstance(value, list):
        if wrong := _wrong(value, _whole):
            return f"each entry of {key} must be a whole number, not {short(wrong[0])}"
    return None


# fields transformers reads from a file without checking that they are there (a tokenizer.json
# without added_tokens raised KeyError: 'added_tokens', shown as "... of 'm': 'added_tokens'")
REQUIRED_FIELDS = {"tokenizer.json": ("added_tokens", "model")}


def field_problem(doc: dict, name: str) -> str | None:
    """The first field of ``doc``, the content of a file ``name`` ("config.json"), that is missing
    where `REQUIRED_FIELDS` needs it or is not of a JSON type `FIELD_TYPES` allows, or holds entries
    of another, in words ("id2label must be a JSON object or null, not 5"); None when all are right."""
    missing = [key for key in REQUIRED_FIELDS.get(name, ()) if key not in doc]
    if missing:
        return f"no {missing[0]} field"
    for key, allowed in FIELD_TYPES.get(name, {}).items():
        if key not in doc:
            continue
        value = doc[key]
        if not isinstance(value, allowed) or (isinstance(value, bool) and bool not in allowed):
            return f"{key} must be {json_kinds(allowed)}, not {short(value)}"
        problem = _entries_problem(name, key, value)
        if problem:
            return problem
    return None


def refuse_directories(directory: Path, names: tuple[str, ...], remedy: str) -> None:
    """Refuse a directory where a file of ``names`` belongs: transformers reported one as missing
    ("no file named model.safetensors ... found") or failed on it with a message about converting
    tokenizers, and Python's reader as "Is a directory"."""
    for name in names:
        if (directory / name).is_dir():
            raise NgspecError(f"{directory / name} is a directory, not a file; {remedy}")


def check_weights(directory: Path) -> None:
    """Refuse a model directory that holds none of `MODEL_WEIGHT_FILES`, naming the weight-like
    files it does hold (transformers said "Error no file named model.safetensors, or
    pytorch_model.bin, found in directory m.")."""
    if any((directory / name).is_file() for name in MODEL_WEIGHT_FILES):
        return
    others = sorted(p.name for p in directory.iterdir() if p.is_file() and p.suffix.lower() in (".safetensors", ".bin", ".gguf", ".pt", ".pth", ".h5", ".msgpack"))
    held = f"; it holds {', '.join(others)}" if others else ""
    if len(others) == 1 and others[0].lower().endswith(".gguf"):
        held += ": give that file itself as --model"
    raise NgspecError(f"{directory} holds no model weights (model.safetensors, pytorch_model.bin, or a sharded model's index of them){held}; "
                      "copy them again from the model's source")


def check_model_files(directory: Path) -> None:
    """Refuse a directory in place of a file a model directory holds, and a file
    (`MODEL_JSON_FILES`, `MODEL_TEXT_FILES`) that is not UTF-8 text, or not a JSON object, or gives
    a field of `FIELD_TYPES` another type, naming it."""
    refuse_directories(directory, MODEL_JSON_FILES + MODEL_TEXT_FILES + MODEL_WEIGHT_FILES, "copy it again from the model's source")
    for name in MODEL_JSON_FILES + MODEL_TEXT_FILES:
        path = directory / name
        if not path.is_file():
            continue
        try:
            text = path.read_text(encoding="utf-8")
            if name in MODEL_TEXT_FILES:
                continue
            doc = json.loads(text)
            problem = field_problem(doc, name) if isinstance(doc, dict) else f"not a JSON object: {text.strip()[:40]}"
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            problem = json_text_problem(exc)
        if problem:
            raise NgspecError(f"{path} is damaged ({problem}); copy it again from the model's source")
