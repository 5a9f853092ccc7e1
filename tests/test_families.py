"""Model families other than Llama and Qwen2 against the oracle (transformers' plain greedy), on tiny
random models: sliding-window attention (Mistral, Phi-3, Gemma 2 and 3, Qwen2 with its window on)
with prompts longer than the window, layers that do not pass keyword arguments on to attention
(StableLM), learned and partial rotary positions (GPT-2, Phi), models without grouped-query
attention; and a clear refusal of the families whose attention a draft tree cannot be verified
through (ALiBi, recurrent or chunked layers)."""

import random

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from conftest import OracleDrafter, hf_greedy, started_head
from ngspec.architecture import sliding_window
from ngspec.batch import BatchConfig, generate_batch
from ngspec.batch_target import BatchTarget
from ngspec.decode import DecodeConfig, Stopper, generate
from ngspec.drafters import make_drafter
from ngspec.errors import NgspecError
from ngspec.target import TargetModel

VOCAB = 96
WINDOW = 8  # far shorter than the prompts, so every sliding layer hides most of the context

SIZES = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=512, tie_word_embeddings=False, pad_token_id=0, bos_token_id=1, eos_token_id=2)
FAMILIES = {  # name: (model_type, config overrides)
    "mistral": ("mistral", dict(num_key_value_heads=2, sliding_window=WINDOW)),  # every layer slides
    "phi3": ("phi3", dict(num_key_value_heads=2, sliding_window=WINDOW)),
    "gemma2": ("gemma2", dict(num_key_value_heads=2, head_dim=16, sliding_window=WINDOW, query_pre_attn_scalar=64)),  # eager, soft-capped
    "gemma3": ("gemma3_text", dict(num_key_value_heads=2, head_dim=16, sliding_window=WINDOW, layer_types=["sliding_attention", "full_attention"])),
    "qwen2-window": ("qwen2", dict(num_key_value_heads=2, use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1)),
    "cohere2": ("cohere2", dict(num_key_value_heads=2, sliding_window=WINDOW, layer_types=["sliding_attention", "full_attention"])),
    "qwen3": ("qwen3", dict(num_key_value_heads=2)),
    "mixtral": ("mixtral", dict(num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2)),  # experts routed per token
    "gemma": ("gemma", dict(num_key_value_heads=2, head_dim=16)),
    "granite": ("granite", dict(num_key_value_heads=2)),  # scaled embeddings, residuals and logits
    "phi": ("phi", dict()),  # partial rotary
    "gpt2": ("gpt2", dict()),  # learned positions
    "stablelm": ("stablelm", dict(num_key_value_heads=2)),  # its layers drop attention's keyword arguments
    "minicpm3": ("minicpm3", dict(num_key_value_heads=4)),  # latent attention: values narrower than queries
    "gpt_neox": ("gpt_neox", dict()),
    "opt": ("opt", dict(ffn_dim=128, word_embed_proj_dim=64)),
}


def family_model(name: str, seed: int = 1):
    model_type, overrides = FAMILIES[name]
    config = AutoConfig.for_model(model_type, **{**SIZES, **overrides})
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(8.0)  # sharp logits: few near-ties
    return model.eval()


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request):
    model = family_model(request.param)
    rng = random.Random(5)
    prompts = [[rng.randrange(3, VOCAB) for _ in range(rng.randrange(12, 60))] for _ in range(5)]
    return request.param, model, prompts, [hf_greedy(model, p, 30) for p in prompts]


def test_sliding_families_are_recognised():
    assert sliding_window(family_model("mistral")) == WINDOW
    assert sliding_window(family_model("gemma3")) == WINDOW
    assert sliding_window(family_model("qwen2-window")) == WINDOW
    assert sliding_window(family_model("stablelm")) is None
    qwen2_off = AutoConfig.for_model("qwen2", **{**SIZES, "sliding_window": WINDOW, "use_sliding_window": False})
    assert sliding_window(AutoModelForCausalLM.from_config(qwen2_off)) is None
    mellum = AutoConfig.for_model("mellum", **{**SIZES, "sliding_window": WINDOW})  # a window, every layer full
    assert sliding_window(AutoModelForCausalLM.from_config(mellum)) is None


