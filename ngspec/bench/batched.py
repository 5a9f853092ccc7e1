"""`ngspec bench --batch-size B`: the arms compared as batches of B rows.

Each arm decodes all the prompts as one batch of B rows (a finished row's slot goes to the next
prompt, as in `generate --batch-size`); arms run one after another, in reversed order every other
round, so slow drift of the machine hits all of them. Rows overlap in time, so throughput is the
batch's total tokens over its wall time, and the baseline is ``vanilla`` at the same batch size
(transformers' `generate` pads a batch its own way and is left out). Every row is checked against
transformers' greedy decoding of its prompt alone (sampling, against vanilla's row: one seed
samples the same tokens whatever the drafts, `verify.Draws`); a row that differs gets the
reference's top-2 margin where it split (`row_splits`), to tell a near-tie from a bug. A round is
one pair per arm, not one per prompt: the spread of the per-round ratios is what tells a few
percent from noise (BENCHMARKS.md 10p: two rounds on two CPU cores differed by 6%).

With ``groups`` (``--interleave-batches K``) the prompts are cut into groups of K batches' worth
and every arm runs in turn on each group (order reversed every other group), so that a load that
changes within a round hits every arm alike (on an H100 two whole rounds differed by 20-60%,
BENCHMARKS.md 10zn); each group's runs are then a pair, and the interval resamples the groups
(`interval.ratio_interval`, a group's rounds together). A group is a batch run of its own: its
last rows drain with slots left empty, which a run over every prompt fills with the next one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterator

from ngspec.batch import BatchConfig
from ngspec.bench.interval import ratio_interval, rounds_interval
from ngspec.bench.report import SAMPLED_NOTE, busy_text, interval_text, setup_text, table_lines
from ngspec.bench.runner import arm_drafter, warm_config
from ngspec.check import GreedyCheck, divergence, margin_text
from ngspec.decode import DecodeConfig
from ngspec.drafters import Resources
from ngspec.drafters.trie import Calibration
from ngspec.engine import Engine
from ngspec.errors import NgspecError, Stopped
from ngspec.metrics.self_repetition import self_repetition
from ngspec.verify import Draws

BASE = "vanilla"


@dataclass
class BatchRound:
    """One arm's batch over all the prompts, once."""

    seconds: float
    tokens: int
    calls: int  # verify calls summed over the rows, the prefill counted as each row's first
    draft_seconds: float
    prefill_seconds: float
    outputs: list[list[int]]
    row_calls: list[int] = field(default_factory=list)  # each row's verify calls, its prefill counted
    groups: list[tuple[int, float]] = field(default_factory=list)  # (tokens, seconds) of each group's run, in order
    steps: int = 0  # the batch's verification steps
    nodes: int = 0  # draft nodes verified, summed over the rows' steps
    padded: int = 0  # the same, were every row as wide as its step's widest (what a padded step verifies)
    cost_units: float = 0.0  # the steps' cost in plain batched steps by the measured table (`BatchReport.cost_units`)
    drafter_stats: list[dict] = field(default_factory=list)  # the rows' drafter statistics, of the drafters that keep them (row drafters: rows per strategy)

    @property
    def rate(self) -> float:
        return self.tokens / self.seconds

    @property
    def tokens_per_call(self) -> float:
        return self.tokens / self.calls

    @property
    def step_cost(self) -> float:
        return self.cost_units / self.steps if self.steps else 0.0

    @property
    def row_steps(self) -> int:
        return self.calls - len(self.outputs)  # each row's prefill is its first call

    @property
    def nodes_per_row(self) -> float:
        return self.nodes / self.row_steps if self.row_steps else 0.0

    @property
    def padded_per_row(self) -> float:
        return self.padded / self.row_steps if self.row_steps else 0.0


