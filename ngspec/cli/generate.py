"""`ngspec generate`: generate from a prompt file with a chosen drafter, streaming the text."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from ngspec.cli import render
from ngspec.cli.common import decode_config, load_engine, sampling_config, stop_strings, warn_if_busy
from ngspec.cli.drafting import Drafting, with_drafting_options
from ngspec.cli.options import (
    DRAFTERS, CategoryOpt, DeviceOpt, DtypeOpt, JsonOpt, MaxNewTokensOpt, ModelOpt, ProfileOpt, TargetGraphsOpt, PromptFileArg, RawOpt, SeedOpt, TrustRemoteCodeOpt,
    StopOpt, TemperatureOpt, TopKOpt, TopPOpt, VerifyOpt, asks_every_turn,
)
from ngspec.drafters import ROW_DRAFTERS, DrafterOptions
from ngspec.errors import NgspecError
from ngspec.perf.measured import CpuWatch
from ngspec.prompts import STDIN, Prompt, load_prompts, prompt_input

if TYPE_CHECKING:  # torch and transformers load when a command runs, not for --help
    from ngspec.api import Output, Speculator
    from ngspec.batch import BatchResult
    from ngspec.turns import Conversations


def result_record(prompt: Prompt, drafter: str, output: Output) -> dict:
    """The per-prompt JSON record (also the source of the human summary): its id and turn."""
    return {"id": prompt.id, "turn": prompt.turn, "drafter": drafter, **output.as_dict()}


def _check_rows(check: dict | None) -> list[tuple[str, str]]:
    from ngspec.check import margin_text

    if check is None:
        return []
    if check["exact_match"]:
        return [("identical to plain decoding", "yes")]
    return [
        ("identical to plain decoding", f"NO, from token {check['first_mismatch']}"),
        ("top-2 margin there", margin_text(check)),
    ]


def _seed_note(record: dict) -> str:
    return f", seed {record['seed']}" if record.get("seed") is not None else ""


def _check_note(check: dict | None) -> str:
    """A batch row's check, as the end of its one-line summary."""
    from ngspec.check import margin_text

    if check is None:
        return ""
    if check["exact_match"]:
        return ", identical to plain decoding"
    return f", NOT identical to plain decoding from token {check['first_mismatch']} (top-2 margin there {margin_text(check)})"


def _rows_summary(stats: dict | None, opts: DrafterOptions | None) -> list[tuple[str, str]]:
    if not stats or opts is None:
        return []
    rows = [("rows (k) x tokens (w)", f"{opts.k} x {opts.w}")]
    for strategy, n in sorted(stats["rows_allocated"].items()):
        rows.append((f"{strategy}: rows drafted / tokens accepted", f"{n} / {stats['tokens_accepted'].get(strategy, 0)}"))
    return rows


def _search_summary(stats: dict | None) -> list[tuple[str, str]]:
    """search / eagle / eagle+search: where the search branch came from, step by step, and how
    the head fared."""
    rows: list[tuple[str, str]] = []
    if stats and "search_branch_from" in stats:
        found = stats["search_branch_from"]
        rows.append(("search branch from local / datastore / none", f"{found['local']} / {found['datastore']} / {found['none']}"))
        if "deepened" in stats:
            rows.append(("deepened branches", str(stats["deepened"])))
    if stats and "head_top_guess" in stats:
        right, scored = stats["head_top_guess"]
        rows.append(("steps without the head", str(stats["head_skipped"])))
        rows.append(("head's top guess right (drafted + caught up)", f"{right} / {scored}" + (f" ({right / scored:.0%})" if scored else "")))
        added, credited = stats.get("head_first_level", (0, 0.0))
        if credited:  # where the gate weighed the head and it ran: what its own first-level nodes added
            rows.append(("head's first level: nodes added / credited by the gate", f"{added} / {credited:.1f}"))
    return rows


