"""Batched decoding: up to B prompts at once, each with its own drafter, acceptance and stop.

The loop is `decode.generate` for B rows: every row proposes a tree, the trees are sized
together, one forward verifies all of them (`BatchTarget.verify`), each row accepts along its
own tree, the accepted entries are kept and the rest become holes. The rows are padded to the
widest tree, so one width is chosen for all (`tree.joint_width`: a row's extra node costs every
row); with ``--batch-layout packed`` they go back to back, so the linear layers cost by the total
nodes and each row keeps the nodes that pay for their share (`tree.packed_sizes`). On the team's
two-core CPU packing lost to padding (BENCHMARKS.md 10n): attention, a third to a half of a
batch-8 step there, still costs per row and query. Every ``rearrange_every`` steps
the cache is compacted if that frees at least ``rearrange_min_share`` of its slots (compaction
copies the whole cache, which costs more than a few steps' attention over a few holes) and, at
fixed shapes (``target_graphs``), lowers the slots a forward attends (`BatchTarget.compaction_pays`);
at fixed shapes it is also compacted before a step whose block would outgrow the cache's buffers
(`BatchTarget.outgrows`: new buffers drop every captured graph).
Trees are sized by the verify costs measured at this batch size, rescaled by what the batch's own
steps take (`ngspec.perf.online.StepTimes`, as at batch size 1), fitted per number of rows: a
batch drains to fewer rows once no prompt waits, and those cheaper steps mixed into one fit swung
its slope from 0.25x to 3.7x the table's (BENCHMARKS.md 10s). A
finished row hands its slot to the next waiting prompt; a prompt that cannot run (longer than the
context window) fails alone with a clear message. Prompts may also arrive while the batch runs
(``feed``: `ngspec serve`'s concurrent requests), each with its own budget, sampling, stops and
token callback, taking freed slots and new rows up to the batch size. Every row's output equals
its own plain decoding.
"""

from __future__ import annotations

import time
from collections import defaultdict, deque
from dataclasses import dataclass, field
from typing import Callable, Sequence

from ngspec.architecture import rope_depth
from ngspec.batch_target import BatchTarget
from ngspec.contracts import DraftContext, Drafter, RunStats, StepStats
from ngspec.decode import DecodeConfig, Generation, Stopper, _first_token, check_prompt, out_of_room
from ngspec.eagle.batched import propose_together
from ngspec.errors import NgspecError, kind_of
from ngspec.perf.measured import CpuWatch
from ngspec.perf.online import StepTimes
from ngspec.static_verify import cold_runs
from ngspec.tree import joint_width, packed_sizes
from ngspec.verify import Draws, SamplingConfig, accept_argmax, sample_rows


LAYOUTS = ("padded", "packed")
GPU_PREFILL_TOKENS = 8192  # the default `BatchConfig.prefill_tokens` off the CPU


@dataclass(frozen=True)
class BatchConfig:
    batch_size: int = 4
    rearrange_every: int = 8  # steps between compaction checks (0 = never compact); measured on CPU (BENCHMARKS.md)
    rearrange_min_share: float = 0.2  # compact only when that frees at least this share of the slots (BENCHMARKS.md)
    joint_sizing: bool = True  # size all rows' trees together (the batch pays for the widest); False: each row alone
    heads_together: bool = True  # run every row's EAGLE head calls in one forward per level; False: row by row
    layout: str = "padded"  # verify rows "padded" to the widest tree, or "packed" back to back (BENCHMARKS.md 10n)
    # prompts admitted at once are prefilled together in forwards of at most this many tokens,
    # padding included (0: each prompt alone; None: GPU_PREFILL_TOKENS on a GPU, where a prefill
    # costs host work about as a step does, and 0 on a CPU, whose prefill is arithmetic: padding
    # would cost and the logits move by float rounding, BENCHMARKS.md 10zp)
    prefill_tokens: int | None = None
    # verify at fixed shapes, replayed from captured CUDA graphs on a GPU (`ngspec.static_verify`)
    target_graphs: bool = False

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise NgspecError(f"--batch-size must be at least 1 (got {self.batch_size})")
        if self.rearrange_every < 0:
            raise NgspecError("--rearrange-every must be >= 0 (0 = never compact)")
        if self.layout not in LAYOUTS:
            raise NgspecError(f"--batch-layout must be one of {', '.join(LAYOUTS)} (got {self.layout!r})")
        if self.prefill_tokens is not None and self.prefill_tokens < 0:
            raise NgspecError(f"--prefill-tokens must be >= 0 (0 = each prompt's prefill alone; got {self.prefill_tokens})")
        if not 0.0 <= self.rearrange_min_share < 1.0:
            raise NgspecError(f"--rearrange-min-share must be in [0, 1) (got {self.rearrange_min_share})")


