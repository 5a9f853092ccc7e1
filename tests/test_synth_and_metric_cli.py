"""synth-corpus, (input, response) pair detection and the self-repetition command."""

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ngspec.cli.app import app
from ngspec.datastore.synth import SynthOptions, pre_query_template, synthesize
from ngspec.errors import NgspecError
from ngspec.metrics.pairs import record_pairs

runner = CliRunner()
SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"


def test_pre_query_template_is_the_text_before_the_user_message(default_model):
    pre = pre_query_template(default_model.tokenizer)
    assert pre.endswith("<|im_start|>user\n")
    full = default_model.tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    assert full.startswith(pre)


@pytest.mark.slow
def test_synthesize_writes_magpie_records_that_build_a_datastore(default_model, tmp_path):
    records = list(synthesize(default_model, SynthOptions(n=3, max_new_tokens=12, max_instruction_tokens=24, batch_size=3)))
    assert len(records) == 3
    for record in records:
        assert record["instruction"] and isinstance(record["response"], str)
    corpus = tmp_path / "self.jsonl"
    corpus.write_text("".join(json.dumps(r) + "\n" for r in records))
    result = runner.invoke(app, ["build-datastore", "-c", str(corpus), "-o", str(tmp_path / "ds"), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["records"] == 3


@pytest.mark.slow
def test_synthesize_answers_given_instructions_in_order_as_greedy_decoding_would(default_model, monkeypatch):
    """Whatever the model's generation_config.json asks (here: never repeat a token, which every
    answer would break): transformers would apply it to the answers."""
    from ngspec.decode import DecodeConfig
    from ngspec.drafters import make_drafter
    from ngspec.engine import Engine
    from ngspec.prompts import encode

    given = ["Name a primary colour.", "Say hello in French.", "What is 2 + 2?"]
    monkeypatch.setattr(default_model.model.generation_config, "no_repeat_ngram_size", 1)
    records = list(synthesize(default_model, SynthOptions(n=2, max_new_tokens=10, batch_size=1), given=given))
    assert [r["instruction"] for r in records] == given[:2]  # --n caps the given list, order kept
    assert records[0]["gen_input_configs"] == {"source": "given"}
    engine = Engine(default_model, calibrate=False)
    for record in records:
        greedy = engine.run(encode(default_model.tokenizer, record["instruction"]), make_drafter("vanilla"), DecodeConfig(max_new_tokens=10))
        assert record["response"] == default_model.tokenizer.decode(greedy.token_ids, skip_special_tokens=True).strip()


def test_synth_corpus_prompts_option_answers_every_prompt_by_default(tmp_path, monkeypatch):
    import ngspec.datastore.synth as synth_module
    import ngspec.models as models_module

    seen = {}

    def answer(loaded, opts, on_record=None, given=None, start=0):
        seen["n"], seen["given"] = opts.n, given
        for g in given[: opts.n]:
            yield {"instruction": g, "response": "ok"}

    monkeypatch.setattr(models_module, "load_model", lambda *a, **k: None)
    monkeypatch.setattr(synth_module, "synthesize", answer)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"turns": ["first", "second turn"]}) + "\n" + json.dumps({"prompt": "other"}) + "\n")
    out = tmp_path / "c.jsonl"
    result = runner.invoke(app, ["synth-corpus", "--prompts", str(prompts), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert seen == {"n": 2, "given": ["first", "other"]}
    assert [json.loads(line)["instruction"] for line in out.read_text().splitlines()] == ["first", "other"]
    result = runner.invoke(app, ["synth-corpus", "--prompts", str(prompts), "--n", "1", "--out", str(tmp_path / "one.jsonl"), "--json"])
    assert result.exit_code == 0 and seen == {"n": 1, "given": ["first"]}
    report = json.loads(result.stdout)  # --json: one line saying what was written, from what, with which options
    assert report["out"] == str(tmp_path / "one.jsonl") and report["records"] == 1 and report["instructions"] == str(prompts)
    assert report["resumed_after"] == 0
    assert report["n"] == 1 and report["max_new_tokens"] == 256 and report["seconds"] >= 0
    result = runner.invoke(app, ["synth-corpus", "--prompts", str(prompts), "--n", "0", "--out", str(tmp_path / "none.jsonl")])
    assert result.exit_code == 1 and "--n" in result.output
    result = runner.invoke(app, ["synth-corpus", "--prompts", str(tmp_path / "missing.jsonl"), "--out", str(tmp_path / "d.jsonl")])
    assert result.exit_code == 1 and "prompt file not found" in result.output


@pytest.mark.parametrize(
    "record, expected",
    [
        ({"instruction": "q", "response": "a"}, [("q", "a")]),
        ({"instruction": "q", "responses": ["a", "b"]}, [("q", "a"), ("q", "b")]),
        # Dolly's closed QA and summaries: the passage the answer copies from was left out of the input
        ({"instruction": "q", "context": "c", "response": "a"}, [("q\nc", "a")]),
        ({"instruction": "q", "input": "x", "context": "", "response": "a"}, [("q\nx", "a")]),
        ({"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}, {"from": "human", "value": "q2"}, {"from": "gpt", "value": "a2"}]}, [("q", "a"), ("q\na\nq2", "a2")]),
        ({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}, [("q", "a")]),
        ({"question_id": 7, "choices": [{"turns": ["a1", "a2"]}]}, [("Q1", "a1"), ("Q1\na1\nQ2", "a2")]),
        ({"instruction": "q", "input": "", "output": "a"}, [("q", "a")]),  # Alpaca: "cannot find (input, response) fields"
        ({"instruction": "q", "input": "x", "output": "a", "history": [["q0", "a0"]]}, [("q0", "a0"), ("q0\na0\nq\nx", "a")]),
        ({"prompt": "q", "completion": "a"}, [("q", "a")]),  # TRL's prompt-completion records
        # LMSYS-Chat-1M's and WildChat's `conversation`; `conversations` of role/content turns
        ({"conversation": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}, [("q", "a")]),
        ({"conversations": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}, [("q", "a")]),
        ({"messages": [{"role": "user", "content": [{"type": "text", "text": "q"}]}, {"role": "assistant", "content": [{"type": "text", "text": "a"}]}]},
         [("q", "a")]),  # content parts: the turns were skipped, silently
        ({"prompt": [{"role": "system", "content": "s"}, {"role": "user", "content": "q"}], "completion": [{"role": "assistant", "content": "a"}]}, [("s\nq", "a")]),
    ],
)
def test_pairs_detection(record, expected):
    pairs = record_pairs(record, "r", {"7": ["Q1", "Q2"]}, None, None)
    assert [(p.input, p.response) for p in pairs] == expected


def test_pairs_need_fields():
    with pytest.raises(NgspecError, match="--input-field"):
        record_pairs({"foo": "bar"}, "r", {}, None, None)


@pytest.mark.parametrize(
    "record,says",
    [
        ({"conversations": 3}, "'conversations' must be a list of turns, not a number"),
        ({"messages": "hello"}, "'messages' must be a list of turns, not a string"),
        ({"question_id": 7, "choices": [{"turns": "a1"}]}, "an answer record needs"),
        ({"question_id": 7, "choices": []}, "an answer record needs"),
        ({"instruction": ["q"], "response": "a"}, "'instruction' must be a string, not a list"),
        ({"instruction": None, "response": "a"}, "'instruction' must be a string, not null"),  # was "not NoneType" (input_fuzz run 9345)
        ({"instruction": "q", "output": 5}, "'output' must be a string, not a number"),
        ({"instruction": "q", "output": "a", "history": "q0"}, "'history' must be a list of [instruction, response] pairs, not a string"),
        ({"prompt": "q", "completion": 5}, "'completion' must be a string or a list of messages, not a number"),
    ],
)
def test_malformed_records_are_named(record, says):
    """A record of the right kind with a field of the wrong type: one message naming the record
    (it crashed with a bare TypeError before)."""
    with pytest.raises(NgspecError, match=f"record r: {re.escape(says)}"):
        record_pairs(record, "r", {"7": ["Q1"]}, None, None)


@pytest.mark.slow
def test_self_repetition_command_on_real_answers(tmp_path):
    answers = SHARED / "mt_bench_answers" / "rest_vicuna-7b-v1.5" / "baseline-vicuna-7b-v1.5-temperature-0.0-top_p-0.jsonl"
    if not answers.is_file():
        pytest.skip("shared data not beside this checkout")
    args = ["self-repetition", "--dataset", str(answers), "--questions", str(SHARED / "mt_bench" / "question.jsonl"), "--limit", "10", "--json"]
    plain = json.loads(runner.invoke(app, args).stdout)
    held = runner.invoke(app, args + ["--holdout", "20"])
    assert held.exit_code == 0, held.output
    held = json.loads(held.stdout)
    assert plain["records"] == held["records"] == 10
    assert plain["mean"] >= 1.0 and held["token_weighted"] >= 1.0
    assert sum(plain["match_length_histogram"].values()) == plain["steps"]


def test_self_repetition_bad_input(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"instruction": "q", "response": "a"}) + "\n")
    result = runner.invoke(app, ["self-repetition", "--dataset", str(path), "--holdout", "5"])
    assert result.exit_code == 1 and "leaves none to measure" in result.stderr
    result = runner.invoke(app, ["self-repetition", "--dataset", str(path), "--datastore", str(tmp_path / "nope")])
    assert result.exit_code == 1 and "datastore not found" in result.stderr
    other = tmp_path / "other.jsonl"  # instructions with no responses: say what was looked for
    other.write_text(json.dumps({"instruction": "q"}) + "\n" + json.dumps({"instruction": "r"}) + "\n")
    result = runner.invoke(app, ["self-repetition", "--dataset", str(other)])
    assert result.exit_code == 1 and "none of its 2 records holds an (input, response) pair" in result.stderr
    assert "--input-field" in result.stderr and "Traceback" not in result.output
    malformed = tmp_path / "malformed.jsonl"
    malformed.write_text(json.dumps({"uuid": "u1", "conversations": [{"from": "human", "value": "q"}]}) + "\n"
                         + json.dumps({"uuid": "u2", "conversations": 3}) + "\n")
    result = runner.invoke(app, ["self-repetition", "--dataset", str(malformed)])
    assert result.exit_code == 1 and "record u2: 'conversations' must be a list of turns" in result.stderr
    assert "Traceback" not in result.output
    questions = tmp_path / "q.jsonl"
    questions.write_text('{"question_id": 1, "turns": ["q"]}\n{"question_id": 2,\n')
    result = runner.invoke(app, ["self-repetition", "--dataset", str(path), "--questions", str(questions)])
    assert result.exit_code == 1 and f"{questions}:2: not valid JSON" in result.stderr
    nulls = tmp_path / "nulls.jsonl"  # an id that is null or not a name: the record's place (it said "record None")
    nulls.write_text(json.dumps({"question_id": None, "uuid": [1], "conversations": 3}) + "\n")
    result = runner.invoke(app, ["self-repetition", "--dataset", str(nulls)])
    assert result.exit_code == 1 and "record 0: 'conversations' must be a list of turns" in result.stderr


def test_interrupted_synthesis_keeps_finished_records_beside_the_output(tmp_path):
    from ngspec.datastore.synth import partial_path, write_jsonl

    def records(stop_after):
        for i in range(5):
            if i == stop_after:
                raise KeyboardInterrupt
            yield {"instruction": f"q{i}", "response": f"a{i}"}

    out = tmp_path / "corpus.jsonl"
    with pytest.raises(NgspecError, match="interrupted after 2 records"):
        write_jsonl(records(2), out, force=False)
    assert not out.exists() and partial_path(out).name == "corpus.partial.jsonl"
    assert [json.loads(line)["instruction"] for line in partial_path(out).read_text().splitlines()] == ["q0", "q1"]
    with pytest.raises(KeyboardInterrupt):
        write_jsonl(records(0), tmp_path / "empty.jsonl", force=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus.partial.jsonl"]
    assert write_jsonl(records(99), out, force=False) == 5 and out.is_file()


def test_an_interrupted_synthesis_through_a_link_keeps_its_records_where_the_link_points(tmp_path):
    """--out a link to a file on another disk: the records kept by an interrupted run go beside
    the file it names (where the run was writing: a rename to the link's side may cross devices
    and fail, losing them), and the next run through the link finds them there."""
    from ngspec.datastore.synth import partial_path, write_jsonl

    def records(stop_after):
        for i in range(3):
            if i == stop_after:
                raise KeyboardInterrupt
            yield {"instruction": f"q{i}", "response": f"a{i}"}

    (tmp_path / "big").mkdir()
    link = tmp_path / "corpus.jsonl"
    link.symlink_to(tmp_path / "big" / "mine.jsonl")
    with pytest.raises(NgspecError, match=f"interrupted after 1 record; it is in {tmp_path / 'big' / 'mine.partial.jsonl'} "):
        write_jsonl(records(1), link, force=False)
    assert partial_path(link) == tmp_path / "big" / "mine.partial.jsonl" and partial_path(link).is_file()
    assert write_jsonl(records(99), link, force=False) == 3
    assert link.is_symlink() and len((tmp_path / "big" / "mine.jsonl").read_text().splitlines()) == 3
    assert sorted(p.name for p in (tmp_path / "big").iterdir()) == ["mine.jsonl"]


def test_synthesis_on_a_full_disk_keeps_the_records_written_whole(tmp_path, monkeypatch):
    """The disk fills in the middle of the third record: the two before it are kept as the
    interrupted run's (the part of the third cut off), so the same command continues once there
    is room, instead of an hour's records going with the temporary file."""
    import errno
    import pathlib

    from ngspec.datastore.synth import partial_path, write_jsonl

    real_open, room = pathlib.Path.open, 2 * len(json.dumps({"instruction": "q0", "response": "a0"}) + "\n") + 10

    class FillingUp:
        def __init__(self, f):
            self.f, self.written = f, 0

        def write(self, data):
            if self.written + len(data) > room:
                self.f.write(data[: room - self.written])  # in part, as a full device takes it
                self.f.flush()
                raise OSError(errno.ENOSPC, "No space left on device")
            self.written += len(data)
            return self.f.write(data)

        def __getattr__(self, name):
            return getattr(self.f, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

    monkeypatch.setattr(pathlib.Path, "open", lambda self, *a, **k: FillingUp(real_open(self, *a, **k)) if ".tmp-" in self.name else real_open(self, *a, **k))
    out = tmp_path / "corpus.jsonl"
    records = ({"instruction": f"q{i}", "response": f"a{i}"} for i in range(5))
    with pytest.raises(NgspecError, match=r"^stopped \(No space left on device, writing .*corpus.jsonl\) after 2 records; they are in .*corpus.partial.jsonl .*Mend that and run the same command"):
        write_jsonl(records, out, force=False)
    monkeypatch.undo()
    assert [json.loads(line)["instruction"] for line in partial_path(out).read_text().splitlines()] == ["q0", "q1"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus.partial.jsonl"]


def test_two_writers_of_one_corpus_each_write_their_own_file(tmp_path):
    """Two `synth-corpus` runs given the same ``--out`` at once: the second's write, made while
    the first is between records, neither truncates nor moves the first's; each lands whole (the
    last rename wins) and nothing is left beside the output. With one fixed temporary name the
    second moved the first's half-written file into place and the first's rename then failed."""
    from ngspec.datastore.synth import write_jsonl

    out = tmp_path / "corpus.jsonl"

    def first():
        yield {"instruction": "first q0", "response": "a"}
        assert write_jsonl(iter([{"instruction": "second q0", "response": "b"}]), out, force=True) == 1
        assert out.read_text().count("\n") == 1 and "second" in out.read_text()
        yield {"instruction": "first q1", "response": "a"}

    assert write_jsonl(first(), out, force=True) == 2
    assert [json.loads(line)["instruction"] for line in out.read_text().splitlines()] == ["first q0", "first q1"]
    assert [p.name for p in tmp_path.iterdir()] == ["corpus.jsonl"]


def test_interrupted_synth_corpus_command_exits_1_and_says_where_the_records_are(tmp_path, monkeypatch):
    import ngspec.datastore.synth as synth_module
    import ngspec.models as models_module

    def two_then_interrupt(loaded, opts, on_record=None, given=None, start=0):
        for i in range(2):
            yield {"instruction": f"q{i}", "response": f"a{i}"}
        raise KeyboardInterrupt

    monkeypatch.setattr(models_module, "load_model", lambda *a, **k: None)
    monkeypatch.setattr(synth_module, "synthesize", two_then_interrupt)
    out = tmp_path / "c.jsonl"
    result = CliRunner().invoke(app, ["synth-corpus", "--n", "5", "--out", str(out)])
    assert result.exit_code == 1
    assert "interrupted after 2 records" in result.output and "c.partial.jsonl" in result.output
    assert not out.exists() and len((tmp_path / "c.partial.jsonl").read_text().splitlines()) == 2


def _interrupting(monkeypatch, call):
    """Make synth-corpus's `call`-th generation (counted from 1) raise KeyboardInterrupt, as Ctrl-C would."""
    import ngspec.datastore.synth as synth_module

    real, calls = synth_module._generate, []

    def generate(*args, **kwargs):
        calls.append(1)
        if len(calls) == call:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(synth_module, "_generate", generate)


def test_an_interrupted_synth_corpus_run_continues_where_it_stopped(tiny_saved, tmp_path, monkeypatch):
    """Answering given prompts one at a time, a run stopped after two records and run again writes
    the same file as a run never stopped, and leaves no partial file behind."""
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"Question number {i}?"}) + "\n" for i in range(4)))
    args = ["synth-corpus", "--model", str(tiny_saved), "--prompts", str(prompts), "--batch-size", "1", "-n", "5"]
    whole, stopped = tmp_path / "whole.jsonl", tmp_path / "stopped.jsonl"
    assert runner.invoke(app, [*args, "--out", str(whole)]).exit_code == 0
    with monkeypatch.context() as patch:
        _interrupting(patch, 3)
        result = runner.invoke(app, [*args, "--out", str(stopped)])
    assert result.exit_code == 1 and "interrupted after 2 records" in result.stderr and "Run the same command again" in result.stderr
    assert "Traceback" not in result.output and not stopped.exists()
    result = runner.invoke(app, [*args, "--out", str(stopped), "--json"])
    assert result.exit_code == 0, result.output
    assert "continuing an interrupted run: 2 of 4 records" in result.stderr
    assert json.loads(result.stdout)["resumed_after"] == 2 and json.loads(result.stdout)["records"] == 4
    assert stopped.read_text() == whole.read_text() and len(whole.read_text().splitlines()) == 4
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.jsonl", "stopped.jsonl", "whole.jsonl"]


def test_synth_corpus_refuses_to_continue_another_runs_records(tiny_saved, tmp_path, monkeypatch):
    prompts, others = tmp_path / "p.jsonl", tmp_path / "o.txt"
    prompts.write_text("".join(json.dumps({"prompt": f"Question number {i}?"}) + "\n" for i in range(4)))
    others.write_text("Another question entirely?\n")
    out = tmp_path / "c.jsonl"
    args = ["synth-corpus", "--model", str(tiny_saved), "--batch-size", "1", "--out", str(out)]
    with monkeypatch.context() as patch:
        _interrupting(patch, 3)
        assert runner.invoke(app, [*args, "--prompts", str(prompts), "-n", "5"]).exit_code == 1
    kept = (tmp_path / "c.partial.jsonl").read_text()
    result = runner.invoke(app, [*args, "--prompts", str(prompts), "-n", "6"])
    assert result.exit_code == 1 and "c.partial.jsonl holds records of another run" in result.stderr
    assert "record 1's gen_response_configs" in result.stderr and '"max_tokens": 5' in result.stderr and "--force" in result.stderr
    result = runner.invoke(app, [*args, "--prompts", str(prompts), "-n", "5", "--seed", "7"])
    assert result.exit_code == 1 and "record 1's uuid" in result.stderr
    result = runner.invoke(app, [*args, "--prompts", str(others), "-n", "5"])
    assert result.exit_code == 1 and "record 1 answers another instruction than prompt 1 of --prompts" in result.stderr
    assert "Traceback" not in result.output and (tmp_path / "c.partial.jsonl").read_text() == kept and not out.exists()
    (tmp_path / "c.partial.jsonl").write_text(kept + "{not json\n")
    result = runner.invoke(app, [*args, "--prompts", str(prompts), "-n", "5"])
    assert result.exit_code == 1 and "c.partial.jsonl:3: not a record synth-corpus writes" in result.stderr
    result = runner.invoke(app, [*args, "--prompts", str(others), "-n", "5", "--force"])
    assert result.exit_code == 0, result.output
    assert len(out.read_text().splitlines()) == 1 and not (tmp_path / "c.partial.jsonl").exists()
    result = runner.invoke(app, [*args, "--n", "2", "--seed", "-1"])
    assert result.exit_code == 1 and "--seed must be from 0 to 2^64 - 1, not -1" in result.stderr


def test_a_continued_self_written_corpus_does_not_repeat_its_first_instructions(tiny_saved, tmp_path, monkeypatch):
    """A resumed run cannot replay the sampler's state, so it seeds from the seed and the count;
    seeded from the seed alone it wrote the first run's first instruction again."""
    out = tmp_path / "self.jsonl"
    args = ["synth-corpus", "--model", str(tiny_saved), "--n", "3", "--batch-size", "1", "-n", "4", "--out", str(out)]
    with monkeypatch.context() as patch:
        _interrupting(patch, 3)  # an instruction and its answer per record: one record done
        assert runner.invoke(app, args).exit_code == 1
    first = json.loads((tmp_path / "self.partial.jsonl").read_text())
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert records[0] == first and len({r["instruction"] for r in records}) == 3
    assert [r["uuid"][-3:] for r in records] == ["001", "002", "003"]


def _generated(rid, turn, drafter, text, calls):
    """A record as `ngspec generate --json` writes it (the fields the metric reads, and others)."""
    tokens = len(text.split())
    return {"id": rid, "turn": turn, "drafter": drafter, "text": text, "token_ids": list(range(tokens)), "new_tokens": tokens,
            "verify_calls": calls, "seconds": 1.0, "finish_reason": "length"}


def test_generate_output_pairs_with_its_prompts_by_id_and_turn():
    """Each (id, turn) answered is one pair, its input the user turns and the answers before it,
    whatever order a batch wrote them in; a second drafter's answer to the same prompt is not
    measured twice but counts in what that drafter reached; a failed prompt is left out."""
    from ngspec.metrics.pairs import achieved, generated_pairs, is_generated

    records = [
        _generated("81", 2, "trie", "b c", 1),
        _generated("81", 1, "trie", "a b c d", 2),
        {"id": "82", "turn": 1, "drafter": "trie", "error": "the prompt has 9000 tokens"},
        _generated("p.jsonl:3", 1, "trie", "x y", 2),
        _generated("81", 1, "vanilla", "a b c d", 4),
    ]
    assert all(is_generated(r) for r in records) and not is_generated({"id": 1, "text": "a"})
    questions = {"81": ["Q1", "Q2"], "82": ["long"], "p.jsonl:3": ["P"]}
    pairs, runs = generated_pairs(records, questions, "q.jsonl")
    assert [(p.id, p.input, p.response) for p in pairs] == [("81.1", "Q1\na b c d\nQ2", "b c"), ("81.0", "Q1", "a b c d"), ("p.jsonl:3.0", "P", "x y")]
    reached = {a.drafter: (a.new_tokens, a.verify_calls) for a in achieved([runs[p.id] for p in pairs])}
    assert reached == {"trie": (8, 5), "vanilla": (4, 4)}
    assert {a.drafter: a.tokens_per_call for a in achieved([runs["81.0"]])} == {"trie": 2.0, "vanilla": 1.0}
    with pytest.raises(NgspecError, match="records hold the answers but not the prompts: give the prompt file it ran on with --questions"):
        generated_pairs(records, {}, "None")
    with pytest.raises(NgspecError, match=r"no prompt with id 'p.jsonl:3' in other.jsonl"):
        generated_pairs(records, {"81": ["Q1"]}, "other.jsonl")
    for field, bad in (("turn", "2"), ("turn", 0), ("verify_calls", 1.5), ("new_tokens", None)):
        with pytest.raises(NgspecError, match=r"^record 81: a `generate --json` record's turn, new_tokens and verify_calls must be counts$"):
            generated_pairs([{**records[1], field: bad}], questions, "q.jsonl")


def test_questions_also_name_their_prompts_as_generate_named_them_read_from_standard_input(tmp_path):
    """`generate -p -` names prompts without an id stdin:LINE (a .jsonl) or stdin (a .txt); the
    same file given as --questions answers to those names too, and a record's own id wins."""
    from ngspec.cli.self_repetition import _questions
    from ngspec.metrics.pairs import generated_pairs

    jsonl = tmp_path / "p.jsonl"
    jsonl.write_text('{"question_id": 7, "turns": ["Q7"]}\n{"prompt": "P2"}\n{"id": "stdin:3", "prompt": "own"}\n{"prompt": "P4"}\n')
    assert _questions(jsonl) == {"7": ["Q7"], "p.jsonl:2": ["P2"], "stdin:3": ["own"], "p.jsonl:4": ["P4"], "stdin:2": ["P2"], "stdin:4": ["P4"]}
    txt = tmp_path / "doc.txt"
    txt.write_text("Summarise this.\n")
    assert _questions(txt) == {"doc": ["Summarise this."], "stdin": ["Summarise this."]}
    array = tmp_path / "a.json"
    array.write_text('[{"prompt": "A0"}, {"id": "x", "prompt": "A1"}]')
    assert _questions(array) == {"a.json[0]": ["A0"], "x": ["A1"], "stdin[0]": ["A0"]}
    import os
    import threading

    fifo = tmp_path / "63"  # `--questions <(jq ...)`: a pipe, read as `generate -p <(...)` read it
    os.mkfifo(fifo)
    threading.Thread(target=fifo.write_text, args=('{"prompt": "P1"}\n',), daemon=True).start()
    assert _questions(fifo) == {"63:1": ["P1"], "stdin:1": ["P1"]}
    records = [_generated("stdin:2", 1, "trie", "a b", 1), _generated("stdin", 1, "trie", "c", 1)]
    pairs, _ = generated_pairs(records, {**_questions(jsonl), **_questions(txt)}, "q.jsonl")
    assert [(p.id, p.input) for p in pairs] == [("stdin:2.0", "P2"), ("stdin.0", "Summarise this.")]


@pytest.mark.slow
def test_self_repetition_of_generates_own_output_beside_what_it_reached(tmp_path):
    """The workflow the README's troubleshooting gives: `generate --json` on a prompt file, then
    `self-repetition` on its output with that prompt file, which prints the ceiling and each
    drafter's tokens per call beside it (before, generate's records were refused as holding no
    (input, response) fields)."""
    out = tmp_path / "out.jsonl"
    for drafter in ("trie", "vanilla"):
        result = runner.invoke(app, ["generate", "-p", "examples/prompts.jsonl", "-d", drafter, "-n", "24", "--json"])
        assert result.exit_code == 0, result.output
        with out.open("a") as fh:
            fh.write(result.stdout)
    written = [json.loads(line) for line in out.read_text().splitlines()]
    args = ["self-repetition", "--dataset", str(out), "--questions", "examples/prompts.jsonl", "--json"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["records"] == len(written) // 2 and report["response_tokens"] > 0
    reached = {a["drafter"]: a for a in report["achieved"]}
    for drafter in ("trie", "vanilla"):
        mine = [r for r in written if r["drafter"] == drafter]
        assert reached[drafter]["new_tokens"] == sum(r["new_tokens"] for r in mine)
        assert reached[drafter]["verify_calls"] == sum(r["verify_calls"] for r in mine)
    assert reached["vanilla"]["tokens_per_call"] == 1.0 and reached["trie"]["tokens_per_call"] > 1.0
    assert reached["trie"]["share_of_ceiling"] == pytest.approx(reached["trie"]["tokens_per_call"] / report["token_weighted"])
    by_id = {f"{r['id']}.{r['turn'] - 1}": r for r in written if r["drafter"] == "trie"}
    assert [entry["reached"]["trie"] for entry in report["per_record"]] == [by_id[e["id"]]["mean_tokens_per_call"] for e in report["per_record"]]
    table = runner.invoke(app, args[:-1])
    assert "trie: tokens per call reached" in table.stdout and "of the token-weighted ceiling" in table.stdout
    alone = runner.invoke(app, args[:3])
    assert alone.exit_code == 1 and "give the prompt file it ran on with --questions" in alone.stderr


def test_synth_corpus_continues_when_the_model_directory_is_spelled_another_way(tiny_saved, tmp_path, monkeypatch):
    """`./m` and an absolute path to `m` are one model: the run continues, and the finished file
    names the model one way throughout."""
    out = tmp_path / "c.jsonl"
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"Question number {i}?"}) + "\n" for i in range(3)))
    args = ["--prompts", str(prompts), "--batch-size", "1", "-n", "4", "--out", str(out)]
    with monkeypatch.context() as patch:
        _interrupting(patch, 2)
        assert runner.invoke(app, ["synth-corpus", "--model", str(tiny_saved), *args]).exit_code == 1
    monkeypatch.chdir(tiny_saved.parent)
    result = runner.invoke(app, ["synth-corpus", "--model", f"./{tiny_saved.name}/", *args])
    assert result.exit_code == 0, result.output
    assert "continuing an interrupted run: 1 of 3 records" in result.stderr
    assert {json.loads(line)["model"] for line in out.read_text().splitlines()} == {f"./{tiny_saved.name}/"}


