"""benchmarks/head_signals.py: a rule learned per bucket of a pre-head signal runs the head where
it paid, and the replay adds tokens and costs as head_worth.py does."""

import pytest
from conftest import benchmark_script

signals = benchmark_script("head_signals")


def step(prompt: int, source: str, gain: int) -> dict:
    """A step where the head adds ``gain`` tokens at a tenth of a step (tree cost unchanged)."""
    return {"prompt": prompt, "source": source, "match": 3, "reach0": 0.5, "local_depth": 3, "gate": source == "none",
            "head_cost": 0.1, "accepted_with": 1 + gain, "accepted_without": 1, "cost_with": 1.0, "cost_without": 1.0,
            "head_right": gain > 0, "branch_right": False}


def test_the_previous_step_is_the_same_prompts():
    rows = signals.with_previous([step(0, "none", 1), step(0, "local", 0), step(1, "none", 1)])
    assert rows[0]["prev_accepted"] == -1 and rows[0]["prev_head_right"] is None
    assert rows[1]["prev_accepted"] == 2 and rows[1]["prev_head_right"] is True
    assert rows[2]["prev_accepted"] == -1


def test_a_signal_that_separates_the_wins_is_learned_and_replayed():
    rows = signals.with_previous([step(p, s, 1 if s == "none" else 0) for p in range(4) for s in ("none", "local", "local")])
    rule = signals.learn(rows, signals.SIGNALS["branch source"])
    assert rule == {"none": True, "local": False}
    # never: 2 tokens a step at cost 1; the rule adds a token at cost 0.1 on a third of the steps
    expected = (2 * 12 + 4) / (12 + 0.4) / 2.0
    assert signals.replay(rows, signals.SIGNALS["branch source"], rule) == pytest.approx(expected)
    figures = signals.evaluate({"a": rows, "b": rows})
    assert figures["policies"]["a"]["gate"] == pytest.approx(expected)  # the gate ran the head where it pays
    assert figures["policies"]["a"]["per-step best"] == pytest.approx(expected)
    cell = figures["signals"]["branch source"]["a"]
    assert cell["other category"] == cell["other prompts"] == cell["in sample"] == pytest.approx(expected)


def test_the_sure_rule_runs_the_head_on_a_fairly_sure_branch_or_a_deep_local_match():
    def at(reach0: float, local_depth: int, prompt: int = 0) -> dict:
        return {**step(prompt, "datastore", 1), "reach0": reach0, "local_depth": local_depth}

    assert [signals.sure(at(c, 0)) for c in (0.1, 0.19, 0.2, 0.5, 0.79, 0.8, 0.95)] == [False, False, True, True, True, False, False]
    assert signals.sure(at(0.0, 2)) and signals.sure(at(0.95, 5)) and not signals.sure(at(0.95, 1))
    # replayed as a policy: the head runs (and adds its token at a tenth of a step) on the sure half
    rows = [at(chance, 0, prompt) for prompt in range(3) for chance in (0.5, 0.9)]
    figures = signals.evaluate({"a": signals.with_previous(rows)})
    assert figures["policies"]["a"]["sure"] == pytest.approx((2 * 6 + 3) / (6 + 0.3) / 2.0)
