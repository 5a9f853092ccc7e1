"""Training an EAGLE-1 head for any causal LM from a corpus of (instruction, response) records.

The objective is EAGLE's: at every position i of a chat-formatted example the head sees the
target's feature ``f_i`` and the next token ``x_{i+1}`` and predicts ``f_{i+1}``; the loss is a
smooth-L1 regression to the true feature plus 0.1 × the cross-entropy between the target's
next-token distribution (its LM head on ``f_{i+1}``) and the LM head on the prediction, both over
response positions only, or with ``loss_on="all"`` over the instruction's positions too: the label
is the target's own distribution wherever the text came from, so a corpus's documents (a RAG
prompt's passages, an article to summarise) teach the head as well as the answers written about
them, and records without any answer (a file of prompts or documents) can be trained on as they
are. Uniform noise on the input features (EAGLE's augmentation) makes the head
robust to its own errors when it drafts several tokens deep.

With ``unroll`` k > 1 the head is also trained as it drafts at depths 2..k ("training-time test",
as HASS and EAGLE-3 do): at depth s the input at position j+s-1 is the head's own depth-(s-1)
prediction, and the query attends to the true-feature entries of positions 0..j plus its own chain's
predicted entries, exactly the cache a depth-s draft node sees. Each depth's loss is added with the
same weight; a step costs about k times as much.

With ``init_head`` training starts from a trained EAGLE-1 head instead of the target's weights
(fine-tuning a general head on one's own traffic); the new head's draft vocabulary is the union of
the old one and the new responses' tokens, ranked by their counts in both corpora.

The target runs once over the corpus (its features are kept in memory as bfloat16, about 1 KB per
token for the default model, and stored in ``--out``'s `FEATURES` directory as the pass goes, so an
interrupted pass continues where it stopped); then the head trains for ``epochs`` passes with
AdamW, a warm-up and cosine decay. A checkpoint (head, optimiser, position in the data) is written
atomically every ``checkpoint_every`` steps and on interruption; a run started again with the same
``--out`` resumes from it. Both are removed once the head is saved.
"""

from __future__ import annotations

import json
import math
import random
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Iterable

import torch
import torch.nn.functional as F
from transformers import DynamicCache

from ngspec import staging
from ngspec.eagle.head import SAVED, EagleHead, draft_vocab_counts, head_config_for, init_from_target, load_head, ranked_tokens, save_draft_vocab, save_head
from ngspec.errors import NgspecError, first_sentence
from ngspec.target import forward_with_features
from ngspec.tree import additive_mask

CHECKPOINT = "checkpoint.pt"
FEATURES = "features"  # the directory in --out where the feature pass is stored as it goes


@dataclass(frozen=True)
class TrainOptions:
    epochs: int = 4
    lr: float = 1e-3
    warmup: int = 20
    batch_tokens: int = 4096  # tokens per optimiser step (whole examples, gradient accumulated)
    max_len: int = 640
    noise: float = 0.1
    ce_weight: float = 0.1
    unroll: int = 1  # depths trained on the head's own predictions (1 = EAGLE-1's teacher forcing only)
    ce_vocab: int = 8192  # > 0: cross-entropy over the responses' N most frequent tokens (the draft vocabulary)
    holdout: int = 12  # examples kept aside to measure acceptance
    checkpoint_every: int = 50
    seed: int = 0
    init_head: str = ""  # a trained EAGLE-1 head to start from (fine-tuning); "" = initialise from the target
    loss_on: str = "response"  # positions trained: "response" (the answers) or "all" (the instructions too)

    def __post_init__(self) -> None:
        if self.loss_on not in ("response", "all"):
            raise NgspecError(f"--loss-on must be response or all (got {self.loss_on!r})")
        rules = (
            ("--epochs", self.epochs, 1), ("--batch-tokens", self.batch_tokens, 1), ("--max-len", self.max_len, 8),
            ("--holdout", self.holdout, 0), ("--ce-vocab", self.ce_vocab, 0), ("--checkpoint-every", self.checkpoint_every, 1),
            ("--unroll", self.unroll, 1),
        )
        bad = [f"{flag} must be >= {least} (got {value})" for flag, value, least in rules if value < least]
        if not 0 < self.lr < math.inf:  # NaN and infinity too: they train a head of NaNs
            bad.append(f"--lr must be > 0 and finite (got {self.lr})")
        if not 0 <= self.noise < math.inf:
            bad.append(f"--noise must be >= 0 and finite (got {self.noise})")
        if bad:
            raise NgspecError("; ".join(bad))


