"""`ngspec serve`: an OpenAI-compatible HTTP endpoint over one `Speculator` (standard library only).

Routes: ``GET /health``, ``GET /v1/models``, ``POST /v1/completions`` (a prompt as text, fed raw,
or token ids; a list of prompts is decoded as one batch) and ``POST /v1/chat/completions``
(messages through the chat template), each with ``"stream": true`` for server-sent events.

The model runs on one thread, the one that loaded it (`Worker`, `serve`); HTTP threads only parse
and answer. Requests that arrive while others are decoded join their batch at the next step
(`Service._run_batch`, through `generate_batch`'s ``feed``), each with its own budget, sampling,
stops and stream. As in OpenAI's API, the text of an answer that ends at a stop string ends just
before it (its ``token_ids`` keep every generated token), and a stream holds back the characters
a stop string could still start in (`HeldText`). Greedy (``temperature`` 0, the default here) is
token-identical to plain decoding; ``temperature`` > 0 samples, token-identical to plain sampling
with the request's ``seed`` (so identical in distribution). Every
response carries an ``ngspec`` object (tokens per call, speed, drafting share) and the choices'
``token_ids``. Bad requests get HTTP 400 with OpenAI's error shape and one readable message.
"""

from __future__ import annotations

import contextlib
import hmac
import itertools
import json
import queue
import re
import socket
import threading
import time
import uuid
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any, Callable

from ngspec.errors import NgspecError, out_of_memory, short
from ngspec.prompts import check_messages, joined_parts

if TYPE_CHECKING:
    from ngspec.api import Output, Speculator

# OpenAI request fields that would change the output: refused unless left out, null or at one of
# these neutral values; fields that do not (user, metadata, stream_options, ...) are ignored
NEUTRAL = {
    "n": (1,), "best_of": (1,), "frequency_penalty": (0,), "presence_penalty": (0,), "logprobs": (False,),
    "top_logprobs": (0,), "echo": (False,), "suffix": ("",), "logit_bias": ({},), "tools": ([],),
    "response_format": ({"type": "text"},),
}
FINISH = {"eos": "stop", "stop": "stop", "length": "length", "context": "length", "cancelled": "stop"}
MAX_BODY = 64 * 2**20
ORIGIN = re.compile(r"[a-z][a-z0-9+.-]*://[^/?#\s]+")  # scheme://host[:port], as a browser's Origin header writes it


def parse_origins(value: str | None) -> frozenset[str] | None:
    """`serve --allowed-origins`: the web pages' origins that may call the server from a browser
    (CORS), comma-separated (``http://localhost:3000``), ``null`` for a page opened from a file, or
    ``*`` for any; None: none (no CORS answers at all). Compared as browsers write them, in lower
    case; one with a path or a trailing slash would never match, so it is refused."""
    if value is None:
        return None
    origins = [o.strip().lower() for o in value.split(",") if o.strip()]
    if not origins:
        raise NgspecError("--allowed-origins is empty: give the origins of the pages that may call the server (http://localhost:3000), or * for any")
    for origin in origins:
        if origin not in ("*", "null") and not ORIGIN.fullmatch(origin):
            raise NgspecError(
                f"--allowed-origins: {origin!r} is not an origin: give scheme://host[:port] with no path or trailing slash, "
                "as a browser sends it (http://localhost:3000), null for a page opened from a file, or * for any"
            )
    return frozenset(origins)


class BadRequest(NgspecError):
    """A request the server refuses (HTTP 400 or the given status)."""

    def __init__(self, message: str, status: HTTPStatus = HTTPStatus.BAD_REQUEST) -> None:
        super().__init__(message)
        self.status = status


STOPPING = BadRequest("the server is stopping", HTTPStatus.SERVICE_UNAVAILABLE)
_WAKE = object()  # put on a worker's queue so that a `run` waiting on it looks again (`Worker.drain`)


