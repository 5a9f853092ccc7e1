"""`bench --batch-size`'s summary: throughput over rounds, ratios to vanilla, per-row tokens per
call and the rows that match the reference, on hand-made rounds; every timed run reading the
datastore cold."""

import math
from types import SimpleNamespace

import pytest

from ngspec.batch import BatchConfig
from ngspec.bench.batched import COLUMNS, BatchRound, batch_groups, rows, run_batched, summarise_batched, to_json, versus, versus_note, versus_rows
from ngspec.bench.interval import rounds_interval
from ngspec.bench.runner import Arm, run_arm
from ngspec.decode import DecodeConfig
from ngspec.drafters import Resources
from ngspec.prompts import Prompt


def test_summary_of_hand_made_rounds():
    reference = [[1, 2, 3], [4, 5]]
    runs = {
        "vanilla": [BatchRound(10.0, 100, 100, 0.0, 4.0, reference), BatchRound(12.0, 100, 100, 0.0, 4.0, reference)],
        "trie": [BatchRound(8.0, 100, 50, 0.4, 4.0, reference), BatchRound(8.0, 100, 50, 0.4, 4.0, [[1, 2, 3], [4, 6]])],
    }
    by = {s.arm: s for s in summarise_batched(runs, reference)}
    assert by["vanilla"].speedup == 1.0 and by["vanilla"].tokens_per_call == 1.0 and by["vanilla"].exact_match == 1.0
    trie = by["trie"]
    assert trie.tokens_per_second == pytest.approx(200 / 16)
    assert trie.speedup == pytest.approx((200 / 16) / (200 / 22))  # totals, not a mean of rounds
    assert trie.round_speedups == pytest.approx([10 / 8, 12 / 8])
    assert trie.tokens_per_call == 2.0
    assert trie.draft_share == pytest.approx(0.8 / 16) and trie.prefill_share == pytest.approx(8 / 16)
    assert trie.exact_match == 0.75  # one row of four differs
    (pair,) = versus(list(by.values()), "trie")
    assert pair["arm"] == "vanilla" and pair["ratio"] == pytest.approx((200 / 22) / (200 / 16))
    assert pair["per_round"] == pytest.approx([8 / 10, 8 / 12])
    # two rounds: Student's t with one degree of freedom (12.706) over the log ratios
    logs = [math.log(8 / 10), math.log(8 / 12)]
    half = 12.706 * abs(logs[0] - logs[1]) / math.sqrt(2) / math.sqrt(2)
    mid = sum(logs) / 2
    assert pair["interval_over"] == "rounds" and pair["interval_95"] == pytest.approx([math.exp(mid - half), math.exp(mid + half)])
    assert versus_rows([pair])[0][3] == f"{math.exp(mid - half):.3f}-{math.exp(mid + half):.3f}x (rounds)"


def test_step_columns_of_hand_made_rounds():
    """nodes/row and padded nodes/row are over the rows' verification steps (each row's prefill,
    its first call, left out); step cost over the batch's steps; all summed over the rounds first."""
    reference = [[1, 2, 3], [4, 5]]
    runs = {
        "vanilla": [BatchRound(10.0, 5, 5, 0.0, 0.0, reference, steps=3, cost_units=3.0)],
        # round 1: 2 rows, 6 calls (4 steps of rows), 9 nodes, 12 padded; 3 batch steps, cost 4.5
        "trie": [BatchRound(8.0, 5, 6, 0.0, 0.0, reference, steps=3, nodes=9, padded=12, cost_units=4.5),
                 BatchRound(8.0, 5, 4, 0.0, 0.0, reference, steps=2, nodes=3, padded=4, cost_units=2.5)],
    }
    by = {s.arm: s for s in summarise_batched(runs, reference)}
    assert (by["vanilla"].nodes_per_row, by["vanilla"].padded_per_row, by["vanilla"].step_cost) == (0.0, 0.0, 1.0)
    trie = by["trie"]
    assert trie.nodes_per_row == pytest.approx(12 / 6) and trie.padded_per_row == pytest.approx(16 / 6) and trie.step_cost == pytest.approx(7 / 5)
    assert rows([trie])[0][5:8] == ["2.00", "2.67", "1.400"]
    assert dict(zip(COLUMNS, rows([trie])[0]))["nodes/row"] == "2.00"
    (arm,) = [a for a in to_json([trie], {}, (1.0, None), [])["arms"]]  # round by round too, to read a round's ratio by
    assert arm["round_tokens_per_call"] == [5 / 6, 5 / 4] and arm["round_step_cost"] == [1.5, 1.25]


