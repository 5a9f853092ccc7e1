"""Side-by-side cost of top-p sampling, in one process: every prompt is sampled with the same seed
twice per drafter, once with the nucleus found by sorting the whole vocabulary (``full sort``: how
`ngspec.verify.target_probs` did it before BENCHMARKS.md 10zm) and once by sorting only its head
(`ngspec.verify.nucleus`, the default), arm order reversed every other prompt. Both keep the same
tokens, and a seed fixes what every drafter samples (`ngspec.verify.Draws`), so each drafter's two
arms decode the same tokens (checked) and the throughput ratio is the cost of the sort alone.
(Before sampling was keyed by position, BENCHMARKS.md 10zm's first runs, a drafter's arms drew
different tokens: the random stream followed its trees, sized by measured step times.)

    python benchmarks/sampling_cost.py --questions ngspec/data/mt_bench.jsonl --limit 8 -n 128 \\
        --temperature 0.7 --top-p 0.9 -d vanilla -d trie
    python benchmarks/sampling_cost.py --questions ../shared/data/spec_bench/question.jsonl --category rag \
        --limit 10 -d vanilla -d trie -d eagle+search --eagle-head heads/amd-v41 --datastore datastores/shipped \
        --tree-choices shapes/amd-v23-cpu-b1-3.json
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

import ngspec.verify
from ngspec.api import Speculator
from ngspec.bench.interval import ratio_interval, throughput_ratio
from ngspec.prompts import load_prompts


def full_sort_nucleus(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """The nucleus by sorting the whole vocabulary (the rule's definition, and the old code)."""
    sorted_p, order = torch.sort(probs, dim=-1, descending=True)
    before = torch.cumsum(sorted_p, dim=-1) - sorted_p
    kept = torch.zeros_like(probs).scatter(-1, order, sorted_p.masked_fill(before >= top_p, 0.0))
    return kept / kept.sum(dim=-1, keepdim=True)


ARMS = {"full sort": full_sort_nucleus, "head sort": ngspec.verify.nucleus}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--questions", type=Path, default=Path("ngspec/data/mt_bench.jsonl"))
    parser.add_argument("--category")
    parser.add_argument("--limit", type=int, default=8)
    parser.add_argument("-n", "--max-new-tokens", type=int, default=128)
    parser.add_argument("-d", "--drafter", action="append", default=None)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--top-p", type=float, default=0.9)
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--eagle-head", type=Path, help="for eagle and eagle+search")
    parser.add_argument("--datastore", type=Path, help="for search and eagle+search")
    parser.add_argument("--tree-choices", type=Path, help="for eagle and eagle+search: a tuned static tree")
    args = parser.parse_args()

    prompts = load_prompts(args.questions, args.category, args.limit)
    drafters = args.drafter or ["vanilla", "trie"]
    needs = {"eagle_head": ("eagle", "eagle+search"), "tree_choices": ("eagle", "eagle+search"), "datastore": ("search", "eagle+search")}
    specs = {d: Speculator.load(drafter=d, **{o: getattr(args, o) for o, ds in needs.items() if d in ds and getattr(args, o)}) for d in drafters}
    runs: dict[tuple[str, str], list[tuple[float, float]]] = {(d, a): [] for d in drafters for a in ARMS}
    sampling = dict(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, seed=args.seed)
    for d, spec in specs.items():
        spec.generate(prompts[0].text, 8, **sampling)  # warm up: calibration, first kernels
    for i, prompt in enumerate(prompts):
        for d, spec in specs.items():
            tokens = {}
            for arm in list(ARMS)[:: 1 if i % 2 == 0 else -1]:
                ngspec.verify.nucleus = ARMS[arm]  # target_probs looks it up at each call
                out = spec.generate(prompt.text, args.max_new_tokens, **sampling)
                runs[d, arm].append((out.new_tokens, out.seconds - out.prefill_seconds))
                tokens[arm] = out.token_ids
            if tokens["full sort"] != tokens["head sort"]:
                print(f"note: {prompt.id} {d}: the arms sampled different tokens (a tie at the nucleus' edge?)")
        print(f"{i + 1}/{len(prompts)} {prompt.id}", flush=True)
    ngspec.verify.nucleus = ARMS["head sort"]

    print(f"\n{len(prompts)} prompts, {args.max_new_tokens} new tokens, T={args.temperature} top-p={args.top_p} top-k={args.top_k}; decode tok/s (prefill left out)")
    for d in drafters:
        full, head = runs[d, "full sort"], runs[d, "head sort"]
        tps = {a: sum(t for t, _ in runs[d, a]) / sum(s for _, s in runs[d, a]) for a in ARMS}
        low, high = ratio_interval(head, full) or (float("nan"), float("nan"))
        print(f"{d:10s} full sort {tps['full sort']:6.1f}  head sort {tps['head sort']:6.1f}  head/full {throughput_ratio(head, full):.3f}x ({low:.3f}-{high:.3f})")
    if "vanilla" in drafters:
        for d in drafters:
            if d != "vanilla":
                for a in ARMS:
                    print(f"{d} vs vanilla, {a}: {throughput_ratio(runs[d, a], runs['vanilla', a]):.3f}x")


if __name__ == "__main__":
    main()
