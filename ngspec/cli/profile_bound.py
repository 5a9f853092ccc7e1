"""`ngspec profile-bound`: where widening verification stops being free, measured and predicted."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeRemainingColumn
from rich.text import Text

from ngspec import staging
from ngspec.cli import render
from ngspec.cli.common import warn_if_busy
from ngspec.cli.options import DeviceOpt, DtypeOpt, JsonOpt, TrustRemoteCodeOpt
from ngspec.errors import NgspecError, Stopped
from ngspec.perf.measured import CpuWatch

if TYPE_CHECKING:  # torch loads when the command runs, not for --help
    import torch

GPU_GRID = ("1..32", "0..15", "25,100,500")
CPU_GRID = ("1,2,4,8,16", "0,1,2,3,5,7", "25,100,500")
GRAPHS_GRID = ("1..8", "0..7", "25,100,500")  # trees of up to 57 nodes: every one a captured shape
SWEEP = "the sweep"  # what a busy warning says was timed


def _load(model: Optional[str], shape: Optional[str], device: torch.device, dtype: torch.dtype, trust_remote_code: bool):
    """(name, model) for --model or --shape."""
    if model and shape:
        raise NgspecError("give --model or --shape, not both")
    if shape:
        from ngspec.perf.shapes import random_model, shape_config

        name, config = shape_config(shape)
        render.info(f"building {name} with random weights on {device} ({str(dtype).removeprefix('torch.')}) ...")
        return name, random_model(config, device, dtype)
    from ngspec.models import load_model

    render.info(f"loading model {model or 'default'} ...")
    loaded = load_model(model or "default", str(device), str(dtype).removeprefix("torch."), trust_remote_code)
    return loaded.name, loaded.model


def profile_bound_command(
    model: Annotated[Optional[str], typer.Option("--model", "-m", help="A model `generate` accepts (default: the bundled SmolLM2-135M-Instruct).")] = None,
    trust_remote_code: TrustRemoteCodeOpt = False,
    shape: Annotated[Optional[str], typer.Option(help="Time an architecture with random weights instead: smollm2-135m, llama-7b, mistral-7b, llama3-8b, or a config.json path.")] = None,
    k: Annotated[Optional[str], typer.Option("--k", help="Rows: list and ranges, e.g. 1..32 or 1,2,4,8 (default: 1..32 on GPU, 1,2,4,8,16 on CPU).")] = None,
    w: Annotated[Optional[str], typer.Option("--w", help="Speculated tokens per row, e.g. 0..15 (default: 0..15 on GPU, 0,1,2,3,5,7 on CPU).")] = None,
    context: Annotated[Optional[str], typer.Option("--context", help="Context lengths in the cache (default 25,100,500 as in the paper).")] = None,
    layout: Annotated[str, typer.Option(help="rows: k rows of w+1 tokens sharing the context's cache; tree: one row with a tree of 1+k*w nodes; both.")] = "both",
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = "auto",
    repeats: Annotated[int, typer.Option(help="Timed runs per cell (the median is kept), after one warm-up run (two with --target-graphs: a shape is captured at its second run).")] = 5,
    out: Annotated[Path, typer.Option("--out", help="Directory for the CSV, JSON and heatmap PNGs.")] = Path("profile-out"),
    save_profile: Annotated[Optional[Path], typer.Option("--save-profile", help="Also write a device profile that `generate`/`bench --profile` load to size drafts.")] = None,
    max_slowdown: Annotated[float, typer.Option(help="Slowdown the device profile's token budget may reach.")] = 1.1,
    target_graphs: Annotated[bool, typer.Option("--target-graphs", help="On a CUDA GPU: time the tree layout as `generate --target-graphs` verifies, each block rounded up to a power of two wide and replayed from a captured CUDA graph, so a small model's host work no longer hides the device's own curve. Trees wider than 64 nodes are left out (generate runs those uncaptured); default grid k 1..8, w 0..7. Save a profile with it for `generate --target-graphs --profile`.")] = False,
    json_out: JsonOpt = False,
) -> None:
    """Time one verification forward over a grid of (k rows, w speculated tokens, context length),
    relative to (k, w) = (1, 0), next to a roofline prediction (FLOPs and bytes from the config,
    peak compute and bandwidth measured here). Widening a draft is free only while the forward pass
    stays memory-bound; this shows where that ends on your device. On a GPU, --target-graphs times
    the forwards replayed from CUDA graphs, as generate --target-graphs runs them: run it with and
    without to see what a small model's host work costs. Ctrl-C reports and writes the (layout,
    context) groups timed whole, saves no device profile, and exits 1.

    Example: ngspec profile-bound --shape llama-7b --dtype bfloat16 --save-profile llama7b.json
    """
    import torch

    from ngspec.architecture import sliding_window
    from ngspec.models import pick_device, pick_dtype
    from ngspec.perf.costs import model_shape
    from ngspec.perf.device_profile import build_profile, device_name, save_profile as write_profile
    from ngspec.perf.plots import heatmap
    from ngspec.perf.report import analyse, report_files, transitions
    from ngspec.perf.roofline import measure_peaks
    from ngspec.perf.sweep import LAYOUTS, ForwardTimer, grid, parse_values, run_sweep
    from ngspec.static_verify import MOST_WIDTH
    from ngspec.target import TargetModel, context_window
    from ngspec.versions import versions

    layouts = list(LAYOUTS) if layout == "both" else [layout]
    if layout not in (*LAYOUTS, "both"):
        raise NgspecError(f"--layout must be rows, tree or both (got {layout!r})")
    if target_graphs and layout == "rows":
        raise NgspecError("--target-graphs times the tree layout (generate verifies rows without fixed shapes); use --layout tree")
    if repeats < 1:
        raise NgspecError("--repeats must be at least 1")
    if not max_slowdown >= 1.0:  # NaN too
        raise NgspecError(f"--max-slowdown must be at least 1.0 (got {max_slowdown})")
    dev = pick_device(device)
    if target_graphs and dev.type != "cuda":  # before the model loads
        raise NgspecError(f"--target-graphs needs a CUDA GPU (the model would run on {dev.type}); leave it out to time the plain forward")
    if target_graphs and layout == "both":
        layouts = ["tree"]
        render.info("--target-graphs: timing the tree layout only (generate verifies rows without fixed shapes)")
    defaults = GRAPHS_GRID if target_graphs else GPU_GRID if dev.type == "cuda" else CPU_GRID
    ks = parse_values(defaults[0] if k is None else k, "k", 1)
    ws = parse_values(defaults[1] if w is None else w, "w", 0)
    contexts = parse_values(defaults[2] if context is None else context, "context", 1)
    torch_dtype = pick_dtype(dtype, dev)
    if dev.type == "cpu" and torch_dtype != torch.float32:
        raise NgspecError("on CPU only float32 is supported (bf16/fp16 are for GPUs)")
    staging.output_folder(out, "--out", "the CSV, JSON and heatmap")
    if save_profile is not None:
        staging.output_directory(save_profile, "--save-profile")

    name, net = _load(model, shape, dev, torch_dtype, trust_remote_code)
    window = context_window(net)
    longest = max(contexts) + max(max(ks) * (max(ws) + 1), 1 + max(ks) * max(ws))
    if longest > window:
        raise NgspecError(f"context {max(contexts)} plus a block of up to {longest - max(contexts)} tokens exceeds the model's window of {window}")
    if "rows" in layouts and sliding_window(net):
        if layout == "rows":
            raise NgspecError(f"{name} has sliding-window layers; the rows layout needs full attention everywhere (use --layout tree)")
        layouts = ["tree"]
        render.info(f"{name} has sliding-window layers: timing the tree layout only (rows need full attention everywhere)")

    cells = grid(layouts, contexts, ks, ws)
    target = TargetModel(net)
    if target_graphs:
        target.use_graphs()  # refuses sliding-window models
        wide = [c for c in cells if c.tokens > MOST_WIDTH]
        cells = [c for c in cells if c.tokens <= MOST_WIDTH]
        if wide:
            render.info(f"--target-graphs: {len(wide)} cells wider than {MOST_WIDTH} nodes left out (generate verifies those uncaptured)")
    render.info("measuring peak compute and bandwidth ...")
    watch = CpuWatch()
    peaks = measure_peaks(dev, torch_dtype)
    # with graphs a shape runs eagerly first and is captured at its second run: two warm-ups
    timer = ForwardTimer(target, max(ks), max(ws), warmup=2 if target_graphs else 1, repeats=repeats)
    columns = (TextColumn("[progress.description]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
    with render.progress(*columns) as progress:
        task = progress.add_task("timing cells", total=len(cells))

        def step(result):
            c = result.cell
            progress.update(task, advance=1, description=f"{c.layout} context {c.context} k={c.k} w={c.w}")

        try:
            results = run_sweep(cells, timer, step)
            stopped = None
        except Stopped as stop:
            results = stop.measured
            groups = len({(r.cell.layout, r.cell.context) for r in results})
            stopped = f"after {groups} of {len({(c.layout, c.context) for c in cells})} (layout, context) groups"
            layouts = [lay for lay in layouts if any(r.cell.layout == lay for r in results)]
            contexts = [ctx for ctx in contexts if any(r.cell.context == ctx for r in results)]

    bytes_per_element = torch.finfo(torch_dtype).bits // 8
    reports = analyse(results, net.config, peaks, bytes_per_element)
    trans = transitions(reports)
    meta = {
        "model": name,
        "model_shape": model_shape(net),
        "device": device_name(dev),
        "dtype": str(torch_dtype).removeprefix("torch."),
        **versions(),
        "repeats": repeats,
        "peak_tflops": peaks.flops_per_s / 1e12,
        "peak_bandwidth_gbs": peaks.bytes_per_s / 1e9,
        "target_graphs": target_graphs,
        "others_cpu_share": watch.share(),
        **({"graphs": target.static.report()} if target.static is not None else {}),
        **({"interrupted": stopped} if stopped else {}),
    }
    stem = f"profile-{name.replace('/', '_')}"
    files = report_files(out, stem, meta, reports, trans)
    for lay in layouts:
        title = f"{name}, {meta['dtype']}, layout {lay}{', CUDA graphs' if target_graphs else ''}\n{meta['device']}"
        files.append((out / f"{stem}-{lay}.png", functools.partial(heatmap, reports, lay, title, out / f"{stem}-{lay}.png")))
    if save_profile is not None and not stopped:  # a profile sizes drafts at every context: not from part of them
        files.append((save_profile, functools.partial(write_profile, save_profile, build_profile(meta, reports, max_slowdown))))

    # the files are written after the report is shown: a disk that fills costs the files, not the figures
    if json_out:
        from ngspec.perf.report import report_json

        render.json_line(report_json(meta, reports, trans) | {"files": [str(path) for path, _ in files]})
        staging.write_each(files)
        warn_if_busy(meta["others_cpu_share"], SWEEP)
        return _stop(stopped, out, save_profile)
    render.summary_table(
        f"{name} on {meta['device']}{f' (interrupted {stopped})' if stopped else ''}",
        [("dtype", meta["dtype"]), ("measured peak compute", f"{meta['peak_tflops']:.3g} TFLOP/s"),
         ("measured peak bandwidth", f"{meta['peak_bandwidth_gbs']:.3g} GB/s"),
         *([("target graphs", meta["graphs"])] if "graphs" in meta else [])],
    )
    for lay in layouts:
        for ctx in contexts:
            cells_here = {(r.k, r.w): r for r in reports if r.layout == lay and r.context == ctx}
            if not cells_here:  # a group an interrupted sweep did not reach
                continue
            row_ks = sorted({kk for kk, _ in cells_here})
            col_ws = sorted({ww for _, ww in cells_here})
            render.table(
                f"{lay}, context {ctx}: measured slowdown (roofline) — rows k, columns w",
                ["k \\ w", *map(str, col_ws)],
                [[str(kk), *(_cell_text(cells_here[(kk, ww)]) for ww in col_ws)] for kk in row_ks],
            )
    render.table(
        "largest block within 10% of (1, 0): tokens (k, w)",
        ["layout", "context", "measured", "roofline"],
        [[t.layout, str(t.context), _transition_text(t.measured_tokens, t.measured_kw),
          _transition_text(t.predicted_tokens, t.predicted_kw)] for t in trans],
    )
    staging.write_each(files)
    render.info("wrote " + ", ".join(str(path) for path, _ in files))
    warn_if_busy(meta["others_cpu_share"], SWEEP)
    _stop(stopped, out, save_profile)


def _stop(stopped: str | None, out: Path, save_profile: Path | None) -> None:
    """After an interrupted sweep's report (``stopped``: how far it got), exit non-zero saying so."""
    if stopped is not None:
        unsaved = f"; {save_profile} was not written (a device profile needs every context)" if save_profile is not None else ""
        raise NgspecError(f"interrupted {stopped}; the report and the files in {out} cover only those, each group whole{unsaved}")


def _cell_text(r) -> str | Text:
    if r.status == "oom":
        return Text("OOM", style="red")
    return f"{r.slowdown:.2f} ({r.predicted_slowdown:.2f})"


def _transition_text(tokens, kw) -> str:
    return "-" if tokens is None else f"{tokens} ({kw[0]}, {kw[1]})"
