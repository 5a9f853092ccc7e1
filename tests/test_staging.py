import os

import pytest
from safetensors import SafetensorError

from ngspec import staging
from ngspec.errors import NgspecError


def test_write_text_replaces_the_file_and_leaves_no_temporary(tmp_path):
    out = tmp_path / "shape.json"
    out.write_text("old")
    staging.write_text(out, "new")
    assert out.read_text() == "new"
    assert [p.name for p in tmp_path.iterdir()] == ["shape.json"]


def test_an_interrupted_write_keeps_the_old_file(tmp_path, monkeypatch):
    out = tmp_path / "shape.json"
    out.write_text("old")

    def interrupted(self, text):
        raise KeyboardInterrupt

    monkeypatch.setattr(type(out), "write_text", interrupted)
    with pytest.raises(KeyboardInterrupt):
        staging.write_text(out, "new")
    monkeypatch.undo()
    assert out.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["shape.json"]


def test_output_directory_is_created_or_refused_clearly(tmp_path):
    staging.output_directory(tmp_path / "a" / "b" / "shape.json")
    assert (tmp_path / "a" / "b").is_dir()
    (tmp_path / "file").write_text("")
    with pytest.raises(NgspecError, match="cannot write .*/file/shape.json: .*/file is a file, not a directory"):
        staging.output_directory(tmp_path / "file" / "shape.json")


