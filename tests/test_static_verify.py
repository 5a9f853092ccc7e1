"""The target's verification at fixed shapes (`ngspec.static_verify`, `--target-graphs`): the same
logits, features and cache as the plain forward step by step (one sequence and a batch whose rows
come, go and are compacted), generations equal to plain greedy decoding for every drafter and
batch size, and, with a CPU stand-in for CUDA graph captures that refuses what a GPU's capture
refuses, each shape captured once (at its second run) and replayed after; on a GPU, captured
against uncaptured."""

from __future__ import annotations

import random

import pytest
import torch

from conftest import hf_greedy, repetitive_prompt, tensor_ops
from graph_standin import StandInGraphs
from ngspec import static_verify
from ngspec.batch import BatchConfig, generate_batch
from ngspec.batch_target import BatchTarget
from ngspec.contracts import DraftTree
from ngspec.decode import DecodeConfig, Stopper, generate
from ngspec.drafters import REGISTRY, DrafterOptions, make_drafter
from ngspec.errors import NgspecError
from ngspec.models import tiny_model
from ngspec.target import TargetModel
from test_families import family_model
from test_batch import prompts_and_expected  # noqa: F401 (fixture)
from test_lossless import VOCAB, tiny_datastore, tiny_eagle, tiny_tables  # noqa: F401 (fixtures)


def _tree(rng: random.Random, size: int) -> DraftTree:
    return DraftTree(tuple(rng.randrange(VOCAB) for _ in range(size)), tuple(rng.randrange(-1, i) for i in range(size)))


def _path(rng: random.Random, tree: DraftTree) -> list[int]:
    """A random root-to-node path (drawn from ``rng`` alone, so both targets keep the same)."""
    if not tree.size or rng.random() < 0.2:
        return []
    node, path = rng.randrange(tree.size), []
    while node != -1:
        path.append(node)
        node = tree.parents[node]
    return path[::-1]


# tree sizes verified in turn (70 nodes: wider than any shape, run as the plain forward) and, where
# "rows", verified as rows (`verify_rows`, never at fixed shapes); the step before each of those
# keeps the root alone, whose entry is already in place, so the views are cut first
SIZES = [0, 3, 1, 9, 15, 0, 31, 70, 2, 6, "rows", 63, 5]


def _entries(cache, length: int) -> list[torch.Tensor]:
    return [t[:, :, :length] for layer in cache.layers for t in (layer.keys, layer.values)]


@pytest.mark.parametrize("family, layers", [("llama", None), ("qwen2", None), ("llama", (0, 1, 2))])
def test_one_sequence_at_fixed_shapes_equals_the_plain_forward(family, layers):
    """Oracle: a plain `TargetModel` verifying and keeping the same trees and paths: every step's
    logits and features (the last hidden state, or EAGLE-3's layers), and the cache, over two
    prompts (the second reuses the first's buffers) and contexts past the first span (256 slots)."""
    plain, static = _one_sequence_side_by_side(tiny_model(family, seed=2), layers)
    assert plain.length > 256  # the second prompt's steps attended a wider span
    assert static.unbucketed == 2 and static.made > 4  # the rows layout never asks for a shape


def _one_sequence_side_by_side(model, layers: tuple[int, ...] | None = None) -> tuple[TargetModel, static_verify.StaticVerify]:
    """A plain `TargetModel` and one at fixed shapes (uncaptured) verifying and keeping the same
    trees (`SIZES`) and paths over two prompts, every step's logits, features and cache entries
    checked equal; the plain one and the fixed one's `StaticVerify`."""
    plain, fixed = TargetModel(model), TargetModel(model)
    static = fixed.use_graphs(capture=False)
    for target in (plain, fixed):
        target.keep_features, target.feature_layers = True, layers
    rng_prompts = random.Random(0)
    for length in (40, 230):
        prompt = repetitive_prompt(rng_prompts, VOCAB, length)
        torch.testing.assert_close(fixed.prefill(prompt), plain.prefill(prompt))
        assert torch.equal(fixed.take_features(), plain.take_features())
        rng = random.Random(length)
        for i, size in enumerate(SIZES):
            layout = "rows" if size == "rows" else "tree"
            tree, root = _tree(rng, 8 if size == "rows" else size), rng.randrange(VOCAB)
            torch.testing.assert_close(fixed.verify(root, tree, layout), plain.verify(root, tree, layout), rtol=1e-5, atol=1e-5)
            path = [] if SIZES[(i + 1) % len(SIZES)] in (70, "rows") else _path(rng, tree)
            for target in (plain, fixed):
                target.commit(path)
            torch.testing.assert_close(fixed.take_features(), plain.take_features(), rtol=1e-5, atol=1e-5)
            assert fixed.length == plain.length
            for f, p in zip(_entries(fixed.cache, fixed.length), _entries(plain.cache, plain.length)):
                torch.testing.assert_close(f, p, rtol=1e-5, atol=1e-6)
    return plain, static


