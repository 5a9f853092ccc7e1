"""`ngspec serve` (`ngspec.server`): OpenAI-shaped answers token-identical to plain greedy
decoding, streamed or not; bad requests get a 400 with one readable message and the server keeps
serving."""

import json
import os
import random
import re
import signal
import subprocess
import socket
import sys
import threading
import urllib.error
import urllib.request
from contextlib import contextmanager

import pytest

from conftest import hf_greedy, repetitive_prompt
from ngspec import NgspecError, Speculator
from ngspec.server import HeldText, before_stop, make_server, serve
from test_cli import invoke
from test_lossless import VOCAB

# the tests load their models on the main thread and serve from another (`ngspec serve` does both on one)
pytestmark = [pytest.mark.filterwarnings("ignore:ngspec. this Speculator runs on a thread other:RuntimeWarning"), pytest.mark.tiny_llama_only]


@contextmanager
def serving(spec, batch_size: int = 8, with_server: bool = False):
    server = make_server(spec, port=0, batch_size=batch_size)
    thread = threading.Thread(target=serve, args=(server,), daemon=True)  # generates on that thread
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield (url, server) if with_server else url
    finally:
        server.service.worker.stop()
        thread.join(timeout=30)
        assert not thread.is_alive()


def hold(server) -> threading.Event:
    """Keep the generation thread busy until the returned event is set (requests queue behind
    it); returns once it is held, so the queue holds only what comes after."""
    held, gate = threading.Event(), threading.Event()
    server.service.worker.submit(lambda: held.set() or gate.wait())
    assert held.wait(timeout=30)
    return gate


def call(url: str, path: str, body=None, raw: bytes | None = None, headers: dict | None = None) -> tuple[int, dict | list[dict]]:
    """(status, the JSON body), or for a stream the list of its events' JSON."""
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    request = urllib.request.Request(url + path, data=data, headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            text, status, kind = response.read().decode(), response.status, response.headers["Content-Type"]
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())
    if kind == "text/event-stream":
        events = [line.removeprefix("data: ") for line in text.split("\n\n") if line]
        assert events[-1] == "[DONE]"
        return status, [json.loads(e) for e in events[:-1]]
    return status, json.loads(text)


@pytest.fixture(scope="module")
def tiny_server(tiny):
    with serving(Speculator.from_model(tiny, drafter="trie")) as url:
        yield url


def test_completions_of_token_ids_are_plain_greedy(tiny, tiny_server):
    rng = random.Random(3)
    eos = tiny.generation_config.eos_token_id
    for _ in range(3):
        prompt = repetitive_prompt(rng, VOCAB, 40)
        status, body = call(tiny_server, "/v1/completions", {"prompt": prompt, "max_tokens": 20})
        assert status == 200
        choice = body["choices"][0]
        assert choice["token_ids"] == hf_greedy(tiny, prompt, 20, eos)
        assert choice["finish_reason"] in ("length", "stop") and choice["text"] == ""  # no tokenizer
        assert body["usage"] == {"prompt_tokens": 40, "completion_tokens": len(choice["token_ids"]), "total_tokens": 40 + len(choice["token_ids"])}
        assert body["ngspec"]["drafter"] == "trie" and body["ngspec"]["mean_tokens_per_call"] >= 1.0


def test_clients_that_connect_all_at_once_are_all_answered(tiny):
    """64 clients connect before the server accepts any (a harness's workers starting together):
    the kernel holds every connection until it is accepted, and each gets its answer. The
    standard library's queue of 5 left the others' handshakes hanging (and reset some in use)."""
    import socket

    server = make_server(Speculator.from_model(tiny, drafter="trie"), port=0)
    address, thread = server.server_address, None
    try:
        clients = []
        for _ in range(64):  # not yet accepting: a connection completes only if the queue holds it
            clients.append(socket.create_connection(address, timeout=2))
        body = json.dumps({"prompt": [5, 6, 7, 8], "max_tokens": 3}).encode()
        request = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
        for client in clients:
            client.sendall(request)
        thread = threading.Thread(target=serve, args=(server,), daemon=True)
        thread.start()
        answers = []
        for client in clients:
            client.settimeout(60)
            data = b""
            while chunk := client.recv(65536):
                data += chunk
            answers.append(data.split(b"\r\n")[0])
            client.close()
        assert answers == [b"HTTP/1.1 200 OK"] * 64
    finally:
        if thread is None:
            server.server_close()
        else:
            server.service.worker.stop()
            thread.join(timeout=30)


def test_a_list_of_prompts_is_decoded_as_one_batch_each_plain_greedy(tiny, tiny_server):
    rng = random.Random(4)
    eos = tiny.generation_config.eos_token_id
    prompts = [repetitive_prompt(rng, VOCAB, rng.randrange(10, 60)) for _ in range(5)]
    status, body = call(tiny_server, "/v1/completions", {"prompt": prompts, "max_tokens": 16})
    assert status == 200
    assert [c["index"] for c in body["choices"]] == list(range(5))
    assert [c["token_ids"] for c in body["choices"]] == [hf_greedy(tiny, p, 16, eos) for p in prompts]
    assert body["usage"]["prompt_tokens"] == sum(map(len, prompts)) and body["ngspec"]["batch_size"] == 5
    assert all(c["ngspec"]["verify_calls"] >= 1 for c in body["choices"])
    # one prompt that cannot run fails the request, naming it
    status, answer = call(tiny_server, "/v1/completions", {"prompt": [prompts[0], [1] * 600], "max_tokens": 4})
    assert status == 400 and answer["error"]["message"].startswith("prompt 1: the prompt has 600 tokens")
    status, answer = call(tiny_server, "/v1/completions", {"prompt": prompts[:2], "stream": True})
    assert status == 400 and "'stream' takes one prompt per request" in answer["error"]["message"]


