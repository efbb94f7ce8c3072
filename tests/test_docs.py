"""The documentation site builds with ``mkdocs build --strict``: no broken link or anchor, no page left out of the
navigation."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import REPO


def test_the_site_builds_strictly(tmp_path):
    pytest.importorskip("mkdocs", reason="MkDocs comes with the dev extra")
    pytest.importorskip("material", reason="Material for MkDocs comes with the dev extra")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert (tmp_path / "site" / "guide" / "serve" / "index.html").is_file()
    assert (tmp_path / "site" / "reference" / "configuration" / "index.html").is_file()