def _drive(target: BatchTarget, seed: int) -> list[torch.Tensor]:
    """A batch's life, scripted: rows admitted (one, then two more: its buffers grow), trees of
    random sizes verified (three too wide for a shape) and random paths kept, finished rows
    dropped (at fixed shapes left in place: then a row admitted, the cache compacted, two drops
    in a row and a forward too wide for a shape each read the cache by row)."""
    rng = random.Random(seed)
    target.keep_features = True
    prompts = [repetitive_prompt(rng, VOCAB, n) for n in (30, 12, 55, 20)]
    out = list(target.admit_many(prompts[:1], [None]))
    for step in range(16):
        if step == 2:
            out += target.admit_many(prompts[1:3], [None, None])
        if step == 6:
            target.drop([1, 2])
        if step == 7:
            out += target.admit_many(prompts[3:], [None])
        if step == 9:
            target.rearrange()
        if step == 11:
            target.drop([0, 2])
        if step == 13:
            target.drop([1])
        trees = [_tree(rng, rng.choice([0, 1, 4, 7, 12, 20])) for _ in range(target.rows)]
        if step in (4, 10, 14):  # wider than any shape: the plain forward, between fixed-shape ones
            trees[0] = _tree(rng, 70)
        verified = target.verify([rng.randrange(VOCAB) for _ in trees], trees)
        out += [verified.row(b) for b in range(target.rows)]
        target.commit([_path(rng, t) for t in trees])
        out += [f for b in range(target.rows) if (f := target.take_features(b)) is not None]
    return out


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_a_batch_at_fixed_shapes_equals_the_plain_forward(family):
    """Oracle: a plain `BatchTarget` driven through the same script: every logit and feature."""
    model = tiny_model(family, seed=4)
    expected = _drive(BatchTarget(model), 3)
    fixed = BatchTarget(model)
    static = fixed.use_graphs(capture=False)
    got = _drive(fixed, 3)
    assert [g.shape for g in got] == [e.shape for e in expected]
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-5)
    assert static.made > 2 and static.unbucketed == 3


@pytest.fixture
def fresh_plans(monkeypatch):
    """Width plans (`static_verify.plan_widths`) made in a test stay in it."""
    monkeypatch.setattr(static_verify, "_WIDTHS", type(static_verify._WIDTHS)())


# replay costs by block width that send every bucket to 64 (all cheaper the wider), or only 8 and
# 16 to 32 (the two GPU visits' shape: 8 and 16 dearer than 32 and 64)
ALL_TO_64 = {w: 8.0 - i for i, w in enumerate(static_verify.WIDTHS)}
MIDDLE_TO_32 = {1: 1.0, 2: 1.1, 4: 1.3, 8: 2.5, 16: 2.7, 32: 1.8, 64: 2.0}


def test_each_bucket_runs_at_the_cheapest_bucket_at_least_as_wide():
    assert static_verify.wider_widths(MIDDLE_TO_32) == {1: 1, 2: 2, 4: 4, 8: 32, 16: 32, 32: 32, 64: 64}
    assert static_verify.wider_widths(ALL_TO_64) == {w: 64 for w in static_verify.WIDTHS}
    assert static_verify.wider_widths({8: 1.0, 16: 0.97}) == {8: 8, 16: 16}  # within the margin: its own
    assert static_verify.wider_widths({8: 1.0, 16: 0.9, 32: 0.9}) == {8: 16, 16: 16, 32: 32}  # a tie: the narrower
    assert static_verify.wider_widths({}) == {}


