"""End-to-end A/B of CPU kernel plans (`ngspec.cpu_linear`): the plan the engine tunes against the
best plan without some kernels (by default ``blocked``, oneDNN on its own weight layout), on the
same prompts in one process, arms interleaved per prompt. Both plans come from one kernel
measurement, so they differ only where a left-out kernel won; each plan's drafters size trees by
that plan's own verify-cost table (measured once, cached).

    python benchmarks/kernel_plans.py --category summarization --limit 8 -n 128 --drafters vanilla,trie
    # against a given plan, e.g. one an earlier measurement cached (one kernel per ROW_LADDER count)
    python benchmarks/kernel_plans.py --other onednn,blocked,onednn,blocked,blocked,blocked,blocked,blocked,transposed,blocked,linear,blocked,blocked,blocked,onednn

Prints each plan's prefill time per prompt, and per drafter and plan the run's tokens/s (prefill
included), how much faster the tuned plan is, and whether both plans' outputs are identical.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from ngspec.cpu_linear import KERNELS, ROW_LADDER, KernelPlan, choose_plan, measure_plan, use_plan
from ngspec.decode import DecodeConfig
from ngspec.drafters import make_drafter
from ngspec.drafters.trie import Calibration
from ngspec.engine import Engine
from ngspec.models import load_model
from ngspec.perf.costs import cached_verify_costs
from ngspec.prompts import encode, load_prompts


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--questions", default="../shared/data/spec_bench/question.jsonl")
    ap.add_argument("--category", default="summarization")
    ap.add_argument("--limit", type=int, default=8)
    ap.add_argument("-n", "--max-new-tokens", type=int, default=128)
    ap.add_argument("--drafters", default="vanilla,trie")
    ap.add_argument("--without", default="blocked", help=f"the kernels the other plan leaves out, comma-separated (of {', '.join(KERNELS)})")
    ap.add_argument("--other", help=f"the other plan, one kernel per row count of {ROW_LADDER}, comma-separated (instead of --without)")
    args = ap.parse_args()

    loaded = load_model("default", device="cpu", dtype="float32")
    tuned, seconds = measure_plan(loaded.model)
    if args.other:
        other, other_name = KernelPlan(tuple(args.other.split(","))), "given"
    else:
        left_out = set(args.without.split(","))
        other = choose_plan({rows: {k: t for k, t in by.items() if k not in left_out} for rows, by in seconds.items()})
        other_name = f"no {args.without}"
    plans = {"tuned": tuned, other_name: other}
    for name, plan in plans.items():
        print(f"{name}: {plan.describe()}", flush=True)
    use_plan(loaded.model, tuned)  # the weight copies the tuned plan runs on (the other needs none of another kind)
    assert other.copy_kernel in (None, tuned.copy_kernel), "the plans would need two copies of the weights"
    engine = Engine(loaded, calibrate=False)
    ids = [encode(loaded.tokenizer, p.text) for p in load_prompts(Path(args.questions), args.category, args.limit)]
    cfg = DecodeConfig(max_new_tokens=args.max_new_tokens)
    arms = [(d, p) for d in args.drafters.split(",") for p in plans]
    calibration = {arm: Calibration() for arm in arms}
    res = {arm: {"seconds": 0.0, "tokens": 0, "outputs": []} for arm in arms}
    prefill = {plan: 0.0 for plan in plans}

    def switch(plan: str) -> None:  # in place, and the cost table drafters size trees by (once measured)
        for layer in loaded.model.modules():
            if hasattr(layer, "plan"):
                layer.plan = plans[plan]
        engine.target.cost_tables = tables.get(plan, {})

    tables: dict[str, dict[int, tuple[float, ...]]] = {}
    for name in plans:
        switch(name)
        tables[name] = {0: cached_verify_costs(engine.target, engine.max_draft_nodes)}
        print(f"{name}: verify cost of 1/2/4/8 nodes {', '.join(f'{tables[name][0][n]:.2f}' for n in (1, 2, 4, 8))}", flush=True)

    for i, x in enumerate(ids):
        for plan in plans if i % 2 == 0 else list(plans)[::-1]:
            switch(plan)
            start = time.perf_counter()
            engine.target.prefill(x)
            prefill[plan] += time.perf_counter() - start
        for drafter, plan in arms if i % 2 == 0 else arms[::-1]:
            switch(plan)
            gen = engine.run(x, make_drafter(drafter, calibration=calibration[drafter, plan]), cfg)
            r = res[drafter, plan]
            r["seconds"] += gen.seconds
            r["tokens"] += len(gen.token_ids)
            r["outputs"].append(gen.token_ids)
    mean = sum(len(x) for x in ids) / len(ids)
    for plan in plans:
        print(f"prefill ({mean:.0f} tokens on average), {plan}: {prefill[plan] / len(ids) * 1000:.0f} ms", flush=True)
    for drafter in args.drafters.split(","):
        base = res[drafter, "tuned"]
        for plan in plans:
            r = res[drafter, plan]
            print(
                f"{args.category} {drafter:8s} {plan:10s} tokens/s {r['tokens'] / r['seconds']:.2f}  "
                f"tuned is {r['seconds'] / base['seconds']:.3f}x as fast  same outputs {r['outputs'] == base['outputs']}",
                flush=True,
            )


if __name__ == "__main__":
    main()
