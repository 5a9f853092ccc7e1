"""Corpus records: reading them (JSON lines and JSON documents with Python's `json`, plain or
compressed with gzip, bzip2 or xz; parquet files and hub datasets through `datasets`) and extracting
the documents to index.

Formats, detected from the first record or chosen with ``--format``:

- ``magpie``: ``instruction`` + ``response``, or a ``responses`` list, or multi-turn
  ``instruction_i`` / ``response_i`` (i = 1, 2, ...)
- ``alpaca``: ``instruction`` (+ ``input``) + ``output``, earlier turns in ``history`` as
  ``[instruction, response]`` pairs (LLaMA-Factory's layout)
- ``completion``: ``prompt`` + ``completion``, strings or lists of messages (TRL's layout)
- ``sharegpt``: ``conversations: [{from, value}]`` (also Magpie's conversation exports), or
  ``conversation`` (LMSYS-Chat-1M, WildChat); turns of either list may be ``{from, value}`` or
  ``{role, content}``
- ``messages``: OpenAI-style ``messages: [{role, content}]``
- ``ultrachat``: ``data: [user, assistant, user, ...]``
- ``text``: plain ``text``

By default only the assistant side goes in (READER's choice); ``text="all"`` adds the user side.
"""

from __future__ import annotations

import bz2
import glob
import gzip
import json
import logging
import lzma
import re
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, Iterable, Iterator

from ngspec.errors import NULL, NgspecError, check_text, compressed_with, json_error, json_kind, lone_surrogate_at, short
from ngspec.staging import is_stream

FORMATS = ("magpie", "alpaca", "completion", "sharegpt", "messages", "ultrachat", "text")
ASSISTANT_ROLES = {"assistant", "gpt", "model", "bot", "chatgpt"}
_TURN = re.compile(r"^(instruction|response)_(\d+)$")
# by a file's suffix in lower case (`C.JSONL` from a Windows tool); `.ndjson` is JSON lines' other name
DATA_SUFFIXES = {".jsonl": "json", ".ndjson": "json", ".json": "json", ".parquet": "parquet"}
# a .jsonl or .json file compressed whole, as `datasets` reads it (`data/train-*.jsonl.gz` on the hub)
COMPRESSIONS = {".gz": ("gzip", gzip.open), ".bz2": ("bzip2", bz2.open), ".xz": ("xz", lzma.open)}
READ_KINDS = ".jsonl, .json or .parquet, or .jsonl or .json compressed with gzip, bzip2 or xz: .gz, .bz2, .xz"
# a JSON escape of half a UTF-16 pair: read alone, it is a lone surrogate (`check_text`)
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def detect_format(record: dict) -> str:
    if not isinstance(record, dict):
        raise NgspecError(f"the corpus's records must be JSON objects, not {json_kind(record)}")
    if "conversations" in record or "conversation" in record:
        return "sharegpt"
    if "messages" in record:
        return "messages"
    if "data" in record and isinstance(record["data"], list):
        return "ultrachat"
    if (layout := turns_layout(record)) is not None:
        return layout
    if {"response", "responses", "instruction"} & record.keys() or any(_TURN.match(k) for k in record):
        return "magpie"
    if "text" in record:
        return "text"
    raise NgspecError(f"cannot tell the corpus format from fields {sorted(record)}; choose one with --format ({', '.join(FORMATS)})")


def _strings(values: Iterable) -> list[str]:
    return [v for v in values if isinstance(v, str) and v.strip()]


# a Magpie-like record's user side: the instruction, and the passage it asks about (Dolly's
# `context`, an Alpaca-like `input` beside a `response`)
MAGPIE_ASKED = ("instruction", "input", "context")


def _magpie(record: dict, include_user: bool) -> list[str]:
    turns = sorted((int(m.group(2)), m.group(1), k) for k in record if (m := _TURN.match(k)))
    if turns:
        return _strings(record[k] for _, kind, k in turns if kind == "response" or include_user)
    docs = _strings([record.get(key) for key in MAGPIE_ASKED]) if include_user else []
    if isinstance(record.get("responses"), list):
        return docs + _strings(record["responses"])
    return docs + _strings([record.get("response")])


