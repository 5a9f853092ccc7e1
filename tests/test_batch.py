"""Batched generation: every row equals its own plain greedy decoding, for every drafter, batch
sizes 1, 4 and 8, with and without cache rearrangement; the cache bookkeeping itself."""

import random
from types import SimpleNamespace
from typing import Callable

import pytest
import torch

from conftest import hf_greedy, repetitive_prompt, started_head, tensor_ops
import ngspec.batch as batch_module
from ngspec.batch import BatchConfig, generate_batch
from ngspec.batch_target import ROW_ALONE, BatchTarget, choose_split, fold_mask, folded_gqa_attention
from ngspec.tree import additive_mask
from ngspec.contracts import DraftTree
from ngspec.decode import DecodeConfig, Stopper
from ngspec.drafters import REGISTRY, DrafterOptions, make_drafter
from ngspec.errors import NgspecError
from ngspec.perf.online import StepTimes
from test_lossless import VOCAB, tiny_datastore, tiny_eagle, tiny_tables  # noqa: F401 (fixtures)


@pytest.fixture(scope="module")
def prompts_and_expected(tiny):
    rng = random.Random(5)
    prompts = [repetitive_prompt(rng, VOCAB, rng.randrange(3, 90)) for _ in range(9)]
    return prompts, [hf_greedy(tiny, p, 30) for p in prompts]


# each batch size in one layout, so that both meet every drafter and every compaction period (the
# other four pairs doubled this matrix; tests/test_fuzz_lossless.py draws them all)
@pytest.mark.parametrize(
    "batch_size, rearrange, layout", [(1, 0, "packed"), (4, 3, "padded"), (8, 1, "packed"), (8, 0, "padded")]
)
@pytest.mark.parametrize("drafter", list(REGISTRY))
def test_every_row_matches_its_own_plain_greedy(tiny, tiny_tables, tiny_eagle, tiny_datastore, prompts_and_expected, drafter, batch_size, rearrange, layout):
    prompts, expected = prompts_and_expected
    opts = DrafterOptions(k=3, w=3, search_depth=6, deepen=True)
    results, report = generate_batch(
        tiny, prompts, lambda: make_drafter(drafter, opts, tiny_tables, tiny_eagle, tiny_datastore),
        DecodeConfig(max_new_tokens=30), BatchConfig(batch_size, rearrange, 0.0, layout=layout), lambda: Stopper(frozenset()),
    )
    for i, (result, want) in enumerate(zip(results, expected)):
        assert result.error is None
        assert result.generation.token_ids == want, f"{drafter} prompt {i}"
    assert report.new_tokens == sum(len(w) for w in expected)
    if rearrange:
        assert report.rearrangements == report.steps // rearrange


STEEP_BATCH_COST = (1.0, 1.1, 1.4, 1.5, 1.7, 1.9) + (2.5,) * 60


@pytest.mark.parametrize("layout", ["packed", "padded"])
@pytest.mark.parametrize("joint", [True, False], ids=["joint-sizing", "rows-alone"])
@pytest.mark.parametrize("drafter", ["trie", "search", "eagle", "eagle+search"])
def test_rows_sized_together_still_match_their_own_plain_greedy(tiny, tiny_eagle, tiny_datastore, prompts_and_expected, drafter, joint, layout):
    prompts, expected = prompts_and_expected
    opts = DrafterOptions(search_depth=6, deepen=True)
    results, _ = generate_batch(
        tiny, prompts, lambda: make_drafter(drafter, opts, None, tiny_eagle, tiny_datastore),
        DecodeConfig(max_new_tokens=30), BatchConfig(4, 3, joint_sizing=joint, layout=layout), lambda: Stopper(frozenset()),
        verify_cost=lambda context: STEEP_BATCH_COST,
    )
    for i, (result, want) in enumerate(zip(results, expected)):
        assert result.generation.token_ids == want, f"{drafter} prompt {i}"


class OracleDrafter:
    """Offers the true continuation, best first, with made-up gains; records what it kept."""

    name = "oracle"

    def __init__(self, truth: dict[tuple[int, ...], list[int]], gains: list[float] | Callable[[list[int]], list[float]]) -> None:
        self.truth, self.gains, self.kept = truth, gains, []

    def start(self, prompt):
        self.prompt, self.out = list(prompt), []

    def propose(self, ctx):
        assert ctx.engine_sizes
        rest = self.truth[tuple(self.prompt)][len(self.out) :]
        gains = self.gains(self.prompt) if callable(self.gains) else self.gains
        n = min(len(gains), len(rest))
        return DraftTree.chain(rest[:n], gains[:n])

    def keep(self, size):
        self.kept.append(size)

    def observe(self, new_tokens):
        self.out.extend(new_tokens)


def oracles(truth, kind=None):
    """A drafter factory making ``kind`` (an `OracleDrafter`) with gains 0.9, 0.6, 0.3, 0.1, and
    the list of the drafters it made."""
    made_drafters = []

    def new_drafter():
        made_drafters.append((kind or OracleDrafter)(truth, [0.9, 0.6, 0.3, 0.1]))
        return made_drafters[-1]

    return made_drafters, new_drafter


