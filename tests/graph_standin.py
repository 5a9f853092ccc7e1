"""A CPU stand-in for CUDA graph captures (`ngspec.cuda_graphs.record`), for the tests of the EAGLE
head's runs and the target's verification at fixed shapes.

A capture records the run without its result: the outputs are left as NaN, as a captured graph's
memory holds no result until replayed. A replay runs it again, writing into the same output
tensors, as a graph replays into the addresses it captured. As a GPU's capture does, it refuses
what cannot be captured: Python values assigned by index, host reads of a tensor's value and the
rest of `UNCAPTURABLE`. ``fail`` makes every capture raise as an uncapturable operation does.

Each pool (`torch.cuda.graph_pool_handle`) counts its live graphs, as PyTorch's allocator does, and
a capture into a pool whose graphs were all released raises the error PyTorch's allocator raised
on the seventh GPU visit, where the head's batched runs stopped capturing once its cache first
grew (BENCHMARKS.md 10zs): an owner that drops every graph must take a new pool."""

from __future__ import annotations

import contextlib
import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ngspec import cuda_graphs

# operations a CUDA graph capture refuses or cannot replay: a tensor's value read on the host
# (`.item()`, `bool()`, `.tolist()`), outputs sized by their values (which wait for the device),
# and tensors made from Python data (a copy from the host)
# (on a CPU `.item()` and `bool()` dispatch as item and is_nonzero; a boolean mask as an index
# runs nonzero on a GPU)
UNCAPTURABLE = {
    "aten._local_scalar_dense.default", "aten.item.default", "aten.is_nonzero.default", "aten.equal.default",
    "aten.nonzero.default", "aten.masked_select.default", "aten._unique2.default", "aten.unique_consecutive.default",
    "aten.lift_fresh.default", "aten.repeat_interleave.Tensor",
}
MASK_INDEXED = {"aten.index.Tensor", "aten.index_put_.default", "aten.index_put.default"}
REFUSED = "CUDA error: operation not permitted when stream is capturing"
RELEASED = 'it->second->use_count > 0 INTERNAL ASSERT FAILED at "/pytorch/c10/cuda/CUDACachingAllocator.cpp"'


class Pool:
    """A graph pool handle that counts its live graphs (``use_count``) and whether it had any."""

    def __init__(self) -> None:
        self.use_count = 0
        self.used = False

    def release(self) -> None:
        self.use_count -= 1


class RefuseUncapturable(TorchDispatchMode):
    """Inside a stand-in capture: raise on any of `UNCAPTURABLE`, or a boolean mask used as an
    index, as a GPU's capture would."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func)
        masked = name in MASK_INDEXED and any(i is not None and i.dtype in (torch.bool, torch.uint8) for i in args[1])
        if name in UNCAPTURABLE or masked:
            raise RuntimeError(f"{REFUSED} ({name})")
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def refusing():
    """What a capture refuses, refused."""
    setitem = torch.Tensor.__setitem__

    def no_host_values(tensor, index, value):
        # on a GPU a Python number assigned to a CUDA tensor's items is made a host tensor
        # first, and copying that inside a capture fails (the sixth visit's first capture did)
        if not isinstance(value, torch.Tensor):
            raise RuntimeError("Cannot copy between CPU and CUDA tensors during CUDA graph capture unless the CPU tensor is pinned.")
        return setitem(tensor, index, value)

    torch.Tensor.__setitem__ = no_host_values
    try:
        with RefuseUncapturable():
            yield
    finally:
        torch.Tensor.__setitem__ = setitem


def _tensors(out) -> list[torch.Tensor]:
    """The tensors of a run's outputs (a tensor, or a tuple of tensors and Nones)."""
    if isinstance(out, torch.Tensor):
        return [out]
    return [t for t in out if t is not None]


class Replayable:
    """A recorded run: each replay runs it again into the outputs the capture returned."""

    def __init__(self, run, out) -> None:
        self.run, self.out = run, out

    def replay(self) -> None:
        for captured, fresh in zip(_tensors(self.out), _tensors(self.run())):
            captured.copy_(fresh)


class StandInGraphs:
    def __init__(self, monkeypatch, fail: bool = False) -> None:
        self.fail = fail
        monkeypatch.setattr(torch.cuda, "graph_pool_handle", Pool)
        monkeypatch.setattr(cuda_graphs, "record", self.record)

    def record(self, run, memory: Pool):
        if memory.used and memory.use_count == 0:
            raise RuntimeError(RELEASED)
        with refusing():
            out = run()
        if self.fail:
            raise RuntimeError(REFUSED)
        for t in _tensors(out):
            if t.is_floating_point():
                t.fill_(float("nan"))
        graph = Replayable(run, out)
        memory.use_count += 1
        memory.used = True
        weakref.finalize(graph, memory.release)
        return graph, out
