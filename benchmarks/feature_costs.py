"""What reading an EAGLE head's features costs the target, two ways:

* a prefill of the longest chosen prompt with no features (drafters without a head), with the
  features the head reads (`ngspec.target.forward_with_features`), and with every layer's hidden
  state (``output_hidden_states=True``, what ngspec asked for before), in rounds that permute
  the order;
* plain verify steps (four-node chains, no features) on two copies of the model, one of which
  has had transformers' output-capturing hooks installed (the first ``output_hidden_states``
  request installs them on every decoder layer and attention module for good), alternating.

Prints medians in ms.

    python benchmarks/feature_costs.py --category summarization --limit 8 --rounds 25
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time
from pathlib import Path

import torch

from ngspec.contracts import DraftTree
from ngspec.models import load_model
from ngspec.prompts import encode, load_prompts
from ngspec.target import TargetModel


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--questions", default="../shared/data/spec_bench/question.jsonl")
    ap.add_argument("--category", default="summarization")
    ap.add_argument("--limit", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=25)
    ap.add_argument("--steps", type=int, default=30, help="verify steps per model per round")
    args = ap.parse_args()
    loaded = load_model()
    plain, hooked = TargetModel(loaded.model), TargetModel(load_model().model)
    prompts = load_prompts(Path(args.questions), args.category, args.limit)
    prompt = max((encode(loaded.tokenizer, p.text) for p in prompts), key=len)

    @torch.inference_mode()
    def prefill_all_layers() -> float:  # before: every layer's hidden state, through transformers
        start = time.perf_counter()
        hooked.model(input_ids=torch.tensor([prompt]), output_hidden_states=True, logits_to_keep=1)
        return time.perf_counter() - start

    def prefill(keep: bool):
        def run() -> float:
            plain.keep_features = keep
            start = time.perf_counter()
            plain.prefill(prompt)
            return time.perf_counter() - start
        return run

    modes = {"none": prefill(False), "head's features": prefill(True), "all layers": prefill_all_layers}
    prefills = timed_rounds(modes, args.rounds)
    print(f"prefill of {len(prompt)} tokens, median of {args.rounds}:", prefills)

    assert sum(len(m._forward_hooks) for m in plain.model.modules()) == 0, "the head's features left hooks behind"
    tree = DraftTree((5, 6, 7, 8), (-1, 0, 1, 2))
    short = prompt[:600]

    def steps(target: TargetModel):
        def run() -> float:
            target.keep_features = False
            target.prefill(short)
            seconds = []
            for _ in range(args.steps):
                start = time.perf_counter()
                target.verify(9, tree)
                seconds.append(time.perf_counter() - start)
                target.commit([0])
            return statistics.median(seconds)
        return run

    per_step = timed_rounds({"plain model": steps(plain), "with transformers' hooks": steps(hooked)}, args.rounds // 2, digits=2)
    print(f"verify step (4-node chain, {len(short)}-token context), median over rounds of each round's median step:", per_step)


def timed_rounds(modes: dict, rounds: int, digits: int = 1) -> dict[str, float]:
    """Median ms of what each mode's call reports (seconds) over ``rounds`` rounds (after one
    warm-up), the order permuted from round to round."""
    orders = list(itertools.permutations(modes))
    times: dict[str, list[float]] = {m: [] for m in modes}
    for r in range(rounds + 1):
        for mode in orders[r % len(orders)]:
            seconds = modes[mode]()
            if r:
                times[mode].append(seconds)
    return {m: round(1000 * statistics.median(v), digits) for m, v in times.items()}


if __name__ == "__main__":
    main()