def before_stop(text: str, stops) -> str:
    """``text`` up to the first place a stop string starts (all of it when none does): OpenAI's
    answers leave the stop string out, and the text after it that its last token brought."""
    starts = [i for i in (text.find(s) for s in stops) if i >= 0]
    return text[: min(starts)] if starts else text


class HeldText:
    """A stream's text without its stop strings: characters go out only once no stop string can
    still start among them (the last ``longest stop - 1`` characters wait for more text), and
    never past a stop string. `finish`, with the answer's text, sends what was held back."""

    def __init__(self, stops, send: Callable[[str], None]) -> None:
        self.stops = tuple(stops)
        self.wait = max((len(s) for s in self.stops), default=1) - 1
        self.send = send
        self.text = ""
        self.sent = 0

    def __call__(self, piece: str) -> None:
        self.text += piece
        self._send_up_to(min(len(self.text) - self.wait, len(before_stop(self.text, self.stops))))

    def finish(self, text: str) -> None:
        self.text = text
        self._send_up_to(len(before_stop(text, self.stops)))

    def _send_up_to(self, end: int) -> None:
        if end > self.sent:
            self.send(self.text[self.sent : end])
            self.sent = end


class ClientGone(Exception):
    """A streaming client left: its generation stops (one request at a time, `--batch-size 1`)."""


def _number(body: dict, name: str, default, kind: type, low=None, high=None):
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and not float(value).is_integer()):
        raise BadRequest(f"'{name}' must be {'an integer' if kind is int else 'a number'}, not {short(value)}")
    value = kind(value)
    if (low is not None and not value >= low) or (high is not None and not value <= high):  # NaN is in no range
        raise BadRequest(f"'{name}' must be in [{low}, {high if high is not None else 'inf'}], not {short(value)}")
    return value


def generation_kwargs(body: dict, max_tokens_default: int) -> dict[str, Any]:
    """The `Speculator.generate` keyword arguments of an OpenAI request body."""
    for name, neutral in NEUTRAL.items():
        value = body.get(name)
        if value is not None and value not in neutral:
            raise BadRequest(f"'{name}' is not supported (leave it out, or {short(neutral[0])})")
    stop = body.get("stop")
    if isinstance(stop, str):
        stop = [stop]
    if stop is not None and not (isinstance(stop, list) and all(isinstance(s, str) and s for s in stop)):
        raise BadRequest("'stop' must be a string or a list of non-empty strings")
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    return {
        "max_new_tokens": _number({"max_tokens": max_tokens}, "max_tokens", max_tokens_default, int, 1),
        "temperature": _number(body, "temperature", 0.0, float, 0.0, 2.0),
        "top_p": _number(body, "top_p", 1.0, float, 0.0, 1.0),
        "top_k": _number(body, "top_k", 0, int, 0),
        "seed": _number(body, "seed", None, int, 0, 2**63 - 1),
        "stop": stop or (),
    }


def _is_ids(prompt) -> bool:
    return isinstance(prompt, list) and bool(prompt) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)


def completion_prompts(body: dict) -> list:
    """A completions request's prompts: one string or token-id list, or a list of them."""
    prompt = body.get("prompt")
    if (isinstance(prompt, str) and prompt) or _is_ids(prompt):
        return [prompt]
    if isinstance(prompt, list) and prompt and all((isinstance(p, str) and p) or _is_ids(p) for p in prompt):
        return prompt
    raise BadRequest("'prompt' must be a non-empty string, a list of token ids, or a list of those")


def chat_messages(body: dict) -> list[dict]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("'messages' must be a non-empty list of {\"role\": ..., \"content\": ...}")
    try:
        out = joined_parts(messages)  # content parts: only text parts can be fed to a text model
        check_messages(out)
    except NgspecError as exc:
        raise BadRequest(str(exc)) from None
    return [{"role": m["role"], "content": m["content"]} for m in out]