def _run_batch(spec: Speculator, asked: Conversations, cfg, batch, json_out: bool, check: bool) -> None:
    """Batched generation: each prompt's text and record as it finishes, then the batch summary;
    prompts that cannot run fail alone (exit code 1 at the end). A question's later turn joins the
    batch once its earlier turn is answered. With ``check``, every row is compared with its own
    plain decoding once the batch is done (outside its timing), and the records follow then."""
    from ngspec.batch import Request

    drafter, units, failed, checked = spec.drafter, asked.units, {}, []
    unit_of, ids, later = [], [], []  # by batch index: the unit it asks and its token ids; later turns ready to join

    def enqueue(i: int) -> int:
        """``units[i]``'s batch index (its ids built first: one that cannot be built takes none)."""
        token_ids = asked.ids(i)
        unit_of.append(i)
        ids.append(token_ids)
        return len(ids) - 1

    def show(unit: Prompt, record: dict) -> None:
        if json_out:
            render.json_line(record)
            return
        render.rule(f"prompt {unit.label}")
        render.console.print(record["text"], markup=False, highlight=False)
        render.info(f"{record['new_tokens']} tokens, {record['mean_tokens_per_call']:.2f} per call, finished by {record['finish_reason']}{_seed_note(record)}{_check_note(record.get('greedy_check'))}")

    def on_finish(result: BatchResult) -> None:
        i = unit_of[result.index]
        if result.error is not None:
            _fail(asked, i, result.error, failed, drafter, json_out)
            return
        gen = result.generation
        asked.answered(i, gen.token_ids)
        output = spec.output(gen, len(ids[result.index]))
        if check:
            checked.append((result.index, output))
        else:
            show(units[i], result_record(units[i], drafter, output))
        if (j := asked.next_turn(i)) is not None:
            try:
                index = enqueue(j)
            except NgspecError as exc:  # e.g. a chat template that refuses the conversation
                _fail(asked, j, str(exc), failed, drafter, json_out)
                return
            later.append(Request(index, ids[index], cfg.max_new_tokens, cfg.sampling, spec.engine.stopper(cfg)))

    def feed() -> list[Request]:
        ready = list(later)
        later.clear()
        return ready

    first = []
    for i, unit in enumerate(units):
        if unit.turn == 1:
            try:
                first.append(enqueue(i))
            except NgspecError as exc:  # e.g. text that is not text, or a chat template that refuses it
                _fail(asked, i, str(exc), failed, drafter, json_out)
    many_turns = any(unit.turn > 1 for unit in units)
    watch = CpuWatch()
    results, report = spec.run_ids([ids[b] for b in first], cfg, batch, on_finish, feed if many_turns else None)
    others = watch.share()
    records = []
    for index, output in checked:
        unit = units[unit_of[index]]
        records.append(result_record(unit, drafter, spec.checked(output, ids[index], cfg)))
        show(unit, records[-1])
    done = [r.generation for r in results if r.generation is not None]
    calls = sum(g.stats.verify_calls for g in done)
    summary = {
        "batch_size": batch.batch_size, "rearrange_every": batch.rearrange_every, "rearrange_min_share": batch.rearrange_min_share,
        "joint_sizing": batch.joint_sizing, "layout": batch.layout, "prompts": len(units), "failed": len(failed),
        "mean_tokens_per_call": sum(len(g.token_ids) for g in done) / calls if calls else 0.0, **report.as_dict(),
        "others_cpu_share": others,
    }
    if check:
        summary["identical_to_plain"] = sum(r["greedy_check"]["exact_match"] for r in records)
    if (head := spec.head_graphs()) is not None:
        summary["head_graphs"] = head
    if json_out:
        render.json_line({"batch": summary})
    else:
        render.summary_table(
            f"{drafter}, batch of {batch.batch_size} on {spec.engine.loaded.name} ({spec.engine.target.device})",
            [
                ("prompts (failed)", f"{len(units)} ({len(failed)})"),
                ("new tokens", str(summary["new_tokens"])),
                ("seconds", f"{summary['seconds']:.2f}"),
                ("tokens/s (all rows)", f"{summary['tokens_per_second']:.1f}"),
                ("prefill share of time", f"{100 * summary['prefill_share']:.1f}%"),
                ("prefill forwards (--prefill-tokens)", f"{summary['prefill_forwards']} ({summary['prefill_tokens'] or 'one prompt each'})"),
                ("batched verification steps", str(summary["steps"])),
                ("mean tokens per call (per row)", f"{summary['mean_tokens_per_call']:.2f}"),
                ("cache rearrangements (seconds)", f"{summary['rearrangements']} ({summary['rearrange_seconds']:.3f})"),
                ("checks skipped (would free < min share)", str(summary["rearrange_skipped"])),
                ("cache entries freed (rows x slots)", str(summary["freed_entries"])),
                ("mean share of cache slots that are holes", f"{100 * summary['mean_hole_share']:.0f}%"),
                ("peak cache slots per row", str(summary["peak_cache_slots"])),
                *([("rows identical to plain decoding", f"{summary['identical_to_plain']} of {len(checked)}")] if check else []),
                *([("target graphs", summary["target_graphs"])] if summary["target_graphs"] else []),
                *([("head graphs", summary["head_graphs"])] if "head_graphs" in summary else []),
            ],
        )
    warn_if_busy(others, "the batch")
    if failed:
        raise NgspecError(_failures(failed, len(units)))


