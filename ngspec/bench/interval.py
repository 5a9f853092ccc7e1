"""How sure a measured speed ratio is: a paired bootstrap over prompts.

A speedup of 1.01x over eight prompts says little by itself: prompts differ in how much a drafter
finds to copy, and a shared machine slows some runs. Both arms run every prompt back to back, so
each prompt gives a pair (the arm's tokens and seconds, the reference's), and resampling the
prompts with replacement, keeping each pair whole, shows how far the total-throughput ratio moves
with the choice of prompts and the noise within each pair. The interval is the middle
``confidence`` share of the resampled ratios (percentile bootstrap); an arm is ahead when its
lower end is above 1. A prompt run in several rounds is resampled with all its pairs together
(``keys``): more rounds average its timing noise, but they are not more prompts. Seeded, so a
report is reproducible. Batches (`bench --batch-size`) run
all prompts as one batch per round, so there the rounds are the pairs (`rounds_interval`).
"""

from __future__ import annotations

import math
import random
from typing import Hashable, Sequence

Run = tuple[float, float]  # (tokens, seconds) of one prompt's run


def throughput_ratio(arm: Sequence[Run], reference: Sequence[Run]) -> float:
    """Total tokens per total second of ``arm`` over the same for ``reference``."""
    return (sum(t for t, _ in arm) / sum(s for _, s in arm)) / (sum(t for t, _ in reference) / sum(s for _, s in reference))


def ratio_interval(
    arm: Sequence[Run],
    reference: Sequence[Run],
    confidence: float = 0.95,
    resamples: int = 2000,
    seed: int = 0,
    keys: Sequence[Hashable] | None = None,
) -> tuple[float, float] | None:
    """The ``confidence`` interval of `throughput_ratio` with the prompts (pairs ``arm[i]``,
    ``reference[i]``) resampled; None with fewer than two prompts (nothing to resample).
    ``keys[i]`` names the prompt of pair i when a prompt has several pairs (rounds, or runs from
    several files): a prompt's pairs are then resampled together, so that running the same
    prompts again narrows the interval only by the timing noise it averages, not as if they
    were new prompts."""
    if len(arm) != len(reference):
        raise ValueError("every prompt needs a run of both arms")
    if keys is not None and len(keys) != len(arm):
        raise ValueError("every pair needs a key (its prompt)")
    if not 0.0 < confidence < 1.0:
        raise ValueError("confidence must be between 0 and 1")
    # each prompt's pairs summed: (tokens, seconds) of the arm and of the reference
    clusters: dict[Hashable, list[float]] = {}
    for i, ((t, s), (rt, rs)) in enumerate(zip(arm, reference)):
        total = clusters.setdefault(i if keys is None else keys[i], [0.0, 0.0, 0.0, 0.0])
        total[0] += t
        total[1] += s
        total[2] += rt
        total[3] += rs
    sums = list(clusters.values())
    n = len(sums)
    if n < 2:
        return None
    rng = random.Random(seed)
    ratios = []
    for _ in range(resamples):
        picks = [sums[i] for i in rng.choices(range(n), k=n)]
        ratios.append(throughput_ratio([(c[0], c[1]) for c in picks], [(c[2], c[3]) for c in picks]))
    ratios.sort()
    tail = (1.0 - confidence) / 2
    return ratios[int(tail * (resamples - 1))], ratios[int(round((1.0 - tail) * (resamples - 1)))]


# Student's t at 97.5% by degrees of freedom (1-30); beyond, the normal's 1.96
T_975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
         2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def rounds_interval(ratios: Sequence[float]) -> tuple[float, float] | None:
    """The 95% interval of a speed ratio measured once per round (batches: a round is one pair of
    whole runs, so the prompts cannot be resampled): Student's t over the rounds' log ratios,
    their geometric mean plus or minus t times the standard error. None with fewer than two
    rounds. Three rounds that differ by 3% give an interval about 8% wide: that is how little a
    few rounds tell apart."""
    n = len(ratios)
    if n < 2:
        return None
    if any(r <= 0 for r in ratios):
        raise ValueError("ratios must be positive")
    logs = [math.log(r) for r in ratios]
    mean = sum(logs) / n
    spread = math.sqrt(sum((x - mean) ** 2 for x in logs) / (n - 1))
    t = T_975[n - 2] if n - 1 <= len(T_975) else 1.96
    half = t * spread / math.sqrt(n)
    return math.exp(mean - half), math.exp(mean + half)
