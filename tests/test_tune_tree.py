"""Tree-shape tuning: the large tree, acceptance counting, pruning, the golden-section search,
and tuned-shape files."""

import json
import random
from collections import Counter
from pathlib import Path

import pytest

from conftest import repetitive_prompt
from ngspec.batch import BatchConfig, generate_batch
from ngspec.decode import DecodeConfig, Stopper
from ngspec.drafters.eagle import EagleOptions, EagleDrafter, check_choices, check_shape_model, read_shape
from ngspec.eagle.tune import AcceptanceRecorder, acceptance_rates, expected_tokens, golden_section_max, large_tree, prune
from ngspec.errors import NgspecError
from test_lossless import VOCAB, tiny_eagle  # noqa: F401 (fixture)

pytestmark = pytest.mark.tiny_llama_only  # the Qwen2 tiny model runs the lossless matrices (conftest)


def test_large_tree_is_connected_and_bounded():
    tree = large_tree(width=4, depth=3, nodes=30)
    assert len(tree) == 30 and len(set(tree)) == 30
    assert check_choices(tree) == tree  # every parent listed, sorted by depth
    assert max(len(p) for p in tree) <= 3 and max(max(p) for p in tree) < 4
    assert (0,) in tree and (0, 0) in tree


@pytest.mark.parametrize("nodes", [1, 5, 30])
def test_a_large_tree_wider_or_deeper_than_its_nodes_is_the_same_tree(nodes):
    """Bounds past ``nodes`` change nothing (a width of 10**6 pushed 10**6 candidates per node taken)."""
    assert large_tree(width=nodes, depth=nodes, nodes=nodes) == large_tree(width=10**6, depth=10**6, nodes=nodes)
    assert large_tree(width=nodes + 3, depth=nodes + 1, nodes=nodes) == large_tree(width=nodes, depth=nodes, nodes=nodes)


def test_prune_keeps_the_most_accepted_nodes_as_a_connected_tree():
    rates = {(0,): 0.6, (1,): 0.1, (0, 0): 0.3, (0, 1): 0.1, (0, 0, 0): 0.1, (2,): 0.0}
    assert prune(rates, 2) == ((0,), (0, 0))
    three = prune(rates, 3)
    assert len(three) == 3 and check_choices(three) == three
    assert (0,) in three and (0, 0) in three
    assert expected_tokens(rates, prune(rates, 2)) == pytest.approx(1.9)


@pytest.mark.parametrize("peak", [1, 2, 7, 19, 33, 40])
def test_golden_section_finds_the_peak_of_a_unimodal_function(peak):
    calls = []

    def f(x):
        calls.append(x)
        return -abs(x - peak) * 1.5

    assert golden_section_max(f, 1, 40) == peak
    assert len(calls) == len(set(calls)) < 20  # each point once, far fewer than all 40


def test_recorded_acceptance_adds_up_to_the_accepted_tokens(tiny, tiny_eagle):
    rng = random.Random(3)
    prompts = [repetitive_prompt(rng, VOCAB, rng.randrange(10, 60)) for _ in range(4)]
    base = tiny_eagle()
    choices = large_tree(width=3, depth=3, nodes=12)
    opts = EagleOptions(tree="static", choices=choices)
    accepted, steps = Counter(), Counter()
    make = lambda: AcceptanceRecorder(EagleDrafter(base.head, base.embed, base.lm_head, opts), accepted, steps)  # noqa: E731
    results, report = generate_batch(tiny, prompts, make, DecodeConfig(max_new_tokens=24), BatchConfig(2), lambda: Stopper(frozenset()))
    gens = [r.generation for r in results]
    drafted_steps = sum(len(g.stats.steps) - 1 for g in gens)  # the prefill drafts nothing
    assert steps["steps"] == drafted_steps
    assert sum(accepted.values()) == sum(s.accepted - 1 for g in gens for s in g.stats.steps[1:])
    rates = acceptance_rates(accepted, steps["steps"], choices)
    for c in choices:  # a child is never accepted more often than its parent
        if len(c) > 1:
            assert rates[c] <= rates[c[:-1]]
    assert expected_tokens(rates, choices) == pytest.approx(sum(s.accepted for g in gens for s in g.stats.steps[1:]) / drafted_steps)


