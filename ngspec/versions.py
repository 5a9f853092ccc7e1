"""The versions a run is made with, as `ngspec --version` prints them and reports record them:
ngspec (with its git commit when it runs from a checkout), torch, transformers and Python.

Numbers in a report are only comparable with numbers from the same code: every checkout says
``0.1.0``, so the commit (and whether tracked files were changed since) rides along as a local
version, ``0.1.0+g1a2b3c4`` or ``0.1.0+g1a2b3c4.dirty``.
"""

from __future__ import annotations

import platform
import subprocess
from pathlib import Path

from ngspec import __version__

CHECKOUT = Path(__file__).resolve().parent.parent  # the repository root, for an editable install


def ngspec_version(root: Path = CHECKOUT) -> str:
    """``__version__``, with ``root``'s commit as a local version when ``root`` is a git checkout
    (an installed wheel, or git missing or failing: the plain version)."""
    if not (root / ".git").exists():
        return __version__
    try:
        commit = _git(root, "rev-parse", "--short=7", "HEAD")
        changed = _git(root, "status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return __version__
    return f"{__version__}+g{commit}{'.dirty' if changed else ''}"


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10, check=True).stdout.strip()


def versions() -> dict[str, str]:
    import torch
    import transformers

    return {"ngspec": ngspec_version(), "torch": torch.__version__, "transformers": transformers.__version__, "python": platform.python_version()}
