"""`ngspec build-datastore`, `ngspec datastore-info` and `ngspec synth-corpus`."""

from __future__ import annotations

import os
import time
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.progress import BarColumn, SpinnerColumn, TextColumn, TimeElapsedColumn

from ngspec import staging
from ngspec.cli import render
from ngspec.cli.options import JsonOpt, ModelOpt, TrustRemoteCodeOpt
from ngspec.datastore.build import BuildOptions, build_datastore
from ngspec.datastore.corpus import COMPRESSIONS, DATA_SUFFIXES, FORMATS
from ngspec.datastore.index import Datastore
from ngspec.errors import NgspecError
from ngspec.perf.memory import resident_bytes

TokenizerOpt = Annotated[Optional[str], typer.Option("--tokenizer", help="Tokenizer to use instead of --model's (a directory or a Hugging Face id).")]


def _default_out(corpus: str) -> Path:
    name = Path(corpus.rstrip("/")).name or "datastore"
    for suffix in (*COMPRESSIONS, *DATA_SUFFIXES):
        if name.lower().endswith(suffix):
            name = name[: -len(suffix)]
    return Path("datastores") / name.replace("/", "__")


def build_datastore_command(
    corpus: Annotated[str, typer.Option("--corpus", "-c", help="A .jsonl/.json/.parquet file (JSON compressed too: .jsonl.gz, .bz2, .xz), a directory of them, or a datasets name.")],
    out: Annotated[Optional[Path], typer.Option("--out", "-o", help="Output directory.", show_default="datastores/<corpus name>")] = None,
    model: ModelOpt = "default",
    trust_remote_code: TrustRemoteCodeOpt = False,
    tokenizer: TokenizerOpt = None,
    text: Annotated[str, typer.Option(help="responses (assistant side only, as READER does) or all (user turns too).")] = "responses",
    fmt: Annotated[Optional[str], typer.Option("--format", help=f"Record format: {', '.join(FORMATS)}.", show_default="detected")] = None,
    split: Annotated[str, typer.Option(help="Split: of a datasets name, of a DatasetDict saved with save_to_disk, or of a directory whose file names name splits as datasets reads them (train-00000-of-00001.parquet and test-..., train/ and test/); a directory whose names name none is read whole.")] = "train",
    response_field: Annotated[Optional[str], typer.Option("--response-field", help="Index this field of every record instead of a detected format's responses (a layout no --format knows: GSM8K's answer).")] = None,
    input_field: Annotated[Optional[str], typer.Option("--input-field", help="With --response-field and --text all: this field, the input, goes in too.")] = None,
    max_records: Annotated[Optional[int], typer.Option(help="Use at most this many records.")] = None,
    num_proc: Annotated[Optional[int], typer.Option("--num-proc", help="Threads for tokenisation (the fast tokenizer's own parallel batch encoding).", show_default="all cores")] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing datastore at --out.")] = False,
    json_out: JsonOpt = False,
) -> None:
    """Tokenise a corpus with the model's tokenizer and write a memory-mappable suffix-array
    datastore (written to a temporary directory and renamed when complete).

    Example: ngspec build-datastore -c ../shared/data/magpie_sample/example_instructions_5res.json
    """
    from ngspec.models import display_name, load_tokenizer  # torch and transformers: not for --help

    opts = BuildOptions(text=text, format=fmt, max_records=max_records, split=split, response_field=response_field, input_field=input_field)
    if num_proc is not None:
        if num_proc < 1:
            raise NgspecError("--num-proc must be at least 1")
        os.environ["RAYON_NUM_THREADS"] = str(num_proc)  # read when the tokenizer's pool starts
        os.environ["TOKENIZERS_PARALLELISM"] = "true"
    out = out or _default_out(corpus)
    spec = tokenizer or model
    tok = load_tokenizer(spec, trust_remote_code)
    rss_before = resident_bytes() or 0  # 0 where unknown
    with render.progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed:,} records"), TimeElapsedColumn()) as progress:
        task = progress.add_task("tokenising", total=max_records)
        meta = build_datastore(
            corpus, tok, display_name(spec), out, opts, force,
            on_batch=lambda n: progress.advance(task, n),
            on_stage=lambda label: progress.update(task, description=label),
        )
    import resource

    # the tokenising child's peak too (it shares this process's pages until it allocates its own)
    peak = max(resource.getrusage(who).ru_maxrss for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)) * 1024
    memory = {"rss_before_data_bytes": rss_before, "peak_rss_bytes": peak}
    _show(Path(out), meta, json_out, memory)


