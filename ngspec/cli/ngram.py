"""`ngspec build-bigram`: build a model's unigram/bigram/extended-bigram tables ahead of time."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeRemainingColumn

from ngspec import staging
from ngspec.cli import render
from ngspec.cli.options import DeviceOpt, DtypeOpt, JsonOpt, ModelOpt, TrustRemoteCodeOpt
from ngspec.errors import NgspecError


def build_bigram_command(
    model: ModelOpt = "default",
    trust_remote_code: TrustRemoteCodeOpt = False,
    out: Annotated[Optional[Path], typer.Option("--out", help="Write the tables here (default: the cache, where generate and bench find them).")] = None,
    batch_size: Annotated[int, typer.Option(help="Tokens per batched forward pass.")] = 512,
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = "auto",
    json_out: JsonOpt = False,
) -> None:
    """Build the model-derived tables of the unigram, bigram and mixed drafters: the unigram
    ranking, the top-16 next tokens after every token (one batched forward pass per 512 tokens of
    the vocabulary) and the extended-bigram chains. Done once per model; generate and bench build
    them on first use otherwise.

    Example: ngspec build-bigram --model default
    """
    from ngspec.drafters.ngram_tables import (
        TOP_K, WIDTH, build_tables, default_table_path, model_fingerprint, save_tables, table_anchor,
    )
    from ngspec.models import load_model

    if batch_size < 1:
        raise NgspecError("--batch-size must be at least 1")
    if out is not None and (out.is_dir() or not out.parent.is_dir()):
        raise NgspecError(f"--out must be a file path in an existing directory (got {out})")
    render.info(f"loading model {model} ...")
    loaded = load_model(model, device, dtype, trust_remote_code)
    anchor = table_anchor(loaded.tokenizer)
    path = out or default_table_path(model_fingerprint(loaded.model, anchor))
    staging.output_directory(path, "--out" if out is not None else "")  # an unwritable path fails now, not after the tables are built
    start = time.perf_counter()
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
    with render.progress(*columns) as progress:
        task = progress.add_task("next tokens of every token", total=None)
        tables = build_tables(
            loaded.model, anchor, batch_size, lambda done, total: progress.update(task, completed=done, total=total)
        )
    seconds = time.perf_counter() - start
    save_tables(tables, path, loaded.name)
    tok = loaded.tokenizer
    examples = {}
    for token in tables.unigram[:3]:
        chain = tables.chain(int(token), 6)
        examples[tok.decode([int(token)])] = tok.decode(chain)
    record = {
        "model": loaded.name,
        "path": str(path),
        "vocab_size": tables.vocab_size,
        "top_k": TOP_K,
        "width": WIDTH,
        "anchor": tok.decode(anchor),
        "fingerprint": tables.fingerprint,
        "seconds": seconds,
        "bytes": path.stat().st_size,
    }
    if json_out:
        render.json_line(record)
        return
    render.summary_table(
        f"n-gram tables for {loaded.name}",
        [
            ("vocabulary", f"{tables.vocab_size:,}"),
            ("bigram top-k x chain width", f"{TOP_K} x {WIDTH}"),
            ("anchor before each token", repr(record["anchor"])),
            ("build time", f"{seconds:.1f} s"),
            ("written to", str(path)),
            ("size", f"{record['bytes'] / 2**20:.1f} MiB"),
            *((f"chain of unigram {k!r}", repr(v)) for k, v in examples.items()),
        ],
    )
