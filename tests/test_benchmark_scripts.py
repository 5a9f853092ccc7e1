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