@dataclass
class Example:
    ids: torch.Tensor  # [T]
    prompt_len: int  # tokens of the chat-formatted input; the rest is the response (none for a document)
    prompt: list[int]

    @property
    def document(self) -> bool:
        """A text without a response (trained with the loss on every position only)."""
        return self.prompt_len >= len(self.ids)

    @property
    def taught(self) -> torch.Tensor:
        """The tokens whose counts rank the draft vocabulary: the response, or a document's whole text."""
        return self.ids if self.document else self.ids[self.prompt_len :]


DOCUMENT_FIELDS = ("text", "instruction", "prompt")  # where a record without a response keeps its text
MIN_DOCUMENT = 8  # tokens of a document's own text (the chat template adds more)


def document_text(record: dict) -> str | None:
    """The text of a record that holds no response: its ``text``, ``instruction`` or ``prompt``
    field, or the first of its ``turns`` (a question file such as Spec-Bench's)."""
    for key in DOCUMENT_FIELDS:
        if isinstance(record.get(key), str) and record[key].strip():
            return record[key]
    turns = record.get("turns")
    if isinstance(turns, list) and turns and isinstance(turns[0], str) and turns[0].strip():
        return turns[0]
    return None


def examples_from_records(records: Iterable[dict], tokenizer, max_len: int, documents: bool = False,
                          fields: tuple[str | None, str | None] = (None, None)) -> list[Example]:
    """Chat-formatted (input, response) examples; with ``documents`` a record that holds no
    response becomes an example of its chat-formatted text alone (for the loss on every position,
    ``loss_on="all"``); other records without a usable pair are skipped. ``fields``: the input and
    response fields to read instead of a detected layout (``--input-field``, ``--response-field``)."""
    from ngspec.metrics.pairs import record_pairs
    from ngspec.prompts import encode

    out = []
    eos = tokenizer.eos_token_id
    for n, record in enumerate(records):
        try:
            pairs = [p for p in record_pairs(record, str(n), {}, *fields) if p.response.strip() and p.input.strip()]
        except NgspecError:
            pairs = []
        for pair in pairs:
            prompt = encode(tokenizer, pair.input)
            response = tokenizer.encode(pair.response, add_special_tokens=False) + ([eos] if eos is not None else [])
            ids = (prompt + response)[:max_len]
            if len(ids) - len(prompt) >= 4:
                out.append(Example(torch.tensor(ids), len(prompt), prompt))
        text = document_text(record) if documents and not pairs else None
        if text is not None and len(tokenizer.encode(text, add_special_tokens=False)) >= MIN_DOCUMENT:
            ids = encode(tokenizer, text)[:max_len]
            out.append(Example(torch.tensor(ids), len(ids), ids))
    return out


@torch.inference_mode()
def target_features(
    model, examples: list[Example], progress: Callable[[int], None] | None = None, store: Path | None = None, shard_tokens: int = 1 << 16,
    stored: Callable[[int], None] | None = None,
) -> list[torch.Tensor]:
    """The target's last hidden states for every example, bfloat16, ``[T, H]`` each; ``progress``
    is told the tokens of each example computed.

    With ``store`` (a directory), they are also written there in shards of about ``shard_tokens``
    tokens as the pass goes, each whole or not at all, named by a fingerprint of the model and the
    examples: a pass run again on the same model and examples (after an interruption) reads the
    shards it finds and computes only the rest (``stored`` is told their tokens, once); shards of
    another model or corpus are removed."""
    device = next(model.parameters()).device
    out: list[torch.Tensor] = []
    key = _features_key(model, examples) if store is not None else ""
    if store is not None:
        store.mkdir(parents=True, exist_ok=True)
        out = _stored_features(store, key, examples)
        if stored and out:
            stored(sum(len(ex.ids) for ex in examples[: len(out)]))
    shard_start = len(out)
    for n in range(len(out), len(examples)):
        ex = examples[n]
        _, hidden = forward_with_features(lambda **extra: model(input_ids=ex.ids[None].to(device), logits_to_keep=1, **extra), model, True, None)
        hidden = hidden[0]
        out.append(hidden.to(torch.bfloat16).cpu())
        if store is not None and (n + 1 == len(examples) or sum(len(t) for t in out[shard_start:]) >= shard_tokens):
            _save_checkpoint(store / f"{key}-{shard_start:07d}.pt", {"first": shard_start, "features": out[shard_start:]})
            shard_start = n + 1
        if progress:
            progress(len(ex.ids))
    return out


