"""EAGLE-1 heads: public layout round trip, refusals, and drafts that stay lossless."""

from __future__ import annotations

import json
import random
import re

import pytest
import torch

from conftest import hf_greedy, repetitive_prompt
from ngspec.contracts import DraftTree
from ngspec.decode import DecodeConfig, generate
from ngspec.drafters import make_drafter
from ngspec.eagle.batched import drive
from ngspec.drafters.eagle import EagleOptions, check_choices, eagle_factory, read_choices
from ngspec.eagle.head import EagleHead, draft_vocab_counts, head_config_for, init_from_target, load_draft_vocab, load_head, save_draft_vocab, save_head
from ngspec.errors import NgspecError
from ngspec.models import tiny_model
from ngspec.target import TargetModel, forward_with_features, select_features

pytestmark = pytest.mark.tiny_llama_only  # the Qwen2 tiny model runs the lossless matrices (conftest)


@pytest.fixture(scope="module")
def llama():
    return tiny_model("llama", seed=3)


def make_head(model, seed=0):
    torch.manual_seed(seed)
    head = EagleHead(head_config_for(model))
    init_from_target(head, model)
    return head.eval()


def test_public_layout_round_trip_drafts_identically(tmp_path, llama):
    head = make_head(llama)
    save_head(head, tmp_path / "h")
    assert sorted(p.name for p in (tmp_path / "h").iterdir()) == ["config.json", "model.safetensors"]
    from safetensors.torch import load_file

    keys = set(load_file(str(tmp_path / "h" / "model.safetensors")))
    assert {"fc.weight", "fc.bias", "layers.0.self_attn.q_proj.weight", "layers.0.mlp.down_proj.weight",
            "layers.0.post_attention_layernorm.weight"} <= keys
    assert not any("input_layernorm" in k for k in keys)
    back = load_head(tmp_path / "h", llama)
    for (k, a), (_, b) in zip(sorted(head.state_dict().items()), sorted(back.state_dict().items())):
        assert torch.equal(a, b), k
    prompt = [5, 9, 13, 5, 9, 2, 7]
    trees = []
    for h in (head, back):
        target = TargetModel(llama)
        drafter = make_drafter("eagle", eagle=eagle_factory(llama, h, EagleOptions()))
        out = generate(target, drafter, prompt, DecodeConfig(max_new_tokens=5))
        trees.append(out.token_ids)
    assert trees[0] == trees[1]


def test_pytorch_bin_with_embed_tokens_loads(tmp_path, llama):
    head = make_head(llama, seed=1)
    (tmp_path / "h").mkdir()
    state = dict(head.state_dict())
    state = {k: v for k, v in state.items() if not k.startswith("rotary.")}
    state["embed_tokens.weight"] = torch.zeros(96, 64)
    torch.save(state, tmp_path / "h" / "pytorch_model.bin")
    (tmp_path / "h" / "config.json").write_text(json.dumps({**head.config.to_dict(), "bias": True}))
    back = load_head(tmp_path / "h", llama)
    assert torch.equal(back.fc.weight, head.fc.weight)


