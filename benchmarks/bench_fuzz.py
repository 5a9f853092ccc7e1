"""A random search over `ngspec bench`'s command line on a real model, run in process.

`cli_fuzz.py` draws `generate`'s options; this draws bench's around them: one to three drafters
(vanilla among them at times), batches, rounds, interleaved batch groups,
`--verify both`, `--turns`, `--versus` (an arm the run has, or one it lacks), a (k, w) grid for the
row drafters, `--category`/`--per-category`/`--limit`, sampling, `--raw`, and the report files
(`--json-out`, `--markdown`, `--plots`; in a fifth of the runs one of them a path that cannot be
written, which must be refused before the model loads). The prompt files are cli_fuzz's (`prompt_files`: CJK and
emoji, a prompt longer than the context window, MT-bench's two turns, a chat with a system
message, Spec-Bench's rag and summarization questions). A run passes when it

- exits 0, every arm that reports an exact match reports 1.0 (bench checks each arm's tokens
  against plain decoding: transformers' greedy, or vanilla's sampling with the same seed) and, at
  batch size 1, those arms report the same number of tokens, no arm reports a near-tie (there are none in float32 on a CPU), and the report files it asked for are
  written (`--json-out` holding the report printed with `--json`); or
- exits 1 with ngspec's own one-line error, or is refused as a usage error (exit 2),

and prints no traceback and no refusal in Python's words. Anything else is a finding, written with
its command line.

    python benchmarks/bench_fuzz.py --runs 40 --eagle-head heads/untrained \\
        --datastore datastores/fuzz-self --out bench-out/bench_fuzz

Runs are fixed by (seed, run number), so `--first N` continues a search past runs made before.
"""

from __future__ import annotations

import json
import random
import sys
import tempfile
import time
from pathlib import Path

from cli_fuzz import judge, prompt_files, search_options  # the script beside this one
from ngspec.drafters import REGISTRY, ROW_DRAFTERS

DRAFTERS = list(REGISTRY)  # a drafter added to ngspec is drawn too


def draw(rng: random.Random, files: list[Path], head: str | None, datastore: str | None, folder: Path) -> list[str]:
    """One random `bench` command line."""
    drafters = rng.sample([d for d in DRAFTERS if head or d not in ("eagle", "eagle+search")], rng.choice([1, 1, 2, 3]))
    batch = rng.choice([1, 1, 2, 3])
    questions = rng.choice(files)
    args = ["bench", "--json", "-q", str(questions), "-d", ",".join(drafters), "-n", str(rng.choice([1, 4, 8, 16])), "-b", str(batch)]
    if "spec_bench" in questions.name and rng.random() < 0.5:
        args += rng.choice([["--category", rng.choice(["rag", "summarization", "coding"])], ["--per-category", "1"]])
    args += ["--limit", str(rng.choice([1, 2, 3]))]
    if rng.random() < 0.3:
        args += ["--turns", rng.choice(["all", "first"])]
    if rng.random() < 0.15:
        args.append("--raw")
    if rng.random() < 0.3:  # batches verify trees only (refused otherwise, as tests/test_cli.py checks)
        args += ["--verify", rng.choice(["tree", "rows", "both"] if batch == 1 else ["tree"])]
    if batch > 1:
        if rng.random() < 0.5:
            args += ["--rounds", str(rng.choice([1, 2, 3]))]
        if rng.random() < 0.4:
            args += ["--interleave-batches", str(rng.choice([0, 1, 2]))]
    elif rng.random() < 0.3:
        args += ["--rounds", str(rng.choice([1, 2]))]
    if rng.random() < 0.4:
        arms = drafters + ["vanilla"] + (["hf-greedy", "hf-prompt-lookup"] if batch == 1 else [])
        args += ["--versus", rng.choice(arms + ["hf-sample", "nope"])]
    if rng.random() < 0.15:
        args += ["--temperature", str(rng.choice([0.5, 1.0])), "--seed", str(rng.randrange(1000))]
        if rng.random() < 0.5:
            args += ["--top-k", str(rng.choice([1, 20]))]
    if rng.random() < 0.3:
        args += ["--json-out", str(folder / f"report-{rng.randrange(10**6)}.json")]
    if rng.random() < 0.3:
        args += ["--markdown", str(folder / f"report-{rng.randrange(10**6)}.md")]
    if any(d in ROW_DRAFTERS for d in drafters):
        args += ["--plots", str(folder / "plots")]
        if rng.random() < 0.6:
            args += ["--k", rng.choice(["1", "2", "1,2", "1..3"]), "--w", rng.choice(["1", "2", "1,3", "2..3"])]
    if "trie" in drafters and rng.random() < 0.3:
        args += ["--num-draft", str(rng.choice([1, 4, 32]))]
    if "prompt-lookup" in drafters and rng.random() < 0.3:
        args += ["--lookup-ngram", str(rng.choice([1, 3])), "--lookup-tokens", str(rng.choice([1, 10]))]
    if {"eagle", "eagle+search"} & set(drafters):
        args += ["--eagle-head", head]
        if rng.random() < 0.4:
            args += ["--tree", "dynamic", "--tree-top-k", str(rng.randrange(1, 9)), "--tree-depth", str(rng.randrange(1, 6)),
                     "--total-tokens", str(rng.choice([1, 8, 32]))]
        if rng.random() < 0.3:
            args += ["--draft-vocab", str(rng.choice([0, 64, 8192]))]
    if {"search", "eagle+search"} & set(drafters):
        if datastore and rng.random() < 0.7:
            args += ["--datastore", datastore]
        if rng.random() < 0.4:
            args += ["--search-depth", str(rng.choice([1, 8, 32]))]
        if "eagle+search" in drafters and rng.random() < 0.4:
            args.append("--deepen")
    return args