def turn_role(turn: dict) -> str:
    """A chat turn's role, in lower case: its ``role`` (OpenAI's) or ``from`` (ShareGPT's)."""
    return str(turn.get("role", turn.get("from", ""))).lower()


def turn_text(turn: object) -> str | None:
    """A chat turn's text: its ``content`` (OpenAI's) or ``value`` (ShareGPT's) string, whichever
    list the turn is in, or the text parts of a content given as a list of parts (``[{"type":
    "text", "text": ...}]``, as OpenAI's clients and multimodal datasets write it) joined, other
    parts (an image) passed by; None where it holds no text."""
    content = turn.get("content", turn.get("value")) if isinstance(turn, dict) else None
    if isinstance(content, list):
        texts = [p["text"] for p in content if isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)]
        return "".join(texts) if texts else None
    return content if isinstance(content, str) else None


def _chat(turns: list, include_user: bool) -> list[str]:
    out = []
    for turn in turns:
        if not isinstance(turn, dict):
            continue
        role = turn_role(turn)
        if role in ASSISTANT_ROLES or (include_user and role in {"user", "human"}):
            out.append(turn_text(turn))
    return _strings(out)


def alpaca_turns(record: dict) -> list[dict]:
    """An Alpaca record as chat turns (``role``, ``content``): each ``[instruction, response]``
    pair of ``history``, then ``instruction`` (with ``input`` on the line below, where there is
    one) and ``output``, as LLaMA-Factory joins them."""
    history = record.get("history") or []
    if not isinstance(history, list):
        raise NgspecError(f"'history' must be a list of [instruction, response] pairs, not {json_kind(history)}")
    turns = []
    for i, pair in enumerate(history):
        if not (isinstance(pair, list) and len(pair) == 2 and all(isinstance(text, str) for text in pair)):
            raise NgspecError(f"'history' item {i} must be an [instruction, response] pair of strings, not {json_kind(pair)}")
        turns += [{"role": "user", "content": pair[0]}, {"role": "assistant", "content": pair[1]}]
    for key in ("instruction", "input", "output"):
        if not isinstance(record.get(key, ""), (str, NULL)):
            raise NgspecError(f"'{key}' must be a string, not {json_kind(record[key])}")
    asked = "\n".join(text for text in (record.get("instruction"), record.get("input")) if text and text.strip())
    return turns + [{"role": "user", "content": asked}, {"role": "assistant", "content": record.get("output") or ""}]


def completion_turns(record: dict) -> list[dict]:
    """A prompt-completion record as chat turns: ``prompt`` and ``completion``, each a string (the
    user's and the assistant's) or a list of messages with their roles (TRL's conversational
    layout)."""
    turns = []
    for key, role in (("prompt", "user"), ("completion", "assistant")):
        value = record.get(key)
        if isinstance(value, str):
            turns.append({"role": role, "content": value})
        elif isinstance(value, list):
            turns += value
        else:
            raise NgspecError(f"'{key}' must be a string or a list of messages, not {json_kind(value)}")
    return turns


def turns_layout(record: dict) -> str | None:
    """``alpaca`` or ``completion`` for a record laid out so (`alpaca_turns`, `completion_turns`;
    a Magpie ``response`` beside an ``output`` makes it Magpie's), else None."""
    if {"instruction", "output"} <= record.keys() and not {"response", "responses"} & record.keys():
        return "alpaca"
    if {"prompt", "completion"} <= record.keys():
        return "completion"
    return None


TURNS_OF = {"alpaca": alpaca_turns, "completion": completion_turns}


def listed(record: dict, key: str) -> list:
    """``record[key]`` where it must be a list of turns (missing or null: none); anything else is
    a malformed record."""
    turns = record.get(key) or []
    if not isinstance(turns, list):
        raise NgspecError(f"'{key}' must be a list of turns, not {json_kind(turns)}")
    return turns


