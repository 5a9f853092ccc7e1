"""Lossless on the real embedded default model (SmolLM2-135M-Instruct, float32 CPU)."""

import json
from pathlib import Path

import pytest
import torch

from conftest import hf_greedy
from ngspec.decode import DecodeConfig, generate
from ngspec.drafters import REGISTRY, DrafterOptions, make_drafter
from ngspec.drafters.eagle import EagleOptions, eagle_factory
from ngspec.drafters.ngram_tables import cached_tables, table_anchor
from ngspec.eagle.head import EagleHead, head_config_for, init_from_target
from ngspec.engine import eos_ids
from ngspec.prompts import encode
from ngspec.target import TargetModel
from ngspec.verify import SamplingConfig

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "spec_bench" / "question.jsonl"
EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
CORPUS = Path(__file__).resolve().parents[1] / "corpora" / "smollm2-self.jsonl"


SHIPPED = 2  # the first prompts of `real_prompts`, shipped with the checkout
# New tokens a test decodes: plain greedy's first NEW tokens are its output at that budget. On a
# slow two-core host each real-model token costs about 0.15 s a prompt, and this file was half the
# suite at 64 (BENCHMARKS.md 10zzn).
NEW = 32


def real_prompts() -> list[str]:
    prompts = [(EXAMPLES / "rag_ngspec.txt").read_text(), (EXAMPLES / "code_edit.txt").read_text()]
    if DATA.is_file():  # the shared Spec-Bench questions, when the checkout has them beside it
        rows = [json.loads(line) for line in DATA.read_text().splitlines()]
        for cat in ("rag", "summarization"):
            prompts.append(next(r for r in rows if r["category"] == cat)["turns"][0])
    return prompts


@pytest.fixture(scope="module")
def default_tables(default_model):
    """The default model's real n-gram tables (built once, about a minute on two cores, then cached)."""
    return cached_tables(default_model.model, default_model.name, table_anchor(default_model.tokenizer))


@pytest.fixture(scope="module")
def default_eagle(default_model):
    """An untrained head started from the model's last layer: real drafts, some accepted. A
    16-node tree of depth 5 (the default is 32 nodes): verifying 33-token blocks, or their ~20
    root-to-leaf rows, made the EAGLE tests a third of the suite's time."""
    model = default_model.model
    torch.manual_seed(0)
    head = EagleHead(head_config_for(model))
    init_from_target(head, model)
    return eagle_factory(model, head.eval(), EagleOptions(top_k=4, depth=5, total_tokens=16))  # on a CPU in int8 (`ngspec.eagle.int8`)


