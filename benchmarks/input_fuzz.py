"""A random search over the files ngspec's commands read: corpora, prompt and question files,
datastores, EAGLE heads, tree shapes, n-gram tables and model directories (their config.json also
as `profile-bound --shape`), whole or damaged, named plainly or with characters that mean
something to a glob, a shell or Rich ("corpus[v2].jsonl", "[/x]").

Each run writes one input into a folder of its own, draws a command that reads it (with a few of
that command's options) and runs it in process on a tiny random Llama saved with the default
model's tokenizer, so a run takes about a second. A run passes when it

- exits 0, leaving at most the output it was asked for, or
- exits 1 with ngspec's own one-line error, or 2 with a usage error, leaving no output and no
  temporary behind (rule 6: bad input gets a clear error and loses nothing),

and prints no traceback and no library's Python warning (with its source line); a run that exits
non-zero must leave every file that was there before it as it was (an interrupted `synth-corpus`
run's records, which a run may continue, among them).
Anything else (an unexpected exception, named with "set NGSPEC_DEBUG=1", another exit code, a file
left behind or changed) is a finding, written with its command line.

    python benchmarks/input_fuzz.py --runs 300 --first 0 --out bench-out/input_fuzz

Runs are fixed by (seed, run number), so `--first N` continues a search past runs made before,
and `--only N,M,...` replays chosen runs (those an older judge passed, after a fix).
Commands run in this process, so a crash (a segmentation fault in a reader) ends the search: the
culprit is the run after the last one logged.
Its first version found two bugs: a corpus file whose name holds ``[v2]`` read as a glob pattern
(0 records), and a record field ``[/x]`` that crashed the error message (Rich markup).
"""

from __future__ import annotations

import argparse
import json
import random
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

NAMES = ["plain", "with space", "corpus[v2]", "what?", "all*", "ünïcode 猫", "[/x]", "[bold]b", "a{1,2}", "dollar$HOME", "semi;colon"]
VALUES = [None, True, 0, -1, 2**63, 1.5, float("nan"), "", " ", "text", "[/x]", [], [1, 2], ["a", 3], {}, {"a": 1}, "猫" * 3]
# an exception ngspec did not expect, as its CLI reports one ("error: TypeError: ... (set
# NGSPEC_DEBUG=1 ...)"); an OSError's line ("error: Is a directory: PATH (set ...)") is the clear
# message for a path that cannot be read
UNEXPECTED = re.compile(r"^error: [A-Za-z_][\w.]*: .*NGSPEC_DEBUG", re.DOTALL)
# a library's Python warning, printed with its file, line and source line ("plots.py:54: UserWarning: Glyph
# 29483 missing from font(s)"): ngspec's own warnings are one "warning: ..." line
PYTHON_WARNING = re.compile(r"^\S+\.py:\d+: \w*Warning: ", re.MULTILINE)
# a refusal in Python's words rather than the input's ("could not load model ...: 'int' object has no
# attribute 'items'"): clear enough to pass for a refusal until 2026-12-06, it names no field or file;
# or carrying an exception's class name ("cannot read PATH: SafetensorError: Error while ...", 157
# runs from 8151 on, until the second 2026-12-06 session); or a library's words passed on that misname
# the fault or give no place ("Expected object or value" of a readable file, "no file named
# model.safetensors" where it is a directory, numpy's advice to load a file "unsafely", a codec's
# byte position, an exception's bare class: "(BadZipFile)"; passed as refusals until the third)
PYTHON_WORDS = re.compile(r"has no attribute '|'\w+' object is not|NoneType|<class '|unhashable type|not supported between instances"
                          r"|invalid literal for int\(\)|index out of range|\b[A-Z]\w*(?:Error|Exception): "
                          r"|Expected object or value|no file named \S+.* found in directory|Couldn't instantiate the backend tokenizer"
                          r"|load it unsafely|codec can't decode|\([A-Z]\w*(?:Error|File)\)"
                          r"|: '[A-Za-z_][\w.]*'(?: \(set NGSPEC_DEBUG|$)"  # a KeyError's message: the key alone
                          r"|untagged enum|expected struct [A-Z]")  # the tokenizers library's Rust type names
KINDS = ["corpus", "prompts", "datastore", "head", "shape", "table", "model"]
# what a saved tokenizer leaves beside a model (removed together: a checkpoint saved without it)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def odd(rng: random.Random):
    """A JSON value of a random type, where a string or a list of turns is expected."""
    return rng.choice(VALUES)