@dataclass
class BatchReport:
    """What the batch did with its cache: steps, compactions, their cost and what they freed, slots
    held."""

    steps: int = 0
    rearrangements: int = 0
    rearrange_skipped: int = 0  # checks where compaction would not have paid (too little freed; at fixed shapes, the same slots attended)
    rearrange_seconds: float = 0.0
    freed_entries: int = 0  # cache entries (rows x slots) that compactions freed
    cost_units: float = 0.0  # the steps' summed cost in plain batched steps, by the measured table
    row_steps: int = 0  # sum over steps of the rows verified
    padded_nodes: int = 0  # sum over steps of rows x the widest row's draft nodes: what a padded step verifies
    slot_steps: int = 0  # sum over steps of (rows x cache slots) attended
    live_steps: int = 0  # the same for live entries only: what a hole-free cache would hold
    peak_slots: int = 0
    seconds: float = 0.0
    prefill_seconds: float = 0.0  # admitting prompts, while the other rows wait
    prefill_tokens: int = 0  # the cap the batch prefilled under (`BatchConfig.prefill_tokens`, resolved)
    prefill_forwards: int = 0
    new_tokens: int = 0
    target_graphs: str | None = None  # what `--target-graphs` captured and replayed (`Graphs.report`)

    @property
    def hole_share(self) -> float:
        return 1.0 - self.live_steps / self.slot_steps if self.slot_steps else 0.0

    def as_dict(self) -> dict:
        return {
            "steps": self.steps, "rearrangements": self.rearrangements, "rearrange_skipped": self.rearrange_skipped,
            "rearrange_seconds": self.rearrange_seconds, "freed_entries": self.freed_entries, "cost_units": self.cost_units,
            "padded_nodes_per_row": self.padded_nodes / self.row_steps if self.row_steps else 0.0,
            "mean_hole_share": self.hole_share, "peak_cache_slots": self.peak_slots, "seconds": self.seconds,
            "prefill_seconds": self.prefill_seconds, "prefill_share": self.prefill_seconds / self.seconds if self.seconds else 0.0,
            "prefill_tokens": self.prefill_tokens, "prefill_forwards": self.prefill_forwards,
            "new_tokens": self.new_tokens, "tokens_per_second": self.new_tokens / self.seconds if self.seconds else 0.0,
            "target_graphs": self.target_graphs,
        }


@dataclass
class BatchResult:
    index: int  # position of the prompt in the input
    generation: Generation | None = None
    error: str | None = None


@dataclass
class Request:
    """A prompt with settings of its own, for a batch that takes prompts as they arrive (``feed``
    of `generate_batch`: `ngspec serve` batches concurrent requests so). ``draws``: its sampling's
    random numbers, from its seed and prompt (`verify.Draws`; None: greedy), so a row samples what
    the prompt alone would."""

    index: int
    prompt: list[int]
    max_new_tokens: int
    sampling: SamplingConfig
    stopper: Stopper
    on_tokens: Callable[[list[int]], None] | None = None
    cancelled: Callable[[], bool] | None = None  # asked before each step: True ends the row ("cancelled")
    on_done: Callable[[], None] | None = None  # called once the row has ended, unless cancelled (e.g. to send the last text)
    draws: Draws | None = field(init=False)

    def __post_init__(self) -> None:
        self.draws = Draws.of(self.sampling, self.prompt)


@dataclass
class _Row:
    request: Request
    drafter: Drafter
    start: float
    watch: CpuWatch  # others' use of the CPUs since the row's prefill began
    out: list[int] = field(default_factory=list)
    stats: RunStats = field(default_factory=RunStats)
    reason: str | None = None

    @property
    def index(self) -> int:
        return self.request.index

    @property
    def prompt(self) -> list[int]:
        return self.request.prompt

    @property
    def stopper(self) -> Stopper:
        return self.request.stopper

    def emit(self, tokens: list[int]) -> None:
        if self.request.on_tokens is not None and tokens:
            self.request.on_tokens(tokens)


