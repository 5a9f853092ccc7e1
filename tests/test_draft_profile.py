"""benchmarks/draft_profile.py: its two runs decode the same tokens as plain decoding, and its
profile covers the drafting phase (the timings themselves are a benchmark, BENCHMARKS.md 10c)."""

import random

from conftest import benchmark_script, repetitive_prompt, started_head

from ngspec.batch import BatchConfig
from ngspec.decode import DecodeConfig
from ngspec.drafters import make_drafter
from ngspec.drafters.eagle import EagleOptions, eagle_factory
from ngspec.engine import Engine
from ngspec.models import LoadedModel, tiny_model

profile = benchmark_script("draft_profile")


def test_profile_of_a_batch_with_rows_together_and_row_by_row():
    model = tiny_model("llama", seed=3)
    head = started_head(model)
    engine = Engine(LoadedModel(model, None, "tiny"), calibrate=False)
    rng = random.Random(2)
    ids = [repetitive_prompt(rng, 96, n) for n in (9, 30, 17)]
    cfg = DecodeConfig(max_new_tokens=12)
    res = profile.profile_batch(engine, ids, eagle_factory(model, head, EagleOptions(top_k=3, depth=3, total_tokens=8)), cfg, 3)
    plain = [engine.run(x, make_drafter("vanilla"), cfg).token_ids for x in ids]
    assert res["together"]["tokens"] == res["row_by_row"]["tokens"] == plain
    assert res["together"]["steps"] > 0 and res["together"]["drafting_ms_per_step"] > 0
    assert "run_calls" in res["profile"] and "top_children" in res["profile"]


def test_a_whole_step_profile_of_a_drafter_without_a_head():
    model = tiny_model("llama", seed=3)
    engine = Engine(LoadedModel(model, None, "tiny"), calibrate=False)
    rng = random.Random(3)
    ids = [repetitive_prompt(rng, 96, n) for n in (12, 25)]
    cfg = DecodeConfig(max_new_tokens=10)
    res = profile.profile_batch(engine, ids, lambda: make_drafter("trie"), cfg, 2, top=1000, whole_step=True)
    assert res["together"]["tokens"] == [engine.run(x, make_drafter("vanilla"), cfg).token_ids for x in ids]
    assert "(verify)" in res["profile"] and "(commit)" in res["profile"]  # the batch's verification is in it, not only drafting


def test_an_eagle_drafter_without_a_head_is_a_usage_error_before_anything_loads():
    import subprocess
    import sys

    from conftest import BENCHMARKS

    run = subprocess.run([sys.executable, str(BENCHMARKS / "draft_profile.py"), "--questions", "none.jsonl"], capture_output=True, text=True)
    assert run.returncode == 2
    assert "--drafter whole-tree needs --eagle-head" in run.stderr and "Traceback" not in run.stderr


def test_a_cost_slope_makes_the_whole_method_size_its_trees_as_on_a_gpu():
    """With ``--cost-slope`` (the engine's ``cost_slope``) the drafters see a verify cost, so the whole method takes its costly
    path (the local trie's tree merged in, the head gated), and the outputs stay plain greedy's."""
    from ngspec.drafters import DrafterOptions

    model = tiny_model("llama", seed=3)
    head = started_head(model)
    engine = Engine(LoadedModel(model, None, "tiny"), calibrate=False, cost_slope=0.004)
    assert engine.target.verify_cost(100)[:3] == (1.0, 1.004, 1.008)
    rng = random.Random(4)
    ids = [repetitive_prompt(rng, 96, n) for n in (11, 23, 16)]
    cfg = DecodeConfig(max_new_tokens=12, max_draft_nodes=32)
    factory = eagle_factory(model, head, EagleOptions(top_k=3, depth=3, total_tokens=8))
    res = profile.profile_batch(engine, ids, lambda: make_drafter("eagle+search", DrafterOptions(search_depth=8), None, factory, None), cfg, 3, top=1000)
    assert res["together"]["tokens"] == [engine.run(x, make_drafter("vanilla"), cfg).token_ids for x in ids]
    assert "_add_local_tree" in res["profile"]


def test_an_assumed_cost_is_never_rescaled_by_the_runs_step_times(monkeypatch):
    """`Engine(cost_slope=S)` hands every run ``learn_costs=False``, alone and in batches; an
    engine without it leaves the setting as given."""
    import ngspec.engine as engine_module

    seen = []
    monkeypatch.setattr(engine_module, "generate", lambda target, drafter, ids, cfg, *rest: seen.append(cfg.learn_costs))
    monkeypatch.setattr(engine_module, "generate_batch", lambda model, prompts, new, cfg, *rest: seen.append(cfg.learn_costs))
    model = tiny_model("llama", seed=3)
    cfg = DecodeConfig(max_new_tokens=4)
    for slope in (0.004, None):
        engine = Engine(LoadedModel(model, None, "tiny"), calibrate=False, cost_slope=slope)
        engine.run([1, 2, 3], make_drafter("vanilla"), cfg)
        engine.run_batch([[1, 2, 3]], lambda: make_drafter("vanilla"), cfg, BatchConfig(1))
    assert seen == [False, False, True, True]
