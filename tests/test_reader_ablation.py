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


def test_interleaved_groups_cover_every_prompt_once_and_reports_add_up():
    from conftest import benchmark_script

    from ngspec.batch import BatchReport

    ablation = benchmark_script("reader_ablation")
    ids = list(range(37))
    assert ablation.batch_groups(ids, 8, 0) == [ids]
    groups = ablation.batch_groups(ids, 8, 2)
    assert [len(g) for g in groups] == [16, 16, 5] and sum(groups, []) == ids
    a = BatchReport(steps=3, cost_units=2.5, slot_steps=40, live_steps=30, peak_slots=12, seconds=1.0, new_tokens=9, prefill_tokens=8192,
                    target_graphs="3 captured")
    b = BatchReport(steps=5, cost_units=1.5, slot_steps=60, live_steps=20, peak_slots=20, seconds=2.0, new_tokens=7, prefill_tokens=8192,
                    target_graphs="4 captured")
    total = ablation.combined([a, b])
    assert (total.steps, total.cost_units, total.seconds, total.new_tokens, total.peak_slots) == (8, 4.0, 3.0, 16, 20)
    assert (total.prefill_tokens, total.target_graphs) == (8192, "4 captured")  # a cap, and a report counting over the runs
    assert total.hole_share == 0.5  # 1 - 50 live of 100 slots attended, not the mean of the two shares


def test_interleave_batches_below_zero_is_a_usage_error():
    run = subprocess.run(
        [sys.executable, str(BENCHMARKS / "reader_ablation.py"), "--questions", "none.jsonl", "--eagle-head", "no-head", "--interleave-batches", "-1"],
        capture_output=True, text=True,
    )
    assert run.returncode == 2 and "--interleave-batches must be 0 or more" in run.stderr and "Traceback" not in run.stderr
