"""benchmarks/reader_ab.py: its re-created earlier versions of the whole method, and its version
without a head, differ from it in exactly what they claim (the A/B itself is a benchmark, see BENCHMARKS.md)."""

import math

import pytest

from conftest import benchmark_script
from test_search import ScoredEagle

from ngspec.contracts import DraftContext, DraftTree
from ngspec.drafters.trie import Calibration

ab = benchmark_script("reader_ab")
HISTORY = [1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 7, 8]  # "1 2" went on as "3 4" twice, as "7 8" once
THREE_FREE = (1.0, 1.0, 1.0, 1.0) + (5.0,) * 30


def drafter(cls):
    d = cls(ScoredEagle(DraftTree((9,), (-1,)), [math.log(0.05)]), None, depth=4, prefix_len=2)
    d.start(HISTORY)
    return d


def test_branch_only_leaves_out_the_local_tree():
    ctx = DraftContext(HISTORY + [1, 2], len(HISTORY), 20, THREE_FREE)
    assert 7 in drafter(ab.search.EagleSearchDrafter).propose(ctx).tokens
    assert 7 not in drafter(ab.BranchOnly).propose(ctx).tokens


def head_runs(cls) -> int:
    """Steps on which a costly head, wrong every time, ran over 40 steps."""
    eagle = ScoredEagle(DraftTree((3,), (-1,)), [math.log(0.9)], head_cost=0.3)
    d = cls.alone(eagle)
    d.start(HISTORY)
    for step in range(40):
        d.propose(DraftContext(HISTORY + [50] * step, len(HISTORY), 20, (1.0, 1.1) + (2.0,) * 20))
        d.observe([50])
    return len(eagle.caps)


def test_the_old_gate_ignores_caught_up_guesses_and_never_probes():
    new, old = drafter(ab.search.EagleSearchDrafter), drafter(ab.OldGate)
    for d in (new, old):
        d.eagle.caught_up = [30, 30]
    assert new._top1_rate() == 31 / 32 and old._top1_rate() == 1 / 2
    # once closed, the new gate lets the head run every PROBE_EVERY-th step; the old one never
    assert head_runs(ab.search.EagleSearchDrafter) >= head_runs(ab.OldGate) + 40 // (ab.search.PROBE_EVERY + 1) - 1 > head_runs(ab.OldGate)


def test_batch_probes_probe_where_the_batch_verified_nothing():
    def runs(cls) -> int:
        eagle = ScoredEagle(DraftTree((3,), (-1,)), [math.log(0.9)], head_cost=0.3)  # always wrong
        d = cls(eagle, None, depth=3, prefix_len=2)
        d.start(HISTORY)
        for step in range(40):  # a batch that verifies none of the row's trees
            d.propose(DraftContext(HISTORY + [50] * step, len(HISTORY), 20, (1.0, 1.1) + (2.0,) * 20, engine_sizes=True))
            d.keep(0)
            d.observe([50])
        return len(eagle.caps)

    assert runs(ab.BatchProbes) >= runs(ab.search.EagleSearchDrafter) + 40 // (ab.search.PROBE_EVERY + 1) - 1


def test_no_head_drafts_the_search_and_the_local_tree_and_never_the_heads_guess():
    flat = DraftContext(HISTORY + [1, 2], len(HISTORY), 20)
    assert 9 in drafter(ab.search.EagleSearchDrafter).propose(flat).tokens  # the head's guess
    for cost in ((), THREE_FREE):
        headless = drafter(ab.NoHead)
        tree = headless.propose(DraftContext(flat.tokens, flat.prompt_len, 20, cost))
        assert 9 not in tree.tokens and 3 in tree.tokens
        assert (7 in tree.tokens) == bool(cost)  # where nodes cost, the local trie's second guess too
        headless.observe([3, 4, 5])
        assert headless.stats()["head_top_guess"] == [0, 0]


def test_a_batch_size_below_one_is_a_usage_error_before_anything_loads():
    import subprocess
    import sys

    from conftest import BENCHMARKS

    run = subprocess.run(
        [sys.executable, str(BENCHMARKS / "reader_ab.py"), "--category", "rag", "--eagle-head", "none", "--tuned", "none.json", "--batch-size", "0"],
        capture_output=True, text=True,
    )
    assert run.returncode == 2
    assert "--batch-size must be at least 1" in run.stderr and "Traceback" not in run.stderr


