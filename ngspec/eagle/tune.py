"""Tree-shape tuning (READER): measure how often each node of a large static EAGLE tree is
accepted, prune the least-accepted nodes, and search the node count that maximises tokens/s.

A node is on the accepted path only if its parent is, so a child's acceptance rate never exceeds
its parent's: keeping the m most-accepted nodes (ties to the shallower) is always a connected
tree, and ``1 + sum of the kept rates`` is the expected tokens per call it will give. Wall time is
what we maximise, and it is measured, not modelled: each candidate node count decodes the
calibration prompts at the chosen batch size: a geometric scan over the node count finds the
region of the best, and a golden-section search inside it picks the count (`coarse_then_golden`).
Counts are timed side by side (`SideBySide`): each group of prompts is decoded with every count of
a comparison back to back, so a shared machine that slows for a while slows them alike, and the
search's best few are timed again together at the end (`playoff`), which says how far the winner
is ahead of the runner-up and how sure that is (a paired bootstrap over the prompt groups).
"""

from __future__ import annotations

import heapq
import math
from collections import Counter
from dataclasses import dataclass
from typing import Callable, Sequence

from ngspec.bench.interval import ratio_interval, throughput_ratio
from ngspec.contracts import DraftContext, DraftTree
from ngspec.eagle.batched import Drafting, drive
from ngspec.tree import accepted_path

Choice = tuple[int, ...]


def large_tree(width: int, depth: int, nodes: int) -> tuple[Choice, ...]:
    """The ``nodes`` most plausible rank paths up to ``width`` children and ``depth`` levels,
    under a prior where the child of rank r is taken with weight 1 / (r + 2) (a child always
    scores below its parent, so the set is a connected tree). No node of ``nodes`` has more than
    ``nodes`` children or levels above it, so a wider or deeper bound changes nothing (and a width of
    a million pushed a million candidates per node taken)."""
    width, depth = min(width, nodes), min(depth, nodes)
    heap: list[tuple[float, Choice]] = [(-1.0 / (r + 2), (r,)) for r in range(width)]
    heapq.heapify(heap)
    out: list[Choice] = []
    while heap and len(out) < nodes:
        neg, path = heapq.heappop(heap)
        out.append(path)
        if len(path) < depth:
            for r in range(width):
                heapq.heappush(heap, (neg / (r + 2), path + (r,)))
    return tuple(sorted(out, key=lambda p: (len(p), p)))


class AcceptanceRecorder:
    """Wraps a static-tree EAGLE drafter and counts, per rank path, how often that node was on
    the accepted path (counts shared by every row of a batch)."""

    def __init__(self, drafter, accepted: Counter, steps: Counter) -> None:
        self.drafter, self.accepted, self.steps = drafter, accepted, steps
        self.name = drafter.name
        self.needs_features = getattr(drafter, "needs_features", False)
        self._tree: DraftTree | None = None

    def start(self, prompt: Sequence[int]) -> None:
        self.drafter.start(prompt)
        self._tree = None

    def propose(self, ctx: DraftContext) -> DraftTree:
        return drive(self.drafting(ctx))

    def drafting(self, ctx: DraftContext) -> Drafting:
        self._tree = yield from self.drafter.drafting(ctx)
        self._choices = self.drafter.last_choices
        return self._tree

    def observe(self, new_tokens: Sequence[int]) -> None:
        self.drafter.observe(new_tokens)
        if self._tree is None:
            return
        self.steps["steps"] += 1
        for node in accepted_path(self._tree, list(new_tokens)[:-1]):  # the last token is the bonus
            self.accepted[self._choices[node]] += 1
        self._tree = None


def acceptance_rates(accepted: Counter, steps: int, choices: Sequence[Choice]) -> dict[Choice, float]:
    return {c: accepted[c] / steps if steps else 0.0 for c in choices}


def prune(rates: dict[Choice, float], nodes: int) -> tuple[Choice, ...]:
    """The ``nodes`` most-accepted paths (ties: shallower, then lower ranks): a connected tree."""
    ranked = sorted(rates, key=lambda c: (-rates[c], len(c), c))
    kept = set()
    for c in ranked:
        if len(kept) == nodes:
            break
        if len(c) == 1 or c[:-1] in kept:  # equal rates could put a child before its parent
            kept.add(c)
    return tuple(sorted(kept, key=lambda p: (len(p), p)))


def expected_tokens(rates: dict[Choice, float], shape: Sequence[Choice]) -> float:
    """Expected tokens per call of a pruned tree (the bonus token plus each node's rate)."""
    return 1.0 + sum(rates[c] for c in shape)


Together = Callable[[Sequence[int]], None]  # measure these points side by side before they are read