def test_output_paths_of_the_wrong_kind_are_refused_before_any_work(tmp_path):
    with pytest.raises(NgspecError, match="is a directory; give the path of a file"):
        staging.output_directory(tmp_path)  # e.g. --json-out DIR: refused before the bench runs
    afile = tmp_path / "notes.txt"
    afile.write_text("keep me")
    with pytest.raises(NgspecError, match="is a file; --force replaces a directory only"):
        with staging.staged_directory(afile, force=True):
            pytest.fail("no work starts")
    assert afile.read_text() == "keep me" and sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def test_a_staged_directory_that_cannot_be_made_is_refused_clearly(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(NgspecError, match="cannot write .*/file/store: .*/file is a file, not a directory"):
        with staging.staged_directory(tmp_path / "file" / "store", force=False):
            pytest.fail("no work starts")


def test_an_os_error_names_the_path_the_user_gave():
    """A failed write reports the output's own name, not the temporary stand-in being written."""
    assert staging.os_error_message(PermissionError(13, "Permission denied", "/out/.table.pt.tmp")) == "Permission denied: /out/table.pt"
    inside = OSError(28, "No space left on device", "/out/.store.tmp-k3j9/sa.npy")  # inside a staged directory
    assert staging.os_error_message(inside) == "No space left on device: /out/store/sa.npy"
    assert staging.os_error_message(FileNotFoundError(2, "No such file or directory", "data/q.jsonl")) == "No such file or directory: data/q.jsonl"
    assert staging.os_error_message(OSError("disk went away")) == "disk went away"


def test_a_command_that_hits_an_os_error_prints_one_line(monkeypatch):
    import typer
    from typer.testing import CliRunner

    from ngspec.cli.app import friendly

    def command():
        raise PermissionError(13, "Permission denied", "/out/.bench.json.tmp")

    demo = typer.Typer()
    demo.command()(friendly(command))
    monkeypatch.delenv("NGSPEC_DEBUG", raising=False)
    result = CliRunner().invoke(demo, [])
    assert result.exit_code == 1
    assert result.output.strip().splitlines() == ["error: Permission denied: /out/bench.json (set NGSPEC_DEBUG=1 for the traceback)"]


def test_files_written_in_turn_name_the_ones_kept_when_one_fails(tmp_path):
    """`write_each`: the first write's OSError passes as it is; a later one's names the files
    written whole before it, which stay."""
    def full(path):
        raise OSError(28, "No space left on device", str(path))

    a, b, c = tmp_path / "a.csv", tmp_path / "b.json", tmp_path / "c.png"
    with pytest.raises(OSError) as first:
        staging.write_each([(a, lambda: full(a)), (b, lambda: staging.write_text(b, "{}"))])
    assert type(first.value) is OSError and first.value.filename == str(a) and not b.exists()
    with pytest.raises(NgspecError) as later:
        staging.write_each([(a, lambda: staging.write_text(a, "x")), (b, lambda: staging.write_text(b, "{}")), (c, lambda: full(c))])
    assert str(later.value) == f"No space left on device: {c}; written whole before it: {a}, {b}"
    assert sorted(tmp_path.iterdir()) == [a, b]


def test_a_full_disk_is_said_without_offering_a_traceback(monkeypatch):
    """A full disk (or quota) is the whole story: the line names the path and no traceback is
    offered, as it is for an OSError that may be ngspec's fault (above)."""
    import typer
    from typer.testing import CliRunner

    from ngspec.cli.app import friendly

    monkeypatch.delenv("NGSPEC_DEBUG", raising=False)
    for code, words in ((28, "No space left on device"), (122, "Disk quota exceeded")):
        def command():
            raise OSError(code, words, "/out/.bench.json.tmp")

        demo = typer.Typer()
        demo.command()(friendly(command))
        result = CliRunner().invoke(demo, [])
        assert result.exit_code == 1
        assert result.output.strip().splitlines() == [f"error: {words}: /out/bench.json"]


def test_a_directory_that_cannot_be_made_names_the_place_not_our_temporary(tmp_path, monkeypatch):
    """A tmpfs out of inodes refused the temporary's mkdir; the message named it
    ("cannot write ds: No space left on device (/tmp/tt/.ds.tmp-f89003fc-28344-829acd81)")."""
    real = type(tmp_path).mkdir

    def no_inodes(self, *args, **kwargs):
        if self.name.startswith(".store.tmp"):
            raise OSError(28, "No space left on device", str(self))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(type(tmp_path), "mkdir", no_inodes)
    with pytest.raises(NgspecError) as failed:
        with staging.staged_directory(tmp_path / "store", force=False):
            pass
    assert str(failed.value) == f"cannot write {tmp_path / 'store'}: No space left on device"
    monkeypatch.setattr(type(tmp_path), "mkdir", lambda self, *a, **k: (_ for _ in ()).throw(PermissionError(13, "Permission denied", str(self))))
    with pytest.raises(NgspecError) as refused:
        with staging.staged_directory(tmp_path / "sub" / "store", force=False):
            pass
    assert str(refused.value) == f"cannot write {tmp_path / 'sub' / 'store'}: Permission denied ({tmp_path / 'sub'})"  # the place that refused


def test_output_directory_refuses_a_place_that_cannot_be_written(tmp_path, monkeypatch):
    """A directory that exists but takes no files (read-only, or /proc) fails before the work."""

    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied", str(kwargs.get("dir")))

    monkeypatch.setattr(staging.tempfile, "mkstemp", refuse)
    with pytest.raises(NgspecError, match="cannot write .*table.npz: Permission denied"):
        staging.output_directory(tmp_path / "table.npz")
    monkeypatch.undo()
    staging.output_directory(tmp_path / "table.npz")  # writable: passes, and leaves nothing behind
    assert list(tmp_path.iterdir()) == []
    busy = tmp_path / ".table.npz.tmp"  # another run's write in progress is left alone
    busy.write_text("half")
    staging.output_directory(tmp_path / "table.npz")
    assert busy.read_text() == "half" and list(tmp_path.iterdir()) == [busy]


def test_staged_files_of_two_writers_of_one_entry_do_not_collide(tmp_path):
    """Two processes filling the same cache entry at once (two commands started together) each
    write their own temporary file; each rename puts a whole file in place
    and nothing is left beside it. A failed write leaves the entry as it was."""
    out = tmp_path / "entry.json"
    with staging.staged_file(out) as first, staging.staged_file(out) as second:
        assert first != second and first.parent == second.parent == tmp_path
        first.write_text("first")
        second.write_text("second")
    assert out.read_text() == "first"  # the outer one renamed last
    plain = tmp_path / "plain.json"
    plain.write_text("")
    assert out.stat().st_mode == plain.stat().st_mode  # the usual permissions (a cache others read)
    plain.unlink()
    with pytest.raises(RuntimeError):
        with staging.staged_file(out) as tmp:
            tmp.write_text("half")
            raise RuntimeError("interrupted")
    assert out.read_text() == "first" and list(tmp_path.iterdir()) == [out]


def test_exclusive_makes_a_second_holder_wait(tmp_path):
    fcntl = pytest.importorskip("fcntl")
    lock = tmp_path / ".entry.lock"
    with staging.exclusive(lock):
        with open(lock) as other, pytest.raises(BlockingIOError):
            fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
    with open(lock) as other:
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released: taken at once


def test_the_default_model_is_converted_once_under_the_lock(tmp_path, monkeypatch):
    """The first use converts the embedded GGUF, holding the cache's lock; later uses find it
    converted."""
    from ngspec import models

    fcntl = pytest.importorskip("fcntl")
    monkeypatch.setenv("NGSPEC_CACHE", str(tmp_path))
    converted = []

    def convert(gguf, out):
        lock = out.parent / f".{out.name}.lock"
        with open(lock) as other, pytest.raises(BlockingIOError):  # converting under the lock
            fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
        out.mkdir()
        (out / "config.json").write_text("{}")
        converted.append(out)

    monkeypatch.setattr(models, "convert_gguf", convert)
    monkeypatch.setattr(models, "embedded_gguf", lambda: tmp_path / "model.gguf")
    assert models.default_model_dir() == models.default_model_dir() == tmp_path / "models" / "smollm2-135m-instruct"
    assert converted == [tmp_path / "models" / "smollm2-135m-instruct"]


def test_a_process_that_waited_at_the_lock_finds_the_model_converted(tmp_path, monkeypatch):
    """Another process converted the model while this one waited for the lock: this one checks
    again once it holds the lock, and converts nothing."""
    from contextlib import contextmanager

    from ngspec import models

    monkeypatch.setenv("NGSPEC_CACHE", str(tmp_path))
    out = tmp_path / "models" / "smollm2-135m-instruct"

    @contextmanager
    def waited(lock):  # the other process finishes while this one waits
        out.mkdir()
        (out / "config.json").write_text("{}")
        yield

    monkeypatch.setattr(models.staging, "exclusive", waited)
    monkeypatch.setattr(models, "convert_gguf", lambda gguf, out: pytest.fail("converted twice"))
    monkeypatch.setattr(models, "embedded_gguf", lambda: tmp_path / "model.gguf")
    assert models.default_model_dir() == out


def test_a_staged_directory_gets_the_usual_permissions(tmp_path):
    """A datastore or the converted default model is readable as any directory made here is (a
    temporary directory is private to its owner)."""
    with staging.staged_directory(tmp_path / "store", force=False) as tmp:
        (tmp / "sa.npy").write_text("")
    plain = tmp_path / "plain"
    plain.mkdir()
    assert (tmp_path / "store").stat().st_mode == plain.stat().st_mode
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plain", "store"]


needs_place = pytest.mark.skipif(staging._PLACE is None, reason="this OS does not say its boot and PID namespace: nothing is swept")


def _dead_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


@needs_place
def test_a_write_killed_outright_is_swept_by_the_next_write_beside_it(tmp_path):
    """A process killed with SIGKILL (or by the OOM killer) runs no cleanup, so its temporary
    directory stays. The next staged write in that directory removes it: its name says it was made
    on this machine, in this PID namespace, by a process that no longer exists."""
    import subprocess
    import sys

    killed = (
        "import os, signal, sys\n"
        "from pathlib import Path\n"
        "from ngspec import staging\n"
        "with staging.staged_directory(Path(sys.argv[1]), force=False) as tmp:\n"
        "    (tmp / 'sa.npy').write_bytes(b'half' * 1000)\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    run = subprocess.run([sys.executable, "-c", killed, str(tmp_path / "store")])
    assert run.returncode == -9
    left = [p.name for p in tmp_path.iterdir()]
    assert len(left) == 1 and left[0].startswith(".store.tmp-")  # what a killed build leaves
    with staging.staged_directory(tmp_path / "other", force=False) as tmp:
        (tmp / "sa.npy").write_text("")
    assert [p.name for p in tmp_path.iterdir()] == ["other"]


@needs_place
def test_only_temporaries_of_dead_writers_here_are_swept(tmp_path):
    """A live writer's temporary (this process's, say), one made on another machine or in another
    container sharing the disk (whose pid means nothing here), one named before the writer's place
    was recorded, and anything else are all left alone."""
    place = staging._PLACE
    dead = _dead_pid()
    stale_dir = tmp_path / f".store.tmp-{place}-{dead}-0badf00d"
    stale_dir.mkdir()
    (stale_dir / "sa.npy").write_text("half")
    stale_file = tmp_path / f".table.npz.tmp-{place}-{dead}-12345678"
    stale_file.write_text("half")
    kept = [
        tmp_path / f".store.tmp-{place}-{os.getpid()}-aaaaaaaa",  # alive: this process
        tmp_path / f".store.tmp-{'f' * len(place)}-{dead}-bbbbbbbb",  # another machine's
        tmp_path / f".store.tmp-{dead}-cccccccc",  # the name before the place was recorded
        tmp_path / f".store.tmp-{place}-{dead}-notahex!",
        tmp_path / "notes.txt",
    ]
    for path in kept:
        path.write_text("keep")
    staging.write_text(tmp_path / "shape.json", "{}")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([p.name for p in kept] + ["shape.json"])


@needs_place
def test_a_temporary_that_cannot_be_swept_is_left_without_a_word(tmp_path, monkeypatch):
    place = staging._PLACE
    stale = tmp_path / f".store.tmp-{place}-{_dead_pid()}-0badf00d"
    stale.write_text("half")

    def refuse(self, missing_ok=False):
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(type(stale), "unlink", refuse)
    with staging.staged_directory(tmp_path / "store", force=False) as tmp:
        (tmp / "sa.npy").write_text("")
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([stale.name, "store"])


def test_a_temporary_name_says_where_and_by_whom_it_was_made(tmp_path):
    """On Linux (CI, our machines) the place is known, so nothing above skips there."""
    import sys

    if sys.platform.startswith("linux"):
        assert staging._PLACE is not None
    name = staging._stand_in(tmp_path / "store").name
    match = staging._LEFTOVER.fullmatch(name)
    if staging._PLACE is None:
        assert match is None and name.startswith(f".store.tmp-{os.getpid()}-")
    else:
        assert (match["place"], int(match["pid"])) == (staging._PLACE, os.getpid())


@pytest.mark.parametrize(
    ("raised", "free", "said"),
    [  # what each writer raised on a 200 KiB tmpfs that filled (numpy, torch, safetensors, Python)
        (OSError("46791 requested and 27616 written"), 0, "No space left on device"),
        (RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 201088 vs 200976"), 0, "No space left on device"),
        (SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)"), 10**9, "No space left on device"),
        (OSError(28, "No space left on device"), 10**9, "No space left on device"),
        (OSError(122, "Disk quota exceeded"), 10**9, "Disk quota exceeded"),
    ],
)
def test_a_write_that_fills_the_device_says_so_naming_the_output(tmp_path, monkeypatch, raised, free, said):
    """A full device is named as one, at the user's path, however the library that wrote said it
    (numpy's short write and torch's "unexpected pos" say nothing of why: the device's free space
    tells), and the temporary is removed."""
    monkeypatch.setattr(staging, "_free_bytes", lambda directory: free)
    for staged, out in ((staging.staged_file, tmp_path / "table.npz"), (lambda out: staging.staged_directory(out, force=False), tmp_path / "store")):
        with pytest.raises(OSError) as failed:
            with staged(out) as tmp:
                (tmp / "sa.npy" if tmp.is_dir() else tmp).write_bytes(b"half")
                raise raised
        assert failed.type is OSError and failed.value.strerror == said and failed.value.filename == str(out)
        assert failed.value.__cause__ is raised and staging.os_error_message(failed.value) == f"{said}: {out}"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "raised",
    [RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 201088 vs 200976"),  # with room: not the device
     ValueError("a bad record"), OSError(28, "No space left on device", "/out/.t.npz.tmp-1"),  # names its file already
     NgspecError("stopped (No space left on device, writing c.jsonl) after 2 records")],  # ngspec's own words
)
def test_other_write_failures_pass_as_they_are(tmp_path, monkeypatch, raised):
    monkeypatch.setattr(staging, "_free_bytes", lambda directory: 10**9 if isinstance(raised, RuntimeError) else 0)
    with pytest.raises(type(raised)) as failed:
        with staging.staged_file(tmp_path / "t.npz"):
            raise raised
    assert failed.value is raised and list(tmp_path.iterdir()) == []


def test_a_full_cache_says_where_the_default_model_goes_and_what_it_needs(tmp_path, monkeypatch):
    from ngspec import models

    monkeypatch.setenv("NGSPEC_CACHE", str(tmp_path))

    def convert(gguf, out):
        raise OSError(28, "No space left on device", str(out))

    monkeypatch.setattr(models, "convert_gguf", convert)
    monkeypatch.setattr(models, "embedded_gguf", lambda: tmp_path / "model.gguf")
    with pytest.raises(NgspecError, match=r"^cannot convert the default model into ngspec's cache \(No space left on device: .*/models/smollm2-135m-instruct\); "
                                          r"it takes about 520 MB: make room there, or set NGSPEC_CACHE to a directory with room$"):
        models.default_model_dir()


@pytest.mark.parametrize(("value", "where"), [("", "~/.cache/ngspec"), ("~/ngc", "~/ngc"), ("/data/ngc", "/data/ngc")])
def test_the_cache_is_where_ngspec_cache_says_and_at_home_when_it_is_empty(monkeypatch, value, where):
    from pathlib import Path

    from ngspec.models import cache_dir

    monkeypatch.setenv("NGSPEC_CACHE", value)
    assert cache_dir() == Path(where).expanduser()


@pytest.mark.parametrize(("value", "on"), [(None, False), ("", False), ("0", False), ("false", False), ("No", False), (" off ", False),
                                          ("1", True), ("yes", True), ("true", True), ("2", True)])
def test_an_environment_switch_is_off_when_empty_or_zero(monkeypatch, value, on):
    """NGSPEC_DEBUG=0 turned tracebacks on, NGSPEC_RECALIBRATE=0 timed everything again."""
    from ngspec.errors import env_switch

    if value is None:
        monkeypatch.delenv("NGSPEC_DEBUG", raising=False)
    else:
        monkeypatch.setenv("NGSPEC_DEBUG", value)
    assert env_switch("NGSPEC_DEBUG") is on


def test_debug_set_to_zero_keeps_the_one_line_error(monkeypatch, capsys):
    import typer

    from ngspec.cli.app import friendly

    def command():
        raise RuntimeError("a bug")

    monkeypatch.setenv("NGSPEC_DEBUG", "0")
    with pytest.raises(typer.Exit):
        friendly(command)()
    assert capsys.readouterr().err.startswith("error: RuntimeError: a bug")
    monkeypatch.setenv("NGSPEC_DEBUG", "1")
    with pytest.raises(RuntimeError, match="a bug"):
        friendly(command)()


def test_force_through_a_link_replaces_the_directory_it_points_to(tmp_path):
    """A datastore kept on another disk behind a link: --force rebuilds it there, beside the old
    one (so on that disk), and the link stays. It failed after the build: "Cannot call rmtree on a
    symbolic link"."""
    real = tmp_path / "big" / "store"
    real.mkdir(parents=True)
    (real / "old.npy").write_text("old")
    link = tmp_path / "store"
    link.symlink_to(real)
    with pytest.raises(NgspecError, match="already exists"):
        with staging.staged_directory(link, force=False):
            pytest.fail("no work starts")
    with staging.staged_directory(link, force=True) as tmp:
        assert tmp.parent == real.parent
        (tmp / "sa.npy").write_text("new")
    assert link.is_symlink() and link.resolve() == real.resolve()
    assert sorted(p.name for p in real.iterdir()) == ["sa.npy"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big", "store"]
    assert sorted(p.name for p in real.parent.iterdir()) == ["store"]
    ahead = tmp_path / "later"  # a link made before the build, to where the datastore should go
    ahead.symlink_to(tmp_path / "big" / "later")
    with staging.staged_directory(ahead, force=False) as tmp:
        (tmp / "sa.npy").write_text("new")
    assert ahead.is_symlink() and (tmp_path / "big" / "later" / "sa.npy").read_text() == "new"


def test_a_replaced_directory_stays_whole_until_the_new_one_is_in_place(tmp_path, monkeypatch):
    """--force moves the old directory aside and removes it only once the new one is in place: an
    interruption never leaves it half removed (it was removed first, then the new one moved in)."""
    out = tmp_path / "store"
    out.mkdir()
    (out / "sa.npy").write_text("old")
    rename, moves_in = type(out).rename, []

    def interrupted(self, target):
        if str(target) == str(out) and not moves_in:  # the new directory's move into place
            moves_in.append(self)
            raise KeyboardInterrupt
        return rename(self, target)

    monkeypatch.setattr(type(out), "rename", interrupted)
    with pytest.raises(KeyboardInterrupt):
        with staging.staged_directory(out, force=True) as tmp:
            (tmp / "sa.npy").write_text("new")
    monkeypatch.undo()
    assert moves_in and (out / "sa.npy").read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["store"]
    with staging.staged_directory(out, force=True) as tmp:
        (tmp / "sa.npy").write_text("new")
    assert (out / "sa.npy").read_text() == "new" and [p.name for p in tmp_path.iterdir()] == ["store"]


def test_an_output_made_by_another_command_meanwhile_is_kept_without_force(tmp_path):
    """Two builds to one path started together: the one that ends second does not remove the
    other's datastore unless --force said so."""
    out = tmp_path / "store"
    with pytest.raises(NgspecError, match=f"{out} was made by another command while this one ran; it is left as it is"):
        with staging.staged_directory(out, force=False) as tmp:
            (tmp / "sa.npy").write_text("ours")
            out.mkdir()
            (out / "sa.npy").write_text("theirs")
    assert (out / "sa.npy").read_text() == "theirs" and [p.name for p in tmp_path.iterdir()] == ["store"]


def test_a_file_written_through_a_link_lands_where_it_points(tmp_path):
    """As a shell's `>` does: the link stays, the file it names gets the text (written beside it)."""
    real = tmp_path / "elsewhere" / "shape.json"
    real.parent.mkdir()
    real.write_text("old")
    link = tmp_path / "shape.json"
    link.symlink_to(real)
    staging.write_text(link, "new")
    assert link.is_symlink() and real.read_text() == "new"
    assert [p.name for p in real.parent.iterdir()] == ["shape.json"]


def test_a_device_or_pipe_is_written_straight_not_replaced(tmp_path):
    """`--json-out /dev/stdout` (a link to the process's pipe) or a FIFO: written as a shell's `>`
    writes, not through a temporary renamed over it, which (as root) would have replaced the link
    or device itself with a file (`/dev/null` too), or now failed naming a path under /proc."""
    import stat

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    link = tmp_path / "stdout"
    link.symlink_to(fifo)
    for out in (fifo, link):
        reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # open first, so that the write does not wait for a reader
        try:
            staging.refuse_replacing(out, force=False)  # written to, not replaced: no --force asked
            staging.output_directory(out, "--json-out")  # checked before the work, without a probe file beside it
            staging.write_text(out, '{"a": 1}\n')
            got = os.read(reader, 100)
        finally:
            os.close(reader)
        assert got == b'{"a": 1}\n', out
        assert stat.S_ISFIFO(fifo.stat().st_mode) and link.is_symlink()
        assert sorted(p.name for p in tmp_path.iterdir()) == ["pipe", "stdout"]
