"""One training process per run folder (``transformer.training.run_lock``): a second hold is refused naming the
holder, the folder is free again once the holder lets go, and a file system without locks only warns. Across
processes, and through ``pipeline.train``: tests/test_pipeline.py."""

from __future__ import annotations

import errno
import logging
import os

import pytest

from transformer.config import ConfigError
from transformer.training import run_lock
from transformer.training.run_lock import LOCK_FILE, hold_run, holder_of


def test_a_held_folder_is_refused_naming_the_holder_and_free_once_let_go(tmp_path):
    run = tmp_path / "new" / "run"
    assert holder_of(run) is None
    with hold_run(run, "output_dir"):  # made if missing
        assert (run / LOCK_FILE).read_text() == f"{os.getpid()}\n" and holder_of(run) == str(os.getpid())
        with pytest.raises(ConfigError, match=rf"^resume: another transformer-train \(process {os.getpid()}\) is "
                                              rf"training in {run}; "):
            with hold_run(run, "resume"):
                pass
    assert holder_of(run) is None and (run / LOCK_FILE).read_text() == ""  # no id that looks like a live holder
    with hold_run(run, "resume"):
        pass


def test_the_lock_file_is_made_as_open_makes_files(tmp_path):
    previous = os.umask(0o002)  # a group's shared folder
    try:
        with hold_run(tmp_path, "output_dir"):
            pass
    finally:
        os.umask(previous)
    assert (tmp_path / LOCK_FILE).stat().st_mode & 0o777 == 0o664


def test_without_locks_the_run_goes_on_with_a_warning(tmp_path, monkeypatch, caplog):
    def no_locks(fd, operation):
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(run_lock.fcntl, "flock", no_locks)
    with caplog.at_level(logging.WARNING, logger="transformer.training.run_lock"), hold_run(tmp_path, "x"):
        pass
    assert [r.getMessage() for r in caplog.records] == [
        f"{tmp_path}: cannot lock it ({os.strerror(errno.ENOLCK)}); nothing stops a second run from training into "
        "it at the same time"]
