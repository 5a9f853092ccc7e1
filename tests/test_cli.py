"""The commands through Typer's runner: JSON output, equality across drafters, bad input."""

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ngspec.cli.app import app
from ngspec.errors import NgspecError
from ngspec.versions import versions

runner = CliRunner()
PROMPT = "Repeat exactly: the quick brown fox jumps over the lazy dog. The quick brown fox jumps over the lazy dog."


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def test_help_does_not_load_torch_or_transformers():
    """`ngspec --help` and every command's --help stay quick: the command modules import the model
    stack (torch, transformers: seconds) only when a command runs."""
    import subprocess
    import sys

    code = "import sys, ngspec.cli.app; print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_python_dash_m_ngspec_is_the_ngspec_command():
    """`python -m ngspec` (no script on PATH, or a chosen interpreter) runs the same command,
    its usage naming how it was called."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "ngspec", "generate", "--no-such-option"], capture_output=True, text=True)
    assert out.returncode == 2 and "Usage: python -m ngspec generate" in out.stderr and "No such option" in out.stderr, out.stderr


def test_every_option_the_readme_gives_a_command_is_one_of_its_options():
    """The README's command lines (code blocks with their continuation lines, and inline code)
    name only options the command has: a renamed or removed option fails here, not in a user's
    shell."""
    from pathlib import Path

    import typer

    commands = typer.main.get_command(app).commands
    readme = (Path(__file__).parent.parent / "README.md").read_text()
    blocks = readme.split("```")  # odd pieces are code blocks: a command at a line's start (or after a pipe, or a path)
    lines = [m for b in blocks[1::2] for m in re.findall(r"(?:^[ \t]*|\| |/)ngspec ([a-z][a-z-]*)((?:[^#\n]|\n(?=\s+--))*)", b, re.M)]  # up to a comment
    spans = re.findall(r"`ngspec ([a-z][a-z-]*)([^`]*)`", "```".join(blocks[::2]))  # prose: inline code
    wrong, checked = [], 0
    for name, rest in lines + spans:
        assert name in commands, f"the README runs `ngspec {name}`, which is no command"
        options = {o for p in commands[name].params for o in p.opts + p.secondary_opts}
        for option in re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", rest):
            checked += 1
            if option not in options:
                wrong.append(f"ngspec {name} {option}")
    assert checked > 50 and not wrong, wrong


def test_a_piped_table_keeps_every_column_whole():
    """Piped to a file, Rich would cut a table to 80 columns ("tok…"); the console is made wide
    enough instead, and an explicit COLUMNS still wins."""
    import os
    import subprocess
    import sys

    code = (
        "from rich.table import Table; from ngspec.cli import render\n"
        "t = Table(*[f'column number {i} with a long header' for i in range(5)])\n"
        "t.add_row(*['1.234x (0.987-1.456)'] * 5); render.console.print(t)"
    )
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    piped = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env).stdout
    assert "…" not in piped and "column number 4 with a long header" in piped
    narrow = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env={**env, "COLUMNS": "80"}).stdout
    assert "…" in narrow


def test_a_short_table_keeps_its_title_on_one_line(capsys):
    from ngspec.cli import render

    render.summary_table("trie on SmolLM2-135M-Instruct (cpu, float32)", [("new tokens", "48")])
    assert capsys.readouterr().out.splitlines()[0].strip() == "trie on SmolLM2-135M-Instruct (cpu, float32)"


def test_a_bar_for_usually_cached_work_appears_only_when_the_work_runs(monkeypatch):
    """The kernel timing of a model's first run on a CPU (a minute or more) shows a bar; a run that
    reads the plan from the cache shows nothing."""
    import io

    from rich.console import Console

    from ngspec.cli import render

    out = io.StringIO()
    monkeypatch.setattr(render, "err_console", Console(file=out, force_terminal=True, width=100))
    with render.progress_when_called("timing matrix kernels (rounds)"):
        pass
    assert out.getvalue() == ""
    with render.progress_when_called("timing matrix kernels (rounds)", "{task.description} {task.completed}/{task.total}") as rounds:
        rounds(1, 8)
        rounds(2, 8)
    assert "timing matrix kernels (rounds) 2/8" in out.getvalue()


@pytest.fixture
def prompt_file(tmp_path):
    path = tmp_path / "p.txt"
    path.write_text(PROMPT)
    return path


def test_a_stop_string_typed_with_backslash_n_stops_at_a_newline(tmp_path):
    """A shell passes `--stop '\\n'` as a backslash and an n, which no answer holds, so the stop
    never came; it reads as a newline now (\\t a tab, \\\\ a backslash), as in llama.cpp."""
    prompt = tmp_path / "fruits.txt"
    prompt.write_text("List three fruits, one per line, nothing else.")
    result = invoke("generate", "-p", prompt, "-d", "trie", "-n", 48, "--stop", "\\n", "--json")
    assert result.exit_code == 0, result.output
    record = json.loads(result.stdout.strip().splitlines()[-1])
    assert record["finish_reason"] == "stop" and record["text"].endswith("\n") and "\n" not in record["text"][:-1], record["text"]


def test_stop_strings_read_backslash_escapes_and_leave_other_backslashes():
    from ngspec.cli.common import stop_strings

    assert stop_strings(["\\n", "a\\tb", "\\\\n", "\\x", "C:\\d", "\\r\\n", "plain"]) == ["\n", "a\tb", "\\n", "\\x", "C:\\d", "\r\n", "plain"]
    assert stop_strings(None) is None


@pytest.mark.slow
def test_generate_json_same_tokens_for_every_drafter(prompt_file):
    records = {}
    for drafter in ("vanilla", "prompt-lookup", "trie"):
        result = invoke("generate", "-p", prompt_file, "-d", drafter, "-n", 24, "--json")
        assert result.exit_code == 0, result.output
        records[drafter] = json.loads(result.stdout.strip().splitlines()[-1])
    keys = {"text", "token_ids", "new_tokens", "seconds", "tokens_per_second", "verify_calls", "mean_tokens_per_call", "draft_seconds", "prefill_seconds"}
    for rec in records.values():
        assert keys <= rec.keys()
        assert 0 < rec["prefill_share"] < 1 and rec["prefill_share"] == pytest.approx(rec["prefill_seconds"] / rec["seconds"])
        assert rec["token_ids"] == records["vanilla"]["token_ids"]
        assert rec["new_tokens"] == len(rec["token_ids"])
    assert records["vanilla"]["mean_tokens_per_call"] == 1.0
    assert records["trie"]["verify_calls"] <= records["vanilla"]["verify_calls"]


@pytest.mark.slow
def test_generate_human_output_streams_text_and_summary(prompt_file):
    result = invoke("generate", "-p", prompt_file, "-n", 8)
    assert result.exit_code == 0, result.output
    assert "tokens per call" in result.stdout


@pytest.mark.slow
def test_bench_reports_every_arm(tmp_path):
    questions = tmp_path / "q.jsonl"
    questions.write_text("".join(json.dumps({"question_id": i, "category": "rag", "turns": [t]}) + "\n" for i, t in enumerate([PROMPT, PROMPT.upper()])))
    md = tmp_path / "reports" / "bench.md"  # a directory that does not exist yet is created
    result = invoke("bench", "-q", questions, "--category", "rag", "-n", 12, "--json", "--markdown", md, "--versus", "trie")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout.strip().splitlines()[-1])
    arms = {a["arm"]: a for a in report["arms"]}
    assert set(arms) == {"hf-greedy", "hf-prompt-lookup", "vanilla", "trie", "prompt-lookup"}
    for name in ("vanilla", "trie", "prompt-lookup", "hf-prompt-lookup"):
        assert arms[name]["exact_match"] == 1.0
        low, high = arms[name]["speedup_interval"]  # two prompts: an interval around the speedup
        assert low <= arms[name]["speedup"] <= high
    assert arms["vanilla"]["tokens_per_call"] == 1.0
    assert sum(arms["trie"]["acceptance_histogram"].values()) > 0
    assert 0 < arms["trie"]["prefill_share"] < 1 and arms["hf-greedy"]["prefill_share"] is None  # transformers' own loop: unknown
    versus = {p["arm"]: p for p in report["versus"]}
    assert set(versus) == set(arms) - {"trie"}
    assert versus["vanilla"]["ratio"] == pytest.approx(arms["vanilla"]["speedup"] / arms["trie"]["speedup"])
    text = md.read_text()
    assert "| trie |" in text and "throughput vs trie" in text and "prefill share" in text


@pytest.mark.slow
def test_bench_compares_arms_as_batches(tmp_path):
    questions = tmp_path / "q.jsonl"
    texts = [PROMPT, PROMPT.upper(), PROMPT[: len(PROMPT) // 2]]
    questions.write_text("".join(json.dumps({"question_id": i, "category": "rag", "turns": [t]}) + "\n" for i, t in enumerate(texts)))
    md = tmp_path / "batch.md"
    result = invoke("bench", "-q", questions, "-n", 12, "-b", 2, "--rounds", 2, "-d", "trie", "--num-draft", 16, "--versus", "trie", "--json", "--markdown", md)
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout.strip().splitlines()[-1])
    arms = {a["arm"]: a for a in report["arms"]}
    assert set(arms) == {"vanilla", "trie"}  # transformers' arms pad batches their own way: left out
    env = report["environment"]
    assert env["batch_size"] == 2 and env["cpu"]  # the host's CPU and every drafter option, for ab_pool to compare
    assert env["device"] == f"{env['cpu']}, {env['torch_threads']} thread{'s' if env['torch_threads'] > 1 else ''}"  # as profile-bound names it
    assert env["drafting"]["num_draft"] == 16 and env["drafting"]["eagle_head"] is None and env["drafting"]["prefix_len"] == 3
    assert "drafting: (num_draft 16, " in md.read_text()
    for arm in arms.values():
        assert arm["exact_match"] == 1.0 and len(arm["round_speedups"]) == len(arm["round_seconds"]) == len(arm["round_step_cost"]) == 2
        assert min(arm["round_tokens_per_call"]) <= arm["tokens_per_call"] <= max(arm["round_tokens_per_call"])
        assert 0 < arm["prefill_share"] < 1
    assert arms["vanilla"]["speedup"] == 1.0 and arms["vanilla"]["tokens_per_call"] == 1.0
    assert arms["trie"]["tokens_per_call"] > 1.0
    # what each step verified: plain steps none; a trie row at most its step's widest, within --num-draft
    assert arms["vanilla"]["nodes_per_row"] == arms["vanilla"]["padded_per_row"] == 0 and arms["vanilla"]["step_cost"] == pytest.approx(1.0)
    assert 0 < arms["trie"]["nodes_per_row"] <= arms["trie"]["padded_per_row"] <= 16 and arms["trie"]["step_cost"] > 0
    assert set(report["step_definitions"]) == {"nodes_per_row", "padded_per_row", "step_cost"}
    assert report["versus"][0]["arm"] == "vanilla" and report["versus"][0]["ratio"] == pytest.approx(1 / arms["trie"]["speedup"])
    assert "| trie |" in md.read_text() and "nodes/row" in md.read_text()
    assert "mismatches" not in report and arms["trie"]["largest_tie_margin"] is None  # float32 on a CPU: no row splits


def test_batched_bench_prints_each_split_row_with_its_rounds_and_margin(tiny_saved, tmp_path, monkeypatch):
    """The batched bench's table is followed by every row `row_splits` found, named by its
    question's label (here one split injected: float32 on a CPU gives none)."""
    from ngspec.bench import batched
    from ngspec.check import GreedyCheck

    found = batched.row_splits
    monkeypatch.setattr(batched, "row_splits", lambda *a: found(*a) + [batched.RowSplit("trie", 1, (1, 2), GreedyCheck(False, 5, 0.125, 1.0, "bfloat16"))])
    questions = tmp_path / "q.jsonl"
    questions.write_text("".join(json.dumps({"question_id": f"q{i}", "category": "rag", "turns": [t]}) + "\n" for i, t in enumerate([PROMPT, PROMPT.upper()])))
    result = runner.invoke(app, ["bench", "-q", str(questions), "--model", str(tiny_saved), "-n", "6", "-b", "2", "--rounds", "2", "-d", "trie"],
                           env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "- trie, prompt q1 (rounds 1, 2): first differs at token 5, transformers' greedy top-2 margin there 0.125 (1 bfloat16 rounding step" in result.output


def test_the_terminal_lists_a_dozen_mismatches_and_counts_the_rest():
    from ngspec.cli.bench import LISTED, listed

    lines = [f"- row {i}" for i in range(LISTED + 3)]
    assert listed(lines[:LISTED]) == lines[:LISTED]
    assert listed(lines) == lines[:LISTED] + ["... and 3 more (every one in --markdown and the JSON)"]


@pytest.mark.parametrize(
    "args, message",
    [
        (["bench", "-q", "{prompt}", "-b", "0"], "at least 1"),
        (["bench", "-q", "{prompt}", "-b", "2", "--verify", "rows"], "use --verify tree"),
        (["bench", "-q", "{prompt}", "-b", "2", "--versus", "hf-greedy"], "left out of batches"),
        (["generate", "-p", "missing.txt"], "not found"),
        (["generate", "-p", "{empty}"], "empty"),
        (["generate", "-p", "{prompt}", "-d", "nope"], "unknown drafter"),
        (["generate", "-p", "{prompt}", "-n", "0"], "max-new-tokens"),
        (["generate", "-p", "{prompt}", "--num-draft", "0"], "--num-draft must be >= 1 (got 0)"),
        (["generate", "-p", "{prompt}", "--ngram-n", "3", "--prefix-len", "3"], "--prefix-len must be from 1 to --ngram-n - 1 (2) (got 3)"),
        (["generate", "-p", "{prompt}", "--temperature", "-1"], "temperature"),
        (["generate", "-p", "{prompt}", "--temperature", "nan"], "temperature must be >= 0 (got nan)"),
        (["bench", "-q", "{prompt}", "--temperature", "0.7", "--top-p", "nan"], "top_p must be in (0, 1] (got nan)"),
        (["train-eagle", "-c", "{prompt}", "--out", "new-head", "--noise", "inf"], "--noise must be >= 0 and finite (got inf)"),
        (["generate", "-p", "{prompt}", "--model", "./no/such/dir"], "not found"),
        (["generate", "-p", "{prompt}", "--dtype", "bfloat16", "--device", "cpu"], "float32"),
        (["bench", "-q", "{prompt}", "--category", "rag"], "no prompts of category"),
        (["bench", "-q", "{prompt}", "--versus", "nope"], "is not an arm of this run; give one of: hf-greedy, hf-prompt-lookup, vanilla, trie, prompt-lookup"),
        # only the arms the run has: none of transformers' in batches, its sampling baseline when sampling
        (["bench", "-q", "{prompt}", "-b", "2", "-d", "vanilla,trie", "--versus", "nope"], "give one of: vanilla, trie"),
        (["bench", "-q", "{prompt}", "--temperature", "0.7", "--versus", "hf-greedy"], "give one of: hf-sample, hf-prompt-lookup, vanilla, trie"),
        (["bench", "-q", "{prompt}", "--rounds", "0"], "--rounds must be at least 1 (got 0)"),
        (["generate", "-p", "{dir}"], "is a directory; give a .txt, .jsonl or .json prompt file"),
        (["generate", "-p", "{prompt}", "-d", "eagle", "--eagle-head", "{dir}", "--tree-choices", "{dir}"], "is a directory; --tree-choices takes a JSON file"),
        (["self-repetition", "--dataset", "{prompt}", "--questions", "{dir}"], "is a directory; --questions takes a .jsonl"),
        (["profile-bound", "--k", "1", "--w", "0", "--out", "{prompt}"], "is a file; give a directory"),
        (["build-datastore", "-c", "{prompt}", "--num-proc", "0"], "--num-proc"),
        (["synth-corpus", "--out", "{prompt}"], "already exists"),
        (["datastore-info", "{empty}"], "datastore not found"),
        (["generate", "-p", "{prompt}", "-d", "search", "--datastore", "no/such/store"], "no datastore at"),
        (["generate", "-p", "{prompt}", "-d", "trie", "--datastore", "{prompt}"], "only used by the search"),
        (["generate", "-p", "{prompt}", "-d", "search", "--deepen"], "--deepen is only used"),
        (["generate", "-p", "{prompt}", "-d", "search", "--search-depth", "0"], "--search-depth must be >= 1 (got 0)"),
        (["generate", "-p", "{prompt}", "-d", "eagle+search"], "need --eagle-head"),
        (["generate", "-p", "{prompt}", "-d", "bigram", "--k", "1,2"], "takes one number here"),
        # an option the drafter does not read was ignored without a word
        (["generate", "-p", "{prompt}", "--k", "2"], "--k is only used by the context-ngram, unigram, bigram and mixed drafters"),
        (["generate", "-p", "{prompt}", "-d", "eagle+search", "--eagle-head", "{dir}", "--num-draft", "8"], "--num-draft is only used by the trie drafter"),
        (["generate", "-p", "{prompt}", "--tree-depth", "3"], "--tree-depth is only used by the eagle and eagle+search drafters"),
        (["bench", "-q", "{prompt}", "-d", "trie,vanilla", "--head-float32"], "--head-float32 is only used by the eagle and eagle+search drafters"),
        (["generate", "-p", "{prompt}", "--batch-size", "0"], "--batch-size must be at least 1"),
        (["generate", "-p", "{prompt}", "--batch-size", "2", "--verify", "rows"], "use --verify tree"),
        (["generate", "-p", "{prompt}", "--rearrange-every", "-1"], "--rearrange-every"),
        (["generate", "-p", "{prompt}", "--rearrange-min-share", "1.5"], "--rearrange-min-share must be in [0, 1)"),
        (["generate", "-p", "{prompt}", "--batch-layout", "ragged"], "--batch-layout must be one of padded, packed"),
        (["generate", "-p", "{prompt}", "-d", "eagle", "--eagle-head", "{dir}", "--tree-choices", "{prompt}"], "expected a JSON list"),
        (["generate", "-p", "{prompt}", "-d", "eagle", "--eagle-head", "{dir}", "--tree", "dynamic", "--tree-choices", "{prompt}"], "--tree-choices is the shape of a static tree"),
        (["generate", "-p", "{prompt}", "-d", "eagle", "--eagle-head", "{dir}", "--tree", "static", "--tree-top-k", "4"], "--tree-top-k shapes the dynamic tree; a static tree's shape is --tree-choices"),
        (["generate", "-p", "{prompt}", "-d", "eagle", "--eagle-head", "{dir}", "--tree", "static", "--tree-depth", "3", "--total-tokens", "9"], "--tree-depth, --total-tokens shape the dynamic tree"),
        (["generate", "-p", "{prompt}", "-d", "eagle", "--eagle-head", "{dir}", "--total-tokens", "0"], "--tree-top-k, --tree-depth and --total-tokens must be at least 1"),
        (["tune-tree", "--eagle-head", "no/such/head", "--out", "x.json"], "no EAGLE head directory"),
        (["tune-tree", "--eagle-head", ".", "--out", "{prompt}"], "already exists"),
        (["tune-tree", "--eagle-head", ".", "--out", "new.json", "--batch-size", "0"], "--batch-size"),
        (["tune-tree", "--eagle-head", ".", "--out", "new.json", "--finalists", "0"], "--finalists must be at least 1"),
        (["tune-tree", "--eagle-head", ".", "--out", "new.json", "--width", "0", "-n", "0"], "--width must be at least 1 (got 0); --max-new-tokens must be at least 1 (got 0)"),
        (["tune-tree", "--eagle-head", ".", "--out", "new.json", "--min-nodes", "9", "--nodes", "4"], "--min-nodes 9 is more than --nodes 4"),
        (["tune-tree", "--eagle-head", ".", "--out", "{prompt}/shape.json"], "prompt.txt is a file, not a directory"),
        (["build-datastore", "-c", "{prompt}", "--out", "{prompt}/ds"], "prompt.txt is a file, not a directory"),
        (["bench", "-q", "{prompt}", "--json-out", "{dir}"], "is a directory; give the path of a file"),
        (["bench", "-q", "{prompt}", "--markdown", "{dir}"], "is a directory; give the path of a file"),
        (["synth-corpus", "--out", "{dir}", "--force"], "is a directory; give the path of a file"),
        (["synth-corpus", "--out", "{dir}/c.jsonl.gz"], "c.jsonl.gz names a compressed file: write"),
        (["train-eagle", "-c", "{prompt}", "--out", "{dir}/h", "--response-field", "answer"], "--input-field and --response-field go together"),
        (["build-datastore", "-c", "{prompt}", "--out", "{dir}/ds", "--input-field", "q"], "--input-field needs --response-field"),
        (["build-datastore", "-c", "{empty}", "--out", "{dir}/ds"], "unsupported file type"),  # fails under its progress bar
    ],
)
def test_bad_input_one_clear_line(tmp_path, args, message):
    (tmp_path / "empty.txt").write_text("  \n")
    (tmp_path / "prompt.txt").write_text(PROMPT)
    args = [a.format(empty=tmp_path / "empty.txt", prompt=tmp_path / "prompt.txt", dir=tmp_path) for a in args]
    result = invoke(*args)
    assert result.exit_code == 1
    assert message in result.stderr
    assert not result.stderr.startswith("\n") and "\n\n" not in result.stderr  # no bar's blank line off a terminal
    assert "Traceback" not in result.output + result.stderr


def test_tune_tree_refuses_a_large_tree_that_no_verification_can_hold(tiny_saved, tmp_path):
    """--nodes 10**9 calibrated a 299,592-node tree (every node of width 8 and depth 6), drafted
    whole on every step, on a model whose window holds 512 tokens."""
    result = invoke("tune-tree", "--model", tiny_saved, "--eagle-head", tiny_saved / "head", "--out", tmp_path / "shape.json", "--nodes", 10**9)
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert "--nodes 1000000000 is more than one verification can hold in the model's context window (512 tokens)" in result.stderr
    assert not (tmp_path / "shape.json").exists()


def test_a_tree_shape_file_makes_the_tree_static(tmp_path):
    """--tree-choices alone means its static tree (it was ignored under the default dynamic
    tree); --tree dynamic with it is refused above."""
    from ngspec.cli.drafting import Drafting

    shape = tmp_path / "shape.json"
    shape.write_text("[[0], [1], [0, 0]]")
    assert Drafting().eagle_options().tree == "dynamic"
    made = Drafting(tree_choices=shape).eagle_options()
    assert made.tree == "static" and made.choices == ((0,), (1,), (0, 0))
    assert Drafting(tree="static").eagle_options().tree == "static"
    # the dynamic tree's sizes: the defaults unless given
    assert (Drafting().eagle_options().top_k, Drafting().eagle_options().total_tokens) == (8, 32)
    assert Drafting(tree_top_k=3, total_tokens=12).eagle_options().total_tokens == 12


def test_unknown_cpu_kernel_setting_is_one_clear_line(prompt_file, monkeypatch):
    monkeypatch.setenv("NGSPEC_CPU_KERNELS", "fastest")
    result = invoke("generate", "-p", prompt_file, "-n", 2)
    assert result.exit_code == 1
    assert "NGSPEC_CPU_KERNELS must be auto or one of linear, transposed, packed" in result.stderr
    assert "Traceback" not in result.output + result.stderr


@pytest.mark.slow
def test_prompt_longer_than_context_window(tmp_path):
    path = tmp_path / "long.txt"
    path.write_text("word " * 9000)  # the default model's window is 8,192 tokens
    result = invoke("generate", "-p", path, "--raw")
    assert result.exit_code == 1
    assert "context window is 8192" in result.stderr


@pytest.mark.slow
@pytest.mark.parametrize("json_out", [True, False])
def test_one_at_a_time_a_long_prompt_fails_alone_and_the_others_run(tmp_path, json_out):
    """As in a batch: the prompt after the one that cannot run is still answered, and the run
    ends with exit code 1 naming the failed prompt."""
    prompts = tmp_path / "p.jsonl"
    rows = [{"id": "a", "prompt": PROMPT}, {"id": "long", "prompt": "word " * 9000}, {"id": "b", "prompt": "Count from one to ten."}]
    prompts.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    result = invoke("generate", "-p", prompts, "-n", 4, *(["--json"] if json_out else []))
    assert result.exit_code == 1 and "1 prompt(s) failed: long (the others finished)" in result.stderr
    assert "Traceback" not in result.output + result.stderr
    if json_out:
        lines = [json.loads(x) for x in result.stdout.strip().splitlines()]
        assert [r["id"] for r in lines] == ["a", "long", "b"] and "context window is 8192" in lines[1]["error"]
        assert lines[2]["new_tokens"] == 4
    else:
        assert "prompt long: the prompt has" in result.stderr and "prompt b" in result.stdout


@pytest.mark.slow
def test_search_with_a_datastore_of_another_tokenizer_is_refused(tmp_path, prompt_file):
    from ngspec.datastore.build import BuildOptions, build_datastore
    from ngspec.models import load_model

    corpus = tmp_path / "c.jsonl"
    corpus.write_text(json.dumps({"instruction": "Say hi", "response": "Hi there, friend."}) + "\n")
    out = tmp_path / "ds"
    build_datastore(str(corpus), load_model("default", device="cpu").tokenizer, "smol", out, BuildOptions())
    meta = json.loads((out / "meta.json").read_text())
    meta["tokenizer_fingerprint"] = "0" * 32
    (out / "meta.json").write_text(json.dumps(meta))
    result = invoke("generate", "-p", prompt_file, "-d", "search", "--datastore", out, "-n", 4)
    assert result.exit_code == 1
    assert "differs from this model's tokenizer" in result.stderr
    assert "Traceback" not in result.output + result.stderr


@pytest.mark.slow
def test_batched_generate_matches_one_at_a_time_and_a_long_prompt_fails_alone(tmp_path):
    prompts = tmp_path / "p.jsonl"
    rows = [{"id": "a", "prompt": PROMPT}, {"id": "long", "prompt": "word " * 9000}, {"id": "b", "prompt": "Count from one to ten."}]
    prompts.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    result = invoke("generate", "-p", prompts, "-d", "trie", "-n", 16, "--batch-size", 2, "--json")
    assert result.exit_code == 1
    assert "1 prompt(s) failed: long" in result.stderr
    lines = [json.loads(x) for x in result.stdout.strip().splitlines()]
    by_id = {r["id"]: r for r in lines if "id" in r}
    assert "context window" in by_id["long"]["error"]
    assert lines[-1]["batch"]["prompts"] == 3 and lines[-1]["batch"]["failed"] == 1
    assert lines[-1]["batch"]["joint_sizing"] is True
    assert lines[-1]["batch"]["rearrange_min_share"] == 0.2 and lines[-1]["batch"]["freed_entries"] >= 0
    alone = invoke("generate", "-p", prompts, "-d", "trie", "-n", 16, "--batch-size", 2, "--json", "--size-rows-alone", "--rearrange-every", 1, "--rearrange-min-share", 0)
    rows_alone = [json.loads(x) for x in alone.stdout.strip().splitlines()]
    assert rows_alone[-1]["batch"]["joint_sizing"] is False
    assert rows_alone[-1]["batch"]["rearrange_min_share"] == 0.0
    assert rows_alone[-1]["batch"]["rearrangements"] == rows_alone[-1]["batch"]["steps"]  # every step, whatever it frees
    assert {r["id"]: r.get("token_ids") for r in rows_alone if "id" in r} == {r["id"]: r.get("token_ids") for r in lines if "id" in r}
    packed = invoke("generate", "-p", prompts, "-d", "trie", "-n", 16, "--batch-size", 2, "--json", "--batch-layout", "packed", "--check")
    packed_rows = [json.loads(x) for x in packed.stdout.strip().splitlines()]
    assert lines[-1]["batch"]["layout"] == "padded" and packed_rows[-1]["batch"]["layout"] == "packed"
    # --check in a batch: every finished row against its own plain greedy decoding
    assert [r["greedy_check"]["exact_match"] for r in packed_rows if "token_ids" in r] == [True, True]
    assert packed_rows[-1]["batch"]["identical_to_plain"] == 2
    assert {r["id"]: r.get("token_ids") for r in packed_rows if "id" in r} == {r["id"]: r.get("token_ids") for r in lines if "id" in r}
    for pid in ("a", "b"):
        single = tmp_path / f"{pid}.txt"
        single.write_text(next(r["prompt"] for r in rows if r["id"] == pid))
        alone = invoke("generate", "-p", single, "-d", "vanilla", "-n", 16, "--json")
        assert by_id[pid]["token_ids"] == json.loads(alone.stdout.strip().splitlines()[-1])["token_ids"]


def test_generate_samples_plain_samplings_tokens_and_reports_the_seed(tmp_path):
    """Sampling with `--check`: every record compared with plain sampling at its seed, which the
    record carries (drawn when none was given); a seed gives the same tokens one at a time, in a
    batch and with `vanilla`."""
    prompts = tmp_path / "p.jsonl"
    rows = [{"id": "a", "prompt": PROMPT}, {"id": "b", "prompt": "Count from one to ten."}, {"id": "a2", "prompt": PROMPT}]
    prompts.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    sampled = ["-n", 16, "--temperature", "0.8", "--top-p", "0.95", "--json"]
    runs = {}
    for name, extra in {"batch": ["-d", "trie", "-b", 2, "--check"], "alone": ["-d", "trie", "--check"], "vanilla": ["-d", "vanilla"]}.items():
        result = invoke("generate", "-p", prompts, *sampled, "--seed", 3, *extra)
        assert result.exit_code == 0, result.stderr
        runs[name] = {r["id"]: r for r in map(json.loads, result.stdout.strip().splitlines()) if "id" in r}
    for name in ("batch", "alone"):
        assert all(r["greedy_check"]["exact_match"] and r["seed"] == 3 for r in runs[name].values())
        assert {i: r["token_ids"] for i, r in runs[name].items()} == {i: r["token_ids"] for i, r in runs["vanilla"].items()}
    assert runs["vanilla"]["a"]["token_ids"] == runs["vanilla"]["a2"]["token_ids"]  # one seed, one prompt: one sample
    unseeded = invoke("generate", "-p", prompts, *sampled, "-d", "trie", "-b", 2, "--check")
    records = [r for r in map(json.loads, unseeded.stdout.strip().splitlines()) if "id" in r]
    assert all(r["greedy_check"]["exact_match"] for r in records)
    assert len({r["seed"] for r in records}) == 3  # a seed drawn per prompt, the repeated one too
    text = invoke("generate", "-p", tmp_path / "a.txt" if (tmp_path / "a.txt").write_text(PROMPT) else None, "-n", 8, "--temperature", "0.8", "--check")
    assert text.exit_code == 0 and "identical to plain decoding" in text.stdout and "seed" in text.stdout


@pytest.mark.slow
def test_bench_with_a_datastore_reports_both_ceilings(tmp_path):
    from ngspec.datastore.build import BuildOptions, build_datastore
    from ngspec.models import load_model

    corpus = tmp_path / "c.jsonl"
    corpus.write_text(json.dumps({"instruction": "Repeat", "response": PROMPT}) + "\n")
    store = tmp_path / "ds"
    build_datastore(str(corpus), load_model("default", device="cpu").tokenizer, "smol", store, BuildOptions())
    questions = tmp_path / "q.jsonl"
    questions.write_text(json.dumps({"question_id": 1, "category": "rag", "turns": [PROMPT]}) + "\n")
    md = tmp_path / "bench.md"
    result = invoke("bench", "-q", questions, "-n", 12, "-d", "search", "--datastore", store, "--json", "--markdown", md)
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["self_repetition_token_weighted_with_datastore"] >= report["self_repetition_token_weighted"]
    assert {a["arm"]: a for a in report["arms"]}["search"]["exact_match"] == 1.0
    assert "with the datastore" in md.read_text()
    # and as batches
    result = invoke("bench", "-q", questions, "-n", 12, "-d", "search", "--datastore", store, "-b", 2, "--rounds", 1, "--json", "--markdown", md)
    assert result.exit_code == 0, result.output
    batched = json.loads(result.stdout.strip().splitlines()[-1])
    assert batched["self_repetition_token_weighted_with_datastore"] == pytest.approx(report["self_repetition_token_weighted_with_datastore"])
    assert batched["self_repetition_token_weighted"] == pytest.approx(report["self_repetition_token_weighted"])
    assert {a["arm"]: a for a in batched["arms"]}["search"]["exact_match"] == 1.0
    assert "with the datastore" in md.read_text()


def test_generate_summarises_the_search_branch_and_the_head():
    from ngspec.cli.generate import _search_summary

    rows = dict(_search_summary({"search_branch_from": {"local": 5, "datastore": 2, "none": 1}, "deepened": 3, "head_skipped": 4, "head_top_guess": [2, 8]}))
    assert rows["search branch from local / datastore / none"] == "5 / 2 / 1"
    assert rows["steps without the head"] == "4" and rows["head's top guess right (drafted + caught up)"] == "2 / 8 (25%)"
    assert dict(_search_summary({"head_skipped": 0, "head_top_guess": [0, 0]}))["head's top guess right (drafted + caught up)"] == "0 / 0"
    assert _search_summary(None) == [] and _search_summary({"rows_allocated": {}}) == []
    # where the gate weighed the head: its first level's own accepted nodes against the gate's credit
    rows = dict(_search_summary({"head_skipped": 4, "head_top_guess": [2, 8], "head_first_level": [3, 7.25]}))
    assert rows["head's first level: nodes added / credited by the gate"] == "3 / 7.2"
    assert "head's first level: nodes added / credited by the gate" not in dict(_search_summary({"head_skipped": 0, "head_top_guess": [0, 0], "head_first_level": [0, 0.0]}))


@pytest.mark.slow
def test_a_run_carries_each_drafters_calibration_from_prompt_to_prompt(tmp_path, monkeypatch):
    """generate (one at a time and batched) gives every prompt's drafter the run's calibration;
    bench gives each arm its own, across the prompts."""
    import ngspec.api as api
    import ngspec.bench.runner as runner
    from ngspec.drafters import make_drafter

    seen = []

    def recording(name, *args, **kwargs):
        drafter = make_drafter(name, *args, **kwargs)
        seen.append((name, getattr(drafter, "calibration", None)))
        return drafter

    monkeypatch.setattr(api, "make_drafter", recording)
    monkeypatch.setattr(runner, "make_drafter", recording)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"id": i, "prompt": p}) + "\n" for i, p in enumerate([PROMPT, "Count from one to ten.", PROMPT])))
    for extra in ([], ["--batch-size", 2]):
        seen.clear()
        assert invoke("generate", "-p", prompts, "-d", "trie", "-n", 6, "--json", *extra).exit_code == 0
        assert len(seen) == 3 and seen[0][1] is not None and all(c is seen[0][1] for _, c in seen)
    seen.clear()
    questions = tmp_path / "q.jsonl"
    questions.write_text("".join(json.dumps({"question_id": i, "category": "rag", "turns": [PROMPT]}) + "\n" for i in range(2)))
    assert invoke("bench", "-q", questions, "-n", 6, "-d", "trie", "-d", "search", "--json").exit_code == 0
    seen = [(n, c) for n, c in seen if n in ("trie", "search")]
    warm, timed = seen[:2], seen[2:]  # each arm's untimed warm-up first, with estimates of its own
    by_arm = {name: {id(c) for n, c in timed if n == name} for name in ("trie", "search")}
    assert [len(s) for s in by_arm.values()] == [1, 1] and by_arm["trie"] != by_arm["search"]
    assert sum(n in by_arm for n, _ in timed) == 4  # two prompts each
    assert [n for n, _ in warm] == ["trie", "search"] and not {id(c) for _, c in warm} & (by_arm["trie"] | by_arm["search"])


