"""`ngspec bench`: Spec-Bench-style comparison of drafters against transformers' generate."""

from __future__ import annotations

import functools
import json
import secrets
from pathlib import Path
from typing import Annotated, Callable, Optional

import typer
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn

from ngspec import staging
from ngspec.cli import render
from ngspec.cli.common import decode_config, load_engine, rows_options, sampling_config, warn_if_busy
from ngspec.cli.drafting import Drafting, with_drafting_options
from ngspec.cli.options import (
    DRAFTERS, CategoryOpt, DeviceOpt, DtypeOpt, JsonOpt, MaxNewTokensOpt, ModelOpt, ProfileOpt, TargetGraphsOpt, RawOpt, SeedOpt, TemperatureOpt, TopKOpt, TopPOpt, TrustRemoteCodeOpt,
    asks_every_turn, counted,
)
from ngspec.drafters import ROW_DRAFTERS, check_drafter
from ngspec.errors import NgspecError, Stopped
from ngspec.perf.measured import CpuWatch


@with_drafting_options
def bench_command(
    questions: Annotated[Path, typer.Option("--questions", "-q", help="Question file (Spec-Bench / MT-bench jsonl with 'turns', or a .jsonl of 'prompt', 'text' or chat 'messages' records, a .json array of them, or a .txt prompt; - reads standard input).")],
    drafters: Annotated[list[str], typer.Option("--drafter", "-d", help=f"Drafter to compare (repeatable, or comma-separated: -d trie,eagle+search); one of: {DRAFTERS}.")] = ["trie", "prompt-lookup"],
    category: CategoryOpt = None,
    limit: Annotated[Optional[int], typer.Option(help="Use the first N questions (after --category and --per-category).")] = None,
    per_category: Annotated[Optional[int], typer.Option("--per-category", help="Use the first N questions of every category (a spread over MT-bench's eight).")] = None,
    turns: Annotated[str, typer.Option("--turns", help="all: a question's later turns (MT-bench's second) are prompts too, each asked after the conversation so far, with transformers' greedy answers to the earlier turns, as Spec-Bench does; first: only the first turns.")] = "all",
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
    verify: Annotated[str, typer.Option("--verify", help="tree, rows, or both (every drafter runs in each layout).")] = "tree",
    plots: Annotated[Path, typer.Option("--plots", help="Directory for the (k, w) heatmaps of a grid sweep: bench-DRAFTER-LAYOUT.png, with --batch-size B bench-DRAFTER-LAYOUT-bB.png.")] = Path("bench-out"),
    markdown_out: Annotated[Optional[Path], typer.Option("--markdown", help="Also write the report as Markdown to this file.")] = None,
    json_path: Annotated[Optional[Path], typer.Option("--json-out", help="Also write the full JSON report to this file.")] = None,
    versus_arm: Annotated[Optional[str], typer.Option("--versus", help="Also compare every arm with this one (an arm label, e.g. trie): throughput ratio and its 95% interval, prompts paired. An arm is ahead when the interval's lower end is above 1.")] = None,
    batch_size: Annotated[int, typer.Option("--batch-size", "-b", help="Compare the arms as batches of this many rows (each arm decodes all prompts as one batch, refilled as rows finish; against vanilla at the same batch size; transformers' arms left out).")] = 1,
    rounds: Annotated[Optional[int], typer.Option("--rounds", help="Run every arm on every prompt this many times (default 1), arms in reversed order every other round: a question's rounds (and turns) are resampled together in the 95% intervals, so rounds average timing noise while more prompts narrow an interval more. With --batch-size above 1 (default 2), every arm's batch this many times: a round is one pair per arm, --versus's interval is over the rounds (over the groups with --interleave-batches), and 5 or more resolve a few percent.")] = None,
    interleave_batches: Annotated[int, typer.Option("--interleave-batches", metavar="K", help="With --batch-size B: cut the prompts into groups of K*B and run every arm in turn on each group (order reversed every other group), not each arm over all prompts before the next; a load that drifts within a round (a GPU's clocks, other jobs) then hits every arm alike, and --versus's interval resamples the groups. Each group is a batch run of its own, so its last rows drain with empty slots. 0: off.")] = 0,
    profile: ProfileOpt = None,
    target_graphs: TargetGraphsOpt = False,
    json_out: JsonOpt = False,
    drafting: Drafting = Drafting(),
) -> None:
    """Compare drafters with vanilla decoding and transformers' generate on the same prompts, in one
    process, interleaved: speedup vs hf-greedy, tokens per call, acceptance histogram, drafting
    share, exact-match rate vs hf-greedy, and the self-repetition ceiling. Row drafters can sweep a
    (k, w) grid (heatmaps of tokens per call and speedup) and report the mixed strategy's ablation.
    --rounds N runs every arm on every prompt N times. With --batch-size B each arm decodes the
    prompts as batches of B rows instead, --rounds times. A multi-turn question (MT-bench) is a
    prompt per turn, each later turn after the conversation so far, and the report splits by turn.
    On a GPU, add --interleave-batches 1 to batches: whole rounds there differ by 20-60%.
    With --temperature above 0 every arm samples with one seed (drawn when --seed is not given),
    against transformers' sampling (hf-sample); the engine's arms sample plain sampling's tokens,
    so their exact match is against vanilla. Ctrl-C during the timed runs still reports (and
    writes) the prompts every arm finished, or with --batch-size the whole rounds, then exits 1.

    Example: ngspec bench -q ../shared/data/spec_bench/question.jsonl --category rag --limit 20
    Batches: ngspec bench -q ../shared/data/spec_bench/question.jsonl --category rag --limit 24 -b 8 -d trie --versus trie
    Batches, interleaved: ngspec bench -q ../shared/data/spec_bench/question.jsonl --category rag --limit 32 -b 8 --interleave-batches 1 -d trie,eagle+search --eagle-head HEAD --datastore DS --versus trie
    """
    from ngspec.bench import grid
    from ngspec.bench.report import COLUMNS, SAMPLED_NOTE, ceiling_of, environment, interval_text, markdown, mismatch_notes, rows, split_tables, summarise, to_json, versus
    from ngspec.bench.runner import HF_ARMS, baseline, make_arms, run_bench
    from ngspec.perf.sweep import parse_values
    from ngspec.prompts import load_prompts, prompt_input, source_name
    from ngspec.turns import split_turns

    sampled = temperature > 0
    if sampled and seed is None:  # one seed for every arm: the engine's arms then sample the same tokens
        seed = secrets.randbits(32)
    cfg = decode_config(max_new_tokens, sampling_config(temperature, top_p, top_k, seed), None)
    sampling_settings = {"temperature": temperature, "top_p": top_p, "top_k": top_k, "seed": seed} if sampled else {}
    drafters = split_names(drafters)
    for name in drafters:
        if name not in HF_ARMS:
            check_drafter(name)
    drafting.check(drafters)
    opts = drafting.options()
    every_turn = asks_every_turn(turns)
    if verify not in ("tree", "rows", "both"):
        raise NgspecError(f"--verify must be tree, rows or both (got {verify!r})")
    bad = [f"{flag} must be at least 1 (got {value})" for flag, value in (("--batch-size", batch_size), ("--rounds", rounds)) if value is not None and value < 1]
    if bad:
        raise NgspecError("; ".join(bad))
    rounds = rounds or (2 if batch_size > 1 else 1)
    if interleave_batches < 0:
        raise NgspecError(f"--interleave-batches must be 0 (off) or more (got {interleave_batches})")
    if interleave_batches and batch_size == 1:
        raise NgspecError("--interleave-batches groups batches: give --batch-size above 1 (at batch size 1 the arms already run prompt by prompt)")
    if batch_size > 1 and verify != "tree":
        raise NgspecError("--batch-size verifies every row's tree in one forward: use --verify tree")
    if batch_size > 1 and versus_arm in HF_ARMS:
        raise NgspecError(f"--versus {versus_arm}: transformers' arms are left out of batches; compare with vanilla or a drafter")
    layouts = ["tree", "rows"] if verify == "both" else [verify]
    ks = parse_values(drafting.k, "k", 1) if drafting.k is not None else None
    ws = parse_values(drafting.w, "w", 1) if drafting.w is not None else None
    def run_arms(ks: list[int], ws: list[int]) -> list:
        """The run's arms: a batched run leaves transformers' out."""
        return [a for a in make_arms(drafters, opts, ks, ws, layouts, sampled) if batch_size == 1 or a.drafter not in HF_ARMS]

    arm_names = list(dict.fromkeys(a.drafter for a in run_arms([1], [1])))  # before the model loads, whatever the grid
    if versus_arm is not None and versus_arm.split(" ")[0] not in arm_names:  # labels start with the drafter
        raise NgspecError(f"--versus {versus_arm!r} is not an arm of this run; give one of: {', '.join(arm_names)}")
    prompts = load_prompts(questions, category, limit, per_category)
    for p in prompts:
        prompt_input(p, raw)  # chat messages refuse --raw before the model loads
    asked = len(split_turns(prompts, every_turn))  # one prompt per turn asked
    for flag, path in (("--markdown", markdown_out), ("--json-out", json_path)):
        if path is not None:
            staging.output_directory(path, flag)
    if any(len(values or ()) > 1 for values in (ks, ws)) and any(name in ROW_DRAFTERS for name in drafters):  # heatmaps
        staging.output_folder(plots, "--plots", "the heatmaps")
    engine = load_engine(model, device, dtype, profile, trust_remote_code, target_graphs=target_graphs)
    if ks is None or ws is None:  # unset: the profile's (k, w) at the first prompt's length, else the defaults
        defaults = rows_options(opts, None, None, engine.profile, 0, engine.target.device.type)
        ks = ks or [defaults.k]
        ws = ws or [defaults.w]
    arms = run_arms(ks, ws)
    if versus_arm is not None and versus_arm not in [a.label for a in arms]:
        raise NgspecError(f"--versus {versus_arm!r} is not an arm of this run; the arms are: {', '.join(a.label for a in arms)}")
    res = drafting.resources(engine, [a.drafter for a in arms])
    settings = {"questions": source_name(questions), "category": category, "per_category": per_category, "prompts": asked, "turns": turns,
                "max_new_tokens": max_new_tokens, "rounds": rounds, **sampling_settings, "drafting": drafting.settings()}
    if batch_size > 1:
        settings |= {"batch_size": batch_size, "interleave_batches": interleave_batches}
        _bench_batched(engine, prompts, every_turn, arms, cfg, res, raw, batch_size, rounds, settings,
                       versus_arm, markdown_out, json_path, json_out, plots, interleave_batches)
        return

    stopped, watch = None, CpuWatch()
    with render.progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()) as progress:
        task = progress.add_task("bench", total=asked * len(arms) * rounds)
        try:
            records = run_bench(engine, prompts, arms, cfg, res, raw, lambda arm: progress.advance(task), rounds, every_turn)
        except Stopped as stop:
            records = stop.measured
            stopped = settings["interrupted"] = f"after {len(records)} of {asked * rounds} prompt runs{' (prompts x rounds)' if rounds > 1 else ''}"
    settings["others_cpu_share"] = watch.share()

    summaries = summarise(records, [a.label for a in arms])
    splits = split_tables(records, [a.label for a in arms])
    env = environment(engine, settings, res.eagle)
    report = to_json(records, summaries, env)
    ceiling = ceiling_of(records)
    abl = report["ablation"] = grid.ablation(arms, grid.run_stats(arms, records))
    for title, columns, _, groups in splits:
        report[f"by_{columns[1]}"] = groups
    pairs = versus(records, [a.label for a in arms], versus_arm) if versus_arm is not None else []
    if pairs:
        report["versus"] = pairs
    ref = baseline(sampled)

    def paired(arm: str, base: str) -> tuple[float, tuple[float, float] | None]:
        [pair] = versus(records, [arm, base], base)
        return pair["ratio"], pair["interval"]

    sweep_lines, heatmaps = _sweeps(report, arms, summaries, plots, env, ref, paired)
    files = _files(heatmaps, report, json_path, markdown_out, lambda: markdown(
        summaries, env, ceiling, ceiling_of(records, True) if res.datastore is not None else None, records, pairs) + grid.markdown(sweep_lines, abl))
    if json_out:
        render.json_line(report)
        return _finish(files, env, stopped, markdown_out, json_path)
    render.table(f"bench{f' (interrupted {stopped})' if stopped else ''}: {counted(len(prompts), asked)}{f', {rounds} rounds' if rounds > 1 else ''}, {max_new_tokens} new tokens, {env['device']}, {env['dtype']}",
                 COLUMNS, rows(summaries))
    for title, columns, cells, _ in splits:
        render.table(f"{title}; ceiling: the group's self-repetition", columns, cells)
    if sweep_lines:
        render.info("\n".join(sweep_lines))
    _ablation_table(abl)
    store = f", {ceiling_of(records, True):.2f} when the datastore is searched too" if res.datastore is not None else ""
    render.info(f"self-repetition ceiling of the {ref} outputs (token-weighted): {ceiling:.2f}{store}; speedup = total throughput vs {ref}")
    if sampled:
        render.info(SAMPLED_NOTE)
    if pairs:
        render.table(
            f"against {versus_arm}, prompts paired",
            ["arm", f"throughput vs {versus_arm}", "95% interval"],
            [[p["arm"], f"{p['ratio']:.3f}x", interval_text(p["interval"], ".3f")] for p in pairs],
        )
    notes = mismatch_notes(records, summaries)
    if notes:
        head, *items = notes.strip().splitlines()
        render.info("\n".join([head, *listed(items)]))
    _finish(files, env, stopped, markdown_out, json_path)


