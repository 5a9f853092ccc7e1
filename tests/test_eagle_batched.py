"""The EAGLE head run for several rows in one forward (`ngspec.eagle.batched`): the same outputs and
the same draft trees as each row drafting alone."""

from __future__ import annotations

import random

import pytest
import torch

from conftest import tensor_ops
from ngspec.contracts import DraftContext, DraftTree
from ngspec.drafters.eagle import EagleOptions, eagle_factory
from ngspec.drafters.search import EagleSearchDrafter
from ngspec.drafters.trie import TrieDrafter
from ngspec.eagle.batched import HeadCall, propose_together, run_calls
from ngspec.eagle.head import EagleHead, head_config_for, init_from_target
from ngspec.eagle.head3 import Eagle3Head, head3_config_for
from ngspec.eagle.vocab import SharedVocab, TopCall, top_children
from ngspec.eagle.pool import HeadPool
from ngspec.kv import make_cache
from ngspec.models import tiny_model
from ngspec.tree import additive_mask

STEEP_COST = tuple(1.0 + 0.3 * n for n in range(65))


@pytest.fixture(scope="module")
def llama():
    return tiny_model("llama", seed=3)


@pytest.fixture(scope="module")
def head(llama):
    """A head whose attention matters (`init_from_target` zeroes its output projection)."""
    torch.manual_seed(0)
    h = EagleHead(head_config_for(llama))
    init_from_target(h, llama)
    with torch.no_grad():
        layer = h.layers[0]
        layer.self_attn.o_proj.weight.normal_(0.0, 0.3)
        layer.mlp.down_proj.weight.normal_(0.0, 0.3)
    return h.eval()


def _inputs(llama, seed, m):
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, llama.config.vocab_size, (m,), generator=g).tolist()
    return tokens, torch.randn(m, llama.config.hidden_size, generator=g)