def test_rounds_interval_hand_worked():
    assert rounds_interval([1.05]) is None  # one round: nothing to tell its noise from
    low, high = rounds_interval([1.0, 1.0, 1.0])
    assert low == pytest.approx(1.0) and high == pytest.approx(1.0)
    # three rounds, logs 0, 0.03, 0.06: mean 0.03, standard deviation 0.03, t(2) = 4.303
    low, high = rounds_interval([1.0, math.exp(0.03), math.exp(0.06)])
    half = 4.303 * 0.03 / math.sqrt(3)
    assert (low, high) == pytest.approx((math.exp(0.03 - half), math.exp(0.03 + half)))
    with pytest.raises(ValueError):
        rounds_interval([1.0, 0.0])


def test_the_versus_note_says_which_arms_the_rounds_tell_apart():
    pairs = [
        {"arm": "fast", "versus": "trie", "interval_95": [1.02, 1.08], "interval_over": "rounds"},
        {"arm": "slow", "versus": "trie", "interval_95": [0.90, 0.97], "interval_over": "rounds"},
        {"arm": "level", "versus": "trie", "interval_95": [0.95, 1.04], "interval_over": "rounds"},
        {"arm": "once", "versus": "trie", "interval_95": None, "interval_over": "rounds"},
    ]
    note = versus_note(pairs)
    assert "ahead of trie: fast" in note and "behind trie: slow" in note
    assert "not told apart from trie by these runs (more --rounds (or --interleave-batches) narrow the interval): level, once" in note



def test_batch_groups_are_consecutive_and_cover_every_prompt_once():
    ids = list(range(20))
    assert batch_groups(ids, 8, 0) == [ids]
    assert batch_groups(ids, 8, 1) == [ids[:8], ids[8:16], ids[16:]]
    assert batch_groups(ids, 4, 2) == [ids[:8], ids[8:16], ids[16:]]
    assert sum(batch_groups(ids, 3, 1), []) == ids


def test_every_timed_run_reads_the_datastore_cold():
    """Arms and rounds repeat the same prompts, so a datastore that remembers continuations would
    hand a later run what an earlier one read: `run_batched` and `run_arm` empty its memory before
    each run."""

    class Store:
        warm = False

        def forget(self):
            self.warm = False

    store, runs = Store(), []

    class Engine:
        def run_batch(self, ids, new_drafter, cfg, batch):
            runs.append((store.warm, cfg.max_new_tokens))
            store.warm = True  # this run's reads
            gen = SimpleNamespace(token_ids=[1], stats=SimpleNamespace(verify_calls=1, draft_seconds=0.0, steps=[]), drafter_stats=None)
            return [SimpleNamespace(error=None, generation=gen) for _ in ids], _report(seconds=1.0, new_tokens=len(ids))

    out = run_batched(Engine(), [[1], [2]], [Arm("trie", "trie"), Arm("search", "search")], DecodeConfig(max_new_tokens=64), Resources(datastore=store), BatchConfig(2), rounds=2)
    assert [n for _, n in runs] == [16, 16] + [64] * 4  # each arm's untimed warm-up first
    assert [cold for cold, _ in runs[2:]] == [False] * 4 and [len(r) for r in out.values()] == [2, 2]

    # at batch size 1 every arm's run of every prompt is a timed run of its own
    runs.clear()

    class OneRow:
        def run(self, ids, drafter, cfg):
            runs.append(store.warm)
            store.warm = True
            return SimpleNamespace(token_ids=[1], seconds=1.0, stats=SimpleNamespace(steps=[], draft_seconds=0.0, prefill_seconds=0.0), drafter_stats=None)

    for pid in ("a", "b"):
        for arm in (Arm("search", "search"), Arm("trie", "trie")):
            run_arm(OneRow(), arm, [1, 2], DecodeConfig(max_new_tokens=4), Resources(datastore=store), pid)
    assert runs == [False] * 4


