"""`benchmarks/serve_soak.py`: the growth it reports, and what it counts as a changed or failed answer."""

import pytest

from conftest import benchmark_script

soak_script = benchmark_script("serve_soak")


def test_growth_is_the_second_halfs_slope_in_mb_per_100_requests():
    samples = [{"requests": r, "rss_gb": 1.0 + (0.5 if r <= 40 else 0.001 * (r - 40) / 10)} for r in range(10, 90, 10)]
    # a jump in the first half (warming up) that the slope leaves out; then 1 MB per 10 requests
    assert soak_script.growth_per_100(samples, "rss_gb") == pytest.approx(0.01 * 1024)
    ended = samples + [{"requests": 90, "rss_gb": 0.5, "final": True}]  # after the last answer: the batch's cache freed
    assert soak_script.growth_per_100(ended, "rss_gb") == pytest.approx(0.01 * 1024)
    assert soak_script.growth_per_100(samples[:1], "rss_gb") is None  # one sample: no slope
    assert soak_script.growth_per_100([{"requests": 10, "rss_gb": None}] * 4, "rss_gb") is None  # no /proc


@pytest.mark.slow
def test_a_soak_on_the_default_model_counts_changed_and_failed_answers(default_model, monkeypatch):
    from ngspec import Speculator

    real_ask, asked = soak_script.ask, []

    def ask(url, text, max_tokens):  # the 2nd answer to the first prompt changed, the 5th request failed
        asked.append(text)
        if len(asked) == 5:
            raise ConnectionResetError("the server hung up")
        tokens = real_ask(url, text, max_tokens)
        return tokens + [0] if asked.count(text) == 2 and text == prompts[0] else tokens

    monkeypatch.setattr(soak_script, "ask", ask)
    prompts = ["Name a prime number.", "Say hello.", "What is 2+2?"]
    spec = Speculator.from_model(default_model.model, default_model.tokenizer, "trie")
    lines = []
    report = soak_script.soak(spec, prompts, requests=9, clients=1, batch_size=2, every=3, max_new_tokens=6, say=lines.append)
    assert (report["requests"], report["mismatches"], report["errors"]) == (9, 1, 1)
    assert [(s["requests"], s["final"]) for s in report["samples"]] == [(3, False), (6, False), (9, True)]
    assert all(s["rss_gb"] > 0.1 for s in report["samples"])  # the model alone is hundreds of MB
    assert any("failed: the server hung up" in line for line in lines)
