"""`ngspec --version` and the versions reports record: ngspec with its checkout's commit."""

from __future__ import annotations

import subprocess

from typer.testing import CliRunner

from ngspec import __version__
from ngspec.cli.app import app
from ngspec.versions import ngspec_version, versions


def _git(root, *args) -> str:
    return subprocess.run(["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@t", *args], capture_output=True, text=True, check=True).stdout.strip()


def test_a_checkout_adds_its_commit_and_whether_tracked_files_changed(tmp_path):
    assert ngspec_version(tmp_path) == __version__  # no checkout: an installed package
    _git(tmp_path, "init", "-q")
    (tmp_path / "a.py").write_text("x = 1\n")
    assert ngspec_version(tmp_path) == __version__  # a checkout without a commit: git fails, the plain version
    _git(tmp_path, "add", "a.py")
    _git(tmp_path, "commit", "-q", "-m", "a")
    commit = _git(tmp_path, "rev-parse", "--short=7", "HEAD")
    assert ngspec_version(tmp_path) == f"{__version__}+g{commit}"
    (tmp_path / "new.txt").write_text("untracked files leave the code as committed\n")
    assert ngspec_version(tmp_path) == f"{__version__}+g{commit}"
    (tmp_path / "a.py").write_text("x = 2\n")
    assert ngspec_version(tmp_path) == f"{__version__}+g{commit}.dirty"


def test_version_prints_every_version_and_exits():
    result = CliRunner().invoke(app, ["--version"])
    found = versions()
    assert result.exit_code == 0 and result.output.startswith(f"ngspec {found['ngspec']} (torch {found['torch']}, transformers ")
    assert f"python {found['python']})" in result.output and found["ngspec"].startswith(__version__)


def test_a_bench_report_records_the_versions_it_ran_with(tiny_saved):
    import json

    result = CliRunner().invoke(app, ["bench", "-q", "-", "--model", str(tiny_saved), "-d", "trie", "-n", "4", "--json"], input='{"prompt": "a b a b"}\n')
    assert result.exit_code == 0, result.output
    env = json.loads(result.stdout.strip().splitlines()[-1])["environment"]
    assert {k: env[k] for k in ("ngspec", "torch", "transformers", "python")} == versions()
