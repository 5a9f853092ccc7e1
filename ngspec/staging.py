"""Writing a directory atomically: build it under a temporary name beside the target, then rename."""

from __future__ import annotations

import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from ngspec.errors import NgspecError


@contextmanager
def staged_directory(out: Path, force: bool) -> Iterator[Path]:
    """Yield a temporary directory beside ``out``; on success it replaces ``out`` atomically."""
    out = Path(out)
    if out.exists() and not force:
        raise NgspecError(f"{out} already exists (use --force to replace it)")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        yield tmp
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