def test_an_answer_that_would_pass_the_window_stops_there_as_generate_does(tiny_saved, tmp_path, monkeypatch):
    """The tiny model's window is 512 tokens. An answer that would run past it is generated alone
    and stops where the window is full, as `generate` stops; the other prompts of its batch are
    answered together as before, and a prompt that fills the window is refused before anything
    is generated."""
    import ngspec.datastore.synth as synth_module
    from ngspec.decode import DecodeConfig
    from ngspec.drafters import make_drafter
    from ngspec.engine import Engine
    from ngspec.models import load_model
    from ngspec.prompts import encode

    batches = []
    generate_batch = synth_module._generate_batch
    monkeypatch.setattr(synth_module, "_generate_batch", lambda loaded, prompts, *a: batches.append(len(prompts)) or generate_batch(loaded, prompts, *a))
    given = ["Question one?", "one two three " * 150, "Question two?"]
    prompts, out = tmp_path / "p.jsonl", tmp_path / "c.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": g}) + "\n" for g in given))
    result = runner.invoke(app, ["synth-corpus", "--model", str(tiny_saved), "--prompts", str(prompts), "-n", "64", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert batches == [2, 1] and "1 of them stopped where the model's context window was full" in result.stderr
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["instruction"] for r in records] == given
    assert [synth_module.AT_WINDOW in r for r in records] == [False, True, False]
    loaded = load_model(str(tiny_saved), "cpu")
    engine = Engine(loaded, calibrate=False)
    for record in records:
        plain = engine.run(encode(loaded.tokenizer, record["instruction"]), make_drafter("vanilla"), DecodeConfig(max_new_tokens=64))
        assert (plain.finish_reason == "context") == (synth_module.AT_WINDOW in record)
        assert record["response"] == loaded.tokenizer.decode(plain.token_ids, skip_special_tokens=True).strip()

    batches.clear()
    prompts.write_text("".join(json.dumps({"prompt": g}) + "\n" for g in ["Question one?", "one two three " * 200]))
    result = runner.invoke(app, ["synth-corpus", "--model", str(tiny_saved), "--prompts", str(prompts), "--out", str(tmp_path / "d.jsonl")])
    assert result.exit_code == 1 and batches == [] and "Traceback" not in result.output
    assert re.search(r"prompt 2 of --prompts: the prompt has \d+ tokens but the model's context window is 512; shorten or drop it", result.stderr)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.jsonl", "p.jsonl"]
    # half a UTF-16 pair: the tokenizer said "TypeError: TextEncodeInput must be Union[...]"
    prompts.write_text(json.dumps({"prompt": "Question one?"}) + "\n" + json.dumps({"prompt": "a \ud83d b"}) + "\n")
    result = runner.invoke(app, ["synth-corpus", "--model", str(tiny_saved), "--prompts", str(prompts), "--out", str(tmp_path / "d.jsonl")])
    assert result.exit_code == 1 and batches == [] and "Traceback" not in result.output
    assert "prompt 2 of --prompts holds a lone surrogate (\\ud83d at character 2)" in result.stderr


def test_a_tokenizer_without_pad_or_eos_token_still_pads_its_batches(tiny_saved, tmp_path):
    """A tokenizer that names no pad token and no end token (its tokenizer_config.json gone; the
    model's end tokens are in generation_config.json) pads a batch with the model's end token:
    the batch stopped on transformers' "Asking to pad but the tokenizer does not have a padding
    token" (found by benchmarks/input_fuzz.py, run 12248). Padding changes no answer."""
    import shutil

    from ngspec.models import load_tokenizer

    model = tmp_path / "model"
    shutil.copytree(tiny_saved, model)
    (model / "tokenizer_config.json").unlink()
    tok = load_tokenizer(str(model))
    assert tok.pad_token is None and tok.eos_token is None and tok.chat_template
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in ["Hi?", "A much longer question than the first one?"]))
    args = ["synth-corpus", "--model", str(model), "--prompts", str(prompts), "-n", "6"]
    together, alone = tmp_path / "together.jsonl", tmp_path / "alone.jsonl"
    result = runner.invoke(app, [*args, "--out", str(together)])
    assert result.exit_code == 0, result.output
    assert runner.invoke(app, [*args, "--batch-size", "1", "--out", str(alone)]).exit_code == 0
    answers = [[json.loads(line)["response"] for line in path.read_text().splitlines()] for path in (together, alone)]
    assert len(answers[0]) == 2 and answers[0] == answers[1]
