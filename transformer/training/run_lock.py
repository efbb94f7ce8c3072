"""One training process per run folder: a second ``transformer-train`` into a folder that one is training in (a
resume started twice, a script run again) is refused instead of writing over the first one's checkpoints.

The hold is an advisory lock (``flock``) on ``RUN/.train.lock``, which holds the holder's process id. The operating
system releases it when the process ends however it ends, so a crash leaves nothing to clean up; the file itself
stays, empty once its holder lets go (after a crash it keeps the id, but no lock). Where the file system has no locks (some network mounts, or no POSIX at all), the run goes on with a warning.
Imports no torch: the command line is checked with it before Hydra writes into the folder.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from transformer.config import ConfigError

try:
    import fcntl
except ImportError:  # not POSIX: no lock
    fcntl = None

LOCK_FILE = ".train.lock"

log = logging.getLogger(__name__)


@contextmanager
def hold_run(folder: Path, key: str) -> Iterator[None]:
    """Hold the run ``folder`` (made if missing) for this process while the ``with`` block runs.

    Raises:
        ConfigError: another process holds it; the message names ``key`` (the setting that chose the folder), the
            folder and the holder's process id.
    """
    folder.mkdir(parents=True, exist_ok=True)
    fd, written = _open(folder / LOCK_FILE), False
    try:
        if (holder := _lock(fd, folder)) is not None:
            raise ConfigError(in_use_message(key, folder, holder))
        try:  # the id the next one names; a lock file of another user's (opened read-only) keeps its own
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
            written = True
        except OSError:
            pass
        yield
    finally:
        try:
            if written:  # let go: no id left that would look like a live holder
                os.ftruncate(fd, 0)
        finally:
            os.close(fd)  # releases the lock


def holder_of(folder: Path) -> str | None:
    """The process id of the training that holds ``folder`` now (``"?"`` when it wrote none), else None."""
    path = folder / LOCK_FILE
    if not path.is_file():
        return None
    try:
        fd = _open(path)
    except OSError:
        return None
    try:
        return _lock(fd, folder, warn=False)
    finally:
        os.close(fd)


def in_use_message(key: str, folder: Path, holder: str) -> str:
    return (f"{key}: another transformer-train (process {holder}) is training in {folder}; two runs in one folder "
            f"would overwrite each other's checkpoints: wait for it to end or stop it (kill -INT {holder}), or train "
            "into another folder")


def _open(path: Path) -> int:
    """The lock file, made as ``open()`` makes files (0o666 less the umask: a run folder a group shares stays
    shared); read-only where it is another user's (a lock is taken on either)."""
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    except PermissionError:
        return os.open(path, os.O_RDONLY)


def _lock(fd: int, folder: Path, warn: bool = True) -> str | None:
    """Take the lock on ``fd`` without waiting: None when taken (or where locks are not available), else the
    holder's process id as its file says."""
    if fcntl is None:
        if warn:
            log.warning("%s: no file locks on this system; nothing stops a second run from training into it at the "
                        "same time", folder)
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
    except OSError as error:  # ENOLCK, EOPNOTSUPP: a file system without locks
        if warn:
            log.warning("%s: cannot lock it (%s); nothing stops a second run from training into it at the same time",
                        folder, error.strerror)
    return None
