"""The on-disk datastore format (version 1): a directory of three files.

- ``tokens.npy``: every document's token ids, one after another, each followed by a separator id
  that no tokenizer produces (the dtype's maximum), so no match can cross a document boundary.
  The dtype is ``uint16`` when every id and the separator fit (vocabulary <= 65,535), else ``uint32``:
  never truncated.
- ``sa.npy``: the suffix array of ``tokens`` (int32 below 2**31 tokens, else int64), built by
  pydivsufsort.
- ``meta.json``: format version, tokenizer name and fingerprint, vocabulary size, source, record,
  document and token counts, build options, creation time and build seconds.

Both arrays are memory-mapped when opened. A directory is written under a temporary name and
renamed when complete, so an interrupted build leaves nothing behind.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from ngspec.errors import NgspecError

FORMAT_VERSION = 1
FILES = ("tokens.npy", "sa.npy", "meta.json")


@dataclass(frozen=True)
class DatastoreMeta:
    tokenizer_name: str
    tokenizer_fingerprint: str
    vocab_size: int
    source: str
    records: int
    documents: int
    tokens: int  # real tokens, separators excluded
    token_dtype: str
    separator: int
    build_options: dict = field(default_factory=dict)
    created: str = ""
    build_seconds: float = 0.0
    format_version: int = FORMAT_VERSION


def token_dtype(vocab_size: int) -> np.dtype:
    """The narrowest unsigned dtype holding every id and a separator above them."""
    return np.dtype(np.uint16) if vocab_size < np.iinfo(np.uint16).max else np.dtype(np.uint32)


def pack_documents(docs: list[list[int]], dtype: np.dtype) -> np.ndarray:
    """Documents' token ids, each followed by the separator (the dtype's maximum)."""
    sep = int(np.iinfo(dtype).max)
    flat = np.fromiter((t for doc in docs for t in (*doc, sep)), dtype=np.int64)
    if len(flat) and flat.max() > sep:
        raise NgspecError("token ids exceed the datastore's id range")
    return flat.astype(dtype)


def tokenizer_fingerprint(tokenizer) -> str:
    """A hash of the vocabulary (token -> id) and special tokens: equal only for equal tokenizers."""
    vocab = sorted(tokenizer.get_vocab().items())
    special = sorted(str(t) for t in getattr(tokenizer, "all_special_tokens", []))
    payload = json.dumps([vocab, special], ensure_ascii=False).encode("utf-8")
    return hashlib.sha256(payload).hexdigest()[:32]


def write_datastore(directory: Path, tokens: np.ndarray, suffix_array: np.ndarray, meta: DatastoreMeta) -> None:
    np.save(directory / "tokens.npy", tokens, allow_pickle=False)
    np.save(directory / "sa.npy", suffix_array, allow_pickle=False)
    (directory / "meta.json").write_text(json.dumps(asdict(meta), indent=2))


def read_meta(path: Path) -> DatastoreMeta:
    path = Path(path)
    if not path.is_dir():
        raise NgspecError(f"datastore not found: {path}")
    missing = [f for f in FILES if not (path / f).is_file()]
    if missing:
        raise NgspecError(f"{path} is not a complete datastore (missing {', '.join(missing)})")
    try:
        raw = json.loads((path / "meta.json").read_text())
        meta = DatastoreMeta(**raw)
    except (json.JSONDecodeError, TypeError) as exc:
        raise NgspecError(f"{path}/meta.json is corrupt: {exc}") from exc
    if meta.format_version != FORMAT_VERSION:
        raise NgspecError(f"{path} has datastore format {meta.format_version}; this ngspec reads {FORMAT_VERSION}")
    return meta


def load_arrays(path: Path, meta: DatastoreMeta) -> tuple[np.ndarray, np.ndarray]:
    """Memory-map ``tokens`` and ``sa`` and check they agree with the metadata."""
    try:
        tokens = np.load(path / "tokens.npy", mmap_mode="r", allow_pickle=False)
        sa = np.load(path / "sa.npy", mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError) as exc:
        raise NgspecError(f"{path} has a corrupt or truncated array file: {exc}") from exc
    expected = meta.tokens + meta.documents
    if tokens.ndim != 1 or len(tokens) != expected or str(tokens.dtype) != meta.token_dtype:
        raise NgspecError(f"{path}/tokens.npy does not match meta.json (corrupt or truncated)")
    if sa.ndim != 1 or len(sa) != len(tokens):
        raise NgspecError(f"{path}/sa.npy does not match tokens.npy (corrupt or truncated)")
    return tokens, sa
