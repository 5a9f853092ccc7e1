"""train-eagle: the objective learns, checkpoints resume exactly, the saved head drafts the same."""

from __future__ import annotations

import json
from dataclasses import asdict

import pytest
import torch
from typer.testing import CliRunner

from ngspec.cli.app import app
from ngspec.contracts import DraftContext
from ngspec.drafters.eagle import EagleOptions, eagle_factory
from ngspec.eagle import train as train_module
from ngspec.eagle.head import load_draft_vocab, load_head
from ngspec.eagle.train import Example, TrainOptions, target_features, train_head
from ngspec.errors import NgspecError
from ngspec.models import tiny_model
from ngspec.target import TargetModel


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama", seed=11)


def examples(n=6, seed=0):
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        phrase = torch.randint(3, 96, (6,), generator=gen)
        ids = torch.cat([torch.randint(3, 96, (5,), generator=gen), phrase.repeat(5)])
        out.append(Example(ids, 5, ids[:5].tolist()))
    return out


def test_training_lowers_the_loss(tmp_path, model):
    data = examples()
    feats = target_features(model, data)
    _, log = train_head(model, data, feats, tmp_path, TrainOptions(epochs=12, batch_tokens=70, lr=3e-3, warmup=2, noise=0.0))
    first = sum(e["reg"] for e in log[:3]) / 3
    last = sum(e["reg"] for e in log[-3:]) / 3
    assert last < 0.7 * first
    assert (tmp_path / "model.safetensors").is_file() and not (tmp_path / "checkpoint.pt").exists()


def test_interrupted_run_resumes_to_the_same_head(tmp_path, model, monkeypatch):
    data = examples(seed=1)
    feats = target_features(model, data)
    opts = TrainOptions(epochs=3, batch_tokens=70, noise=0.0, checkpoint_every=2)
    full, _ = train_head(model, data, feats, tmp_path / "full", opts)

    real = train_module.example_loss
    calls = {"n": 0}

    def flaky(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 9:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(train_module, "example_loss", flaky)
    with pytest.raises(KeyboardInterrupt):
        train_head(model, data, feats, tmp_path / "cut", opts)
    state = torch.load(tmp_path / "cut" / "checkpoint.pt", weights_only=True)
    assert state["step"] >= 1
    monkeypatch.setattr(train_module, "example_loss", real)
    resumed, log = train_head(model, data, feats, tmp_path / "cut", opts)
    assert [e["step"] for e in log] == list(range(1, len(log) + 1))
    for (k, a), (_, b) in zip(sorted(full.state_dict().items()), sorted(resumed.state_dict().items())):
        torch.testing.assert_close(a, b, msg=k)


@pytest.mark.parametrize("every, resumes", [(2, "resumes from its last checkpoint"), (1000, "trains again (no checkpoint was due)")])
def test_a_head_that_cannot_be_saved_says_what_a_rerun_keeps(tmp_path, model, monkeypatch, every, resumes):
    """A disk that fills at the end of training (`benchmarks/full_disk.py`): it said only "No space
    left on device: OUT/model.safetensors", leaving the user to guess whether the training was
    lost; the checkpoint stays, and the same run again resumes from it and saves the head."""
    from ngspec.eagle.train import CHECKPOINT

    data = examples(seed=1)
    feats = target_features(model, data)
    opts = TrainOptions(epochs=3, batch_tokens=70, noise=0.0, checkpoint_every=every)

    def full(directory, responses, prior=None):  # at the last file, the head's weights saved
        raise OSError(28, "No space left on device", str(directory / ".draft_vocab.json.tmp-1"))

    monkeypatch.setattr(train_module, "save_draft_vocab", full)
    with pytest.raises(NgspecError) as failed:
        train_head(model, data, feats, tmp_path, opts)
    assert str(failed.value) == (f"the head is trained but could not be saved (No space left on device: {tmp_path / 'draft_vocab.json'}); "
                                 f"make room and run the same command again: it {resumes}")  # no features stored (the CLI's are)
    assert (tmp_path / CHECKPOINT).is_file() == (every == 2)
    assert not (tmp_path / "model.safetensors").exists() and not (tmp_path / "config.json").exists()  # no head in part: the CLI's rerun would refuse --out
    monkeypatch.undo()
    train_head(model, data, feats, tmp_path, opts)
    assert (tmp_path / "model.safetensors").is_file() and not (tmp_path / CHECKPOINT).exists()


def test_checkpoint_from_other_options_is_refused(tmp_path, model, monkeypatch):
    data = examples(seed=2)
    feats = target_features(model, data)
    monkeypatch.setattr(train_module, "example_loss", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt))
    with pytest.raises(KeyboardInterrupt):
        train_head(model, data, feats, tmp_path, TrainOptions(epochs=1, batch_tokens=70))
    monkeypatch.undo()

    with pytest.raises(NgspecError, match="other options or data"):
        train_head(model, data, feats, tmp_path, TrainOptions(epochs=2, batch_tokens=70))