def record(rng: random.Random) -> object:
    """A corpus or prompt record: one of the formats ngspec reads, often with a field of the wrong
    type, missing or extra; now and then not an object at all."""
    text = rng.choice(["The answer is 42.", "Hello there, how are you?", "猫は🐱です。", "x" * rng.randrange(1, 3000)])
    kinds = [
        {"instruction": text, "response": text},
        {"instruction": text, "responses": [text, text]},
        {"instruction_1": text, "response_1": text, "instruction_2": text, "response_2": text},
        {"conversations": [{"from": "human", "value": text}, {"from": "gpt", "value": text}]},
        {"messages": [{"role": "user", "content": text}, {"role": "assistant", "content": text}]},
        # since 2026-12-08 (runs from 19150 on; earlier runs drew from the kinds without these four)
        {"messages": [{"role": "user", "content": [{"type": "text", "text": text}]}, {"role": "assistant", "content": [{"type": "image_url"}, {"type": "text", "text": text}]}]},
        {"instruction": text, "input": text, "output": text, "history": [[text, text]]},
        {"instruction": text, "context": text, "response": text},
        {"prompt": rng.choice([text, [{"role": "user", "content": text}]]), "completion": rng.choice([text, [{"role": "assistant", "content": text}]])},
        {"data": [text, text]},
        {"text": text},
        {"prompt": text},
        {"turns": [text, text]},
        {"question_id": rng.randrange(100), "category": "rag", "turns": [text]},
        {"id": rng.choice(NAMES), "prompt": text},
    ]
    if rng.random() < 0.05:
        return odd(rng)
    out = dict(rng.choice(kinds))
    for _ in range(rng.choice([0, 0, 1, 2])):
        key = rng.choice(list(out) + ["[/x]", "response", "prompt", "turns", "messages", "conversations", "data", "output", "history", "completion"])
        if rng.random() < 0.3:
            out.pop(key, None)
        else:
            out[key] = odd(rng)
    return out


def write_records(rng: random.Random, path: Path, records: list) -> Path:
    """Records as JSON lines, a JSON array or parquet, with now and then a damaged line."""
    form = rng.choice(["jsonl", "jsonl", "jsonl", "json", "parquet", "txt"])
    path = path.with_suffix("." + form)
    if form == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        rows = [r for r in records if isinstance(r, dict)]
        try:
            pq.write_table(pa.Table.from_pylist(rows), path)
            return path
        except (pa.ArrowException, ValueError, TypeError, OverflowError):  # rows pyarrow cannot type alike: as lines
            path = path.with_suffix(".jsonl")
    if form == "json":
        path.write_text(json.dumps(records, ensure_ascii=rng.random() < 0.5))
        return path
    if form == "txt":
        path.write_text("\n\n".join(str(r.get("prompt", r.get("text", ""))) if isinstance(r, dict) else str(r) for r in records))
        return path
    lines = [json.dumps(r, ensure_ascii=rng.random() < 0.5).encode() for r in records]
    for _ in range(rng.choice([0, 0, 0, 1])):
        at = rng.randrange(len(lines) + 1)
        lines.insert(at, rng.choice([b"", b"{", b'{"text": "cut', b"\xff\xfe bad bytes", b"[1, 2]", b"null", b"   "]))
    data = b"\n".join(lines) + (b"\n" if rng.random() < 0.8 else b"")
    path.write_bytes((b"\xef\xbb\xbf" if rng.random() < 0.1 else b"") + data)
    return path


def interrupted_run(rng: random.Random, path: Path, model: Path) -> str:
    """What an interrupted `synth-corpus --prompts P -n 4 --model MODEL` leaves in ``path``:
    records of its format, now and then with a field another run would have written or retyped,
    or a damaged line."""
    from ngspec.datastore.synth import record_uuid

    records = []
    for number in range(1, rng.randrange(1, 5)):
        text = rng.choice(["The answer is 42.", "Hello there, how are you?", "猫は🐱です。"])
        record = {"uuid": record_uuid(0, number), "instruction": text, "response": text, "gen_input_configs": {"source": "given"},
                  "gen_response_configs": {"temperature": 0.0, "max_tokens": 4}, "model": str(model)}
        if rng.random() < 0.3:
            record[rng.choice(sorted(record) + ["[/x]"])] = odd(rng)
        records.append(record)
    lines = [json.dumps(r, ensure_ascii=False) for r in records]
    if rng.random() < 0.2:
        lines.insert(rng.randrange(len(lines) + 1), rng.choice(["{", '{"instruction": "cut', "[1, 2]", "null", ""]))
    path.write_text("".join(line + "\n" for line in lines))
    return f"{len(lines)}-line partial"