def test_tuned_shape_files(tmp_path):
    good = tmp_path / "shape.json"
    good.write_text(json.dumps({"format": "ngspec-tree-shape", "model": "tiny", "choices": [[0], [0, 0], [1]]}))
    choices, meta = read_shape(good)
    assert choices == ((0,), (1,), (0, 0)) and meta["model"] == "tiny"
    check_shape_model(good, "tiny")
    with pytest.raises(NgspecError, match="tuned for model 'tiny'"):
        check_shape_model(good, "other")
    plain = tmp_path / "plain.json"
    plain.write_text("[[0], [1]]")
    check_shape_model(plain, "any")  # a bare list says nothing about the model
    # a tune-tree file records the model's fingerprint: the same model under another name (by
    # path) is accepted, another model under the same name refused
    printed = tmp_path / "printed.json"
    printed.write_text(json.dumps({"model": "tiny", "model_fingerprint": "abc", "choices": [[0]]}))
    check_shape_model(printed, "/models/tiny", "abc")
    with pytest.raises(NgspecError, match="tuned for model 'tiny', whose config or weights differ from those of 'tiny'"):
        check_shape_model(printed, "tiny", "def")
    printed.write_text(json.dumps({"model": None, "model_fingerprint": "abc", "choices": [[0]]}))  # it said "tuned for model None"
    with pytest.raises(NgspecError, match="tuned for another model, whose config or weights differ from those of 'tiny'"):
        check_shape_model(printed, "tiny", "def")
    printed.write_text(json.dumps({"model": 5, "choices": [[0]]}))  # a model named by no string is not compared by name
    check_shape_model(printed, "tiny")
    for bad, message in [("{\"model\": \"x\"}", "without 'choices'"), ("[[0, 0]]", "without its parent"), ("[]", "no nodes"), ("not json", "expected a JSON list"),
                         ("null", r"expected a JSON list .*\(got null\)"), ('{"choices": 3}', r"\(got 3\)"), ("[0, 1]", r"\(got \[0, 1\]\)")]:
        path = tmp_path / "bad.json"
        path.write_text(bad)
        with pytest.raises(NgspecError, match=message):
            read_shape(path)


def test_coarse_scan_then_golden_section_survives_a_misleading_middle():
    # the best is at 3; a bump near 20 (an extra tree level, noise) traps a plain golden section
    values = {x: 30.0 - x for x in range(2, 81)}
    values.update({13: 16.0, 15: 20.0, 21: 19.0})
    from ngspec.eagle.tune import coarse_then_golden

    calls = []

    def f(x):
        calls.append(x)
        return values[x]

    assert coarse_then_golden(f, 2, 80) == 2
    assert len(calls) == len(set(calls)) < 15
    peaked = {x: -abs(x - 11) for x in range(1, 65)}
    assert coarse_then_golden(lambda x: peaked[x], 1, 64) == 11


def test_calibration_uses_every_question_of_your_own_file(tmp_path):
    from ngspec.cli.tune import calibration_prompts, calibration_source

    own = tmp_path / "calib.jsonl"
    own.write_text("".join(json.dumps({"prompt": f"passage {i}"}) + "\n" for i in range(5)))
    assert len(calibration_prompts(own, None, None)) == 5
    assert len(calibration_prompts(own, None, 3)) == 3
    default = calibration_prompts(None, None, None)
    assert len(default) == 8 and len({p.category for p in default}) == 8
    assert len(calibration_prompts(None, 2, None)) == 16
    assert [calibration_source(q) for q in (own, None, Path("-"))] == [str(own), "the bundled MT-bench", "standard input"]


class DriftingMachine:
    """A fake timer: count m truly runs at ``speeds[m]`` tokens/s, but the machine slows by
    ``drift`` of its speed with every group run (another tenant arriving), as a shared VM does."""

    def __init__(self, speeds: dict[int, float], drift: float) -> None:
        self.speeds, self.drift, self.clock, self.calls = speeds, drift, 0, []

    def run_group(self, m: int, g: int) -> tuple[float, float, int]:
        self.calls.append((m, g))
        slow = 1.0 - self.drift * self.clock
        self.clock += 1
        return 100.0, 100.0 / (self.speeds[m] * slow), 50


