"""Prompt files and turning prompts into token ids.

A ``.txt`` file is one prompt, and ``-`` reads standard input (one prompt, JSONL records when
its first line is one, or a JSON document holding them, `read_stdin`). A ``.jsonl`` file holds one
record per line, and a ``.json`` file an array of them (or one record): ``{"prompt": ...}``,
``{"text": ...}``, Spec-Bench/MT-bench style ``{"turns": [...]}`` (the first turn is the prompt, and
every turn is kept: `ngspec bench` and `ngspec generate` ask the later ones in the conversation so
far, `ngspec.turns`) or OpenAI-style ``{"messages": [...]}`` (a chat as it stands: a system
prompt, earlier turns, then the user's message, through the chat template).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from ngspec.datastore.corpus import MAGPIE_ASKED
from ngspec.errors import NgspecError, check_text, compressed_with, json_error, short
from ngspec.staging import is_stream


@dataclass(frozen=True)
class Prompt:
    id: str
    text: str
    category: str | None = None
    turns: tuple[str, ...] = ()  # a multi-turn record's user turns, the first being ``text``
    turn: int = 1  # which of them ``text`` is
    messages: tuple[dict, ...] = ()  # a 'messages' record's chat, asked as it stands (``text``: its last user message)

    @property
    def label(self) -> str:
        """The id, and the turn after the first: ``81`` then ``81 (turn 2)``."""
        return self.id if self.turn == 1 else f"{self.id} (turn {self.turn})"


def read_text(path: Path, what: str = "prompt file", takes: str = "give a .txt, .jsonl or .json prompt file") -> str:
    """The text of a file the user named as ``what`` (refused with the reason when it is a
    directory, missing or not UTF-8; a byte-order mark is read past)."""
    if path.is_dir():
        raise NgspecError(f"{path} is a directory; {takes}")
    if not path.exists():
        raise NgspecError(f"{what} not found: {path}")
    return _decoded(path.read_bytes(), str(path))  # a pipe too (`<(...)`): read once


def _decoded(data: bytes, where: str) -> str:
    try:
        return data.decode("utf-8-sig")  # a byte-order mark (Windows editors write one) is not text
    except UnicodeDecodeError as exc:
        if (kind := compressed_with(data[:10])) is not None:
            raise NgspecError(f"{where} is not valid UTF-8: the file is compressed with {kind}; decompress it first") from None
        raise NgspecError(f"{where} is not valid UTF-8 (byte {exc.start})") from exc


STDIN = "-"  # ``--prompt-file -``


def source_name(path: Path | str) -> str:
    """A prompt file as reports name it: its path, or "standard input" for `STDIN`."""
    return "standard input" if str(path) == STDIN else str(path)


PROMPT_KEYS = ("prompt", "text", "turns", "messages")


def _holds_prompt(value: object) -> bool:
    return isinstance(value, dict) and any(key in value for key in PROMPT_KEYS)


def _json_or_none(text: str) -> object:
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


def read_stdin() -> tuple[str, str]:
    """Standard input's text and what it holds, as a file's suffix would say: ``jsonl`` when its
    first non-blank line is a JSON object holding a prompt (`PROMPT_KEYS`), ``json`` when the whole
    text is a JSON array with such a record in it or one such object (a ``.json`` file piped in),
    else ``txt``: one prompt, as a ``.txt`` file is."""
    text = _decoded(sys.stdin.buffer.read(), "standard input")
    return text, sniffed(text)


def sniffed(text: str) -> str:
    """The layout of a prompt text that comes with no suffix (standard input, a pipe), as
    `read_stdin` tells it."""
    first = next((line for line in text.splitlines() if line.strip()), "")
    if _holds_prompt(_json_or_none(first)):
        return "jsonl"
    whole = _json_or_none(text) if text.lstrip().startswith(("[", "{")) else None
    if _holds_prompt(whole) or (isinstance(whole, list) and any(map(_holds_prompt, whole))):
        return "json"
    return "txt"


def json_layout(text: str, suffix: str) -> str:
    """How a ``.jsonl`` or ``.json`` file's text is laid out, as corpora are read
    (`ngspec.datastore.corpus`), whatever the suffix says: ``jsonl`` when its first non-blank line
    is a JSON object alone (a ``.json`` file, unless the whole text is that one object), else
    ``json`` when the whole text is one JSON document (a pretty-printed array in a ``.jsonl``
    file), else the suffix's, so that the error names the place as that layout would."""
    first = next((line for line in text.splitlines() if line.strip()), "")
    whole = _json_or_none(text)
    if isinstance(_json_or_none(first), dict) and (suffix == ".jsonl" or whole is None):
        return "jsonl"
    return "json" if whole is not None or suffix == ".json" else "jsonl"