def test_a_seeded_request_gets_plain_samplings_answer_alone_or_batched(tiny, tiny_server):
    """A sampled request with a seed is answered with plain sampling's tokens for that seed, alone
    or in a batch with other prompts: the same request, the same answer."""
    from ngspec.decode import DecodeConfig, generate
    from ngspec.drafters import make_drafter
    from ngspec.target import TargetModel
    from ngspec.verify import SamplingConfig

    rng = random.Random(6)
    prompts = [repetitive_prompt(rng, VOCAB, rng.randrange(10, 60)) for _ in range(3)]
    sampling = {"temperature": 0.8, "top_p": 0.9, "seed": 21, "max_tokens": 16}
    status, alone = call(tiny_server, "/v1/completions", {"prompt": prompts[0], **sampling})
    assert status == 200
    status, batched = call(tiny_server, "/v1/completions", {"prompt": prompts, **sampling})
    assert status == 200
    cfg = DecodeConfig(max_new_tokens=16, eos_ids=frozenset({tiny.generation_config.eos_token_id}), sampling=SamplingConfig(0.8, 0.9, 0, 21))
    plain = [generate(TargetModel(tiny), make_drafter("vanilla"), p, cfg).token_ids for p in prompts]
    assert alone["choices"][0]["token_ids"] == plain[0]
    assert [c["token_ids"] for c in batched["choices"]] == plain
    assert alone["ngspec"]["seed"] == 21 and all(c["ngspec"]["seed"] == 21 for c in batched["choices"])
    # unseeded: a seed is drawn and reported, and sending it back replays the answer
    status, drawn = call(tiny_server, "/v1/completions", {"prompt": prompts[1], **sampling, "seed": None})
    assert status == 200 and isinstance(drawn["ngspec"]["seed"], int)
    status, replay = call(tiny_server, "/v1/completions", {"prompt": prompts[1], **sampling, "seed": drawn["ngspec"]["seed"]})
    assert replay["choices"][0]["token_ids"] == drawn["choices"][0]["token_ids"]


@pytest.mark.parametrize(
    "path, body, status, message",
    [
        ("/v1/completions", None, 400, "must be a JSON object"),
        ("/v1/completions", [1, 2], 400, "must be a JSON object"),
        ("/v1/completions", {"prompt": []}, 400, "'prompt' must be a non-empty string, a list of token ids, or a list of those"),
        ("/v1/completions", {"prompt": ["a", ""]}, 400, "'prompt' must be a non-empty string"),
        ("/v1/completions", {"prompt": [1, 2], "n": 2}, 400, "'n' is not supported"),
        ("/v1/completions", {"prompt": [1, 2], "logprobs": 3}, 400, "'logprobs' is not supported"),
        ("/v1/completions", {"prompt": [1, 2], "temperature": "hot"}, 400, "'temperature' must be a number"),
        ("/v1/completions", {"prompt": [1, 2], "temperature": 3}, 400, r"'temperature' must be in \[0.0, 2.0\]"),
        ("/v1/completions", {"prompt": [1, 2], "temperature": float("nan")}, 400, r"'temperature' must be in \[0.0, 2.0\], not NaN$"),  # JSON's NaN
        # values quoted as the request wrote them (Python's words before: "(got {'a': 1})", "or False")
        ("/v1/completions", {"prompt": [1, 2], "max_tokens": {"a": 1}}, 400, r"'max_tokens' must be an integer, not \{\"a\": 1\}$"),
        ("/v1/completions", {"prompt": [1, 2], "seed": [None]}, 400, r"'seed' must be an integer, not \[null\]$"),
        ("/v1/completions", {"prompt": [1, 2], "echo": True}, 400, r"'echo' is not supported \(leave it out, or false\)$"),
        ("/v1/completions", {"prompt": [1, 2], "temperature": 1, "top_p": float("nan")}, 400, r"'top_p' must be in"),
        ("/v1/completions", {"prompt": [1, 2], "temperature": 1, "seed": -1}, 400, r"'seed' must be in \[0, "),
        ("/v1/completions", {"prompt": [1, 2], "max_tokens": 0}, 400, "'max_tokens' must be in"),
        ("/v1/completions", {"prompt": [1, 2], "max_tokens": 2.5}, 400, "'max_tokens' must be an integer"),
        ("/v1/completions", {"prompt": [1, 2], "stop": [""]}, 400, "'stop' must be a string or a list"),
        ("/v1/completions", {"prompt": [1, 2], "stop": "x"}, 400, "stop strings need a tokenizer"),
        ("/v1/completions", {"prompt": [1, 999]}, 400, "outside the model's vocabulary"),
        ("/v1/completions", {"prompt": [[1, 2], [1, 999]]}, 400, r"^prompt 1: token id 999 is outside the model's vocabulary"),
        # taken as true: "stream": "no" streamed
        ("/v1/completions", {"prompt": [1, 2], "stream": "no"}, 400, r"^'stream' must be true or false, not \"no\"$"),
        ("/v1/completions", {"prompt": [1] * 600}, 400, "context window is 512"),
        ("/v1/completions", {"prompt": [1, 2], "stream": True}, 400, r"streamed text \(on_text\) need a tokenizer"),
        ("/v1/completions", {"prompt": "text"}, 400, "text prompts need a tokenizer"),
        ("/v1/chat/completions", {"messages": []}, 400, "'messages' must be a non-empty list"),
        ("/v1/chat/completions", {"messages": [{"content": "hi"}]}, 400, "a chat message needs a 'role' and a 'content', both strings, not {\"content\": \"hi\"}"),
        ("/v1/chat/completions", {"messages": ["hi"]}, 400, "a chat message needs a 'role' and a 'content', both strings, not \"hi\""),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, 400, "only text content parts"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}, 400, "chat messages need a tokenizer"),
        ("/v1/embeddings", {}, 404, "no route POST /v1/embeddings"),
    ],
)
def test_a_bad_request_gets_one_clear_message_and_the_server_keeps_serving(tiny_server, path, body, status, message):
    got, answer = call(tiny_server, path, body, raw=b"" if body is None else None)
    assert got == status
    assert answer["error"]["type"] == "invalid_request_error"
    assert re.search(message, answer["error"]["message"]), answer
    assert call(tiny_server, "/health")[1] == {"status": "ok"}


