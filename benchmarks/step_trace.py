"""Where a batched step's time goes on a GPU, by phase: the host's time, the CUDA runtime calls it
makes (kernel launches, copies, synchronisations) and the GPU's kernel time, for each arm and
batch size, from one run under `torch.profiler` (CPU and CUDA activities) beside one run without
it (the step time to trust; the profiler slows the host).

On an H100 the default 135M model is host-bound (BENCHMARKS.md 10b-10e), and what separates the
whole READER method from the trie at batch 8 there is its drafting's host time (10zd: without it,
rag would have run 1.12x the trie). Operation counts (`op_count.py`) say how many tensor
operations a step issues; this says what they cost there, and how many of them wait for the GPU:
a tensor made from a Python list on a CUDA device is a blocking copy, which waits for every
queued kernel. Phases: ``drafting`` (`propose_together`), ``verify`` and ``commit``
(`BatchTarget`), ``prefill`` (`BatchTarget.admit_many`), ``rest`` (the loop's own work: stopping,
slots, compaction).

    python benchmarks/step_trace.py --questions question.jsonl --eagle-head /tmp/head \\
        --datastore /tmp/datastore --tuned shape-b8.json --batch-sizes 8,32 --limit 32 -n 32 \\
        --arms vanilla,trie,whole --json-out trace.json

On a CPU it runs too (CPU activity only: no runtime calls or kernels to count), for rehearsal.
"""

from __future__ import annotations

import argparse
import collections
import json
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function

import ngspec.batch as batch_module
from ngspec.batch import BatchConfig
from ngspec.batch_target import BatchTarget
from ngspec.decode import DecodeConfig
from ngspec.engine import Engine
from ngspec.perf.phases import wrapped

LABEL = "ngspec:"
PHASES = {  # phase: (owner, method) whose time it is
    "drafting": (batch_module, "propose_together"),
    "verify": (BatchTarget, "verify"),
    "commit": (BatchTarget, "commit"),
    "prefill": (BatchTarget, "admit_many"),
}
RUNTIME_KINDS = {  # CUDA runtime (and driver) calls by what they do
    "launch": ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx"),
    "copy": ("cudaMemcpyAsync", "cudaMemcpy", "cudaMemcpy2DAsync", "cudaMemsetAsync"),
    "sync": ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize"),
}


def labelled(phases: dict = PHASES):
    """Each phase's calls inside a profiler range named ``ngspec:PHASE`` (a context manager)."""

    def wrap(name, f):
        def run(*args, **kwargs):
            with record_function(LABEL + name):
                return f(*args, **kwargs)
        return run

    return wrapped(phases, wrap)


def phase_of(event) -> str:
    """The phase of the innermost ``ngspec:`` range around ``event`` (itself included), or "rest"."""
    while event is not None:
        if event.name.startswith(LABEL):
            return event.name[len(LABEL):]
        event = event.cpu_parent
    return "rest"


def runtime_kind(name: str) -> str | None:
    for kind, names in RUNTIME_KINDS.items():
        if name in names:
            return kind
    return "other" if name.startswith("cu") else None  # any other runtime or driver call (aten's are "aten::...")


def tally(events, steps: int) -> dict:
    """Per phase and per decoding step: host milliseconds (the phase's ranges), CUDA runtime calls
    by kind (count and host milliseconds) and kernel milliseconds on the GPU. ``events`` are the
    profiler's `FunctionEvent`s (``name``, ``cpu_parent``, ``cpu_time_total`` in µs, ``kernels``
    with ``duration`` in µs); prefills are given in total, not per step."""
    out: dict = collections.defaultdict(lambda: collections.defaultdict(float))
    for e in events:
        if e.name.startswith(LABEL):
            out[e.name[len(LABEL):]]["host_ms"] += e.cpu_time_total / 1000
            continue
        kind = runtime_kind(e.name)
        phase = phase_of(e.cpu_parent)
        if kind is not None:
            out[phase][f"{kind}_calls"] += 1
            out[phase][f"{kind}_ms"] += e.cpu_time_total / 1000
        for k in getattr(e, "kernels", ()) or ():
            out[phase]["gpu_ms"] += k.duration / 1000
    per = max(steps, 1)
    return {p: {k: (v if p == "prefill" else v / per) for k, v in d.items()} for p, d in out.items()}


def trace_arm(engine: Engine, ids: list[list[int]], new_drafter, cfg: DecodeConfig, batch: BatchConfig, cuda: bool) -> dict:
    """One warm-up, one plain run (its step time) and one profiled run of the batch."""
    engine.run_batch(ids, new_drafter, DecodeConfig(max_new_tokens=8, max_draft_nodes=cfg.max_draft_nodes), batch)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    sync()
    t0 = time.perf_counter()
    results, report = engine.run_batch(ids, new_drafter, cfg, batch)
    sync()
    wall = time.perf_counter() - t0
    prefill = sum(r.generation.stats.prefill_seconds for r in results)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with labelled(), profile(activities=activities) as prof:
        t0 = time.perf_counter()
        _, traced = engine.run_batch(ids, new_drafter, cfg, batch)
        sync()
        traced_wall = time.perf_counter() - t0
    phases = tally(prof.events(), traced.steps)
    # the loop's own host time: what the labelled phases leave of the profiled run
    labelled_ms = sum(d.get("host_ms", 0.0) for p, d in phases.items() if p != "prefill")
    rest = phases.setdefault("rest", {})
    rest["host_ms"] = 1000 * traced_wall / max(traced.steps, 1) - labelled_ms - phases.get("prefill", {}).get("host_ms", 0.0) / max(traced.steps, 1)
    return {
        "steps": report.steps, "traced_steps": traced.steps, "new_tokens": report.new_tokens, "seconds": wall,
        "ms_per_step": 1000 * (wall - prefill) / max(report.steps, 1), "prefill_seconds": prefill,
        "tokens_per_row_step": report.new_tokens / max(report.steps, 1) / min(batch.batch_size, len(ids)),
        "phases": phases,
    }


