"""A random search over `ngspec serve`'s request bodies, on a real model, in process.

Each run posts a burst of 1-4 requests at once (so they share a batch) to `/v1/completions` and
`/v1/chat/completions`: fields OpenAI's API has, with valid values and, now and then, values of
the wrong type (null, lists, objects, 2^63, NaN, infinity), streamed or not. A request passes when

- it is answered 200, and its tokens are those of plain decoding of the same prompt with the same
  settings (`vanilla`, run on the server's model thread after the burst; a sampled answer is
  replayed with the seed it reports), or
- it is refused with a 400 and one line of OpenAI's error shape,

and the server still answers `/health` after the burst. Anything else (a 500, another status, a
message with a traceback, a time-out, differing tokens) is a finding, printed with its body.
A budget is capped at ``--max-tokens`` (a larger one is valid: it runs to the context window).

    python benchmarks/serve_fuzz.py --runs 200 --first 0 --out bench-out/serve_fuzz

Runs are fixed by their number, so `--first N` continues a search past runs made before. The
first search (BENCHMARKS.md 10zzh) found a server that timed its verify costs again for every
burst where the timing could not be cached.

``--keep-alive``: each client keeps one connection for all its requests, as http.client and
httpx (under OpenAI's SDK) do, and now and then sends a request the server refuses before
reading its body (`FRAMINGS`: no such route, a body over the limit, a chunked body, a length
that is negative or not a number, a body that is not JSON) on it first. Each must get its
refusal, and the request after it its own answer: a server that read the left-over body as the
next request answered that one with an HTML 400 (BENCHMARKS.md 10zzzl).

``--origins``: the server lets the pages of one origin call it (`serve --allowed-origins`), and
each request comes from that origin, another one or none (a browser's `Origin` header), now and
then after the browser's preflight (`OPTIONS`). An answer to the allowed origin must name it in
`Access-Control-Allow-Origin` and no other answer may name any; the preflight must get 204 for
the allowed origin and 403 for another (BENCHMARKS.md 10zzzm).
"""

from __future__ import annotations

import argparse
import http.client
import json
import random
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import urlparse

from input_fuzz import PYTHON_WORDS  # the script beside this one
from ngspec.server import MAX_BODY

