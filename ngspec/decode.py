"""The decode loop: propose -> verify -> accept -> commit -> observe, until a stop.

Read it top to bottom in `generate`. Everything model-specific lives in `TargetModel`, everything
draft-specific in the drafter, acceptance rules in `ngspec.verify`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from ngspec.architecture import rope_depth
from ngspec.contracts import DraftContext, Drafter, RunStats, StepStats, table_cost
from ngspec.errors import NgspecError, check_text
from ngspec.perf.measured import CpuWatch
from ngspec.perf.online import StepTimes
from ngspec.static_verify import cold_runs
from ngspec.target import TargetModel
from ngspec.verify import Draws, SamplingConfig, accept_greedy, accept_sampled, target_probs


@dataclass(frozen=True)
class DecodeConfig:
    max_new_tokens: int = 256
    max_draft_nodes: int = 64  # the largest tree the engine will verify in one call
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    eos_ids: frozenset[int] = frozenset()
    stop_strings: tuple[str, ...] = ()
    verify: str = "tree"  # "tree": one row under a tree mask; "rows": one batch row per leaf
    learn_costs: bool = True  # rescale the cost table by the run's own step times (`StepTimes`)

    def __post_init__(self) -> None:
        if self.verify not in ("tree", "rows"):
            raise NgspecError(f"--verify must be tree or rows (got {self.verify!r})")
        if self.max_new_tokens <= 0:
            raise NgspecError("--max-new-tokens must be at least 1")
        if self.max_draft_nodes < 0:
            raise NgspecError("the draft-node cap must be >= 0")
        bad = [s for s in self.stop_strings if not isinstance(s, str) or not s]
        if bad:
            raise NgspecError(f"--stop takes non-empty strings (got {bad[0]!r})")
        for stop in self.stop_strings:
            check_text(stop, f"the stop string {stop!r}")


@dataclass
class Generation:
    token_ids: list[int]
    seconds: float
    finish_reason: str  # eos | stop | length | context (| cancelled: a batch row whose request was cancelled)
    stats: RunStats
    drafter_stats: dict | None = None
    seed: int | None = None  # sampling's seed, drawn for the run when none was given (None: greedy)
    # other processes' share of all CPUs' time during the run (`CpuWatch`; None where it cannot tell):
    # beside other work a step slows many times over, unevenly (BENCHMARKS.md 10zzzh)
    others_cpu_share: float | None = None


class Stopper:
    """Finds the first EOS token, stop token or completed stop string inside a run of new tokens."""

    def __init__(
        self,
        eos_ids: frozenset[int],
        stop_strings: Sequence[str] = (),
        detokenize: Callable[[list[int]], str] | None = None,
        stop_ids: frozenset[int] = frozenset(),
    ) -> None:
        if stop_strings and detokenize is None:
            raise ValueError("stop strings need a detokenizer")
        self.eos_ids = eos_ids
        self.stop_ids = stop_ids  # tokens that end generation as a stop string does
        self.stop_strings = tuple(stop_strings)
        self.detokenize = detokenize
        # tokens enough to hold any stop string: a token adds at least one byte of text
        self._window = max((len(s.encode()) for s in stop_strings), default=0) + 8

    def cut(self, previous: list[int], new: Sequence[int]) -> tuple[list[int], str | None]:
        """Return the part of ``new`` to keep and why generation stops there (or None)."""
        kept: list[int] = []
        for tok in new:
            kept.append(tok)
            if tok in self.eos_ids:
                return kept, "eos"
            if tok in self.stop_ids:
                return kept, "stop"
            if self.stop_strings and self._ends_in_stop(previous + kept):
                return kept, "stop"
        return kept, None

    def _ends_in_stop(self, tokens: list[int]) -> bool:
        assert self.detokenize is not None
        window = tokens[-self._window :]
        tail, before = self.detokenize(window), self.detokenize(window[:-1])
        # only a stop string the newest token completes counts: the window's text without that
        # token does not hold it (a token's text alone can differ from what it adds in context:
        # SentencePiece drops a leading space, so "mat " completed by "▁on" went unseen)
        return any(s in tail and s not in before for s in self.stop_strings)


def special_stop_ids(tokenizer, stop_strings: Sequence[str], detokenize: Callable[[list[int]], str]) -> frozenset[int]:
    """The special tokens a stop string names ("<|im_end|>", "<|eot_id|>"): the text leaves them
    out, so the string could never be found there; such a token stops generation itself."""
    wanted = set(stop_strings)
    added = getattr(tokenizer, "added_tokens_decoder", None) or {}
    return frozenset(i for i, token in added.items() if token.content in wanted and detokenize([i]) == "")


def _first_token(logits: torch.Tensor, cfg: SamplingConfig, draws: Draws | None) -> int:
    """The token after the prompt (output position 0)."""
    if draws is None:
        return int(logits.argmax())
    return draws.token(target_probs(logits, cfg), 0)


def check_prompt(prompt: Sequence[int], max_length: int, vocab: int | None = None) -> None:
    """Refuse a prompt the model cannot run: empty, filling its context window, or (with ``vocab``,
    the rows of its input embedding) holding a token id it has no embedding for."""
    if len(prompt) == 0:
        raise NgspecError("the prompt is empty")
    if len(prompt) >= max_length:
        raise NgspecError(f"the prompt has {len(prompt)} tokens but the model's context window is {max_length}")
    if vocab is not None and not 0 <= min(prompt) <= max(prompt) < vocab:
        bad = next(t for t in prompt if not 0 <= t < vocab)
        raise NgspecError(f"the prompt holds token id {bad}, outside the model's vocabulary (0..{vocab - 1}): was it encoded with another model's tokenizer?")


def most_new_tokens(prompt_length: int, max_length: int) -> int:
    """How many tokens decoding can emit after a prompt before `out_of_room` stops it at the
    context window: one per free position, and the last from the logits of the last position."""
    return max_length - prompt_length + 1


def out_of_room(emitted: int, committed: int, max_new_tokens: int, max_length: int) -> str | None:
    """Why a sequence must stop before the next step: its token budget or the context window."""
    if emitted >= max_new_tokens:
        return "length"
    if max_length - committed - 1 < 0:  # not even the root fits
        return "context"
    return None


def generate(
    target: TargetModel,
    drafter: Drafter,
    prompt: Sequence[int],
    cfg: DecodeConfig,
    stopper: Stopper | None = None,
    on_tokens: Callable[[list[int]], None] | None = None,
) -> Generation:
    """Generate from ``prompt``; the output equals plain decoding of the target (greedy: token for
    token; sampling: in distribution, and token for token with plain sampling at the same seed)."""
    prompt = list(prompt)
    check_prompt(prompt, target.max_length, target.vocab)
    stopper = stopper or Stopper(cfg.eos_ids)
    draws = Draws.of(cfg.sampling, prompt)
    stats = RunStats()

    start, watch = time.perf_counter(), CpuWatch()
    target.keep_features = bool(getattr(drafter, "needs_features", False))
    target.feature_layers = getattr(drafter, "feature_layers", None)  # EAGLE-3 reads three layers
    root = _first_token(target.prefill(prompt), cfg.sampling, draws)
    stats.prefill_seconds = time.perf_counter() - start
    out, reason = stopper.cut([], [root])
    stats.steps.append(StepStats(tree_size=0, accepted=len(out), draft_seconds=0.0, verify_cost=0.0))  # the prefill
    drafter.start(prompt)
    drafter.observe(out)
    emit(on_tokens, out)
    times = StepTimes()  # what this run's verify calls take

    while reason is None:
        reason = out_of_room(len(out), target.length, cfg.max_new_tokens, target.max_length)
        if reason is not None:
            break
        budget = cfg.max_new_tokens - len(out)  # tokens we may still emit
        window = target.max_length - target.length - 1  # tree nodes that fit after the root
        t0 = time.perf_counter()
        features = target.take_features() if target.keep_features else None
        table = target.verify_cost()
        costs = times.corrected(table) if cfg.learn_costs else table
        ctx = DraftContext(prompt + out, len(prompt), min(cfg.max_draft_nodes, window), costs, features, step_seconds=times.plain_seconds)
        depth = rope_depth(target.length, target.rope_switch, budget - 1)
        tree = drafter.propose(ctx).truncated(ctx.max_nodes, max_depth=depth)
        t1 = time.perf_counter()
        draft_s = t1 - t0

        cold = cold_runs(target)
        logits = target.verify(out[-1], tree, cfg.verify)
        if draws is None:
            verdict = accept_greedy(tree, logits)
        else:
            verdict = accept_sampled(tree, logits, cfg.sampling, draws, len(out))
        target.commit(verdict.path)
        step_cost = table_cost(table, tree.size)  # by the measured table: no timing noise
        if cold_runs(target) == cold:  # a verification at a new fixed shape is not what a step costs
            times.record(step_cost, time.perf_counter() - t1)  # the verdict read waited for the device

        new, reason = stopper.cut(out, verdict.tokens)
        stats.steps.append(StepStats(tree.size, len(new), draft_s, step_cost))
        out.extend(new)
        drafter.observe(new)
        emit(on_tokens, new)

    seconds = time.perf_counter() - start
    drafter_stats = drafter.stats() if hasattr(drafter, "stats") else None  # e.g. rows per strategy
    return Generation(out, seconds, reason, stats, drafter_stats, None if draws is None else draws.seed, watch.share())


def emit(on_tokens: Callable[[list[int]], None] | None, tokens: list[int]) -> None:
    if on_tokens is not None and tokens:
        on_tokens(tokens)
