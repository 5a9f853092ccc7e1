"""The paired bootstrap interval of a speed ratio (`ngspec.bench.interval`)."""

import random

import pytest

from ngspec.bench.interval import ratio_interval, throughput_ratio


def test_throughput_ratio_is_total_tokens_per_total_second():
    # 100 tokens in 1 s and 300 in 2 s (133.3 tok/s) against 100 in 2 s and 300 in 2 s (100 tok/s)
    assert throughput_ratio([(100, 1.0), (300, 2.0)], [(100, 2.0), (300, 2.0)]) == pytest.approx(4 / 3)


def test_identical_arms_give_a_point_at_one():
    runs = [(128, 1.0 + i / 10) for i in range(8)]
    assert ratio_interval(runs, runs) == (1.0, 1.0)


def test_every_prompt_twice_as_fast_gives_exactly_two_whatever_the_prompts():
    ref = [(50 + 10 * i, 1.0 + 0.3 * i) for i in range(10)]
    arm = [(t, s / 2) for t, s in ref]
    low, high = ratio_interval(arm, ref)
    assert low == pytest.approx(2.0) and high == pytest.approx(2.0)


def noisy(n: int, true: float, noise: float, seed: int) -> tuple[list, list]:
    rng = random.Random(seed)
    ref = [(128, rng.uniform(2.0, 4.0)) for _ in range(n)]
    return [(t, s / true * rng.uniform(1 - noise, 1 + noise)) for t, s in ref], ref


def test_the_interval_holds_the_estimate_and_narrows_with_more_prompts():
    arm, ref = noisy(8, 1.05, 0.1, seed=1)
    low, high = ratio_interval(arm, ref)
    assert low < throughput_ratio(arm, ref) < high
    arm64, ref64 = noisy(64, 1.05, 0.1, seed=1)
    low64, high64 = ratio_interval(arm64, ref64)
    assert high64 - low64 < (high - low) * 0.7


def test_it_covers_the_true_ratio_about_as_often_as_it_claims():
    # 200 simulated 16-prompt comparisons with a true ratio of 1.1: a 90% interval should hold it
    # in roughly 90% of them (a percentile bootstrap runs a little narrow at small n)
    held = 0
    for trial in range(200):
        arm, ref = noisy(16, 1.1, 0.15, seed=100 + trial)
        low, high = ratio_interval(arm, ref, confidence=0.9, resamples=400, seed=trial)
        held += low <= 1.1 <= high
    assert 0.8 <= held / 200 <= 0.97


def test_seeded_and_explicit_about_bad_input():
    arm, ref = noisy(8, 1.0, 0.2, seed=3)
    assert ratio_interval(arm, ref, seed=5) == ratio_interval(arm, ref, seed=5)
    assert ratio_interval(arm[:1], ref[:1]) is None
    with pytest.raises(ValueError, match="both arms"):
        ratio_interval(arm, ref[:-1])
    with pytest.raises(ValueError, match="confidence"):
        ratio_interval(arm, ref, confidence=1.0)


def test_bench_summaries_carry_the_interval_into_the_table_and_json():
    from ngspec.bench.report import markdown, rows, summarise, to_json
    from ngspec.bench.runner import ArmRun, BenchRecord
    from ngspec.metrics.self_repetition import self_repetition
    from ngspec.prompts import Prompt

    out = [1, 2, 3, 4, 5, 6, 7, 8]
    records = []
    for i, (ref_s, trie_s) in enumerate([(2.0, 1.0), (3.0, 1.4), (2.5, 1.3), (4.0, 2.1)]):
        runs = {"hf-greedy": ArmRun(f"p{i}", out, ref_s, 8, [1] * 8), "trie": ArmRun(f"p{i}", out, trie_s, 4, [2] * 4)}
        records.append(BenchRecord(Prompt(f"p{i}", "text"), 5, runs, self_repetition([9, 9, 9, 9, 9], out)))
    greedy, trie = summarise(records, ["hf-greedy", "trie"])
    assert greedy.speedup_interval == (1.0, 1.0)
    low, high = trie.speedup_interval
    assert 1.8 < low < trie.speedup < high < 2.1  # every prompt 1.9-2.0x faster
    assert f"{low:.2f}-{high:.2f}x" in rows([greedy, trie])[1]
    assert "95% interval" in markdown([greedy, trie], {}, 1.0, records=records)
    assert to_json(records, [greedy, trie], {})["arms"][1]["speedup_interval"] == (low, high)
    assert summarise(records[:1], ["trie"])[0].speedup_interval is None


def test_pairs_of_one_prompt_are_resampled_together_when_keyed():
    # every prompt run twice with identical timings: as separate pairs they look like twice the
    # prompts and the interval narrows; keyed by prompt, the interval is the one-round interval
    arm, ref = noisy(12, 1.05, 0.15, seed=7)
    once = ratio_interval(arm, ref)
    twice_unkeyed = ratio_interval(arm * 2, ref * 2)
    twice_keyed = ratio_interval(arm * 2, ref * 2, keys=list(range(12)) * 2)
    assert twice_keyed == pytest.approx(once)
    assert twice_unkeyed[1] - twice_unkeyed[0] < (once[1] - once[0]) * 0.85


def test_distinct_keys_are_the_unkeyed_interval_and_bad_keys_are_refused():
    arm, ref = noisy(10, 1.0, 0.2, seed=4)
    assert ratio_interval(arm, ref, keys=[f"p{i}" for i in range(10)]) == ratio_interval(arm, ref)
    assert ratio_interval(arm[:2], ref[:2], keys=["a", "a"]) is None  # one prompt: nothing to resample
    with pytest.raises(ValueError, match="key"):
        ratio_interval(arm, ref, keys=["a"] * 9)
