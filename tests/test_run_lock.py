"""One training process per run folder (``transformer.training.run_lock``): a second hold is refused naming the
holder, the folder is free again once the holder lets go, and a file system without locks only warns. Across
processes, and through ``pipeline.train``: tests/test_pipeline.py."""

from __future__ import annotations

import errno
import logging
import os

import pytest

from transformer.checkpoint import RunDir
from transformer.config import ConfigError
from transformer.training import run_lock
from transformer.training.run_lock import hold_run


def test_a_held_folder_is_refused_naming_the_holder_and_free_once_let_go(tmp_path):
    run = RunDir(tmp_path / "new" / "run")
    with hold_run(run, "output_dir"):  # made if missing
        assert run.lock.read_text() == f"{os.getpid()}\n"
        with pytest.raises(ConfigError, match=rf"^resume: another transformer-train \(process {os.getpid()}\) is "
                                              rf"training in {run.root}; "):
            with hold_run(run, "resume"):
                pass
    with hold_run(run, "resume"):
        pass


def test_without_locks_the_run_goes_on_with_a_warning(tmp_path, monkeypatch, caplog):
    def no_locks(fd, operation):
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(run_lock.fcntl, "flock", no_locks)
    with caplog.at_level(logging.WARNING, logger="transformer.training.run_lock"), hold_run(RunDir(tmp_path), "x"):
        pass
    assert [r.getMessage() for r in caplog.records] == [
        f"{tmp_path}: cannot lock it ({os.strerror(errno.ENOLCK)}); nothing stops a second run from training into "
        "it at the same time"]
