"""benchmarks/head_worth.py: the tree it scores as the step without the head is the one the gate's
skip would have drafted, both trees are scored against the true continuation, and the policy
replay adds up tokens and costs as it says (the diagnostic itself is a benchmark, BENCHMARKS.md)."""

import json
import math
import sys

import pytest
from conftest import benchmark_script
from test_search import ScoredEagle

from ngspec.contracts import DraftContext, DraftTree

worth = benchmark_script("head_worth")
HISTORY = [1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 7, 8]  # "1 2" went on as "3 4" twice, as "7 8" once
COST = (1.0,) * 6 + (3.0,) * 30  # five nodes are free, a sixth costs two steps more


def witness_step(truth: list[int]):
    """One step after "... 1 2" with a head that guesses 9 (then 4); the generated text so far is
    the last two tokens of the context, ``truth`` what greedy decoding emits next."""
    eagle = ScoredEagle(DraftTree((9, 4), (-1, 0)), [math.log(0.6), math.log(0.3)], head_cost=0.2)
    rows: list[dict] = []
    d = worth.Witness(eagle, None, depth=4, prefix_len=2, reference=[1, 2] + truth, rows=rows)
    d.start(HISTORY)
    ctx = DraftContext(HISTORY + [1, 2], len(HISTORY), 20, COST)
    tree = d.propose(ctx)
    skipped = worth.search.EagleSearchDrafter(ScoredEagle(DraftTree(), []), None, depth=4, prefix_len=2)
    skipped.start(HISTORY)
    skipped._head_pays = lambda *a: False
    return rows[0], tree, skipped.propose(ctx), eagle


def test_the_head_runs_every_step_and_both_trees_are_scored():
    row, with_head, alone, eagle = witness_step([9, 4, 5])
    assert eagle.caps, "the head ran although the gate is recorded"
    assert 9 in with_head.tokens and 9 not in alone.tokens
    assert row["accepted_with"] == 2 and row["accepted_without"] == 0  # 9 4 accepted; the branch says 3
    assert row["head_right"] and not row["branch_right"]
    assert row["cost_with"] == COST[with_head.size] and row["cost_without"] == COST[alone.size]
    assert 0 < row["credited"] < 0.5  # the head's top-guess rate starts from one in two


def test_the_step_without_the_head_is_the_skipped_steps_tree():
    row, with_head, alone, _ = witness_step([3, 4, 1])
    assert row["branch_right"] and not row["head_right"]
    # without the head the branch keeps its third node; the head's two nodes took its place
    assert row["accepted_without"] == 3 == len(worth.accepted_path(alone, [3, 4, 1]))
    assert row["accepted_with"] == 2 == len(worth.accepted_path(with_head, [3, 4, 1]))


def test_policies_add_tokens_and_costs():
    rows = [
        {"gate": True, "credited": 0.5, "head_cost": 0.2, "accepted_with": 2, "accepted_without": 0, "cost_with": 1.1, "cost_without": 1.0, "head_right": True, "branch_right": False},
        {"gate": False, "credited": 0.1, "head_cost": 0.2, "accepted_with": 1, "accepted_without": 1, "cost_with": 1.2, "cost_without": 1.0, "head_right": False, "branch_right": True},
    ]
    s = worth.summarise(rows)
    assert s["all"]["realized"] == pytest.approx(1.0) and s["all"]["credited"] == pytest.approx(0.3)
    assert s["gate runs"]["realized"] == 2 and s["gate skips"]["realized"] == 0
    rates = s["tokens per cost"]
    assert rates["never"] == pytest.approx(3 / 2.0)
    assert rates["always"] == pytest.approx(5 / (1.3 + 1.4))
    assert rates["gate"] == pytest.approx(5 / (1.3 + 1.0)) == rates["per-step best"]


def test_what_was_known_before_the_head_ran_is_recorded():
    row, *_ = witness_step([9, 4, 5])
    assert row["prompt"] == 0 and row["source"] == "local" and row["match"] == 2 == row["local_depth"]
    assert 0 < row["reach0"] <= 1  # "1 2" went on as "3" two times in three


