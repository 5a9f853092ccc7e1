"""Building a datastore: records -> documents -> token ids -> suffix array -> staged write.

Everything is written inside a staging directory that is renamed at the end, so an interrupted or
failed build leaves nothing behind. Tokenisation runs in a forked child that appends ids to a file
there; the parent then holds only the ids and the suffix sort's arrays.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from itertools import islice
from pathlib import Path
from typing import Callable, Iterable

import numpy as np

from ngspec.datastore.corpus import FORMATS, detect_format, documents, field_documents, iter_records
from ngspec.datastore.format import (
    FILES, DatastoreMeta, pack_documents, token_dtype, tokenizer_fingerprint, write_datastore,
)
from ngspec.datastore.suffix import suffix_array
from ngspec.errors import NgspecError
from ngspec.perf.memory import release_free_memory
from ngspec.staging import staged_directory


@dataclass(frozen=True)
class BuildOptions:
    text: str = "responses"  # responses | all
    format: str | None = None  # None = detect from the first record
    max_records: int | None = None
    split: str = "train"
    batch_size: int = 512
    response_field: str | None = None  # instead of a format: the field holding each record's response
    input_field: str | None = None  # and its input (with text="all")

    def __post_init__(self) -> None:
        if self.text not in ("responses", "all"):
            raise NgspecError("--text must be 'responses' or 'all'")
        if self.format is not None and self.format not in FORMATS:
            raise NgspecError(f"unknown --format {self.format!r}; choose one of {', '.join(FORMATS)}")
        if self.format is not None and self.response_field is not None:
            raise NgspecError("--format detects a layout; --response-field names the field itself: give one")
        if self.input_field is not None and self.response_field is None:
            raise NgspecError("--input-field needs --response-field")
        if self.max_records is not None and self.max_records < 1:
            raise NgspecError("--max-records must be at least 1")


def _batches(items: Iterable, size: int) -> Iterable[list]:
    it = iter(items)
    while batch := list(islice(it, size)):
        yield batch


@dataclass
class Tokenised:
    records: int = 0
    documents: int = 0
    tokens: int = 0  # stored ids, separators included
    format: str = ""


def tokenize_to_file(records: Iterable[dict], tokenizer, opts: BuildOptions, path: Path, on_batch: Callable[[int], None] | None = None) -> Tokenised:
    """Append the token ids of every document, each followed by the separator, to ``path``."""
    dtype = token_dtype(len(tokenizer))
    done = Tokenised(format=opts.format or ("fields" if opts.response_field else ""))
    if opts.max_records is not None:
        records = islice(records, opts.max_records)
    with open(path, "ab") as f:
        for batch in _batches(records, opts.batch_size):
            if not done.format:
                done.format = detect_format(batch[0])
            docs = []
            for i, record in enumerate(batch, done.records + 1):
                try:
                    if opts.response_field is not None:
                        docs += field_documents(record, opts.response_field, opts.input_field if opts.text == "all" else None)
                    else:
                        docs += documents(record, done.format, opts.text == "all")
                except NgspecError as exc:
                    raise NgspecError(f"record {i}: {exc}") from None
            done.records += len(batch)
            if docs:
                ids = pack_documents(tokenizer(docs, add_special_tokens=False)["input_ids"], dtype)
                ids.tofile(f)
                done.documents += len(docs)
                done.tokens += len(ids)
            if on_batch:
                on_batch(len(batch))
    if done.documents == 0:
        named = f"; no record holds a string {opts.response_field!r}" if opts.response_field else ""
        raise NgspecError(f"the corpus has no usable {'texts' if opts.text == 'all' else 'responses'} (format {done.format or 'unknown'}, {done.records} records{named})")
    return done


def _tokenize_child(corpus: str, tokenizer, opts: BuildOptions, path: Path, conn) -> None:
    """Runs in a forked process: tokenise to ``path``, reporting progress and the result on ``conn``."""
    try:
        done = tokenize_to_file(iter_records(corpus, opts.split), tokenizer, opts, path, lambda n: conn.send(("batch", n)))
        conn.send(("done", done))
    except NgspecError as exc:
        conn.send(("error", str(exc)))
    except OSError as exc:  # a full disk above all: raised again in the parent, where staging names it at the output
        conn.send(("raise", OSError(exc.errno, exc.strerror, exc.filename) if exc.errno else OSError(str(exc))))
    except Exception as exc:  # noqa: BLE001 - reported to the parent as one line
        conn.send(("error", f"tokenisation failed: {type(exc).__name__}: {exc}"))
    finally:
        conn.close()


def died(exitcode: int | None) -> str:
    """How a child process ended, for a message: killed outright (SIGKILL, which the OOM killer
    sends) reads as out of memory, a crash as a crash with its signal."""
    import signal

    if exitcode is not None and exitcode < 0:
        name = signal.Signals(-exitcode).name if -exitcode in signal.valid_signals() else f"signal {-exitcode}"
        if -exitcode == signal.SIGKILL:
            return f"was killed ({name}); out of memory?"
        return f"crashed ({name}, exit code {exitcode})"
    return f"died (exit code {exitcode})"


def tokenize_corpus(corpus: str, tokenizer, opts: BuildOptions, path: Path, on_batch: Callable[[int], None] | None = None) -> Tokenised:
    """Tokenise ``corpus`` into ``path``, in a forked child process where the platform allows:
    the tokenizer's Python ints and the reader's Arrow buffers then die with the child instead of
    staying in this process's heap under the suffix sort (about 10 bytes per token otherwise)."""
    import multiprocessing

    if "fork" not in multiprocessing.get_all_start_methods():
        return tokenize_to_file(iter_records(corpus, opts.split), tokenizer, opts, path, on_batch)
    ctx = multiprocessing.get_context("fork")
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_tokenize_child, args=(corpus, tokenizer, opts, path, child), daemon=True)
    proc.start()
    child.close()
    try:
        while True:
            try:
                message = parent.recv()
            except EOFError:
                proc.join()
                raise NgspecError(f"the tokenising process {died(proc.exitcode)}") from None
            if message[0] == "batch":
                if on_batch:
                    on_batch(message[1])
            elif message[0] == "error":
                raise NgspecError(message[1])
            elif message[0] == "raise":
                raise message[1]
            else:
                return message[1]
    finally:
        parent.close()
        proc.join(timeout=5)
        if proc.is_alive():
            proc.terminate()
            proc.join()


