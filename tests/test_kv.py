"""Committing an accepted path leaves the cache equal to one recomputed from scratch."""

import inspect

import torch
from conftest import tensor_ops
from transformers import DynamicCache

from ngspec.contracts import DraftTree
from ngspec.kv import cache_argument
from ngspec.target import TargetModel


def fresh_cache(model, tokens):
    cache = DynamicCache(config=model.config)
    with torch.inference_mode():
        model(torch.tensor([tokens]), **cache_argument(model, cache), use_cache=True)
    return cache


def test_commit_matches_recomputed_cache(tiny):
    prompt = [5, 6, 7, 8, 9, 10]
    target = TargetModel(tiny)
    target.prefill(prompt)
    root = 11
    tree = DraftTree((20, 21, 22, 23, 24), (-1, 0, -1, 2, 3))  # accept the second branch: 22 23 24
    logits = target.verify(root, tree)
    target.commit([2, 3])
    assert target.length == len(prompt) + 3
    expected = fresh_cache(tiny, prompt + [root, 22, 23])
    for got_layer, want_layer in zip(target.cache.layers, expected.layers):
        assert torch.allclose(got_layer.keys, want_layer.keys, atol=1e-5)
        assert torch.allclose(got_layer.values, want_layer.values, atol=1e-5)
    # and the logits of the branch equal those of sequential decoding
    with torch.inference_mode():
        seq = tiny(torch.tensor([prompt + [root, 22, 23, 24]])).logits[0, -4:]
    assert torch.allclose(logits[[0, 3, 4, 5]], seq, atol=1e-4)


def test_commit_nothing_keeps_only_root(tiny):
    target = TargetModel(tiny)
    target.prefill([1, 2, 3])
    target.verify(4, DraftTree.chain([5, 6]))
    target.commit([])
    expected = fresh_cache(tiny, [1, 2, 3, 4])
    assert torch.allclose(target.cache.layers[0].keys, expected.layers[0].keys, atol=1e-5)


def test_growable_cache_grows_and_matches_dynamic_cache(tiny):
    """Appending past the preallocated capacity (doubling) keeps exactly the same entries."""
    from ngspec.kv import GrowableLayer, make_cache

    cache = make_cache(tiny.config, capacity=2)
    assert all(isinstance(layer, GrowableLayer) for layer in cache.layers)
    tokens = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5]
    with torch.inference_mode():
        tiny(torch.tensor([tokens[:3]]), **cache_argument(tiny, cache), use_cache=True)
        for i in range(3, len(tokens), 2):
            tiny(torch.tensor([tokens[i : i + 2]]), **cache_argument(tiny, cache), use_cache=True)
    expected = fresh_cache(tiny, tokens)
    for got_layer, want_layer in zip(cache.layers, expected.layers):
        assert got_layer.keys.shape == want_layer.keys.shape
        assert torch.allclose(got_layer.keys, want_layer.keys, atol=1e-5)
        assert torch.allclose(got_layer.values, want_layer.values, atol=1e-5)


def test_replace_compacts_in_place_and_keeps_appending():
    """A batch's cache compacted stays in its buffers (no second cache); appends then go after the
    replaced entries; fewer rows stay in the buffers, more rows than they hold get new ones."""
    from ngspec.kv import GrowableLayer

    g = torch.Generator().manual_seed(0)
    layer = GrowableLayer(capacity=8)
    keys, values = torch.randn(3, 2, 5, 4, generator=g), torch.randn(3, 2, 5, 4, generator=g)
    layer.update(keys, values)
    buffer = layer._keys.data_ptr()

    kept_k, kept_v = keys[:, :, [0, 2, 3]], values[:, :, [0, 2, 3]]  # three live slots per row
    layer.replace(kept_k, kept_v)
    assert layer._keys.data_ptr() == buffer
    new_k, new_v = torch.randn(3, 2, 1, 4, generator=g), torch.randn(3, 2, 1, 4, generator=g)
    layer.update(new_k, new_v)
    torch.testing.assert_close(layer.keys, torch.cat([kept_k, new_k], dim=2))
    torch.testing.assert_close(layer.values, torch.cat([kept_v, new_v], dim=2))

    for rows in ([2, 0], [0, 1, 1, 0]):  # fewer rows (3 -> 2), then more (2 -> 4)
        before_k, before_v = layer.keys.clone(), layer.values.clone()
        layer.replace(before_k[rows], before_v[rows])
        torch.testing.assert_close(layer.keys, before_k[rows])
        torch.testing.assert_close(layer.values, before_v[rows])
        layer.update(new_k[:1].expand(len(rows), -1, -1, -1), new_v[:1].expand(len(rows), -1, -1, -1))
        assert layer.keys.shape == (len(rows), 2, before_k.shape[2] + 1, 4)
        torch.testing.assert_close(layer.keys[:, :, :-1], before_k[rows])


