"""The drafters' own host time per row and step, replayed over real greedy outputs without the model.

On a GPU with the target's verification replayed from CUDA graphs (`--target-graphs`), a 32-row
step of the default model took 40-60 ms on the H200, and the whole method's drafting was
20-22% of it against the trie's 3-4%, with its head skipped on most row-steps (BENCHMARKS.md
10zs). That drafting is host Python, so it can be timed here: each arm drafts for every position
of stored greedy outputs (teacher-forced, as `benchmarks/replay_drafters.py` replays them), under a
GPU-like verify cost (1 + S*n for n nodes), and the seconds spent in `propose`, `keep` and
`observe` are summed, each prompt's from its fastest of ``--repeats`` replays. Arms:

* ``trie``: the trie drafter;
* ``search``: the search branch alone (local trie and datastore);
* ``whole skipped``: `eagle+search` with a head whose gate never opens (a head that costs a
  thousand steps; every `search.PROBE_EVERY`-th step it "runs" and drafts nothing): the path the
  whole method takes on the row-steps that skip the head, which were most of them on the H200.

``--engine-sizes`` drafts as in a batch (every tree offered best first, the batch keeping
``--width`` nodes, `Drafter.keep`); without it, as one sequence (each drafter sizes its own tree).
Each arm prints its tokens per call, its host microseconds per step, and a digest of every tree it
offered, so that a change meant to make drafting cheaper can be checked to draft the same trees.

The outputs come from `reader_ab.py --reference-cache FILE` (plain greedy decoding's answers, keyed
by prompt, length, dtype and device; a GPU visit's file serves here):

    python benchmarks/drafter_host.py --references bench-out/v64/gpu/x/3/res/res/reference-rag-64.json \\
        --questions ../shared/data/spec_bench/question.jsonl --category rag --limit 64 -n 64 \\
        --datastore datastores/shipped --engine-sizes
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time
from pathlib import Path

from transformers import AutoTokenizer

import ngspec.drafters.search as search
from ngspec.contracts import DraftContext
from ngspec.datastore.index import Datastore
from ngspec.drafters import DrafterOptions, make_drafter
from ngspec.drafters.trie import Calibration
from ngspec.models import default_model_dir
from ngspec.prompts import load_prompts
from ngspec.turns import Conversations
from reader_ab import _Headless, reference_key  # benchmarks/, beside this script


class SkippedHead(_Headless):
    """Stands in for the EAGLE drafter of a head that never pays: its gate stays shut (a run costs a
    thousand steps), and on the probes that run it anyway it drafts nothing."""

    head_cost = 1000.0


def references(path: Path, tokenizer, questions: str, category: str | None, limit: int, n: int, dtype: str, device: str) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, greedy output) of the first ``limit`` prompts, from a `reader_ab.py
    --reference-cache` file written with the same length, dtype and device."""
    cache = json.loads(path.read_text())
    asked = Conversations(tokenizer, load_prompts(Path(questions), category, limit), False)
    out = []
    for i in range(len(asked.units)):
        ids = asked.ids(i)
        key = reference_key(ids, n, dtype, device)
        if key not in cache:
            raise SystemExit(f"prompt {i} is not in {path} (asked with -n {n}, {dtype}, {device}?)")
        out.append((ids, cache[key]))
    return out


def replay(drafter, ids: list[int], output: list[int], cost: tuple[float, ...], engine_sizes: bool, width: int, digest) -> tuple[int, int, float]:
    """(tokens, calls, host seconds) of ``drafter`` over one output, teacher-forced."""
    drafter.start(ids)
    drafter.observe(output[:1])  # the prefill's token
    k, calls, seconds = 0, 0, 0.0
    while k + 1 < len(output):
        ctx = DraftContext(ids + output[: k + 1], len(ids), len(cost) - 1, cost, engine_sizes=engine_sizes)
        started = time.perf_counter()
        tree = drafter.propose(ctx)
        if engine_sizes:
            tree = tree.truncated(width, width)
            if hasattr(drafter, "keep"):
                drafter.keep(tree.size)
        seconds += time.perf_counter() - started
        digest.update(repr((tree.tokens, tree.parents)).encode())
        node, accepted = -1, []
        while k + 1 + len(accepted) < len(output):
            want = output[k + 1 + len(accepted)]
            node = next((i for i, (t, p) in enumerate(zip(tree.tokens, tree.parents)) if p == node and t == want), None)
            if node is None:
                break
            accepted.append(want)
        new = accepted + output[k + 1 + len(accepted) : k + 2 + len(accepted)]  # the bonus token, if any is left
        started = time.perf_counter()
        drafter.observe(new)
        seconds += time.perf_counter() - started
        k += len(new)
        calls += 1
    return k, calls, seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--references", required=True, help="a reader_ab.py --reference-cache file")
    ap.add_argument("--questions", default="../shared/data/spec_bench/question.jsonl")
    ap.add_argument("--category")
    ap.add_argument("--limit", type=int, default=64)
    ap.add_argument("-n", "--max-new-tokens", type=int, default=64, help="the length the references were asked with")
    ap.add_argument("--ref-dtype", default="torch.float32")
    ap.add_argument("--ref-device", default="cuda:0")
    ap.add_argument("--datastore")
    ap.add_argument("--arms", default="trie,search,whole skipped")
    ap.add_argument("--cost-slope", type=float, default=0.004, help="verify cost 1 + S*n for n nodes (0.004: about the H100's)")
    ap.add_argument("--max-nodes", type=int, default=96)
    ap.add_argument("--engine-sizes", action="store_true", help="draft as in a batch: trees offered best first, --width kept")
    ap.add_argument("--width", type=int, default=8, help="with --engine-sizes: the nodes the batch keeps of each tree")
    ap.add_argument("--repeats", type=int, default=3, help="replays per arm (each prompt's fastest is counted)")
    args = ap.parse_args()

    tokenizer = AutoTokenizer.from_pretrained(default_model_dir())
    refs = references(Path(args.references), tokenizer, args.questions, args.category, args.limit, args.max_new_tokens, args.ref_dtype, args.ref_device)
    store = Datastore.open(args.datastore, tokenizer) if args.datastore else None
    cost = tuple(1.0 + args.cost_slope * n for n in range(args.max_nodes + 1))
    arms = {
        "trie": lambda cal: make_drafter("trie", DrafterOptions(), calibration=cal),
        "search": lambda cal: make_drafter("search", DrafterOptions(), datastore=store, calibration=cal),
        "whole skipped": lambda cal: search.EagleSearchDrafter(SkippedHead(), store, calibration=cal),
    }
    for name in args.arms.split(","):
        best = [float("inf")] * len(refs)  # each prompt's fastest replay: a noisy moment costs one prompt's time, not a repeat's
        for _ in range(args.repeats):
            if store is not None:
                store.forget()
            calibration, digest = Calibration(), hashlib.sha1()
            tokens = calls = 0
            for i, (ids, output) in enumerate(refs):
                t, c, s = replay(arms[name](calibration), ids, output, cost, args.engine_sizes, args.width, digest)
                tokens, calls, best[i] = tokens + t, calls + c, min(best[i], s)
        print(f"{name:14s} tokens/call {tokens / calls:.3f}  host {1e6 * sum(best) / calls:.1f} us a step  ({calls} steps)  trees {digest.hexdigest()[:12]}", flush=True)


if __name__ == "__main__":
    main()