@dataclass
class BatchArmSummary:
    arm: str
    tokens_per_second: float  # total tokens / total seconds over every round
    speedup: float  # throughput ratio vs vanilla at the same batch size
    round_speedups: list[float]  # the same, round by round
    tokens_per_call: float  # per row: tokens / verify calls summed over the rows
    draft_share: float
    prefill_share: float
    exact_match: float | None  # share of rows (over every round) equal to transformers' greedy decoding (sampled: vanilla's rows; None for vanilla)
    nodes_per_row: float = 0.0  # draft nodes a row's step verified, on average (the prefill left out)
    padded_per_row: float = 0.0  # the same were every row as wide as its step's widest: what a padded batch verifies
    step_cost: float = 0.0  # a step's cost in plain batched steps by the measured table, on average
    largest_tie_margin: float | None = None  # over the rows that differ: the reference's top-2 margin where they split
    largest_tie_steps: float | None = None  # the widest such split in rounding steps of the model's dtype
    rounds: list[BatchRound] = field(default_factory=list, repr=False)

    @property
    def groups(self) -> int:
        """The groups of prompts each round ran in (1: all of them as one batch run)."""
        return len(self.rounds[0].groups)


def batch_groups(ids: list, batch_size: int, batches: int) -> list[list]:
    """The prompts in consecutive groups of ``batches`` batches' worth (all of them at 0): the
    benchmarks that run every arm in turn on each group, so that a load that changes during a run
    hits every arm alike (`benchmarks/reader_ab.py`, `reader_ablation.py`, ``--interleave-batches``)."""
    if not batches:
        return [ids]
    n = batches * batch_size
    return [ids[i : i + n] for i in range(0, len(ids), n)]


def run_batched(
    engine: Engine, ids: list[list[int]], arms: list, cfg: DecodeConfig, res: Resources, batch: BatchConfig, rounds: int,
    on_progress: Callable[[str], None] | None = None, groups: int = 0,
) -> dict[str, list[BatchRound]]:
    """Every arm's batch over ``ids``, ``rounds`` times; each arm's drafter estimates carried from
    prompt to prompt within a round (as `generate --batch-size` does), fresh every round. With
    ``groups`` (K), every arm in turn on each group of K batches' worth of prompts instead (order
    reversed every other group), a round's groups summed into its `BatchRound`. First, untimed,
    every arm decodes a few tokens of one batch of the first prompts (as `warm_up` does for one
    row). Interrupted (Ctrl-C, SIGTERM) after a whole round, it raises `Stopped` with the rounds
    every arm finished."""
    out: dict[str, list[BatchRound]] = {a.label: [] for a in arms}
    for arm in arms:
        engine.run_batch(ids[: batch.batch_size], lambda arm=arm: arm_drafter(arm, res), warm_config(cfg), batch)
    try:
        for whole in _timed_rounds(engine, ids, arms, cfg, res, batch, rounds, on_progress, groups):
            for label, run in whole.items():
                out[label].append(run)
    except KeyboardInterrupt:
        if out[arms[0].label]:  # whole rounds: one pair per arm each
            raise Stopped(out) from None
        raise
    return out


def _timed_rounds(engine, ids, arms, cfg, res, batch, rounds, on_progress, groups) -> Iterator[dict[str, BatchRound]]:
    """`run_batched`'s timed rounds, each yielded once every arm has run it whole."""
    for r in range(rounds):
        carried = {arm.label: Calibration() for arm in arms}
        parts: dict[str, list[BatchRound]] = {arm.label: [] for arm in arms}
        start = 0
        for n, group in enumerate(batch_groups(ids, batch.batch_size, groups)):
            for arm in arms if (r + n) % 2 == 0 else arms[::-1]:
                if res.datastore is not None:
                    res.datastore.forget()  # every timed run reads it cold: arms and rounds repeat the same prompts
                results, report = engine.run_batch(
                    group, lambda arm=arm: arm_drafter(arm, res, carried[arm.label]), cfg, batch,
                )
                failed = next((x for x in results if x.error), None)
                if failed is not None:
                    raise NgspecError(f"prompt {start + failed.index + 1} cannot run: {failed.error}")
                gens = [x.generation for x in results]
                parts[arm.label].append(BatchRound(
                    report.seconds, report.new_tokens, sum(g.stats.verify_calls for g in gens), sum(g.stats.draft_seconds for g in gens),
                    report.prefill_seconds, [g.token_ids for g in gens], [g.stats.verify_calls for g in gens],
                    steps=report.steps, nodes=sum(s.tree_size for g in gens for s in g.stats.steps),
                    padded=report.padded_nodes, cost_units=report.cost_units, drafter_stats=[g.drafter_stats for g in gens if g.drafter_stats],
                ))
                if on_progress:
                    on_progress(arm.label)
            start += len(group)
        yield {arm.label: _joined(parts[arm.label]) for arm in arms}


