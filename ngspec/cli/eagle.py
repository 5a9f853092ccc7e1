"""`ngspec train-eagle`: train an EAGLE-1 draft head for a model from a corpus."""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from ngspec import staging
from ngspec.cli import render
from ngspec.cli.options import DeviceOpt, DtypeOpt, JsonOpt, ModelOpt, TrustRemoteCodeOpt
from ngspec.errors import NgspecError


def train_eagle_command(
    corpus: Annotated[str, typer.Option("--corpus", "-c", help="Records in any format build-datastore reads (the model's own responses are best, e.g. corpora/smollm2-self.jsonl).")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Directory for the head (public EAGLE-1 layout), checkpoints and train_report.json.")],
    model: ModelOpt = "default",
    trust_remote_code: TrustRemoteCodeOpt = False,
    epochs: Annotated[int, typer.Option(help="Passes over the training examples.")] = 4,
    lr: Annotated[float, typer.Option(help="Peak learning rate (AdamW, warm-up then cosine decay).")] = 1e-3,
    batch_tokens: Annotated[int, typer.Option(help="Tokens per optimiser step.")] = 4096,
    max_len: Annotated[int, typer.Option(help="Longest example in tokens (longer ones are cut).")] = 640,
    noise: Annotated[float, typer.Option(help="Uniform noise (±) added to the input features, as EAGLE does.")] = 0.1,
    unroll: Annotated[int, typer.Option(help="Also train depths 2..N on the head's own predictions, as it drafts them (training-time test, as HASS and EAGLE-3 do; 1 = EAGLE-1's teacher forcing only). A step costs about N times as much.")] = 1,
    ce_vocab: Annotated[int, typer.Option(help="Cross-entropy over the training responses' N most frequent tokens, the draft vocabulary (0 = the whole vocabulary; most of a CPU training step otherwise).")] = 8192,
    holdout: Annotated[int, typer.Option(help="Examples kept aside to measure acceptance after training.")] = 12,
    eval_tokens: Annotated[int, typer.Option(help="Tokens generated per held-out prompt for the evaluation.")] = 64,
    checkpoint_every: Annotated[int, typer.Option(help="Optimiser steps between checkpoints (a rerun resumes from the last).")] = 50,
    init_head: Annotated[Optional[Path], typer.Option("--init-head", help="Fine-tune this trained EAGLE-1 head (e.g. a general head, on your own traffic) instead of starting from the target's weights; its draft vocabulary is kept and extended.")] = None,
    loss_on: Annotated[str, typer.Option(help="Positions the loss covers: 'response' (the answers only) or 'all' (the instructions too, e.g. the passages of RAG prompts or the articles to summarise; the label is the model's own next-token distribution either way). With 'all', records without a response (a 'text', 'instruction' or 'prompt' field, or 'turns' as in a question file) are trained on as documents: no answers need generating.")] = "response",
    input_field: Annotated[Optional[str], typer.Option("--input-field", help="With --response-field: the field holding each record's input (a layout no format knows: GSM8K's question).")] = None,
    response_field: Annotated[Optional[str], typer.Option("--response-field", help="With --input-field: the field holding each record's response (GSM8K's answer).")] = None,
    max_records: Annotated[Optional[int], typer.Option(help="Use at most this many records.")] = None,
    seed: Annotated[int, typer.Option(help="Seed for initialisation, data order and the holdout split.")] = 0,
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = "auto",
    json_out: JsonOpt = False,
) -> None:
    """Train an EAGLE-1 draft head (feature regression + token cross-entropy on the model's own
    features) and save it in the public layout for `--drafter eagle --eagle-head DIR`. An
    interrupted run, run again, continues the feature pass it stored in --out/features, or resumes
    training from the last checkpoint in --out. With --init-head it fine-tunes a trained head
    instead, e.g. a general head on your own prompts and the model's answers to them.

    Examples: ngspec train-eagle --corpus corpora/smollm2-self.jsonl --out heads/smollm2
    ngspec train-eagle --corpus my-answers.jsonl --init-head heads/smollm2 --out heads/smollm2-mine --epochs 2
    ngspec train-eagle --corpus my-prompts.jsonl --loss-on all --init-head heads/smollm2 --out heads/smollm2-docs --epochs 8
    """
    from itertools import islice

    from ngspec.datastore.corpus import iter_records
    from ngspec.drafters.eagle import EagleOptions
    from ngspec.eagle.head import WEIGHTS
    from ngspec.eagle.train import CHECKPOINT, FEATURES, TrainOptions, evaluate, examples_from_records, initial_head, target_features, train_head
    from ngspec.engine import Engine
    from ngspec.models import load_model

    opts = TrainOptions(epochs=epochs, lr=lr, batch_tokens=batch_tokens, max_len=max_len, noise=noise, unroll=unroll, ce_vocab=ce_vocab,
                        holdout=holdout, checkpoint_every=checkpoint_every, seed=seed, init_head=str(init_head or ""),
                        loss_on=loss_on)
    if max_records is not None and max_records < 1:
        raise NgspecError("--max-records must be at least 1")
    if (input_field is None) != (response_field is None):
        raise NgspecError("--input-field and --response-field go together: an example is an input and its response")
    if out.exists() and not out.is_dir():
        raise NgspecError(f"--out {out} exists and is not a directory")
    if init_head is not None and out.resolve() == init_head.resolve():
        raise NgspecError("--out must differ from --init-head: the head being fine-tuned is read, not overwritten")
    if out.is_dir() and not (out / CHECKPOINT).is_file() and any((out / name).is_file() for name in WEIGHTS):
        raise NgspecError(f"--out {out} already holds a trained head (and no checkpoint to resume); choose another --out, or delete it to train again")
    records = iter_records(corpus)
    if max_records is not None:
        records = islice(records, max_records)
    render.info(f"loading model {model} ...")
    loaded = load_model(model, device, dtype, trust_remote_code)
    if init_head is not None:
        initial_head(loaded.model, opts.init_head)  # a wrong head fails now, not after the feature pass
    examples = examples_from_records(records, loaded.tokenizer, max_len, documents=loss_on == "all", fields=(input_field, response_field))
    if len(examples) <= holdout:
        kind = "examples (answered records and documents)" if loss_on == "all" else \
            "(instruction, response) examples (with --loss-on all, records without a response are read as documents)"
        raise NgspecError(f"{corpus} gave {len(examples)} usable {kind}; need more than --holdout {holdout}")
    staging.output_directory(out / "config.json")  # --out itself, made now: an unwritable path fails before the feature pass
    random.Random(seed).shuffle(examples)
    held, train = examples[:holdout], examples[holdout:]
    start = time.perf_counter()
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), TimeRemainingColumn())
    with render.progress(*columns) as progress:
        task = progress.add_task("target features (tokens)", total=sum(len(e.ids) for e in train))
        feats = target_features(loaded.model, train, lambda n: progress.advance(task, n), out / FEATURES,
                                stored=lambda n: progress.reset(task, completed=n))  # the pace (time left) counts from there
        feature_seconds = time.perf_counter() - start
        task = progress.add_task("training (steps)", total=None)

        def on_step(step: int, total: int, entry: dict) -> None:
            progress.update(task, completed=step, total=total,
                            description=f"training: loss reg {entry['reg']:.3f} ce {entry['ce']:.2f} top-1 {entry['top1']:.2f}"
                            + (f" (depth {opts.unroll}: {entry['top1_last']:.2f})" if opts.unroll > 1 else ""))

        head, log = train_head(loaded.model, train, feats, out, opts, on_step)
    train_seconds = time.perf_counter() - start
    report = {
        "model": loaded.name, "corpus": corpus, "out": str(out), "examples": len(train), "holdout": len(held),
        "documents": sum(e.document for e in train),
        "train_tokens": sum(len(e.ids) for e in train), "options": opts.__dict__,
        "feature_seconds": feature_seconds, "train_seconds": train_seconds, "final": log[-1] if log else None,
    }
    if held:
        render.info("measuring acceptance on the held-out prompts ...")
        report["evaluation"] = evaluate(Engine(loaded), head, held, eval_tokens, EagleOptions())
    report["log"] = log
    if json_out:
        render.json_line({k: v for k, v in report.items() if k != "log"})
        return _write_report(out, report)
    final = report["final"] or {}
    rows = [
        ("training examples / tokens", f"{len(train)} / {report['train_tokens']:,}"
         + (f" ({report['documents']} documents without a response)" if report["documents"] else "")),
        ("time (features + training)", f"{train_seconds / 60:.1f} min"),
        ("final loss: regression / cross-entropy", f"{final.get('reg', 0):.3f} / {final.get('ce', 0):.3f}"),
        ("final top-1 agreement with the model", f"{final.get('top1', 0):.2f}"
         + (f" (depth {opts.unroll}: {final.get('top1_last', 0):.2f})" if opts.unroll > 1 else "")),
    ]
    if "evaluation" in report:
        ev = report["evaluation"]
        rows += [("held-out tokens per call (dynamic tree)", f"{ev['tokens_per_call']:.2f}"),
                 ("held-out outputs identical to greedy", f"{ev['identical_to_greedy']} / {ev['prompts']}")]
    rows.append(("head written to", str(out)))
    render.summary_table(f"EAGLE head for {loaded.name}", rows)
    _write_report(out, report)


def _write_report(out: Path, report: dict) -> None:
    """``train_report.json``, after the report is shown: the head is saved by then, which a disk
    that fills here must not leave in doubt."""
    from ngspec.eagle.train import write_report

    try:
        write_report(out, report)
    except OSError as exc:
        raise NgspecError(f"{staging.os_error_message(exc)}; the head itself is saved in {out} (only its training report is missing)") from exc