@pytest.mark.slow
def test_an_eagle_head_in_int8_or_float32_through_generate_and_tune_tree(tmp_path, prompt_file, default_model):
    """`--head-int8` (the default) and `--head-float32` give the same tokens as plain decoding;
    tune-tree records which the shape was tuned with."""
    from conftest import started_head
    from ngspec.eagle import int8
    from ngspec.eagle.head import save_head

    save_head(started_head(default_model.model), tmp_path / "head")
    plain = invoke("generate", "-p", prompt_file, "-n", 16, "--json")
    assert plain.exit_code == 0, plain.output
    expected = json.loads(plain.stdout.strip().splitlines()[-1])["token_ids"]
    for flag in ("--head-int8", "--head-float32"):
        result = invoke("generate", "-p", prompt_file, "-d", "eagle+search", "--eagle-head", tmp_path / "head", "-n", 16, "--json", flag)
        assert result.exit_code == 0, result.output
        assert json.loads(result.stdout.strip().splitlines()[-1])["token_ids"] == expected
    result = invoke("tune-tree", "--eagle-head", tmp_path / "head", "--out", tmp_path / "shape.json", "--limit", 2, "-n", 8, "--nodes", 4, "--depth", 2, "--width", 2, "--finalists", 2, "--json")
    assert result.exit_code == 0, result.output
    shape = json.loads((tmp_path / "shape.json").read_text())
    assert shape["head_int8"] is int8.available("cpu")
    assert (shape["calibration_questions"], shape["calibration_prompts"], shape["turns"]) == ("the bundled MT-bench", 4, "all")  # two questions, both turns of each
    # the search's two fastest counts timed again side by side, prompt by prompt: the winner is the shape
    final = shape["playoff"]
    assert len(final["nodes"]) == 2 and final["nodes"][0] == shape["nodes"] and set(final["nodes"]) <= {int(m) for m in shape["searched"]}
    assert final["best_vs_runner_up"] == pytest.approx(final["tokens_per_second"][str(final["nodes"][0])] / final["tokens_per_second"][str(final["nodes"][1])])
    assert final["best_vs_runner_up"] >= 1.0 and len(final["interval"]) == 2
    # the shape is the default model's by its fingerprint: the same model given by path takes it
    from ngspec.drafters.ngram_tables import model_fingerprint
    from ngspec.models import default_model_dir

    assert shape["model_fingerprint"] == model_fingerprint(default_model.model)
    by_path = invoke("generate", "-p", prompt_file, "--model", default_model_dir(), "-d", "eagle", "--eagle-head", tmp_path / "head",
                     "--tree", "static", "--tree-choices", tmp_path / "shape.json", "-n", 16, "--json")
    assert by_path.exit_code == 0, by_path.output
    assert json.loads(by_path.stdout.strip().splitlines()[-1])["token_ids"] == expected
    first = invoke("tune-tree", "--eagle-head", tmp_path / "head", "--out", tmp_path / "first.json", "--limit", 2, "-n", 8, "--nodes", 4, "--depth", 2, "--width", 2, "--finalists", 1, "--turns", "first")
    assert first.exit_code == 0, first.output
    assert "2 prompts" in first.stderr + first.stdout and "2 questions, 4 turns" in result.stderr + result.stdout
    shape = json.loads((tmp_path / "first.json").read_text())
    assert (shape["calibration_prompts"], shape["turns"]) == (2, "first")