def _fail(asked: Conversations, i: int, error: str, failed: dict[int, str], drafter: str, json_out: bool) -> None:
    """``asked.units[i]`` could not run: recorded in ``failed`` and shown, and so are its
    question's later turns, which cannot be asked without its answer."""
    unit = asked.units[i]
    failed[i] = unit.label
    _show_failure(unit, drafter, error, json_out)
    if (j := asked.next_turn(i)) is not None:
        _fail(asked, j, f"not asked: turn {unit.turn} failed", failed, drafter, json_out)


def _show_failure(prompt: Prompt, drafter: str, error: str, json_out: bool) -> None:
    """A prompt that could not run: its JSON record, or one line on stderr."""
    if json_out:
        render.json_line({"id": prompt.id, "turn": prompt.turn, "drafter": drafter, "error": error})
    else:
        render.error(f"prompt {prompt.label}: {error}")


def _failures(failed: dict[int, str], asked: int) -> str:
    """The prompts that failed (by index, their labels) of the ``asked``, in one line."""
    if len(failed) == asked:
        return f"{'the prompt' if asked == 1 else f'all {asked} prompts'} failed: {', '.join(failed.values())}"
    return f"{len(failed)} prompt(s) failed: {', '.join(failed.values())} (the others finished)"


@with_drafting_options
def generate_command(
    prompt_file: PromptFileArg,
    drafter: Annotated[str, typer.Option("--drafter", "-d", help=f"One of: {DRAFTERS}.")] = "trie",
    category: CategoryOpt = None,
    limit: Annotated[Optional[int], typer.Option(help="Use the first N prompts (questions) of the file, after --category.")] = None,
    model: ModelOpt = "default",
    trust_remote_code: TrustRemoteCodeOpt = False,
    max_new_tokens: MaxNewTokensOpt = 256,
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = "auto",
    raw: RawOpt = False,
    temperature: TemperatureOpt = 0.0,
    top_p: TopPOpt = 1.0,
    top_k: TopKOpt = 0,
    seed: SeedOpt = None,
    stop: StopOpt = None,
    verify: VerifyOpt = "tree",
    batch_size: Annotated[int, typer.Option("--batch-size", "-b", help="Decode this many prompts of a .jsonl or .json at once (each with its own drafts and acceptance; a finished prompt's slot goes to the next one). 1 = one at a time, streamed.")] = 1,
    rearrange_every: Annotated[Optional[int], typer.Option("--rearrange-every", help="With --batch-size > 1: every N steps, compact the KV cache (drop the holes rejected drafts leave) if that frees enough (--rearrange-min-share); 0 = never.", show_default="8")] = None,
    rearrange_min_share: Annotated[Optional[float], typer.Option("--rearrange-min-share", help="Compact only when that frees at least this share of the cache's slots (compaction copies the whole cache); 0 = at every check.", show_default="0.2, measured on CPU")] = None,
    batch_layout: Annotated[str, typer.Option("--batch-layout", help="With --batch-size > 1: padded (every row's tree padded to the widest, one width chosen for all) or packed (rows back to back, each row keeps the nodes that pay for their share of the step; lost to padded on a two-core CPU, BENCHMARKS.md 10n).")] = "padded",
    prefill_tokens: Annotated[Optional[int], typer.Option("--prefill-tokens", help="With --batch-size > 1: prompts admitted at once (a batch's first rows, slots freed in the same step) are prefilled together in forwards of at most this many tokens, padding included; 0 = each prompt alone. 8192 on a GPU, where a prefill costs host work as a step does; 0 on a CPU, where padding costs arithmetic.", show_default="8192 on a GPU, 0 on a CPU")] = None,
    rows_alone: Annotated[bool, typer.Option("--size-rows-alone", help="With --batch-size > 1: each row sizes its draft tree by itself. Default: one width for the whole batch, chosen from every row's estimates (one forward pays for the widest tree).")] = False,
    turns: Annotated[str, typer.Option("--turns", help="all: a multi-turn question's later turns ({'turns': [...]} records, MT-bench's second) are asked too, each after the conversation so far with the answers just generated, as Spec-Bench asks them; first: only the first turns.")] = "all",
    check: Annotated[bool, typer.Option("--check", help="Also decode plainly (no drafts; greedy, or sampling with the run's seed) and report whether the tokens are identical; on a mismatch, the position and the top-2 margin there (logits; sampling: log-probability plus the seed's noise), a near-tie explaining a flip in bf16/fp16. In a batch every row is checked after the batch (its timing excludes the checks).")] = False,
    profile: ProfileOpt = None,
    target_graphs: TargetGraphsOpt = False,
    json_out: JsonOpt = False,
    drafting: Drafting = Drafting(),
) -> None:
    """Generate text for every prompt in a file, token-identical to plain decoding, and report
    speed and acceptance.

    Example: ngspec generate -p examples/rag_ngspec.txt --drafter trie
    """
    from ngspec.api import Speculator, check_choice
    from ngspec.batch import BatchConfig
    from ngspec.decode import check_prompt
    from ngspec.turns import Conversations

    check_choice(drafter, drafting)  # validate everything before loading anything
    cfg = decode_config(max_new_tokens, sampling_config(temperature, top_p, top_k, seed), stop_strings(stop), verify)
    every = BatchConfig.rearrange_every if rearrange_every is None else rearrange_every
    min_share = BatchConfig.rearrange_min_share if rearrange_min_share is None else rearrange_min_share
    batch = BatchConfig(batch_size, every, min_share, joint_sizing=not rows_alone, layout=batch_layout, prefill_tokens=prefill_tokens)
    if batch_size > 1 and verify != "tree":
        raise NgspecError("--batch-size > 1 verifies trees: use --verify tree (rows are for one prompt at a time)")
    every_turn = asks_every_turn(turns)
    if str(prompt_file) == STDIN and sys.stdin.isatty():
        render.info("reading the prompt from standard input: type it, then Ctrl-D on a line of its own")
    prompts = load_prompts(prompt_file, category, limit)
    for p in prompts:
        prompt_input(p, raw)  # --raw refuses chat messages before the model loads
    # the drafters' estimates are carried from prompt to prompt (and row to row) in the Speculator
    spec = Speculator(load_engine(model, device, dtype, profile, trust_remote_code, target_graphs=target_graphs), drafter, drafting)
    asked = Conversations(spec.engine.loaded.tokenizer, prompts, every_turn, raw)  # one prompt per turn asked
    if batch_size > 1:
        _run_batch(spec, asked, cfg, batch, json_out, check)
        return
    engine, units, failed, records, watch = spec.engine, asked.units, {}, [], CpuWatch()
    for i, unit in enumerate(units):
        if i in failed:  # a later turn of a question whose earlier turn failed
            continue
        try:
            ids = asked.ids(i)
            if len(units) > 1:  # a prompt that cannot run fails alone, as in a batch
                check_prompt(ids, engine.target.max_length, engine.target.vocab)
        except NgspecError as exc:
            if len(units) == 1:  # the run's one prompt: its error is the run's
                raise
            _fail(asked, i, str(exc), failed, drafter, json_out)
            continue
        stream = None if json_out else render.TextStream(engine.detokenize)
        if stream is not None and len(units) > 1:
            render.rule(f"prompt {unit.label}")
        output = spec.output(spec.run(ids, cfg, on_tokens=stream), len(ids))
        asked.answered(i, output.token_ids)
        record = result_record(unit, drafter, spec.checked(output, ids, cfg) if check else output)
        if engine.target.static is not None:  # so far, over the prompts run
            record["target_graphs"] = engine.target.static.report()
        if (head := spec.head_graphs()) is not None:
            record["head_graphs"] = head
        records.append(record)
        if json_out:
            render.json_line(record)
            continue
        stream.finish()
        render.summary_table(
            f"{drafter} on {engine.loaded.name} ({engine.target.device}, {str(engine.target.dtype).removeprefix('torch.')})",
            [
                ("new tokens", str(record["new_tokens"])),
                ("seconds", f"{record['seconds']:.2f}"),
                ("tokens/s", f"{record['tokens_per_second']:.1f}"),
                ("verification calls", str(record["verify_calls"])),
                ("mean tokens per call", f"{record['mean_tokens_per_call']:.2f}"),
                ("drafting share of time", f"{100 * record['draft_share']:.1f}%"),
                ("prefill share of time", f"{100 * record['prefill_share']:.1f}%"),
                ("finished by", record["finish_reason"]),
                *([("sampling seed", str(record["seed"]))] if record.get("seed") is not None else []),
                *_rows_summary(record.get("drafter_stats"), spec.options_for(len(ids)) if drafter in ROW_DRAFTERS else None),
                *_search_summary(record.get("drafter_stats")),
                *_check_rows(record.get("greedy_check")),
                *([("target graphs (so far)", record["target_graphs"])] if "target_graphs" in record else []),
                *([("head graphs (so far)", record["head_graphs"])] if "head_graphs" in record else []),
            ],
        )
    if len(units) > 1 and not json_out:
        _totals(records, len(units), len(failed), f"{drafter}: all {len(units)} prompts, one at a time, on {engine.loaded.name} ({engine.target.device})")
    warn_if_busy(watch.share(), "the prompts" if len(units) > 1 else "the prompt")
    if failed:
        raise NgspecError(_failures(failed, len(units)))


