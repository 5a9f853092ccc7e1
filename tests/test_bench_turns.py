"""Multi-turn questions in `ngspec bench` and `ngspec generate`: a later turn is asked after the
conversation so far (as Spec-Bench asks MT-bench's second turn), with transformers' greedy answers
to the earlier turns in `bench` and the answers just generated in `generate`."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from ngspec.turns import Conversations, split_turns, turn_ids
from ngspec.cli.app import app
from ngspec.errors import NgspecError
from ngspec.prompts import Prompt, encode, load_prompts, prompt_ids

FIRST = "Write one sentence about a quick brown fox that jumps over a lazy dog."
SECOND = "Rewrite your previous response in capital letters."


def _questions(tmp_path, records):
    path = tmp_path / "q.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_a_turns_record_keeps_every_turn_and_a_prompt_record_none(tmp_path):
    path = _questions(tmp_path, [{"question_id": 1, "turns": ["a", "b", "c"]}, {"prompt": "d", "turns": ["x", "y"]}])
    first, plain = load_prompts(path)
    assert (first.text, first.turns, first.turn, first.label) == ("a", ("a", "b", "c"), 1, "1")
    assert plain.turns == ()  # 'prompt' wins, as it always did; its 'turns' are not asked
    units = split_turns([first, plain], every_turn=True)
    assert [(u.text, u.turn, u.label) for u in units] == [("a", 1, "1"), ("b", 2, "1 (turn 2)"), ("c", 3, "1 (turn 3)"), ("d", 1, "q.jsonl:2")]
    assert split_turns([first, plain], every_turn=False) == [first, plain]


@pytest.mark.parametrize("turns", [["a", 5], ["a", "  "]])
def test_a_later_turn_that_is_not_text_is_one_clear_error(tmp_path, turns):
    with pytest.raises(NgspecError, match="every one of 'turns' must be a non-empty string"):
        load_prompts(_questions(tmp_path, [{"turns": turns}]))


def test_a_second_turn_is_the_chat_with_the_first_answer(default_model):
    tok = default_model.tokenizer
    prompt = Prompt("7", SECOND, turns=(FIRST, SECOND), turn=2)
    answer = tok("The fox jumped.", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]  # the EOS is not said
    want = tok.apply_chat_template(
        [{"role": "user", "content": FIRST}, {"role": "assistant", "content": "The fox jumped."}, {"role": "user", "content": SECOND}],
        add_generation_prompt=True, tokenize=True,
    )
    want = want["input_ids"] if isinstance(want, dict) or hasattr(want, "input_ids") else want
    assert turn_ids(tok, prompt, [answer]) == list(want)
    raw = tok.decode(turn_ids(tok, prompt, [answer], raw=True))
    assert raw == f"{FIRST}\n\nThe fox jumped.\n\n{SECOND}"  # no template: turns and answers by blank lines
    assert turn_ids(tok, Prompt("7", FIRST, turns=(FIRST, SECOND)), []) == encode(tok, FIRST)
    with pytest.raises(ValueError, match="follows 1 answers"):
        turn_ids(tok, prompt, [])


def test_conversations_ask_a_later_turn_after_the_answers_before_it(default_model):
    tok = default_model.tokenizer
    prompts = [Prompt("1", FIRST, turns=(FIRST, SECOND)), Prompt("2", "Say hi.")]
    asked = Conversations(tok, prompts, every_turn=True)
    assert [u.label for u in asked.units] == ["1", "1 (turn 2)", "2"]
    with pytest.raises(KeyError):  # the first turn has no answer yet
        asked.ids(1)
    asked.answered(0, tok("Foxes jump.")["input_ids"])
    asked.answered(0, [1, 2, 3])  # a later round repeats the answer: the first one stays
    assert tok.decode(asked.ids(1)).count("Foxes jump.") == 1
    assert asked.ids(2) == encode(tok, "Say hi.")


def _invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def test_bench_asks_the_second_turn_after_the_first_answer_and_splits_the_report(tmp_path):
    path = _questions(tmp_path, [{"question_id": 81, "category": "writing", "turns": [FIRST, SECOND]}, {"question_id": 3, "category": "rag", "turns": [FIRST]}])
    md = tmp_path / "bench.md"
    result = _invoke("bench", "-q", path, "-n", 10, "-d", "trie", "--rounds", 2, "--versus", "vanilla", "--json", "--markdown", md)
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["environment"]["prompts"] == 3 and report["environment"]["turns"] == "all"
    keyed = {(p["id"], p["turn"], p["round"]): p for p in report["prompts"]}
    assert sorted(keyed) == sorted((q, t, r) for q, t in (("81", 1), ("81", 2), ("3", 1)) for r in (0, 1))
    for p in report["prompts"]:
        assert all(run["exact_match"] for run in p["runs"].values())
    # the second turn's prompt holds the first turn's prompt and its answer
    first, second = keyed[("81", 1, 0)], keyed[("81", 2, 0)]
    assert second["prompt_tokens"] > first["prompt_tokens"] + first["runs"]["hf-greedy"]["new_tokens"] - 2
    turns = report["by_turn"]
    assert set(turns) == {"1", "2"} and [a["arm"] for a in turns["2"]] == [a["arm"] for a in report["arms"]]
    assert "By turn" in md.read_text() and "| trie | 1 |" in md.read_text()
    categories = report["by_category"]  # two categories: Spec-Bench's split, beside the turns'
    assert set(categories) == {"writing", "rag"} and all(a["exact_match"] == 1.0 for a in categories["writing"])
    assert "| trie | writing | 1 |" in md.read_text()

    only_first = _invoke("bench", "-q", path, "-n", 10, "-d", "trie", "--turns", "first", "--json")
    assert only_first.exit_code == 0, only_first.output
    report = json.loads(only_first.stdout.strip().splitlines()[-1])
    assert [(p["id"], p["turn"]) for p in report["prompts"]] == [("81", 1), ("3", 1)] and "by_turn" not in report
    assert report["prompts"][0]["prompt_tokens"] == first["prompt_tokens"]


@pytest.mark.slow
def test_batched_bench_asks_every_turn_and_every_row_is_exact(tmp_path):
    path = _questions(tmp_path, [{"question_id": 81, "turns": [FIRST, SECOND]}, {"question_id": 82, "turns": [SECOND.lower(), FIRST]}])
    result = _invoke("bench", "-q", path, "-n", 10, "-b", 3, "--rounds", 1, "-d", "trie", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["environment"]["prompts"] == 4
    assert all(arm["exact_match"] == 1.0 for arm in report["arms"])
    turns = report["by_turn"]
    assert [(t["turn"], t["rows"]) for t in turns] == [(1, 2), (2, 2)]
    assert all(set(t["tokens_per_call"]) == {"vanilla", "trie"} and t["tokens_per_call"]["vanilla"] == 1.0 for t in turns)


def test_batched_tokens_per_call_by_turn_hand_worked(monkeypatch):
    """Each turn's rows: their tokens over their calls, summed over rounds."""
    import ngspec.bench.batched as batched

    monkeypatch.setattr(batched, "ceiling", lambda ids, ref: float(len(ids)))
    out = [[1, 2, 3, 4], [5, 6], [7, 8, 9]]
    runs = {"trie": [batched.BatchRound(1.0, 9, 6, 0.0, 0.0, out, [2, 1, 3]), batched.BatchRound(1.0, 9, 5, 0.0, 0.0, out, [2, 2, 1])]}
    turns = batched.by_turn(runs, [[0]] * 3, out, [1, 2, 1])
    assert turns == [
        {"turn": 1, "rows": 2, "ceiling": 2.0, "tokens_per_call": {"trie": (4 + 3 + 4 + 3) / (2 + 3 + 2 + 1)}},
        {"turn": 2, "rows": 1, "ceiling": 1.0, "tokens_per_call": {"trie": (2 + 2) / (1 + 2)}},
    ]
    assert batched.by_turn(runs, [[0]] * 3, out, [1, 1, 1]) == []
    assert batched.turn_columns(turns) == ["turn", "rows", "ceiling", "trie tokens/call"]