def field_documents(record: dict, response_field: str, input_field: str | None = None) -> list[str]:
    """The texts of one record in a layout no format knows (GSM8K's ``question``/``answer``):
    the fields named (``build-datastore --response-field``, and ``--input-field`` with ``--text
    all``), each its own document; a missing or null field gives none."""
    if not isinstance(record, dict):
        raise NgspecError(f"a record must be a JSON object, not {json_kind(record)}")
    named = [name for name in (input_field, response_field) if name is not None]
    for name in named:
        if not isinstance(record.get(name), (str, NULL)):
            raise NgspecError(f"'{name}' must be a string, not {json_kind(record[name])}")
    return _strings(record.get(name) for name in named)


def documents(record: dict, fmt: str, include_user: bool = False) -> list[str]:
    """The texts of one record to index, each its own document."""
    if not isinstance(record, dict):
        raise NgspecError(f"a record must be a JSON object, not {json_kind(record)}")
    if fmt == "magpie":
        return _magpie(record, include_user)
    if fmt in TURNS_OF:
        return _chat(TURNS_OF[fmt](record), include_user)
    if fmt == "sharegpt":  # LMSYS-Chat-1M and WildChat name the list `conversation`
        return _chat(listed(record, "conversations" if "conversations" in record else "conversation"), include_user)
    if fmt == "messages":
        return _chat(listed(record, "messages"), include_user)
    if fmt == "ultrachat":
        turns = listed(record, "data")
        return _strings(t for i, t in enumerate(turns) if i % 2 == 1 or include_user)
    if fmt == "text":
        return _strings([record.get("text")])
    raise NgspecError(f"unknown corpus format {fmt!r}; choose one of {', '.join(FORMATS)}")


def data_kind(path: Path) -> str | None:
    """The `datasets` builder that reads a data file, by its name: ``json`` for ``.jsonl`` and
    ``.json`` (``.ndjson`` too; plain or compressed, `COMPRESSIONS`), ``parquet`` for ``.parquet``; None for another."""
    if path.suffix.lower() in COMPRESSIONS:
        return "json" if DATA_SUFFIXES.get(Path(path.stem).suffix.lower()) == "json" else None
    return DATA_SUFFIXES.get(path.suffix.lower())


@contextmanager
def _opened(file: Path) -> Iterator[BinaryIO]:
    """``file`` opened for reading bytes, decompressed where its name says it is compressed; a
    compressed file that is damaged, cut short or not compressed after all is one message naming
    it (gzip, bz2 and lzma each raise their own kinds, some only partway through)."""
    kind, open_ = COMPRESSIONS.get(file.suffix.lower(), (None, open))
    with open_(file, "rb") as f:
        try:
            yield f
        except (EOFError, lzma.LZMAError, OSError) as exc:
            if kind is None or (isinstance(exc, OSError) and exc.errno is not None):  # a plain file's, or the disk's
                raise
            raise NgspecError(f"cannot read corpus {file}: not a whole {kind} file ({exc})") from None


def split_files(path: Path, split: str) -> list[Path] | None:
    """The files of ``split`` in a directory whose file or folder names name two splits or more,
    as `datasets` reads them (``data/train-00000-of-00001.parquet`` beside ``data/test-...``,
    ``train/`` and ``test/``, ``train.jsonl`` and ``valid.jsonl``); None where they name one or
    none: every file is then read."""
    from datasets.data_files import DataFilesDict, get_data_patterns

    try:
        found = DataFilesDict.from_patterns(get_data_patterns(str(path)), base_path=str(path))
    except Exception:  # no data files at all (datasets' EmptyDatasetError): local_files says so
        return None
    if len(found) < 2:
        return None
    if split not in found:
        raise NgspecError(f"{path} holds the splits {', '.join(sorted(map(str, found)))} (by its file names, as datasets reads them) and no {split!r}: "
                          "choose one with --split")
    return sorted(Path(f) for f in found[split])


