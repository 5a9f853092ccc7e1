"""`ngspec serve` over many requests: does its memory stay flat, and does every answer stay the same?

    python benchmarks/serve_soak.py --questions ../shared/data/spec_bench/question.jsonl \
        --limit 40 -n 48 --requests 400 --clients 4 --batch-size 4 -d trie --every 20

The model is loaded and run on the main thread, as in `ngspec serve`; ``--clients`` threads send
chat completions (greedy) round the prompts again and again until ``--requests`` have been
answered. Every answer to a prompt must have the first answer's tokens (greedy decoding is
deterministic, batched or not); any that differs, or a request that fails, is counted and makes
the exit code 1. After every ``--every`` answers it records the process's resident memory, then
again after glibc hands its free arenas back (``malloc_trim``, where there is glibc), and at the
end prints the growth of both over the second half in MB per 100 requests (while the batch
runs: the sample after the last answer is kept but not fitted), and writes all of it as JSON
(``--out``).
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import threading
import time
import urllib.request
from pathlib import Path

from ngspec.perf.memory import release_free_memory, resident_gb

def trimmed_gb() -> float | None:
    """Resident memory once free heap pages are back with the OS (None without glibc or /proc)."""
    return resident_gb() if release_free_memory() else None


def ask(url: str, text: str, max_tokens: int) -> list[int]:
    body = {"messages": [{"role": "user", "content": text}], "max_tokens": max_tokens}
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=600) as response:
        return json.loads(response.read())["choices"][0]["token_ids"]


def growth_per_100(samples: list[dict], key: str) -> float | None:
    """Least-squares slope of ``key`` (GB) against requests over the second half of the samples,
    in MB per 100 requests. The final sample is left out: the last answer ends the batch, whose
    cache is then freed."""
    kept = [s for s in samples if not s.get("final")]
    half = [s for s in kept[len(kept) // 2 :] if s[key] is not None]
    if len(half) < 2:
        return None
    xs, ys = [s["requests"] for s in half], [s[key] for s in half]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    var = sum((x - mx) ** 2 for x in xs)
    return None if var == 0 else sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / var * 1024 * 100


def soak(spec, prompts: list[str], requests: int, clients: int, batch_size: int, every: int, max_new_tokens: int, say=print) -> dict:
    """Serve ``spec`` on this thread while ``clients`` threads ask ``prompts`` round and round
    until ``requests`` are answered; the report (see the module's docstring)."""
    from ngspec.server import make_server, serve_while

    server = make_server(spec, port=0, batch_size=batch_size)
    url = f"http://127.0.0.1:{server.server_address[1]}/v1/chat/completions"
    lock = threading.Lock()
    state = {"sent": 0, "done": 0, "mismatches": 0, "errors": 0}
    first: dict[int, list[int]] = {}
    samples: list[dict] = []
    start = time.perf_counter()

    def client() -> None:
        while True:
            with lock:
                if state["sent"] >= requests:
                    return
                i = state["sent"] % len(prompts)
                state["sent"] += 1
            try:
                tokens = ask(url, prompts[i], max_new_tokens)
            except OSError as exc:  # HTTP errors included: counted, and the soak goes on
                with lock:
                    state["errors"] += 1
                say(f"request for prompt {i} failed: {exc}")
                tokens = None
            with lock:
                if tokens is not None and first.setdefault(i, tokens) != tokens:
                    state["mismatches"] += 1
                state["done"] += 1
                if state["done"] % every == 0 or state["done"] == requests:
                    sample = {"requests": state["done"], "seconds": round(time.perf_counter() - start, 1),
                              "rss_gb": resident_gb(), "trimmed_rss_gb": trimmed_gb(), "final": state["done"] == requests}
                    samples.append(sample)
                    shown = {k: "?" if sample[k] is None else f"{sample[k]:.3f}" for k in ("rss_gb", "trimmed_rss_gb")}
                    say(f"{sample['requests']:6d} requests {sample['seconds']:8.1f} s  resident {shown['rss_gb']} GB,"
                        f" trimmed {shown['trimmed_rss_gb']} GB  mismatches {state['mismatches']}")

    serve_while(server, *[client] * clients)  # generation on this thread until the clients are done
    return {
        "prompts": len(prompts), "requests": state["done"], "max_new_tokens": max_new_tokens, "clients": clients,
        "batch_size": batch_size, "mismatches": state["mismatches"], "errors": state["errors"],
        "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
        "growth_mb_per_100_requests": growth_per_100(samples, "rss_gb"),
        "trimmed_growth_mb_per_100_requests": growth_per_100(samples, "trimmed_rss_gb"), "samples": samples,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--questions", required=True, help="a question file (.jsonl; Spec-Bench or MT-bench style)")
    ap.add_argument("--category", help="only this category's questions")
    ap.add_argument("--limit", type=int, default=40, help="distinct prompts, asked round and round")
    ap.add_argument("-n", "--max-new-tokens", type=int, default=48)
    ap.add_argument("--requests", type=int, default=400)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--every", type=int, default=20, help="record memory after every this many answers")
    ap.add_argument("-d", "--drafter", default="trie")
    ap.add_argument("--model", default="default")
    ap.add_argument("--eagle-head")
    ap.add_argument("--datastore")
    ap.add_argument("--out", type=Path, help="write the samples and figures as JSON here")
    args = ap.parse_args()
    if min(args.requests, args.clients, args.batch_size, args.every, args.limit) < 1:
        ap.error("--requests, --clients, --batch-size, --every and --limit must be at least 1")

    from ngspec import Speculator
    from ngspec.prompts import load_prompts

    options = {k: v for k, v in (("eagle_head", args.eagle_head), ("datastore", args.datastore)) if v}
    spec = Speculator.load(args.model, drafter=args.drafter, **options)
    prompts = [p.text for p in load_prompts(args.questions, args.category, args.limit)]
    report = {"drafter": args.drafter, "model": args.model, **soak(spec, prompts, args.requests, args.clients, args.batch_size,
                                                                   args.every, args.max_new_tokens, lambda line: print(line, flush=True))}
    shown = {k: "?" if report[k] is None else f"{report[k]:+.1f}" for k in ("growth_mb_per_100_requests", "trimmed_growth_mb_per_100_requests")}
    print(f"{report['requests']} requests over {len(prompts)} prompts, {report['mismatches']} answers unlike the prompt's first,"
          f" {report['errors']} failed; second half: resident {shown['growth_mb_per_100_requests']} MB,"
          f" trimmed {shown['trimmed_growth_mb_per_100_requests']} MB per 100 requests; peak {report['peak_rss_gb']:.2f} GB")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1) + "\n")
    return 1 if report["mismatches"] or report["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
