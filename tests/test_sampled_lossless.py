"""Sampling, token for token: every drafter, alone and in batches, samples exactly the tokens plain
sampling (the `vanilla` drafter: one token a call, no drafts) draws with the same seed, on tiny
random models in float32 on a CPU. Sampling's random numbers come from the seed, the prompt and the
output position alone (`ngspec.verify.Draws`), so drafts change how many tokens a call keeps, never
which. That plain sampling itself draws from the model's distribution is `tests/test_sampling.py`."""

import random
from dataclasses import replace

import pytest

from conftest import repetitive_prompt
from ngspec.batch import BatchConfig, Request, generate_batch
from ngspec.decode import DecodeConfig, Stopper, generate
from ngspec.drafters import REGISTRY, DrafterOptions, make_drafter
from ngspec.target import TargetModel
from ngspec.verify import SamplingConfig
from test_lossless import COST_LAYOUTS, VOCAB, tiny_datastore, tiny_eagle, tiny_tables  # noqa: F401 (fixtures)

pytestmark = pytest.mark.tiny_llama_only  # the Qwen2 tiny model runs the lossless matrices (conftest)

# peaked enough that drafts are accepted, varied enough that other seeds draw other tokens
SAMPLINGS = [
    SamplingConfig(temperature=0.3),
    SamplingConfig(temperature=0.6, top_p=0.9),
    SamplingConfig(temperature=1.0, top_k=5),
    SamplingConfig(temperature=0.5, top_p=0.8, top_k=20),
]


def plain_sampling(model, prompt: list[int], cfg: DecodeConfig) -> list[int]:
    return generate(TargetModel(model), make_drafter("vanilla"), prompt, cfg).token_ids


@pytest.fixture(scope="module")
def cases(tiny):
    """Prompts, each with its sampling settings and seed, and plain sampling's tokens for them."""
    rng = random.Random(11)
    out = []
    for case in range(8):
        prompt = repetitive_prompt(rng, VOCAB, rng.randrange(5, 100))
        cfg = DecodeConfig(max_new_tokens=30, sampling=replace(SAMPLINGS[case % len(SAMPLINGS)], seed=100 + case))
        out.append((prompt, cfg, plain_sampling(tiny, prompt, cfg)))
    return out


def test_plain_sampling_depends_on_the_seed(tiny, cases):
    """Not a constant: another seed samples other tokens (so the tests below can fail)."""
    prompt, cfg, want = cases[1]
    other = DecodeConfig(max_new_tokens=30, sampling=SamplingConfig(temperature=0.6, top_p=0.9, seed=999))
    assert plain_sampling(tiny, prompt, other) != want
    assert plain_sampling(tiny, prompt, cfg) == want


@COST_LAYOUTS
@pytest.mark.parametrize("drafter", [d for d in REGISTRY if d != "vanilla"])
def test_every_drafter_samples_plain_samplings_tokens(tiny, tiny_tables, tiny_eagle, tiny_datastore, cases, drafter, cost, layout):
    target = TargetModel(tiny)
    target.cost_tables = {0: cost}
    opts = DrafterOptions(num_draft=8, ngram_n=5, prefix_len=2, k=4, w=4, search_depth=6, deepen=True)
    calls = tokens = 0
    for case, (prompt, cfg, want) in enumerate(cases):
        cfg = DecodeConfig(max_new_tokens=cfg.max_new_tokens, sampling=cfg.sampling, verify=layout)
        store = tiny_datastore if case % 2 else None
        got = generate(target, make_drafter(drafter, opts, tiny_tables, tiny_eagle, store), prompt, cfg)
        assert got.token_ids == want, f"{drafter} case {case}"
        assert got.seed == cfg.sampling.seed
        calls, tokens = calls + got.stats.verify_calls, tokens + len(got.token_ids)
    if drafter in ("trie", "prompt-lookup", "search", "eagle+search"):
        assert tokens > 1.05 * calls  # drafts were accepted: the tree really was walked by samples


