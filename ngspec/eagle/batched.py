"""Running the EAGLE head for several rows of a batch in one forward.

An EAGLE drafter drafts a tree by running its head once per tree level (`EagleDrafter.drafting`
yields each run as a `HeadCall` and resumes with its output). Alone, each call is one head forward.
In a batch, every row's drafter waits at its next call and `propose_together` runs all waiting
calls of one head as ONE forward: the rows' tokens are concatenated into one sequence, so the
head's linear layers (fc, q/k/v/o, MLP) run once for all rows, and so does attention: every row's
head cache is a row of one buffer (`ngspec.eagle.pool`), so one attention call serves all rows.
A step of B rows at depth D then costs D head forwards instead of B x D, which is what made EAGLE
at batch 8-32 spend most of its time drafting on the GPU (BENCHMARKS.md, section 10b).

A call's new entries are appended to its row's cache, and each of its pairs sees the row's first
``seen`` entries plus the ones its ``block`` names (the drafter drops a tree's entries again when
the tree is drafted).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import partial
from typing import Generator, Sequence

import torch
from torch import nn

from ngspec.contracts import DraftContext, DraftTree
from ngspec.eagle.pool import PoolRow, pooled_attention
from ngspec.eagle.vocab import TopCall, top_children
from ngspec.rows import attention_function

ATTENTION_NAME = "ngspec_head_rows"


@dataclass
class HeadCall:
    """One row's request: the head over ``tokens`` paired with ``features`` ([m, H], already
    projected) at ``positions``, their entries appended to the row's ``cache``. Every pair sees
    the cache's first ``seen`` entries; beyond those, pair i sees the entries ``seen + j`` for j in
    ``block[i]`` (its own included), or, with no ``block``, the call's own pairs up to itself
    (then ``seen`` is the whole cache). Only the outputs of pairs ``keep_from`` onward are
    computed and returned (every pair's keys and values reach the cache)."""

    head: torch.nn.Module
    embed: torch.nn.Module
    cache: PoolRow
    tokens: list[int]
    features: torch.Tensor
    positions: list[int]
    seen: int
    block: list[list[int]] | None = None
    keep_from: int = 0

    def visible(self) -> list[list[int]]:
        """``block``, or the causal one."""
        return self.block if self.block is not None else [list(range(i + 1)) for i in range(len(self.tokens))]


class HostWork:
    """What a drafter yields before host work that needs no head output (a row whose head's gate
    stayed shut assembling its tree from the search alone): `propose_together` resumes it (with
    None) once every row's head forward of the round is launched and before the first top-k
    request, which waits for them, so that on a GPU the work runs while the device computes."""


HOST_WORK = HostWork()

# a drafter's tree, asked for as head runs (answered with their outputs), top-k requests over
# its draft vocabulary (answered with token ids and log-probabilities) and `HOST_WORK` (None)
Drafting = Generator["HeadCall | TopCall | HostWork", object, DraftTree]


def head_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, calls: Sequence[HeadCall] = (), **kwargs):
    """Attention of every call's pairs over its row's cache (`pooled_attention`): ``calls``,
    bound in for the forward, whose pairs ``query [1, heads, M, d]`` holds one call after
    another."""
    assert all(c.block is not None or c.seen == c.cache.length for c in calls), "a causal call sees its row's whole cache"
    return pooled_attention([c.cache for c in calls], [c.seen for c in calls], [c.visible() for c in calls], query, key, value, scaling), None


@torch.inference_mode()
def run_calls(calls: Sequence[HeadCall]) -> list[torch.Tensor]:
    """One head forward for calls of the same head and pool (one per row); each call's output
    ``[m - keep_from, H]``."""
    head, embed = calls[0].head, calls[0].embed
    param = next(head.parameters())
    calls = [_cache_unread(c, param) for c in calls]
    embeds, features, positions = _pair_inputs(
        embed, [t for c in calls for t in c.tokens], torch.cat([c.features for c in calls]),
        [p for c in calls for p in c.positions], param,
    )
    with attention_function(head, ATTENTION_NAME, partial(head_attention, calls=calls)):
        out = head(embeds, features, positions, None, None)[0]
    return list(out.split([len(c.tokens) for c in calls]))


