"""What verification costs in this run, learned from the run's own steps.

A cost table (`ngspec.perf.costs`) is measured once, at one context length, on a machine that
may have been quieter or busier then; on the team's AMD VM a cached table read 8 nodes at 1.23
plain steps while the steps of a Spec-Bench rag run (contexts of 800-1,000 tokens) took 1.44,
a table measured again minutes later read 1.41 at 512 tokens and 1.49 at 1,024, and tables
measured twenty minutes after that 1.20-1.23 at 512 again (BENCHMARKS.md, section 10b, ninth
session). Trees sized by a table that is too cheap are too large.

`StepTimes` fits each verify call's seconds to ``a + b * (table[n] - 1)`` for its tree of ``n``
nodes (least squares, older steps weighing less): ``a`` is a plain step's seconds now, and
``b / a`` rescales the table's extra cost above a plain step (`corrected`). The table keeps its
shape (where its steps are, which sizes cost alike); only its slope is learned. Until the steps
seen vary enough in size to tell the slope, the table is used as measured. The single-sequence
loop (`ngspec.decode`) and the batched one (`ngspec.batch`, by the widest tree of each step) both
learn it.
"""

from __future__ import annotations

from typing import Sequence


DECAY = 0.97  # each older step weighs this much less (about the last 30 steps count)
MIN_STEPS = 12  # steps before the fit is trusted
MIN_SPREAD = 0.05  # standard deviation of the table's extra cost over the steps seen, at least
SCALE_RANGE = (0.25, 4.0)  # the learned slope stays within these multiples of the table's


class StepTimes:
    def __init__(self) -> None:
        self.steps = 0
        self._w = self._x = self._y = self._xx = self._xy = 0.0
        self.scale = 1.0  # learned slope over the table's (1.0 until the fit holds)
        self.plain_seconds = 0.0  # a plain step's seconds, 0.0 before the first step

    def record(self, cost: float, seconds: float) -> None:
        """One verify call took ``seconds``; ``cost`` is what the cost table it was sized by says
        it costs (relative to a plain step: ``table_cost(table, size)`` for a tree of ``size``
        nodes)."""
        x = cost - 1.0  # the table's extra cost above a plain step
        self.steps += 1
        self._w, self._x, self._y, self._xx, self._xy = (
            DECAY * self._w + 1.0, DECAY * self._x + x, DECAY * self._y + seconds, DECAY * self._xx + x * x, DECAY * self._xy + x * seconds,
        )
        mean_x, mean_y = self._x / self._w, self._y / self._w
        spread = self._xx / self._w - mean_x * mean_x
        if self.steps >= MIN_STEPS and spread >= MIN_SPREAD**2:
            slope = (self._xy / self._w - mean_x * mean_y) / spread
            plain = mean_y - slope * mean_x
            if plain > 0:
                self.plain_seconds = plain
                self.scale = min(max(slope / plain, SCALE_RANGE[0]), SCALE_RANGE[1])
                return
        # not enough to tell the slope: a plain step's seconds by the current scale
        self.plain_seconds = mean_y / (1.0 + self.scale * mean_x)

    def corrected(self, table: Sequence[float]) -> tuple[float, ...]:
        """``table`` with its extra cost above a plain step scaled by what the steps showed."""
        if self.scale == 1.0 or not table:
            return tuple(table)
        return tuple(1.0 + self.scale * (c - 1.0) for c in table)