def test_a_window_in_a_llama_config_slides_as_in_transformers_own_decoding():
    """A Llama config that carries a ``sliding_window`` gets sliding cache layers in transformers'
    own decoding (its prompt attends fully, each later token to the window), though Llama's masks
    never slide: the engine matches that, drafting or not."""
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model("llama", **{**SIZES, "num_key_value_heads": 2, "sliding_window": WINDOW}))
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    assert sliding_window(model) == WINDOW
    target, rng = TargetModel(model.eval()), random.Random(6)
    for case in range(4):
        prompt = [rng.randrange(3, VOCAB) for _ in range(rng.randrange(20, 60))]
        want = hf_greedy(model, prompt, 30)
        for drafter in (OracleDrafter(want, VOCAB, seed=case), make_drafter("vanilla")):
            assert generate(target, drafter, prompt, DecodeConfig(max_new_tokens=30)).token_ids == want, f"case {case}"


@pytest.mark.parametrize("layout", ["tree", "rows"])
def test_trees_match_plain_greedy(family, layout):
    name, model, prompts, expected = family
    target = TargetModel(model)
    cfg = DecodeConfig(max_new_tokens=30, verify=layout)
    if layout == "rows" and (sliding_window(model) or name == "minicpm3"):  # rows share one prefix, of full width
        with pytest.raises(NgspecError, match="use tree verification"):
            generate(target, OracleDrafter(expected[0], VOCAB), prompts[0], cfg)
        return
    for case, (prompt, want) in enumerate(zip(prompts, expected)):
        got = generate(target, OracleDrafter(want, VOCAB, seed=case), prompt, cfg)
        assert got.token_ids == want, f"{name} prompt {case}"
        held = [layer.keys.shape[-2] for layer in target.cache.layers]
        if target.window:  # sliding layers drop what no later query sees; the others keep all
            assert target.dropped > 0 and all(held[i] == target.length - target.dropped < 2 * WINDOW for i in target.sliding)
        assert all(h == target.length for i, h in enumerate(held) if i not in target.sliding)


@pytest.mark.parametrize("layout", ["padded", "packed"])
def test_batched_rows_match_plain_greedy(family, layout, monkeypatch):
    name, model, prompts, expected = family
    if layout == "packed" and model.config._attn_implementation == "eager":  # Gemma 2: soft-capped, eager
        with pytest.raises(NgspecError, match="use --batch-layout padded"):
            BatchTarget(model, packed=True)
        return
    held = []  # after each step: slots of every layer, the batch's slots, and what sliding layers dropped
    commit = BatchTarget.commit

    def recording(self, paths):
        commit(self, paths)
        held.append(([layer.keys.shape[-2] for layer in self.cache.layers], self.slots, self.dropped, self.sliding))

    monkeypatch.setattr(BatchTarget, "commit", recording)
    results, _ = generate_batch(
        model, prompts, lambda: OracleDrafter(expected[0] + expected[1], VOCAB, seed=3), DecodeConfig(max_new_tokens=30),
        BatchConfig(3, 2, 0.0, layout=layout), lambda: Stopper(frozenset()),
    )
    for i, (result, want) in enumerate(zip(results, expected)):
        assert result.error is None, f"{name} prompt {i}: {result.error}"
        assert result.generation.token_ids == want, f"{name} prompt {i}"
    # sliding layers drop the slots every row is past (rows admitted later start beyond them)
    assert all(n == slots - (dropped if i in sliding else 0) for layers, slots, dropped, sliding in held for i, n in enumerate(layers))
    assert any(dropped for _, _, dropped, _ in held) == bool(sliding_window(model))


