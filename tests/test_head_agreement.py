"""benchmarks/head_agreement.py: its examples are the target's greedy answers, and its agreement
counts every answer position once (the figures themselves are a benchmark, BENCHMARKS.md 10d)."""

import random

from conftest import benchmark_script, repetitive_prompt, started_head

from ngspec.decode import DecodeConfig
from ngspec.drafters import make_drafter
from ngspec.eagle.train import target_features
from ngspec.engine import Engine
from ngspec.models import LoadedModel, tiny_model

script = benchmark_script("head_agreement")


def test_agreement_over_the_targets_own_answers():
    model = tiny_model("llama", seed=4)
    head = started_head(model)
    engine = Engine(LoadedModel(model, None, "tiny"), calibrate=False)
    rng = random.Random(5)
    prompts = [repetitive_prompt(rng, 96, n) for n in (10, 21)]
    examples = script.answered(engine, prompts, 9)
    for ex, ids in zip(examples, prompts):
        greedy = engine.run(ids, make_drafter("vanilla"), DecodeConfig(max_new_tokens=9)).token_ids
        assert ex.prompt == ids and ex.ids.tolist() == ids + greedy
    feats = target_features(model, examples)
    share, n = script.agreement(model, head, None, examples, feats)
    assert n == sum(len(ex.ids) - ex.prompt_len + 1 for ex in examples) and 0.0 <= share <= 1.0
    alone, m = script.agreement(model, head, [5], examples, feats)
    assert m == n and alone == 1.0  # over a one-token vocabulary both argmaxes are that token