def _joined(parts: list[BatchRound]) -> BatchRound:
    """One round of an arm from its groups' runs, in prompt order (or an arm's rounds summed)."""
    return BatchRound(
        sum(x.seconds for x in parts), sum(x.tokens for x in parts), sum(x.calls for x in parts), sum(x.draft_seconds for x in parts),
        sum(x.prefill_seconds for x in parts), [o for x in parts for o in x.outputs], [c for x in parts for c in x.row_calls],
        [(x.tokens, x.seconds) for x in parts], sum(x.steps for x in parts), sum(x.nodes for x in parts),
        sum(x.padded for x in parts), sum(x.cost_units for x in parts), [d for x in parts for d in x.drafter_stats],
    )


@dataclass(frozen=True)
class RowSplit:
    """An arm's row that differs from its reference, once however many rounds repeat it."""

    arm: str
    row: int  # index into the prompts asked
    rounds: tuple[int, ...]  # the rounds (from 1) that produced this output
    check: GreedyCheck  # where it splits and the reference's top-2 margin there

    def as_dict(self, labels: list[str]) -> dict:
        return {"arm": self.arm, "prompt": labels[self.row], "rounds": list(self.rounds)} | self.check.as_dict()

    def describe(self, label: str, ref: str) -> str:
        """"LABEL (rounds 1, 3): first differs at token N, REF top-2 margin there M (S dtype
        rounding steps ...)", for the prompt named ``label``; ``ref``: the reference, possessive."""
        rounds = f"round{'s' if len(self.rounds) > 1 else ''} {', '.join(map(str, self.rounds))}"
        return f"{label} ({rounds}): first differs at token {self.check.first_mismatch}, {ref} top-2 margin there {margin_text(self.check.as_dict())}"


def row_splits(
    engine: Engine, runs: dict[str, list[BatchRound]], ids: list[list[int]], reference: list[list[int]], cfg: DecodeConfig,
    on_progress: Callable[[int, int], None] | None = None,
) -> list[RowSplit]:
    """Every arm's rows that differ from ``reference`` (sampling: from vanilla's row of the same
    round, with the prompt's draws), each distinct output once with the reference's top-2 margin
    where it splits (`check.divergence`: one forward of the model per distinct output, each
    reported to ``on_progress`` as (done, total))."""
    sampled = not cfg.sampling.greedy
    seen: dict[tuple, list[int]] = {}  # (arm, row, output, reference) -> the rounds that decoded it
    for arm, rounds in runs.items():
        if sampled and arm == BASE:
            continue
        for r, (run, base) in enumerate(zip(rounds, runs[BASE]), 1):
            for i, got in enumerate(run.outputs):
                want = base.outputs[i] if sampled else reference[i]
                if got != want:
                    seen.setdefault((arm, i, tuple(got), tuple(want)), []).append(r)
    out = []
    if on_progress and seen:
        on_progress(0, len(seen))
    for (arm, i, got, want), where in seen.items():
        check = divergence(engine, ids[i], list(want), list(got), cfg, Draws.of(cfg.sampling, ids[i]))
        out.append(RowSplit(arm, i, tuple(where), check))
        if on_progress:
            on_progress(len(out), len(seen))
    return out