@pytest.mark.parametrize("name", ["gemma3", "phi3", "gpt2", "mistral"])
def test_an_eagle_head_started_for_the_family_drafts_losslessly(name):
    """train-eagle's start (`init_from_target`) on layers unlike Llama's (Phi-3's fused
    projections, GPT-2's blocks, Gemma's norms), and `eagle+search` on the family at batch 1 and
    in a batch."""
    from ngspec.drafters import DrafterOptions, make_drafter
    from ngspec.drafters.eagle import EagleOptions, eagle_factory

    model = family_model(name)
    factory = eagle_factory(model, started_head(model), EagleOptions(top_k=3, depth=3, total_tokens=8))
    opts = DrafterOptions(search_depth=6, deepen=True)
    rng = random.Random(2)
    prompts = [[rng.randrange(3, VOCAB) for _ in range(rng.randrange(12, 50))] * 2 for _ in range(3)]  # repeats: the search finds matches
    expected = [hf_greedy(model, p, 24) for p in prompts]
    cfg = DecodeConfig(max_new_tokens=24)
    target = TargetModel(model)
    assert [generate(target, make_drafter("eagle+search", opts, None, factory, None), p, cfg).token_ids for p in prompts] == expected
    results, _ = generate_batch(model, prompts, lambda: make_drafter("eagle+search", opts, None, factory, None), cfg, BatchConfig(2), lambda: Stopper(frozenset()))
    assert [r.generation.token_ids for r in results] == expected


def test_folded_attention_folds_each_mask_once_a_step(monkeypatch):
    """On a CPU a batch's tree steps fold grouped-query heads into the queries, with the step's
    mask folded once, not once a layer (each layer's fold is what its attention would get
    unfolded: the batched tests above check the outputs)."""
    import ngspec.batch_target as module

    folds, verifies = [], []
    monkeypatch.setattr(module, "fold_mask", lambda mask, groups, fold=module.fold_mask: folds.append(1) or fold(mask, groups))
    verify = module.BatchTarget.verify
    monkeypatch.setattr(module.BatchTarget, "verify", lambda self, *a, **k: verifies.append(1) or verify(self, *a, **k))
    model = family_model("mistral")  # two layers, one mask
    assert BatchTarget(model).fold_groups == 2
    prompts = [list(range(3, 40)), list(range(10, 30))]
    want = hf_greedy(model, prompts[0], 20)
    generate_batch(model, prompts, lambda: OracleDrafter(want, VOCAB), DecodeConfig(max_new_tokens=20), BatchConfig(2, 0, 0.0), lambda: Stopper(frozenset()))
    assert folds and len(folds) <= len(verifies)


def _refusal(model_type: str, **overrides) -> str:
    config = AutoConfig.for_model(model_type, **{**SIZES, **overrides})
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with pytest.raises(NgspecError) as single:
        TargetModel(model)
    with pytest.raises(NgspecError) as batch:
        BatchTarget(model)
    assert str(single.value) == str(batch.value)
    return str(single.value)


def test_alibi_models_are_refused_clearly():
    assert "position" in _refusal("bloom", n_embed=64, n_layer=2, n_head=4)
    assert "position" in _refusal("falcon", num_key_value_heads=4, alibi=True)


def test_models_that_number_positions_their_own_way_are_refused_clearly():
    assert "numbers positions its own way" in _refusal("xlm-roberta", is_decoder=True)


def test_models_without_a_cache_or_a_custom_mask_are_refused_clearly():
    assert "does not keep its keys and values" in _refusal("openai-gpt", n_embd=64, n_layer=2, n_head=4)
    assert "does not take a custom 4D attention mask (AssertionError" in _refusal("xlm", emb_dim=64, n_layers=2, n_heads=4)


def test_a_model_that_ignores_a_custom_mask_is_refused_clearly():
    """Code loaded with --trust-remote-code may drop the mask a tree needs: verified trees would
    then differ from plain decoding, silently, so the probe refuses it."""
    from transformers import LlamaForCausalLM

    class MaskBlind(LlamaForCausalLM):
        def forward(self, input_ids=None, attention_mask=None, position_ids=None, cache=None, **kwargs):
            return super().forward(input_ids=input_ids, position_ids=position_ids, cache=cache, **kwargs)

    model = MaskBlind(AutoConfig.for_model("llama", **SIZES)).eval()
    with pytest.raises(NgspecError, match="^MaskBlind does not honour a custom 4D attention mask"):
        TargetModel(model)