def _check_replaceable(out: Path) -> None:
    """Refuse to let --force remove anything but a datastore (its files alone, whole or damaged)
    or an empty directory, or the directory the command runs in: a mistyped --out (a project,
    the home directory, ".") would be removed whole after the build."""
    try:
        here = Path.cwd().resolve()
    except OSError:  # the directory the command runs in was removed: nothing to keep there
        here = None
    where = out.resolve()
    if where == here:
        raise NgspecError(f"{out} is the current directory: --force would remove it under the shell; give another --out")
    if here is not None and where in here.parents:
        raise NgspecError(f"{out} holds the current directory: --force would remove it; give another --out")
    others = sorted(p.name for p in out.iterdir() if p.name not in FILES)
    if others:
        shown = ", ".join(others[:3]) + (f" and {len(others) - 3} more" if len(others) > 3 else "")
        raise NgspecError(f"{out} holds files other than a datastore's ({shown}): --force replaces a datastore only; give another --out")


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
    if force and Path(out).is_dir():
        _check_replaceable(Path(out))
    with staged_directory(Path(out), force) as tmp:  # refuses an existing ``out`` without ``force``, before any work
        raw = tmp / "tokens.raw"
        done = tokenize_corpus(corpus, tokenizer, opts, raw, on_batch)
        release_free_memory()  # anything the reader left here goes back before the sort
        dtype = token_dtype(len(tokenizer))
        tokens = np.fromfile(raw, dtype=dtype)
        raw.unlink()
        if len(tokens) != done.tokens:
            raise NgspecError(f"tokenisation wrote {len(tokens):,} ids, expected {done.tokens:,}")
        if on_stage:
            on_stage(f"suffix sort of {len(tokens):,} tokens")
        sa = suffix_array(tokens)
        meta = DatastoreMeta(
            tokenizer_name=tokenizer_name,
            tokenizer_fingerprint=tokenizer_fingerprint(tokenizer),
            vocab_size=len(tokenizer),
            source=str(corpus),
            records=done.records,
            documents=done.documents,
            tokens=len(tokens) - done.documents,
            token_dtype=str(tokens.dtype),
            separator=int(np.iinfo(tokens.dtype).max),
            build_options={**asdict(opts), "format": done.format},
            created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
            build_seconds=round(time.perf_counter() - start, 3),
        )
        write_datastore(tmp, tokens, sa, meta)
    return meta
