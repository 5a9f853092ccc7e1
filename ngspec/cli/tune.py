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
from ngspec.cli.common import load_engine
from ngspec.cli.options import DeviceOpt, DtypeOpt, JsonOpt, MaxNewTokensOpt, ModelOpt, RawOpt
from ngspec.errors import NgspecError

MT_BENCH = Path(__file__).resolve().parents[1] / "data" / "mt_bench.jsonl"


def calibration_prompts(questions: Path | None, per_category: int | None, limit: int | None):
    """The first question of each of the bundled MT-bench's categories unless told otherwise, and
    every question of a file of your own (which may have no categories at all)."""
    from ngspec.prompts import load_prompts

    if questions is None:
        return load_prompts(MT_BENCH, None, limit, per_category or 1)
    return load_prompts(questions, None, limit, per_category)


def tune_tree_command(
    eagle_head: Annotated[Path, typer.Option("--eagle-head", help="The EAGLE-1 head to tune a tree for (`ngspec train-eagle` makes one).")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Where to write the tuned shape (JSON; load it with --tree static --tree-choices FILE).")],
    model: ModelOpt = "default",
    questions: Annotated[Optional[Path], typer.Option("--questions", "-q", help="Calibration questions (jsonl with 'turns' or 'prompt'); default: the bundled MT-bench questions.")] = None,
    per_category: Annotated[Optional[int], typer.Option("--per-category", help="First N questions of every category (default: 1 of each of the bundled MT-bench's eight; every question of your --questions).")] = None,
    limit: Annotated[Optional[int], typer.Option(help="At most this many questions (after --per-category).")] = None,
    max_new_tokens: MaxNewTokensOpt = 128,
    batch_size: Annotated[int, typer.Option("--batch-size", "-b", help="Tune for decoding this many prompts at once.")] = 1,
    nodes: Annotated[int, typer.Option("--nodes", help="Nodes of the large tree measured first (and the largest count searched).")] = 80,
    width: Annotated[int, typer.Option("--width", help="Most children per node in the large tree.")] = 8,
    depth: Annotated[int, typer.Option("--depth", help="Depth of the large tree.")] = 6,
    min_nodes: Annotated[int, typer.Option("--min-nodes", help="Smallest node count searched.")] = 2,
    head_int8: Annotated[bool, typer.Option("--head-int8/--head-float32", help="Tune with the head's products in int8 (on a CPU with a float32 model), as generate and bench run it by default; match what you will generate with.")] = True,
    force: Annotated[bool, typer.Option("--force", help="Replace --out if it exists.")] = False,
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = "auto",
    raw: RawOpt = False,
    json_out: JsonOpt = False,
) -> None:
    """Measure each node's acceptance in a large static EAGLE tree on calibration prompts, prune
    the least-accepted nodes, and search (a geometric scan, then golden section) the node count with the most tokens/s
    at --batch-size on this device; save the shape for `generate`/`bench --tree static
    --tree-choices FILE`.

    Example: ngspec tune-tree --eagle-head heads/smollm2 --out shapes/smollm2-cpu-b1.json
    """
    from ngspec.batch import BatchConfig
    from ngspec.decode import DecodeConfig
    from ngspec.drafters.eagle import EagleOptions, eagle_factory
    from ngspec.eagle import int8
    from ngspec.eagle.head import load_draft_vocab, load_head
    from ngspec.eagle.tune import AcceptanceRecorder, TuneResult, acceptance_rates, coarse_then_golden, expected_tokens, large_tree, prune
    from ngspec.prompts import encode

    if not eagle_head.is_dir():
        raise NgspecError(f"no EAGLE head directory at {eagle_head}")
    if out.exists() and not force:
        raise NgspecError(f"{out} already exists (use --force to replace it)")
    if not 1 <= min_nodes <= nodes:
        raise NgspecError("need 1 <= --min-nodes <= --nodes")
    if width < 1 or depth < 1:
        raise NgspecError("--width and --depth must be at least 1")
    staging.output_directory(out)
    batch = BatchConfig(batch_size)
    prompts = calibration_prompts(questions, per_category, limit)
    engine = load_engine(model, device, dtype)
    ids = [encode(engine.loaded.tokenizer, p.text, raw) for p in prompts]
    cfg = DecodeConfig(max_new_tokens=max_new_tokens, max_draft_nodes=nodes)
    head = load_head(eagle_head, engine.loaded.model)  # read once; every candidate tree reuses it
    vocab = load_draft_vocab(eagle_head)
    big = large_tree(width, depth, nodes)
    accepted: Counter = Counter()
    steps: Counter = Counter()

    def run(choices, recorder: bool, label: str) -> dict:
        factory = eagle_factory(engine.loaded.model, head, EagleOptions(tree="static", choices=choices, head_int8=head_int8), vocab)
        make = (lambda: AcceptanceRecorder(factory(), accepted, steps)) if recorder else factory
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=render.err_console, transient=True) as progress:
            task = progress.add_task(label, total=len(ids))
            results, report = engine.run_batch(ids, make, cfg, batch, lambda r: progress.advance(task))
        failed = next((r for r in results if r.error), None)
        if failed is not None:
            raise NgspecError(f"calibration prompt {prompts[failed.index].id} cannot run: {failed.error}")
        calls = sum(r.generation.stats.verify_calls for r in results)
        return {"tokens_per_second": report.as_dict()["tokens_per_second"], "tokens_per_call": report.new_tokens / calls if calls else 0.0, "seconds": report.seconds}

    render.info(f"calibrating a {len(big)}-node tree on {len(ids)} prompts, batch size {batch_size} ...")
    run(big, True, f"measuring acceptance of {len(big)} nodes")
    rates = acceptance_rates(accepted, steps["steps"], big)
    result = TuneResult(big, rates, steps["steps"])

    def tokens_per_second(m: int) -> float:
        shape = prune(rates, m)
        figures = run(shape, False, f"{m} nodes")
        figures["expected_tokens_per_call"] = expected_tokens(rates, shape)
        result.evaluations[m] = figures
        render.info(f"{m:>4} nodes: {figures['tokens_per_second']:.1f} tokens/s, {figures['tokens_per_call']:.2f} tokens/call (expected {figures['expected_tokens_per_call']:.2f})")
        return figures["tokens_per_second"]

    best = coarse_then_golden(tokens_per_second, min_nodes, len(big))
    shape = prune(rates, best)
    record = {
        "format": "ngspec-tree-shape", "version": 1, "model": engine.loaded.name, "eagle_head": str(eagle_head),
        "device": str(engine.target.device), "dtype": str(engine.target.dtype).removeprefix("torch."),
        "batch_size": batch_size, "head_int8": head_int8 and int8.applies(engine.loaded.model, head), "nodes": len(shape), "calibration_prompts": len(ids), "calibration_steps": result.calibration_steps,
        "searched": {str(m): v for m, v in sorted(result.evaluations.items())},
        "acceptance": {json.dumps(list(c)): rates[c] for c in shape},
        "choices": [list(c) for c in shape],
    }
    staging.write_text(out, json.dumps(record, indent=1))
    if json_out:
        render.json_line(record)
        return
    render.table(
        f"tree sizes tried on {engine.loaded.name} ({engine.target.device}), batch size {batch_size}",
        ["nodes", "tokens/s", "tokens/call", "expected tokens/call"],
        [[str(m), f"{v['tokens_per_second']:.1f}", f"{v['tokens_per_call']:.2f}", f"{v['expected_tokens_per_call']:.2f}"] for m, v in sorted(result.evaluations.items())],
    )
    render.info(f"best: {best} nodes; shape written to {out} (use: --tree static --tree-choices {out})")
