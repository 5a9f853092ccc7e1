"""`ngspec serve` under concurrent clients: one request at a time (`--batch-size 1`) against
concurrent requests decoded together (`--batch-size B`), in one process, arms alternating.

    python benchmarks/serve_concurrency.py --questions ../shared/data/spec_bench/question.jsonl \
        --category rag --limit 8 -n 64 --clients 1,4 --batch-size 4 --rounds 2

Each arm serves the same prompts: ``C`` client threads, each sending its share of the prompts one
after another (chat completions, greedy). The model is loaded and run on the main thread, as in
`ngspec serve`. Prints, per arm and client count: wall seconds, tokens per second over all
requests, mean seconds a request waited for its answer, and whether every answer's tokens equal
the first arm's.
"""

from __future__ import annotations

import argparse
import json
import time
import urllib.request
from functools import partial

from ngspec import Speculator
from ngspec.prompts import load_prompts
from ngspec.server import make_server, serve_while


def ask(url: str, text: str, max_tokens: int) -> tuple[list[int], float]:
    body = {"messages": [{"role": "user", "content": text}], "max_tokens": max_tokens}
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    start = time.perf_counter()
    with urllib.request.urlopen(request, timeout=600) as response:
        answer = json.loads(response.read())
    return answer["choices"][0]["token_ids"], time.perf_counter() - start


def run_arm(spec: Speculator, batch_size: int, clients: int, prompts: list[str], max_tokens: int) -> dict:
    """One arm: serve on this thread while ``clients`` threads ask; returns its figures."""
    server = make_server(spec, port=0, batch_size=batch_size)
    url = f"http://127.0.0.1:{server.server_address[1]}/v1/chat/completions"
    answers: dict[int, tuple[list[int], float]] = {}

    def client(c: int) -> None:
        for i in range(c, len(prompts), clients):
            answers[i] = ask(url, prompts[i], max_tokens)

    start = time.perf_counter()
    serve_while(server, *[partial(client, c) for c in range(clients)])  # generation on this thread until the clients are done
    wall = time.perf_counter() - start
    tokens = [answers[i][0] for i in range(len(prompts))]
    return {"wall": wall, "tokens": tokens, "new": sum(map(len, tokens)), "latency": sum(a[1] for a in answers.values()) / len(answers)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--questions", required=True)
    ap.add_argument("--category")
    ap.add_argument("--limit", type=int, default=8)
    ap.add_argument("-n", "--max-new-tokens", type=int, default=64)
    ap.add_argument("--clients", default="1,4", help="client counts, comma-separated")
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("-d", "--drafter", default="trie")
    args = ap.parse_args()
    spec = Speculator.load("default", drafter=args.drafter)
    prompts = [p.text for p in load_prompts(args.questions, args.category, args.limit)]
    arms = [1, args.batch_size]
    run_arm(spec, args.batch_size, 2, prompts[:2], 8)  # warm-up
    totals: dict[tuple[int, int], list[dict]] = {}
    for round_ in range(args.rounds):
        for clients in (int(c) for c in args.clients.split(",")):
            for b in arms if round_ % 2 == 0 else arms[::-1]:
                totals.setdefault((clients, b), []).append(run_arm(spec, b, clients, prompts, args.max_new_tokens))
    reference = totals[next(iter(totals))][0]["tokens"]
    print(f"{len(prompts)} prompts, {args.drafter}, {args.max_new_tokens} new tokens at most, {args.rounds} rounds (sums)")
    for (clients, b), runs in totals.items():
        wall = sum(r["wall"] for r in runs)
        new = sum(r["new"] for r in runs)
        latency = sum(r["latency"] for r in runs) / len(runs)
        same = all(r["tokens"] == reference for r in runs)
        print(f"clients {clients}  --batch-size {b}:  {wall:7.2f} s  {new / wall:6.1f} tokens/s  mean wait {latency:5.2f} s  identical tokens: {same}")


if __name__ == "__main__":
    main()
