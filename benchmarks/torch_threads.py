"""Decoding on the loading thread, before and after torch has run on a second thread.

    python benchmarks/torch_threads.py --questions ../shared/data/spec_bench/question.jsonl \
        --category rag --limit 4 -n 64 --rounds 2

Phases, in this order (once a second thread has run torch it cannot be undone in-process, so the
phases cannot be interleaved; each is repeated ``--rounds`` times back to back):
  main alone       every generation on the main thread, which loaded the model
  main, 2nd alive  the same after one generation on a second thread that stays alive
  2nd thread       the same generations on that second thread
  main, 2nd gone   on the main thread again after the second thread has ended
Prints seconds per phase and the ratio to the first; tokens must be identical throughout.
"""

from __future__ import annotations

import argparse
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from ngspec import Speculator
from ngspec.prompts import load_prompts


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--questions", required=True)
    ap.add_argument("--category")
    ap.add_argument("--limit", type=int, default=4)
    ap.add_argument("-n", "--max-new-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("-d", "--drafter", default="trie")
    args = ap.parse_args()
    spec = Speculator.load("default", drafter=args.drafter)
    spec._thread = None  # measuring the very thing its warning is about
    prompts = [p.text for p in load_prompts(args.questions, args.category, args.limit)]

    def run() -> tuple[float, list[list[int]]]:
        start = time.perf_counter()
        tokens = [spec.generate(p, max_new_tokens=args.max_new_tokens).token_ids for p in prompts for _ in range(args.rounds)]
        return time.perf_counter() - start, tokens

    run()  # warm-up
    phases = {"main alone": run()}
    second = ThreadPoolExecutor(max_workers=1)
    second.submit(lambda: spec.generate(prompts[0], max_new_tokens=4)).result()
    phases["main, 2nd alive"] = run()
    phases["2nd thread"] = second.submit(run).result()
    second.shutdown(wait=True)
    threading.Event().wait(1.0)
    phases["main, 2nd gone"] = run()
    base_s, base_tokens = phases["main alone"]
    print(f"{len(prompts)} prompts x {args.rounds}, {args.drafter}, {args.max_new_tokens} new tokens at most")
    for name, (seconds, tokens) in phases.items():
        print(f"{name:16s} {seconds:7.2f} s  {seconds / base_s:.3f}x  identical tokens: {tokens == base_tokens}")


if __name__ == "__main__":
    main()
