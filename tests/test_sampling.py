"""Sampling through draft trees is lossless in distribution (empirical vs exact target)."""

from typing import Sequence

import pytest
import torch

from ngspec.contracts import DraftContext, DraftTree
from ngspec.decode import DecodeConfig, generate
from ngspec.models import tiny_model
from ngspec.target import TargetModel
from ngspec.verify import SamplingConfig, target_probs


class FixedTreeDrafter:
    """Always drafts the same two-level tree, whatever the context."""

    name = "fixed"

    def start(self, prompt: Sequence[int]) -> None:
        pass

    def propose(self, ctx: DraftContext) -> DraftTree:
        return DraftTree.from_paths([[0, 1], [2, 3], [1, 0], [3]])

    def observe(self, new_tokens: Sequence[int]) -> None:
        pass


def exact_pair_after_first(model, prompt, cfg, vocab):
    """p(t2, t3) of plain sampling (t1 summed out), from the target's own conditionals."""
    with torch.inference_mode():
        def cond(prefix):
            return target_probs(model(torch.tensor([prompt + prefix])).logits[0, -1], cfg)

        joint = torch.zeros(vocab, vocab)
        p1 = cond([])
        for t1 in range(vocab):
            p2 = cond([t1])
            for t2 in range(vocab):
                joint[t2] += p1[t1] * p2[t2] * cond([t1, t2])
    return joint


def test_tree_sampling_matches_target_distribution():
    """t1 comes from the prefill; t2 and t3 are accepted from two tree levels or resampled."""
    vocab = 4
    model = tiny_model("llama", seed=3, vocab_size=vocab)
    with torch.no_grad():
        model.lm_head.weight.mul_(0.15)  # soften the sharpened tiny model: many outcomes matter
    prompt = [1, 2, 3, 0, 1]
    cfg = SamplingConfig(temperature=1.0, top_k=3)
    joint = exact_pair_after_first(model, prompt, cfg, vocab)
    assert (joint > 0.03).sum() >= 6  # a distribution worth testing

    target = TargetModel(model)
    draws = 3000
    counts = torch.zeros(vocab, vocab)
    deep = 0
    for seed in range(draws):
        dc = DecodeConfig(max_new_tokens=3, sampling=SamplingConfig(1.0, 1.0, 3, seed))
        gen = generate(target, FixedTreeDrafter(), prompt, dc)
        _, t2, t3 = gen.token_ids
        counts[t2, t3] += 1
        deep += gen.stats.steps[1].accepted == 2
    assert deep > draws // 10  # drafts really were accepted two levels deep
    tv = 0.5 * (counts / draws - joint).abs().sum().item()
    assert tv < 0.05, tv


def test_seeded_sampling_is_reproducible():
    model = tiny_model("qwen2", seed=1)
    target = TargetModel(model)
    dc = DecodeConfig(max_new_tokens=20, sampling=SamplingConfig(0.8, 0.9, 0, seed=7))
    runs = [generate(target, FixedTreeDrafter(), [3, 4, 5], dc).token_ids for _ in range(2)]
    assert runs[0] == runs[1]



@pytest.mark.parametrize("layout", ["padded", "packed"])
def test_sampling_in_a_batch_matches_target_distribution(layout):
    """The batched loop samples each row from its own row of the batch's logits (padded or packed,
    rows joining as others finish): two prompts in turn, each row's tokens distributed as plain
    sampling of its own prompt."""
    from ngspec.batch import BatchConfig, Request, generate_batch
    from ngspec.decode import Stopper

    vocab = 4
    model = tiny_model("llama", seed=3, vocab_size=vocab)
    with torch.no_grad():
        model.lm_head.weight.mul_(0.15)
    prompts = [[1, 2, 3, 0, 1], [3, 3, 0, 2]]
    cfg = SamplingConfig(temperature=1.0, top_k=3)
    joints = [exact_pair_after_first(model, p, cfg, vocab) for p in prompts]
    assert 0.5 * (joints[0] - joints[1]).abs().sum() > 0.15  # rows that mixed up their prompts would show
    draws = 6000  # a total variation of about 0.026 per prompt from sampling alone; 0.2 with rows mixed up
    # each request with a seed of its own: a seed and a prompt make one sample (`verify.Draws`)
    fed = [[Request(i, prompts[i % 2], 3, SamplingConfig(1.0, 1.0, 3, seed=i), Stopper(frozenset())) for i in range(draws)]]
    results, _ = generate_batch(
        model, [], FixedTreeDrafter, DecodeConfig(max_new_tokens=3), BatchConfig(8, 0, layout=layout), lambda: Stopper(frozenset()),
        feed=lambda: fed.pop() if fed else [],
    )
    counts = torch.zeros(2, vocab, vocab)
    deep = 0
    for r in results:
        _, t2, t3 = r.generation.token_ids
        counts[r.index % 2, t2, t3] += 1
        deep += r.generation.stats.steps[1].accepted == 2
    assert deep > draws // 10  # drafts really were accepted two levels deep
    for which in range(2):
        tv = 0.5 * (counts[which] / (draws // 2) - joints[which]).abs().sum().item()
        assert tv < 0.06, (which, tv)