def test_a_damaged_or_foreign_checkpoint_is_refused_in_one_sentence(tmp_path, model):
    """It said "cannot resume from ... (RuntimeError: PytorchStreamReader failed reading zip
    archive: ...)" and torch's paragraph on miniz; another model's head gave every mismatched
    tensor's shape."""
    data = examples(seed=2)
    feats = target_features(model, data)
    opts = TrainOptions(epochs=1, batch_tokens=70)
    ckpt = tmp_path / "checkpoint.pt"
    ckpt.write_bytes(b"PK\x03\x04garbage")
    with pytest.raises(NgspecError) as err:
        train_head(model, data, feats, tmp_path, opts)
    assert str(err.value) == f"cannot resume from {ckpt} (PytorchStreamReader failed reading zip archive: not a ZIP archive.); delete it to start over"
    torch.save([1, 2], ckpt)
    with pytest.raises(NgspecError, match=r"checkpoint.pt is not a train-eagle checkpoint; use another --out or delete it$"):
        train_head(model, data, feats, tmp_path, opts)
    torch.save({"head": {"fc.weight": torch.zeros(3, 3)}, "options": asdict(opts), "examples": len(data)}, ckpt)
    with pytest.raises(NgspecError, match=r"^cannot resume from \S+ \(Error\(s\) in loading state_dict for EagleHead:\); delete it") as err:
        train_head(model, data, feats, tmp_path, opts)
    assert "torch.Size" not in str(err.value)


def test_saved_head_drafts_like_the_trained_one(tmp_path, model):
    data = examples(seed=3)
    head, _ = train_head(model, data, target_features(model, data), tmp_path, TrainOptions(epochs=1, batch_tokens=70))
    loaded = load_head(tmp_path, model)
    assert set(load_draft_vocab(tmp_path)) == {int(t) for ex in data for t in ex.ids[ex.prompt_len :]}
    trees = []
    for h in (head, loaded):
        drafter = eagle_factory(model, h, EagleOptions(top_k=3, depth=3, total_tokens=8))()
        target = TargetModel(model)
        target.keep_features = True
        prompt = data[0].ids[:12].tolist()
        logits = target.prefill(prompt)
        drafter.start(prompt)
        ctx = DraftContext(prompt + [int(logits.argmax())], len(prompt), 16, (), target.take_features())
        trees.append(drafter.propose(ctx))
    assert trees[0] == trees[1] and trees[0].size == 8


def test_fine_tuning_starts_from_the_given_head_and_keeps_its_vocabulary(tmp_path, model):
    from collections import Counter

    from ngspec.eagle.head import draft_vocab_counts

    first, second = examples(seed=6), examples(seed=7)
    trained, _ = train_head(model, first, target_features(model, first), tmp_path / "a", TrainOptions(epochs=2, batch_tokens=70))
    feats = target_features(model, second)
    still, _ = train_head(model, second, feats, tmp_path / "b", TrainOptions(epochs=1, batch_tokens=70, lr=1e-12, init_head=str(tmp_path / "a")))
    fresh, _ = train_head(model, second, feats, tmp_path / "c", TrainOptions(epochs=1, batch_tokens=70, lr=1e-12))
    weights = trained.state_dict()
    assert all(torch.allclose(v, weights[k], atol=1e-6) for k, v in still.state_dict().items())
    assert not torch.allclose(fresh.fc.weight, trained.fc.weight, atol=1e-3)
    responses = Counter(int(t) for ex in first + second for t in ex.ids[ex.prompt_len :])
    assert draft_vocab_counts(tmp_path / "b") == dict(responses)