def local_files(path: Path, split: str = "train") -> tuple[str, list[str]]:
    """The `datasets` builder and files for a local file or directory of them (of ``split``
    where the directory's names name splits: `split_files`)."""
    if not path.is_dir() and is_stream(path):
        raise NgspecError(f"{path} is a pipe or device, not a file: a corpus is read more than once; save it to a .jsonl, .json or .parquet file")
    files = sorted(p for p in path.rglob("*") if data_kind(p)) if path.is_dir() else [path]
    inner = next((p.parent for p in files if p.name in ("state.json", "dataset_dict.json") and saved_dataset(p.parent)), None)
    if inner is not None:  # its metadata would be read as records
        raise NgspecError(f"{path} holds a dataset saved by datasets' save_to_disk ({inner}): give that directory as the corpus, alone")
    if path.is_dir() and (chosen := split_files(path, split)) is not None:
        files = [p for p in chosen if data_kind(p)]
    if not files:
        raise NgspecError(f"{path} holds no corpus files (it reads {READ_KINDS})")
    kinds = {data_kind(p) for p in files}
    if None in kinds:
        raise NgspecError(f"{path}: unsupported file type (use {READ_KINDS})")
    if len(kinds) > 1:
        raise NgspecError(f"{path} mixes json and parquet files; build from one kind at a time")
    return kinds.pop(), [str(p) for p in files]


def saved_dataset(path: Path) -> bool:
    """Whether ``path`` is a directory `datasets`' ``save_to_disk`` wrote: a Dataset (arrow files
    beside ``state.json`` and ``dataset_info.json``) or a DatasetDict (``dataset_dict.json`` and a
    directory per split)."""
    return (path / "dataset_dict.json").is_file() or ((path / "state.json").is_file() and (path / "dataset_info.json").is_file())


def _saved_records(path: Path, spec: str, split: str) -> Iterator[dict]:
    """The records of a dataset ``save_to_disk`` wrote (a DatasetDict's ``split``), read with
    `datasets.load_from_disk` (memory-mapped)."""
    import datasets

    try:
        saved = datasets.load_from_disk(str(path))
    except Exception as exc:  # datasets raises several kinds for a damaged or foreign directory
        raise _reading_error(spec, exc) from exc
    if isinstance(saved, datasets.DatasetDict):
        if split not in saved:
            raise NgspecError(
                f"{spec} is a DatasetDict saved by datasets' save_to_disk with the splits {', '.join(sorted(saved))} and no {split!r}: "
                f"choose one with --split, or give a split's directory ({path / sorted(saved)[0]}) as the corpus"
            )
        saved = saved[split]
    yield from _stream(spec, lambda _: saved)


def looks_local(spec: str) -> bool:
    """Whether ``spec`` can only be a local path: a hub dataset id is ``name`` or ``owner/name``,
    never starting with ``.``, ``/`` or ``~``, never with more than one ``/``, and not ending in
    a data file's suffix. Such a path that does not exist is reported as missing at once,
    without asking the hub (offline, `datasets` retries for most of a minute)."""
    return spec.startswith((".", "/", "~")) or spec.count("/") > 1 or data_kind(Path(spec)) is not None


def _document(file: Path) -> list[dict] | str | None:
    """A ``.json``/``.jsonl`` file read as one JSON document (an array, or an object over several
    lines): its records, or where it stops being valid (``FILE:LINE...: what``); None where it is
    JSON lines. It is a document where its first line opens an array that is not JSON alone, or the
    first line is the file's one array, or the whole file is one valid object whose first line is
    not JSON alone (a first line cut short, or a stray array before records, is a JSON-lines
    fault, reported at its line)."""
    with _opened(file) as f:
        for line in f:
            start = line.lstrip().removeprefix(b"\xef\xbb\xbf").lstrip()
            if start.startswith(b"["):  # a pretty array, or a one-line array with nothing after it
                return _json_document(file) if not _is_json(start) or not any(rest.strip() for rest in f) else None
            if start.startswith(b"{") and not _is_json(start):  # an object over several lines
                read = _json_document(file)
                return None if isinstance(read, str) else read
            if start:
                return None
    return None