@pytest.mark.slow
def test_bench_rounds_at_batch_size_one_pair_each_prompt_with_itself(tmp_path):
    """--rounds N at batch size 1 runs every arm on every prompt N times; the intervals resample a
    prompt's rounds together (keyed by prompt), not as N times the prompts."""
    from ngspec.bench.interval import ratio_interval

    questions = tmp_path / "q.jsonl"
    questions.write_text("".join(json.dumps({"question_id": i, "category": "rag", "turns": [t]}) + "\n" for i, t in enumerate([PROMPT, PROMPT.upper()])))
    result = invoke("bench", "-q", questions, "-n", 8, "-d", "trie", "--rounds", 2, "--versus", "vanilla", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["environment"]["rounds"] == 2 and report["environment"]["drafting"]["datastore"] is None
    assert [(p["id"], p["round"]) for p in report["prompts"]] == [("0", 0), ("1", 0), ("0", 1), ("1", 1)]
    arms = {a["arm"]: a for a in report["arms"]}
    assert all(a["exact_match"] == 1.0 for a in arms.values())

    def runs(arm):
        return [(p["runs"][arm]["new_tokens"], p["runs"][arm]["seconds"]) for p in report["prompts"]]

    keys = [p["id"] for p in report["prompts"]]
    assert tuple(arms["trie"]["speedup_interval"]) == pytest.approx(ratio_interval(runs("trie"), runs("hf-greedy"), keys=keys))
    (trie,) = [p for p in report["versus"] if p["arm"] == "trie"]
    assert tuple(trie["interval"]) == pytest.approx(ratio_interval(runs("trie"), runs("vanilla"), keys=keys))


def test_ngspecs_own_warnings_are_one_line_on_stderr(capsys):
    import warnings

    from ngspec.cli.app import friendly

    def command():
        warnings.warn("ngspec: the machine was busy", RuntimeWarning)
        warnings.warn("something else", UserWarning)

    with pytest.warns(UserWarning, match="something else"):  # others go where they went before
        friendly(command)()
    err = capsys.readouterr().err
    assert "warning: the machine was busy" in err and "RuntimeWarning" not in err and "something else" not in err


@pytest.mark.parametrize("error", [NgspecError("bad input"), RuntimeError("a bug"), OSError(28, "No space left on device"), KeyboardInterrupt()])
def test_a_failed_command_exits_without_its_exception_chain(error, capsys):
    """The exit a failed command raises carries no exception chain: the failed command's frames
    (its model, caches) are released at once when it runs in process (tests, a notebook). Chained,
    each failed batched EAGLE run in one process kept its model's weights mapped (0.5 GB a run)."""
    import weakref

    import typer

    from ngspec.cli.app import friendly

    class Model:
        pass

    held = []

    def command():
        model = Model()
        held.append(weakref.ref(model))
        raise type(error)(*error.args)  # made in the command, as a real failure is

    with pytest.raises(typer.Exit) as info:
        friendly(command)()
    assert info.value.__context__ is None and info.value.__cause__ is None
    assert held[0]() is None  # nothing of the command's frame is left
    assert capsys.readouterr().err.strip()  # and its one-line message was shown


def test_output_piped_into_a_reader_that_stops_ends_quietly(capsys):
    """`ngspec generate ... | head -c 20`: the pipe closes under us; Unix tools stop without a word
    (a shell reports 141, 128 + SIGPIPE), where we printed "error: Broken pipe"."""
    import typer

    from ngspec.cli.app import friendly

    def command():
        raise BrokenPipeError(32, "Broken pipe")

    with pytest.raises(typer.Exit) as info:
        friendly(command)()
    assert info.value.exit_code == 141 and capsys.readouterr().err == ""


def test_a_real_pipe_closed_by_its_reader_ends_the_command_quietly(tiny_saved, tmp_path):
    """The reader takes the first prompt's line and closes the pipe: seven prompts are still to
    be written into it."""
    import subprocess
    import sys

    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"Count to {n}: 1 2 3"}) + "\n" for n in range(8)))
    command = [sys.executable, "-m", "ngspec.cli.app", "generate", "-p", str(prompts), "--model", str(tiny_saved), "-n", "64", "--json"]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as run:
        assert run.stdout.read(1) == "{"
        run.stdout.close()
        err = run.stderr.read()
        assert run.wait(timeout=300) == 141 and "error" not in err and "Exception" not in err, err


