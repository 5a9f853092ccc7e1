"""Runs every arm on every prompt in one process, interleaved, and records what each did.

Arms: ``hf-greedy`` (``hf-sample`` when sampling) and ``hf-prompt-lookup`` (transformers'
`generate`, the ecosystem baseline),
``vanilla`` (our engine with no drafts) and the chosen drafters, each possibly at several (k, w)
and in both verification layouts. For each prompt the arms run back to back, so slow drift of the
machine affects all arms alike; with several rounds, in reversed order every other round.
Before any of that every arm decodes a few tokens of the first prompt once, untimed (`warm_up`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable

from ngspec.check import GreedyCheck, divergence
from ngspec.decode import DecodeConfig
from ngspec.drafters import ROW_DRAFTERS, DrafterOptions, Resources, make_drafter
from ngspec.drafters.trie import Calibration
from ngspec.engine import Engine
from ngspec.errors import Stopped
from ngspec.metrics.self_repetition import SelfRepetition, self_repetition
from ngspec.prompts import Prompt
from ngspec.turns import Conversations
from ngspec.verify import Draws

HF_ARMS = ("hf-greedy", "hf-sample", "hf-prompt-lookup")
WARM_UP_TOKENS = 16


@dataclass(frozen=True)
class Arm:
    """One configuration to compare: a drafter with its options and verification layout."""

    label: str
    drafter: str
    opts: DrafterOptions = field(default_factory=DrafterOptions)
    verify: str = "tree"

    @property
    def grid_cell(self) -> tuple[int, int] | None:
        return (self.opts.k, self.opts.w) if self.drafter in ROW_DRAFTERS else None


def baseline(sampled: bool) -> str:
    """The arm every speedup is against: transformers' greedy `generate`, or its sampling."""
    return "hf-sample" if sampled else "hf-greedy"


def make_arms(drafters: list[str], opts: DrafterOptions, ks: list[int], ws: list[int], layouts: list[str], sampled: bool = False) -> list[Arm]:
    """The baseline (hf-greedy, or hf-sample when ``sampled``), hf-prompt-lookup and vanilla,
    then every drafter; row drafters once per (k, w) cell, every drafter once per layout. Labels
    say what differs."""
    arms = [Arm(name, name, opts) for name in (baseline(sampled), "hf-prompt-lookup", "vanilla")]
    grid = len(ks) * len(ws) > 1
    for name in dict.fromkeys(drafters):
        if name in HF_ARMS or name == "vanilla":
            continue
        cells = [(k, w) for k in ks for w in ws] if name in ROW_DRAFTERS else [(opts.k, opts.w)]
        for k, w in cells:
            for layout in layouts:
                label = name
                if name in ROW_DRAFTERS and grid:
                    label += f" k={k} w={w}"
                if len(layouts) > 1:
                    label += f" ({layout})"
                arms.append(Arm(label, name, replace(opts, k=k, w=w), layout))
    return arms


@dataclass
class ArmRun:
    """One arm on one prompt."""

    prompt_id: str
    token_ids: list[int]
    seconds: float
    verify_calls: int | None = None  # unknown for transformers' prompt lookup
    accepted: list[int] = field(default_factory=list)  # tokens emitted by each call
    draft_seconds: float = 0.0
    prefill_seconds: float | None = None  # the prompt's forward; unknown for transformers' arms
    drafter_stats: dict | None = None  # row drafters: rows and accepted tokens per strategy
    vs_reference: GreedyCheck | None = None  # against hf-greedy (sampling: vanilla): first mismatch and its near-tie margin (None: not checked)


@dataclass
class BenchRecord:
    prompt: Prompt
    prompt_tokens: int
    runs: dict[str, ArmRun]
    self_repetition: SelfRepetition  # of the baseline's output given the prompt
    with_datastore: SelfRepetition | None = None  # the same, also searching --datastore
    round: int = 0  # with several rounds, every prompt has a record per round


def arm_drafter(arm: Arm, res: Resources, calibration: Calibration | None = None):
    """A fresh drafter of ``arm`` with the run's tables, head and datastore; ``calibration``: the
    estimates it carries from earlier prompts (None: its own, as a warm-up's)."""
    return make_drafter(arm.drafter, arm.opts, res.tables, res.eagle, res.datastore, calibration)


def warm_config(cfg: DecodeConfig) -> DecodeConfig:
    """``cfg`` for an untimed warm-up run: `WARM_UP_TOKENS` new tokens at most."""
    return replace(cfg, max_new_tokens=min(WARM_UP_TOKENS, cfg.max_new_tokens))