def test_mismatched_or_broken_heads_are_refused(tmp_path, llama):
    save_head(make_head(llama), tmp_path / "h")
    other = tiny_model("llama", seed=3, vocab_size=128)
    with pytest.raises(NgspecError, match="128"):
        load_head(tmp_path / "h", other)
    with pytest.raises(NgspecError, match="no EAGLE head directory"):
        load_head(tmp_path / "missing", llama)
    (tmp_path / "e").mkdir()
    with pytest.raises(NgspecError, match="no config.json"):
        load_head(tmp_path / "e", llama)
    (tmp_path / "e" / "config.json").write_text((tmp_path / "h" / "config.json").read_text())
    with pytest.raises(NgspecError, match="no weights"):
        load_head(tmp_path / "e", llama)
    (tmp_path / "e" / "model.safetensors").write_bytes(b"\x00" * 20)
    with pytest.raises(NgspecError, match=r"cannot read \S+/model.safetensors: it is damaged, cut short or not a weights file \(.*header.*\); copy the head again") as err:
        load_head(tmp_path / "e", llama)
    assert "SafetensorError" not in str(err.value)  # it read "SafetensorError: Error while deserializing header: ..."
    from safetensors.torch import save_file

    save_file({"midlayer.fc.weight": torch.zeros(2, 2), "d2t": torch.zeros(3, dtype=torch.long)}, str(tmp_path / "e" / "model.safetensors"))
    with pytest.raises(NgspecError, match="EAGLE-3"):
        load_head(tmp_path / "e", llama)
    save_file({"fc.weight": torch.zeros(64, 128)}, str(tmp_path / "e" / "model.safetensors"))
    with pytest.raises(NgspecError, match="missing"):
        load_head(tmp_path / "e", llama)
    config = json.loads((tmp_path / "h" / "config.json").read_text())
    (tmp_path / "h" / "config.json").write_text(json.dumps({**config, "hidden_size": config["num_attention_heads"] * 8 + 1}))
    with pytest.raises(NgspecError, match=r"^\S+config.json is not a Llama-style head config \(The hidden size \(\d+\) is not a multiple"):
        load_head(tmp_path / "h", llama)  # transformers' own validation, in one line without its class names


@pytest.mark.parametrize("data, says", [
    (b"", "it ends early"),  # a bare EOFError, which said nothing
    (b"\x00" * 20, "Weights only load failed."),  # then torch's paragraph on loading with weights_only=False
    (b"PK\x03\x04garbage", "PytorchStreamReader failed reading zip archive: not a ZIP archive."),  # then advice on miniz
])
def test_a_damaged_pytorch_head_file_is_named_in_one_sentence(tmp_path, llama, data, says):
    save_head(make_head(llama), tmp_path / "h")
    (tmp_path / "h" / "model.safetensors").unlink()
    (tmp_path / "h" / "pytorch_model.bin").write_bytes(data)
    with pytest.raises(NgspecError) as err:
        load_head(tmp_path / "h", llama)
    assert str(err.value) == (f"cannot read {tmp_path}/h/pytorch_model.bin: it is damaged, cut short or not a weights file ({says}); "
                              "copy the head again, or train one with `ngspec train-eagle`")


@pytest.mark.parametrize("name", ["model.safetensors", "config.json"])
def test_a_directory_in_place_of_a_head_file_is_named(tmp_path, llama, name):
    """A directory named model.safetensors was read as missing weights ("no weights in ...",
    input_fuzz run 12990)."""
    save_head(make_head(llama), tmp_path / "h")
    (tmp_path / "h" / name).unlink()
    (tmp_path / "h" / name).mkdir()
    with pytest.raises(NgspecError) as err:
        load_head(tmp_path / "h", llama)
    assert str(err.value) == f"{tmp_path}/h/{name} is a directory, not a file; copy the head again, or train one with `ngspec train-eagle`"


@pytest.mark.parametrize("content, says", [
    (b"\xf5{}", "not UTF-8 text: byte 0 is 0xf5"),  # "is not valid JSON ('utf-8' codec can't decode byte 0xf5 ...)" (input_fuzz run 13039)
    (b'{"hidden_size": ', "not valid JSON: Expecting value at line 1 column 17"),
])
def test_a_head_config_that_is_not_json_text_says_where(tmp_path, llama, content, says):
    save_head(make_head(llama), tmp_path / "h")
    (tmp_path / "h" / "config.json").write_bytes(content)
    with pytest.raises(NgspecError) as err:
        load_head(tmp_path / "h", llama)
    assert str(err.value) == f"{tmp_path}/h/config.json is damaged ({says})"


@pytest.mark.parametrize("config", ["1.5", "[1, 2]", "null", '"text"'])
def test_a_head_config_that_is_not_an_object_is_refused_in_one_message(tmp_path, llama, config):
    """It raised "TypeError: argument of type 'float' is not iterable" (found by
    benchmarks/input_fuzz.py)."""
    save_head(make_head(llama), tmp_path / "h")
    (tmp_path / "h" / "config.json").write_text(config)
    with pytest.raises(NgspecError, match="config.json must hold a JSON object"):
        load_head(tmp_path / "h", llama)


