"""bench with row drafters: arms per (k, w) and layout, sweeps, heatmaps, the ablation; bad input."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from ngspec.bench.runner import make_arms
from ngspec.cli.app import app
from ngspec.drafters import DrafterOptions

runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def test_arms_cover_the_grid_for_row_drafters_only():
    arms = make_arms(["trie", "mixed"], DrafterOptions(), [1, 4], [2], ["tree", "rows"])
    labels = [a.label for a in arms]
    assert labels[:3] == ["hf-greedy", "hf-prompt-lookup", "vanilla"]
    assert "trie (tree)" in labels and "trie (rows)" in labels
    assert "mixed k=4 w=2 (rows)" in labels and len(labels) == 3 + 2 + 4
    assert {a.grid_cell for a in arms if a.drafter == "mixed"} == {(1, 2), (4, 2)}
    single = make_arms(["mixed"], DrafterOptions(k=3, w=5), [3], [5], ["tree"])
    assert [a.label for a in single][-1] == "mixed"


@pytest.mark.slow
def test_bench_grid_end_to_end(tmp_path):
    result = invoke("bench", "-q", "examples/prompts.jsonl", "--limit", 1, "-n", 12, "-d", "mixed",
                    "--k", "1,2", "--w", "2", "--verify", "both", "--plots", tmp_path, "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout.strip().splitlines()[-1])
    arms = {a["arm"]: a for a in report["arms"]}
    assert {"mixed k=1 w=2 (tree)", "mixed k=2 w=2 (rows)"} <= set(arms)
    assert all(a["exact_match"] == 1.0 for a in arms.values())
    assert {(s["drafter"], s["layout"]) for s in report["sweeps"]} == {("mixed", "tree"), ("mixed", "rows")}
    for sweep in report["sweeps"]:  # the fastest cell against the next: one prompt gives no interval
        assert sweep["best_vs_runner_up"] >= 1.0 and sweep["interval_95"] is None and sweep["runner_up_by_speedup"] != sweep["best_by_speedup"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bench-mixed-rows.png", "bench-mixed-tree.png"]
    ablation = {a["arm"]: a for a in report["ablation"]}
    strategies = ablation["mixed k=2 w=2 (tree)"]["strategies"]
    assert set(strategies) <= {"context", "bigram"} and sum(s["rows"] for s in strategies.values()) > 0


def test_a_batched_grid_sweeps_every_cell_against_vanilla_and_draws_its_own_heatmaps(tiny_saved, tmp_path):
    """A batched grid was reported arm by arm only: no best cell, no heatmap, no ablation. Its
    heatmaps are named by the batch size, so that they keep batch size 1's beside them, and its
    speedup is against vanilla at that batch size."""
    prompts = tmp_path / "q.jsonl"
    prompts.write_text('{"prompt": "Say a b a b a b."}\n{"prompt": "Count: 1 2 3 1 2 3"}\n{"prompt": "x y x y"}\n')
    plots = tmp_path / "plots"
    result = invoke("bench", "-q", prompts, "--model", tiny_saved, "-n", 8, "-d", "context-ngram", "--k", "1,2", "--w", "1..2",
                    "-b", 2, "--rounds", 1, "--plots", plots, "--markdown", tmp_path / "grid.md")
    assert result.exit_code == 0, result.output
    md = (tmp_path / "grid.md").read_text()  # the report file keeps the sweep's lines too
    assert "\nSweeps:\n\n- context-ngram (tree): best by wall time k=" in md and "bench-context-ngram-tree-b2.png" in md
    assert "context-ngram (tree): best by wall time k=" in result.output and "x vs vanilla; " in result.output, result.output
    assert "the runner-up k=" in result.output and "no interval from one round" in result.output
    assert "most tokens per call k=" in result.output and "bench-context-ngram-tree-b2.png" in result.output
    assert [p.name for p in plots.iterdir()] == ["bench-context-ngram-tree-b2.png"]
    result = invoke("bench", "-q", prompts, "--model", tiny_saved, "-n", 8, "-d", "context-ngram", "--k", "1,2", "--w", "1",
                    "-b", 2, "--rounds", 1, "--plots", plots, "--json")
    report = json.loads(result.stdout.strip().splitlines()[-1])
    cells = {a["arm"]: a for a in report["arms"] if a["arm"].startswith("context-ngram")}
    assert set(cells) == {"context-ngram k=1 w=1", "context-ngram k=2 w=1"} and all(a["exact_match"] == 1.0 for a in cells.values())
    [sweep] = report["sweeps"]
    best, runner_up = sorted(cells.values(), key=lambda a: a["speedup"], reverse=True)
    assert (sweep["drafter"], sweep["layout"]) == ("context-ngram", "tree") and best["arm"] == f"context-ngram k={sweep['best_by_speedup'][0]} w=1"
    assert runner_up["arm"] == f"context-ngram k={sweep['runner_up_by_speedup'][0]} w=1" and sweep["interval_95"] is None  # one round
    assert sweep["best_vs_runner_up"] == pytest.approx(best["tokens_per_second"] / runner_up["tokens_per_second"])
    assert report["plots"] == [str(plots / "bench-context-ngram-tree-b2.png")]
    mixed = invoke("bench", "-q", prompts, "--model", tiny_saved, "-n", 8, "-d", "mixed", "--k", 2, "--w", 2, "-b", 2, "--rounds", 2, "--json",
                   "--markdown", tmp_path / "mixed.md")
    [abl] = json.loads(mixed.stdout.strip().splitlines()[-1])["ablation"]  # every row of both rounds, as batch size 1 sums its prompts
    md = (tmp_path / "mixed.md").read_text()
    assert "Sweeps:" not in md and "Row drafters: rows drafted and tokens accepted per strategy" in md
    assert f"| mixed | {next(iter(abl['strategies']))} | " in md  # the arm on its first strategy's row
    assert abl["arm"] == "mixed" and set(abl["strategies"]) <= {"context", "bigram"} and sum(s["rows"] for s in abl["strategies"].values()) > 0
    # the rows a step drafts follow from the tokens so far, which are plain decoding's in a batch or
    # alone: two batched rounds draft twice what one pass over the prompts at batch size 1 drafts
    alone = invoke("bench", "-q", prompts, "--model", tiny_saved, "-n", 8, "-d", "mixed", "--k", 2, "--w", 2, "--json")
    [once] = json.loads(alone.stdout.strip().splitlines()[-1])["ablation"]
    assert abl["strategies"] == {name: {"rows": 2 * v["rows"], "tokens_accepted": 2 * v["tokens_accepted"], "tokens_per_row": v["tokens_per_row"]}
                                 for name, v in once["strategies"].items()}
    assert abl["accepted_row_rank"] == {rank: 2 * n for rank, n in once["accepted_row_rank"].items()}


@pytest.mark.parametrize(
    ("interval", "batch_size", "said"),
    [((1.02, 1.09), 1, "1.050x the runner-up k=2 w=1, 95% interval 1.020-1.090x"),
     ((0.97, 1.12), 1, "level with the runner-up k=2 w=1: 1.050x, 95% interval 0.970-1.120x; more prompts (--limit) narrow it"),
     ((0.97, 1.12), 4, "level with the runner-up k=2 w=1: 1.050x, 95% interval 0.970-1.120x; more --rounds narrow it"),
     (None, 1, "1.050x the runner-up k=2 w=1, no interval from one prompt"),
     (None, 4, "1.050x the runner-up k=2 w=1, no interval from one round")],
)
def test_a_sweep_says_whether_its_fastest_cell_is_told_apart_from_the_runner_up(tmp_path, interval, batch_size, said):
    from types import SimpleNamespace

    from ngspec.cli.bench import _sweeps

    arms = make_arms(["mixed"], DrafterOptions(), [1, 2, 4], [1], ["tree"])
    speed = {"mixed k=1 w=1": 1.10, "mixed k=2 w=1": 1.15, "mixed k=4 w=1": 1.20}
    summaries = [SimpleNamespace(arm=a.label, speedup=speed.get(a.label, 1.0), tokens_per_call=2.0 + speed.get(a.label, 0)) for a in arms]
    asked = []

    def paired(arm, base):
        asked.append((arm, base))
        return 1.05, interval

    report = {}
    lines, draws = _sweeps(report, arms, summaries, tmp_path, {"model": "m", "device": "cpu"}, "hf-greedy", paired, batch_size)
    assert asked == [("mixed k=4 w=1", "mixed k=2 w=1")]
    assert len(draws) == 1 and not list(tmp_path.iterdir())  # drawn once the report is shown (`_finish`)
    path, draw = draws[0]
    assert str(path) == report["plots"][0] and draw() == path and path.is_file()
    assert lines[0] == f"mixed (tree): best by wall time k=4 w=1 (1.20x vs hf-greedy; {said}); most tokens per call k=4 w=1 (3.20)"
    assert report["sweeps"][0]["runner_up_by_speedup"] == [2, 1] and report["sweeps"][0]["interval_95"] == (list(interval) if interval else None)


@pytest.mark.parametrize(
    "args, message",
    [
        (["generate", "-p", "examples/rag_ngspec.txt", "-d", "mixed", "--k", "0"], "--k"),
        (["generate", "-p", "examples/rag_ngspec.txt", "--verify", "diagonal"], "--verify must be tree or rows"),
        (["bench", "-q", "examples/prompts.jsonl", "-d", "mixed", "--w", "3..1"], "inverted range"),
        (["bench", "-q", "examples/prompts.jsonl", "--verify", "all"], "--verify must be tree, rows or both"),
        (["bench", "-q", "examples/prompts.jsonl", "-d", "vanilla,trie,nope"], "unknown drafter 'nope'"),
    ],
)
def test_bad_row_options_fail_cleanly(args, message):
    result = invoke(*args)
    assert result.exit_code == 1
    assert message in result.output and "Traceback" not in result.output


@pytest.mark.slow
def test_foreign_or_damaged_bigram_table_is_refused(tmp_path):
    from ngspec.drafters.ngram_tables import NgramTables, extend, save_tables
    import numpy as np

    bigram = np.zeros((49152, 2), dtype=np.int64)
    path = tmp_path / "other.npz"
    save_tables(NgramTables("someone-else", np.arange(4), bigram, extend(bigram, 2)), path, "other-model")
    result = invoke("generate", "-p", "examples/rag_ngspec.txt", "-d", "bigram", "-n", 4, "--bigram-table", path)
    assert result.exit_code == 1 and "built for another model (other-model" in result.output
    path.write_bytes(b"garbage")
    result = invoke("generate", "-p", "examples/rag_ngspec.txt", "-d", "bigram", "-n", 4, "--bigram-table", path)
    assert result.exit_code == 1 and "damaged n-gram table" in result.output
    result = invoke("generate", "-p", "examples/rag_ngspec.txt", "-d", "trie", "-n", 4, "--bigram-table", path)
    assert result.exit_code == 1 and "only used by the unigram, bigram and mixed" in result.output


def test_drafters_may_be_repeated_or_comma_separated():
    from ngspec.cli.bench import split_names

    assert split_names(["vanilla,trie", "eagle+search", " search , "]) == ["vanilla", "trie", "eagle+search", "search"]
    assert split_names(["trie"]) == ["trie"]


def test_an_arm_that_drafted_no_row_says_so_in_the_ablation():
    """context-ngram on a context without repeats drafts nothing: its arm is a row saying so, not
    a table with a header and no rows."""
    from ngspec.bench import grid

    abl = [{"arm": "context-ngram k=1 w=1", "strategies": {}, "accepted_row_rank": {}},
           {"arm": "mixed k=2 w=1", "strategies": {"bigram": {"rows": 4, "tokens_accepted": 2, "tokens_per_row": 0.5}}, "accepted_row_rank": {1: 2}}]
    assert grid.ablation_rows(abl) == [["context-ngram k=1 w=1", "no rows drafted", "0", "0", "0.000", ""],
                                       ["mixed k=2 w=1", "bigram", "4", "2", "0.500", "1:2"]]
