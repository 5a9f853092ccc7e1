"""The EAGLE head's runs at fixed shapes (`ngspec.eagle.graphs.StaticRuns`): the same outputs and
head cache as `run_calls`, the same trees, and generations equal to plain greedy decoding; on a
GPU, the captured graphs' replays equal the uncaptured runs."""

from __future__ import annotations

import pytest
import torch

from conftest import hf_greedy, started_head
from graph_standin import StandInGraphs
from ngspec.batch import BatchConfig, generate_batch
from ngspec.decode import DecodeConfig, Stopper
from ngspec.drafters import DrafterOptions, make_drafter
from ngspec.drafters.eagle import EagleOptions, eagle_factory, head_graphs_report
from ngspec.drafters.search import EagleSearchDrafter
from ngspec.eagle import graphs
from ngspec.eagle.batched import HeadCall, propose_together, run_calls
from ngspec.eagle.graphs import StaticRuns
from ngspec.eagle.head3 import Eagle3Head, head3_config_for
from ngspec.eagle.pool import HeadPool
from ngspec.models import tiny_model
from test_batch import prompts_and_expected  # noqa: F401 (fixture)
from test_lossless import tiny_datastore  # noqa: F401 (fixture)
from test_eagle_batched import STEEP_COST, _inputs, _Rows, head, llama  # noqa: F401 (fixtures)

pytestmark = pytest.mark.tiny_llama_only  # the Qwen2 tiny model runs the lossless matrices (conftest)


def _script(llama, head, embed, run, pool, rows_wanted=3):
    """Runs as a batch makes them: prompts caught up (all but the last pair only cached), causal
    catching up on some rows, tree levels (blocks) on others, a row with no call, a repeated
    shape with new data, a fourth row joining (the pool grows), and contexts past the first width."""
    rows = [pool.row() for _ in range(rows_wanted)]
    outs = []
    for i, (r, m) in enumerate(zip(rows, [30, 5, 12])):
        t, f = _inputs(llama, i, m)
        outs += run([HeadCall(head, embed, r, t, f, list(range(m)), 0, None, m - 1)])
    for seed in (10, 20):  # the same shape twice, different pairs
        t0, f0 = _inputs(llama, seed, 3)
        t2, f2 = _inputs(llama, seed + 1, 1)
        outs += run([HeadCall(head, embed, rows[0], t0, f0, [30, 31, 32], 30), HeadCall(head, embed, rows[2], t2, f2, [12], 12)])
        rows[0].crop(30)
        rows[2].crop(12)
    t1, f1 = _inputs(llama, 12, 3)
    t3, f3 = _inputs(llama, 13, 2)
    outs += run([
        HeadCall(head, embed, rows[1], t1, f1, [5, 6, 6], 5, [[0], [0, 1], [0, 2]]),
        HeadCall(head, embed, rows[2], t3, f3, [12, 12], 12, [[0], [1]]),
    ])
    rows.append(pool.row())  # a fourth row: the pool must grow to keep a spare row
    t, f = _inputs(llama, 14, 300)  # past the first width (256) and the pool's first capacity
    outs += run([HeadCall(head, embed, rows[3], t, f, list(range(300)), 0, None, 296)])
    t, f = _inputs(llama, 15, 4)
    outs += run([HeadCall(head, embed, rows[3], t, f, [300, 301, 301, 302], 300, [[0], [0, 1], [0, 2], [0, 1, 3]]),
                 HeadCall(head, embed, rows[1], *_inputs(llama, 16, 1), [8], 8, [[0]])])
    return outs, rows


