"""Runs every arm on every prompt in one process, interleaved, and records what each did.

Arms: ``hf-greedy`` and ``hf-prompt-lookup`` (transformers' `generate`, the ecosystem baseline),
``vanilla`` (our engine with no drafts) and the chosen drafters. For each prompt the arms run back
to back, so slow drift of the machine affects all arms alike.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from ngspec.decode import DecodeConfig
from ngspec.drafters import DrafterOptions, make_drafter
from ngspec.engine import Engine
from ngspec.metrics.self_repetition import SelfRepetition, self_repetition
from ngspec.prompts import Prompt, encode

HF_ARMS = ("hf-greedy", "hf-prompt-lookup")


@dataclass
class ArmRun:
    """One arm on one prompt."""

    prompt_id: str
    token_ids: list[int]
    seconds: float
    verify_calls: int | None = None  # unknown for transformers' prompt lookup
    accepted: list[int] = field(default_factory=list)  # tokens emitted by each call
    draft_seconds: float = 0.0


@dataclass
class BenchRecord:
    prompt: Prompt
    prompt_tokens: int
    runs: dict[str, ArmRun]
    self_repetition: SelfRepetition  # of the hf-greedy output given the prompt


def run_arm(engine: Engine, arm: str, ids: list[int], cfg: DecodeConfig, opts: DrafterOptions, pid: str) -> ArmRun:
    if arm in HF_ARMS:
        tokens, seconds = engine.hf_generate(ids, cfg.max_new_tokens, lookup=arm == "hf-prompt-lookup")
        calls = len(tokens) if arm == "hf-greedy" else None
        return ArmRun(pid, tokens, seconds, calls, [1] * len(tokens) if calls else [])
    gen = engine.run(ids, make_drafter(arm, opts), cfg)
    steps = gen.stats.steps
    return ArmRun(pid, gen.token_ids, gen.seconds, len(steps), [s.accepted for s in steps], gen.stats.draft_seconds)


def run_bench(
    engine: Engine,
    prompts: list[Prompt],
    arms: list[str],
    cfg: DecodeConfig,
    opts: DrafterOptions,
    raw: bool = False,
    on_progress: Callable[[str], None] | None = None,
) -> list[BenchRecord]:
    """Run ``arms`` (hf-greedy first, as the reference) on every prompt."""
    records = []
    for prompt in prompts:
        ids = encode(engine.loaded.tokenizer, prompt.text, raw)
        runs = {}
        for arm in arms:
            runs[arm] = run_arm(engine, arm, ids, cfg, opts, prompt.id)
            if on_progress:
                on_progress(arm)
        reference = runs["hf-greedy"].token_ids
        records.append(BenchRecord(prompt, len(ids), runs, self_repetition(ids, reference)))
    return records