@pytest.mark.parametrize("costs", [ALL_TO_64, MIDDLE_TO_32], ids=["all-to-64", "middle-to-32"])
def test_blocks_padded_wider_equal_the_plain_forward(costs, fresh_plans):
    """Oracle: as `test_one_sequence_at_fixed_shapes_equals_the_plain_forward` and
    `test_a_batch_at_fixed_shapes_equals_the_plain_forward`, with each block padded to the bucket
    a width plan names (where the buffers have room): every logit, feature and cache entry."""
    model = tiny_model("llama", seed=2)
    plan = static_verify.plan_widths(model, 1, costs)
    _, static = _one_sequence_side_by_side(model)
    widths = {shape.width for shape in static._shapes}
    assert widths and widths <= set(plan.values())  # only the buckets the plan runs at
    assert ("8 as 32" in static.report()) == (plan[8] == 32)
    static_verify.plan_widths(model, 4, costs)  # a batch of up to 4 rows (`_drive` pads its rows to powers of two)
    expected = _drive(BatchTarget(model), 3)
    batched = BatchTarget(model)
    shared = batched.use_graphs(capture=False)
    got = _drive(batched, 3)
    for g, e in zip(got, expected, strict=True):
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-5)
    assert {shape.width for shape in shared._shapes} <= set(plan.values())


def test_a_plan_pads_no_block_past_the_buffers_and_serves_fewer_rows_not_more(fresh_plans):
    """A block is padded wider only where the cache's buffers hold it (else its own bucket: growing
    them would drop every graph); rows with no plan of their own take the plan of the fewest rows
    above them, and more rows than any plan covers are not padded."""
    model = tiny_model("llama", seed=2)
    static_verify.plan_widths(model, 4, ALL_TO_64)
    target = TargetModel(model)
    static = target.use_graphs(capture=False)
    target.prefill(list(range(1, 30)))
    capacity = target.cache.layers[0]._keys.shape[-2]
    assert static._width(target.cache, 10, 5, 1) == 64 and static._width(target.cache, 10, 5, 4) == 64
    assert static._width(target.cache, capacity - 20, 5, 1) == 8  # no room for 64 slots
    assert static._width(target.cache, 10, 5, 8) == 8  # more rows than the plan was measured at


@pytest.mark.parametrize("drafter", ["trie", "eagle+search"])
def test_an_engine_pads_blocks_as_its_replayed_calibration_planned(tiny, tiny_eagle, tiny_datastore, prompts_and_expected, drafter,  # noqa: F811
                                                                   tmp_path, monkeypatch, fresh_plans):
    """`Engine(target_graphs=True)` times each bucket's replay (here: stood in, every bucket
    cheaper the wider), and its verifications, one sequence and a batch of 4, then run padded to
    64 wide: every row equal to plain greedy, and no shape of another width."""
    from ngspec.engine import Engine
    from ngspec.models import LoadedModel
    from ngspec.perf import costs

    monkeypatch.setenv("NGSPEC_CACHE", str(tmp_path))
    monkeypatch.setattr(static_verify, "_BATCHES", type(static_verify._BATCHES)())
    monkeypatch.setattr(costs, "measure_replay_costs", lambda target, n, batch, progress: dict(ALL_TO_64))
    engine = Engine(LoadedModel(tiny, None, "tiny"), target_graphs=True)
    engine.eos = frozenset()  # as `hf_greedy`: no end of sequence
    prompts, expected = prompts_and_expected
    opts = DrafterOptions(k=3, w=3, search_depth=6, deepen=True)
    new = lambda: make_drafter(drafter, opts, None, tiny_eagle, tiny_datastore)  # noqa: E731
    assert [engine.run(p, new(), DecodeConfig(max_new_tokens=30)).token_ids for p in prompts[:3]] == expected[:3]
    results, _ = engine.run_batch(prompts, new, DecodeConfig(max_new_tokens=30), BatchConfig(4, 3))
    assert [r.generation.token_ids for r in results] == expected
    assert static_verify.planned_widths(tiny) == {1: dict.fromkeys(static_verify.WIDTHS, 64), 4: dict.fromkeys(static_verify.WIDTHS, 64)}
    for static in (engine.target.static, static_verify.batches_static(tiny)):
        assert {shape.width for shape in static._shapes} == {64}
        assert "blocks padded wider: 1 row: 1 as 64" in static.report()


