"""Measured verify cost by tree size, relative to a one-token decoding step.

On CPUs the cost of a forward pass grows unevenly with the number of tokens, and differently on
each CPU (the default model on two cores of an Intel Xeon with packed weights: 3 tokens about
1.1x a single token, 4 tokens 1.25x, 9 tokens 1.6x; of an AMD EPYC with its kernels: 2 tokens
1.0x, 3 tokens 1.35x, 9 tokens 2.6x), so drafters size trees from measurements, not intuition. The table is
measured once per engine with random tokens at a given context length (the fastest of 9 interleaved
rounds per size), and cached under
``$NGSPEC_CACHE/costs`` per model shape (`model_shape`: a model loaded by name, by path or as a
fine-tune of the same architecture reads one table; two models at one relative path do not),
device, dtype, thread count, torch version and the CPU kernel plan (`ngspec.cpu_linear`), per
batch size for batched decoding and apart for verification replayed from CUDA graphs
(`--target-graphs`) (set ``NGSPEC_RECALIBRATE=1`` to measure again).

Replayed, a tree of n nodes costs what its block's width bucket costs (1 + n tokens padded to a
power of two: `ngspec.static_verify`), and a wider bucket can replay faster than a narrower one
(BENCHMARKS.md 10zzk). So with `--target-graphs` one size per bucket is timed
(`measure_replay_costs`), blocks are sent to the cheapest bucket at least as wide
(`ngspec.static_verify.plan_widths`), and the table is those buckets' costs, a step per bucket
(`replayed_table`).
"""

from __future__ import annotations

import time
from contextlib import AbstractContextManager, nullcontext
from typing import Callable

import torch

from ngspec.contracts import DraftTree
from ngspec.cpu_linear import cpu_name, current_plan
from ngspec.cuda_graphs import bucket
from ngspec.perf.measured import measured_once
from ngspec.static_verify import MOST_WIDTH, WIDTHS, plan_widths, wider_widths
from ngspec.target import TargetModel


def _fastest(
    verify: Callable[[int], None], device: torch.device, sizes: list[int], repeats: int, clock: Callable[[], float],
    progress: Callable[[int, int], None] | None,
) -> dict[int, float]:
    """Fastest time of ``verify(size)`` (one verification of ``size`` draft nodes, then undone) at
    each of ``sizes`` (0 among them), relative to size 0.

    The fastest of ``repeats`` rather than their median: other work on the machine only ever adds
    time, and a table is cached for good. On the AMD VM, tables from the median of 5 read 1.35 to
    1.70 for 4 nodes minutes apart; the fastest of 15, 1.43 to 1.45 (BENCHMARKS.md, section 1).
    ``progress(done, repeats)`` hears of the start and of each finished round."""
    samples: dict[int, list[float]] = {size: [] for size in sizes}
    if progress is not None:
        progress(0, repeats)
    verify(0)  # warm-up
    # rounds over all sizes rather than all repeats of one size after another: a burst of other
    # work on the machine then slows one sample of several sizes, not every sample of one
    for round_ in range(repeats):
        for size in sizes:
            start = clock()
            verify(size)
            if device.type == "cuda":
                torch.cuda.synchronize(device)  # kernels run asynchronously
            samples[size].append(clock() - start)
        if progress is not None:
            progress(round_ + 1, repeats)
    fastest = {size: min(times) for size, times in samples.items()}
    return {size: t / fastest[0] for size, t in fastest.items()}


def _relative_costs(
    verify: Callable[[int], None], device: torch.device, max_nodes: int, repeats: int, clock: Callable[[], float] = time.perf_counter,
    progress: Callable[[int, int], None] | None = None,
) -> tuple[float, ...]:
    """`_fastest` at sizes spread over 0..max_nodes, as a table over 0..max_nodes (`cost_table`)."""
    sizes = sorted({0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, max_nodes} & set(range(max_nodes + 1)))
    return cost_table(_fastest(verify, device, sizes, repeats, clock, progress), max_nodes)


def replay_sizes(max_nodes: int) -> list[int]:
    """The tree sizes `measure_replay_costs` times: for each width bucket that trees of up to
    ``max_nodes`` nodes reach, its widest tree (a bucket costs one replay whatever it holds), and
    ``max_nodes`` where its block is too wide for any (it runs as the plain forward does)."""
    sizes = {n for w in WIDTHS if bucket((n := min(w - 1, max_nodes)) + 1, 1) == w}
    if max_nodes + 1 > MOST_WIDTH:
        sizes.add(max_nodes)
    return sorted(sizes)


def _by_width(relative: dict[int, float]) -> dict[int, float]:
    """Costs by tree size (`replay_sizes`) as costs by block width: a bucket's, or a block too wide for one."""
    return {n + 1 if n + 1 > MOST_WIDTH else bucket(n + 1, 1): cost for n, cost in relative.items()}


