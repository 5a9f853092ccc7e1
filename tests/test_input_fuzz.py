"""`benchmarks/input_fuzz.py`: its verdicts tell a clear refusal from a crash or a file left
behind, its draws reach every kind of input and every command, and a short search runs end to end
on a tiny saved model."""

import json
import random
import sys
from types import SimpleNamespace

import pytest

from conftest import benchmark_script

input_fuzz = benchmark_script("input_fuzz")


@pytest.mark.parametrize(
    ("code", "output", "left", "verdict"),
    [
        (0, "wrote ds\n", [], "ok"),
        (1, "error: corpus not found: x.jsonl\n", [], "refused"),
        (1, "error: Is a directory: /h/config.json (set NGSPEC_DEBUG=1 for the traceback)\n", [], "refused"),  # an OSError, said clearly
        (2, "Usage: ngspec generate\nError: Invalid value for '--k'\n", [], "refused"),
        (1, "error: AttributeError: 'str' object has no attribute 'items' (set NGSPEC_DEBUG=1 for the traceback)\n", [], "FINDING"),
        (1, "error: rich.errors.MarkupError: closing tag (set NGSPEC_DEBUG=1 for the traceback)\n", [], "FINDING"),
        # an exception whose message takes several lines (it passed for a refusal until 2026-12-04)
        (1, "error: StrictDataclassFieldValidationError: Validation error for field 'bos_token_id':\n    TypeError: Field x (set NGSPEC_DEBUG=1 for the traceback)\n", [], "FINDING"),
        (1, "error: a clear message\nover two lines\n", [], "refused"),
        # a refusal in Python's words, naming no field or file (a "refused" until 2026-12-06)
        (1, "error: could not load model 'm': 'int' object has no attribute 'items'\n", [], "FINDING"),
        (1, "error: could not load the tokenizer of 'm': Special token a has to be either str or AddedToken but got: <class 'int'>\n", [], "FINDING"),
        (1, "error: h/config.json is not a Llama-style head config (module 'torch' has no attribute 'x')\n", [], "FINDING"),
        (1, "error: could not load the tokenizer of 'm': list index out of range\n", [], "FINDING"),
        (1, "error: cannot read h/model.safetensors: SafetensorError: Error while deserializing header: header too large\n", [], "FINDING"),
        (1, "error: cannot read h/model.safetensors: it is damaged, cut short or not a weights file (Error while deserializing header)\n", [], "refused"),
        (1, "error: m/config.json is damaged (id2label must be a JSON object or null, not 5); copy it again from the model's source\n", [], "refused"),
        # a library's words that misname the fault or give no place (refusals until the third 2026-12-06 session)
        (1, "error: cannot read corpus 'c.jsonl': Expected object or value\n", [], "FINDING"),  # run 12953
        (1, "error: could not load model 'm': Error no file named model.safetensors, or pytorch_model.bin, found in directory m.\n", [], "FINDING"),
        (1, "error: m has a corrupt or truncated array file: This file contains pickled (object) data. If you trust the file you can load it unsafely\n", [], "FINDING"),
        (1, "error: ds/meta.json is corrupt: 'utf-8' codec can't decode byte 0xc3 in position 0: invalid continuation byte\n", [], "FINDING"),
        (1, "error: t.npz is a damaged n-gram table file (BadZipFile); rebuild it with `ngspec build-bigram`\n", [], "FINDING"),
        (1, "error: t.npz is a damaged n-gram table file (not a .npz archive); rebuild it with `ngspec build-bigram`\n", [], "refused"),
        # a KeyError's message is the key alone: which file lacked it, and why it matters, go unsaid
        (1, "error: could not load the tokenizer of 'm': 'added_tokens'\n", [], "FINDING"),  # run 13770, refused then
        (1, "error: 'vocab_size' (set NGSPEC_DEBUG=1 for the traceback)\n", [], "FINDING"),
        (1, "error: unknown drafter 'nope'; choose from trie, vanilla\n", [], "refused"),
        (1, "error: m/tokenizer.json is damaged (no added_tokens field); copy it again from the model's source\n", [], "refused"),
        # the tokenizers library's Rust type names (runs 14258 and 14366, refused then)
        (1, "error: m/tokenizer.json is damaged (data did not match any variant of untagged enum PyDecoderWrapper at line 1 column 2696); copy it again\n", [], "FINDING"),
        (1, "error: m/tokenizer.json is damaged (invalid type: integer `5`, expected struct TruncationParams at line 1 column 34); copy it again\n", [], "FINDING"),
        (1, "error: m/tokenizer.json is damaged (its decoder is of no kind the tokenizers library reads, at line 1 column 2696); copy it again\n", [], "refused"),
        (1, "Traceback (most recent call last):\n  x\n", [], "FINDING"),
        (1, "error: cannot read corpus\n", [".ds-tmp-1"], "FINDING"),  # a refusal that leaves a temporary behind
        (1, "error: cannot continue\n", ["changed out.partial.jsonl"], "FINDING"),  # a refusal that lost an input
        (1, "", [], "FINDING"),  # exit 1 without ngspec's error line
        (3, "error: x\n", [], "FINDING"),
        # a library's warning with its source line (input_fuzz run 8080, an "ok" until 2026-12-05)
        (0, "{}\n/v/matplotlib/backend_agg.py:211: UserWarning: Glyph 29483 missing from font(s) DejaVu Sans.\n  fig.savefig(path)\n", [], "FINDING"),
        (0, "warning: ngspec's own warning, one line\n", [], "ok"),
    ],
)
def test_verdicts(code, output, left, verdict):
    assert input_fuzz.judge(code, output, None, left)[0] == verdict


