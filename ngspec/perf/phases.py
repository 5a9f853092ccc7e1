"""Methods wrapped for the length of a block: how the benchmarks attribute a decoding step's work
to its phases (drafting, verify, commit, ...) without changing the code that runs them
(`benchmarks/op_count.py` counts each phase's tensor operations, `benchmarks/step_trace.py`
labels each phase's profiler range)."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator


@contextmanager
def wrapped(phases: dict[str, tuple[object, str]], wrap: Callable[[str, Callable], Callable]) -> Iterator[None]:
    """Inside the block each phase's method (``phases``: name -> (owner, attribute)) is
    ``wrap(name, method)``; after it, however the block ends, the method itself again."""
    originals = {name: getattr(owner, attr) for name, (owner, attr) in phases.items()}
    for name, (owner, attr) in phases.items():
        setattr(owner, attr, wrap(name, originals[name]))
    try:
        yield
    finally:
        for name, (owner, attr) in phases.items():
            setattr(owner, attr, originals[name])
