import torch

from ngspec.contracts import DraftTree
from ngspec.verify import Draws, SamplingConfig, _Samples, accept_argmax, accept_greedy, accept_sampled, race_rows, target_probs


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
    """Whatever siblings are drafted, the emitted first token is distributed like the target, and
    a drafted token is accepted with its probability (the siblings together: their sum)."""
    probs = torch.tensor([0.4, 0.3, 0.2, 0.1, 0.0])
    logits = torch.log(probs.clamp_min(1e-30)).expand(4, 5)
    tree = DraftTree((3, 1, 4), (-1, -1, -1))  # a rare, a likely and an impossible sibling
    cfg = SamplingConfig(temperature=1.0)
    draws = 20000
    counts = torch.zeros(5)
    accepted = 0
    for seed in range(draws):
        verdict = accept_sampled(tree, logits, cfg, Draws(seed, [7]), 0)
        counts[verdict.tokens[0]] += 1
        accepted += bool(verdict.path)
    tv = 0.5 * (counts / draws - probs).abs().sum().item()
    assert tv < 0.015
    assert counts[4] == 0
    assert abs(accepted / draws - 0.4) < 0.015  # tokens 3 and 1: 0.1 + 0.3


def test_sampled_acceptance_is_plain_sampling_with_the_same_draws():
    """At every node the tree takes the token plain sampling draws at that output position, so
    the emitted tokens are plain sampling's whatever was drafted; other seeds, other tokens."""
    torch.manual_seed(3)
    logits = torch.randn(4, 50) * 2
    cfg = SamplingConfig(temperature=0.8, top_p=0.95)
    chain = DraftTree.chain([0, 0, 0])
    for seed in range(50):
        draws = Draws(seed, [1, 2, 3])
        plain = [draws.token(target_probs(logits[d], cfg), 10 + d) for d in range(4)]
        verdict = accept_sampled(DraftTree.chain(plain[:3]), logits, cfg, draws, 10)
        assert verdict.tokens == tuple(plain)  # a draft of plain sampling's tokens: all accepted
        wrong = accept_sampled(DraftTree.chain([(plain[0] + 1) % 50, 0, 0]), logits, cfg, draws, 10)
        assert wrong.tokens == (plain[0],)
        assert accept_sampled(chain, logits, cfg, draws, 10).tokens[0] == plain[0]
    assert len({Draws(seed, [1, 2, 3]).token(target_probs(logits[0], cfg), 0) for seed in range(50)}) > 3
    assert Draws(5, [1, 2, 3]).token(target_probs(logits[0], cfg), 0) == Draws(5, [1, 2, 3]).token(target_probs(logits[0], cfg), 0)


def test_draws_depend_on_seed_prompt_and_position_only():
    a = Draws(1, [4, 5]).uniforms(1000, 3)
    assert torch.equal(a, Draws(1, [4, 5]).uniforms(1000, 3))
    assert not torch.equal(a, Draws(2, [4, 5]).uniforms(1000, 3))
    assert not torch.equal(a, Draws(1, [4, 6]).uniforms(1000, 3))
    assert not torch.equal(a, Draws(1, [4, 5]).uniforms(1000, 4))
    unseeded = Draws(None, [4, 5])  # a seed is drawn, and kept to replay the run
    assert torch.equal(unseeded.uniforms(100, 0), Draws(unseeded.seed, [4, 5]).uniforms(100, 0))
    assert Draws(None, [4, 5]).seed != unseeded.seed


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
    for on in ("1", "true", "yes"):  # like ngspec's other switches (it took "1" alone)
        monkeypatch.setenv("NGSPEC_CUDNN_ATTENTION", on)
        decode_attention(torch.device("cuda"))
    monkeypatch.setenv("NGSPEC_CUDNN_ATTENTION", "0")
    decode_attention(torch.device("cuda"))
    assert calls == [False, False]