def golden_section_max(f: Callable[[int], float], lo: int, hi: int, together: Together | None = None) -> int:
    """Integer argmax of a unimodal ``f`` on [lo, hi] by golden-section search (each value
    evaluated once; the ends are evaluated too, so a monotone ``f`` is handled). ``together``,
    when given, is first handed each set of points that is compared: the two inner points of a
    step, then the last bracket with the ends."""
    memo: dict[int, float] = {}

    def value(x: int) -> float:
        if x not in memo:
            memo[x] = f(x)
        return memo[x]

    ratio = (math.sqrt(5) - 1) / 2
    a, b = lo, hi
    while b - a > 3:
        c = round(b - ratio * (b - a))
        d = round(a + ratio * (b - a))
        if c == d:
            d = c + 1
        if together:
            together([c, d])
        if value(c) >= value(d):
            b = d
        else:
            a = c
    rest = [*range(a, b + 1), lo, hi]
    if together:
        together(rest)
    for x in rest:
        value(x)
    return max(memo, key=lambda x: (memo[x], -x))


def coarse_then_golden(f: Callable[[int], float], lo: int, hi: int, together: Together | None = None) -> int:
    """Integer argmax of ``f`` on [lo, hi]: first a geometric scan (lo, 2·lo, 4·lo, ..., hi), then a
    golden-section search between the neighbours of the best scanned point. Measured tokens/s is
    noisy and jumps where pruning adds a level to the tree (one more head expansion), so a
    golden-section search over the whole range alone can settle on the wrong side. ``together``
    (see `golden_section_max`) is handed the whole scan first."""
    memo: dict[int, float] = {}

    def value(x: int) -> float:
        if x not in memo:
            memo[x] = f(x)
        return memo[x]

    grid = sorted({*(min(lo * 2**i, hi) for i in range(max(1, (hi // max(lo, 1)).bit_length() + 1))), hi})
    if together:
        together(grid)
    for x in grid:
        value(x)
    best = max(grid, key=lambda x: (memo[x], -x))
    i = grid.index(best)
    left, right = grid[max(i - 1, 0)], grid[min(i + 1, len(grid) - 1)]
    if right - left > 1:
        golden_section_max(value, left, right, together)
    return max(memo, key=lambda x: (memo[x], -x))


GroupRun = tuple[float, float, int]  # one prompt group's (tokens, seconds, verify calls)


def rate(runs: Sequence[GroupRun]) -> float:
    """Total tokens per total second."""
    seconds = sum(s for _, s, _ in runs)
    return sum(t for t, _, _ in runs) / seconds if seconds else 0.0


class SideBySide:
    """Node counts timed side by side. ``run_group(m, g)`` decodes prompt group ``g`` with the
    ``m``-node tree; `measure` runs every group with each of its counts back to back, the order
    rotated from group to group, so that a machine that slows for a while (another tenant, a
    thermal dip) slows every count of the comparison alike instead of the one timed then. Each
    count's runs are kept (``runs``), one per group: the pairs `playoff` resamples."""

    def __init__(self, run_group: Callable[[int, int], GroupRun], groups: int,
                 announce: Callable[[list[int], int], None] | None = None) -> None:
        if groups < 1:
            raise ValueError("need at least one prompt group")
        self.run_group, self.groups, self.announce = run_group, groups, announce
        self.runs: dict[int, list[GroupRun]] = {}

    def measure(self, counts: Sequence[int], again: bool = False) -> dict[int, list[GroupRun]]:
        """Time the counts not yet measured (all of them ``again``); returns this call's runs."""
        todo = [m for m in dict.fromkeys(counts) if again or m not in self.runs]
        fresh: dict[int, list[GroupRun]] = {m: [] for m in todo}
        if not todo:
            return fresh
        if self.announce:
            self.announce(todo, self.groups)
        for g in range(self.groups):
            k = g % len(todo)
            for m in todo[k:] + todo[:k]:
                fresh[m].append(self.run_group(m, g))
        self.runs.update(fresh)
        return fresh

    def tokens_per_second(self, m: int) -> float:
        if m not in self.runs:
            self.measure([m])
        return rate(self.runs[m])


@dataclass(frozen=True)
class Playoff:
    """The search's best counts timed again side by side: the winner, and its throughput over the
    runner-up's with the 95% interval of that ratio (prompt groups resampled in pairs; None with
    one group or one finalist)."""

    counts: tuple[int, ...]  # the finalists, best first by this timing
    tokens_per_second: dict[int, float]
    ratio: float | None
    interval: tuple[float, float] | None

    @property
    def best(self) -> int:
        return self.counts[0]


def playoff(timer: SideBySide, finalists: int) -> Playoff:
    """Time the ``finalists`` fastest counts measured so far again, side by side, and rank them
    by that timing alone (ties to the smaller tree)."""
    top = sorted(timer.runs, key=lambda m: (-rate(timer.runs[m]), m))[: max(1, finalists)]
    final = timer.measure(top, again=True) if len(top) > 1 else {top[0]: timer.runs[top[0]]}
    ranked = tuple(sorted(top, key=lambda m: (-rate(final[m]), m)))
    speeds = {m: rate(final[m]) for m in ranked}
    if len(ranked) < 2:
        return Playoff(ranked, speeds, None, None)
    pairs = [[(t, s) for t, s, _ in final[m]] for m in ranked[:2]]
    return Playoff(ranked, speeds, throughput_ratio(*pairs), ratio_interval(*pairs))