CUDA_OOM = ("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 GiB of which 1.06 GiB is free. "
            "Including non-PyTorch memory, this process has 78.12 GiB memory in use. Of the allocated memory 76.50 GiB is allocated by "
            "PyTorch, and 1.10 GiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting "
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory Management")
CPU_OOM = ("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: you tried to allocate 13960068 "
           "bytes. Error code 12 (Cannot allocate memory)")  # what `generate -b 4` raised under `ulimit -v 2500000`


@pytest.mark.parametrize(
    ("error", "said"),
    [(lambda: __import__("torch").OutOfMemoryError(CUDA_OOM), "out of memory on GPU 0: torch could not allocate 2.00 GiB more (1.06 GiB of 79.19 GiB free); "
      "ask for less at once: a smaller --batch-size or --max-new-tokens, or a smaller draft tree (--num-draft, --total-tokens, --tree-choices); "
      "or free memory (torch also suggests PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True against fragmentation)"),
     (lambda: RuntimeError(CPU_OOM), "out of memory on the CPU: torch could not allocate 13.3 MiB more; ask for less at once: a smaller --batch-size "
      "or --max-new-tokens, or a smaller draft tree (--num-draft, --total-tokens, --tree-choices); or free memory"),
     (MemoryError, "out of memory on the CPU; ask for less at once: a smaller --batch-size or --max-new-tokens, or a smaller draft tree "
      "(--num-draft, --total-tokens, --tree-choices); or free memory"),
     (lambda: RuntimeError("The size of tensor a (4) must match the size of tensor b (5)"), None)],  # not memory: as before
)
def test_running_out_of_memory_is_one_line_with_what_asks_for_less(error, said, capsys):
    """torch's allocation errors (a paragraph on a GPU) become one line saying where memory ran
    out, how much was asked for, and which of the command's options ask for less."""
    import typer

    from ngspec.cli.app import LESS_AT_ONCE, friendly

    def command():
        raise error()

    with pytest.raises(typer.Exit) as info:
        friendly(command, LESS_AT_ONCE["generate"])()
    assert info.value.exit_code == 1
    err = capsys.readouterr().err.strip()
    assert err == f"error: {said}" if said else err.startswith("error: RuntimeError: The size of tensor a") and "NGSPEC_DEBUG" in err


def test_every_command_that_runs_a_model_names_options_it_has_for_less_memory():
    from ngspec.cli.app import LESS_AT_ONCE

    for command, options in LESS_AT_ONCE.items():
        text = runner.invoke(app, [command, "--help"], env={"COLUMNS": "300"}).output
        for option in re.findall(r"--[a-z-]+", options):
            assert option in text, (command, option)


def test_generate_keeps_a_category_and_the_first_prompts(tmp_path):
    """`--category` and `--limit` pick prompts of a question file, as `bench` does; an unknown
    category is refused in one line naming those there are, before the model loads."""
    path = tmp_path / "q.jsonl"
    rows = [{"question_id": i, "category": c, "turns": [f"Say {i}."]} for i, c in enumerate(["rag", "code", "rag", "rag"])]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    result = invoke("generate", "-p", path, "--category", "rag", "--limit", 2, "-d", "vanilla", "-n", 3, "--json")
    assert result.exit_code == 0, result.stderr
    assert [json.loads(x)["id"] for x in result.stdout.strip().splitlines()] == ["0", "2"]
    bad = invoke("generate", "-p", path, "--category", "math", "-n", 3)
    assert bad.exit_code == 1 and "no prompts of category 'math'" in bad.stderr and "code, rag" in bad.stderr
    assert "Traceback" not in bad.stderr and "loading model" not in bad.stderr
    zero = invoke("generate", "-p", path, "--limit", 0, "-n", 3)
    assert zero.exit_code == 1 and "--limit must be at least 1" in zero.stderr


@pytest.mark.parametrize(
    "stdin, ids, texts",
    [
        (PROMPT.encode() + b"\n", ["stdin"], [PROMPT]),
        ("\ufeffSay hi.\n".encode(), ["stdin"], ["Say hi."]),  # a byte-order mark is not text
        (b'\n{"question_id": 7, "turns": ["Say 7."]}\n{"prompt": "Say 8."}\n', ["7", "stdin:3"], ["Say 7.", "Say 8."]),
        (b'{"title": "not a prompt record"}\nSummarise that.\n', ["stdin"], ['{"title": "not a prompt record"}\nSummarise that.']),
        (b'[\n {"question_id": 7, "turns": ["Say 7."]},\n {"prompt": "Say 8."}\n]\n', ["7", "stdin[1]"], ["Say 7.", "Say 8."]),  # a .json file piped in
        (b'{\n  "prompt": "Say 9."\n}\n', ["stdin[0]"], ["Say 9."]),
        (b'[1, 2, 3] is a list.\n', ["stdin"], ["[1, 2, 3] is a list."]),
        (b'["a", "b"]\n', ["stdin"], ['["a", "b"]']),  # JSON, but no prompt record in it: text
    ],
)
def test_a_prompt_file_of_dash_reads_standard_input(monkeypatch, stdin, ids, texts):
    """`-p -`: one prompt, as a .txt file is, or JSONL records when the first line is one, or a JSON
    document (as a .json file holds) with prompt records in it (JSON that holds no prompt is text)."""
    import io

    from ngspec.prompts import load_prompts

    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(stdin)))
    prompts = load_prompts("-")
    assert [p.id for p in prompts] == ids and [p.text for p in prompts] == texts