def test_a_request_that_runs_out_of_memory_gets_one_line_and_the_server_keeps_serving(tiny, monkeypatch):
    """torch's CUDA paragraph becomes the CLI's one line, with what a client can ask less of; the
    next request is answered."""
    import torch

    spec = Speculator.from_model(tiny, drafter="trie")
    real, failed = spec.generate, []

    def once_out_of_memory(*args, **kwargs):
        if not failed:
            failed.append(1)
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 GiB of which "
                                         "1.06 GiB is free. Including non-PyTorch memory, this process has 78.12 GiB memory in use.")
        return real(*args, **kwargs)

    monkeypatch.setattr(spec, "generate", once_out_of_memory)
    with serving(spec, batch_size=1) as url:
        status, answer = call(url, "/v1/completions", {"prompt": [1, 2, 3], "max_tokens": 4})
        assert status == 500 and answer["error"]["type"] == "server_error"
        assert answer["error"]["message"] == ("out of memory on GPU 0: torch could not allocate 2.00 GiB more (1.06 GiB of 79.19 GiB free); "
                                              "ask for less at once: a smaller max_tokens, or fewer prompts in one request; or free memory")
        status, answer = call(url, "/v1/completions", {"prompt": [1, 2, 3], "max_tokens": 4})
        assert status == 200 and 1 <= len(answer["choices"][0]["token_ids"]) <= 4


def test_invalid_json_and_unknown_get_routes(tiny_server):
    status, answer = call(tiny_server, "/v1/completions", raw=b"{bad")
    assert status == 400 and "not valid JSON" in answer["error"]["message"]
    assert call(tiny_server, "/v1/models")[1]["data"][0]["owned_by"] == "ngspec"
    assert call(tiny_server, "/v2/models")[0] == 404


def test_a_server_times_its_batch_costs_once_it_has_its_port_and_before_it_answers(tiny, monkeypatch):
    """On a cold cache the default model's timing at batch 8 took 70 s, which the first request
    waited for (past a 60 s client timeout in CI) where a caller of make_server did not time first."""
    spec = Speculator.from_model(tiny)
    asked = []
    monkeypatch.setattr(spec.engine, "batch_costs", lambda batch: asked.append(batch) or spec.engine.target.verify_cost)
    said = []
    server = make_server(spec, port=0, batch_size=3, say=said.append)
    try:
        assert asked == [3] and said == ["verify costs at batch size 3 (measured once per machine) ..."]
        with pytest.raises(NgspecError, match="cannot listen"):
            make_server(spec, port=server.server_address[1], batch_size=5)
        assert asked == [3]  # a port in use is refused first, without the wait
    finally:
        server.server_close()


def test_a_server_stopped_while_it_times_its_batch_costs_lets_go_of_its_port(tiny, monkeypatch):
    """Ctrl-C during the timing (70 s on a cold cache) left the bound socket open until the garbage
    collector found it; the traceback held it, so the port stayed taken."""
    spec = Speculator.from_model(tiny)

    def interrupted(batch):
        raise KeyboardInterrupt

    monkeypatch.setattr(spec.engine, "batch_costs", interrupted)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(KeyboardInterrupt) as interrupt:
        make_server(spec, port=port, batch_size=3)
    with socket.socket() as again:  # the port is free again while the traceback still holds the frame
        again.bind(("127.0.0.1", port))
        again.listen()
    assert interrupt.traceback


def test_a_port_in_use_is_refused_in_one_line(tiny):
    spec = Speculator.from_model(tiny)
    server = make_server(spec, port=0)
    try:
        with pytest.raises(NgspecError, match=f"cannot listen on 127.0.0.1:{server.server_address[1]}"):
            make_server(spec, port=server.server_address[1])
    finally:
        server.server_close()


def test_serve_refuses_bad_options_before_loading():
    for args, message in ((["--port", 70000], "--port must be in 0..65535"), (["--max-tokens", 0], "--max-tokens must be at least 1"), (["-b", 0], "--batch-size must be at least 1"), (["-d", "nope"], "unknown drafter"),
                          (["--api-key", " "], "the API key is empty (was the variable it came from unset?)"),
                          (["--shutdown-timeout", "-1"], "--shutdown-timeout must be 0 or more seconds (got -1)"),
                          (["--shutdown-timeout", "nan"], "--shutdown-timeout must be 0 or more seconds (got nan)")):
        result = invoke("serve", *args)
        assert result.exit_code == 1 and message in result.stderr, result.stderr


def test_held_text_sends_everything_before_the_first_stop_string_and_nothing_of_it():
    """Against `before_stop` of the whole text: random texts cut into random pieces, sent as a
    generation would (ending at the piece that completes a stop string, or not); what has been
    sent is at every moment a prefix of the answer, and all of it once `finish` has run."""
    rng = random.Random(0)
    for _ in range(3000):
        stops = ["".join(rng.choice("ab\n") for _ in range(rng.randint(1, 4))) for _ in range(rng.randint(0, 3))]
        text = "".join(rng.choice("abc\n") for _ in range(rng.randint(0, 30)))
        pieces, start = [], 0
        while start < len(text):
            end = start + rng.randint(1, 4)
            pieces.append(text[start:end])
            start = end
            if before_stop(text[:end], stops) != text[:end]:  # a stop string completed: generation ends
                break
        text = "".join(pieces)
        answer, sent = before_stop(text, stops), []
        held = HeldText(stops, sent.append)
        for piece in pieces:
            held(piece)
            assert answer.startswith("".join(sent))
        held.finish(text)
        assert "".join(sent) == answer and all(sent)
        if not stops:  # nothing to hold back: each piece goes out as it comes
            assert sent == [p for p in pieces if p]


