"""Writing a directory or a file atomically: build it under a temporary name beside the target, then
rename, so that an interrupted command never leaves half of one behind.

A process killed outright (SIGKILL, the OOM killer) runs no cleanup and leaves its temporary
behind. Each temporary's name records where its writer ran (this boot of this machine, and its PID
namespace) and the writer's pid, so the next write in the same directory can tell a dead writer's
leftovers from a live writer's work and remove them; one made elsewhere is never touched."""

from __future__ import annotations

import errno
import hashlib
import os
import re
import secrets
import shutil
import stat
import tempfile
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from ngspec.errors import NgspecError


@contextmanager
def staged_directory(out: Path, force: bool) -> Iterator[Path]:
    """Yield a temporary directory beside ``out``; on success it takes ``out``'s place (see
    `_move_into_place`). A link at ``out`` stays: the directory goes where it points (another disk,
    say), and the temporary is made beside it there."""
    out = Path(out)
    refuse_replacing(out, force)
    if out.exists() and not out.is_dir():
        raise NgspecError(f"{out} is a file; --force replaces a directory only, give another path")
    out = followed(out)
    _no_file_above(out)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        _sweep(out.parent)
        tmp = _stand_in(out)
        tmp.mkdir()  # with the usual permissions (a shared cache or datastore stays readable to others)
    except OSError as exc:  # the path that refused, unless it is our own temporary (no inodes left: ENOSPC at its mkdir)
        where = exc.filename or out.parent
        where = "" if _STAND_IN.fullmatch(Path(where).name) else f" ({where})"
        raise NgspecError(f"cannot write {out}: {exc.strerror or exc}{where}") from None
    try:
        yield tmp
        _move_into_place(tmp, out, force)
    except Exception as exc:
        if (full := _full_device(exc, out, tmp)) is not None:
            raise full from exc
        raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def refuse_replacing(out: Path, force: bool) -> None:
    """Refuse an output that is there already, unless ``force`` (a device or pipe, `is_stream`, is
    written to, not replaced)."""
    if not force and Path(out).exists() and not is_stream(Path(out)):
        raise NgspecError(f"{out} already exists (use --force to replace it)")


def is_stream(out: Path) -> bool:
    """Whether ``out`` is (or links to) a device, pipe or socket: ``/dev/stdout``, ``/dev/null``,
    a FIFO. Such an output is written straight, as a shell's ``>`` writes it: there is nothing to
    write whole, and a temporary renamed over it would replace the device or link itself with a
    file (as root, ``/dev/null`` for every process)."""
    try:
        mode = os.stat(out).st_mode
    except (OSError, ValueError):
        return False
    return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode))


def followed(out: Path) -> Path:
    """Where ``out`` writes to: the path a link there names (even one that names nothing yet)."""
    return out.resolve() if out.is_symlink() else out


def _move_into_place(new: Path, out: Path, force: bool) -> None:
    """Rename the directory ``new`` to ``out``. An ``out`` there already (``force``) is moved aside
    first and removed only once ``new`` is in place, so an interruption never leaves it half
    removed; one that another command made while this one ran is not removed without ``force``."""
    if not out.exists():
        new.rename(out)
        return
    if not force:
        raise NgspecError(f"{out} was made by another command while this one ran; it is left as it is (use --force to replace it)")
    old = _stand_in(out)
    out.rename(old)
    try:
        new.rename(out)
    except BaseException:
        old.rename(out)
        raise
    shutil.rmtree(old, ignore_errors=True)


@contextmanager
def exclusive(lock: Path) -> Iterator[None]:
    """Hold an exclusive lock on the file ``lock`` (made if missing) for the block: a second
    process waits at the same lock until the first leaves it (where the OS has no ``fcntl``,
    nobody waits)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        yield
        return
    with open(lock, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _this_place() -> str | None:
    """Eight hex digits naming this boot of this machine and this process's PID namespace: where a
    pid names one process. None where the OS does not say (nothing is swept there)."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:
        return None
    return hashlib.blake2s(f"{boot} {namespace}".encode(), digest_size=4).hexdigest()


