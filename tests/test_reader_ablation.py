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


def test_flat_cost_and_a_cost_slope_exclude_each_other():
    run = subprocess.run(
        [sys.executable, str(BENCHMARKS / "reader_ablation.py"), "--questions", "none.jsonl", "--eagle-head", "no-head", "--flat-cost", "--cost-slope", "0.004"],
        capture_output=True, text=True,
    )
    assert run.returncode == 2 and "exclude each other" in run.stderr and "Traceback" not in run.stderr


def test_a_cost_slope_is_every_drafters_table_at_every_batch_size():
    from conftest import benchmark_script

    from ngspec.models import LoadedModel, tiny_model

    ablation = benchmark_script("reader_ablation")
    engine = ablation.engine_for(LoadedModel(tiny_model("llama"), None, "tiny"), False, 0.004, 96)
    table = engine.target.verify_cost()
    assert len(table) == 97 and table[0] == 1.0 and abs(table[50] - 1.2) < 1e-12
    assert engine.batch_costs(8)(300) == table == engine.target.verify_cost(300)
    assert ablation.engine_for(LoadedModel(tiny_model("llama"), None, "tiny"), True, None, 96).target.verify_cost() == ()