def _features_key(model, examples: list[Example]) -> str:
    """What a stored feature pass must match: the model (`model_fingerprint`) and every example's tokens."""
    import hashlib

    from ngspec.drafters.ngram_tables import model_fingerprint

    digest = hashlib.sha256(model_fingerprint(model).encode())
    for ex in examples:
        digest.update(len(ex.ids).to_bytes(4, "little"))
        digest.update(ex.ids.to(torch.int64).numpy().tobytes())
    return digest.hexdigest()[:24]


def _stored_features(store: Path, key: str, examples: list[Example]) -> list[torch.Tensor]:
    """The features an earlier pass stored for ``key``, in order, up to the first gap or a shard that
    cannot be read (the pass computes from there); another key's shards are removed."""
    out: list[torch.Tensor] = []
    if not store.is_dir():
        return out
    for path in sorted(store.glob("*.pt")):
        if not path.name.startswith(f"{key}-"):
            path.unlink(missing_ok=True)  # a pass over another model or corpus
            continue
        try:
            shard = torch.load(path, map_location="cpu", weights_only=True)
            first, feats = int(shard["first"]), list(shard["features"])
        except Exception:  # noqa: BLE001 - a damaged shard is computed again
            break
        fits = first == len(out) and first + len(feats) <= len(examples) and all(
            len(f) == len(examples[first + i].ids) for i, f in enumerate(feats))
        if not fits:
            break
        out += feats
    return out


def output_weight(model, train: list[Example], ce_vocab: int, prior: dict[int, int] | None = None) -> torch.Tensor:
    """The LM-head rows the cross-entropy is computed over: the ``ce_vocab`` tokens most frequent
    in the training responses (and documents, `Example.taught`) plus ``prior`` counts (what the
    drafter drafts over with ``--draft-vocab``), or the whole matrix (``ce_vocab`` 0, or an LM head
    with a bias). On a CPU the two full-vocabulary products per position are most of a training step (the default model: 8,192 rows make a step 6.9x
    faster and hold 94% of the model's probability on its own answers, BENCHMARKS.md section 8)."""
    lm_head = model.get_output_embeddings()
    if not ce_vocab or getattr(lm_head, "bias", None) is not None:
        return lm_head.weight
    ids = [t for t, _ in ranked_tokens((ex.taught.tolist() for ex in train), prior)[:ce_vocab]]
    return lm_head.weight.index_select(0, torch.tensor(sorted(ids), device=lm_head.weight.device))


def unrolled_mask(length: int, step: int, dtype: torch.dtype) -> torch.Tensor:
    """Additive mask ``[1, 1, n_s, n_1 + ... + n_s]`` (``n_k = length - k`` entries per depth) for the
    depth-``step`` queries of `unrolled_outputs`: query j sees depth 1's entries 0..j (the true
    features of positions 0..j) and entry j of every deeper depth (its own chain of predictions)."""
    n = length - step
    rows = torch.arange(n)[:, None]
    blocks = [torch.arange(length - 1)[None] <= rows]
    blocks += [torch.arange(length - k)[None] == rows for k in range(2, step + 1)]
    return additive_mask(torch.cat(blocks, dim=1), dtype)[None, None]


def unrolled_outputs(head: EagleHead, embeds: torch.Tensor, features: torch.Tensor, steps: int) -> list[torch.Tensor]:
    """The head's predictions at depths 1..``steps`` for every start position of one sequence.

    ``embeds[i]`` is the embedding of token i+1 and ``features[i]`` the (noised) true feature of
    position i (``[T-1, H]`` each). Depth 1 is teacher-forced: output i predicts f_{i+1}. At depth
    s, output j (position j+s-1) reads the depth-(s-1) output j, predicts f_{j+s}, and attends as a
    depth-s draft node does (`unrolled_mask`). Returns ``[T-s, H]`` per depth.
    """
    length = features.shape[0] + 1
    cache = DynamicCache() if steps > 1 else None
    positions = torch.arange(length - 1, device=features.device)
    outs = [head(embeds[None], features[None], positions[None], cache=cache)[0]]
    for s in range(2, steps + 1):
        n = length - s
        if n < 1:
            break
        mask = unrolled_mask(length, s, features.dtype).to(features.device)
        outs.append(head(embeds[s - 1 :][None], outs[-1][:n][None], positions[s - 1 :][None], mask, cache)[0])
    return outs


