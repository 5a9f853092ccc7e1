"""What running the EAGLE head is worth, step by step, against what the head's gate credits it.

The whole method (`eagle+search` with deepening and a tuned static tree) runs with its head on at
every step. At each step the script also assembles the tree the step would have drafted without
the head (the same search branch and local trie tree, sized alone, as on a step the gate skips)
and scores both trees against the prompt's plain greedy output, which the run follows exactly. It
records what the gate would have decided, the gain it credits the head (its top guess's rate
times the chance the branch's first token is wrong), the head's cost relative to a plain step, and
what was known before the head ran (the branch's source, match length and first-node chance, the
local trie's match depth; `benchmarks/head_signals.py` tries them as gates).

From those records it prints, per category:

* the realized gain (accepted with the head less accepted without it) next to the credited gain,
  over all steps, the steps the gate would run the head on and those it would skip, and by
  quartile of the credited gain;
* where the realized gain comes from: steps where the head's top guess is right or wrong, and the
  branch's first token right or wrong;
* tokens per unit of cost of four policies replayed over the same steps: never run the head,
  always run it, follow the gate, and pick the better tree at each step (each step's
  cost: its tree's verify cost from the run's cost table, plus the head's measured cost where it
  runs). A replay assumes a skipped step leaves the next steps as they were (the head catches up
  on skipped positions, `EagleDrafter.defer`).

    python benchmarks/head_worth.py --category summarization --eagle-head heads/amd-v23-all-e8lr1 \\
        --datastore datastores/shipped --tuned shapes/amd-v23-cpu-b1.json --json bench-out/v30/worth-summ.json

`--bucket-ms` sizes the trees as another device's replayed verification would (a GPU's
`--target-graphs` milliseconds by width bucket, blocks padded wider where cheaper, as
`replay_drafters.py --bucket-ms` takes them) and `--head-cost` gives the head's run in that
device's plain steps; the model still runs here, so the outputs, and what each tree would accept,
are this machine's.

`--replay FILE` summarises a saved `--json` run's step records again, without a model: the
summary's policies include the calibrated gate learning from the accepted length below the
head's own first node, and the gate with its credit scaled by a fixed 1.5, 2 and 3.

Batch size 1 only (a batch sizes its rows' trees together).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import ngspec.drafters.search as search
from ngspec.contracts import DraftContext, DraftTree
from ngspec.datastore.index import Datastore
from ngspec.decode import DecodeConfig
from ngspec.drafters import make_drafter
from ngspec.drafters.eagle import EagleOptions, eagle_factory, read_choices
from ngspec.drafters.trie import Calibration
from ngspec.eagle.head import load_draft_vocab, load_head
from ngspec.engine import Engine
from ngspec.models import load_model
from ngspec.perf.costs import bucket_costs, replayed_table
from ngspec.prompts import encode, load_prompts
from ngspec.tree import accepted_path


class Witness(search.EagleSearchDrafter):
    """The whole method with its head run at every step, recording both trees' outcomes."""

    def __init__(self, *args, reference: list[int], rows: list[dict], prompt_index: int = 0, head_cost: float | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.reference, self.rows, self.prompt_index = reference, rows, prompt_index
        self.device_head_cost = head_cost  # another device's head run, in its plain steps (None: as timed here)
        self._row: dict | None = None

    def _head_cost(self, ctx: DraftContext) -> float:
        return super()._head_cost(ctx) if self.device_head_cost is None else self.device_head_cost

    def _credited_gain(self, reach, n: int) -> float:
        self._credited = super()._credited_gain(reach, n)
        self._reach0 = reach[0] if n else 0.0  # the branch's first-node chance, as the gate sized it
        self._branch = (1.0 + sum(reach[:n]), n)  # the tokens the branch alone is expected to give, its nodes
        return self._credited

    def _head_pays(self, conditionals, key, ctx: DraftContext) -> bool:
        gate = super()._head_pays(conditionals, key, ctx)  # sets ``_credited`` and ``_reach0``
        node = self.search.trie.match(ctx.tokens)
        expected, n = self._branch
        self._row = {
            "gate": gate, "credited": self._credited, "head_cost": self._head_cost(ctx),
            # what the gate weighs: its credit against the branch alone (`EagleSearchDrafter._head_pays`)
            "expected": expected, "cost_n": ctx.cost(n), "cost_n1": ctx.cost(n + 1),
            # what is known before the head runs (`benchmarks/head_signals.py` tries them as gates)
            "prompt": self.prompt_index, "source": key[0], "match": key[1], "reach0": self._reach0,
            "local_depth": self.search.trie.depth(node) if node is not None else 0,
        }
        return True

    def _assemble(self, ctx, found, root_key, root_node, tree, scores):
        out = super()._assemble(ctx, found, root_key, root_node, tree, scores)
        row, self._row = self._row, None
        if row is None or not scores:
            return out
        counts, deepened = dict(self.search.found), self.deepened
        alone = super()._assemble(ctx, found, root_key, root_node, DraftTree(), [])[0]
        self.search.found.update(counts)  # the counterfactual is not part of the run's statistics
        self.deepened = deepened
        truth = self.reference[len(ctx.tokens) - ctx.prompt_len :]
        with_head, only = out[0], out[3]
        path = accepted_path(with_head, truth)
        row.update(
            # what the drafter itself can see after the step: a node only the head's first level offered was accepted
            first_level_only=any(only[i] == 1 for i in path),
            accepted_with=len(path),
            accepted_without=len(accepted_path(alone, truth)),
            cost_with=ctx.cost(with_head.size),
            cost_without=ctx.cost(alone.size),
            head_right=bool(truth) and truth[0] == self._eagle_top,
            branch_right=bool(truth) and bool(found[1]) and found[1][0] == truth[0],
        )
        self.rows.append(row)
        return out


CREDIT_SCALES = (1.5, 2.0, 3.0)  # the gate with its credit scaled by a fixed factor, replayed


def summarise(rows: list[dict]) -> dict:
    def gain(rs: list[dict]) -> dict:
        if not rs:
            return {"steps": 0}
        return {
            "steps": len(rs),
            "realized": statistics.fmean(r["accepted_with"] - r["accepted_without"] for r in rs),
            "credited": statistics.fmean(r["credited"] for r in rs),
            "cost_added": statistics.fmean(r["cost_with"] - r["cost_without"] for r in rs),
        }

    credited = sorted(r["credited"] for r in rows)
    cuts = [credited[len(credited) * q // 4] for q in (1, 2, 3)]
    quartiles = [[r for r in rows if (q == 0 or r["credited"] >= cuts[q - 1]) and (q == 3 or r["credited"] < cuts[q])] for q in range(4)]

    def rate(pick) -> float:
        tokens = sum(1 + (r["accepted_with"] if pick(r) else r["accepted_without"]) for r in rows)
        cost = sum(r["cost_with"] + r["head_cost"] if pick(r) else r["cost_without"] for r in rows)
        return tokens / cost

    def calibrated(record=lambda r: float(r["first_level_only"]), scale: float | None = None) -> list[bool]:
        """The gate with its credit scaled by what ``record`` says the head added where it ran
        (by default whether its first level added a node: `reader_ab.py`'s ``whole cal``,
        `search.HEAD_CREDIT` in a calibration carried from prompt to prompt; probes as the gate's),
        or by a fixed ``scale``: the head's run on each step."""
        calibration, since, prompt, runs = Calibration(), 0, None, []
        for r in rows:
            if r["prompt"] != prompt:
                prompt, since = r["prompt"], 0
                calibration.next_prompt()
            gain = r["credited"] * scale if scale is not None else calibration.scaled(search.HEAD_CREDIT, [r["credited"]])[0]
            run = since >= search.PROBE_EVERY or (r["expected"] + gain) / (r["cost_n1"] + search.HEAD_COST_WEIGHT * r["head_cost"]) > r["expected"] / r["cost_n"]
            since = 0 if run else since + 1
            if run and scale is None:
                calibration.record(search.HEAD_CREDIT, record(r), r["credited"])
            runs.append(run)
        return runs

    replayable = bool(rows) and "expected" in rows[0]
    picks = dict(zip(map(id, rows), calibrated())) if replayable else {}
    # where the head's own first token was taken, the tokens accepted are all its gain: a fuller
    # record than whether it was taken (BENCHMARKS.md 10zzr)
    length_picks = dict(zip(map(id, rows), calibrated(lambda r: float(r["accepted_with"]) if r["first_level_only"] else 0.0))) if replayable else {}
    scaled_picks = {x: dict(zip(map(id, rows), calibrated(scale=x))) for x in CREDIT_SCALES} if replayable else {}

    def oracle(r: dict) -> bool:
        return (1 + r["accepted_with"]) / (r["cost_with"] + r["head_cost"]) > (1 + r["accepted_without"]) / r["cost_without"]

    return {
        "all": gain(rows),
        "gate runs": gain([r for r in rows if r["gate"]]),
        "gate skips": gain([r for r in rows if not r["gate"]]),
        "by credited quartile": [gain(q) for q in quartiles],
        "head right, branch wrong": gain([r for r in rows if r["head_right"] and not r["branch_right"]]),
        "head right, branch right": gain([r for r in rows if r["head_right"] and r["branch_right"]]),
        "head wrong, branch wrong": gain([r for r in rows if not r["head_right"] and not r["branch_right"]]),
        "head wrong, branch right": gain([r for r in rows if not r["head_right"] and r["branch_right"]]),
        "head cost": statistics.fmean(r["head_cost"] for r in rows),
        **({"calibrated gate runs": gain([r for r in rows if picks[id(r)]]),
            "first level only accepted, gate runs": statistics.fmean(r["first_level_only"] for r in rows if r["gate"]) if any(r["gate"] for r in rows) else 0.0}
           if picks else {}),
        "tokens per cost": {
            "never": rate(lambda r: False),
            "always": rate(lambda r: True),
            "gate": rate(lambda r: r["gate"]),
            **({"calibrated gate": rate(lambda r: picks[id(r)]),
                "calibrated gate, accepted length": rate(lambda r: length_picks[id(r)]),
                **{f"credit x{x:g}": rate(lambda r, x=x: scaled_picks[x][id(r)]) for x in CREDIT_SCALES}} if picks else {}),
            "per-step best": rate(oracle),
        },
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--questions", default="../shared/data/spec_bench/question.jsonl")
    ap.add_argument("--replay", metavar="JSON", help="summarise the step records a --json run saved, without running a model")
    ap.add_argument("--category")
    ap.add_argument("--limit", type=int, default=8)
    ap.add_argument("-n", "--max-new-tokens", type=int, default=128)
    ap.add_argument("--eagle-head")
    ap.add_argument("--datastore")
    ap.add_argument("--tuned", help="tune-tree output for the whole method's static tree")
    ap.add_argument("--json", help="write the per-step records and the summary here")
    ap.add_argument("--bucket-ms", help="size the trees by a device's replayed verification, milliseconds by width bucket, "
                    "e.g. 1:4.43,2:5.25,4:5.44,8:8.9,16:8.9,32:6.70,64:7.46 (blocks padded wider where cheaper)")
    ap.add_argument("--head-cost", type=float, help="the head's run in that device's plain steps (default: as timed here)")
    args = ap.parse_args()
    if args.replay:
        print(json.dumps(summarise(json.loads(Path(args.replay).read_text())["steps"]), indent=1))
        return
    missing = [flag for flag, value in (("--category", args.category), ("--eagle-head", args.eagle_head), ("--tuned", args.tuned)) if not value]
    if missing:
        ap.error(f"{', '.join(missing)} required (or --replay)")

    loaded = load_model()
    nodes = 63 if args.bucket_ms else 96
    engine = Engine(loaded, calibrate=not args.bucket_ms)
    if args.bucket_ms:
        engine.target.cost_tables = {0: replayed_table(bucket_costs(args.bucket_ms), nodes)}
    head_dir = Path(args.eagle_head)
    store = Datastore.open(args.datastore, loaded.tokenizer) if args.datastore else None
    tuned = EagleOptions("static", choices=read_choices(Path(args.tuned)), draft_vocab=8192)
    factory = eagle_factory(loaded.model, load_head(head_dir, loaded.model), tuned, load_draft_vocab(head_dir))
    ids = [encode(loaded.tokenizer, p.text) for p in load_prompts(Path(args.questions), args.category, args.limit)]
    # another device's table stands as given: not rescaled by this machine's step times
    cfg = DecodeConfig(max_new_tokens=args.max_new_tokens, max_draft_nodes=nodes, learn_costs=not args.bucket_ms)
    calibration, rows, exact = Calibration(), [], 0  # carried from prompt to prompt, as in `generate`
    for i, x in enumerate(ids):
        reference = engine.run(x, make_drafter("vanilla"), cfg).token_ids
        drafter = Witness(factory(), store, deepen=True, calibration=calibration, reference=reference, rows=rows,
                           prompt_index=i, head_cost=args.head_cost)
        exact += engine.run(x, drafter, cfg).token_ids == reference
    summary = summarise(rows)
    print(f"{args.category}: {len(rows)} steps, exact {exact}/{len(ids)}")
    print(json.dumps(summary, indent=1))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"summary": summary, "steps": rows}))


if __name__ == "__main__":
    main()