def test_one_width_for_the_batch_from_every_rows_gains(tiny, prompts_and_expected):
    prompts, expected = prompts_and_expected
    truth = {tuple(p): e for p, e in zip(prompts, expected)}
    drafters, new_drafter = oracles(truth)
    # four rows: width 0 -> 4 / 1.0, 1 -> 7.6 / 1.1 = 6.9, 2 -> 10.0 / 1.4 = 7.1, 3 -> 11.2 / 1.5
    # = 7.5, 4 -> 11.6 / 1.7 = 6.8: three nodes each
    results, report = generate_batch(
        tiny, prompts[:4], new_drafter, DecodeConfig(max_new_tokens=30), BatchConfig(4, 0, layout="padded"), lambda: Stopper(frozenset()),
        verify_cost=lambda context: STEEP_BATCH_COST,
    )
    assert [r.generation.token_ids for r in results] == expected[:4]
    assert all(d.kept and set(d.kept) == {3} for d in drafters)
    first = [r.generation.stats.steps[1] for r in results]
    assert all(s.tree_size == 3 and s.accepted == 4 for s in first)
    assert all(s.verify_cost == STEEP_BATCH_COST[3] for s in first)  # the batched step's cost, width 3
    widths = [max(r.generation.stats.steps[i].tree_size for r in results if len(r.generation.stats.steps) > i) for i in range(1, report.steps + 1)]
    assert report.cost_units == pytest.approx(sum(STEEP_BATCH_COST[w] for w in widths))
    rows = [sum(len(r.generation.stats.steps) > i for r in results) for i in range(1, report.steps + 1)]
    assert report.row_steps == sum(rows) and report.padded_nodes == sum(n * w for n, w in zip(rows, widths))
    assert report.as_dict()["padded_nodes_per_row"] == pytest.approx(report.padded_nodes / report.row_steps)


def test_packed_rows_each_keep_the_nodes_that_pay_for_their_share(tiny, prompts_and_expected):
    """Packed, a step costs by the rows' total nodes (the table read at the mean per row), so a row
    with a likely branch verifies it while the others verify none; padded, the same trees get one
    width that every row pays for."""
    prompts, expected = prompts_and_expected
    truth = {tuple(p): e for p, e in zip(prompts, expected)}
    sure = tuple(prompts[0])

    def gains(prompt):
        return [0.95, 0.9, 0.9, 0.9, 0.9] if tuple(prompt) == sure else [0.3, 0.1, 0.1, 0.1, 0.1]

    kept = {}
    for layout in ("packed", "padded"):
        results, _ = generate_batch(
            tiny, prompts[:4], lambda: OracleDrafter(truth, gains), DecodeConfig(max_new_tokens=30), BatchConfig(4, 0, layout=layout), lambda: Stopper(frozenset()),
            verify_cost=lambda context: STEEP_BATCH_COST,
        )
        assert [r.generation.token_ids for r in results] == expected[:4]
        first = [r.generation.stats.steps[1] for r in results]
        kept[layout] = [s.tree_size for s in first]
        assert len({s.verify_cost for s in first}) == 1
        kept[layout + " cost"] = first[0].verify_cost
    # packed, the first step adds nodes best first: the sure row's five nodes, at a mean of 1.25
    # per row, cost 1.1 + 0.25 * 0.3 = 1.175, and 0.06 (`ROW_ALONE`) for the row attended on its
    # own: (4 + 4.55) / 1.235 = 6.92 expected tokens per unit; four nodes give 7.65 / 1.16 = 6.59,
    # and a 0.3 node more (a second row alone) 8.85 / (1.25 + 0.12) = 6.46
    assert ROW_ALONE == 0.06
    assert kept["packed"] == [5, 0, 0, 0]
    assert kept["packed cost"] == pytest.approx(1.235)
    # padded, every row pays each level: widths 0..5 give 4, 5.85 / 1.1 = 5.32, 7.05 / 1.4 = 5.04,
    # 8.25 / 1.5 = 5.5, 9.45 / 1.7 = 5.56, 10.65 / 1.9 = 5.61: five nodes for every row
    assert kept["padded"] == [5, 5, 5, 5] and kept["padded cost"] == STEEP_BATCH_COST[5]


class SteeperSteps(StepTimes):
    """Stands in for a batch's learned step times: its steps showed three times the table's extra
    cost. Records what it was told."""

    def __init__(self) -> None:
        super().__init__()
        self.scale, self.recorded = 3.0, []
        made.append(self)

    def record(self, cost, seconds):
        self.recorded.append((cost, seconds))


made: list[SteeperSteps] = []


@pytest.mark.parametrize("learn", [True, False], ids=["learned", "table"])
def test_the_batch_sizes_trees_by_its_own_step_times(tiny, prompts_and_expected, monkeypatch, learn):
    prompts, expected = prompts_and_expected
    truth = {tuple(p): e for p, e in zip(prompts, expected)}
    seen = []

    class Recording(OracleDrafter):
        def propose(self, ctx):
            seen.append(ctx.verify_cost)
            return super().propose(ctx)

    drafters, new_drafter = oracles(truth, Recording)
    made.clear()
    monkeypatch.setattr(batch_module, "StepTimes", SteeperSteps)
    # learned, extra cost x3: 1.0, 1.3, 2.2, 2.5, 3.1; four rows: width 0 -> 4 / 1.0, 1 -> 7.6 /
    # 1.3 = 5.8, 2 -> 10.0 / 2.2 = 4.5, 3 -> 11.2 / 2.5 = 4.5: one node each (the table: three)
    results, report = generate_batch(
        tiny, prompts[:4], new_drafter, DecodeConfig(max_new_tokens=30, learn_costs=learn), BatchConfig(4, 0),
        lambda: Stopper(frozenset()), verify_cost=lambda context: STEEP_BATCH_COST,
    )
    assert [r.generation.token_ids for r in results] == expected[:4]
    width = 1 if learn else 3
    assert all(d.kept and set(d.kept) == {width} for d in drafters)
    corrected = tuple(1.0 + 3.0 * (c - 1.0) for c in STEEP_BATCH_COST)
    assert all(c == (corrected if learn else STEEP_BATCH_COST) for c in seen)
    (times,) = made
    assert len(times.recorded) == report.steps
    assert all(s > 0 for _, s in times.recorded)
    assert times.recorded[0][0] == STEEP_BATCH_COST[width]  # the measured table's cost, and the time
    assert results[0].generation.stats.steps[1].verify_cost == STEEP_BATCH_COST[width]  # reports use the measured table


