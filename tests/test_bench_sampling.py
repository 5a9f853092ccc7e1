"""`ngspec bench --temperature`: every arm samples, against transformers' own sampling (hf-sample);
speed is compared as for greedy decoding, and no output is checked token for token."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from ngspec.bench.report import SAMPLED_NOTE, markdown, rows, summarise, to_json
from ngspec.bench.runner import ArmRun, BenchRecord, make_arms
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


def test_sampled_arms_are_compared_with_hf_sample_and_exact_match_does_not_apply():
    records = _records("hf-sample")
    base, trie = summarise(records, ["hf-sample", "trie"])
    assert trie.speedup == pytest.approx((8 / 2.5) / (8 / 5.0)) and trie.exact_match is None and base.exact_match is None
    assert rows([base, trie])[1][10] == "-"
    text = markdown([base, trie], {}, 1.0, records=records)
    assert "vs hf-sample" in text and SAMPLED_NOTE in text and "hf-greedy" not in text
    assert all(run["exact_match"] is None for p in to_json(records, [base, trie], {})["prompts"] for run in p["runs"].values())
    # greedy: against hf-greedy, token for token (the trie's tokens differ from the third on)
    greedy = summarise(_records("hf-greedy"), ["hf-greedy", "trie"])
    assert [s.exact_match for s in greedy] == [1.0, 0.0]


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
    assert all(a["exact_match"] is None for a in report["arms"]) and report["environment"]["temperature"] == 0.8
    assert [p["turn"] for p in report["prompts"]] == [1, 2] and SAMPLED_NOTE in md.read_text()
    batched = _invoke("bench", "-q", path, "-n", 12, "-b", "2", "--rounds", "1", "-d", "trie", "--temperature", "0.8", "--seed", "1", "--json", "--markdown", md)
    assert batched.exit_code == 0, batched.output
    report = json.loads(batched.stdout.strip().splitlines()[-1])
    assert [a["arm"] for a in report["arms"]] == ["vanilla", "trie"] and all(a["exact_match"] is None for a in report["arms"])
    assert report["environment"]["temperature"] == 0.8 and "sampled outputs" in md.read_text() and SAMPLED_NOTE in md.read_text()
