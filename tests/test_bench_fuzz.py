"""`benchmarks/bench_fuzz.py`: every command line it draws parses as `ngspec bench` options (a
misspelt option would turn every run into a usage error that the search counts as refused), and
its report check tells a clean report from one with a differing arm, a near-tie or a missing
report file."""

import json
import random

import pytest
import typer

from conftest import benchmark_script
from ngspec.cli.app import app

bench_fuzz = benchmark_script("bench_fuzz")


def test_every_drawn_command_line_parses(tmp_path):
    files = bench_fuzz.prompt_files(tmp_path)
    bench = typer.main.get_command(app).commands["bench"]
    seen, options = set(), set()
    for n in range(300):
        args = bench_fuzz.draw(random.Random(f"0 {n} bench"), files, "heads/h", "datastores/d", tmp_path)
        assert args[0] == "bench"
        bench.make_context("bench", args[1:])  # raises on an unknown option or a value of the wrong type
        seen.update(args[args.index("-d") + 1].split(","))
        options.update(a for a in args if a.startswith("--"))
    assert seen == set(bench_fuzz.DRAFTERS)
    assert {"--versus", "--rounds", "--interleave-batches", "--verify", "--turns", "--json-out", "--markdown", "--temperature", "--k"} <= options


def test_without_a_head_the_eagle_drafters_are_not_drawn(tmp_path):
    files = bench_fuzz.prompt_files(tmp_path)
    drawn = (bench_fuzz.draw(random.Random(n), files, None, None, tmp_path) for n in range(200))
    drafters = {d for a in drawn for d in a[a.index("-d") + 1].split(",")}
    assert drafters == set(bench_fuzz.DRAFTERS) - {"eagle", "eagle+search"}


def report(*arms) -> str:
    return "progress on stderr is not here\n" + json.dumps({"arms": [{"arm": a, "exact_match": e, "largest_tie_margin": t} for a, e, t in arms]})


@pytest.mark.parametrize(
    ("arms", "fault"),
    [
        ([("hf-greedy", None, None), ("trie", 1.0, None)], None),
        ([("vanilla", 1.0, None), ("trie", 0.5, None)], "not identical"),
        ([("vanilla", 1.0, None), ("search", 1.0, 0.01)], "near-ties"),
        ([], "no arms"),
    ],
)
def test_a_report_is_checked_arm_by_arm(arms, fault):
    found = bench_fuzz.check_report(["bench"], report(*arms))
    assert (found is None) if fault is None else (fault in found)


def test_exact_arms_must_report_the_same_number_of_tokens():
    arms = [{"arm": "hf-greedy", "exact_match": None, "tokens": 30}, {"arm": "vanilla", "exact_match": 1.0, "tokens": 32},
            {"arm": "trie", "exact_match": 1.0, "tokens": 32}, {"arm": "hf-prompt-lookup", "exact_match": None, "tokens": 29}]
    assert bench_fuzz.check_report(["bench"], json.dumps({"arms": arms})) is None
    arms[2]["tokens"] = 16  # exact over a part of the answer only
    assert "different token counts: {'vanilla': 32, 'trie': 16}" in bench_fuzz.check_report(["bench"], json.dumps({"arms": arms}))


def test_the_report_files_asked_for_must_be_written_and_match(tmp_path):
    printed = report(("trie", 1.0, None))
    out, md = tmp_path / "r.json", tmp_path / "r.md"
    args = ["bench", "--json-out", str(out), "--markdown", str(md)]
    assert "was not written" in bench_fuzz.check_report(args, printed)
    out.write_text(json.dumps({"arms": [{"arm": "vanilla", "exact_match": 1.0, "largest_tie_margin": None}]}))
    md.write_text("| arm |\n")
    assert "other arms" in bench_fuzz.check_report(args, printed)
    out.write_text(printed.splitlines()[-1])
    assert bench_fuzz.check_report(args, printed) is None
    assert bench_fuzz.check_report(["bench"], "no report") == "no JSON report on stdout"


def test_every_sweep_must_have_its_heatmaps_drawn(tmp_path):
    drawn = tmp_path / "bench-mixed-tree-b2.png"
    sweep = {"drafter": "mixed", "layout": "tree", "best_by_speedup": [1, 2], "best_by_tokens_per_call": [2, 2]}
    printed = json.dumps({"arms": [{"arm": "vanilla", "exact_match": 1.0}], "sweeps": [sweep], "plots": [str(drawn)]})
    assert "were not all drawn" in bench_fuzz.check_report(["bench"], printed)
    drawn.write_bytes(b"png")
    assert bench_fuzz.check_report(["bench"], printed) is None
    assert "one per sweep" in bench_fuzz.check_report(["bench"], printed.replace(', "plots": [' + json.dumps(str(drawn)) + "]", ""))


@pytest.mark.parametrize(("batch", "cells", "plots_written"), [("1", ["--k", "1,2", "--w", "1"], True), ("2", ["--k", "1,2", "--w", "1"], True), ("2", ["--k", "1", "--w", "2"], False)])
def test_a_bad_report_path_replaces_the_drawn_one_and_says_whether_bench_writes_it(tmp_path, batch, cells, plots_written):
    """`bad_output` swaps one report path for one that cannot be written; bench writes --json-out
    and --markdown always, --plots only for a grid's heatmaps."""
    bench = typer.main.get_command(app).commands["bench"]
    args = ["bench", "--json", "-q", "q.jsonl", "-d", "mixed,trie", "-n", "4", "-b", batch, "--markdown", str(tmp_path / "r.md"),
            "--plots", str(tmp_path / "plots"), *cells]
    flags = set()
    for n in range(40):
        bad, written = bench_fuzz.bad_output(random.Random(n), args, tmp_path)
        flag, path = bad[-2], bad[-1]
        flags.add(flag)
        kept = args[: args.index(flag)] + args[args.index(flag) + 2 :] if flag in args else args
        assert bad[:-2] == kept  # the rest of the line as drawn, the drawn path of that option gone
        bench.make_context("bench", bad[1:])
        blocked = any(p.is_file() for p in [tmp_path / path, *(tmp_path / path).parents])
        assert blocked or (flag != "--plots" and (tmp_path / path).is_dir()), bad
        assert written == (flag != "--plots" or plots_written)
    assert flags == {"--json-out", "--markdown", "--plots"}
