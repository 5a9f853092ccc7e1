"""`ngspec bench --temperature`: every arm samples with one seed, against transformers' own sampling
(hf-sample); speed is compared as for greedy decoding, and the engine's arms are checked token for
token against `vanilla` (plain sampling with the same seed draws the same tokens)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from ngspec.bench.report import SAMPLED_NOTE, markdown, rows, summarise, to_json
from ngspec.bench.runner import Arm, ArmRun, BenchRecord, check_runs, make_arms
from ngspec.decode import DecodeConfig
from ngspec.check import GreedyCheck
from ngspec.cli.app import app
from ngspec.drafters import DrafterOptions
from ngspec.metrics.self_repetition import self_repetition
from ngspec.prompts import Prompt
from ngspec.verify import SamplingConfig


def _records(reference: str) -> list[BenchRecord]:
    out = []
    for i, (ref_s, trie_s) in enumerate([(2.0, 1.0), (3.0, 1.5)]):
        runs = {reference: ArmRun(f"p{i}", [1, 2, 3, 4], ref_s, 4, [1] * 4), "trie": ArmRun(f"p{i}", [1, 2, 5, 6], trie_s, 2, [2, 2])}
        out.append(BenchRecord(Prompt(f"p{i}", "text"), 5, runs, self_repetition([9, 9], [1, 2, 3, 4])))
    return out


def test_sampled_arms_are_compared_with_hf_sample_and_checked_against_vanilla():
    records = _records("hf-sample")
    base, trie = summarise(records, ["hf-sample", "trie"])  # not checked: no vanilla arm
    assert trie.speedup == pytest.approx((8 / 2.5) / (8 / 5.0)) and trie.exact_match is None and base.exact_match is None
    assert rows([base, trie])[1][10] == "-"
    text = markdown([base, trie], {}, 1.0, records=records)
    assert "vs hf-sample" in text and SAMPLED_NOTE in text and "hf-greedy" not in text
    assert all(run["exact_match"] is None for p in to_json(records, [base, trie], {})["prompts"] for run in p["runs"].values())
    # greedy: against hf-greedy, token for token (the trie's tokens differ from the third on)
    greedy = _records("hf-greedy")
    for r in greedy:  # what `check_runs` finds (a mismatch also asks the model for its margin)
        r.runs["hf-greedy"].vs_reference, r.runs["trie"].vs_reference = GreedyCheck(True, None, None), GreedyCheck(False, 2, 0.5)
    assert [s.exact_match for s in summarise(greedy, ["hf-greedy", "trie"])] == [1.0, 0.0]
    # sampled: the engine's arms against vanilla's tokens, transformers' left unchecked
    sampled = DecodeConfig(sampling=SamplingConfig(temperature=0.8, seed=1))
    arms = [Arm("hf-sample", "hf-sample"), Arm("vanilla", "vanilla"), Arm("trie", "trie")]
    for i, r in enumerate(records):
        r.runs["vanilla"] = ArmRun(f"p{i}", [1, 2, 5, 6], 2.0, 4, [1] * 4)
        check_runs(None, [9, 9], arms, r.runs, sampled)
    summaries = summarise(records, ["hf-sample", "vanilla", "trie"])
    assert [s.exact_match for s in summaries] == [None, 1.0, 1.0]
    assert rows(summaries)[0][10] == "-" and rows(summaries)[2][10] == "100%"


def test_the_baseline_arm_follows_the_decoding():
    opts = DrafterOptions()
    assert [a.label for a in make_arms(["trie"], opts, [1], [1], ["tree"], sampled=True)] == ["hf-sample", "hf-prompt-lookup", "vanilla", "trie"]
    assert [a.label for a in make_arms(["hf-greedy", "trie"], opts, [1], [1], ["tree"])] == ["hf-greedy", "hf-prompt-lookup", "vanilla", "trie"]


def test_transformers_sampling_is_seeded_and_samples(default_model):
    from ngspec.engine import Engine

    engine = Engine(default_model)
    ids = list(default_model.tokenizer("Name three colours, then three more.")["input_ids"])
    hot = SamplingConfig(temperature=1.5, seed=3)
    first, _ = engine.hf_generate(ids, 24, sampling=hot)
    again, _ = engine.hf_generate(ids, 24, sampling=hot)
    greedy, _ = engine.hf_generate(ids, 24)
    others = {tuple(engine.hf_generate(ids, 24, sampling=SamplingConfig(temperature=1.5, seed=s))[0]) for s in range(4, 8)}
    assert first == again  # one seed, one sample
    assert len(others | {tuple(greedy)}) > 1  # temperature 1.5 samples: five seeds do not all give greedy's tokens


def _invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


@pytest.mark.slow
def test_bench_samples_every_arm_one_prompt_at_a_time_and_in_batches(tmp_path):
    path = tmp_path / "q.jsonl"
    path.write_text(json.dumps({"question_id": 1, "turns": ["Say something about foxes.", "Say it again."]}) + "\n")
    md = tmp_path / "b.md"
    result = _invoke("bench", "-q", path, "-n", 12, "-d", "trie", "--temperature", "0.8", "--seed", "1", "--json", "--markdown", md)
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert [a["arm"] for a in report["arms"]] == ["hf-sample", "hf-prompt-lookup", "vanilla", "trie"]
    assert [a["exact_match"] for a in report["arms"]] == [None, None, 1.0, 1.0] and report["environment"]["temperature"] == 0.8
    assert [p["turn"] for p in report["prompts"]] == [1, 2] and SAMPLED_NOTE in md.read_text()
    batched = _invoke("bench", "-q", path, "-n", 12, "-b", "2", "--rounds", "1", "-d", "trie", "--temperature", "0.8", "--seed", "1", "--json", "--markdown", md)
    assert batched.exit_code == 0, batched.output
    report = json.loads(batched.stdout.strip().splitlines()[-1])
    assert [a["arm"] for a in report["arms"]] == ["vanilla", "trie"] and [a["exact_match"] for a in report["arms"]] == [None, 1.0]
    assert report["environment"]["temperature"] == 0.8 and "sampled outputs" in md.read_text() and SAMPLED_NOTE in md.read_text()


def test_bench_without_a_seed_draws_one_for_every_arm(tmp_path):
    """Unseeded, bench still samples every arm with one seed (reported), so the engine's arms
    decode the same tokens and their exact match means something."""
    path = tmp_path / "q.jsonl"
    path.write_text(json.dumps({"question_id": 1, "turns": ["Name five fruits."]}) + "\n")
    result = _invoke("bench", "-q", path, "-n", 10, "-d", "trie", "--temperature", "0.9", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert isinstance(report["environment"]["seed"], int)
    assert [a["exact_match"] for a in report["arms"]][2:] == [1.0, 1.0]
