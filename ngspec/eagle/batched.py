"""Running the EAGLE head for several rows of a batch in one forward.

An EAGLE drafter drafts a tree by running its head once per tree level (`EagleDrafter.drafting`
yields each run as a `HeadCall` and resumes with its output). Alone, each call is one head forward.
In a batch, every row's drafter waits at its next call and `propose_together` runs all waiting
calls of one head as ONE forward: the rows' tokens are concatenated into one sequence, so the
head's linear layers (fc, q/k/v/o, MLP) run once for all rows, and only attention is taken per row,
over that row's own head cache (`row_attention`). A step of B rows at depth D then costs D head
forwards instead of B x D, which is what made EAGLE at batch 8-32 spend most of its time drafting
on the GPU (BENCHMARKS.md, section 10b).

Every row keeps its own cache (a `GrowableLayer`): a call's new entries are appended to it, and
the call sees the entries its ``visible`` mask allows (the drafter drops a tree's entries again
when the tree is drafted).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generator, Sequence

import torch
from torch import nn
from transformers import AttentionInterface

from ngspec.contracts import DraftContext, DraftTree
from ngspec.eagle.vocab import TopCall, top_children
from ngspec.rows import attention_function
from ngspec.tree import additive_mask

ATTENTION_NAME = "ngspec_head_rows"


@dataclass
class HeadCall:
    """One row's request: the head over ``tokens`` paired with ``features`` ([m, H], already
    projected) at ``positions``, each seeing ``visible`` ([m, past + m]) of the row's ``cache``
    layer: its first ``past`` entries, then the call's own. Only the outputs of pairs ``keep_from``
    onward are computed and returned (every pair's keys and values reach the cache)."""

    head: torch.nn.Module
    embed: torch.nn.Module
    cache: object  # the row's head-cache layer (`GrowableLayer`)
    tokens: list[int]
    features: torch.Tensor
    positions: list[int]
    visible: torch.Tensor
    keep_from: int = 0

    @property
    def past(self) -> int:
        return self.visible.shape[1] - len(self.tokens)


# a drafter's tree, asked for as head runs (answered with their outputs) and top-k requests over
# its draft vocabulary (answered with token ids and log-probabilities)
Drafting = Generator["HeadCall | TopCall", object, DraftTree]


def row_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Attention of every row's queries over that row's cache: ``query [1, heads, M, d]`` holds the
    rows' tokens one after another (``kwargs['head_rows']`` says where each row's start), ``key``
    and ``value`` their new entries, which are appended to the rows' caches here."""
    outs = []
    start = 0
    for call in kwargs["head_rows"]:
        m = len(call.tokens)
        cache = call.cache
        assert (cache.keys.shape[-2] if cache.is_initialized else 0) == call.past, "a call must see its row's whole cache"
        keys, values = cache.update(key[:, :, start : start + m], value[:, :, start : start + m])
        mask = additive_mask(call.visible.to(query.device), query.dtype)[None, None]
        outs.append(torch.nn.functional.scaled_dot_product_attention(
            query[:, :, start : start + m], keys, values, attn_mask=mask, scale=scaling, enable_gqa=True,
        ))
        start += m
    return torch.cat(outs, dim=2).transpose(1, 2).contiguous(), None


AttentionInterface.register(ATTENTION_NAME, row_attention)


@torch.inference_mode()
def run_calls(calls: Sequence[HeadCall]) -> list[torch.Tensor]:
    """One head forward for calls of the same head (one per row); each call's output
    ``[m - keep_from, H]``."""
    head, embed = calls[0].head, calls[0].embed
    param = next(head.parameters())
    calls = [_cache_unread(c, param) for c in calls]
    embeds, features, positions = _pair_inputs(
        embed, [t for c in calls for t in c.tokens], torch.cat([c.features.to(param.device, param.dtype) for c in calls]),
        [p for c in calls for p in c.positions], param,
    )
    with attention_function(head, ATTENTION_NAME):
        out = head(embeds, features, positions, None, None, head_rows=calls)[0]
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
    call.cache.update(*call.head.keys_values(*_pair_inputs(call.embed, call.tokens[:k], call.features[:k], call.positions[:k], param)))
    return HeadCall(call.head, call.embed, call.cache, call.tokens[k:], call.features[k:], call.positions[k:], call.visible[k:])


def answer(calls: Sequence) -> list:
    """Calls of one kind and one head (or vocabulary), answered together."""
    return run_calls(calls) if isinstance(calls[0], HeadCall) else top_children(calls)


def _together(call) -> tuple:
    """Which calls can be answered together: head runs of one head, top-k requests over one
    shared vocabulary."""
    return (HeadCall, id(call.head)) if isinstance(call, HeadCall) else (TopCall, id(call.vocab.shared))


def drive(drafting: Drafting) -> DraftTree:
    """A drafter's tree, answering each of its calls alone."""
    try:
        call = next(drafting)
        while True:
            call = drafting.send(answer([call])[0])
    except StopIteration as done:
        return done.value


def propose_together(drafters: Sequence, contexts: Sequence[DraftContext]) -> list[DraftTree]:
    """Every row's tree; drafters that draft with a head (a ``drafting`` method) run their head
    calls together, one forward per head and round, and their top-k requests likewise, one
    product, softmax, top-k and copy to the host per vocabulary and round; the others `propose`
    as usual."""
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
        for rows in groups.values():
            for row, out in zip(rows, answer([calls[r] for r in rows])):
                advance(row, out)
    return [trees[row] for row in range(len(drafters))]