def _json_lines(file: Path) -> Iterator[dict]:
    """The records of a JSON-lines file, each as Python's `json` reads it, blank lines skipped; a
    line that is not a JSON object stops the reading with its number. `datasets` 5.2 read these
    files through pyarrow, 5x slower on this VM, and a field that changed type there crashed the
    process (after a line such as ``NaN``), stopped on a blank line ("Expected object or value"), or,
    past the first 10 MB, turned every string of that field in that block into its JSON text, quotes
    and escapes included (BENCHMARKS.md 10zzz)."""
    with _opened(file) as f:
        for lineno, line in enumerate(f, 1):
            if lineno == 1:
                line = line.removeprefix(b"\xef\xbb\xbf")
            if not line.strip():
                continue
            try:
                record = json.loads(line.decode("utf-8").rstrip("\r\n"))  # a line cut short: "Unterminated string", not "Invalid control character"
            except UnicodeDecodeError:
                raise NgspecError(f"cannot read corpus {file}:{lineno}: not valid UTF-8{_compressed_note(file) if lineno == 1 else ''}") from None
            except RecursionError:
                raise NgspecError(f"cannot read corpus {file}:{lineno}: its JSON is nested too deeply to read") from None
            except json.JSONDecodeError as exc:
                if line.lstrip().startswith(b"{"):
                    raise NgspecError(f"cannot read corpus {file}:{lineno}: not valid JSON ({json_error(exc)} at column {exc.colno})") from None
                record = None  # refused below, by how the line starts
            if not isinstance(record, dict):
                if lineno == 1 and (note := _compressed_note(file)):
                    raise NgspecError(f"cannot read corpus {file}:1: not valid JSON{note}")
                shown = line.strip()[:20].decode("utf-8", "replace").rstrip()
                raise NgspecError(f"cannot read corpus {file}:{lineno}: a record must be a JSON object (the line starts {shown!r})")
            if _SURROGATE_ESCAPE.search(line):
                _check_record_text(record, f"cannot read corpus {file}:{lineno}")
            yield record


def _compressed_note(file: Path) -> str:
    """What to do with a file read as plain that is compressed after all (a ``.jsonl.gz`` saved
    as ``.jsonl``): name it for its compression, or decompress it; "" for a file that is not."""
    with open(file, "rb") as f:
        kind = compressed_with(f.read(10))
    if kind is None or file.suffix.lower() in COMPRESSIONS:
        return ""
    known = next((suffix for suffix, (name, _) in COMPRESSIONS.items() if name == kind), None)
    return f": the file is compressed with {kind}; " + (f"name it {file.name}{known} to read it as such" if known else "decompress it first")


def _check_record_text(record: dict, what: str) -> None:
    """Refuse a record holding a lone surrogate in one of its strings (`check_text`), naming the
    field: the tokenizer would fail on it without saying where ("TextEncodeInput must be
    Union[...]")."""
    found = _not_text(record)
    if found is not None:
        check_text(found[1], f"{what}: field {found[0]}")


def _not_text(value: object, path: str = "") -> tuple[str, str] | None:
    """The first string of a JSON value (a field's name or value) that holds a lone surrogate, and
    where it is (``conversations[1].value``); None when there is none."""
    if isinstance(value, str):
        return None if lone_surrogate_at(value) is None else (path, value)
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        where = f"{path}[{key}]" if isinstance(key, int) else f"{path}.{key}" if path else key
        if isinstance(key, str) and lone_surrogate_at(key) is not None:
            return f"{where!r} (its name)", key
        if (found := _not_text(item, where)) is not None:
            return found
    return None


def _json_file(file: Path) -> Iterator[dict]:
    """A JSON-lines file line by line, or a JSON document whole. `datasets` 5.2 typed a document
    as one block: where a field held strings and other values, every value of it came back as its
    JSON text, quotes and escapes included (BENCHMARKS.md 10zzza)."""
    read = _document(file)
    if read is None:
        yield from _json_lines(file)
        return
    if isinstance(read, str):
        raise NgspecError(f"cannot read corpus {read}")
    yield from read


def _is_json(line: bytes) -> bool:
    try:
        json.loads(line)
    except (ValueError, RecursionError):  # JSONDecodeError, UnicodeDecodeError; nested too deeply
        return False
    return True