def test_an_exception_that_escaped_the_command_is_a_finding():
    assert input_fuzz.judge(1, "", ValueError("boom"), [])[0] == "FINDING"
    assert input_fuzz.judge(1, "error: x\n", SystemExit(1), [])[0] == "refused"


def test_a_file_gone_or_rewritten_is_changed(tmp_path):
    kept, rewritten, gone = (tmp_path / name for name in ("kept", "rewritten", "gone"))
    for path in (kept, rewritten, gone):
        path.write_text("records\n")
    (tmp_path / "dir").mkdir()
    contents = input_fuzz.snapshot(tmp_path.iterdir())
    assert sorted(p.name for p in contents) == ["gone", "kept", "rewritten"] and input_fuzz.changed(contents, tmp_path) == []
    rewritten.write_text("records\nmore\n")
    gone.unlink()
    assert sorted(input_fuzz.changed(contents, tmp_path)) == ["changed gone", "changed rewritten"]


def stand_ins(tmp_path):
    """Files shaped like the fixtures, for draws that only write inputs."""
    head = tmp_path / "tiny" / "head"
    head.mkdir(parents=True)
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        (tmp_path / "tiny" / name).write_text(json.dumps({"vocab_size": 8}))
    (tmp_path / "tiny" / "model.safetensors").write_bytes(b"weights")
    (head / "config.json").write_text(json.dumps({"hidden_size": 8}))
    (head / "model.safetensors").write_bytes(b"weights")
    store = tmp_path / "datastore"
    store.mkdir()
    (store / "meta.json").write_text(json.dumps({"tokens": 3, "source": "c"}))
    for name in ("tokens.npy", "sa.npy"):
        (store / name).write_bytes(b"array")
    (tmp_path / "bigram.npz").write_bytes(b"tables")
    return SimpleNamespace(model=tmp_path / "tiny", datastore=store, table=tmp_path / "bigram.npz", corpus=tmp_path / "corpus.jsonl")


def test_draws_reach_every_input_kind_and_command(tmp_path):
    fx = stand_ins(tmp_path)
    models = set()
    commands, notes = set(), []
    for n in range(400):
        run_dir = tmp_path / f"run{n}"
        run_dir.mkdir()
        args, output, note = input_fuzz.draw(random.Random(n), fx, run_dir)
        commands.add(args[0])
        notes.append(note)
        if "--model" in args:
            models.add(args[args.index("--model") + 1])
        assert all(isinstance(a, str) for a in args) and (output is None or run_dir in output.parents)
    assert commands == {"build-datastore", "self-repetition", "train-eagle", "generate", "bench", "tune-tree", "synth-corpus", "datastore-info", "build-bigram",
                        "profile-bound"}
    for damage in ("truncate", "garbage", "empty", "remove", "directory", "without", "not an object", "files", "missing", "no tokenizer files", "partial"):
        assert any(damage in note for note in notes), damage
    assert len(models) > 50  # the fixture's model, and damaged copies of it
    names = {p.name for p in tmp_path.rglob("*")}
    assert any("[v2]" in n for n in names) and any("猫" in n for n in names) and any(n.startswith("x]") for n in names)


def test_a_short_search_runs_end_to_end(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["input_fuzz.py", "--runs", "6", "--first", "0", "--out", str(tmp_path)])
    assert input_fuzz.main() == 0
    runs = [json.loads(line) for line in (tmp_path / "runs-0-0.jsonl").read_text().splitlines()]
    assert [r["run"] for r in runs] == list(range(6)) and {r["verdict"] for r in runs} <= {"ok", "refused"}
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == {v: sum(r["verdict"] == v for r in runs) for v in {r["verdict"] for r in runs}}


def test_chosen_runs_replay_as_they_ran_in_their_search(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["input_fuzz.py", "--only", "4,1", "--out", str(tmp_path)])
    assert input_fuzz.main() == 0
    replayed = [json.loads(line) for line in (tmp_path / "runs-0-only.jsonl").read_text().splitlines()]
    monkeypatch.setattr(sys, "argv", ["input_fuzz.py", "--runs", "5", "--first", "0", "--out", str(tmp_path)])
    assert input_fuzz.main() == 0
    searched = {r["run"]: r for r in map(json.loads, (tmp_path / "runs-0-0.jsonl").read_text().splitlines())}
    assert [r["run"] for r in replayed] == [4, 1]
    assert [(r["args"][0], r["damage"], r["verdict"]) for r in replayed] == [(searched[n]["args"][0], searched[n]["damage"], searched[n]["verdict"]) for n in (4, 1)]


def test_zero_runs_is_a_usage_error(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["input_fuzz.py", "--runs", "0"])
    with pytest.raises(SystemExit) as exit:
        input_fuzz.main()
    assert exit.value.code == 2
