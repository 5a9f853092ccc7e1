"""Would a signal known before the head runs pick the steps where its run wins? Offline, over the
per-step records of `benchmarks/head_worth.py --json` (one file per category).

Each signal splits steps into buckets. A rule learned on some steps runs the head on a bucket when
the bucket's mean realized gain (tokens accepted with the head less without) beats what the same
cost buys at the run's rate without the head; it is replayed (tokens per unit of cost, against
never running the head, as in head_worth.py) on steps it did not learn from: the other category's,
and the other half of the same category's prompts (learned on odd prompts, replayed on even ones
and back). In-sample figures are printed too, as the upper bound a signal could give.

    python benchmarks/head_signals.py bench-out/v31/summarization.json bench-out/v31/rag.json
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Callable


def _cut(x: float, cuts: tuple[float, ...]) -> int:
    return sum(x >= c for c in cuts)


SIGNALS: dict[str, Callable[[dict], object]] = {
    "branch source": lambda r: r["source"],
    "source x match length": lambda r: (r["source"], min(r["match"], 4)),
    "branch first-node chance": lambda r: _cut(r["reach0"], (0.2, 0.5, 0.8)),
    "source x first-node chance": lambda r: (r["source"], _cut(r["reach0"], (0.3, 0.7))),
    "local match depth": lambda r: r["local_depth"],
    "last step's accepted tokens": lambda r: min(r["prev_accepted"], 3),
    "last step: head right": lambda r: r["prev_head_right"],
    "last step: head right, branch right": lambda r: (r["prev_head_right"], r["prev_branch_right"]),
    "last accepted x first-node chance": lambda r: (min(r["prev_accepted"], 2), _cut(r["reach0"], (0.3, 0.7))),
}


SURE_BRANCH = (0.2, 0.8)  # the fixed `sure` rule (reader_ab.py's `whole sure`): the branch's first-node chances where the head runs
SURE_LOCAL_DEPTH = 2  # and the local trie's match depth from which it runs


def sure(r: dict) -> bool:
    """The `sure` rule, picked on section 10zzr's rag and summarization records at the H200's replayed
    sizing: run the head where the branch is fairly sure of its first token or the local trie matched
    two tokens or more."""
    return SURE_BRANCH[0] <= r["reach0"] < SURE_BRANCH[1] or r["local_depth"] >= SURE_LOCAL_DEPTH


def with_previous(rows: list[dict]) -> list[dict]:
    """Each record with the previous step's outcome of the same prompt (-1 / None on a prompt's
    first step): known before the head runs."""
    out, prev = [], None
    for r in rows:
        same = prev is not None and prev["prompt"] == r["prompt"]
        out.append({**r, "prev_accepted": prev["accepted_with"] if same else -1,
                    "prev_head_right": prev["head_right"] if same else None, "prev_branch_right": prev["branch_right"] if same else None})
        prev = r
    return out


def rate(rows: list[dict], run: Callable[[dict], bool]) -> float:
    """Tokens per unit of cost when the head runs on the steps ``run`` picks."""
    tokens = sum(1 + (r["accepted_with"] if run(r) else r["accepted_without"]) for r in rows)
    cost = sum(r["cost_with"] + r["head_cost"] if run(r) else r["cost_without"] for r in rows)
    return tokens / cost


def learn(rows: list[dict], signal: Callable[[dict], object]) -> dict:
    """Per bucket: run the head there when its mean gain beats its mean added cost at the rate the
    steps reach without the head."""
    buckets: dict = defaultdict(list)
    for r in rows:
        buckets[signal(r)].append(r)
    floor = rate(rows, lambda r: False)
    return {
        b: statistics.fmean(r["accepted_with"] - r["accepted_without"] for r in rs)
        > floor * statistics.fmean(r["cost_with"] + r["head_cost"] - r["cost_without"] for r in rs)
        for b, rs in buckets.items()
    }


def replay(rows: list[dict], signal: Callable[[dict], object], rule: dict) -> float:
    """The rule's tokens per cost over ``rows``, against never running the head (an unseen bucket
    runs the head)."""
    return rate(rows, lambda r: rule.get(signal(r), True)) / rate(rows, lambda r: False)


def evaluate(categories: dict[str, list[dict]]) -> dict:
    out: dict = {"policies": {}, "signals": {}}
    for name, rows in categories.items():
        never = rate(rows, lambda r: False)
        best = lambda r: (1 + r["accepted_with"]) / (r["cost_with"] + r["head_cost"]) > (1 + r["accepted_without"]) / r["cost_without"]
        out["policies"][name] = {"steps": len(rows), "always": rate(rows, lambda r: True) / never,
                                 "gate": rate(rows, lambda r: r["gate"]) / never,
                                 "sure": rate(rows, sure) / never, "per-step best": rate(rows, best) / never}
    for sig, signal in SIGNALS.items():
        cells = {}
        for name, rows in categories.items():
            others = [r for other, rs in categories.items() if other != name for r in rs]
            halves = [[r for r in rows if r["prompt"] % 2 == k] for k in (0, 1)]
            cells[name] = {
                "other category": replay(rows, signal, learn(others, signal)) if others else None,
                "other prompts": statistics.fmean(replay(halves[k], signal, learn(halves[1 - k], signal)) for k in (0, 1)),
                "in sample": replay(rows, signal, learn(rows, signal)),
            }
        out["signals"][sig] = cells
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("records", nargs="+", type=Path, help="head_worth.py --json files, one per category")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = ap.parse_args()
    categories = {p.stem: with_previous(json.loads(p.read_text())["steps"]) for p in args.records}
    figures = evaluate(categories)
    if args.json:
        print(json.dumps(figures, indent=1))
        return
    for name, p in figures["policies"].items():
        print(f"{name}: {p['steps']} steps; against never: always {p['always']:.3f}, gate {p['gate']:.3f}, sure {p['sure']:.3f}, per-step best {p['per-step best']:.3f}")
    print("\nrule learned per signal, replayed (against never): other category / other prompts / in sample")
    for sig, cells in figures["signals"].items():
        row = "  ".join(f"{name}: {c['other category'] or 0:.3f} / {c['other prompts']:.3f} / {c['in sample']:.3f}" for name, c in cells.items())
        print(f"  {sig:36s} {row}")


if __name__ == "__main__":
    main()