def run_arm(engine: Engine, arm: Arm, ids: list[int], cfg: DecodeConfig, res: Resources, pid: str, calibration: Calibration | None = None) -> ArmRun:
    """``calibration``: the arm's drafter estimates carried from its earlier prompts."""
    if arm.drafter in HF_ARMS:
        tokens, seconds = engine.hf_generate(ids, cfg.max_new_tokens, lookup=arm.drafter == "hf-prompt-lookup", sampling=cfg.sampling)
        calls = len(tokens) if arm.drafter != "hf-prompt-lookup" else None
        return ArmRun(pid, tokens, seconds, calls, [1] * len(tokens) if calls else [])
    cap = arm.opts.k * arm.opts.w if arm.drafter in ROW_DRAFTERS else 0
    arm_cfg = replace(cfg, verify=arm.verify, max_draft_nodes=max(cfg.max_draft_nodes, cap))
    if res.datastore is not None:
        res.datastore.forget()  # every timed run reads it cold: arms and rounds repeat the same prompts
    gen = engine.run(ids, arm_drafter(arm, res, calibration), arm_cfg)
    steps = gen.stats.steps
    return ArmRun(
        pid, gen.token_ids, gen.seconds, len(steps), [s.accepted for s in steps], gen.stats.draft_seconds, gen.stats.prefill_seconds, gen.drafter_stats
    )


def warm_up(engine: Engine, arms: list[Arm], ids: list[int], cfg: DecodeConfig, res: Resources) -> None:
    """Every arm decodes `WARM_UP_TOKENS` of ``ids`` once, untimed, so that a process's first
    allocations, lazy setup and first kernels land on no arm's clock (the first arm of the first
    prompt would pay them all; BENCHMARKS.md 10zk). Its drafter estimates are thrown away."""
    for arm in arms:
        run_arm(engine, arm, ids, warm_config(cfg), res, "warm-up")


def check_runs(engine: Engine, ids: list[int], arms: list[Arm], runs: dict[str, ArmRun], cfg: DecodeConfig) -> None:
    """Every run's `vs_reference`. Greedy: against the first arm (hf-greedy). Sampling: the
    engine's arms against `vanilla` (plain sampling with the same seed draws the same tokens,
    `verify.Draws`); transformers' arms draw their own random numbers, so theirs stay None."""
    if cfg.sampling.greedy:
        reference = runs[arms[0].label].token_ids
        for run in runs.values():
            run.vs_reference = divergence(engine, ids, reference, run.token_ids)
        return
    plain = runs.get("vanilla")
    if plain is None:
        return
    draws = Draws.of(cfg.sampling, ids)
    for arm in arms:
        if arm.drafter not in HF_ARMS:
            run = runs[arm.label]
            run.vs_reference = divergence(engine, ids, plain.token_ids, run.token_ids, cfg, draws)


def run_bench(
    engine: Engine,
    prompts: list[Prompt],
    arms: list[Arm],
    cfg: DecodeConfig,
    res: Resources = Resources(),
    raw: bool = False,
    on_progress: Callable[[str], None] | None = None,
    rounds: int = 1,
    every_turn: bool = False,
) -> list[BenchRecord]:
    """Run ``arms`` on every prompt, ``rounds`` times (the arms in reversed order every other
    round; each round's drafters calibrate afresh and carry that from prompt to prompt); one
    record per prompt and round, the first arm's output (the baseline's) the reference: every
    arm is checked against it when greedy, and its answers make the later turns' prompts.
    ``every_turn``: a multi-turn question's later turns are prompts too, each after the
    conversation so far (`ngspec.turns`). Sampling (``cfg.sampling``, one seed), every arm samples,
    and the engine's arms are checked against `vanilla`'s plain sampling (`check_runs`).
    Interrupted (Ctrl-C, SIGTERM) after a prompt's arms all finished, it raises `Stopped` with the
    records so far."""
    records = []
    asked = Conversations(engine.loaded.tokenizer, prompts, every_turn, raw, engine.target.max_length, engine.target.vocab)
    warm_up(engine, arms, asked.ids(0), cfg, res)
    ceilings: dict[int, tuple[SelfRepetition, SelfRepetition | None]] = {}  # the same outputs every round
    try:
        for r in range(rounds):
            carried = {arm.label: Calibration() for arm in arms}  # each arm's estimates, from prompt to prompt
            for i, prompt in enumerate(asked.units):
                ids = asked.ids(i)
                runs = {}
                for arm in arms if r % 2 == 0 else arms[::-1]:
                    runs[arm.label] = run_arm(engine, arm, ids, cfg, res, prompt.label, carried[arm.label])
                    if on_progress:
                        on_progress(arm.label)
                runs = {arm.label: runs[arm.label] for arm in arms}
                reference = runs[arms[0].label].token_ids
                asked.answered(i, reference)
                check_runs(engine, ids, arms, runs, cfg)
                if i not in ceilings:
                    store = self_repetition(ids, reference, res.datastore) if res.datastore is not None else None
                    ceilings[i] = (self_repetition(ids, reference), store)
                records.append(BenchRecord(prompt, len(ids), runs, *ceilings[i], round=r))
    except KeyboardInterrupt:
        if records:  # the prompts every arm finished, each a paired comparison
            raise Stopped(records) from None
        raise
    return records
