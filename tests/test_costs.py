import warnings

import pytest
import torch

from conftest import next_run
from ngspec.contracts import DraftContext
from ngspec.drafters.trie import TrieDrafter, best_size
from ngspec.perf.costs import _relative_costs, measure_verify_costs
from ngspec.target import TargetModel

pytestmark = pytest.mark.tiny_llama_only  # the Qwen2 tiny model runs the lossless matrices (conftest)


def test_measured_costs_shape(tiny):
    costs = measure_verify_costs(TargetModel(tiny), max_nodes=10, context=16, repeats=1)
    assert len(costs) == 11 and costs[0] == 1.0
    assert all(b >= a for a, b in zip(costs, costs[1:]))


def test_other_work_on_the_machine_does_not_skew_the_table():
    """Oracle: a fake clock. Verifying n nodes takes 10 + n time units; other work adds 50 units
    to two of the three samples of the baseline and of 2 nodes (a median would read 2 nodes as
    cheaper than none, and 4 nodes as costing less than half as much again)."""
    now = [0.0]
    calls = {size: 0 for size in range(5)}

    def verify(size):
        calls[size] += 1
        noisy = size in (0, 2) and calls[size] in (2, 3)  # the warm-up is call 1 of size 0
        now[0] += 10 + size + (50 if noisy else 0)

    table = _relative_costs(verify, torch.device("cpu"), 4, repeats=3, clock=lambda: now[0])
    assert table == pytest.approx([1 + n / 10 for n in range(5)])


def test_best_size_hand_worked():
    steep = DraftContext([], 0, 3, verify_cost=(1.0, 1.05, 1.1, 1.5))
    # expected tokens / cost: 0 -> 1.0, 1 -> 1.9/1.05, 2 -> 2.8/1.1 (best), 3 -> 2.9/1.5
    assert best_size([0.9, 0.9, 0.1], steep) == 2
    assert best_size([0.9, 0.9, 0.1], DraftContext([], 0, 3)) == 3  # flat cost: take everything
    assert best_size([0.01, 0.01], steep) == 0  # nothing likely: do not draft


def test_trie_drafts_less_when_verification_is_expensive():
    prompt = [1, 2, 3, 4, 5, 1, 2, 6, 7, 1, 2, 8, 9]  # after "1 2": three different continuations
    costs = (1.0, 1.02, 1.04) + (3.0,) * 10
    for cost, expect_max in (((), 8), (costs, 2)):
        drafter = TrieDrafter(n=4, prefix_len=2, num_draft=8)
        drafter.start(prompt)
        tree = drafter.propose(DraftContext(prompt + [1, 2], len(prompt), 8, cost))
        assert 0 < tree.size <= expect_max


def test_cost_table_is_cached_per_setting(tiny, tmp_path, monkeypatch, quiet_machine):
    from ngspec.perf import costs as costs_module

    monkeypatch.setenv("NGSPEC_CACHE", str(tmp_path))
    target = TargetModel(tiny)
    first = costs_module.cached_verify_costs(target, 6)
    assert len(first) == 7 and len(list((tmp_path / "costs").glob("*.json"))) == 1

    def must_not_measure(*args, **kwargs):
        raise AssertionError("measured again despite the cache")

    monkeypatch.setattr(costs_module, "measure_verify_costs", must_not_measure)
    assert costs_module.cached_verify_costs(target, 6) == first
    next_run()
    assert costs_module.cached_verify_costs(target, 6) == first  # read back from the cache
    monkeypatch.setenv("NGSPEC_RECALIBRATE", "1")
    monkeypatch.setattr(costs_module, "measure_verify_costs", lambda *a, **k: (1.0,) * 7)
    next_run()
    assert costs_module.cached_verify_costs(target, 6) == (1.0,) * 7
    monkeypatch.setattr(costs_module, "measure_verify_costs", must_not_measure)
    assert costs_module.cached_verify_costs(target, 6) == (1.0,) * 7  # recalibrated once a run, not every call


def test_every_call_records_its_cost_by_the_table(tiny):
    """What each verification cost by the measured table: tokens per cost unit is the speedup the
    table predicts (the ablation's noise-free column); plain decoding costs one unit per call after
    the prefill."""
    import random

    from conftest import repetitive_prompt
    from ngspec.decode import DecodeConfig, generate
    from ngspec.drafters import make_drafter

    table = (1.0, 1.1, 1.4, 1.5)
    target = TargetModel(tiny)
    target.cost_tables = {0: table}
    prompt = repetitive_prompt(random.Random(4), 96, 80)
    got = generate(target, make_drafter("trie"), prompt, DecodeConfig(max_new_tokens=40))
    drafted = got.stats.steps[1:]  # the first is the prefill
    assert any(s.tree_size >= 2 for s in drafted)  # the table's steep entries are exercised
    assert [s.verify_cost for s in drafted] == [table[min(s.tree_size, 3)] for s in drafted]
    assert got.stats.cost_units == sum(table[min(s.tree_size, 3)] for s in drafted)  # prefill left out
    plain = generate(target, make_drafter("vanilla"), prompt, DecodeConfig(max_new_tokens=40))
    assert plain.stats.cost_units == plain.stats.verify_calls - 1


