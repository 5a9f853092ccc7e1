"""Why two runs of one prompt report different tokens per call: the same prompt decoded several
times with the cost table rescaled by each run's own step times (`DecodeConfig.learn_costs`, the
default; `ngspec/perf/online.py`) and without, arms alternating, in one process.

    python benchmarks/cost_learning.py --prompt-file examples/rag_ngspec.txt --drafter trie --rounds 3

Prints, per run: whether the costs were learned, the tokens, tokens per call, and the sizes of
the trees verified (how many steps verified 1, 2, ... nodes). The tokens are the same in every run
(the script checks). Each run starts from the drafter's own estimates, as a new `ngspec generate`
process does (one `Speculator` carries them from prompt to prompt, which changes its trees too).
With learning off the trees are sized from the cached table alone; with it on they also follow
the step times this run measured.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

from ngspec import Speculator
from ngspec.decode import DecodeConfig
from ngspec.prompts import load_prompts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompt-file", type=Path, default=Path("examples/rag_ngspec.txt"))
    parser.add_argument("--model", default="default")
    parser.add_argument("--drafter", default="trie")
    parser.add_argument("--max-new-tokens", "-n", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3, help="runs per arm (learning on, then off, alternating)")
    ns = parser.parse_args()

    spec = Speculator.load(ns.model, drafter=ns.drafter)
    ids = spec.encode(load_prompts(ns.prompt_file)[0].text)  # the first prompt, read as `generate` reads it
    tokens, rows = None, []
    for _ in range(ns.rounds):
        for learn in (True, False):
            fresh = Speculator(spec.engine, ns.drafter)  # the loaded model, with estimates of its own, as a new `generate` run
            gen = fresh.run(ids, DecodeConfig(max_new_tokens=ns.max_new_tokens, learn_costs=learn))
            if tokens is None:
                tokens = gen.token_ids
            row = {
                "learn_costs": learn, "tokens": len(gen.token_ids), "same_tokens": gen.token_ids == tokens,
                "tokens_per_call": round(fresh.output(gen, len(ids)).mean_tokens_per_call, 3),  # as generate reports it
                "tree_sizes": dict(sorted(Counter(s.tree_size for s in gen.stats.steps).items())),
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
    return 0 if all(r["same_tokens"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