@pytest.mark.parametrize(
    "piped, ids",
    [(b"Say hi.\n", ["63"]), (b'{"prompt": "Say 8."}\n{"prompt": "Say 9."}\n', ["63:1", "63:2"]), (b'[{"prompt": "Say 8."}]', ["63[0]"])],
)
def test_a_prompt_file_that_is_a_pipe_is_read_as_standard_input_is(tmp_path, piped, ids):
    """`-p <(jq ...)` names a pipe (/dev/fd/63), with no suffix to tell its layout: it was "prompt
    file not found". It is read once, and its layout told from its text, as `-p -` does."""
    import os
    import threading

    from ngspec.prompts import load_prompts

    fifo = tmp_path / "63"
    os.mkfifo(fifo)
    writer = threading.Thread(target=fifo.write_bytes, args=(piped,), daemon=True)
    writer.start()
    prompts = load_prompts(fifo)
    writer.join(timeout=10)
    assert [p.id for p in prompts] == ids


def test_a_corpus_that_is_a_pipe_is_refused_in_one_line(tmp_path):
    """A corpus is read more than once (its format is told from its first record), which a pipe
    allows once: it was "unsupported file type"."""
    import os

    from ngspec.datastore.corpus import iter_records

    fifo = tmp_path / "63"
    os.mkfifo(fifo)
    with pytest.raises(NgspecError, match=f"^{fifo} is a pipe or device, not a file: a corpus is read more than once; save it to a .jsonl, .json or .parquet file$"):
        next(iter_records(str(fifo)))


