import random

import pytest

from ngspec.perf import online
from ngspec.perf.online import StepTimes

TABLE = (1.0, 1.05, 1.1, 1.1, 1.1, 1.15, 1.2, 1.25, 1.3) + (1.5,) * 8


def test_the_fit_learns_a_plain_step_and_the_slope_from_varied_steps():
    """Steps that really cost 1 + 2 * (table - 1) plain steps of 20 ms, with noise: the fit
    finds both, and the corrected table is the real cost."""
    rng = random.Random(0)
    times = StepTimes()
    for _ in range(200):
        size = rng.choice([0, 4, 8, 16])
        times.record(TABLE[size], 0.020 * (1 + 2 * (TABLE[size] - 1)) * rng.uniform(0.98, 1.02))
    assert times.scale == pytest.approx(2.0, rel=0.1)
    assert times.plain_seconds == pytest.approx(0.020, rel=0.05)
    assert times.corrected(TABLE)[8] == pytest.approx(1.6, rel=0.05)
    assert times.corrected(()) == ()


def test_without_spread_in_sizes_the_table_stands():
    times = StepTimes()
    for _ in range(50):  # every step the same size: the slope cannot be told
        times.record(TABLE[4], 0.030)
    assert times.scale == 1.0 and times.corrected(TABLE) == TABLE
    assert times.plain_seconds == pytest.approx(0.030 / 1.1)


def test_the_fit_waits_for_enough_steps_and_bounds_the_scale():
    times = StepTimes()
    for i in range(online.MIN_STEPS - 1):
        times.record(TABLE[16 if i % 2 else 0], 0.010 if i % 2 == 0 else 1.0)
    assert times.scale == 1.0
    times.record(TABLE[16], 1.0)  # 100x the plain step for 1.5 in the table
    assert times.scale == online.SCALE_RANGE[1]


def test_older_steps_weigh_less():
    """The machine slows down: the fit follows the recent steps."""
    times = StepTimes()
    for i in range(100):
        size = (0, 8)[i % 2]
        times.record(TABLE[size], 0.020 * (1 + (TABLE[size] - 1)))
    for i in range(100):
        size = (0, 8)[i % 2]
        times.record(TABLE[size], 0.040 * (1 + 3 * (TABLE[size] - 1)))
    assert times.scale == pytest.approx(3.0, rel=0.05) and times.plain_seconds == pytest.approx(0.040, rel=0.05)
