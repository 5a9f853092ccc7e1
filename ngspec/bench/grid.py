"""(k, w) sweeps of the row drafters and the mixed strategy's ablation, from bench records.

A sweep is every arm of one drafter and layout at several (k, w): tokens per call and wall-time
speedup per cell (vs hf-greedy; in a batched run vs vanilla at the same batch size), drawn as
heatmaps like the learning-free n-gram paper's. The ablation sums each arm's drafter statistics
(of its prompt runs, or of its batch rows): rows drafted and tokens accepted per strategy, and
the rank of the accepted row among the k.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from ngspec.bench.batched import BatchArmSummary
from ngspec.bench.report import ArmSummary
from ngspec.bench.runner import Arm, BenchRecord
from ngspec.drafters import ROW_DRAFTERS


@dataclass
class Sweep:
    drafter: str
    layout: str
    cells: dict[tuple[int, int], ArmSummary | BatchArmSummary]

    def ranked(self, key: str) -> list[tuple[tuple[int, int], ArmSummary | BatchArmSummary]]:
        """The cells, highest ``key`` first."""
        return sorted(self.cells.items(), key=lambda item: getattr(item[1], key) or 0.0, reverse=True)

    def best(self, key: str) -> tuple[tuple[int, int], ArmSummary | BatchArmSummary]:
        return self.ranked(key)[0]


def sweeps(arms: list[Arm], summaries: list[ArmSummary] | list[BatchArmSummary]) -> list[Sweep]:
    """Drafter/layout groups that span more than one (k, w) cell."""
    by_label = {s.arm: s for s in summaries}
    groups: dict[tuple[str, str], dict[tuple[int, int], ArmSummary | BatchArmSummary]] = {}
    for arm in arms:
        if arm.grid_cell is not None:
            groups.setdefault((arm.drafter, arm.verify), {})[arm.grid_cell] = by_label[arm.label]
    return [Sweep(d, layout, cells) for (d, layout), cells in groups.items() if len(cells) > 1]


def run_stats(arms: list[Arm], records: list[BenchRecord]) -> dict[str, list[dict]]:
    """Each arm's drafter statistics, one per prompt run that has them (`ablation`'s input)."""
    return {arm.label: [r.runs[arm.label].drafter_stats for r in records if r.runs[arm.label].drafter_stats] for arm in arms}


def ablation(arms: list[Arm], stats_by_arm: dict[str, list[dict]]) -> list[dict]:
    """Per arm with drafter statistics (``stats_by_arm``: a run's, one per prompt run or batch
    row): per strategy rows drafted and tokens accepted; how often the accepted row was the 1st,
    2nd, ... of the k."""
    out = []
    for arm in arms:
        if arm.drafter not in ROW_DRAFTERS:
            continue  # other drafters' statistics (e.g. the search branch's sources) are not rows
        stats = stats_by_arm.get(arm.label, [])
        if not stats:
            continue
        rows, tokens, rank = Counter(), Counter(), Counter()
        for s in stats:
            rows.update(s["rows_allocated"])
            tokens.update(s["tokens_accepted"])
            rank.update({int(k): v for k, v in s["accepted_row_rank"].items()})
        out.append({
            "arm": arm.label,
            "strategies": {
                name: {"rows": rows[name], "tokens_accepted": tokens[name], "tokens_per_row": tokens[name] / rows[name] if rows[name] else 0.0}
                for name in sorted(rows)
            },
            "accepted_row_rank": dict(sorted(rank.items())),
        })
    return out


ABLATION_TITLE = "row drafters: rows drafted and tokens accepted per strategy; rank of the accepted row"
ABLATION_COLUMNS = ["arm", "strategy", "rows", "tokens accepted", "per row", "accepted row rank (1 = first)"]


def ablation_rows(abl: list[dict]) -> list[list[str]]:
    """`ablation`'s table: a row per arm and strategy, the arm and its ranks on its first; an arm
    that drafted no row says so (context-ngram finds nothing in a context without repeats)."""
    return [
        [a["arm"] if i == 0 else "", name, str(v["rows"]), str(v["tokens_accepted"]), f"{v['tokens_per_row']:.3f}",
         " ".join(f"{r}:{n}" for r, n in a["accepted_row_rank"].items()) if i == 0 else ""]
        for a in abl
        for i, (name, v) in enumerate(a["strategies"].items() or [("no rows drafted", {"rows": 0, "tokens_accepted": 0, "tokens_per_row": 0.0})])
    ]


def markdown(sweep_lines: list[str], abl: list[dict]) -> str:
    """A --markdown report's part for a grid's sweeps (their lines) and the ablation: empty without."""
    from ngspec.bench.report import table_lines

    out = ["", "Sweeps:", "", *[f"- {line}" for line in sweep_lines]] if sweep_lines else []
    if abl:
        out += ["", f"{ABLATION_TITLE[0].upper()}{ABLATION_TITLE[1:]}:", "", *table_lines(ABLATION_COLUMNS, ablation_rows(abl))]
    return "\n".join(out) + "\n" if out else ""


def heatmaps(sweep: Sweep, title: str, path: Path, baseline: str = "hf-greedy") -> Path:
    """Tokens per call and speedup vs ``baseline`` over (k, w), side by side."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from ngspec.perf.plots import save_figure

    ks = sorted({k for k, _ in sweep.cells})
    ws = sorted({w for _, w in sweep.cells})
    fig, axes = plt.subplots(1, 2, figsize=(2.0 + 0.9 * len(ws) * 2, 1.6 + 0.45 * len(ks)), layout="constrained")
    for ax, key, label in ((axes[0], "tokens_per_call", "tokens per call"), (axes[1], "speedup", f"speedup vs {baseline}")):
        grid = np.full((len(ks), len(ws)), np.nan)
        for (k, w), s in sweep.cells.items():
            value = getattr(s, key)
            if value is not None:
                grid[ks.index(k), ws.index(w)] = value
        image = ax.imshow(grid, origin="lower", cmap="viridis", aspect="auto")
        ax.set_xticks(range(len(ws)), [str(w) for w in ws])
        ax.set_yticks(range(len(ks)), [str(k) for k in ks])
        ax.set_xlabel("w (tokens per row)")
        ax.set_ylabel("k (rows)")
        ax.set_title(label, fontsize=9)
        for i in range(len(ks)):
            for j in range(len(ws)):
                if not np.isnan(grid[i, j]):
                    ax.text(j, i, f"{grid[i, j]:.2f}", ha="center", va="center", fontsize=7, color="white")
        fig.colorbar(image, ax=ax, shrink=0.8)
    fig.suptitle(title, fontsize=9)
    return save_figure(fig, path)