def usage(prompt_tokens: int, new_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": new_tokens, "total_tokens": prompt_tokens + new_tokens}


def ngspec_stats(out: Output, drafter: str) -> dict:
    return {
        "drafter": drafter,
        "mean_tokens_per_call": out.mean_tokens_per_call,
        "verify_calls": out.verify_calls,
        "tokens_per_second": out.tokens_per_second,
        "seconds": out.seconds,
        "draft_share": out.draft_share,
        "prefill_share": out.prefill_share,
        "finish_reason": out.finish_reason,
        **({"seed": out.seed} if out.seed is not None else {}),  # sampled: the seed that replays it
        **({"others_cpu_share": out.others_cpu_share} if out.others_cpu_share is not None else {}),  # busy beside other work?
    }


@dataclass
class Pending:
    """A one-prompt request waiting for the generation thread, to join the running batch."""

    prompt: Any
    raw: bool
    kwargs: dict
    on_text: Callable[[str], None] | None = None
    gone: Callable[[], bool] | None = None  # the streaming client left: its row stops
    future: Future = field(default_factory=Future)


class Worker:
    """Runs submitted work, one item at a time, on the thread that calls `run`; `Pending`
    requests go to ``batch`` (with `arrived`, to take those that come while it runs).

    `ngspec serve` runs it on the thread that loaded the model, and HTTP on other threads: on a
    CPU, torch from a second thread starts a second OpenMP team, and with more OpenMP threads
    than cores libgomp stops letting idle workers spin, which made decoding about 1.4x slower on
    two cores, on both threads (BENCHMARKS.md 10z)."""

    def __init__(self, batch: Callable[[Pending, Callable[[], list[Pending]]], None] | None = None) -> None:
        self._queue: queue.Queue = queue.Queue()
        self._deferred: deque = deque()  # work that came while a batch ran, in order
        self._batch = batch
        self.draining = False  # `drain` was called: `run` returns once the queue is empty

    def submit(self, work: Callable) -> Future:
        future: Future = Future()
        self._queue.put((work, future))
        return future

    def join_batch(self, pending: Pending) -> Future:
        self._queue.put(pending)
        return pending.future

    def arrived(self) -> list[Pending]:
        """The requests queued since the last call (without waiting); other work waits for the
        batch to end."""
        out = []
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return out
            if item is not _WAKE:
                (out if isinstance(item, Pending) else self._deferred).append(item)

    def run(self) -> None:
        """Until `stop`, or once `drain` was called and nothing is left; a KeyboardInterrupt
        (Ctrl-C, or SIGTERM in `ngspec serve`) ends it too. Work still queued when it ends is
        answered "the server is stopping"."""
        try:
            self._run()
        finally:
            self.refuse_waiting()

    def _next(self):
        """The next item, in order: None to stop (`stop`, or drained)."""
        while True:
            if self._deferred:
                return self._deferred.popleft()
            try:
                item = self._queue.get_nowait() if self.draining else self._queue.get()
            except queue.Empty:
                return None
            if item is not _WAKE:
                return item

    def _run(self) -> None:
        while (item := self._next()) is not None:
            if isinstance(item, Pending):
                self._batch(item, self.arrived)
                continue
            work, future = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(work())
            except Exception as exc:
                future.set_exception(exc)
            except BaseException:  # interrupted mid-generation: fail the request, then stop
                future.set_exception(STOPPING)
                raise

    def stop(self) -> None:
        self._queue.put(None)

    def drain(self) -> None:
        """Finish the work queued so far (and what joins the running batch), then let `run`
        return; `Service` refuses new requests meanwhile."""
        self.draining = True
        self._queue.put(_WAKE)  # a `run` waiting on the empty queue looks again

    def refuse_waiting(self) -> None:
        """Answer the work still queued "the server is stopping" (none waits for ever)."""
        left = list(self._deferred)
        self._deferred.clear()
        with contextlib.suppress(queue.Empty):
            while True:
                left.append(self._queue.get_nowait())
        for item in left:
            future = item.future if isinstance(item, Pending) else item[1] if isinstance(item, tuple) else None
            if future is not None and future.set_running_or_notify_cancel():
                future.set_exception(STOPPING)


class Service:
    """What the HTTP handler calls: requests in, response bodies (or event chunks) out. With
    ``batch_size`` > 1, concurrent one-prompt requests are decoded together, each joining the
    running batch at its next step (a slot freed by a finished request, or a new row)."""

    def __init__(self, spec: Speculator, max_tokens_default: int = 256, batch_size: int = 8) -> None:
        self.worker = Worker(self._run_batch)
        self.spec = spec
        self.max_tokens_default = max_tokens_default
        self.batch_size = batch_size
        self.model_id = spec.engine.loaded.name
        self.in_flight = 0  # requests taken and not yet answered (`complete` calls running)
        self._counting = threading.Lock()

    @property
    def draining(self) -> bool:
        return self.worker.draining

    def drain(self) -> None:
        """Stop taking requests (new ones get 503) and end serving once those taken are answered."""
        self.worker.drain()

    def _run_batch(self, first: Pending, arrived: Callable[[], list[Pending]]) -> None:
        """On the generation thread: decode ``first`` and every request that arrives while rows
        remain, as one batch; each request's future gets its Output (or its error)."""
        from ngspec.batch import BatchConfig
        from ngspec.cli.common import decode_config, sampling_config

        joined: dict[int, tuple[Pending, int]] = {}  # request index: (its pending, prompt tokens)
        first_ones, indices = [first], itertools.count()

        def feed() -> list:
            pendings = first_ones + arrived()
            first_ones.clear()
            requests = []
            for p in pendings:
                if not p.future.set_running_or_notify_cancel():
                    continue
                index = next(indices)
                try:
                    request = self.spec.request(index, p.prompt, raw=p.raw, on_text=p.on_text, cancelled=p.gone, **p.kwargs)
                except NgspecError as exc:
                    p.future.set_exception(BadRequest(str(exc)))
                    continue
                joined[index] = (p, len(request.prompt))
                requests.append(request)
            return requests

        def finished(result) -> None:
            pending, prompt_tokens = joined[result.index]
            if result.error is not None:
                pending.future.set_exception(BadRequest(result.error))
                return
            pending.future.set_result(self.spec.output(result.generation, prompt_tokens))

        cfg = decode_config(self.max_tokens_default, sampling_config(0.0, 1.0, 0, None), None)  # each request brings its own
        try:
            self.spec.run_batch([], cfg, BatchConfig(self.batch_size), finished, feed)
        except BaseException as exc:  # a bug or an interrupt: no request waits for ever
            for pending, _ in joined.values():
                if not pending.future.done():
                    pending.future.set_exception(exc if isinstance(exc, Exception) else STOPPING)
            if not isinstance(exc, Exception):
                raise

    def models(self) -> dict:
        return {"object": "list", "data": [{"id": self.model_id, "object": "model", "created": 0, "owned_by": "ngspec"}]}

    def complete(self, body: dict, chat: bool, emit: Callable[[dict], None] | None = None, gone: Callable[[], bool] | None = None) -> dict | None:
        """The response body, or with ``emit`` (streaming) each chunk handed to it and None;
        ``gone``: whether the streaming client has left (its batch row then stops)."""
        with self._counting:
            self.in_flight += 1
        try:
            return self._complete(body, chat, emit, gone)
        finally:
            with self._counting:
                self.in_flight -= 1

    def _complete(self, body: dict, chat: bool, emit, gone) -> dict | None:
        kwargs = generation_kwargs(body, self.max_tokens_default)
        if chat:
            prompt, raw = chat_messages(body), False
        else:
            prompts, raw = completion_prompts(body), True
            if len(prompts) > 1:
                if emit is not None:
                    raise BadRequest("'stream' takes one prompt per request")
                return self._batch(prompts, kwargs)
            prompt = prompts[0]
        kind = "chat.completion" if chat else "text_completion"
        head = self._head(chat)

        def piece(text: str | None, finish: str | None, role: bool = False) -> dict:
            if chat:
                delta = {"role": "assistant"} if role else {}
                if text:
                    delta["content"] = text
                return {**head, "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
            return {**head, "object": "text_completion", "choices": [{"index": 0, "text": text or "", "finish_reason": finish}]}

        sent = []  # a chat stream opens with the assistant's role, sent with the first text

        def stream(text: str | None, finish: str | None = None) -> dict:
            chunk = piece(text, finish, role=chat and not sent)
            sent.append(chunk)
            return chunk

        stops = kwargs["stop"]
        held = None if emit is None else HeldText(stops, lambda text: emit(stream(text)))
        # nothing is sent before the prompt's checks (its length, the sampling settings)
        if self.batch_size > 1:  # a client that left ends its row at the next step
            out = self._wait(self.worker.join_batch(Pending(prompt, raw, kwargs, held, gone)))
        else:
            def on_text_alone(text: str) -> None:
                if gone is not None and gone():
                    raise ClientGone  # ends this request's generation
                held(text)

            work = lambda: self.spec.generate(prompt, raw=raw, on_text=held and on_text_alone, **kwargs)  # noqa: E731
            try:
                out = self._wait(self.worker.submit(work))
            except ClientGone:
                return None
        finish = FINISH[out.finish_reason]
        extra = {"usage": usage(out.prompt_tokens, out.new_tokens), "ngspec": ngspec_stats(out, self.spec.drafter)}
        text = out.text or ""
        if emit is not None:
            held.finish(text)
            last = stream(None, finish)
            last["choices"][0]["token_ids"] = out.token_ids
            emit({**last, **extra})
            return None
        text = before_stop(text, stops)
        choice = {"index": 0, "finish_reason": finish, "token_ids": out.token_ids}
        choice.update({"message": {"role": "assistant", "content": text}} if chat else {"text": text, "logprobs": None})
        return {**head, "object": kind, "choices": [choice], **extra}

    def _head(self, chat: bool) -> dict:
        """What every response and event of one request starts with."""
        return {"id": f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}", "created": int(time.time()), "model": self.model_id}

    @staticmethod
    def _wait(future: Future):
        """The generation thread's answer to one request."""
        try:
            return future.result()
        except BadRequest:
            raise
        except NgspecError as exc:  # a prompt longer than the context window, a bad sampling setting
            raise BadRequest(str(exc)) from exc

    def _batch(self, prompts: list, kwargs: dict) -> dict:
        """Several completions prompts, decoded together ``batch_size`` at a time."""
        outs = self._wait(self.worker.submit(lambda: self.spec.generate_batch(prompts, batch_size=self.batch_size, raw=True, **kwargs)))
        failed = [f"prompt {i}: {o.error}" for i, o in enumerate(outs) if o.error is not None]
        if failed:
            raise BadRequest("; ".join(failed))
        choices = [
            {"index": i, "text": before_stop(o.text or "", kwargs["stop"]), "logprobs": None, "finish_reason": FINISH[o.finish_reason], "token_ids": o.token_ids, "ngspec": ngspec_stats(o, self.spec.drafter)}
            for i, o in enumerate(outs)
        ]
        prompt_tokens, new_tokens, calls = (sum(getattr(o, f) for o in outs) for f in ("prompt_tokens", "new_tokens", "verify_calls"))
        return {
            **self._head(chat=False), "object": "text_completion",
            "choices": choices,
            "usage": usage(prompt_tokens, new_tokens),
            "ngspec": {"drafter": self.spec.drafter, "batch_size": min(self.batch_size, len(outs)), "mean_tokens_per_call": new_tokens / calls if calls else 0.0},
        }


class Handler(BaseHTTPRequestHandler):
    service: Service  # set on the class `make_server` builds
    protocol_version = "HTTP/1.1"
    log: Callable[[str], None] | None = None
    api_key: str | None = None  # asked of every request but /health when set
    origins: frozenset[str] | None = None  # web pages' origins a browser may let call (`parse_origins`)
    _body_read = False  # whether this request's body was read (`_admitted` starts each request)

    def setup(self) -> None:
        super().setup()
        # each response (headers, then the body or an event) goes out at once: with Nagle's
        # algorithm the second write waited for the client's delayed ACK, about 40 ms a request
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, format: str, *args) -> None:  # noqa: A002 (the base class's name)
        if self.log is not None:
            self.log(f"{self.address_string()} {format % args}")

    def _send(self, status: HTTPStatus, body: dict, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in {**self._cors(), **(headers or {})}.items():
            self.send_header(name, value)
        if self._body_unread():  # a refusal before the body was read: the rest of the stream is that body, not a request
            self.close_connection = True
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """http.server's own refusals (a method with no handler, a malformed request line, headers
        too long) in OpenAI's JSON shape, not its HTML page; the connection closes, as there."""
        self.log_error("code %d, message %s", code, message)
        self.close_connection = True
        self._error(HTTPStatus(code), message or self.responses.get(code, ("error",))[0])

    def _cors(self) -> dict[str, str]:
        """The headers that let a browser hand this answer to the page that asked: only for an
        origin `parse_origins` lets in."""
        origin = getattr(self, "headers", None) and self.headers.get("Origin")
        if self.origins is None or not origin or not ("*" in self.origins or origin.lower() in self.origins):
            return {}
        return {"Access-Control-Allow-Origin": origin, "Vary": "Origin"}

    def do_OPTIONS(self) -> None:  # noqa: N802 (http.server's name)
        """A browser's preflight before a page's cross-origin request: which methods and headers
        it may send. It carries no API key (the browser sends the key with the request itself)."""
        self._body_read = False
        if self.origins is None:
            self.send_error(HTTPStatus.NOT_IMPLEMENTED, "Unsupported method ('OPTIONS'): a browser's cross-origin preflight is "
                            "answered when serve runs with --allowed-origins naming the page's origin")
            return
        origin, allowed = self.headers.get("Origin"), self._cors()
        if not allowed:
            said = f"the origin {origin!r} is not one of serve's --allowed-origins" if origin else "a preflight (OPTIONS) needs an Origin header"
            self._error(HTTPStatus.FORBIDDEN, said)
            return
        self.send_response(HTTPStatus.NO_CONTENT)
        for name, value in allowed.items():
            self.send_header(name, value)
        self.send_header("Access-Control-Allow-Methods", "GET, HEAD, POST, OPTIONS")
        self.send_header("Access-Control-Allow-Headers", self.headers.get("Access-Control-Request-Headers") or "Authorization, Content-Type")
        self.send_header("Access-Control-Max-Age", "600")
        self.send_header("Content-Length", "0")
        if self._body_unread():
            self.close_connection = True
            self.send_header("Connection", "close")
        self.end_headers()

    def _body_unread(self) -> bool:
        headers = getattr(self, "headers", None)  # none yet where the request line itself was refused
        if headers is None or self._body_read:
            return False
        return (headers.get("Content-Length") or "").strip() not in ("", "0") or "Transfer-Encoding" in headers

    def _error(self, status: HTTPStatus, message: str, code: str | None = None, headers: dict[str, str] | None = None) -> None:
        kind = "invalid_request_error" if status < 500 else "server_error"
        self._send(status, {"error": {"message": message, "type": kind, "param": None, "code": code}}, headers)

    def _admitted(self, path: str) -> bool:
        """Start a request: whether it may go on. With an API key, a request to anything but
        /health must carry it as ``Authorization: Bearer KEY``; one that does not is answered here,
        as OpenAI's API answers it."""
        self._body_read = False
        if self.api_key is None or path == "/health":
            return True
        scheme, _, given = (self.headers.get("Authorization") or "").partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(given.encode(), self.api_key.encode()):
            return True
        self._error(HTTPStatus.UNAUTHORIZED, "missing or incorrect API key: send the header 'Authorization: Bearer KEY' with the key "
                    "the server was started with (serve --api-key or NGSPEC_API_KEY)", "invalid_api_key", {"WWW-Authenticate": "Bearer"})
        return False

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        path = self.path.split("?")[0].rstrip("/")
        if not self._admitted(path):
            return
        if path == "/health":  # a load balancer stops sending requests to a server that is stopping
            self._send(*((HTTPStatus.SERVICE_UNAVAILABLE, {"status": "stopping"}) if self.service.draining else (HTTPStatus.OK, {"status": "ok"})))
        elif path == "/v1/models":
            self._send(HTTPStatus.OK, self.service.models())
        else:
            self._error(HTTPStatus.NOT_FOUND, f"no route GET {self.path}; try POST /v1/completions or /v1/chat/completions")

    do_HEAD = do_GET  # noqa: N815 (http.server's name): the GET answer's headers, without its body (`_send`)

    def do_POST(self) -> None:  # noqa: N802
        path = self.path.split("?")[0].rstrip("/")
        if not self._admitted(path):
            return
        if path not in ("/v1/completions", "/v1/chat/completions"):
            self._error(HTTPStatus.NOT_FOUND, f"no route POST {self.path}; try /v1/completions or /v1/chat/completions")
            return
        if self.service.draining:  # the client may try another server: this one ends once its requests are answered
            self.close_connection = True
            self._error(HTTPStatus.SERVICE_UNAVAILABLE, "the server is stopping: it answers the requests it has and takes no new ones")
            return
        try:
            body = self._body()
            if body.get("stream") is not None and not isinstance(body["stream"], bool):
                raise BadRequest(f"'stream' must be true or false, not {short(body['stream'])}")
            if body.get("stream"):
                self._stream(body, chat=path.endswith("chat/completions"))
            else:
                self._send(HTTPStatus.OK, self.service.complete(body, chat=path.endswith("chat/completions")))
        except BadRequest as exc:
            self._error(exc.status, str(exc))
        except BrokenPipeError:  # the client went away mid-stream
            pass
        except Exception as exc:  # never a traceback to the client; the server keeps serving
            said = out_of_memory(exc, "a smaller max_tokens, or fewer prompts in one request") or f"{type(exc).__name__}: {exc}"
            self._error(HTTPStatus.INTERNAL_SERVER_ERROR, said)

    def _body(self) -> dict:
        if "Transfer-Encoding" in self.headers:
            raise BadRequest("a chunked request body is not read here: send the body with a Content-Length", HTTPStatus.LENGTH_REQUIRED)
        try:
            length = int(self.headers.get("Content-Length", "0"))
        except ValueError:
            raise BadRequest("Content-Length is not a number") from None
        if length < 0:  # read(-1) would wait for the client to close the connection
            raise BadRequest(f"Content-Length must not be negative (got {length})")
        if length > MAX_BODY:
            raise BadRequest(f"request body over {MAX_BODY // 2**20} MiB", HTTPStatus.REQUEST_ENTITY_TOO_LARGE)
        data = self.rfile.read(length)
        self._body_read = True
        try:
            body = json.loads(data or b"null")
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise BadRequest(f"the request body is not valid JSON ({exc})") from None
        if not isinstance(body, dict):
            raise BadRequest("the request body must be a JSON object")
        return body

    def _stream(self, body: dict, chat: bool) -> None:
        """Server-sent events. ``emit`` runs on the generation thread (inside a batch with other
        requests): a client gone mid-stream must not stop the batch, so its writes fail silently."""
        started, gone = False, False

        def emit(chunk: dict) -> None:
            nonlocal started, gone
            if gone:
                return
            try:
                if not started:  # headers only once the request has passed its checks
                    self.send_response(HTTPStatus.OK)
                    self.send_header("Content-Type", "text/event-stream")
                    self.send_header("Cache-Control", "no-cache")
                    self.send_header("Connection", "close")
                    for name, value in self._cors().items():
                        self.send_header(name, value)
                    self.end_headers()
                    started = True
                self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                self.wfile.flush()
            except OSError:  # the client went away
                gone = True

        try:
            self.service.complete(body, chat, emit, lambda: gone)
        except BadRequest as exc:
            if not started:
                raise
            emit({"error": {"message": str(exc), "type": "invalid_request_error" if exc.status < 500 else "server_error"}})
        self.close_connection = True
        if not gone:
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()


class Server(ThreadingHTTPServer):
    daemon_threads = True
    # connections waiting to be accepted: clients that connect at once (a harness with 64 workers)
    # overflowed the standard library's 5, and up to 27 of 64 were reset (BENCHMARKS.md 10zj)
    request_queue_size = 1024
    service: Service

    def server_bind(self) -> None:
        if self.address_family == socket.AF_INET6:  # "::" takes IPv4 clients too, as `python -m http.server` does
            with contextlib.suppress(OSError, AttributeError):
                self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        super().server_bind()


class Server6(Server):
    address_family = socket.AF_INET6


def check_api_key(api_key: str | None) -> None:
    """Refuse an empty key: ``--api-key "$KEY"`` with KEY unset would serve with no key asked."""
    if api_key is not None and not api_key.strip():
        raise NgspecError("the API key is empty (was the variable it came from unset?): give a key, or none to ask for no key")


def make_server(
    spec: Speculator, host: str = "127.0.0.1", port: int = 8000, max_tokens_default: int = 256, batch_size: int = 8,
    log: Callable[[str], None] | None = None, say: Callable[[str], None] | None = None, api_key: str | None = None,
    allowed_origins: str | None = None,
) -> Server:
    """A server bound to (host, port) (port 0: any free port, read ``server.server_address``),
    ready to answer: `serve` runs it; ``batch_size``: rows decoded together (concurrent requests,
    and a completions request's list of prompts). Its `Service` is ``server.service``. ``log``:
    each request's line; ``say``: start-up messages; ``api_key``: asked of every request but
    /health (``Authorization: Bearer KEY``; None: no authentication); ``allowed_origins``: the web
    pages that may call it from a browser (`parse_origins`; None: no CORS). The verify costs at ``batch_size`` are
    measured here (once per machine, then cached), after the port is taken and before any request
    comes: on a cold cache the first request would otherwise wait for them (70 s for the default
    model at batch 8 on two cores, past a client's 60 s timeout in one CI run)."""
    check_api_key(api_key)
    origins = parse_origins(allowed_origins)
    service = Service(spec, max_tokens_default, batch_size)
    handler = type("NgspecHandler", (Handler,), {"service": service, "log": staticmethod(log) if log else None, "api_key": api_key, "origins": origins})
    try:
        ipv6 = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0] == socket.AF_INET6
        server = (Server6 if ipv6 else Server)((host, port), handler)
    except OSError as exc:
        raise NgspecError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from exc
    server.service = service
    if batch_size > 1 and say is not None:
        say(f"verify costs at batch size {batch_size} (measured once per machine) ...")
    try:
        spec.engine.batch_costs(batch_size)
    except BaseException:  # Ctrl-C during the timing: give the port back now, not at garbage collection
        server.server_close()
        raise
    return server


def serve(server: Server) -> None:
    """Answer HTTP on a background thread and generate on this one (the thread that loaded the
    model), until Ctrl-C, `server.service.worker.stop()`, or `server.service.drain()` and the
    requests it had are answered."""
    http = threading.Thread(target=server.serve_forever, name="ngspec-http", daemon=True)
    http.start()
    try:
        server.service.worker.run()
    finally:
        server.shutdown()
        server.service.worker.refuse_waiting()  # one that came in while it shut down
        server.server_close()


def serve_while(server: Server, *clients: Callable[[], None]) -> None:
    """`serve` on this thread while each of ``clients`` runs on a thread of its own; stops once
    they have all returned (for benchmarks and programs that drive their own server)."""

    def drive() -> None:
        try:
            threads = [threading.Thread(target=client) for client in clients]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        finally:
            server.service.worker.stop()

    driver = threading.Thread(target=drive, name="ngspec-clients")
    driver.start()
    serve(server)
    driver.join()