def test_recurrent_and_chunked_layers_are_refused_clearly():
    assert "linear_attention" in _refusal("qwen3_next", num_key_value_heads=2, num_hidden_layers=4)
    assert "chunked_attention" in _refusal("llama4_text", num_key_value_heads=2, num_hidden_layers=4)


def test_generate_on_a_family_ngspec_cannot_verify_is_one_clear_line(tmp_path):
    from typer.testing import CliRunner

    from ngspec.cli.app import app
    from ngspec.models import load_tokenizer

    tok = load_tokenizer()
    bloom = AutoModelForCausalLM.from_config(AutoConfig.for_model("bloom", **{**SIZES, "vocab_size": len(tok), "n_embed": 64, "n_layer": 2, "n_head": 4}))
    bloom.save_pretrained(tmp_path / "bloom")
    tok.save_pretrained(tmp_path / "bloom")
    (tmp_path / "p.txt").write_text("Say hello.")
    result = CliRunner().invoke(app, ["generate", "-p", str(tmp_path / "p.txt"), "-n", "4", "--model", str(tmp_path / "bloom")])
    assert result.exit_code == 1
    assert "BloomForCausalLM does not take position ids" in result.stderr and "Traceback" not in result.output + result.stderr


SWITCH = 40  # longrope's original_max_position_embeddings: short factors within it, long past it


def longrope_model():
    head_half = 8  # rotary factors per half head (head size 16)
    rope = {"rope_type": "longrope", "rope_theta": 10000.0, "short_factor": [1.0] * head_half,
            "long_factor": [4.0 + i for i in range(head_half)], "original_max_position_embeddings": SWITCH, "factor": 4.0}
    config = AutoConfig.for_model("llama", **{**SIZES, "num_key_value_heads": 2, "rope_parameters": rope})
    torch.manual_seed(1)
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()


def plain_logits(model, prompt, tokens):
    """Logits at each of ``tokens`` fed one forward at a time after ``prompt`` (plain decoding)."""
    from transformers import DynamicCache

    from ngspec.kv import cache_argument

    with torch.inference_mode():
        cache = cache_argument(model, DynamicCache(config=model.config))
        model(torch.tensor([prompt]), **cache)
        return torch.stack([model(torch.tensor([[t]]), **cache).logits[0, -1] for t in tokens])


def test_a_block_across_the_longrope_switch_is_what_plain_decoding_is_not():
    """The premise of `rope_switch`: a block that straddles the switch gets long factors for every
    token, plain decoding short ones before it; blocks on one side of it match plain decoding."""
    from ngspec.architecture import rope_switch
    from ngspec.contracts import DraftTree

    model = longrope_model()
    assert rope_switch(model.config) == SWITCH
    prompt, chain = list(range(5, 41)), [50, 51, 52, 53, 54, 55]  # positions 36..42 straddle 40
    target = TargetModel(model)
    target.prefill(prompt)
    across = target.verify(7, DraftTree.chain(chain))
    assert (across - plain_logits(model, prompt, [7] + chain)).abs().max() > 1e-3
    target.discard()
    before = target.verify(7, DraftTree.chain(chain[:3]))  # positions 36..39
    assert torch.allclose(before, plain_logits(model, prompt, [7] + chain[:3]), atol=1e-5)