def summarise_batched(
    runs: dict[str, list[BatchRound]], reference: list[list[int]], sampled: bool = False, splits: list[RowSplit] = (),
) -> list[BatchArmSummary]:
    """Per arm: throughput and its ratio to vanilla's (in total and round by round), tokens per
    call per row, drafting and prefill shares, the rows equal to ``reference`` (``sampled``, one
    seed: to vanilla's rows of the same round, which plain sampling draws alike), and from
    ``splits`` (`row_splits`) the widest margin where a row split from it."""
    base = runs[BASE]
    base_rate = _joined(base).rate
    out = []
    for arm, rounds in runs.items():
        total = _joined(rounds)  # every round summed: totals, not a mean of rounds
        checked = [(got, want) for x, b in zip(rounds, base) for got, want in zip(x.outputs, b.outputs if sampled else reference)]
        out.append(BatchArmSummary(
            arm=arm,
            tokens_per_second=total.rate,
            speedup=total.rate / base_rate,
            round_speedups=[x.rate / b.rate for x, b in zip(rounds, base)],
            tokens_per_call=total.tokens_per_call,
            draft_share=total.draft_seconds / total.seconds,
            prefill_share=total.prefill_seconds / total.seconds,
            exact_match=None if sampled and arm == BASE else sum(got == want for got, want in checked) / len(checked),
            nodes_per_row=total.nodes_per_row,
            padded_per_row=total.padded_per_row,
            step_cost=total.step_cost,
            largest_tie_margin=max((x.check.margin for x in splits if x.arm == arm), default=None),
            largest_tie_steps=max((x.check.steps for x in splits if x.arm == arm and x.check.steps is not None), default=None),
            rounds=rounds,
        ))
    return out


def split_lines(splits: list[RowSplit], labels: list[str], sampled: bool = False) -> list[str]:
    """A line for each row that split from its reference: where, in which rounds, and the
    reference's top-2 margin there (a near-tie, a few rounding steps wide, or a bug when wide)."""
    ref = "vanilla's" if sampled else "transformers' greedy"
    return [f"{x.arm}, prompt {x.describe(labels[x.row], ref)}" for x in splits]


def run_stats(runs: dict[str, list[BatchRound]]) -> dict[str, list[dict]]:
    """Each arm's drafter statistics, one per row of every round (`grid.ablation`'s input)."""
    return {label: [d for r in rounds for d in r.drafter_stats] for label, rounds in runs.items()}


def ceiling(ids: list[list[int]], reference: list[list[int]], datastore=None) -> float:
    """Token-weighted self-repetition of the reference outputs (tokens per call with an unbounded
    tree over everything seen; with ``datastore``, searching it too)."""
    values = [self_repetition(p, r, datastore) for p, r in zip(ids, reference)]
    steps = sum(v.steps for v in values)
    return sum(v.tokens for v in values) / steps if steps else 0.0


def by_turn(runs: dict[str, list[BatchRound]], ids: list[list[int]], reference: list[list[int]], turns: list[int]) -> list[dict]:
    """Tokens per call per row of each arm on each turn's rows (``turns[i]``: row i's turn; a
    later turn is asked after the conversation so far), beside that turn's self-repetition
    ceiling. Throughput is not split: a batch's rows share its wall time. Empty when every row is
    a first turn."""
    if set(turns) <= {1}:
        return []
    out = []
    for turn in sorted(set(turns)):
        rows = [i for i, t in enumerate(turns) if t == turn]
        out.append({
            "turn": turn, "rows": len(rows), "ceiling": ceiling([ids[i] for i in rows], [reference[i] for i in rows]),
            "tokens_per_call": {
                arm: sum(len(x.outputs[i]) for x in rounds for i in rows) / sum(x.row_calls[i] for x in rounds for i in rows)
                for arm, rounds in runs.items()
            },
        })
    return out


TURN_COLUMNS = ["turn", "rows", "ceiling"]


def turn_rows(turns: list[dict]) -> list[list[str]]:
    return [[str(t["turn"]), str(t["rows"]), f"{t['ceiling']:.2f}", *(f"{v:.2f}" for v in t["tokens_per_call"].values())] for t in turns]


