"""A random search over `ngspec generate`'s command line on a real model, run in process.

Each run draws a drafter and the options around it (batch size and layout, budget, prompt file
(a fifth of the .jsonl files given as the same records in a .json array, and a fifth of them all
fed through standard input as `-p -`),
stop strings, --raw, --turns, verify layout, sizing, compaction, joint prefill, sampling, EAGLE's
tree, draft vocabulary and int8 or float32 head, datastore, search depth, deepening, the trie's
and row drafters' options) and runs `generate --json --check`. A run passes when it

- exits 0 and every row it printed is identical to plain decoding (`greedy_check`) and kept to
  its stop strings (`stop_fault`), or
- exits 1 with ngspec's own one-line error (rows that ran before or beside a failed prompt are
  still checked), or is refused as a usage error (exit 2),

and prints no traceback. Anything else, an unexpected exception named with "set NGSPEC_DEBUG=1",
another exit code or a row that differs, is a finding, written with its command line.

    python benchmarks/cli_fuzz.py --runs 100 --seed 0 --eagle-head heads/amd-v41 \\
        --datastore datastores/shipped --out bench-out/cli_fuzz

Runs are fixed by (seed, run number), so `--first N` continues a search past runs made before.
The 10zj search (559 runs, session 43) found two bugs this way; this one adds the options added
since (`--prefill-tokens`, `--turns`, `--size-rows-alone`, sampling under `--check`, chat records).
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import re
import resource
import sys
import tempfile
import time
from pathlib import Path

from input_fuzz import PYTHON_WORDS  # the script beside this one
from ngspec.drafters import REGISTRY, ROW_DRAFTERS
from ngspec.perf.memory import release_free_memory, resident_gb

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data"

DRAFTERS = list(REGISTRY)  # a drafter added to ngspec is drawn too
# as a shell passes them: a real newline, and typed escapes (`--stop '\n'`: a backslash and an n) that ngspec reads as one
STOPS = ["\n", ",", ".", " the", "ngspec", "。", "🐱", "<|im_start|>", "<|im_end|>", "--", "1.", "\n\n", "trie ", "\\n", "\\n\\n", ".\\n", "\\t", "\\\\"]


def prompt_files(folder: Path) -> list[Path]:
    """The shipped examples, and .jsonl files that mix what users feed: CJK and emoji, a prompt
    longer than the context window, a two-turn question, a chat with a system message, "Hi".
    Each .jsonl has a twin in ``folder`` holding its records as a .json array (`json_twin`)."""
    files = sorted((ROOT / "examples").glob("*.txt")) + [ROOT / "examples" / "prompts.jsonl"]
    rag = (ROOT / "examples" / "rag_ngspec.txt").read_text()
    cjk = "猫は🐱です。请用中文回答：什么是推测解码？ Réponds aussi en français. " * 3
    records = {
        "mixed": [{"prompt": cjk}, {"prompt": "Hi"}, {"prompt": rag}],
        "long": [{"prompt": "Hi"}, {"prompt": "word " * 9000}, {"prompt": "Count from 1 to 30, separated by commas."}],
        "chat": [{"messages": [{"role": "system", "content": "Answer in one sentence."}, {"role": "user", "content": "What is a suffix array?"}]},
                 {"prompt": "List three prime numbers."}],
    }
    if (SHARED / "mt_bench" / "question.jsonl").is_file():
        rows = [json.loads(line) for line in (SHARED / "mt_bench" / "question.jsonl").read_text().splitlines()[:2]]
        records["turns"] = [{"turns": r["turns"]} for r in rows]
    if (SHARED / "spec_bench" / "question.jsonl").is_file():
        rows = [json.loads(line) for line in (SHARED / "spec_bench" / "question.jsonl").read_text().splitlines()]
        records["spec_bench"] = [r for r in rows if r.get("category") in ("rag", "summarization")][:3]
    for name, recs in records.items():
        path = folder / f"{name}.jsonl"
        path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in recs))
        files.append(path)
    for path in files:
        if path.suffix == ".jsonl":
            recs = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
            json_twin(path, folder).write_text(json.dumps(recs, ensure_ascii=False, indent=1))
    return files


def json_twin(path: Path, folder: Path) -> Path:
    """Where `prompt_files` wrote a .jsonl file's records as one .json array."""
    return folder / f"{path.stem}.json"