def replayed_table(costs: dict[int, float], max_nodes: int, pad_wider: bool = True) -> tuple[float, ...]:
    """The cost table over 0..max_nodes nodes from a block width's cost (`measure_replay_costs`):
    a tree costs the bucket its block runs at (``pad_wider``: `wider_widths`'s, its own or a
    wider one that replays cheaper; else its own), a step per bucket; a block too wide for any
    costs as measured, linear up to it."""
    buckets = {w: c for w, c in costs.items() if w <= MOST_WIDTH}
    plan = wider_widths(buckets) if pad_wider else {w: w for w in buckets}
    points: dict[int, float] = {}
    for width, to in plan.items():
        low, high = width // 2, min(width - 1, max_nodes)  # the trees whose block (root and nodes) pads to ``width``
        if low <= high:
            points[low] = points[high] = costs[to]
    points.update({w - 1: c for w, c in costs.items() if w > MOST_WIDTH})
    return cost_table(points, max_nodes)


def bucket_costs(spec: str) -> dict[int, float]:
    """A device's replay milliseconds by width bucket, written "1:4.43,2:5.25,...,64:7.46" (as
    `profile-bound --target-graphs` times them), relative to the one-token bucket's: what
    `replayed_table` takes, for replaying drafters at another device's sizing."""
    ms = {int(width): float(t) for width, t in (pair.split(":") for pair in spec.split(","))}
    return {width: t / ms[1] for width, t in ms.items()}


def _one_row(target: TargetModel, max_nodes: int, context: int) -> Callable[[int], None]:
    """``verify(size)`` on ``target``: a random chain of ``size`` nodes after ``context`` random
    tokens, verified and undone."""
    context = max(1, min(context, target.max_length - max_nodes - 2))
    vocab = int(target.model.config.vocab_size)
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(1, vocab, (context,), generator=gen).tolist()
    target.prefill(prompt)

    def verify(size: int) -> None:
        target.verify(prompt[-1], DraftTree.chain(torch.randint(1, vocab, (size,), generator=gen).tolist()))
        target.discard()  # the context stays at ``context`` tokens for every measurement

    return verify


def _rows(model, batch: int, max_nodes: int, context: int, graphs: bool) -> Callable[[int], None]:
    """``verify(size)`` on a `BatchTarget` of ``batch`` rows of ``context`` random tokens: every
    row a random chain of ``size`` nodes, verified and undone. ``graphs``: at fixed shapes, as
    `--target-graphs` verifies them (each shape run eagerly at its first use and captured at its
    second, whose times the fastest of the rounds leaves out)."""
    from ngspec.batch_target import BatchTarget

    target = BatchTarget(model)
    if graphs:
        target.use_graphs()
    context = max(1, min(context, target.max_length - max_nodes - 2))
    vocab = int(model.config.vocab_size)
    gen = torch.Generator().manual_seed(0)
    for _ in range(batch):
        target.admit(torch.randint(1, vocab, (context,), generator=gen).tolist())

    def verify(size: int) -> None:
        target.verify([1] * batch, [DraftTree.chain(torch.randint(1, vocab, (size,), generator=gen).tolist()) for _ in range(batch)])
        target.discard()

    return verify


def measure_verify_costs(
    target: TargetModel, max_nodes: int, context: int = 512, repeats: int = 9, progress: Callable[[int, int], None] | None = None,
) -> tuple[float, ...]:
    """Relative cost of verifying 0..max_nodes nodes (index = tree size), interpolated between
    measured sizes and made non-decreasing (about 9 s for the default model on two cores)."""
    return _relative_costs(_one_row(target, max_nodes, context), target.device, max_nodes, repeats, progress=progress)


def measure_batch_costs(
    model, batch: int, max_nodes: int, context: int = 512, repeats: int = 9, progress: Callable[[int, int], None] | None = None,
) -> tuple[float, ...]:
    """`measure_verify_costs` for ``batch`` rows verified together: the cost of every row
    verifying n nodes, relative to every row verifying none (a batched plain step). A batch
    turns compute-bound sooner, so each draft node costs more than alone. About 34 s for the
    default model at batch 8 on two cores."""
    return _relative_costs(_rows(model, batch, max_nodes, context, graphs=False), next(model.parameters()).device, max_nodes, repeats, progress=progress)


def measure_replay_costs(
    target: TargetModel, max_nodes: int, batch: int = 1, context: int = 512, repeats: int = 9, clock: Callable[[], float] = time.perf_counter,
    progress: Callable[[int, int], None] | None = None,
) -> dict[int, float]:
    """With `--target-graphs` (``target.static`` set): the cost of verifying a block of each width
    bucket (1, 2, 4, ... up to the widest that trees of ``max_nodes`` nodes reach; and 1 +
    ``max_nodes`` tokens where that is too wide for any), for ``batch`` rows, relative to one token
    a row (`replay_sizes`). One row verifies on ``target`` itself, so the shapes it captures are
    the run's own."""
    verify = _one_row(target, max_nodes, context) if batch == 1 else _rows(target.model, batch, max_nodes, context, graphs=True)
    return _by_width(_fastest(verify, target.device, replay_sizes(max_nodes), repeats, clock, progress))


