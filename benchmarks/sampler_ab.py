"""Tokens per call of the two lossless sampling rules, side by side in one process: ``rejection``
(sibling-by-sibling rejection sampling with residual resampling on one random stream, ngspec's rule
before BENCHMARKS.md 10zm) and ``race`` (the default: each position's token from the seed, the
prompt and the position alone, `ngspec.verify.Draws`, a drafted token accepted when it is that
token). Both accept a node's drafted siblings with their summed probability, so their tokens per
call should agree within sampling noise; the texts differ (other random numbers), so this measures
acceptance over several seeds per prompt, not speed.

    python benchmarks/sampler_ab.py --questions ../shared/data/spec_bench/question.jsonl --category rag \\
        --limit 10 --seeds 3 -d trie
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

import ngspec.decode
from ngspec.api import Speculator
from ngspec.bench.interval import ratio_interval, throughput_ratio
from ngspec.prompts import load_prompts
from ngspec.tree import children
from ngspec.verify import SamplingConfig, accept_sampled, target_probs
from ngspec.contracts import DraftTree, Verdict


class Rejection:
    """The rule before 10zm, on a stream seeded per run (``position`` and ``draws`` unused)."""

    def __init__(self) -> None:
        self.gen = torch.Generator()

    def __call__(self, tree: DraftTree, logits: torch.Tensor, cfg: SamplingConfig, draws, position: int) -> Verdict:
        kids = children(tree)
        node, path = 0, []
        while True:
            probs = target_probs(logits[node], cfg).cpu()
            accepted = None
            for child in kids[node]:
                tok = tree.tokens[child - 1]
                mass = probs.sum()
                if float(torch.rand((), generator=self.gen)) < (float(probs[tok] / mass) if mass > 0 else 0.0):
                    accepted = child
                    break
                probs = probs.clone()
                probs[tok] = 0.0
            if accepted is None:
                bonus = int(torch.multinomial(probs / probs.sum(), 1, generator=self.gen).item())
                return Verdict(tuple(path), tuple(tree.tokens[i] for i in path) + (bonus,))
            path.append(accepted - 1)
            node = accepted


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--questions", type=Path, default=Path("ngspec/data/mt_bench.jsonl"))
    parser.add_argument("--category")
    parser.add_argument("--limit", type=int, default=8)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("-n", "--max-new-tokens", type=int, default=128)
    parser.add_argument("-d", "--drafter", default="trie")
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--top-p", type=float, default=1.0)
    args = parser.parse_args()

    prompts = load_prompts(args.questions, args.category, args.limit)
    spec = Speculator.load(drafter=args.drafter)
    rejection = Rejection()
    rules = {"rejection": rejection, "race": accept_sampled}
    runs: dict[str, list[tuple[float, float]]] = {r: [] for r in rules}
    keys = []
    for i, prompt in enumerate(prompts):
        for seed in range(args.seeds):
            for rule in list(rules)[:: 1 if (i + seed) % 2 == 0 else -1]:
                ngspec.decode.accept_sampled = rules[rule]  # the loop looks it up at each step
                rejection.gen.manual_seed(seed)
                out = spec.generate(prompt.text, args.max_new_tokens, temperature=args.temperature, top_p=args.top_p, seed=seed)
                runs[rule].append((out.new_tokens, out.verify_calls))
            keys.append(prompt.id)
        print(f"{i + 1}/{len(prompts)} {prompt.id}", flush=True)
    ngspec.decode.accept_sampled = accept_sampled

    print(f"\n{len(prompts)} prompts x {args.seeds} seeds, {args.drafter}, T={args.temperature} top-p={args.top_p}, {args.max_new_tokens} new tokens")
    for rule in rules:
        tokens, calls = sum(t for t, _ in runs[rule]), sum(c for _, c in runs[rule])
        print(f"{rule:10s} tokens/call {tokens / calls:.3f} ({tokens} tokens, {calls} calls)")
    low, high = ratio_interval(runs["race"], runs["rejection"], keys=keys) or (float("nan"), float("nan"))
    print(f"race / rejection tokens per call: {throughput_ratio(runs['race'], runs['rejection']):.3f}x ({low:.3f}-{high:.3f}, a prompt's seeds resampled together)")


if __name__ == "__main__":
    main()
