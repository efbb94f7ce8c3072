"""Files that are whole or absent: every write that a crash must not tear goes through here.

A file is written to a temporary sibling, flushed and fsynced, renamed over its name (``os.replace``, atomic on
POSIX), and the folder is fsynced so that the rename itself survives a power cut. A crash at any point leaves the
old file or the new one, never a torn one, and no temporary file is left behind by an error.
"""

from __future__ import annotations

import errno
import fnmatch
import hashlib
import json
import os
import shutil
import signal
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any


def fsync_directory(directory: str | Path) -> None:
    """Make the renames and new names in ``directory`` durable (POSIX); a no-op where folders cannot be opened."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def fsync_file(path: str | Path) -> None:
    """Flush a file that is already written (e.g. by a library that took its path) to the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def atomic_write(path: str | Path, mode: str = "wb", *, suffix: str = ".tmp",
                 encoding: str | None = None) -> Iterator[IO[Any]]:
    """Open a temporary sibling of ``path`` for writing; on a clean exit it replaces ``path``.

    Args:
        path: the file to write (its folder must exist).
        mode: ``"wb"`` or ``"w"`` (text; ``encoding`` defaults to UTF-8).
        suffix: the temporary file's suffix (``.part`` for downloads, say).

    On an exception the temporary file is removed and ``path`` is left as it was.
    """
    path = Path(path)
    try:
        fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=suffix, dir=path.parent)
    except OSError as error:
        raise _disk_full(path, error) or error
    if "b" not in mode and encoding is None:
        encoding = "utf-8"
    try:
        os.fchmod(fd, _replaced_mode(path))  # mkstemp's file is private; the file it becomes is not (a shared cache)
        with os.fdopen(fd, mode, encoding=encoding) as handle:
            yield dying_at_fault_point(handle, path)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp_name, path)
    except BaseException as error:
        full = _disk_full(path, error)  # before the partial file is removed, which frees its space
        Path(tmp_name).unlink(missing_ok=True)
        if full is not None:
            raise full from error
        raise
    fsync_directory(path.parent)


class DiskFullError(OSError):
    """A write ran out of space; the file written keeps its earlier content (if any). The message names the file."""

    def __str__(self) -> str:
        return str(self.strerror)


_FULL = (errno.ENOSPC, errno.EDQUOT)


def _disk_full(path: Path, error: BaseException, outcome: str | None = None) -> DiskFullError | None:
    """A :class:`DiskFullError` for ``error`` when it came from a full disk, else None. torch.save reports one as a
    RuntimeError ("file write failed", or "unexpected pos" when a buffered write came up short), so a failed write
    on a file system with no space left counts too. ``outcome`` says what became of ``path`` (default: it keeps
    its earlier content, or was not written)."""
    if isinstance(error, DiskFullError):
        return error
    full = isinstance(error, OSError) and error.errno in _FULL
    # an error that names no cause (torch.save's, a short write's EIO), not one that names another (ENOENT, EACCES)
    unexplained = isinstance(error, RuntimeError) or (isinstance(error, OSError) and error.errno in (None, errno.EIO))
    if not full and unexplained:
        try:
            stats = os.statvfs(path.parent)  # a read-only file system (squashfs, /proc) has no space, and needs none
            full = not stats.f_flag & os.ST_RDONLY and stats.f_bavail * stats.f_frsize < 1 << 20
        except OSError:
            full = False
    if not full:
        return None
    if outcome is None:
        outcome = f"{path.name} keeps its earlier content" if path.exists() else f"{path.name} was not written"
    return DiskFullError(errno.ENOSPC, f"no space left on device (ENOSPC) while writing {path}; {outcome}; "
                                       f"free space on {path.parent} and run the command again")


def disk_full_while_building(folder: Path, error: BaseException) -> DiskFullError | None:
    """:func:`_disk_full` for a folder built under a temporary name and renamed into place: nothing of it is kept."""
    return _disk_full(folder, error, f"nothing half-written was kept under {folder.name}")


def _new_file_mode(base: int = 0o666) -> int:
    """The mode ``open()`` gives a new file (``mkdir``, with ``base`` 0o777, a new folder): less the umask, read
    from ``/proc`` where it can be (setting it to read it would race with other threads' new files)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            umask = next(int(line.split()[1], 8) for line in status if line.startswith("Umask:"))
    except (OSError, StopIteration, ValueError, IndexError):  # not Linux, or a kernel before 4.7
        umask = os.umask(0)
        os.umask(umask)
    return base & ~umask


def _replaced_mode(path: Path) -> int:
    """The mode for the file that takes ``path``'s name: the mode of the file it replaces (a private file stays
    private), else a new file's."""
    try:
        return stat.S_IMODE(os.stat(path).st_mode) & 0o777  # not setuid, setgid or sticky
    except OSError:
        return _new_file_mode()


def write_text_through(path: str | Path, text: str) -> None:
    """Write ``text`` (UTF-8) to a file a person named: through a symbolic link, into the file it points to; a regular
    file atomically (:func:`write_text`); a device or a named pipe (``/dev/null``, a FIFO), which a rename would
    replace, opened and written as a shell's ``>`` writes it."""
    target = Path(os.path.realpath(path))
    if is_stream(target):
        with open(target, "w", encoding="utf-8") as handle:
            handle.write(text)
    else:
        write_text(target, text)


