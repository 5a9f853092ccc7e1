"""Acceptance rules: which drafted nodes the target agrees with, and the bonus token.

Knows nothing about where drafts come from. Greedy acceptance follows the target's argmax down the
tree. Sampling follows the target's *sample* down the tree the same way: the token at output
position t is the one whose probability over its own random number is largest (the exponential
race, argmax p(x) / E(x) with E(x) ~ Exp(1): a sample of p, the Gumbel-max trick), and the random
numbers of position t come from the seed, the prompt and t alone (`Draws`). A drafted token is
therefore accepted exactly when it is the token plain sampling would draw there: with probability
p(x), as rejection sampling accepts it, and the siblings of a node together with their summed
probability, as sibling-by-sibling rejection accepts them. So sampling is lossless in distribution
and, more, token-identical to plain sampling with the same seed, whatever the drafter, the tree or
the batch.

Where the samples are drawn depends on the device. On a CPU only the nodes the walk visits are
sampled (`_Samples`: a node's distribution is a softmax over the vocabulary, too dear to take for
every node). On a GPU that way costs a wait for the device and a copy for every visited node,
about 1-2 ms per sampled token at batch 8 (BENCHMARKS.md 10zn), so there every node's race runs
at once on the device, and one copy brings them back for all the rows of a batch that share a
setting (`race_rows`), as greedy's argmax does; the uniforms, still drawn on the host, are copied
once per output position, all the rows' in one copy (`windows`). Both ways draw the same numbers,
so they sample the same tokens (on a GPU up to the last bit of a logarithm, as every float there).
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass, replace
from typing import Sequence

import torch

from ngspec.contracts import DraftTree, Verdict
from ngspec.tree import children, depths


@dataclass(frozen=True)
class SamplingConfig:
    """Temperature 0 means greedy; top_k 0 and top_p 1.0 disable those filters."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0

    def __post_init__(self) -> None:
        if not self.temperature >= 0:  # NaN too: it sampled token 0 at every step
            raise ValueError(f"temperature must be >= 0 (got {self.temperature})")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1] (got {self.top_p})")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (got {self.top_k})")
        if self.seed is not None and not 0 <= self.seed < 2**63:
            raise ValueError("seed must be between 0 and 2**63 - 1")


