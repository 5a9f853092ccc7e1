"""The only place that prints: Rich tables, streaming text, JSON lines, error messages.

Text handed in is printed as it is, never read as Rich markup: messages, titles and cells carry
file names, record fields and prompt ids, whose square brackets Rich would otherwise drop
(``corpus[v2].jsonl`` printed as ``corpus.jsonl``) or fail on (``[/x]``: a traceback while
reporting an error). A cell that should be styled is a `rich.text.Text`."""

from __future__ import annotations

import codecs
import json
import os
import sys
from contextlib import contextmanager
from typing import Callable, Iterator

from rich.console import Console, RenderableType
from rich.progress import Progress, ProgressColumn, TaskID
from rich.table import Table
from rich.text import Text

PIPED_WIDTH = 240


def _console(stderr: bool = False) -> Console:
    """A console; piped or redirected (and with no COLUMNS set), it is wide enough that a bench
    table keeps every column whole instead of being cut to Rich's default 80 ("tok…")."""
    console = Console(stderr=stderr, highlight=False)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console = Console(stderr=stderr, highlight=False, width=PIPED_WIDTH)
    return console


console = _console()
err_console = _console(stderr=True)


def error(message: str) -> None:
    err_console.print(Text.assemble(("error:", "bold red"), " ", message), soft_wrap=True)


def warning(message: str) -> None:
    err_console.print(Text.assemble(("warning:", "bold yellow"), " ", message), soft_wrap=True)


def info(message: str) -> None:
    err_console.print(Text(message, style="dim"), soft_wrap=True)


def progress(*columns: ProgressColumn | str) -> Progress:
    """A progress bar on stderr that clears itself when done, on a terminal. Elsewhere (a log
    file, nohup, a batch job's output) a bar would print nothing useful, so a task that runs long
    prints a line now and then instead (`LoggedProgress`)."""
    if err_console.is_terminal:
        return Progress(*columns, console=err_console, transient=True)
    return LoggedProgress(*columns, console=err_console, every=_log_every())


def _log_every() -> float:
    """Seconds between a long task's progress lines off a terminal: NGSPEC_PROGRESS_EVERY, else 60
    (0 or less: none)."""
    value = os.environ.get("NGSPEC_PROGRESS_EVERY", "")
    try:
        return float(value) if value.strip() else 60.0
    except ValueError:
        return 60.0


class LoggedProgress(Progress):
    """`progress` off a terminal: no bar, but once a task has run ``every`` seconds, a line on
    stderr at most every ``every`` seconds saying how far it is (done of total, elapsed, and the
    time left at the pace since it started), and a last one when a task that printed any
    completes. A command of a few seconds prints nothing more than it did."""

    def __init__(self, *columns: ProgressColumn | str, every: float, **kwargs) -> None:
        super().__init__(*columns, disable=True, **kwargs)
        self._every = every
        self._since: dict[TaskID, tuple[float, float]] = {}  # task: (time, completed) its pace counts from
        self._shown: dict[TaskID, float] = {}  # task: when its last line was printed
        self._ended: set[TaskID] = set()

    def add_task(self, description: str, *args, **kwargs) -> TaskID:
        task_id = super().add_task(description, *args, **kwargs)
        self._since[task_id] = (self.get_time(), self._tasks[task_id].completed)
        return task_id

    def reset(self, task_id: TaskID, *args, **kwargs) -> None:
        super().reset(task_id, *args, **kwargs)
        self._since[task_id] = (self.get_time(), self._tasks[task_id].completed)
        self._shown.pop(task_id, None)
        self._ended.discard(task_id)

    def update(self, task_id: TaskID, *args, **kwargs) -> None:
        super().update(task_id, *args, **kwargs)
        self._log(task_id)

    def advance(self, task_id: TaskID, advance: float = 1) -> None:
        super().advance(task_id, advance)
        self._log(task_id)

    def _log(self, task_id: TaskID) -> None:
        if self._every <= 0 or task_id in self._ended or task_id not in self._since:
            return
        task, now = self._tasks[task_id], self.get_time()
        start, first = self._since[task_id]
        ended = task.total is not None and task.completed >= task.total
        if not (ended and task_id in self._shown) and now - self._shown.get(task_id, start) < self._every:
            return
        self._shown[task_id] = now
        if ended:
            self._ended.add(task_id)
        done = f"{task.completed:,.0f}" + (f"/{task.total:,.0f} ({100 * task.completed / task.total:.0f}%)" if task.total else "")
        line = f"{task.description or 'working'}: {done}, {_clock(now - start)} elapsed"
        if not ended and task.total and task.completed > first:
            line += f", about {_clock((now - start) / (task.completed - first) * (task.total - task.completed))} left"
        info(line)


