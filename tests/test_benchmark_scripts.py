"""Every script under `benchmarks/` parses and imports from ngspec only names that exist, so a
rename in the package cannot leave a command of BENCHMARKS.md broken until someone runs it (most
scripts take minutes to hours and have no test of their own)."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
SCRIPTS = sorted(BENCHMARKS.glob("*.py"))


def ngspec_imports(tree: ast.AST) -> list[tuple[str, str | None]]:
    """(module, name) for every `from ngspec... import name` and (module, None) for `import ngspec...`."""
    found: list[tuple[str, str | None]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and node.module.split(".")[0] == "ngspec":
            found += [(node.module, alias.name) for alias in node.names]
        elif isinstance(node, ast.Import):
            found += [(alias.name, None) for alias in node.names if alias.name.split(".")[0] == "ngspec"]
    return found


def test_the_scripts_are_found():
    assert len(SCRIPTS) > 10 and BENCHMARKS / "reader_ab.py" in SCRIPTS


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_script_imports_resolve(script):
    tree = ast.parse(script.read_text(), filename=str(script))
    missing = []
    for module, name in ngspec_imports(tree):
        mod = importlib.import_module(module)
        if name is not None and not hasattr(mod, name):
            try:  # a submodule imported by name
                importlib.import_module(f"{module}.{name}")
            except ModuleNotFoundError:
                missing.append(f"{module}.{name}")
    assert not missing, f"{script.name} imports names ngspec no longer has: {missing}"


def test_a_missing_name_is_caught():
    tree = ast.parse("from ngspec.tree import no_such_function\nimport ngspec.decode\n")
    (module, name), (other, none) = ngspec_imports(tree)
    assert (module, name, other, none) == ("ngspec.tree", "no_such_function", "ngspec.decode", None)
    assert not hasattr(importlib.import_module(module), name)


def test_shared_cores_reads_what_generate_records(tiny_saved, tmp_path):
    """`shared_cores.py` reads tokens/s and the others' CPU share from `generate --json`, one
    prompt or a batch's summary (BENCHMARKS.md 10zzzh), with no neighbour here."""
    import json
    import subprocess
    import sys

    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"count to {i}"}) + "\n" for i in range(3)))
    for args in (["-p", str(BENCHMARKS.parent / "examples" / "rag_ngspec.txt")], ["-p", str(prompts), "-b", "2"]):
        out = tmp_path / "lines.jsonl"
        run = subprocess.run([sys.executable, str(BENCHMARKS / "shared_cores.py"), *args, "-m", str(tiny_saved), "-n", "4",
                              "--settings", "default,threads1", "--neighbours", "none", "--out", str(out)],
                             capture_output=True, text=True, cwd=tmp_path)
        assert run.returncode == 0, run.stderr
        lines = [json.loads(line) for line in out.read_text().splitlines()]
        assert [(r["setting"], r["neighbour"]) for r in lines] == [("default", "none"), ("threads1", "none")]
        assert all(r["tokens_per_second"] > 0 for r in lines) and "tokens the same in every run: True" in run.stdout
