"""benchmarks/op_count.py: it counts every phase of a batched run, and the verification of a
batch's trees costs the same operations as a plain batched step (BATCHES' host work, BENCHMARKS.md
10e)."""

import random

import pytest

from conftest import benchmark_script, repetitive_prompt, started_head

from ngspec.batch import BatchConfig
from ngspec.decode import DecodeConfig
from ngspec.drafters import make_drafter
from ngspec.engine import Engine
from ngspec.models import LoadedModel, tiny_model

op_count = benchmark_script("op_count")


def test_operations_per_step_by_phase(monkeypatch):
    # folded grouped-query attention (`batch_target.folded_gqa_attention`) is for CPUs only and
    # adds a few operations to tree steps; on a GPU, where host operations are what a step costs,
    # tree steps run the plain step's attention
    monkeypatch.setenv("NGSPEC_FOLD_GQA", "0")
    model = tiny_model("llama", seed=3)
    engine = Engine(LoadedModel(model, None, "tiny"), calibrate=False)
    rng = random.Random(4)
    ids = [repetitive_prompt(rng, 96, n) for n in (11, 30, 18)]
    cfg = DecodeConfig(max_new_tokens=12)
    plain = [engine.run(x, make_drafter("vanilla"), cfg).token_ids for x in ids]
    res = {arm: op_count.count_ops(engine, ids, lambda: make_drafter(arm), cfg, BatchConfig(3)) for arm in ("vanilla", "trie")}
    for r in res.values():
        assert r["tokens"] == plain and r["steps"] > 0 and r["prefill_ops"] > 0
    assert res["trie"]["nodes_per_row_step"] > 1 and res["vanilla"]["nodes_per_row_step"] == 0
    # torch 2.6 lays the CPU's masked attention output out so that transformers' `transpose(1, 2)
    # .contiguous()` copies it: one operation a tree step more, which torch 2.13 to 2.15 do not make
    copies = dict(res["trie"]["names"]["verify"]).get("contiguous.default", 0)
    assert copies <= 1
    assert res["vanilla"]["ops_per_step"]["verify"] == res["trie"]["ops_per_step"]["verify"] - copies > 0
    assert res["trie"]["ops_per_step"]["drafting"] == 0  # the trie drafts in Python alone


def test_the_heads_attention_is_counted_inside_drafting_and_does_not_grow_with_the_rows(monkeypatch):
    """One attention call serves every row that runs the head (`ngspec.eagle.pool`): its
    operations per call are about the same for 2 rows as for 6 (row by row they were 3x)."""
    import ngspec.eagle.batched as batched
    from ngspec.drafters.eagle import EagleOptions, eagle_factory

    calls = [0]
    attend = batched.pooled_attention

    def counted(*args, **kwargs):
        calls[0] += 1
        return attend(*args, **kwargs)

    monkeypatch.setattr(batched, "pooled_attention", counted)
    model = tiny_model("llama", seed=3)
    factory = eagle_factory(model, started_head(model), EagleOptions(top_k=2, depth=3, total_tokens=6))
    engine = Engine(LoadedModel(model, None, "tiny"), calibrate=False)
    rng = random.Random(4)
    cfg = DecodeConfig(max_new_tokens=12)
    per_call = []
    for rows in (2, 6):
        ids = [repetitive_prompt(rng, 96, rng.randrange(8, 40)) for _ in range(rows)]
        calls[0] = 0
        res = op_count.count_ops(engine, ids, lambda: make_drafter("eagle", None, None, factory), cfg, BatchConfig(rows))
        assert res["tokens"] == [engine.run(x, make_drafter("vanilla"), cfg).token_ids for x in ids]
        assert 0 < res["head_attention_per_step"] < res["ops_per_step"]["drafting"]
        per_call.append(res["head_attention_per_step"] * res["steps"] / calls[0])
    assert per_call[1] < 1.2 * per_call[0]


def test_head_runs_and_top_k_rounds_are_counted_per_step():
    """A dynamic tree of depth 3 under a flat cost: every batched step runs the head three times
    for all rows together (the newly committed pairs, then two levels) and asks three rounds of
    top-k (the root's children, then each level's); row by row it would be three per row. One
    prompt alone (``-b 1``) counts the same per step."""
    from ngspec.drafters.eagle import EagleOptions, eagle_factory

    model = tiny_model("llama", seed=3)
    factory = eagle_factory(model, started_head(model), EagleOptions(top_k=2, depth=3, total_tokens=6))
    engine = Engine(LoadedModel(model, None, "tiny"), calibrate=False)
    rng = random.Random(6)
    ids = [repetitive_prompt(rng, 96, n) for n in (14, 33, 21, 9)]
    cfg = DecodeConfig(max_new_tokens=10)
    new_drafter = lambda: make_drafter("eagle", None, None, factory)
    batched = op_count.count_ops(engine, ids, new_drafter, cfg, BatchConfig(4))
    single = op_count.count_single(engine, ids[:2], new_drafter, cfg)
    for res in (batched, single):
        assert res["head_runs_per_step"] == 3 and res["top_k_rounds_per_step"] == 3
        assert res["ops_per_step"]["drafting"] > res["head_attention_per_step"] > 0
        assert res["total_per_step"] == sum(res["ops_per_step"].values())
    trie = op_count.count_ops(engine, ids, lambda: make_drafter("trie"), cfg, BatchConfig(4))
    assert trie["head_runs_per_step"] == trie["top_k_rounds_per_step"] == 0


