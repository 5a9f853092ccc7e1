"""This process's memory: resident now, and free heap pages handed back to the OS."""

from __future__ import annotations

import os
from pathlib import Path


def resident_bytes() -> int | None:
    """Resident memory of this process now (Linux's /proc), or None where unknown."""
    try:
        return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def resident_gb() -> float | None:
    """`resident_bytes` in GB."""
    rss = resident_bytes()
    return None if rss is None else rss / 2**30


def release_free_memory() -> bool:
    """Return freed heap pages to the OS (glibc's malloc_trim, Arrow's pool), so a peak that follows
    is not stacked on memory already let go of, and resident memory counts what is held. Whether
    malloc_trim ran (False where the C library is not glibc)."""
    import ctypes
    import ctypes.util

    try:
        import pyarrow

        pyarrow.default_memory_pool().release_unused()
    except (ImportError, AttributeError):
        pass
    libc = ctypes.util.find_library("c")
    if libc:
        try:
            ctypes.CDLL(libc).malloc_trim(0)
            return True
        except (OSError, AttributeError):
            pass  # not glibc: nothing to trim
    return False