def test_a_drained_batch_fits_its_step_times_per_number_of_rows(tiny, prompts_and_expected, monkeypatch):
    """Once no prompt waits the batch runs fewer rows, whose steps cost less: each row count's
    steps go to a fit of their own, and each step is sized by its own row count's fit. Here the
    four rows' fit reads every node at three times the table's extra cost (one node each, as
    above), the lone fifth row's reads nodes as free (every node offered)."""
    prompts, expected = prompts_and_expected
    truth = {tuple(p): e for p, e in zip(prompts, expected)}
    drafters, new_drafter = oracles(truth)

    class Fit(SteeperSteps):
        def __init__(self) -> None:
            super().__init__()
            self.scale = (3.0, 0.0)[len(made) - 1]

    made.clear()
    monkeypatch.setattr(batch_module, "StepTimes", Fit)
    results, report = generate_batch(
        tiny, prompts[:5], new_drafter, DecodeConfig(max_new_tokens=30), BatchConfig(4, 0), lambda: Stopper(frozenset()),
        verify_cost=lambda context: STEEP_BATCH_COST,
    )
    assert [r.generation.token_ids for r in results] == expected[:5]
    four, alone = made  # four rows, then the fifth prompt alone
    steps = [len(r.generation.stats.steps) - 1 for r in results]  # each row's verify steps
    assert len(set(steps[:4])) == 1 and len(four.recorded) == steps[0]
    assert len(alone.recorded) == steps[4] and report.steps == steps[0] + steps[4]
    assert all(set(d.kept) == {1} for d in drafters[:4])
    assert all(s.tree_size == 4 for s in results[4].generation.stats.steps[1:-1])


def test_a_finished_row_hands_its_slot_to_the_next_prompt_and_stops_alone(tiny, prompts_and_expected):
    prompts, expected = prompts_and_expected
    eos = expected[0][5]
    finished = []
    results, _ = generate_batch(
        tiny, prompts, lambda: make_drafter("trie"), DecodeConfig(max_new_tokens=30), BatchConfig(3),
        lambda: Stopper(frozenset({eos})), on_finish=lambda r: finished.append(r.index),
    )
    for result, prompt in zip(results, prompts):
        assert result.generation.token_ids == hf_greedy(tiny, prompt, 30, eos=eos)
    assert sorted(finished) == list(range(len(prompts)))
    assert finished != list(range(len(prompts)))  # rows finished out of order and were refilled


@pytest.mark.parametrize("fed", [False, True])
def test_a_batch_size_far_above_the_prompts_takes_rows_for_those_that_wait(tiny, prompts_and_expected, fed):
    """``--batch-size`` is a cap: with 10**12 and three prompts (given, or fed while the batch
    runs as a server feeds them) the batch took a list of 10**12 new-row slots and ended in a
    MemoryError."""
    from ngspec.batch import Request
    from ngspec.verify import SamplingConfig

    prompts, expected = prompts_and_expected
    later = [Request(i, prompts[i], 30, SamplingConfig(), Stopper(frozenset())) for i in (1, 2)] if fed else []
    results, _ = generate_batch(
        tiny, prompts[:1] if fed else prompts[:3], lambda: make_drafter("trie"), DecodeConfig(max_new_tokens=30), BatchConfig(10**12),
        lambda: Stopper(frozenset()), feed=(lambda: [later.pop()] if later else []) if fed else None,
    )
    assert [r.generation.token_ids for r in results] == expected[:3]


@pytest.mark.parametrize("max_new_tokens", [1, 2])
def test_a_budget_spent_by_the_prefill_stops_a_refilled_row_too(tiny, prompts_and_expected, max_new_tokens):
    """A budget of one token is spent by the prefill's token: the prompts admitted into freed
    slots must stop there as the first batch's rows do, not take a step first."""
    prompts, _ = prompts_and_expected
    results, _ = generate_batch(
        tiny, prompts, lambda: make_drafter("trie"), DecodeConfig(max_new_tokens=max_new_tokens), BatchConfig(3), lambda: Stopper(frozenset()),
    )
    for i, (result, prompt) in enumerate(zip(results, prompts)):
        assert result.generation.token_ids == hf_greedy(tiny, prompt, max_new_tokens), f"prompt {i}"
        assert result.generation.finish_reason == "length"


def test_a_prompt_too_long_fails_alone(tiny, prompts_and_expected):
    prompts, expected = prompts_and_expected
    batch = [prompts[0], [1] * 600, prompts[1]]  # the tiny model's window is 512
    results, _ = generate_batch(
        tiny, batch, lambda: make_drafter("trie"), DecodeConfig(max_new_tokens=30), BatchConfig(2), lambda: Stopper(frozenset()),
    )
    assert results[1].generation is None and "context window is 512" in results[1].error
    assert results[0].generation.token_ids == expected[0]
    assert results[2].generation.token_ids == expected[1]


OUTSIDE = r"the prompt holds token id 200, outside the model's vocabulary \(0\.\.95\): was it encoded with another model's tokenizer\?"