def test_every_arm_warms_up_untimed_before_the_first_timed_run(monkeypatch):
    """`run_bench` runs every arm once on the first prompt for a few tokens before timing any: the
    first arm of the first prompt would otherwise pay the process's first allocations and kernels.
    The warm-up's runs are in no record."""
    import ngspec.bench.runner as runner

    calls = []

    def fake_run_arm(engine, arm, ids, cfg, res, pid, calibration=None):
        calls.append((arm.label, pid, cfg.max_new_tokens))
        return runner.ArmRun(pid, [5, 6], 1.0, 2, [1, 1])

    monkeypatch.setattr(runner, "run_arm", fake_run_arm)
    monkeypatch.setattr(runner, "divergence", lambda *a: None)
    monkeypatch.setattr(runner, "self_repetition", lambda *a: SimpleNamespace(value=1.0, steps=2, tokens=2))
    engine = SimpleNamespace(loaded=SimpleNamespace(tokenizer=lambda text: {"input_ids": [ord(c) for c in text]}), target=SimpleNamespace(max_length=64, vocab=0x110000))  # every code point a token
    prompts = [Prompt("a", "xy"), Prompt("b", "zw")]
    arms = [Arm("hf-greedy", "hf-greedy"), Arm("trie", "trie")]
    records = runner.run_bench(engine, prompts, arms, DecodeConfig(max_new_tokens=64), rounds=1)
    assert calls[:2] == [("hf-greedy", "warm-up", 16), ("trie", "warm-up", 16)]
    assert calls[2:] == [(arm, pid, 64) for pid in "ab" for arm in ("hf-greedy", "trie")]
    assert [r.prompt.id for r in records] == ["a", "b"]


class _Recorder:
    """A stand-in engine: every row's output is its prompt, and each run takes ``seconds[arm]``
    per row; it records which arm ran which prompts with which calibration."""

    def __init__(self, seconds: dict[str, float], fail: tuple[str, int] | None = None):
        self.seconds, self.fail, self.runs = seconds, fail, []

    def run_batch(self, ids, new_drafter, cfg, batch):
        drafter = new_drafter()
        arm = drafter.name
        self.runs.append((arm, [x[0] for x in ids], cfg.max_new_tokens, drafter.calibration))
        gens = [SimpleNamespace(token_ids=list(x), stats=SimpleNamespace(verify_calls=len(x), draft_seconds=0.0, steps=[]), drafter_stats=None) for x in ids]
        results = [SimpleNamespace(index=i, error=None, generation=g) for i, g in enumerate(gens)]
        if self.fail and self.fail[0] == arm and self.fail[1] in [x[0] for x in ids]:
            results[[x[0] for x in ids].index(self.fail[1])].error = "too long"
        return results, _report(seconds=self.seconds[arm] * len(ids), new_tokens=sum(len(x) for x in ids))


def _report(**fields):
    """A stand-in `BatchReport` of a run that verified no draft."""
    return SimpleNamespace(prefill_seconds=0.0, steps=0, padded_nodes=0, cost_units=0.0, **fields)


def _fake_drafters(monkeypatch):
    import ngspec.bench.batched as batched

    monkeypatch.setattr(batched, "arm_drafter", lambda arm, res, calibration=None: SimpleNamespace(name=arm.label, calibration=calibration))


def test_interleaved_batches_run_every_arm_on_each_group_in_turn(monkeypatch):
    """``groups`` K: every arm in turn on each group of K*B prompts, order reversed every other
    group (and round); an arm's calibration carried across a round's groups and fresh the next
    round; a round's outputs in prompt order and its groups' (tokens, seconds) kept."""
    _fake_drafters(monkeypatch)
    engine = _Recorder({"vanilla": 2.0, "trie": 1.0})
    ids = [[i, i] for i in range(5)]
    arms = [Arm("vanilla", "vanilla"), Arm("trie", "trie")]
    out = run_batched(engine, ids, arms, DecodeConfig(max_new_tokens=64), Resources(), BatchConfig(2), rounds=2, groups=1)
    timed = engine.runs[2:]  # after each arm's warm-up
    assert [(arm, first) for arm, first, _, _ in timed] == [
        ("vanilla", [0, 1]), ("trie", [0, 1]), ("trie", [2, 3]), ("vanilla", [2, 3]), ("vanilla", [4]), ("trie", [4]),  # round 1
        ("trie", [0, 1]), ("vanilla", [0, 1]), ("vanilla", [2, 3]), ("trie", [2, 3]), ("trie", [4]), ("vanilla", [4]),  # round 2
    ]
    trie_calibrations = [c for arm, _, _, c in timed if arm == "trie"]
    assert trie_calibrations[0] is trie_calibrations[1] is trie_calibrations[2] and trie_calibrations[3] is not trie_calibrations[0]
    trie = out["trie"]
    assert [r.outputs for r in trie] == [ids, ids] and [r.tokens for r in trie] == [10, 10] and [r.seconds for r in trie] == [5.0, 5.0]
    assert trie[0].groups == [(4, 2.0), (4, 2.0), (2, 1.0)] and trie[0].row_calls == [2] * 5
    # without groups: one run per arm and round over every prompt, nothing kept per group
    engine.runs.clear()
    whole = run_batched(engine, ids, arms, DecodeConfig(max_new_tokens=64), Resources(), BatchConfig(2), rounds=1)
    assert [(arm, len(first)) for arm, first, _, _ in engine.runs[2:]] == [("vanilla", 5), ("trie", 5)]
    assert whole["trie"][0].groups == [(10, 5.0)]


