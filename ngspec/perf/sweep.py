"""The (layout, context, k, w) sweep: grid parsing, timing done right, out-of-memory cells.

Every cell times one verification forward after ``context`` cached tokens: k rows of w + 1 tokens
sharing the cache (``rows``) or one tree of 1 + k·w nodes, k chains of w below the root (``tree``).
Timing: the cache for a context is filled once; every cell gets warm-up runs, then the median of
``repeats`` timed runs (CUDA events on GPU, ``perf_counter`` on CPU); the same random non-zero
token ids are reused by every cell. A cell that runs out of memory is recorded as such and the
sweep goes on.
"""

from __future__ import annotations

import re
import statistics
import time
from collections import Counter
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

import torch

from ngspec.contracts import DraftTree
from ngspec.errors import NgspecError, Stopped
from ngspec.target import TargetModel

LAYOUTS = ("rows", "tree")


@dataclass(frozen=True)
class Cell:
    layout: str
    context: int
    k: int
    w: int

    @property
    def tokens(self) -> int:
        """Tokens the forward pass processes."""
        return self.k * (self.w + 1) if self.layout == "rows" else 1 + self.k * self.w


@dataclass
class CellResult:
    cell: Cell
    seconds: float | None  # median of the timed runs; None when the cell failed
    status: str = "ok"  # "ok" or "oom"


def parse_values(spec: str, name: str, minimum: int) -> list[int]:
    """``"1..32"``, ``"0..15:3"`` (step), ``"1,2,4,8"`` or a mix, sorted and de-duplicated."""
    values: set[int] = set()
    for part in spec.replace(" ", "").split(","):
        match = re.fullmatch(r"(\d+)(?:\.\.(\d+)(?::(\d+))?)?", part)
        if not match:
            raise NgspecError(f"--{name} {spec!r}: expected numbers and ranges like 1,2,4 or 1..32 or 0..15:3")
        lo = int(match.group(1))
        hi = int(match.group(2)) if match.group(2) is not None else lo
        step = int(match.group(3) or 1)
        if hi < lo:
            raise NgspecError(f"--{name} {part!r} is an inverted range (write {hi}..{lo})")
        if step < 1:
            raise NgspecError(f"--{name} {part!r}: the step must be at least 1")
        values.update(range(lo, hi + 1, step))
    if not values:
        raise NgspecError(f"--{name} is empty")
    if min(values) < minimum:
        raise NgspecError(f"--{name} values must be at least {minimum} (got {min(values)})")
    return sorted(values)


def grid(layouts: Sequence[str], contexts: Iterable[int], ks: Sequence[int], ws: Sequence[int]) -> list[Cell]:
    """Every cell, grouped by context (the cache is filled once per context) and always including
    the (1, 0) reference cell of each group."""
    ks = sorted(set(ks) | {1})
    ws = sorted(set(ws) | {0})
    return [Cell(layout, c, k, w) for c in contexts for layout in layouts for k in ks for w in ws]


def chains_tree(rows: Sequence[Sequence[int]]) -> DraftTree:
    """k independent chains below the root (the tree layout of k rows, with no prefix merged)."""
    tokens: list[int] = []
    parents: list[int] = []
    for row in rows:
        for depth, tok in enumerate(row):
            parents.append(-1 if depth == 0 else len(tokens) - 1)
            tokens.append(int(tok))
    return DraftTree(tuple(tokens), tuple(parents))


def is_out_of_memory(exc: BaseException) -> bool:
    return isinstance(exc, torch.OutOfMemoryError) or "out of memory" in str(exc).lower()


class ForwardTimer:
    """Times the cells of a sweep on one `TargetModel`."""

    def __init__(self, target: TargetModel, max_k: int, max_w: int, warmup: int = 1, repeats: int = 5) -> None:
        self.target = target
        self.warmup, self.repeats = warmup, repeats
        vocab = int(target.model.config.vocab_size)
        gen = torch.Generator().manual_seed(0)
        self.pool = torch.randint(1, vocab, (max_k, max(max_w, 1)), generator=gen).tolist()
        self.context_ids = torch.randint(1, vocab, (1,), generator=gen).tolist()
        self.vocab = vocab
        self._context = -1

    def _fill(self, context: int) -> None:
        gen = torch.Generator().manual_seed(context)
        self.target.prefill(torch.randint(1, self.vocab, (context,), generator=gen).tolist())
        self._context = context

    def _run(self, cell: Cell) -> None:
        rows = [r[: cell.w] for r in self.pool[: cell.k]]
        root = self.context_ids[0]
        try:
            if cell.layout == "rows":
                self.target.verify_rows(root, rows)
            else:
                self.target.verify(root, chains_tree(rows))
        finally:
            self.target.discard()

    def _timed(self, cell: Cell) -> float:
        device = self.target.device
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            self._run(cell)
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1000.0
        start_s = time.perf_counter()
        self._run(cell)
        return time.perf_counter() - start_s

    def __call__(self, cell: Cell) -> float:
        if cell.context != self._context:
            self._fill(cell.context)
        for _ in range(self.warmup):
            self._run(cell)
        return statistics.median(self._timed(cell) for _ in range(self.repeats))


def run_sweep(
    cells: Sequence[Cell],
    measure: Callable[[Cell], float],
    on_cell: Callable[[CellResult], None] | None = None,
) -> list[CellResult]:
    """Measure every cell; out-of-memory failures are recorded and the sweep continues.
    Interrupted (Ctrl-C, SIGTERM) after a (layout, context) group of cells was measured whole, it
    raises `Stopped` with the whole groups' results."""
    results = []
    try:
        for cell in cells:
            try:
                result = CellResult(cell, measure(cell))
            except (RuntimeError, torch.OutOfMemoryError) as exc:
                if not is_out_of_memory(exc):
                    raise
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
                result = CellResult(cell, None, "oom")
            results.append(result)
            if on_cell:
                on_cell(result)
    except KeyboardInterrupt:
        planned = Counter((c.layout, c.context) for c in cells)
        timed = Counter((r.cell.layout, r.cell.context) for r in results)
        whole = [r for r in results if timed[r.cell.layout, r.cell.context] == planned[r.cell.layout, r.cell.context]]
        if whole:  # each group's slowdowns are relative to its own (1, 0) cell
            raise Stopped(whole) from None
        raise
    return results