def _plain_and_fixed(model) -> list[tuple[str, BatchTarget]]:
    """A plain `BatchTarget` and one at fixed shapes (uncaptured), by name."""
    fixed = BatchTarget(model)
    fixed.use_graphs(capture=False)
    return [("plain", BatchTarget(model)), ("fixed", fixed)]


def test_at_fixed_shapes_a_drop_moves_no_cache_row():
    """A finished row's buffer row becomes padding where it is: the drop reorders the rows'
    records only (the plain layout moves the last rows into the gaps, four operations a layer)."""
    model = tiny_model("llama", seed=4)
    ops = {}
    for name, target in _plain_and_fixed(model):
        rng = random.Random(0)
        target.admit_many([repetitive_prompt(rng, VOCAB, n) for n in (30, 12, 55, 20)], [None] * 4)
        target.verify([1, 2, 3, 4], [_tree(rng, 3) for _ in range(4)])
        target.commit([[], [0], [], []])
        ops[name] = tensor_ops(lambda: target.drop([1, 3]))
        assert target.lengths == [21, 14]  # row 3 (20 tokens and a root) took row 0's place
    assert ops["fixed"] <= 2 < 4 * len(model.model.layers) <= ops["plain"]


@pytest.mark.parametrize("family", ["llama", "qwen2"])
@pytest.mark.parametrize("then", ["compact", "admit"])
def test_at_fixed_shapes_the_last_rows_finishing_then_a_compaction_or_an_admission_equals_the_plain_forward(family, then):
    """The last rows finish (the others stay in buffer rows 0, 1, ...: nothing to move), and the
    next step compacts before it verifies, or a request fed to the batch comes in a new row. The
    layers once kept the row count of the last forward, one more than the batch's: the compaction
    crashed (a randomised search found it: an index of 3 rows against keys of 4), and the
    admission added its row after that count (its output came out right all the same). Oracle: a
    plain `BatchTarget` through the same steps."""
    model = tiny_model(family, seed=4)
    out = {}
    for name, target in _plain_and_fixed(model):
        rng = random.Random(0)
        target.admit_many([repetitive_prompt(rng, VOCAB, n) for n in (30, 12, 55, 20)], [None] * 4)
        got = []
        for keep in ([0, 1, 2], [0]):
            trees = [_tree(rng, 5) for _ in range(target.rows)]
            got += [target.verify([1] * target.rows, trees).row(b) for b in range(target.rows)]
            target.commit([[0, 1], []] + [[]] * (target.rows - 2))
            target.drop(keep)
            if then == "compact":
                target.rearrange()
                assert target.slots == max(target.lengths)
            else:
                got += target.admit_many([repetitive_prompt(rng, VOCAB, 25)], [None])
                assert target.rows == len(keep) + 1
        trees = [_tree(rng, 3) for _ in range(target.rows)]
        got += [target.verify([2] * target.rows, trees).row(b) for b in range(target.rows)]
        out[name] = got
    for f, p in zip(out["fixed"], out["plain"], strict=True):
        torch.testing.assert_close(f, p, rtol=1e-5, atol=1e-5)


def test_at_fixed_shapes_compaction_waits_until_it_lowers_the_attended_slots():
    """A fixed-shape forward attends a power of two of slots, holes or not, and compacting into
    the same buffers frees no memory: the check says no until the cache crosses into the next
    power of two while its live entries fit below it. The plain layout compacts at the share."""
    model = tiny_model("llama", seed=4)
    seen = {}
    for name, target in _plain_and_fixed(model):
        rng = random.Random(0)
        target.admit_many([repetitive_prompt(rng, VOCAB, n) for n in (100, 40)], [None, None])
        seen[name] = []
        while target.slots < 300:
            target.verify([1, 2], [_tree(rng, 12), _tree(rng, 12)])
            target.commit([[], []])  # the roots kept: 12 holes a row a step
            seen[name].append((target.slots, target.compaction_pays(0.2)))
    assert seen["plain"][3] == (152, True) and not any(pays for _, pays in seen["plain"][:2])
    assert all(pays == (slots >= 256) for slots, pays in seen["fixed"])  # 256 slots and the next root: 512 attended
    assert target.compaction_pays(0.0) and not target.compaction_pays(0.9)  # the share still has its say
    target.rearrange()
    assert target.slots == max(target.lengths) < 256 and not target.compaction_pays(0.0)


