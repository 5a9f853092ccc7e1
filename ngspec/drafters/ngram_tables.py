"""Model-derived n-gram tables of the learning-free n-gram paper, built once per model and cached.

* **unigram**: every token scored by the distance of its output embedding ``u_y`` from the mean
  output embedding, measured under the input-embedding covariance Σ:
  ``(u_y − ū)ᵀ Σ (u_y − ū)``. For hidden states spread like the input embeddings, ``log E[exp(h·u)]``
  grows with this quadratic form, so high scores are the tokens the model favours absent context.
  Stored as the ids ranked best first.
* **bigram**: the top-K next tokens of ``p_M(· | x)`` for every token x (batched one-token forward
  passes). A lone token at position 0 is out of distribution for models without a BOS token (the
  default SmolLM2 then predicts "-" or "," after every token), so x follows a short anchor: the
  chat template's assistant header for chat models (the context responses are written in), else
  the BOS token, else nothing.
* **extended bigram**: for every x and each of its top-K first steps, the chain continued greedily
  with the bigram's top-1 to W tokens, stored as a ``[V, K, W]`` lookup table.

Cached under ``$NGSPEC_CACHE/ngram/<fingerprint>.npz``; the fingerprint hashes the model's config
and a sample of its embedding and LM-head weights (and the anchor), so a table is never used with
another model.
"""

from __future__ import annotations

import hashlib
import json
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from transformers import PreTrainedModel

from ngspec import staging
from ngspec.architecture import sliding_window
from ngspec.errors import NgspecError, env_switch, first_sentence
from ngspec.kv import cache_argument, make_cache
from ngspec.rows import forward_rows

TABLE_FORMAT = 1
TOP_K = 16  # bigram continuations kept per token
WIDTH = 16  # extended-bigram chain length
UNIGRAM_KEEP = 1024  # ranked unigram ids kept


def table_anchor(tokenizer) -> list[int]:
    """Tokens placed before x when computing ``p_M(· | x)``: the chat template's generation prompt
    (e.g. ``<|im_start|>assistant\n``), else BOS, else none."""
    if tokenizer is None:
        return []
    if getattr(tokenizer, "chat_template", None):
        try:
            turn = [{"role": "user", "content": "x"}]
            with_header = tokenizer.apply_chat_template(turn, add_generation_prompt=True, tokenize=False)
            without = tokenizer.apply_chat_template(turn, add_generation_prompt=False, tokenize=False)
            if with_header.startswith(without) and len(with_header) > len(without):
                return list(tokenizer.encode(with_header[len(without) :], add_special_tokens=False))
        except Exception:  # a template that needs more than one user turn: fall back to BOS
            pass
    bos = getattr(tokenizer, "bos_token_id", None)
    return [int(bos)] if bos is not None else []