def draw(rng: random.Random, files: list[Path], head: str | None, datastore: str | None, shape: str | None, folder: Path) -> list[str]:
    """One random command line."""
    drafter = rng.choice([d for d in DRAFTERS if head or d not in ("eagle", "eagle+search")])
    batch = rng.choice([1, 1, 2, 3])
    args = ["generate", "--json", "--check", "-d", drafter, "-p", str(rng.choice(files)), "-n", str(rng.choice([1, 2, 5, 16, 32, 48])), "-b", str(batch)]
    if rng.random() < 0.3:
        args += ["--limit", str(rng.randrange(1, 4))]
    for stop in rng.sample(STOPS, rng.choice([0, 0, 1, 2])):
        args += ["--stop", stop]
    if rng.random() < 0.15:
        args.append("--raw")
    if rng.random() < 0.25:
        args += ["--turns", rng.choice(["all", "first"])]
    if batch == 1 and rng.random() < 0.3:
        args += ["--verify", "rows"]
    if batch > 1:
        if rng.random() < 0.4:
            args += ["--batch-layout", rng.choice(["padded", "packed"])]
        if rng.random() < 0.4:
            args += ["--rearrange-every", str(rng.choice([0, 1, 2, 8]))]
        if rng.random() < 0.3:
            args += ["--rearrange-min-share", str(rng.choice([0.0, 0.2, 0.9]))]
        if rng.random() < 0.4:
            args += ["--prefill-tokens", str(rng.choice([0, 16, 64, 100000]))]
        if rng.random() < 0.3:
            args.append("--size-rows-alone")
    kind = rng.random()
    if kind < 0.15:
        args += ["--temperature", str(rng.choice([0.3, 0.7, 1.0])), "--seed", str(rng.randrange(1000))]
        if rng.random() < 0.5:
            args += ["--top-p", str(rng.choice([0.5, 0.9]))]
        if rng.random() < 0.5:
            args += ["--top-k", str(rng.choice([1, 5, 40]))]
    elif kind < 0.2:  # reduces to greedy
        args += ["--temperature", "0.8", "--top-k", "1", "--seed", str(rng.randrange(1000))]
    if drafter == "trie":
        if rng.random() < 0.5:
            args += ["--num-draft", str(rng.choice([1, 4, 8, 32]))]
        if rng.random() < 0.3:
            n = rng.choice([2, 4, 13])
            args += ["--ngram-n", str(n), "--prefix-len", str(rng.randrange(1, n))]
        if rng.random() < 0.3:
            args.append("--no-trie-update")
    if drafter == "prompt-lookup" and rng.random() < 0.5:
        args += ["--lookup-ngram", str(rng.choice([1, 2, 3])), "--lookup-tokens", str(rng.choice([1, 4, 10]))]
    if drafter in ROW_DRAFTERS:
        if rng.random() < 0.5:
            args += ["--k", str(rng.randrange(1, 5)), "--w", str(rng.randrange(1, 6))]
        if drafter in ("context-ngram", "mixed") and rng.random() < 0.3:
            args += ["--ngram-q", str(rng.choice([1, 2, 3]))]
    if drafter in ("eagle", "eagle+search"):
        args += ["--eagle-head", head]
        tree = rng.random()
        if tree < 0.3 and shape:
            args += ["--tree-choices", shape]
        elif tree < 0.5:
            paths = {tuple(rng.randrange(3) for _ in range(rng.randrange(1, 4))) for _ in range(rng.randrange(1, 10))}
            listed = sorted({p[:j] for p in paths for j in range(1, len(p) + 1)}, key=lambda p: (len(p), p))
            path = folder / f"shape-{rng.randrange(10**6)}.json"
            path.write_text(json.dumps([list(p) for p in listed]))
            args += ["--tree-choices", str(path)]
        elif tree < 0.8:
            args += ["--tree", "dynamic", "--tree-top-k", str(rng.randrange(1, 9)), "--tree-depth", str(rng.randrange(1, 7)), "--total-tokens", str(rng.choice([1, 4, 16, 32]))]
        if rng.random() < 0.4:
            args += ["--draft-vocab", str(rng.choice([0, 64, 8192]))]
        if rng.random() < 0.3:
            args.append("--head-float32")
    if drafter in ("search", "eagle+search"):
        if datastore and rng.random() < 0.7:
            args += ["--datastore", datastore]
        if rng.random() < 0.5:
            args += ["--search-depth", str(rng.choice([1, 4, 16, 32]))]
        if drafter == "eagle+search" and rng.random() < 0.5:
            args.append("--deepen")
    return args