def test_turns_must_be_all_or_first(tmp_path):
    result = _invoke("bench", "-q", _questions(tmp_path, [{"turns": ["a"]}]), "--turns", "second")
    assert result.exit_code == 1 and "--turns must be all or first (got 'second')" in result.stderr and "Traceback" not in result.stderr


def test_a_questions_turns_are_one_cluster_in_the_intervals_and_two_rows_in_the_notes():
    """A second turn repeats much of the first answer, so the bootstrap resamples a question's
    turns together (its key is the question), while a mismatch names the turn."""
    from types import SimpleNamespace

    from ngspec.bench.report import mismatches, prompts_of
    from ngspec.bench.runner import ArmRun, BenchRecord
    from ngspec.check import GreedyCheck

    first = Prompt("81", FIRST, turns=(FIRST, SECOND))
    second = Prompt("81", SECOND, turns=(FIRST, SECOND), turn=2)
    rep = SimpleNamespace(value=1.0, steps=1, tokens=1)
    wrong = ArmRun("81", [1, 3], 1.0, 2, vs_reference=GreedyCheck(False, 1, 0.001))
    records = [BenchRecord(p, 10, {"trie": wrong}, rep) for p in (first, second)]
    assert prompts_of(records) == ["81", "81"]
    assert [pid for pid, _, _ in mismatches(records, "trie")] == ["81", "81 (turn 2)"]