def test_fine_tuning_a_missing_head_is_refused(model):

    with pytest.raises(NgspecError, match="no EAGLE head directory"):
        train_module.initial_head(model, "no/such/head")


runner = CliRunner()


def test_corpus_without_pairs_is_refused(tmp_path):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text(json.dumps({"text": "no pairs here"}) + "\n")
    result = runner.invoke(app, ["train-eagle", "-c", str(corpus), "--out", str(tmp_path / "h")])
    assert result.exit_code == 1 and "usable (instruction, response) examples" in result.output and "--loss-on all" in result.output
    assert not (tmp_path / "h").exists()  # a refused run leaves no empty head directory behind


def test_unroll_below_one_is_refused(tmp_path):
    result = runner.invoke(app, ["train-eagle", "-c", "corpora/smollm2-self.jsonl", "--out", str(tmp_path / "h"), "--unroll", "0"])
    assert result.exit_code == 1 and "--unroll must be >= 1 (got 0)" in result.output and "Traceback" not in result.output
    assert not (tmp_path / "h").exists()


def test_loss_on_all_covers_the_instruction_positions(model):
    """With the loss on every position, each pair the head reads is scored (T - 1 of a T-token
    example); on the response alone, from the pair that predicts the first response token on."""
    ex = examples()[0]
    feats = target_features(model, [ex])[0]
    head = train_module.EagleHead(train_module.head_config_for(model))
    _, response = train_module.example_loss(head, model, ex, feats, TrainOptions(noise=0.0))
    _, every = train_module.example_loss(head, model, ex, feats, TrainOptions(noise=0.0, loss_on="all"))
    assert response["tokens"] == len(ex.ids) - ex.prompt_len + 1
    assert every["tokens"] == len(ex.ids) - 1


def test_loss_on_all_learns_what_only_the_instructions_hold(tmp_path, model):
    """Instructions that repeat a phrase and responses of noise: trained on the instructions too,
    the head predicts the phrase where it repeats; trained on the responses alone it cannot."""
    gen = torch.Generator().manual_seed(5)
    data = []
    for _ in range(6):
        phrase = torch.randint(3, 96, (5,), generator=gen)
        prompt = phrase.repeat(6)
        ids = torch.cat([prompt, torch.randint(3, 96, (6,), generator=gen)])
        data.append(Example(ids, len(prompt), prompt.tolist()))
    feats = target_features(model, data)
    scores = {}
    for loss_on in ("response", "all"):
        opts = TrainOptions(epochs=12, batch_tokens=120, lr=3e-3, warmup=2, noise=0.0, ce_vocab=0, loss_on=loss_on)
        head, _ = train_head(model, data, feats, tmp_path / loss_on, opts)
        with torch.no_grad():  # top-1 agreement with the model over the instructions' later repeats
            stats = [train_module.example_loss(head, model, Example(ex.ids[: ex.prompt_len], 15, ex.prompt), f[: ex.prompt_len], TrainOptions(noise=0.0))[1]
                     for ex, f in zip(data, feats)]
        scores[loss_on] = sum(s["top1"] * s["tokens"] for s in stats) / sum(s["tokens"] for s in stats)
    assert scores["all"] > scores["response"] + 0.2, scores


