"""The real Multi30k download code against a loopback HTTP server (no internet needed)."""

from __future__ import annotations

import functools
import hashlib
import http.server
import logging
import shutil
import threading
from pathlib import Path

import pytest
from conftest import multi30k_dir

from transformer.data.corpus import DataError
from transformer.data.splits import MULTI30K_SHA256, download_file, prepare_multi30k

MULTI30K = multi30k_dir()
pytestmark = pytest.mark.skipif(not (MULTI30K / "val.en.gz").is_file(), reason=f"no Multi30k at {MULTI30K}")


class _Handler(http.server.SimpleHTTPRequestHandler):
    """Serves files from ``directory``; ``/error/CODE/...`` answers CODE; ``/truncated/...`` stops midway."""

    def log_message(self, format: str, *args: object) -> None:  # keep test output quiet
        pass

    def do_GET(self) -> None:
        parts = self.path.strip("/").split("/")
        if parts[0] == "error":
            self.send_error(int(parts[1]), "test error")
        elif parts[0] == "truncated":
            data = (Path(self.directory) / "good" / parts[-1]).read_bytes()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data[: len(data) // 2])
            self.close_connection = True
        else:
            super().do_GET()


def _corrupted(path: Path) -> bytes:
    data = bytearray(path.read_bytes())
    data[-20] ^= 0x01  # one flipped bit
    return bytes(data)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """Base URL of a server with ``good/`` (the real files) and ``bad/`` (val.de.gz corrupted)."""
    root = tmp_path_factory.mktemp("www")
    (root / "good").mkdir()
    (root / "bad").mkdir()
    for name in ("val.en.gz", "val.de.gz", "test_2016_flickr.en.gz", "test_2016_flickr.de.gz"):
        shutil.copy(MULTI30K / name, root / "good" / name)
    (root / "bad" / "val.de.gz").write_bytes(_corrupted(MULTI30K / "val.de.gz"))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Handler, directory=str(root)))
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()
    thread.join()


def _names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def test_download_verifies_and_writes_files(server, tmp_path, caplog):
    target = tmp_path / "m30k"
    with caplog.at_level(logging.INFO, logger="transformer.data.splits"):
        assert prepare_multi30k(target, splits=("val", "test_2016_flickr"), base_url=f"{server}/good") == target
    assert _names(target) == ["test_2016_flickr.de.gz", "test_2016_flickr.en.gz", "val.de.gz", "val.en.gz"]
    for name in _names(target):
        assert hashlib.sha256((target / name).read_bytes()).hexdigest() == MULTI30K_SHA256[name]
    assert f"downloading {server}/good/val.en.gz" in caplog.text and "sha256 verified" in caplog.text
    # files already there are verified and kept: no server needed the second time
    prepare_multi30k(target, splits=("val", "test_2016_flickr"), base_url="http://127.0.0.1:9/unused")


def test_checksum_mismatch_leaves_nothing_behind(server, tmp_path):
    with pytest.raises(DataError) as info:
        prepare_multi30k(tmp_path, langs=("de",), splits=("val",), base_url=f"{server}/bad")
    actual = hashlib.sha256(_corrupted(MULTI30K / "val.de.gz")).hexdigest()
    message = str(info.value)
    assert f"checksum mismatch for {server}/bad/val.de.gz" in message
    assert f"expected sha256 {MULTI30K_SHA256['val.de.gz']}" in message and f"got {actual}" in message
    assert "val.de.gz was not saved" in message
    assert _names(tmp_path) == []


@pytest.mark.parametrize("code, reason", [(404, "HTTP 404"), (500, "HTTP 500")])
def test_server_error_is_reported_and_nothing_is_left(server, tmp_path, code, reason):
    with pytest.raises(DataError) as info:
        prepare_multi30k(tmp_path, langs=("en",), splits=("val",), base_url=f"{server}/error/{code}")
    message = str(info.value)
    assert f"downloading {server}/error/{code}/val.en.gz failed: {reason}" in message
    assert "data.source_dir" in message  # says how to avoid the download
    assert _names(tmp_path) == []


def test_interrupted_transfer_leaves_nothing_behind(server, tmp_path):
    with pytest.raises(DataError, match=r"downloading .*/truncated/val\.en\.gz failed"):
        prepare_multi30k(tmp_path, langs=("en",), splits=("val",), base_url=f"{server}/truncated")
    assert _names(tmp_path) == []


def test_unreachable_server_is_reported(tmp_path):
    with pytest.raises(DataError, match=r"downloading http://127\.0\.0\.1:9/val\.en\.gz failed"):
        prepare_multi30k(tmp_path, langs=("en",), splits=("val",), base_url="http://127.0.0.1:9", timeout=5)
    assert _names(tmp_path) == []


def test_a_local_write_failure_is_not_called_a_download_failure(server, tmp_path):
    dest = tmp_path / "no such folder" / "val.en.gz"
    with pytest.raises(DataError, match=r"no such folder/val\.en\.gz: cannot write the file here") as info:
        download_file(f"{server}/good/val.en.gz", dest, MULTI30K_SHA256["val.en.gz"])
    assert "downloading" not in str(info.value)


def test_a_disk_that_fills_at_the_rename_is_named_as_a_write_failure(server, tmp_path, monkeypatch):
    def full(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("transformer.files.os.replace", full)
    with pytest.raises(DataError, match=r"^no space left on device \(ENOSPC\) while writing .*val\.en\.gz; val\.en\.gz "
                                         r"was not written"):
        download_file(f"{server}/good/val.en.gz", tmp_path / "val.en.gz", MULTI30K_SHA256["val.en.gz"])
    assert _names(tmp_path) == []  # the temporary file is gone too