def jsonl_records(path: Path, text: str) -> Iterator[tuple[int, object]]:
    """(line number, parsed value) of each non-blank line of a .jsonl file's ``text``."""
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            yield lineno, json.loads(line)
        except RecursionError:
            raise NgspecError(f"{path}:{lineno}: its JSON is nested too deeply to read") from None
        except json.JSONDecodeError as exc:
            raise NgspecError(f"{path}:{lineno}: not valid JSON ({json_error(exc)} at column {exc.colno})") from exc


def json_records(path: Path, text: str) -> list:
    """The items of a .json file's array, or its one object (refused with where it fails)."""
    try:
        document = json.loads(text)
    except RecursionError:
        raise NgspecError(f"{path}: its JSON is nested too deeply to read") from None
    except json.JSONDecodeError as exc:
        raise NgspecError(f"{path}:{exc.lineno}:{exc.colno}: not valid JSON ({json_error(exc)})") from None
    if isinstance(document, (dict, str)):
        return [document]
    if not isinstance(document, list):
        raise NgspecError(f"{path}: expected a JSON array of prompts (records or strings) or one, not {short(document)}")
    return document


def _record_prompt(record: object, where: str) -> Prompt:
    if isinstance(record, str):  # ["Summarise ...", "Translate ..."], or a line of `jq -R .`
        record = {"prompt": record}
    if not isinstance(record, dict):
        raise NgspecError(f"{where}: expected a prompt record (a JSON object) or a prompt (a JSON string), not {short(record)}")
    turns: tuple[str, ...] = ()
    messages: tuple[dict, ...] = ()
    if isinstance(record.get("prompt"), str):
        text = record["prompt"]
    elif isinstance(record.get("text"), str):
        text = record["text"]
    elif isinstance(record.get("turns"), list) and record["turns"] and isinstance(record["turns"][0], str):
        text, later = record["turns"][0], record["turns"][1:]
        if any(not isinstance(t, str) or not t.strip() for t in later):
            raise NgspecError(f"{where}: every one of 'turns' must be a non-empty string")
        turns = (text, *later)
    elif (chat := next((record[key] for key in ("messages", "prompt") if isinstance(record.get(key), list) and record[key]), None)) is not None:
        # OpenAI's messages, or TRL's conversational prompt; content parts joined, as `serve` does
        try:
            messages = tuple(joined_parts(chat))
            check_messages(list(messages))
        except NgspecError as exc:
            raise NgspecError(f"{where}: {exc}") from None
        said = [m["content"] for m in messages if m["role"] == "user"] or [messages[-1]["content"]]
        text = said[-1]
    elif isinstance(record.get("instruction"), str):  # Alpaca, AlpacaEval, Dolly (the corpus layouts)
        text = "\n".join(part for key in MAGPIE_ASKED if isinstance(part := record.get(key), str) and part.strip())
    else:
        raise NgspecError(f"{where}: needs a 'prompt', 'text' or 'instruction' string, a non-empty 'turns' list or a non-empty 'messages' list")
    if not text.strip():
        raise NgspecError(f"{where}: the prompt is empty")
    rid = record.get("question_id", record.get("id"))
    category = record.get("category")
    return Prompt(str(rid) if rid is not None else where, text, category if isinstance(category, str) else None, turns, messages=messages)


def load_prompts(
    path: Path, category: str | None = None, limit: int | None = None, per_category: int | None = None
) -> list[Prompt]:
    """Read a .txt, .jsonl or .json prompt file (``-``: standard input, `read_stdin`), optionally
    keeping one category, the first ``per_category`` of every category, and then the first ``limit``."""
    path = Path(path)
    suffix = {".ndjson": ".jsonl"}.get(path.suffix.lower(), path.suffix.lower())  # Q.JSONL; JSON lines' other name
    if suffix == ".parquet" and not path.is_dir():
        raise NgspecError(f"{path} is a parquet file; prompt files are .txt (one prompt), .jsonl (a record per line) or .json (an array of records)")
    if str(path) == STDIN:
        (text, kind), path, source = read_stdin(), Path("stdin"), "standard input"  # ids: stdin, stdin:LINE, stdin[I]
    else:
        text, source = read_text(path), f"prompt file {path}"
        if suffix in (".jsonl", ".json"):
            kind = json_layout(text, suffix)
        else:  # a pipe (`-p <(jq ...)`) has no suffix to say: its text does, as standard input's
            kind = sniffed(text) if is_stream(path) else "txt"
    if not text.strip():
        raise NgspecError(f"{source} is empty")
    if kind == "json":
        prompts = [_record_prompt(record, f"{path.name}[{i}]") for i, record in enumerate(json_records(path, text))]
        if not prompts:
            raise NgspecError(f"{source} holds no prompts (an empty array)")
    elif kind == "jsonl":
        prompts = [_record_prompt(record, f"{path.name}:{lineno}") for lineno, record in jsonl_records(path, text)]
    else:
        # line ends as Python's text mode reads them: a file saved on Windows is the same prompt
        prompts = [Prompt(path.stem, text.replace("\r\n", "\n").replace("\r", "\n").strip("\n"))]
    if category is not None:
        known = sorted({p.category for p in prompts if p.category})
        prompts = [p for p in prompts if p.category == category]
        if not prompts:
            raise NgspecError(f"no prompts of category {category!r} in {source}; categories: {', '.join(known) or 'none'}")
    if per_category is not None:
        if per_category < 1:
            raise NgspecError("--per-category must be at least 1")
        seen: dict[str | None, int] = {}
        kept = []
        for p in prompts:
            seen[p.category] = seen.get(p.category, 0) + 1
            if seen[p.category] <= per_category:
                kept.append(p)
        prompts = kept
    if limit is not None:
        if limit < 1:
            raise NgspecError("--limit must be at least 1")
        prompts = prompts[:limit]
    return prompts


