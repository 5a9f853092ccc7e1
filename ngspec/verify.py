"""Acceptance rules: which drafted nodes the target agrees with, and the bonus token.

Knows nothing about where drafts come from. Greedy acceptance follows the target's argmax down the
tree. Sampling is lossless for deterministic drafts: at each node the siblings are tried in order,
sibling x is accepted with probability p(x) under the (renormalised) target distribution, a rejected
sibling is zeroed out, and if none is accepted the bonus token is drawn from what remains.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from ngspec.contracts import DraftTree, Verdict
from ngspec.tree import children


@dataclass(frozen=True)
class SamplingConfig:
    """Temperature 0 means greedy; top_k 0 and top_p 1.0 disable those filters."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0

    def generator(self) -> torch.Generator | None:
        """A random generator seeded with ``seed`` when sampling (None: greedy, or unseeded)."""
        return torch.Generator().manual_seed(self.seed) if not self.greedy and self.seed is not None else None

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError("temperature must be >= 0")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError("top_p must be in (0, 1]")
        if self.top_k < 0:
            raise ValueError("top_k must be >= 0")


def target_probs(logits: torch.Tensor, cfg: SamplingConfig) -> torch.Tensor:
    """The distribution sampling draws from: temperature, then top-k, then top-p (float32)."""
    scores = logits.float() / cfg.temperature
    if cfg.top_k and cfg.top_k < scores.shape[-1]:
        kth = torch.topk(scores, cfg.top_k, dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    return nucleus(probs, cfg.top_p) if cfg.top_p < 1.0 else probs


NUCLEUS_HEAD = 1024


def nucleus(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Top-p: keep the most likely tokens whose mass before them is under ``top_p``, renormalised.

    Sorting the whole vocabulary cost 3.2 ms a row on a CPU (49,152 tokens), paid for every token
    sampled; a nucleus is rarely more than a few hundred tokens, so only the head is sorted
    (`torch.topk`, 0.08 ms), widened until the nucleus ends inside it: the same tokens as a full
    sort (BENCHMARKS.md 10zm)."""
    vocab = probs.shape[-1]
    k = min(NUCLEUS_HEAD, vocab)
    while True:
        head, order = torch.topk(probs, k, dim=-1)
        before = torch.cumsum(head, dim=-1) - head
        if k == vocab or bool((before[..., -1] >= top_p).all()):
            break
        k = min(vocab, k * 8)
    kept = torch.zeros_like(probs).scatter(-1, order, head.masked_fill(before >= top_p, 0.0))
    return kept / kept.sum(dim=-1, keepdim=True)


def accept_greedy(tree: DraftTree, logits: torch.Tensor) -> Verdict:
    """Follow the target's argmax from the root; ``logits`` is ``[n+1, vocab]`` in block order."""
    return accept_argmax(tree, logits.argmax(dim=-1).tolist())


def accept_argmax(tree: DraftTree, preds: Sequence[int]) -> Verdict:
    """`accept_greedy` from the target's argmax at every block index (``preds``, at least
    ``n+1`` of them: a batch takes every row's argmax in one operation and one copy).

    Siblings may repeat a token (a search branch is appended to a tree without merging); every
    such sibling agrees with the target, so the one with the longest accepted run below it is
    taken (the first on a tie): the output is the same, only longer per call."""
    kids = children(tree)

    def run(node: int) -> list[int]:
        """Longest accepted run of block indices below block index ``node``."""
        best: list[int] = []
        for c in kids[node]:
            if tree.tokens[c - 1] == preds[node]:
                below = [c] + run(c)
                if len(below) > len(best):
                    best = below
        return best

    blocks = run(0)
    path = tuple(b - 1 for b in blocks)
    last = blocks[-1] if blocks else 0
    return Verdict(path, tuple(tree.tokens[i] for i in path) + (preds[last],))


def sample_token(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    """Draw on the host, where a seed's generator lives, wherever ``probs`` were computed."""
    return int(torch.multinomial(probs.cpu(), 1, generator=generator).item())


def accept_sampled(
    tree: DraftTree, logits: torch.Tensor, cfg: SamplingConfig, generator: torch.Generator | None
) -> Verdict:
    """Sibling-by-sibling rejection sampling with residual resampling (lossless in distribution).

    ``logits`` stay where the verify call left them: only the visited nodes' distributions come
    to the host, where the seed's generator draws."""
    kids = children(tree)
    node, path = 0, []
    while True:
        probs = target_probs(logits[node], cfg).cpu()
        accepted = None
        for child in kids[node]:
            tok = tree.tokens[child - 1]
            mass = probs.sum()
            p_tok = float(probs[tok] / mass) if mass > 0 else 0.0
            u = float(torch.rand((), generator=generator))
            if u < p_tok:
                accepted = child
                break
            probs = probs.clone()
            probs[tok] = 0.0
        if accepted is None:
            bonus = sample_token(probs / probs.sum(), generator)
            return Verdict(tuple(path), tuple(tree.tokens[i] for i in path) + (bonus,))
        path.append(accepted - 1)
        node = accepted
