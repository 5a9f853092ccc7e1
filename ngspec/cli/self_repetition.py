"""`ngspec self-repetition`: how self-repetitive a dataset's responses are."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Optional

import typer

from ngspec.cli import render
from ngspec.cli.datastore import TokenizerOpt
from ngspec.cli.options import JsonOpt, ModelOpt, TrustRemoteCodeOpt
from ngspec.datastore.corpus import iter_records
from ngspec.datastore.index import Datastore
from ngspec.errors import NgspecError
from ngspec.metrics.pairs import achieved, generated_pairs, is_generated, record_pairs
from ngspec.metrics.report import measure, tokenize_pairs
from ngspec.prompts import load_prompts
from ngspec.staging import is_stream


def _record_id(record: dict, index: int) -> str:
    """A record's id in pairs and messages: its question_id or uuid where it gives one (a string or
    a whole number), else its place in the dataset ("record None" named a null question_id)."""
    for key in ("question_id", "uuid"):
        value = record.get(key)
        if isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool)):
            return str(value)
    return str(index)


def _questions(path: Optional[Path]) -> dict[str, list[str]]:
    """Each prompt's user turns by id: a question file's ``turns``, a chat's messages as one
    input, a ``prompt``'s text, a .txt file's text under its stem (as `generate` names them, and as
    it names the same prompts read from standard input: stdin, stdin:LINE, stdin[I])."""
    if path is None:
        return {}
    path = Path(path)
    if path.is_dir() or (path.suffix.lower() not in (".txt", ".jsonl", ".ndjson", ".json") and str(path) != "-" and not is_stream(path)):
        what = "is a directory" if path.is_dir() else "is not a .jsonl, .json or .txt file"
        raise NgspecError(f"{path} {what}; --questions takes a .jsonl or .json question or prompt file (or the .txt prompt given to generate)")
    asked = {p.id: ["\n".join(m["content"] for m in p.messages)] if p.messages else list(p.turns or (p.text,)) for p in load_prompts(path)}
    # the same prompts piped to `generate -p -` are named stdin (a .txt), stdin:LINE (a .jsonl) or stdin[I] (a .json)
    for rid, turns in list(asked.items()):
        if rid == path.stem:
            asked.setdefault("stdin", turns)
        elif rid.startswith((f"{path.name}:", f"{path.name}[")):
            asked.setdefault("stdin" + rid[len(path.name):], turns)
    return asked


def self_repetition_command(
    dataset: Annotated[str, typer.Option("--dataset", help="A .jsonl/.json/.parquet file (JSON compressed too: .jsonl.gz, .bz2, .xz), a directory of them, or a datasets name.")],
    input_field: Annotated[Optional[str], typer.Option(help="Field holding the input (overrides detection).")] = None,
    response_field: Annotated[Optional[str], typer.Option(help="Field holding the response (overrides detection).")] = None,
    questions: Annotated[Optional[Path], typer.Option(help="For answer files (question_id + choices) and `generate --json` output: the question or prompt file giving their inputs (joined by id).")] = None,
    datastore: Annotated[Optional[Path], typer.Option(help="Also search this datastore (built with the same tokenizer).")] = None,
    holdout: Annotated[int, typer.Option(help="Use the first N responses as the datastore and measure the rest (the paper's 'with datastore' setting).")] = 0,
    model: ModelOpt = "default",
    trust_remote_code: TrustRemoteCodeOpt = False,
    tokenizer: TokenizerOpt = None,
    split: Annotated[str, typer.Option(help="Split: of a datasets name, of a DatasetDict saved with save_to_disk, or of a directory whose file names name splits as datasets reads them (train-00000-of-00001.parquet and test-..., train/ and test/); a directory whose names name none is read whole.")] = "train",
    limit: Annotated[Optional[int], typer.Option(help="Measure at most this many (input, response) pairs.")] = None,
    json_out: JsonOpt = False,
) -> None:
    """Self-repetition of each response: |Y| / steps of greedy longest copying from its input and
    its own earlier text (and a datastore): the ceiling of search-only drafting's tokens per call.

    Example: ngspec self-repetition --dataset ../shared/data/mt_bench_answers/rest_vicuna-7b-v1.5/baseline-vicuna-7b-v1.5-temperature-0.0-top_p-0.jsonl --questions ../shared/data/mt_bench/question.jsonl
    """
    if datastore is not None and holdout:
        raise NgspecError("use either --datastore or --holdout, not both")
    if holdout < 0 or (limit is not None and limit < 1):
        raise NgspecError("--holdout must be >= 0 and --limit >= 1")
    from ngspec.models import load_tokenizer  # torch and transformers: not for --help

    tok = load_tokenizer(tokenizer or model, trust_remote_code)
    store = Datastore.open(datastore, tok) if datastore is not None else None
    asked = _questions(questions)
    pairs, records, generated = [], 0, []
    for i, record in enumerate(iter_records(dataset, split)):
        records += 1
        if input_field is None and response_field is None and is_generated(record):
            generated.append(record)  # paired once all are read: a later turn's input holds the earlier answers
            continue
        pairs.extend(record_pairs(record, _record_id(record, i), asked, input_field, response_field))
        if limit is not None and len(pairs) >= holdout + limit:
            break
    runs: dict[str, list[dict]] = {}
    if generated:
        answered, runs = generated_pairs(generated, asked, str(questions))
        pairs.extend(answered)
    if not pairs:
        raise NgspecError(
            f"{dataset}: none of its {records} records holds an (input, response) pair; expected Magpie "
            "'instruction' + 'response', Alpaca 'instruction' + 'output', 'prompt' + 'completion', ShareGPT 'conversations' (LMSYS's 'conversation'), "
            "OpenAI 'messages', an answer file "
            "('question_id' + 'choices', with --questions) or `generate --json` output (with --questions), or name the fields "
            "with --input-field/--response-field"
        )
    if len(pairs) <= holdout:
        raise NgspecError(f"{dataset} has {len(pairs)} (input, response) pairs; --holdout {holdout} leaves none to measure")
    start = time.perf_counter()
    encoded = tokenize_pairs(tok, pairs)
    tokenize_seconds = time.perf_counter() - start
    if holdout:
        store = Datastore.from_documents([resp for _, resp in encoded[:holdout]], len(tok), "holdout")
        pairs, encoded = pairs[holdout:], encoded[holdout:]
    pairs, encoded = pairs[:limit], encoded[:limit]
    report = measure(pairs, encoded, store)
    report.tokenize_seconds = tokenize_seconds
    result = report.as_dict() | {"dataset": dataset, "datastore": str(datastore) if datastore else ("holdout" if holdout else None), "holdout": holdout}
    for entry in result["per_record"]:  # each answer's ceiling beside what each drafter reached on it
        if entry["id"] in runs:
            entry["reached"] = {a.drafter: a.tokens_per_call for a in achieved([runs[entry["id"]]])}
    reached = achieved([runs[p.id] for p in pairs if p.id in runs])
    if reached:  # `generate --json` output: what its drafters reached beside the ceiling
        result["achieved"] = [
            {"drafter": a.drafter, "tokens_per_call": a.tokens_per_call, "share_of_ceiling": a.tokens_per_call / result["token_weighted"] if result["token_weighted"] else None,
             "new_tokens": a.new_tokens, "verify_calls": a.verify_calls}
            for a in reached
        ]
    if json_out:
        render.json_line(result)
        return
    render.summary_table(
        f"self-repetition of {dataset}" + (f" (+ {result['datastore']})" if result["datastore"] else ""),
        [
            ("pairs measured", str(result["records"])),
            ("mean over records", f"{result['mean']:.3f}"),
            ("median over records", f"{result['median']:.3f}"),
            ("token-weighted", f"{result['token_weighted']:.3f}"),
            ("response tokens", f"{result['response_tokens']:,}"),
            ("match lengths", "  ".join(f"{k}:{v}" for k, v in result["match_length_histogram"].items())),
            ("metric speed", f"{result['tokens_per_second']:,.0f} tokens/s (tokenising took {tokenize_seconds:.2f} s)"),
            *[(f"{a['drafter']}: tokens per call reached", f"{a['tokens_per_call']:.2f}" + (f" ({a['share_of_ceiling']:.0%} of the token-weighted ceiling)" if a["share_of_ceiling"] else ""))
              for a in result.get("achieved", [])],
        ],
    )