def prompt_input(prompt: Prompt, raw: bool = False) -> str | list[dict]:
    """What to encode for ``prompt``: its chat messages, or its text. Messages are a chat, so
    ``raw`` (text without the template) refuses them."""
    if not prompt.messages:
        return prompt.text
    if raw:
        raise NgspecError(f"prompt {prompt.id} is chat messages, which go through the chat template; --raw takes text prompts")
    return [dict(m) for m in prompt.messages]


def prompt_ids(tokenizer, prompt: Prompt, raw: bool = False) -> list[int]:
    """Token ids for ``prompt``: its chat messages through the chat template, or its text (see `encode`)."""
    given = prompt_input(prompt, raw)
    return encode(tokenizer, given, raw) if isinstance(given, str) else encode_messages(tokenizer, given)


def encode(tokenizer, text: str, raw: bool = False) -> list[int]:
    """Token ids for ``text``: wrapped in the chat template (when the tokenizer has one) unless raw."""
    check_text(text, "the prompt")
    if not raw and getattr(tokenizer, "chat_template", None):
        return encode_messages(tokenizer, [{"role": "user", "content": text}])
    return list(tokenizer(text)["input_ids"])


def joined_parts(messages: list) -> list:
    """``messages`` with each content given as a list of text parts (``[{"type": "text", "text":
    ...}]``, as OpenAI's clients send it) joined into one string; other parts (an image) are
    refused, since a text model cannot read them. Anything else is left for `check_messages`."""
    out = []
    for m in messages:
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, list):
            if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content):
                raise NgspecError('only text content parts ({"type": "text", "text": ...}) are supported')
            m = {**m, "content": "".join(p["text"] for p in content)}
        out.append(m)
    return out


def check_messages(messages: list) -> None:
    """Every chat message a dict with a string 'role' and a string 'content'."""
    bad = [m for m in messages if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str)]
    if bad:
        raise NgspecError(f"a chat message needs a 'role' and a 'content', both strings, not {short(bad[0])}")
    for i, message in enumerate(messages, 1):
        check_text(message["role"], f"chat message {i}'s role")
        check_text(message["content"], f"chat message {i}'s content")


def encode_messages(tokenizer, messages: list[dict]) -> list[int]:
    """Token ids for chat ``messages`` ({'role': ..., 'content': ...}, a content also as a list of
    text parts) through the chat template, ready for the assistant's answer."""
    if not getattr(tokenizer, "chat_template", None):
        raise NgspecError("chat messages need a tokenizer with a chat template; give text or token ids instead")
    messages = developer_as_system(tokenizer, joined_parts(messages))
    check_messages(messages)
    ids = apply_template(tokenizer, messages, add_generation_prompt=True, tokenize=True)
    if isinstance(ids, dict) or hasattr(ids, "input_ids"):
        ids = ids["input_ids"]
    return list(ids)


def developer_as_system(tokenizer, messages: list) -> list:
    """OpenAI's "developer" role, its newer name for the system prompt that recent clients send,
    as "system" where the chat template does not name it (SmolLM2's added its own system prompt
    and a "developer" turn the model never saw); a template that names it gets it as it is."""
    if "developer" in str(tokenizer.chat_template):
        return messages
    return [{**m, "role": "system"} if isinstance(m, dict) and m.get("role") == "developer" else m for m in messages]


def apply_template(tokenizer, messages: list[dict], **kwargs):
    """``tokenizer.apply_chat_template(messages, **kwargs)``, its failures in one line: a template
    jinja cannot read (a file cut short, a typo) named as the model's, and the template's own
    refusals (roles that must alternate, ...) as a refusal of these messages."""
    from jinja2 import TemplateSyntaxError  # transformers renders chat templates with jinja2

    try:
        return tokenizer.apply_chat_template(messages, **kwargs)
    except TemplateSyntaxError as exc:
        raise NgspecError(f"the model's chat template cannot be read (jinja: {exc}): check its chat_template.jinja or tokenizer_config.json") from exc
    except Exception as exc:  # the template's own checks (raise_exception) raise anything
        raise NgspecError(f"the chat template refused these messages: {exc}") from exc