def full_sort_nucleus(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """The top-p rule by its definition: sort the whole vocabulary, keep the tokens whose mass
    before them is under top_p, renormalise."""
    sorted_p, order = torch.sort(probs, dim=-1, descending=True)
    before = torch.cumsum(sorted_p, dim=-1) - sorted_p
    kept = torch.zeros_like(probs).scatter(-1, order, sorted_p.masked_fill(before >= top_p, 0.0))
    return kept / kept.sum(dim=-1, keepdim=True)


def test_top_p_sorts_only_the_head_and_matches_the_full_sort():
    """`target_probs` sorts only the most likely tokens, widening the head when the nucleus runs
    past it (a flat distribution at a high temperature); the kept tokens and their probabilities
    are those of the full sort (up to the order of exactly tied tokens at the boundary, which
    only a near-flat distribution has), for one row and for several."""
    gen = torch.Generator().manual_seed(0)
    vocab = 49152
    for temperature, scale in [(0.7, 3.0), (1.0, 1.0), (2.0, 0.3), (1.5, 0.01)]:
        logits = torch.randn(3, vocab, generator=gen) * scale
        for top_p in (0.1, 0.5, 0.9, 0.99):
            cfg = SamplingConfig(temperature=temperature, top_p=top_p)
            want = full_sort_nucleus(torch.softmax(logits / temperature, dim=-1), top_p)
            got = target_probs(logits, cfg)
            assert torch.equal((got > 0).sum(dim=-1), (want > 0).sum(dim=-1)), (temperature, top_p)
            assert int(((got > 0) != (want > 0)).sum()) <= 2 * (scale < 0.1) * len(logits)  # tie swaps
            assert torch.allclose(got.sort(dim=-1).values, want.sort(dim=-1).values, atol=1e-7)
            assert torch.allclose(target_probs(logits[1], cfg), got[1], atol=1e-7)
    # the widened head: at scale 0.01 the 0.99 nucleus holds nearly the whole vocabulary
    assert int((target_probs(logits, SamplingConfig(temperature=1.5, top_p=0.99)) > 0).sum(dim=-1).min()) > 8 * 1024


def test_top_k_then_top_p_matches_the_full_sort():
    logits = torch.randn(2, 5000, generator=torch.Generator().manual_seed(1)) * 2
    cfg = SamplingConfig(temperature=0.8, top_k=40, top_p=0.9)
    scores = logits / 0.8
    kth = torch.topk(scores, 40, dim=-1).values[..., -1:]
    want = full_sort_nucleus(torch.softmax(scores.masked_fill(scores < kth, float("-inf")), dim=-1), 0.9)
    got = target_probs(logits, cfg)
    assert torch.equal(got > 0, want > 0) and torch.allclose(got, want, atol=1e-7)
    assert int((got > 0).sum(dim=-1).max()) <= 40


def test_sampling_reads_logits_on_the_device_and_draws_on_the_host():
    """Acceptance takes the verify call's logits where they are (a GPU's: no copy of the whole
    tree's logits; every node raced there at once, `race_rows`) with the host's random numbers;
    the same seed, the same tokens on either device."""
    import pytest

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    tree = DraftTree((3, 1, 4), (-1, -1, -1))
    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(2))
    cfg = SamplingConfig(temperature=1.0, top_p=0.9, seed=5)
    for seed in range(20):
        draws = Draws(seed, [1])
        assert accept_sampled(tree, logits, cfg, draws, 0) == accept_sampled(tree, logits.cuda(), cfg, draws, 0)
        assert draws.token(target_probs(logits[0].cuda(), cfg), 0) == draws.token(target_probs(logits[0], cfg), 0)


def test_a_seed_out_of_range_is_refused():
    import pytest

    for seed in (-1, 2**63):
        with pytest.raises(ValueError, match="seed must be between 0 and 2"):
            SamplingConfig(temperature=1.0, seed=seed)
    SamplingConfig(temperature=1.0, seed=2**63 - 1)


def test_a_temperature_that_is_not_a_number_is_refused():
    """NaN compares false with everything: `temperature < 0` let it through, and sampling then
    drew token 0 at every step. Infinity is the uniform distribution's limit, as in transformers."""
    import pytest

    for bad, message in ((float("nan"), r"temperature must be >= 0 \(got nan\)"), (-0.5, r"\(got -0.5\)")):
        with pytest.raises(ValueError, match=message):
            SamplingConfig(temperature=bad)
    with pytest.raises(ValueError, match=r"top_p must be in \(0, 1\] \(got nan\)"):
        SamplingConfig(temperature=1.0, top_p=float("nan"))
    assert not SamplingConfig(temperature=float("inf")).greedy


def _random_tree(gen: torch.Generator, size: int, vocab: int) -> DraftTree:
    parents = [-1] + [int(torch.randint(-1, i, (1,), generator=gen)) for i in range(1, size)]
    tokens = [int(t) for t in torch.randint(0, vocab, (size,), generator=gen)]
    return DraftTree(tuple(tokens), tuple(parents))


