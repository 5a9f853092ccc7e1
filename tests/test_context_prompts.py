"""benchmarks/context_prompts.py: summarisation and passage-QA prompts for `synth-corpus --prompts`."""

import json
import subprocess
import sys
from pathlib import Path

from conftest import BENCHMARKS, benchmark_script
from ngspec.prompts import load_prompts

SCRIPT = BENCHMARKS / "context_prompts.py"


def _module():
    return benchmark_script("context_prompts")


def _passage(i: int) -> str:
    return " ".join(f"word{i}-{j}" for j in range(80))


def _corpus(tmp_path: Path) -> Path:
    records = [{"instruction": f"Question {i}?\nmore", "response": _passage(i)} for i in range(4)]
    records.append({"instruction": "Too short", "response": "yes"})
    records.append({"instruction": "Repeats", "response": "again " * 100})
    (tmp_path / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    # Magpie's 5-response exports: a .json array whose records hold a ``responses`` list.
    (tmp_path / "b.json").write_text(json.dumps([{"instruction": "Listed?", "responses": [_passage(9), "too short"]}]))
    return tmp_path


def test_passages_keep_readable_responses_from_jsonl_and_json(tmp_path):
    pairs = _module().passages([_corpus(tmp_path)])
    assert sorted(q for q, _ in pairs) == ["Listed?", "Question 0?\nmore", "Question 1?\nmore", "Question 2?\nmore", "Question 3?\nmore"]


def test_prompts_alternate_summaries_and_questions_a_passage_answers(tmp_path):
    cp = _module()
    pairs = cp.passages([_corpus(tmp_path)])
    prompts = cp.context_prompts(pairs, 10, seed=1)
    assert prompts == cp.context_prompts(pairs, 10, seed=1)
    assert prompts != cp.context_prompts(pairs, 10, seed=2)
    by_question = {q.splitlines()[0]: p for q, p in pairs}
    for i, prompt in enumerate(prompts):
        if i % 2 == 0:
            assert prompt.startswith("Summarize: ") and prompt[len("Summarize: "):] in {p for _, p in pairs}
        else:
            *shown, question = prompt.split("\n")
            assert len(shown) == 2 and by_question[question] in shown


def test_the_written_file_is_a_prompt_file_synth_corpus_reads(tmp_path):
    out = tmp_path / "prompts.jsonl"
    subprocess.run([sys.executable, str(SCRIPT), str(_corpus(tmp_path)), "--n", "6", "--out", str(out)], check=True, capture_output=True)
    assert len(load_prompts(out)) == 6