@pytest.mark.parametrize("field", [
    {"id2label": "text"}, {"hidden_size": "64"}, {"num_attention_heads": None}, {"rope_scaling": [1]}, {"num_key_value_heads": -1},
    {"intermediate_size": 0}, {"head_dim": -8}, {"hidden_act": " "}, {"hidden_act": ["silu"]}, {"id2label": 5}, {"attention_bias": 5},
])
def test_a_head_config_with_a_field_of_the_wrong_type_is_refused_in_one_message(tmp_path, llama, field):
    """id2label a string raised AttributeError inside transformers, num_key_value_heads -1 a
    RuntimeError building the head (found by benchmarks/input_fuzz.py)."""
    save_head(make_head(llama), tmp_path / "h")
    config = json.loads((tmp_path / "h" / "config.json").read_text())
    (tmp_path / "h" / "config.json").write_text(json.dumps({**config, **field}))
    with pytest.raises(NgspecError, match="config.json is not a Llama-style head config") as err:
        load_head(tmp_path / "h", llama)
    assert not re.search(r"'\w+' object|NoneType|<class|TypeError", str(err.value)), err.value  # JSON's words, not Python's


@pytest.mark.parametrize("field, says", [
    ({"intermediate_size": 0}, r"intermediate_size=0; a layer size must be a whole number from 1 to 2147483647"),
    ({"hidden_act": "x"}, r'hidden_act="x", an activation transformers does not know \(silu, '),
])
def test_a_head_config_is_checked_as_a_models_config_is(tmp_path, llama, field, says):
    """The head's sizes and activation are refused by `models.config_problem`, in the words a
    model's config gets, after the head's file."""
    save_head(make_head(llama), tmp_path / "h")
    config = json.loads((tmp_path / "h" / "config.json").read_text())
    (tmp_path / "h" / "config.json").write_text(json.dumps({**config, **field}))
    with pytest.raises(NgspecError, match=rf"^\S+/h/config.json is not a Llama-style head config \(it gives {says}"):
        load_head(tmp_path / "h", llama)


@pytest.mark.parametrize("dtype", ["x", 5, "float64"])
def test_a_heads_config_dtype_is_not_read_the_head_takes_its_targets(tmp_path, llama, dtype):
    """A dtype torch has no name for failed in Python's words ("module 'torch' has no attribute
    'x'", found by benchmarks/field_sweep.py); the head is cast to the target's dtype anyway."""
    save_head(make_head(llama), tmp_path / "h")
    config = json.loads((tmp_path / "h" / "config.json").read_text())
    (tmp_path / "h" / "config.json").write_text(json.dumps({**config, "dtype": dtype, "torch_dtype": dtype}))
    head = load_head(tmp_path / "h", llama)
    assert next(head.parameters()).dtype == next(llama.parameters()).dtype


@pytest.mark.parametrize("layout", ["tree", "rows"])
@pytest.mark.parametrize("tree", ["dynamic", "static"])
def test_eagle_drafts_match_plain_greedy(tiny, tree, layout):
    head = make_head(tiny)
    opts = EagleOptions(tree=tree, top_k=3, depth=4, total_tokens=12)
    rng = random.Random(4)
    target = TargetModel(tiny)
    sizes = []
    for case in range(6):
        prompt = repetitive_prompt(rng, 96, rng.randrange(4, 80))
        expected = hf_greedy(tiny, prompt, 30)
        drafter = make_drafter("eagle", eagle=eagle_factory(tiny, head, opts))
        got = generate(target, drafter, prompt, DecodeConfig(max_new_tokens=30, verify=layout))
        assert got.token_ids == expected, f"case {case}"
        sizes += [s.tree_size for s in got.stats.steps[1:]]
    assert max(sizes) == (12 if tree == "dynamic" else 17)