@pytest.mark.parametrize(
    "stdin, message",
    [(b"", "standard input is empty"), (b" \n\n", "standard input is empty"), (b"caf\xe9\n", "standard input is not valid UTF-8 (byte 3)"),
     (b'{"prompt": "a"}\n{"prompt": }\n', "stdin:2: not valid JSON (Expecting value at column 12)"),
     (b'{"prompt": "a"}\n{"prompt": "b\n', "stdin:2: not valid JSON (Unterminated string starting at column 12)"), (b'{"prompt": "a"}\n[1]\n', "stdin:2: expected a prompt record (a JSON object) or a prompt (a JSON string), not [1]")],
)
def test_bad_standard_input_is_refused_in_one_line_before_the_model_loads(stdin, message):
    result = runner.invoke(app, ["generate", "-p", "-", "-n", "3"], input=stdin)
    assert result.exit_code == 1 and message in result.stderr
    assert "Traceback" not in result.stderr and "loading model" not in result.stderr


PIPED = '{"prompt": "Say a b a b a b."}\n{"prompt": "Count: 1 2 3 1 2 3"}\n'


def test_bench_reads_questions_from_standard_input_and_says_so(tiny_saved):
    """`bench -q -` runs the piped records and its report names where they came from, not "-"."""
    result = runner.invoke(app, ["bench", "-q", "-", "--model", str(tiny_saved), "-d", "trie", "-n", "6", "--json"], input=PIPED)
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["environment"]["questions"] == "standard input" and report["environment"]["prompts"] == 2
    assert {a["arm"]: a["exact_match"] for a in report["arms"]} == {"hf-greedy": 1.0, "hf-prompt-lookup": 1.0, "vanilla": 1.0, "trie": 1.0}