def damage_file(rng: random.Random, path: Path) -> str:
    how = rng.choice(["truncate", "garbage", "empty", "remove", "directory"])
    if how == "truncate":
        data = path.read_bytes()
        path.write_bytes(data[: rng.randrange(len(data) + 1)])
    elif how == "garbage":
        path.write_bytes(bytes(rng.randrange(256) for _ in range(rng.randrange(1, 200))))
    elif how == "empty":
        path.write_bytes(b"")
    elif how == "remove":
        path.unlink()
    else:
        path.unlink()
        path.mkdir()
    return f"{how} {path.name}"


def damage_json(rng: random.Random, path: Path) -> str:
    """A JSON object file with a field dropped, retyped or the file not an object."""
    data = json.loads(path.read_text())
    key = rng.choice(sorted(data))
    if rng.random() < 0.15:
        path.write_text(json.dumps(odd(rng)))
        return f"{path.name} not an object"
    if rng.random() < 0.3:
        del data[key]
        path.write_text(json.dumps(data))
        return f"{path.name} without {key}"
    data[key] = odd(rng)
    path.write_text(json.dumps(data))
    return f"{path.name} {key}={data[key]!r}"


def damaged_copy(rng: random.Random, source: Path, path: Path, leave_out: tuple[str, ...] = ()) -> str:
    """A copy of the directory ``source`` at ``path`` (but ``leave_out``) with one of its files
    damaged (now and then none); what was done."""
    shutil.copytree(source, path, ignore=shutil.ignore_patterns(*leave_out))
    target = path / rng.choice(sorted(p.name for p in path.iterdir()))
    if target.suffix == ".json" and rng.random() < 0.7:
        return damage_json(rng, target)
    return damage_file(rng, target) if rng.random() < 0.9 else "whole"


def shape(rng: random.Random) -> object:
    paths = [[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]][: rng.randrange(1, 7)]
    if rng.random() < 0.3:
        paths.append(rng.choice([[], [-1], [5, 5], ["a"], [0.5], [2**40], "0,1", None]))
    if rng.random() < 0.4:
        return paths
    out = {"choices": paths, "model": rng.choice(["tiny", "someone-else", None, 3]), "nodes": len(paths)}
    if rng.random() < 0.3:
        out[rng.choice(["choices", "model", "model_fingerprint", "nodes"])] = odd(rng)
    return out


def save_tiny_model(model_dir: Path, head_dir: Path) -> None:
    """A tiny random Llama saved at ``model_dir`` with the default model's tokenizer, and an
    untrained EAGLE head for it at ``head_dir`` (both seeded)."""
    from ngspec import models
    from ngspec.eagle.head import EagleHead, head_config_for, init_from_target, save_head

    import torch

    tok = models.load_tokenizer()
    model = models.tiny_model("llama", seed=0, vocab_size=len(tok))
    model.save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    torch.manual_seed(0)
    head = EagleHead(head_config_for(model))
    init_from_target(head, model)
    save_head(head.eval(), head_dir)


class Fixtures:
    """What every run starts from: a tiny saved model with an untrained EAGLE head, a datastore
    and a bigram table built for it, made once."""

    def __init__(self, where: Path, runner, app) -> None:
        self.model = where / "tiny"
        save_tiny_model(self.model, self.model / "head")
        corpus = where / "corpus.jsonl"
        corpus.write_text("".join(json.dumps({"instruction": f"q{i}", "response": f"The answer number {i} is {i * 7}."}) + "\n" for i in range(40)))
        self.corpus = corpus
        self.datastore = where / "datastore"
        self.table = where / "bigram.npz"
        for args in (["build-datastore", "-c", str(corpus), "-o", str(self.datastore)], ["build-bigram", "--out", str(self.table)]):
            result = runner.invoke(app, [*args, "--model", str(self.model)])
            if result.exit_code != 0:
                raise SystemExit(f"cannot build the fixtures: {result.output}")