def test_split_summarises_each_group_alone_in_the_order_first_seen():
    from types import SimpleNamespace

    from ngspec.bench.report import category_of, split
    from ngspec.bench.runner import ArmRun, BenchRecord

    rep = SimpleNamespace(value=1.0, steps=2, tokens=2)

    def record(pid, category, ref_seconds, trie_seconds):
        runs = {"hf-greedy": ArmRun(pid, [1, 2], ref_seconds, 2, [1, 1]), "trie": ArmRun(pid, [1, 2], trie_seconds, 1, [2])}
        return BenchRecord(Prompt(pid, "x", category), 5, runs, rep)

    records = [record("1", "rag", 2.0, 1.0), record("2", "qa", 1.0, 1.0), record("3", "rag", 2.0, 0.5)]
    groups = split(records, ["hf-greedy", "trie"], category_of)
    assert list(groups) == ["rag", "qa"]
    trie = {g: next(s for s in v if s.arm == "trie") for g, v in groups.items()}
    assert trie["rag"].speedup == pytest.approx((4 / 1.5) / (4 / 4.0)) and trie["qa"].speedup == pytest.approx(1.0)
    assert trie["rag"].tokens_per_call == 2.0
    assert split(records[:1] + records[2:], ["hf-greedy", "trie"], category_of) == {}  # one group: nothing to split


def test_a_prompt_too_long_for_the_window_is_refused_by_name(default_model, tmp_path):
    """Every first turn is checked before anything runs; a later turn when it is built (its length
    depends on the first answer)."""
    tok = default_model.tokenizer
    long = Prompt("9", "word " * 300)
    with pytest.raises(NgspecError, match=r"prompt 9: the prompt has \d+ tokens but the model's context window is 200"):
        Conversations(tok, [Prompt("1", FIRST), long], every_turn=True, max_length=200)
    asked = Conversations(tok, [Prompt("7", FIRST, turns=(FIRST, SECOND))], every_turn=True, max_length=60)
    asked.answered(0, tok("fox " * 80)["input_ids"])
    with pytest.raises(NgspecError, match=r"prompt 7 \(turn 2\): the prompt has"):
        asked.ids(1)

    path = _questions(tmp_path, [{"question_id": 1, "turns": [FIRST]}, {"question_id": 2, "turns": ["word " * 9000]}])
    result = _invoke("bench", "-q", path, "-n", 4, "-d", "trie")
    assert result.exit_code == 1 and "prompt 2: the prompt has" in result.stderr and "Traceback" not in result.output + result.stderr


def test_an_answer_that_fills_the_window_is_exact_in_every_arm(tiny_saved, tmp_path):
    """The engine stops where the context window is full; transformers' greedy reference would go
    on past it (and warn), and every arm's output then read as differing from it."""
    text = "one two three " * 160  # 481 tokens; the tiny model's window is 512
    path = _questions(tmp_path, [{"prompt": text}])
    result = _invoke("bench", "-q", path, "--model", tiny_saved, "--raw", "-n", 40, "-d", "trie", "--json")
    assert result.exit_code == 0, result.output
    arms = {a["arm"]: a for a in json.loads(result.stdout)["arms"]}
    assert {name: (a["tokens"], a["exact_match"]) for name, a in arms.items() if name != "hf-prompt-lookup"} == {
        "hf-greedy": (512 - 481 + 1, 1.0), "vanilla": (32, 1.0), "trie": (32, 1.0)}


CHAT = [{"role": "system", "content": "You answer in one short sentence."}, {"role": "user", "content": FIRST}]


def test_a_messages_record_is_its_chat_through_the_template(default_model, tmp_path):
    tok = default_model.tokenizer
    path = _questions(tmp_path, [{"id": "c", "messages": CHAT}, {"prompt": "Hi."}])
    chat, plain = load_prompts(path)
    assert chat.text == FIRST and chat.messages == tuple(CHAT) and plain.messages == ()
    want = tok.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=True)
    want = want["input_ids"] if isinstance(want, dict) or hasattr(want, "input_ids") else want
    assert prompt_ids(tok, chat) == list(want) != prompt_ids(tok, Prompt("c", FIRST))  # the system prompt is in it
    assert prompt_ids(tok, plain) == encode(tok, "Hi.")
    with pytest.raises(NgspecError, match="prompt c is chat messages, which go through the chat template; --raw takes text prompts"):
        prompt_ids(tok, chat, raw=True)


