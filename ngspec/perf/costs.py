"""Measured verify cost by tree size, relative to a one-token decoding step.

On CPUs the cost of a forward pass grows unevenly with the number of tokens (the default model on
two cores: 2 tokens about 1.1x a single token, 3 tokens 1.5x, 9 tokens 2x), so drafters size trees
from measurements, not intuition. The table is measured once per engine with random tokens at a
given context length.
"""

from __future__ import annotations

import statistics
import time

import torch

from ngspec.contracts import DraftTree
from ngspec.target import TargetModel


def measure_verify_costs(target: TargetModel, max_nodes: int, context: int = 512, repeats: int = 3) -> tuple[float, ...]:
    """Relative cost of verifying 0..max_nodes nodes (index = tree size), interpolated between
    measured sizes and made non-decreasing."""
    context = max(1, min(context, target.max_length - max_nodes - 2))
    vocab = int(target.model.config.vocab_size)
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(1, vocab, (context,), generator=gen).tolist()
    target.prefill(prompt)
    sizes = sorted({0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, max_nodes} & set(range(max_nodes + 1)))
    measured = {}
    for size in [0] + sizes:  # the first run of size 0 is a warm-up
        tree = DraftTree.chain(torch.randint(1, vocab, (size,), generator=gen).tolist())
        samples = []
        for _ in range(repeats):
            start = time.perf_counter()
            target.verify(prompt[-1], tree)
            target.commit([])
            if target.device.type == "cuda":
                torch.cuda.synchronize(target.device)  # kernels run asynchronously
            samples.append(time.perf_counter() - start)
        measured[size] = statistics.median(samples)
    base = measured[0]
    table, running = [], 1.0
    for n in range(max_nodes + 1):
        lo = max(s for s in sizes if s <= n)
        hi = min(s for s in sizes if s >= n)
        value = measured[lo] if hi == lo else measured[lo] + (measured[hi] - measured[lo]) * (n - lo) / (hi - lo)
        running = max(running, value / base)
        table.append(running)
    return tuple(table)