def turn_columns(turns: list[dict]) -> list[str]:
    return TURN_COLUMNS + [f"{arm} tokens/call" for arm in turns[0]["tokens_per_call"]]


# tok/s over all rows; tokens/call and nodes per row; step cost per batch step
COLUMNS = ["arm", "tok/s", "vs vanilla", "per round", "tokens/call", "nodes/row", "padded", "step cost", "draft share", "prefill share", "exact match"]


def rows(summaries: list[BatchArmSummary]) -> list[list[str]]:
    return [
        [
            s.arm, f"{s.tokens_per_second:.1f}", f"{s.speedup:.3f}x", " ".join(f"{v:.3f}" for v in s.round_speedups),
            f"{s.tokens_per_call:.2f}", f"{s.nodes_per_row:.2f}", f"{s.padded_per_row:.2f}", f"{s.step_cost:.3f}", f"{100 * s.draft_share:.1f}%", f"{100 * s.prefill_share:.1f}%",
            "-" if s.exact_match is None else f"{100 * s.exact_match:.0f}%",
        ]
        for s in summaries
    ]


def versus(summaries: list[BatchArmSummary], base: str) -> list[dict]:
    """Every other arm's throughput against ``base``'s, in total and round by round, with its 95%
    interval: over the groups when the prompts ran in several (`ratio_interval`, each group with
    its rounds' pairs), else over the rounds (`rounds_interval`)."""
    by = {s.arm: s for s in summaries}
    theirs = by[base]
    out = []
    for s in summaries:
        if s.arm == base:
            continue
        per_round = [x.rate / b.rate for x, b in zip(s.rounds, theirs.rounds)]
        grouped = s.groups > 1
        if grouped:
            interval = ratio_interval(
                [p for x in s.rounds for p in x.groups], [p for x in theirs.rounds for p in x.groups],
                keys=[g for x in s.rounds for g in range(len(x.groups))],
            )
        else:
            interval = rounds_interval(per_round)
        out.append({
            "arm": s.arm, "versus": base, "ratio": s.tokens_per_second / theirs.tokens_per_second, "per_round": per_round,
            **({"per_group": [[t / sec / (bt / bs) for (t, sec), (bt, bs) in zip(x.groups, b.groups)] for x, b in zip(s.rounds, theirs.rounds)]} if grouped else {}),
            "interval_95": list(interval) if interval is not None else None,
            "interval_over": "groups" if grouped else "rounds",
        })
    return out


def versus_columns(base: str) -> list[str]:
    return ["arm", f"throughput vs {base}", "per round", "95% interval"]


def versus_rows(pairs: list[dict]) -> list[list[str]]:
    return [
        [p["arm"], f"{p['ratio']:.3f}x", " ".join(f"{v:.3f}" for v in p["per_round"]), interval_text(p["interval_95"], ".3f") + f" ({p['interval_over']})"]
        for p in pairs
    ]


def versus_note(pairs: list[dict]) -> str:
    """What the intervals say: which arms are ahead of or behind the base, or that a few rounds
    (or groups) cannot tell."""
    base = pairs[0]["versus"]
    ahead = [p["arm"] for p in pairs if p["interval_95"] and p["interval_95"][0] > 1]
    behind = [p["arm"] for p in pairs if p["interval_95"] and p["interval_95"][1] < 1]
    more = "more prompts or --rounds narrow" if pairs[0]["interval_over"] == "groups" else "more --rounds (or --interleave-batches) narrow"
    level = [p["arm"] for p in pairs if p["arm"] not in ahead + behind]
    parts = [f"ahead of {base}: {', '.join(ahead)}" if ahead else "", f"behind {base}: {', '.join(behind)}" if behind else "",
             f"not told apart from {base} by these runs ({more} the interval): {', '.join(level)}" if level else ""]
    return "; ".join(p for p in parts if p)


