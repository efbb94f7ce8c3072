"""One training process per run folder: a second ``transformer-train`` into a folder that one is training in (a
resume started twice, a script run again) is refused instead of writing over the first one's checkpoints.

The hold is an advisory lock (``flock``) on ``RUN/.train.lock``, which holds the holder's process id. The operating
system releases it when the process ends however it ends, so a crash leaves nothing to clean up; the file itself
stays. Where the file system has no locks (some network mounts), the run goes on with a warning.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from transformer.checkpoint import RunDir
from transformer.config import ConfigError

try:
    import fcntl
except ImportError:  # not POSIX: no lock
    fcntl = None

log = logging.getLogger(__name__)


@contextmanager
def hold_run(run: RunDir, key: str) -> Iterator[None]:
    """Hold ``run``'s folder (made if missing) for this process while the ``with`` block runs.

    Raises:
        ConfigError: another process holds it; the message names ``key`` (the setting that chose the folder), the
            folder and the holder's process id.
    """
    run.root.mkdir(parents=True, exist_ok=True)
    fd = os.open(run.lock, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        if _lock(fd, run.root, key):
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock


def _lock(fd: int, root: Path, key: str) -> bool:
    """Take the lock on ``fd`` without waiting: True when taken, False where locks are not available."""
    if fcntl is None:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        raise ConfigError(f"{key}: another transformer-train (process {holder}) is training in {root}; two runs in "
                          f"one folder would overwrite each other's checkpoints: wait for it to end or stop it "
                          f"(kill -INT {holder}), or train into another folder") from None
    except OSError as error:  # ENOLCK, EOPNOTSUPP: a file system without locks
        log.warning("%s: cannot lock it (%s); nothing stops a second run from training into it at the same time",
                    root, error.strerror)
        return False
    return True