def test_an_unknown_arm_is_a_usage_error_before_anything_loads():
    import subprocess
    import sys

    from conftest import BENCHMARKS

    run = subprocess.run(
        [sys.executable, str(BENCHMARKS / "reader_ab.py"), "--category", "rag", "--eagle-head", "none", "--tuned", "none.json",
         "--arms", "trie,whole hc1,whole hc..,wholly,whole graphs hc1 tg,whole graphs cover tg,whole graphs cover hc1,"
                   "whole cal,whole graphs no deepen cal tg,whole no deepen graphs cal,whole sure,whole graphs no deepen sure tg"],
        capture_output=True, text=True,
    )
    assert run.returncode == 2 and "Traceback" not in run.stderr
    # "whole hc1" is known (the cost weighed once), and so are its, the cover gate's and the
    # calibrated credit's graphs, no deepen and tg variants, in that order
    assert "unknown arms: ['whole hc..', 'wholly', 'whole graphs cover hc1', 'whole no deepen graphs cal']" in run.stderr


def gate_opens(d, cost: tuple[float, ...]) -> bool:
    """Whether ``d``'s head ran on one step after "1 2" (followed by "3 4" twice and "7 8" once)."""
    d.start(HISTORY)
    d.propose(DraftContext(HISTORY + [1, 2], len(HISTORY), 20, cost))
    return bool(d.eagle.caps)


def gated(cls, head_cost: float, **attrs):
    d = cls(ScoredEagle(DraftTree((9,), (-1,)), [math.log(0.5)], head_cost=head_cost), None, depth=4, prefix_len=2)
    for k, v in attrs.items():
        setattr(d, k, v)
    return d


def test_whole_hc_weighs_the_heads_cost_the_given_number_of_times():
    cheap = ab.HeadCostAt(ScoredEagle(DraftTree((9,), (-1,)), [0.0], head_cost=0.2), None)
    cheap.start([1])
    cheap.weight = 1.0
    ctx = DraftContext([1, 2], 1, 8)
    assert ab.search.HEAD_COST_WEIGHT * cheap._head_cost(ctx) == pytest.approx(0.2)
    cheap.weight = 2.0
    assert ab.search.HEAD_COST_WEIGHT * cheap._head_cost(ctx) == pytest.approx(0.4)


def test_the_cover_gate_credits_the_head_less_where_the_local_tree_offers_first_tokens():
    flat = (1.0,) * 40  # nodes are free: the local tree offers both "3" and "7" after "1 2"
    built = [gate_opens(gated(ab.search.EagleSearchDrafter, h), flat) for h in (0.0, 0.05, 0.1, 0.2, 0.4, 0.8)]
    cover = [gate_opens(gated(ab.CoverGate, h), flat) for h in (0.0, 0.05, 0.1, 0.2, 0.4, 0.8)]
    # on a flat cost the cover gate credits less gain against more expected tokens: it opens
    # only where the gate as built does, and stays shut on some head costs where it opens
    assert all(b or not c for b, c in zip(built, cover))
    assert sum(cover) < sum(built)
    assert cover[0]  # a free head always pays


def test_the_calibrated_credit_scales_the_gates_credit_by_the_first_levels_record():
    """``whole cal``: as in `test_search.test_the_gate_weighs_half_the_heads_cost`, a run pays
    while its credit is above 0.4 and the prior rate credits 0.5. Where the head's first level
    added nothing in 9 credited (halved at the new prompt: a rate of 1 / 5.5, which is also the
    record's prior, so a scale of 1 / 30) the calibrated gate keeps the head off, where it always
    did it runs; the gate as built runs it either way."""
    cost = (1.0, 1.1) + (2.0,) * 20
    opens = {}
    for cls in (ab.search.EagleSearchDrafter, ab.CalibratedCredit):
        for added in (0.0, 9.0):
            calibration = Calibration()
            calibration.record(ab.search.HEAD_CREDIT, added, 9.0)
            d = cls(ScoredEagle(DraftTree((3,), (-1,)), [math.log(0.9)], head_cost=0.6), None, depth=0, calibration=calibration)
            d.start(HISTORY)
            d.propose(DraftContext(HISTORY + [50], len(HISTORY), 20, cost))
            opens[cls.__name__, added] = bool(d.eagle.caps)
    assert opens == {("EagleSearchDrafter", 0.0): True, ("EagleSearchDrafter", 9.0): True,
                     ("CalibratedCredit", 0.0): False, ("CalibratedCredit", 9.0): True}