def test_a_failed_row_in_a_later_group_is_named_by_its_place_among_all_prompts(monkeypatch):
    from ngspec.errors import NgspecError

    _fake_drafters(monkeypatch)
    engine = _Recorder({"vanilla": 1.0, "trie": 1.0}, fail=("trie", 3))
    with pytest.raises(NgspecError, match="prompt 4 cannot run: too long"):
        run_batched(engine, [[i] for i in range(5)], [Arm("vanilla", "vanilla"), Arm("trie", "trie")], DecodeConfig(max_new_tokens=8),
                    Resources(), BatchConfig(2), rounds=1, groups=1)


def test_versus_over_groups_resamples_the_groups_with_their_rounds():
    """With several groups, the interval is the paired bootstrap over groups (a group's rounds
    resampled together), and each group's ratio is reported."""
    from ngspec.bench.interval import ratio_interval

    reference = [[1]] * 6

    def rounds(group_runs):
        return [BatchRound(sum(s for _, s in g), sum(t for t, _ in g), 6, 0.0, 0.0, reference, [1] * 6, g) for g in group_runs]

    runs = {
        "vanilla": rounds([[(20, 2.0), (20, 2.0), (20, 2.0)], [(20, 2.2), (20, 2.0), (20, 1.8)]]),
        "trie": rounds([[(20, 1.0), (20, 1.6), (20, 1.2)], [(20, 1.1), (20, 1.5), (20, 1.0)]]),
    }
    summaries = summarise_batched(runs, reference)
    (pair,) = versus(summaries, "vanilla")
    want = ratio_interval([(20, 1.0), (20, 1.6), (20, 1.2), (20, 1.1), (20, 1.5), (20, 1.0)],
                          [(20, 2.0), (20, 2.0), (20, 2.0), (20, 2.2), (20, 2.0), (20, 1.8)], keys=[0, 1, 2, 0, 1, 2])
    assert pair["interval_over"] == "groups" and pair["interval_95"] == pytest.approx(list(want))
    assert [pytest.approx(x) for x in [[2.0, 1.25, 2.0 / 1.2], [2.2 / 1.1, 2.0 / 1.5, 1.8]]] == pair["per_group"]
    assert pair["per_round"] == pytest.approx([6.0 / 3.8, 6.0 / 3.6])
    assert "more prompts or --rounds narrow the interval" in versus_note([{**pair, "interval_95": [0.9, 1.1]}])
    assert versus_rows([pair])[0][3].endswith("(groups)")


@pytest.mark.slow
def test_bench_interleaves_batches_on_the_default_model_and_refuses_what_cannot_be(tmp_path):
    import json

    from typer.testing import CliRunner

    from ngspec.cli.app import app

    path = tmp_path / "q.jsonl"
    path.write_text("".join(json.dumps({"question_id": i, "turns": [f"List {i + 2} colours, one per line."]}) + "\n" for i in range(5)))
    md = tmp_path / "b.md"
    args = ["bench", "-q", str(path), "-n", "12", "-b", "2", "-d", "trie", "--versus", "vanilla"]
    result = CliRunner().invoke(app, [*args, "--interleave-batches", "1", "--rounds", "1", "--json", "--markdown", str(md)])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["environment"]["interleave_batches"] == 1
    assert [a["exact_match"] for a in report["arms"]] == [1.0, 1.0]  # every row, every group: plain greedy's tokens
    assert [len(a["group_runs"][0]) for a in report["arms"]] == [3, 3]  # 5 prompts in groups of 2, 2, 1
    (pair,) = report["versus"]
    assert pair["interval_over"] == "groups" and len(pair["per_group"][0]) == 3 and pair["interval_95"] is not None
    assert "3 groups of prompts per round" in md.read_text()
    for extra, message in ((["--interleave-batches", "-1"], "must be 0 (off) or more"), (["-b", "1", "--interleave-batches", "1"], "give --batch-size above 1")):
        refused = CliRunner().invoke(app, [*args, *extra])
        assert refused.exit_code != 0 and message in refused.output and "Traceback" not in refused.output
