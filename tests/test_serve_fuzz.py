"""`benchmarks/serve_fuzz.py`: its verdicts tell an answer, a clear refusal and a finding apart,
its replay catches tokens that differ from plain decoding, and a short search runs end to end on
a tiny saved model."""

import json
import random
import sys

import pytest

from conftest import benchmark_script

serve_fuzz = benchmark_script("serve_fuzz")

ANSWER = json.dumps({"choices": [{"index": 0, "text": "hi", "token_ids": [5, 6]}]})
STREAM = "data: " + json.dumps({"choices": [{"delta": {"content": "hi"}}]}) + "\n\ndata: " + json.dumps({"choices": [{"token_ids": [5]}]}) + "\n\ndata: [DONE]\n\n"


@pytest.mark.parametrize(
    ("status", "kind", "text", "verdict"),
    [
        (200, "application/json", ANSWER, "ok"),
        (200, "text/event-stream", STREAM, "ok"),
        (200, "text/event-stream", STREAM.replace("data: [DONE]\n\n", ""), "FINDING"),  # a stream cut short
        (200, "application/json", json.dumps({"choices": [{"text": "hi"}]}), "FINDING"),  # no token ids
        (400, "application/json", json.dumps({"error": {"message": "'n' is not supported", "type": "invalid_request_error"}}), "refused"),
        (400, "application/json", json.dumps({"error": {"message": "Traceback (most recent call last):\n  x"}}), "FINDING"),
        (400, "application/json", json.dumps({"error": {}}), "FINDING"),
        (400, "application/json", json.dumps({"error": {"message": "'NoneType' object is not iterable"}}), "FINDING"),  # Python's words
        (500, "application/json", json.dumps({"error": {"message": "internal"}}), "FINDING"),
        (400, "text/html", "<html>bad</html>", "FINDING"),
    ],
)
def test_verdicts(status, kind, text, verdict):
    assert serve_fuzz.judge(status, kind, text)[0] == verdict


def test_draws_cover_both_routes_streams_sampling_and_bursts():
    bodies = [serve_fuzz.draw(random.Random(n)) for n in range(300)]
    assert {path for path, _ in bodies} == {"/v1/completions", "/v1/chat/completions"}
    assert sum(body.get("stream") is True for _, body in bodies) > 50
    assert sum(body.get("temperature") not in (None, 0) for _, body in bodies) > 50
    assert all(json.loads(json.dumps(body, allow_nan=True)) is not None for _, body in bodies)
    assert serve_fuzz.capped({"max_tokens": 2**63, "max_completion_tokens": True}, 32) == {"max_tokens": 32, "max_completion_tokens": True}


class FixedTokens:
    def __init__(self, tokens):
        self.tokens, self.asked = tokens, []

    def generate(self, prompt, raw, **kwargs):
        self.asked.append((prompt, raw, kwargs["seed"]))
        return type("Out", (), {"token_ids": self.tokens})()


def test_replay_reports_tokens_that_differ_and_uses_the_reported_seed():
    answer = {"choices": [{"token_ids": [5, 6]}], "ngspec": {"seed": 41}}
    body = {"prompt": "Say hi.", "temperature": 0.7}
    plain = FixedTokens([5, 6])
    assert serve_fuzz.replay(plain, "/v1/completions", body, answer) is None
    assert plain.asked == [("Say hi.", True, 41)]  # unseeded: the seed the answer reports
    assert "against plain decoding's [5, 7]" in serve_fuzz.replay(FixedTokens([5, 7]), "/v1/completions", body, answer)
    chat = {"messages": [{"role": "user", "content": "hi"}]}
    plain = FixedTokens([5, 6])
    assert serve_fuzz.replay(plain, "/v1/chat/completions", chat, {"choices": [{"token_ids": [5, 6]}]}) is None
    assert plain.asked[0][1] is False  # chat goes through the template