def test_another_devices_head_cost_stands_in_for_the_timed_one():
    """`--head-cost`: the gate and the records weigh the head as that device's run, not as timed here."""
    eagle = ScoredEagle(DraftTree((9,), (-1,)), [math.log(0.6)], head_cost=0.2)
    rows: list[dict] = []
    d = worth.Witness(eagle, None, depth=4, prefix_len=2, reference=[1, 2, 9], rows=rows, head_cost=0.05)
    d.start(HISTORY)
    d._head_seconds = 3.0  # timed here: 3 plain steps a run
    ctx = DraftContext(HISTORY + [1, 2], len(HISTORY), 20, COST, step_seconds=1.0)
    d.propose(ctx)
    assert rows[0]["head_cost"] == 0.05
    d.device_head_cost = None
    assert d._head_cost(ctx) == 3.0


def test_the_calibrated_gate_scales_the_credit_by_what_the_first_level_showed():
    """Replayed: a credit of 0.5 a step, a run weighed at 0.1 steps and a node at 0.1, so a run
    pays while the scaled credit is above 0.2. The head's first level never adds a node, so the
    scale falls from 1 as the calibration's (0 + prior) / (credited + 1), its prior the same record's
    1 / (credited + 1): runs at 1 and 1 / 2.25, then 1 / 4 stops it."""
    step = {"gate": True, "credited": 0.5, "head_cost": 0.2, "expected": 1.0, "cost_n": 1.0, "cost_n1": 1.1,
            "first_level_only": False, "accepted_with": 1, "accepted_without": 1, "cost_with": 1.1, "cost_without": 1.0,
            "head_right": False, "branch_right": True, "prompt": 0}
    s = worth.summarise([dict(step) for _ in range(4)])
    assert s["calibrated gate runs"]["steps"] == 2 and s["gate runs"]["steps"] == 4
    assert s["tokens per cost"]["calibrated gate"] == pytest.approx(8 / (2 * 1.3 + 2 * 1.0))
    assert s["first level only accepted, gate runs"] == 0.0


def test_the_first_levels_own_accepted_node_is_recorded():
    row, *_ = witness_step([9, 4, 5])  # the head's 9 is no branch's
    assert row["first_level_only"] and row["expected"] >= 1.0 and row["cost_n1"] >= row["cost_n"]
    row, *_ = witness_step([3, 4, 1])
    assert not row["first_level_only"]


def test_the_replayed_policies_include_a_fuller_record_and_fixed_credit_scales(tmp_path, capsys, monkeypatch):
    """Four steps worth 0.5 of credit each, the run weighed at 0.1 steps and its node at 0.1 (a run
    pays while the weighed credit is above 0.2). The head's own first node is taken every time,
    with 2 tokens: the first-level record (1 a run) holds the scale near 1, the accepted length
    raises it, and a fixed scale of 1.5-3 keeps every run. `--replay` prints the same summary from
    a saved run's records."""
    step = {"gate": True, "credited": 0.5, "head_cost": 0.2, "expected": 1.0, "cost_n": 1.0, "cost_n1": 1.1,
            "first_level_only": True, "accepted_with": 2, "accepted_without": 0, "cost_with": 1.1, "cost_without": 1.0,
            "head_right": True, "branch_right": False, "prompt": 0}
    rows = [dict(step) for _ in range(4)]
    s = worth.summarise(rows)
    rates = s["tokens per cost"]
    every_run = 4 * 3 / (4 * 1.3)
    assert rates["calibrated gate"] == rates["calibrated gate, accepted length"] == pytest.approx(every_run)
    assert rates["credit x1.5"] == rates["credit x2"] == rates["credit x3"] == pytest.approx(every_run)
    saved = tmp_path / "w.json"
    saved.write_text(json.dumps({"summary": s, "steps": rows}))
    monkeypatch.setattr(sys, "argv", ["head_worth.py", "--replay", str(saved)])
    worth.main()
    assert json.loads(capsys.readouterr().out) == json.loads(json.dumps(s))


def test_a_fixed_credit_scale_below_the_cost_keeps_the_head_off():
    """A credit of 0.05 weighed x1.5-3 stays below the 0.2 a run must gain (except the probes every
    16 skipped steps), while the accepted-length record cannot start a run it never sees."""
    step = {"gate": False, "credited": 0.05, "head_cost": 0.2, "expected": 1.0, "cost_n": 1.0, "cost_n1": 1.1,
            "first_level_only": False, "accepted_with": 0, "accepted_without": 0, "cost_with": 1.1, "cost_without": 1.0,
            "head_right": False, "branch_right": False, "prompt": 0}
    s = worth.summarise([dict(step) for _ in range(10)])
    assert s["tokens per cost"]["credit x3"] == pytest.approx(s["tokens per cost"]["never"])
