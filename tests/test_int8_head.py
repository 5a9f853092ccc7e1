"""An EAGLE head's products in int8 (`ngspec.eagle.int8`): close to float32, the head's fc kept in
float32, the draft vocabulary scored over the same columns, and every drafter that uses the head
still token-identical to plain greedy decoding (drafts change, outputs never)."""

import random

import pytest
import torch
from torch import nn

from conftest import hf_greedy, repetitive_prompt, started_head
from ngspec.batch import BatchConfig, generate_batch
from ngspec.decode import DecodeConfig, Stopper, generate
from ngspec.drafters import DrafterOptions, make_drafter
from ngspec.drafters.eagle import EagleOptions, eagle_factory
from ngspec.eagle import int8
from ngspec.eagle.vocab import SharedVocab, TopCall, top_children
from ngspec.models import tiny_model
from ngspec.target import TargetModel

pytestmark = [pytest.mark.skipif(not int8.available("cpu"), reason="this torch build has no int8 CPU kernels"), pytest.mark.tiny_llama_only]


@pytest.fixture(scope="module")
def llama():
    return tiny_model("llama", seed=3)


def _relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got - want).abs().max() / want.abs().max()).item()


def test_an_int8_layer_is_close_to_its_float_layer_over_any_leading_dimensions():
    torch.manual_seed(0)
    layer = nn.Linear(64, 48)
    x = torch.randn(2, 5, 64)
    got = int8.Int8Linear(layer)(x)
    assert got.shape == (2, 5, 48)
    assert _relative_error(got, layer(x)) < 0.03
    assert _relative_error(int8.product(x[0, :1], int8.prepack(layer.weight)), x[0, :1] @ layer.weight.T) < 0.03


def test_the_int8_head_keeps_fc_in_float32_and_leaves_the_head_as_it_was(llama):
    head = started_head(llama)
    quantized = int8.int8_head(head)
    attn, mlp = quantized.layers[0].self_attn, quantized.layers[0].mlp
    assert type(quantized.fc) is nn.Linear
    assert all(isinstance(m, int8.Int8Linear) for m in (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj))
    assert sum(isinstance(m, int8.Int8Linear) for m in head.modules()) == 0
    hidden = llama.config.hidden_size
    expected = sum(p.numel() for p in head.parameters()) - 3 * sum(m.weight.numel() for n, m in head.named_modules() if isinstance(m, nn.Linear) and n != "fc") // 4
    assert abs(int8.float_equivalent(quantized) - expected) <= 7
    g = torch.Generator().manual_seed(1)
    embeds, features = torch.randn(1, 6, hidden, generator=g), torch.randn(1, 6, hidden, generator=g)
    positions = torch.arange(6)[None]
    with torch.inference_mode():
        want, got = head(embeds, features, positions), quantized(embeds, features, positions)
    assert torch.nn.functional.cosine_similarity(got.flatten(), want.flatten(), dim=0) > 0.99


def test_int8_runs_on_cpus_only():
    assert not int8.available("meta")
    assert int8.available(torch.device("cpu"))


def test_a_row_scores_the_same_columns_with_the_shared_rows_in_int8(llama):
    """A row alone with extra prompt tokens: the shared columns (int8) then its own (float32, the
    same as the float32 vocabulary's), in the same order; requests answered together draft only
    the row's own tokens, best first."""
    head, lm_head = started_head(llama), llama.get_output_embeddings()
    frequent = list(range(0, 40, 2))
    exact = SharedVocab.build(head, lm_head, frequent, lambda x, w: x @ w.T)
    quantized = SharedVocab.build(head, lm_head, frequent, lambda x, w: x @ w.T, shared_int8=True)
    prompt = [77, 3, 91, 91, 5]
    features = torch.randn(3, llama.config.hidden_size, generator=torch.Generator().manual_seed(2))
    (want, want_ids), (got, got_ids) = exact.for_prompt(prompt).alone(features), quantized.for_prompt(prompt).alone(features)
    assert torch.equal(got_ids, want_ids) and got.shape == want.shape
    n = len(frequent)
    torch.testing.assert_close(got[:, n:], want[:, n:])  # the prompt's own tokens: float32
    assert _relative_error(got[:, :n], want[:, :n]) < 0.05
    prompts = [prompt, [], list(range(41, 45))]
    calls = [TopCall(quantized.for_prompt(p), features[:m], 4) for p, m in zip(prompts, (1, 2, 3))]
    for p, (ids, values) in zip(prompts, top_children(calls)):
        assert all(set(row) <= set(frequent) | set(p) and len(row) == 4 for row in ids)
        assert all(v == sorted(v, reverse=True) for v in values)


def _int8_factory(model, opts: EagleOptions):
    factory = eagle_factory(model, started_head(model), opts)
    drafter = factory()
    assert isinstance(drafter.head.layers[0].mlp.up_proj, int8.Int8Linear)  # quantized indeed
    return factory


@pytest.mark.parametrize("drafter", ["eagle", "eagle+search"])
@pytest.mark.parametrize("tree", ["dynamic", "static"])
def test_drafters_with_an_int8_head_match_plain_greedy(tiny, drafter, tree):
    factory = _int8_factory(tiny, EagleOptions(tree=tree, top_k=3, depth=4, total_tokens=12, head_int8=True))
    rng = random.Random(11)
    target = TargetModel(tiny)
    for case in range(5):
        prompt = repetitive_prompt(rng, 96, rng.randrange(4, 90))
        opts = DrafterOptions(search_depth=6, deepen=drafter == "eagle+search")
        got = generate(target, make_drafter(drafter, opts, eagle=factory), prompt, DecodeConfig(max_new_tokens=30))
        assert got.token_ids == hf_greedy(tiny, prompt, 30), f"case {case}"


def test_a_batch_with_an_int8_head_matches_plain_greedy_row_by_row(tiny):
    factory = _int8_factory(tiny, EagleOptions(top_k=3, depth=3, total_tokens=10, head_int8=True))
    rng = random.Random(12)
    prompts = [repetitive_prompt(rng, 96, rng.randrange(4, 70)) for _ in range(5)]
    results, _ = generate_batch(
        tiny, prompts, lambda: make_drafter("eagle+search", DrafterOptions(deepen=True), eagle=factory),
        DecodeConfig(max_new_tokens=24), BatchConfig(3, rearrange_every=4), lambda: Stopper(frozenset()),
    )
    for result, prompt in zip(results, prompts):
        assert result.generation.token_ids == hf_greedy(tiny, prompt, 24)


def test_int8_is_the_default_and_head_int8_false_keeps_float32(llama):
    head = started_head(llama)
    assert any(isinstance(m, int8.Int8Linear) for m in eagle_factory(llama, head, EagleOptions())().head.modules())
    assert not any(isinstance(m, int8.Int8Linear) for m in eagle_factory(llama, head, EagleOptions(head_int8=False))().head.modules())
    bf16 = tiny_model("llama", seed=3).to(torch.bfloat16)  # not a float32 model: the head follows its dtype
    assert not any(isinstance(m, int8.Int8Linear) for m in eagle_factory(bf16, started_head(llama), EagleOptions())().head.modules())