WEIRD = [None, True, 0, -1, 2.5, 2**63, "", "x", [], [1], {}, {"a": 1}, [None], float("nan"), float("inf")]
CHAT = [
    [{"role": "user", "content": "Say hi."}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Count to 5, separated by commas."}],
    [{"role": "user", "content": [{"type": "text", "text": "Repeat: the cat sat on the mat."}]}],
    [{"role": "user", "content": "猫は🐱です。Translate."}],
    [{"role": "user", "content": "Name a fruit."}, {"role": "assistant", "content": "Apple."}, {"role": "user", "content": "Another?"}],
]
PROMPTS = ["Say hi.", "Repeat: a b c a b c a b c", "def add(a, b):\n    return a + b\n\ndef sub(a, b):", "Count from 1 to 20:", [1, 2, 3, 4], ["Say hi.", "Count to 3."]]
FIELDS = {
    "max_tokens": [1, 4, 8, 16, 32], "max_completion_tokens": [3, 8], "temperature": [0, 0.7],
    "top_p": [0.5, 0.9, 1.0], "top_k": [0, 1, 5, 50], "seed": [0, 7, 12345], "stop": ["\n", [",", "."], "hi", ["5"] * 5],
    "n": [1, 1, 1, 2], "model": ["ngspec", "other"], "logprobs": [None, False, False, True], "user": ["u"],
    "presence_penalty": [0, 0, 0.5], "frequency_penalty": [0], "stream_options": [{"include_usage": True}, None],
    "echo": [False, False, True], "response_format": [{"type": "text"}],
}


ALLOWED = "http://allowed.example:3000"  # --origins: the page origin the server lets in
ORIGINS = [None, None, ALLOWED, "http://other.example"]

_BODY = b'{"prompt": "Say hi.", "max_tokens": 2}'
# (route, headers, body sent, the status it must get): each refused, most before the body is read
FRAMINGS = [
    ("/v1/bogus", {"Content-Length": str(len(_BODY))}, _BODY, 404),
    ("/v1/completions", {"Content-Length": str(MAX_BODY + 1)}, _BODY, 413),
    ("/v1/completions", {"Transfer-Encoding": "chunked"}, b"%x\r\n%s\r\n0\r\n\r\n" % (len(_BODY), _BODY), 411),
    ("/v1/completions", {"Content-Length": "-5"}, b"", 400),
    ("/v1/completions", {"Content-Length": "ten"}, _BODY, 400),
    ("/v1/chat/completions", {"Content-Length": "8"}, b"not json", 400),
]


def draw(rng: random.Random) -> tuple[str, dict]:
    """One request: its route and body."""
    chat = rng.random() < 0.5
    body: dict = {"messages": rng.choice(CHAT)} if chat else {"prompt": rng.choice(PROMPTS)}
    if rng.random() < 0.3:
        body["stream"] = True
    if rng.random() < 0.3:
        body["temperature"] = rng.choice([0.7, 1.0, 2.0])
    for name in rng.sample(sorted(FIELDS), rng.randrange(0, 5)):
        body[name] = rng.choice(FIELDS[name]) if rng.random() < 0.85 else rng.choice(WEIRD)
    if rng.random() < 0.1:  # the prompt or the messages themselves of the wrong kind
        body["messages" if chat else "prompt"] = rng.choice(WEIRD)
    body.setdefault("max_tokens", rng.choice([8, 16]))
    return ("/v1/chat/completions" if chat else "/v1/completions"), body


def capped(body: dict, cap: int) -> dict:
    """Budgets above ``cap`` lowered to it (valid, but they run to the context window)."""
    out = dict(body)
    for name in ("max_tokens", "max_completion_tokens"):
        value = out.get(name)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value > cap:
            out[name] = cap
    return out


def post(url: str, path: str, body: dict | None, timeout: float, origin: str | None = None) -> tuple[int, str, str, str | None]:
    """(status, content type, text, the Access-Control-Allow-Origin answered); a GET without a
    body; ``origin``: the browser page's, sent as `Origin`."""
    data = None if body is None else json.dumps(body, allow_nan=True).encode()
    headers = {"Content-Type": "application/json", **({"Origin": origin} if origin else {})}
    request = urllib.request.Request(url + path, data=data, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.headers.get("Content-Type", ""), response.read().decode(), response.headers.get("Access-Control-Allow-Origin")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("Content-Type", ""), exc.read().decode(), exc.headers.get("Access-Control-Allow-Origin")


def preflight(url: str, path: str, origin: str, timeout: float) -> None:
    """A browser's preflight for a POST from ``origin``: raises unless the allowed origin gets 204
    naming it and another gets 403 naming none."""
    where = urlparse(url)
    connection = http.client.HTTPConnection(where.hostname, where.port, timeout=timeout)
    try:
        connection.request("OPTIONS", path, headers={"Origin": origin, "Access-Control-Request-Method": "POST",
                                                     "Access-Control-Request-Headers": "content-type"})
        response = connection.getresponse()
        response.read()
        named = response.getheader("Access-Control-Allow-Origin")
        want = (204, origin) if origin == ALLOWED else (403, None)
        if (response.status, named) != want:
            raise ValueError(f"the preflight from {origin} got {response.status} naming {named!r}, not {want[0]} naming {want[1]!r}")
    finally:
        connection.close()


_kept = threading.local()  # --keep-alive: each client thread's connection


def post_kept(url: str, path: str, body: dict | None, timeout: float, framing: int | None, origin: str | None = None) -> tuple[int, str, str, str | None]:
    """`post` on this thread's kept connection (http.client opens a fresh one where the server
    closed it), after the refused request ``FRAMINGS[framing]`` when one is given; a wrong
    answer to that one raises."""
    if getattr(_kept, "connection", None) is None:
        where = urlparse(url)
        _kept.connection = http.client.HTTPConnection(where.hostname, where.port, timeout=timeout)
    connection = _kept.connection
    if framing is not None:
        route, headers, sent, status = FRAMINGS[framing]
        connection.putrequest("POST", route)
        for name, value in headers.items():
            connection.putheader(name, value)
        connection.endheaders(sent)
        response = connection.getresponse()
        text = response.read().decode()
        if response.status != status or judge(400, "application/json", text)[0] != "refused":
            raise ValueError(f"the refused request {route} {headers} got {response.status}: {text[:200]!r}")
    data = None if body is None else json.dumps(body, allow_nan=True).encode()
    connection.request("GET" if body is None else "POST", path, data, {"Content-Type": "application/json", **({"Origin": origin} if origin else {})})
    response = connection.getresponse()
    return response.status, response.getheader("Content-Type", ""), response.read().decode(), response.getheader("Access-Control-Allow-Origin")


def ask(url: str, path: str, body: dict, timeout: float, framing: int | None, origin: str | None, first_preflight: bool, keep_alive: bool):
    """One client's request of a burst: its preflight first where drawn, then `post` or `post_kept`."""
    if first_preflight:
        preflight(url, path, origin, timeout)
    if keep_alive:
        return post_kept(url, path, body, timeout, framing, origin)
    return post(url, path, body, timeout, origin)


def cors_finding(origin: str | None, named: str | None) -> str | None:
    """What is wrong with the `Access-Control-Allow-Origin` an answer named (None: nothing): the
    allowed origin's page must be named, no other may be."""
    want = origin if origin == ALLOWED else None
    return None if named == want else f"Access-Control-Allow-Origin {named!r} for a request from {origin!r} (want {want!r})"


def answers(kind: str, text: str) -> list[dict]:
    """The JSON body, or a stream's events (the last one carries the token ids)."""
    if kind.startswith("text/event-stream"):
        events = [line.removeprefix("data: ") for line in text.split("\n\n") if line]
        if not events or events[-1] != "[DONE]":
            raise ValueError("a stream that does not end with [DONE]")
        return [json.loads(e) for e in events[:-1]]
    return [json.loads(text)]


def judge(status: int, kind: str, text: str) -> tuple[str, str]:
    """("ok" | "refused" | "FINDING", detail) of one answer, before its tokens are replayed."""
    try:
        events = answers(kind, text)
    except ValueError as exc:
        return "FINDING", f"status {status}, unreadable answer ({exc}): {text[:200]!r}"
    if status == 200:
        last = events[-1]
        if not all("token_ids" in c for c in last.get("choices", [])) or not last.get("choices"):
            return "FINDING", f"200 without token ids: {text[:200]!r}"
        return "ok", f"{len(last['choices'])} choice(s)"
    if status == 400:
        message = events[0].get("error", {}).get("message") if isinstance(events[0], dict) else None
        if not isinstance(message, str) or not message or "Traceback" in message or "\n" in message:
            return "FINDING", f"400 without one clear line: {text[:300]!r}"
        if PYTHON_WORDS.search(message):
            return "FINDING", f"400 in Python's words: {message}"
        return "refused", message
    return "FINDING", f"status {status}: {text[:300]!r}"


def replay(vanilla, path: str, body: dict, answer: dict) -> str | None:
    """None when plain decoding gives the answer's tokens, else what differs. Runs on the
    server's model thread."""
    from ngspec.server import chat_messages, completion_prompts, generation_kwargs

    kwargs = generation_kwargs(body, 256)
    chat = path.endswith("chat/completions")
    prompts = [chat_messages(body)] if chat else completion_prompts(body)
    choices = answer["choices"]
    for i, (prompt, choice) in enumerate(zip(prompts, choices)):
        stats = choice.get("ngspec") or answer.get("ngspec") or {}
        seed = kwargs["seed"] if kwargs["seed"] is not None else stats.get("seed")
        want = vanilla.generate(prompt, raw=not chat, **{**kwargs, "seed": seed}).token_ids
        if choice["token_ids"] != want:
            return f"choice {i}: {choice['token_ids']} against plain decoding's {want}"
    return None if len(prompts) == len(choices) else f"{len(choices)} choices for {len(prompts)} prompts"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=100, help="bursts of requests")
    ap.add_argument("--first", type=int, default=0, help="number of the first run")
    ap.add_argument("--model", default="default")
    ap.add_argument("--drafter", default="trie")
    ap.add_argument("--batch-size", type=int, default=4, help="the server's --batch-size")
    ap.add_argument("--max-tokens", type=int, default=32, help="budgets above this are lowered to it")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds an answer may take")
    ap.add_argument("--out", type=Path, help="folder for runs-FIRST.jsonl (one line per request)")
    ap.add_argument("--keep-alive", action="store_true", help="each client keeps its connection, and sends refused requests on it now and then")
    ap.add_argument("--origins", action="store_true", help=f"the server lets {ALLOWED} call it (CORS); requests come from it, another origin or none, now and then (one in two) after a preflight")
    args = ap.parse_args()
    if args.runs < 1 or args.batch_size < 1 or args.max_tokens < 1:
        ap.error("--runs, --batch-size and --max-tokens must be at least 1")

    import warnings

    from ngspec import Speculator
    from ngspec.server import make_server, serve

    warnings.filterwarnings("ignore", message="ngspec. this Speculator runs on a thread other")
    spec = Speculator.load(args.model, drafter=args.drafter)
    vanilla = Speculator.from_model(spec.engine.loaded.model, spec.engine.loaded.tokenizer, "vanilla")
    server = make_server(spec, port=0, batch_size=args.batch_size, allowed_origins=ALLOWED if args.origins else None)
    thread = threading.Thread(target=serve, args=(server,), daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    log = None
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        log = (args.out / f"runs-{args.first}.jsonl").open("a")
    counts: dict[str, int] = {}
    findings = 0
    with ThreadPoolExecutor(max_workers=4) as clients:
        for run in range(args.first, args.first + args.runs):
            rng = random.Random(run)
            burst = [draw(rng) for _ in range(rng.choice([1, 1, 2, 3, 4]))]
            burst = [(path, capped(body, args.max_tokens)) for path, body in burst]
            start = time.perf_counter()
            framings = [rng.randrange(len(FRAMINGS)) if args.keep_alive and rng.random() < 0.3 else None for _ in burst]
            origins = [rng.choice(ORIGINS) for _ in burst] if args.origins else [None] * len(burst)  # drawn only with --origins: runs stay as they were
            preflights = [o is not None and rng.random() < 0.5 for o in origins] if args.origins else [False] * len(burst)
            posted = [clients.submit(ask, url, path, body, args.timeout, f, o, pre, args.keep_alive)
                      for (path, body), f, o, pre in zip(burst, framings, origins, preflights)]
            for (path, body), future, framing, origin, pre in zip(burst, posted, framings, origins, preflights):
                try:
                    status, kind, text, named = future.result()
                    verdict, detail = judge(status, kind, text)
                    if args.origins and (wrong := cors_finding(origin, named)) is not None:
                        verdict, detail = "FINDING", wrong
                except Exception as exc:  # a time-out, a dropped connection, a wrong preflight
                    verdict, detail = "FINDING", f"{type(exc).__name__}: {exc}"
                if verdict == "ok":
                    answer = answers(kind, text)[-1]
                    differs = server.service.worker.submit(lambda: replay(vanilla, path, body, answer)).result()
                    if differs is not None:
                        verdict, detail = "FINDING", differs
                counts[verdict] = counts.get(verdict, 0) + 1
                findings += verdict == "FINDING"
                line = {"run": run, "verdict": verdict, "detail": detail, "path": path, "body": body, "burst": len(burst)}
                if framing is not None:
                    line["after_refused"] = FRAMINGS[framing][0] + " " + json.dumps(FRAMINGS[framing][1])
                if origin is not None:
                    line["origin"] = origin
                    line["preflight"] = pre
                if log is not None:
                    log.write(json.dumps(line, allow_nan=True) + "\n")
                    log.flush()
                if verdict == "FINDING":
                    after = f" (after {line['after_refused']})" if framing is not None else ""
                    print(f"FINDING run {run}: {path} {json.dumps(body, allow_nan=True)}{after}\n  {detail}", flush=True)
            health = post(url, "/health", None, 30.0)[0]
            print(f"{run:5d} {len(burst)} request(s) {time.perf_counter() - start:6.1f}s health {health}", flush=True)
            if health != 200:
                print(f"FINDING run {run}: the server stopped answering /health ({health})", flush=True)
                findings += 1
                break
    server.service.worker.stop()
    thread.join(timeout=30)
    print(json.dumps({**counts, "findings": findings}))
    raise SystemExit(1 if findings else 0)


if __name__ == "__main__":
    main()