def _show(path: Path, meta, json_out: bool, memory: dict | None = None, checked: dict | None = None) -> None:
    size = sum(f.stat().st_size for f in path.iterdir() if f.is_file())
    if json_out:
        render.json_line({"path": str(path), "bytes_on_disk": size, **asdict(meta), **(memory or {}), **({"checked": checked} if checked else {})})
        return
    render.summary_table(
        f"datastore {path}",
        [
            ("source", meta.source),
            ("tokenizer", f"{meta.tokenizer_name} ({meta.tokenizer_fingerprint[:12]})"),
            ("records", f"{meta.records:,}"),
            ("documents", f"{meta.documents:,}"),
            ("tokens", f"{meta.tokens:,}"),
            ("token dtype", meta.token_dtype),
            ("size on disk", f"{size / 2**20:.1f} MiB"),
            ("built", f"{meta.created} in {meta.build_seconds:.1f} s"),
            ("options", ", ".join(f"{k}={v}" for k, v in meta.build_options.items())),
            *_memory_rows(memory, meta.tokens + meta.documents),
            *([("checked", f"ids, separators, suffix array (a permutation; {checked['neighbours_in_order']:,} neighbours in order)")] if checked else []),
        ],
    )


def _memory_rows(memory: dict | None, tokens: int) -> list[tuple[str, str]]:
    if not memory or not memory["rss_before_data_bytes"] or not tokens:
        return []
    before, peak = memory["rss_before_data_bytes"], memory["peak_rss_bytes"]
    return [("peak memory", f"{peak / 2**20:.0f} MiB: {before / 2**20:.0f} MiB before reading data "
             f"(Python, libraries, tokenizer) + {(peak - before) / tokens:.1f} bytes/token")]


