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
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path

import numpy as np

from ngspec.errors import NgspecError, first_sentence, json_kinds, json_text_problem, short
from ngspec.model_files import refuse_directories

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
    refuse_directories(path, FILES, "rebuild the datastore with `ngspec build-datastore`")  # it read as "missing sa.npy"
    missing = [f for f in FILES if not (path / f).is_file()]
    if missing:
        raise NgspecError(f"{path} is not a complete datastore (missing {', '.join(missing)})")
    try:
        raw = json.loads((path / "meta.json").read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise NgspecError(f"{path}/meta.json is corrupt: {json_text_problem(exc)}") from exc
    if not isinstance(raw, dict):
        raise NgspecError(f"{path}/meta.json is corrupt: not a JSON object")
    if raw.get("format_version", FORMAT_VERSION) != FORMAT_VERSION:  # before its fields: another format has others
        raise NgspecError(f"{path} has datastore format {raw['format_version']!r}; this ngspec reads {FORMAT_VERSION}")
    names = {f.name for f in fields(DatastoreMeta)}
    missing = sorted(f.name for f in fields(DatastoreMeta) if f.name not in raw and f.default is MISSING and f.default_factory is MISSING)
    unknown = sorted(set(raw) - names)
    if missing or unknown:
        raise NgspecError(f"{path}/meta.json is corrupt: " + "; ".join(
            ([f"missing {', '.join(map(repr, missing))}"] if missing else []) + ([f"unknown {', '.join(map(repr, unknown))}"] if unknown else [])))
    meta = DatastoreMeta(**raw)
    for f in fields(DatastoreMeta):
        value = getattr(meta, f.name)
        if isinstance(value, bool) or not isinstance(value, _FIELD_TYPES[f.type]):
            raise NgspecError(f"{path}/meta.json is corrupt: '{f.name}' must be {json_kinds(_FIELD_TYPES[f.type])}, not {short(value)}")
    if meta.token_dtype not in ("uint16", "uint32"):
        raise NgspecError(f"{path}/meta.json is corrupt: 'token_dtype' must be \"uint16\" or \"uint32\", not {short(meta.token_dtype)}")
    low = [f"'{name}' is {getattr(meta, name)}" for name, least in _LEAST.items() if getattr(meta, name) < least]
    if low:
        raise NgspecError(f"{path}/meta.json is corrupt: {', '.join(low)}")
    if meta.separator != np.iinfo(meta.token_dtype).max or meta.vocab_size > meta.separator:
        raise NgspecError(f"{path}/meta.json is corrupt: separator {meta.separator} and vocab_size {meta.vocab_size} do not fit {meta.token_dtype}")
    return meta


_FIELD_TYPES = {"str": (str,), "int": (int,), "float": (int, float), "dict": (dict,)}  # DatastoreMeta's annotations
_LEAST = {"vocab_size": 1, "records": 0, "documents": 0, "tokens": 0}


def _array(file: Path) -> np.ndarray:
    with open(file, "rb") as f:
        start = f.read(6)
    # numpy takes a file without its magic bytes for a pickle, and advises loading it "unsafely"
    problem = "it is empty" if not start else None if start == b"\x93NUMPY" else "not a .npy file"
    if problem is None:
        try:
            return np.load(file, mmap_mode="r", allow_pickle=False)
        except (ValueError, OSError, EOFError) as exc:
            problem = first_sentence(exc)
    raise NgspecError(f"{file} is corrupt or truncated ({problem}); rebuild the datastore with `ngspec build-datastore`")


def load_arrays(path: Path, meta: DatastoreMeta) -> tuple[np.ndarray, np.ndarray]:
    """Memory-map ``tokens`` and ``sa`` and check they agree with the metadata."""
    tokens, sa = (_array(path / name) for name in ("tokens.npy", "sa.npy"))
    expected = meta.tokens + meta.documents
    if tokens.ndim != 1 or len(tokens) != expected or str(tokens.dtype) != meta.token_dtype:
        raise NgspecError(f"{path}/tokens.npy does not match meta.json (corrupt or truncated)")
    if sa.ndim != 1 or len(sa) != len(tokens):
        raise NgspecError(f"{path}/sa.npy does not match tokens.npy (corrupt or truncated)")
    return tokens, sa


CHECK_CHUNK = 1 << 22  # entries read at a time while checking
ORDER_PREFIX = 64  # tokens of two neighbouring suffixes compared when checking their order


def check_arrays(tokens: np.ndarray, sa: np.ndarray, meta: DatastoreMeta, sample: int = 4096, on_progress=None) -> int:
    """Check the arrays' contents, not only their sizes: every id below the vocabulary or the
    separator, one separator per document, the suffix array a permutation of the positions, and
    ``sample`` evenly spaced neighbouring entries in suffix order (their first ``ORDER_PREFIX``
    tokens compared). One pass over each array in chunks, plus one byte per token for the
    permutation. Returns the number of neighbours compared; raises `NgspecError` naming the damage.
    ``on_progress(done, total)`` is told the entries read so far."""
    n, sep = len(tokens), meta.separator
    total, done = 2 * n, 0
    separators = 0
    for start in range(0, n, CHECK_CHUNK):
        chunk = np.asarray(tokens[start : start + CHECK_CHUNK])
        outside = np.flatnonzero((chunk >= meta.vocab_size) & (chunk != sep))
        if len(outside):
            i = int(outside[0])
            raise NgspecError(f"token id {int(chunk[i])} at position {start + i} is outside the vocabulary ({meta.vocab_size} ids)")
        separators += int(np.count_nonzero(chunk == sep))
        done += len(chunk)
        if on_progress:
            on_progress(done, total)
    if separators != meta.documents:
        raise NgspecError(f"tokens.npy has {separators} document separators, meta.json says {meta.documents}")
    seen = np.zeros(n, dtype=bool)
    for start in range(0, n, CHECK_CHUNK):
        chunk = np.asarray(sa[start : start + CHECK_CHUNK], dtype=np.int64)
        outside = np.flatnonzero((chunk < 0) | (chunk >= n))
        if len(outside):
            i = int(outside[0])
            raise NgspecError(f"the suffix array points outside the tokens (entry {start + i}: {int(chunk[i])})")
        seen[chunk] = True
        done += len(chunk)
        if on_progress:
            on_progress(done, total)
    if not seen.all():
        raise NgspecError("the suffix array is not a permutation of the token positions")
    del seen
    pairs = np.unique(np.linspace(0, n - 2, num=min(sample, n - 1), dtype=np.int64)) if n > 1 else np.zeros(0, dtype=np.int64)
    for i in pairs.tolist():
        a, b = int(sa[i]), int(sa[i + 1])
        first, second = tokens[a : a + ORDER_PREFIX].tolist(), tokens[b : b + ORDER_PREFIX].tolist()
        if first > second or (first == second and len(first) < ORDER_PREFIX):
            raise NgspecError(f"suffix array entries {i} and {i + 1} are out of suffix order")
    return len(pairs)