def model_fingerprint(model: PreTrainedModel, anchor: list[int] | None = None) -> str:
    """Hash of the config, a strided sample of the embedding and LM-head weights, and the anchor."""
    digest = hashlib.sha256()
    digest.update(json.dumps(list(anchor or [])).encode())
    config = {k: v for k, v in model.config.to_dict().items() if not k.startswith("_") and k not in ("dtype", "torch_dtype")}
    digest.update(json.dumps(config, sort_keys=True, default=str).encode())
    for weight in (model.get_input_embeddings().weight, model.get_output_embeddings().weight):
        flat = weight.detach().reshape(-1)
        sample = flat[:: max(1, flat.numel() // 65536)][:65536].float().cpu().numpy()
        digest.update(np.round(sample, 4).tobytes())  # robust to dtype round-off across devices
    return digest.hexdigest()[:24]


@dataclass(frozen=True)
class NgramTables:
    fingerprint: str
    unigram: np.ndarray  # [UNIGRAM_KEEP] token ids, best first
    bigram: np.ndarray  # [V, K] top-K next tokens per token, best first
    extended: np.ndarray  # [V, K, W] chains: extended[x, j] starts with bigram[x, j]
    anchor: list[int] | None = None  # the tokens each x followed (None: a file from before they were recorded)

    @property
    def vocab_size(self) -> int:
        return int(self.bigram.shape[0])

    def chain(self, first: int, length: int) -> list[int]:
        """``first`` followed by its greedy bigram chain, ``length`` tokens in all."""
        if length <= 0:
            return []
        return [int(first), *(int(t) for t in self.extended[first, 0, : length - 1])]


def unigram_ranking(model: PreTrainedModel, keep: int = UNIGRAM_KEEP) -> np.ndarray:
    inp = model.get_input_embeddings().weight.detach().float().cpu()
    out = model.get_output_embeddings().weight.detach().float().cpu()
    sigma = torch.cov(inp.T)  # [H, H] covariance of the input embeddings
    centred = out - out.mean(0)
    score = ((centred @ sigma) * centred).sum(-1)
    return torch.argsort(score, descending=True)[:keep].numpy().astype(np.int64)


@torch.inference_mode()
def bigram_topk(
    model: PreTrainedModel,
    top_k: int = TOP_K,
    batch_size: int = 512,
    progress: Callable[[int, int], None] | None = None,
    anchor: list[int] | None = None,
) -> np.ndarray:
    """Top-K next tokens after each single token (placed after ``anchor``), ``[V, K]``."""
    vocab = int(model.get_output_embeddings().weight.shape[0])
    device = next(model.parameters()).device
    top_k = min(top_k, vocab)
    table = np.zeros((vocab, top_k), dtype=np.int64)
    prefix = None
    if anchor and sliding_window(model) is None:  # the anchor's cache is computed once and shared
        prefix = make_cache(model.config, capacity=len(anchor))
        model(input_ids=torch.tensor([list(anchor)], device=device), **cache_argument(model, prefix), use_cache=True)
    for start in range(0, vocab, batch_size):
        ids = torch.arange(start, min(start + batch_size, vocab), device=device)[:, None]
        if prefix is not None:
            logits = forward_rows(model, prefix, ids)[0].logits[:, -1]
        else:
            if anchor:
                ids = torch.cat([torch.tensor([list(anchor)], device=device).expand(len(ids), -1), ids], dim=1)
            logits = model(input_ids=ids, use_cache=False, logits_to_keep=1).logits[:, -1]
        table[start : start + len(ids)] = torch.topk(logits.float(), top_k, dim=-1).indices.cpu().numpy()
        if progress:
            progress(min(start + batch_size, vocab), vocab)
    return table


def extend(bigram: np.ndarray, width: int = WIDTH) -> np.ndarray:
    """``[V, K, W]``: each top-K first step followed greedily by the top-1 bigram."""
    chains = np.empty((*bigram.shape, width), dtype=bigram.dtype)
    current = bigram
    chains[:, :, 0] = current
    for i in range(1, width):
        current = bigram[current, 0]
        chains[:, :, i] = current
    return chains


def build_tables(model: PreTrainedModel, anchor: list[int] | None = None, batch_size: int = 512, progress=None) -> NgramTables:
    bigram = bigram_topk(model, TOP_K, batch_size, progress, anchor)
    return NgramTables(model_fingerprint(model, anchor), unigram_ranking(model), bigram, extend(bigram), list(anchor or []))


def _narrow(a: np.ndarray, vocab: int) -> np.ndarray:
    return a.astype(np.uint16 if vocab <= 65536 else np.uint32)


def save_tables(tables: NgramTables, path: Path, model_name: str) -> None:
    """Write whole to a temporary file, then rename (an interrupted build leaves nothing)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    meta = {"format": TABLE_FORMAT, "fingerprint": tables.fingerprint, "model": model_name, "vocab_size": tables.vocab_size}
    if tables.anchor is not None:
        meta["anchor"] = [int(t) for t in tables.anchor]
    with staging.staged_file(path) as tmp, open(tmp, "wb") as fh:
        np.savez(
            fh,
            meta=np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8),
            unigram=_narrow(tables.unigram, tables.vocab_size),
            bigram=_narrow(tables.bigram, tables.vocab_size),
            extended=_narrow(tables.extended, tables.vocab_size),
        )


def _damage(path: Path, exc: Exception) -> str:
    """What is wrong with a table file, in words: it said only the exception's class ("ValueError",
    "BadZipFile", "EOFError"), and numpy reads a file that is no archive as a pickle."""
    with open(path, "rb") as f:
        start = f.read(4)
    if not start:
        return "it is empty"
    if start != b"PK\x03\x04":
        return "not a .npz archive"
    if isinstance(exc, KeyError):
        return f"no {exc.args[0].split()[0] if exc.args and isinstance(exc.args[0], str) else exc} array in it"
    if isinstance(exc, (json.JSONDecodeError, UnicodeDecodeError)):
        return "its meta entry is not JSON text"
    if isinstance(exc, (zipfile.BadZipFile, EOFError)):
        return "the archive is cut short or damaged"  # zipfile says "File is not a zip file" of one cut short
    return first_sentence(exc)


def load_tables(
    path: Path, fingerprint: str | None = None, vocab_size: int | None = None, fingerprint_after: Callable[[list[int]], str] | None = None
) -> NgramTables:
    """Read tables; refuse a damaged file or one made for another model (by fingerprint) or
    vocabulary. ``fingerprint_after(anchor)``: this model's fingerprint after another anchor, to
    tell a table built for this model after other tokens (read with or without its tokenizer)
    from one built for another model."""
    try:
        with np.load(path) as data:
            meta = json.loads(bytes(data["meta"]).decode())
            arrays = {k: data[k].astype(np.int64) for k in ("unigram", "bigram", "extended")}
    except FileNotFoundError:
        raise NgspecError(f"no n-gram tables at {path}: build them with `ngspec build-bigram --out {path}`") from None
    except IsADirectoryError:
        raise NgspecError(f"{path} is a directory; give the table file `ngspec build-bigram --out` writes") from None
    except (OSError, ValueError, KeyError, zipfile.BadZipFile, EOFError) as exc:  # JSON and codec errors are ValueErrors
        raise NgspecError(f"{path} is a damaged n-gram table file ({_damage(path, exc)}); rebuild it with `ngspec build-bigram`") from None
    if meta.get("format") != TABLE_FORMAT:
        raise NgspecError(f"{path} has table format {meta.get('format')}; this ngspec reads {TABLE_FORMAT}: rebuild it")
    bigram, extended = arrays["bigram"], arrays["extended"]
    if bigram.ndim != 2 or extended.shape[:2] != bigram.shape or int(meta.get("vocab_size", -1)) != bigram.shape[0]:
        raise NgspecError(f"{path} is a damaged n-gram table file (inconsistent shapes); rebuild it")
    if vocab_size is not None and bigram.shape[0] != vocab_size:
        raise NgspecError(f"{path} was built for a {bigram.shape[0]}-token vocabulary, but this model has {vocab_size}")
    anchor = meta.get("anchor")
    if anchor is not None and not (isinstance(anchor, list) and all(type(t) is int and 0 <= t < bigram.shape[0] for t in anchor)):
        raise NgspecError(f"{path} is a damaged n-gram table file (its anchor is not a list of token ids); rebuild it")
    if fingerprint is not None and meta.get("fingerprint") != fingerprint:
        if anchor is not None and fingerprint_after is not None and fingerprint_after(anchor) == meta.get("fingerprint"):
            raise NgspecError(
                f"{path} was built for this model read with a tokenizer (each token's next tokens measured after the tokens "
                f"{anchor}: its assistant header or BOS); here the model has no tokenizer or another one, so the table does not "
                "apply: give the model that tokenizer, or leave out --bigram-table (bigram_table=) and ngspec builds one for it as given"
            )
        raise NgspecError(
            f"{path} was built for another model ({meta.get('model')}, fingerprint {meta.get('fingerprint')}); "
            "rebuild it for this one with `ngspec build-bigram`"
        )
    if bigram.size and (bigram.max() >= bigram.shape[0] or extended.max() >= bigram.shape[0]):
        raise NgspecError(f"{path} is a damaged n-gram table file (token ids out of range); rebuild it")
    return NgramTables(str(meta["fingerprint"]), arrays["unigram"], bigram, extended, anchor)


def default_table_path(fingerprint: str) -> Path:
    from ngspec.models import cache_dir

    return cache_dir() / "ngram" / f"{fingerprint}.npz"


def cached_tables(
    model: PreTrainedModel,
    model_name: str,
    anchor: list[int] | None = None,
    path: Path | None = None,
    progress: Callable[[int, int], None] | None = None,
    notify: Callable[[str], None] | None = None,
) -> NgramTables:
    """Tables for ``model``: read from ``path`` (default: the cache, keyed by fingerprint), built
    and saved when the default cache entry is missing or damaged. An explicit ``path`` that does not
    match the model is refused, never silently replaced."""
    vocab = int(model.get_output_embeddings().weight.shape[0])
    fingerprint = model_fingerprint(model, anchor)
    if path is not None:
        return load_tables(path, fingerprint, vocab, lambda other: model_fingerprint(model, other))
    path = default_table_path(fingerprint)
    if path.is_file() and not env_switch("NGSPEC_REBUILD_TABLES"):
        try:
            return load_tables(path, fingerprint, vocab)
        except NgspecError as exc:
            if notify:
                notify(f"{exc}: rebuilding")
    tables = build_tables(model, anchor, progress=progress)
    staging.keep_in_cache(path, lambda out: save_tables(tables, out, model_name), "the n-gram tables")
    return tables
