"""READER's ablation on one machine, in one process: EAGLE alone, + search branch, + deepening,
+ KV rearrangement, + tuned tree, next to vanilla and trie, at several batch sizes.

"EAGLE" is the `eagle` drafter, whose tree is sized by the measured verify cost like every
`eagle+search` arm's (so "+ search branch" adds the branch and nothing else); "EAGLE (whole tree)"
verifies the head's whole tree every step, as the paper's EAGLE alone does on a GPU (with
``--flat-cost`` the two are the same).

Every arm decodes the same prompts; batch size 1 runs the single-sequence engine (its cache is
compacted every step by construction), every arm in turn on each prompt, larger batches the
batched engine, one arm after another (with ``--interleave-batches K``, every arm in turn on each
group of K batches' worth of prompts: on a shared machine, where the load changes under a run). Reports tokens per call (per row), total tokens/s,
speedup vs vanilla at the same batch size, the speedup the measured verify-cost table predicts
from the trees actually verified (free of timing noise; decoding steps only: prefills, drafting
and compaction left out), and the self-repetition
ceiling of the vanilla outputs without and with the datastore. With ``--rounds R`` every batch
size runs its arms R times, the order reversed every other round (A B C, C B A, ...), and reports
the summed time and each round's, so that drift over a run hits every arm alike. Exact match vs
plain greedy (single-sequence vanilla) is checked for every arm and printed, with the reference's
top-2 logit margin where an output first differs (near-ties in bf16 on a GPU). Before the timed
runs every arm decodes 16 tokens of the first prompts once, untimed (warm-up).

    python benchmarks/reader_ablation.py --questions ../shared/data/spec_bench/question.jsonl \
        --category rag --limit 10 -n 128 --eagle-head heads/smollm2-v2 \
        --datastore datastores/smollm2-self --tuned shapes/smollm2-cpu-b1.json --batch-sizes 1,8
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import fields, replace
from pathlib import Path

from ngspec.batch import BatchConfig, BatchReport
from ngspec.bench.batched import batch_groups
from ngspec.check import divergence
from ngspec.datastore.index import Datastore
from ngspec.decode import DecodeConfig
from ngspec.drafters import DrafterOptions, make_drafter
from ngspec.drafters.trie import Calibration
from ngspec.drafters.eagle import EagleOptions, eagle_factory, read_choices
from ngspec.eagle.head import load_draft_vocab, load_head
from ngspec.engine import Engine
from ngspec.metrics.self_repetition import self_repetition
from ngspec.models import load_model
from ngspec.prompts import encode, load_prompts


WHOLE_TREE = "eagle (whole tree)"  # the head's whole tree, verified even where nodes cost (the paper's EAGLE alone)


def arms(args, eagle_opts: EagleOptions, tuned: EagleOptions | None) -> list[dict]:
    """(label, drafter, options, eagle options, rearrange-every) of every arm, in ablation order."""
    base = DrafterOptions(search_depth=args.search_depth)
    out = [
        {"label": "vanilla", "drafter": "vanilla", "opts": base, "eagle": eagle_opts, "rearrange": args.rearrange_every},
        {"label": "trie", "drafter": "trie", "opts": base, "eagle": eagle_opts, "rearrange": args.rearrange_every},
        {"label": "search", "drafter": "search", "opts": base, "eagle": eagle_opts, "rearrange": args.rearrange_every},
        {"label": "EAGLE", "drafter": "eagle", "opts": base, "eagle": eagle_opts, "rearrange": 0},
        {"label": "EAGLE (whole tree)", "drafter": WHOLE_TREE, "opts": base, "eagle": eagle_opts, "rearrange": 0},
        {"label": "+ search branch", "drafter": "eagle+search", "opts": base, "eagle": eagle_opts, "rearrange": 0},
        {"label": "+ deepening", "drafter": "eagle+search", "opts": replace(base, deepen=True), "eagle": eagle_opts, "rearrange": 0},
        {"label": "+ KV rearrangement", "drafter": "eagle+search", "opts": replace(base, deepen=True), "eagle": eagle_opts, "rearrange": args.rearrange_every},
    ]
    if tuned is not None:
        out.append({"label": "+ tuned tree", "drafter": "eagle+search", "opts": replace(base, deepen=True), "eagle": tuned, "rearrange": args.rearrange_every})
    return out


def engine_for(loaded, flat_cost: bool, cost_slope: float | None, max_nodes: int) -> Engine:
    """The engine: calibrated on this machine; with ``flat_cost`` none (trees whole); with
    ``cost_slope`` S the table 1 + S*n for n nodes, at every batch size."""
    if cost_slope is not None:
        return Engine(loaded, calibrate=False, max_draft_nodes=max_nodes, cost_slope=cost_slope)
    return Engine(loaded, calibrate=not flat_cost)


def combined(reports: list[BatchReport]) -> BatchReport:
    """One report for several runs: their counts and times summed, the largest cache and prefill
    cap kept, and the last graphs' report (it counts over the runs already)."""
    total = BatchReport()
    for rep in reports:
        for f in fields(BatchReport):
            mine, theirs = getattr(total, f.name), getattr(rep, f.name)
            if f.name == "target_graphs":
                setattr(total, f.name, theirs or mine)
            else:
                setattr(total, f.name, max(mine, theirs) if f.name in ("peak_slots", "prefill_tokens") else mine + theirs)
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--questions", required=True)
    ap.add_argument("--category")
    ap.add_argument("--limit", type=int, default=10)
    ap.add_argument("-n", "--max-new-tokens", type=int, default=128)
    ap.add_argument("--model", default="default")
    ap.add_argument("--device", default="auto", help="auto (CUDA when present), cpu, cuda")
    ap.add_argument("--dtype", default="auto", help="auto (float32 on CPU, bfloat16 on GPU), float32, bfloat16, float16")
    ap.add_argument("--eagle-head", required=True)
    ap.add_argument("--datastore")
    ap.add_argument("--tuned", help="tune-tree output for the '+ tuned tree' arm at batch size 1")
    ap.add_argument("--tuned-batch", help="tune-tree output for that arm at larger batch sizes (default: --tuned)")
    ap.add_argument("--tree", default="dynamic")
    ap.add_argument("--tree-top-k", type=int, default=4)
    ap.add_argument("--tree-depth", type=int, default=4)
    ap.add_argument("--total-tokens", type=int, default=16)
    ap.add_argument("--search-depth", type=int, default=16)
    ap.add_argument("--draft-vocab", type=int, default=8192)
    ap.add_argument("--rearrange-every", type=int, default=BatchConfig.rearrange_every)
    ap.add_argument("--rearrange-min-share", type=float, default=BatchConfig.rearrange_min_share, help="compact only when that frees at least this share of the slots (0 = at every check)")
    ap.add_argument("--batch-sizes", default="1,8")
    ap.add_argument("--rounds", type=int, default=1, help="run every arm this many times, reversing the order of the arms every other round (interleaving at batch sizes > 1, repeats at 1); times are summed")
    ap.add_argument("--interleave-batches", type=int, default=0, metavar="K",
                    help="at batch sizes > 1, run the prompts K batches' worth at a time, every arm in turn on each group "
                    "(the order reversed every other group), so that a load that changes during the run (a shared GPU) "
                    "hits every arm alike; 0 (default): each arm over all the prompts, one arm after another")
    ap.add_argument("--only", help="comma-separated arm labels to run (vanilla always runs)")
    ap.add_argument("--compare-rows-alone", action="store_true", help="at batch sizes > 1 also run every drafting arm with each row sizing its tree alone (the batch then pays for the widest row's tree), labelled '(rows alone)'")
    ap.add_argument("--compare-head-row-by-row", action="store_true", help="at batch sizes > 1 also run every arm with an EAGLE head running it row by row (one head forward per row and tree level, as before the head ran for all rows together), labelled '(head row by row)'")
    ap.add_argument("--flat-cost", action="store_true", help="no verify-cost calibration: every drafter keeps its full (fixed) tree, as on a GPU far from its compute bound; tokens per call then shows the shapes themselves (timings are not meaningful)")
    ap.add_argument("--cost-slope", type=float, help="hand every drafter the verify cost 1 + S*n for a tree of n nodes, not rescaled by the run's own step times: trees sized as on a machine with that cost (0.004: about the H100's for the default model, BENCHMARKS.md 10c); tokens per call exact, timings not meaningful")
    ap.add_argument("--json-out")
    args = ap.parse_args()
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    if args.interleave_batches < 0:
        ap.error("--interleave-batches must be 0 or more")
    if args.flat_cost and args.cost_slope is not None:
        ap.error("--flat-cost and --cost-slope exclude each other")

    loaded = load_model(args.model, args.device, args.dtype)
    cfg = DecodeConfig(max_new_tokens=args.max_new_tokens, max_draft_nodes=96)
    engine = engine_for(loaded, args.flat_cost, args.cost_slope, cfg.max_draft_nodes)
    head = load_head(Path(args.eagle_head), loaded.model)
    vocab = load_draft_vocab(Path(args.eagle_head))
    store = Datastore.open(args.datastore, loaded.tokenizer) if args.datastore else None
    eagle_opts = EagleOptions(args.tree, args.tree_top_k, args.tree_depth, args.total_tokens, draft_vocab=args.draft_vocab)
    tuned = EagleOptions("static", choices=read_choices(Path(args.tuned)), draft_vocab=args.draft_vocab) if args.tuned else None
    tuned_batch = EagleOptions("static", choices=read_choices(Path(args.tuned_batch)), draft_vocab=args.draft_vocab) if args.tuned_batch else tuned
    prompts = load_prompts(Path(args.questions), args.category, args.limit)
    ids = [encode(loaded.tokenizer, p.text) for p in prompts]
    sizes = [int(b) for b in args.batch_sizes.split(",")]
    keep = {"vanilla", *args.only.split(",")} if args.only else None

    results, reference = [], None
    if 1 not in sizes:  # every arm is compared with plain single-sequence greedy decoding
        reference = [engine.run(x, make_drafter("vanilla"), cfg).token_ids for x in ids]
    for b in sizes:
        chosen = [a for a in arms(args, eagle_opts, tuned if b == 1 else tuned_batch) if keep is None or a["label"] in keep]
        if b > 1 and args.compare_rows_alone:
            chosen = [dict(a, joint=j, label=a["label"] + ("" if j else " (rows alone)")) for a in chosen for j in (True, False) if j or a["drafter"] != "vanilla"]
        if b > 1 and args.compare_head_row_by_row:
            chosen = [dict(a, together=t, label=a["label"] + ("" if t else " (head row by row)")) for a in chosen for t in (True, False) if t or "eagle" in a["drafter"]]
        news = {}
        carried: dict[str, Calibration] = {}  # each arm's estimates, from prompt to prompt of a round
        for arm in chosen:
            factory = eagle_factory(loaded.model, head, arm["eagle"], vocab)
            news[arm["label"]] = lambda arm=arm, factory=factory: factory() if arm["drafter"] == WHOLE_TREE else make_drafter(arm["drafter"], arm["opts"], None, factory, store, carried.get(arm["label"]))  # noqa: E731

        def batch_config(arm: dict) -> BatchConfig:
            return BatchConfig(b, arm["rearrange"], args.rearrange_min_share, arm.get("joint", True), arm.get("together", True))

        # untimed warm-up, every arm once on the first prompts: first allocations and lazy setup
        # (the head's first forwards cost about a third more) land on no arm's clock
        warm = replace(cfg, max_new_tokens=min(16, cfg.max_new_tokens))
        for arm in chosen:
            if b == 1:
                engine.run(ids[0], news[arm["label"]](), warm)
            else:
                engine.run_batch(ids[:b], news[arm["label"]], warm, batch_config(arm))
        done = {arm["label"]: None for arm in chosen}
        spent: dict[str, list[float]] = {arm["label"]: [] for arm in chosen}
        reports: dict[str, dict] = {}
        for round_ in range(args.rounds):
            order = chosen if round_ % 2 == 0 else chosen[::-1]
            carried.update({arm["label"]: Calibration() for arm in chosen})  # not the warm-up's, nor the last round's
            if b == 1:  # arms interleaved per prompt, so that the machine's drift hits every arm alike
                gens = {arm["label"]: [] for arm in order}
                took = dict.fromkeys(gens, 0.0)
                for x in ids:
                    for arm in order:
                        if store is not None:
                            store.forget()  # every timed run reads it cold: arms and rounds repeat the same prompts
                        t0 = time.perf_counter()
                        gens[arm["label"]].append(engine.run(x, news[arm["label"]](), cfg))
                        took[arm["label"]] += time.perf_counter() - t0
                for label in gens:
                    done[label] = gens[label]
                    spent[label].append(took[label])
            else:
                gens, took, reps = ({arm["label"]: [] for arm in order} for _ in range(3))
                for g, group in enumerate(batch_groups(ids, b, args.interleave_batches)):
                    for arm in order if g % 2 == 0 else order[::-1]:
                        if store is not None:
                            store.forget()
                        out, rep = engine.run_batch(group, news[arm["label"]], cfg, batch_config(arm))
                        gens[arm["label"]] += [r.generation for r in out]
                        took[arm["label"]].append(rep.seconds)
                        reps[arm["label"]].append(rep)
                for label in gens:
                    done[label] = gens[label]
                    spent[label].append(sum(took[label]))
                    reports[label] = combined(reps[label]).as_dict()
        for arm in chosen:
            gens, seconds, report = done[arm["label"]], sum(spent[arm["label"]]), reports.get(arm["label"])
            tokens = [g.token_ids for g in gens]
            if reference is None:
                reference = tokens
            splits = [divergence(engine, x, r, t) for x, r, t in zip(ids, reference, tokens)]
            calls = sum(g.stats.verify_calls for g in gens)
            # the measured cost table's verdict, free of timing noise: batch 1 sums each call's
            # cost, larger batches each batched step's (prefills left out)
            cost_units = report["cost_units"] if report else sum(g.stats.cost_units for g in gens)
            row = {
                "batch_size": b, "arm": arm["label"], "drafter": arm["drafter"], "rearrange_every": arm["rearrange"] if b > 1 else None,
                "new_tokens": sum(map(len, tokens)), "seconds": seconds, "round_seconds": spent[arm["label"]],
                "tokens_per_second": args.rounds * sum(map(len, tokens)) / seconds,
                "tokens_per_call": sum(map(len, tokens)) / calls,
                "tokens_per_cost_unit": sum(map(len, tokens)) / cost_units,
                "exact_match": sum(t == r for t, r in zip(tokens, reference)) / len(tokens),
                "mismatches": [{"prompt": i, "first_mismatch": c.first_mismatch, "near_tie_margin": c.margin, "near_tie_steps": c.steps} for i, c in enumerate(splits) if not c.exact_match],
                "draft_share": sum(g.stats.draft_seconds for g in gens) / spent[arm["label"]][-1],
                **({"cache": report} if report else {}),
            }
            results.append(row)
            print(json.dumps(row), flush=True)

    plain = [self_repetition(x, r) for x, r in zip(ids, reference)]
    with_store = [self_repetition(x, r, store) for x, r in zip(ids, reference)] if store is not None else None
    ceiling = {
        "median": statistics.median(s.value for s in plain),
        "token_weighted": sum(len(r) for r in reference) / sum(s.steps for s in plain),
    }
    if with_store:
        ceiling["median_with_datastore"] = statistics.median(s.value for s in with_store)
        ceiling["token_weighted_with_datastore"] = sum(len(r) for r in reference) / sum(s.steps for s in with_store)
    print(json.dumps({"ceiling": ceiling}), flush=True)

    print("\n| batch | arm | tokens/call | tokens/s | vs vanilla | by cost table | drafting | exact | largest tie margin |\n|---|---|---|---|---|---|---|---|---|")
    for row in results:
        van = next(r for r in results if r["batch_size"] == row["batch_size"] and r["arm"] == "vanilla")
        print(f"| {row['batch_size']} | {row['arm']} | {row['tokens_per_call']:.2f} | {row['tokens_per_second']:.1f} | "
              f"{row['tokens_per_second'] / van['tokens_per_second']:.2f}x | {row['tokens_per_cost_unit'] / van['tokens_per_cost_unit']:.2f}x | "
              f"{100 * row['draft_share']:.0f}% | {100 * row['exact_match']:.0f}% | "
              f"{max((m['near_tie_margin'] for m in row['mismatches']), default=0):.3f} |")
    print(f"\nself-repetition ceiling of the vanilla outputs: {json.dumps(ceiling)}")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({"results": results, "ceiling": ceiling}, indent=1))


if __name__ == "__main__":
    main()