@pytest.mark.slow
def test_records_without_a_response_are_documents_with_loss_on_all(default_model):
    tokenizer = default_model.tokenizer
    records = [
        {"instruction": "Name a colour.", "response": "Blue is a colour that many people like."},
        {"instruction": "Name a fruit.", "input": "", "output": "An apple is a fruit that grows on trees."},  # Alpaca
        {"prompt": "Name a tree.", "completion": "An oak is a tree that lives for centuries."},  # TRL's prompt-completion
        {"text": "A passage about rivers, which flow from the hills down to the sea, carrying silt."},
        {"question_id": 1, "turns": ["Summarize: the council met on Tuesday and voted to repair the old bridge."]},
        {"instruction": "Read this and answer later: the museum opens at nine and closes at five."},
        {"text": "too short"},
        {"title": "no text at all"},
    ]
    answered = train_module.examples_from_records(records, tokenizer, 256)
    both = train_module.examples_from_records(records, tokenizer, 256, documents=True)
    assert len(answered) == 3 and all(ex.prompt_len < len(ex.ids) for ex in answered)
    assert ["apple" in tokenizer.decode(answered[1].ids[answered[1].prompt_len:]), "oak" in tokenizer.decode(answered[2].ids[answered[2].prompt_len:])] == [True, True]
    documents = both[3:]
    assert len(both) == 6 and [ex.ids.tolist() for ex in both[:3]] == [ex.ids.tolist() for ex in answered]  # answered records are not documents too
    assert all(ex.prompt_len == len(ex.ids) and ex.prompt == ex.ids.tolist() for ex in documents)
    assert ["rivers" in tokenizer.decode(documents[0].ids), "bridge" in tokenizer.decode(documents[1].ids),
            "museum" in tokenizer.decode(documents[2].ids)] == [True, True, True]
    assert torch.equal(documents[0].taught, documents[0].ids) and torch.equal(both[0].taught, both[0].ids[both[0].prompt_len :])
    # a layout no format knows (GSM8K's question/answer), by its fields: none were usable before
    gsm = [{"question": "What is 6 times 7?", "answer": "6 times 7 is 42, since 6 sevens make 42.\n#### 42"}]
    assert train_module.examples_from_records(gsm, tokenizer, 256) == []
    (named,) = train_module.examples_from_records(gsm, tokenizer, 256, fields=("question", "answer"))
    assert "6 sevens" in tokenizer.decode(named.ids[named.prompt_len:]) and "6 times 7?" in tokenizer.decode(named.ids[: named.prompt_len])


def test_a_head_trained_on_documents_alone_drafts_over_their_tokens(tmp_path, model):
    data = [Example(ex.ids, len(ex.ids), ex.ids.tolist()) for ex in examples(n=4, seed=6)]
    head, log = train_head(model, data, target_features(model, data), tmp_path, TrainOptions(epochs=2, batch_tokens=70, loss_on="all"))
    vocab = load_draft_vocab(tmp_path)
    assert log and set(vocab) == {int(t) for ex in data for t in ex.ids}
    with pytest.raises(NgspecError, match="--loss-on all"):
        train_head(model, data, target_features(model, data), tmp_path / "r", TrainOptions(epochs=1, batch_tokens=70))


def test_loss_on_must_be_response_or_all(tmp_path):
    result = runner.invoke(app, ["train-eagle", "-c", "corpora/smollm2-self.jsonl", "--out", str(tmp_path / "h"), "--loss-on", "prompt"])
    assert result.exit_code == 1 and "--loss-on must be response or all" in result.output and "Traceback" not in result.output


def test_fine_tuning_into_its_own_directory_is_refused(tmp_path):
    result = runner.invoke(app, ["train-eagle", "-c", "corpora/smollm2-self.jsonl", "--out", str(tmp_path), "--init-head", str(tmp_path)])
    assert result.exit_code == 1 and "--out must differ from --init-head" in result.output and "Traceback" not in result.output


def test_a_finished_head_is_not_trained_over(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"weights")  # a finished run leaves weights and no checkpoint
    result = runner.invoke(app, ["train-eagle", "-c", "corpora/smollm2-self.jsonl", "--out", str(tmp_path)])
    assert result.exit_code == 1 and "already holds a trained head" in result.output and "Traceback" not in result.output
    assert (tmp_path / "model.safetensors").read_bytes() == b"weights"