def test_side_by_side_runs_every_group_of_each_count_in_rotated_order():
    from ngspec.eagle.tune import SideBySide

    machine = DriftingMachine({2: 1.0, 4: 1.0, 8: 1.0}, 0.0)
    announced = []
    timer = SideBySide(machine.run_group, 3, lambda counts, groups: announced.append((counts, groups)))
    fresh = timer.measure([2, 4, 8, 4])
    assert machine.calls == [(2, 0), (4, 0), (8, 0), (4, 1), (8, 1), (2, 1), (8, 2), (2, 2), (4, 2)]
    assert announced == [([2, 4, 8], 3)] and sorted(fresh) == [2, 4, 8]
    assert timer.measure([4, 8]) == {} and len(machine.calls) == 9  # measured already
    timer.measure([4, 8], again=True)
    assert len(machine.calls) == 15 and len(timer.runs[4]) == 3  # timed again: the new runs replace the old
    with pytest.raises(ValueError):
        SideBySide(machine.run_group, 0)


def test_counts_timed_side_by_side_rank_right_where_one_after_the_other_does_not():
    """Count 3 is truly 2% faster than count 5; the machine slows by 1% per group run. Timed one
    after the other (5 first), 3 looks slower; side by side, group by group, it is faster."""
    from ngspec.eagle.tune import SideBySide

    speeds = {3: 51.0, 5: 50.0}
    after = SideBySide(DriftingMachine(speeds, 0.01).run_group, 8)
    after.measure([5])
    after.measure([3])
    assert after.tokens_per_second(3) < after.tokens_per_second(5)
    together = SideBySide(DriftingMachine(speeds, 0.01).run_group, 8)
    together.measure([3, 5])
    assert together.tokens_per_second(3) > together.tokens_per_second(5)


def test_the_search_hands_each_comparison_to_together_before_reading_it():
    from ngspec.eagle.tune import coarse_then_golden

    peaked = {x: -abs(x - 11) for x in range(1, 65)}
    measured: set[int] = set()
    handed = []

    def together(points):
        handed.append(list(points))
        measured.update(points)

    def f(x):
        assert x in measured, f"{x} read before it was handed over"
        return peaked[x]

    assert coarse_then_golden(f, 1, 64, together) == 11 == coarse_then_golden(lambda x: peaked[x], 1, 64)
    assert handed[0] == [1, 2, 4, 8, 16, 32, 64]  # the scan, in one comparison
    assert all(len(points) == 2 for points in handed[1:-1])  # then golden-section pairs


def test_the_playoff_times_the_finalists_again_and_says_how_sure_it_is():
    """Early timings on a fast machine favour 8 and 16; timed again side by side, 4 (truly 3%
    ahead of 8) wins, and the interval of its lead holds the true ratio."""
    from ngspec.eagle.tune import SideBySide, playoff

    speeds = {2: 40.0, 4: 51.5, 8: 50.0, 16: 45.0}
    machine = DriftingMachine(speeds, 0.004)
    timer = SideBySide(machine.run_group, 12)
    for m in (16, 8, 2, 4):  # one after the other, on a machine that slows: the latest look worst
        timer.measure([m])
    assert max(timer.runs, key=timer.tokens_per_second) != 4
    final = playoff(timer, 3)
    assert final.best == 4 and set(final.counts) == {4, 8, 16}
    assert len(timer.runs[4]) == 12 and len(machine.calls) == 4 * 12 + 3 * 12
    assert final.ratio == pytest.approx(51.5 / 50.0, rel=0.01)
    assert final.interval is not None and final.interval[0] <= 51.5 / 50.0 <= final.interval[1]
    assert final.interval[0] > 1.0  # 3% clear of a steady 1% spread of drift across the rotation

    alone = playoff(timer, 1)  # no playoff: the best so far, nothing timed again
    assert alone.counts == (4,) and alone.ratio is None and len(machine.calls) == 84
    one_group = SideBySide(DriftingMachine(speeds, 0.0).run_group, 1)
    one_group.measure([4, 8])
    assert playoff(one_group, 2).interval is None  # one pair: nothing to resample