def _clock(seconds: float) -> str:
    """``1:02:03`` (h:mm:ss)."""
    whole = int(seconds)
    return f"{whole // 3600}:{whole // 60 % 60:02d}:{whole % 60:02d}"


@contextmanager
def progress_when_called(description: str, *columns: ProgressColumn | str) -> Iterator[Callable[[int, int], None]]:
    """A ``(done, total)`` callback for work that is usually cached: its `progress` bar appears at
    the first call, so a run that finds the result cached shows none."""
    shown: list[tuple[Progress, TaskID]] = []

    def update(done: int, total: int) -> None:
        if not shown:
            bar = progress(*columns)
            bar.start()
            shown.append((bar, bar.add_task(description, total=total, completed=done)))
        bar, task = shown[0]
        bar.update(task, completed=done, total=total)

    try:
        yield update
    finally:
        for bar, _ in shown:
            bar.stop()


def stdout_holds_unicode() -> bool:
    """Whether stdout's encoding can write every character (UTF-8, as almost everywhere)."""
    try:
        return codecs.lookup(getattr(sys.stdout, "encoding", None) or "utf-8").name.startswith("utf-")
    except LookupError:
        return False


def json_line(obj: object) -> None:
    """``obj`` as one JSON line on stdout (characters as written, or JSON's escapes where stdout
    cannot hold them)."""
    sys.stdout.write(json.dumps(obj, ensure_ascii=not stdout_holds_unicode()) + "\n")
    sys.stdout.flush()


class TextStream:
    """Prints decoded text as tokens arrive (`ngspec.api.TextDeltas` to stdout)."""

    def __init__(self, detokenize) -> None:
        from ngspec.api import TextDeltas

        self._deltas = TextDeltas(detokenize, self._write)

    def __call__(self, new_tokens: list[int]) -> None:
        self._deltas(new_tokens)

    @staticmethod
    def _write(text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()

    def finish(self) -> None:
        self._deltas.flush()  # text held back for a character's other bytes, if the output ends mid-character
        sys.stdout.write("\n")
        sys.stdout.flush()


def rule(title: str) -> None:
    console.rule(Text(title))


def _plain(cell: RenderableType) -> RenderableType:
    return Text(cell) if isinstance(cell, str) else cell


def _title_width(title: str) -> int:
    """A table at least as wide as its title, so a short table does not wrap it."""
    return min(len(title), console.width)


def summary_table(title: str, rows: list[tuple[str, str]]) -> None:
    table = Table(title=Text(title), show_header=False, title_justify="left", min_width=_title_width(title))
    table.add_column(style="bold")
    table.add_column(justify="right")
    for key, value in rows:
        table.add_row(_plain(key), _plain(value))
    console.print(table)


def table(title: str, columns: list[str], rows: list[list[RenderableType]]) -> None:
    t = Table(title=Text(title), title_justify="left", min_width=_title_width(title))
    for i, col in enumerate(columns):
        t.add_column(Text(col), justify="left" if i == 0 else "right")
    for row in rows:
        t.add_row(*map(_plain, row))
    console.print(t)