@pytest.mark.parametrize("kind", ["eagle1", "eagle3"])
def test_fixed_shape_runs_equal_run_calls(llama, head, kind):
    """Oracle: `run_calls` over the same calls: every output, and every held row's cache entries."""
    if kind == "eagle3":
        torch.manual_seed(1)
        head = Eagle3Head(head3_config_for(llama, llama.config.vocab_size), llama.config.hidden_size).eval()
    embed = llama.get_input_embeddings()
    expected, expected_rows = _script(llama, head, embed, run_calls, HeadPool())
    pool = HeadPool()
    static = StaticRuns(head, embed, pool, capture=False)
    got, got_rows = _script(llama, head, embed, static.run, pool)
    assert [o.shape for o in got] == [o.shape for o in expected]
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-5)
    for g, e in zip(got_rows, expected_rows):
        assert g.length == e.length
        torch.testing.assert_close(g.keys, e.keys, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(g.values, e.values, rtol=1e-5, atol=1e-6)
    assert pool.keys.shape[0] > pool.rows_made  # a spare row no drafter holds
    assert static.unbucketed == 0 and static.graphs.captures == static.graphs.replays == 0


def test_shapes_are_reused_and_dropped_when_the_pool_grows(llama, head):
    embed = llama.get_input_embeddings()
    pool = HeadPool()
    static = StaticRuns(head, embed, pool, capture=False)
    a, b = pool.row(), pool.row()
    for r, seed in ((a, 1), (b, 2)):
        t, f = _inputs(llama, seed, 8)
        static.run([HeadCall(head, embed, r, t, f, list(range(8)), 0, None, 7)])
    made = static.shapes
    for seed in range(3):  # three more pairs on each row, three times: one more shape
        calls = [HeadCall(head, embed, r, *_inputs(llama, 10 + seed, 3), [8, 9, 10], 8) for r in (a, b)]
        static.run(calls)
        a.crop(8)
        b.crop(8)
    assert static.shapes == made + 1
    c = pool.row()  # the third row leaves no spare row: the pool grows and the shapes go
    static.run([HeadCall(head, embed, c, *_inputs(llama, 20, 1), [0], 0)])
    assert static.shapes == 1


def test_a_run_too_large_for_a_graph_runs_as_run_calls(llama, head):
    embed = llama.get_input_embeddings()
    t, f = _inputs(llama, 3, graphs.MOST_PAIRS + 1)
    n = len(t)
    static = StaticRuns(head, embed, HeadPool(), capture=False)
    got = static.run([HeadCall(head, embed, static.pool.row(), t, f, list(range(n)), 0)])[0]
    expected = run_calls([HeadCall(head, embed, HeadPool().row(), t, f, list(range(n)), 0)])[0]
    assert static.unbucketed == 1
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("drafter", ["eagle-dynamic", "eagle+search"])
@pytest.mark.parametrize("cost", [(), STEEP_COST], ids=["flat-cost", "steep-cost"])
def test_trees_drafted_at_fixed_shapes_equal_trees_drafted_row_by_row(llama, head, drafter, cost):
    """Oracle: the same drafters with ordinary head runs, one row at a time."""
    opts = EagleOptions(tree="dynamic", top_k=3, depth=3, total_tokens=10, draft_vocab=12, head_int8=False)
    vocab = list(range(0, llama.config.vocab_size, 3))
    plain = eagle_factory(llama, head, opts, vocab)
    fixed = eagle_factory(llama, head, EagleOptions(**{**opts.__dict__, "head_graphs": True}), vocab)
    assert fixed().pool.static_runs is not None and plain().pool.static_runs is None

    def make(factory):
        return EagleSearchDrafter(factory(), None, depth=6, prefix_len=2) if drafter == "eagle+search" else factory()

    lengths = [9, 3, 17, 5]
    rows = _Rows(llama, lengths)
    alone, together = [make(plain) for _ in lengths], [make(fixed) for _ in lengths]
    for b, t in enumerate(rows.tokens):
        alone[b].start(t[: lengths[b]])
        together[b].start(t[: lengths[b]])
    for _ in range(6):
        ctxs = rows.contexts(cost)
        expected = [d.propose(c) for d, c in zip(alone, ctxs)]
        got = propose_together(together, ctxs)
        assert got == expected
        for d_alone, d_together, step in zip(alone, together, rows.commit(got)):
            d_alone.observe(step)
            d_together.observe(step)


@pytest.mark.parametrize("drafter", ["eagle", "eagle+search"])
@pytest.mark.parametrize("batch_size", [1, 4])
def test_generations_with_fixed_shape_head_runs_match_plain_greedy(tiny, tiny_datastore, prompts_and_expected, drafter, batch_size):  # noqa: F811
    prompts, expected = prompts_and_expected
    factory = eagle_factory(tiny, started_head(tiny), EagleOptions(top_k=3, depth=4, total_tokens=12, head_graphs=True))
    results, _ = generate_batch(
        tiny, prompts, lambda: make_drafter(drafter, DrafterOptions(search_depth=6, deepen=True), None, factory, tiny_datastore),
        DecodeConfig(max_new_tokens=30), BatchConfig(batch_size), lambda: Stopper(frozenset()),
    )
    assert [r.generation.token_ids for r in results] == expected
    assert factory.pool.static_runs.shapes > 0


def test_a_factorys_head_graphs_are_reported(tiny, prompts_and_expected):  # noqa: F811
    """`head_graphs_report` (what `generate` and `bench` print for --head-graphs): the factory's
    shapes, captures and replays after a batch; None for a factory without fixed shapes, or none."""
    prompts, _ = prompts_and_expected
    head = started_head(tiny)
    opts = EagleOptions(top_k=3, depth=4, total_tokens=12)
    assert head_graphs_report(eagle_factory(tiny, head, opts)) is None and head_graphs_report(None) is None
    factory = eagle_factory(tiny, head, EagleOptions(**{**opts.__dict__, "head_graphs": True}))
    generate_batch(tiny, prompts[:3], lambda: make_drafter("eagle", DrafterOptions(), None, factory, None),
                   DecodeConfig(max_new_tokens=12), BatchConfig(3), lambda: Stopper(frozenset()))
    static = factory.pool.static_runs
    report = head_graphs_report(factory)
    assert static.shapes > 0 and report == static.report()
    assert report.startswith("0 captured in 0.00 s, 0 replays, 0 runs at new shapes in 0.00 s; capturing never failed; ") and f"{static.shapes} shapes" in report


def test_captured_runs_replay_into_their_buffers(llama, head, monkeypatch):
    """The capture plumbing with a stand-in for torch.cuda's graphs: each shape captured once (at
    its second run), later runs replayed from their refilled inputs, outputs and cache rows as
    `run_calls`'."""
    StandInGraphs(monkeypatch)
    embed = llama.get_input_embeddings()
    expected, expected_rows = _script(llama, head, embed, run_calls, HeadPool())
    pool = HeadPool()
    static = StaticRuns(head, embed, pool, capture=True)
    got, got_rows = _script(llama, head, embed, static.run, pool)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-5)
    for g, e in zip(got_rows, expected_rows):
        torch.testing.assert_close(g.keys, e.keys, rtol=1e-5, atol=1e-6)
    assert static.graphs.failure is None and 0 < static.graphs.captures < static.graphs.replays


