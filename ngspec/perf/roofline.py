"""Roofline prediction of one verification forward: FLOPs and bytes from the config, device peaks
from two microbenchmarks, predicted time = max(compute time, memory time).

A cell of the sweep verifies ``rows`` sequences of ``row_tokens`` tokens each after ``context``
cached tokens: k rows of w + 1 tokens (layout ``rows``) or one row of 1 + k·w tree nodes (``tree``).

Counted, per forward pass (s = bytes per element of the dtype, N = rows · row_tokens):

* FLOPs: 2 · N · (matrix parameters of all layers + the LM head) for the linear layers, plus
  4 · N · heads · head_dim · (context + row_tokens) for attention (scores and weighted values; the
  block's own scores are computed densely and masked, as SDPA and our row attention do).
* bytes: every weight once (the embedding table only for the N rows looked up, unless the LM head
  reuses it), the context's keys and values once (rows share them), the block's own keys and values
  (written, then read), activations (about 8 · hidden + 3 · intermediate elements per token and
  layer) and the logits (N · vocab).

Embedding lookups, norms, rotary embeddings and softmax are left out: they are small next to the
rest for every shape we time. Measured peaks, not datasheet ones, so the prediction describes what
this software stack reaches on this device.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from transformers import PretrainedConfig


@dataclass(frozen=True)
class Cost:
    flops: float
    bytes: float


def _dims(config: PretrainedConfig) -> tuple[int, int, int, int, int, int, int]:
    hidden, inter = config.hidden_size, config.intermediate_size
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    return hidden, inter, config.num_hidden_layers, heads, kv_heads, head_dim, config.vocab_size


def forward_cost(config: PretrainedConfig, rows: int, row_tokens: int, context: int, bytes_per_element: int) -> Cost:
    """FLOPs and bytes of one forward over ``rows`` × ``row_tokens`` new tokens after ``context``."""
    hidden, inter, layers, heads, kv_heads, head_dim, vocab = _dims(config)
    s = bytes_per_element
    n = rows * row_tokens
    layer_matrices = hidden * head_dim * (2 * heads + 2 * kv_heads) + 3 * hidden * inter
    tied = bool(getattr(config, "tie_word_embeddings", False))
    flops = 2.0 * n * (layers * layer_matrices + hidden * vocab)
    flops += 4.0 * layers * n * heads * head_dim * (context + row_tokens)
    weights = layers * (layer_matrices + 2 * hidden) + hidden * vocab + (0 if tied else n * hidden)
    kv_entry = layers * 2 * kv_heads * head_dim
    data = weights + kv_entry * context + 2 * kv_entry * n
    data += layers * n * (8 * hidden + 3 * inter) + n * vocab
    return Cost(flops, data * s)


def cell_cost(config: PretrainedConfig, layout: str, k: int, w: int, context: int, bytes_per_element: int) -> Cost:
    if layout == "rows":
        return forward_cost(config, k, w + 1, context, bytes_per_element)
    return forward_cost(config, 1, 1 + k * w, context, bytes_per_element)


@dataclass(frozen=True)
class DevicePeaks:
    flops_per_s: float
    bytes_per_s: float

    def predict(self, cost: Cost) -> float:
        """Seconds: whichever of compute and memory traffic takes longer."""
        return max(cost.flops / self.flops_per_s, cost.bytes / self.bytes_per_s)

    def bound(self, cost: Cost) -> str:
        return "compute" if cost.flops / self.flops_per_s > cost.bytes / self.bytes_per_s else "memory"


def _best_time(fn, device: torch.device, repeats: int) -> float:
    fn()  # warm-up
    best = float("inf")
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - start)
    return best


@torch.inference_mode()
def measure_peaks(device: torch.device, dtype: torch.dtype, repeats: int = 5) -> DevicePeaks:
    """Peak matrix-product throughput and copy bandwidth this stack reaches on ``device``."""
    n = 4096 if device.type == "cuda" else 1024
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    matmul = _best_time(lambda: torch.matmul(a, b), device, repeats)
    del a, b
    elements = (512 if device.type == "cuda" else 128) * 2**20 // 4
    src = torch.randn(elements, device=device)
    dst = torch.empty_like(src)
    copy = _best_time(lambda: dst.copy_(src), device, repeats)
    return DevicePeaks(flops_per_s=2.0 * n**3 / matmul, bytes_per_s=2.0 * src.numel() * src.element_size() / copy)
