"""User-facing errors: anything raised as `NgspecError` is shown as one clear line by the CLI; and
how such messages quote what they refuse."""

import json
import os
import re

NULL = type(None)


class NgspecError(Exception):
    """An error caused by the user's input or environment, with a message meant for them."""


class Stopped(Exception):
    """Ctrl-C (or SIGTERM) during a long measurement that had finished part of it whole:
    ``measured`` is that part (`bench`'s prompts or rounds, `profile-bound`'s groups of cells),
    for the command to report before it exits non-zero."""

    def __init__(self, measured):
        super().__init__("interrupted")
        self.measured = measured


# how a compressed file starts (its "magic number"), by what compressed it
_MAGIC = re.compile(rb"(?P<gzip>\x1f\x8b)|(?P<bzip2>BZh[1-9]1AY&SY)|(?P<xz>\xfd7zXZ\x00)|(?P<zstd>\x28\xb5\x2f\xfd)")


def compressed_with(head: bytes) -> str | None:
    """What compressed a file whose first bytes are ``head`` (10 are enough): gzip, bzip2, xz or
    zstd; None for none of them."""
    found = _MAGIC.match(head)
    return found.lastgroup if found else None


def json_error(exc: json.JSONDecodeError) -> str:
    """JSON's message without its dangling "at" ("Unterminated string starting at"), for a message
    that goes on with the place."""
    return exc.msg.removesuffix(" at")


def json_text_problem(exc: ValueError) -> str:
    """What a `UnicodeDecodeError` or `json.JSONDecodeError` found in a file, saying where, in the
    words of the file rather than Python's ("'utf-8' codec can't decode byte 0xc3 in position 0")."""
    if isinstance(exc, UnicodeDecodeError):
        return f"not UTF-8 text: byte {exc.start} is {exc.object[exc.start]:#04x}"
    if isinstance(exc, json.JSONDecodeError):
        return f"not valid JSON: {json_error(exc)} at line {exc.lineno} column {exc.colno}"
    return first_sentence(exc)


def check_text(text: str, what: str) -> str:
    """``text``, refused where it is not Unicode text: where it holds a lone surrogate, half of a
    UTF-16 pair (a JSON escape such as ``\\ud83d`` cut from its other half, or a byte that was not
    UTF-8 read from the command line). Tokenizers and UTF-8 cannot take one: transformers' fast
    tokenizers raised "TextEncodeInput must be Union[...]"."""
    at = lone_surrogate_at(text)
    if at is not None:
        raise NgspecError(
            f"{what} holds a lone surrogate (\\u{ord(text[at]):04x} at character {at}), half of a UTF-16 pair "
            "and not text (a JSON escape cut from its other half?): remove or replace it"
        )
    return text


def lone_surrogate_at(text: str) -> int | None:
    """Where ``text`` holds its first lone surrogate (see `check_text`); None when it holds none."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return exc.start
    return None


def shown(value: object) -> str:
    """A value as a message shows it: as Python writes it when short, else by its type."""
    text = repr(value)
    return text if len(text) <= 40 else kind_of(value)


def kind_of(value: object) -> str:
    """"a list", "an int": a value by its type's name, with its article."""
    name = type(value).__name__
    return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}"


def json_kind(value: object) -> str:
    """What a value read from JSON is, in JSON's words ("null", "a number", "a JSON object"), for a
    message that says what a field holds instead of what it should; Python's names ("NoneType",
    "dict") mean nothing to whoever wrote the file. Other types (a Parquet reader's) by name."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    for kinds, words in (((int, float), "a number"), (str, "a string"), ((list, tuple), "a list"), (dict, "a JSON object")):
        if isinstance(value, kinds):
            return words
    return kind_of(value)


JSON_KINDS = {bool: "true or false", int: "a whole number", float: "a number", str: "a string", dict: "a JSON object", list: "a list", NULL: "null"}


def json_kinds(types: tuple[type, ...]) -> str:
    """``(int, float, NULL)`` as "a number or null"."""
    names = [JSON_KINDS[t] for t in types if not (t is int and float in types)]
    return " or ".join([", ".join(names[:-1]), names[-1]] if len(names) > 2 else names)


def short(value: object, limit: int | None = 40) -> str:
    """A JSON value as a message quotes it, cut at ``limit`` characters (what JSON cannot hold, such
    as a config's numpy number set in Python, as Python writes it)."""
    return json.dumps(value, ensure_ascii=False, default=repr)[:limit]


def first_sentence(exc: Exception) -> str:
    """What a file reader said, without its class name ("SafetensorError: ...") or torch's
    paragraphs of advice (to load with weights_only=False, to report a miniz error)."""
    text = str(exc).strip()
    if not text:
        return "it ends early" if isinstance(exc, EOFError) else type(exc).__name__
    return re.split(r"(?<=\.)\s", text.splitlines()[0])[0]


_SIZE = r"([\d.]+ ?[KMGT]?i?B)"
_OOM_WORDS = re.compile(r"out of memory|can't allocate memory|not enough memory", re.IGNORECASE)


def out_of_memory(exc: BaseException, less: str = "") -> str | None:
    """One line for an allocation that failed, or None for anything else: torch's CUDA error
    ("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 GiB of
    which 1.06 GiB is free. ..." and a paragraph more), its CPU allocator's ("[enforce fail at
    alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: you tried to allocate
    13960068 bytes. Error code 12 ..."), or Python's MemoryError. ``less``: the options that ask
    for less memory at once, for the advice."""
    text = str(exc)
    if not isinstance(exc, MemoryError) and not (isinstance(exc, RuntimeError) and _OOM_WORDS.search(text)):
        return None
    gpu = re.search(r"\bGPU (\d+)", text)
    where = f"on GPU {gpu.group(1)}" if gpu else "on the GPU" if "CUDA" in text else "on the CPU"
    size, count = re.search(r"[Tt]ried to allocate " + _SIZE, text), re.search(r"tried to allocate (\d+) bytes", text)
    asked = size.group(1) if size else f"{int(count.group(1)) / 2**20:.1f} MiB" if count else None
    free = re.search(r"total capacity of " + _SIZE + r" of which " + _SIZE + " is free", text)
    said = f"out of memory {where}" + (f": torch could not allocate {asked} more" if asked else "") + (
        f" ({free.group(2)} of {free.group(1)} free)" if free else "")
    advice = f"ask for less at once: {less}; or free memory" if less else "ask for less at once, or free memory"
    if "expandable_segments" in text:
        advice += " (torch also suggests PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True against fragmentation)"
    return f"{said}; {advice}"


def env_switch(name: str) -> bool:
    """Whether the environment turns ``name`` on (NGSPEC_DEBUG, NGSPEC_RECALIBRATE, ...): set to
    anything but empty, 0, false, no or off. ``NGSPEC_DEBUG=0`` used to turn tracebacks on."""
    return os.environ.get(name, "").strip().lower() not in ("", "0", "false", "no", "off")
