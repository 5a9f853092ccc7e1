"""`ngspec bench`: Spec-Bench-style comparison of drafters against transformers' generate."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from ngspec.bench.report import COLUMNS, ceiling_of, environment, markdown, rows, summarise, to_json
from ngspec.bench.runner import HF_ARMS, run_bench
from ngspec.cli import render
from ngspec.cli.common import decode_config, load_engine, sampling_config
from ngspec.cli.options import (
    DRAFTERS, DeviceOpt, DtypeOpt, JsonOpt, LookupNgramOpt, LookupTokensOpt, MaxNewTokensOpt,
    ModelOpt, NgramNOpt, NumDraftOpt, PrefixLenOpt, ProfileOpt, RawOpt, TrieUpdateOpt,
)
from ngspec.drafters import DrafterOptions, make_drafter
from ngspec.errors import NgspecError
from ngspec.prompts import load_prompts


def bench_command(
    questions: Annotated[Path, typer.Option("--questions", "-q", help="Question file (Spec-Bench / MT-bench jsonl with 'turns'; the first turn is used).")],
    drafters: Annotated[list[str], typer.Option("--drafter", "-d", help=f"Drafter to compare (repeatable); one of: {DRAFTERS}.")] = ["trie", "prompt-lookup"],
    category: Annotated[Optional[str], typer.Option(help="Keep only this category (e.g. rag, summarization).")] = None,
    limit: Annotated[Optional[int], typer.Option(help="Use the first N questions (after --category).")] = None,
    model: ModelOpt = "default",
    max_new_tokens: MaxNewTokensOpt = 256,
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = "auto",
    raw: RawOpt = False,
    num_draft: NumDraftOpt = DrafterOptions.num_draft,
    ngram_n: NgramNOpt = DrafterOptions.ngram_n,
    prefix_len: PrefixLenOpt = DrafterOptions.prefix_len,
    trie_update: TrieUpdateOpt = DrafterOptions.trie_update,
    lookup_ngram: LookupNgramOpt = DrafterOptions.lookup_ngram,
    lookup_tokens: LookupTokensOpt = DrafterOptions.lookup_tokens,
    markdown_out: Annotated[Optional[Path], typer.Option("--markdown", help="Also write the report as Markdown to this file.")] = None,
    json_path: Annotated[Optional[Path], typer.Option("--json-out", help="Also write the full JSON report to this file.")] = None,
    profile: ProfileOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Compare drafters with vanilla decoding and transformers' generate on the same prompts, in one
    process, interleaved: speedup vs hf-greedy, tokens per call, acceptance histogram, drafting
    share, exact-match rate vs hf-greedy, and the self-repetition ceiling.

    Example: ngspec bench -q ../shared/data/spec_bench/question.jsonl --category rag --limit 20
    """
    cfg = decode_config(max_new_tokens, sampling_config(0.0, 1.0, 0, None), None)
    opts = DrafterOptions(num_draft, ngram_n, prefix_len, trie_update, lookup_ngram, lookup_tokens)
    for name in drafters:
        if name not in HF_ARMS:
            make_drafter(name, opts)
    arms = list(dict.fromkeys(["hf-greedy", "hf-prompt-lookup", "vanilla", *drafters]))
    prompts = load_prompts(questions, category, limit)
    for path in (markdown_out, json_path):
        if path is not None and not path.parent.exists():
            raise NgspecError(f"output directory does not exist: {path.parent}")
    engine = load_engine(model, device, dtype, profile)

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=render.err_console, transient=True) as progress:
        task = progress.add_task("bench", total=len(prompts) * len(arms))
        records = run_bench(engine, prompts, arms, cfg, opts, raw, lambda arm: progress.advance(task))

    summaries = summarise(records, arms)
    settings = {"questions": str(questions), "category": category, "prompts": len(prompts), "max_new_tokens": max_new_tokens}
    env = environment(engine, settings)
    report = to_json(records, summaries, env)
    ceiling = ceiling_of(records)
    if markdown_out is not None:
        markdown_out.write_text(markdown(summaries, env, ceiling))
    if json_path is not None:
        json_path.write_text(json.dumps(report, indent=2))
    if json_out:
        render.json_line(report)
        return
    render.table(f"bench: {len(prompts)} prompts, {max_new_tokens} new tokens, {env['device']}, {env['dtype']}", COLUMNS, rows(summaries))
    render.info(f"self-repetition ceiling of the hf-greedy outputs (token-weighted): {ceiling:.2f}; speedup = total throughput vs hf-greedy")
