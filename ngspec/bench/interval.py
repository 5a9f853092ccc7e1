"""How sure a measured speed ratio is: a paired bootstrap over prompts.

A speedup of 1.01x over eight prompts says little by itself: prompts differ in how much a drafter
finds to copy, and a shared machine slows some runs. Both arms run every prompt back to back, so
each prompt gives a pair (the arm's tokens and seconds, the reference's), and resampling the
prompts with replacement, keeping each pair whole, shows how far the total-throughput ratio moves
with the choice of prompts and the noise within each pair. The interval is the middle
``confidence`` share of the resampled ratios (percentile bootstrap); an arm is ahead when its
lower end is above 1. Seeded, so a report is reproducible.
"""

from __future__ import annotations

import random
from typing import Sequence

Run = tuple[float, float]  # (tokens, seconds) of one prompt's run


def throughput_ratio(arm: Sequence[Run], reference: Sequence[Run]) -> float:
    """Total tokens per total second of ``arm`` over the same for ``reference``."""
    return (sum(t for t, _ in arm) / sum(s for _, s in arm)) / (sum(t for t, _ in reference) / sum(s for _, s in reference))


def ratio_interval(
    arm: Sequence[Run], reference: Sequence[Run], confidence: float = 0.95, resamples: int = 2000, seed: int = 0
) -> tuple[float, float] | None:
    """The ``confidence`` interval of `throughput_ratio` with the prompts (pairs ``arm[i]``,
    ``reference[i]``) resampled; None with fewer than two prompts (nothing to resample)."""
    if len(arm) != len(reference):
        raise ValueError("every prompt needs a run of both arms")
    if not 0.0 < confidence < 1.0:
        raise ValueError("confidence must be between 0 and 1")
    n = len(arm)
    if n < 2:
        return None
    rng = random.Random(seed)
    ratios = []
    for _ in range(resamples):
        picks = rng.choices(range(n), k=n)
        ratios.append(throughput_ratio([arm[i] for i in picks], [reference[i] for i in picks]))
    ratios.sort()
    tail = (1.0 - confidence) / 2
    return ratios[int(tail * (resamples - 1))], ratios[int(round((1.0 - tail) * (resamples - 1)))]