def test_blocks_never_straddle_the_longrope_switch_and_batches_keep_below_it(monkeypatch):
    from ngspec.tree import depths

    model = longrope_model()
    rng = random.Random(4)
    prompts = [[rng.randrange(3, VOCAB) for _ in range(n)] for n in (20, 30, 36, 5)]
    expected = [hf_greedy(model, p, 24) for p in prompts]
    blocks = []  # (first, last) position of every verified block
    verify = TargetModel.verify
    monkeypatch.setattr(TargetModel, "verify", lambda self, root, tree, *a: blocks.append((self.length, self.length + max(depths(tree), default=0))) or verify(self, root, tree, *a))
    target = TargetModel(model)
    for case, (prompt, want) in enumerate(zip(prompts, expected)):
        assert generate(target, OracleDrafter(want, VOCAB, seed=case), prompt, DecodeConfig(max_new_tokens=24)).token_ids == want
    assert not [b for b in blocks if b[0] < SWITCH <= b[1]]
    assert any(b[0] < SWITCH - 1 and b[1] == SWITCH - 1 for b in blocks)  # cut at the switch, not before
    results, _ = generate_batch(model, prompts, lambda: OracleDrafter(expected[3], VOCAB), DecodeConfig(max_new_tokens=24), BatchConfig(2), lambda: Stopper(frozenset()))
    assert [r.error is None for r in results] == [False, False, False, True]  # 20 + 24 reaches 40
    assert "decode this prompt with --batch-size 1" in results[0].error
    assert results[3].generation.token_ids == expected[3]


def test_the_family_sweep_script_reports_exact_and_refused(capsys, monkeypatch):
    import sys

    from conftest import benchmark_script

    monkeypatch.setattr(sys, "argv", ["family_sweep.py", "mistral", "bloom"])
    benchmark_script("family_sweep").main()
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["mistral", "b1", "3/3", "|", "b3", "3/3"]
    assert lines[1].startswith("bloom") and "REFUSED" in lines[1]


@pytest.mark.parametrize("batch", [1, 2])
def test_the_sliding_cache_script_times_arms_that_agree(batch, capsys, monkeypatch):
    import json
    import sys

    from conftest import benchmark_script

    script = benchmark_script("sliding_cache")
    monkeypatch.setattr(script, "SIZES", dict(SIZES, num_hidden_layers=6, num_key_value_heads=2))
    monkeypatch.setattr(sys, "argv", ["sliding_cache.py", "--family", "gemma3", "--window", "8", "--context", "40", "-n", "6", "--rounds", "1", "-b", str(batch)])
    script.main()
    report = json.loads(capsys.readouterr().out)
    assert report["identical"] and set(report["tokens_per_second"]) == {"keep", "drop"} | ({"transformers"} if batch == 1 else set())
    assert report["cache_mib"]["drop"] < report["cache_mib"]["keep"] / 2


def test_sliding_layers_of_a_batch_hold_about_two_windows_whatever_the_order_of_prompts():
    """Prompts admitted later, shorter or longer than the batch so far, end at its last slot (a
    longer one puts holes before the others), beside the other rows' newest entries: the sliding
    layers drop back to about two windows within a window of steps, and every row still decodes
    as plain greedy does."""
    from ngspec.contracts import DraftTree

    model = family_model("mistral")
    target = BatchTarget(model)
    prompts, out = [], []

    def admit(prompt, row=None):
        first = int(target.admit(prompt, row).argmax())
        if row is None:
            prompts.append(prompt)
            out.append([first])
        else:
            prompts[row], out[row] = prompt, [first]

    def steps(n):
        for _ in range(n):
            verified = target.verify([o[-1] for o in out], [DraftTree.chain([])] * target.rows)
            target.commit([[]] * target.rows)
            for o, best in zip(out, verified.greedy()):
                o.append(best[0])
        assert [layer.keys.shape[-2] for layer in target.cache.layers] == [target.slots - target.dropped] * 2

    admit(list(range(3, 13)))  # 10 tokens
    admit(list(range(20, 80)))  # 60: holes go before the first row's 10
    assert target.valid[0].tolist() == [False] * 50 + [True] * 10
    steps(WINDOW)
    assert target.slots - target.dropped < 2 * WINDOW
    for b in range(2):
        assert out[b] == hf_greedy(model, prompts[b], len(out[b]))
    admit(list(range(30, 50)), 0)  # 20 tokens, where the batch has 68 slots
    steps(WINDOW)
    assert target.slots - target.dropped < 2 * WINDOW
    target.rearrange()  # every row ends at the last slot: the sliding layers keep window - 1
    assert target.slots - target.dropped == WINDOW - 1
    steps(WINDOW)
    for b in range(2):
        assert out[b] == hf_greedy(model, prompts[b], len(out[b]))