@pytest.mark.parametrize("drafter", list(REGISTRY))
def test_generations_at_fixed_shapes_match_plain_greedy(tiny, tiny_tables, tiny_eagle, tiny_datastore, drafter):  # noqa: F811
    rng = random.Random(1)
    target = TargetModel(tiny)
    target.use_graphs(capture=False)
    opts = DrafterOptions(num_draft=4, trie_update=True, ngram_n=5, prefix_len=2, k=3, w=4, search_depth=6, deepen=True)
    for case in range(4):
        prompt = repetitive_prompt(rng, VOCAB, rng.randrange(5, 120))
        expected = hf_greedy(tiny, prompt, 40)
        store = tiny_datastore if case % 2 else None
        got = generate(target, make_drafter(drafter, opts, tiny_tables, tiny_eagle, store), prompt, DecodeConfig(max_new_tokens=40))
        assert got.token_ids == expected, f"{drafter} case {case}"


@pytest.mark.parametrize("batch_size, rearrange", [(1, 0), (4, 3), (8, 1)])
@pytest.mark.parametrize("drafter", list(REGISTRY))
def test_batches_at_fixed_shapes_match_plain_greedy(tiny, tiny_tables, tiny_eagle, tiny_datastore, prompts_and_expected, drafter, batch_size, rearrange):  # noqa: F811
    prompts, expected = prompts_and_expected
    opts = DrafterOptions(k=3, w=3, search_depth=6, deepen=True)
    results, report = generate_batch(
        tiny, prompts, lambda: make_drafter(drafter, opts, tiny_tables, tiny_eagle, tiny_datastore),
        DecodeConfig(max_new_tokens=30), BatchConfig(batch_size, rearrange, target_graphs=True), lambda: Stopper(frozenset()),
    )
    assert [r.generation.token_ids for r in results] == expected
    assert "0 captured" in report.target_graphs  # off a GPU the fixed shapes run uncaptured


def _capturing(monkeypatch, fail: bool = False) -> StandInGraphs:
    """The stand-in for captures, and every `StaticVerify` made capturing (off a GPU they would not)."""
    standin = StandInGraphs(monkeypatch, fail)
    made = static_verify.StaticVerify.__init__

    def capturing(self, model, capture):
        made(self, model, True)

    monkeypatch.setattr(static_verify.StaticVerify, "__init__", capturing)
    monkeypatch.setattr(static_verify, "_BATCHES", type(static_verify._BATCHES)())
    return standin


def test_captured_verification_replays_into_its_buffers(tiny, prompts_and_expected, monkeypatch):  # noqa: F811
    """With captures standing in for CUDA graphs (outputs NaN until replayed, host reads and
    copies refused): one sequence and batches equal plain greedy; each shape runs eagerly first and
    is captured at its second run, once; a second batch makes no new shape, and a third captures
    nothing (it replays the graphs of the batches before it)."""
    _capturing(monkeypatch)
    prompts, expected = prompts_and_expected
    target = TargetModel(tiny)
    static = target.use_graphs()
    for prompt, want in zip(prompts[:4], expected):
        got = generate(target, make_drafter("trie", DrafterOptions(), None, None, None), prompt, DecodeConfig(max_new_tokens=30))
        assert got.token_ids == want
    graphs = static.graphs
    assert graphs.failure is None and 0 < graphs.captures <= static.made and graphs.replays > 2 * graphs.captures
    assert graphs.cold == static.made + graphs.captures  # each shape's first run, and each capture

    def batch():
        results, _ = generate_batch(tiny, prompts, lambda: make_drafter("trie", DrafterOptions(), None, None, None),
                                    DecodeConfig(max_new_tokens=30), BatchConfig(4, 3, target_graphs=True), lambda: Stopper(frozenset()))
        assert [r.generation.token_ids for r in results] == expected

    batch()
    shared = static_verify.batches_static(tiny)
    made = shared.made
    assert shared.graphs.failure is None and shared.graphs.captures > 0
    batch()
    captured, replays = shared.graphs.captures, shared.graphs.replays
    assert shared.made == made and captured <= made and replays > 2 * captured
    batch()
    assert shared.graphs.captures == captured and shared.graphs.replays > replays