def test_every_node_sampled_at_once_draws_what_the_walk_draws_node_by_node():
    """`race_rows` (a GPU's way: every node's race at once, one copy per setting) gives every
    block index of every row the token `_Samples` draws when the walk visits it (a CPU's way), on
    random trees and logits, rows with their own seeds and positions and settings that differ
    (temperature, top-k, top-p) or are shared; so `accept_argmax` takes the same verdict."""
    gen = torch.Generator().manual_seed(7)
    vocab = 300
    configs = [SamplingConfig(temperature=0.7, seed=1), SamplingConfig(temperature=1.3, top_k=20, seed=2),
               SamplingConfig(temperature=0.9, top_p=0.8, seed=3), SamplingConfig(temperature=0.5, top_k=40, top_p=0.95, seed=4),
               SamplingConfig(temperature=0.7, seed=5), SamplingConfig(temperature=0.9, top_p=0.8, seed=6)]
    for _ in range(3):
        trees = [_random_tree(gen, int(torch.randint(1, 24, (1,), generator=gen)), vocab) for _ in configs]
        logits = [torch.randn(t.size + 1 + 2, vocab, generator=gen) * 3 for t in trees]  # padded past the tree, as a batch's rows are
        positions = [int(torch.randint(0, 50, (1,), generator=gen)) for _ in configs]
        prompts = [[9, i] for i in range(len(configs))]
        eager = race_rows(trees, logits, configs, [Draws(c.seed, p) for c, p in zip(configs, prompts)], positions)
        for tree, x, cfg, prompt, position, got in zip(trees, logits, configs, prompts, positions, eager):
            lazy = _Samples(tree, x, cfg, Draws(cfg.seed, prompt), position)
            assert got == [lazy[b] for b in range(tree.size + 1)], cfg
            chain = DraftTree.chain([got[0]])  # a draft of the sample itself is accepted, either way
            assert accept_argmax(chain, got) == accept_sampled(chain, x[:2], cfg, Draws(cfg.seed, prompt), position)


def test_windows_draw_each_position_once_and_move_on(monkeypatch):
    """`windows` draws a position's uniforms on the first call that asks for it, for every row
    in one copy, and holds them until a call starts past them: consecutive steps whose trees
    overlap draw only the positions new to them."""
    import ngspec.verify as verify

    a, b = Draws(5, [1, 2]), Draws(6, [1, 2])
    drawn, copies = [], []
    real = Draws.uniforms

    def counted(self, vocab, position):
        drawn.append((self.seed, position))
        return real(self, vocab, position)

    real_stack = torch.stack
    monkeypatch.setattr(Draws, "uniforms", counted)
    monkeypatch.setattr(verify.torch, "stack", lambda xs: copies.append(len(xs)) or real_stack(xs))
    cpu = torch.device("cpu")
    first_a, first_b = verify.windows([a, b], 64, [(10, 14), (3, 5)], cpu)
    assert drawn == [(5, 10), (5, 11), (5, 12), (5, 13), (6, 3), (6, 4)] and copies[0] == 6  # one block for both rows
    assert first_a.shape == (4, 64) and first_b.shape == (2, 64)
    assert torch.equal(first_a[2], -torch.log(real(a, 64, 12))) and torch.equal(first_b[1], -torch.log(real(b, 64, 4)))
    drawn.clear()
    second_a, second_b = verify.windows([a, b], 64, [(12, 17), (4, 5)], cpu)  # two tokens accepted in a, one in b
    assert drawn == [(5, 14), (5, 15), (5, 16)] and torch.equal(second_a[0], first_a[2]) and torch.equal(second_b[0], first_b[1])
    assert sorted(a._held) == [12, 13, 14, 15, 16] and sorted(b._held) == [4]
    drawn.clear()
    verify.windows([a], 64, [(16, 17)], cpu)
    assert drawn == [] and sorted(a._held) == [16]


def test_sampling_on_a_gpu_races_every_node_at_once(monkeypatch):
    """`accept_sampled` takes the all-at-once way off a CPU (stood in for here by the predicate)."""
    import ngspec.verify as verify

    calls = []
    monkeypatch.setattr(verify, "race_rows", lambda *a: calls.append("all") or [[1, 2]])
    logits = torch.randn(2, 10)
    cfg = SamplingConfig(temperature=1.0, seed=1)
    verify.accept_sampled(DraftTree.chain([1]), logits, cfg, Draws(1, [1]), 0)
    assert calls == []
    monkeypatch.setattr(verify, "all_at_once", lambda logits: True)
    assert verify.accept_sampled(DraftTree.chain([1]), logits, cfg, Draws(1, [1]), 0).tokens == (1, 2)
    assert calls == ["all"]