def test_verification_replayed_from_graphs_is_calibrated_apart(tiny, tmp_path, monkeypatch, quiet_machine):
    """`--target-graphs` changes what a step costs (its block's bucket's replay), so its table is
    not the plain one read from the cache: each bucket is timed (one row on the target itself, a
    batch's rows on the batch's fixed shapes), blocks are then padded to the cheapest bucket at
    least as wide for that many rows, and both the table and that plan come back from the cache."""
    from ngspec import static_verify
    from ngspec.perf import costs as costs_module

    monkeypatch.setenv("NGSPEC_CACHE", str(tmp_path))
    monkeypatch.setattr(static_verify, "_WIDTHS", type(static_verify._WIDTHS)())
    plain, fixed = TargetModel(tiny), TargetModel(tiny)
    fixed.use_graphs(capture=False)
    costs_module.cached_verify_costs(plain, 6)
    asked = []
    by_width = {1: 1.0, 2: 1.2, 4: 1.5, 8: 1.1}  # trees of 6 nodes (7 tokens) reach the bucket of 8

    def measured(target, n, batch, progress):
        asked.append((target, batch))
        return dict(by_width)

    monkeypatch.setattr(costs_module, "measure_replay_costs", measured)
    table = costs_module.cached_verify_costs(fixed, 6)
    assert asked == [(fixed, 1)] and table == (1.0, 1.1, 1.1, 1.1, 1.1, 1.1, 1.1)  # 2 and 4 run as 8, cheaper
    assert static_verify.planned_widths(tiny) == {1: {1: 1, 2: 8, 4: 8, 8: 8}}
    table = costs_module.cached_verify_costs(fixed, 6, batch=2)
    assert asked[-1] == (fixed, 2) and static_verify.planned_widths(tiny)[2] == {1: 1, 2: 8, 4: 8, 8: 8}
    assert len(list((tmp_path / "costs").glob("*.json"))) == 3
    monkeypatch.setattr(costs_module, "measure_replay_costs", lambda *a, **k: pytest.fail("measured again despite the cache"))
    next_run()  # read back from the cache
    monkeypatch.setattr(static_verify, "_WIDTHS", type(static_verify._WIDTHS)())
    assert costs_module.cached_verify_costs(fixed, 6) == (1.0, 1.1, 1.1, 1.1, 1.1, 1.1, 1.1)
    assert static_verify.planned_widths(tiny) == {1: {1: 1, 2: 8, 4: 8, 8: 8}}


def test_replayed_trees_cost_their_buckets_replay_a_step_per_bucket():
    """Oracle by hand: which tree sizes are timed (each bucket's widest, and a tree too wide for
    any bucket), and the table they make: flat inside a bucket, the cheaper wider bucket's cost
    where the plan pads to it, linear towards a block too wide for any."""
    from ngspec.perf.costs import _by_width, replay_sizes, replayed_table

    assert replay_sizes(6) == [0, 1, 3, 6] and _by_width({0: 1.0, 1: 1.0, 3: 1.0, 6: 1.0}) == {1: 1.0, 2: 1.0, 4: 1.0, 8: 1.0}
    assert replay_sizes(32) == [0, 1, 3, 7, 15, 31, 32]
    assert replay_sizes(70) == [0, 1, 3, 7, 15, 31, 63, 70] and set(_by_width(dict.fromkeys(replay_sizes(70), 1.0))) == {1, 2, 4, 8, 16, 32, 64, 71}
    costs = {1: 1.0, 2: 1.1, 4: 1.3, 8: 2.5, 16: 2.7, 32: 1.8, 64: 2.0, 71: 6.0}
    table = replayed_table(costs, 70)
    assert table[:4] == (1.0, 1.1, 1.3, 1.3)
    assert set(table[4:32]) == {1.8}  # 8 and 16 run as 32
    assert set(table[32:64]) == {2.0} and table[70] == 6.0 and 2.0 < table[67] < 6.0
    assert replayed_table({1: 1.0, 2: 1.1, 4: 1.3, 8: 2.5}, 5) == (1.0, 1.1, 1.3, 1.3, 2.5, 2.5)


def test_a_devices_bucket_milliseconds_read_relative_to_one_token():
    from ngspec.perf.costs import bucket_costs

    assert bucket_costs("1:4.0,2:5.0,8:8.0,32:6.0") == {1: 1.0, 2: 1.25, 8: 2.0, 32: 1.5}


