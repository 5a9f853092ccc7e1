"""What an EAGLE head's predicted features are scored over, and scoring several rows at once.

An EAGLE-1 head predicts a feature and the target's LM head turns it into next-token
log-probabilities. Over the whole vocabulary (49,152 rows for the default model) that product is
most of a drafting step on a CPU, so drafters score over a draft vocabulary: the head's most
frequent tokens, the same for every row (`SharedVocab`), plus the tokens of the row's own prompt
that are not among them (`RowVocab.extra`). An EAGLE-3 head brings its own LM head over its own
reduced vocabulary, and a head without a draft vocabulary scores over the whole one: both shared
by every row, with no extras. On a CPU the shared columns' product may run in int8
(`ngspec.eagle.int8`); a row's extra columns then keep a float32 product of their own.

`top_children` answers one or several rows' requests (`TopCall`). A row alone gets one product
over its own rows of the LM head (shared and extra, gathered on its first request). Several rows
get one product over the shared columns for all of them, one over the union of their extra
tokens, then one log-softmax, one top-k and one copy to the host for all of them: in a batch
that replaces one of each per row and tree level (on a CPU batch-8 drafting took 25% less time;
on a GPU the change was within noise, BENCHMARKS.md section 10c). Each row's log-probabilities come out as if it were scored
alone: its logits sit in the same columns (shared, then its own extras), and the columns only
other rows need are -inf (up to float rounding: CPU BLAS rounds a product over more rows or
columns differently; drafts are only proposals, so this never changes an output).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from ngspec.eagle import int8


@dataclass
class SharedVocab:
    """The columns every row of one head scores: ``logits`` of features over them, the token id of
    each (``ids``; None: the column is the token id), and for a draft vocabulary the LM-head weight
    that rows' extra tokens are read from (``lm_weight``; None: rows have no extras), and where
    the shared columns run in float32, their rows of it (``weight``) and the product (``x @
    weight.T``) they are run with."""

    logits: Callable[[torch.Tensor], torch.Tensor]
    ids: torch.Tensor | None
    lm_weight: torch.Tensor | None = None
    weight: torch.Tensor | None = None
    product: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None
    # the shared columns' product runs in int8 (`ngspec.eagle.int8`); a row alone then scores its
    # extra columns in a float32 product of their own (one over the shared and extra rows gathered
    # per prompt would quantize them again for every prompt: 26 ms for the default model's draft
    # vocabulary)
    shared_int8: bool = False
    # the layout of the extra columns of the rows that last asked together (`_Layout`), reused
    # while the rows asking are among them
    batch_layout: "_Layout | None" = field(default=None, repr=False)
    known: frozenset[int] = field(default=frozenset(), repr=False)  # the shared columns' token ids

    def __post_init__(self) -> None:
        if self.lm_weight is not None:
            self.known = frozenset(self.ids.tolist())

    @staticmethod
    def build(
        head, lm_head: torch.nn.Module, vocab: Sequence[int] | None, product: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], shared_int8: bool = False,
    ) -> "SharedVocab":
        """An EAGLE-3 head's own vocabulary; else ``vocab`` (the draft vocabulary's tokens) read
        from the target's LM head with ``product`` (``x @ weight.T``), or with ``shared_int8``
        its rows in int8 once (`ngspec.eagle.int8`; a row's extra columns keep a float32 product); else
        the whole vocabulary."""
        if head.own_lm_head:
            return SharedVocab(head.draft_logits, head.draft_to_target())
        if not vocab:
            return SharedVocab(lm_head, None)
        ids = torch.tensor(sorted(set(int(t) for t in vocab)), device=lm_head.weight.device)
        weight = lm_head.weight.index_select(0, ids)
        if shared_int8:  # the float32 rows are not kept: nothing reads them once packed
            packed = int8.prepack(weight)
            return SharedVocab(lambda x: int8.product(x, packed), ids, lm_head.weight, shared_int8=True)
        return SharedVocab(lambda x: product(x, weight), ids, lm_head.weight, weight, product)

    def for_prompt(self, prompt: Sequence[int]) -> "RowVocab":
        """A row's vocabulary: the shared columns and the prompt's tokens outside them."""
        if self.lm_weight is None:
            return RowVocab(self, torch.zeros(0, dtype=torch.long))
        extra = sorted(set(int(t) for t in prompt) - self.known)
        return RowVocab(self, torch.tensor(extra, dtype=torch.long, device=self.lm_weight.device))

    @property
    def size(self) -> int:
        return len(self.ids) if self.ids is not None else self.logits.weight.shape[0]


@dataclass
class RowVocab:
    shared: SharedVocab
    extra: torch.Tensor  # token ids of the row's extra columns, after the shared ones
    _own: tuple[torch.Tensor, torch.Tensor] | None = field(default=None, repr=False)
    extra_ids: tuple[int, ...] = field(init=False, repr=False)  # ``extra`` on the host, read once

    def __post_init__(self) -> None:
        self.extra_ids = tuple(self.extra.tolist())

    @property
    def size(self) -> int:
        return self.shared.size + len(self.extra)

    def alone(self, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits over the row's columns in one product, and their token ids (a row with extras,
        scored alone: its LM-head rows are gathered on the first call)."""
        shared = self.shared
        if self._own is None:
            extra_rows = shared.lm_weight.index_select(0, self.extra)
            self._own = extra_rows if shared.shared_int8 else torch.cat([shared.weight, extra_rows]), torch.cat([shared.ids, self.extra])
        weight, ids = self._own
        if shared.shared_int8:
            return torch.cat([shared.logits(features), _extra_product(features, weight)], dim=-1), ids
        return shared.product(features, weight), ids


@dataclass
class TopCall:
    """One row's request: the ``k`` most likely next tokens after each of ``features`` (the
    head's predicted features, m rows of [H]: a list of them, or an [m, H] tensor), over
    ``vocab``. A list lets `top_children` stack every call's rows in one operation instead of
    one per row and call (a batch's host work, BENCHMARKS.md 10w)."""

    vocab: RowVocab
    features: Sequence[torch.Tensor]
    k: int


# per feature row: the k best token ids and their log-probabilities, best first
Top = tuple[list[list[int]], list[list[float]]]


@torch.inference_mode()
def top_children(calls: Sequence[TopCall]) -> list[Top]:
    """Every call's answer; the calls share one `SharedVocab`."""
    shared = calls[0].vocab.shared
    sizes = [len(c.features) for c in calls]
    features = torch.stack([f for c in calls for f in c.features])
    if len(calls) == 1 and len(calls[0].vocab.extra):
        logits, ids = calls[0].vocab.alone(features)
    else:
        logits = shared.logits(features)
        ids = shared.ids if shared.ids is not None else torch.arange(logits.shape[-1], device=logits.device)
        if any(len(c.vocab.extra) for c in calls):
            logits, ids = _with_extras(logits, features, calls, sizes)
    logp = torch.log_softmax(logits.float(), dim=-1)
    top = torch.topk(logp, min(max(c.k for c in calls), logp.shape[-1]), dim=-1)
    chosen = ids.gather(1, top.indices) if ids.dim() == 2 else ids[top.indices]
    token_ids, values = chosen.tolist(), top.values.tolist()
    out, start = [], 0
    for call, m in zip(calls, sizes):
        k = min(call.k, call.vocab.size)  # a row never gets a column it does not have
        out.append(([t[:k] for t in token_ids[start : start + m]], [v[:k] for v in values[start : start + m]]))
        start += m
    return out


def _with_extras(logits: torch.Tensor, features: torch.Tensor, calls: Sequence[TopCall], sizes: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits [M, shared + widest extras]: each feature row's shared columns, then its own row's
    extras, then -inf; and the token id of each of those columns, per feature row."""
    shared = calls[0].vocab.shared
    layout = shared.batch_layout
    if layout is None or any(id(c.vocab) not in layout.row_of for c in calls):
        shared.batch_layout = layout = _Layout.build(shared, [c.vocab for c in calls], logits.shape[-1])
    rows = [layout.row_of[id(c.vocab)] for c, m in zip(calls, sizes) for _ in range(m)]
    combined = torch.cat([logits, _extra_product(features, layout.union_weight), logits.new_full((len(features), 1), float("-inf"))], dim=-1)
    per_row = layout.columns[torch.tensor(rows, device=layout.columns.device)]
    return combined.gather(1, per_row), layout.column_ids[per_row]


def _extra_product(features: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Logits over a few hundred extra columns gathered on the fly: the ordinary product, not the
    target's kernel plan. oneDNN builds a primitive for every new pair of shapes, 0.5-1 ms on the
    team's AMD EPYC, and these weights change with the rows' prompts; the ordinary product takes
    0.04-0.25 ms (BENCHMARKS.md 10q)."""
    return features @ weight.T


@dataclass(frozen=True)
class _Layout:
    """Where the extra columns of rows with these vocabularies sit: the LM-head rows of the union of
    their extra tokens (``union_weight``); for each row (``row_of``, by the vocabulary's id), which
    column of [shared | union | -inf] each of its own columns is (``columns``); the token id of every
    column of [shared | union | -inf] (``column_ids``, -1 for -inf). Any of these rows, in any
    order, is answered from it: it is built for the rows asking when one of them is not in the
    cached one (a prompt was admitted, or a row that did not ask then asks now), and every later
    level whose rows are among them reuses it (at deeper levels fewer rows ask). ``vocabs`` keeps
    them alive, so no id is reused while it is cached."""

    vocabs: tuple[RowVocab, ...]
    row_of: dict[int, int]
    union_weight: torch.Tensor
    columns: torch.Tensor
    column_ids: torch.Tensor

    @staticmethod
    def build(shared: SharedVocab, vocabs: Sequence[RowVocab], n: int) -> "_Layout":
        extras = [v.extra_ids for v in vocabs]
        union = sorted(set().union(*extras))
        where = {t: n + i for i, t in enumerate(union)}
        pad, width = n + len(union), max(map(len, extras))  # pad: the -inf column
        own = torch.tensor([[where[t] for t in extra] + [pad] * (width - len(extra)) for extra in extras], dtype=torch.long)
        columns = torch.cat([torch.arange(n).expand(len(vocabs), n), own.reshape(len(vocabs), width)], dim=1)
        device = shared.ids.device
        union_ids = torch.tensor(union, dtype=torch.long, device=device)
        column_ids = torch.cat([shared.ids, union_ids, shared.ids.new_full((1,), -1)])
        return _Layout(tuple(vocabs), {id(v): r for r, v in enumerate(vocabs)}, shared.lm_weight.index_select(0, union_ids), columns.to(device), column_ids)