def test_single_sequence_steps_are_counted_by_phase():
    """``-b 1``: the single-sequence engine's steps, prompt after prompt, with the same outputs as
    plain decoding; a trie step drafts with no tensor operation, and its commits (a cache cut,
    and a gather where the accepted nodes are not the block's first) are counted apart."""
    model = tiny_model("llama", seed=3)
    engine = Engine(LoadedModel(model, None, "tiny"), calibrate=False)
    rng = random.Random(5)
    ids = [repetitive_prompt(rng, 96, n) for n in (11, 30)]
    cfg = DecodeConfig(max_new_tokens=12)
    plain = [engine.run(x, make_drafter("vanilla"), cfg).token_ids for x in ids]
    res = {arm: op_count.count_single(engine, ids, lambda: make_drafter(arm), cfg) for arm in ("vanilla", "trie")}
    for r in res.values():
        assert r["tokens"] == plain and r["steps"] > 0 and r["prefill_ops"] > 0
        assert r["ops_per_step"]["verify"] > r["ops_per_step"]["commit"] > 0
        assert "prefill" not in r["names"] and sum(n for _, n in r["names"]["verify"]) == pytest.approx(r["ops_per_step"]["verify"])
    assert res["vanilla"]["steps"] == sum(len(t) for t in plain) - len(plain)  # one token a step after the prefill's
    assert res["trie"]["steps"] < res["vanilla"]["steps"] and res["trie"]["nodes_per_row_step"] > 0
    assert res["trie"]["ops_per_step"]["drafting"] == 0


def test_fixed_shape_forwards_are_counted_apart_once_a_head_run():
    """With the head's runs at fixed shapes (`ngspec.eagle.graphs`), each run's forward is counted
    apart (on a GPU one replay issues it): the same head runs and outputs as without, and what is
    left of drafting once those forwards are replays is well under drafting without them."""
    from ngspec.drafters.eagle import EagleOptions, eagle_factory

    model = tiny_model("llama", seed=3)
    engine = Engine(LoadedModel(model, None, "tiny"), calibrate=False)
    rng = random.Random(6)
    ids = [repetitive_prompt(rng, 96, n) for n in (14, 33, 21, 9)]
    cfg = DecodeConfig(max_new_tokens=10)
    res = {}
    for graphs in (False, True):
        factory = eagle_factory(model, started_head(model), EagleOptions(top_k=2, depth=3, total_tokens=6, head_graphs=graphs))
        res[graphs] = op_count.count_ops(engine, ids, lambda: make_drafter("eagle", None, None, factory), cfg, BatchConfig(4))
    plain, fixed = res[False], res[True]
    assert fixed["tokens"] == plain["tokens"]
    assert fixed["head_runs_per_step"] == fixed["replays_per_step"] == plain["head_runs_per_step"] == 3
    assert plain["replays_per_step"] == plain["head_graph_per_step"] == fixed["head_attention_per_step"] == 0
    left = fixed["ops_per_step"]["drafting"] - fixed["head_graph_per_step"] + fixed["replays_per_step"]
    assert 0 < left < 0.5 * plain["ops_per_step"]["drafting"]


@pytest.mark.parametrize("batch_size", [1, 3])
def test_fixed_shape_verification_is_counted_apart_once_a_step(batch_size):
    """With `--target-graphs` (`ngspec.static_verify`) each step's verification forward is counted
    apart (on a GPU one replay issues it): the same outputs, one replay a step, and what is left
    of verification once those forwards are replays (the inputs laid out on the host, two copies)
    is a small part of it."""
    model = tiny_model("llama", seed=3)
    rng = random.Random(7)
    ids = [repetitive_prompt(rng, 96, n) for n in (14, 33, 21)]
    cfg = DecodeConfig(max_new_tokens=10)
    res = {}
    for graphs in (False, True):
        engine = Engine(LoadedModel(model, None, "tiny"), calibrate=False, target_graphs=graphs)
        new = lambda: make_drafter("trie")  # noqa: E731
        res[graphs] = op_count.count_single(engine, ids, new, cfg) if batch_size == 1 else op_count.count_ops(engine, ids, new, cfg, BatchConfig(batch_size))
    plain, fixed = res[False], res[True]
    assert fixed["tokens"] == plain["tokens"]
    assert fixed["verify_replays_per_step"] == 1 and plain["verify_replays_per_step"] == plain["verify_graph_per_step"] == 0
    left = fixed["ops_per_step"]["verify"] - fixed["verify_graph_per_step"] + fixed["verify_replays_per_step"]
    assert 0 < left < 0.3 * plain["ops_per_step"]["verify"]  # a 2-layer model: the forward is most of it at 30 layers
