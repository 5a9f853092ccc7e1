import torch

from ngspec.contracts import DraftTree
from ngspec.verify import SamplingConfig, accept_greedy, accept_sampled, target_probs


def one_hot_logits(preds: list[int], vocab: int = 20) -> torch.Tensor:
    logits = torch.zeros(len(preds), vocab)
    for i, p in enumerate(preds):
        logits[i, p] = 5.0
    return logits


def test_greedy_follows_later_sibling_and_takes_bonus():
    tree = DraftTree((10, 11, 12, 13), (-1, 0, 0, -1))
    # block order: root, a, b, c, d; target wants a after root, c after a, 7 after c
    logits = one_hot_logits([10, 12, 0, 7, 0])
    verdict = accept_greedy(tree, logits)
    assert verdict.path == (0, 2)
    assert verdict.tokens == (10, 12, 7)


def test_greedy_rejects_everything():
    tree = DraftTree.chain([3, 4])
    verdict = accept_greedy(tree, one_hot_logits([9, 4, 5]))
    assert verdict.path == () and verdict.tokens == (9,)


def test_top_k_and_top_p_filters():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    p = target_probs(logits, SamplingConfig(temperature=1.0, top_k=2))
    assert torch.allclose(p, torch.tensor([0.625, 0.375, 0.0, 0.0]))
    p = target_probs(logits, SamplingConfig(temperature=1.0, top_p=0.8))
    assert torch.allclose(p, torch.tensor([0.625, 0.375, 0.0, 0.0]))
    p = target_probs(logits, SamplingConfig(temperature=1.0, top_p=0.81))
    assert p[2] > 0 and p[3] == 0


def test_sibling_rejection_sampling_matches_target_distribution():
    """Whatever siblings are drafted, the emitted first token is distributed like the target."""
    probs = torch.tensor([0.4, 0.3, 0.2, 0.1, 0.0])
    logits = torch.log(probs.clamp_min(1e-30)).expand(4, 5)
    tree = DraftTree((3, 1, 4), (-1, -1, -1))  # a rare, a likely and an impossible sibling
    gen = torch.Generator().manual_seed(0)
    cfg = SamplingConfig(temperature=1.0)
    draws = 20000
    counts = torch.zeros(5)
    for _ in range(draws):
        counts[accept_sampled(tree, logits, cfg, gen).tokens[0]] += 1
    tv = 0.5 * (counts / draws - probs).abs().sum().item()
    assert tv < 0.015
    assert counts[4] == 0


def test_gpu_decoding_keeps_attention_off_cudnn_unless_asked(monkeypatch):
    """Unmasked bf16 steps ran 2.8x slower than float32 ones on the H100, which fits cuDNN building
    a plan per key length (BENCHMARKS.md section 10); on CPU nothing is touched."""
    import torch

    from ngspec.target import decode_attention

    calls = []
    monkeypatch.setattr(torch.backends.cuda, "enable_cudnn_sdp", calls.append)
    monkeypatch.delenv("NGSPEC_CUDNN_ATTENTION", raising=False)
    decode_attention(torch.device("cpu"))
    assert calls == []
    decode_attention(torch.device("cuda"))
    assert calls == [False]
    monkeypatch.setenv("NGSPEC_CUDNN_ATTENTION", "1")
    decode_attention(torch.device("cuda"))
    assert calls == [False]
