"""`ngspec.cuda_graphs.Graphs.run`: a shape runs eagerly at its first use, is captured at its
second and replayed after; what capturing cost is counted (under the CPU stand-in for captures)."""

from __future__ import annotations

import pytest
import torch

from graph_standin import StandInGraphs
from ngspec.cuda_graphs import Graphs, Slot, met_once


class Counted:
    """A fixed-shape run that writes ``x + 1`` into its own output, counting its executions."""

    def __init__(self) -> None:
        self.x = torch.zeros(3)
        self.out = torch.zeros(3)
        self.calls = 0

    def __call__(self) -> torch.Tensor:
        self.calls += 1
        self.out.copy_(self.x + 1)
        return self.out


def test_a_shape_runs_eagerly_then_is_captured_at_its_second_use_then_replayed(monkeypatch):
    StandInGraphs(monkeypatch)
    graphs, slot, run = Graphs("a test", True), Slot(), Counted()
    for use, x in enumerate([1.0, 5.0, 7.0, 2.0], start=1):
        run.x.fill_(x)
        out = graphs.run(slot, run)
        assert torch.equal(out, torch.full((3,), x + 1))  # the stand-in leaves a capture's outputs NaN until replayed
        assert (slot.graph is None) == (use == 1)
    # first use eager; second: the capture, then its replay; then replays
    assert (graphs.captures, graphs.replays, graphs.cold) == (1, 3, 2)
    assert graphs.cold_seconds >= graphs.capture_seconds > 0
    assert graphs.report().startswith("1 captured in ") and "3 replays, 2 runs at new shapes in " in graphs.report()
    assert graphs.report().endswith("; capturing never failed")


def test_a_shape_used_once_is_never_captured(monkeypatch):
    StandInGraphs(monkeypatch)
    graphs, slots = Graphs("a test", True), [Slot(), Slot(), Slot()]
    for slot in slots:
        graphs.run(slot, Counted())
    graphs.run(slots[0], Counted())
    assert (graphs.captures, graphs.replays, graphs.cold) == (1, 1, 4) and met_once(slots) == 2


def test_without_capturing_every_run_is_eager_and_none_is_cold(monkeypatch):
    StandInGraphs(monkeypatch)
    graphs, slot, run = Graphs("a test", False), Slot(), Counted()
    for _ in range(3):
        graphs.run(slot, run)
    assert run.calls == 3 and (graphs.captures, graphs.replays, graphs.cold, graphs.cold_seconds) == (0, 0, 0, 0.0)


def test_a_refused_capture_stops_capturing_and_runs_go_on_eagerly(monkeypatch):
    StandInGraphs(monkeypatch, fail=True)
    graphs, slot, run = Graphs("a test", True), Slot(), Counted()
    graphs.run(slot, run)
    with pytest.warns(UserWarning, match="a test cannot be captured"):
        out = graphs.run(slot, run)
    assert torch.equal(out, torch.ones(3)) and not graphs.enabled and "operation not permitted" in graphs.failure
    graphs.run(slot, run)
    assert (graphs.captures, graphs.replays, graphs.cold) == (0, 0, 2) and graphs.capture_seconds == 0
