"""Measurements made once per machine setting and kept as JSON under ``$NGSPEC_CACHE/<kind>``.

The CPU kernel plan (`ngspec.cpu_linear`) and the verify-cost tables (`ngspec.perf.costs`) are
timed on first use and then read back. An entry is keyed by a hash of its setting string (what
the measurement depends on: CPU, threads, torch version, model shape, ...), written through a
temporary file and renamed, so an interrupted write leaves nothing half-written. A damaged or
unusable entry is measured again and rewritten; ``NGSPEC_RECALIBRATE=1`` measures everything
again.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Callable, TypeVar

from ngspec import staging

T = TypeVar("T")


def measured_once(kind: str, setting: str, read: Callable[[dict], T | None], measure: Callable[[], tuple[T, dict]]) -> T:
    """The cached value for ``setting``: ``read(entry)`` of the stored entry (None or a
    ValueError/KeyError/TypeError: unusable), else ``measure()``'s value, whose entry fields are
    stored beside the setting."""
    from ngspec.models import cache_dir

    path = cache_dir() / kind / (hashlib.sha256(setting.encode()).hexdigest()[:20] + ".json")
    if path.is_file() and not os.environ.get("NGSPEC_RECALIBRATE"):
        try:
            value = read(json.loads(path.read_text()))
            if value is not None:
                return value
        except (ValueError, KeyError, TypeError):
            pass  # a damaged entry is measured again and rewritten
    value, entry = measure()
    path.parent.mkdir(parents=True, exist_ok=True)
    staging.write_text(path, json.dumps({"setting": setting, **entry}))
    return value