@pytest.mark.parametrize(
    "messages, message",
    [([{"role": "user"}], "needs a 'role' and a 'content'"), ([], "needs a 'prompt', 'text' or 'instruction' string"), ("hi", "needs a 'prompt', 'text' or 'instruction' string")],
)
def test_a_bad_messages_record_is_one_clear_error(tmp_path, messages, message):
    with pytest.raises(NgspecError, match=message):
        load_prompts(_questions(tmp_path, [{"messages": messages}]))


def test_generate_and_bench_take_messages_records_and_synth_corpus_refuses_them(tmp_path, default_model):
    path = _questions(tmp_path, [{"id": "c", "messages": CHAT}, {"id": "p", "prompt": FIRST}])
    chat_tokens = len(prompt_ids(default_model.tokenizer, load_prompts(path)[0]))
    for extra in ([], ["-b", "2"]):
        result = _invoke("generate", "-p", path, "-d", "trie", "-n", 12, "--check", "--json", *extra)
        assert result.exit_code == 0, result.output
        rows = [r for line in result.stdout.strip().splitlines() if line.startswith("{") and "id" in (r := json.loads(line))]
        by_id = {r["id"]: r for r in rows}  # a batch prints rows as they finish
        assert sorted(by_id) == ["c", "p"] and all(r["greedy_check"]["exact_match"] for r in rows)
        assert by_id["c"]["prompt_tokens"] == chat_tokens != by_id["p"]["prompt_tokens"]  # our system prompt, not the template's own
    result = _invoke("bench", "-q", path, "-n", 8, "-d", "trie", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert all(run["exact_match"] for p in report["prompts"] for run in p["runs"].values())
    for args in (["generate", "-p", path, "--raw"], ["bench", "-q", path, "--raw"]):
        result = _invoke(*args)
        assert result.exit_code == 1 and "prompt c is chat messages" in result.stderr and "Traceback" not in result.stderr
    result = _invoke("synth-corpus", "--prompts", path, "--out", tmp_path / "out.jsonl")
    assert result.exit_code == 1 and "prompt c is chat messages" in result.stderr


def _records(result) -> dict:
    """`generate --json`'s prompt records (a batch prints them as they finish), by (id, turn)."""
    rows = [json.loads(line) for line in result.stdout.strip().splitlines() if line.startswith("{")]
    return {(r["id"], r["turn"]): r for r in rows if "id" in r}


@pytest.mark.slow
def test_generate_asks_the_second_turn_after_its_own_first_answer(tmp_path, default_model):
    """One at a time and in a batch (where the second turn joins once the first is answered), every
    turn token-identical to plain greedy decoding of its own prompt; the second turn's prompt is the
    chat with the first answer."""
    tok = default_model.tokenizer
    path = _questions(tmp_path, [{"question_id": 81, "turns": [FIRST, SECOND]}, {"question_id": 3, "turns": ["Say hi."]}])
    seen = {}
    for extra in ([], ["-b", "2"], ["-b", "3"]):
        result = _invoke("generate", "-p", path, "-d", "trie", "-n", 24, "--check", "--json", *extra)
        assert result.exit_code == 0, result.output
        records = _records(result)
        assert sorted(records) == [("3", 1), ("81", 1), ("81", 2)]
        assert all(r["greedy_check"]["exact_match"] for r in records.values())
        first, second = records[("81", 1)], records[("81", 2)]
        answer = tok.decode(first["token_ids"], skip_special_tokens=True).strip()
        asked = Prompt("81", SECOND, turns=(FIRST, SECOND), turn=2)
        assert second["prompt_tokens"] == len(turn_ids(tok, asked, [first["token_ids"]])) and answer in tok.decode(turn_ids(tok, asked, [first["token_ids"]]))
        seen[tuple(extra)] = {k: r["token_ids"] for k, r in records.items()}
        if extra:
            batch = json.loads(result.stdout.strip().splitlines()[-1])["batch"]
            assert batch["prompts"] == 3 and batch["failed"] == 0
    assert seen[()] == seen[("-b", "2")] == seen[("-b", "3")]

    only_first = _invoke("generate", "-p", path, "-d", "trie", "-n", 24, "--turns", "first", "--json")
    assert only_first.exit_code == 0, only_first.output
    assert sorted(_records(only_first)) == [("3", 1), ("81", 1)]
    human = _invoke("generate", "-p", path, "-d", "trie", "-n", 24, "-b", "2")
    assert human.exit_code == 0 and "prompt 81 (turn 2)" in human.stdout


@pytest.mark.slow
@pytest.mark.parametrize("batch", ["1", "2"])
def test_a_turn_that_fails_fails_the_turns_after_it_and_the_others_finish(tmp_path, batch):
    path = _questions(tmp_path, [{"question_id": 2, "turns": ["word " * 9000, SECOND]}, {"question_id": 1, "turns": [FIRST, SECOND]}])
    result = _invoke("generate", "-p", path, "-d", "trie", "-n", 8, "-b", batch, "--json")
    assert result.exit_code == 1 and "Traceback" not in result.output + result.stderr
    records = _records(result)
    assert "the prompt has" in records[("2", 1)]["error"] and records[("2", 2)]["error"] == "not asked: turn 1 failed"
    assert records[("1", 1)]["new_tokens"] > 0 and records[("1", 2)]["new_tokens"] > 0
    assert "2 prompt(s) failed: 2, 2 (turn 2)" in result.stderr


NOT_TEXT = "bad \ud800 text"  # a lone surrogate: the tokenizer cannot take it


@pytest.mark.parametrize("batch, raw", [("1", []), ("2", []), ("2", ["--raw"])])
def test_a_turn_that_cannot_be_encoded_fails_alone_and_the_others_keep_their_own_records(tiny_saved, tmp_path, batch, raw):
    """A first or later turn whose text is not text fails alone, named, and its question's later
    turns are not asked. In a batch, a later turn that failed so had been counted as a row: every
    prompt admitted after it took the record, and the label, of the prompt before it."""
    questions = [
        {"question_id": 1, "turns": [FIRST, NOT_TEXT]},
        {"question_id": 2, "turns": [NOT_TEXT, SECOND]},
        {"question_id": 3, "turns": ["Say hi.", SECOND]},
        {"question_id": 4, "turns": ["Count to three.", SECOND]},
    ]
    path = _questions(tmp_path, questions)
    result = _invoke("generate", "-p", path, "--model", tiny_saved, "-d", "trie", "-n", 12, "-b", batch, "--check", "--json", *raw)
    assert result.exit_code == 1 and "Traceback" not in result.output + result.stderr
    records = _records(result)
    assert sorted(records) == [(str(q), t) for q in (1, 2, 3, 4) for t in (1, 2)]
    assert "lone surrogate (\\ud800 at character" in records[("1", 2)]["error"]  # with --raw, the later turn is the conversation as text
    assert "lone surrogate" in records[("2", 1)]["error"] and records[("2", 2)]["error"] == "not asked: turn 1 failed"
    alone = {}
    for q in (1, 3, 4):  # each question alone, one turn at a time: the prompt and tokens each record must have
        one = _records(_invoke("generate", "-p", _questions(tmp_path, [questions[q - 1]]), "--model", tiny_saved, "-d", "trie", "-n", 12, "--json", *raw))
        alone.update({k: r for k, r in one.items() if "error" not in r})
    assert sorted(alone) == [("1", 1), ("3", 1), ("3", 2), ("4", 1), ("4", 2)]
    for key, want in alone.items():
        got = records[key]
        assert (got["prompt_tokens"], got["token_ids"]) == (want["prompt_tokens"], want["token_ids"]), key
        assert got["greedy_check"]["exact_match"] is True
    assert "3 prompt(s) failed" in result.stderr


@pytest.mark.slow
def test_a_failed_turn_skips_only_its_own_questions_later_turns_even_under_a_shared_id(tmp_path):
    path = _questions(tmp_path, [{"question_id": 2, "turns": ["word " * 9000, SECOND]}, {"question_id": 2, "turns": [FIRST, SECOND]}])
    result = _invoke("generate", "-p", path, "-d", "trie", "-n", 8, "--json")
    rows = [json.loads(line) for line in result.stdout.strip().splitlines() if line.startswith("{")]
    assert [("error" in r, r["turn"]) for r in rows] == [(True, 1), (True, 2), (False, 1), (False, 2)]


def test_generate_turns_must_be_all_or_first(tmp_path):
    result = _invoke("generate", "-p", _questions(tmp_path, [{"turns": ["a"]}]), "--turns", "both")
    assert result.exit_code == 1 and "--turns must be all or first (got 'both')" in result.stderr and "Traceback" not in result.stderr
