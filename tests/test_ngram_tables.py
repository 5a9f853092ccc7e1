"""Model-derived n-gram tables: the definitions by brute force, the cache, and bad files."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ngspec.drafters import ngram_tables as nt
from ngspec.errors import NgspecError
from ngspec.models import tiny_model

ANCHOR = [3, 1, 4]


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama", seed=5)


@pytest.fixture(scope="module")
def tables(model):
    return nt.build_tables(model, ANCHOR, batch_size=40)


def test_unigram_is_the_covariance_distance_ranking(model, tables):
    emb_in = model.get_input_embeddings().weight.detach().double()
    emb_out = model.get_output_embeddings().weight.detach().double()
    sigma = np.cov(emb_in.numpy().T)
    mean = emb_out.mean(0).numpy()
    scores = [float((u - mean) @ sigma @ (u - mean)) for u in emb_out.numpy()]
    expected = sorted(range(len(scores)), key=lambda i: -scores[i])
    assert tables.unigram.tolist() == expected[: len(tables.unigram)]


def test_bigram_rows_are_the_top_k_after_anchor_and_token(model, tables):
    assert tables.bigram.shape == (96, nt.TOP_K)
    with torch.inference_mode():
        for x in (0, 7, 50, 95):
            logits = model(input_ids=torch.tensor([ANCHOR + [x]])).logits[0, -1]
            top = torch.topk(logits, nt.TOP_K).indices.tolist()
            assert tables.bigram[x, :4].tolist() == top[:4]  # leading entries (later ones may tie-swap)


def test_bigram_without_anchor_is_the_lone_token(model):
    table = nt.bigram_topk(model, top_k=3, batch_size=32)
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([[11]])).logits[0, -1]
    assert table[11].tolist() == torch.topk(logits, 3).indices.tolist()


def test_extended_chains_follow_the_top_bigram(tables):
    ext = tables.extended
    assert ext.shape == (96, nt.TOP_K, nt.WIDTH)
    for x in (2, 40):
        for j in (0, 5):
            chain = [int(tables.bigram[x, j])]
            while len(chain) < nt.WIDTH:
                chain.append(int(tables.bigram[chain[-1], 0]))
            assert ext[x, j].tolist() == chain
    assert tables.chain(9, 4) == [9, *ext[9, 0, :3].tolist()]


def test_save_load_round_trip_and_refusals(tmp_path, model, tables):
    path = tmp_path / "t.npz"
    nt.save_tables(tables, path, "tiny")
    assert not list(tmp_path.glob(".*tmp*"))
    back = nt.load_tables(path, tables.fingerprint, 96)
    for name in ("unigram", "bigram", "extended"):
        assert np.array_equal(getattr(back, name), getattr(tables, name))
    other = tiny_model("llama", seed=6)
    with pytest.raises(NgspecError, match="built for another model"):
        nt.load_tables(path, nt.model_fingerprint(other, ANCHOR), 96)
    with pytest.raises(NgspecError, match="96-token vocabulary"):
        nt.load_tables(path, tables.fingerprint, 128)
    whole = path.read_bytes()
    for content, says in [(whole[:300], "the archive is cut short or damaged"), (b"", "it is empty"), (b"garbage", "not a .npz archive")]:
        path.write_bytes(content)  # they said only the exception's class: "(BadZipFile)", "(EOFError)", "(ValueError)"
        with pytest.raises(NgspecError) as refused:
            nt.load_tables(path)
        assert str(refused.value) == f"{path} is a damaged n-gram table file ({says}); rebuild it with `ngspec build-bigram`"
    np.savez(path, meta=np.frombuffer(b"\xff{", dtype=np.uint8), unigram=tables.unigram)
    with pytest.raises(NgspecError, match=r"\(its meta entry is not JSON text\)"):
        nt.load_tables(path)
    np.savez(path, meta=np.frombuffer(b"{}", dtype=np.uint8), unigram=tables.unigram)
    with pytest.raises(NgspecError, match=r"\(no bigram array in it\)"):
        nt.load_tables(path)
    with pytest.raises(NgspecError, match="no n-gram tables"):
        nt.load_tables(tmp_path / "missing.npz")
    with pytest.raises(NgspecError, match="is a directory; give the table file"):
        nt.load_tables(tmp_path)


def test_a_table_for_this_model_after_another_anchor_says_so(tmp_path, model, tables):
    """A table built for a model read with its tokenizer, given for the same model without one (a
    `Speculator.from_model(model, None, ...)`): it was refused as "built for another model"."""
    path = tmp_path / "t.npz"
    nt.save_tables(tables, path, "tiny")
    assert nt.load_tables(path).anchor == ANCHOR
    with pytest.raises(NgspecError) as refused:
        nt.cached_tables(model, "tiny", [], path)
    assert f"was built for this model read with a tokenizer (each token's next tokens measured after the tokens {ANCHOR}" in str(refused.value)
    with pytest.raises(NgspecError, match="built for another model"):  # another model after another anchor
        nt.cached_tables(tiny_model("llama", seed=6), "other", [], path)
    nt.save_tables(nt.NgramTables(tables.fingerprint, tables.unigram, tables.bigram, tables.extended), path, "tiny")  # as files before anchors
    with pytest.raises(NgspecError, match="built for another model"):
        nt.cached_tables(model, "tiny", [], path)
    nt.save_tables(nt.NgramTables(tables.fingerprint, tables.unigram, tables.bigram, tables.extended, [96]), path, "tiny")
    with pytest.raises(NgspecError, match=r"\(its anchor is not a list of token ids\)"):
        nt.load_tables(path)


def test_fingerprint_depends_on_weights_and_anchor(model):
    assert nt.model_fingerprint(model, ANCHOR) == nt.model_fingerprint(model, ANCHOR)
    assert nt.model_fingerprint(model, ANCHOR) != nt.model_fingerprint(model, [])
    assert nt.model_fingerprint(model) != nt.model_fingerprint(tiny_model("llama", seed=6))


def test_cache_builds_once_and_rebuilds_a_damaged_entry(tmp_path, monkeypatch, model):
    monkeypatch.setenv("NGSPEC_CACHE", str(tmp_path))
    first = nt.cached_tables(model, "tiny", ANCHOR)
    path = nt.default_table_path(first.fingerprint)
    assert path.is_file()
    monkeypatch.setattr(nt, "build_tables", lambda *a, **k: pytest.fail("should read the cache"))
    assert np.array_equal(nt.cached_tables(model, "tiny", ANCHOR).bigram, first.bigram)
    path.write_bytes(b"not a zip")
    notes = []
    monkeypatch.setattr(nt, "build_tables", lambda m, a, progress=None: first)
    nt.cached_tables(model, "tiny", ANCHOR, notify=notes.append)
    assert notes and "damaged" in notes[0] and "rebuilding" in notes[0]
    assert nt.load_tables(path).fingerprint == first.fingerprint  # rewritten whole


def test_explicit_table_for_another_model_is_refused_not_replaced(tmp_path, model, tables):
    path = tmp_path / "t.npz"
    nt.save_tables(tables, path, "tiny")
    before = path.read_bytes()
    with pytest.raises(NgspecError, match="another model"):
        nt.cached_tables(tiny_model("llama", seed=6), "other", ANCHOR, path=path)
    assert path.read_bytes() == before


def test_anchor_is_the_generation_prompt_of_a_chat_template():
    from ngspec.models import load_tokenizer

    tok = load_tokenizer()
    assert tok.decode(nt.table_anchor(tok)) == "<|im_start|>assistant\n"
    assert nt.table_anchor(None) == []
