"""Checking a run against plain decoding (greedy, or sampling with the run's seed), with near-tie
margins for any mismatch.

In float32 on CPU the engine's output must equal plain decoding, short of a tie within float32
rounding (a verify step computes the same products in other shapes, about 1e-6 apart in the tiny
test models' logits). In lower precision or with other GPU kernels an argmax can flip where the two
best logits are nearly tied; the margin at the first differing position tells such a near-tie from
a real bug. Sampling picks the argmax of the log-probabilities plus the position's Gumbel noise
(`verify.Draws`), so there the margin is between the two best of those scores.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from ngspec.cpu_linear import stock_linears
from ngspec.decode import DecodeConfig
from ngspec.drafters import make_drafter
from ngspec.engine import Engine
from ngspec.verify import Draws, target_probs


@dataclass(frozen=True)
class GreedyCheck:
    exact_match: bool
    first_mismatch: int | None  # index into the generated tokens
    margin: float | None  # top-1 minus top-2 logit (sampling: log-probability plus noise) of plain decoding there

    def as_dict(self) -> dict:
        return {"exact_match": self.exact_match, "first_mismatch": self.first_mismatch, "near_tie_margin": self.margin}


@torch.inference_mode()
def top2_margin(engine: Engine, tokens: list[int], cfg: DecodeConfig | None = None, draws: Draws | None = None, position: int = 0) -> float:
    """Top-1 minus top-2 next-token logit after ``tokens``; when sampling (``draws``), of the
    scores the sampled token wins at output ``position``: log-probability plus Gumbel noise."""
    model = engine.loaded.model
    logits = model(torch.tensor([tokens], device=engine.target.device), logits_to_keep=1).logits[0, -1]
    scores = logits.float() if draws is None else draws.scores(target_probs(logits, cfg.sampling), position)
    top = torch.topk(scores, 2).values
    return float(top[0] - top[1])


def divergence(
    engine: Engine, prompt: list[int], reference: list[int], generated: list[int], cfg: DecodeConfig | None = None, draws: Draws | None = None
) -> GreedyCheck:
    """Compare ``generated`` with a plain ``reference`` of the same prompt (greedy; sampled when
    ``draws`` are given); at the first differing position, the reference's top-2 margin (computed
    on the stock layers) says whether the two runs split at a near-tie."""
    if generated == reference:
        return GreedyCheck(True, None, None)
    first = next((i for i, (a, b) in enumerate(zip(reference, generated)) if a != b), min(len(reference), len(generated)))
    with stock_linears(engine.loaded.model):
        return GreedyCheck(False, first, top2_margin(engine, prompt + reference[:first], cfg, draws, first))


def check_against_greedy(engine: Engine, prompt: list[int], generated: list[int], cfg: DecodeConfig, seed: int | None = None) -> GreedyCheck:
    """Decode ``prompt`` plainly (no drafts, same stops and budget) on the model's stock linear
    layers, as transformers computes it (not the engine's tuned CPU kernels), and compare with
    ``generated``. A sampled run is replayed with its ``seed`` (`Generation.seed`: the one drawn
    for it when none was given)."""
    if not cfg.sampling.greedy:
        cfg = replace(cfg, sampling=replace(cfg.sampling, seed=seed if seed is not None else cfg.sampling.seed))
    with stock_linears(engine.loaded.model):
        plain = engine.run(prompt, make_drafter("vanilla"), cfg).token_ids
    return divergence(engine, prompt, plain, generated, cfg, Draws.of(cfg.sampling, prompt))