def test_fine_tuning_a_missing_head_fails_before_the_feature_pass(tmp_path):
    result = runner.invoke(app, ["train-eagle", "-c", "corpora/smollm2-self.jsonl", "--out", str(tmp_path / "h"), "--init-head", str(tmp_path / "none")])
    assert result.exit_code == 1 and "no EAGLE head directory" in result.output and "Traceback" not in result.output
    assert not (tmp_path / "h").exists()


@pytest.mark.parametrize("json_out", [False, True])
def test_a_training_report_that_cannot_be_written_leaves_no_doubt_about_the_head(tiny_saved, tmp_path, monkeypatch, json_out):
    """A disk that fills at train_report.json, the last file: the head is saved by then, and the
    message says so; the report is shown before it is written (it was written first)."""
    from ngspec import staging

    real = staging.write_text

    def full_at_the_report(out, text):
        if out.name == "train_report.json":
            raise OSError(28, "No space left on device", str(out))
        return real(out, text)

    monkeypatch.setattr(staging, "write_text", full_at_the_report)
    out = tmp_path / "head"
    result = runner.invoke(app, ["train-eagle", "--model", str(tiny_saved), "-c", "corpora/smollm2-self.jsonl", "--out", str(out), "--max-records", "4",
                                 "--epochs", "1", "--holdout", "1", "--eval-tokens", "4", *(["--json"] if json_out else [])])
    assert result.exit_code == 1
    assert " ".join(result.stderr.split()).endswith(f"error: No space left on device: {out / 'train_report.json'}; the head itself is saved in {out} "
                                                    "(only its training report is missing)")
    assert (out / "model.safetensors").is_file() and not (out / "train_report.json").exists()
    assert ('"evaluation"' if json_out else "head written to") in result.stdout


