"""Atomic writes: a file is replaced whole or left as it was, and no temporary file outlives an error."""

from __future__ import annotations

import errno
import json
import os

import pytest

from transformer import files


def test_a_write_replaces_the_file_whole(tmp_path):
    path = tmp_path / "out.txt"
    path.write_text("old")
    files.write_text(path, "new ünïcode\n")
    assert path.read_text(encoding="utf-8") == "new ünïcode\n"
    assert [p.name for p in tmp_path.iterdir()] == ["out.txt"]


def test_an_error_mid_write_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "model.bin"
    path.write_bytes(b"old bytes")
    with pytest.raises(RuntimeError, match="disk on fire"):
        with files.atomic_write(path) as handle:
            handle.write(b"half of the new")
            raise RuntimeError("disk on fire")
    assert path.read_bytes() == b"old bytes"
    assert [p.name for p in tmp_path.iterdir()] == ["model.bin"]


def test_a_failed_rename_leaves_no_temporary(tmp_path, monkeypatch):
    def full(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("transformer.files.os.replace", full)
    with pytest.raises(OSError, match=r"no space left on device \(ENOSPC\) while writing .*metrics.json"):
        files.write_json(tmp_path / "metrics.json", {"bleu": 1.0})
    assert list(tmp_path.iterdir()) == []


def test_write_json_round_trips(tmp_path):
    value = {"bleu": 39.6, "splits": ["val", "test"], "nested": {"n": 3}}
    files.write_json(tmp_path / "m.json", value)
    assert json.loads((tmp_path / "m.json").read_text()) == value


def test_a_missing_folder_is_an_error_not_created(tmp_path):
    with pytest.raises(FileNotFoundError):
        files.write_text(tmp_path / "missing" / "out.txt", "x")
    assert not (tmp_path / "missing").exists()


def test_link_atomically_makes_the_target_hold_the_sources_bytes(tmp_path):
    source, target = tmp_path / "step_5.pt", tmp_path / "last.pt"
    source.write_bytes(b"step five")
    target.write_bytes(b"step four")
    files.link_atomically(source, target)
    assert target.read_bytes() == b"step five"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.pt", "step_5.pt"]


def test_a_written_file_gets_the_mode_open_would_give(tmp_path):
    """Not mkstemp's private 0600: a cache shared between users must stay readable."""
    import os
    import stat

    umask = os.umask(0o022)
    try:
        files.write_text(tmp_path / "meta.json", "{}")
    finally:
        os.umask(umask)
    assert stat.S_IMODE((tmp_path / "meta.json").stat().st_mode) == 0o644


def test_a_folder_built_under_a_temporary_name_gets_the_mode_mkdir_would_give(tmp_path):
    """Not mkdtemp's private 0700, which the rename into place keeps: an export or a cache others read."""
    import os
    import stat

    for umask, mode in ((0o022, 0o755), (0o002, 0o775), (0o077, 0o700)):
        previous = os.umask(umask)
        try:
            folder = files.temporary_folder(tmp_path, f".export-{umask:o}.")
        finally:
            os.umask(previous)
        assert folder.parent == tmp_path and folder.name.startswith(f".export-{umask:o}.")
        assert stat.S_IMODE(folder.stat().st_mode) == mode


def test_a_full_disk_names_enospc_and_the_file_and_keeps_the_old_one(tmp_path, monkeypatch):
    import errno

    from transformer.files import DiskFullError

    target = tmp_path / "last.pt"
    files.write_text(target, "the previous checkpoint")

    def write_until_full(handle):
        handle.write("half of it")
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(DiskFullError) as caught:
        with files.atomic_write(target, "w") as handle:
            write_until_full(handle)
    assert str(caught.value) == (f"no space left on device (ENOSPC) while writing {target}; last.pt keeps its earlier "
                                 f"content; free space on {tmp_path} and run the command again")
    assert target.read_text() == "the previous checkpoint" and sorted(p.name for p in tmp_path.iterdir()) == ["last.pt"]


def test_torch_saves_failure_on_a_full_file_system_is_a_disk_full_error(tmp_path, monkeypatch):
    """torch.save reports ENOSPC as a RuntimeError; with no space left on the file system it is a full disk."""
    from collections import namedtuple

    from transformer.files import DiskFullError

    stats = namedtuple("stats", "f_bavail f_frsize f_flag")
    monkeypatch.setattr(files.os, "statvfs", lambda path: stats(0, 4096, 0))
    with pytest.raises(DiskFullError, match=r"ENOSPC\) while writing .*new\.pt; new\.pt was not written"):
        with files.atomic_write(tmp_path / "new.pt") as handle:
            handle.write(b"PK")
            raise RuntimeError("[enforce fail at inline_container.cc] PytorchStreamWriter failed writing file")
    with pytest.raises(FileNotFoundError):  # an error that names its cause keeps it, whatever the space left
        with files.atomic_write(tmp_path / "new.pt") as handle:
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", str(tmp_path / "x"))
    monkeypatch.setattr(files.os, "statvfs", lambda path: stats(0, 4096, os.ST_RDONLY))
    with pytest.raises(RuntimeError, match="PytorchStreamWriter"):  # a read-only file system has no space to give
        with files.atomic_write(tmp_path / "new.pt") as handle:
            raise RuntimeError("PytorchStreamWriter failed writing file")
    monkeypatch.undo()
    with pytest.raises(RuntimeError, match="an ordinary failure"):  # with space left, an error stays what it was
        with files.atomic_write(tmp_path / "new.pt") as handle:
            raise RuntimeError("an ordinary failure")
