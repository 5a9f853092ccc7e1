"""benchmarks/op_count.py: it counts every phase of a batched run, and the verification of a
batch's trees costs the same operations as a plain batched step (BATCHES' host work, BENCHMARKS.md
10e)."""

import random

from conftest import benchmark_script, repetitive_prompt

from ngspec.batch import BatchConfig
from ngspec.decode import DecodeConfig
from ngspec.drafters import make_drafter
from ngspec.engine import Engine
from ngspec.models import LoadedModel, tiny_model

op_count = benchmark_script("op_count")


def test_operations_per_step_by_phase():
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
    assert res["vanilla"]["ops_per_step"]["verify"] == res["trie"]["ops_per_step"]["verify"] > 0
    assert res["trie"]["ops_per_step"]["drafting"] == 0  # the trie drafts in Python alone