def _bench_batched(engine, prompts, every_turn: bool, arms, cfg, res, raw: bool, batch_size: int, rounds: int, settings: dict, versus_arm, markdown_out, json_path, json_out: bool,
                   plots: Path, groups: int = 0) -> None:
    """`bench --batch-size`: every arm's batch over all prompts (each turn asked one; with
    ``groups``, every arm in turn on each group of that many batches' worth), ``rounds`` times,
    against vanilla at the same batch size; every row checked against transformers' greedy
    decoding alone, whose answers to earlier turns make the later turns' prompts (sampling:
    transformers' sampled answers make them, and every row is checked against vanilla's)."""
    from ngspec.batch import BatchConfig
    from ngspec.bench import batched, grid
    from ngspec.bench.report import SAMPLED_NOTE, environment
    from ngspec.turns import Conversations

    asked = Conversations(engine.loaded.tokenizer, prompts, every_turn, raw, engine.target.max_length, engine.target.vocab)
    sampled = not cfg.sampling.greedy
    with render.progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()) as progress:
        task = progress.add_task(f"reference (transformers' {'sampling' if sampled else 'greedy'}, one prompt at a time)", total=len(asked.units))
        ids, reference = [], []
        for i in range(len(asked.units)):
            ids.append(asked.ids(i))
            reference.append(engine.hf_generate(ids[-1], cfg.max_new_tokens, sampling=cfg.sampling)[0])
            asked.answered(i, reference[-1])
            progress.advance(task)
        parts = len(batched.batch_groups(ids, batch_size, groups))
        task = progress.add_task(f"batches of {batch_size}" + (f", {parts} groups" if parts > 1 else ""), total=rounds * len(arms) * parts)
        stopped, watch = None, CpuWatch()
        try:
            runs = batched.run_batched(engine, ids, arms, cfg, res, BatchConfig(batch_size), rounds, lambda arm: progress.advance(task), groups)
        except Stopped as stop:
            runs = stop.measured
            stopped = settings["interrupted"] = f"after {len(runs[arms[0].label])} of {rounds} rounds"
        settings["others_cpu_share"] = watch.share()
    with render.progress_when_called("rows that differ: where each splits", TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()) as measured:
        splits = batched.row_splits(engine, runs, ids, reference, cfg, measured)
    labels = [u.label for u in asked.units]
    summaries = batched.summarise_batched(runs, reference, sampled, splits)
    env = environment(engine, settings, res.eagle)
    ceilings = (batched.ceiling(ids, reference), batched.ceiling(ids, reference, res.datastore) if res.datastore is not None else None)
    pairs = batched.versus(summaries, versus_arm) if versus_arm is not None else []
    turns = batched.by_turn(runs, ids, reference, [u.turn for u in asked.units])
    report = batched.to_json(summaries, env, ceilings, pairs, turns, splits, labels)

    def paired(arm: str, base: str) -> tuple[float, tuple[float, float] | None]:
        [pair] = batched.versus([s for s in summaries if s.arm in (arm, base)], base)
        return pair["ratio"], pair["interval_95"]

    sweep_lines, heatmaps = _sweeps(report, arms, summaries, plots, env, "vanilla", paired, batch_size)
    abl = report["ablation"] = grid.ablation(arms, batched.run_stats(runs))
    files = _files(heatmaps, report, json_path, markdown_out, lambda: batched.markdown(
        summaries, env, ceilings, pairs, turns, sampled, splits, labels) + grid.markdown(sweep_lines, abl))
    if json_out:
        render.json_line(report)
        return _finish(files, env, stopped, markdown_out, json_path)
    render.table(f"bench{f' (interrupted {stopped})' if stopped else ''}: {counted(len(prompts), len(ids))} in batches of {batch_size}{f', {parts} interleaved groups' if parts > 1 else ''}, {rounds} round(s), {settings['max_new_tokens']} new tokens, {env['device']}, {env['dtype']}",
                 batched.COLUMNS, batched.rows(summaries))
    render.info(f"tok/s over all rows, against vanilla at batch size {batch_size}; tokens/call per row. {batched.ceiling_text(ceilings, sampled)}")
    if sampled:
        render.info(SAMPLED_NOTE)
    if sweep_lines:
        render.info("\n".join(sweep_lines))
    _ablation_table(abl)
    if turns:
        render.table("by turn: tokens/call per row (a later turn is asked after the conversation so far)", batched.turn_columns(turns), batched.turn_rows(turns))
    if pairs:
        render.table(f"against {versus_arm}", batched.versus_columns(versus_arm), batched.versus_rows(pairs))
        render.info(batched.versus_note(pairs))
    if splits:
        against = "vanilla's sampled rows" if sampled else "transformers' greedy decoding"
        render.info(f"rows that differ from {against} (a split a few rounding steps wide is a near-tie; float32 on a CPU should give none):\n"
                    + "\n".join(listed([f"- {x}" for x in batched.split_lines(splits, labels, sampled)])))
    _finish(files, env, stopped, markdown_out, json_path)


