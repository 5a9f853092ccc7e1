"""A timed run records the share of the CPUs other processes used meanwhile and says when it was
high: beside one busy process on two cores the default model decoded 32x slower, and `bench`'s
ratios between arms moved too (BENCHMARKS.md 10zzzh). The share is injected here (`CpuWatch.share`)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from ngspec.cli.app import app
from ngspec.perf import measured

runner = CliRunner()
PROMPT = "Repeat exactly: the quick brown fox jumps over the lazy dog. The quick brown fox jumps over the lazy dog."
WARNED = "warning: other processes used 60% of the CPUs while {} ran"


@pytest.fixture
def busy(monkeypatch):
    """Set the share every watch reads; the threshold as shipped (the suite's own runs share the machine)."""
    monkeypatch.setattr(measured, "BUSY_SHARE", 0.2)

    def set_share(share):
        monkeypatch.setattr(measured.CpuWatch, "share", lambda self: share)
    return set_share


@pytest.fixture
def questions(tmp_path):
    path = tmp_path / "q.jsonl"
    path.write_text("".join(json.dumps({"question_id": i, "category": "rag", "turns": [t]}) + "\n" for i, t in enumerate([PROMPT, PROMPT.upper()])))
    return path


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args], env={"COLUMNS": "400"})


@pytest.mark.parametrize("batch", [1, 2])
def test_bench_records_the_share_and_warns_in_its_reports(busy, questions, tiny_saved, tmp_path, batch):
    md = tmp_path / "bench.md"
    busy(0.6)
    result = invoke("bench", "-q", questions, "--model", tiny_saved, "-n", 4, "-d", "trie", "-b", batch, "--json", "--markdown", md)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout.strip().splitlines()[-1])["environment"]["others_cpu_share"] == 0.6
    assert WARNED.format("the arms") in result.stderr
    assert "**Warning:** other processes used 60% of the CPUs while the arms ran" in md.read_text()
    busy(0.05)  # a quiet machine: recorded, not warned about
    result = invoke("bench", "-q", questions, "--model", tiny_saved, "-n", 4, "-d", "trie", "-b", batch, "--markdown", md)
    assert result.exit_code == 0, result.output
    assert "warning" not in result.stderr and "Warning" not in md.read_text() and "others_cpu_share: 0.05" in md.read_text()


def test_generate_records_the_share_per_prompt_and_warns_once(busy, questions, tiny_saved):
    busy(0.6)
    result = invoke("generate", "-p", questions, "--model", tiny_saved, "-n", 4, "--json")
    assert result.exit_code == 0, result.output
    records = [json.loads(line) for line in result.stdout.strip().splitlines()]
    assert [r["others_cpu_share"] for r in records] == [0.6, 0.6]
    assert result.stderr.count(WARNED.format("the prompts")) == 1
    result = invoke("generate", "-p", questions, "--model", tiny_saved, "-n", 4, "-b", 2, "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout.strip().splitlines()[-1])["batch"]["others_cpu_share"] == 0.6
    assert WARNED.format("the batch") in result.stderr
    busy(None)  # no /proc, or too short to tell
    result = invoke("generate", "-p", questions, "--model", tiny_saved, "-n", 4)
    assert result.exit_code == 0 and "warning" not in result.stderr


def test_profile_bound_records_the_share_in_its_report_and_profile(busy, tmp_path):
    shape = tmp_path / "tiny" / "config.json"
    shape.parent.mkdir()
    shape.write_text(json.dumps(dict(model_type="llama", hidden_size=8, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2,
                                     num_key_value_heads=1, vocab_size=96, max_position_embeddings=64)))
    busy(0.6)
    out = tmp_path / "out"
    result = invoke("profile-bound", "--shape", shape, "--k", "1", "--w", "0,1", "--context", "4", "--repeats", 1, "--out", out, "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout.strip().splitlines()[-1])["others_cpu_share"] == 0.6
    assert json.loads((out / "profile-tiny.json").read_text())["others_cpu_share"] == 0.6
    assert WARNED.format("the sweep") in result.stderr


def test_tune_tree_records_the_share_in_the_shape_file(busy, tiny_saved, tmp_path):
    busy(0.6)
    out = tmp_path / "shape.json"
    result = invoke("tune-tree", "--model", tiny_saved, "--eagle-head", tiny_saved / "head", "--out", out, "--limit", 1, "-n", 4,
                    "--nodes", 3, "--depth", 2, "--width", 2, "--finalists", 1)
    assert result.exit_code == 0, result.output
    assert json.loads(out.read_text())["others_cpu_share"] == 0.6
    assert WARNED.format("the tree sizes") in result.stderr


def test_every_output_carries_the_share_through_the_api(busy, tiny_saved):
    """`Output.others_cpu_share`, one prompt or a batch's rows, is what the generate record and
    the server's `ngspec` object show (None where the watch cannot tell: left out of both)."""
    from ngspec import Speculator
    from ngspec.server import ngspec_stats

    spec = Speculator.load(str(tiny_saved), drafter="trie")
    busy(0.6)
    out = spec.generate(PROMPT, 4, raw=True)
    assert out.others_cpu_share == 0.6 and out.as_dict()["others_cpu_share"] == 0.6
    assert ngspec_stats(out, "trie")["others_cpu_share"] == 0.6
    assert [o.others_cpu_share for o in spec.generate_batch([PROMPT, PROMPT.upper(), "x"], 4, batch_size=2, raw=True)] == [0.6] * 3
    busy(None)
    out = spec.generate(PROMPT, 4, raw=True)
    assert "others_cpu_share" not in out.as_dict() and "others_cpu_share" not in ngspec_stats(out, "trie")
