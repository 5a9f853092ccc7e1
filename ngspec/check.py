"""Checking a run against plain decoding (greedy, or sampling with the run's seed), with near-tie
margins for any mismatch.

In float32 on CPU the engine's output must equal plain decoding, short of a tie within float32
rounding (a verify step computes the same products in other shapes, about 1e-6 apart in the tiny
test models' logits). In lower precision or with other GPU kernels an argmax can flip where the two
best logits are nearly tied; the margin at the first differing position tells such a near-tie from
a real bug. Sampling picks the argmax of the log-probabilities plus the position's Gumbel noise
(`verify.Draws`), so there the margin is between the two best of those scores.

A margin means little without the size of the values it separates: 2e-5 is three float32 steps
between logits of 66, and 0.25 two bfloat16 steps between logits of 20. So the margin also comes
in rounding steps of the model's dtype at the top logit's size (sampling: over the temperature,
as the log-probabilities divide the logits by it); a split a few steps wide is rounding.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch

from ngspec.cpu_linear import stock_linears
from ngspec.decode import DecodeConfig
from ngspec.drafters import make_drafter
from ngspec.engine import Engine, one_at_a_time
from ngspec.verify import Draws, target_probs


@dataclass(frozen=True)
class GreedyCheck:
    exact_match: bool
    first_mismatch: int | None  # index into the generated tokens
    margin: float | None  # top-1 minus top-2 logit (sampling: log-probability plus noise) of plain decoding there
    steps: float | None = None  # that margin in rounding steps of ``dtype`` at the top logit's size
    dtype: str | None = None  # the model's, e.g. "float32"

    def as_dict(self) -> dict:
        return {"exact_match": self.exact_match, "first_mismatch": self.first_mismatch, "near_tie_margin": self.margin,
                "near_tie_steps": self.steps, "near_tie_dtype": self.dtype}


def rounding_step(value: float, dtype: torch.dtype) -> float:
    """The distance between neighbouring ``dtype`` values near ``value``: one rounding step there."""
    finfo = torch.finfo(dtype)
    return finfo.eps * 2.0 ** math.floor(math.log2(max(abs(value), finfo.tiny)))


def margin_text(check: dict) -> str:
    """A mismatch's margin for people (``check``: a `GreedyCheck.as_dict()`), e.g. "2.29e-05
    (3 float32 rounding steps at that logit size)"."""
    text = f"{check['near_tie_margin']:.3g}"
    if check.get("near_tie_steps") is None:
        return text
    steps = check["near_tie_steps"]
    return f"{text} ({steps:.3g} {check['near_tie_dtype']} rounding step{'' if f'{steps:.3g}' == '1' else 's'} at that logit size)"


@torch.inference_mode()
def top2_margin(engine: Engine, tokens: list[int], cfg: DecodeConfig | None = None, draws: Draws | None = None, position: int = 0) -> tuple[float, float]:
    """Top-1 minus top-2 next-token logit after ``tokens``, and that gap in rounding steps of the
    model's dtype at the top logit's size; when sampling (``draws``), of the scores the sampled
    token wins at output ``position``: log-probability plus Gumbel noise, whose rounding is the
    logits' over the temperature."""
    model = engine.loaded.model
    logits = model(torch.tensor([tokens], device=engine.target.device), logits_to_keep=1).logits[0, -1]
    step = rounding_step(float(logits.float().max()), model.dtype)
    if draws is None:
        scores = logits.float()
    else:
        scores, step = draws.scores(target_probs(logits, cfg.sampling), position), step / cfg.sampling.temperature
    top = torch.topk(scores, 2).values
    margin = float(top[0] - top[1])
    return margin, margin / step


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
        margin, steps = top2_margin(engine, prompt + reference[:first], cfg, draws, first)
    return GreedyCheck(False, first, margin, steps, str(engine.loaded.model.dtype).removeprefix("torch."))


def check_against_greedy(engine: Engine, prompt: list[int], generated: list[int], cfg: DecodeConfig, seed: int | None = None) -> GreedyCheck:
    """Decode ``prompt`` plainly (no drafts, same stops and budget) on the model's stock linear
    layers, as transformers computes it (not the engine's tuned CPU kernels), and compare with
    ``generated``. A sampled run is replayed with its ``seed`` (`Generation.seed`: the one drawn
    for it when none was given)."""
    if not cfg.sampling.greedy:
        cfg = replace(cfg, sampling=replace(cfg.sampling, seed=seed if seed is not None else cfg.sampling.seed))
    with one_at_a_time(engine.loaded.model, decoding=False), stock_linears(engine.loaded.model):  # the stock layers for this run only
        plain = engine.run(prompt, make_drafter("vanilla"), cfg).token_ids
    return divergence(engine, prompt, plain, generated, cfg, Draws.of(cfg.sampling, prompt))