@pytest.mark.parametrize("batch_size, layout", [(4, "padded"), (8, "packed")])  # the fuzz test draws the others
@pytest.mark.parametrize("drafter", list(REGISTRY))
def test_every_row_of_a_batch_samples_its_own_plain_samplings_tokens(tiny, tiny_tables, tiny_eagle, tiny_datastore, cases, drafter, batch_size, layout):
    """Rows of one batch, each with its own seed and settings (fed as requests), sample what each
    prompt samples alone; rows with the same seed and settings in one batch would too."""
    opts = DrafterOptions(k=3, w=3, search_depth=6, deepen=True)
    fed = [[Request(i, prompt, cfg.max_new_tokens, cfg.sampling, Stopper(frozenset())) for i, (prompt, cfg, _) in enumerate(cases)]]
    results, _ = generate_batch(
        tiny, [], lambda: make_drafter(drafter, opts, tiny_tables, tiny_eagle, tiny_datastore),
        DecodeConfig(max_new_tokens=30), BatchConfig(batch_size, 3, 0.0, layout=layout), lambda: Stopper(frozenset()),
        feed=lambda: fed.pop() if fed else [],
    )
    assert [r.index for r in results] == list(range(len(cases)))
    for i, (result, (_, cfg, want)) in enumerate(zip(results, cases)):
        assert result.error is None
        assert result.generation.token_ids == want, f"{drafter} row {i}"
        assert result.generation.seed == cfg.sampling.seed


def test_a_batch_of_one_setting_samples_each_prompt_as_alone(tiny, tiny_eagle, tiny_datastore, cases):
    """`generate_batch`'s prompts share the batch's settings and seed; each still samples its own
    plain sampling's tokens (the draws are keyed by the prompt), and an unseeded run draws a seed
    per prompt, reported so that it can be replayed."""
    cfg = DecodeConfig(max_new_tokens=30, sampling=SamplingConfig(temperature=0.6, top_p=0.9, seed=3))
    prompts = [prompt for prompt, _, _ in cases[:5]]
    results, _ = generate_batch(
        tiny, prompts, lambda: make_drafter("eagle+search", DrafterOptions(search_depth=6), None, tiny_eagle, tiny_datastore),
        cfg, BatchConfig(3, 0), lambda: Stopper(frozenset()),
    )
    for prompt, result in zip(prompts, results):
        assert result.generation.token_ids == plain_sampling(tiny, prompt, cfg)
    unseeded = DecodeConfig(max_new_tokens=30, sampling=SamplingConfig(temperature=0.6, top_p=0.9))
    results, _ = generate_batch(tiny, prompts[:2] * 2, lambda: make_drafter("trie"), unseeded, BatchConfig(4, 0), lambda: Stopper(frozenset()))
    seeds = [r.generation.seed for r in results]
    assert len(set(seeds)) == 4  # the same prompt twice: two seeds, two samples
    for prompt, result in zip(prompts[:2] * 2, results):
        replay = DecodeConfig(max_new_tokens=30, sampling=SamplingConfig(temperature=0.6, top_p=0.9, seed=result.generation.seed))
        assert result.generation.token_ids == plain_sampling(tiny, prompt, replay)


@pytest.mark.parametrize("drafter", list(REGISTRY))
def test_racing_every_node_at_once_samples_the_same_tokens(tiny, tiny_tables, tiny_eagle, tiny_datastore, cases, drafter, monkeypatch):
    """A GPU samples every node of a tree at once (`verify.race_rows`); forced here on the CPU,
    every drafter, alone and in a batch of 4, still samples plain sampling's tokens (drawn node by
    node, the CPU's way)."""
    import ngspec.verify as verify

    monkeypatch.setattr(verify, "all_at_once", lambda logits: True)
    target = TargetModel(tiny)
    opts = DrafterOptions(k=3, w=3, search_depth=6, deepen=True)
    for case, (prompt, cfg, want) in enumerate(cases[:4]):
        got = generate(target, make_drafter(drafter, opts, tiny_tables, tiny_eagle, tiny_datastore if case % 2 else None), prompt, cfg)
        assert got.token_ids == want, f"{drafter} case {case}"
    fed = [[Request(i, prompt, cfg.max_new_tokens, cfg.sampling, Stopper(frozenset())) for i, (prompt, cfg, _) in enumerate(cases)]]
    results, _ = generate_batch(
        tiny, [], lambda: make_drafter(drafter, opts, tiny_tables, tiny_eagle, tiny_datastore),
        DecodeConfig(max_new_tokens=30), BatchConfig(4, 3, 0.0, layout="packed"), lambda: Stopper(frozenset()),
        feed=lambda: fed.pop() if fed else [],
    )
    assert [r.generation.token_ids for r in results] == [want for _, _, want in cases]