def test_a_versus_arm_missing_from_a_batched_grid_lists_only_the_batched_arms(tiny_saved, tmp_path):
    """A (k, w) grid labels its arms by cell, so `--versus bigram` names none of them; the refusal
    lists the arms the run has, and a batched run has none of transformers' (it listed hf-greedy
    and hf-prompt-lookup, which a batched run leaves out)."""
    args = ["bench", "-q", "-", "--model", str(tiny_saved), "-d", "context-ngram", "--k", "1", "--w", "2..3", "-n", "4", "--plots", str(tmp_path)]
    result = runner.invoke(app, [*args, "-b", "2", "--versus", "context-ngram"], input=PIPED)
    assert result.exit_code == 1
    assert "the arms are: vanilla, context-ngram k=1 w=2, context-ngram k=1 w=3" in result.output, result.output
    result = runner.invoke(app, [*args, "--versus", "context-ngram"], input=PIPED)
    assert result.exit_code == 1 and "the arms are: hf-greedy, hf-prompt-lookup, vanilla, context-ngram k=1 w=2" in result.output


@pytest.mark.parametrize("where", ["a file", "under a file"])
def test_a_grid_sweeps_plots_folder_that_cannot_be_written_fails_before_the_model_loads(tiny_saved, tmp_path, where):
    """A file given as --plots was found only after every arm had run (a bare "File exists"), and
    the --markdown report of the run was lost with it; a batched grid draws heatmaps too. Without
    a grid no plot is drawn, so then the folder is neither checked nor made."""
    blocker = tmp_path / "file"
    blocker.write_text("")
    plots = blocker if where == "a file" else blocker / "plots"
    md = tmp_path / "b.md"
    args = ["bench", "-q", "-", "--model", str(tmp_path / "never-loaded"), "-d", "context-ngram", "-n", "4", "--markdown", str(md), "--plots", str(plots)]
    message = f"--plots {blocker} is a file; give a directory for the heatmaps" if where == "a file" else f"cannot write {plots}: {blocker} is a file, not a directory"
    for batch in ("1", "2"):
        result = runner.invoke(app, [*args, "--k", "1", "--w", "2..3", "-b", batch], input=PIPED)
        assert result.exit_code == 1 and message in result.stderr and "Traceback" not in result.output, result.output
        assert not md.exists() and blocker.read_text() == ""
    result = runner.invoke(app, [*args[:-2], "--json-out", str(tmp_path), "--k", "1", "--w", "2"], input=PIPED)  # two report files: which one
    assert result.exit_code == 1 and f"--json-out {tmp_path} is a directory; give the path of a file to write" in result.stderr, result.output
    for batch in ("1", "2"):  # one cell: no heatmap
        result = runner.invoke(app, [*args[:4], str(tiny_saved), *args[5:], "--k", "1", "--w", "2", "-b", batch], input=PIPED)
        assert result.exit_code == 0 and md.exists(), result.output
        md.unlink()


@pytest.mark.parametrize("batch", ["1", "2"])
def test_a_bench_whose_files_cannot_be_written_at_the_end_still_shows_its_report(tiny_saved, tmp_path, monkeypatch, batch):
    """A disk that fills during a long run: the files are written after the report is printed
    (they were written first, and the table was lost with them), then the run fails in one line."""
    from ngspec import staging

    def full(out, text):
        raise OSError(28, "No space left on device", str(out))

    monkeypatch.setattr(staging, "write_text", full)
    md, plots = tmp_path / "b.md", tmp_path / "plots"
    result = runner.invoke(app, ["bench", "-q", "-", "--model", str(tiny_saved), "-d", "context-ngram", "-n", "4", "--k", "1", "--w", "1..2",
                                 "-b", batch, "--markdown", str(md), "--json-out", str(tmp_path / "b.json"), "--plots", str(plots)], input=PIPED)
    heatmap = plots / f"bench-context-ngram-tree{'-b2' if batch == '2' else ''}.png"
    assert result.exit_code == 1 and f"error: No space left on device: {md}; written whole before it: {heatmap}" in " ".join(result.stderr.split())
    assert result.stdout.startswith("bench: 2 prompts") and "exact" in result.stdout  # the table, then the sweep and the error
    assert result.stderr.index("best by wall time k=") < result.stderr.index(f"error: No space left on device: {md}")
    assert list(plots.iterdir()) == [heatmap]  # drawn before


def test_tune_tree_calibrates_on_questions_from_standard_input(tiny_saved, tmp_path):
    """`tune-tree -q -` tunes on the piped records, and `generate` takes the shape it saved."""
    shape = tmp_path / "shape.json"
    args = ["tune-tree", "-q", "-", "--model", str(tiny_saved), "--eagle-head", str(tiny_saved / "head"), "-n", "8", "--nodes", "12", "--depth", "3", "--out", str(shape)]
    result = runner.invoke(app, args, input=PIPED)
    assert result.exit_code == 0, result.output
    saved = json.loads(shape.read_text())
    assert saved["calibration_questions"] == "standard input" and saved["calibration_prompts"] == 2
    assert {k: saved[k] for k in ("ngspec", "torch", "transformers", "python")} == versions()  # what tuned it
    assert saved["nodes"] == len(saved["choices"]) >= 2
    run = runner.invoke(app, ["generate", "-p", "-", "--model", str(tiny_saved), "-d", "eagle", "--eagle-head", str(tiny_saved / "head"),
                              "--tree", "static", "--tree-choices", str(shape), "-n", "6", "--check", "--json"], input=PIPED)
    assert run.exit_code == 0, run.output
    assert [json.loads(line)["greedy_check"]["exact_match"] for line in run.stdout.strip().splitlines()] == [True, True]


@pytest.mark.parametrize("json_out", [False, True])
def test_a_tuned_shape_that_cannot_be_written_is_not_lost(tiny_saved, tmp_path, monkeypatch, json_out):
    """A disk that fills at the end of `tune-tree` (`benchmarks/full_disk.py`): the shape was lost
    with its file, after a tuning that may take hours. The report is shown first, then the shape
    goes to stdout as JSON when its file cannot be written, and `generate` loads it from there."""
    from ngspec import staging

    shape = tmp_path / "shape.json"

    def full(out, text):
        raise OSError(28, "No space left on device", str(out))

    monkeypatch.setattr(staging, "write_text", full)
    args = ["tune-tree", "-q", "-", "--model", str(tiny_saved), "--eagle-head", str(tiny_saved / "head"), "-n", "8", "--nodes", "12", "--depth", "3",
            "--out", str(shape), *(["--json"] if json_out else [])]
    result = runner.invoke(app, args, input=PIPED)
    assert result.exit_code == 1 and not shape.exists()
    assert " ".join(result.stderr.split()).endswith(f"error: No space left on device: {shape}; the tuned shape is the JSON record on stdout: save it to "
                                                    "a file (where there is room) and load it with --tree static --tree-choices FILE")
    if not json_out:
        assert "tree sizes tried on" in result.stdout  # the report, then the record
    record = result.stdout.strip().splitlines()[-1]
    assert json.loads(record)["format"] == "ngspec-tree-shape"
    monkeypatch.undo()
    shape.write_text(record)
    run = runner.invoke(app, ["generate", "-p", "-", "--model", str(tiny_saved), "-d", "eagle", "--eagle-head", str(tiny_saved / "head"),
                              "--tree", "static", "--tree-choices", str(shape), "-n", "4", "--json"], input=PIPED)
    assert run.exit_code == 0, run.output