_PLACE = _this_place()
_LEFTOVER = re.compile(r"\..+\.tmp-(?P<place>[0-9a-f]{8})-(?P<pid>[0-9]+)-[0-9a-f]{8}")


def _stand_in(out: Path) -> Path:
    """A temporary name beside ``out``, unique to this process and call, saying where it was made."""
    where = f"{_PLACE}-" if _PLACE else ""
    return out.with_name(f".{out.name}.tmp-{where}{os.getpid()}-{secrets.token_hex(4)}")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):  # another user's process (or a pid no OS gives): keep
        return True
    return True


def _sweep(directory: Path) -> None:
    """Remove the temporaries in ``directory`` whose writers ran here and have died (quietly: a
    leftover that cannot be removed is left as it was)."""
    if _PLACE is None:
        return
    try:
        names = os.listdir(directory)
    except OSError:
        return
    for name in names:
        match = _LEFTOVER.fullmatch(name)
        if match is None or match["place"] != _PLACE or _alive(int(match["pid"])):
            continue
        leftover = directory / name
        try:
            if leftover.is_dir() and not leftover.is_symlink():
                shutil.rmtree(leftover)
            else:
                leftover.unlink(missing_ok=True)
        except OSError:
            pass


def _no_file_above(out: Path) -> None:
    """Refuse ``out`` when its nearest existing ancestor is a file (mkdir would say "File exists")."""
    above = next((p for p in out.parents if p.exists()), None)
    if above is not None and not above.is_dir():
        raise NgspecError(f"cannot write {out}: {above} is a file, not a directory")


def output_directory(out: Path, flag: str = "") -> None:
    """Create the directory ``out`` will be written in and check that a file can be written there
    (called before a long run, so that a path that cannot be written fails at once, not after the
    work); ``out`` itself must not be a directory. ``flag``: the option that named it, for the
    message (a command may write several files)."""
    if Path(out).is_dir():
        raise NgspecError(f"{flag + ' ' if flag else ''}{out} is a directory; give the path of a file to write")
    if is_stream(Path(out)):
        return  # a device or pipe, written straight (`staged_file`): no file is made beside it
    _no_file_above(Path(out))
    try:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise NgspecError(f"cannot create the directory for {out}: {exc.strerror or exc}") from None
    try:
        probe_writable(Path(out).parent, Path(out).name)
    except OSError as exc:
        raise NgspecError(f"cannot write {out}: {exc.strerror or exc}") from None


