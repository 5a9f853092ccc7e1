"""scripts/setup.sh refuses a Python older than 3.11 in one line, before it makes a venv or asks pip
for anything (pip would fail later, on transformers, with a page of versions)."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("version, refused", [("3.10.13", True), ("3.11.7", False)])
def test_setup_names_the_python_it_needs(tmp_path, version, refused):
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "setup.sh", tmp_path / "scripts")
    # a stand-in interpreter of that version that records what it was asked to do
    fake = tmp_path / "python-fake"
    major, minor = (int(p) for p in version.split(".")[:2])
    fake.write_text(
        "#!/usr/bin/env bash\n"
        f'echo "$*" >> {tmp_path}/calls\n'
        f'if [ "$1" = --version ]; then echo "Python {version}"; exit 0; fi\n'
        f'if [ "$1" = -c ]; then exec {sys.executable} -c "import sys; sys.version_info = ({major}, {minor}, 0); exec(sys.argv[1])" "$2"; fi\n'
        "exit 3\n"  # anything else (-m venv): stop the script here
    )
    fake.chmod(0o755)
    run = subprocess.run(["bash", "scripts/setup.sh"], cwd=tmp_path, env={"PATH": os.environ["PATH"], "PYTHON": str(fake)}, capture_output=True, text=True)
    calls = (tmp_path / "calls").read_text().splitlines()
    assert run.returncode != 0
    if refused:
        assert run.stderr.strip() == f"ngspec needs Python 3.11 or newer; {fake} is Python {version}. Set PYTHON=python3.11 (or newer) and run again."
        assert not any(c.startswith("-m") for c in calls) and not (tmp_path / ".venv").exists()
    else:
        assert run.returncode == 3 and calls[-1] == "-m venv .venv"
