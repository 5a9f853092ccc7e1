"""Measurements made once per machine setting and kept as JSON under ``$NGSPEC_CACHE/<kind>``.

The CPU kernel plan (`ngspec.cpu_linear`) and the verify-cost tables (`ngspec.perf.costs`) are
timed on first use and then read back. An entry is keyed by a hash of its setting string (what
the measurement depends on: CPU, threads, torch version, model shape, ...), written through a
temporary file and renamed, so an interrupted write leaves nothing half-written. A damaged or
unusable entry is measured again and rewritten; ``NGSPEC_RECALIBRATE=1`` measures everything
again.

A measurement is cached only if the machine was quiet while it ran: where Linux counts CPU time
(``/proc``), the share of all CPUs' time that other processes used during it is recorded, and
above `BUSY_SHARE` the result serves the run that made it but is not kept (a warning says so),
so the next run times it again. Within one run (one process: a `generate` or `bench` run, a `serve`
process, a Python session) each setting is timed at most once, whatever was kept: a server on a busy
machine, or with a cache it cannot write, timed its batch costs again for every burst of requests
(34 s at batch size 8 on two cores). Timed beside a job that kept both of two cores busy, a one-token
step slows far more than a 30-token one (every operation waits on a contended thread team), and
the cost table read every tree up to 30 nodes as free: every later run sized its trees by it
(BENCHMARKS.md 10zc). Entries cached before this record was kept are measured again.

The same watch (`CpuWatch`) times every run the user reads figures from: each generation
(`Generation.others_cpu_share`, and so `Output` and `generate --json`), a `bench` run's arms,
`profile-bound`'s sweep and `tune-tree`'s sizes, which warn above `BUSY_SHARE` (`busy_warning`):
beside one busy process on two cores the default model decoded 32x slower (10zzzh).
"""

from __future__ import annotations

import hashlib
import json
import warnings
from pathlib import Path
from typing import Callable, TypeVar

from ngspec import staging
from ngspec.errors import env_switch

T = TypeVar("T")

BUSY_SHARE = 0.2  # others' share of all CPUs' time during a measurement above which it is not cached
MIN_TICKS = 100  # all CPUs' clock ticks a measurement must span for the share to tell (both counters sample per tick)
WHAT = {"kernels": "matrix kernels", "costs": "verification costs"}
_THIS_RUN: dict[Path, object] = {}  # what this process has measured, by cache entry (kept there or not)


def _cpu_ticks() -> tuple[int, int] | None:
    """(busy, total) clock ticks of all CPUs since boot, from /proc/stat (steal time counts as
    busy: another VM's work); None where there is no such file."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    if len(fields) < 4:
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle and waiting for I/O
    total = sum(fields)  # guest time is already counted in user time
    return total - idle, total


def _own_ticks() -> int | None:
    """Clock ticks this process (all its threads) has run, user and system, from /proc/self/stat."""
    try:
        with open("/proc/self/stat") as f:
            stat = f.read()
        fields = stat[stat.rindex(")") + 2 :].split()  # after the command name, which may hold spaces
        return int(fields[11]) + int(fields[12])  # utime and stime, fields 14 and 15 of proc(5)
    except (OSError, ValueError, IndexError):
        return None


class CpuWatch:
    """Watches the share of all CPUs' time that other processes use from its making to `share()`:
    a run timed beside other work is slower than the machine is, and not evenly so (a one-token
    step slows far more than a verify of many tokens: BENCHMARKS.md 10zzzh), so a timed run
    records it and says when it was above `BUSY_SHARE`."""

    def __init__(self) -> None:
        self._cpu, self._own = _cpu_ticks(), _own_ticks()

    def share(self) -> float | None:
        """Others' share so far (to 0.1%); None where it cannot be read (no ``/proc``), or too little time
        has passed for the counters to tell (a tiny model's table takes a fraction of a second)."""
        cpu, own = _cpu_ticks(), _own_ticks()
        if self._cpu is None or self._own is None or cpu is None or own is None or cpu[1] - self._cpu[1] < MIN_TICKS:
            return None
        others = (cpu[0] - self._cpu[0]) - (own - self._own)
        return round(max(0.0, others / (cpu[1] - self._cpu[1])), 3)


def busy_warning(share: float | None, what: str) -> str | None:
    """What to tell a user whose ``what`` (e.g. "the runs") was timed while other processes used
    ``share`` of the CPUs, or None if that is under `BUSY_SHARE`."""
    if share is None or share <= BUSY_SHARE:
        return None
    return (
        f"other processes used {share:.0%} of the CPUs while {what} ran: the times are not this machine's alone, and "
        "unevenly off (shared cores slow some steps many times more than others, so even ratios between runs shift; "
        "BENCHMARKS.md 10zzzh). Time it with the machine otherwise idle; where runs must share cores, "
        "GOMP_SPINCOUNT=10000 or OMP_WAIT_POLICY=PASSIVE helps (README, Troubleshooting)."
    )


def entry_path(kind: str, setting: str) -> Path:
    from ngspec.models import cache_dir

    return cache_dir() / kind / (hashlib.sha256(setting.encode()).hexdigest()[:20] + ".json")


def measured_once(kind: str, setting: str, read: Callable[[dict], T | None], measure: Callable[[], tuple[T, dict]]) -> T:
    """The value this process measured for ``setting``, else the cached one: ``read(entry)`` of
    the stored entry (None or a ValueError/KeyError/TypeError: unusable), else ``measure()``'s
    value, whose entry fields are stored beside the setting if the machine was quiet enough while
    it ran."""
    path = entry_path(kind, setting)
    if path in _THIS_RUN:
        return _THIS_RUN[path]  # type: ignore[return-value]
    if path.is_file() and not env_switch("NGSPEC_RECALIBRATE"):
        try:
            entry = json.loads(path.read_text())
            value = read(entry) if "others_cpu_share" in entry else None  # older entries: not known to be quiet
            if value is not None:
                return value
        except (ValueError, KeyError, TypeError):
            pass  # a damaged entry is measured again and rewritten
    watch = CpuWatch()
    value, entry = measure()
    others = watch.share()
    _THIS_RUN[path] = value
    if others is not None and others > BUSY_SHARE:
        warnings.warn(
            f"ngspec: other processes used {others:.0%} of the CPUs while ngspec timed {WHAT.get(kind, kind)}, so the "
            "result serves this run only and is not cached (it is timed again next run); on a busy machine trees may "
            "be sized wrongly. Run once with the machine otherwise idle to keep a measurement.",
            RuntimeWarning, stacklevel=2,
        )
        return value
    text = json.dumps({"setting": setting, **entry, "others_cpu_share": others})
    staging.keep_in_cache(path, lambda out: staging.write_text(out, text), f"the timing of {WHAT.get(kind, kind)}")
    return value
