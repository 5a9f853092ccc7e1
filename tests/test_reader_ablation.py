"""benchmarks/reader_ablation.py: its arguments (the ablation itself is a benchmark, see BENCHMARKS.md)."""

import subprocess
import sys

from conftest import BENCHMARKS


def test_rounds_below_one_is_a_usage_error_before_anything_loads():
    run = subprocess.run(
        [sys.executable, str(BENCHMARKS / "reader_ablation.py"), "--questions", "none.jsonl", "--eagle-head", "no-head", "--rounds", "0"],
        capture_output=True, text=True,
    )
    assert run.returncode == 2
    assert "--rounds must be at least 1" in run.stderr
    assert "Traceback" not in run.stderr