def test_the_loops_learn_step_costs_from_replayed_verifications_only(tiny, prompts_and_expected, monkeypatch):  # noqa: F811
    """A verification at a new fixed shape (its first run, eager; its second, the capture) takes
    many times a replay, so the loops leave it out of the step times they learn verify costs from
    (`StepTimes`): one sequence and a batch record exactly their other steps."""
    import ngspec.batch as batch_module
    import ngspec.decode as decode_module
    from ngspec.perf.online import StepTimes

    recorded = []

    class Counted(StepTimes):
        def record(self, cost, seconds):
            recorded.append(cost)
            super().record(cost, seconds)

    monkeypatch.setattr(decode_module, "StepTimes", Counted)
    monkeypatch.setattr(batch_module, "StepTimes", Counted)
    _capturing(monkeypatch)
    prompts, expected = prompts_and_expected
    target = TargetModel(tiny)
    static = target.use_graphs()
    got = generate(target, make_drafter("trie", DrafterOptions(), None, None, None), prompts[0], DecodeConfig(max_new_tokens=30))
    assert got.token_ids == expected[0] and static.graphs.cold > 0
    assert len(recorded) == len(got.stats.steps) - 1 - static.graphs.cold  # every step but the prefill and the cold ones
    recorded.clear()
    results, report = generate_batch(tiny, prompts, lambda: make_drafter("trie", DrafterOptions(), None, None, None),
                                     DecodeConfig(max_new_tokens=30), BatchConfig(4, 3, target_graphs=True), lambda: Stopper(frozenset()))
    shared = static_verify.batches_static(tiny)
    assert [r.generation.token_ids for r in results] == expected and shared.graphs.cold > 0
    assert len(recorded) == report.steps - shared.graphs.cold


def test_a_batch_at_fixed_shapes_compacts_rather_than_outgrow_its_buffers(tiny, prompts_and_expected, monkeypatch):  # noqa: F811
    """Each step appends a block as wide as the widest row's, so a batch's slots fill with holes;
    where the next block would outgrow the cache's buffers and compacting makes room, the batch
    compacts (into the same buffers) instead of growing them, which would drop every captured
    graph. With 96 slots of room beyond each admission (more than a row's 30 new tokens and a
    block of up to 64) and no periodic compaction, the buffers are never replaced, and every row equals plain
    greedy."""
    from ngspec import batch_target, kv
    from ngspec.cuda_graphs import Graphs

    monkeypatch.setattr(batch_target, "make_cache", lambda config, capacity: kv.make_cache(config, capacity - 512 + 96))
    drops = []
    dropped = Graphs.dropped
    monkeypatch.setattr(Graphs, "dropped", lambda self: (drops.append(1), dropped(self)))
    grown = []
    make_room = kv.GrowableLayer.make_room

    def counted(layer, rows, size):
        before = layer._keys.shape
        make_room(layer, rows, size)
        grown.append(layer._keys.shape != before)

    monkeypatch.setattr(kv.GrowableLayer, "make_room", counted)
    _capturing(monkeypatch)
    prompts, expected = prompts_and_expected
    results, report = generate_batch(tiny, prompts, lambda: make_drafter("trie", DrafterOptions(), None, None, None),
                                     DecodeConfig(max_new_tokens=30), BatchConfig(4, 0, target_graphs=True), lambda: Stopper(frozenset()))
    assert [r.generation.token_ids for r in results] == expected
    assert report.rearrangements > 0 and not any(grown) and len(drops) == 1  # the first verification's buffers