def test_rows_come_and_go_within_the_buffers():
    """A batch's rows are added in spare buffer rows (made for the rows wanted, else grown by
    doubling), moved one by one and kept as a view: no operation copies the whole cache, entries
    stay, new rows are zeros (a hole's value meets a zero weight in attention, so it must not be
    NaN)."""
    from ngspec.kv import GrowableLayer

    g = torch.Generator().manual_seed(1)
    layer = GrowableLayer(capacity=8)
    first = torch.randn(1, 2, 5, 4, generator=g)
    layer.update(first, -first)
    grown = []
    for rows in range(2, 7):
        before = layer._keys.data_ptr()
        layer.add_rows(1, rows_wanted=None if rows < 4 else 6)
        grown.append(layer._keys.data_ptr() != before)
        assert layer.keys.shape == (rows, 2, 5, 4) and not layer.keys[-1].any() and not layer.values[-1].any()
        layer.keys[-1] = rows  # a row's entries, as a prompt admitted there would write them
        layer.values[-1] = -rows
    assert grown == [True, True, False, True, False]  # 1 -> 2 -> 4 by doubling, then the 6 wanted: not a copy per row
    assert layer._keys.shape[0] == 6
    torch.testing.assert_close(layer.keys[0], first[0])
    torch.testing.assert_close(layer.values[0], -first[0])

    buffer, snapshot, values = layer._keys.data_ptr(), layer.keys.clone(), layer.values.clone()
    src, dst = torch.tensor([5, 4]), torch.tensor([1, 2])  # rows 1 and 2 finished: 4 and 5 take their places
    # two operations a buffer to move the rows; at fixed shapes (lazy) the rows kept cost none
    # until read, else their views are made at once (two operations)
    assert tensor_ops(lambda: (layer.move_rows(src, dst), layer.keep_rows(4, lazy=True))) == 4
    assert layer._key_rows is None and tensor_ops(lambda: layer.keep_rows(4)) == 2
    assert layer._keys.data_ptr() == buffer and layer.keys.shape == (4, 2, 5, 4)
    torch.testing.assert_close(layer.keys, snapshot[[0, 5, 4, 3]])
    torch.testing.assert_close(layer.values, values[[0, 5, 4, 3]])
    new = torch.randn(4, 2, 1, 4, generator=g)
    layer.update(new, new)  # appends go on after the kept rows' entries
    torch.testing.assert_close(layer.keys, torch.cat([snapshot[[0, 5, 4, 3]], new], dim=2))
    layer.add_rows(1)  # a row added after a drop reuses a spare row and starts as holes
    assert layer._keys.data_ptr() == buffer and not layer.keys[4].any()


class _KnowsOldName(torch.nn.Module):
    def forward(self, x, past_key_values=None):
        return x


class _KnowsNewName(torch.nn.Module):
    def forward(self, x, cache=None):
        return x


def test_cache_goes_under_the_name_the_module_knows(tiny):
    assert cache_argument(_KnowsOldName(), "c") == {"past_key_values": "c"}
    assert cache_argument(_KnowsNewName(), "c") == {"cache": "c"}
    (name,) = cache_argument(tiny, None)  # whichever transformers is installed
    assert name in inspect.signature(type(tiny).forward).parameters


def test_a_layer_that_dropped_its_oldest_entries_commits_and_cuts_back_by_position():
    """Entries hold their own position; one layer drops its first 5 (as a sliding layer past its
    window does): committing a block's kept entries and cutting back after a rejected block leave
    each layer holding exactly the positions it should, and the dropped layer's buffer shrinks."""
    from ngspec.kv import GrowableLayer, keep_block, truncate

    def positions(n):
        return torch.arange(n, dtype=torch.float32).view(1, 1, n, 1)

    cache = DynamicCache()
    cache.layers = [GrowableLayer(capacity=256), GrowableLayer(capacity=256)]
    for layer in cache.layers:
        layer.update(positions(12), positions(12))
    cache.layers[1].drop_front(5)
    assert cache.layers[1].dropped == 5 and cache.layers[1]._keys.shape[-2] < 256
    for layer in cache.layers:  # a block of 4 entries at positions 12-15; keep the 1st and 3rd
        layer.update(positions(16)[:, :, 12:], positions(16)[:, :, 12:])
    keep_block(cache, 12, [0, 2])
    assert cache.layers[0].keys.flatten().tolist() == [*range(12), 12, 14]
    assert cache.layers[1].keys.flatten().tolist() == [*range(5, 12), 12, 14]
    assert cache.layers[1].values.flatten().tolist() == [*range(5, 12), 12, 14]
    for layer in cache.layers:  # another block, rejected whole
        layer.update(positions(3), positions(3))
    truncate(cache, 14)
    assert [layer.keys.shape[-2] for layer in cache.layers] == [14, 9]
