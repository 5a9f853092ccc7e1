"""Datastores: search against brute force, the on-disk format, building and its bad input."""

import json
import logging
import random
import re
from pathlib import Path

import numpy as np
import pytest

from ngspec.datastore.build import BuildOptions, build_datastore
from ngspec.datastore.corpus import detect_format, documents
from ngspec.datastore.index import Datastore
from ngspec.errors import NgspecError


def occurs_in(docs, query):
    n = len(query)
    return any(doc[s : s + n] == list(query) for doc in docs for s in range(len(doc) - n + 1))


def brute_longest_suffix(docs, context, max_len):
    best = 0
    for L in range(1, min(max_len, len(context)) + 1):
        if occurs_in(docs, context[-L:]):
            best = L
    return best


@pytest.mark.parametrize("min_len,max_len,vocab", [(1, 6, 4), (2, 11, 3), (3, 32, 2)])
def test_search_matches_brute_force(min_len, max_len, vocab):
    """Lengths are probed by doubling from ``min_len``, then by binary search. The cases match
    nothing, fewer tokens than ``min_len``, up to a dozen (small vocabularies make long matches),
    and the whole ``max_len`` (the first range)."""
    rng = random.Random(0)
    for _ in range(200):
        docs = [[rng.randrange(vocab) for _ in range(rng.randrange(0, 40))] for _ in range(rng.randrange(1, 5))]
        store = Datastore.from_documents(docs, vocab_size=10)
        context = [rng.randrange(vocab) for _ in range(rng.randrange(1, 40))]
        match = store.longest_suffix_match(context, min_len=min_len, max_len=max_len)
        expected = brute_longest_suffix(docs, context, max_len)
        if expected < min_len:
            assert match is None
            continue
        assert match.length == expected
        query = context[-expected:]
        assert match.count == sum(
            doc[s : s + expected] == query for doc in docs for s in range(len(doc) - expected + 1)
        )
        assert all(store.tokens[store.sa[i] : store.sa[i] + expected].tolist() == query for i in range(match.lo, match.hi))


def test_no_match_crosses_a_document_boundary():
    store = Datastore.from_documents([[1, 2], [3, 4]], vocab_size=10)
    assert store.occurs([1, 2]) and store.occurs([3, 4])
    assert not store.occurs([2, 3])
    assert store.longest_suffix_match([9, 2, 3], max_len=3).length == 1  # "3" alone, never "2 3"


def test_a_context_holding_the_separator_matches_only_after_it():
    """The separator id (above every real token; a context read from the store's own arrays may
    hold one) ends a document: a match never runs through it, so its continuation is read within
    one document, even at the arrays' end."""
    store = Datastore.from_documents([[1, 2], [3, 4]], vocab_size=10)
    sep = store.meta.separator
    assert store.longest_suffix_match([1, 2, sep], max_len=3) is None
    assert store.longest_suffix_match([3, 4, sep], min_len=1, max_len=3) is None
    match = store.longest_suffix_match([2, sep, 3], min_len=1, max_len=3)
    assert match.length == 1 and store.greedy_continuation(match, 4) == ([4], [1.0])


def test_large_vocabularies_use_32_bit_tokens():
    store = Datastore.from_documents([[70000, 65535, 3]], vocab_size=80000)
    assert store.tokens.dtype == np.uint32
    assert store.occurs([70000, 65535]) and store.tokens[0] == 70000
    assert Datastore.from_documents([[5]], vocab_size=49152).tokens.dtype == np.uint16
    # continuations read 32-bit ids too (ties to the smaller id: 5 before 70001)
    two = Datastore.from_documents([[70000, 65535, 3, 70001], [70000, 65535, 3, 5]], vocab_size=80000)
    assert two.greedy_continuation(two.longest_suffix_match([70000, 65535], 1, 4), 3) == ([3, 5], [1.0, 0.5])


@pytest.mark.parametrize(
    "record, fmt, responses, everything",
    [
        ({"instruction": "q", "response": "a"}, "magpie", ["a"], ["q", "a"]),
        ({"instruction": "q", "responses": ["a", "b"]}, "magpie", ["a", "b"], ["q", "a", "b"]),
        # Dolly's passage (context) and an Alpaca-like input beside a response are the user's text too
        ({"instruction": "q", "context": "c", "response": "a"}, "magpie", ["a"], ["q", "c", "a"]),
        ({"instruction": "q", "input": "x", "response": "a"}, "magpie", ["a"], ["q", "x", "a"]),
        ({"instruction_1": "q1", "response_1": "a1", "instruction_2": "q2", "response_2": "a2"}, "magpie", ["a1", "a2"], ["q1", "a1", "q2", "a2"]),
        ({"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}]}, "sharegpt", ["a"], ["q", "a"]),
        ({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}, "messages", ["a"], ["q", "a"]),
        ({"data": ["q", "a", "q2", "a2"]}, "ultrachat", ["a", "a2"], ["q", "a", "q2", "a2"]),
        ({"text": "t"}, "text", ["t"], ["t"]),
        # Alpaca (LLaMA-Factory's alpaca layout: an optional input, earlier turns in history) was
        # read as Magpie and gave no response: "none of its records holds an (input, response) pair"
        ({"instruction": "q", "input": "", "output": "a"}, "alpaca", ["a"], ["q", "a"]),
        ({"instruction": "q", "input": "x", "output": "a", "history": [["q0", "a0"]]}, "alpaca", ["a0", "a"], ["q0", "a0", "q\nx", "a"]),
        # TRL's prompt-completion records, text or conversational
        ({"prompt": "q", "completion": "a"}, "completion", ["a"], ["q", "a"]),
        # LMSYS-Chat-1M's and WildChat's `conversation` (refused: "cannot tell the corpus format"), and
        # ShareGPT-style `conversations` of role/content turns (skipped, silently)
        ({"conversation": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}, "sharegpt", ["a"], ["q", "a"]),
        ({"conversations": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}, "sharegpt", ["a"], ["q", "a"]),
        ({"messages": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}]}, "messages", ["a"], ["q", "a"]),
        # content as a list of parts (OpenAI's clients, multimodal datasets): such turns were skipped, silently
        ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "u"}}, {"type": "text", "text": "q"}]},
                       {"role": "assistant", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]}, "messages", ["ab"], ["q", "ab"]),
        ({"prompt": [{"role": "user", "content": "q"}], "completion": [{"role": "assistant", "content": "a"}]}, "completion", ["a"], ["q", "a"]),
    ],
)
def test_record_formats(record, fmt, responses, everything):
    assert detect_format(record) == fmt
    assert documents(record, fmt) == responses
    assert documents(record, fmt, include_user=True) == everything


def test_unknown_format_is_a_clear_error():
    with pytest.raises(NgspecError, match="--format"):
        detect_format({"foo": 1})
    with pytest.raises(NgspecError, match="--format"):
        BuildOptions(format="xml")