@pytest.mark.parametrize("kind", ["eagle1", "eagle3"])
def test_row_attention_equals_the_head_over_its_own_cache(llama, head, kind):
    """Oracle: the head with transformers' cache and attention over a past of 5 entries and a
    block of 3 that sees a tree-shaped part of it."""
    if kind == "eagle3":
        torch.manual_seed(1)
        head = Eagle3Head(head3_config_for(llama, llama.config.vocab_size), llama.config.hidden_size).eval()
    embed = llama.get_input_embeddings()
    past_tokens, past_feats = _inputs(llama, 1, 5)
    tokens, feats = _inputs(llama, 2, 3)
    visible = torch.ones(3, 8, dtype=torch.bool)
    visible[:, 5:] = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool)  # node 2 skips node 1
    block = [[0], [0, 1], [0, 2]]  # the same, as the entries beyond the first 5

    with torch.inference_mode():
        cache = make_cache(head.config, capacity=16)
        causal = additive_mask(torch.ones(5, 5, dtype=torch.bool).tril(), torch.float32)[None, None]
        head(embed(torch.tensor([past_tokens])), past_feats[None], torch.arange(5)[None], causal, cache)
        expected = head(embed(torch.tensor([tokens])), feats[None], torch.tensor([[5, 6, 6]]),
                        additive_mask(visible, torch.float32)[None, None], cache)[0]

        layer = HeadPool().row()
        run_calls([HeadCall(head, embed, layer, past_tokens, past_feats, list(range(5)), 0)])
        got = run_calls([HeadCall(head, embed, layer, tokens, feats, [5, 6, 6], 5, block)])[0]
    assert layer.keys.shape[-2] == 8
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_calls_of_several_rows_in_one_forward_equal_each_row_alone(llama, head):
    embed = llama.get_input_embeddings()
    rows = [_inputs(llama, 10 + r, m) for r, m in enumerate([4, 1, 7])]
    outs = {}
    for together in (False, True):
        pool = HeadPool()
        layers = [pool.row() for _ in rows]
        calls = [HeadCall(head, embed, layer, t, f, list(range(len(t))), 0) for layer, (t, f) in zip(layers, rows)]
        outs[together] = run_calls(calls) if together else [run_calls([c])[0] for c in calls]
        assert [layer.keys.shape[-2] for layer in layers] == [4, 1, 7]
    for alone, batched in zip(outs[False], outs[True]):
        torch.testing.assert_close(batched, alone, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", ["eagle1", "eagle3"])
def test_a_call_computes_only_the_outputs_it_keeps_and_caches_every_pair(llama, head, kind):
    """Oracle: the same calls keeping every output. Rows keep their last pair, their last three,
    or all of them; the caches get every pair's keys and values either way (those of the pairs
    not kept from `keys_values` alone)."""
    if kind == "eagle3":
        torch.manual_seed(1)
        head = Eagle3Head(head3_config_for(llama, llama.config.vocab_size), llama.config.hidden_size).eval()
    embed = llama.get_input_embeddings()
    rows = [_inputs(llama, 20 + r, m) for r, m in enumerate([6, 4, 5])]
    keep_from = [5, 1, 0]
    runs = {}
    for keep in (False, True):
        pool = HeadPool()
        layers = [pool.row() for _ in rows]
        calls = [HeadCall(head, embed, layer, t, f, list(range(len(t))), 0, None, k if keep else 0)
                 for layer, (t, f), k in zip(layers, rows, keep_from)]
        runs[keep] = run_calls(calls), layers
    (full, full_layers), (kept, kept_layers) = runs[False], runs[True]
    assert [len(o) for o in kept] == [1, 3, 5]
    for whole, part, k in zip(full, kept, keep_from):
        torch.testing.assert_close(part, whole[k:], rtol=1e-5, atol=1e-5)
    for a, b in zip(full_layers, kept_layers):  # the same keys and values (float rounding apart)
        torch.testing.assert_close(b.keys, a.keys, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(b.values, a.values, rtol=1e-5, atol=1e-6)


class _Rows:
    """Rows of a batch: contexts that grow by a few tokens per step, with fresh target features
    for every newly committed position (the head reads them as it would the target's)."""

    def __init__(self, llama, lengths, seed=0):
        self.rng = random.Random(seed)
        self.gen = torch.Generator().manual_seed(seed)
        self.hidden = llama.config.hidden_size
        self.vocab = llama.config.vocab_size
        # each row: its prompt, then the root (the first generated token, not yet committed)
        self.tokens = [[self.rng.randrange(self.vocab) for _ in range(n + 1)] for n in lengths]
        self.prompt_lens = list(lengths)
        self.fresh = [self._features(n) for n in lengths]  # the prompt's, from its prefill

    def _features(self, n):
        return torch.randn(n, self.hidden, generator=self.gen)

    def contexts(self, cost):
        return [DraftContext(list(t), p, 64, cost, f) for t, p, f in zip(self.tokens, self.prompt_lens, self.fresh)]

    def commit(self, trees):
        """Accept a random prefix of each tree's first branch plus a bonus token."""
        new = []
        for b, tree in enumerate(trees):
            path, node = [], -1
            while True:
                kids = [i for i, p in enumerate(tree.parents) if p == node]
                if not kids or self.rng.random() < 0.4:
                    break
                node = kids[0]
                path.append(tree.tokens[node])
            step = path + [self.rng.randrange(self.vocab)]
            self.tokens[b] += step
            self.fresh[b] = self._features(len(step))
            new.append(step)
        return new


@pytest.mark.parametrize("drafter", ["eagle-dynamic", "eagle-static", "eagle+search", "mixed"])
@pytest.mark.parametrize("cost", [(), STEEP_COST], ids=["flat-cost", "steep-cost"])
@pytest.mark.parametrize("draft_vocab", [0, 12], ids=["whole-vocab", "draft-vocab"])
def test_trees_drafted_together_equal_trees_drafted_row_by_row(llama, head, drafter, cost, draft_vocab):
    """Oracle: the same drafters, fed the same contexts and features, one row at a time. With a
    draft vocabulary every row's prompt adds its own tokens to it, so the rows' top-k requests
    answered together differ in their columns. The head in float32: in int8 the rows of one call
    share an activation scale, so their drafts may differ from each row's alone (`ngspec.eagle.int8`)."""
    opts = EagleOptions(tree="static" if drafter == "eagle-static" else "dynamic", top_k=3, depth=3, total_tokens=10, draft_vocab=draft_vocab, head_int8=False)
    factory = eagle_factory(llama, head, opts, list(range(0, llama.config.vocab_size, 3)))

    def make(b):
        if drafter == "eagle+search" or (drafter == "mixed" and b == 1):
            return EagleSearchDrafter(factory(), None, depth=6, prefix_len=2)
        if drafter == "mixed" and b == 2:
            return TrieDrafter()
        return factory()

    lengths = [9, 3, 17, 5]
    rows = _Rows(llama, lengths)
    alone, together = [make(b) for b in range(4)], [make(b) for b in range(4)]
    for b, t in enumerate(rows.tokens):
        alone[b].start(t[: lengths[b]])
        together[b].start(t[: lengths[b]])
    drafted = 0
    for _ in range(6):
        ctxs = rows.contexts(cost)
        expected = [d.propose(c) for d, c in zip(alone, ctxs)]
        got = propose_together(together, ctxs)
        assert got == expected
        drafted += sum(t.size for t in got)
        new = rows.commit(got)
        for d_alone, d_together, step in zip(alone, together, new):
            d_alone.observe(step)
            d_together.observe(step)
    assert drafted > 0


def test_a_batch_without_head_drafters_proposes_as_usual():
    rows = [TrieDrafter(), TrieDrafter()]
    for d, p in zip(rows, ([1, 2, 3, 1, 2], [4, 5, 4, 5])):
        d.start(p)
    ctxs = [DraftContext([1, 2, 3, 1, 2], 5, 8), DraftContext([4, 5, 4, 5], 4, 8)]
    trees = propose_together(rows, ctxs)
    assert all(isinstance(t, DraftTree) for t in trees) and trees[0].tokens[:1] == (3,)


def test_top_k_requests_answered_together_equal_each_row_alone(llama, head):
    """Oracle: each row's request answered alone. The rows' prompts bring different extra tokens
    (one none at all), one row asks for more tokens than its vocabulary holds. The same token ids,
    only the row's own, and the same log-probabilities up to float rounding (a product over more
    rows or columns rounds differently on CPU BLAS)."""
    lm_head = llama.get_output_embeddings()
    frequent = list(range(0, 40, 2))
    shared = SharedVocab.build(head, lm_head, frequent, lambda x, w: x @ w.T)
    prompts = [[1, 3, 5, 2], [], [77, 3, 91, 91], list(range(41, 49))]
    g = torch.Generator().manual_seed(5)
    calls = [TopCall(shared.for_prompt(p), torch.randn(m, llama.config.hidden_size, generator=g), k)
             for p, m, k in zip(prompts, [2, 1, 3, 4], [3, 5, 4, 30])]
    alone = [top_children([c])[0] for c in calls]
    _same_answers(top_children(calls), alone)
    _same_answers(top_children(calls[::-1]), alone[::-1])  # the layout cached for all rows, read in another order
    _same_answers(top_children(calls[2:0:-1]), alone[2:0:-1])  # ... and for some of them
    _same_answers(top_children([calls[0], calls[3]]), [alone[0], alone[3]])
    for p, (ids, values) in zip(prompts, alone):
        allowed = set(frequent) | set(p)
        assert all(set(row) <= allowed and len(row) == len(set(row)) for row in ids)
        assert all(v == sorted(v, reverse=True) for v in values)
    assert len(alone[3][0][0]) == 28  # 20 shared tokens and its 8 own: never a padding column


def test_top_k_over_the_whole_vocabulary_answered_together(llama, head):
    shared = SharedVocab.build(head, llama.get_output_embeddings(), None, lambda x, w: x @ w.T)
    g = torch.Generator().manual_seed(6)
    calls = [TopCall(shared.for_prompt([1, 2]), torch.randn(m, llama.config.hidden_size, generator=g), 4) for m in (1, 3)]
    _same_answers(top_children(calls), [top_children([c])[0] for c in calls])


def _same_answers(got, expected):
    for (ids, values), (ids0, values0) in zip(got, expected, strict=True):
        assert ids == ids0
        torch.testing.assert_close(torch.tensor(values), torch.tensor(values0), rtol=1e-5, atol=1e-6)


def test_rows_top_k_requests_cost_the_same_tensor_operations_for_any_number_of_rows(llama, head):
    """On a GPU a batch's drafting is host work, paid per tensor operation: answering the rows'
    requests, their extra columns laid out afresh (new rows), must not add operations per row or
    per feature row."""
    shared = SharedVocab.build(head, llama.get_output_embeddings(), list(range(0, 40, 2)), lambda x, w: x @ w.T)
    g = torch.Generator().manual_seed(7)

    def ops(prompts, rows_each):
        calls = [TopCall(shared.for_prompt(p), list(torch.randn(m, llama.config.hidden_size, generator=g)), 4) for p, m in zip(prompts, rows_each)]
        return tensor_ops(lambda: top_children(calls))

    two = ops([[1, 3, 5], [41, 43]], [1, 2])
    five = ops([[1, 3, 5], [41, 43], [77, 91], [50, 51, 52, 53], [3]], [3, 1, 2, 4, 1])
    assert two == five


def test_host_work_runs_after_the_rounds_head_forwards_are_launched_and_before_top_k(monkeypatch):
    """A row that yields `HOST_WORK` (its head skipped) is resumed after every head forward of the
    round is launched and before the top-k requests wait for them, whatever the rows' order."""
    from types import SimpleNamespace

    import ngspec.eagle.batched as batched
    from ngspec.eagle.batched import HOST_WORK
    from ngspec.eagle.vocab import TopCall

    log = []
    head_call = HeadCall(None, None, SimpleNamespace(pool=object()), [1], None, [0], 0)
    top_call = TopCall(SimpleNamespace(shared=object()), [], 1)
    monkeypatch.setattr(batched, "answer", lambda calls: log.append(type(calls[0]).__name__) or [None] * len(calls))

    class Row:
        def __init__(self, name, skips):
            self.name, self.skips = name, skips

        def drafting(self, ctx):
            if self.skips:
                yield HOST_WORK
                log.append(self.name)
                return DraftTree((self.name,), (-1,))
            yield head_call
            yield top_call
            return DraftTree((self.name,), (-1,))

    rows = [Row(7, True), Row(8, False), Row(9, True)]
    trees = propose_together(rows, [DraftContext([1, 2], 1, 4)] * 3)
    assert [t.tokens for t in trees] == [(7,), (8,), (9,)]
    assert log == ["HeadCall", "HostWork", 7, 9, "TopCall"]
