"""Plain decoding and the trie at batch 1 and at batch B, side by side in one process.

    python benchmarks/batch_vs_single.py --questions ../shared/data/spec_bench/question.jsonl \
        --category rag --limit 8 -n 128 --batch-size 8 --repeats 2

Each repeat runs vanilla and trie one prompt at a time, then both over all prompts as one batch;
prints tokens/s per arm and whether every output equals batch-1 vanilla's. The first repeat also
pays for measuring the batch's cost table (once per machine); read the last one.
"""

from __future__ import annotations

import argparse
import time

from ngspec.batch import BatchConfig
from ngspec.decode import DecodeConfig
from ngspec.drafters import make_drafter
from ngspec.engine import Engine
from ngspec.models import load_model
from ngspec.prompts import encode, load_prompts


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--questions", required=True)
    ap.add_argument("--category")
    ap.add_argument("--limit", type=int, default=8)
    ap.add_argument("-n", "--max-new-tokens", type=int, default=128)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    engine = Engine(load_model())
    prompts = [encode(engine.loaded.tokenizer, p.text) for p in load_prompts(args.questions, args.category, args.limit)]
    cfg = DecodeConfig(max_new_tokens=args.max_new_tokens)
    reference = None
    for repeat in range(args.repeats):
        for batch in (1, args.batch_size):
            for drafter in ("vanilla", "trie"):
                start = time.perf_counter()
                if batch == 1:
                    outputs = [engine.run(p, make_drafter(drafter), cfg).token_ids for p in prompts]
                else:
                    results, _ = engine.run_batch(prompts, lambda: make_drafter(drafter), cfg, BatchConfig(batch_size=batch))
                    outputs = [r.generation.token_ids for r in results]
                seconds = time.perf_counter() - start
                reference = reference or outputs
                tokens = sum(len(o) for o in outputs)
                print(f"repeat {repeat} batch {batch} {drafter}: {tokens} tokens in {seconds:.1f} s, "
                      f"{tokens / seconds:.1f} tokens/s, identical to batch-1 vanilla: {outputs == reference}", flush=True)


if __name__ == "__main__":
    main()
