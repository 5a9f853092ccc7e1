"""Every ngspec command that writes, run on a disk that fills: does each say so in one line, and
lose nothing (rule 6)?

    sudo .venv/bin/python benchmarks/full_disk.py --out bench-out/full_disk

Each case mounts a fresh tmpfs (``--size``, 200 KiB by default), fills it with a file until only
so much room is left (each of ``--free``, 0, 32 KiB and 128 KiB by default: the write then fails
at a different stage of the writer, or not at all), and once more with room but no inode left
(``nr_inodes=1``: no file or directory can be made, which the OS also calls "No space left on
device"), and runs one command writing there, in a process of its own, on a tiny random Llama saved with the default model's tokenizer (built
once, outside the tmpfs). A run passes when the command either

- finishes (exit 0) with its output whole where it was asked for, or
- exits with the code the case expects (1 for a write that cannot finish; 0 where the write is
  only a cache, which must then warn) and says so in ngspec's words: its ``error:`` or
  ``warning:`` line matches the case's pattern (the path it could not write, "No space left on
  device"), with no traceback, no offer of one and no library's words ("enforce fail",
  "requested and", "SafetensorError"),

and in both cases leaves on the tmpfs only its output, or what the case allows after a failure
(an interrupted `train-eagle` run's folder, kept for the resume; `synth-corpus`'s complete
records in NAME.partial.jsonl, every line a whole record; the files a command's message says it
wrote whole before the one that failed), never a temporary (``.NAME.tmp-...``) or a half-written
output. When `synth-corpus` kept records, the disk is freed and the same command
run again: it must continue from them and finish.

A run that fails prints what it saw; the exit code is the number of failed runs. It needs root (to
mount) and Linux; without them it says so and exits 2. The cases are those checked by hand on
2026-12-07 (BENCHMARKS.md 10zzzj); this script keeps them from regressing (10zzzk).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NGSPEC = [sys.executable, "-c", "import sys; from ngspec.cli.app import main; sys.argv[0] = 'ngspec'; sys.exit(main())"]
TEMPORARY = re.compile(r"\..+\.tmp-")
LIBRARY_WORDS = re.compile(r"Traceback|enforce fail|requested and \d+ written|SafetensorError|os error 28|NGSPEC_DEBUG")


@dataclass
class Case:
    name: str
    args: list[str]  # T stands for the tmpfs, M for the tiny model
    says: str  # a pattern the error (or warning) line must match
    out: str  # what it writes when it finishes (T/...)
    more_free: tuple[int, ...] = ()  # room to leave besides --free's, where this writer fails part way
    rc: int = 1
    keeps: list[str] = field(default_factory=list)  # what may stay on the tmpfs (patterns, relative)
    env: dict[str, str] = field(default_factory=dict)
    then_free: str | None = None  # after records were kept, run again on the freed disk; this must be in its output


def cases(questions: Path, prompts: Path, corpus: Path) -> list[Case]:
    full = r"No space left on device: T/"
    bench = ["bench", "-q", str(questions), "--limit", "1", "-n", "8", "-d", "bigram", "--model", "M", "--plots", "T/plots"]
    return [
        Case("build-datastore", ["build-datastore", "--corpus", str(corpus), "--model", "M", "--out", "T/ds"], full + "ds$", "ds"),
        Case("build-bigram", ["build-bigram", "--model", "M", "--out", "T/t.npz"], full + "t.npz$", "t.npz"),
        Case("train-eagle", ["train-eagle", "--model", "M", "--corpus", str(corpus), "--max-records", "40", "--holdout", "2", "--epochs", "1", "--out", "T/head"],
             full + r"head/", "head/model.safetensors", keeps=[r"head(/.*)?"]),
        Case("train-eagle, few records", ["train-eagle", "--model", "M", "--corpus", str(corpus), "--max-records", "4", "--holdout", "1", "--epochs", "1",
                                          "--out", "T/head"], full + r"head", "head/model.safetensors", keeps=[r"head(/.*)?"]),  # its features fit
        Case("tune-tree", ["tune-tree", "--model", "M", "-q", str(questions), "--limit", "1", "-n", "8", "--eagle-head", "M/head", "--nodes", "8",
                           "--out", "T/shape.json"], full + "shape.json; the tuned shape is the JSON record on stdout", "shape.json"),
        Case("synth-corpus", ["synth-corpus", "--model", "M", "--prompts", str(prompts), "-n", "400", "--out", "T/c.jsonl"],
             r"(stopped \(No space left on device, writing T/c.jsonl\) after \d+ records?; (they are|it is) in T/c.partial.jsonl"
             r"|No space left on device: T/c.jsonl$)", "c.jsonl", more_free=(8192,),  # the second: not one record fitted
             keeps=[r"c\.partial\.jsonl"], then_free="continuing an interrupted run"),
        Case("bench --plots", [*bench, "--k", "1,2", "--w", "1,2"], full + r"plots/bench-bigram-\w+\.png$", "plots/bench-bigram-tree.png", keeps=["plots"]),
        Case("bench --json-out", [*bench, "--json-out", "T/r.json"], full + r"r.json$", "r.json", keeps=["plots"]),
        Case("bench --markdown", [*bench, "--markdown", "T/r.md"], full + r"r.md$", "r.md", keeps=["plots"]),
        Case("profile-bound --out", ["profile-bound", "--model", "M", "--k", "1", "--w", "1,2", "--context", "16", "--repeats", "1", "--out", "T/prof"],
             full + r"prof/", "prof", keeps=["prof"]),
        Case("default model into the cache", ["generate", "-p", "examples/rag_ngspec.txt", "-n", "4"],
             r"cannot convert the default model into ngspec's cache \(No space left on device: T/cache/.*\); it takes about \d+ MB", "cache/models",
             env={"NGSPEC_CACHE": "T/cache"}, keeps=[r"cache(/.*)?"]),
        Case("a cache that cannot be written", ["generate", "--model", "M", "-p", "examples/rag_ngspec.txt", "-n", "8", "-d", "mixed"],
             r"warning: cannot write .*\(No space left on device", "cache", rc=0, env={"NGSPEC_CACHE": "T/cache"}, keeps=[r"cache(/.*)?"]),
    ]


def tiny_model(where: Path) -> None:
    from ngspec import models
    from ngspec.eagle.head import save_head

    sys.path.insert(0, str(ROOT / "tests"))
    from conftest import started_head  # the tests' untrained head, for tune-tree

    tok = models.load_tokenizer()
    model = models.tiny_model("llama", seed=0, vocab_size=len(tok))
    model.save_pretrained(where)
    tok.save_pretrained(where)
    save_head(started_head(model), where / "head")


def fill(disk: Path, free: int) -> None:
    """Write a file on ``disk`` until about ``free`` bytes are left (whole blocks)."""
    stat = os.statvfs(disk)
    room = stat.f_bavail * stat.f_frsize - free
    with open(disk / "fill", "wb") as handle:
        while room > 0:
            try:
                handle.write(b"\0" * min(room, 1 << 16))
                handle.flush()
            except OSError:
                break
            room -= 1 << 16


def mounted(disk: Path, size: str, inodes: bool = True) -> None:
    """A tmpfs at ``disk``; without ``inodes`` its root takes its only inode, so that no file or
    directory can be made there (a disk out of inodes says ENOSPC too)."""
    disk.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}" + ("" if inodes else ",nr_inodes=1"), "tmpfs", str(disk)], check=True)


def unmount(disk: Path) -> None:
    subprocess.run(["umount", str(disk)], check=False)


def left_on(disk: Path) -> list[str]:
    return sorted(str(p.relative_to(disk)) for p in disk.rglob("*") if p.name != "fill")


def run(case: Case, disk: Path, model: Path, env: dict[str, str]) -> tuple[int, str, float]:
    """Run the case's command; its exit code, its stderr and its wall time."""
    swap = {"T": str(disk), "M": str(model)}
    args = [re.sub(r"^(T|M)(?=/|$)", lambda m: swap[m[1]], a) for a in case.args]
    full_env = {**env, **{k: re.sub(r"^T(?=/|$)", str(disk), v) for k, v in case.env.items()}}
    start = time.perf_counter()
    done = subprocess.run([*NGSPEC, *args], cwd=ROOT, env=full_env, capture_output=True, text=True, timeout=900)
    return done.returncode, done.stderr, time.perf_counter() - start