def test_before_stop_cuts_at_the_earliest_stop_string():
    assert before_stop("1, 2, 3, 4, 5,", ["5,", "7"]) == "1, 2, 3, 4, "
    assert before_stop("the mat.", ["at", "mat"]) == "the "
    assert before_stop("no stop here", ["x"]) == "no stop here" and before_stop("abc", ()) == "abc"


@pytest.mark.slow
def test_chat_and_completions_on_the_default_model_streamed_or_not(default_model):
    spec = Speculator.from_model(default_model.model, default_model.tokenizer, "trie")
    messages = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Repeat: the cat sat on the mat, the cat sat on the mat."}]
    plain = Speculator.from_model(default_model.model, default_model.tokenizer, "vanilla").generate(messages, max_new_tokens=24)
    with serving(spec) as url:
        status, body = call(url, "/v1/chat/completions", {"model": "anything", "messages": messages, "max_tokens": 24, "temperature": 0, "logprobs": False, "user": "me"})
        assert status == 200 and body["object"] == "chat.completion"
        choice = body["choices"][0]
        assert choice["token_ids"] == plain.token_ids and choice["message"] == {"role": "assistant", "content": plain.text}
        assert choice["finish_reason"] == ("stop" if plain.finish_reason == "eos" else "length")

        status, events = call(url, "/v1/chat/completions", {"messages": messages, "max_tokens": 24, "stream": True})
        assert status == 200 and all(e["object"] == "chat.completion.chunk" for e in events)
        assert events[0]["choices"][0]["delta"]["role"] == "assistant"
        assert "".join(e["choices"][0]["delta"].get("content", "") for e in events) == plain.text
        assert events[-1]["choices"][0]["token_ids"] == plain.token_ids and events[-1]["usage"]["completion_tokens"] == len(plain.token_ids)

        # OpenAI's stop: the text ends before the stop string, streamed or not; the token ids keep it
        stop_body = {"prompt": "Count from 1 to 10, separated by commas: 1, 2,", "max_tokens": 24, "stop": ["5,", "7"]}
        plain = Speculator.from_model(default_model.model, default_model.tokenizer, "vanilla").generate(stop_body["prompt"], max_new_tokens=24, raw=True, stop=stop_body["stop"])
        assert plain.finish_reason == "stop" and plain.text.endswith("5,")  # the API keeps the stop string
        status, body = call(url, "/v1/completions", stop_body)
        assert body["choices"][0]["text"] == plain.text[: -len("5,")] and body["choices"][0]["token_ids"] == plain.token_ids
        assert body["choices"][0]["finish_reason"] == "stop"
        status, events = call(url, "/v1/completions", {**stop_body, "stream": True})
        assert "".join(e["choices"][0]["text"] for e in events) == plain.text[: -len("5,")]
        assert events[-1]["choices"][0]["finish_reason"] == "stop" and events[-1]["choices"][0]["token_ids"] == plain.token_ids
        status, body = call(url, "/v1/completions", {**stop_body, "prompt": [stop_body["prompt"]] * 2})  # a list: the batch path
        assert [c["text"] for c in body["choices"]] == [plain.text[: -len("5,")]] * 2

        # refused before the stream opens: a plain 400, not an event
        status, answer = call(url, "/v1/completions", {"prompt": "word " * 9000, "stream": True})
        assert status == 400 and "context window is 8192" in answer["error"]["message"]