def output_folder(out: Path, flag: str, holds: str) -> None:
    """Create the directory ``out`` (``flag``'s value, the folder for ``holds``) and check that a
    file can be written in it, before a long run: a path that cannot be written fails at once,
    not after the work."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise NgspecError(f"{flag} {out} is a file; give a directory for {holds}")
    _no_file_above(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe_writable(out)
    except OSError as exc:
        raise NgspecError(f"cannot write to output directory {out}: {exc.strerror or exc}") from None


def probe_writable(directory: Path, name: str = "ngspec") -> None:
    """Make and remove a file of our own in ``directory`` (a unique name, never one that may be in
    use); raises OSError when the directory takes no files."""
    handle, probe = tempfile.mkstemp(prefix=f".{name}.probe-", dir=directory)
    os.close(handle)
    os.unlink(probe)


@contextmanager
def staged_file(out: Path) -> Iterator[Path]:
    """Yield a temporary path beside ``out``, unique to this call (two processes writing the same
    cache entry at once each write their own and the last rename wins, whole); on success it
    replaces ``out`` atomically, otherwise it is removed. A device or pipe (`is_stream`) is
    yielded itself, written straight."""
    if is_stream(Path(out)):
        yield Path(out)
        return
    out = followed(Path(out))  # a link stays; the file it names is replaced, as a shell's `>` writes
    _sweep(out.parent)
    tmp = _stand_in(out)  # made by the caller, with its usual permissions
    try:
        yield tmp
        tmp.replace(out)
    except Exception as exc:
        if (full := _full_device(exc, out, tmp)) is not None:
            raise full from exc
        raise
    finally:
        tmp.unlink(missing_ok=True)


FULL_BYTES = 1 << 20  # free bytes under which a write that failed without saying why is put down to a full device
FULL_WORDS = {errno.ENOSPC: "No space left on device", errno.EDQUOT: "Disk quota exceeded"}  # the errnos of a full device


def _free_bytes(directory: Path) -> int | None:
    try:
        return shutil.disk_usage(directory).free
    except OSError:
        return None


def _full_device(exc: Exception, out: Path, tmp: Path) -> OSError | None:
    """The plain OSError (ENOSPC or EDQUOT, naming ``out``) for ``exc``, raised while ``out`` was
    written through ``tmp``, when it came from a full device (or quota); None for anything else.
    The writers we use say so in their own ways: Python's and numpy's OSError with the errno but no
    file name ("No space left on device" alone), safetensors in its text ("I/O error: No space
    left on device (os error 28)"), and numpy's short write ("46791 requested and 27616 written")
    and torch's ("[enforce fail at inline_container.cc:672] . unexpected pos 201088 vs 200976")
    not at all: those two count as a full device when it has under `FULL_BYTES` free, the
    temporary still on it. ngspec's own errors pass as they are (they may quote such an error)."""
    if isinstance(exc, NgspecError) or (isinstance(exc, OSError) and exc.filename is not None):
        return None  # ngspec's own words, or an OSError that already names its file
    said = getattr(exc, "errno", None)
    code = said if said in FULL_WORDS else next((c for c, words in FULL_WORDS.items() if words in str(exc)), None)
    if code is None and said is None and isinstance(exc, (OSError, RuntimeError)):
        free = _free_bytes(tmp.parent)
        code = errno.ENOSPC if free is not None and free < FULL_BYTES else None
    return None if code is None else OSError(code, FULL_WORDS[code], str(out))


def keep_in_cache(path: Path, write: Callable[[Path], None], what: str) -> bool:
    """Store a cache entry: ``write(path)`` after making its directory. A cache is only a saving,
    so where it cannot be written (read-only, full, a file in the way) this warns and returns
    False, and the caller goes on with what it computed: a first run's minute of timing was lost
    to a "File exists" error before."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write(path)
        return True
    except OSError as exc:
        reason = f"{exc.strerror or exc}: {exc.filename or path.parent}"
        warnings.warn(
            f"ngspec: cannot write {what} to the cache ({reason}); the next run will redo this work. "
            "Set NGSPEC_CACHE to a writable directory", RuntimeWarning, stacklevel=2,
        )
        return False


def write_text(out: Path, text: str) -> None:
    """Write ``text`` to ``out`` through a temporary file beside it, renamed into place."""
    with staged_file(out) as tmp:
        tmp.write_text(text)


def write_each(writes: list[tuple[Path, Callable[[], object]]]) -> None:
    """Write a command's files (``(path, what writes it)`` pairs) in turn, each whole or not at
    all; when one fails after others were written (a disk that fills), the message names those,
    which stay: they are whole, and each may have cost a long run."""
    written: list[Path] = []
    for path, write in writes:
        try:
            write()
        except OSError as exc:
            if not written:
                raise
            raise NgspecError(f"{os_error_message(exc)}; written whole before it: {', '.join(map(str, written))}") from exc
        written.append(path)


_STAND_IN = re.compile(r"\.(.+)\.tmp(-.*)?")


def os_error_message(exc: OSError) -> str:
    """An OSError in one line ("Permission denied: out/table.pt"), naming the path the user gave
    rather than the temporary stand-in that was being written (``.table.pt.tmp``)."""
    reason = exc.strerror or str(exc) or type(exc).__name__
    if exc.filename is None:
        return reason
    parts = [m.group(1) if (m := _STAND_IN.fullmatch(part)) else part for part in Path(exc.filename).parts]
    return f"{reason}: {Path(*parts)}"