def is_stream(path: str | Path) -> bool:
    """Whether ``path`` is a character device or a named pipe: a file written to as it is, never replaced."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return stat.S_ISCHR(mode) or stat.S_ISFIFO(mode)  # not a block device: a disk is no place for text


def temporary_folder(parent: str | Path, prefix: str) -> Path:
    """A new folder in ``parent`` to build a folder in before renaming it into place: named ``prefix`` and random
    characters, with the mode ``mkdir`` would give it (``tempfile.mkdtemp`` makes it private, and the rename keeps
    that: an export or a cache that other accounts read would be closed to them)."""
    folder = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    folder.chmod(_new_file_mode(0o777))
    return folder


def write_text(path: str | Path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    with atomic_write(path, "w") as handle:
        handle.write(text)


def write_json(path: str | Path, value: Any) -> None:
    """Write ``value`` as indented JSON (with a final newline) to ``path`` atomically; a path or another value JSON
    has no type for is written as its string."""
    write_text(path, json.dumps(value, indent=2, default=str) + "\n")


def link_atomically(source: str | Path, target: str | Path) -> None:
    """Make ``target`` hold the same bytes as ``source``: a hard link (no copy) or, where the file system has
    none, a copy; then a rename over ``target``. The caller fsyncs the folder."""
    target = Path(target)
    tmp = target.with_name(f".{target.name}.link.tmp")
    tmp.unlink(missing_ok=True)
    try:
        try:
            os.link(source, tmp)
        except OSError:  # file systems without hard links
            shutil.copyfile(source, tmp)
        dying_before_rename(target)
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def sha256(path: str | Path) -> str:
    """Hex SHA-256 digest of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


# --------------------------------------------------------------------------------------------------
# A kill in the middle of a write (fault tests)
# --------------------------------------------------------------------------------------------------

FAULT_ENV = "TRANSFORMER_KILL_AT"  # "NAME_PATTERN:BYTES", e.g. "step_*.pt:4096"; unset in normal use
FAULT_ONCE_ENV = "TRANSFORMER_KILL_ONCE"  # a marker file: kill only while it does not exist (then create it)


class _DyingWriter:
    """A file handle that kills its process (SIGKILL, as an OOM killer or ``kill -9`` would) once ``limit`` bytes
    (characters, for text) went through it: what a crash in the middle of that write leaves behind."""

    def __init__(self, handle: IO[Any], limit: int) -> None:
        self._handle, self._limit, self._written = handle, limit, 0

    def write(self, data: Any) -> int:
        size = len(data) if isinstance(data, str) else memoryview(data).nbytes
        if self._written + size >= self._limit and _first_kill():
            part = data[: self._limit - self._written] if isinstance(data, str) else \
                memoryview(data).cast("B")[: self._limit - self._written]
            self._handle.write(part)
            self._handle.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        self._written += size
        return self._handle.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._handle, name)

    def __enter__(self) -> _DyingWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._handle.close()


def dying_before_rename(path: str | Path) -> None:
    """Kill the process when ``TRANSFORMER_KILL_AT`` names ``path`` (any byte count): the fault tests' crash between
    making a link's temporary name and renaming it over ``path`` (``last.pt``, ``best.pt``)."""
    point = os.environ.get(FAULT_ENV)
    if point and fnmatch.fnmatch(Path(path).name, point.rpartition(":")[0]) and _first_kill():
        os.kill(os.getpid(), signal.SIGKILL)


def remove_stale_temporaries(folder: str | Path) -> list[Path]:
    """Delete the temporary files a killed writer left in ``folder`` (``.NAME.*.tmp`` of :func:`atomic_write`,
    ``.NAME.link.tmp`` of :func:`link_atomically`): never read, they only take space. Only for a folder one process
    writes at a time (a run's checkpoints). Returns what was removed."""
    removed = []
    for path in Path(folder).glob(".*.tmp"):
        if path.is_file():
            path.unlink(missing_ok=True)
            removed.append(path)
    return removed


def _first_kill() -> bool:
    """True unless ``TRANSFORMER_KILL_ONCE`` names a marker file that exists; creates it (a restarted process, e.g.
    under torchrun, then runs through)."""
    marker = os.environ.get(FAULT_ONCE_ENV)
    if not marker:
        return True
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL))
    except FileExistsError:
        return False
    return True


def dying_at_fault_point(handle: IO[Any], path: str | Path) -> Any:
    """``handle``, or, when ``TRANSFORMER_KILL_AT`` names this file, one that kills the process in the middle of
    writing it. Every writer of lasting files passes its handle through here, so the fault tests can crash each."""
    point = os.environ.get(FAULT_ENV)
    if not point:
        return handle
    pattern, _, limit = point.rpartition(":")
    return _DyingWriter(handle, int(limit)) if fnmatch.fnmatch(Path(path).name, pattern) else handle