@pytest.mark.slow
def test_the_serve_command_starts_answers_and_stops_on_sigterm():
    """With the API key from NGSPEC_API_KEY, which the start-up line says is asked for."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "ngspec.cli.app", "serve", "--port", "0", "-d", "prompt-lookup", "--max-tokens", "4"],
        stderr=subprocess.PIPE, text=True, env={**os.environ, "COLUMNS": "200", "NGSPEC_API_KEY": "k-123"},
    )
    try:
        lines = []
        while not any("serving" in line for line in lines):
            line = proc.stderr.readline()
            assert line, "".join(lines)
            lines.append(line)
        assert "requests must carry the API key" in lines[-1] and "k-123" not in lines[-1]
        url = re.search(r"http://[\d.]+:\d+", lines[-1]).group(0)
        assert call(url, "/v1/completions", {"prompt": "One, two, three, four,"})[0] == 401
        status, body = call(url, "/v1/completions", {"prompt": "One, two, three, four,"}, headers={"Authorization": "Bearer k-123"})
        assert status == 200 and body["usage"]["completion_tokens"] <= 4 and body["ngspec"]["drafter"] == "prompt-lookup"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        assert "stopped" in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()


def test_the_worker_runs_work_on_the_thread_that_runs_it_and_passes_errors_back():
    from ngspec.server import Worker

    worker = Worker()
    runner = threading.Thread(target=worker.run)
    runner.start()
    done = worker.submit(threading.get_ident)
    failed = worker.submit(lambda: 1 / 0)
    assert done.result(timeout=10) == runner.ident  # not the submitting thread's
    with pytest.raises(ZeroDivisionError):
        failed.result(timeout=10)
    worker.stop()
    runner.join(timeout=10)
    assert not runner.is_alive()


def test_a_draining_worker_finishes_what_it_has_then_returns_and_what_came_after_is_refused():
    """`Worker.drain`: the work queued before it runs, `run` then returns by itself; work
    queued after it is answered "the server is stopping" (it waited for ever before)."""
    from ngspec.server import Worker

    worker = Worker()
    gate = threading.Event()
    first, second = worker.submit(gate.wait), worker.submit(lambda: "second")
    runner = threading.Thread(target=worker.run)
    runner.start()
    worker.drain()
    assert worker.draining
    gate.set()
    runner.join(timeout=10)
    assert not runner.is_alive() and first.result(timeout=1) is True and second.result(timeout=1) == "second"
    late = worker.submit(lambda: "late")
    worker.refuse_waiting()
    with pytest.raises(NgspecError, match="the server is stopping"):
        late.result(timeout=1)


def test_a_draining_server_answers_the_requests_it_has_and_refuses_new_ones(tiny):
    """`serve --shutdown-timeout`: on the first Ctrl-C or SIGTERM the requests in flight and
    those already queued get their whole answers, new ones (and /health, for a load balancer)
    get 503, and serving ends by itself once nothing is left."""
    spec = Speculator.from_model(tiny, drafter="trie")
    server = make_server(spec, port=0, batch_size=2)
    thread = threading.Thread(target=serve, args=(server,), daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        gate = hold(server)
        answers = {}
        asked = [threading.Thread(target=lambda i=i: answers.setdefault(i, call(url, "/v1/completions", {"prompt": [1, 2, 3 + i], "max_tokens": 8})))
                 for i in range(3)]
        for t in asked:
            t.start()
        while server.service.in_flight < 3:
            threading.Event().wait(0.01)
        server.service.drain()
        status, body = call(url, "/v1/completions", {"prompt": [1, 2, 3], "max_tokens": 8})
        assert status == 503 and "the server is stopping" in body["error"]["message"]
        assert call(url, "/health") == (503, {"status": "stopping"})
        gate.set()
        for t in asked:
            t.join(timeout=60)
        assert all(answers[i][0] == 200 and answers[i][1]["usage"]["completion_tokens"] == 8 for i in range(3)), answers
        thread.join(timeout=30)
        assert not thread.is_alive()  # it stopped by itself
    finally:
        server.service.worker.stop()
        thread.join(timeout=30)


def test_the_first_signal_drains_for_the_timeout_and_a_second_stops_at_once(monkeypatch):
    """`ngspec serve`'s signals: with requests in flight the first SIGTERM (or Ctrl-C) drains
    and says so; a second, or the timeout running out, stops at once (KeyboardInterrupt, as
    before: what is left gets 503). Nothing in flight, or --shutdown-timeout 0: at once."""
    import time

    from ngspec.cli.serve import signals_drain

    class Service:
        in_flight, drained = 2, 0

        def drain(self):
            self.drained += 1

    said = []
    service = Service()
    with signals_drain(service, 30, said.append):
        os.kill(os.getpid(), signal.SIGTERM)
        assert service.drained == 1 and said == ["stopping: finishing the 2 requests in flight, for up to 30 s, and taking no new ones (Ctrl-C again stops now)"]
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)
    assert signal.getsignal(signal.SIGTERM) is not None and signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    with signals_drain(service, 0.2, said.append), pytest.raises(KeyboardInterrupt):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the timeout's alarm ends it
    with signals_drain(service, float("inf"), said.append):  # no limit: no alarm
        os.kill(os.getpid(), signal.SIGTERM)
        assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0) and said[-1].startswith("stopping: finishing the 2 requests in flight, however long they take")
    for timeout, in_flight in ((0, 2), (30, 0)):
        service.in_flight = in_flight
        with signals_drain(service, timeout, said.append), pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(1)
    assert service.drained == 3


@pytest.mark.slow
@pytest.mark.parametrize("script, phases", [("serve_overhead", ("direct", "http", "http stream")), ("torch_threads", ("main alone", "main, 2nd gone"))])
def test_the_serving_benchmarks_run_and_find_the_same_tokens(script, phases, monkeypatch, capsys):
    from conftest import BENCHMARKS, benchmark_script

    module = benchmark_script(script)
    questions = BENCHMARKS.parent / "examples" / "prompts.jsonl"
    monkeypatch.setattr(sys, "argv", [script, "--questions", str(questions), "--limit", "1", "-n", "3", "--rounds", "1"])
    module.main()
    lines = capsys.readouterr().out.splitlines()
    for phase in phases:
        line = next(x for x in lines if x.startswith(phase))
        assert line.endswith("identical tokens 1/1") or line.endswith("identical tokens: True"), line


@pytest.mark.parametrize("batch_size", [1, 3])
def test_concurrent_requests_are_decoded_together_each_plain_greedy(tiny, batch_size, monkeypatch):
    """Requests that arrive while the generation thread is busy join one batch (at most
    ``batch_size`` rows, the rest taking slots as rows finish); each answer is its own plain
    greedy decoding with its own max_tokens, and a prompt too long fails alone."""
    import ngspec.engine as engine_module

    batches = []
    real = engine_module.generate_batch
    monkeypatch.setattr(engine_module, "generate_batch", lambda *a, **k: batches.append(1) or real(*a, **k))
    rng = random.Random(9)
    eos = tiny.generation_config.eos_token_id
    prompts = [repetitive_prompt(rng, VOCAB, rng.randrange(10, 50)) for _ in range(5)] + [[1] * 600]
    budgets = [16, 4, 16, 9, 12, 4]
    with serving(Speculator.from_model(tiny, drafter="trie"), batch_size, with_server=True) as (url, server):
        gate = hold(server)  # the generation thread waits: every request queues
        answers = [None] * len(prompts)

        def ask(i: int) -> None:
            answers[i] = call(url, "/v1/completions", {"prompt": prompts[i], "max_tokens": budgets[i]})

        askers = [threading.Thread(target=ask, args=(i,)) for i in range(len(prompts))]
        for t in askers:
            t.start()
        while server.service.worker._queue.qsize() < len(prompts):  # all six queued behind the gate
            threading.Event().wait(0.01)
        gate.set()
        for t in askers:
            t.join(timeout=60)
    for i, (status, body) in enumerate(answers[:-1]):
        assert status == 200 and body["choices"][0]["token_ids"] == hf_greedy(tiny, prompts[i], budgets[i], eos), i
    status, body = answers[-1]
    assert status == 400 and "context window is 512" in body["error"]["message"]
    assert len(batches) == (1 if batch_size > 1 else 0)  # one batch for all (batch size 1: one generate each)


@pytest.mark.slow
def test_a_client_gone_mid_stream_does_not_stop_the_batch_and_its_row_ends(default_model, monkeypatch):
    import http.client

    import ngspec.engine as engine_module

    batches = []
    real = engine_module.generate_batch

    def recorded(*args, **kwargs):
        results, report = real(*args, **kwargs)
        batches.append(results)
        return results, report

    monkeypatch.setattr(engine_module, "generate_batch", recorded)
    spec = Speculator.from_model(default_model.model, default_model.tokenizer, "trie")
    question = "Count from one to forty, in words, separated by commas."
    plain = Speculator.from_model(default_model.model, default_model.tokenizer, "vanilla").generate(question, max_new_tokens=40)
    with serving(spec, with_server=True) as (url, server):
        gate = hold(server)  # both requests queue, then run as one batch
        port = server.server_address[1]
        leaving = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        leaving.request("POST", "/v1/chat/completions", json.dumps({"messages": [{"role": "user", "content": question}], "max_tokens": 40, "stream": True}), {"Content-Type": "application/json"})
        answers = []
        staying = threading.Thread(target=lambda: answers.append(call(url, "/v1/chat/completions", {"messages": [{"role": "user", "content": question}], "max_tokens": 40})))
        staying.start()
        while server.service.worker._queue.qsize() < 2:
            threading.Event().wait(0.01)
        gate.set()
        response = leaving.getresponse()
        assert response.status == 200 and response.fp.readline().startswith(b"data: ")
        response.close()
        leaving.close()  # gone after the first event
        staying.join(timeout=120)
        status, body = answers[0]
        assert status == 200 and body["choices"][0]["token_ids"] == plain.token_ids
        assert call(url, "/health")[1] == {"status": "ok"}
    # the leaving client's row stopped at the step after it left, not at its 40 tokens
    (results,) = batches
    left, stayed = sorted((r.generation for r in results), key=lambda g: g.finish_reason != "cancelled")
    assert left.finish_reason == "cancelled" and len(left.token_ids) < len(plain.token_ids)
    assert stayed.token_ids == plain.token_ids


def test_requests_arriving_over_several_steps_each_get_their_own_answer(tiny):
    """The generation thread's batch takes requests at several steps (each feed call brings some):
    every request's future gets its own answer, plain greedy with its own budget."""
    from ngspec.server import Pending, Service

    service = Service(Speculator.from_model(tiny, drafter="trie"), batch_size=3)
    rng = random.Random(12)
    eos = tiny.generation_config.eos_token_id
    prompts = [repetitive_prompt(rng, VOCAB, rng.randrange(8, 40)) for _ in range(8)]
    budgets = [20, 6, 14, 3, 20, 9, 11, 5]
    pendings = [Pending(p, True, {"max_new_tokens": n}) for p, n in zip(prompts, budgets)]
    arrivals = iter([pendings[1:3], [], [pendings[3]], pendings[4:7], [], [pendings[7]]])
    service._run_batch(pendings[0], lambda: next(arrivals, []))
    assert next(arrivals, None) is None  # every group joined the batch
    for p, prompt, n in zip(pendings, prompts, budgets):
        assert p.future.result(timeout=0).token_ids == hf_greedy(tiny, prompt, n, eos)