def fed_requests(arrived: object, indices: set[int]) -> list[Request]:
    """What a ``feed`` handed back, checked: a list (or tuple) of `Request`, each with an index
    this batch has not seen (``indices``, updated): results are keyed by index, so a second
    request under one would take the first one's result."""
    if not isinstance(arrived, (list, tuple)):
        got = "None" if arrived is None else kind_of(arrived)
    else:
        odd = [r for r in arrived if not isinstance(r, Request)]
        got = f"a list holding {kind_of(odd[0])}" if odd else None
    if got is not None:
        raise NgspecError(f"feed must return a list of requests (made by Speculator.request), [] when none arrived; got {got}")
    for request in arrived:
        if request.index in indices:
            raise NgspecError(f"feed gave a request with index {request.index}, which this batch already has: give every request an index of its own")
        indices.add(request.index)
    return list(arrived)


def check_rope_switch(prompt: Sequence[int], max_new_tokens: int, switch: int | None, batch_size: int) -> None:
    """In a batch one forward's longest position decides every row's rotary frequencies where
    they switch (longrope, `ngspec.architecture.rope_switch`), so a row that could reach the
    switch would change the other rows' outputs: it is refused (and fails alone)."""
    if switch is not None and batch_size > 1 and len(prompt) + max_new_tokens >= switch:
        raise NgspecError(
            f"this model switches its rotary frequencies for a whole forward at {switch} positions (longrope), so in a "
            f"batch every row must stay below that: {len(prompt)} prompt tokens plus {max_new_tokens} new ones "
            "could reach it; decode this prompt with --batch-size 1"
        )


