"""Assembles the `ngspec` commands and turns user errors into one readable line.

Every command is wrapped by `friendly`: an `NgspecError` (bad input) or an unexpected exception
becomes one message on stderr and exit code 1. Set NGSPEC_DEBUG=1 to see the traceback instead.
ngspec's own warnings (a measurement timed on a busy machine) are one line on stderr too.
"""

from __future__ import annotations

import functools
import os
import signal
import sys
import warnings
from pathlib import Path
from typing import Annotated, Callable

import typer
from typer.core import TyperCommand, TyperGroup

from ngspec.cli import render
from ngspec.errors import NgspecError, env_switch, out_of_memory
from ngspec.staging import FULL_WORDS, os_error_message


class _FlagsNameNoType:
    """Help rows name a type only for options that take a value: typer 0.29 prints `<bool>` beside
    every flag (`--json <bool>`), which reads as if `--json true` were wanted."""

    def get_params(self, ctx):
        params = super().get_params(ctx)
        for param in params:
            if getattr(param, "is_flag", False) and param.metavar is None:
                param.metavar = ""
        return params


class _Command(_FlagsNameNoType, TyperCommand):
    pass


class _Group(_FlagsNameNoType, TyperGroup):
    pass


app = typer.Typer(
    cls=_Group,
    name="ngspec",
    help="Lossless speculative decoding with cheap drafters: faster generation, output identical to plain decoding.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


def _print_version(asked: bool) -> None:
    if asked:
        from ngspec.versions import versions

        found = versions()
        typer.echo(f"ngspec {found.pop('ngspec')} ({', '.join(f'{name} {v}' for name, v in found.items())})")
        raise typer.Exit()


@app.callback()
def _options(
    version: Annotated[bool, typer.Option("--version", callback=_print_version, is_eager=True,
                                          help="Print ngspec's version (with its commit when run from a checkout), torch's, transformers' and Python's, and exit.")] = False,
) -> None:
    pass


_TREE = "a smaller draft tree (--num-draft, --total-tokens, --tree-choices)"
LESS_AT_ONCE = {  # by command: the options that ask for less memory at once, for an out-of-memory error's advice
    "generate": f"a smaller --batch-size or --max-new-tokens, or {_TREE}",
    "bench": f"a smaller --batch-size or --max-new-tokens, or {_TREE}",
    "serve": f"a smaller --batch-size, or {_TREE}",
    "tune-tree": "fewer --nodes, a smaller --batch-size or --max-new-tokens",
    "train-eagle": "a smaller --max-len or --max-records",
    "synth-corpus": "a smaller --batch-size or --max-new-tokens",
    "build-bigram": "a smaller --batch-size",
    "build-datastore": "fewer --max-records",
}


def _quiet_stdout() -> None:
    """Point standard output at /dev/null, so that Python's flush of it at exit, into the closed
    pipe, prints nothing ("Exception ignored ... BrokenPipeError")."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # no real file behind sys.stdout (a test's runner)
        pass


def friendly(command: Callable, less: str = "") -> Callable:
    """``command`` with its errors as one line on stderr (``less``: what asks for less memory,
    for the advice of an out-of-memory error)."""

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        debug = env_switch("NGSPEC_DEBUG")
        kwargs = {name: _home_expanded(value) for name, value in kwargs.items()}
        try:
            with warnings.catch_warnings():
                shown = warnings.showwarning

                def show(message, category, filename, lineno, file=None, line=None) -> None:
                    """ngspec's own warnings ("ngspec: ...") as one line on stderr, like its errors."""
                    if str(message).startswith("ngspec: ") and file is None:
                        render.warning(str(message).removeprefix("ngspec: "))
                    else:
                        shown(message, category, filename, lineno, file, line)

                warnings.showwarning = show
                return command(*args, **kwargs)
        except NgspecError as exc:
            if debug:
                raise
            message, code = str(exc), 1
        except KeyboardInterrupt:
            message, code = "interrupted", 130
        except (typer.Exit, typer.Abort):
            raise
        except BrokenPipeError:  # the reader of our output went away (`| head`): stop quietly, as Unix tools do
            _quiet_stdout()
            raise typer.Exit(141) from None  # 128 + SIGPIPE, what a shell reports for a tool the signal stopped
        except OSError as exc:  # a path that cannot be read or written, a full disk
            if debug:
                raise
            # a full disk is the whole story; another OSError may be ngspec's fault, so the traceback is offered
            hint = "" if exc.errno in FULL_WORDS else " (set NGSPEC_DEBUG=1 for the traceback)"
            message, code = os_error_message(exc) + hint, 1
        except Exception as exc:
            if debug:
                raise
            message, code = out_of_memory(exc, less) or f"{type(exc).__name__}: {exc} (set NGSPEC_DEBUG=1 for the traceback)", 1
        # raised outside the handlers, so the exit carries no exception chain: a command run in
        # process (tests, a notebook) that failed released its frames, model and caches at once
        # (chained, a failed batched EAGLE run kept its model's weights mapped: 0.5 GB a run)
        render.error(message)
        raise typer.Exit(code)

    return wrapper


def _home_expanded(value: object) -> object:
    """A path option written ``--out=~/ds`` reaches us with its ``~`` (a shell expands it only at
    the start of a word): read it as the home directory, as corpus and model paths are, not as a
    directory named ``~`` (which a later ``rm -rf ~`` would take for home)."""
    if isinstance(value, list):
        return [_home_expanded(v) for v in value]
    if isinstance(value, Path) and str(value).startswith("~"):
        try:
            return value.expanduser()
        except RuntimeError:  # ~name of no such user: left as written
            return value
    return value


def _register() -> None:
    from ngspec.cli.bench import bench_command
    from ngspec.cli.datastore import build_datastore_command, datastore_info_command, synth_corpus_command
    from ngspec.cli.eagle import train_eagle_command
    from ngspec.cli.generate import generate_command
    from ngspec.cli.ngram import build_bigram_command
    from ngspec.cli.profile_bound import profile_bound_command
    from ngspec.cli.self_repetition import self_repetition_command
    from ngspec.cli.serve import serve_command
    from ngspec.cli.tune import tune_tree_command

    commands = [
        ("generate", generate_command, "Generate with a drafter, token-identical to plain decoding; speed and acceptance."),
        ("serve", serve_command, "Serve OpenAI-compatible completions over HTTP, sped up by a drafter."),
        ("bench", bench_command, "Compare drafters with vanilla and transformers' generate on a question set."),
        ("build-datastore", build_datastore_command, "Build a suffix-array datastore from a corpus."),
        ("datastore-info", datastore_info_command, "Show and check a datastore."),
        ("self-repetition", self_repetition_command, "Measure how self-repetitive a dataset's responses are."),
        ("synth-corpus", synth_corpus_command, "Let the model write its own Magpie-style corpus."),
        ("build-bigram", build_bigram_command, "Build a model's unigram/bigram tables for the n-gram drafters."),
        ("train-eagle", train_eagle_command, "Train an EAGLE-1 draft head for a model from a corpus."),
        ("tune-tree", tune_tree_command, "Tune a static EAGLE tree shape for this device and batch size."),
        ("profile-bound", profile_bound_command, "Time verification over (k rows, w tokens, context) next to a roofline prediction."),
    ]
    for name, command, short in commands:
        app.command(name, short_help=short, cls=_Command)(friendly(command, LESS_AT_ONCE.get(name, "")))


_register()


def _interrupt_on_sigterm(signum, frame) -> None:
    raise KeyboardInterrupt


def escape_what_stdout_cannot_hold() -> None:
    """On a stdout whose encoding is not a Unicode one (PYTHONIOENCODING=ascii, a Latin-1 locale),
    print what it cannot hold as Python's stderr does (``\\xe9``), not fail the command with a
    UnicodeEncodeError; JSON lines then use JSON's escapes (`render.json_line`)."""
    if not render.stdout_holds_unicode() and hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(errors="backslashreplace")


def main() -> None:
    # a terminated build unwinds like Ctrl-C, so staged outputs are removed, never left half-written
    signal.signal(signal.SIGTERM, _interrupt_on_sigterm)
    escape_what_stdout_cannot_hold()
    app()


if __name__ == "__main__":
    main()