NO_INODES = r"(error|warning): cannot (write|create|convert) (?=.*T/).*No space left on device"  # refused at the first file or directory


def judge(case: Case, disk: Path, rc: int, stderr: str, inodes: bool = True) -> list[str]:
    """What is wrong with one run (empty: it passed); ``inodes`` False: on a disk with none left."""
    faults = []
    said = " ".join(stderr.split()).replace(str(disk), "T")  # Rich may wrap a long line
    says = case.says if inodes else NO_INODES
    finished = rc == 0 and case.rc != 0
    if rc not in ((0, case.rc) if inodes else (case.rc,)):
        faults.append(f"exit code {rc}, expected {'0 or ' if inodes else ''}{case.rc}")
    elif finished and not (disk / case.out).exists():
        faults.append(f"exit code 0 and no {case.out}")
    elif not finished and (case.rc != 0 or "warning: cannot write" in said or not inodes) and not re.search(says.replace("$", r"(\s|$)"), said):
        faults.append(f"no line matching {says!r}")
    if LIBRARY_WORDS.search(stderr):
        faults.append(f"a library's words, a traceback or an offer of one: {LIBRARY_WORDS.search(stderr)[0]!r}")
    kept = re.search(r"; written whole before it: (.*)", said)  # a command's files written before the one that failed stay
    kept = {re.sub(r"^T/", "", path) for path in kept[1].split(", ")} if kept else set()
    for name in left_on(disk):
        if TEMPORARY.search(name):
            faults.append(f"a temporary left behind: {name}")
        elif not (any(re.fullmatch(keep, name) for keep in case.keeps) or name in kept
                  or (rc == 0 and (name == case.out or name.startswith(case.out + "/") or case.out.startswith(name + "/")))):
            faults.append(f"left behind: {name}")
    for partial in disk.glob("*.partial.jsonl"):
        for number, line in enumerate(partial.read_bytes().splitlines(), 1):
            try:
                json.loads(line)
            except ValueError:
                faults.append(f"{partial.name} line {number} is not a whole record")
    return faults


