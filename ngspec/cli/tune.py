"""`ngspec tune-tree`: a static EAGLE tree shape tuned for this device and batch size."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from ngspec import staging
from ngspec.cli import render
from ngspec.cli.common import load_engine, warn_if_busy
from ngspec.cli.options import DeviceOpt, DtypeOpt, JsonOpt, MaxNewTokensOpt, ModelOpt, RawOpt, TrustRemoteCodeOpt, asks_every_turn, counted
from ngspec.errors import NgspecError
from ngspec.perf.measured import CpuWatch

MT_BENCH = Path(__file__).resolve().parents[1] / "data" / "mt_bench.jsonl"


def calibration_prompts(questions: Path | None, per_category: int | None, limit: int | None):
    """The first question of each of the bundled MT-bench's categories unless told otherwise, and
    every question of a file of your own (which may have no categories at all)."""
    from ngspec.prompts import load_prompts

    if questions is None:
        return load_prompts(MT_BENCH, None, limit, per_category or 1)
    return load_prompts(questions, None, limit, per_category)


def calibration_source(questions: Path | None) -> str:
    """Where the calibration prompts came from, as the shape file records it."""
    from ngspec.prompts import source_name

    return "the bundled MT-bench" if questions is None else source_name(questions)


def tune_tree_command(
    eagle_head: Annotated[Path, typer.Option("--eagle-head", help="The EAGLE-1 head to tune a tree for (`ngspec train-eagle` makes one).")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Where to write the tuned shape (JSON; load it with --tree static --tree-choices FILE).")],
    model: ModelOpt = "default",
    trust_remote_code: TrustRemoteCodeOpt = False,
    questions: Annotated[Optional[Path], typer.Option("--questions", "-q", help="Calibration questions (jsonl with 'turns' or 'prompt'; - reads standard input); default: the bundled MT-bench questions.")] = None,
    per_category: Annotated[Optional[int], typer.Option("--per-category", help="First N questions of every category (default: 1 of each of the bundled MT-bench's eight; every question of your --questions).")] = None,
    limit: Annotated[Optional[int], typer.Option(help="At most this many questions (after --per-category).")] = None,
    turns: Annotated[str, typer.Option("--turns", help="all: a question's later turns (MT-bench's second) are calibration prompts too, each asked after the conversation so far, as bench and generate ask them; first: only the first turns (about half the time).")] = "all",
    max_new_tokens: MaxNewTokensOpt = 128,
    batch_size: Annotated[int, typer.Option("--batch-size", "-b", help="Tune for decoding this many prompts at once.")] = 1,
    nodes: Annotated[int, typer.Option("--nodes", help="Nodes of the large tree measured first (and the largest count searched).")] = 80,
    width: Annotated[int, typer.Option("--width", help="Most children per node in the large tree.")] = 8,
    depth: Annotated[int, typer.Option("--depth", help="Depth of the large tree.")] = 6,
    min_nodes: Annotated[int, typer.Option("--min-nodes", help="Smallest node count searched.")] = 2,
    finalists: Annotated[int, typer.Option("--finalists", help="The search's fastest N node counts are timed again side by side, and the fastest of that timing wins; it also says how far ahead of the runner-up and how sure (1: no playoff).")] = 3,
    head_int8: Annotated[bool, typer.Option("--head-int8/--head-float32", help="Tune with the head's products in int8 (on a CPU with a float32 model), as generate and bench run it by default; match what you will generate with.")] = True,
    force: Annotated[bool, typer.Option("--force", help="Replace --out if it exists.")] = False,
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = "auto",
    raw: RawOpt = False,
    target_graphs: Annotated[bool, typer.Option("--target-graphs", help="Tune with the target's verification replayed from CUDA graphs (a CUDA GPU), as generate --target-graphs runs it: a replay costs about the same whatever the tree's size, so the best node count differs. Match what you will generate with.")] = False,
    json_out: JsonOpt = False,
) -> None:
    """Measure each node's acceptance in a large static EAGLE tree on calibration prompts, prune
    the least-accepted nodes, and search (a geometric scan, then golden section) the node count with the most tokens/s
    at --batch-size on this device; save the shape for `generate`/`bench --tree static
    --tree-choices FILE`. Counts are timed side by side, group of --batch-size prompts by group,
    and the best --finalists are timed again together at the end: the winner's lead over the
    runner-up comes with a 95% interval (an interval across 1: the two are level on these prompts).

    Example: ngspec tune-tree --eagle-head heads/smollm2 --out shapes/smollm2-cpu-b1.json
    """
    from ngspec.batch import BatchConfig
    from ngspec.bench.report import interval_text
    from ngspec.decode import DecodeConfig
    from ngspec.drafters.eagle import EagleOptions, eagle_factory
    from ngspec.drafters.ngram_tables import model_fingerprint
    from ngspec.eagle import int8
    from ngspec.eagle.head import load_draft_vocab, load_head
    from ngspec.eagle.tune import AcceptanceRecorder, SideBySide, acceptance_rates, coarse_then_golden, expected_tokens, large_tree, playoff, prune, rate
    from ngspec.turns import Conversations
    from ngspec.versions import versions

    if not eagle_head.is_dir():
        raise NgspecError(f"no EAGLE head directory at {eagle_head}")
    staging.refuse_replacing(Path(out), force)
    counts = (("--nodes", nodes), ("--min-nodes", min_nodes), ("--width", width), ("--depth", depth), ("--finalists", finalists), ("--max-new-tokens", max_new_tokens))
    bad = [f"{flag} must be at least 1 (got {value})" for flag, value in counts if value < 1]
    if not bad and min_nodes > nodes:
        bad.append(f"--min-nodes {min_nodes} is more than --nodes {nodes}")
    if bad:
        raise NgspecError("; ".join(bad))
    every_turn = asks_every_turn(turns)
    staging.output_directory(out, "--out")
    batch = BatchConfig(batch_size)
    prompts = calibration_prompts(questions, per_category, limit)
    engine = load_engine(model, device, dtype, trust_remote_code=trust_remote_code, target_graphs=target_graphs)
    if nodes >= engine.target.max_length:  # a verification holds the tree after the prompt, in the window
        raise NgspecError(f"--nodes {nodes} is more than one verification can hold in the model's context window ({engine.target.max_length} tokens)")
    # one prompt per turn asked; a later turn is built once the large tree's run has answered the
    # turn before it (lossless: plain greedy's answer), and every prompt must fit the context window
    asked = Conversations(engine.loaded.tokenizer, prompts, every_turn, raw, engine.target.max_length, engine.target.vocab)
    units = asked.units
    cfg = DecodeConfig(max_new_tokens=max_new_tokens, max_draft_nodes=nodes)
    head = load_head(eagle_head, engine.loaded.model)  # read once; every candidate tree reuses it
    vocab = load_draft_vocab(eagle_head)
    big = large_tree(width, depth, nodes)
    accepted: Counter = Counter()
    steps: Counter = Counter()

    def factory(choices):
        return eagle_factory(engine.loaded.model, head, EagleOptions(tree="static", choices=choices, head_int8=head_int8), vocab)

    def decode(at: list[int], make, on_finish):
        """Decode the prompts ``units[i]`` for ``i`` in ``at`` as one batch run: their results and
        (new tokens, seconds, verify calls)."""
        results, report = engine.run_batch([asked.ids(i) for i in at], make, cfg, batch, on_finish)
        failed = next((r for r in results if r.error), None)
        if failed is not None:
            raise NgspecError(f"calibration prompt {units[at[failed.index]].label} cannot run: {failed.error}")
        return results, (report.new_tokens, report.seconds, sum(r.generation.stats.verify_calls for r in results))

    def progress_bar() -> Progress:
        return render.progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())

    render.info(f"calibrating a {len(big)}-node tree on {counted(len(prompts), len(units))}, batch size {batch_size} ...")
    watch = CpuWatch()
    with progress_bar() as progress:
        task = progress.add_task(f"measuring acceptance of {len(big)} nodes", total=len(units))
        recorder = factory(big)
        for turn in sorted({u.turn for u in units}):  # every first turn, then the second turns they lead to, ...
            at = [i for i, u in enumerate(units) if u.turn == turn]
            results, _ = decode(at, lambda: AcceptanceRecorder(recorder(), accepted, steps), lambda r: progress.advance(task))
            for i, result in zip(at, results):
                asked.answered(i, result.generation.token_ids)
    rates = acceptance_rates(accepted, steps["steps"], big)

    # each node count decodes every group of --batch-size prompts; the counts of one comparison
    # take turns group by group (`SideBySide`), each count's drafter factory kept for all its groups
    groups = [list(range(g, min(g + batch_size, len(units)))) for g in range(0, len(units), batch_size)]
    factories: dict = {}
    shown: set[int] = set()

    def figures(m: int) -> dict:
        runs = timer.runs[m]
        calls = sum(c for _, _, c in runs)
        return {"tokens_per_second": rate(runs), "tokens_per_call": sum(t for t, _, _ in runs) / calls if calls else 0.0,
                "seconds": sum(s for _, s, _ in runs), "expected_tokens_per_call": expected_tokens(rates, prune(rates, m))}

    def tokens_per_second(m: int) -> float:
        value = timer.tokens_per_second(m)
        if m not in shown:
            shown.add(m)
            f = figures(m)
            render.info(f"{m:>4} nodes: {f['tokens_per_second']:.1f} tokens/s, {f['tokens_per_call']:.2f} tokens/call (expected {f['expected_tokens_per_call']:.2f})")
        return value

    with progress_bar() as progress:
        task = progress.add_task("", total=None)

        def announce(counts: list[int], groups: int) -> None:
            progress.reset(task, total=len(counts) * groups, description=f"timing {', '.join(map(str, counts))} nodes side by side")

        def run_group(m: int, g: int):
            if m not in factories:
                factories[m] = factory(prune(rates, m))
            _, result = decode(groups[g], factories[m], None)
            progress.advance(task)
            return result

        timer = SideBySide(run_group, len(groups), announce)
        coarse_then_golden(tokens_per_second, min_nodes, len(big), timer.measure)
        searched = {m: figures(m) for m in sorted(timer.runs)}  # before the playoff times its counts again
        final = playoff(timer, finalists)
    best = final.best
    shape = prune(rates, best)
    record = {
        "format": "ngspec-tree-shape", "version": 1, "model": engine.loaded.name,
        "model_fingerprint": model_fingerprint(engine.loaded.model), "eagle_head": str(eagle_head),
        "device": str(engine.target.device), "dtype": str(engine.target.dtype).removeprefix("torch."), **versions(),
        "batch_size": batch_size, "head_int8": head_int8 and int8.applies(engine.loaded.model, head), "nodes": len(shape),
        "calibration_questions": calibration_source(questions), "calibration_prompts": len(units), "turns": turns, "calibration_steps": steps["steps"],
        "searched": {str(m): v for m, v in searched.items()},
        "playoff": {"nodes": list(final.counts), "tokens_per_second": {str(m): v for m, v in final.tokens_per_second.items()},
                    "best_vs_runner_up": final.ratio, "interval": list(final.interval) if final.interval else None},
        "others_cpu_share": watch.share(),  # while the sizes were timed (and the acceptance measured)
        "acceptance": {json.dumps(list(c)): rates[c] for c in shape},
        "choices": [list(c) for c in shape],
    }
    if json_out:
        render.json_line(record)
        _write_shape(out, record, shown=True)
        warn_if_busy(record["others_cpu_share"], "the tree sizes")
        return
    render.table(
        f"tree sizes tried on {engine.loaded.name} ({engine.target.device}), batch size {batch_size}",
        ["nodes", "tokens/s", "tokens/call", "expected tokens/call", "playoff tokens/s"],
        [[str(m), f"{v['tokens_per_second']:.1f}", f"{v['tokens_per_call']:.2f}", f"{v['expected_tokens_per_call']:.2f}",
          f"{final.tokens_per_second[m]:.1f}" if m in final.tokens_per_second else "-"] for m, v in searched.items()],
    )
    if final.ratio is not None:
        lead = f"{final.ratio:.3f}x the runner-up ({final.counts[1]} nodes) timed side by side, 95% interval {interval_text(final.interval, '.3f')}"
        if final.interval is not None and final.interval[0] <= 1.0:
            lead += ": level on these prompts (more of them, --limit or --per-category, would tell the two apart)"
        render.info(f"playoff of {', '.join(map(str, final.counts))} nodes: {best} nodes ran {lead}")
    _write_shape(out, record, shown=False)
    render.info(f"best: {best} nodes; shape written to {out} (use: --tree static --tree-choices {out})")
    warn_if_busy(record["others_cpu_share"], "the tree sizes")


def _write_shape(out: Path, record: dict, shown: bool) -> None:
    """Write the tuned shape, after the report is shown; when it cannot be written (a disk that
    fills), the shape goes to stdout as JSON (``shown``: it is there already), so that the tuning,
    which may have taken hours, is not lost."""
    try:
        staging.write_text(out, json.dumps(record, indent=1))
    except OSError as exc:
        if not shown:
            render.json_line(record)
        raise NgspecError(f"{staging.os_error_message(exc)}; the tuned shape is the JSON record on stdout: save it to a file "
                          "(where there is room) and load it with --tree static --tree-choices FILE") from exc