@pytest.mark.slow
def test_train_eagle_command_on_the_default_model(tmp_path):
    out = tmp_path / "head"
    result = runner.invoke(app, ["train-eagle", "-c", "corpora/smollm2-self.jsonl", "--out", str(out), "--max-records", "6",
                                 "--epochs", "1", "--holdout", "1", "--eval-tokens", "8", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["evaluation"]["identical_to_greedy"] == 1
    assert (out / "config.json").is_file() and (out / "train_report.json").is_file()


@pytest.mark.slow
def test_train_eagle_command_trains_on_documents_alone(tmp_path):
    """A file of texts without answers (as a question file or a folder of documents gives) trains a
    head with --loss-on all; without it the file is refused with the hint."""
    texts = [json.loads(line)["response"] for line in open("corpora/smollm2-self.jsonl")][:6]
    corpus = tmp_path / "docs.jsonl"
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    out = tmp_path / "head"
    args = ["train-eagle", "-c", str(corpus), "--out", str(out), "--epochs", "1", "--holdout", "1", "--eval-tokens", "8", "--json"]
    refused = runner.invoke(app, args)
    assert refused.exit_code == 1 and "--loss-on all" in refused.output
    result = runner.invoke(app, [*args, "--loss-on", "all"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["documents"] == report["examples"] == 5 and report["evaluation"]["identical_to_greedy"] == 1
    assert load_draft_vocab(out)


@pytest.mark.slow
def test_train_eagle_command_fine_tunes_a_head_of_the_default_model(tmp_path):
    from ngspec.eagle.head import EagleHead, draft_vocab_counts, head_config_for, save_draft_vocab, save_head
    from ngspec.models import load_model

    target = load_model("default", "cpu", "float32").model
    start = tmp_path / "start"
    start.mkdir()
    save_head(EagleHead(head_config_for(target)), start)
    save_draft_vocab(start, [[7, 7, 8]])
    out = tmp_path / "tuned"
    result = runner.invoke(app, ["train-eagle", "-c", "corpora/smollm2-self.jsonl", "--out", str(out), "--init-head", str(start),
                                 "--max-records", "4", "--epochs", "1", "--holdout", "1", "--eval-tokens", "8", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["options"]["init_head"] == str(start) and report["evaluation"]["identical_to_greedy"] == 1
    counts = draft_vocab_counts(out)
    assert counts.get(7, 0) >= 2 and counts.get(8, 0) >= 1  # the first head's vocabulary is kept


def test_cross_entropy_vocabulary_is_the_most_frequent_response_tokens(model):
    from ngspec.eagle.train import example_loss, output_weight

    data = examples(n=3, seed=4)
    full = model.get_output_embeddings().weight
    assert output_weight(model, data, 0) is full
    counts = torch.bincount(torch.cat([ex.ids[ex.prompt_len :] for ex in data]), minlength=full.shape[0])
    weight = output_weight(model, data, 5)
    rows = [int(torch.nonzero((full == row).all(-1))[0]) for row in weight]
    assert rows == sorted(rows) and len(rows) == 5
    assert min(counts[rows]) >= max(counts[[t for t in range(len(counts)) if t not in rows]])
    head = train_module.EagleHead(train_module.head_config_for(model))
    feats = target_features(model, data[:1])[0]
    opts = TrainOptions(noise=0.0)
    torch.manual_seed(0)
    whole, _ = example_loss(head, model, data[0], feats, opts)
    torch.manual_seed(0)
    same, _ = example_loss(head, model, data[0], feats, opts, output_weight(model, data, 0))
    restricted, stats = example_loss(head, model, data[0], feats, opts, weight)
    assert torch.equal(whole, same) and not torch.equal(whole, restricted) and 0 <= stats["top1"] <= 1


def test_unrolled_depths_see_what_a_draft_node_sees(model):
    """Depth s of the unrolled objective equals drafting s tokens deep with a cache: the true
    features of positions 0..j, then the head's own predictions one position at a time."""
    from transformers import DynamicCache

    from ngspec.eagle.head import EagleHead, head_config_for

    torch.manual_seed(3)
    head = EagleHead(head_config_for(model)).eval()
    T, H = 8, model.config.hidden_size
    embeds, feats = torch.randn(T - 1, H), torch.randn(T - 1, H)
    with torch.no_grad():
        outs = train_module.unrolled_outputs(head, embeds, feats, 3)
        assert [len(o) for o in outs] == [T - 1, T - 2, T - 3]
        for j in range(T - 3):
            cache = DynamicCache()
            pos = torch.arange(j + 1)[None]
            pred = head(embeds[None, : j + 1], feats[None, : j + 1], pos, cache=cache)[0, -1]
            assert torch.allclose(pred, outs[0][j], atol=1e-5)
            for s in (2, 3):
                p = torch.tensor([[j + s - 1]])
                pred = head(embeds[None, j + s - 1 : j + s], pred[None, None], p, cache=cache)[0, -1]
                assert torch.allclose(pred, outs[s - 1][j], atol=1e-5), (j, s)


def test_unrolled_training_learns_the_deeper_depth(tmp_path, model):
    data = examples(seed=2)
    feats = target_features(model, data)
    opts = TrainOptions(epochs=12, batch_tokens=70, lr=3e-3, warmup=2, noise=0.0, unroll=2)
    _, log = train_head(model, data, feats, tmp_path, opts)
    assert sum(e["reg"] for e in log[-3:]) < 0.7 * sum(e["reg"] for e in log[:3])
    assert sum(e["top1_last"] for e in log[-3:]) > sum(e["top1_last"] for e in log[:3])
    with pytest.raises(Exception, match="--unroll"):
        TrainOptions(unroll=0)


def test_training_and_drafting_on_a_bfloat16_model(tmp_path):
    """On a GPU the target runs in bfloat16 while the head trains in float32 (a crash found on the
    first GPU run); the CPU's bfloat16 kernels reproduce it."""
    from ngspec.eagle.train import evaluate
    from ngspec.engine import Engine
    from ngspec.models import LoadedModel

    model = tiny_model("llama", seed=11).to(torch.bfloat16)
    data = examples(seed=5)
    head, log = train_head(model, data[:-1], target_features(model, data[:-1]), tmp_path, TrainOptions(epochs=2, batch_tokens=70, unroll=2))
    assert len(log) > 0 and all(torch.isfinite(torch.tensor(e["reg"])) for e in log)
    engine = Engine(LoadedModel(model, None, "tiny-bf16"), calibrate=False)
    report = evaluate(engine, head, data[-1:], 8, EagleOptions(top_k=3, depth=3, total_tokens=8))
    assert report["prompts"] == 1 and report["tokens_per_call"] >= 1.0
    assert load_head(tmp_path, model).fc.weight.dtype == torch.bfloat16


def test_bad_training_options_are_each_named_with_their_value():
    with pytest.raises(NgspecError) as caught:
        TrainOptions(epochs=0, lr=-1.0, max_len=4)
    assert str(caught.value) == "--epochs must be >= 1 (got 0); --max-len must be >= 8 (got 4); --lr must be > 0 and finite (got -1.0)"
    with pytest.raises(NgspecError, match=r"^--lr must be > 0 and finite \(got nan\); --noise must be >= 0 and finite \(got inf\)$"):
        TrainOptions(lr=float("nan"), noise=float("inf"))  # an infinite noise (or lr) trained a head of NaNs
    with pytest.raises(NgspecError, match=r"--lr must be > 0 and finite \(got inf\)"):
        TrainOptions(lr=float("inf"))
    with pytest.raises(NgspecError, match=r"^--unroll must be >= 1 \(got 0\)$"):
        TrainOptions(unroll=0)
    TrainOptions()  # the defaults pass


def test_an_interrupted_feature_pass_continues_where_it_stopped(tmp_path, model, monkeypatch):
    """The feature pass stores its features in shards as it goes: stopped after its second shard
    and run again, it reads those and computes only the rest, and the features equal one
    uninterrupted pass's. A shard of another corpus is removed; a damaged one is computed again."""
    data = examples(n=7, seed=5)
    whole = target_features(model, data)
    store = tmp_path / "features"
    done = []

    def stop_after_four(n):
        done.append(n)
        if len(done) == 5:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        target_features(model, data, stop_after_four, store, shard_tokens=2 * 35)  # 35 tokens an example: shards of 2
    assert len(list(store.glob("*.pt"))) == 2  # examples 0-1 and 2-3; the fifth was never stored
    computed = []
    real = train_module.forward_with_features
    monkeypatch.setattr(train_module, "forward_with_features", lambda *a, **k: computed.append(1) or real(*a, **k))
    seen, stored = [], []
    again = target_features(model, data, seen.append, store, shard_tokens=2 * 35, stored=stored.append)
    assert len(computed) == 3 and stored == [4 * 35] and seen == [35] * 3  # the stored four counted apart, once
    assert len(again) == len(whole) and all(torch.equal(a, b) for a, b in zip(again, whole))
    assert len(list(store.glob("*.pt"))) == 4
    # other examples: the stored shards are another pass's, removed, and everything computed afresh
    computed.clear()
    other = examples(n=3, seed=6)
    target_features(model, other, None, store, shard_tokens=10**6)
    assert len(computed) == 3 and len(list(store.glob("*.pt"))) == 1
    # a damaged shard: computed again from there
    (shard,) = store.glob("*.pt")
    shard.write_bytes(b"cut")
    computed.clear()
    redone = target_features(model, other, None, store, shard_tokens=10**6)
    assert len(computed) == 3 and all(torch.equal(a, b) for a, b in zip(redone, target_features(model, other)))


def test_a_finished_training_removes_its_stored_features(tmp_path, model):
    data = examples(n=4, seed=7)
    feats = target_features(model, data, None, tmp_path / train_module.FEATURES)
    assert list((tmp_path / train_module.FEATURES).glob("*.pt"))
    train_head(model, data, feats, tmp_path, TrainOptions(epochs=1, batch_tokens=70))
    assert not (tmp_path / train_module.FEATURES).exists() and (tmp_path / "model.safetensors").is_file()
