"""Heatmaps of the slowdown grid in the style of the learning-free n-gram paper's figure: w on the
x axis, k on the y axis, one panel per context length; measured on top, predicted below."""

from __future__ import annotations

from pathlib import Path

from ngspec.perf.report import CellReport


def heatmap(reports: list[CellReport], layout: str, title: str, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    cells = [r for r in reports if r.layout == layout]
    contexts = sorted({r.context for r in cells})
    ks = sorted({r.k for r in cells})
    ws = sorted({r.w for r in cells})
    annotate = len(ks) * len(ws) <= 150
    panel_w = max(2.6, 0.3 * len(ws) + 0.8)
    panel_h = max(2.2, 0.22 * len(ks) + 0.9)
    fig, axes = plt.subplots(
        2, len(contexts), figsize=(1.4 + panel_w * len(contexts), 0.8 + 2 * panel_h), squeeze=False, layout="constrained"
    )
    vmax = max([r.slowdown or 1.0 for r in cells] + [r.predicted_slowdown for r in cells] + [1.5])
    image = None
    for col, context in enumerate(contexts):
        for row, key in enumerate(("slowdown", "predicted_slowdown")):
            grid = np.full((len(ks), len(ws)), np.nan)
            for r in cells:
                if r.context == context and getattr(r, key) is not None:
                    grid[ks.index(r.k), ws.index(r.w)] = getattr(r, key)
            ax = axes[row][col]
            image = ax.imshow(grid, origin="lower", cmap="viridis", vmin=1.0, vmax=vmax, aspect="auto")
            ax.set_xticks(range(len(ws)), [str(w) for w in ws], fontsize=7)
            ax.set_yticks(range(len(ks)), [str(k) for k in ks], fontsize=7)
            ax.set_title(f"{'measured' if row == 0 else 'roofline'}, context {context}", fontsize=8)
            if row == 1:
                ax.set_xlabel("w (speculated tokens)", fontsize=7)
            if col == 0:
                ax.set_ylabel("k (rows)", fontsize=7)
            if annotate:
                for i in range(len(ks)):
                    for j in range(len(ws)):
                        if not np.isnan(grid[i, j]):
                            ax.text(j, i, f"{grid[i, j]:.1f}", ha="center", va="center", fontsize=5, color="white")
                        elif row == 0:
                            ax.text(j, i, "OOM", ha="center", va="center", fontsize=5, color="red")
    fig.suptitle(title, fontsize=9)
    fig.colorbar(image, ax=axes, shrink=0.8).set_label("slowdown vs (k, w) = (1, 0)", fontsize=8)
    return save_figure(fig, path)


def save_figure(fig, path: Path) -> Path:
    """Write ``fig`` to ``path`` and close it. A title naming a model directory in characters the
    bundled font lacks ("模型") shows them as boxes, without matplotlib's warning and its source
    line on the terminal."""
    import warnings

    import matplotlib.pyplot as plt

    from ngspec.staging import staged_file

    try:
        with warnings.catch_warnings(), staged_file(path) as tmp:  # whole or not at all, as every output
            warnings.filterwarnings("ignore", message=r"Glyph \d+ .* missing from font")
            fig.savefig(tmp, format=path.suffix.removeprefix(".") or "png", dpi=90)
    finally:
        plt.close(fig)
    return path