@pytest.mark.slow
def test_the_concurrency_benchmark_runs_and_finds_the_same_tokens(monkeypatch, capsys):
    from conftest import BENCHMARKS, benchmark_script

    module = benchmark_script("serve_concurrency")
    questions = BENCHMARKS.parent / "examples" / "prompts.jsonl"
    monkeypatch.setattr(sys, "argv", ["serve_concurrency", "--questions", str(questions), "--limit", "3", "-n", "3", "--clients", "1,3", "--batch-size", "3", "--rounds", "1"])
    module.main()
    lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith("clients")]
    assert len(lines) == 4 and all(x.endswith("identical tokens: True") for x in lines)


@pytest.mark.slow
def test_one_request_at_a_time_a_client_gone_mid_stream_stops_its_generation(default_model):
    """`--batch-size 1`: the generation of a streaming client that left stops at its next text,
    and the server answers the next request (from a fresh cache) exactly."""
    import http.client

    spec = Speculator.from_model(default_model.model, default_model.tokenizer, "trie")
    question = "Count from one to sixty, in words, separated by commas."
    plain = Speculator.from_model(default_model.model, default_model.tokenizer, "vanilla").generate(question, max_new_tokens=60)
    steps = []
    real = spec.generate
    spec.generate = lambda *a, **k: steps.append(real(*a, **k)) or steps[-1]
    with serving(spec, batch_size=1, with_server=True) as (url, server):
        gate = hold(server)
        leaving = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=60)
        leaving.request("POST", "/v1/chat/completions", json.dumps({"messages": [{"role": "user", "content": question}], "max_tokens": 60, "stream": True}), {"Content-Type": "application/json"})
        while server.service.worker._queue.qsize() < 1:
            threading.Event().wait(0.01)
        leaving.close()  # gone before its first event
        gate.set()
        status, body = call(url, "/v1/chat/completions", {"messages": [{"role": "user", "content": question}], "max_tokens": 60})
        assert status == 200 and body["choices"][0]["token_ids"] == plain.token_ids
    assert len(steps) == 1  # the leaving request's generation never finished


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_serve_while_serves_on_this_thread_until_every_client_returns_even_one_that_failed(tiny):
    from ngspec.server import serve_while

    server = make_server(Speculator.from_model(tiny, drafter="trie"), port=0)
    url = f"http://127.0.0.1:{server.server_address[1]}"
    answers, threads = [], set()

    def client() -> None:
        threads.add(threading.get_ident())
        answers.append(call(url, "/v1/completions", {"prompt": [4, 8, 15], "max_tokens": 4})[1]["choices"][0]["token_ids"])

    def failing() -> None:
        raise RuntimeError("a client that failed")  # its thread reports it; the others go on

    serve_while(server, client, client, failing)
    assert len(answers) == 2 and answers[0] == answers[1] and len(answers[0]) == 4
    assert len(threads) == 2 and threading.get_ident() not in threads
    with pytest.raises(urllib.error.URLError):  # stopped: the socket is closed
        call(url, "/health")


