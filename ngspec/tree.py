"""Pure tree maths for verification: depths, visibility, masks, positions, paths, and
how many nodes pay for their verify cost (`most_paying`; for a batch, `joint_width` when its rows
are padded to one width, `packed_sizes` when they are packed back to back).

Index 0 of every verification block is the root (the last emitted token); tree node ``i`` sits at
block index ``i + 1``.
"""

from __future__ import annotations

from heapq import heapify, heappop, heappush
from typing import Callable, Sequence

import torch

from ngspec.contracts import DraftTree


def depths(tree: DraftTree) -> list[int]:
    """Depth of every node below the root (children of the root have depth 1)."""
    out: list[int] = []
    for p in tree.parents:
        out.append(1 if p < 0 else out[p] + 1)
    return out


def children(tree: DraftTree) -> list[list[int]]:
    """Children of every block index (0 = root, i + 1 = node i), in node order."""
    kids: list[list[int]] = [[] for _ in range(tree.size + 1)]
    for i, p in enumerate(tree.parents):
        kids[p + 1].append(i + 1)
    return kids


def ancestors(tree: DraftTree) -> list[list[int]]:
    """Block indices every block index sees: the root, its ancestors and itself, root first."""
    seen = [[0]]
    for i, p in enumerate(tree.parents):
        seen.append(seen[p + 1] + [i + 1])
    return seen


def visibility(tree: DraftTree) -> torch.Tensor:
    """Bool ``[n+1, n+1]``: entry (i, j) is true when block index j is i itself or an ancestor.
    Built in Python and made a tensor once (a tensor write per node costs a host-bound GPU's
    dispatch time each)."""
    return torch.tensor(_marked(ancestors(tree), tree.size + 1), dtype=torch.bool)


def _marked(seen: Sequence[Sequence[int]], width: int) -> list[list[bool]]:
    """One row of ``width`` flags per list of ``seen`` indices, true at those indices."""
    rows = []
    for indices in seen:
        row = [False] * width
        for j in indices:
            row[j] = True
        rows.append(row)
    return rows