def again_on_a_freed_disk(case: Case, disk: Path, model: Path, env: dict[str, str]) -> list[str]:
    """Free the disk and run the same command: it must continue from the records kept and finish."""
    (disk / "fill").unlink()
    rc, stderr, _ = run(case, disk, model, env)
    if rc != 0:
        return [f"run again on a freed disk: exit code {rc}: {stderr.strip()[-300:]}"]
    if case.then_free not in " ".join(stderr.split()):
        return [f"run again on a freed disk: no {case.then_free!r}"]
    if left_on(disk) != [case.out]:
        return [f"run again on a freed disk: left {left_on(disk)}"]
    return []


def sizes(text: str) -> list[int]:
    return [int(float(v[:-1]) * 1024) if v.lower().endswith("k") else int(v) for v in text.split(",") if v]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="200k", help="the tmpfs's size (tmpfs's size= option)")
    parser.add_argument("--free", default="0,32k,128k", help="room left on the tmpfs before each run, in bytes or KiB (comma-separated)")
    parser.add_argument("--only", help="run only the cases whose name holds one of these words (comma-separated)")
    parser.add_argument("--out", type=Path, help="write the results as JSON here (a directory)")
    parser.add_argument("--questions", type=Path, default=ROOT / "ngspec/data/mt_bench.jsonl")
    args = parser.parse_args()
    if sys.platform != "linux" or os.geteuid() != 0:
        print("full_disk.py mounts a tmpfs: run it as root on Linux", file=sys.stderr)
        return 2
    if not args.questions.is_file():
        print(f"no question file at {args.questions} (give --questions)", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="ngspec-full-disk-"))
    results = []
    try:
        model = work / "model"
        tiny_model(model)
        prompts = work / "prompts.jsonl"  # four instructions, one record each
        prompts.write_text("".join(json.dumps({"prompt": f"Write a long story about number {i}."}) + "\n" for i in range(4)))
        env = {k: v for k, v in os.environ.items() if not k.startswith("NGSPEC_")}
        env["NGSPEC_CACHE"] = str(work / "cache")  # the usual cache, off the tmpfs
        disk = work / "disk"
        only = [w for w in (args.only or "").split(",") if w]
        for case in cases(args.questions, prompts, ROOT / "corpora/smollm2-self.jsonl"):
            if only and not any(w in case.name for w in only):
                continue
            for free in [*sorted({*sizes(args.free), *case.more_free}), None]:  # None: room, but no inode left
                mounted(disk, args.size, inodes=free is not None)
                try:
                    if free is not None:
                        fill(disk, free)
                    rc, stderr, seconds = run(case, disk, model, env)
                    faults = judge(case, disk, rc, stderr, inodes=free is not None)
                    again = bool(case.then_free and not faults and list(disk.glob("*.partial.jsonl")))
                    if again:
                        faults += again_on_a_freed_disk(case, disk, model, env)
                finally:
                    unmount(disk)
                line = next((l for l in stderr.splitlines() if l.startswith(("error:", "warning: cannot"))), "finished" if rc == 0 else stderr.strip()[-200:])
                room = "no inode free" if free is None else f"{free // 1024} KiB free"
                print(f"{'PASS' if not faults else 'FAIL'}  {case.name}, {room} ({seconds:.1f} s): rc={rc}  {line[:150]}", flush=True)
                for fault in faults:
                    print(f"      {fault}")
                if faults:
                    print("      stderr: " + stderr.strip()[-800:].replace("\n", "\n              "))
                results.append({"case": case.name, "free": "no inode" if free is None else free, "args": case.args, "rc": rc, "continued": again, "seconds": round(seconds, 1),
                                "said": " ".join(stderr.split())[-600:], "faults": faults})
    finally:
        shutil.rmtree(work, ignore_errors=True)
    failed = sum(bool(r["faults"]) for r in results)
    print(f"{len(results) - failed} of {len(results)} runs passed ({sum(r['rc'] == 0 for r in results)} finished; "
          f"{sum(r['continued'] for r in results)} synth-corpus runs continued on the freed disk)")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "full_disk.json").write_text(json.dumps(results, indent=1) + "\n")
    return failed


if __name__ == "__main__":
    sys.exit(main())