def render(key: str, r: dict) -> str:
    lines = [f"{key}: {r['steps']} steps, {r['tokens_per_row_step']:.2f} tokens per row and step, "
             f"{r['ms_per_step']:.1f} ms a step without the profiler (prefills apart, {r['prefill_seconds']:.2f} s)"]
    for phase, d in sorted(r["phases"].items()):
        unit = "in all" if phase == "prefill" else "a step"
        cells = ", ".join(f"{k} {v:.2f}" if k.endswith("ms") else f"{k} {v:.1f}" for k, v in sorted(d.items()))
        lines.append(f"    {phase} ({unit}): {cells}")
    return "\n".join(lines)


def main() -> None:
    from ngspec.datastore.index import Datastore
    from ngspec.drafters import DrafterOptions, make_drafter
    from ngspec.drafters.eagle import EagleOptions, eagle_factory, read_choices
    from ngspec.eagle.head import load_draft_vocab, load_head
    from ngspec.models import load_model
    from ngspec.prompts import encode, load_prompts

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--questions", required=True)
    ap.add_argument("--category", default="rag")
    ap.add_argument("--batch-sizes", default="8,32")
    ap.add_argument("--limit", type=int, help="prompts (default: the largest batch size)")
    ap.add_argument("-n", "--max-new-tokens", type=int, default=32)
    ap.add_argument("--arms", default="vanilla,trie,whole", help="vanilla, trie, search, whole (eagle+search with --deepen), whole no deepen")
    ap.add_argument("--eagle-head", help="for whole")
    ap.add_argument("--tuned", help="tune-tree output: the whole method's static tree")
    ap.add_argument("--datastore")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--cost-slope", type=float, help="size trees by the cost 1 + S*n for n nodes, as on another device (0.004: about the "
                    "H100's for the default model), e.g. to see a GPU's trees' host work on a CPU (default: this device's measured costs)")
    ap.add_argument("--target-graphs", action="store_true", help="verify at fixed shapes, replayed from CUDA graphs on a GPU "
                    "(`--target-graphs`; on the seventh visit a batch-32 trie step then took 40-60 ms against 9 ms at batch 1, "
                    "BENCHMARKS.md 10zs: where the rest goes is this trace's question)")
    ap.add_argument("--head-graphs", action="store_true", help="the whole arms' head runs replayed from CUDA graphs (`--head-graphs`)")
    ap.add_argument("--json-out")
    args = ap.parse_args()
    arms = args.arms.split(",")
    if any(a.startswith("whole") for a in arms) and not (args.eagle_head and args.tuned):
        ap.error("the whole arm needs --eagle-head and --tuned")
    sizes = [int(b) for b in args.batch_sizes.split(",")]

    loaded = load_model(device=args.device, dtype=args.dtype)
    cuda = loaded.model.device.type == "cuda"
    engine = Engine(loaded, max_draft_nodes=96, cost_slope=args.cost_slope, target_graphs=args.target_graphs)
    store = Datastore.open(args.datastore, loaded.tokenizer) if args.datastore else None
    factory = None
    if any(a.startswith("whole") for a in arms):
        opts = EagleOptions("static", choices=read_choices(Path(args.tuned)), draft_vocab=8192, head_graphs=args.head_graphs)
        factory = eagle_factory(loaded.model, load_head(Path(args.eagle_head), loaded.model), opts, load_draft_vocab(Path(args.eagle_head)))
    makers = {
        "vanilla": lambda: make_drafter("vanilla"),
        "trie": lambda: make_drafter("trie"),
        "search": lambda: make_drafter("search", datastore=store),
        "whole": lambda: make_drafter("eagle+search", DrafterOptions(deepen=True), None, factory, store),
        "whole no deepen": lambda: make_drafter("eagle+search", DrafterOptions(deepen=False), None, factory, store),
    }
    unknown = [a for a in arms if a not in makers]
    if unknown:
        ap.error(f"unknown arms: {unknown}")
    prompts = load_prompts(Path(args.questions), args.category, args.limit or max(sizes))
    ids = [encode(loaded.tokenizer, p.text) for p in prompts]
    cfg = DecodeConfig(max_new_tokens=args.max_new_tokens, max_draft_nodes=96)
    out = {"device": torch.cuda.get_device_name() if cuda else "cpu", "torch": torch.__version__, "target_graphs": args.target_graphs,
           "head_graphs": args.head_graphs, "runs": {}}
    for b in sizes:
        for arm in arms:
            key = f"b{b} {arm}"
            out["runs"][key] = trace_arm(engine, ids, makers[arm], cfg, BatchConfig(b), cuda)
            print(render(key, out["runs"][key]), flush=True)
            if args.json_out:
                Path(args.json_out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