@pytest.mark.parametrize("tree", ["dynamic", "static"])
def test_draft_vocabulary_drafts_only_its_tokens_and_stays_lossless(tiny, tree):
    head = make_head(tiny)
    vocab = list(range(0, 96, 3))  # a third of the vocabulary, "most frequent first"
    opts = EagleOptions(tree=tree, top_k=3, depth=3, total_tokens=10, draft_vocab=20)
    rng = random.Random(6)
    target = TargetModel(tiny)
    for case in range(4):
        prompt = repetitive_prompt(rng, 96, rng.randrange(4, 60))
        drafter = eagle_factory(tiny, head, opts, vocab)()
        allowed = set(vocab[:20]) | set(prompt)
        propose = drafter.propose

        def checked(ctx):
            tree_ = propose(ctx)
            assert set(tree_.tokens) <= allowed
            return tree_

        drafter.propose = checked
        got = generate(target, drafter, prompt, DecodeConfig(max_new_tokens=24))
        assert got.token_ids == hf_greedy(tiny, prompt, 24), f"case {case}"


def test_draft_vocab_file_round_trip_and_damage(tmp_path):
    save_draft_vocab(tmp_path, [[5, 5, 7], [7, 5, 9]])
    assert load_draft_vocab(tmp_path) == [5, 7, 9]
    assert draft_vocab_counts(tmp_path) == {5: 3, 7: 2, 9: 1}
    save_draft_vocab(tmp_path, [[9, 9]], prior={5: 3, 7: 2, 9: 1})  # a fine-tuned head's vocabulary: counts add up
    assert draft_vocab_counts(tmp_path) == {9: 3, 5: 3, 7: 2}
    for damage in ("{broken", '{"ids": [1, 2], "counts": [4]}', "[1, 2]", '{"tokens": [1]}', '{"ids": 3}', '{"ids": [1], "counts": 1}', "null"):
        (tmp_path / "draft_vocab.json").write_text(damage)
        with pytest.raises(NgspecError, match="damaged") as refused:
            load_draft_vocab(tmp_path)
        assert "indices" not in str(refused.value) and "object is not" not in str(refused.value)  # said in the file's terms
    assert load_draft_vocab(tmp_path / "nothing") is None


def test_choices_files(tmp_path):
    path = tmp_path / "c.json"
    path.write_text("[[0], [1], [0, 0]]")
    assert read_choices(path) == ((0,), (1,), (0, 0))
    path.write_text("[[0, 0]]")
    with pytest.raises(NgspecError, match="without its parent"):
        read_choices(path)
    path.write_text("{oops")  # Python's words said "line 1 column 2 (char 1)"
    with pytest.raises(NgspecError, match=r"JSON list .*\(not valid JSON: Expecting property name enclosed in double quotes at line 1 column 2\)$"):
        read_choices(path)
    path.write_bytes(b"[[0]]\xe9")
    with pytest.raises(NgspecError, match=r"\(not UTF-8 text: byte 5 is 0xe9\)$"):
        read_choices(path)
    with pytest.raises(NgspecError):
        check_choices([(0, -1)])
    for wrong in ("[[0], [1.5]]", '[[0], ["1"]]', "[[true]]"):  # not rank 1: a mistake
        path.write_text(wrong)
        with pytest.raises(NgspecError, match="must be an integer"):
            read_choices(path)


def test_choices_built_in_python_are_checked_and_ordered_too():
    """Choices that skip the shape file (the Python API) get the same check: a path without its
    parent made the static drafter raise a KeyError mid-step."""
    with pytest.raises(NgspecError, match="without its parent"):
        EagleOptions(tree="static", choices=((0,), (1, 2)))
    assert EagleOptions(tree="static", choices=((1,), (0, 0), (0,))).choices == ((0,), (1,), (0, 0))


def test_a_static_tree_beyond_the_draft_vocabulary_is_refused(tiny):
    head = make_head(tiny)
    vocab = list(range(0, 96, 3))
    eagle_factory(tiny, head, EagleOptions(tree="static", choices=((0,), (19,)), draft_vocab=20), vocab)  # the last of 20 columns
    with pytest.raises(NgspecError, match="rank 20, but the head drafts over 20 tokens"):
        eagle_factory(tiny, head, EagleOptions(tree="static", choices=((0,), (20,)), draft_vocab=20), vocab)
    with pytest.raises(NgspecError, match="rank 96, but the head drafts over 96 tokens"):  # the whole vocabulary
        eagle_factory(tiny, head, EagleOptions(tree="static", choices=((96,),), draft_vocab=0), vocab)
    eagle_factory(tiny, head, EagleOptions(tree="dynamic", top_k=200, draft_vocab=20), vocab)  # dynamic: top-k is capped, as before


