"""Capturing a fixed-shape forward as a CUDA graph: what the EAGLE head's runs
(`ngspec.eagle.graphs`) and the target's verification (`ngspec.static_verify`) share.

A graph replays the kernels of one captured run in one launch, reading its inputs from, and
writing its outputs to, the addresses the capture saw. So an owner keeps one input buffer per
shape, refills it before each replay and reads the outputs the capture returned. A capture is
preceded by one ordinary run on a side stream (lazy initialisations must happen outside it), and
an owner's graphs share one memory pool, a new one each time the owner drops them all. An
operation a capture refuses (a host read of a tensor's value, a copy from pageable host memory)
ends capturing for that owner, with one warning: its runs then go on uncaptured, at the same
fixed shapes.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable, TypeVar

import torch

T = TypeVar("T")


def bucket(n: int, least: int) -> int:
    """The smallest power of two at least ``n`` and ``least`` (a captured shape's size)."""
    b = least
    while b < n:
        b *= 2
    return b


def record(run: Callable[[], T], memory: Any) -> tuple[Any, T]:
    """``run`` captured as a CUDA graph sharing the pool ``memory``, after one warm-up run on a
    side stream; the graph and the outputs the captured run left (filled by each replay).
    Raises what the capture raises (a RuntimeError for a refused operation)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        run()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=memory):
        out = run()
    return graph, out


class Graphs:
    """One owner's captured graphs: ``captures`` and ``replays`` count them; ``failure`` says why
    capturing stopped, if it did (``enabled`` is then False)."""

    def __init__(self, what: str, enabled: bool) -> None:
        self.what, self.enabled = what, enabled
        self.captures = self.replays = 0
        self.failure: str | None = None
        self._memory = None

    def capture(self, run: Callable[[], T]) -> tuple[Any, T | None]:
        """``run`` captured (a graph and its outputs, valid after a `replay`), or (None, None)
        when not capturing or when the capture fails (warned once; nothing is captured after)."""
        if not self.enabled:
            return None, None
        if self._memory is None:
            self._memory = torch.cuda.graph_pool_handle()
        try:
            graph, out = record(run, self._memory)
        except RuntimeError as exc:
            self.enabled, self.failure = False, f"{type(exc).__name__}: {exc}".splitlines()[0]
            warnings.warn(f"ngspec: {self.what} cannot be captured as CUDA graphs here ({self.failure}); it runs uncaptured", stacklevel=3)
            return None, None
        self.captures += 1
        return graph, out

    def dropped(self) -> None:
        """The owner dropped every graph it captured (its buffers were replaced): later captures
        take a new pool. On the seventh GPU visit PyTorch's allocator asserted on a capture into a
        pool whose graphs had all been released (BENCHMARKS.md 10zs); the allocator frees the old
        pool itself."""
        self._memory = None

    def replay(self, graph: Any) -> None:
        graph.replay()
        self.replays += 1

    def report(self) -> str:
        """One line: what was captured and replayed, and whether capturing stopped."""
        return f"{self.captures} captured, {self.replays} replays; capturing {'stopped: ' + self.failure if self.failure else 'never failed'}"