@pytest.fixture(scope="module")
def default_datastore(default_model):
    """The shipped self-synthesised corpus as an in-memory datastore."""
    from ngspec.datastore.corpus import documents
    from ngspec.datastore.index import Datastore

    texts = [t for line in CORPUS.read_text().splitlines() for t in documents(json.loads(line), "magpie")]
    docs = [default_model.tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    return Datastore.from_documents(docs, len(default_model.tokenizer))


@pytest.fixture(scope="module")
def expected_outputs(default_model):
    eos = eos_ids(default_model)
    out = []
    for text in real_prompts():
        ids = encode(default_model.tokenizer, text)
        out.append((ids, hf_greedy(default_model.model, ids, 64, eos=min(eos))))
    return out


ROWS_LAYOUT = ("trie", "bigram", "eagle+search")  # a chain, rows of n-grams, a tree with a deep branch


@pytest.mark.slow
@pytest.mark.parametrize("drafter", list(REGISTRY))
def test_default_model_lossless(default_model, default_tables, default_eagle, default_datastore, expected_outputs, drafter):
    """Every drafter on the shipped prompts alone, in the default `tree` layout (the Spec-Bench
    prompts, when the checkout has them beside it, run in the batch test below). `rows` lays out
    the same trees another way: on the real model for a chain, n-gram rows and a deepened tree (on
    the tiny models for every drafter)."""
    target = TargetModel(default_model.model)
    eos = eos_ids(default_model)
    layouts = ["tree", "rows"] if drafter in ROWS_LAYOUT else ["tree"]
    for layout in layouts:
        for case, (ids, expected) in enumerate(expected_outputs[: SHIPPED if layout == "tree" else 1]):
            opts = DrafterOptions(trie_update=True, k=4, w=4, search_depth=8, deepen=case % 2 == 1 or layout == "rows")
            cfg = DecodeConfig(max_new_tokens=NEW, eos_ids=eos, verify=layout)
            got = generate(target, make_drafter(drafter, opts, default_tables, default_eagle, default_datastore), ids, cfg)
            assert got.token_ids == expected[:NEW], f"{layout} case {case}"


@pytest.mark.slow
@pytest.mark.parametrize("drafter", list(REGISTRY))
def test_default_model_batched_lossless(default_model, default_tables, default_eagle, default_datastore, expected_outputs, drafter):
    """Batch of 4 real prompts of different lengths: each row equals its own plain greedy."""
    from ngspec.batch import BatchConfig, generate_batch
    from ngspec.decode import Stopper

    eos = eos_ids(default_model)
    opts = DrafterOptions(k=4, w=3, deepen=True)
    results, _ = generate_batch(
        default_model.model, [ids for ids, _ in expected_outputs],
        lambda: make_drafter(drafter, opts, default_tables, default_eagle, default_datastore),
        DecodeConfig(max_new_tokens=NEW, eos_ids=eos), BatchConfig(4, rearrange_every=8), lambda: Stopper(eos),
    )
    for result, (_, expected) in zip(results, expected_outputs):
        assert result.generation.token_ids == expected[:NEW]


SAMPLED = SamplingConfig(temperature=0.7, top_p=0.9, seed=11)


@pytest.fixture(scope="module")
def sampled_outputs(default_model, expected_outputs):
    """Plain sampling (`vanilla`: no drafts) of the real prompts, with one seed."""
    eos = eos_ids(default_model)
    cfg = DecodeConfig(max_new_tokens=NEW, eos_ids=eos, sampling=SAMPLED)
    out = [(ids, generate(TargetModel(default_model.model), make_drafter("vanilla"), ids, cfg).token_ids) for ids, _ in expected_outputs]
    # really sampled: not greedy's tokens (the code edit's continuation is peaked enough to sample greedy's)
    assert sum(got != want[: len(got)] for (_, got), (_, want) in zip(out, expected_outputs)) >= len(out) // 2
    return out


@pytest.mark.slow
@pytest.mark.parametrize("drafter", ["trie", "bigram", "search", "eagle+search"])  # every drafter samples on the tiny models
def test_default_model_samples_plain_samplings_tokens(default_model, default_tables, default_eagle, default_datastore, sampled_outputs, drafter):
    """Sampling with a seed, alone and in a batch of the real prompts: a chain, n-gram rows, a
    search and a head's tree draw plain sampling's tokens (`verify.Draws`: the seed, the prompt and the position fix each token)."""
    from ngspec.batch import BatchConfig, generate_batch
    from ngspec.decode import Stopper

    eos = eos_ids(default_model)
    opts = DrafterOptions(k=4, w=3, search_depth=8, deepen=True)
    cfg = DecodeConfig(max_new_tokens=NEW, eos_ids=eos, sampling=SAMPLED)
    target = TargetModel(default_model.model)
    ids, want = sampled_outputs[0]  # the RAG prompt alone (the code edit's samples are nearly greedy's), then every prompt in a batch
    assert generate(target, make_drafter(drafter, opts, default_tables, default_eagle, default_datastore), ids, cfg).token_ids == want
    results, _ = generate_batch(
        default_model.model, [ids for ids, _ in sampled_outputs],
        lambda: make_drafter(drafter, opts, default_tables, default_eagle, default_datastore), cfg, BatchConfig(4, rearrange_every=8), lambda: Stopper(eos),
    )
    assert [r.generation.token_ids for r in results] == [want for _, want in sampled_outputs]


@pytest.mark.slow
def test_default_model_lossless_with_a_float32_head(default_model, default_datastore, expected_outputs):
    """The tests above run the head as `generate` does by default (on a CPU its products in
    int8, `ngspec.eagle.int8`); here `--head-float32`: other drafts, the same outputs, the
    shipped prompts alone and every prompt in a batch of 3. `eagle+search` with deepening drafts
    the head's tree, as `eagle` does, plus a search branch hung below it."""
    from ngspec.batch import BatchConfig, generate_batch
    from ngspec.decode import Stopper
    from ngspec.eagle import int8

    model = default_model.model
    torch.manual_seed(0)
    head = EagleHead(head_config_for(model))
    init_from_target(head, model)
    factory = eagle_factory(model, head.eval(), EagleOptions(top_k=4, depth=5, total_tokens=16, head_int8=False))
    assert not any(isinstance(m, int8.Int8Linear) for m in factory().head.modules())
    target = TargetModel(model)
    eos = eos_ids(default_model)
    drafter, opts = "eagle+search", DrafterOptions(search_depth=8, deepen=True)
    cfg = DecodeConfig(max_new_tokens=NEW, eos_ids=eos)
    for ids, expected in expected_outputs[:SHIPPED]:  # every prompt in the batch below
        assert generate(target, make_drafter(drafter, opts, eagle=factory, datastore=default_datastore), ids, cfg).token_ids == expected[:NEW]
    results, _ = generate_batch(
        model, [ids for ids, _ in expected_outputs], lambda: make_drafter(drafter, opts, eagle=factory, datastore=default_datastore),
        cfg, BatchConfig(3), lambda: Stopper(eos),
    )
    assert [r.generation.token_ids for r in results] == [expected[:NEW] for _, expected in expected_outputs]


def _stop_inside_a_run(default_model, expected_outputs) -> tuple[int, str, int]:
    """(prompt index, stop string, tokens kept): a two-token string that plain decoding first
    completes at the third token of a step where the trie had three or more tokens accepted."""
    tokenizer = default_model.tokenizer
    target = TargetModel(default_model.model)
    for index, (ids, expected) in enumerate(expected_outputs):
        steps = generate(target, make_drafter("trie"), ids, DecodeConfig(max_new_tokens=64, eos_ids=eos_ids(default_model))).stats.steps
        at = 0
        for step in steps:
            if step.accepted >= 3 and at > 0:
                stop = tokenizer.decode(expected[at + 1 : at + 3])
                if stop.strip() and stop not in tokenizer.decode(expected[: at + 2]):
                    return index, stop, at + 3
            at += step.accepted
    raise AssertionError("no run of three accepted tokens in the real prompts' outputs")


@pytest.mark.slow
def test_a_stop_string_naming_a_special_token_stops_there_alone_and_in_a_batch(default_model):
    """A raw chat transcript whose next token is "<|im_start|>" (not the model's EOS): with that
    stop string, generation stops at it; before, the text (which leaves special tokens out) never
    held it and generation ran to its budget."""
    from ngspec import Speculator

    prompt = "<|im_start|>user\nHi<|im_end|>\n"
    start = default_model.tokenizer.convert_tokens_to_ids("<|im_start|>")
    for drafter in ("vanilla", "trie"):
        spec = Speculator.from_model(default_model.model, default_model.tokenizer, drafter)
        assert spec.generate(prompt, max_new_tokens=12, raw=True).token_ids[0] == start
        out = spec.generate(prompt, max_new_tokens=12, raw=True, stop=["<|im_start|>"])
        assert (out.token_ids, out.finish_reason, out.text) == ([start], "stop", "")
        outs = spec.generate_batch([prompt, "Count to five."], max_new_tokens=12, raw=True, stop=["<|im_start|>"], batch_size=2)
        assert (outs[0].token_ids, outs[0].finish_reason) == ([start], "stop")


@pytest.mark.slow
@pytest.mark.parametrize("batch_size", [1, 3])
def test_a_stop_string_ends_the_output_where_plain_decoding_ends_it(default_model, expected_outputs, batch_size):
    """A stop string spanning two tokens, completed inside a run of accepted drafts: the output is
    plain greedy's tokens up to the one that completes it, with nothing after, alone and in a
    batch whose other rows go on."""
    from ngspec.batch import BatchConfig, generate_batch
    from ngspec.decode import Stopper

    eos = eos_ids(default_model)
    index, stop, kept = _stop_inside_a_run(default_model, expected_outputs)
    ids, expected = expected_outputs[index]

    def stopper() -> Stopper:
        return Stopper(eos, [stop], default_model.tokenizer.decode)

    want, reason = stopper().cut([], expected)  # plain decoding checks after every token
    assert reason == "stop" and len(want) == kept
    cfg = DecodeConfig(max_new_tokens=64, eos_ids=eos, stop_strings=(stop,))
    if batch_size == 1:
        got = generate(TargetModel(default_model.model), make_drafter("trie"), ids, cfg, stopper())
        assert got.token_ids == want and got.finish_reason == "stop"
        return
    others = [i for i in range(len(expected_outputs)) if i != index][:2]
    prompts = [ids] + [expected_outputs[i][0] for i in others]
    results, _ = generate_batch(default_model.model, prompts, lambda: make_drafter("trie"), cfg, BatchConfig(batch_size), stopper)
    assert results[0].generation.token_ids == want and results[0].generation.finish_reason == "stop"
    for result, i in zip(results[1:], others):
        assert result.generation.token_ids == stopper().cut([], expected_outputs[i][1])[0]


@pytest.mark.slow
@pytest.mark.parametrize("drafter", ["trie", "eagle+search"])  # a chain and a tree (every drafter: test_static_verify)
def test_default_model_lossless_with_captured_verification(default_model, default_tables, default_eagle, default_datastore, expected_outputs, drafter, monkeypatch):
    """`--target-graphs` on the real model, its forwards captured by the CPU stand-in for CUDA
    graphs (which refuses what a GPU's capture refuses): the shipped prompts one at a time and
    every prompt in a batch of 4, each equal to plain greedy, and every shape captured once (at its second run) and replayed after."""
    from ngspec.batch import BatchConfig, generate_batch
    from ngspec.decode import Stopper
    from ngspec.static_verify import batches_static
    from test_static_verify import _capturing

    _capturing(monkeypatch)
    eos = eos_ids(default_model)
    opts = DrafterOptions(search_depth=8, deepen=True)
    new = lambda: make_drafter(drafter, opts, default_tables, default_eagle, default_datastore)  # noqa: E731
    target = TargetModel(default_model.model)
    static = target.use_graphs()
    for ids, expected in expected_outputs[:SHIPPED]:  # every prompt in the batch below
        assert generate(target, new(), ids, DecodeConfig(max_new_tokens=NEW, eos_ids=eos)).token_ids == expected[:NEW]
    results, _ = generate_batch(default_model.model, [ids for ids, _ in expected_outputs], new, DecodeConfig(max_new_tokens=NEW, eos_ids=eos),
                                BatchConfig(4, rearrange_every=8, target_graphs=True), lambda: Stopper(eos))
    assert [r.generation.token_ids for r in results] == [expected[:NEW] for _, expected in expected_outputs]
    for graphs in (static.graphs, batches_static(default_model.model).graphs):
        assert graphs.failure is None and 0 < graphs.captures < graphs.replays