def _totals(records: list[dict], prompts: int, failed: int, title: str) -> None:
    """The run's totals after its prompts' own tables: tokens per second and per call over every
    prompt that ran (each prompt's seconds, added up: a prompt's own time, prefill included)."""
    seconds = sum(r["seconds"] for r in records)
    tokens = sum(r["new_tokens"] for r in records)
    calls = sum(r["verify_calls"] for r in records)
    checked = [r["greedy_check"] for r in records if r.get("greedy_check")]
    render.summary_table(title, [
        ("prompts (failed)", f"{prompts} ({failed})"),
        ("new tokens", str(tokens)),
        ("seconds", f"{seconds:.2f}"),
        ("tokens/s", f"{tokens / seconds:.1f}" if seconds else "-"),
        ("verification calls", str(calls)),
        ("mean tokens per call", f"{tokens / calls:.2f}" if calls else "-"),
        ("drafting share of time", f"{100 * sum(r['draft_seconds'] for r in records) / seconds:.1f}%" if seconds else "-"),
        ("prefill share of time", f"{100 * sum(r['prefill_seconds'] for r in records) / seconds:.1f}%" if seconds else "-"),
        *([("identical to plain decoding", f"{sum(c['exact_match'] for c in checked)} of {len(checked)}")] if checked else []),
    ])