def place(run_dir: Path, name: str) -> Path:
    """``run_dir / name``, its folder made (a name such as ``[/x]`` holds a slash)."""
    path = run_dir / name
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def draw(rng: random.Random, fx: Fixtures, run_dir: Path) -> tuple[list[str], Path | None, str]:
    """(command line, the output it may leave, what was damaged) for one run; writes its input
    into ``run_dir``."""
    kind = rng.choice(KINDS)
    name = rng.choice(NAMES)
    model = ["--model", str(fx.model)]
    out = place(run_dir, f"out {rng.choice(NAMES)}")
    if kind in ("corpus", "prompts"):
        where = place(run_dir, name)
        if rng.random() < 0.1:  # a directory of files
            where.mkdir()
            files = [write_records(rng, where / f"part{i}", [record(rng) for _ in range(rng.randrange(0, 6))]) for i in range(rng.randrange(1, 3))]
            path, note = where, f"{len(files)} files"
        else:
            path, note = write_records(rng, where, [record(rng) for _ in range(rng.randrange(0, 8))]), ""
        if rng.random() < 0.05:
            path, note = run_dir / "missing.jsonl", "missing"
        if kind == "corpus":
            command = rng.choice(["build", "build", "self-repetition", "train"])
            if command == "build":
                args = ["build-datastore", "-c", str(path), "-o", str(out), *model]
                args += rng.choice([[], [], ["--format", rng.choice(["magpie", "alpaca", "completion", "sharegpt", "messages", "ultrachat", "text", "nope"])], ["--text", "all"], ["--max-records", str(rng.choice([0, 1, 3, -1]))]])
                return args, out, note
            if command == "train":
                return ["train-eagle", "-c", str(path), "-o", str(out), *model, "--epochs", "1", "--holdout", str(rng.choice([0, 1])), "--eval-tokens", "4", "--batch-tokens", "256", "--max-len", "64"], out, note
            args = ["self-repetition", "--dataset", str(path), *model, "--json"]
            args += rng.choice([[], ["--holdout", str(rng.choice([0, 1, 3, -1]))], ["--datastore", str(fx.datastore)], ["--response-field", rng.choice(["response", "text", "[/x]"])], ["--limit", "2"]])
            return args, None, note
        command = rng.choice(["generate", "generate", "bench", "tune", "synth"])
        if command == "generate":
            drafter = rng.choice(["trie", "vanilla", "search"])
            store = ["--datastore", str(fx.datastore)] if drafter == "search" else []
            return ["generate", "-p", str(path), *model, "-n", "4", "-d", drafter, *store, *rng.choice([[], ["--json"], ["-b", "2"], ["--turns", "all"]])], None, note
        if command == "bench":
            return ["bench", "-q", str(path), *model, "-n", "4", "-d", "trie", "--json"], None, note
        if command == "synth":
            if rng.random() < 0.5:  # an interrupted run's records beside the output, which this run would continue
                note += " " + interrupted_run(rng, out.with_suffix(".partial.jsonl"), fx.model)
            return ["synth-corpus", "--prompts", str(path), "-o", str(out.with_suffix(".jsonl")), *model, "-n", "4"], out.with_suffix(".jsonl"), note
        return ["tune-tree", "-q", str(path), "--eagle-head", str(fx.model / "head"), "-o", str(out.with_suffix(".json")), *model,
                "-n", "4", "--nodes", "6", "--depth", "2", "--finalists", "1"], out.with_suffix(".json"), note
    if kind == "datastore":
        path = place(run_dir, name)
        note = damaged_copy(rng, fx.datastore, path)
        command = rng.choice(["info", "info", "generate", "self-repetition"])
        if command == "info":
            return ["datastore-info", str(path), *rng.choice([[], ["--check"], ["--json"]])], None, note
        if command == "generate":
            drafter = rng.choice(["search", "eagle+search"])
            head = ["--eagle-head", str(fx.model / "head")] if drafter == "eagle+search" else []
            return ["generate", "-p", "examples/rag_ngspec.txt", *model, "-n", "4", "-d", drafter, *head, "--datastore", str(path)], None, note
        return ["self-repetition", "--dataset", str(fx.corpus), *model, "--datastore", str(path), "--json"], None, note
    if kind == "head":
        path = place(run_dir, name)
        note = damaged_copy(rng, fx.model / "head", path)
        if rng.random() < 0.15:
            (path / "draft_vocab.json").write_text(json.dumps(rng.choice([[1, 2, 3], ["a"], {"tokens": [1]}, [2**40], None, list(range(10))])))
            note += " draft_vocab.json"
        if rng.random() < 0.2:
            return ["tune-tree", "--eagle-head", str(path), "-o", str(out.with_suffix(".json")), *model, "-q", "examples/prompts.jsonl", "--limit", "1",
                    "-n", "4", "--nodes", "6", "--depth", "2", "--finalists", "1"], out.with_suffix(".json"), note
        drafter = rng.choice(["eagle", "eagle+search"])
        store = ["--datastore", str(fx.datastore)] if drafter == "eagle+search" else []
        return ["generate", "-p", "examples/rag_ngspec.txt", *model, "-n", "4", "-d", drafter, "--eagle-head", str(path),
                *store, *rng.choice([[], ["--head-float32"], ["-b", "2"]])], None, note
    if kind == "model":
        path = place(run_dir, name)
        if rng.random() < 0.15:  # a checkpoint saved without its tokenizer
            shutil.copytree(fx.model, path, ignore=shutil.ignore_patterns("head", *TOKENIZER_FILES))
            note = "no tokenizer files"
        else:
            note = damaged_copy(rng, fx.model, path, leave_out=("head",))
        model = ["--model", str(path)]
        command = rng.choice(["generate", "generate", "bench", "build-datastore", "train-eagle", "synth-corpus", "build-bigram", "profile-bound"])
        if command == "profile-bound":  # its config.json as a shape of random weights, timed into a folder made for it
            out.mkdir()
            return ["profile-bound", "--shape", str(path / "config.json"), "--k", "1,2", "--w", "0,1", "--context", "4", "--repeats", "1",
                    "--out", str(out), "--json"], out, note
        if command == "generate":
            return ["generate", "-p", "examples/rag_ngspec.txt", *model, "-n", "4", "-d", rng.choice(["trie", "vanilla", "context-ngram"]),
                    *rng.choice([[], ["--json"], ["-b", "2"]])], None, note
        if command == "bench":
            return ["bench", "-q", "examples/prompts.jsonl", "--limit", "2", *model, "-n", "4", "-d", "trie", "--json"], None, note
        if command == "build-datastore":
            return ["build-datastore", "-c", str(fx.corpus), "-o", str(out), *model], out, note
        if command == "train-eagle":
            return ["train-eagle", "-c", str(fx.corpus), "-o", str(out), *model, "--epochs", "1", "--holdout", "1", "--eval-tokens", "4",
                    "--batch-tokens", "256", "--max-len", "64"], out, note
        if command == "synth-corpus":
            return ["synth-corpus", "-o", str(out.with_suffix(".jsonl")), *model, "--n", "2", "-n", "4"], out.with_suffix(".jsonl"), note
        return ["build-bigram", "--out", str(out.with_suffix(".npz")), *model], out.with_suffix(".npz"), note
    if kind == "shape":
        path = place(run_dir, name).with_suffix(".json")
        value = shape(rng)
        path.write_text(json.dumps(value) if rng.random() < 0.9 else "{not json")
        return ["generate", "-p", "examples/rag_ngspec.txt", *model, "-n", "4", "-d", "eagle", "--eagle-head", str(fx.model / "head"),
                "--tree", "static", "--tree-choices", str(path)], None, json.dumps(value)[:60]
    path = place(run_dir, name).with_suffix(".npz")
    shutil.copy(fx.table, path)
    note = damage_file(rng, path) if rng.random() < 0.9 else "whole"
    return ["generate", "-p", "examples/rag_ngspec.txt", *model, "-n", "4", "-d", rng.choice(["bigram", "unigram", "mixed"]), "--bigram-table", str(path)], None, note