def _json_document(file: Path) -> list[dict] | str:
    """The records of a JSON document file (each item of an array, or the one object), or where it
    stops being valid, as ``FILE:LINE...: what``."""
    with _opened(file) as f:
        data = f.read()
    try:
        document = json.loads(data.decode("utf-8-sig"))
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        return f"{file}:{line}: not valid UTF-8"
    except RecursionError:
        return f"{file}: its JSON is nested too deeply to read"
    except json.JSONDecodeError as exc:
        return f"{file}:{exc.lineno}:{exc.colno}: not valid JSON ({json_error(exc)})"
    records = document if isinstance(document, list) else [document]
    stray = next((i for i, item in enumerate(records) if not isinstance(item, dict)), None)
    if stray is not None:
        return f"{file}: item {stray} of its array is not a record (a JSON object) but {short(records[stray])}"
    if _SURROGATE_ESCAPE.search(data):
        for i, record in enumerate(records):
            _check_record_text(record, f"cannot read corpus {file}: item {i} of its array" if isinstance(document, list) else f"cannot read corpus {file}")
    return records


def _reading_error(spec: str, exc: Exception) -> NgspecError:
    message = " ".join(str(exc).split()) if str(exc) else type(exc).__name__
    if len(message) > 400:
        message = message[:400] + " ..."
    if isinstance(exc, UnicodeDecodeError):
        message = f"the text is not valid UTF-8 ({message})"
    return NgspecError(f"cannot read corpus {spec!r}: {message}")


def iter_records(spec: str, split: str = "train") -> Iterator[dict]:
    """Records of a local path or a dataset name, streamed (JSON files with Python's `json`, JSON
    lines line by line; parquet files, hub datasets and a dataset `save_to_disk` wrote through
    `datasets`); reading errors
    (malformed JSON, bad encodings, unknown datasets) become one clear `NgspecError`. The files
    of a directory are read one after another, so files whose records carry different extra
    fields (a Magpie export next to `synth-corpus` output) can sit side by side."""
    path = Path(spec).expanduser()
    if not path.exists() and looks_local(spec):
        raise NgspecError(f"corpus not found: {spec} (no such file or directory)")
    if not path.exists():
        yield from _stream(spec, lambda datasets: datasets.load_dataset(spec, split=split, streaming=True))
        return
    if path.is_dir() and saved_dataset(path):
        yield from _saved_records(path, spec, split)
        return
    builder, files = local_files(path, split)
    for file in files:
        where = file if path.is_dir() else spec
        if builder == "parquet" and _parquet_rows(file) == 0:
            continue  # no records, as in an empty .jsonl (datasets fails on it: "BatchSize must be greater than 0")
        if builder == "json":
            yield from _json_file(Path(file))
            continue
        pattern = glob.escape(file)  # datasets reads data_files as patterns: corpus[v2].parquet matched no file
        yield from _stream(where, lambda datasets: datasets.load_dataset(builder, data_files=[pattern], split="train", streaming=True))


def _parquet_rows(file: str) -> int | None:
    """The rows a parquet file's footer counts (None when it cannot be read: datasets then names
    the fault)."""
    import pyarrow.parquet as pq

    try:
        return pq.ParquetFile(file).metadata.num_rows
    except Exception:  # pyarrow raises several kinds for a damaged file
        return None


class _Reraised(logging.Filter):
    """Drops `datasets`' log line about a JSON or parquet file it cannot read: the error it
    raises next becomes ngspec's one message."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(("Failed to load JSON from file", "Failed to read file", "Failed to convert pandas DataFrame"))


def _stream(spec: str, load) -> Iterator[dict]:
    import datasets

    loggers = [logging.getLogger(f"datasets.packaged_modules.{kind}.{kind}") for kind in ("json", "parquet")]
    reraised = _Reraised()
    for logger in loggers:
        logger.addFilter(reraised)  # while ngspec reads, not for the rest of the process
    try:
        try:
            iterator = iter(load(datasets))
        except StopIteration:  # an empty file: datasets finds no first record to read its fields from
            return
        except Exception as exc:  # datasets raises many kinds for unreadable or malformed input
            raise _reading_error(spec, exc) from exc
        while True:
            try:
                record = next(iterator)
            except StopIteration:
                return
            except Exception as exc:
                raise _reading_error(spec, exc) from exc
            yield record
    finally:
        for logger in loggers:
            logger.removeFilter(reraised)
