"""Does a draft tree's shape, or keeping the hidden states EAGLE reads, change what verifying it
costs? Times `TargetModel.verify` of four-node chains, forks and stars (and 0, 1, 2 nodes), with
``keep_features`` off and on, in interleaved rounds at one context length, and prints medians
relative to a plain step. The cost tables drafters size trees by are measured on chains without
features (`ngspec.perf.costs`), so this is what says whether they hold for EAGLE's trees.

    python benchmarks/verify_shapes.py --context 1200 --rounds 30
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from ngspec.contracts import DraftTree
from ngspec.kv import truncate
from ngspec.models import load_model
from ngspec.target import TargetModel


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="default")
    ap.add_argument("--context", type=int, default=1200)
    ap.add_argument("--rounds", type=int, default=30)
    args = ap.parse_args()
    loaded = load_model(args.model)
    target = TargetModel(loaded.model)
    vocab = loaded.model.config.vocab_size
    gen = torch.Generator().manual_seed(0)

    def tokens(n: int) -> tuple[int, ...]:
        return tuple(torch.randint(1, vocab, (n,), generator=gen).tolist())

    shapes = {
        "0 nodes": lambda: DraftTree(),
        "1 node": lambda: DraftTree.chain(tokens(1)),
        "2-chain": lambda: DraftTree.chain(tokens(2)),
        "4-chain": lambda: DraftTree.chain(tokens(4)),
        "4-fork (2 x 2)": lambda: DraftTree(tokens(4), (-1, -1, 0, 1)),
        "4-star": lambda: DraftTree(tokens(4), (-1, -1, -1, -1)),
    }
    settings = [(shape, features) for features in (False, True) for shape in shapes]
    prompt = list(tokens(args.context))
    target.prefill(prompt)
    samples: dict = {s: [] for s in settings}
    for rnd in range(args.rounds):
        for shape, features in settings if rnd % 2 == 0 else settings[::-1]:
            target.keep_features = features
            tree = shapes[shape]()
            start = time.perf_counter()
            target.verify(prompt[-1], tree)
            samples[(shape, features)].append(time.perf_counter() - start)
            truncate(target.cache, target.length)  # the context stays at --context tokens
    base = statistics.median(samples[("0 nodes", False)])
    print(f"context {args.context}, {args.rounds} interleaved rounds; median ms and relative to a plain step")
    for shape, features in settings:
        m = statistics.median(samples[(shape, features)])
        print(f"{shape:16s} features {'on ' if features else 'off'}  {m * 1e3:7.1f} ms  {m / base:5.2f}")


if __name__ == "__main__":
    main()
