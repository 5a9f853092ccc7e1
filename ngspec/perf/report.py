"""Turning sweep timings into slowdowns, roofline predictions, transitions and files (CSV, JSON)."""

from __future__ import annotations

import csv
import functools
import io
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from transformers import PretrainedConfig

from ngspec import staging
from ngspec.perf.roofline import DevicePeaks, cell_cost
from ngspec.perf.sweep import Cell, CellResult

TOLERANCE = 0.10  # "free" = within 10% of the (1, 0) cell


@dataclass(frozen=True)
class CellReport:
    layout: str
    context: int
    k: int
    w: int
    tokens: int
    status: str
    ms: float | None
    slowdown: float | None
    predicted_ms: float
    predicted_slowdown: float
    bound: str  # what the roofline says limits the cell: "memory" or "compute"


def analyse(results: list[CellResult], config: PretrainedConfig, peaks: DevicePeaks, bytes_per_element: int) -> list[CellReport]:
    """Slowdown of every cell relative to the (1, 0) cell of its layout and context, measured and
    predicted."""
    def predicted(cell: Cell) -> float:
        return peaks.predict(cell_cost(config, cell.layout, cell.k, cell.w, cell.context, bytes_per_element))

    base = {
        (r.cell.layout, r.cell.context): r.seconds
        for r in results
        if r.cell.k == 1 and r.cell.w == 0 and r.seconds
    }
    out = []
    for r in results:
        c = r.cell
        ref = base.get((c.layout, c.context))
        pred = predicted(c)
        pred_ref = predicted(Cell(c.layout, c.context, 1, 0))
        cost = cell_cost(config, c.layout, c.k, c.w, c.context, bytes_per_element)
        out.append(
            CellReport(
                c.layout, c.context, c.k, c.w, c.tokens, r.status,
                None if r.seconds is None else r.seconds * 1e3,
                None if r.seconds is None or not ref else r.seconds / ref,
                pred * 1e3, pred / pred_ref, peaks.bound(cost),
            )
        )
    return out


@dataclass(frozen=True)
class Transition:
    """The largest block that stays within the tolerance, measured and predicted."""

    layout: str
    context: int
    measured_tokens: int | None
    measured_kw: tuple[int, int] | None
    predicted_tokens: int | None
    predicted_kw: tuple[int, int] | None


def _largest_free(cells: list[CellReport], key: str, tolerance: float) -> CellReport | None:
    free = [c for c in cells if getattr(c, key) is not None and getattr(c, key) <= 1 + tolerance]
    return max(free, key=lambda c: (c.tokens, c.w), default=None)


def transitions(reports: list[CellReport], tolerance: float = TOLERANCE) -> list[Transition]:
    out = []
    for layout, context in dict.fromkeys((r.layout, r.context) for r in reports):
        cells = [r for r in reports if r.layout == layout and r.context == context]
        measured = _largest_free(cells, "slowdown", tolerance)
        predicted = _largest_free(cells, "predicted_slowdown", tolerance)
        out.append(
            Transition(
                layout, context,
                measured.tokens if measured else None, (measured.k, measured.w) if measured else None,
                predicted.tokens if predicted else None, (predicted.k, predicted.w) if predicted else None,
            )
        )
    return out


def csv_text(reports: list[CellReport]) -> str:
    buffer = io.StringIO()
    fields = list(CellReport.__dataclass_fields__)
    writer = csv.DictWriter(buffer, fieldnames=fields, lineterminator="\n")
    writer.writeheader()
    for r in reports:
        row = asdict(r)
        for key in ("ms", "slowdown", "predicted_ms", "predicted_slowdown"):
            if row[key] is not None:
                row[key] = f"{row[key]:.6g}"
        writer.writerow(row)
    return buffer.getvalue()


def report_json(meta: dict, reports: list[CellReport], trans: list[Transition]) -> dict:
    return {
        **meta,
        "tolerance": TOLERANCE,
        "transitions": [asdict(t) for t in trans],
        "cells": [asdict(r) for r in reports],
    }


def report_files(out_dir: Path, stem: str, meta: dict, reports: list[CellReport], trans: list[Transition]) -> list[tuple[Path, Callable[[], None]]]:
    """``<stem>.csv`` and ``<stem>.json`` in ``out_dir``, each with what writes it (whole, then
    renamed: `staging.write_each`)."""
    import json

    texts = ((".csv", csv_text(reports)), (".json", json.dumps(report_json(meta, reports, trans), indent=1)))
    return [(out_dir / f"{stem}{suffix}", functools.partial(staging.write_text, out_dir / f"{stem}{suffix}", text)) for suffix, text in texts]
