"""Offline replay of drafters over real greedy outputs: acceptance without running the model.

Greedy acceptance is determined by the true continuation, so replaying a drafter over stored
greedy outputs gives its exact tokens per call. Combined with a verify-cost table measured on
this machine (same process), it predicts the speedup of each drafter configuration in seconds
instead of minutes; `ngspec bench` then confirms the best ones with real runs.

    python benchmarks/replay_drafters.py --questions ../shared/data/spec_bench/question.jsonl \
        --category rag --limit 10 --cache bench-out/ref-rag.json

`--datastore DIR` gives the search drafters (`search`) a datastore, `--tables` the model-derived
drafters (unigram, bigram, mixed) their n-gram tables; EAGLE heads need the model's features and
cannot be replayed.

`--bucket-ms` takes a device's replayed verification by width bucket instead of this machine's
table (`profile-bound --target-graphs`, e.g. an H200's "1:4.43,2:5.25,4:5.44,8:8.43,16:9.52,32:6.70,
64:7.46"), and replays each configuration twice, with every block at its own bucket ("natural")
and padded to the cheapest bucket at least as wide (`--target-graphs` since BENCHMARKS.md 10zzl),
each sizing its trees by its own table (`ngspec.perf.costs.replayed_table`).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from ngspec.contracts import DraftContext
from ngspec.decode import DecodeConfig
from ngspec.drafters import DrafterOptions, make_drafter
from ngspec.drafters.trie import Calibration
from ngspec.engine import Engine
from ngspec.models import load_model
from ngspec.perf.costs import bucket_costs, replayed_table
from ngspec.prompts import encode, load_prompts


def references(engine: Engine, args) -> list[dict]:
    if args.cache and Path(args.cache).is_file():
        return json.loads(Path(args.cache).read_text())
    out = []
    for p in load_prompts(args.questions, args.category, args.limit):
        ids = encode(engine.loaded.tokenizer, p.text)
        gen = engine.run(ids, make_drafter("vanilla"), DecodeConfig(max_new_tokens=args.max_new_tokens))
        out.append({"id": p.id, "prompt": ids, "output": gen.token_ids})
        print(f"reference {p.id}: {len(gen.token_ids)} tokens", flush=True)
    if args.cache:
        Path(args.cache).parent.mkdir(parents=True, exist_ok=True)
        Path(args.cache).write_text(json.dumps(out))
    return out


def replay(ref: dict, drafter, cost: tuple[float, ...], sizes: list[int] | None = None) -> tuple[int, int, float]:
    """(tokens, calls, relative cost) of one reference output under ``drafter`` (each tree's
    size appended to ``sizes`` if given)."""
    prompt, out = ref["prompt"], ref["output"]
    drafter.start(prompt)
    drafter.observe(out[:1])
    k, calls, total_cost = 0, 1, 1.0  # the prefill emits out[0]
    while k + 1 < len(out):
        ctx = DraftContext(prompt + out[: k + 1], len(prompt), len(cost) - 1, cost)
        tree = drafter.propose(ctx).truncated(ctx.max_nodes, len(out) - k - 2)
        node, accepted = -1, 0
        while True:
            want = out[k + 1 + accepted] if k + 1 + accepted < len(out) else None
            nxt = next((i for i, (t, p) in enumerate(zip(tree.tokens, tree.parents)) if p == node and t == want), None)
            if nxt is None:
                break
            node, accepted = nxt, accepted + 1
        new = out[k + 1 : k + 2 + accepted]
        drafter.observe(new)
        k += len(new)
        calls += 1
        total_cost += ctx.cost(tree.size)
        if sizes is not None:
            sizes.append(tree.size)
    return len(out), calls, total_cost


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--questions", required=True)
    ap.add_argument("--category")
    ap.add_argument("--limit", type=int, default=10)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--cache")
    ap.add_argument("--configs", default="prompt-lookup;trie")
    ap.add_argument("--datastore", help="Datastore directory for the search drafters")
    ap.add_argument("--tables", action="store_true", help="Load (or build once and cache) the model's n-gram tables, for the unigram/bigram/mixed drafters")
    ap.add_argument("--flat-cost", action="store_true", help="Let drafters assume verification is free (GPU-like): shows what the drafter can find; speedups then assume that cost")
    ap.add_argument("--bucket-ms", help="a device's replay milliseconds by width bucket, e.g. 1:4.4,2:5.3,4:5.4,8:8.4,16:9.5,32:6.7,64:7.5: "
                    "replay each configuration with blocks at their own bucket and padded wider where cheaper")
    ap.add_argument("--no-carry", action="store_true", help="Calibrate each prompt's drafter from scratch (default: carried from prompt to prompt, as generate and bench do)")
    args = ap.parse_args()
    engine = Engine(load_model(), calibrate=not (args.flat_cost or args.bucket_ms), max_draft_nodes=64)
    refs = references(engine, args)
    store = None
    if args.datastore:
        from ngspec.datastore.index import Datastore

        store = Datastore.open(args.datastore, engine.loaded.tokenizer)
    if args.bucket_ms:
        relative = bucket_costs(args.bucket_ms)
        costs = {"natural": replayed_table(relative, 63, pad_wider=False), "padded wider": replayed_table(relative, 63)}
    else:
        costs = {"": (1.0,) * 65 if args.flat_cost else engine.target.verify_cost(512)}
    for label, cost in costs.items():
        print(f"relative verify cost by tree size{' (' + label + ')' if label else ''}:", [round(c, 2) for c in cost])
    tables = engine.ngram_tables() if args.tables else None
    for spec in args.configs.split(";"):
        name, *kv = spec.split(",")
        opts = DrafterOptions(**{k: (v == "True") if v in ("True", "False") else int(v) for k, v in (x.split("=") for x in kv)})
        for label, cost in costs.items():
            speedups, tpcs, sizes = [], [], []
            carried = None if args.no_carry else Calibration()
            for ref in refs:
                tokens, calls, total = replay(ref, make_drafter(name, opts, tables, datastore=store, calibration=carried), cost, sizes)
                speedups.append(tokens / total)
                tpcs.append(tokens / calls)
            shown = f"{spec} {label}".strip()
            print(f"{shown:60s} tokens/call median {statistics.median(tpcs):.2f}  mean tree {statistics.fmean(sizes):.1f} nodes  "
                  f"predicted speedup median {statistics.median(speedups):.2f}x mean {statistics.fmean(speedups):.2f}x")


if __name__ == "__main__":
    main()