def test_a_prompt_with_a_token_outside_the_vocabulary_fails_alone_and_one_at_a_time_in_a_line(tiny, prompts_and_expected):
    """A model given another model's tokenizer: its token ids ended in the embedding's IndexError
    ("index out of range in self")."""
    import re

    from ngspec.decode import generate
    from ngspec.target import TargetModel

    prompts, expected = prompts_and_expected
    results, _ = generate_batch(
        tiny, [prompts[0], [1, 200, 3], prompts[1]], lambda: make_drafter("trie"), DecodeConfig(max_new_tokens=30), BatchConfig(2),
        lambda: Stopper(frozenset()),
    )
    assert results[1].generation is None and re.fullmatch(OUTSIDE, results[1].error)
    assert [results[0].generation.token_ids, results[2].generation.token_ids] == expected[:2]
    with pytest.raises(NgspecError, match=f"^{OUTSIDE}$"):
        generate(TargetModel(tiny), make_drafter("trie"), [5, 200], DecodeConfig(max_new_tokens=4))


def test_batch_size_and_rearrangement_are_validated():
    with pytest.raises(NgspecError, match="--batch-size"):
        BatchConfig(0)
    with pytest.raises(NgspecError, match="--rearrange-every"):
        BatchConfig(2, -1)
    for share in (-0.1, 1.0):
        with pytest.raises(NgspecError, match="--rearrange-min-share"):
            BatchConfig(2, 8, share)


def test_compaction_runs_only_when_it_frees_the_minimum_share(tiny, tiny_datastore, prompts_and_expected, monkeypatch):
    prompts, expected = prompts_and_expected
    seen = []  # (share the check found, slots freed) of every compaction
    original = BatchTarget.rearrange

    def spy(self):
        share, before = self.freeable_share(), self.slots
        original(self)
        seen.append((share, (before - self.slots) * self.rows))

    monkeypatch.setattr(BatchTarget, "rearrange", spy)
    reports = {}
    for min_share in (0.0, 0.1):
        seen.clear()
        results, report = generate_batch(
            tiny, prompts, lambda: make_drafter("search", DrafterOptions(search_depth=6), None, None, tiny_datastore),
            DecodeConfig(max_new_tokens=30), BatchConfig(4, 2, min_share), lambda: Stopper(frozenset()),
        )
        assert [r.generation.token_ids for r in results] == expected
        assert report.rearrangements + report.rearrange_skipped == report.steps // 2
        assert report.rearrangements == len(seen) and all(share >= min_share for share, _ in seen)
        assert report.freed_entries == sum(freed for _, freed in seen)
        reports[min_share] = report
    assert reports[0.0].rearrange_skipped == 0
    assert 0 < reports[0.1].rearrangements < reports[0.0].rearrangements  # some checks freed too little


def test_rearrange_keeps_live_entries_in_order_and_drops_holes(tiny):
    """Compacted, every row's live entries end at the last slot (a sliding-window model's rows
    then share their newest slots, all its sliding layers keep)."""
    target = BatchTarget(tiny)
    target.admit([1, 2, 3, 4, 5])
    target.admit([6, 7])
    trees = [DraftTree((9, 9, 9), (-1, 0, 1)), DraftTree((8,), (-1,))]
    target.verify([5, 7], trees)
    target.commit([(0, 1), ()])
    assert target.lengths == [8, 3]
    before = [layer.keys.clone() for layer in target.cache.layers]
    valid = target.valid.clone()
    assert target.freeable_share() == pytest.approx(1 - 8 / 9)  # the longest row keeps 8 of 9 slots
    buffers = [layer._keys.data_ptr() for layer in target.cache.layers]
    target.rearrange()
    assert target.slots == 8 and target.freeable_share() == 0.0
    for old, layer in zip(before, target.cache.layers):
        for b, n in enumerate(target.lengths):
            live = valid[b].nonzero().flatten()
            assert torch.equal(layer.keys[b, :, 8 - n :], old[b, :, live])  # every row ends at the last slot
    assert target.valid.tolist() == [[True] * 8, [False] * 5 + [True] * 3]
    assert [layer._keys.data_ptr() for layer in target.cache.layers] == buffers  # compacted in place

    target.drop([1])
    assert target.lengths == [3] and target.valid.tolist() == [[False] * 5 + [True] * 3]
    for old, layer in zip(before, target.cache.layers):
        assert torch.equal(layer.keys[0, :, 5:], old[1, :, valid[1].nonzero().flatten()])


def test_rows_are_added_and_dropped_without_copying_the_cache(tiny):
    """Filling a batch of B rows gives the cache's buffers B rows once (when the second comes, not
    one more at each of the 7 admissions after the first),
    and dropping finished rows moves only the kept rows past the new end into their places: every
    kept row keeps its entries, valid map, length and pending features, in the order returned."""
    target = BatchTarget(tiny, rows_wanted=8)
    prompts = [[(7 * i + j) % 90 + 1 for j in range(20 - i)] for i in range(8)]
    grown = 0
    for prompt in prompts:
        before = target.cache.layers[0]._keys.data_ptr() if target.cache is not None else None
        target.admit(prompt)
        grown += before is not None and target.cache.layers[0]._keys.data_ptr() != before
    assert grown == 1 and target.rows == 8 and target.cache.layers[0]._keys.shape[0] == 8
    target.pending = [[torch.full((1, 2), float(b))] for b in range(8)]  # a stand-in per row
    keys = [layer.keys.clone() for layer in target.cache.layers]
    valid, lengths = target.valid.clone(), list(target.lengths)
    buffers = [layer._keys.data_ptr() for layer in target.cache.layers]

    order = target.drop([0, 2, 5, 6, 7])  # rows 1, 3 and 4 finished
    assert order == [0, 5, 2, 6, 7]  # rows 0 and 2 stay; 5, 6 and 7 fill the finished rows' places
    assert [layer._keys.data_ptr() for layer in target.cache.layers] == buffers
    assert target.lengths == [lengths[b] for b in order] and torch.equal(target.valid, valid[order])
    assert [p[0][0, 0].item() for p in target.pending] == [float(b) for b in order]
    for old, layer in zip(keys, target.cache.layers):
        assert torch.equal(layer.keys, old[order])