def test_a_batchs_captured_shapes_share_one_output_per_row_count(monkeypatch):
    """Every captured shape writes its logits and features into one buffer per row count, so a
    shape keeps no output of its own (before, each kept rows x width x vocabulary floats); under
    the stand-in for captures the batch oracle's script still gives every logit and feature."""
    _capturing(monkeypatch)
    model = tiny_model("llama", seed=4)
    expected = _drive(BatchTarget(model), 3)
    fixed = BatchTarget(model)
    static = fixed.use_graphs()
    got = _drive(fixed, 3)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-5)
    captured = [(shape, inputs.graph.out) for shape, inputs in static._shapes.items() if inputs.graph.graph is not None]
    rows = {shape.rows for shape, _ in captured}
    assert static.graphs.failure is None and len(captured) > len(rows)
    for what in (0, 1):  # logits, features
        assert len({out[what].untyped_storage().data_ptr() for _, out in captured}) == len(rows)
    vocab, hidden = model.config.vocab_size, model.config.hidden_size
    assert static.output_bytes() <= sum(r * static_verify.MOST_WIDTH * (vocab + hidden) * 4 for r in {s.rows for s in static._shapes})
    assert "outputs" in static.report()


def test_a_refused_capture_warns_once_and_verification_goes_on_uncaptured(tiny, prompts_and_expected, monkeypatch):  # noqa: F811
    _capturing(monkeypatch, fail=True)
    prompts, expected = prompts_and_expected
    target = TargetModel(tiny)
    static = target.use_graphs()
    with pytest.warns(UserWarning, match="the target's verification cannot be captured") as caught:
        for prompt, want in zip(prompts[:3], expected):
            got = generate(target, make_drafter("trie", DrafterOptions(), None, None, None), prompt, DecodeConfig(max_new_tokens=30))
            assert got.token_ids == want
    assert len(caught) == 1
    assert "operation not permitted" in static.graphs.failure and static.graphs.captures == static.graphs.replays == 0


def test_what_fixed_shapes_cannot_follow_is_refused_in_one_line():
    with pytest.raises(NgspecError, match="sliding-window layers"):
        TargetModel(family_model("mistral")).use_graphs()
    with pytest.raises(NgspecError, match="leave out --batch-layout packed"):
        BatchTarget(tiny_model("llama", seed=0), packed=True).use_graphs()


def test_target_graphs_need_a_gpu_in_the_cli(tmp_path):
    from typer.testing import CliRunner

    from ngspec.cli.app import app

    prompts = tmp_path / "p.txt"
    prompts.write_text("hello")
    tune = ["tune-tree", "--eagle-head", str(tmp_path), "--out", str(tmp_path / "shape.json")]
    for command in (["generate", "--prompt-file", str(prompts)], ["bench", "-q", str(prompts)], tune):
        result = CliRunner().invoke(app, [*command, "--target-graphs", "--device", "cpu", "--model", str(tmp_path / "no-model")])
        assert result.exit_code != 0
        assert "--target-graphs needs a CUDA GPU" in result.output  # before the model (which does not exist) loads
        assert "Traceback" not in result.output


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_captured_verification_equals_plain_greedy_on_a_gpu():
    """On a GPU: captured replays against the same fixed shapes uncaptured, step by step, and a
    sequence's and a batch's generations against plain greedy decoding."""
    model = tiny_model("llama", seed=4).cuda()
    expected = _drive(BatchTarget(model), 3)
    fixed = BatchTarget(model)
    static = fixed.use_graphs(capture=True)
    got = _drive(fixed, 3)
    assert static.graphs.failure is None and static.graphs.captures > 0
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-4)
    rng = random.Random(2)
    prompts = [repetitive_prompt(rng, VOCAB, rng.randrange(5, 100)) for _ in range(6)]
    want = [hf_greedy(model, p, 30) for p in prompts]
    target = TargetModel(model)
    target.use_graphs(capture=True)
    for prompt, w in zip(prompts, want):
        assert generate(target, make_drafter("trie", DrafterOptions(), None, None, None), prompt, DecodeConfig(max_new_tokens=30)).token_ids == w
    results, _ = generate_batch(model, prompts, lambda: make_drafter("trie", DrafterOptions(), None, None, None),
                                DecodeConfig(max_new_tokens=30), BatchConfig(4, 3, target_graphs=True), lambda: Stopper(frozenset()))
    assert [r.generation.token_ids for r in results] == want