def _sweeps(report: dict, arms, summaries, plots: Path, env: dict, against: str, paired: Callable,
            batch_size: int = 1) -> tuple[list[str], list[tuple[Path, Callable[[], object]]]]:
    """A (k, w) grid's sweeps: each one's best cells into ``report`` ("sweeps"), the fastest
    against the runner-up (``paired(arm, base)``: the ratio and its 95% interval, None from one
    prompt or round), and its heatmaps' paths under ``plots`` ("plots"; a batched run's named by
    its batch size, so that they keep batch size 1's); the lines that say so on the terminal, and
    each heatmap's path with what draws it (`_finish` draws them, after the report is shown)."""
    from ngspec.bench import grid
    from ngspec.bench.report import interval_text

    grids = grid.sweeps(arms, summaries)
    report["sweeps"], lines = [], []
    if not grids:
        return [], []
    for g in grids:
        ((bk, bw), best), ((rk, rw), runner_up) = g.ranked("speedup")[:2]
        (tk, tw), most = g.best("tokens_per_call")
        ratio, interval = paired(best.arm, runner_up.arm)
        report["sweeps"].append({
            "drafter": g.drafter, "layout": g.layout, "best_by_speedup": [bk, bw], "best_by_tokens_per_call": [tk, tw],
            "runner_up_by_speedup": [rk, rw], "best_vs_runner_up": ratio, "interval_95": list(interval) if interval else None,
        })
        runner, span = f"the runner-up k={rk} w={rw}", (f"95% interval {interval_text(interval, '.3f')}" if interval
                                                         else f"no interval from one {'round' if batch_size > 1 else 'prompt'}")
        level = interval is not None and interval[0] <= 1.0 <= interval[1]
        narrower = "more --rounds narrow it" if batch_size > 1 else "more prompts (--limit) narrow it"  # --rounds' help: which does
        against_next = f"level with {runner}: {ratio:.3f}x, {span}; {narrower}" if level else f"{ratio:.3f}x {runner}, {span}"
        lines.append(f"{g.drafter} ({g.layout}): best by wall time k={bk} w={bw} ({best.speedup:.2f}x vs {against}; {against_next}); "
                     f"most tokens per call k={tk} w={tw} ({most.tokens_per_call:.2f})")
    plots.mkdir(parents=True, exist_ok=True)
    batch = (f", batch size {batch_size}", f"-b{batch_size}") if batch_size > 1 else ("", "")
    paths = [plots / f"bench-{g.drafter}-{g.layout}{batch[1]}.png" for g in grids]
    report["plots"] = [str(path) for path in paths]
    draws = [(path, functools.partial(grid.heatmaps, g, f"{g.drafter} ({g.layout}) on {env['model']}\n{env['device']}{batch[0]}", path, against))
             for g, path in zip(grids, paths)]
    return [*lines, "heatmaps: " + ", ".join(report["plots"])], draws