TYPED = {"\\n": "\n", "\\t": "\t", "\\\\": "\\"}  # the fuzz's own reading of the typed escapes STOPS holds


def stop_fault(args: list[str], rows: list[dict]) -> str | None:
    """A row that went past a --stop string (its text holds one, yet it ended otherwise), or one
    that ended on a stop string its text lacks; None when every row kept to its stops. A stop
    that names a special token (``<|im_end|>``) is left out: the text never holds it."""
    stops = [re.sub(r"\\[nt\\]", lambda m: TYPED[m.group(0)], args[i + 1]) for i, a in enumerate(args[:-1]) if a == "--stop"]
    plain = [stop for stop in stops if not (stop.startswith("<|") and stop.endswith("|>"))]
    for row in rows:
        text, reason = row.get("text"), row.get("finish_reason")
        if not isinstance(text, str) or not stops:
            continue
        held = [stop for stop in plain if stop in text]
        if held and reason != "stop":
            return f"prompt {row.get('id')} ended by {reason} with stop string {held[0]!r} in its text"
        if reason == "stop" and not held and len(plain) == len(stops):
            return f"prompt {row.get('id')} ended by a stop string its text lacks: {plain}"
    return None


def judge(code: int, output: str, exc: BaseException | None, args: list[str] = ()) -> tuple[str, str]:
    """(verdict, detail): ok, refused (a usage error), ngspec-error (ngspec's one-line error, such as
    a prompt that failed while the others ran), or a finding; ``args``, the command line, for
    `stop_fault`."""
    if exc is not None and not isinstance(exc, SystemExit):
        return "FINDING", f"{type(exc).__name__}: {exc}"
    last = output.strip().splitlines()[-1] if output.strip() else ""
    if "Traceback" in output or "NGSPEC_DEBUG" in output:
        return "FINDING", last
    rows = []
    for line in output.splitlines():
        if line.startswith("{"):
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                pass
    said = [last] + [r["error"] for r in rows if isinstance(r.get("error"), str)]  # the run's error and each failed prompt's
    if code != 0 and (worded := next((line for line in said if PYTHON_WORDS.search(line)), None)):
        return "FINDING", worded  # a refusal in Python's words, not the input's
    wrong = [r for r in rows if isinstance(r.get("greedy_check"), dict) and not r["greedy_check"]["exact_match"]]
    if wrong:
        return "FINDING", f"{len(wrong)} row(s) not identical: {[r['greedy_check'] for r in wrong]}"
    if fault := stop_fault(list(args), rows):
        return "FINDING", fault
    checked = sum(isinstance(r.get("greedy_check"), dict) for r in rows)
    if code == 0:
        return "ok", f"{checked} rows exact"
    if code == 2:
        return "refused", last
    if code == 1:
        return "ngspec-error", f"{checked} rows exact; {last}"
    return "FINDING", f"exit code {code}"