def target_probs(logits: torch.Tensor, cfg: SamplingConfig) -> torch.Tensor:
    """The distribution sampling draws from: temperature, then top-k, then top-p (float32)."""
    scores = logits.float() / cfg.temperature
    if cfg.top_k and cfg.top_k < scores.shape[-1]:
        kth = torch.topk(scores, cfg.top_k, dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    return nucleus(probs, cfg.top_p) if cfg.top_p < 1.0 else probs


NUCLEUS_HEAD = 1024


def nucleus(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Top-p: keep the most likely tokens whose mass before them is under ``top_p``, renormalised.

    Sorting the whole vocabulary cost 3.2 ms a row on a CPU (49,152 tokens), paid for every token
    sampled; a nucleus is rarely more than a few hundred tokens, so only the head is sorted
    (`torch.topk`, 0.08 ms), widened until the nucleus ends inside it: the same tokens as a full
    sort (BENCHMARKS.md 10zm)."""
    vocab = probs.shape[-1]
    k = min(NUCLEUS_HEAD, vocab)
    while True:
        head, order = torch.topk(probs, k, dim=-1)
        before = torch.cumsum(head, dim=-1) - head
        if k == vocab or bool((before[..., -1] >= top_p).all()):
            break
        k = min(vocab, k * 8)
    kept = torch.zeros_like(probs).scatter(-1, order, head.masked_fill(before >= top_p, 0.0))
    return kept / kept.sum(dim=-1, keepdim=True)


def accept_greedy(tree: DraftTree, logits: torch.Tensor) -> Verdict:
    """Follow the target's argmax from the root; ``logits`` is ``[n+1, vocab]`` in block order."""
    return accept_argmax(tree, logits.argmax(dim=-1).tolist())


def accept_argmax(tree: DraftTree, preds: Sequence[int]) -> Verdict:
    """`accept_greedy` from the target's argmax at every block index (``preds``, at least
    ``n+1`` of them: a batch takes every row's argmax in one operation and one copy).

    Siblings may repeat a token (a search branch is appended to a tree without merging); every
    such sibling agrees with the target, so the one with the longest accepted run below it is
    taken (the first on a tie): the output is the same, only longer per call."""
    kids = children(tree)

    def run(node: int) -> list[int]:
        """Longest accepted run of block indices below block index ``node``."""
        best: list[int] = []
        for c in kids[node]:
            if tree.tokens[c - 1] == preds[node]:
                below = [c] + run(c)
                if len(below) > len(best):
                    best = below
        return best

    blocks = run(0)
    path = tuple(b - 1 for b in blocks)
    last = blocks[-1] if blocks else 0
    return Verdict(path, tuple(tree.tokens[i] for i in path) + (preds[last],))


class Draws:
    """The random numbers one prompt's sampling uses: a vector of uniforms over the vocabulary for
    every output position, from (seed, prompt, position) alone, so every way of decoding the
    prompt (any drafter, tree, batch or device) samples the same tokens. Without a seed a random
    one is drawn here (``seed`` says which, so a run can be replayed: `--check` does)."""

    def __init__(self, seed: int | None, prompt: Sequence[int]) -> None:
        self.seed = secrets.randbits(32) if seed is None else seed
        ids = b"".join(int(i).to_bytes(8, "little", signed=True) for i in prompt)
        self._key = hashlib.blake2b(str(self.seed).encode() + b":" + ids, digest_size=16).digest()
        self._held: dict[int, torch.Tensor] = {}  # output position -> its exponentials on the device (`windows`)

    @classmethod
    def of(cls, sampling: SamplingConfig, prompt: Sequence[int]) -> Draws | None:
        """The draws of a sampled prompt; None when greedy."""
        return None if sampling.greedy else cls(sampling.seed, prompt)

    def uniforms(self, vocab: int, position: int) -> torch.Tensor:
        """Output ``position``'s uniforms, one per token (on the host)."""
        digest = hashlib.blake2b(position.to_bytes(8, "little"), key=self._key, digest_size=8).digest()
        return torch.rand(vocab, generator=torch.Generator().manual_seed(int.from_bytes(digest, "little")))

    def race(self, probs: torch.Tensor, position: int) -> torch.Tensor:
        """The exponential race at output ``position``: p(x) / E(x), E(x) = -log u(x), on the host."""
        return probs.cpu() / -torch.log(self.uniforms(probs.shape[-1], position))

    def token(self, probs: torch.Tensor, position: int) -> int:
        """The token sampled from ``probs`` (``[vocab]``, any device) at output ``position``: the
        race's winner."""
        return int(self.race(probs, position).argmax())

    def scores(self, probs: torch.Tensor, position: int) -> torch.Tensor:
        """The race in log space, log p(x) + Gumbel(x), whose argmax `token` is (for margins)."""
        return torch.log(self.race(probs, position))

    def missing(self, start: int, stop: int) -> list[int]:
        """Output positions ``start`` to ``stop - 1`` whose exponentials `windows` does not hold
        yet; those before ``start`` are let go (a later tree never reaches back)."""
        self._held = {p: e for p, e in self._held.items() if p >= start}
        return [p for p in range(start, stop) if p not in self._held]


def windows(draws: Sequence[Draws], vocab: int, spans: Sequence[tuple[int, int]], device: torch.device) -> list[torch.Tensor]:
    """The exponentials -log u of each row's output positions ``spans[i]`` (start, stop), as
    ``[stop - start, vocab]`` on ``device``. Every position's uniforms are drawn on the host once
    and held there after (a tree's positions are mostly the last step's, moved on by the tokens it
    accepted); the rows' new ones are drawn first and copied in one copy, so that on a GPU the
    drawing overlaps the verify forward, which the copy then waits for."""
    new = [(d, p) for d, (start, stop) in zip(draws, spans) for p in d.missing(start, stop)]
    if new:
        block = -torch.log(torch.stack([d.uniforms(vocab, p) for d, p in new]).to(device))
        for (d, p), e in zip(new, block):
            d._held[p] = e
    return [torch.stack([d._held[p] for p in range(start, stop)]) for d, (start, stop) in zip(draws, spans)]


class _Samples:
    """The target's sample at every block index of a verified tree, drawn when first asked: node
    d levels below the root predicts output position ``position + d``."""

    def __init__(self, tree: DraftTree, logits: torch.Tensor, cfg: SamplingConfig, draws: Draws, position: int) -> None:
        self.logits, self.cfg, self.draws, self.position = logits, cfg, draws, position
        self.depth = [0, *depths(tree)]
        self.drawn: dict[int, int] = {}

    def __getitem__(self, node: int) -> int:
        if node not in self.drawn:
            self.drawn[node] = self.draws.token(target_probs(self.logits[node], self.cfg), self.position + self.depth[node])
        return self.drawn[node]


def race_rows(
    trees: Sequence[DraftTree], logits: Sequence[torch.Tensor], cfgs: Sequence[SamplingConfig], draws: Sequence[Draws], positions: Sequence[int],
) -> list[list[int]]:
    """The target's sample at every block index of each row's verified tree (``logits[i]``: row
    i's, root first), every node's race at once on the logits' device: one race for the rows that
    share a setting (temperature, top-k, top-p; seeds may differ) and one copy to the host for
    each. The tokens `_Samples` draws node by node."""
    out: list[list[int]] = [[] for _ in trees]
    alike: dict[SamplingConfig, list[int]] = {}
    for i, cfg in enumerate(cfgs):
        alike.setdefault(replace(cfg, seed=None), []).append(i)
    depth = [[0, *depths(t)] for t in trees]
    held = windows(draws, logits[0].shape[-1], [(p, p + max(d) + 1) for p, d in zip(positions, depth)], logits[0].device)
    for cfg, rows in alike.items():
        exponentials = torch.cat([held[i][torch.tensor(depth[i], device=held[i].device)] for i in rows])
        probs = target_probs(torch.cat([logits[i][: trees[i].size + 1] for i in rows]), cfg)
        flat = (probs / exponentials).argmax(dim=-1).tolist()
        for i in rows:
            out[i], flat = flat[: trees[i].size + 1], flat[trees[i].size + 1 :]
    return out


def all_at_once(logits: torch.Tensor) -> bool:
    """Whether `sample_rows` races every node on the device (off a CPU) or the visited ones."""
    return logits.device.type != "cpu"


def sample_rows(
    trees: Sequence[DraftTree], logits: Sequence[torch.Tensor], cfgs: Sequence[SamplingConfig], draws: Sequence[Draws], positions: Sequence[int],
) -> list[Sequence[int]]:
    """Each row's samples at every block index, for `accept_argmax`: off a CPU every node's, at
    once (`race_rows`); on a CPU each node's when the walk first visits it (`_Samples`)."""
    if logits and all_at_once(logits[0]):
        return race_rows(trees, logits, cfgs, draws, positions)
    return [_Samples(*row) for row in zip(trees, logits, cfgs, draws, positions)]


def accept_sampled(tree: DraftTree, logits: torch.Tensor, cfg: SamplingConfig, draws: Draws, position: int) -> Verdict:
    """`accept_argmax` against the target's samples instead of its argmax (see the module's
    docstring): lossless in distribution, and the tokens plain sampling draws with the same seed.
    ``position``: the output position the root's logits predict (the tokens generated so far).
    ``logits`` stay on their device: on a GPU every node is sampled there at once; on a CPU only
    the nodes visited are (`sample_rows`)."""
    return accept_argmax(tree, sample_rows([tree], [logits], [cfg], [draws], [position])[0])
