"""`benchmarks/cli_fuzz.py`: every command line it draws parses as `ngspec generate` options (a
misspelt option would turn every run into a usage error that the search counts as refused), and
its verdicts tell an exact run, ngspec's own errors and findings apart."""

import json
import random

import pytest
import typer

from conftest import benchmark_script
from ngspec.cli.app import app
from ngspec.prompts import load_prompts

cli_fuzz = benchmark_script("cli_fuzz")


def test_every_drawn_command_line_parses(tmp_path):
    files = cli_fuzz.prompt_files(tmp_path)
    assert all(f.is_file() for f in files)
    for path in (f for f in files if f.suffix == ".jsonl"):  # the same records as a .json array, read as the same prompts
        twin = cli_fuzz.json_twin(path, tmp_path)
        assert [(p.text, p.turns) for p in load_prompts(twin)] == [(p.text, p.turns) for p in load_prompts(path)]
    generate = typer.main.get_command(app).commands["generate"]
    seen = set()
    for n in range(300):
        args = cli_fuzz.draw(random.Random(f"0 {n}"), files, "heads/h", "datastores/d", "shape.json", tmp_path)
        assert args[0] == "generate"
        generate.make_context("generate", args[1:])  # raises on an unknown option or a value of the wrong type
        seen.add(args[args.index("-d") + 1])
    assert seen == set(cli_fuzz.DRAFTERS)


def test_without_a_head_the_eagle_drafters_are_not_drawn(tmp_path):
    files = cli_fuzz.prompt_files(tmp_path)
    drafters = {a[a.index("-d") + 1] for a in (cli_fuzz.draw(random.Random(n), files, None, None, None, tmp_path) for n in range(200))}
    assert drafters == set(cli_fuzz.DRAFTERS) - {"eagle", "eagle+search"}


def row(exact: bool) -> str:
    return json.dumps({"prompt": "p", "greedy_check": {"exact_match": exact, "first_mismatch": None if exact else 3, "near_tie_margin": 0.5}})


@pytest.mark.parametrize(
    ("code", "output", "exc", "verdict"),
    [
        (0, row(True) + "\n" + row(True), None, "ok"),
        (0, row(True) + "\n" + row(False), None, "FINDING"),  # a row that differs from plain decoding
        (1, row(False) + "\nerror: 1 prompt(s) failed", None, "FINDING"),
        (1, row(True) + "\nerror: 1 prompt(s) failed: f.jsonl:2 (the others finished)", None, "ngspec-error"),
        (2, "Usage: ngspec generate\nError: No such option: --nope", None, "refused"),
        (1, "error: TypeError: bad (set NGSPEC_DEBUG=1 for the traceback)", None, "FINDING"),  # not ngspec's own error
        (1, "Traceback (most recent call last):\n  ...", None, "FINDING"),
        # ngspec's own error, in Python's words rather than the input's: for the run, or for one prompt
        (1, "error: could not load model 'm': 'int' object has no attribute 'items'", None, "FINDING"),
        (1, json.dumps({"id": 2, "error": "unhashable type: 'list'"}) + "\nerror: 1 prompt(s) failed: f.jsonl:2 (the others finished)", None, "FINDING"),
        (1, "", ValueError("escaped"), "FINDING"),
        (0, "", SystemExit(0), "ok"),
        (3, "", None, "FINDING"),
    ],
)
def test_verdicts(code, output, exc, verdict):
    assert cli_fuzz.judge(code, output, exc)[0] == verdict


@pytest.mark.parametrize(
    ("stops", "text", "reason", "fault"),
    [
        (["\\n"], "one line\n", "stop", None),  # typed: a backslash and an n mean a newline
        (["\\n"], "one line\\n and on", "length", None),  # ... so the two characters stop nothing
        (["\\n"], "one line\nand on", "length", "ended by length with stop string '\\n'"),
        (["\n"], "a\nb", "eos", "ended by eos"),  # a real newline, as a script passes it
        (["\\\\"], "C:\\", "stop", None),
        ([".", "\\t"], "no stop here", "stop", "its text lacks"),
        (["<|im_end|>", "."], "no stop here", "stop", None),  # a special token stops unseen in the text
        (["<|im_end|>"], "text", "eos", None),
        ([], "a.\n", "length", None),
    ],
)
def test_a_row_must_end_at_the_first_stop_string_its_text_holds(stops, text, reason, fault):
    args = ["generate", "-p", "f.txt", *[x for stop in stops for x in ("--stop", stop)], "--json"]
    found = cli_fuzz.stop_fault(args, [{"id": 1, "text": text, "finish_reason": reason}])
    assert (found is None) if fault is None else (fault in found), found
    printed = json.dumps({"id": 1, "text": text, "finish_reason": reason, "greedy_check": {"exact_match": True}})
    assert cli_fuzz.judge(0, printed, None, args)[0] == ("ok" if fault is None else "FINDING")


def test_what_a_run_left_behind_counts_reachable_tensors_and_modules():
    import torch

    before = cli_fuzz.held()
    kept = [torch.zeros(4, 2**20), torch.nn.Linear(2, 2)]  # 16 MB, and a module holding two more tensors
    after = cli_fuzz.held()
    assert after["tensors_gb"] - before["tensors_gb"] == pytest.approx(16 / 1024, abs=1e-4)
    assert after["modules"] == before["modules"] + 1
    assert after["objects"] > 1000  # Python's tracked objects: nothing here is frozen
    if before["rss_gb"] is not None:  # Linux
        assert 0 < after["trimmed_rss_gb"] <= after["rss_gb"] + 0.01
    del kept
