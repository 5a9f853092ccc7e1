"""Host work of a batched step, counted rather than timed: the tensor (aten) operations per decoding
step, by phase (drafting, verify, commit, the rest: stopping, compaction, slots), for each drafter;
for a drafter with an EAGLE head also its head runs (batched forwards) and top-k rounds a step,
which is how BENCHMARKS.md 10ze counted the levels the head's gate lets run. With
``--head-graphs`` the head runs at fixed shapes (`ngspec.eagle.graphs`) and the operations of
those runs' forwards, which on a GPU one graph replay issues instead, are counted apart: what a
step would issue with them captured is its total less those, plus one replay a head run.
With ``--target-graphs`` the target's verification runs at fixed shapes (`ngspec.static_verify`)
and its forwards are counted apart the same way ("verify graph").
With ``-b 1`` the single-sequence engine's steps (what `generate` runs for one prompt), over
``--prompts`` prompts one after another, with the drafter's `observe` counted apart.

On the H100 the default 135M model is host-bound: a plain batch-8 step took 45 ms for about 2,600
operations (BENCHMARKS.md sections 10b, 10c, 10e), so what a batched step costs there is mostly
its number of operations (and the drafters' own Python), whatever this machine's arithmetic. The
counts are exact and need no GPU; prefills are counted apart.

    python benchmarks/op_count.py --questions ../shared/data/spec_bench/question.jsonl --category rag \\
        -b 8 -n 32 --arms vanilla,trie,eagle+search --eagle-head heads/amd-v23-all-e8lr1 \\
        --tuned bench-out/v22/res/shape-b8.json --datastore datastores/shipped

Trees are sized by the cost table ``1 + S n`` for n nodes (``--cost-slope S``, 0.004 by default:
nodes nearly free, as on a GPU), so they are as large as on the GPU.
The target's and the EAGLE head's layers and products are the plain ones a GPU runs
(``NGSPEC_CPU_KERNELS=linear``); ``--cpu-kernels`` counts this CPU's tuned ones (`ngspec.cpu_linear`),
which at batch size 1 issue about twice the operations.
"""

from __future__ import annotations

import argparse
import collections
import functools
import os
from dataclasses import replace
from pathlib import Path

from torch.utils._python_dispatch import TorchDispatchMode

import ngspec.batch as batch_module
import ngspec.eagle.batched as head_module
from ngspec.eagle.graphs import StaticRuns
from ngspec.batch import BatchConfig
from ngspec.batch_target import BatchTarget
from ngspec.decode import DecodeConfig
from ngspec.engine import Engine
from ngspec.perf.phases import wrapped
from ngspec.drafters.eagle import head_graphs_report
from ngspec.static_verify import StaticVerify, batches_static
from ngspec.target import TargetModel

PHASES = {  # phase: (owner, method) whose operations it counts
    "drafting": (batch_module, "propose_together"),
    "head attention": (head_module, "pooled_attention"),  # inside drafting: the EAGLE head's attention, once a head run
    "head top-k": (head_module, "top_children"),  # inside drafting: a round of the rows' top-k requests
    "head graph": (StaticRuns, "_forward"),  # inside drafting: a head run's forward at fixed shapes, one replay on a GPU
    "verify": (BatchTarget, "verify"),
    "commit": (BatchTarget, "commit"),
    "features": (BatchTarget, "take_features"),
    "prefill": (BatchTarget, "admit_many"),
    "verify graph": (StaticVerify, "_forward"),  # inside verify: the forward at fixed shapes, one replay on a GPU
}


SINGLE_PHASES = {  # the same for the single-sequence engine (batch size 1)
    "features": (TargetModel, "take_features"),
    "verify": (TargetModel, "verify"),
    "commit": (TargetModel, "commit"),
    "prefill": (TargetModel, "prefill"),
    "head attention": PHASES["head attention"],
    "head top-k": PHASES["head top-k"],
    "head graph": PHASES["head graph"],
    "verify graph": PHASES["verify graph"],
}