def _pair_inputs(embed: nn.Module, tokens: Sequence[int], features: torch.Tensor, positions: Sequence[int], param: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Pairs as the head takes them, ``[1, T, ...]`` on its device and in its dtype: the tokens
    embedded, their features and their positions."""
    dev = param.device
    embeds = embed(torch.tensor([list(tokens)], device=dev)).to(param.dtype)
    return embeds, features.to(dev, param.dtype)[None], torch.tensor([list(positions)], device=dev)


def _cache_unread(call: HeadCall, param: torch.Tensor) -> HeadCall:
    """The call's pairs before ``keep_from`` go straight to its cache as keys and values (all a
    one-layer head needs from a pair whose prediction nobody reads: no queries, attention or MLP;
    the head's prefill of a 4,000-token prompt takes 24 ms instead of 374); the rest of the call,
    which sees them as its past, is returned."""
    k = call.keep_from
    if k == 0:
        return call
    call.cache.append(*call.head.keys_values(*_pair_inputs(call.embed, call.tokens[:k], call.features[:k], call.positions[:k], param)))
    rest = replace(call, tokens=call.tokens[k:], features=call.features[k:], positions=call.positions[k:], keep_from=0)
    if call.block is None:  # causal: the pairs now cached are part of what every later pair sees
        return replace(rest, seen=call.seen + k)
    return replace(rest, block=call.block[k:])


def answer(calls: Sequence) -> list:
    """Calls of one kind and one head (or vocabulary), answered together (head runs at fixed
    shapes where their pool says so: `ngspec.eagle.graphs`)."""
    if isinstance(calls[0], HostWork):
        return [None] * len(calls)
    if not isinstance(calls[0], HeadCall):
        return top_children(calls)
    static = calls[0].cache.pool.static_runs
    return run_calls(calls) if static is None else static.run(calls)


def _together(call) -> tuple:
    """Which calls can be answered together, and in which order a round answers them (the
    tuple's first item): head runs into one pool (of one head), then host work, then top-k
    requests over one shared vocabulary."""
    if isinstance(call, HeadCall):
        return (0, id(call.cache.pool))
    return (1, 0) if isinstance(call, HostWork) else (2, id(call.vocab.shared))


@torch.inference_mode()
def drive(drafting: Drafting) -> DraftTree:
    """A drafter's tree, answering each of its calls alone. Drafting runs in inference mode here
    and in `propose_together`, the generators' only drivers: the generators themselves are not
    wrapped, since torch re-enters a wrapped generator's mode at every resumption (about 20 a
    batch-8 step; a twentieth of the drafting phase's profile, BENCHMARKS.md 10zh)."""
    try:
        call = next(drafting)
        while True:
            call = drafting.send(answer([call])[0])
    except StopIteration as done:
        return done.value


@torch.inference_mode()
def propose_together(drafters: Sequence, contexts: Sequence[DraftContext]) -> list[DraftTree]:
    """Every row's tree; drafters that draft with a head (a ``drafting`` method) run their head
    calls together, one forward per head and round, and their top-k requests likewise, one
    product, softmax, top-k and copy to the host per vocabulary and round; the others `propose`
    as usual. In a round the head forwards are launched first, then the rows' `HOST_WORK` runs,
    then the top-k requests copy the heads' answers to the host (on a GPU, the host work of rows
    that skipped their head overlaps the others' forwards)."""
    trees: dict[int, DraftTree] = {}
    running: dict[int, Drafting] = {}
    waiting: dict[int, HeadCall] = {}

    def advance(row: int, out: torch.Tensor | None) -> None:
        try:
            waiting[row] = next(running[row]) if out is None else running[row].send(out)
        except StopIteration as done:
            trees[row] = done.value
            del running[row]

    for row, (drafter, ctx) in enumerate(zip(drafters, contexts)):
        if hasattr(drafter, "drafting"):
            running[row] = drafter.drafting(ctx)
            advance(row, None)
        else:
            trees[row] = drafter.propose(ctx)
    while waiting:
        groups: dict[tuple, list[int]] = {}
        for row, call in waiting.items():
            groups.setdefault(_together(call), []).append(row)
        calls, waiting = waiting, {}
        for _, rows in sorted(groups.items(), key=lambda group: group[0][0]):  # stable: rows' order kept
            for row, out in zip(rows, answer([calls[r] for r in rows])):
                advance(row, out)
    return [trees[row] for row in range(len(drafters))]
