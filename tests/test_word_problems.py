"""benchmarks/word_problems.py: seeded arithmetic prompts for `synth-corpus --prompts`."""

import subprocess
import sys

from conftest import BENCHMARKS, benchmark_script
from ngspec.prompts import load_prompts

SCRIPT = BENCHMARKS / "word_problems.py"


def _module():
    return benchmark_script("word_problems")


def test_problems_are_seeded_distinct_questions():
    wp = _module()
    first = wp.word_problems(64, seed=3)
    assert first == wp.word_problems(64, seed=3)
    assert first != wp.word_problems(64, seed=4)
    assert len(set(first)) == 64
    assert all(p.endswith("?") for p in first)


def test_the_written_file_is_a_prompt_file_synth_corpus_reads(tmp_path):
    out = tmp_path / "problems.jsonl"
    subprocess.run([sys.executable, str(SCRIPT), "--n", "20", "--out", str(out)], check=True, capture_output=True)
    prompts = load_prompts(out)
    assert [p.text for p in prompts] == _module().word_problems(20, seed=0)
