"""Side-by-side cost of two ways of sampling, in one process: every prompt (or, with
``--batch-size B``, every group of B prompts, decoded as one batch) is sampled with the same seed
once per arm and drafter, arm order reversed every other prompt or group. Both arms of a
comparison sample the same tokens (checked), since a seed fixes what every drafter samples
(`ngspec.verify.Draws`), so the throughput ratio is the cost of the way alone.

``--compare nucleus`` (the default): the top-p nucleus found by sorting the whole vocabulary
(``full sort``: how `ngspec.verify.target_probs` did it before BENCHMARKS.md 10zm) against sorting
only its head (`ngspec.verify.nucleus`, the default). ``--compare ways``: each tree node sampled
when acceptance first visits it (``node by node``: a CPU's way) against every node of every row
raced at once on the device, one copy back (``all at once``: a GPU's way, `ngspec.verify.race_rows`,
BENCHMARKS.md 10zo). (Before sampling was keyed by position, BENCHMARKS.md 10zm's first runs, a
drafter's arms drew different tokens: the random stream followed its trees, sized by measured step
times.)

    python benchmarks/sampling_cost.py --questions ngspec/data/mt_bench.jsonl --limit 8 -n 128 \\
        --temperature 0.7 --top-p 0.9 -d vanilla -d trie
    python benchmarks/sampling_cost.py --questions ../shared/data/spec_bench/question.jsonl --category rag \\
        --limit 10 -d vanilla -d trie -d eagle+search --eagle-head heads/amd-v41 --datastore datastores/shipped \\
        --tree-choices shapes/amd-v23-cpu-b1-3.json
    python benchmarks/sampling_cost.py --compare ways --batch-size 8 --questions ../shared/data/spec_bench/question.jsonl \\
        --category rag --limit 16 -n 64 -d vanilla -d trie
"""

from __future__ import annotations

import argparse
import time
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


# each comparison's two arms: the module attribute each patches, and its value (the default last)
COMPARISONS = {
    "nucleus": ("nucleus", {"full sort": full_sort_nucleus, "head sort": ngspec.verify.nucleus}),
    "ways": ("all_at_once", {"node by node": lambda logits: False, "all at once": lambda logits: True}),
}


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
    parser.add_argument("--compare", choices=list(COMPARISONS), default="nucleus")
    parser.add_argument("-b", "--batch-size", type=int, default=1, help="above 1: each group of this many prompts decoded as one batch")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto", help="auto: float32 on a CPU, bfloat16 on a GPU")
    args = parser.parse_args()
    if args.batch_size < 1:
        parser.error("--batch-size must be at least 1")

    name, arms = COMPARISONS[args.compare]
    first, second = arms
    default = getattr(ngspec.verify, name)
    prompts = load_prompts(args.questions, args.category, args.limit)
    groups = [prompts[i : i + args.batch_size] for i in range(0, len(prompts), args.batch_size)]
    drafters = args.drafter or ["vanilla", "trie"]
    needs = {"eagle_head": ("eagle", "eagle+search"), "tree_choices": ("eagle", "eagle+search"), "datastore": ("search", "eagle+search")}
    specs = {
        d: Speculator.load(drafter=d, device=args.device, dtype=args.dtype, **{o: getattr(args, o) for o, ds in needs.items() if d in ds and getattr(args, o)})
        for d in drafters
    }
    runs: dict[tuple[str, str], list[tuple[float, float]]] = {(d, a): [] for d in drafters for a in arms}
    sampling = dict(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, seed=args.seed)

    def decode(spec: Speculator, group) -> tuple[list[list[int]], float, float]:
        """The group's tokens, new tokens and seconds (one prompt: prefill left out)."""
        if args.batch_size == 1:
            out = spec.generate(group[0].text, args.max_new_tokens, **sampling)
            return [out.token_ids], out.new_tokens, out.seconds - out.prefill_seconds
        start = time.perf_counter()
        outs = spec.generate_batch([p.text for p in group], args.max_new_tokens, batch_size=args.batch_size, **sampling)
        return [o.token_ids for o in outs], sum(o.new_tokens for o in outs), time.perf_counter() - start

    for d, spec in specs.items():
        for arm in arms:  # warm up each way: calibration, first kernels
            setattr(ngspec.verify, name, arms[arm])
            decode(spec, groups[0])
    for i, group in enumerate(groups):
        for d, spec in specs.items():
            tokens = {}
            for arm in list(arms)[:: 1 if i % 2 == 0 else -1]:
                setattr(ngspec.verify, name, arms[arm])  # the engine looks it up at each call
                tokens[arm], new, seconds = decode(spec, group)
                runs[d, arm].append((new, seconds))
            if tokens[first] != tokens[second]:
                print(f"note: {group[0].id} {d}: the arms sampled different tokens (a near-tie?)")
        print(f"{i + 1}/{len(groups)} {group[0].id}", flush=True)
    setattr(ngspec.verify, name, default)

    print(f"\n{len(prompts)} prompts, batch size {args.batch_size}, {args.max_new_tokens} new tokens, T={args.temperature} "
          f"top-p={args.top_p} top-k={args.top_k}, {next(iter(specs.values())).engine.target.device}; decode tok/s"
          + (" (prefill left out)" if args.batch_size == 1 else " (batch wall time)"))
    for d in drafters:
        tps = {a: sum(t for t, _ in runs[d, a]) / sum(s for _, s in runs[d, a]) for a in arms}
        low, high = ratio_interval(runs[d, second], runs[d, first]) or (float("nan"), float("nan"))
        print(f"{d:12s} {first} {tps[first]:7.1f}  {second} {tps[second]:7.1f}  {second}/{first} "
              f"{throughput_ratio(runs[d, second], runs[d, first]):.3f}x ({low:.3f}-{high:.3f})")
    if "vanilla" in drafters:
        for d in drafters:
            if d != "vanilla":
                for a in arms:
                    print(f"{d} vs vanilla, {a}: {throughput_ratio(runs[d, a], runs['vanilla', a]):.3f}x")


if __name__ == "__main__":
    main()