def generate_batch(
    model,
    prompts: Sequence[Sequence[int]],
    new_drafter: Callable[[], Drafter],
    cfg: DecodeConfig,
    batch: BatchConfig,
    new_stopper: Callable[[], Stopper],
    verify_cost: Callable[[int], tuple[float, ...]] = lambda context: (),
    on_finish: Callable[[BatchResult], None] | None = None,
    feed: Callable[[], list[Request]] | None = None,
) -> tuple[list[BatchResult], BatchReport]:
    """Generate for every prompt, ``batch.batch_size`` at a time; results in input order.
    ``feed``, when given, is asked for requests that arrived since (each with its own budget,
    sampling, stops and token callback) whenever a slot is free: before every step while the batch
    has fewer rows than its size, and as a row ends. They fill free slots and rows up to the batch
    size, and the call returns once no row is left and none came (results in the order of their
    index)."""
    if cfg.verify != "tree":
        raise NgspecError("batched generation verifies trees (--verify tree); rows layout is for batch size 1")
    # the rows the cache will hold: a static batch fills them; requests fed one by one (a server)
    # may never, so their rows grow by doubling
    wanted = min(batch.batch_size, len(prompts)) if feed is None else None
    target = BatchTarget(model, packed=batch.layout == "packed", rows_wanted=wanted)
    target.prefill_tokens = batch.prefill_tokens if batch.prefill_tokens is not None else (0 if target.device.type == "cpu" else GPU_PREFILL_TOKENS)
    static = target.use_graphs() if batch.target_graphs else None
    results: dict[int, BatchResult] = {}
    report = BatchReport(prefill_tokens=target.prefill_tokens)
    waiting = deque(Request(i, list(p), cfg.max_new_tokens, cfg.sampling, new_stopper()) for i, p in enumerate(prompts))
    indices = {r.index for r in waiting}
    rows: list[_Row] = []
    # what this batch's verify calls take, fitted per number of rows (a step of fewer rows costs
    # less): rescales the cost table, as at batch 1
    times: defaultdict[int, StepTimes] = defaultdict(StepTimes)

    def learned(table: tuple[float, ...], rows: int) -> tuple[float, ...]:
        return times[rows].corrected(table) if cfg.learn_costs else table

    began = time.perf_counter()

    def compact() -> None:
        """`BatchTarget.rearrange`, timed and counted."""
        t0, before = time.perf_counter(), target.slots
        target.rearrange()
        report.rearrangements += 1
        report.rearrange_seconds += time.perf_counter() - t0
        report.freed_entries += (before - target.slots) * target.rows

    def finish(row: _Row) -> None:
        if row.request.on_done is not None and row.reason != "cancelled":
            row.request.on_done()
        g = Generation(row.out, time.perf_counter() - row.start, row.reason, row.stats,
                       row.drafter.stats() if hasattr(row.drafter, "stats") else None,
                       None if row.request.draws is None else row.request.draws.seed, row.watch.share())
        results[row.index] = BatchResult(row.index, g)
        report.new_tokens += len(row.out)
        if on_finish:
            on_finish(results[row.index])

    def admit(freed: list[int], new_rows: int = 0) -> list[_Row]:
        """Start waiting prompts that fit, one per slot of ``freed`` in order, then in up to
        ``new_rows`` new rows, prefilled together where the target batches prefills; fewer rows
        when fewer wait. Requests fed since are taken first into the queue, among them any that a
        row just finished led to (a conversation's next turn): a batch whose last row ends then
        goes on with them."""
        if feed is not None:
            waiting.extend(fed_requests(feed(), indices))
        slots: list[int | None] = [*freed, *[None] * min(new_rows, len(waiting))]  # a batch size far above the prompts costs nothing
        requests: list[Request] = []
        while waiting and len(requests) < len(slots):
            request = waiting.popleft()
            try:
                check_prompt(request.prompt, target.max_length, target.vocab)
                check_rope_switch(request.prompt, request.max_new_tokens, target.rope_switch, batch.batch_size)
            except NgspecError as exc:
                results[request.index] = BatchResult(request.index, error=str(exc))
                if on_finish:
                    on_finish(results[request.index])
                continue
            requests.append(request)
        if not requests:
            return []
        drafters = [new_drafter() for _ in requests]
        for drafter in drafters:
            target.keep_features = target.keep_features or bool(getattr(drafter, "needs_features", False))
            target.feature_layers = getattr(drafter, "feature_layers", None)
        t0, watch = time.perf_counter(), CpuWatch()
        logits = target.admit_many([r.prompt for r in requests], slots[: len(requests)])
        took = time.perf_counter() - t0
        report.prefill_seconds += took
        prefill = took / len(requests)  # a shared prefill: each row's share
        started = []
        for request, drafter, first in zip(requests, drafters, logits):
            row = _Row(request, drafter, t0, watch)
            root = _first_token(first, request.sampling, request.draws)
            row.stats.prefill_seconds = prefill
            row.out, row.reason = row.stopper.cut([], [root])
            # a budget of one token is spent here: a row admitted into a freed slot must stop
            # before the next step, as the loop's check stops the rows it sees
            row.reason = row.reason or out_of_room(len(row.out), len(request.prompt), request.max_new_tokens, target.max_length)
            row.stats.steps.append(StepStats(0, len(row.out), 0.0, 0.0))  # the prefill
            drafter.start(request.prompt)
            drafter.observe(row.out)
            row.emit(row.out)
            started.append(row)
        return started

    def fill() -> None:
        """New rows for waiting prompts, up to the batch size."""
        if len(rows) < batch.batch_size:
            rows.extend(admit([], batch.batch_size - len(rows)))

    fill()
    while rows:
        # rows that are done hand their slot to the next prompt, or leave the batch; a finished
        # row is let go before the next is admitted, so that the head-cache row its drafter holds
        # is free for the new drafter (indexed: `enumerate` would keep its last pair alive)
        freed = []
        for b in range(len(rows)):
            row = rows[b]
            if row.reason is None and row.request.cancelled is not None and row.request.cancelled():
                row.reason = "cancelled"  # e.g. a streaming client that left: its slot goes to the next prompt
            if row.reason is None:
                row.reason = out_of_room(len(row.out), target.lengths[b], row.request.max_new_tokens, target.max_length)
            if row.reason is not None:
                finish(row)
                rows[b] = row = None
                freed.append(b)
        for b, row in zip(freed, admit(freed)):  # all freed slots' prompts admitted together
            rows[b] = row
        if any(r is None for r in rows):
            order = target.drop([b for b, r in enumerate(rows) if r is not None])
            rows = [rows[b] for b in order]
            if not rows:
                break
        fill()  # prompts that arrived while every slot was busy
        if any(r.reason is not None for r in rows):  # an admitted prompt already ended (EOS first)
            continue

        # every row drafts; rows that draft with an EAGLE head run it together, one forward per level
        t0 = time.perf_counter()
        contexts = []
        for b, row in enumerate(rows):
            features = target.take_features(b) if getattr(row.drafter, "needs_features", False) else None
            room = min(cfg.max_draft_nodes, target.max_length - target.lengths[b] - 1)
            contexts.append(DraftContext(row.prompt + row.out, len(row.prompt), room, learned(verify_cost(target.lengths[b]), len(rows)), features, batch.joint_sizing))
        if batch.heads_together:
            proposed = propose_together([r.drafter for r in rows], contexts)
        else:
            proposed = [r.drafter.propose(c) for r, c in zip(rows, contexts)]
        trees = [
            tree.truncated(ctx.max_nodes, max_depth=rope_depth(target.lengths[b], target.rope_switch, ctx.max_nodes))
            for b, (tree, ctx) in enumerate(zip(proposed, contexts))
        ]
        draft_s = [(time.perf_counter() - t0) / len(rows)] * len(rows)  # drafting is shared: each row's share
        # size the rows' trees together: packed, each row by what its nodes gain against the
        # batch's total; padded, one width that every row pays for
        table = verify_cost(max(target.lengths))
        if target.packed and table:
            sizes = packed_sizes(trees, lambda sizes: target.step_cost(learned(table, len(rows)), sizes))
        elif target.packed:
            sizes = [t.size for t in trees]  # nothing measured: every tree whole
        else:
            width = joint_width(trees, learned(table, len(rows)))
            sizes = [min(t.size, width) if t.gains else t.size for t in trees]
        for b, row in enumerate(rows):
            if trees[b].size > sizes[b]:
                trees[b] = trees[b].truncated(sizes[b], max_depth=sizes[b])
                if hasattr(row.drafter, "keep"):
                    row.drafter.keep(trees[b].size)
            budget = row.request.max_new_tokens - len(row.out)
            trees[b] = trees[b].truncated(trees[b].size, max_depth=budget - 1)

        if target.outgrows(1 + max(t.size for t in trees)):  # at fixed shapes: compacted rather than grown
            compact()
        step_cost = target.step_cost(table, [t.size for t in trees])  # by the measured table: no timing noise
        t1, cold = time.perf_counter(), cold_runs(target)
        verified = target.verify([r.out[-1] for r in rows], trees)
        # greedy rows: one argmax and one copy to the host for every row; sampled rows: on a GPU
        # one race and one copy for the rows of a setting, on a CPU each visited node's draw
        argmax = verified.greedy() if any(r.request.sampling.greedy for r in rows) else None
        sampled = [b for b, r in enumerate(rows) if not r.request.sampling.greedy]
        samples = dict(zip(sampled, sample_rows(
            [trees[b] for b in sampled], [verified.row(b) for b in sampled], [rows[b].request.sampling for b in sampled],
            [rows[b].request.draws for b in sampled], [len(rows[b].out) for b in sampled],
        )))
        verdicts = [accept_argmax(t, argmax[b] if b not in samples else samples[b]) for b, t in enumerate(trees)]
        target.commit([v.path for v in verdicts])
        if cold_runs(target) == cold:  # a verification at a new fixed shape is not what a step costs
            times[len(rows)].record(step_cost, time.perf_counter() - t1)  # the verdicts read waited for the device
        report.steps += 1
        report.cost_units += step_cost
        report.row_steps += len(rows)
        report.padded_nodes += len(rows) * max(t.size for t in trees)
        use = target.use()
        report.slot_steps += use.slots * use.rows
        report.live_steps += use.live
        report.peak_slots = max(report.peak_slots, use.slots)

        for row, tree, verdict, d in zip(rows, trees, verdicts, draft_s):
            new, row.reason = row.stopper.cut(row.out, verdict.tokens)
            row.stats.steps.append(StepStats(tree.size, len(new), d, step_cost))
            row.out.extend(new)
            row.drafter.observe(new)
            row.emit(new)

        if batch.rearrange_every and report.steps % batch.rearrange_every == 0:
            if not target.compaction_pays(batch.rearrange_min_share):
                report.rearrange_skipped += 1
            else:
                compact()

    report.seconds = time.perf_counter() - began
    report.prefill_forwards = target.prefill_forwards
    report.target_graphs = None if static is None else static.report()
    return [results[i] for i in sorted(results)], report

