"""What ngspec prints shows the text it is given: square brackets from users (file names, record
fields, prompt ids) are not Rich markup, so they are neither swallowed nor a crash."""

from __future__ import annotations

import pytest
import typer.main
from rich.markup import RE_TAGS

from ngspec.cli import render
from ngspec.cli.app import app

TRICKY = "corpus[v2].jsonl fields ['[/x]', '[bold]b[/bold]'] [/]"


@pytest.mark.parametrize("say", [render.error, render.warning, render.info])
def test_messages_print_brackets_as_they_are(say, capsys):
    say(TRICKY)  # '[/x]' was a MarkupError raised while reporting the error: a traceback
    assert TRICKY in capsys.readouterr().err


def test_tables_and_rules_print_brackets_as_they_are(capsys):
    render.table(f"arms of {TRICKY}", ["[arm]", "tokens/s"], [["[/x]", "[bold]1.0[/bold]"]])
    render.summary_table("[run]", [("model", "models/[v2]"), ("drafter", "[/]")])
    render.rule("prompt [/x]")
    out = capsys.readouterr().out
    for text in (TRICKY, "[arm]", "[/x]", "[bold]1.0[/bold]", "[run]", "models/[v2]", "[/]", "prompt [/x]"):
        assert text in out


def test_a_table_cell_may_still_be_styled_text(capsys):
    from rich.text import Text

    render.table("cells", ["a"], [[Text("OOM", style="red")]])
    assert "OOM" in capsys.readouterr().out


def test_no_help_text_holds_what_rich_would_read_as_markup():
    """Rich drops ``[default: 8]`` from an option's help as an unknown tag: a default that is not
    the parameter's own value goes in ``show_default`` instead."""
    cli = typer.main.get_command(app)
    found = []
    for name, command in cli.commands.items():
        for who, text in [("", command.help or "")] + [(p.name, getattr(p, "help", None) or "") for p in command.params]:
            found += [(name, who, m.group(0)) for m in RE_TAGS.finditer(text)]
    assert found == []


def test_a_corpus_with_bracketed_fields_or_path_is_refused_in_one_line_naming_them(tmp_path):
    from typer.testing import CliRunner

    runner = CliRunner()
    corpus = tmp_path / "corpus[v2].jsonl"
    corpus.write_text('{"[/x]": 1, "[bold]": 2}\n')
    result = runner.invoke(app, ["build-datastore", "-c", str(corpus), "-o", str(tmp_path / "ds")])
    assert result.exit_code == 1 and "Traceback" not in result.output and result.exception.__class__ is SystemExit
    assert "cannot tell the corpus format from fields ['[/x]', '[bold]']" in result.output
    missing = tmp_path / "nope[v2].jsonl"
    result = runner.invoke(app, ["build-datastore", "-c", str(missing), "-o", str(tmp_path / "ds")])
    assert result.exit_code == 1 and f"corpus not found: {missing}" in result.output  # it said nope.jsonl
    assert not (tmp_path / "ds").exists()


def test_help_shows_the_defaults_it_names():
    from typer.testing import CliRunner

    runner = CliRunner()
    text = " ".join(runner.invoke(app, ["build-datastore", "--help"], env={"COLUMNS": "200"}).output.split())
    assert "datastores/<corpus name>" in text and "all cores" in text and "detected" in text
    text = " ".join(runner.invoke(app, ["generate", "--help"], env={"COLUMNS": "200"}).output.split())
    assert "--rearrange-every" in text and "(8)" in text and "measured on CPU" in text


def test_generate_heads_each_prompt_with_its_id_as_written(tiny_saved, tmp_path):
    from typer.testing import CliRunner

    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "[/x]", "prompt": "Hello"}\n{"id": "[bold]b", "prompt": "Hi there"}\n')
    result = CliRunner().invoke(app, ["generate", "-p", str(prompts), "--model", str(tiny_saved), "-n", "4"])
    assert result.exit_code == 0, result.output
    assert "prompt [/x]" in result.output and "prompt [bold]b" in result.output


def test_profile_bound_marks_a_cell_that_ran_out_of_memory_in_red():
    from types import SimpleNamespace

    from ngspec.cli.profile_bound import _cell_text

    cell = _cell_text(SimpleNamespace(status="oom"))
    assert cell.plain == "OOM" and str(cell.style) == "red"


