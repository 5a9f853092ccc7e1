"""Every field of a model directory's JSON files, and of an EAGLE head's config.json, set to a value
of each JSON type in turn (and a string or number field to one no field expects, "[/x]" or -1, and
a list or object field to one holding a null entry),
run through `ngspec generate`: a systematic companion to `input_fuzz.py`'s random search, judged
the same way.

A run passes when `generate` succeeds (transformers ignores many fields) or refuses with one line
in the input's words ("PATH is damaged (id2label must be a JSON object or null, not 5)"). A
refusal in Python's words ("'int' object has no attribute 'items'"), an unexpected exception or a
traceback is a finding. Fields that `ngspec.model_files.FIELD_TYPES` checks are tried too where
the files lack them. The model is a tiny random Llama saved with the default model's tokenizer,
so a run takes about a quarter of a second: 772 runs in 3.4 minutes on the AMD EPYC VM.

    python benchmarks/field_sweep.py --out bench-out/field_sweep

It was written (2026-12-06) after the same sweep by hand found about 30 fields whose other types
ended in Python's words, which input_fuzz had passed for refusals (fixed in ngspec/model_files.py);
its own first runs found three more (a head's dtype torch has no name for, a tokenizer's auto_map
list of one class, a model config's dtype "[/x]").
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

# one value of each JSON type (an object that is no token, a list of one number)
VALUES = [5, 1.5, "x", [1], None, {"a": 1}, True]
# and, for a field of that type, a value of its own type that no field expects (a mistyped name, a
# number below every id and size): "hidden_act": "x" ended in a bare KeyError
SAME_TYPE = {"string": "[/x]", "number": -1}
# and, for a list or object field, one holding a null entry: the entry checks' "none found" was None
# too, so [2, null] passed them (2026-12-06)
NULL_ENTRY = {"list": [None], "object": {"0": None}}


def json_type(value: object) -> str:
    return "null" if value is None else {bool: "bool", int: "number", float: "number", str: "string", list: "list", dict: "object"}[type(value)]


def fixtures(where: Path) -> tuple[Path, Path]:
    """input_fuzz's tiny Llama (the default tokenizer) and its untrained EAGLE head; a prompt file."""
    from input_fuzz import save_tiny_model  # the script beside this one

    model_dir = where / "tiny"
    save_tiny_model(model_dir, where / "head")
    prompts = where / "prompts.txt"
    prompts.write_text("Name three colours.\n")
    return model_dir, prompts


def cases(model_dir: Path, head_dir: Path, files: list[str]):
    """(which directory, file, field, value) for every field and every value of another type."""
    from ngspec.model_files import FIELD_TYPES
    from ngspec.models import TEXT_CONFIGS

    for owner, directory, names in (("model", model_dir, files), ("head", head_dir, ["config.json"])):
        for name in names:
            path = directory / name
            doc = json.loads(path.read_text()) if path.is_file() else {}
            checked = list(FIELD_TYPES.get(name, {})) + list(TEXT_CONFIGS if name == "config.json" else ())
            keys = list(doc) + [key for key in checked if key not in doc and owner == "model"]
            for key in keys:
                allowed = FIELD_TYPES.get(name, {}).get(key, ())
                for kind, value in NULL_ENTRY.items():
                    if (key in doc and json_type(doc[key]) == kind) or {"list": list, "object": dict}[kind] in allowed:
                        yield owner, name, key, value
                for value in VALUES:
                    if key in doc and json_type(value) == json_type(doc[key]):
                        continue
                    yield owner, name, key, value
                if key in doc and json_type(doc[key]) in SAME_TYPE and doc[key] != SAME_TYPE[json_type(doc[key])]:
                    yield owner, name, key, SAME_TYPE[json_type(doc[key])]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", default="config.json,generation_config.json,tokenizer_config.json,tokenizer.json,special_tokens_map.json",
                        help="the model directory's files to sweep (comma-separated)")
    parser.add_argument("--limit", type=int, default=0, help="stop after this many runs (0: all)")
    parser.add_argument("--out", type=Path, default=Path("bench-out/field_sweep"))
    ns = parser.parse_args()

    from typer.testing import CliRunner

    from input_fuzz import judge  # the script beside this one
    from ngspec.cli.app import app

    runner = CliRunner()
    ns.out.mkdir(parents=True, exist_ok=True)
    counts: dict[str, int] = {}
    with tempfile.TemporaryDirectory() as tmp, (ns.out / "runs.jsonl").open("w") as log:
        model_dir, prompts = fixtures(Path(tmp))
        head_dir = Path(tmp) / "head"
        for n, (owner, name, key, value) in enumerate(cases(model_dir, head_dir, ns.files.split(","))):
            if ns.limit and n >= ns.limit:
                break
            source = model_dir if owner == "model" else head_dir
            edited = Path(tmp) / f"edited-{owner}"
            shutil.rmtree(edited, ignore_errors=True)
            shutil.copytree(source, edited)
            path = edited / name
            doc = json.loads(path.read_text()) if path.is_file() else {}
            path.write_text(json.dumps(doc | {key: value}))
            model, head = (edited, head_dir) if owner == "model" else (model_dir, edited)
            args = ["generate", "--model", str(model), "--prompt-file", str(prompts), "--max-new-tokens", "2",
                    "--drafter", "eagle", "--eagle-head", str(head)]
            result = runner.invoke(app, args)
            verdict, detail = judge(result.exit_code, result.output, result.exception, [])
            counts[verdict] = counts.get(verdict, 0) + 1
            detail = detail.replace(str(edited), owner.upper())
            edit = f"{owner} {name} {key}={json.dumps(value)}"
            log.write(json.dumps({"run": n, "edit": edit, "verdict": verdict, "detail": detail, "exit": result.exit_code}, ensure_ascii=False) + "\n")
            log.flush()
            print(f"{n:4d} {verdict:8s} {edit[:60]:60s} {'' if verdict == 'ok' else detail[:110]}", flush=True)
    print(json.dumps(counts))
    return 1 if counts.get("FINDING") else 0


if __name__ == "__main__":
    sys.exit(main())