def test_serial_assembles_a_skipped_step_at_once_into_the_same_tree():
    """``... serial`` asks for no `HOST_WORK` where the head stays off, and drafts the same tree."""
    from ngspec.eagle.batched import HOST_WORK

    ctx = DraftContext(HISTORY + [1, 2], len(HISTORY), 20, (1.0, 1.1) + (2.0,) * 20)  # a second node costs double: no head

    def asked(cls):
        d, calls = drafter(cls), []
        steps = d.drafting(ctx)
        try:
            calls.append(next(steps))
            while True:
                calls.append(steps.send(None))
        except StopIteration as done:
            return calls, done.value, d.skipped

    calls, tree, skipped = asked(ab.search.EagleSearchDrafter)
    assert calls == [HOST_WORK] and skipped == 1 and tree.size
    assert asked(ab.Serial) == ([], tree, 1)


def test_the_sure_branch_rule_runs_the_head_where_the_local_trie_matched_two_tokens_and_not_where_nothing_matched():
    """``whole sure``: after "1 2" the local trie matched two tokens, so the head runs however dear
    it is; after an unseen token no branch is found (first-node chance 0) and the trie matched
    nothing, so it stays off however cheap, where the gate as built runs a free head."""
    steep = (1.0, 1.1) + (2.0,) * 30
    assert gate_opens(gated(ab.SureBranch, 5.0), steep)
    assert not gate_opens(gated(ab.search.EagleSearchDrafter, 5.0), steep)

    def unseen(cls, head_cost):
        d = gated(cls, head_cost)
        d.start(HISTORY)
        d.propose(DraftContext(HISTORY + [50], len(HISTORY), 20, steep))
        return bool(d.eagle.caps)

    assert not unseen(ab.SureBranch, 0.0) and unseen(ab.search.EagleSearchDrafter, 0.0)


def test_the_sure_branch_rule_runs_the_head_on_a_fairly_sure_branch_only():
    """Where the local trie matched nothing (after an unseen token), the rule follows the branch's
    first-node chance alone: from 0.2 to below 0.8 the head runs, outside it not."""

    class AtChance(ab.SureBranch):
        chance = 0.0

        def _credited_gain(self, reach, n):  # the branch sized with this first-node chance
            return super()._credited_gain([self.chance], 1)

    ctx = DraftContext(HISTORY + [50], len(HISTORY), 20, (1.0, 1.1) + (2.0,) * 30)
    for chance, runs in ((0.1, False), (0.2, True), (0.5, True), (0.79, True), (0.8, False), (0.95, False)):
        d = gated(AtChance, 0.0, chance=chance)
        d.start(HISTORY)
        assert d._head_pays([], ("datastore", 3), ctx) == runs, chance
    # after "1 2" the local trie matched two tokens: the head runs whatever the branch's chance
    d = gated(AtChance, 0.0, chance=0.95)
    d.start(HISTORY)
    assert d._head_pays([], ("local", 2), DraftContext(HISTORY + [1, 2], len(HISTORY), 20, ctx.verify_cost))


def test_a_row_that_differs_is_printed_with_its_split_and_margin_once_however_many_rounds():
    """The GPU visits' A/B names every output that differs from plain greedy with where it splits
    and plain greedy's top-2 margin there (one forward per distinct output), so a near-tie is told
    from a bug without decoding the prompt again."""
    import torch

    from ngspec.check import rounding_step
    from ngspec.decode import DecodeConfig
    from ngspec.drafters import make_drafter
    from ngspec.engine import Engine
    from ngspec.models import LoadedModel, tiny_model

    model = tiny_model("llama", seed=0)
    engine = Engine(LoadedModel(model, None, "tiny"), calibrate=False)
    ids = [[4, 8, 15, 16, 23, 42], [7, 7, 3, 9]]
    reference = [engine.run(x, make_drafter("vanilla"), DecodeConfig(max_new_tokens=10)).token_ids for x in ids]
    bad = reference[1][:2] + [(reference[1][2] + 1) % 96] + reference[1][3:]
    res = {"trie": {"splits": []}, "whole": {"splits": []}}
    lines = ab.split_lines(engine, {("whole", 1, tuple(bad)): [1, 2]}, ids, reference, ["rag:1", "rag:2"], res)
    with torch.inference_mode():
        logits = model(torch.tensor([ids[1] + reference[1][:2]])).logits[0, -1]
    top = torch.topk(logits, 2).values
    steps = float(top[0] - top[1]) / rounding_step(float(top[0]), torch.float32)
    (split,) = res["whole"]["splits"]
    assert res["trie"]["splits"] == [] and split["prompt"] == "rag:2" and split["rounds"] == [1, 2]
    assert split["first_mismatch"] == 2 and split["near_tie_steps"] == pytest.approx(steps, rel=1e-3)
    assert lines == [f"split: whole, rag:2 (rounds 1, 2): first differs at token 2, plain greedy's top-2 margin there {split['near_tie_margin']:.3g} "
                     f"({split['near_tie_steps']:.3g} float32 rounding steps at that logit size)"]