def snapshot(paths) -> dict[Path, bytes]:
    """The contents of the files among ``paths``."""
    return {p: p.read_bytes() for p in paths if p.is_file()}


def changed(contents: dict[Path, bytes], run_dir: Path) -> list[str]:
    """The files of a `snapshot` that are gone or hold something else now, named from ``run_dir``."""
    return [f"changed {p.relative_to(run_dir)}" for p, data in contents.items() if not p.is_file() or p.read_bytes() != data]


def judge(code: int, output: str, exc: BaseException | None, left: list[str]) -> tuple[str, str]:
    """(verdict, detail): ok, refused (ngspec's one-line error or a usage error), or a finding."""
    lines = output.strip().splitlines()
    last = lines[-1] if lines else ""
    if exc is not None and not isinstance(exc, SystemExit):
        return "FINDING", f"{type(exc).__name__}: {exc}"
    # the error runs from its line to the end: an exception's message may take several lines
    if "Traceback" in output or any(UNEXPECTED.match("\n".join(lines[i:])) for i, line in enumerate(lines) if line.startswith("error: ")):
        return "FINDING", last
    if warned := PYTHON_WARNING.search(output):
        return "FINDING", output[warned.start():].splitlines()[0]
    if left:
        return "FINDING", f"left behind or changed: {left}"
    if code == 0:
        return "ok", last[:100]
    if code == 1 and any(line.startswith("error: ") for line in lines):
        error = next(line for line in lines if line.startswith("error: "))
        return ("FINDING" if PYTHON_WORDS.search(error) else "refused"), error
    if code == 2:
        return "refused", last
    return "FINDING", f"exit code {code}: {last}"


