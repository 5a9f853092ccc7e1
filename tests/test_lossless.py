"""Every drafter against the oracle (transformers' plain greedy generate) on tiny random models."""

import random

import pytest
import torch

from conftest import OracleDrafter, hf_greedy, repetitive_prompt
from ngspec import cpu_linear
from ngspec.cpu_linear import KERNELS, KernelPlan, use_plan
from ngspec.datastore.index import Datastore
from ngspec.decode import DecodeConfig, generate
from ngspec.drafters import REGISTRY, DrafterOptions, make_drafter
from ngspec.drafters.eagle import EagleOptions, eagle_factory
from ngspec.drafters.ngram_tables import build_tables
from ngspec.eagle.head import EagleHead, head_config_for, init_from_target
from ngspec.models import tiny_model
from ngspec.target import TargetModel

VOCAB = 96


STEEP_COST = (1.0, 1.01, 1.05, 1.6, 1.7, 2.0) + (2.5,) * 60


@pytest.fixture(scope="session")
def tiny_tables(tiny):
    return build_tables(tiny, [1], batch_size=48)


@pytest.fixture(scope="session")
def tiny_eagle(tiny):
    """An untrained head started from the model's last layer (what train-eagle starts from)."""
    torch.manual_seed(0)
    head = EagleHead(head_config_for(tiny))
    init_from_target(head, tiny)
    return eagle_factory(tiny, head.eval(), EagleOptions(top_k=4, depth=4, total_tokens=16))


@pytest.fixture(scope="session")
def tiny_datastore(tiny):
    """Documents of the model's own greedy continuations: the search finds real matches."""
    rng = random.Random(7)
    docs = []
    for _ in range(12):
        prompt = repetitive_prompt(rng, VOCAB, rng.randrange(5, 60))
        docs.append(prompt[-4:] + hf_greedy(tiny, prompt, 40))
    return Datastore.from_documents(docs, VOCAB)


# (costs, verification layout) pairs for the drafter matrices: flat costs size the trees large, steep
# ones small; each runs in one layout, so every family meets both costs and both layouts (the
# other two pairs doubled the tiny models' share of the suite; tests/test_fuzz_lossless.py draws all four)
COST_LAYOUTS = pytest.mark.parametrize(
    "cost, layout", [((), "tree"), (STEEP_COST, "rows")], ids=["flat-cost-tree", "steep-cost-rows"]
)


@COST_LAYOUTS
@pytest.mark.parametrize("drafter", list(REGISTRY))
def test_drafters_match_plain_greedy(tiny, tiny_tables, tiny_eagle, tiny_datastore, drafter, cost, layout):
    rng = random.Random(1)
    target = TargetModel(tiny)
    target.cost_tables = {0: cost}
    options = [
        DrafterOptions(),
        DrafterOptions(num_draft=4, trie_update=True, ngram_n=5, prefix_len=2, k=7, w=6, ngram_q=2, search_depth=6, deepen=True),
    ]
    for case in range(8):
        prompt = repetitive_prompt(rng, VOCAB, rng.randrange(5, 120))
        expected = hf_greedy(tiny, prompt, 40)
        opts = options[case % 2]
        cfg = DecodeConfig(max_new_tokens=40, verify=layout)
        store = tiny_datastore if case % 4 < 2 else None  # searches with and without a datastore
        got = generate(target, make_drafter(drafter, opts, tiny_tables, tiny_eagle, store), prompt, cfg)
        assert got.token_ids == expected, f"{drafter} case {case}"
        assert sum(s.accepted for s in got.stats.steps) == len(got.token_ids)


@pytest.mark.parametrize("kernel", [k for k in KERNELS if cpu_linear.runnable(k)])
def test_tuned_cpu_kernels_match_plain_greedy(kernel):
    """The engine on each CPU kernel of `ngspec.cpu_linear` (every row count: the one-token steps,
    trees of every size and the prefill) against transformers on the stock layers."""
    rng = random.Random(3)
    for family in ("llama", "qwen2"):
        model = tiny_model(family, seed=1)
        use_plan(model, KernelPlan.uniform(kernel))
        target = TargetModel(model)
        for case in range(4):
            prompt = [rng.randrange(VOCAB) for _ in range(rng.randrange(3, 60))]
            expected = hf_greedy(model, prompt, 40)
            got = generate(target, OracleDrafter(expected, VOCAB, seed=case), prompt, DecodeConfig(max_new_tokens=40))
            assert got.token_ids == expected, f"{family} case {case}"


@pytest.mark.parametrize("layout", ["tree", "rows"])
def test_deep_noisy_trees_match_plain_greedy(tiny, layout):
    """Trees that often contain the true continuation, sometimes on a later sibling."""
    rng = random.Random(2)
    target = TargetModel(tiny)
    accepted_deep = 0
    for case in range(12):
        prompt = [rng.randrange(VOCAB) for _ in range(rng.randrange(3, 60))]
        expected = hf_greedy(tiny, prompt, 50)
        cfg = DecodeConfig(max_new_tokens=50, verify=layout)
        got = generate(target, OracleDrafter(expected, VOCAB, seed=case), prompt, cfg)
        assert got.token_ids == expected, f"case {case}"
        accepted_deep += sum(s.accepted >= 4 for s in got.stats.steps)
    assert accepted_deep > 40  # the test really exercised long accepted runs


def test_eos_inside_accepted_run_stops_there(tiny):
    rng = random.Random(3)
    target = TargetModel(tiny)
    prompt = [rng.randrange(VOCAB) for _ in range(20)]
    free = hf_greedy(tiny, prompt, 30)
    eos = free[12]
    first = free.index(eos)
    expected = hf_greedy(tiny, prompt, 30, eos=eos)
    assert expected == free[: first + 1]
    got = generate(target, OracleDrafter(free, VOCAB), prompt, DecodeConfig(max_new_tokens=30, eos_ids=frozenset([eos])))
    assert got.token_ids == expected and got.finish_reason == "eos"


def test_max_new_tokens_is_exact_with_deep_drafts(tiny):
    target = TargetModel(tiny)
    prompt = list(range(10))
    expected = hf_greedy(tiny, prompt, 7)
    got = generate(target, OracleDrafter(expected + [0] * 10, VOCAB), prompt, DecodeConfig(max_new_tokens=7))
    assert got.token_ids == expected and got.finish_reason == "length"
