"""A server of your own around ngspec's batch: requests arrive from other threads (here one thread
stands in for the clients, a prompt every --every seconds), the model decodes them together on
the thread that loaded it, each in a free row as it comes, and every answer is handed back as it
finishes. `ngspec serve` batches the same way behind an OpenAI-style HTTP API.

    python examples/own_server.py                                  # the default model, examples/prompts.jsonl
    python examples/own_server.py --model DIR --drafter search --batch-size 4 --every 0.5

Prints one JSON line per answer as it finishes (the record of `ngspec generate --json`, with the
request's index); the tokens are those plain greedy decoding gives each prompt alone.
"""

from __future__ import annotations

import argparse
import json
import queue
import sys
import threading
import time
from pathlib import Path

from ngspec import NgspecError, Speculator
from ngspec.batch import BatchConfig
from ngspec.decode import DecodeConfig


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="default", help="a model ngspec loads (default: the bundled SmolLM2-135M-Instruct)")
    parser.add_argument("--drafter", default="trie")
    parser.add_argument("--batch-size", type=int, default=4, help="rows decoded together")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--every", type=float, default=0.2, help="seconds between two arrivals")
    parser.add_argument("--prompts", type=Path, default=Path(__file__).with_name("prompts.jsonl"), help='a .jsonl of {"prompt": ...}')
    args = parser.parse_args()
    try:
        lines = args.prompts.read_text().splitlines()
    except OSError as exc:
        print(f"error: cannot read {args.prompts}: {exc.strerror}", file=sys.stderr)
        return 1
    try:
        prompts = [json.loads(line)["prompt"] for line in lines if line.strip()]
    except (ValueError, KeyError, TypeError) as exc:
        print(f'error: {args.prompts}: each line must be a JSON object with a "prompt" ({exc!r})', file=sys.stderr)
        return 1
    try:
        spec = Speculator.load(args.model, drafter=args.drafter)  # load, and decode, on this thread
        batch = BatchConfig(args.batch_size)
    except NgspecError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1

    inbox: queue.Queue = queue.Queue()  # (index, prompt) from the clients; None: no more will come

    def clients() -> None:
        for index, prompt in enumerate(prompts):
            inbox.put((index, prompt))
            time.sleep(args.every)
        inbox.put(None)

    prompt_tokens: dict[int, int] = {}  # by index, for each answer's Output
    closed = False

    def take(first: tuple | None = None) -> list:
        """What arrived since the batch last asked, as requests ([] when nothing did)."""
        nonlocal closed
        arrived = [first] if first else []
        while not closed:
            try:
                item = inbox.get_nowait()
            except queue.Empty:
                break
            if item is None:
                closed = True
            else:
                arrived.append(item)
        requests = []
        for index, prompt in arrived:
            try:
                request = spec.request(index, prompt, args.max_new_tokens)  # its own settings: temperature=, stop=, on_text=, ...
            except NgspecError as exc:  # a prompt that cannot be one: answer it, keep serving
                print(json.dumps({"index": index, "error": str(exc)}), flush=True)
                continue
            prompt_tokens[index] = len(request.prompt)
            requests.append(request)
        return requests

    def on_finish(result) -> None:
        out = spec.output(result, prompt_tokens.pop(result.index))  # finish reason "error" for a prompt that could not run
        print(json.dumps({"index": result.index, **out.as_dict()}), flush=True)

    waiting: list = []  # requests made while no batch ran

    def feed() -> list:
        """Asked by the batch whenever a slot is free."""
        new = waiting + take()
        waiting.clear()
        return new

    threading.Thread(target=clients, daemon=True).start()
    while not closed:
        first = inbox.get()  # no row runs: wait for a request
        if first is None:
            break
        waiting.extend(take(first))
        # runs until no row is left and nothing arrived, asking feed() whenever a slot is free
        spec.run_batch([], DecodeConfig(), batch, on_finish, feed=feed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