def run_numbers(description: str, out: str, switches: dict[str, str] | None = None) -> tuple[argparse.Namespace, list[int] | range]:
    """The options of an in-process search over a tiny model (this script, api_fuzz.py), and the
    numbers of the runs they ask for: ``--first`` and ``--runs``, or ``--only``'s list.
    ``switches``: a search's own on/off flags, with their help."""
    parser = argparse.ArgumentParser(description=description)
    for flag, text in (switches or {}).items():
        parser.add_argument(flag, action="store_true", help=text)
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--first", type=int, default=0, help="the first run's number (runs are fixed by seed and number)")
    parser.add_argument("--only", default="", help="replay just these runs (comma-separated numbers), not --first/--runs")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path(out))
    ns = parser.parse_args()
    if ns.runs < 1:
        parser.error("--runs must be at least 1")
    try:
        return ns, [int(n) for n in ns.only.split(",")] if ns.only else range(ns.first, ns.first + ns.runs)
    except ValueError:
        parser.error(f"--only takes run numbers separated by commas, not {ns.only!r}")


def main() -> int:
    ns, numbers = run_numbers(__doc__.split("\n\n")[0], "bench-out/input_fuzz")

    from typer.testing import CliRunner

    from ngspec.cli.app import app

    ns.out.mkdir(parents=True, exist_ok=True)
    runner = CliRunner()
    counts: dict[str, int] = {}
    with tempfile.TemporaryDirectory() as tmp, (ns.out / f"runs-{ns.seed}-{'only' if ns.only else ns.first}.jsonl").open("w") as log:
        fx = Fixtures(Path(tmp), runner, app)
        for n in numbers:
            run_dir = Path(tmp) / f"run{n}"
            run_dir.mkdir()
            args, output, note = draw(random.Random(f"{ns.seed} {n}"), fx, run_dir)
            before = set(run_dir.rglob("*"))
            contents = snapshot(before)
            start = time.perf_counter()
            result = runner.invoke(app, args)
            seconds = time.perf_counter() - start
            kept = output if result.exit_code == 0 else None
            left = sorted(str(p.relative_to(run_dir)) for p in set(run_dir.rglob("*")) - before if kept is None or not (p == kept or kept in p.parents))
            if result.exit_code != 0:  # a refusal loses nothing: every file there before is there as it was
                left += changed(contents, run_dir)
            verdict, detail = judge(result.exit_code, result.output, result.exception, left)
            counts[verdict] = counts.get(verdict, 0) + 1
            log.write(json.dumps({"run": n, "verdict": verdict, "detail": detail, "exit": result.exit_code, "seconds": round(seconds, 2),
                                  "damage": note, "args": args, **({"output": result.output[-4000:]} if verdict == "FINDING" else {})},
                                 ensure_ascii=False) + "\n")
            log.flush()
            print(f"{n:5d} {verdict:8s} {seconds:5.1f}s {args[0]:16s} {note[:40]:40s} {detail[:90]}", flush=True)
            if verdict == "FINDING":
                print("      ngspec " + " ".join(repr(a) if " " in a else a for a in args), flush=True)
            shutil.rmtree(run_dir, ignore_errors=True)
    print(json.dumps(counts))
    return 1 if counts.get("FINDING") else 0


if __name__ == "__main__":
    sys.exit(main())