def test_off_a_terminal_a_long_task_prints_a_line_now_and_then(capsys, monkeypatch):
    """In a log (nohup, a batch job) there is no bar; a task that has run a minute says how far it
    is, at most once a minute, with the time left at its pace since it started (a continued
    synth-corpus run starts at the records it carried), and once more when it completes. A task
    done within the minute prints nothing."""
    clock = [0.0]
    bar = render.LoggedProgress(console=render.err_console, every=60, get_time=lambda: clock[0])
    with bar:
        quick = bar.add_task("quick", total=3)
        for _ in range(3):
            clock[0] += 1
            bar.advance(quick)
        task = bar.add_task("synth [v2]", total=100, completed=20)  # 20 carried from an interrupted run
        for _ in range(80):
            clock[0] += 2
            bar.advance(task)
    lines = capsys.readouterr().err.splitlines()
    assert lines == [
        "synth [v2]: 50/100 (50%), 0:01:00 elapsed, about 0:01:40 left",  # 30 done in 60 s: 50 more take 100 s
        "synth [v2]: 80/100 (80%), 0:02:00 elapsed, about 0:00:40 left",
        "synth [v2]: 100/100 (100%), 0:02:40 elapsed",
    ]
    assert not any("quick" in line for line in lines)
    # a task of unknown length, its description updated as it goes (train-eagle's steps)
    bar = render.LoggedProgress(console=render.err_console, every=60, get_time=lambda: clock[0])
    steps = bar.add_task("training", total=None)
    clock[0] += 61
    bar.update(steps, completed=7, description="training: loss 1.5")
    assert capsys.readouterr().err.splitlines() == ["training: loss 1.5: 7, 0:01:01 elapsed"]
    # reset to what a pass found stored (train-eagle's features): the pace counts from there
    features = bar.add_task("target features", total=100)
    clock[0] += 1
    bar.reset(features, completed=60)
    clock[0] += 60
    bar.advance(features, 10)
    assert capsys.readouterr().err.splitlines() == ["target features: 70/100 (70%), 0:01:00 elapsed, about 0:03:00 left"]


def test_progress_is_a_bar_on_a_terminal_and_lines_elsewhere(monkeypatch):
    monkeypatch.setenv("NGSPEC_PROGRESS_EVERY", "5")
    logged = render.progress()
    assert isinstance(logged, render.LoggedProgress) and logged._every == 5.0  # pytest's stderr is no terminal
    from rich.console import Console

    monkeypatch.setattr(render, "err_console", Console(stderr=True, force_terminal=True))
    assert not isinstance(render.progress(), render.LoggedProgress)


def test_a_stdout_that_cannot_hold_every_character_gets_escapes_not_an_error(monkeypatch):
    """Where stdout's encoding is not a Unicode one (PYTHONIOENCODING=ascii, a Latin-1 locale, a
    Windows code page), generated text and tables that hold other characters failed the command
    ("UnicodeEncodeError: 'ascii' codec can't encode ..."): text is now escaped as Python's stderr
    is, and JSON lines use JSON's own escapes, so they read back unchanged."""
    import io
    import json
    import sys

    from ngspec.cli.app import escape_what_stdout_cannot_hold

    raw = io.BytesIO()
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(raw, encoding="ascii"))
    escape_what_stdout_cannot_hold()
    print("Répète: こんにちは")
    render.json_line({"text": "Répète: こんにちは"})
    render.console.print("tableau: é")
    sys.stdout.flush()
    text, line, table = raw.getvalue().decode("ascii").splitlines()[:3]
    assert text == "R\\xe9p\\xe8te: \\u3053\\u3093\\u306b\\u3061\\u306f"
    assert json.loads(line) == {"text": "Répète: こんにちは"}
    assert table == "tableau: \\xe9"
    utf8 = io.BytesIO()
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(utf8, encoding="utf-8"))
    escape_what_stdout_cannot_hold()
    render.json_line({"text": "é"})
    sys.stdout.flush()
    assert utf8.getvalue().decode() == '{"text": "é"}\n'  # as written where it can be
