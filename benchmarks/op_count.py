"""Host work of a batched step, counted rather than timed: the tensor (aten) operations per decoding
step, by phase (drafting, verify, commit, the rest: stopping, compaction, slots), for each drafter.

On the H100 the default 135M model is host-bound: a plain batch-8 step took 45 ms for about 2,600
operations (BENCHMARKS.md sections 10b, 10c, 10e), so what a batched step costs there is mostly
its number of operations (and the drafters' own Python), whatever this machine's arithmetic. The
counts are exact and need no GPU; prefills are counted apart.

    python benchmarks/op_count.py --questions ../shared/data/spec_bench/question.jsonl --category rag \\
        -b 8 -n 32 --arms vanilla,trie,eagle+search --eagle-head heads/amd-v23-all-e8lr1 \\
        --tuned bench-out/v22/res/shape-b8.json --datastore datastores/shipped

Trees are sized by the cost table ``1 + S n`` for n nodes (``--cost-slope S``, 0.004 by default:
nodes nearly free, as on a GPU), so they are as large as on the GPU.
"""

from __future__ import annotations

import argparse
import collections
from contextlib import contextmanager
from pathlib import Path

from torch.utils._python_dispatch import TorchDispatchMode

import ngspec.batch as batch_module
import ngspec.eagle.batched as head_module
from ngspec.batch import BatchConfig
from ngspec.batch_target import BatchTarget
from ngspec.decode import DecodeConfig
from ngspec.engine import Engine

PHASES = {  # phase: (owner, method) whose operations it counts
    "drafting": (batch_module, "propose_together"),
    "head attention": (head_module, "pooled_attention"),  # inside drafting: the EAGLE head's attention
    "verify": (BatchTarget, "verify"),
    "commit": (BatchTarget, "commit"),
    "features": (BatchTarget, "take_features"),
    "prefill": (BatchTarget, "admit"),
}


class _Counter(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.phase = "rest"
        self.ops: collections.Counter = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[self.phase] += 1
        return func(*args, **(kwargs or {}))


@contextmanager
def _phases(counter: _Counter):
    """Attribute operations to the phase whose method is running (the innermost one)."""
    originals = {name: getattr(owner, attr) for name, (owner, attr) in PHASES.items()}

    def wrapped(name, f):
        def run(*args, **kwargs):
            outer, counter.phase = counter.phase, name
            try:
                return f(*args, **kwargs)
            finally:
                counter.phase = outer
        return run

    for name, (owner, attr) in PHASES.items():
        setattr(owner, attr, wrapped(name, originals[name]))
    try:
        yield
    finally:
        for name, (owner, attr) in PHASES.items():
            setattr(owner, attr, originals[name])


def count_ops(engine: Engine, ids: list[list[int]], new_drafter, cfg: DecodeConfig, batch: BatchConfig) -> dict:
    """Operations per decoding step by phase (prefills in total), the steps, the nodes verified per
    row and step, and the outputs."""
    counter = _Counter()
    with _phases(counter), counter:
        results, report = engine.run_batch(ids, new_drafter, cfg, batch)
    steps = max(report.steps, 1)
    per_step = {p: counter.ops[p] / steps for p in ("drafting", "features", "verify", "commit", "rest")}
    per_step["drafting"] += counter.ops["head attention"] / steps
    return {
        "steps": report.steps, "ops_per_step": per_step, "total_per_step": sum(per_step.values()),
        "head_attention_per_step": counter.ops["head attention"] / steps,
        "prefill_ops": counter.ops["prefill"], "tokens": [r.generation.token_ids for r in results],
        "nodes_per_row_step": sum(s.tree_size for r in results for s in r.generation.stats.steps) / steps / len(ids),
    }


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
    ap.add_argument("-b", "--batch-size", type=int, default=8)
    ap.add_argument("-n", "--max-new-tokens", type=int, default=32)
    ap.add_argument("--arms", default="vanilla,trie", help="drafters, e.g. vanilla,trie,eagle+search")
    ap.add_argument("--eagle-head", help="for eagle and eagle+search")
    ap.add_argument("--tuned", help="tune-tree output: the head's static tree (default: a dynamic tree)")
    ap.add_argument("--datastore", help="for search and eagle+search")
    ap.add_argument("--cost-slope", type=float, default=0.004)
    args = ap.parse_args()

    loaded = load_model("default", "cpu", "float32")
    engine = Engine(loaded, calibrate=False, max_draft_nodes=96, cost_slope=args.cost_slope)
    factory = store = None
    if args.eagle_head:
        # the head in float32 as on a GPU (int8 is for CPUs), whose host work this counts
        opts = EagleOptions("static", choices=read_choices(Path(args.tuned)), head_int8=False) if args.tuned else EagleOptions(head_int8=False)
        factory = eagle_factory(loaded.model, load_head(Path(args.eagle_head), loaded.model), opts, load_draft_vocab(Path(args.eagle_head)))
    if args.datastore:
        store = Datastore.open(args.datastore, loaded.tokenizer)
    ids = [encode(loaded.tokenizer, p.text) for p in load_prompts(Path(args.questions), args.category, args.batch_size)]
    cfg = DecodeConfig(max_new_tokens=args.max_new_tokens, max_draft_nodes=96)  # the slope stands (`Engine.cost_slope`)
    for arm in args.arms.split(","):
        res = count_ops(engine, ids, lambda: make_drafter(arm, DrafterOptions(deepen=True), None, factory, store), cfg, BatchConfig(args.batch_size))
        new = sum(len(t) for t in res["tokens"])
        cells = "  ".join(f"{p} {n:.0f}" for p, n in res["ops_per_step"].items())
        cells = cells.replace("  features", f" (head attention {res['head_attention_per_step']:.0f})  features", 1)
        print(f"{arm:13s} {res['steps']} steps, {new / max(res['steps'], 1) / len(ids):.2f} tokens and {res['nodes_per_row_step']:.1f} nodes per row and step; "
              f"operations per step {res['total_per_step']:.0f}: {cells}; prefills {res['prefill_ops']}", flush=True)


if __name__ == "__main__":
    main()
