"""What building a prompt's n-gram trie costs the host: `NGramTrie.extend` over real prompts, in
microseconds a token, at the trie drafter's n = 13 and eagle+search's local trie (n = 3 + 16 = 19).

Every `trie` and `eagle+search` row builds its trie when its prompt is admitted, on the host, after
the prefill (a batch's other rows wait); on a host-bound GPU a prefill of a few hundred tokens
takes tens of milliseconds, so this can be a noticeable share of the time to first token.

    python benchmarks/trie_build.py --questions ../shared/data/spec_bench/question.jsonl --category rag --limit 16

``--check`` also compares every trie with one built a token at a time (the incremental path that
``--trie-update`` takes while decoding): node ids, counts and children's order must be equal.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from ngspec.drafters.trie import NGramTrie


def build_time(ids: list[int], n: int, prefix_len: int, repeats: int) -> float:
    """Best of ``repeats`` wall times of building the trie of ``ids``, in seconds."""
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        NGramTrie(n, prefix_len).extend(ids)
        best = min(best, time.perf_counter() - t0)
    return best


def state(trie: NGramTrie) -> tuple:
    """Everything a query reads: the nodes in id order, with their children in dict order."""
    return trie.tokens, trie.counts, trie.depths, [list(c.items()) for c in trie.children]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--questions", required=True)
    ap.add_argument("--category", default="rag")
    ap.add_argument("--limit", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    from ngspec.models import load_tokenizer
    from ngspec.prompts import encode, load_prompts

    tok = load_tokenizer("default")
    ids = [encode(tok, p.text) for p in load_prompts(Path(args.questions), args.category, args.limit)]
    tokens = sum(map(len, ids))
    print(f"{len(ids)} {args.category} prompts, {tokens} tokens (median {statistics.median(map(len, ids)):.0f})")
    for n, prefix_len, who in ((13, 3, "trie drafter"), (19, 3, "eagle+search's local trie")):
        seconds = sum(build_time(p, n, prefix_len, args.repeats) for p in ids)
        print(f"n = {n:2d} ({who}): {1e6 * seconds / tokens:.2f} us a token, {1e3 * seconds / len(ids):.2f} ms a prompt")
        if args.check:
            for p in ids:
                whole, stepwise = NGramTrie(n, prefix_len), NGramTrie(n, prefix_len)
                whole.extend(p)
                for t in p:
                    stepwise.extend([t])
                assert state(whole) == state(stepwise), "a trie built at once differs from one built a token at a time"
            print("  built at once == built a token at a time: yes")


if __name__ == "__main__":
    main()