def _files(heatmaps: list[tuple[Path, Callable[[], object]]], report: dict, json_path: Path | None, markdown_out: Path | None,
           markdown_text: Callable[[], str]) -> list[tuple[Path, Callable[[], object]]]:
    """The run's files and what writes each: its heatmaps, then ``--markdown`` and ``--json-out``."""
    files = list(heatmaps)
    if markdown_out is not None:
        files.append((markdown_out, lambda: staging.write_text(markdown_out, markdown_text())))
    if json_path is not None:
        files.append((json_path, lambda: staging.write_text(json_path, json.dumps(report, indent=2))))
    return files


def _finish(files: list[tuple[Path, Callable[[], object]]], env: dict, stopped: str | None, markdown_out: Path | None,
            json_path: Path | None) -> None:
    """After the report is shown: write its files (last, so that a disk that fills during a long
    run costs the files, not the figures already on the terminal), warn if other work shared the
    CPUs, and exit non-zero if the run was interrupted."""
    from ngspec.bench.report import ARMS

    staging.write_each(files)
    warn_if_busy(env["others_cpu_share"], ARMS)
    _stop(stopped, markdown_out, json_path)


def _ablation_table(abl: list[dict]) -> None:
    """The row drafters' ablation (`grid.ablation`), when the run has one."""
    from ngspec.bench import grid

    if abl:
        render.table(grid.ABLATION_TITLE, grid.ABLATION_COLUMNS, grid.ablation_rows(abl))


def _stop(stopped: str | None, *paths: Path | None) -> None:
    """After an interrupted run's report (``stopped``: how far it got), exit non-zero saying so."""
    if stopped is not None:
        written = [str(p) for p in paths if p is not None]
        raise NgspecError(f"interrupted {stopped}; the report{' (and ' + ', '.join(written) + ')' if written else ''} covers only those, every arm on each")


LISTED = 12  # mismatch lines printed to the terminal; --markdown and the JSON keep every one


def listed(lines: list[str]) -> list[str]:
    """The first `LISTED` of ``lines``, and how many more the report files hold: a bf16 run on a
    GPU can split dozens of rows at near-ties."""
    if len(lines) <= LISTED:
        return lines
    return lines[:LISTED] + [f"... and {len(lines) - LISTED} more (every one in --markdown and the JSON)"]


def split_names(values: list[str]) -> list[str]:
    """``-d`` values as given, repeated or comma-separated (``-d vanilla,trie -d eagle+search``)."""
    return [name.strip() for value in values for name in value.split(",") if name.strip()]
