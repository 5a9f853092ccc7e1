"""Datastore build time, peak memory and lookup rate, and the self-repetition metric's speed.

    python benchmarks/datastore_speed.py --tokens 10000000 --work /tmp/ngspec-ds

Builds a synthetic Magpie-style corpus of about ``--tokens`` tokens (sentences recombined from the
shared Magpie sample, so the text is realistic English), then times `build-datastore` as a
subprocess (peak RSS from the OS), random longest-match lookups on the result, the greedy
continuations the search branch reads from them, and the self-repetition metric on records of
about 1,000 input and 500 response tokens.
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import subprocess
import sys
import time
from pathlib import Path

MAGPIE = Path(__file__).resolve().parents[2] / "shared" / "data" / "magpie_sample" / "example_instructions_5res.json"


def synthetic_corpus(path: Path, approx_tokens: int, seed: int = 0) -> int:
    rng = random.Random(seed)
    sentences = []
    for record in json.loads(MAGPIE.read_text()):
        for response in record["responses"]:
            sentences += [s.strip() + "." for s in response.split(".") if len(s.strip()) > 20]
    records, chars = 0, 0
    with path.open("w") as f:
        while chars < approx_tokens * 4.2:  # about 4.2 characters per token for this tokenizer
            response = " ".join(rng.choice(sentences) for _ in range(rng.randrange(5, 30)))
            f.write(json.dumps({"instruction": "Explain.", "response": response}) + "\n")
            records += 1
            chars += len(response)
    return records


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=10_000_000)
    ap.add_argument("--work", type=Path, default=Path("/tmp/ngspec-ds"))
    ap.add_argument("--lookups", type=int, default=20000)
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    corpus = args.work / "corpus.jsonl"
    if not corpus.exists():
        print(f"synthetic corpus: {synthetic_corpus(corpus, args.tokens):,} records", flush=True)
    out = args.work / "ds"
    start = time.perf_counter()
    cmd = [sys.executable, "-m", "ngspec.cli.app", "build-datastore", "-c", str(corpus), "-o", str(out), "--force", "--json"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if proc.returncode:
        sys.exit(proc.stderr)
    meta = json.loads(proc.stdout.strip().splitlines()[-1])
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    print(f"build: {meta['tokens']:,} tokens in {seconds:.1f} s wall (process incl. imports and tokenizer load); "
          f"peak RSS {peak / 2**20:.0f} MiB = {peak / meta['tokens']:.1f} bytes/token", flush=True)
    before, own_peak = meta["rss_before_data_bytes"], meta["peak_rss_bytes"]
    stored = meta["tokens"] + meta["documents"]  # separators included
    print(f"memory: {before / 2**20:.0f} MiB before reading data (Python, torch via transformers, datasets, "
          f"tokenizer) + {(own_peak - before) / stored:.1f} bytes/token for the data", flush=True)

    from ngspec.datastore.index import Datastore
    from ngspec.metrics.self_repetition import self_repetition

    store = Datastore.open(out)
    rng = random.Random(1)
    n = len(store.tokens)
    contexts = []
    for _ in range(args.lookups):
        s = rng.randrange(n - 40)
        ctx = store.tokens[s : s + 16].tolist()
        ctx[-1 - rng.randrange(3)] = rng.randrange(49152)  # so matches end at varied lengths
        contexts.append(ctx)
    start = time.perf_counter()
    found = sum(store.longest_suffix_match(c, min_len=1, max_len=16) is not None for c in contexts)
    rate = len(contexts) / (time.perf_counter() - start)
    print(f"longest-match lookups: {rate:,.0f} per second ({found} of {len(contexts)} found)", flush=True)

    # the search branch's reads: each distinct match of at least two tokens (as the drafters ask,
    # up to 32) followed 16 tokens deep, nothing remembered from an earlier read
    matches = list(dict.fromkeys(m for m in (store.longest_suffix_match(c, min_len=2, max_len=32) for c in contexts) if m is not None))
    store.forget()
    start = time.perf_counter()
    for m in matches:
        store.greedy_continuation(m, 16, 0.5)
    seconds = time.perf_counter() - start
    counts = sorted(m.count for m in matches)
    print(f"continuations (16 deep, each distinct match read once): {len(matches) / seconds:,.0f} per second "
          f"({len(matches)} matches; occurrences: median {counts[len(counts) // 2]}, over 64 in {sum(c > 64 for c in counts)})", flush=True)

    records = []
    for _ in range(200):
        s = rng.randrange(n - 1600)
        window = [t for t in store.tokens[s : s + 1500].tolist() if t != store.meta.separator]
        records.append((window[:1000], window[1000:1500]))
    start = time.perf_counter()
    tokens = sum(self_repetition(x, y).tokens for x, y in records)
    rate = tokens / (time.perf_counter() - start)
    print(f"self-repetition: {rate:,.0f} response tokens per second (records of ~1000 input + ~500 response tokens)")


if __name__ == "__main__":
    main()