def example_loss(head: EagleHead, model, ex: Example, feats: torch.Tensor, opts: TrainOptions, weight: torch.Tensor | None = None) -> tuple[torch.Tensor, dict]:
    """EAGLE loss on one example (over positions whose prediction is of a response token, or of
    every token the head can predict with ``opts.loss_on == "all"``), summed over the
    ``opts.unroll`` depths; the cross-entropy is over the rows of ``weight`` (default: the whole LM
    head), the target's distribution renormalised to them. ``top1`` is depth 1's
    agreement with the model, ``top1_last`` the deepest depth's."""
    device = next(head.parameters()).device
    ids = ex.ids.to(device)
    f = feats.to(device=device, dtype=torch.float32)
    inp = f[:-1]
    if opts.noise:
        inp = inp + (torch.rand_like(inp) * 2 - 1) * opts.noise
    with torch.no_grad():  # the head trains in float32 whatever the target's dtype (bfloat16 on a GPU)
        embeds = model.get_input_embeddings()(ids[1:]).float()
    weight = (model.get_output_embeddings().weight if weight is None else weight).float()
    trained = ex.prompt_len if opts.loss_on == "response" else 0  # the first token whose prediction is trained
    start = max(trained - 2, 0)  # the first feature any depth predicts; its distribution:
    with torch.no_grad():
        p_all = torch.softmax(f[start + 1 :] @ weight.T, dim=-1)  # shared by the depths (row i: f[start + 1 + i])
    total, stats = 0.0, {}
    for s, out in enumerate(unrolled_outputs(head, embeds, inp, opts.unroll), start=1):
        first = max(trained - 1 - s, 0)  # output j predicts f_{j+s}, which predicts token j+s+1
        pred, true = out[first:], f[s:][first:]
        reg = F.smooth_l1_loss(pred, true)
        p_target = p_all[first + s - start - 1 :]
        logq = torch.log_softmax(pred @ weight.T, dim=-1)
        ce = -(p_target * logq).sum(-1).mean()
        total = total + reg + opts.ce_weight * ce
        with torch.no_grad():
            top1 = (logq.argmax(-1) == p_target.argmax(-1)).float().mean().item()
        if s == 1:
            stats = {"reg": reg.item(), "ce": ce.item(), "top1": top1, "tokens": len(pred)}
        stats["top1_last"] = top1
    return total, stats


def _lr(step: int, total: int, opts: TrainOptions) -> float:
    if step < opts.warmup:
        return opts.lr * (step + 1) / opts.warmup
    progress = (step - opts.warmup) / max(total - opts.warmup, 1)
    return opts.lr * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))


def _save_checkpoint(path: Path, state: dict) -> None:
    with staging.staged_file(path) as tmp:
        torch.save(state, tmp)


def _batches(order: list[int], examples: list[Example], batch_tokens: int) -> list[list[int]]:
    batches, current, size = [], [], 0
    for i in order:
        current.append(i)
        size += len(examples[i].ids)
        if size >= batch_tokens:
            batches.append(current)
            current, size = [], 0
    if current:
        batches.append(current)
    return batches


def initial_head(model, init_head: str) -> tuple[EagleHead, dict[int, int] | None]:
    """The head training starts from, float32, with the draft-vocabulary counts it brings: a fresh
    head initialised from the target, or a copy of the trained EAGLE-1 head at ``init_head``
    (fine-tuning a general head on your own traffic), whose vocabulary the new one keeps."""
    if not init_head:
        head = EagleHead(head_config_for(model))
        init_from_target(head, model)
        return head, None
    head = load_head(Path(init_head), model)
    if not isinstance(head, EagleHead):
        raise NgspecError(f"--init-head {init_head} is an EAGLE-3 head; train-eagle trains and fine-tunes EAGLE-1 heads")
    return head.float(), draft_vocab_counts(Path(init_head))