def test_discard_forgets_the_block_and_batch_costs_are_a_table(tiny):
    from ngspec.perf.costs import measure_batch_costs

    target = BatchTarget(tiny)
    target.admit([1, 2, 3])
    target.admit([4, 5])
    slots, valid = target.slots, target.valid.clone()
    target.verify([3, 5], [DraftTree.chain([7, 8]), DraftTree.chain([9])])
    assert target.slots == slots + 3
    target.discard()
    assert target.slots == slots and torch.equal(target.valid, valid)
    assert all(layer.keys.shape[2] == slots for layer in target.cache.layers)
    table = measure_batch_costs(tiny, batch=3, max_nodes=6, context=16, repeats=1)
    assert len(table) == 7 and table[0] == 1.0
    assert all(b >= a for a, b in zip(table, table[1:]))


@pytest.mark.parametrize("packed", [True, False], ids=["packed", "padded"])
def test_a_batched_step_keeps_what_each_row_alone_keeps(tiny, packed):
    """Oracle: each row verified and committed alone (`TargetModel`). The batch builds every row's
    block, mask and positions at once and keeps the accepted entries and their features with one
    write and one gather for all rows: the same logits, live slots and features per row."""
    from ngspec.target import TargetModel

    prompts = [[1, 2, 3, 4, 5], [6, 7], [8, 9, 10]]
    trees = [DraftTree((9, 9, 9), (-1, 0, 1)), DraftTree((8, 4), (-1, -1)), DraftTree()]
    paths = [(0, 1), (1,), ()]
    target = BatchTarget(tiny, packed=packed)
    target.keep_features = True
    for p in prompts:
        target.admit(p)
    for b in range(3):
        target.take_features(b)
    start = target.slots
    verified = target.verify([p[-1] for p in prompts], trees)
    assert verified.packed == packed
    target.commit(paths)
    for b, (prompt, tree, path) in enumerate(zip(prompts, trees, paths)):
        alone = TargetModel(tiny)
        alone.keep_features = True
        alone.prefill(prompt)
        alone.take_features()
        expected = alone.verify(prompt[-1], tree)
        alone.commit(path)
        assert torch.allclose(verified.row(b), expected, atol=1e-5)
        assert verified.greedy()[b] == expected.argmax(-1).tolist()
        assert target.lengths[b] == alone.length
        assert target.valid[b, start:].nonzero().flatten().tolist() == [0, *(i + 1 for i in path)]
        assert torch.allclose(target.take_features(b), alone.take_features(), atol=1e-5)


@pytest.mark.parametrize("packed", [True, False], ids=["packed", "padded"])
def test_a_batched_verify_and_commit_cost_the_same_tensor_operations_for_any_rows_and_trees(tiny, packed):
    """On a GPU a small model's batched step is host work, paid per tensor operation: building the
    blocks, the mask, acceptance and the commit must not add operations per row or per node
    (packed, each row attended on its own adds its attention calls, by design)."""
    def step_ops(prompts, trees):
        target = BatchTarget(tiny, packed=packed)
        target.keep_features = True
        for p in prompts:
            target.admit(p)

        def step():
            preds = target.verify([p[-1] for p in prompts], trees).greedy()
            target.commit([(0,) if t.size and t.tokens[0] == preds[b][0] else () for b, t in enumerate(trees)])

        return tensor_ops(step)

    two = step_ops([[1, 2, 3], [4, 5]], [DraftTree.chain([3, 4, 5, 6, 7]), DraftTree()])
    if packed:  # one attention call for every row's root, one for the row whose tree reaches beyond it
        many = step_ops([[1, 2, 3], [4, 5], [6, 7, 8, 9], [2, 2]], [DraftTree(), DraftTree((3, 4, 5, 6, 7), (-1, -1, 0, 2, 3)), DraftTree(), DraftTree()])
    else:
        many = step_ops([[1, 2, 3], [4, 5], [6, 7, 8, 9], [2, 2]], [DraftTree.chain([7, 8, 9]), DraftTree((3, 4, 5, 6), (-1, -1, 0, 2)), DraftTree(), DraftTree.chain([1])])
    assert two == many


def test_a_batchs_head_drafters_share_one_pool_and_reuse_finished_rows(tiny, prompts_and_expected):
    """9 prompts at batch size 2: the rows' head caches are rows of the factory's one pool, and a
    finished row's drafter hands its row back before the next prompt's drafter takes one, so the
    pool never holds more rows than the batch."""
    from ngspec.drafters.eagle import EagleOptions, eagle_factory

    prompts, expected = prompts_and_expected
    factory = eagle_factory(tiny, started_head(tiny), EagleOptions(top_k=2, depth=3, total_tokens=6))
    pool = factory().pool  # not started: takes no row
    results, _ = generate_batch(
        tiny, prompts, lambda: make_drafter("eagle", DrafterOptions(), None, factory, None),
        DecodeConfig(max_new_tokens=30), BatchConfig(2), lambda: Stopper(frozenset()),
    )
    assert [r.generation.token_ids for r in results] == expected
    assert pool.rows_made == 2
    assert pool.rows_in_use == 0


