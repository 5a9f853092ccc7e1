"""What `ngspec serve` adds to a generation: the same prompts through `Speculator.generate`
directly, through HTTP, and through HTTP streamed, interleaved prompt by prompt in one process.

    python benchmarks/serve_overhead.py --questions ../shared/data/spec_bench/question.jsonl \
        --category rag --limit 8 -n 128 --rounds 3

The direct arm is `generate`'s own wall time on the generation thread; the HTTP arms are the
client's wall clock (request, queue, generation, JSON, reading the stream to its end). Prints
each arm's total seconds and its ratio to the direct calls, and whether every arm's tokens equal
the direct calls'. As in `ngspec serve`, the model is loaded and run on the main thread and HTTP
is answered on others; the client is one more thread that never touches torch.
"""

from __future__ import annotations

import argparse
import json
import time
import urllib.request

from ngspec import Speculator
from ngspec.prompts import load_prompts
from ngspec.server import make_server, serve_while


def post(url: str, body: dict) -> tuple[list[int], float]:
    """The answer's token ids and the client's wall seconds (a stream read to its end)."""
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    start = time.perf_counter()
    with urllib.request.urlopen(request, timeout=600) as response:
        text = response.read().decode()
    seconds = time.perf_counter() - start
    if body.get("stream"):
        events = [json.loads(e.removeprefix("data: ")) for e in text.split("\n\n") if e and e != "data: [DONE]"]
        return events[-1]["choices"][0]["token_ids"], seconds
    return json.loads(text)["choices"][0]["token_ids"], seconds


def timed_direct(spec: Speculator, text: str, max_new_tokens: int) -> tuple[list[int], float]:
    start = time.perf_counter()
    out = spec.generate(text, max_new_tokens=max_new_tokens)
    return out.token_ids, time.perf_counter() - start


def body_for(text: str, max_new_tokens: int) -> dict:
    return {"messages": [{"role": "user", "content": text}], "max_tokens": max_new_tokens}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--questions", required=True)
    ap.add_argument("--category")
    ap.add_argument("--limit", type=int, default=8)
    ap.add_argument("-n", "--max-new-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("-d", "--drafter", default="trie")
    args = ap.parse_args()
    spec = Speculator.load("default", drafter=args.drafter)
    prompts = [p.text for p in load_prompts(args.questions, args.category, args.limit)]
    server = make_server(spec, port=0)
    worker = server.service.worker
    url = f"http://127.0.0.1:{server.server_address[1]}/v1/chat/completions"
    arms = ("direct", "http", "http stream")
    runs = {  # direct: generate itself, timed on the generation thread; http: the client's wall clock
        "direct": lambda text: worker.submit(lambda: timed_direct(spec, text, args.max_new_tokens)).result(),
        "http": lambda text: post(url, body_for(text, args.max_new_tokens)),
        "http stream": lambda text: post(url, {**body_for(text, args.max_new_tokens), "stream": True}),
    }
    totals = {arm: 0.0 for arm in arms}
    exact = {arm: 0 for arm in arms}

    def client() -> None:
        runs["direct"](prompts[0])  # warm-up
        for round_ in range(args.rounds):
            for i, text in enumerate(prompts):
                shift = (round_ * len(prompts) + i) % len(arms)  # each arm goes first as often as the others
                results = {arm: runs[arm](text) for arm in arms[shift:] + arms[:shift]}
                for arm in arms:
                    totals[arm] += results[arm][1]
                    exact[arm] += results[arm][0] == results["direct"][0]

    serve_while(server, client)  # generation on this thread, the one that loaded the model, as in `ngspec serve`
    calls = args.rounds * len(prompts)
    print(f"{calls} calls per arm ({len(prompts)} prompts x {args.rounds} rounds), {args.drafter}, {args.max_new_tokens} new tokens at most")
    for arm in arms:
        extra = (totals[arm] - totals["direct"]) / calls * 1000
        print(f"{arm:12s} {totals[arm]:8.2f} s  {totals[arm] / totals['direct']:.4f}x direct  {extra:+7.2f} ms per call  identical tokens {exact[arm]}/{calls}")


if __name__ == "__main__":
    main()