def test_a_capture_that_fails_warns_once_and_runs_go_on_uncaptured(llama, head, monkeypatch):
    StandInGraphs(monkeypatch, fail=True)
    embed = llama.get_input_embeddings()
    expected, _ = _script(llama, head, embed, run_calls, HeadPool())
    static = StaticRuns(head, embed, HeadPool(), capture=True)
    with pytest.warns(UserWarning, match="cannot be captured as CUDA graphs") as caught:
        got, _ = _script(llama, head, embed, static.run, static.pool)
    assert len(caught) == 1
    graphs = static.graphs
    assert "operation not permitted" in graphs.failure and graphs.captures == graphs.replays == 0 and not graphs.enabled
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_captured_runs_equal_uncaptured_ones_on_a_gpu():
    """On a GPU: the same script with graphs captured and replayed, against the same fixed-shape
    runs uncaptured, and a batch's generations against plain greedy decoding."""
    llama = tiny_model("llama", seed=3).cuda()
    head = started_head(llama).cuda()
    embed = llama.get_input_embeddings()
    uncaptured = StaticRuns(head, embed, HeadPool(), capture=False)
    captured = StaticRuns(head, embed, HeadPool(), capture=True)
    expected, _ = _script(llama, head, embed, uncaptured.run, uncaptured.pool)
    got, _ = _script(llama, head, embed, captured.run, captured.pool)
    graphs = captured.graphs
    assert graphs.failure is None and graphs.captures > 0 and graphs.replays > graphs.captures
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-4)


def test_head_graphs_need_a_gpu_in_the_cli(tmp_path):
    from typer.testing import CliRunner

    from ngspec.cli.app import app

    head_dir = tmp_path / "head"
    head_dir.mkdir()
    prompts = tmp_path / "p.txt"
    prompts.write_text("hello")
    result = CliRunner().invoke(app, ["generate", "--prompt-file", str(prompts), "-d", "eagle", "--eagle-head", str(head_dir), "--head-graphs", "-n", "4", "--device", "cpu"])
    assert result.exit_code != 0
    assert "--head-graphs needs a CUDA GPU" in result.output
    assert "Traceback" not in result.output