def datastore_info_command(
    path: Annotated[Path, typer.Argument(help="Datastore directory.")],
    check: Annotated[bool, typer.Option("--check/--no-check", help="Also read both arrays through: ids in range, one separator per document, the suffix array a permutation in suffix order (sampled neighbours). One pass; seconds per 100M tokens.")] = True,
    json_out: JsonOpt = False,
) -> None:
    """Show a datastore's metadata and check that its files are complete and consistent (sizes
    always; contents with --check, the default)."""
    from ngspec.datastore.format import check_arrays

    store = Datastore.open(path)  # reads the metadata and validates the arrays' sizes against it
    checked = None
    if check:
        columns = (TextColumn("checking"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"), TimeElapsedColumn())
        with render.progress(*columns) as progress:
            task = progress.add_task("checking", total=None)
            try:
                pairs = check_arrays(store.tokens, store.sa, store.meta, on_progress=lambda done, total: progress.update(task, completed=done, total=total))
            except NgspecError as exc:
                raise NgspecError(f"{path} is damaged: {exc}; rebuild it with ngspec build-datastore") from None
        checked = {"ids_and_separators": True, "suffix_array_permutation": True, "neighbours_in_order": pairs}
    _show(path, store.meta, json_out, checked=checked)


def synth_corpus_command(
    out: Annotated[Path, typer.Option("--out", "-o", help="Output .jsonl file (Magpie record format).")],
    n: Annotated[Optional[int], typer.Option("--n", help="Records to generate (default: 100, or every prompt of --prompts).")] = None,
    prompts: Annotated[Optional[Path], typer.Option("--prompts", help="Answer these instructions (.txt, or .jsonl or .json with 'prompt', 'text' or 'turns'; the first turn is used) instead of letting the model write its own: the target's own answers to your prompts, EAGLE's training recipe.")] = None,
    model: ModelOpt = "default",
    trust_remote_code: TrustRemoteCodeOpt = False,
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", "-n", help="Most tokens per response.")] = 256,
    batch_size: Annotated[int, typer.Option(help="Prompts generated together.")] = 8,
    seed: Annotated[int, typer.Option(help="Seed for sampling the instructions.")] = 0,
    device: Annotated[str, typer.Option(help="auto, cpu, cuda or cuda:N.")] = "auto",
    force: Annotated[bool, typer.Option("--force", help="Replace an existing output file, and start afresh instead of continuing an interrupted run.")] = False,
    json_out: JsonOpt = False,
) -> None:
    """Magpie-style self-synthesis: the model writes instructions (from its chat template's
    pre-query part alone) and answers them greedily; the result feeds build-datastore and
    train-eagle. With --prompts it answers your instructions instead. An interrupted run keeps
    its finished records in NAME.partial.jsonl, and the same command run again continues there.

    Examples: ngspec synth-corpus --n 300 --out corpora/smollm2-self.jsonl
              ngspec synth-corpus --prompts my-prompts.jsonl --out corpora/my-answers.jsonl
    """
    from ngspec.datastore.synth import AT_WINDOW, SynthOptions, partial_path, resumable, synthesize, write_jsonl
    from ngspec.models import load_model
    from ngspec.prompts import load_prompts

    if Path(out).suffix.lower() in COMPRESSIONS:  # written line by line, and continued after an interruption: plain text
        raise NgspecError(f"synth-corpus writes plain JSON lines, and --out {out} names a compressed file: write {Path(out).with_suffix('')} and compress it after")
    given = None
    if prompts is not None:
        records = load_prompts(prompts)
        chats = [p.id for p in records if p.messages]
        if chats:
            raise NgspecError(f"synth-corpus answers single instructions, and prompt {chats[0]} is chat messages: give 'prompt', 'text' or 'turns' records")
        given = [p.text for p in records][:n]  # --n caps the prompts answered
        n = len(given)
    opts = SynthOptions(n=100 if n is None else n, max_new_tokens=max_new_tokens, batch_size=batch_size, seed=seed)
    staging.refuse_replacing(Path(out), force)
    staging.output_directory(out, "--out")  # a path that cannot be written fails now, not after the answers
    loaded = load_model(model, device, trust_remote_code=trust_remote_code)
    carried = [] if force or not partial_path(out).exists() else resumable(partial_path(out), loaded, opts, given)
    if carried:
        render.info(f"continuing an interrupted run: {len(carried)} of {opts.n} records are in {partial_path(out)}")
    started = time.perf_counter()
    with render.progress(SpinnerColumn(), TextColumn("synthesising"), BarColumn(), TextColumn("{task.completed}/{task.total} records"), TimeElapsedColumn()) as progress:
        task = progress.add_task("synth", total=opts.n, completed=len(carried))
        at_window = sum(AT_WINDOW in r for r in carried)  # answers cut by the context window

        def counted(records):
            nonlocal at_window
            for record in records:
                at_window += AT_WINDOW in record
                yield record

        count = write_jsonl(counted(synthesize(loaded, opts, lambda: progress.advance(task), given, start=len(carried))), out, force, carried)
    seconds = time.perf_counter() - started
    if json_out:
        render.json_line({
            "out": str(out), "records": count, "resumed_after": len(carried), "stopped_at_context_window": at_window, "instructions": str(prompts) if prompts is not None else "self-written",
            "model": model, "seconds": round(seconds, 3), **asdict(opts),
        })
    else:
        resumed = f" ({len(carried)} carried from the interrupted run)" if carried else ""
        render.info(f"wrote {count} records{resumed} to {out} in {seconds:.0f} s")
        if at_window:
            render.info(f"{at_window} of them stopped where the model's context window was full, before --max-new-tokens or an end (their records say \"{AT_WINDOW}\": true)")