STEP_DEFINITIONS = {
    "nodes_per_row": "draft nodes verified per row per verification step, the prefill left out",
    "padded_per_row": "the same were every row as wide as its step's widest: what a padded batch verifies (the default layout)",
    "step_cost": "a step's cost in plain batched steps by the measured cost table (1 per step without one)",
}
STEP_NOTE = ("nodes/row is the draft nodes a row's step verified; padded, the same were every row as wide as its "
             "step's widest (what a padded batch verifies); step cost, a step's cost in plain batched steps by the measured table: "
             "verification's speed follows tokens/call over step cost, and throughput also pays drafting and the prefill.")


def to_json(
    summaries: list[BatchArmSummary], env: dict, ceilings: tuple[float, float | None], pairs: list[dict], turns: list[dict] = (),
    splits: list[RowSplit] = (), labels: list[str] = (),
) -> dict:
    """``ceilings``: the self-repetition ceiling of the reference outputs, and with the datastore
    searched too (None without one); ``turns``: `by_turn`; ``splits``: `row_splits`, their
    prompts named by ``labels``."""
    return {
        "environment": env,
        "tokens_per_call_definition": "tokens emitted per target forward pass per row, bonus token included, each row's prefill counted as its first call",
        "step_definitions": STEP_DEFINITIONS,
        "self_repetition_token_weighted": ceilings[0],
        **({"self_repetition_token_weighted_with_datastore": ceilings[1]} if ceilings[1] is not None else {}),
        "arms": [
            {k: v for k, v in vars(s).items() if k != "rounds"} | {"round_seconds": [x.seconds for x in s.rounds]}
            | {"round_tokens_per_call": [x.tokens_per_call for x in s.rounds], "round_step_cost": [x.step_cost for x in s.rounds]}
            | ({"group_runs": [[list(g) for g in x.groups] for x in s.rounds]} if s.groups > 1 else {})
            for s in summaries
        ],
        **({"versus": pairs} if pairs else {}),
        **({"by_turn": list(turns)} if turns else {}),
        **({"mismatches": [x.as_dict(labels) for x in splits]} if splits else {}),
    }


def ceiling_text(ceilings: tuple[float, float | None], sampled: bool = False) -> str:
    store = f"; with the datastore: {ceilings[1]:.2f}" if ceilings[1] is not None else ""
    return f"Self-repetition ceiling of transformers' {'sampled' if sampled else 'greedy'} outputs (token-weighted): {ceilings[0]:.2f}{store}"


def how_run(summaries: list[BatchArmSummary]) -> str:
    groups = summaries[0].groups
    if groups > 1:
        return f"Every arm runs in turn on each of {groups} groups of prompts per round, each group a batch run of its own"
    return "Each arm decodes all prompts as one batch per round"


def markdown(
    summaries: list[BatchArmSummary], env: dict, ceilings: tuple[float, float | None], pairs: list[dict], turns: list[dict] = (), sampled: bool = False,
    splits: list[RowSplit] = (), labels: list[str] = (),
) -> str:
    lines = table_lines(COLUMNS, rows(summaries))
    if turns:
        lines += ["", "By turn (tokens/call per row; a later turn is asked after the conversation so far):", ""] + table_lines(turn_columns(turns), turn_rows(turns))
    if pairs:
        base = pairs[0]["versus"]
        lines += [""] + table_lines(versus_columns(base), versus_rows(pairs)) + ["", versus_note(pairs)]
    if splits:
        against = "vanilla" if sampled else "transformers' greedy decoding"
        lines += ["", f"Mismatches vs {against}:"] + [f"- {x}" for x in split_lines(splits, labels, sampled)]
    meta = setup_text(env) + (f"\n\n**Warning:** {busy}" if (busy := busy_text(env)) else "")
    return (
        f"{meta}\n\n{ceiling_text(ceilings, sampled)}\n\n"
        + how_run(summaries) + "; throughput is total tokens over wall time, against "
        "vanilla at the same batch size; tokens/call is per row and counts the bonus token and the prefill. "
        + STEP_NOTE
        + (f" {SAMPLED_NOTE}" if sampled else "") + "\n\n"
        + "\n".join(lines) + "\n"
    )