def test_replay_costs_are_measured_by_width_on_fixed_shapes(tiny):
    """`measure_replay_costs` times one tree per bucket, one row on the target's own fixed shapes
    (which the run then reuses) and a batch's rows on theirs."""
    from ngspec.perf.costs import measure_replay_costs

    target = TargetModel(tiny)
    static = target.use_graphs(capture=False)
    costs = measure_replay_costs(target, 10, context=16, repeats=1)
    assert set(costs) == {1, 2, 4, 8, 16} and costs[1] == 1.0 and all(c > 0 for c in costs.values())
    assert {shape.width for shape in static._shapes} == {1, 2, 4, 8, 16}
    assert set(measure_replay_costs(target, 10, batch=3, context=16, repeats=1)) == {1, 2, 4, 8, 16}


def test_cost_tables_are_keyed_by_the_models_shape_not_its_name(tiny, tmp_path, monkeypatch, quiet_machine):
    """A table is what a forward of these sizes costs: another model of the same shape (the same
    one loaded by name and by path, or a fine-tune) reads it; a model of another shape, which
    could have been given under the same relative path, is measured for itself."""
    from ngspec.models import TINY_FAMILIES, tiny_model
    from ngspec.perf import costs as costs_module

    family = tiny.config.model_type
    monkeypatch.setenv("NGSPEC_CACHE", str(tmp_path))
    monkeypatch.setattr(costs_module, "measure_verify_costs", lambda target, n, progress: (1.0,) + (2.0,) * n)
    assert costs_module.cached_verify_costs(TargetModel(tiny), 6) == (1.0,) + (2.0,) * 6
    monkeypatch.setattr(costs_module, "measure_verify_costs", lambda target, n, progress: (1.0,) + (3.0,) * n)
    assert costs_module.cached_verify_costs(TargetModel(tiny_model(family, seed=5)), 6) == (1.0,) + (2.0,) * 6  # same shape, other weights
    wider = tiny_model(family, vocab_size=160)
    assert costs_module.model_shape(wider) != costs_module.model_shape(tiny)
    assert costs_module.cached_verify_costs(TargetModel(wider), 6) == (1.0,) + (3.0,) * 6
    other = next(f for f in TINY_FAMILIES if f != family)
    assert costs_module.model_shape(tiny_model(other)) != costs_module.model_shape(tiny)


def test_a_calibration_shows_its_rounds_while_measured_and_nothing_once_cached(tiny, tmp_path, monkeypatch, quiet_machine):
    """The engine's verify costs (about 9 s for the default model on two cores, 34 s at batch 8)
    report their rounds to the engine's ``bar`` while they are measured, and are read from the
    cache without one. Before, they ran silent after the kernel timing's bar."""
    from contextlib import contextmanager

    from ngspec.engine import Engine
    from ngspec.models import LoadedModel

    monkeypatch.setenv("NGSPEC_CACHE", str(tmp_path))
    shown: list[tuple[str, list]] = []

    @contextmanager
    def bar(what):
        calls: list = []
        shown.append((what, calls))
        yield lambda done, total: calls.append((done, total))

    engine = Engine(LoadedModel(tiny, None, "tiny"), max_draft_nodes=6, bar=bar)
    engine.batch_costs(2)
    assert [what for what, _ in shown] == ["timing verify costs (rounds)", "timing verify costs at batch 2 (rounds)"]
    assert all(calls == [(done, 9) for done in range(10)] for _, calls in shown)
    shown.clear()
    Engine(LoadedModel(tiny, None, "tiny"), max_draft_nodes=6, bar=bar).batch_costs(2)
    assert shown == []


def test_a_cache_that_keeps_nothing_still_times_each_batch_size_once_a_run(tiny, tmp_path, monkeypatch, quiet_machine):
    """`ngspec serve` starts a batch for every burst of requests: with a cache it cannot write (or
    a busy machine, whose timings are not kept) it timed the batch's verify costs again for every
    burst, 34 s at batch size 8 on two cores. Now once a process per batch size."""
    from ngspec import Speculator
    from ngspec.batch import BatchConfig
    from ngspec.decode import DecodeConfig
    from ngspec.perf import costs as costs_module

    (tmp_path / "file").write_text("")
    monkeypatch.setenv("NGSPEC_CACHE", str(tmp_path / "file" / "cache"))  # nothing can be written there
    timed = []
    real = costs_module.measure_batch_costs
    monkeypatch.setattr(costs_module, "measure_batch_costs", lambda *a, **k: timed.append(a[1]) or real(*a, **k))
    with pytest.warns(RuntimeWarning, match="cannot write the timing of verification costs"):
        spec = Speculator.from_model(tiny, drafter="trie")
        first, _ = spec.run_batch([[1, 2, 3], [4, 5]], DecodeConfig(max_new_tokens=6), BatchConfig(2))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing timed, so nothing to warn of again
        again, _ = spec.run_batch([[1, 2, 3], [4, 5]], DecodeConfig(max_new_tokens=6), BatchConfig(2))
    assert timed == [2]
    assert [r.generation.token_ids for r in again] == [r.generation.token_ids for r in first]