def _depth(tree: DraftTree) -> int:
    depths: list[int] = []
    for p in tree.parents:
        depths.append(1 + (depths[p] if p >= 0 else 0))
    return max(depths, default=0)


@pytest.mark.parametrize("tree", ["dynamic", "static"])
def test_a_caller_can_stop_the_head_below_a_level(tiny, tree):
    """``drafting(ctx, deeper)``: asked before each level below the root's children with the tree
    so far, its scores, the best score about to be expanded and the levels left; False stops the
    tree there. Always True drafts the same trees as no caller; stopped trees stay lossless."""
    head = make_head(tiny)
    opts = EagleOptions(tree=tree, top_k=3, depth=4, total_tokens=12)
    prompt = repetitive_prompt(random.Random(5), 96, 30)
    target = TargetModel(tiny)

    class Asking:
        name, needs_features = "eagle", True

        def __init__(self, stop_below: int | None) -> None:
            self.inner, self.stop_below, self.trees, self.asked = eagle_factory(tiny, head, opts)(), stop_below, [], []

        def start(self, p):
            self.inner.start(p)

        def deeper(self, tree_, scores, frontier, levels):
            assert frontier in scores and len(scores) == tree_.size
            self.asked.append((_depth(tree_), levels))
            return self.stop_below is None or _depth(tree_) < self.stop_below

        def propose(self, ctx):
            self.trees.append(drive(self.inner.drafting(ctx, self.deeper if self.stop_below != 0 else None)))
            return self.trees[-1]

        def observe(self, new):
            self.inner.observe(new)

    plain, always, stopped = Asking(0), Asking(None), Asking(2)
    for drafter in (plain, always, stopped):
        got = generate(target, drafter, prompt, DecodeConfig(max_new_tokens=24))
        assert got.token_ids == hf_greedy(tiny, prompt, 24)
    assert always.trees == plain.trees and plain.asked == []
    last = 4 if tree == "dynamic" else 5  # the default static choices go five deep
    assert set(always.asked) == {(d, last - d) for d in range(1, last)}  # every level, levels left
    assert max(map(_depth, stopped.trees)) == 2 and set(stopped.asked) == {(1, last - 1), (2, last - 2)}


def test_deferred_steps_are_caught_up_exactly(tiny):
    """A drafter that skips the head on some steps (`defer`) drafts, when it runs again, what one
    that ran the head every step drafts from the same history, and stays lossless."""
    head = make_head(tiny)
    opts = EagleOptions(top_k=3, depth=3, total_tokens=8)
    target = TargetModel(tiny)
    prompt = repetitive_prompt(random.Random(9), 96, 40)
    skipping = eagle_factory(tiny, head, opts)()
    seen = []

    class Skipper:
        name, needs_features = "eagle", True

        def start(self, p):
            skipping.start(p)

        def propose(self, ctx):
            skip = len(seen) % 3 != 0
            seen.append((ctx, skip))
            if skip:
                skipping.defer(ctx)
                return DraftTree()
            return skipping.propose(ctx)

        def observe(self, new):
            skipping.observe(new)

    got = generate(target, Skipper(), prompt, DecodeConfig(max_new_tokens=30))
    assert got.token_ids == hf_greedy(tiny, prompt, 30)
    every = eagle_factory(tiny, head, opts)()
    every.start(prompt)
    skipping.start(prompt)
    caught_up = 0
    for step, (ctx, skip) in enumerate(seen):
        if skip:
            skipping.defer(ctx)
            every.propose(ctx)
            continue
        a, b = skipping.propose(ctx), every.propose(ctx)
        assert a == b and skipping.last_scores == pytest.approx(every.last_scores, abs=1e-4)
        caught_up += step > 0
    assert caught_up >= 3