def test_a_refused_request_with_an_unread_body_closes_its_connection(tiny_server):
    """A keep-alive client (http.client, httpx under OpenAI's SDK) whose POST was refused before
    its body was read (no such route, a body over the limit, a chunked body) sent its next request
    on the same connection, and the server read the old body as that request: the answer was an
    HTML "400 Bad request syntax". Such a refusal now closes the connection, and the client's next
    request goes out on a fresh one and is answered."""
    import http.client
    from urllib.parse import urlparse

    from ngspec.server import MAX_BODY

    port = urlparse(tiny_server).port
    body = json.dumps({"prompt": [1, 2, 3], "max_tokens": 3})
    refusals = [
        ("/v1/bogus", {"Content-Length": str(len(body))}, body, 404),
        ("/v1/completions", {"Content-Length": str(MAX_BODY + 1)}, body, 413),
        ("/v1/completions", {"Transfer-Encoding": "chunked"}, f"{len(body):x}\r\n{body}\r\n0\r\n\r\n", 411),
        ("/v1/completions", {"Content-Length": "-5"}, "", 400),  # it waited for the client to close
    ]
    for path, headers, payload, status in refusals:
        client = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        client.putrequest("POST", path)
        for name, value in headers.items():
            client.putheader(name, value)
        client.endheaders(payload.encode())
        response = client.getresponse()
        assert response.status == status and "error" in json.loads(response.read()), path
        assert response.getheader("Connection") == "close"
        client.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        response = client.getresponse()
        assert response.status == 200 and json.loads(response.read())["usage"]["completion_tokens"] == 3, path
        client.close()


def test_an_api_key_is_asked_of_every_request_but_the_health_check(tiny):
    """`serve --api-key` (or NGSPEC_API_KEY): a request without `Authorization: Bearer KEY`, or
    with another key, gets OpenAI's 401 answer; /health stays open for load balancers."""
    import http.client

    spec = Speculator.from_model(tiny, drafter="trie")
    server = make_server(spec, port=0, batch_size=1, api_key="s3cret")
    thread = threading.Thread(target=serve, args=(server,), daemon=True)
    thread.start()
    try:
        client = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=30)
        body = json.dumps({"prompt": [1, 2, 3], "max_tokens": 3})
        asked = [("GET", "/v1/models", None), ("POST", "/v1/completions", body), ("POST", "/v1/chat/completions", body)]
        for auth in (None, "Bearer wrong", "s3cret", "Basic s3cret", "Bearer s3cret "):
            for method, path, payload in asked:
                client.request(method, path, payload, {} if auth is None else {"Authorization": auth})
                response = client.getresponse()
                error = json.loads(response.read())["error"]
                assert response.status == 401 and error["code"] == "invalid_api_key", (auth, path)
                assert response.getheader("WWW-Authenticate") == "Bearer"
                assert "Authorization: Bearer" in error["message"] and "s3cret" not in error["message"]
        client.request("GET", "/health")
        response = client.getresponse()
        assert response.status == 200 and json.loads(response.read()) == {"status": "ok"}
        for method, path, payload in asked[:2]:
            client.request(method, path, payload, {"Authorization": "Bearer s3cret"})
            response = client.getresponse()
            assert response.status == 200, path
            response.read()
        client.close()
    finally:
        server.service.worker.stop()
        thread.join(timeout=30)


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.skipif(not _ipv6_loopback(), reason="no IPv6 loopback on this machine")
def test_an_ipv6_address_is_served_and_all_of_them_take_ipv4_clients_too(tiny):
    """`--host ::1` failed: "Address family for hostname not supported". An IPv6 address (or a
    name that resolves to one) is served now, and `::` (every interface) answers IPv4 clients as
    well, as `python -m http.server` does."""
    from ngspec.cli.serve import url_of

    spec = Speculator.from_model(tiny, drafter="trie")
    for host, clients in (("::1", ["[::1]"]), ("::", ["[::1]", "127.0.0.1"])):
        server = make_server(spec, host=host, port=0, batch_size=1)
        thread = threading.Thread(target=serve, args=(server,), daemon=True)
        thread.start()
        try:
            port = server.server_address[1]
            assert url_of(server) == f"http://[{host}]:{port}/v1"
            for client in clients:
                assert call(f"http://{client}:{port}", "/health") == (200, {"status": "ok"}), (host, client)
        finally:
            server.service.worker.stop()
            thread.join(timeout=30)
    with pytest.raises(NgspecError, match="cannot listen on no-such-host.invalid:0: "):
        make_server(spec, host="no-such-host.invalid", port=0)


