"""benchmarks/spec_bench_variants.py: in-domain training prompts that leave the held-out questions out."""

import json
import subprocess
import sys
from pathlib import Path

from conftest import BENCHMARKS, benchmark_script
from ngspec.prompts import load_prompts

SCRIPT = BENCHMARKS / "spec_bench_variants.py"


def _rows() -> list[dict]:
    rows = []
    for i in range(4):
        rows.append({"category": "rag", "turns": [f"passage {i} a\npassage {i} b\nWho is {i}?"]})
        rows.append({"category": "summarization", "turns": [f"Summarize: article {i}"]})
    rows.append({"category": "qa", "turns": ["Who sings it?"]})
    rows.append({"category": "writing", "turns": ["Write a poem."]})
    return rows


def _question_file(tmp_path: Path) -> Path:
    questions = tmp_path / "question.jsonl"
    questions.write_text("".join(json.dumps(r) + "\n" for r in _rows()))
    return questions


def test_held_out_questions_stay_out_and_each_document_is_asked_three_ways(tmp_path):
    sv = benchmark_script("spec_bench_variants")
    prompts = sv.variants(load_prompts(_question_file(tmp_path)), holdout=2)
    text = "\n".join(prompts)
    for held in ("passage 0", "passage 1", "article 0", "article 1", "Who is"):
        assert held not in text
    assert [p for p in prompts if p.startswith("passage 2 a\npassage 2 b\n")] == [
        "passage 2 a\npassage 2 b\n" + q for q in sv.RAG_QUESTIONS]
    assert [p for p in prompts if p.endswith("article 3")] == [i + "article 3" for i in sv.ARTICLE_INSTRUCTIONS]
    assert len(prompts) == 2 * 3 + 2 * 3 + 1 and prompts[-1] == "Who sings it?"


def test_the_written_file_is_a_prompt_file_synth_corpus_reads(tmp_path):
    out = tmp_path / "prompts.jsonl"
    subprocess.run([sys.executable, str(SCRIPT), str(_question_file(tmp_path)), "--holdout", "3", "--out", str(out)], check=True, capture_output=True)
    assert len(load_prompts(out)) == 3 + 3 + 1


def test_originals_are_the_questions_after_the_held_out_ones_as_asked(tmp_path):
    out = tmp_path / "originals.jsonl"
    subprocess.run([sys.executable, str(SCRIPT), str(_question_file(tmp_path)), "--holdout", "2", "--originals", "--out", str(out)],
                   check=True, capture_output=True)
    assert [p.text for p in load_prompts(out)] == [
        "passage 2 a\npassage 2 b\nWho is 2?", "passage 3 a\npassage 3 b\nWho is 3?",
        "Summarize: article 2", "Summarize: article 3"]