def bad_output(rng: random.Random, args: list[str], folder: Path) -> tuple[list[str], bool]:
    """``args`` with one report path made one that cannot be written (a folder given for a file, a
    file for a folder, a path under a file), and whether the run writes it (`--plots` only draws
    a grid's heatmaps). Drawn by its own generator, so the runs drawn before keep their lines."""
    blocker = folder / "a-file"
    blocker.write_text("")
    flag = rng.choice(["--json-out", "--markdown", "--plots"])
    bad = rng.choice([blocker, blocker / "sub"] if flag == "--plots" else [folder, blocker / "report"])
    if flag in args:
        args = args[: args.index(flag)] + args[args.index(flag) + 2 :]
    cells = [args[args.index(f) + 1] for f in ("--k", "--w") if f in args]
    grid = any(d in ROW_DRAFTERS for d in args[args.index("-d") + 1].split(",")) and any("," in c or ".." in c for c in cells)
    return [*args, flag, str(bad)], flag != "--plots" or grid


def check_report(args: list[str], output: str) -> str | None:
    """What is wrong with a finished run's report, or None: an arm whose tokens differ from plain
    decoding or that met a near-tie, or a report file asked for (or a sweep's heatmaps) missing or
    differing."""
    lines = [line for line in output.splitlines() if line.startswith("{")]
    if not lines:
        return "no JSON report on stdout"
    report = json.loads(lines[-1])
    arms = report.get("arms", [])
    if not arms:
        return "the report has no arms"
    wrong = [(a["arm"], a["exact_match"]) for a in arms if a.get("exact_match") is not None and a["exact_match"] != 1.0]
    if wrong:
        return f"arms not identical to plain decoding: {wrong}"
    tokens = {a["arm"]: a["tokens"] for a in arms if a.get("exact_match") == 1.0 and "tokens" in a}  # batch size 1 reports them
    if len(set(tokens.values())) > 1:
        return f"arms identical to plain decoding report different token counts: {tokens}"
    ties = [(a["arm"], a["largest_tie_margin"]) for a in arms if a.get("largest_tie_margin") is not None]
    if ties:
        return f"near-ties in float32 on a CPU: {ties}"
    if "--json-out" in args:
        written = Path(args[args.index("--json-out") + 1])
        if not written.is_file():
            return f"--json-out {written} was not written"
        if json.loads(written.read_text()).get("arms") != arms:
            return f"--json-out {written} holds other arms than the report printed"
    if "--markdown" in args:
        written = Path(args[args.index("--markdown") + 1])
        if not written.is_file() or not written.read_text().strip():
            return f"--markdown {written} was not written"
    drawn = [Path(p) for p in report.get("plots", [])]
    if len(drawn) != len(report.get("sweeps", [])) or not all(p.is_file() for p in drawn):
        return f"the sweeps' heatmaps {[str(p) for p in drawn]} were not all drawn, one per sweep: {report.get('sweeps')}"
    return None


def main() -> int:
    ns = search_options(__doc__.split("\n\n")[0], 40, "bench-out/bench_fuzz").parse_args()

    from typer.testing import CliRunner

    from ngspec.cli.app import app

    ns.out.mkdir(parents=True, exist_ok=True)
    runner = CliRunner()
    counts: dict[str, int] = {}
    with tempfile.TemporaryDirectory() as tmp, (ns.out / f"runs-{ns.seed}-{ns.first}.jsonl").open("w") as log:
        folder = Path(tmp)
        files = prompt_files(folder)
        for n in range(ns.first, ns.first + ns.runs):
            rng = random.Random(f"{ns.seed} {n} bench")
            args = draw(rng, files, ns.eagle_head, ns.datastore, folder)
            paths = random.Random(f"{ns.seed} {n} paths")
            written = False
            if paths.random() < 0.2:
                args, written = bad_output(paths, args, folder)
            if ns.model != "default":
                args += ["--model", ns.model]
            start = time.perf_counter()
            result = runner.invoke(app, args)
            verdict, detail = judge(result.exit_code, result.output, result.exception)
            if written and verdict not in ("FINDING", "refused") and (verdict == "ok" or "loading model" in result.output):
                verdict, detail = "FINDING", f"a report path that cannot be written was {'accepted' if verdict == 'ok' else 'refused only after the model loaded'}: {detail}"
            elif verdict == "ok" and (fault := check_report(args, result.stdout)):
                verdict, detail = "FINDING", fault
            elif verdict == "ok":
                detail = "report checked"
            counts[verdict] = counts.get(verdict, 0) + 1
            seconds = time.perf_counter() - start
            entry = {"run": n, "verdict": verdict, "detail": detail, "exit": result.exit_code, "seconds": round(seconds, 1), "args": args}
            log.write(json.dumps(entry, ensure_ascii=False) + "\n")
            log.flush()
            print(f"{n:5d} {verdict:12s} {seconds:6.1f}s  {detail[:110]}", flush=True)
            if verdict == "FINDING":
                print("      ngspec " + " ".join(args), flush=True)
    print(json.dumps(counts))
    return 1 if counts.get("FINDING") else 0


if __name__ == "__main__":
    sys.exit(main())