def test_a_short_search_on_a_tiny_saved_model(tiny_saved, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["serve_fuzz.py", "--model", str(tiny_saved), "--runs", "6", "--max-tokens", "6", "--out", str(tmp_path)])
    with pytest.raises(SystemExit) as done:
        serve_fuzz.main()
    assert done.value.code == 0, capsys.readouterr().out
    rows = [json.loads(line) for line in (tmp_path / "runs-0.jsonl").read_text().splitlines()]
    assert {r["run"] for r in rows} == set(range(6)) and {r["verdict"] for r in rows} == {"ok", "refused"}
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["findings"] == 0


def test_bad_counts_are_usage_errors(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["serve_fuzz.py", "--runs", "0"])
    with pytest.raises(SystemExit) as done:
        serve_fuzz.main()
    assert done.value.code == 2 and "--runs, --batch-size and --max-tokens must be at least 1" in capsys.readouterr().err


def _search(monkeypatch, capsys, model, out, *flags):
    """(exit code, the runs' lines, what it printed) of a short search on ``model``."""
    monkeypatch.setattr(sys, "argv", ["serve_fuzz.py", "--model", str(model), "--max-tokens", "4", "--timeout", "60", "--out", str(out), *flags])
    with pytest.raises(SystemExit) as done:
        serve_fuzz.main()
    rows = [json.loads(line) for line in (out / "runs-0.jsonl").read_text().splitlines()]
    return done.value.code, rows, capsys.readouterr().out


def test_a_keep_alive_search_sends_refused_requests_first_and_finds_a_server_that_misreads_them(tiny_saved, tmp_path, monkeypatch, capsys):
    """`--keep-alive`: requests after refusals on the same connection are answered as usual; a
    server that kept a connection open after a refusal that left the body unread (as ngspec's did)
    is a finding."""
    from ngspec.server import Handler

    def search(out):
        return _search(monkeypatch, capsys, tiny_saved, out, "--runs", "6", "--keep-alive")

    code, rows, said = search(tmp_path / "now")
    assert code == 0, said
    assert len({r["after_refused"] for r in rows if "after_refused" in r}) >= 2
    monkeypatch.setattr(Handler, "_body_unread", lambda self: False)  # the server before it closed such connections
    code, rows, said = search(tmp_path / "before")
    assert code == 1 and any(r["verdict"] == "FINDING" and "after_refused" in r for r in rows), said


def test_cors_findings_name_an_answer_that_names_the_wrong_origin():
    allowed = serve_fuzz.ALLOWED
    assert serve_fuzz.cors_finding(allowed, allowed) is None and serve_fuzz.cors_finding(None, None) is None
    assert serve_fuzz.cors_finding("http://other.example", None) is None
    assert "want 'http://allowed.example:3000'" in serve_fuzz.cors_finding(allowed, None)  # the page could not read it
    assert "want None" in serve_fuzz.cors_finding("http://other.example", "*")  # a page let in that should not be


def test_an_origins_search_passes_and_finds_a_server_that_lets_every_page_in(tiny_saved, tmp_path, monkeypatch, capsys):
    """`--origins`: requests from the allowed origin, another and none, some after a preflight;
    a server that named every origin (`Access-Control-Allow-Origin: *` to all) is a finding."""
    from ngspec.server import Handler

    def search(out):
        return _search(monkeypatch, capsys, tiny_saved, out, "--runs", "8", "--origins")

    code, rows, said = search(tmp_path / "now")
    assert code == 0, said
    assert {r.get("origin") for r in rows} >= {serve_fuzz.ALLOWED, "http://other.example", None} and any(r.get("preflight") for r in rows)
    monkeypatch.setattr(Handler, "_cors", lambda self: {"Access-Control-Allow-Origin": "*"})
    code, rows, said = search(tmp_path / "before")
    assert code == 1 and any(r["verdict"] == "FINDING" and "Access-Control-Allow-Origin" in r["detail"] for r in rows), said
