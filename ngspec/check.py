"""Checking a run against plain greedy decoding, with near-tie margins for any mismatch.

In float32 on CPU the engine's output must equal plain greedy, short of a tie within float32
rounding (a verify step computes the same products in other shapes, about 1e-6 apart in the tiny
test models' logits). In lower precision or with other GPU kernels an argmax can flip where the two
best logits are nearly tied; the margin at the first differing position tells such a near-tie from
a real bug.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ngspec.cpu_linear import stock_linears
from ngspec.decode import DecodeConfig
from ngspec.drafters import make_drafter
from ngspec.engine import Engine


@dataclass(frozen=True)
class GreedyCheck:
    exact_match: bool
    first_mismatch: int | None  # index into the generated tokens
    margin: float | None  # top-1 minus top-2 logit of plain greedy at that position

    def as_dict(self) -> dict:
        return {"exact_match": self.exact_match, "first_mismatch": self.first_mismatch, "near_tie_margin": self.margin}


@torch.inference_mode()
def top2_margin(engine: Engine, tokens: list[int]) -> float:
    """Top-1 minus top-2 next-token logit after ``tokens``."""
    model = engine.loaded.model
    logits = model(torch.tensor([tokens], device=engine.target.device), logits_to_keep=1).logits[0, -1]
    top = torch.topk(logits.float(), 2).values
    return float(top[0] - top[1])


def divergence(engine: Engine, prompt: list[int], reference: list[int], generated: list[int]) -> GreedyCheck:
    """Compare ``generated`` with a greedy ``reference`` of the same prompt; at the first differing
    position, the reference's top-2 logit margin (computed on the stock layers) says whether the
    two runs split at a near-tie."""
    if generated == reference:
        return GreedyCheck(True, None, None)
    first = next((i for i, (a, b) in enumerate(zip(reference, generated)) if a != b), min(len(reference), len(generated)))
    with stock_linears(engine.loaded.model):
        return GreedyCheck(False, first, top2_margin(engine, prompt + reference[:first]))


def check_against_greedy(engine: Engine, prompt: list[int], generated: list[int], cfg: DecodeConfig) -> GreedyCheck:
    """Decode ``prompt`` plainly (no drafts, same stops and budget) on the model's stock linear
    layers, as transformers computes it (not the engine's tuned CPU kernels), and compare with
    ``generated``."""
    with stock_linears(engine.loaded.model):
        plain = engine.run(prompt, make_drafter("vanilla"), cfg).token_ids
    return divergence(engine, prompt, plain, generated)