def test_the_head_scores_its_guesses_on_the_positions_it_catches_up_on():
    """`caught_up`: every pair the head consumes, except the newest of each run (whose guess is
    drafted), has a known next token; the head's top guess there is scored. A drafter that skips
    the head on some steps therefore learns, over the same positions, exactly what one that runs
    it every step learns from its drafted guesses plus its own caught-up ones."""
    tiny = tiny_model("llama", seed=0)  # its greedy output repeats: the untrained head is often right
    head = make_head(tiny)
    opts = EagleOptions(top_k=3, depth=3, total_tokens=8)
    prompt = repetitive_prompt(random.Random(9), 96, 40)
    contexts = []

    class Recorder:
        name, needs_features = "eagle", True

        def __init__(self):
            self.inner = eagle_factory(tiny, head, opts)()

        def start(self, p):
            self.inner.start(p)

        def propose(self, ctx):
            contexts.append(ctx)
            return self.inner.propose(ctx)

        def observe(self, new):
            self.inner.observe(new)

    got = generate(TargetModel(tiny), Recorder(), prompt, DecodeConfig(max_new_tokens=40))
    seq = prompt + got.token_ids
    runs = [i for i in range(len(contexts)) if i % 4 == 0 or i == len(contexts) - 1]  # skip 3 of 4
    learned = {}
    for name, run_at in (("every", range(len(contexts))), ("skipping", runs)):
        drafter = eagle_factory(tiny, head, opts)()
        drafter.start(prompt)
        right = scored = 0
        for i, ctx in enumerate(contexts):
            if i not in run_at:
                drafter.defer(ctx)
                continue
            guess, at = drafter.propose(ctx).tokens[0], len(ctx.tokens)  # the root's top child
            if at < len(seq):
                right, scored = right + (guess == seq[at]), scored + 1
        learned[name] = (right, scored, *drafter.caught_up)
    r_every, s_every, cr_every, cs_every = learned["every"]
    r_skip, s_skip, cr_skip, cs_skip = learned["skipping"]
    # both saw every generated position up to the last guess once: drafted or caught up
    assert s_every + cs_every == s_skip + cs_skip == len(contexts[-1].tokens) - len(prompt) + (len(contexts[-1].tokens) < len(seq))
    assert cs_skip > cs_every and s_skip < s_every
    assert r_every + cr_every == r_skip + cr_skip
    assert r_every + cr_every > 0  # the head is right somewhere, so the counts can disagree


@pytest.mark.parametrize("layers", [None, (1, 2, -1)], ids=["eagle-1", "eagle-3"])
def test_the_target_reads_the_features_the_head_needs_and_only_those(layers):
    """Oracle: the features selected from every layer's hidden state, as transformers gives them
    when asked for all. EAGLE-1's come through one hook that does not stay behind; EAGLE-3's
    through transformers' selection, which keeps no other layer's."""
    model = tiny_model("llama", seed=0)  # its own: transformers' capturing hooks stay on a model
    ids = torch.tensor([[3, 5, 7, 9, 11]])
    hooks = lambda: sum(len(m._forward_hooks) for m in model.modules())  # noqa: E731
    kept = []
    out, features = forward_with_features(lambda **extra: kept.append(extra) or model(input_ids=ids, **extra), model, True, layers)
    assert (hooks() == 0) == (layers is None) and kept == [{} if layers is None else {"output_hidden_states": list(layers)}]
    everything = model(input_ids=ids, output_hidden_states=True).hidden_states
    assert torch.equal(features, select_features(everything, layers))
    if layers is not None:
        wanted = {i % len(everything) for i in layers}
        assert [i for i, h in enumerate(out.hidden_states) if h is not None] == sorted(wanted)
    assert forward_with_features(lambda **extra: extra, model, False, layers) == ({}, None)
    target = TargetModel(model)
    target.keep_features, target.feature_layers = True, layers
    target.prefill([3, 5, 7, 9, 11])
    assert torch.equal(target.take_features(), select_features(everything, layers)[0])