def cost_table(points: dict[int, float], max_nodes: int) -> tuple[float, ...]:
    """Relative cost of 0..max_nodes nodes from measured ``{nodes: relative cost}`` points:
    linear between points, along the last slope beyond them, never below 1.0 or decreasing."""
    known = sorted({0: 1.0, **points}.items())  # a measured size 0 replaces the default
    table, running = [], 1.0
    for n in range(max_nodes + 1):
        lower = max((p for p in known if p[0] <= n), key=lambda p: p[0])
        upper = min((p for p in known if p[0] >= n), key=lambda p: p[0], default=None)
        if upper is None:  # beyond the measured sizes
            prev = known[-2] if len(known) > 1 else (0, 1.0)
            slope = (known[-1][1] - prev[1]) / max(known[-1][0] - prev[0], 1)
            value = known[-1][1] + slope * (n - known[-1][0])
        elif upper[0] == lower[0]:
            value = lower[1]
        else:
            value = lower[1] + (upper[1] - lower[1]) * (n - lower[0]) / (upper[0] - lower[0])
        running = max(running, value)
        table.append(running)
    return tuple(table)


def model_shape(model: torch.nn.Module) -> str:
    """What a forward's cost depends on in the model itself: its class, attention implementation
    and the sizes of its layers, not its name or weights. The cost tables were keyed by the name
    the model was given, so one model loaded by name and by path was timed twice, and two models
    given as the same relative path shared the first one's table."""
    config = model.config
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    sizes = ("num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim", "vocab_size", "sliding_window", "tie_word_embeddings")
    fields = [type(model).__name__, str(getattr(config, "_attn_implementation", None))]
    fields += [f"{name}={getattr(text, name, None)}" for name in sizes]
    return ",".join(fields)


TimingBar = Callable[[str], AbstractContextManager]  # a description -> a block yielding a (done, total) callback, or None


def _no_bar(what: str) -> AbstractContextManager:
    return nullcontext(None)


def cached_verify_costs(target: TargetModel, max_nodes: int, batch: int = 1, bar: TimingBar | None = None, pad_wider: bool = True) -> tuple[float, ...]:
    """`measure_verify_costs` (or `measure_batch_costs` for ``batch`` > 1; with `--target-graphs`
    `measure_replay_costs`, and blocks padded wider where that replays cheaper unless not
    ``pad_wider``), measured once per model shape, machine setting and batch size and then read
    from the cache; ``bar`` shows the measurement's rounds (the CLI's `progress_when_called`)."""
    plan = current_plan(target.model)
    # "fastest": the fastest of interleaved rounds; older entries (medians, or one size after
    # another) are measured again
    setting = f"{model_shape(target.model)}|{cpu_name() if target.device.type == 'cpu' else ''}|{target.device}|{target.dtype}|{torch.get_num_threads()}|{torch.__version__}|{max_nodes}|fastest"
    setting += f"|kernels={','.join(plan.kernels)}" if plan is not None else ""
    if batch > 1:
        setting += f"|batch={batch}"
    if target.static is not None:  # `--target-graphs`: a step costs its block's bucket's replay
        return _replayed_costs(target, max_nodes, batch, setting + "|target-graphs|widths", bar, pad_wider)

    def read(entry: dict) -> tuple[float, ...] | None:
        costs = tuple(float(c) for c in entry["relative_cost"])
        return costs if len(costs) == max_nodes + 1 else None

    def measure() -> tuple[tuple[float, ...], dict]:
        what = "timing verify costs (rounds)" if batch == 1 else f"timing verify costs at batch {batch} (rounds)"
        with (bar or _no_bar)(what) as rounds:
            if batch == 1:
                costs = measure_verify_costs(target, max_nodes, progress=rounds)
            else:
                costs = measure_batch_costs(target.model, batch, max_nodes, progress=rounds)
        return costs, {"relative_cost": costs}

    return measured_once("costs", setting, read, measure)


def _replayed_costs(target: TargetModel, max_nodes: int, batch: int, setting: str, bar: TimingBar | None, pad_wider: bool) -> tuple[float, ...]:
    """`cached_verify_costs` with `--target-graphs`: each width bucket's replay measured once per
    setting (`measure_replay_costs`), the blocks of ``batch`` rows sent to the cheapest bucket at
    least as wide from now on (`plan_widths`; unless not ``pad_wider``), and the table of what
    trees then cost (`replayed_table`)."""

    def read(entry: dict) -> dict[int, float] | None:
        costs = {int(w): float(c) for w, c in entry["width_cost"].items()}
        return costs if set(costs) == set(_by_width({n: 1.0 for n in replay_sizes(max_nodes)})) else None

    def measure() -> tuple[dict[int, float], dict]:
        what = "timing replayed verification by width (rounds)" + (f" at batch {batch}" if batch > 1 else "")
        with (bar or _no_bar)(what) as rounds:
            costs = measure_replay_costs(target, max_nodes, batch, progress=rounds)
        return costs, {"width_cost": {str(w): c for w, c in costs.items()}}

    costs = measured_once("costs", setting, read, measure)
    if pad_wider:
        plan_widths(target.model, batch, {w: c for w, c in costs.items() if w <= MOST_WIDTH})
    return replayed_table(costs, max_nodes, pad_wider)
