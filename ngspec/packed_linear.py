"""Linear layers with weights pre-packed for MKL, for verifying draft trees on CPUs.

On CPUs a forward pass over 4 to 32 tokens costs far more than over 1 to 3: for those shapes the
default float32 matrix product re-packs every weight matrix on every call, which for a
memory-bound model is like reading the weights twice (the default model on two cores: 4 tokens
1.6x a one-token step, 16 tokens 2.6x). Packing each weight once, at load time, and calling MKL's
packed product (`torch.ops.mkl._mkl_linear`, what torch's own compiler uses when it freezes CPU
weights) removes that copy (4 tokens 1.3x, 16 tokens 1.8x: BENCHMARKS.md section 1). One to three
rows keep the ordinary product, which is already the fastest there, so plain decoding is
unchanged.

The packed copy costs about twice the weights' memory, so packing is skipped when that would take
more than a quarter of the machine's memory, and ``NGSPEC_CPU_PACK=0`` turns it off.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Iterator

import torch
from torch import nn

PACKED_MIN_ROWS = 4  # below this the ordinary product is as fast (measured on the team's CPU)


class PackedLinear(nn.Linear):
    """An `nn.Linear` (same parameters, same state dict) that also holds its weight packed for
    MKL and uses it for inference on ``PACKED_MIN_ROWS`` or more rows."""

    packed: torch.Tensor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
        if rows < PACKED_MIN_ROWS or x.dtype != torch.float32 or (torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad)):
            return super().forward(x)
        flat = x.reshape(rows, x.shape[-1])
        out = torch.ops.mkl._mkl_linear(flat, self.packed, self.weight, self.bias, rows)
        return out.reshape(*x.shape[:-1], out.shape[-1])


def packing_wanted(model: nn.Module) -> bool:
    """Whether to pack ``model``'s linear layers: on a CPU, in float32, with MKL, when the
    packed copies fit comfortably in memory, unless ``NGSPEC_CPU_PACK=0``."""
    if os.environ.get("NGSPEC_CPU_PACK", "1") == "0" or not torch.backends.mkl.is_available():
        return False
    param = next(model.parameters())
    if param.device.type != "cpu" or param.dtype != torch.float32:
        return False
    weight_bytes = sum(m.weight.numel() * 4 for m in model.modules() if isinstance(m, nn.Linear))
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return False
    return 2 * weight_bytes < memory // 4


def pack_linears(model: nn.Module) -> int:
    """Turn every float32 `nn.Linear` of ``model`` into a `PackedLinear` in place (idempotent);
    returns how many layers are packed."""
    packed = 0
    for module in model.modules():
        if type(module) is nn.Linear and module.weight.dtype == torch.float32:
            module.__class__ = PackedLinear
            module.packed = torch.ops.mkl._mkl_reorder_linear_weight(module.weight.detach(), 64)
        packed += isinstance(module, PackedLinear)
    return packed


def pack_if_wanted(model: nn.Module) -> int:
    """`pack_linears` where `packing_wanted` says so; returns how many layers are packed (0: not)."""
    return pack_linears(model) if packing_wanted(model) else 0


@contextmanager
def stock_linears(model: nn.Module) -> Iterator[nn.Module]:
    """``model`` with its packed layers working as plain `nn.Linear` inside the block (the packed
    copies are kept and back in use after it): how transformers itself would run the model, for
    the ecosystem baselines of `ngspec bench`."""
    packed = [m for m in model.modules() if type(m) is PackedLinear]
    for module in packed:
        module.__class__ = nn.Linear
    try:
        yield model
    finally:
        for module in packed:
            module.__class__ = PackedLinear
