"""How much ngspec slows when other processes share its CPU cores, and what helps: the main
command timed alone and beside a neighbour, under each OpenMP setting; then, with `--bench`, what
a neighbour does to `ngspec bench`'s ratios.

    python benchmarks/shared_cores.py -n 32 --rounds 2 --bench

Neighbours (started first, left running while the measured command runs, then killed):
  none     the machine otherwise idle
  ngspec   the same `ngspec generate` in a loop, under the same setting (two users of one box)
  spin     one pure-Python busy loop (one core of other work that takes no OpenMP threads)
Settings, each given to the measured command and its ngspec neighbour alike: default (torch's
threads as they come: one per core, GNU OpenMP's waiting policy), OMP_WAIT_POLICY=PASSIVE
(idle workers sleep instead of spinning), OMP_NUM_THREADS=1; and on request GOMP_SPINCOUNT
1,000, 3,000, 10,000 or 30,000 (spin that long, then sleep; settings spin1k ... spin30k).

Prints one JSON line per measured run (tokens/s, and the share of the CPUs other processes used
as ngspec itself recorded it) and a table of median tokens/s; the tokens must be the same in
every cell. With `--bench`: `ngspec bench -d trie` alone and beside the ngspec neighbour, default
setting, and the speedups each reports.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

NGSPEC = [str(Path(sys.executable).parent / "ngspec")]  # the console script beside this Python
SETTINGS = {
    "default": {}, "passive": {"OMP_WAIT_POLICY": "PASSIVE"}, "threads1": {"OMP_NUM_THREADS": "1"},
    # GNU OpenMP's spin before sleeping, shortened (default 300,000 waits): not in the default list
    **{f"spin{n}k": {"GOMP_SPINCOUNT": str(1000 * n)} for n in (1, 3, 10, 30)},
}
NEIGHBOURS = ("none", "ngspec", "spin")
WARM_UP = 8.0  # seconds a neighbour runs before the measured command starts (an ngspec one loads its model first)


def env_for(setting: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS", "GOMP_SPINCOUNT")}
    return env | SETTINGS[setting]


def start_neighbour(kind: str, setting: str, generate: list[str]) -> subprocess.Popen | None:
    if kind == "none":
        return None
    if kind == "spin":
        code = "while True: pass"
    else:  # the same command, again and again
        code = f"import subprocess\nwhile True: subprocess.run({generate!r}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)"
    proc = subprocess.Popen([sys.executable, "-c", code], env=env_for(setting), start_new_session=True)
    time.sleep(WARM_UP)
    return proc


def stop(proc: subprocess.Popen | None) -> None:
    if proc is not None:
        os.killpg(proc.pid, 9)
        proc.wait()


def measured_generate(generate: list[str], setting: str, neighbour: str) -> dict:
    proc = start_neighbour(neighbour, setting, generate)
    try:
        out = subprocess.run(generate, env=env_for(setting), capture_output=True, text=True, check=True).stdout
    finally:
        stop(proc)
    *records, last = [json.loads(line) for line in out.strip().splitlines()]
    summary = last.get("batch", last)  # with --batch-size: the batch's summary after each prompt's record
    tokens = [r["token_ids"] for r in records] if "batch" in last else last["token_ids"]
    return {"setting": setting, "neighbour": neighbour, "tokens_per_second": round(summary["tokens_per_second"], 2),
            "others_cpu_share": summary.get("others_cpu_share"), "tokens": tokens}  # none for a run too short to tell


def measured_bench(bench: list[str], neighbour: str, generate: list[str]) -> dict:
    proc = start_neighbour(neighbour, "default", generate)
    try:
        report = json.loads(subprocess.run(bench, env=env_for("default"), capture_output=True, text=True, check=True).stdout)
    finally:
        stop(proc)
    return {"neighbour": neighbour, "others_cpu_share": report["environment"].get("others_cpu_share"),
            "speedups": {a["arm"]: round(a["speedup"], 3) for a in report["arms"]},
            "tokens_per_second": {a["arm"]: round(a["tokens_per_second"], 2) for a in report["arms"]}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-p", "--prompt-file", default="examples/rag_ngspec.txt")
    ap.add_argument("--limit", type=int, help="the first N prompts of a .jsonl")
    ap.add_argument("-b", "--batch-size", type=int, default=1)
    ap.add_argument("-m", "--model", default="default")
    ap.add_argument("-n", "--max-new-tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=1, help="every cell this many times, cells interleaved")
    ap.add_argument("--settings", default="default,passive,threads1", help=f"of: {', '.join(SETTINGS)}")
    ap.add_argument("--neighbours", default=",".join(NEIGHBOURS))
    ap.add_argument("--bench", action="store_true", help="also ngspec bench alone and beside an ngspec neighbour")
    ap.add_argument("--questions", default="../shared/data/spec_bench/question.jsonl", help="--bench's questions")
    ap.add_argument("--out", type=Path, help="also write every line here (JSON lines)")
    args = ap.parse_args()
    generate = NGSPEC + ["generate", "-p", args.prompt_file, "-n", str(args.max_new_tokens), "-b", str(args.batch_size), "--model", args.model, "--json"]
    if args.limit is not None:
        generate += ["--limit", str(args.limit)]
    settings, neighbours = args.settings.split(","), args.neighbours.split(",")
    lines = []

    def emit(row: dict) -> None:
        lines.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "tokens"}), flush=True)

    for _ in range(args.rounds):
        for setting in settings:
            for neighbour in neighbours:
                emit(measured_generate(generate, setting, neighbour))
    same = len({json.dumps(r["tokens"]) for r in lines}) == 1
    print(f"\ntokens/s, median of {args.rounds} (others' CPU share as ngspec recorded it); tokens the same in every run: {same}")
    print("setting   | " + " | ".join(f"{n:>16}" for n in neighbours))
    for setting in settings:
        cells = []
        for neighbour in neighbours:
            runs = [r for r in lines if r["setting"] == setting and r["neighbour"] == neighbour]
            shares = [r["others_cpu_share"] for r in runs if r["others_cpu_share"] is not None]
            share = f" ({statistics.median(shares):.0%})" if shares else ""
            cells.append(f"{statistics.median(r['tokens_per_second'] for r in runs):.1f}{share}")
        print(f"{setting:9} | " + " | ".join(f"{c:>16}" for c in cells))
    if args.bench:
        bench = NGSPEC + ["bench", "-q", args.questions, "--category", "rag", "--limit", "2", "-n", str(args.max_new_tokens), "-d", "trie", "--model", args.model, "--json"]
        for neighbour in ("none", "ngspec"):
            emit(measured_bench(bench, neighbour, generate))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text("".join(json.dumps(r) + "\n" for r in lines))
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
