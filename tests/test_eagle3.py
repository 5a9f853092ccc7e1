"""EAGLE-3 heads: loading the public layout (safetensors and pytorch_model.bin), refusing
mismatches, drafting through d2t, lossless output."""

import json
import random

import pytest
import torch

from conftest import hf_greedy, repetitive_prompt
from ngspec.decode import DecodeConfig, generate
from ngspec.drafters import DrafterOptions, make_drafter
from ngspec.drafters.eagle import EagleOptions, eagle_factory
from ngspec.eagle.head import load_head
from ngspec.eagle.head3 import Eagle3Head, feature_layers, head3_config_for, save_head3
from ngspec.errors import NgspecError
from ngspec.target import TargetModel

pytestmark = pytest.mark.tiny_llama_only  # the Qwen2 tiny model runs the lossless matrices (conftest)

DRAFT_VOCAB = 40


def random_head3(model, seed: int = 0) -> Eagle3Head:
    """A randomly initialised EAGLE-3 head whose draft vocabulary is every other token plus some."""
    torch.manual_seed(seed)
    head = Eagle3Head(head3_config_for(model, DRAFT_VOCAB))
    with torch.no_grad():
        for p in head.parameters():
            p.normal_(0.0, 0.2)
        targets = torch.arange(DRAFT_VOCAB) * 2 + 1  # draft id i -> target id 2i + 1
        head.d2t.copy_(targets - torch.arange(DRAFT_VOCAB))
        head.t2d.zero_()
        head.t2d[targets] = True
    return head.eval()


@pytest.mark.parametrize("filename", ["model.safetensors", "pytorch_model.bin"])
def test_public_layout_loads_and_drafts_identically(tmp_path, tiny, filename):
    head = random_head3(tiny)
    save_head3(head, tmp_path / "h", filename)
    raw = json.loads((tmp_path / "h" / "config.json").read_text())
    assert raw["draft_vocab_size"] == DRAFT_VOCAB
    loaded = load_head(tmp_path / "h", tiny)
    assert isinstance(loaded, Eagle3Head)
    assert loaded.feature_layers == feature_layers(tiny.config.num_hidden_layers)
    for key, value in head.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value), key
    trees = []
    for h in (head, loaded):
        h.feature_layers = loaded.feature_layers
        target = TargetModel(tiny)
        prompt = [3, 5, 7, 9, 11, 3, 5]
        out = generate(target, make_drafter("eagle", eagle=eagle_factory(tiny, h, EagleOptions(top_k=3, depth=3, total_tokens=8))), prompt, DecodeConfig(max_new_tokens=6))
        trees.append(out.token_ids)
    assert trees[0] == trees[1]


def test_drafts_are_mapped_through_d2t(tiny):
    head = random_head3(tiny)
    head.feature_layers = feature_layers(tiny.config.num_hidden_layers)
    drafter = eagle_factory(tiny, head, EagleOptions(top_k=4, depth=3, total_tokens=10))()
    target = TargetModel(tiny)
    target.keep_features, target.feature_layers = True, drafter.feature_layers
    prompt = [2, 4, 6, 8, 10]
    logits = target.prefill(prompt)
    drafter.start(prompt)
    from ngspec.contracts import DraftContext

    tree = drafter.propose(DraftContext(prompt + [int(logits.argmax())], len(prompt), 16, (), target.take_features()))
    assert tree.size == 10
    assert all(t % 2 == 1 for t in tree.tokens)  # only odd ids are in the draft vocabulary


@pytest.mark.parametrize("layout", ["tree", "rows"])
@pytest.mark.parametrize("cost", [(), (1.0, 1.01, 1.05, 1.6) + (2.5,) * 30], ids=["flat-cost", "steep-cost"])
@pytest.mark.parametrize("name", ["eagle", "eagle+search"])
@pytest.mark.parametrize("tree", ["dynamic", "static"])
def test_eagle3_drafts_match_plain_greedy(tiny, tree, name, cost, layout):
    """Trees verified as one row under a tree mask, or each path as its own row (``--verify rows``:
    EAGLE-3's three layers read from the rows' forward, which crashed before)."""
    head = random_head3(tiny, seed=1)
    head.feature_layers = feature_layers(tiny.config.num_hidden_layers)
    rng = random.Random(8)
    target = TargetModel(tiny)
    target.cost_tables = {0: cost}
    for case in range(4):
        prompt = repetitive_prompt(rng, 96, rng.randrange(4, 60))
        drafter = make_drafter(name, DrafterOptions(search_depth=6, deepen=True), eagle=eagle_factory(tiny, head, EagleOptions(tree=tree, top_k=3, depth=3, total_tokens=10)))
        got = generate(target, drafter, prompt, DecodeConfig(max_new_tokens=24, verify=layout))
        assert got.token_ids == hf_greedy(tiny, prompt, 24), f"case {case}"


def test_feature_layers_follow_eagle3():
    assert feature_layers(32) == (2, 16, 29)
    assert feature_layers(30) == (2, 15, 27)
    assert feature_layers(2) == (1, 1, 1)


def test_mismatched_eagle3_heads_are_refused(tmp_path, tiny):
    head = random_head3(tiny)
    save_head3(head, tmp_path / "h")
    config = json.loads((tmp_path / "h" / "config.json").read_text())
    for change, message in [({"vocab_size": 50}, "vocabulary"), ({"target_hidden_size": 32}, "features of hidden size")]:
        (tmp_path / "h" / "config.json").write_text(json.dumps({**config, **change}))
        with pytest.raises(NgspecError, match=message):
            load_head(tmp_path / "h", tiny)
    (tmp_path / "h" / "config.json").write_text(json.dumps(config))
    from safetensors.torch import load_file, save_file

    state = load_file(str(tmp_path / "h" / "model.safetensors"))
    bad = dict(state)
    bad["d2t"] = bad["d2t"] + 1000
    save_file(bad, str(tmp_path / "h" / "model.safetensors"))
    with pytest.raises(NgspecError, match="outside the model"):
        load_head(tmp_path / "h", tiny)
    del state["norm.weight"]
    save_file(state, str(tmp_path / "h" / "model.safetensors"))
    with pytest.raises(NgspecError, match="missing norm.weight"):
        load_head(tmp_path / "h", tiny)