def train_head(
    model,
    train: list[Example],
    feats: list[torch.Tensor],
    out: Path,
    opts: TrainOptions,
    on_step: Callable[[int, int, dict], None] | None = None,
) -> tuple[EagleHead, list[dict]]:
    """Train (or resume) a head; returns it and the per-step log."""
    if opts.loss_on == "response" and any(ex.document for ex in train):
        raise NgspecError("examples without a response (documents) train only with the loss on every position (--loss-on all)")
    torch.manual_seed(opts.seed)
    head, prior = initial_head(model, opts.init_head)
    head.to(next(model.parameters()).device).train()
    for p in model.parameters():
        p.requires_grad_(False)
    optimiser = torch.optim.AdamW(head.parameters(), lr=opts.lr, weight_decay=0.0)
    weight = output_weight(model, train, opts.ce_vocab, prior).float()
    plans = []
    for epoch in range(opts.epochs):
        order = list(range(len(train)))
        random.Random(opts.seed + epoch).shuffle(order)
        plans += _batches(order, train, opts.batch_tokens)
    total = len(plans)
    step, log = 0, []
    out.mkdir(parents=True, exist_ok=True)
    ckpt = out / CHECKPOINT
    if ckpt.is_file():
        try:
            state = torch.load(ckpt, map_location="cpu", weights_only=True)
            if not isinstance(state, dict):
                raise NgspecError(f"{ckpt} is not a train-eagle checkpoint; use another --out or delete it")
            if state.get("options") != asdict(opts) or state.get("examples") != len(train):  # before its shapes are read
                raise NgspecError(f"{ckpt} belongs to a run with other options or data; use another --out or delete it")
            head.load_state_dict(state["head"])
            optimiser.load_state_dict(state["optimiser"])
            step, log = int(state["step"]), list(state["log"])
        except NgspecError:
            raise
        except Exception as exc:  # damaged, cut short, or another model's head
            raise NgspecError(f"cannot resume from {ckpt} ({first_sentence(exc)}); delete it to start over") from None

    def checkpoint() -> None:
        _save_checkpoint(ckpt, {"head": head.state_dict(), "optimiser": optimiser.state_dict(), "step": step,
                                "log": log, "options": asdict(opts), "examples": len(train)})

    try:
        while step < total:
            for group in optimiser.param_groups:
                group["lr"] = _lr(step, total, opts)
            optimiser.zero_grad(set_to_none=True)
            batch = plans[step]
            stats = {"reg": 0.0, "ce": 0.0, "top1": 0.0, "top1_last": 0.0, "tokens": 0}
            tokens = sum(len(train[i].ids) for i in batch)
            for i in batch:
                loss, s = example_loss(head, model, train[i], feats[i], opts, weight)
                (loss * len(train[i].ids) / tokens).backward()
                for key in ("reg", "ce", "top1", "top1_last"):
                    stats[key] += s[key] * s["tokens"]
                stats["tokens"] += s["tokens"]
            torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
            optimiser.step()
            step += 1
            entry = {"step": step, "lr": optimiser.param_groups[0]["lr"],
                     **{k: stats[k] / max(stats["tokens"], 1) for k in ("reg", "ce", "top1", "top1_last")}}
            log.append(entry)
            if on_step:
                on_step(step, total, entry)
            if step % opts.checkpoint_every == 0:
                checkpoint()
    except KeyboardInterrupt:
        checkpoint()  # nothing learned so far is lost; run again to resume
        raise
    head.eval()
    try:
        save_head(head, out)
        save_draft_vocab(out, (ex.taught.tolist() for ex in train), prior)
    except OSError as exc:  # a disk that fills at the end: say what a rerun keeps of the work
        for name in SAVED:  # a head saved in part would make the rerun refuse --out
            (out / name).unlink(missing_ok=True)
        kept = [f"reuses the target's features stored in {out / FEATURES}"] if (out / FEATURES).is_dir() else []
        kept.append("resumes from its last checkpoint" if ckpt.is_file() else "trains again (no checkpoint was due)")
        raise NgspecError(f"the head is trained but could not be saved ({staging.os_error_message(exc)}); make room and run the same "
                          f"command again: it {(' and ' if ckpt.is_file() else ' but ').join(kept)}") from exc
    ckpt.unlink(missing_ok=True)
    shutil.rmtree(out / FEATURES, ignore_errors=True)  # the stored feature pass (`target_features`), no longer needed
    return head, log


def evaluate(engine, head: EagleHead, holdout: list[Example], max_new_tokens: int, eagle_opts) -> dict:
    """Mean tokens per verification call of the head's whole tree on held-out prompts (not sized
    by this device's verify cost, so that it measures the head), and the check that its output
    equals plain greedy decoding."""
    from ngspec.decode import DecodeConfig
    from ngspec.drafters import make_drafter
    from ngspec.drafters.eagle import eagle_factory

    factory = eagle_factory(engine.loaded.model, head, eagle_opts)
    tokens = calls = identical = 0
    start = time.perf_counter()
    for ex in holdout:
        cfg = DecodeConfig(max_new_tokens=max_new_tokens)
        gen = engine.run(ex.prompt, factory(), cfg)
        plain = engine.run(ex.prompt, make_drafter("vanilla"), cfg)
        tokens += len(gen.token_ids)
        calls += gen.stats.verify_calls
        identical += gen.token_ids == plain.token_ids
    return {"prompts": len(holdout), "tokens_per_call": tokens / calls if calls else 0.0,
            "identical_to_greedy": identical, "seconds": time.perf_counter() - start}


def write_report(out: Path, report: dict) -> None:
    staging.write_text(out / "train_report.json", json.dumps(report, indent=2))
