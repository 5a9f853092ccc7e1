"""benchmarks/draft_split.py: its timers see every phase of a batched run that drafts with a head,
and the parts add up within the whole (the figures themselves are a benchmark, BENCHMARKS.md 10zzb)."""

import json

import pytest

from conftest import benchmark_script, started_head

split_module = benchmark_script("draft_split")


@pytest.mark.slow
def test_the_split_of_a_batched_eagle_run_on_the_default_model(tmp_path, default_model):
    from ngspec.eagle.head import save_head

    save_head(started_head(default_model.model), tmp_path / "head")
    questions = tmp_path / "q.jsonl"
    prompts = ["Summarise: the cat sat on the mat. The cat sat on the mat again.", "List three colours, then list them again."]
    questions.write_text("".join(json.dumps({"question_id": i, "category": "x", "turns": [t]}) + "\n" for i, t in enumerate(prompts)))
    seconds, calls = split_module.split(["bench", "-q", str(questions), "-n", "12", "-b", "2", "--rounds", "1", "-d", "eagle+search",
                                         "--eagle-head", str(tmp_path / "head"), "--json-out", str(tmp_path / "out.json")])
    report = json.loads((tmp_path / "out.json").read_text())
    assert {a["arm"]: a["exact_match"] for a in report["arms"]} == {"vanilla": 1.0, "eagle+search": 1.0}
    assert calls["run"] >= 1 and seconds["run"] > seconds["drafting"] > 0  # vanilla's runs are not counted
    assert calls["head runs"] == calls["top-k"] >= 1 and calls["head prefill"] >= 2  # each prompt's head prefill
    assert seconds["head runs"] + seconds["top-k"] <= seconds["drafting"]
    assert seconds["head prefill"] + seconds["pooled attention"] <= seconds["head runs"]
    assert calls["start"] >= len(prompts) and calls["observe"] >= calls["drafting"]