@pytest.fixture(scope="module")
def tokenizer(default_model):
    return default_model.tokenizer


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def small_store(tmp_path, tokenizer):
    """A datastore of one three-word document at ``tmp_path / "ds"``."""
    out = tmp_path / "ds"
    build_datastore(str(write_jsonl(tmp_path / "c.jsonl", [{"text": "one two three"}])), tokenizer, "smol", out, BuildOptions())
    return out


def test_a_corpus_of_any_layout_is_built_from_the_fields_named(tmp_path, tokenizer):
    """GSM8K's `question`/`answer` (and any layout no format knows) was refused ("cannot tell the
    corpus format"), with no way round but rewriting the file; `self-repetition` took
    --input-field/--response-field, `build-datastore` did not. Now it does: the named response
    (and, with --text all, the input) of every record."""
    from test_cli import invoke

    rows = [{"question": f"What is {i} times 7?", "answer": f"{i} times 7 is {i * 7}.\n#### {i * 7}"} for i in range(5)]
    corpus = write_jsonl(tmp_path / "gsm.jsonl", rows)
    meta = build_datastore(str(corpus), tokenizer, "smol", tmp_path / "ds", BuildOptions(response_field="answer"))
    answers = sum(len(tokenizer(r["answer"], add_special_tokens=False)["input_ids"]) for r in rows)
    assert (meta.records, meta.documents, meta.tokens) == (5, 5, answers) and meta.build_options["format"] == "fields"
    both = build_datastore(str(corpus), tokenizer, "smol", tmp_path / "ds-all", BuildOptions(response_field="answer", input_field="question", text="all"))
    assert both.documents == 10 and both.build_options["input_field"] == "question"
    with pytest.raises(NgspecError, match="--format detects a layout; --response-field names the field itself: give one"):
        BuildOptions(format="magpie", response_field="answer")
    with pytest.raises(NgspecError, match="--input-field needs --response-field"):
        BuildOptions(input_field="question")
    write_jsonl(tmp_path / "bad.jsonl", rows[:1] + [{"question": "q", "answer": 5}])
    with pytest.raises(NgspecError, match="record 2: 'answer' must be a string, not a number"):
        build_datastore(str(tmp_path / "bad.jsonl"), tokenizer, "smol", tmp_path / "ds-bad", BuildOptions(response_field="answer"))
    with pytest.raises(NgspecError, match="the corpus has no usable responses .*no record holds a string 'response'"):
        build_datastore(str(corpus), tokenizer, "smol", tmp_path / "ds-none", BuildOptions(response_field="response"))
    result = invoke("build-datastore", "-c", corpus, "--out", tmp_path / "ds-cli", "--response-field", "answer", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["documents"] == 5

def test_build_open_and_info(tmp_path, tokenizer):
    corpus = write_jsonl(tmp_path / "c.jsonl", [{"instruction": f"q{i}", "response": f"The answer number {i} is {i * 7}."} for i in range(30)])
    out = tmp_path / "ds"
    meta = build_datastore(str(corpus), tokenizer, "smol", out, BuildOptions())
    assert meta.records == 30 and meta.documents == 30 and meta.token_dtype == "uint16"
    store = Datastore.open(out, tokenizer)
    ids = tokenizer("The answer number 12", add_special_tokens=False)["input_ids"]
    match = store.longest_suffix_match(ids, max_len=len(ids))
    assert match is not None and match.length == len(ids)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.jsonl", "ds"]  # no temp dirs left

    from typer.testing import CliRunner

    from ngspec.cli.app import app

    result = CliRunner().invoke(app, ["datastore-info", str(out), "--json"])
    assert result.exit_code == 0 and json.loads(result.stdout)["tokens"] == meta.tokens


@pytest.mark.parametrize("spec,local", [
    ("corpora/magpie.jsonl", True), ("./corpus", True), ("/data/corpus", True), ("~/corpus", True), ("a/b/c", True),
    ("x.parquet", True), ("Magpie-Align/Magpie-Pro-300K-Filtered", False), ("squad", False),
])
def test_a_missing_local_corpus_is_not_asked_of_the_hub(spec, local, tmp_path, monkeypatch):
    """A path that cannot be a hub id fails at once when missing; hub-like names go to `datasets`."""
    from ngspec.datastore import corpus as corpus_module

    monkeypatch.chdir(tmp_path)
    assert corpus_module.looks_local(spec) == local
    asked = []
    monkeypatch.setattr(corpus_module, "_stream", lambda spec, load: asked.append(spec) or iter(()))
    if local:
        with pytest.raises(NgspecError, match=f"corpus not found: {spec}"):
            list(corpus_module.iter_records(spec))
        assert asked == []
    else:
        assert list(corpus_module.iter_records(spec)) == [] and asked == [spec]


def test_bad_builds_leave_nothing(tmp_path, tokenizer, monkeypatch):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    nofields = write_jsonl(tmp_path / "nofields.jsonl", [{"instruction": "q", "response": ""}])
    latin1 = tmp_path / "latin1.jsonl"
    latin1.write_bytes(b'{"text": "caf\xe9"}\n')
    for corpus in (empty, nofields, latin1, tmp_path / "missing.jsonl"):
        with pytest.raises(NgspecError):
            build_datastore(str(corpus), tokenizer, "smol", tmp_path / "out", BuildOptions())
        assert not (tmp_path / "out").exists()
    # a malformed record is named (its number, counted from 1) rather than crashing the tokeniser
    turns = [{"from": "human", "value": "q"}, {"from": "gpt", "value": "an answer"}]
    malformed = write_jsonl(tmp_path / "malformed.jsonl", [{"conversations": turns}] * 2 + [{"conversations": 3}])
    with pytest.raises(NgspecError, match="record 3: 'conversations' must be a list of turns, not a number"):
        build_datastore(str(malformed), tokenizer, "smol", tmp_path / "out", BuildOptions(batch_size=2))
    assert not (tmp_path / "out").exists()

    good = write_jsonl(tmp_path / "good.jsonl", [{"text": "hello world"}])
    import ngspec.datastore.build as build_module

    def interrupted(_tokens):
        raise KeyboardInterrupt

    monkeypatch.setattr(build_module, "suffix_array", interrupted)
    with pytest.raises(KeyboardInterrupt):
        build_datastore(str(good), tokenizer, "smol", tmp_path / "out", BuildOptions())
    assert not (tmp_path / "out").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out")]


@pytest.mark.parametrize("raised", [OSError("46791 requested and 0 written"), OSError(28, "No space left on device")])
def test_a_disk_that_fills_while_tokenising_is_named_at_the_output(tmp_path, tokenizer, monkeypatch, raised):
    """The tokens are written in a forked child: its OSError reaches the parent whole, where
    staging names the full device at the output, as for any other write (it said "tokenisation
    failed: OSError: 46791 requested and 0 written" on a full tmpfs: numpy's short write)."""
    import ngspec.datastore.build as build_module
    from ngspec import staging

    class Ids:
        def __len__(self):
            return 1

        def tofile(self, handle):
            raise type(raised)(*raised.args)

    monkeypatch.setattr(build_module, "pack_documents", lambda ids, dtype: Ids())
    monkeypatch.setattr(staging, "_free_bytes", lambda directory: 0)
    good = write_jsonl(tmp_path / "good.jsonl", [{"text": "hello world"}])
    with pytest.raises(OSError) as failed:
        build_datastore(str(good), tokenizer, "smol", tmp_path / "out", BuildOptions())
    assert staging.os_error_message(failed.value) == f"No space left on device: {tmp_path / 'out'}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["good.jsonl"]


def test_existing_output_needs_force_and_corruption_is_detected(tmp_path, tokenizer):
    corpus = write_jsonl(tmp_path / "c.jsonl", [{"text": "one two three"}, {"text": "four five"}])
    out = tmp_path / "ds"
    build_datastore(str(corpus), tokenizer, "smol", out, BuildOptions())
    with pytest.raises(NgspecError, match="--force"):
        build_datastore(str(corpus), tokenizer, "smol", out, BuildOptions())
    build_datastore(str(corpus), tokenizer, "smol", out, BuildOptions(), force=True)

    data = (out / "tokens.npy").read_bytes()
    (out / "tokens.npy").write_bytes(data[: len(data) - 4])
    with pytest.raises(NgspecError, match="corrupt or truncated"):
        Datastore.open(out)


def test_force_replaces_only_a_datastore(tmp_path, tokenizer, monkeypatch):
    """--force on a directory that is not a datastore (a mistyped --out: a project, the home
    directory, ".") is refused before any work: it would have been removed whole after the build."""
    corpus = write_jsonl(tmp_path / "c.jsonl", [{"text": "one two three"}])
    project = tmp_path / "project"
    project.mkdir()
    (project / "notes.txt").write_text("keep me")
    (project / "sa.npy").write_text("")
    with pytest.raises(NgspecError, match=fr"^{project} holds files other than a datastore's \(notes.txt\): --force replaces a datastore only; give another --out$"):
        build_datastore(str(corpus), tokenizer, "smol", project, BuildOptions(), force=True)
    assert (project / "notes.txt").read_text() == "keep me" and sorted(p.name for p in tmp_path.iterdir()) == ["c.jsonl", "project"]
    monkeypatch.chdir(project)
    for here in (".", "./", ".."):
        with pytest.raises(NgspecError, match="(is|holds) the current directory.*; give another --out$"):
            build_datastore(str(corpus), tokenizer, "smol", Path(here), BuildOptions(), force=True)
    empty = tmp_path / "empty"  # made ahead for the datastore, or a damaged datastore: replaced
    empty.mkdir()
    (project / "notes.txt").unlink()
    monkeypatch.chdir(tmp_path)
    for out in (empty, project):
        build_datastore(str(corpus), tokenizer, "smol", out, BuildOptions(), force=True)
        assert sorted(p.name for p in out.iterdir()) == ["meta.json", "sa.npy", "tokens.npy"]
    monkeypatch.chdir(empty)
    with pytest.raises(NgspecError, match="^. is the current directory: --force would remove it under the shell; give another --out$"):
        build_datastore(str(corpus), tokenizer, "smol", Path("."), BuildOptions(), force=True)
    with pytest.raises(NgspecError, match=f"^{tmp_path} holds the current directory"):
        build_datastore(str(corpus), tokenizer, "smol", tmp_path, BuildOptions(), force=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.jsonl", "empty", "project"]

    def removed(cls=None):
        raise FileNotFoundError(2, "No such file or directory")

    monkeypatch.setattr(Path, "cwd", classmethod(removed))  # run from a directory since removed
    build_datastore(str(corpus), tokenizer, "smol", empty, BuildOptions(), force=True)


@pytest.mark.parametrize("meta", [
    b"\x97\xff not text", b"[1, 2]", b"{not json", b'{"format_version": 1}', b"null",
    {"source": {"a": 1}}, {"build_options": "[/x]"}, {"vocab_size": "49152"}, {"documents": True}, {"token_dtype": "float64"},
    {"build_seconds": None}, {"tokenizer_fingerprint": 7}, {"vocab_size": -1}, {"vocab_size": 0}, {"documents": -2},
    {"separator": 7}, {"vocab_size": 70000},
])
def test_a_damaged_meta_file_is_named_in_one_message(tmp_path, tokenizer, meta):
    """A meta.json that is not UTF-8, or whose fields have the wrong types, is refused when the
    datastore is opened; they raised UnicodeDecodeError, AttributeError or Rich's
    NotRenderableError later (found by benchmarks/input_fuzz.py)."""
    out = small_store(tmp_path, tokenizer)
    if isinstance(meta, dict):
        meta = json.dumps({**json.loads((out / "meta.json").read_text()), **meta}).encode()
    (out / "meta.json").write_bytes(meta)
    with pytest.raises(NgspecError, match="meta.json is corrupt") as refused:
        Datastore.open(out)
    assert "__init__" not in str(refused.value)  # the field, not Python's words for it


@pytest.mark.parametrize("field, value, says", [
    ("vocab_size", "49152", r"'vocab_size' must be a whole number, not \"49152\"$"),
    ("build_seconds", None, r"'build_seconds' must be a number, not null$"),
    ("source", {"a": 1}, r"'source' must be a string, not \{\"a\": 1\}$"),
    ("documents", True, r"'documents' must be a whole number, not true$"),
    ("token_dtype", "float64", r"'token_dtype' must be \"uint16\" or \"uint32\", not \"float64\"$"),
])
def test_a_meta_field_of_the_wrong_type_is_named_in_jsons_words(tmp_path, tokenizer, field, value, says):
    """It said "must be of type int (got '49152')": Python's type names and quoting."""
    out = small_store(tmp_path, tokenizer)
    (out / "meta.json").write_text(json.dumps({**json.loads((out / "meta.json").read_text()), field: value}))
    with pytest.raises(NgspecError, match=f"meta.json is corrupt: {says}"):
        Datastore.open(out)


def test_a_datastore_of_another_format_version_says_so_before_its_fields(tmp_path, tokenizer):
    out = small_store(tmp_path, tokenizer)
    (out / "meta.json").write_text(json.dumps({"format_version": 2, "layout": "new"}))
    with pytest.raises(NgspecError, match="has datastore format 2; this ngspec reads 1"):
        Datastore.open(out)


def test_a_meta_file_names_its_missing_and_unknown_fields(tmp_path, tokenizer):
    out = small_store(tmp_path, tokenizer)
    meta = json.loads((out / "meta.json").read_text())
    del meta["vocab_size"], meta["source"], meta["created"]  # created has a default
    (out / "meta.json").write_text(json.dumps({**meta, "extra": 1}))
    with pytest.raises(NgspecError, match=r"meta.json is corrupt: missing 'source', 'vocab_size'; unknown 'extra'$"):
        Datastore.open(out)


@pytest.mark.parametrize("name", ["tokens.npy", "sa.npy"])
@pytest.mark.parametrize("content, says", [
    (b"", "it is empty"),
    # numpy took it for a pickle: "This file contains pickled (object) data. If you trust the file you can
    # load it unsafely ..." (input_fuzz run 13012)
    (b"\xa9\xec\xc9B\xaa\xdc" * 8, "not a .npy file"),
    (b"\x93NUMPY\x01\x00v\x00{'descr'", "EOF: reading array header, expected 118 bytes got 8"),
    (None, "Array can't be memory-mapped: Python objects in dtype."),
])
def test_a_damaged_array_file_is_named_in_one_message(tmp_path, tokenizer, name, content, says):
    out = small_store(tmp_path, tokenizer)
    if content is None:
        np.save(out / name, np.array([1, "a"], dtype=object), allow_pickle=True)
    else:
        (out / name).write_bytes(content)
    with pytest.raises(NgspecError) as refused:
        Datastore.open(out)
    assert str(refused.value) == f"{out / name} is corrupt or truncated ({says}); rebuild the datastore with `ngspec build-datastore`"


@pytest.mark.parametrize("name", ["tokens.npy", "sa.npy", "meta.json"])
def test_a_directory_in_place_of_a_datastore_file_is_named(tmp_path, tokenizer, name):
    out = small_store(tmp_path, tokenizer)
    (out / name).unlink()
    (out / name).mkdir()
    with pytest.raises(NgspecError) as refused:
        Datastore.open(out)
    assert str(refused.value) == f"{out / name} is a directory, not a file; rebuild the datastore with `ngspec build-datastore`"


@pytest.mark.parametrize("content, says", [
    (b"\xc3{}", "not UTF-8 text: byte 0 is 0xc3"),  # "'utf-8' codec can't decode byte 0xc3 in position 0" (input_fuzz run 12968)
    (b'{"source": ', "not valid JSON: Expecting value at line 1 column 12"),
])
def test_a_meta_file_that_is_not_json_says_where_in_its_own_words(tmp_path, tokenizer, content, says):
    out = small_store(tmp_path, tokenizer)
    (out / "meta.json").write_bytes(content)
    with pytest.raises(NgspecError) as refused:
        Datastore.open(out)
    assert str(refused.value) == f"{out}/meta.json is corrupt: {says}"


def test_datastore_from_another_tokenizer_is_refused(tmp_path, tokenizer):
    out = small_store(tmp_path, tokenizer)
    meta = json.loads((out / "meta.json").read_text())
    meta["tokenizer_fingerprint"] = "0" * 32
    (out / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(NgspecError, match="differs from this model's tokenizer"):
        Datastore.open(out, tokenizer)


def test_a_directory_of_files_with_different_extra_fields_reads_every_record(tmp_path):
    from ngspec.datastore.corpus import iter_records

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    # a self-written record and one answering a given prompt carry differently shaped metadata
    write_jsonl(corpus / "a.jsonl", [{"instruction": "q1", "response": "a1", "gen_input_configs": {"temperature": 1.0, "top_p": 0.99}}])
    write_jsonl(corpus / "b.jsonl", [{"instruction": "q2", "response": "a2", "gen_input_configs": {"source": "given"}}] * 2)
    assert [r["response"] for r in iter_records(str(corpus))] == ["a1", "a2", "a2"]
    (corpus / "empty.jsonl").write_text("")  # an empty file holds no records (datasets cannot even start on it)
    assert [r["response"] for r in iter_records(str(corpus))] == ["a1", "a2", "a2"]
    assert list(iter_records(str(corpus / "empty.jsonl"))) == []
    (corpus / "c.jsonl").write_text('{"instruction": "q3", "response": \n')
    with pytest.raises(NgspecError, match="c.jsonl"):  # the message names the unreadable file
        list(iter_records(str(corpus)))


def test_a_directory_whose_file_names_name_splits_gives_the_split_asked_for(tmp_path):
    """A dataset repository as the hub keeps it (`data/train-00000-of-00001.parquet` beside
    `data/test-...`, `train/`/`test/` folders, `train.jsonl` and `valid.jsonl`) was read whole:
    the test answers went into the datastore (and self-repetition's measure), and --split was
    ignored; a repository's `dataset_infos.json` stopped the build ("mixes json and parquet").
    Now the split is chosen as `datasets` reads the names; one that is not there is refused,
    naming those that are. A directory whose names name no split is read whole, as before."""
    import datasets

    from ngspec.datastore.corpus import iter_records

    rows = {split: [{"instruction": f"q {split} {i}", "response": f"a {split} {i}"} for i in range(2)] for split in ("train", "test")}
    repo = tmp_path / "repo"
    (repo / "data").mkdir(parents=True)
    for split, records in rows.items():
        datasets.Dataset.from_list(records).to_parquet(str(repo / "data" / f"{split}-00000-of-00001.parquet"))
    (repo / "dataset_infos.json").write_text('{"default": {"description": ""}}')
    (repo / "README.md").write_text("# a dataset card")
    folders = tmp_path / "folders"
    for split, records in rows.items():
        (folders / split).mkdir(parents=True)
        write_jsonl(folders / split / "part0.jsonl", records)
    names = tmp_path / "names"
    names.mkdir()
    write_jsonl(names / "train.jsonl", rows["train"])
    write_jsonl(names / "valid.jsonl", rows["test"])
    for where, other in ((repo, "test"), (folders, "test"), (names, "validation")):
        assert list(iter_records(str(where))) == rows["train"], where
        assert list(iter_records(str(where), other)) == rows["test"], where
        with pytest.raises(NgspecError, match=rf"{where.name} holds the splits {'test, train' if other == 'test' else 'train, validation'} "
                                              r"\(by its file names, as datasets reads them\) and no 'dev': choose one with --split"):
            list(iter_records(str(where), "dev"))
    from test_cli import invoke

    for command in (("build-datastore", "--corpus", folders, "--out", tmp_path / "ds"), ("self-repetition", "--dataset", folders)):
        result = invoke(*command, "--split", "dev")  # one line, exit 1, nothing built
        assert result.exit_code == 1 and "holds the splits test, train (by its file names" in result.stderr and "Traceback" not in result.output
    assert not (tmp_path / "ds").exists()
    plain = tmp_path / "plain"
    plain.mkdir()
    write_jsonl(plain / "a.jsonl", rows["train"])
    write_jsonl(plain / "b.jsonl", rows["test"])
    assert list(iter_records(str(plain), "test")) == rows["train"] + rows["test"]  # no split in the names: every file


@pytest.mark.parametrize("suffix,opener", [(".gz", "gzip"), (".bz2", "bz2"), (".xz", "lzma")])
def test_a_compressed_json_corpus_is_read_as_its_records(tmp_path, monkeypatch, suffix, opener):
    """`corpus.jsonl.gz` (a corpus kept compressed; the hub's `data/train-*.jsonl.gz`) was refused
    ("unsupported file type"), and a directory of them held "no .jsonl, .json or .parquet files",
    though `datasets` reads them. JSON lines and JSON documents compressed with gzip, bzip2 or xz
    are read as they are plain, split names and all; a damaged or cut-short file is one message
    naming it, and the lines of a malformed one are counted in its decompressed text."""
    import importlib

    from ngspec.datastore.corpus import iter_records

    module = importlib.import_module(opener)
    rows = [{"instruction": f"q {i}", "response": f"a {i}"} for i in range(3)]
    lines = "".join(json.dumps(r) + "\n" for r in rows).encode()
    (tmp_path / f"c.jsonl{suffix}").write_bytes(module.compress(lines))
    (tmp_path / f"c.json{suffix}").write_bytes(module.compress(json.dumps(rows, indent=1).encode()))
    assert list(iter_records(str(tmp_path / f"c.jsonl{suffix}"))) == rows
    assert list(iter_records(str(tmp_path / f"c.json{suffix}"))) == rows
    repo = tmp_path / "repo" / "data"
    repo.mkdir(parents=True)
    (repo / f"train-00000-of-00001.jsonl{suffix}").write_bytes(module.compress(lines))
    (repo / f"test-00000-of-00001.jsonl{suffix}").write_bytes(module.compress(lines[: lines.index(b"\n") + 1]))
    assert list(iter_records(str(repo.parent))) == rows
    assert list(iter_records(str(repo.parent), "test")) == rows[:1]
    whole = module.compress(lines + b'{"text": }\n')
    (tmp_path / f"bad.jsonl{suffix}").write_bytes(whole)
    with pytest.raises(NgspecError, match=rf"cannot read corpus .*bad.jsonl{re.escape(suffix)}:4: not valid JSON"):
        list(iter_records(str(tmp_path / f"bad.jsonl{suffix}")))
    (tmp_path / f"cut.jsonl{suffix}").write_bytes(module.compress(lines * 50)[:-20])
    with pytest.raises(NgspecError, match=rf"cannot read corpus .*cut.jsonl{re.escape(suffix)}: not a whole {opener_name(suffix)} file"):
        list(iter_records(str(tmp_path / f"cut.jsonl{suffix}")))
    (tmp_path / f"plain.jsonl{suffix}").write_bytes(lines)  # named compressed, written plain
    with pytest.raises(NgspecError, match=rf"cannot read corpus .*plain.jsonl{re.escape(suffix)}: not a whole {opener_name(suffix)} file"):
        list(iter_records(str(tmp_path / f"plain.jsonl{suffix}")))
    from test_cli import invoke

    monkeypatch.chdir(tmp_path)
    result = invoke("build-datastore", "--corpus", f"c.jsonl{suffix}")
    assert result.exit_code == 0, result.output
    assert (tmp_path / "datastores" / "c" / "meta.json").is_file()  # named as c.jsonl's would be
    result = invoke("build-datastore", "--corpus", tmp_path / f"cut.jsonl{suffix}", "--out", tmp_path / "ds-cut")
    assert result.exit_code == 1 and "not a whole" in result.stderr and "Traceback" not in result.output
    assert not (tmp_path / "ds-cut").exists()


def opener_name(suffix):
    return {".gz": "gzip", ".bz2": "bzip2", ".xz": "xz"}[suffix]


def test_a_corpus_compressed_in_a_way_not_read_is_named(tmp_path):
    from ngspec.datastore.corpus import iter_records

    (tmp_path / "c.jsonl.zst").write_bytes(b"(\xb5/\xfd")
    with pytest.raises(NgspecError, match=r"c.jsonl.zst: unsupported file type \(use .jsonl, .json or .parquet, or .jsonl or .json compressed with gzip, bzip2 or xz: .gz, .bz2, .xz\)"):
        list(iter_records(str(tmp_path / "c.jsonl.zst")))
    (tmp_path / "c.parquet.gz").write_bytes(b"")
    with pytest.raises(NgspecError, match=r"c.parquet.gz: unsupported file type"):
        list(iter_records(str(tmp_path / "c.parquet.gz")))
    with pytest.raises(NgspecError, match=r"holds no corpus files \(it reads .jsonl, .json or .parquet, or .jsonl or .json compressed"):
        list(iter_records(str(tmp_path)))  # neither counts as a corpus file


@pytest.mark.parametrize("kind,packed", [("gzip", lambda b: __import__("gzip").compress(b)), ("bzip2", lambda b: __import__("bz2").compress(b)),
                                         ("xz", lambda b: __import__("lzma").compress(b)), ("zstd", lambda b: b"(\xb5/\xfd" + b)])
def test_a_compressed_file_not_named_so_is_said_to_be_compressed(tmp_path, kind, packed):
    """A corpus or prompt file saved compressed under a plain name (`curl -o c.jsonl` of a
    `.jsonl.gz`) was "not valid UTF-8" or "a record must be a JSON object (the line starts
    'BZh91AY&SY...')": the message now says what the file is and what to do."""
    from ngspec.datastore.corpus import iter_records
    from ngspec.prompts import load_prompts

    lines = b'{"instruction": "q", "response": "a"}\n' * 50
    (tmp_path / "c.jsonl").write_bytes(packed(lines))
    named = f"name it c.jsonl.{dict(gzip='gz', bzip2='bz2', xz='xz')[kind]} to read it as such" if kind != "zstd" else "decompress it first"
    with pytest.raises(NgspecError, match=rf"c.jsonl:1: not valid (UTF-8|JSON): the file is compressed with {kind}; {named}$"):
        list(iter_records(str(tmp_path / "c.jsonl")))
    (tmp_path / "p.jsonl").write_bytes(packed(b'{"prompt": "Say hi"}\n'))
    with pytest.raises(NgspecError, match=rf"p.jsonl is not valid UTF-8: the file is compressed with {kind}; decompress it"):
        load_prompts(tmp_path / "p.jsonl")



def test_a_corpus_named_in_capitals_or_ndjson_is_read(tmp_path):
    """`C.JSONL`, `C.JSONL.GZ` and `c.ndjson` (JSON lines' other name) were "unsupported file
    type", and a directory of them held no corpus files, though `datasets` reads them."""
    import gzip

    from ngspec.datastore.corpus import iter_records

    rows = [{"instruction": "q", "response": "a"}]
    for name in ("C.JSONL", "c.ndjson", "C.Json"):
        write_jsonl(tmp_path / name, rows)
    (tmp_path / "C.JSONL.GZ").write_bytes(gzip.compress(b'{"instruction": "q", "response": "a"}\n'))
    for name in ("C.JSONL", "c.ndjson", "C.Json", "C.JSONL.GZ"):
        assert list(iter_records(str(tmp_path / name))) == rows, name
    assert list(iter_records(str(tmp_path))) == rows * 4

def test_a_dataset_saved_with_save_to_disk_is_read_as_its_records(tmp_path):
    """`Dataset.save_to_disk` (the `datasets` way to keep a processed corpus) writes arrow files
    beside JSON metadata: the metadata was read as the corpus ("cannot tell the corpus format
    from fields ['citation', 'description', ...]"). A saved Dataset is read with
    `load_from_disk`; a saved DatasetDict gives the split asked for, and names its splits when
    it has no such one; a directory holding one among other files is refused with where it is."""
    import datasets

    from ngspec.datastore.corpus import iter_records

    rows = [{"instruction": "q1", "response": "a1"}, {"instruction": "q2", "response": "a2"}]
    one = datasets.Dataset.from_list(rows)
    one.save_to_disk(str(tmp_path / "saved"))
    assert list(iter_records(str(tmp_path / "saved"))) == rows
    datasets.DatasetDict({"train": one, "test": one.select([1])}).save_to_disk(str(tmp_path / "dict"))
    assert list(iter_records(str(tmp_path / "dict"))) == rows
    assert list(iter_records(str(tmp_path / "dict"), "test")) == rows[1:]
    with pytest.raises(NgspecError, match=r"dict is a DatasetDict saved by datasets' save_to_disk with the splits test, train and no 'validation'"):
        list(iter_records(str(tmp_path / "dict"), "validation"))
    (tmp_path / "mixed").mkdir()
    write_jsonl(tmp_path / "mixed" / "a.jsonl", rows)
    one.save_to_disk(str(tmp_path / "mixed" / "inner"))
    with pytest.raises(NgspecError, match=r"mixed holds a dataset saved by datasets' save_to_disk \(.*inner\): give that directory as the corpus"):
        list(iter_records(str(tmp_path / "mixed")))


@pytest.mark.parametrize("where", ["leading", "between", "trailing"])
def test_blank_lines_in_a_file_whose_field_changes_type_are_skipped(tmp_path, where):
    """datasets 5.2 re-reads a block whose field changes type (``"id"`` text, then a number) line
    by line and stopped on a blank line there ("Expected object or value"; input_fuzz run 12953)."""
    from ngspec.datastore.corpus import iter_records

    rows = [{"id": "q-1", "instruction": "q1", "response": "a1"}, {"id": 2, "instruction": "q2", "response": "a2"}]
    lines = [json.dumps(row) for row in rows]
    text = {"leading": "\n" + "\n".join(lines) + "\n", "between": lines[0] + "\n\n  \n" + lines[1] + "\n",
            "trailing": "\n".join(lines) + "\n\n"}[where]
    path = tmp_path / "c.jsonl"
    path.write_text(text)
    assert list(iter_records(str(path))) == rows
    assert path.read_text() == text  # the user's file is left as it was
    assert [p.name for p in tmp_path.iterdir()] == ["c.jsonl"]


def test_a_field_that_changes_type_past_the_first_ten_megabytes_keeps_every_value_as_written(tmp_path):
    """datasets 5.2 streamed 10 MB blocks typed by the first: a block where ``response`` turned from
    text to a number came back with every response of that block as its JSON text, quotes and
    escapes included ('"a\\nb"'), silently (thousands of records of a 12 MB file)."""
    from ngspec.datastore.corpus import iter_records

    rows = [{"instruction": f"q{i}", "response": f"line one\nline two of answer {i} " + "x" * 160} for i in range(60_000)]
    rows += [{"instruction": "odd", "response": 5}, {"instruction": "last", "response": "plain \"text\""}]
    path = tmp_path / "c.jsonl"
    with path.open("w") as f:
        f.writelines(json.dumps(row) + "\n" for row in rows)
    assert path.stat().st_size > 11 << 20
    assert list(iter_records(str(path))) == rows


def test_a_record_nested_past_pythons_recursion_limit_is_refused_by_its_line(tmp_path):
    from ngspec.datastore.corpus import iter_records

    path = tmp_path / "c.jsonl"
    path.write_text('{"response": "a1"}\n{"response": ' + "[" * 100_000 + "]" * 100_000 + "}\n")
    with pytest.raises(NgspecError, match=r"c\.jsonl:2: its JSON is nested too deeply to read$"):
        list(iter_records(str(path)))


def test_a_blank_line_does_not_hide_a_malformed_one(tmp_path):
    from ngspec.datastore.corpus import iter_records

    path = tmp_path / "c.jsonl"
    path.write_text('{"id": "q-1", "response": "a1"}\n\n{"id": 2, "response": "a2"}\n{"id": 3, "response": \n')
    with pytest.raises(NgspecError, match=r"c\.jsonl:4: not valid JSON"):
        list(iter_records(str(path)))


@pytest.mark.parametrize("name", ["corpus[v2].jsonl", "what?.jsonl", "all*.jsonl", "dir[1]/c.jsonl"])
def test_a_corpus_whose_path_holds_glob_characters_is_read_whole(tmp_path, name):
    """`datasets` reads data_files as glob patterns: ``corpus[v2].jsonl`` matched no file, and the
    build said the corpus had no usable responses (0 records)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from ngspec.datastore.corpus import iter_records

    path = tmp_path / name
    path.parent.mkdir(exist_ok=True)
    write_jsonl(path, [{"instruction": "q1", "response": "a1"}, {"instruction": "q2", "response": "a2"}])
    (path.parent / "corpusv.jsonl").write_text('{"response": "beside"}\n')  # what [v2] would match as a pattern
    assert [r["response"] for r in iter_records(str(path))] == ["a1", "a2"]
    assert sorted(r["response"] for r in iter_records(str(path.parent))) == ["a1", "a2", "beside"]
    parquet = path.with_suffix(".parquet")
    pq.write_table(pa.table({"response": ["p1"]}), parquet)
    assert [r["response"] for r in iter_records(str(parquet))] == ["p1"]


def test_an_empty_parquet_file_holds_no_records_and_a_broken_one_is_one_line(tmp_path, capfd):
    """A parquet file of no rows is read as no records, as an empty .jsonl is (datasets failed on
    it: "BatchSize must be greater than 0, got 0"), and datasets' own log line about a file it
    cannot read is not printed above ngspec's one message (found by benchmarks/input_fuzz.py)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from ngspec.datastore.corpus import iter_records

    pq.write_table(pa.Table.from_pylist([]), tmp_path / "empty.parquet")
    pq.write_table(pa.table({"response": ["a1"]}), tmp_path / "one.parquet")
    assert list(iter_records(str(tmp_path / "empty.parquet"))) == []
    assert [r["response"] for r in iter_records(str(tmp_path))] == ["a1"]
    (tmp_path / "one.parquet").write_bytes((tmp_path / "one.parquet").read_bytes()[:-30] + b"PAR1")
    capfd.readouterr()
    with pytest.raises(NgspecError, match="cannot read corpus .*one.parquet"):
        list(iter_records(str(tmp_path)))
    assert capfd.readouterr().err == ""


@pytest.mark.parametrize("first", ["NaN", "1", "null", '"text"', "[1, 2]", "\ufeffNaN"])
def test_a_json_lines_record_that_is_not_an_object_is_refused_by_its_line(tmp_path, first):
    """A line that is not an object, followed by a field that changes type, crashed the process
    inside pyarrow's JSON reader (a segmentation fault, through datasets 5.2 and pyarrow 26; found
    by benchmarks/input_fuzz.py run 1349); JSON lines are now read by Python's reader, and such a
    line is refused by its number (in a child process, so a crash would show as one)."""
    import subprocess
    import sys

    corpus = tmp_path / "c.jsonl"
    corpus.write_text(f'{{"response": "a1"}}\n\n{first}\n{{"c": -1}}\n{{"c": [1]}}\n', encoding="utf-8")
    code = f"from ngspec.datastore.corpus import iter_records\nlist(iter_records({str(corpus)!r}))"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode == 1 and f"cannot read corpus {corpus}:3: a record must be a JSON object" in run.stderr
    assert "Segmentation" not in run.stderr


def test_a_json_document_corpus_is_not_read_as_lines(tmp_path):
    from ngspec.datastore.corpus import iter_records

    corpus = tmp_path / "c.json"
    corpus.write_text('\n[\n  {"response": "a1"},\n  {"response": "a2"}\n]\n')
    assert [r["response"] for r in iter_records(str(corpus))] == ["a1", "a2"]
    corpus.write_text('\ufeff{\n  "response": "a3"\n}\n', encoding="utf-8")
    assert [r["response"] for r in iter_records(str(corpus))] == ["a3"]
    lines = tmp_path / "c.jsonl"
    lines.write_text('{"response": "cut\nNaN\n{"c": -1}\n{"c": [1]}\n')  # a first line cut short is not a document
    with pytest.raises(NgspecError, match=r"c.jsonl:1: not valid JSON \(Unterminated string"):
        list(iter_records(str(lines)))


def _check_fails(tokens, sa, meta, message):
    from ngspec.datastore.format import check_arrays

    with pytest.raises(NgspecError, match=message):
        check_arrays(tokens, sa, meta)


def test_the_content_check_passes_a_good_store_and_names_each_kind_of_damage():
    """`datastore-info` checks contents, not only sizes: ids in range, one separator per document,
    the suffix array a permutation of the positions, and sampled neighbours in suffix order. A
    store damaged in place would otherwise search silently wrong (never out of bounds)."""
    from ngspec.datastore.format import check_arrays

    rng = random.Random(1)
    docs = [[rng.randrange(6) for _ in range(rng.randrange(1, 40))] for _ in range(30)]
    store = Datastore.from_documents(docs, vocab_size=10)
    tokens, sa, meta = np.array(store.tokens), np.array(store.sa), store.meta
    assert check_arrays(tokens, sa, meta, sample=len(sa)) == len(sa) - 1  # every neighbour pair compared

    bad = tokens.copy()
    bad[3] = 12  # above the vocabulary, not the separator
    _check_fails(bad, sa, meta, "token id 12 at position 3 is outside the vocabulary")
    bad = tokens.copy()
    bad[int(np.flatnonzero(tokens == meta.separator)[0])] = 1  # a document's end overwritten
    _check_fails(bad, sa, meta, "29 document separators, meta.json says 30")
    bad = sa.copy()
    bad[5] = len(sa) + 7
    _check_fails(tokens, bad, meta, "points outside the tokens")
    bad = sa.copy()
    bad[5] = bad[6]
    _check_fails(tokens, bad, meta, "not a permutation")
    bad = sa.copy()
    bad[[0, -1]] = bad[[-1, 0]]  # a swap keeps the permutation but breaks the order
    with pytest.raises(NgspecError, match="out of suffix order"):
        check_arrays(tokens, bad, meta, sample=len(sa))


def test_datastore_info_checks_contents(tmp_path, tokenizer):
    from typer.testing import CliRunner

    from ngspec.cli.app import app

    corpus = write_jsonl(tmp_path / "c.jsonl", [{"instruction": f"q{i}", "response": f"The answer number {i} is {i * 7}."} for i in range(30)])
    out = tmp_path / "ds"
    build_datastore(str(corpus), tokenizer, "smol", out, BuildOptions())
    result = CliRunner().invoke(app, ["datastore-info", str(out), "--json"])
    assert result.exit_code == 0 and json.loads(result.stdout)["checked"]["neighbours_in_order"] > 0
    sa = np.load(out / "sa.npy")
    sa[3] = 10**6
    np.save(out / "sa.npy", sa)
    result = CliRunner().invoke(app, ["datastore-info", str(out)])
    assert result.exit_code == 1 and "points outside the tokens" in result.stderr and "rebuild it" in result.stderr
    meta = json.loads((out / "meta.json").read_text())
    (out / "meta.json").write_text(json.dumps({**meta, "records": " "}))  # it said "must be of type int (got ' ')"
    result = CliRunner().invoke(app, ["datastore-info", str(out)])
    assert result.exit_code == 1 and "meta.json is corrupt: 'records' must be a whole number, not \" \"" in result.stderr


@pytest.mark.parametrize(
    "name, data, says",
    [
        # pyarrow named this line "row 1" of its block, and a line 200,001 deep "row 49183"
        ("lines.jsonl", b'{"text": "a"}\n\n{"text": "b"}\n{"text": }\n{"text": "c"}\n', r"lines.jsonl:4: not valid JSON \(Expecting value at column 10\)"),
        ("latin1.jsonl", b'{"text": "a"}\n{"text": "caf\xe9"}\n', r"latin1.jsonl:2: not valid UTF-8"),
        ("array.json", b'[{"text": "a"},\n {"text": }]', r"array.json:2:11: not valid JSON \(Expecting value\)"),
        # datasets said "Failed to convert pandas DataFrame to Arrow Table from file ..." (input_fuzz run 2840)
        ("items.json", b'[1.5, {"data": ["a", "b"]}, {"text": "c", "response": {}}]', r"items.json: item 0 of its array is not a record \(a JSON object\) but 1.5"),
        # quoted as written, not as "\u00e9t\u00e9"
        ("words.json", '[{"text": "a"}, "été"]'.encode(), r'words.json: item 1 of its array is not a record \(a JSON object\) but "été"'),
        # a JSON-lines file whose first line is a stray array said "stray.jsonl:2:1: not valid JSON (Extra data)" (input_fuzz run 14685)
        ("stray.jsonl", b'[1, 2]\n{"text": "a"}\n', r"stray.jsonl:1: a record must be a JSON object \(the line starts '\[1, 2\]'\)"),
        # a first line nested too deeply stopped with Python's "RecursionError: maximum recursion depth exceeded ..."
        ("deepfirst.jsonl", b'{"text": ' + b"[" * 100_000 + b"]" * 100_000 + b"}\n", r"deepfirst.jsonl:1: its JSON is nested too deeply to read"),
        ("deep.json", b'[{"text": ' + b"[" * 100_000 + b"]" * 100_000 + b"}]", r"deep.json: its JSON is nested too deeply to read"),
        # half of a UTF-16 pair: the tokenizer said "tokenisation failed: TypeError: TextEncodeInput must be Union[...]"
        ("lone.jsonl", b'{"text": "a \\ud83d\\ude00"}\n{"conversations": [{"value": "a"}, {"value": "b \\uD83D c"}]}\n',
         r"lone.jsonl:2: field conversations\[1\].value holds a lone surrogate \(\\ud83d at character 2\)"),
        ("lone.json", b'[{"text": "a"}, {"text": "\\udc00"}]', r"lone.json: item 1 of its array: field text holds a lone surrogate \(\\udc00 at character 0\)"),
        ("key.json", b'{"te\\udc00xt": "a"}', r"key.json:1: field 'te\\udc00xt' \(its name\) holds a lone surrogate"),
    ],
)
def test_a_malformed_json_corpus_is_named_by_its_line_in_one_message(tmp_path, capfd, name, data, says):
    """The line that breaks the file, counted from 1, in ngspec's one message: `datasets` logged
    its own line before it ("Failed to load JSON from file ...") and counted rows within a block."""
    from ngspec.datastore.corpus import iter_records

    (tmp_path / name).write_bytes(data)
    with pytest.raises(NgspecError, match=f"cannot read corpus {re.escape(str(tmp_path))}/{says}"):
        list(iter_records(str(tmp_path / name)))
    assert "Failed to" not in "".join(capfd.readouterr())
    assert logging.getLogger("datasets.packaged_modules.json.json").filters == []  # the rest of the process hears datasets


def test_a_corpus_that_python_reads_but_pyarrow_does_not_keeps_the_readers_message(tmp_path):
    from ngspec.datastore.corpus import iter_records

    pretty = tmp_path / "one.json"  # one document over several lines: no line of it is JSON alone
    pretty.write_text('{\n  "text": "a"\n}\n')
    assert list(iter_records(str(pretty))) == [{"text": "a"}]
    lines = tmp_path / "ok.jsonl"  # JSON lines are read by Python's reader, as it reads them
    lines.write_text('{"text": "a"}\n  \n{"text": NaN}\n')
    assert [type(r["text"]) for r in iter_records(str(lines))] == [str, float]


def test_a_json_document_whose_field_changes_type_keeps_its_strings_as_written(tmp_path):
    """`datasets` 5.2 read such an array as one block typed as strings, and gave every value of the
    field, strings included, as its JSON text: "answer" came back as '"answer"' and a newline as
    backslash-n, with no word said."""
    from ngspec.datastore.corpus import iter_records

    records = [{"instruction": "q", "response": 'a "quoted"\nanswer'}, {"instruction": 5, "response": ["a list"]}]
    array = tmp_path / "mixed.json"
    array.write_text(json.dumps(records, indent=1))
    assert list(iter_records(str(array))) == records
    one = tmp_path / "one.json"  # one object over several lines is one record
    one.write_text(json.dumps(records[0], indent=1))
    assert list(iter_records(str(one))) == records[:1]
    (tmp_path / "empty.json").write_text("[\n]\n")
    assert list(iter_records(str(tmp_path / "empty.json"))) == []


@pytest.mark.parametrize(("code", "says"), [
    (-9, "was killed (SIGKILL); out of memory?"), (-11, "crashed (SIGSEGV, exit code -11)"), (3, "died (exit code 3)"),
])
def test_how_the_tokenising_process_ended_is_said_as_it_was(code, says):
    """A segmentation fault in the reader was reported as 'exit code -11; out of memory?'."""
    from ngspec.datastore.build import died

    assert died(code) == says


def test_a_build_whose_tokenising_process_crashes_says_so_and_leaves_nothing(tmp_path, tokenizer, monkeypatch):
    import faulthandler
    import os
    import signal

    import ngspec.datastore.build as build

    def crash(*args, **kwargs):
        faulthandler.disable()  # pytest's handler would print the child's stack
        os.kill(os.getpid(), signal.SIGSEGV)

    monkeypatch.setattr(build, "tokenize_to_file", crash)
    corpus = write_jsonl(tmp_path / "c.jsonl", [{"text": "one two three"}])
    with pytest.raises(NgspecError, match=r"the tokenising process crashed \(SIGSEGV"):
        build_datastore(str(corpus), tokenizer, "smol", tmp_path / "ds", BuildOptions())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.jsonl"]


@pytest.mark.parametrize("layout", ["lines", "array"])
def test_the_corpus_reading_benchmark_compares_both_readers(tmp_path, monkeypatch, capsys, layout):
    import sys

    from conftest import benchmark_script

    corpus_read = benchmark_script("corpus_read")
    monkeypatch.setattr(sys, "argv", ["corpus_read.py", "--records", "20", "--repeats", "1", "--layout", layout, "--out", str(tmp_path)])
    assert corpus_read.main() == 0
    result = json.loads((tmp_path / "corpus_read.json").read_text())
    assert result["layout"] == layout and result["records"] == 22
    assert result["ngspec"]["changed"] == 0 and result["ngspec"]["records"] == 22
    assert result["datasets"]["records"] == 22


def test_a_path_option_written_with_a_tilde_means_the_home_directory(tmp_path, monkeypatch):
    """`--out=~/ds` reaches ngspec with its `~` (a shell expands it only at a word's start), and
    was made as a directory named `~` under the current one (which a later `rm -rf ~` would
    take the home directory for); corpus and model paths already read `~` as home."""
    from typer.testing import CliRunner

    from ngspec.cli.app import app

    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(work)
    write_jsonl(home / "c.jsonl", [{"text": "one two three"}])
    built = CliRunner().invoke(app, ["build-datastore", "--corpus", "~/c.jsonl", "--out=~/ds"])
    assert built.exit_code == 0, built.output
    assert sorted(p.name for p in (home / "ds").iterdir()) == ["meta.json", "sa.npy", "tokens.npy"]
    assert list(work.iterdir()) == []
    shown = CliRunner().invoke(app, ["datastore-info", "~/ds", "--json"])
    assert shown.exit_code == 0 and json.loads(shown.stdout)["records"] == 1
