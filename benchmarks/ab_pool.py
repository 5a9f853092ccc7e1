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

`ngspec bench -b B --rounds R --json-out` files run without groups (the CPU's batch runs) pool their
rounds: a round is one whole batch run per arm, its ratio the two arms' throughputs against that
round's vanilla run, and the pooled ratio is the rounds' geometric mean with Student's t interval
over them (`ngspec.bench.interval.rounds_interval`, what bench prints for one file). Every round
counts, also rounds of the same prompts in two files: the interval measures timing noise over a
fixed set of prompts, not prompt-to-prompt spread. Files of the two kinds do not pool together.

    python benchmarks/ab_pool.py res/b8-rag-3rounds.json res/b8-rag-5rounds.json --arm eagle+search --versus trie

`ngspec bench` files record their setup (model, device, host CPU, dtype, threads, torch, batch size,
new tokens, sampling, every drafter option: the EAGLE head, datastore, tree shape...). Files whose
setups differ are refused, the differences named (`--mixed` pools them anyway, and says so); their
prompts, category and rounds may differ. A setup key a file does not record (files written before
bench recorded it) is not compared, and the report names the files that record none.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from statistics import geometric_mean

from ngspec.bench.interval import ratio_interval, rounds_interval, throughput_ratio

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


def bench_arms(data: dict, arm: str, versus: str, name: str) -> dict[str, dict]:
    """A `ngspec bench -b` result's arms by label, ``arm`` and ``versus`` among them."""
    arms = {a["arm"]: a for a in data["arms"]}
    for a in (arm, versus):
        if a not in arms:
            raise SystemExit(f"{name}: no arm {a!r} (arms: {', '.join(arms)})")
    return arms


def bench_pairs(arms: dict[str, dict], env: dict, arm: str, versus: str, name: str) -> tuple[list[Run], list[Run], list[str]]:
    """The same as `pairs` for a `ngspec bench -b --interleave-batches` result (``arms``, its
    ``environment``): its arms' group runs, round after round, keyed by category, batch size and group."""
    if "group_runs" not in arms[versus]:
        raise SystemExit(f"{name}: {arm!r} ran in groups and {versus!r} did not: nothing to pair")
    runs = {a: [tuple(g) for rnd in arms[a]["group_runs"] for g in rnd] for a in (arm, versus)}
    keys = [f"{env.get('category')}:b{env.get('batch_size')}:group {g}" for rnd in arms[arm]["group_runs"] for g in range(len(rnd))]
    return runs[arm], runs[versus], keys


def bench_rounds(arms: dict[str, dict], arm: str, versus: str, name: str) -> list[float]:
    """A `ngspec bench -b` result run without groups: ``arm``'s throughput over ``versus``'s, round
    by round (each against the round's vanilla run, which both share)."""
    mine, theirs = arms[arm].get("round_speedups"), arms[versus].get("round_speedups")
    if not mine or not theirs or len(mine) != len(theirs) or min(mine + theirs) <= 0:
        raise SystemExit(f"{name}: no rounds of {arm!r} and {versus!r} to pair (not an ngspec bench -b --json-out file?)")
    return [a / b for a, b in zip(mine, theirs)]


def describe_rounds(label: str, ratios: list[float]) -> str:
    interval = rounds_interval(ratios)
    span = f"95% interval {interval[0]:.3f}-{interval[1]:.3f}x" if interval else "one round: no interval"
    above = sum(r > 1 for r in ratios)
    return f"{label}: {geometric_mean(ratios):.3f}x over {len(ratios)} round{'s' * (len(ratios) != 1)} ({above} above 1), {span}"


def describe(label: str, mine: list[Run], theirs: list[Run], keys: list[str]) -> str:
    interval = ratio_interval(mine, theirs, keys=keys)
    span = f"95% interval {interval[0]:.3f}-{interval[1]:.3f}x" if interval else "one prompt: no interval"
    n = len(set(keys))
    return f"{label}: {throughput_ratio(mine, theirs):.3f}x over {n} prompt{'s' * (n != 1)} or groups ({len(mine)} pairs), {span}"


SETUP = ("model", "device", "cpu", "torch_threads", "dtype", "torch", "transformers", "cudnn_attention", "max_new_tokens", "batch_size",
         "interleave_batches", "temperature", "top_p", "top_k", "drafting")  # what a pooled file must share
GRAPHS = ("target_graphs", "batch_target_graphs")  # reports that vary by run: only whether they ran counts


def setup_of(env: dict) -> dict:
    """A bench file's setup (``environment``) flattened: ``drafting.eagle_head`` and the like."""
    out = {}
    for key in SETUP:
        if isinstance(value := env.get(key), dict):
            out.update({f"{key}.{k}": v for k, v in value.items()})
        elif key in env:
            out[key] = value
    if "drafting" in env:  # files that record their drafting record their graphs' presence too
        out.update({key: key in env for key in GRAPHS})
    return out


def setup_differences(setups: list[tuple[str, dict]]) -> list[str]:
    """Each setup key whose value differs between the files that record it, with the first file of
    each value."""
    seen: dict[str, dict] = {}  # key: {value as text: first file with it}
    for name, setup in setups:
        for k, v in setup.items():
            seen.setdefault(k, {}).setdefault(repr(v), (name, v))
    return [f"{k} " + " against ".join(f"{v} ({name})" for name, v in values.values()) for k, values in seen.items() if len(values) > 1]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="+", type=Path, help="reader_ab.py or ngspec bench -b --json-out files")
    ap.add_argument("--arm", default="whole")
    ap.add_argument("--versus", default="trie")
    ap.add_argument("--mixed", action="store_true", help="pool bench files whose setups differ (head, datastore, host...)")
    args = ap.parse_args(argv)
    mine: list[Run] = []
    theirs: list[Run] = []
    keys: list[str] = []
    ratios: list[float] = []  # bench -b files without groups: one ratio a round
    unkeyed = []
    setups = []  # bench files' (name, setup)
    for path in args.files:
        try:
            results = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise SystemExit(f"{path}: cannot read reader_ab results ({exc})") from None
        if isinstance(results.get("arms"), list):  # ngspec bench -b --json-out
            setups.append((str(path), setup_of(results.get("environment", {}))))
            arms = bench_arms(results, args.arm, args.versus, str(path))
            if "group_runs" not in arms[args.arm]:  # run without groups: pooled by rounds
                rounds = bench_rounds(arms, args.arm, args.versus, str(path))
                print(describe_rounds(f"{args.arm} vs {args.versus}, {path}", rounds))
                ratios += rounds
                continue
            a, b, k = bench_pairs(arms, results.get("environment", {}), args.arm, args.versus, str(path))
        else:
            a, b, k = pairs(results, args.arm, args.versus, str(path))
        if k is None:  # every pair a prompt of its own
            unkeyed.append(str(path))
            k = [f"{path}#{i}" for i in range(len(a))]
        print(describe(f"{args.arm} vs {args.versus}, {path}", a, b, k))
        mine += a
        theirs += b
        keys += k
    if diffs := setup_differences(setups):
        if not args.mixed:
            raise SystemExit("these files ran different setups: " + "; ".join(diffs) + ". Pool files of one setup, or give --mixed")
        print("note: pooled across different setups (--mixed): " + "; ".join(diffs))
    if ratios and mine:
        raise SystemExit("these files mix bench -b runs without groups (pooled by rounds) with runs pooled by prompts or groups: pool each kind on its own")
    if len(args.files) > 1 and ratios:
        print(describe_rounds(f"{args.arm} vs {args.versus}, pooled", ratios))
    elif len(args.files) > 1:
        print(describe(f"{args.arm} vs {args.versus}, pooled", mine, theirs, keys))
        if unkeyed:
            print(f"note: {', '.join(unkeyed)} hold no prompt keys (written before reader_ab kept them): each of their pairs "
                  "counted as a prompt of its own, so pooled files that ran the same prompts read narrower than they are")
    unrecorded = [name for name, setup in setups if not any(k.startswith("drafting.") for k in setup)]
    if len(args.files) > 1 and unrecorded:
        print(f"note: {', '.join(unrecorded)} record no drafting setup (written before bench recorded it): pooled "
              "without checking that they ran the same head, datastore and shape as the others")


if __name__ == "__main__":
    main(sys.argv[1:])
