"""The only types the engine and the drafters share.

A drafter proposes a `DraftTree` given a `DraftContext`; the engine verifies it and reports a
`Verdict` back through `Drafter.observe`. Neither side sees the other's internals: drafters never
touch the KV cache, and the verifier never knows which drafter produced a tree.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence, runtime_checkable


@dataclass(frozen=True)
class DraftTree:
    """Draft tokens hung below the root (the last emitted token, not yet in the KV cache).

    Node ``i`` holds ``tokens[i]``; ``parents[i]`` is the index of its parent node, or -1 when its
    parent is the root. Parents always come before their children, so a chain is
    ``parents = (-1, 0, 1, ...)`` and k independent rows are k chains starting at -1.

    ``gains`` (optional, empty or one per node) is the drafter's estimate of each node's chance of
    being accepted, for trees offered best first (`DraftContext.engine_sizes`): every prefix of
    the nodes is then a tree, and keeping the first n is expected to yield ``sum(gains[:n])``
    drafted tokens. It does not take part in comparisons.
    """

    tokens: tuple[int, ...] = ()
    parents: tuple[int, ...] = ()
    gains: tuple[float, ...] = field(default=(), compare=False)

    def __post_init__(self) -> None:
        if len(self.tokens) != len(self.parents):
            raise ValueError("tokens and parents must have the same length")
        if self.gains and len(self.gains) != len(self.tokens):
            raise ValueError("gains must be empty or one per node")
        for i, p in enumerate(self.parents):
            if not -1 <= p < i:
                raise ValueError(f"node {i} has parent {p}; parents must precede their children")
        for t in self.tokens:
            if t < 0:
                raise ValueError("draft tokens must be non-negative ids")

    @property
    def size(self) -> int:
        return len(self.tokens)

    @classmethod
    def chain(cls, tokens: Sequence[int], gains: Sequence[float] = ()) -> "DraftTree":
        return cls(tuple(int(t) for t in tokens), tuple(range(-1, len(tokens) - 1)), tuple(gains))

    @classmethod
    def from_paths(cls, paths: Sequence[Sequence[int]]) -> "DraftTree":
        """Merge token paths (each starting below the root) into one prefix tree."""
        tokens: list[int] = []
        parents: list[int] = []
        index: dict[tuple[int, int], int] = {}
        for path in paths:
            parent = -1
            for tok in path:
                key = (parent, int(tok))
                if key not in index:
                    index[key] = len(tokens)
                    tokens.append(int(tok))
                    parents.append(parent)
                parent = index[key]
        return cls(tuple(tokens), tuple(parents))

    def truncated(self, max_nodes: int, max_depth: int) -> "DraftTree":
        """Keep the first ``max_nodes`` nodes no deeper than ``max_depth`` (stays prefix-closed)."""
        n = max(0, min(max_nodes, self.size))
        if max_depth >= n:  # parents come first: the first n nodes are a tree at most n deep
            return self if n == self.size else DraftTree(self.tokens[:n], self.parents[:n], self.gains[:n])
        keep: dict[int, int] = {}
        depth: dict[int, int] = {-1: 0}
        tokens: list[int] = []
        parents: list[int] = []
        gains: list[float] = []
        for i, (tok, par) in enumerate(zip(self.tokens, self.parents)):
            if len(tokens) >= max_nodes:
                break
            if par != -1 and par not in keep:
                continue
            d = depth[par] + 1
            if d > max_depth:
                continue
            depth[i] = d
            keep[i] = len(tokens)
            tokens.append(tok)
            parents.append(keep[par] if par >= 0 else -1)
            if self.gains:
                gains.append(self.gains[i])
        if len(tokens) == self.size:
            return self
        return DraftTree(tuple(tokens), tuple(parents), tuple(gains))


@dataclass(frozen=True)
class Verdict:
    """What verification decided for one tree.

    ``path`` lists the accepted tree nodes root-to-leaf; ``tokens`` are their tokens followed by the
    bonus token (the target's own choice after the last accepted node), so it is never empty.
    """

    path: tuple[int, ...]
    tokens: tuple[int, ...]


@dataclass
class DraftContext:
    """What the loop hands a drafter each step: all tokens so far (prompt, then generated ones,
    ending with the root token), the largest tree the engine will verify, and the measured cost of
    verifying a tree of each size relative to a plain one-token step (empty when unknown)."""

    tokens: list[int]
    prompt_len: int
    max_nodes: int
    verify_cost: tuple[float, ...] = ()
    # for drafters that declare ``needs_features = True`` (EAGLE): the target's last hidden states
    # of the positions committed since the previous call, ``[m, hidden]``; they are positions
    # ``len(tokens) - 1 - m .. len(tokens) - 2`` (the root, ``tokens[-1]``, is not committed yet)
    features: Any = None
    # set by batched decoding, where one forward verifies every row's tree padded to the widest
    # one: drafters that size trees by cost offer instead up to ``max_nodes`` nodes best first
    # with their ``DraftTree.gains``, and the engine picks one width for all rows (`joint_width`;
    # packed rows, ``--batch-layout packed``: each row's own size, `packed_sizes`) and tells each
    # drafter how many of its nodes it kept (``Drafter.keep``, optional)
    engine_sizes: bool = False
    # seconds of a plain one-token verify step in this run so far, as the loop's fit of its calls'
    # times finds it (`ngspec.perf.online.StepTimes`; 0 before the first call, and in batches,
    # where a row's drafting cannot be timed apart from the others'): what a drafter that times
    # its own work compares it with
    step_seconds: float = 0.0

    def cost(self, size: int) -> float:
        """Relative cost of verifying ``size`` nodes (1.0 everywhere when nothing was measured)."""
        return table_cost(self.verify_cost, size)


def table_cost(table: Sequence[float], size: float) -> float:
    """A cost table's entry for ``size`` nodes (its last entry beyond it; 1.0 for no table). A
    fractional ``size`` reads linearly between two entries: a packed batch's mean nodes per row
    (`ngspec.tree.packed_sizes`), whose forward costs by its total tokens as a padded one does."""
    if not table:
        return 1.0
    last = len(table) - 1
    if size >= last:
        return table[last]
    low = int(size)
    if low == size:
        return table[low]
    return table[low] + (size - low) * (table[low + 1] - table[low])


@runtime_checkable
class Drafter(Protocol):
    """One drafting method. Implementations live in ``ngspec.drafters``, one per file."""

    name: str

    def start(self, prompt: Sequence[int]) -> None:
        """Reset per-sequence state for a new prompt."""

    def propose(self, ctx: DraftContext) -> DraftTree:
        """Return the draft tree to verify below the root token ``ctx.tokens[-1]``."""

    def observe(self, new_tokens: Sequence[int]) -> None:
        """Tokens just emitted (accepted drafts plus the bonus token)."""

    # Optional, for drafters that offer trees best first (``DraftContext.engine_sizes``):
    # ``keep(n)`` says the engine verifies only the first ``n`` nodes of the last proposal.


@dataclass
class StepStats:
    """Per-step accounting kept by the loop."""

    tree_size: int
    accepted: int  # tokens emitted by this verification call, the bonus token included
    draft_seconds: float
    verify_cost: float = 1.0  # this call's cost in plain steps by the measured table (1.0 without one; 0 for the prefill)


@dataclass
class RunStats:
    """Totals for one generated sequence. The prefill is the first step: it emits the first token,
    so tokens per call is ``len(tokens) / verify_calls`` for every arm, plain decoding giving 1.0."""

    steps: list[StepStats] = field(default_factory=list)
    # the prompt's forward (in a batch, the row's admission): no drafter shortens it, so where it
    # is much of a run (long RAG prompts on a CPU) it caps what any drafter can gain
    prefill_seconds: float = 0.0

    @property
    def verify_calls(self) -> int:
        return len(self.steps)

    @property
    def draft_seconds(self) -> float:
        return sum(s.draft_seconds for s in self.steps)

    @property
    def cost_units(self) -> float:
        """The verification calls' summed cost in plain steps by the measured cost table (the
        prefill left out): per token, what the table predicts, free of timing noise."""
        return sum(s.verify_cost for s in self.steps)