def held() -> dict:
    """What a run left behind, after garbage collection: resident memory before and after glibc
    hands its free arenas back (`malloc_trim`; the second None where there is no glibc), the GB of
    torch tensors still reachable from Python objects, the torch modules alive and Python's
    tracked objects. The peak (`ru_maxrss`) only ever rises; these show whether a run leaves
    something behind for the next."""
    import torch

    gc.collect()
    tensors, modules, objects = 0, 0, gc.get_objects()
    for obj in objects:
        kind = type(obj)  # not isinstance: it reads __class__, which some deprecated torch objects warn on
        if issubclass(kind, torch.Tensor) and not obj.is_meta:
            try:
                tensors += obj.untyped_storage().nbytes()
            except RuntimeError:  # tensors without storage (subclasses, lazy ones)
                continue
        elif issubclass(kind, torch.nn.Module):
            modules += 1
    count = len(objects)
    del objects
    rss = resident_gb()
    trimmed = resident_gb() if release_free_memory() else None
    return {"rss_gb": rss, "trimmed_rss_gb": trimmed, "tensors_gb": tensors / 2**30, "modules": modules, "objects": count}


def search_options(description: str, runs: int, out: str) -> argparse.ArgumentParser:
    """The options of a search over a command line on a real model (this script, bench_fuzz.py)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--runs", type=int, default=runs)
    parser.add_argument("--first", type=int, default=0, help="the first run's number (runs are fixed by seed and number)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model", default="default")
    parser.add_argument("--eagle-head", help="a head directory for eagle and eagle+search (without it they are not drawn)")
    parser.add_argument("--datastore", help="a datastore for search and eagle+search")
    parser.add_argument("--out", type=Path, default=Path(out))
    return parser


def main() -> int:
    parser = search_options(__doc__.split("\n\n")[0], 50, "bench-out/cli_fuzz")
    parser.add_argument("--tree-choices", help="a tune-tree shape file to draw among the static trees")
    ns = parser.parse_args()

    from typer.testing import CliRunner

    from ngspec.cli.app import app

    ns.out.mkdir(parents=True, exist_ok=True)
    runner = CliRunner()
    counts: dict[str, int] = {}
    with tempfile.TemporaryDirectory() as tmp, (ns.out / f"runs-{ns.seed}-{ns.first}.jsonl").open("w") as log:
        folder = Path(tmp)
        files = prompt_files(folder)
        for n in range(ns.first, ns.first + ns.runs):
            rng = random.Random(f"{ns.seed} {n}")
            args = draw(rng, files, ns.eagle_head, ns.datastore, ns.tree_choices, folder)
            if ns.model != "default":
                args += ["--model", ns.model]
            at = args.index("-p") + 1
            if args[at].endswith(".jsonl") and random.Random(f"{ns.seed} {n} json").random() < 0.2:  # its own draw, as below
                args[at] = str(json_twin(Path(args[at]), folder))
            piped, stdin = None, None
            if random.Random(f"{ns.seed} {n} stdin").random() < 0.2:  # its own draw: the runs drawn before stay as they were
                stdin, args[at] = args[at], "-"  # the prompt file fed through standard input, as `-p -`
                piped = Path(stdin).read_bytes()
            start = time.perf_counter()
            result = runner.invoke(app, args, input=piped)
            verdict, detail = judge(result.exit_code, result.output, result.exception, args)
            counts[verdict] = counts.get(verdict, 0) + 1
            seconds = time.perf_counter() - start
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
            left = {k: v if v is None or isinstance(v, int) else round(v, 3) for k, v in held().items()}
            entry = {"run": n, "verdict": verdict, "detail": detail, "exit": result.exit_code, "seconds": round(seconds, 1),
                     "max_rss_gb": round(peak, 2), **left, "args": args, "stdin": stdin}
            log.write(json.dumps(entry, ensure_ascii=False) + "\n")
            log.flush()
            gb = {k: "?" if left[k] is None else f"{left[k]:.2f}" for k in ("rss_gb", "trimmed_rss_gb", "tensors_gb")}
            print(f"{n:5d} {verdict:12s} {seconds:6.1f}s GB: peak {peak:.2f} now {gb['rss_gb']} trimmed {gb['trimmed_rss_gb']}"
                  f" tensors {gb['tensors_gb']}; {left['modules']} modules, {left['objects']} objects  {detail[:100]}", flush=True)
            if verdict == "FINDING":
                print("      ngspec " + " ".join(args) + (f" < {stdin}" if stdin else ""), flush=True)
    print(json.dumps(counts))
    return 1 if counts.get("FINDING") else 0


if __name__ == "__main__":
    sys.exit(main())
