"""`bench` stopped by Ctrl-C (or SIGTERM) keeps what it measured: the prompts every arm finished
(with --batch-size, the whole rounds) are reported, to the terminal and to --json-out and
--markdown, and the command exits non-zero saying how far it got. Stopped before anything was
measured whole, it reports nothing and writes no file."""

import json

from typer.testing import CliRunner

from ngspec.cli.app import app

runner = CliRunner()


def _questions(tmp_path, n):
    path = tmp_path / "q.jsonl"
    path.write_text("".join(json.dumps({"question_id": i, "category": "rag", "turns": [f"Say the word number {i} three times."]}) + "\n" for i in range(n)))
    return path


def _interrupt_run_arm(monkeypatch, when):
    """Make `run_arm` raise KeyboardInterrupt, as Ctrl-C would, at the first call ``when(pid)`` picks."""
    import ngspec.bench.runner as bench_runner

    real = bench_runner.run_arm

    def run_arm(engine, arm, ids, cfg, res, pid, calibration=None):
        if when(pid):
            raise KeyboardInterrupt
        return real(engine, arm, ids, cfg, res, pid, calibration)

    monkeypatch.setattr(bench_runner, "run_arm", run_arm)


def test_a_bench_stopped_on_its_second_prompt_reports_the_first(tiny_saved, tmp_path, monkeypatch):
    md, report_file = tmp_path / "b.md", tmp_path / "b.json"
    timed = []
    _interrupt_run_arm(monkeypatch, lambda pid: pid != "warm-up" and (timed.append(pid) or len(set(timed)) == 2))
    args = ["bench", "--model", str(tiny_saved), "-q", str(_questions(tmp_path, 3)), "-n", "6", "-d", "trie", "--versus", "vanilla"]
    result = runner.invoke(app, [*args, "--json", "--markdown", str(md), "--json-out", str(report_file)])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert "interrupted after 1 of 3 prompt runs; the report (and " in result.stderr and "covers only those" in result.stderr
    report = json.loads(result.stdout)
    assert json.loads(report_file.read_text()) == report
    assert report["environment"]["interrupted"] == "after 1 of 3 prompt runs" and report["environment"]["prompts"] == 3
    arms = {a["arm"]: a for a in report["arms"]}
    assert set(arms) == {"hf-greedy", "hf-prompt-lookup", "vanilla", "trie"}
    assert all(a["exact_match"] == 1.0 and a["tokens"] > 0 for a in arms.values())
    assert [p["id"] for p in report["prompts"]] == ["0"]
    assert "interrupted: after 1 of 3 prompt runs" in md.read_text()
    # the tables, not JSON: the same report on the terminal, then the same one line
    timed.clear()
    result = runner.invoke(app, args)
    assert result.exit_code == 1 and "interrupted after 1 of 3 prompt runs; the report covers" in result.stderr
    assert "bench (interrupted after 1 of 3 prompt runs): 3 prompts" in result.stdout and "trie" in result.stdout


def test_a_bench_stopped_before_a_prompt_finished_writes_nothing(tiny_saved, tmp_path, monkeypatch):
    md = tmp_path / "b.md"
    _interrupt_run_arm(monkeypatch, lambda pid: pid == "warm-up")
    result = runner.invoke(app, ["bench", "--model", str(tiny_saved), "-q", str(_questions(tmp_path, 2)), "-n", "6", "-d", "trie", "--json", "--markdown", str(md)])
    assert result.exit_code == 130 and result.stdout == "" and "interrupted" in result.stderr and "Traceback" not in result.output
    assert not md.exists()


def test_a_batched_bench_stopped_in_its_second_round_reports_the_first(tiny_saved, tmp_path, monkeypatch):
    from ngspec.engine import Engine

    real, calls = Engine.run_batch, []

    def run_batch(self, prompts, new_drafter, cfg, batch, *args, **kwargs):
        calls.append(1)
        if len(calls) == 2 + 2 + 1:  # after two arms' warm-ups and round 1's two runs
            raise KeyboardInterrupt
        return real(self, prompts, new_drafter, cfg, batch, *args, **kwargs)

    monkeypatch.setattr(Engine, "run_batch", run_batch)
    md = tmp_path / "b.md"
    args = ["bench", "--model", str(tiny_saved), "-q", str(_questions(tmp_path, 3)), "-n", "6", "-b", "2", "--rounds", "3", "-d", "trie",
            "--versus", "vanilla", "--json", "--markdown", str(md)]
    result = runner.invoke(app, args)
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert f"interrupted after 1 of 3 rounds; the report (and {md}) covers only those" in result.stderr
    report = json.loads(result.stdout)
    assert report["environment"]["interrupted"] == "after 1 of 3 rounds" and report["environment"]["rounds"] == 3
    arms = {a["arm"]: a for a in report["arms"]}
    assert set(arms) == {"vanilla", "trie"} and all(len(a["round_speedups"]) == 1 and a["exact_match"] == 1.0 for a in arms.values())
    assert "interrupted: after 1 of 3 rounds" in md.read_text()
    calls.clear()
    result = runner.invoke(app, args[:-3])  # the tables
    assert result.exit_code == 1 and "bench (interrupted after 1 of 3 rounds): 3 prompts in batches of 2" in result.stdout
