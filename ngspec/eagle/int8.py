"""An EAGLE head's products in int8 on a CPU.

Drafting at batch size 1 on a CPU is bound by memory bandwidth: each target forward evicts the
head's weights from the cache, so every head run reads them again (about 33 MB in float32 for
the default model: the decoder layer and 7,216 rows of the LM head for the draft vocabulary).
With int8 weights (one scale per output row) and activations quantized on the fly (one scale
per call: PyTorch's dynamic quantized linear, fbgemm/x86 kernels) the same products read a
quarter of the bytes and run 2.6-2.9x faster from a cold cache (BENCHMARKS.md section 10p).

Drafts are only proposals, so this never changes an output; it changes which tokens the head
proposes. The head's ``fc`` stays in float32: its input holds the target's hidden state, whose
few very large channels leave one activation scale per call too coarse for the rest (on the
default model's held-out Spec-Bench answers the head's top guess agreed with the target 23.0%
of the time with ``fc`` in int8, 25.0% without, 26.2% in float32; section 10p).

PyTorch has deprecated its quantized tensors (the kernels still ship in the supported range);
`available` says whether this build has them, and where it does not, heads run in float32.
"""

from __future__ import annotations

import copy
import warnings

import torch
from torch import nn

FLOAT_LAYERS = ("fc",)  # layers of an EAGLE head kept in float32 (see the module docstring)


def available(device: torch.device | str) -> bool:
    """Whether this torch build runs int8 dynamic linear products on ``device`` (CPUs only)."""
    if torch.device(device).type != "cpu":
        return False
    try:
        engines = torch.backends.quantized.supported_engines
        return hasattr(torch.ops.quantized, "linear_dynamic") and any(e in engines for e in ("x86", "fbgemm"))
    except (AttributeError, RuntimeError):
        return False


def applies(target_model: nn.Module, head: nn.Module | None = None) -> bool:
    """Whether a head for ``target_model`` would run in int8 when asked: a float32 model on a
    CPU with int8 kernels, and an EAGLE-1 head (an EAGLE-3 head brings its own LM head)."""
    weight = target_model.get_output_embeddings().weight
    return weight.dtype == torch.float32 and available(weight.device) and not getattr(head, "own_lm_head", False)


def prepack(weight: torch.Tensor, bias: torch.Tensor | None = None):
    """``weight`` ([out, in]) as int8 with one scale per output row, packed for
    `torch.ops.quantized.linear_dynamic`, with ``bias`` (float32) folded in."""
    w = weight.detach().float().contiguous()
    scale = (w.abs().amax(dim=1).clamp_min(1e-12) / 127).double()
    with warnings.catch_warnings():  # the deprecation of quantized tensors, once per layer
        warnings.simplefilter("ignore", UserWarning)
        q = torch.quantize_per_channel(w, scale, torch.zeros(w.shape[0], dtype=torch.long), 0, torch.qint8)
        return torch.ops.quantized.linear_prepack(q, None if bias is None else bias.detach().float().contiguous())


# fbgemm's kernels below AVX-512 add pairs of u8 x s8 products in 16 bits, which saturate over the
# full 8-bit range: there the activations take 7 bits (PyTorch's reduce_range, as its own x86
# recipes do). On an AVX2-only AMD EPYC the full range put 9% relative error on the head's products
# (tests/test_int8_head.py allows 5%); 7 bits kept them inside it
REDUCE_RANGE = "AVX512" not in torch.backends.cpu.get_cpu_capability()


def product(x: torch.Tensor, packed) -> torch.Tensor:
    """``x @ W.T (+ b)`` over any leading dimensions of a float32 ``x``, for ``packed =
    prepack(W, b)``; the activations are quantized per call (8 bits, 7 below AVX-512)."""
    rows = x.reshape(-1, x.shape[-1]).contiguous()
    out = torch.ops.quantized.linear_dynamic(rows, packed, REDUCE_RANGE)
    return out.reshape(*x.shape[:-1], out.shape[-1])


class Int8Linear(nn.Module):
    """An inference-only stand-in for an `nn.Linear`, with int8 weights (see `prepack`)."""

    def __init__(self, layer: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = layer.in_features, layer.out_features
        self.packed = prepack(layer.weight, layer.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return product(x.float(), self.packed)


def float_numbers(weights: int, in_int8: bool) -> int:
    """How many float32 numbers' worth of bytes ``weights`` weights take: a quarter in int8."""
    return weights // 4 if in_int8 else weights


def float_equivalent(module: nn.Module) -> int:
    """How many float32 numbers' worth of weights ``module`` reads: its parameters, and a
    quarter of each `Int8Linear`'s weights."""
    quantized = sum(m.in_features * m.out_features for m in module.modules() if isinstance(m, Int8Linear))
    return sum(p.numel() for p in module.parameters()) + float_numbers(quantized, True)


def int8_head(head: nn.Module) -> nn.Module:
    """A copy of ``head`` (float32, on a CPU) whose linear layers, but for `FLOAT_LAYERS`, are
    `Int8Linear`; ``head`` itself is left as it was."""
    out = copy.deepcopy(head)
    for name, module in list(out.named_modules()):
        for child_name, child in list(module.named_children()):
            path = f"{name}.{child_name}" if name else child_name
            if isinstance(child, nn.Linear) and path not in FLOAT_LAYERS:
                setattr(module, child_name, Int8Linear(child))
    return out.eval()