class _Counter(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.phase = "rest"
        self.ops: collections.Counter = collections.Counter()
        self.names: collections.Counter = collections.Counter()  # (phase, operation)
        self.calls: collections.Counter = collections.Counter()  # phase -> times its method ran

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[self.phase] += 1
        self.names[self.phase, func.__name__] += 1
        return func(*args, **(kwargs or {}))


def _in_phase(counter: _Counter, name: str, f):
    """``f``, its operations counted under phase ``name``."""
    def run(*args, **kwargs):
        counter.calls[name] += 1
        outer, counter.phase = counter.phase, name
        try:
            return f(*args, **kwargs)
        finally:
            counter.phase = outer
    return run


def _phases(counter: _Counter, phases: dict = PHASES):
    """Attribute operations to the phase whose method is running (the innermost one)."""
    return wrapped(phases, lambda name, f: _in_phase(counter, name, f))


def _names(counter: _Counter, steps: int) -> dict[str, list[tuple[str, float]]]:
    """Each phase's operations by name, per step, most frequent first (prefills left out)."""
    out: dict[str, list[tuple[str, float]]] = collections.defaultdict(list)
    for (phase, name), n in counter.names.most_common():
        if phase != "prefill":
            out[phase].append((name, n / steps))
    return dict(out)


def _head(counter: _Counter, per_step: dict, steps: int) -> dict:
    """The head's attention, top-k and fixed-shape forward operations, counted apart, back into
    ``per_step``'s drafting; per step: the attention's operations, the fixed-shape forwards' (a
    replay each on a GPU), and the head runs (each runs the attention or a fixed-shape forward
    once) and top-k rounds (batched: one for all rows that wait)."""
    per_step["drafting"] += sum(counter.ops[p] for p in ("head attention", "head top-k", "head graph")) / steps
    per_step["verify"] += counter.ops["verify graph"] / steps
    return {
        "verify_graph_per_step": counter.ops["verify graph"] / steps, "verify_replays_per_step": counter.calls["verify graph"] / steps,
        "head_attention_per_step": counter.ops["head attention"] / steps, "head_graph_per_step": counter.ops["head graph"] / steps,
        "head_runs_per_step": (counter.calls["head attention"] + counter.calls["head graph"]) / steps,
        "replays_per_step": counter.calls["head graph"] / steps, "top_k_rounds_per_step": counter.calls["head top-k"] / steps,
    }


def count_ops(engine: Engine, ids: list[list[int]], new_drafter, cfg: DecodeConfig, batch: BatchConfig) -> dict:
    """Operations per decoding step by phase (prefills in total), the steps, the nodes verified per
    row and step, and the outputs."""
    counter = _Counter()
    with _phases(counter), counter:
        results, report = engine.run_batch(ids, new_drafter, cfg, batch)
    steps = max(report.steps, 1)
    per_step = {p: counter.ops[p] / steps for p in ("drafting", "features", "verify", "commit", "rest")}
    head = _head(counter, per_step, steps)
    return {
        "steps": report.steps, "ops_per_step": per_step, "total_per_step": sum(per_step.values()), **head,
        "prefill_ops": counter.ops["prefill"], "tokens": [r.generation.token_ids for r in results], "names": _names(counter, steps),
        "nodes_per_row_step": sum(s.tree_size for r in results for s in r.generation.stats.steps) / steps / len(ids),
    }


def count_single(engine: Engine, ids: list[list[int]], new_drafter, cfg: DecodeConfig) -> dict:
    """`count_ops` for the single-sequence engine: the prompts one after another, each step's
    operations by phase (the drafter's `propose` and `observe` apart), prefills in total."""
    counter = _Counter()
    outputs, steps = [], 0
    with _phases(counter, SINGLE_PHASES), counter:
        for prompt in ids:
            drafter = new_drafter()
            drafter.propose = _in_phase(counter, "drafting", drafter.propose)
            drafter.observe = _in_phase(counter, "observe", drafter.observe)
            gen = engine.run(prompt, drafter, cfg)
            steps += len(gen.stats.steps) - 1  # the prefill's entry is not a step
            outputs.append(gen)
    steps = max(steps, 1)
    per_step = {p: counter.ops[p] / steps for p in ("drafting", "observe", "features", "verify", "commit", "rest")}
    head = _head(counter, per_step, steps)
    return {
        "steps": steps, "ops_per_step": per_step, "total_per_step": sum(per_step.values()), **head,
        "prefill_ops": counter.ops["prefill"], "tokens": [g.token_ids for g in outputs], "names": _names(counter, steps),
        "nodes_per_row_step": sum(s.tree_size for g in outputs for s in g.stats.steps) / steps,
    }


def main() -> None:
    from ngspec.datastore.index import Datastore
    from ngspec.drafters.eagle import EagleOptions, eagle_factory, read_choices
    from ngspec.eagle.head import load_draft_vocab, load_head
    from ngspec.models import load_model
    from ngspec.prompts import encode, load_prompts

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--questions", required=True)
    ap.add_argument("--category", default="rag")
    ap.add_argument("-b", "--batch-size", type=int, default=8, help="1: the single-sequence engine")
    ap.add_argument("--prompts", type=int, help="prompts counted (default: the batch size; at -b 1, 4)")
    ap.add_argument("-n", "--max-new-tokens", type=int, default=32)
    ap.add_argument("--arms", default="vanilla,trie", help="drafters, e.g. vanilla,trie,eagle+search")
    ap.add_argument("--eagle-head", help="for eagle and eagle+search")
    ap.add_argument("--tuned", help="tune-tree output: the head's static tree (default: a dynamic tree)")
    ap.add_argument("--datastore", help="for search and eagle+search")
    ap.add_argument("--cost-slope", type=float, default=0.004)
    ap.add_argument("--head-graphs", action="store_true", help="run the head at fixed shapes (`--head-graphs`, uncaptured here) and count "
                    "its forwards apart: on a GPU each is one replay")
    ap.add_argument("--target-graphs", action="store_true", help="verify at fixed shapes (`--target-graphs`, uncaptured here) and count "
                    "those forwards apart: on a GPU each is one replay")
    ap.add_argument("--names", type=int, default=0, help="also list each phase's N most frequent operations per step")
    ap.add_argument("--cpu-kernels", action="store_true", help="count with this CPU's tuned linear layers and products (`ngspec.cpu_linear`), "
                    "as generate runs on a CPU; by default the plain ones a GPU runs (NGSPEC_CPU_KERNELS=linear)")
    args = ap.parse_args()
    if not args.cpu_kernels:  # the target's and the head's layers and products as on a GPU
        os.environ["NGSPEC_CPU_KERNELS"] = "linear"

    loaded = load_model("default", "cpu", "float32")
    engine = Engine(loaded, calibrate=False, max_draft_nodes=96, cost_slope=args.cost_slope, target_graphs=args.target_graphs)
    factory = store = None
    if args.eagle_head:
        # the head in float32 as on a GPU (int8 is for CPUs), whose host work this counts
        opts = EagleOptions("static", choices=read_choices(Path(args.tuned)), head_int8=False) if args.tuned else EagleOptions(head_int8=False)
        opts = replace(opts, head_graphs=args.head_graphs)
        factory = eagle_factory(loaded.model, load_head(Path(args.eagle_head), loaded.model), opts, load_draft_vocab(Path(args.eagle_head)))
    if args.datastore:
        store = Datastore.open(args.datastore, loaded.tokenizer)
    ids = [encode(loaded.tokenizer, p.text) for p in load_prompts(Path(args.questions), args.category, args.prompts or (4 if args.batch_size == 1 else args.batch_size))]
    cfg = DecodeConfig(max_new_tokens=args.max_new_tokens, max_draft_nodes=96)  # the slope stands (`Engine.cost_slope`)
    count_arms(args, engine, ids, cfg, factory, store)


def count_arms(args, engine: Engine, ids: list[list[int]], cfg: DecodeConfig, factory, store) -> None:
    from ngspec.drafters import DrafterOptions, make_drafter

    for arm in args.arms.split(","):
        new_drafter = functools.partial(make_drafter, arm, DrafterOptions(deepen=True), None, factory, store)
        if args.batch_size == 1:
            res, rows = count_single(engine, ids, new_drafter, cfg), 1
        else:
            res, rows = count_ops(engine, ids, new_drafter, cfg, BatchConfig(args.batch_size)), len(ids)
        new = sum(len(t) for t in res["tokens"])
        graphs = (f"; fixed-shape forwards {res['head_graph_per_step']:.0f}, captured {res['ops_per_step']['drafting'] - res['head_graph_per_step'] + res['replays_per_step']:.0f} "
                  "drafting operations and replays") if res["replays_per_step"] else ""
        verify = (f" (fixed-shape forwards {res['verify_graph_per_step']:.0f}; captured, {res['ops_per_step']['verify'] - res['verify_graph_per_step'] + res['verify_replays_per_step']:.0f} "
                  "operations and replays)") if res["verify_replays_per_step"] else ""
        head = (f" (head attention {res['head_attention_per_step']:.0f}; {res['head_runs_per_step']:.2f} head runs and "
                f"{res['top_k_rounds_per_step']:.2f} top-k rounds a step{graphs})") if res["head_runs_per_step"] else ""
        cells = "  ".join(f"{p} {n:.0f}" + (head if p == "drafting" else verify if p == "verify" else "") for p, n in res["ops_per_step"].items())
        print(f"{arm:13s} {res['steps']} steps, {new / max(res['steps'], 1) / rows:.2f} tokens and {res['nodes_per_row_step']:.1f} nodes per row and step; "
              f"operations per step {res['total_per_step']:.0f}: {cells}; prefills {res['prefill_ops']}", flush=True)
        for phase, names in res["names"].items() if args.names else ():
            print(f"    {phase}: " + ", ".join(f"{name} {n:.1f}" for name, n in names[: args.names]))
        # the fixed shapes met so far, over the arms run (uncaptured here: how many a GPU would capture,
        # and how many it would run once only, uncaptured)
        static = engine.target.static if args.batch_size == 1 else batches_static(engine.target.model)
        for what, report in (("target", static and static.report()), ("head", head_graphs_report(factory))):
            if report:
                print(f"    {what} shapes so far: {report}")


if __name__ == "__main__":
    main()
