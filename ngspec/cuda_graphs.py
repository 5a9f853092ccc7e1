"""Capturing a fixed-shape forward as a CUDA graph: what the EAGLE head's runs
(`ngspec.eagle.graphs`) and the target's verification (`ngspec.static_verify`) share.

A graph replays the kernels of one captured run in one launch, reading its inputs from, and
writing its outputs to, the addresses the capture saw. So an owner keeps one input buffer per
shape, refills it before each replay and reads the outputs the capture returned. A shape runs
eagerly at its first use (which is the warm-up a capture needs: lazy initialisations must happen
outside it), is captured at its second and replayed from then on (`Graphs.run`): a shape used
once costs one ordinary run instead of a warm-up, a capture and a replay. An owner's graphs share
one memory pool, a new one each time the owner drops them all. An operation a capture refuses (a
host read of a tensor's value, a copy from pageable host memory) ends capturing for that owner,
with one warning: its runs then go on uncaptured, at the same fixed shapes.

Runs at a new shape (a first use, a capture) take many times a replay's time: on the seventh GPU
visit a batch of 32 rows captured 25-30 shapes per run (BENCHMARKS.md 10zs). `Graphs.cold` counts
them, and `Graphs.cold_seconds` and `Graphs.capture_seconds` sum their time and the captures', so
that what a run learns from its own step times (the verify cost, the head's cost) can leave such
runs out, and reports can say what capturing cost.
"""

from __future__ import annotations

import time
import warnings
from contextlib import nullcontext
from typing import Any, Callable, Generic, TypeVar

import torch

T = TypeVar("T")
_STREAMS: dict[int, Any] = {}  # the side stream every capture on a device runs on (made at its first)


def bucket(n: int, least: int) -> int:
    """The smallest power of two at least ``n`` and ``least`` (a captured shape's size)."""
    b = least
    while b < n:
        b *= 2
    return b


def record(run: Callable[[], T], memory: Any) -> tuple[Any, T]:
    """``run`` captured as a CUDA graph sharing the pool ``memory`` (its shape already run once,
    eagerly: `Graphs.run`); the graph and the outputs the captured run left (filled by each
    replay). Raises what the capture raises (a RuntimeError for a refused operation).

    This is `torch.cuda.graph` without what it does on entry beyond capturing: a device
    synchronisation, `torch.cuda.empty_cache()` and emptying the pinned host memory cache. Those
    free memory for a capture that follows a training step; here a capture comes in the middle of
    a decoding run, whose next ordinary operations would allocate all that memory again."""
    device = torch.cuda.current_device()
    side = _STREAMS.get(device)
    if side is None:
        side = _STREAMS[device] = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(side):
        graph.capture_begin(pool=memory)
        try:
            out = run()
        finally:
            graph.capture_end()
    torch.cuda.current_stream().wait_stream(side)
    return graph, out


class Slot(Generic[T]):
    """One shape's graph: its uses so far, and once captured the graph and its outputs."""

    def __init__(self) -> None:
        self.uses = 0
        self.graph: Any = None
        self.out: T | None = None


def met_once(slots) -> int:
    """How many of these shapes' ``slots`` ran once only (never captured: `Graphs.run`)."""
    return sum(slot.uses == 1 for slot in slots)


class Graphs:
    """One owner's captured graphs: ``captures`` and ``replays`` count them, ``capture_seconds``
    sums the captures' time, ``cold`` counts the runs at a shape not yet replayed (first uses and
    captures, while capturing) and ``cold_seconds`` their time, captures included; ``failure``
    says why capturing stopped, if it did (``enabled`` is then False)."""

    def __init__(self, what: str, enabled: bool, device: torch.device | None = None) -> None:
        self.what, self.enabled = what, enabled
        self.device = device  # where the owner's tensors are: captures run with it current
        self.captures = self.replays = self.cold = 0
        self.capture_seconds = self.cold_seconds = 0.0
        self.failure: str | None = None
        self._memory = None

    def run(self, slot: Slot[T], run: Callable[[], T]) -> T:
        """``run``'s outputs at ``slot``'s shape: run eagerly at its first use, captured at its
        second (then replayed), replayed after; run eagerly every time when not capturing."""
        slot.uses += 1
        if slot.graph is not None:
            self.replay(slot.graph)
            return slot.out
        if not self.enabled:
            return run()
        started = time.perf_counter()
        self.cold += 1
        if slot.uses == 2:  # a failed capture is not tried again: capturing has stopped
            slot.graph, slot.out = self.capture(run)
        if slot.graph is None:
            out = run()
        else:
            self.replay(slot.graph)
            out = slot.out
        self.cold_seconds += time.perf_counter() - started  # host time (a small model's runs are host-bound)
        return out

    def capture(self, run: Callable[[], T]) -> tuple[Any, T | None]:
        """``run`` captured (a graph and its outputs, valid after a `replay`), or (None, None)
        when not capturing or when the capture fails (warned once; nothing is captured after)."""
        if not self.enabled:
            return None, None
        on_device = torch.cuda.device(self.device) if self.device is not None and self.device.type == "cuda" else nullcontext()
        started = time.perf_counter()
        try:
            with on_device:  # a model on cuda:1 is captured on cuda:1's streams and pools
                if self._memory is None:
                    self._memory = torch.cuda.graph_pool_handle()
                graph, out = record(run, self._memory)
        except RuntimeError as exc:
            self.enabled, self.failure = False, f"{type(exc).__name__}: {exc}".splitlines()[0]
            warnings.warn(f"ngspec: {self.what} cannot be captured as CUDA graphs here ({self.failure}); it runs uncaptured", stacklevel=3)
            return None, None
        self.capture_seconds += time.perf_counter() - started  # host time: capturing issues no device work
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
        """One line: what was captured (and in how long) and replayed, and whether capturing stopped."""
        return (f"{self.captures} captured in {self.capture_seconds:.2f} s, {self.replays} replays, "
                f"{self.cold} runs at new shapes in {self.cold_seconds:.2f} s; "
                f"capturing {'stopped: ' + self.failure if self.failure else 'never failed'}")
