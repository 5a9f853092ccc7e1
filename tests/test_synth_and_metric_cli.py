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
def test_synthesize_answers_given_instructions_in_order_as_greedy_decoding_would(default_model):
    from ngspec.decode import DecodeConfig
    from ngspec.drafters import make_drafter
    from ngspec.engine import Engine
    from ngspec.prompts import encode

    given = ["Name a primary colour.", "Say hello in French.", "What is 2 + 2?"]
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

    def answer(loaded, opts, on_record=None, given=None):
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
        ({"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}, {"from": "human", "value": "q2"}, {"from": "gpt", "value": "a2"}]}, [("q", "a"), ("q\na\nq2", "a2")]),
        ({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}, [("q", "a")]),
        ({"question_id": 7, "choices": [{"turns": ["a1", "a2"]}]}, [("Q1", "a1"), ("Q1\na1\nQ2", "a2")]),
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
        ({"conversations": 3}, "'conversations' must be a list of turns, not int"),
        ({"messages": "hello"}, "'messages' must be a list of turns, not str"),
        ({"question_id": 7, "choices": [{"turns": "a1"}]}, "an answer record needs"),
        ({"question_id": 7, "choices": []}, "an answer record needs"),
        ({"instruction": ["q"], "response": "a"}, "'instruction' must be a string, not list"),
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

    def two_then_interrupt(loaded, opts, on_record=None, given=None):
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