def test_http_servers_own_refusals_are_json_and_head_asks_after_health(tiny_server):
    """http.server answered a method it has no handler for (PUT, OPTIONS, HEAD) and a malformed
    request with an HTML page; a monitor that checks `HEAD /health` read 501 as down. Now HEAD
    is answered as GET without the body, and the rest are refused in OpenAI's JSON shape."""
    import http.client
    from urllib.parse import urlparse

    port = urlparse(tiny_server).port
    client = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    client.request("HEAD", "/health")
    response = client.getresponse()
    assert response.status == 200 and response.getheader("Content-Type") == "application/json"
    assert response.read() == b"" and int(response.getheader("Content-Length")) == len(b'{"status": "ok"}')
    client.request("GET", "/health")  # the connection is still in step
    response = client.getresponse()
    assert response.status == 200 and json.loads(response.read()) == {"status": "ok"}
    for method in ("PUT", "OPTIONS", "DELETE"):
        client.request(method, "/v1/completions", "{}", {"Content-Type": "application/json"})
        response = client.getresponse()
        error = json.loads(response.read())["error"]
        assert response.status == 501 and response.getheader("Content-Type") == "application/json", method
        assert error["message"].startswith(f"Unsupported method ('{method}')") and error["type"] == "server_error"
        assert ("--allowed-origins" in error["message"]) == (method == "OPTIONS")  # a browser's preflight: what would answer it
        client.close()
    with socket.create_connection(("127.0.0.1", port), timeout=30) as raw:  # a header line over http.server's 64 KiB
        raw.sendall(b"GET /health HTTP/1.1\r\nX-Long: " + b"a" * 70_000 + b"\r\n\r\n")
        answer = b""
        while chunk := raw.recv(4096):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 431") and b"Content-Type: application/json" in head and head.count(b"Connection: close") == 1
    assert json.loads(body)["error"]["message"] == "Line too long"


def test_allowed_origins_let_a_browser_page_call_the_server_and_no_other(tiny_saved):
    """`serve --allowed-origins`: a web page served from one of them may call the server from a
    browser (CORS): its preflight (OPTIONS, which carries no API key) is answered with what the
    browser asks for, and every answer to it, a stream, a 401 or a 404 too, names its origin.
    Another origin is refused at the preflight and its answers name none, so the browser keeps
    them from the page; without the option nothing changes (OPTIONS stays a 501)."""
    import http.client

    spec = Speculator.load(tiny_saved, drafter="trie")  # with a tokenizer: a stream sends text
    server = make_server(spec, port=0, batch_size=1, api_key="s3cret", allowed_origins="http://localhost:3000, https://App.example")
    thread = threading.Thread(target=serve, args=(server,), daemon=True)
    thread.start()
    page, key = "http://localhost:3000", {"Authorization": "Bearer s3cret"}
    try:
        client = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=30)

        def ask(method, path, headers, body=None):
            client.request(method, path, body, headers)
            response = client.getresponse()
            return response, response.read()

        for origin in (page, "https://app.example"):  # the option's case is not the browser's
            response, body = ask("OPTIONS", "/v1/chat/completions", {"Origin": origin, "Access-Control-Request-Method": "POST",
                                                                     "Access-Control-Request-Headers": "authorization,content-type"})
            assert response.status == 204 and body == b"" and response.getheader("Access-Control-Allow-Origin") == origin
            assert "POST" in response.getheader("Access-Control-Allow-Methods") and response.getheader("Vary") == "Origin"
            assert response.getheader("Access-Control-Allow-Headers") == "authorization,content-type"
        request = json.dumps({"prompt": [1, 2, 3], "max_tokens": 3})
        for headers, status in (({"Origin": page, **key}, 200), ({"Origin": page}, 401)):
            response, body = ask("POST", "/v1/completions", headers, request)
            assert response.status == status and response.getheader("Access-Control-Allow-Origin") == page, body
        response, body = ask("GET", "/v1/nothing", {"Origin": page, **key})
        assert response.status == 404 and response.getheader("Access-Control-Allow-Origin") == page
        response, body = ask("POST", "/v1/completions", {"Origin": page, **key}, json.dumps({"prompt": [1, 2, 3], "max_tokens": 3, "stream": True}))
        assert response.status == 200 and response.getheader("Access-Control-Allow-Origin") == page and body.endswith(b"data: [DONE]\n\n"), body
        client.close()
        client = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=30)
        response, body = ask("OPTIONS", "/v1/completions", {"Origin": "https://evil.example", "Access-Control-Request-Method": "POST"})
        assert response.status == 403 and response.getheader("Access-Control-Allow-Origin") is None
        assert "'https://evil.example' is not one of serve's --allowed-origins" in json.loads(body)["error"]["message"]
        response, body = ask("GET", "/v1/models", {"Origin": "https://evil.example", **key})
        assert response.status == 200 and response.getheader("Access-Control-Allow-Origin") is None
        client.close()
    finally:
        server.service.worker.stop()
        thread.join(timeout=30)
    response_to_any = make_server(spec, port=0, batch_size=1, allowed_origins="*")
    thread = threading.Thread(target=serve, args=(response_to_any,), daemon=True)
    thread.start()
    try:
        client = http.client.HTTPConnection("127.0.0.1", response_to_any.server_address[1], timeout=30)
        client.request("GET", "/health", headers={"Origin": "null"})  # a page opened from a file
        response = client.getresponse()
        assert response.status == 200 and response.getheader("Access-Control-Allow-Origin") == "null"
        response.read()
        client.close()
    finally:
        response_to_any.service.worker.stop()
        thread.join(timeout=30)


@pytest.mark.parametrize(
    ("value", "message"),
    [("http://localhost:3000/", "'http://localhost:3000/' is not an origin: give scheme://host[:port]"),
     ("localhost:3000", "'localhost:3000' is not an origin"),
     ("http://a.example/app", "'http://a.example/app' is not an origin"),
     (" , ", "--allowed-origins is empty")],
)
def test_allowed_origins_that_no_browser_would_send_are_refused_before_the_model_loads(value, message):
    """A trailing slash or a path never matches the Origin a browser sends: refused, not served
    to no page at all."""
    from ngspec.server import parse_origins

    with pytest.raises(NgspecError, match=re.escape(message)):
        parse_origins(value)
    result = invoke("serve", "--model", "/no/such/model", "--allowed-origins", value)
    assert result.exit_code == 1 and message in result.stderr and "/no/such/model" not in result.stderr, result.stderr
