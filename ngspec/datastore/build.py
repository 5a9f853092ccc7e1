"""Building a datastore: records -> documents -> token ids -> suffix array -> staged write."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from itertools import islice
from pathlib import Path
from typing import Callable, Iterable

import numpy as np

from ngspec.datastore.corpus import FORMATS, detect_format, documents, iter_records
from ngspec.datastore.format import (
    DatastoreMeta, pack_documents, token_dtype, tokenizer_fingerprint, write_datastore,
)
from ngspec.datastore.suffix import suffix_array
from ngspec.errors import NgspecError
from ngspec.staging import staged_directory


@dataclass(frozen=True)
class BuildOptions:
    text: str = "responses"  # responses | all
    format: str | None = None  # None = detect from the first record
    max_records: int | None = None
    split: str = "train"
    batch_size: int = 512

    def __post_init__(self) -> None:
        if self.text not in ("responses", "all"):
            raise NgspecError("--text must be 'responses' or 'all'")
        if self.format is not None and self.format not in FORMATS:
            raise NgspecError(f"unknown --format {self.format!r}; choose one of {', '.join(FORMATS)}")
        if self.max_records is not None and self.max_records < 1:
            raise NgspecError("--max-records must be at least 1")


def release_free_memory() -> None:
    """Return freed heap pages to the OS (glibc's malloc_trim, Arrow's pool), so the suffix sort's
    peak is not stacked on memory the tokeniser and the reader already let go of."""
    import ctypes
    import ctypes.util

    try:
        import pyarrow

        pyarrow.default_memory_pool().release_unused()
    except (ImportError, AttributeError):
        pass
    libc = ctypes.util.find_library("c")
    if libc:
        try:
            ctypes.CDLL(libc).malloc_trim(0)
        except (OSError, AttributeError):
            pass  # not glibc: nothing to trim


def _batches(items: Iterable, size: int) -> Iterable[list]:
    it = iter(items)
    while batch := list(islice(it, size)):
        yield batch


def tokenize_corpus(records: Iterable[dict], tokenizer, opts: BuildOptions, on_batch: Callable[[int], None] | None = None) -> tuple[np.ndarray, int, int, str]:
    """Token ids of every document, each followed by the separator; plus record and document
    counts and the format used."""
    dtype = token_dtype(len(tokenizer))
    chunks: list[np.ndarray] = []
    n_records = n_docs = 0
    fmt = opts.format
    if opts.max_records is not None:
        records = islice(records, opts.max_records)
    for batch in _batches(records, opts.batch_size):
        if fmt is None:
            fmt = detect_format(batch[0])
        docs = [d for r in batch for d in documents(r, fmt, opts.text == "all")]
        n_records += len(batch)
        if docs:
            chunks.append(pack_documents(tokenizer(docs, add_special_tokens=False)["input_ids"], dtype))
            n_docs += len(docs)
        if on_batch:
            on_batch(len(batch))
    if n_docs == 0:
        raise NgspecError(f"the corpus has no usable {'texts' if opts.text == 'all' else 'responses'} (format {fmt or 'unknown'}, {n_records} records)")
    return np.concatenate(chunks), n_records, n_docs, fmt or ""


def build_datastore(
    corpus: str,
    tokenizer,
    tokenizer_name: str,
    out: Path,
    opts: BuildOptions,
    force: bool = False,
    on_batch: Callable[[int], None] | None = None,
    on_stage: Callable[[str], None] | None = None,
) -> DatastoreMeta:
    """Build the datastore of ``corpus`` at ``out`` (replacing it only with ``force``)."""
    start = time.perf_counter()
    if Path(out).exists() and not force:
        raise NgspecError(f"{out} already exists (use --force to replace it)")
    records = iter_records(corpus, opts.split)
    tokens, n_records, n_docs, fmt = tokenize_corpus(records, tokenizer, opts, on_batch)
    del records
    release_free_memory()  # tokenisation leaves ~10 bytes/token of freed heap; hand it back first
    if on_stage:
        on_stage(f"suffix sort of {len(tokens):,} tokens")
    sa = suffix_array(tokens)
    meta = DatastoreMeta(
        tokenizer_name=tokenizer_name,
        tokenizer_fingerprint=tokenizer_fingerprint(tokenizer),
        vocab_size=len(tokenizer),
        source=str(corpus),
        records=n_records,
        documents=n_docs,
        tokens=len(tokens) - n_docs,
        token_dtype=str(tokens.dtype),
        separator=int(np.iinfo(tokens.dtype).max),
        build_options={**asdict(opts), "format": fmt},
        created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        build_seconds=round(time.perf_counter() - start, 3),
    )
    with staged_directory(Path(out), force) as tmp:
        write_datastore(tmp, tokens, sa, meta)
    return meta