def batch_blocks(roots: Sequence[int], trees: Sequence[DraftTree], lengths: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Verification blocks of several rows, padded to the widest: token ids and positions
    ``[rows, width]`` and block visibility ``[rows, width, width]``, for rows holding ``lengths``
    committed tokens. A padding entry is a lone copy of the root at the next position, seeing the
    root and itself and seen by nothing. Built as Python lists, one tensor each (a host-bound GPU
    pays dispatch time per tensor operation, so per-row and per-node writes added up)."""
    width = 1 + max(t.size for t in trees)
    ids, positions, visible = [], [], []
    for root, tree, length in zip(roots, trees, lengths):
        n = 1 + tree.size
        seen = ancestors(tree) + [[0, j] for j in range(n, width)]
        ids.append([root, *tree.tokens] + [root] * (width - n))
        positions.append(block_positions(tree, length) + [length + 1] * (width - n))
        visible.append(_marked(seen, width))
    return torch.tensor(ids, dtype=torch.long), torch.tensor(positions, dtype=torch.long), torch.tensor(visible, dtype=torch.bool)


def additive_mask(visible: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """0 where ``visible`` is true, the dtype's minimum elsewhere (same shape): the float form
    eager attention adds to its scores and SDPA accepts too."""
    mask = torch.zeros(visible.shape, dtype=dtype, device=visible.device)
    return mask.masked_fill_(~visible, torch.finfo(dtype).min)


def block_visibility(tree: DraftTree, past_len: int) -> torch.Tensor:
    """Bool ``[1, n+1, past_len + n+1]``: what each block index sees of ``past_len`` cached
    positions (all of them) and of the block (`visibility`)."""
    vis = visibility(tree)
    n = vis.shape[0]
    visible = torch.ones(1, n, past_len + n, dtype=torch.bool)
    visible[0, :, past_len:] = vis
    return visible


def block_positions(tree: DraftTree, past_len: int) -> list[int]:
    """Position of every block index: tokens already cached plus depth (root has depth 0)."""
    return [past_len] + [past_len + d for d in depths(tree)]


def root_to_leaf_paths(tree: DraftTree) -> list[list[int]]:
    """Node indices of every root-to-leaf path, in node order of the leaves."""
    kids = children(tree)
    paths: list[list[int]] = []
    for node in range(tree.size):
        if kids[node + 1]:
            continue
        path = [node]
        while tree.parents[path[-1]] >= 0:
            path.append(tree.parents[path[-1]])
        paths.append(path[::-1])
    return paths


def accepted_path(tree: DraftTree, tokens: Sequence[int]) -> list[int]:
    """Nodes of the longest root path whose tokens are a prefix of ``tokens``: what greedy
    acceptance took when ``tokens`` were emitted (pass them without the bonus token). Siblings
    may repeat a token; the longer run wins, as in `verify.accept_greedy`."""
    kids = children(tree)

    def walk(block: int, depth: int) -> list[int]:
        best: list[int] = []
        if depth < len(tokens):
            for c in kids[block]:
                if tree.tokens[c - 1] == tokens[depth]:
                    below = [c - 1] + walk(c, depth + 1)
                    if len(below) > len(best):
                        best = below
        return best

    return walk(0, 0)


def most_paying(gains: Sequence[float], costs: Sequence[float], first: int = 0, base: float = 1.0) -> int:
    """The number n >= ``first`` of leading ``gains`` (expected drafted tokens per node) that
    maximises expected tokens per unit of verify cost, ``(base + sum(gains[:n])) / costs[n]``
    (``costs``: a cost table, its last entry beyond it, 1.0 everywhere when empty, as
    `table_cost` reads it); ``base`` counts the tokens every call emits anyway (the bonus token).
    Ties go to the smaller n."""
    costs = costs or (1.0,)
    last = len(costs) - 1
    expected = base + sum(gains[:first])
    best, best_rate = first, expected / costs[min(first, last)]
    for n in range(first + 1, len(gains) + 1):
        expected += gains[n - 1]
        rate = expected / costs[n if n < last else last]  # the table read inline: sizing runs this a few thousand times a step
        if rate > best_rate:
            best, best_rate = n, rate
    return best


def joint_width(trees: Sequence[DraftTree], cost: Sequence[float]) -> int:
    """One tree size for a batch whose rows are verified in one forward, padded to the widest
    tree: the width W that maximises the rows' expected tokens, ``sum(1 + sum(gains[:W]))``, per
    unit of the batch's verify cost ``cost[W]`` (relative to a plain batched step; the last entry
    applies beyond the table). Trees offered best first (with ``gains``) can be cut to W or keep
    fewer nodes; a tree without gains is kept whole, so W is never below its size, and counts its
    bonus token only. Ties go to the narrower width. With no cost table every tree is kept whole."""
    widest = max((t.size for t in trees), default=0)
    if not cost:
        return widest
    fixed = max((t.size for t in trees if not t.gains), default=0)
    # expected drafted tokens of all rows at each width: add every row's gains position by position
    drafted = [0.0] * widest
    for t in trees:
        for i, g in enumerate(t.gains):
            drafted[i] += g
    return most_paying(drafted, cost, first=fixed, base=float(len(trees)))


def packed_sizes(trees: Sequence[DraftTree], step_cost: Callable[[list[int]], float]) -> list[int]:
    """Each row's own tree size for a batch whose rows are verified packed: their blocks back to
    back in one forward (`ngspec.batch_target.BatchTarget` with ``packed``), which costs by its
    total tokens, ``step_cost(sizes)`` relative to a plain batched step. Nodes are added one at a
    time, each the next node of the row whose next node gains most, and the sizes kept are those
    that maximise the rows' expected tokens per unit of cost: a row with a long likely branch
    verifies it while the others verify none, where one width for all would pay that branch's
    length in every row. Trees without gains are kept whole and count their bonus token only;
    ties go to fewer nodes."""
    rows = len(trees)
    sizes = [t.size if not t.gains else 0 for t in trees]
    expected = float(rows)
    best, best_rate = list(sizes), expected / step_cost(sizes)
    heap = [(-t.gains[0], b) for b, t in enumerate(trees) if t.gains]
    heapify(heap)
    while heap:
        gain, b = heappop(heap)
        sizes[b] += 1
        expected -= gain
        if sizes[b] < trees[b].size:
            heappush(heap, (-trees[b].gains[sizes[b]], b))
        rate = expected / step_cost(sizes)
        if rate > best_rate:
            best, best_rate = list(sizes), rate
    return best