def test_a_damaged_head_is_refused_by_generate_in_one_line_with_exit_code_1(tiny_saved, tmp_path):
    """The CLI end of `load_head`'s damaged-weights message: it said "SafetensorError: Error while
    deserializing header ..." (input_fuzz runs 10578, 11446)."""
    import shutil

    head = tmp_path / "head"
    shutil.copytree(tiny_saved / "head", head)
    (head / "model.safetensors").write_bytes(b"\x00" * 20)
    result = runner.invoke(app, ["generate", "-p", "-", "--model", str(tiny_saved), "-d", "eagle", "--eagle-head", str(head), "-n", "4"], input=PIPED)
    errors = [line for line in result.output.splitlines() if line.startswith("error: ")]
    assert result.exit_code == 1 and len(errors) == 1, result.output
    assert "model.safetensors: it is damaged, cut short or not a weights file (" in errors[0] and "SafetensorError" not in result.output
    assert "Traceback" not in result.output


@pytest.mark.slow
def test_generate_reads_the_prompt_from_standard_input_as_from_a_file(prompt_file):
    """`cat prompt.txt | ngspec generate -p -` gives the tokens `-p prompt.txt` gives."""
    from_file = invoke("generate", "-p", prompt_file, "-d", "trie", "-n", 12, "--json")
    piped = runner.invoke(app, ["generate", "-p", "-", "-d", "trie", "-n", "12", "--json"], input=prompt_file.read_bytes())
    assert from_file.exit_code == 0 and piped.exit_code == 0, piped.output
    want, got = (json.loads(r.stdout.strip().splitlines()[-1]) for r in (from_file, piped))
    assert got["token_ids"] == want["token_ids"] and got["id"] == "stdin"


@pytest.mark.slow
def test_generate_totals_a_run_of_several_prompts_one_at_a_time():
    """After each prompt's own table, a run of several prompts at batch size 1 ends with the
    totals over all of them (a batch already ended with its summary); --json keeps one record per
    prompt and nothing else."""
    args = ["generate", "-p", "examples/prompts.jsonl", "-d", "trie", "-n", 8]
    records = [json.loads(line) for line in invoke(*args, "--json").stdout.strip().splitlines()]
    assert len(records) == 3 and all("token_ids" in r for r in records)
    result = invoke(*args)
    assert result.exit_code == 0, result.output
    totals = result.stdout[result.stdout.index("trie: all 3 prompts, one at a time"):]
    tokens, calls = sum(r["new_tokens"] for r in records), sum(r["verify_calls"] for r in records)
    assert re.search(rf"new tokens\s*│\s*{tokens}\s", totals) and re.search(rf"verification calls\s*│\s*{calls}\s", totals)
    assert re.search(rf"mean tokens per call\s*│\s*{tokens / calls:.2f}\s", totals)
    single = invoke("generate", "-p", "examples/code_edit.txt", "-n", 4)
    assert "one at a time" not in single.stdout


@pytest.mark.parametrize("command", [["generate", "-p", "examples/rag_ngspec.txt"], ["profile-bound"], ["build-bigram", "--out", "t.pt"]])
def test_a_device_ngspec_does_not_run_on_is_one_line_before_the_model_loads(tmp_path, monkeypatch, command):
    """`--device mps` (or gpu, xla, meta) ended in torch's RuntimeError, after the model loaded;
    now each command stops at its `loading model ...` line, if it prints one, with nothing written."""
    monkeypatch.chdir(Path(__file__).resolve().parents[1])
    command = [str(tmp_path / a) if a == "t.pt" else a for a in command]
    result = runner.invoke(app, [*command, "--device", "mps"])
    assert result.exit_code == 1 and "error: unknown device 'mps'; choose auto, cpu, cuda or cuda:N" in result.stderr
    assert "Traceback" not in result.stderr and not list(tmp_path.iterdir())


@pytest.fixture(scope="module")
def added_token(tiny_saved, tmp_path_factory):
    """The tiny saved model with a token added to its tokenizer and no embedding for it (a pad or
    chat token added without resizing the model)."""
    import shutil

    from transformers import AutoTokenizer

    where = tmp_path_factory.mktemp("added_token")
    shutil.copytree(tiny_saved, where, dirs_exist_ok=True)
    tok = AutoTokenizer.from_pretrained(where)
    tok.add_tokens(["<|mine|>"], special_tokens=True)
    tok.save_pretrained(where)
    return where


@pytest.mark.parametrize("batch", ["1", "2"])
def test_a_prompt_holding_a_token_the_model_has_no_embedding_for_fails_alone_in_one_line(added_token, tmp_path, batch):
    """Its id ended in the embedding's IndexError ("index out of range in self")."""
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "a", "prompt": "Say <|mine|>."}\n{"id": "b", "prompt": "Count to three."}\n')
    result = runner.invoke(app, ["generate", "-p", str(prompts), "--model", str(added_token), "-n", "4", "-b", batch])
    assert result.exit_code == 1 and "Traceback" not in result.output + result.stderr
    assert re.search(r"prompt a: the prompt holds token id 49152, outside the model's vocabulary \(0\.\.49151\): was it encoded with another model's tokenizer\?", result.stderr)
    assert result.stderr.rstrip().endswith("error: 1 prompt(s) failed: a (the others finished)") and "prompt b" in result.stdout
    prompts.write_text('{"id": "a", "prompt": "Say <|mine|>."}\n{"id": "b", "prompt": "And <|mine|>."}\n')
    result = runner.invoke(app, ["generate", "-p", str(prompts), "--model", str(added_token), "-n", "4", "-b", batch])
    assert result.exit_code == 1 and result.stderr.rstrip().endswith("error: all 2 prompts failed: a, b")


def test_a_model_given_another_models_tokenizer_is_refused_before_any_work(tiny_saved, tmp_path):
    """Every command that loads a model: `train-eagle` and `synth-corpus` ended in "IndexError:
    index out of range in self" (and `generate` at each prompt)."""
    import shutil

    from ngspec import models

    where = tmp_path / "model"
    models.tiny_model("llama", seed=0).save_pretrained(where)  # 96 tokens, given the default tokenizer's 49,152
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (tiny_saved / name).is_file():
            shutil.copy(tiny_saved / name, where / name)
    corpus = Path(__file__).resolve().parents[1] / "corpora" / "smollm2-self.jsonl"
    for command in (["generate", "-p", "examples/rag_ngspec.txt"], ["train-eagle", "-c", str(corpus), "--out", str(tmp_path / "head")],
                    ["synth-corpus", "--n", "2", "--out", str(tmp_path / "s.jsonl")]):
        result = runner.invoke(app, [*command, "--model", str(where)])
        assert result.exit_code == 1 and "Traceback" not in result.output + result.stderr, command
        assert "has 49152 tokens but the model has embeddings for 96: they belong to different models" in result.stderr, command
    assert not (tmp_path / "s.jsonl").exists()


def test_help_shows_a_type_only_for_options_that_take_a_value():
    """A flag takes no value, so its help row names no type: `--json <bool>` (typer 0.29's rendering)
    reads as if it wanted `--json true`, which fails as an unexpected extra argument. Options with
    a value keep theirs."""
    for command in (["--help"], ["generate", "--help"], ["bench", "--help"], ["build-datastore", "--help"]):
        result = runner.invoke(app, command, env={"COLUMNS": "200"})
        assert result.exit_code == 0, result.output
        assert "<bool>" not in result.output, command
    generate = runner.invoke(app, ["generate", "--help"], env={"COLUMNS": "200"}).output
    assert re.search(r"--json\s+Machine-readable", generate), generate
    assert re.search(r"--max-new-tokens\s+-n\s+<int>", generate), generate
