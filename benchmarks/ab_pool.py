"""One arm's speed against another's over several `reader_ab.py --json-out` files at once: each file's
ratio with its 95% interval, then all of them pooled (`ngspec.bench.interval.ratio_interval`). A
ratio from a few prompts says little; prompts from two categories, or from the same category on
two visits, pooled, say more.

    python benchmarks/ab_pool.py res/versus-b1-rag.json res/versus-b1-summarization.json --arm whole --versus trie

A prompt's pairs are resampled together, from every file that ran it (each run is keyed by its
category and question id), so a prompt run in two rounds or on two visits counts once, as one
prompt. Files written before reader_ab kept those keys count every pair as a prompt of its own:
pooling two such files that ran the same prompts reads narrower than the prompts justify (the
report says so). Batch runs pool their groups (`--interleave-batches`) the same way. Pool only
files from the same machine and setup.

`ngspec bench -b B --interleave-batches K --json-out` files pool too: each group of prompts (a
batch run of its own, every arm in turn on it) is one unit, keyed by the run's category, batch
size and group index, so two files that ran the same groups count each group once.

    python benchmarks/ab_pool.py res/sampled-b8-rag.json res/greedy-b8-rag.json --arm eagle+search --versus trie
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ngspec.bench.interval import ratio_interval, throughput_ratio

Run = tuple[float, float]


def pairs(results: dict, arm: str, versus: str, name: str) -> tuple[list[Run], list[Run], list[str] | None]:
    """The paired (tokens, seconds) runs of ``arm`` and ``versus`` in one reader_ab result, and
    their prompts' keys (None in files written before reader_ab kept them)."""
    for a in (arm, versus):
        if a not in results:
            raise SystemExit(f"{name}: no arm {a!r} (arms: {', '.join(results)})")
    mine, theirs = results[arm]["runs"], results[versus]["runs"]
    if not mine or len(mine) != len(theirs):
        raise SystemExit(f"{name}: no paired runs of {arm!r} and {versus!r} (a batch run without --interleave-batches?)")
    keys = results[arm].get("keys")
    return [tuple(r) for r in mine], [tuple(r) for r in theirs], keys if keys and len(keys) == len(mine) else None


def bench_pairs(data: dict, arm: str, versus: str, name: str) -> tuple[list[Run], list[Run], list[str]]:
    """The same for a `ngspec bench -b` result: its arms' group runs, round after round, keyed by
    category, batch size and group (a bench run without groups has no pairs to resample)."""
    arms = {a["arm"]: a for a in data["arms"]}
    for a in (arm, versus):
        if a not in arms:
            raise SystemExit(f"{name}: no arm {a!r} (arms: {', '.join(arms)})")
    if "group_runs" not in arms[arm] or "group_runs" not in arms[versus]:
        raise SystemExit(f"{name}: no group runs (a bench -b run without --interleave-batches, or of one group): nothing to pool")
    env = data.get("environment", {})
    runs = {a: [tuple(g) for rnd in arms[a]["group_runs"] for g in rnd] for a in (arm, versus)}
    keys = [f"{env.get('category')}:b{env.get('batch_size')}:group {g}" for rnd in arms[arm]["group_runs"] for g in range(len(rnd))]
    return runs[arm], runs[versus], keys


def describe(label: str, mine: list[Run], theirs: list[Run], keys: list[str]) -> str:
    interval = ratio_interval(mine, theirs, keys=keys)
    span = f"95% interval {interval[0]:.3f}-{interval[1]:.3f}x" if interval else "one prompt: no interval"
    n = len(set(keys))
    return f"{label}: {throughput_ratio(mine, theirs):.3f}x over {n} prompt{'s' * (n != 1)} or groups ({len(mine)} pairs), {span}"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="+", type=Path, help="reader_ab.py or ngspec bench -b --json-out files")
    ap.add_argument("--arm", default="whole")
    ap.add_argument("--versus", default="trie")
    args = ap.parse_args(argv)
    mine: list[Run] = []
    theirs: list[Run] = []
    keys: list[str] = []
    unkeyed = []
    for path in args.files:
        try:
            results = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise SystemExit(f"{path}: cannot read reader_ab results ({exc})") from None
        if isinstance(results.get("arms"), list):  # ngspec bench -b --json-out
            a, b, k = bench_pairs(results, args.arm, args.versus, str(path))
        else:
            a, b, k = pairs(results, args.arm, args.versus, str(path))
        if k is None:  # every pair a prompt of its own
            unkeyed.append(str(path))
            k = [f"{path}#{i}" for i in range(len(a))]
        print(describe(f"{args.arm} vs {args.versus}, {path}", a, b, k))
        mine += a
        theirs += b
        keys += k
    if len(args.files) > 1:
        print(describe(f"{args.arm} vs {args.versus}, pooled", mine, theirs, keys))
        if unkeyed:
            print(f"note: {', '.join(unkeyed)} hold no prompt keys (written before reader_ab kept them): each of their pairs "
                  "counted as a prompt of its own, so pooled files that ran the same prompts read narrower than they are")


if __name__ == "__main__":
    main(sys.argv[1:])