def test_packed_attention_splits_rows_by_the_queries_work():
    # blocks of 9 and 1 x 7: every row's root in one call, the long row's 8 more alone (8 + 8 + 1
    # against 72 for one call of width 9); blocks of 3 and 2: one call of width 3 (6 against 4 + 2)
    assert choose_split([9, 1, 1, 1, 1, 1, 1, 1]) == 1
    assert choose_split([3, 2]) == 3
    assert choose_split([4, 2, 2, 2, 2, 2, 2, 2]) == 2
    assert choose_split([1, 1]) == 1


def test_folded_attention_takes_a_mask_per_head_and_narrower_values():
    """A mask per head (Doge) goes to transformers' own attention; values narrower than the queries
    (multi-head latent attention) give outputs of their width."""
    torch.manual_seed(0)
    rows, heads, kv_heads, q, keys = 2, 4, 2, 3, 7
    query, key, value = torch.randn(rows, heads, q, 16), torch.randn(rows, kv_heads, keys, 16), torch.randn(rows, kv_heads, keys, 8)
    visible = torch.rand(rows, heads, q, keys) > 0.3
    visible[..., 0] = True
    per_head = additive_mask(visible, torch.float32)
    attention_module = SimpleNamespace(num_key_value_groups=heads // kv_heads, is_causal=True, training=False)
    out, _ = folded_gqa_attention(attention_module, query, key, value, per_head, scaling=0.25)
    repeated = torch.nn.functional.scaled_dot_product_attention(
        query, key.repeat_interleave(2, dim=1), value.repeat_interleave(2, dim=1), attn_mask=per_head, scale=0.25,
    )
    assert out.shape == (rows, q, heads, 8) and torch.allclose(out, repeated.transpose(1, 2), atol=1e-6)
    shared = per_head[:, :1]
    out, _ = folded_gqa_attention(attention_module, query, key, value, shared, scaling=0.25)
    repeated = torch.nn.functional.scaled_dot_product_attention(
        query, key.repeat_interleave(2, dim=1), value.repeat_interleave(2, dim=1), attn_mask=shared, scale=0.25,
    )
    assert out.shape == (rows, q, heads, 8) and out.is_contiguous() and torch.allclose(out, repeated.transpose(1, 2), atol=1e-6)


def test_folded_grouped_query_attention_is_the_attention_of_repeated_keys():
    torch.manual_seed(0)
    rows, heads, kv_heads, q, keys, dim = 3, 6, 2, 4, 11, 8
    query, key, value = torch.randn(rows, heads, q, dim), torch.randn(rows, kv_heads, keys, dim), torch.randn(rows, kv_heads, keys, dim)
    visible = torch.rand(rows, 1, q, keys) > 0.3
    visible[..., 0] = True
    mask = additive_mask(visible, torch.float32)
    out, _ = folded_gqa_attention(None, query, key, value, mask, scaling=0.3, folded_masks={id(mask): fold_mask(mask, heads // kv_heads)})
    repeated = torch.nn.functional.scaled_dot_product_attention(
        query, key.repeat_interleave(3, dim=1), value.repeat_interleave(3, dim=1), attn_mask=mask, scale=0.3,
    )
    assert out.shape == (rows, q, heads, dim)
    assert torch.allclose(out, repeated.transpose(1, 2), atol=1e-6)



def test_prefill_time_is_reported_apart_from_drafting_and_verification(tiny, monkeypatch):
    """A run's prefill seconds are the prompt's forward (here slowed by 0.2 s), alone and for each
    row of a batch, whose report sums its admissions."""
    import time

    from ngspec.decode import generate
    from ngspec.target import TargetModel

    slow = 0.2
    prefill, admit = TargetModel.prefill, BatchTarget._prefill

    def slow_prefill(self, *args):
        time.sleep(slow)
        return prefill(self, *args)

    def slow_admit(self, *args):
        time.sleep(slow)
        return admit(self, *args)

    monkeypatch.setattr(TargetModel, "prefill", slow_prefill)
    monkeypatch.setattr(BatchTarget, "_prefill", slow_admit)  # one forward of a row's prompt (on a CPU, one prompt a forward)
    rng = random.Random(9)
    prompts = [repetitive_prompt(rng, VOCAB, 40) for _ in range(3)]
    cfg = DecodeConfig(max_new_tokens=12)
    gen = generate(TargetModel(tiny), make_drafter("trie"), prompts[0], cfg)
    assert slow <= gen.stats.prefill_seconds < gen.seconds
    results, report = generate_batch(tiny, prompts, lambda: make_drafter("trie"), cfg, BatchConfig(2), lambda: Stopper(frozenset()))
    rows = [r.generation.stats.prefill_seconds for r in results]
    assert all(slow <= s < r.generation.seconds for s, r in zip(rows, results))
    assert report.prefill_seconds == pytest.approx(sum(rows))
    assert report.as_dict()["prefill_share"] == pytest.approx(report.prefill_seconds / report.seconds)
    assert 3 * slow <= report.prefill_seconds < report.seconds


@pytest.mark.parametrize("drafter", ["trie", "eagle+search"])
@pytest.mark.parametrize("batch_size", [2, 4])
def test_prompts_fed_while_the_batch_runs_join_it_and_each_matches_its_own_plain_greedy(tiny, tiny_eagle, tiny_datastore, prompts_and_expected, drafter, batch_size):
    """`feed`: requests arrive at later steps with budgets, token callbacks and sampling of their
    own; they take free slots and new rows, and every greedy row equals its own plain decoding."""
    from ngspec.batch import Request
    from ngspec.verify import SamplingConfig

    prompts, expected = prompts_and_expected
    streamed: dict[int, list[int]] = {}
    budgets = [30, 12, 30, 5, 30, 20, 30, 30, 9]

    sampled = 5  # one row samples with its own seed; the greedy rows stay exact beside it

    def request(i: int) -> Request:
        sampling = SamplingConfig(temperature=1.0, seed=1) if i == sampled else SamplingConfig()
        return Request(i, prompts[i], budgets[i], sampling, Stopper(frozenset()), on_tokens=lambda t, i=i: streamed.setdefault(i, []).extend(t))

    arrivals = {1: [request(1), request(2)], 2: [request(3)], 4: [request(i) for i in range(4, 9)]}
    calls = []

    def feed() -> list[Request]:
        calls.append(len(calls))
        return arrivals.pop(len(calls) - 1, [])

    finished = []
    # the batch starts from the first prompt (as a list); the others are fed while it runs
    results, report = generate_batch(
        tiny, prompts[:1], lambda: make_drafter(drafter, DrafterOptions(search_depth=6, deepen=True), None, tiny_eagle, tiny_datastore),
        DecodeConfig(max_new_tokens=30), BatchConfig(batch_size, 3, 0.0), lambda: Stopper(frozenset()), on_finish=finished.append, feed=feed,
    )
    assert not arrivals  # every group was taken while the batch ran
    assert [r.index for r in results] == list(range(9)) and all(r.error is None for r in results)
    for i, result in enumerate(results):
        if i == sampled:
            assert len(result.generation.token_ids) == budgets[i]
        else:
            assert result.generation.token_ids == expected[i][: budgets[i]], f"prompt {i}"
        if i:
            assert streamed[i] == result.generation.token_ids  # fed requests stream their tokens
    assert sorted(r.index for r in finished) == list(range(9))
    assert report.new_tokens == sum(budgets)


def test_a_request_that_a_finishing_row_leads_to_joins_even_when_that_row_was_the_last(tiny, prompts_and_expected):
    """A conversation's next turn is fed once its row has finished (`ngspec generate --turns all`):
    when that row was the batch's last, the batch goes on with it instead of ending."""
    from ngspec.batch import Request
    from ngspec.verify import SamplingConfig

    prompts, expected = prompts_and_expected
    later: list[Request] = []

    def on_finish(result) -> None:
        if result.index + 1 < 3:  # each row, as it ends, leads to the next prompt
            later.append(Request(result.index + 1, prompts[result.index + 1], 30, SamplingConfig(), Stopper(frozenset())))

    def feed() -> list[Request]:
        ready = list(later)
        later.clear()
        return ready

    results, report = generate_batch(
        tiny, prompts[:1], lambda: make_drafter("trie"), DecodeConfig(max_new_tokens=30), BatchConfig(2, 0, 0.0),
        lambda: Stopper(frozenset()), on_finish=on_finish, feed=feed,
    )
    assert [r.generation.token_ids for r in results] == expected[:3]
    assert report.new_tokens == sum(len(e) for e in expected[:3])


def test_a_cancelled_request_ends_at_the_next_step_and_frees_its_slot(tiny, prompts_and_expected):
    from ngspec.batch import Request
    from ngspec.verify import SamplingConfig

    prompts, expected = prompts_and_expected
    got: list[int] = []
    leaving = Request(1, prompts[1], 30, SamplingConfig(), Stopper(frozenset()), on_tokens=got.extend, cancelled=lambda: len(got) >= 3)
    arrivals = [[leaving], [], [], [Request(i, prompts[i], 30, SamplingConfig(), Stopper(frozenset())) for i in (2, 3)]]
    results, _ = generate_batch(
        tiny, prompts[:1], lambda: make_drafter("trie"), DecodeConfig(max_new_tokens=30), BatchConfig(2, 0, 0.0),
        lambda: Stopper(frozenset()), feed=lambda: arrivals.pop(0) if arrivals else [],
    )
    gone = results[1].generation
    assert gone.finish_reason == "cancelled" and 3 <= len(gone.token_ids) < 30 and gone.token_ids == expected[1][: len(gone.token_ids)]
    assert [r.generation.token_ids for r in (results[0], results[2], results[3])] == [expected[0], expected[2], expected[3]]


def test_each_row_that_ends_calls_its_on_done_once_after_its_last_tokens_and_a_cancelled_row_never(tiny, prompts_and_expected):
    """``Request.on_done`` (the API sends a stream's last text there): once per row that ends, by
    budget (one token too) or EOS, after every token it emitted; not for a row cancelled
    (its client left)."""
    from ngspec.batch import Request
    from ngspec.verify import SamplingConfig

    prompts, expected = prompts_and_expected
    emitted: dict[int, list[int]] = {}
    done: list[tuple[int, int]] = []  # (row, tokens emitted by then)

    def request(i: int, budget: int, cancelled=None) -> Request:
        return Request(
            i, prompts[i], budget, SamplingConfig(), Stopper(frozenset()), on_tokens=lambda t: emitted.setdefault(i, []).extend(t),
            cancelled=cancelled, on_done=lambda: done.append((i, len(emitted.get(i, [])))),
        )

    arrivals = [[request(0, 30), request(1, 30, cancelled=lambda: len(emitted.get(1, [])) >= 3), request(2, 1), request(3, 12)]]
    results, _ = generate_batch(
        tiny, [], lambda: make_drafter("trie"), DecodeConfig(max_new_tokens=30), BatchConfig(2), lambda: Stopper(frozenset()),
        feed=lambda: arrivals.pop(0) if arrivals else [],
    )
    ended = {r.index: r.generation for r in results}
    assert ended[1].finish_reason == "cancelled"
    assert sorted(done) == [(i, len(ended[i].token_ids)) for i in (0, 2, 3)]
    assert ended[0].token_ids == expected[0] and ended[2].token_ids == expected[2][:1] and ended[3].token_ids == expected[3][:12]


def _same_placement(a: BatchTarget, b: BatchTarget) -> None:
    assert torch.equal(a.valid, b.valid) and a.lengths == b.lengths and a.dropped == b.dropped
    for la, lb in zip(a.cache.layers, b.cache.layers):
        live = a.valid[:, la.dropped :].to(la.keys.device)[:, None, :, None]  # holes may hold anything
        for x, y in ((la.keys, lb.keys), (la.values, lb.values)):
            assert x.shape == y.shape
            torch.testing.assert_close(x * live, y * live, atol=1e-5, rtol=1e-4)
    for pa, pb in zip(a.pending, b.pending):
        assert len(pa) == len(pb) and all(torch.allclose(x, y, atol=1e-5) for x, y in zip(pa, pb))


@pytest.mark.parametrize("name", ["llama", "mistral", "gemma3", "gpt2", "mixtral"])
def test_prompts_prefilled_together_are_placed_as_each_alone(name):
    """`admit_many` with ``prefill_tokens`` runs one forward for prompts of different lengths,
    right-padded, and places each as its own prefill would: the same slots, valid map, lengths,
    dropped sliding slots and features, entries and logits equal up to float rounding; also into a
    finished row's slot beside a new row (every slide, learned positions, routed experts)."""
    from test_families import family_model
    from ngspec.models import tiny_model

    model = tiny_model("llama", seed=3) if name == "llama" else family_model(name)
    rng = random.Random(11)
    prompts = [[rng.randrange(3, 90) for _ in range(n)] for n in (20, 7, 33, 12, 5)]
    alone, together = BatchTarget(model, rows_wanted=4), BatchTarget(model, rows_wanted=4)
    together.prefill_tokens = 10_000
    for t in (alone, together):
        t.keep_features = True
    first = [alone.admit(p) for p in prompts[:3]]
    for x, y in zip(first, together.admit_many(prompts[:3], [None] * 3)):
        torch.testing.assert_close(x, y, atol=1e-5, rtol=1e-4)
    _same_placement(alone, together)
    for t in (alone, together):
        t.drop([0, 2])
    later = [alone.admit(prompts[3], 1), alone.admit(prompts[4])]
    for x, y in zip(later, together.admit_many(prompts[3:], [1, None])):
        torch.testing.assert_close(x, y, atol=1e-5, rtol=1e-4)
    _same_placement(alone, together)


@pytest.mark.parametrize("cap, forwards", [(0, 5), (60, 3), (10_000, 1)])
def test_prefill_tokens_caps_what_one_forward_holds(tiny, cap, forwards):
    """Consecutive prompts share a forward while their count times the longest stays within the
    cap (padding counts): lengths 20, 7, 33, 12, 5 under 60 go as [20, 7], [33], [12, 5]."""
    calls = []
    target = BatchTarget(tiny)
    target.prefill_tokens = cap
    original = target._prefill
    target._prefill = lambda prompts, rows: calls.append([len(p) for p in prompts]) or original(prompts, rows)
    target.admit_many([[5] * n for n in (20, 7, 33, 12, 5)], [None] * 5)
    assert len(calls) == forwards and sum(calls, []) == [20, 7, 33, 12, 5]
    if cap == 60:
        assert calls == [[20, 7], [33], [12, 5]]


@pytest.mark.parametrize("drafter", ["vanilla", "trie", "eagle+search"])
def test_rows_prefilled_together_match_their_own_plain_greedy(tiny, tiny_eagle, tiny_datastore, prompts_and_expected, drafter):
    """A batch that prefills the prompts it admits at once together (the default on a GPU): the
    first rows, and freed slots refilled as rows finish, every row its own plain greedy output."""
    prompts, expected = prompts_and_expected
    opts = DrafterOptions(search_depth=6)
    forwards = []
    original = BatchTarget._prefill

    def counted(self, prompts, rows):
        forwards.append(len(prompts))
        return original(self, prompts, rows)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(BatchTarget, "_prefill", counted)
        results, report = generate_batch(
            tiny, prompts, lambda: make_drafter(drafter, opts, None, tiny_eagle, tiny_datastore), DecodeConfig(max_new_tokens=30),
            BatchConfig(4, prefill_tokens=100_000), lambda: Stopper(frozenset()),
        )
    assert [r.generation.token_ids for r in results] == expected
    assert forwards[0] == 4 and sum(forwards) == len(prompts)
    assert (report.prefill_tokens, report.prefill_forwards) == (100_000, len(forwards))


def test_prefill_tokens_default_by_device_and_validated(tiny, monkeypatch):
    seen = []
    monkeypatch.setattr(BatchTarget, "admit_many", lambda self, prompts, rows: seen.append(self.prefill_tokens) or [])
    generate_batch(tiny, [[5, 6]], lambda: make_drafter("trie"), DecodeConfig(max_new_tokens=4), BatchConfig(2), lambda: Stopper(frozenset()))
    assert seen == [0]  # a CPU prefills one prompt a forward
    with pytest.raises(NgspecError, match="--prefill-tokens must be >= 0"):
        BatchConfig(2, prefill_tokens=-1)
