"""The project speaks only of itself: no tracked text file says how it was developed (work-session numbers,
tracker numbers, machine loans) or names a path of the machine it was built on; versions and dates instead. This is
the one file allowed to spell the list."""

from __future__ import annotations

import re
import subprocess

import pytest
from conftest import REPO

FORBIDDEN = {
    "a work-session number": r"\bsessions? \d",
    "a tracker number": r"\b(issues?|tickets?) #?\d",
    "a machine loan": r"\blease[sd_]?\b|\blease_more\b|\blent\b",
    "a build machine's path": r"/work/(main|shared)|/tmp/bash_jobs",
}
TEXT = (".py", ".md", ".yaml", ".yml", ".toml", ".sh", ".txt", ".cfg", ".json", ".html", ".js", ".css", "run")


def tracked_text_files() -> list[str]:
    try:
        listed = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    return [name for name in listed.splitlines() if name.endswith(TEXT) and name != "tests/test_wording.py"]


@pytest.mark.parametrize("what", list(FORBIDDEN))
def test_no_tracked_file_speaks_of_how_the_project_was_built(what):
    pattern = re.compile(FORBIDDEN[what], re.IGNORECASE)
    hits = [f"{name}:{number}: {line.strip()[:100]}"
            for name in tracked_text_files() if (REPO / name).is_file()
            for number, line in enumerate((REPO / name).read_text(encoding="utf-8", errors="replace").splitlines(), 1)
            if pattern.search(line)]
    assert not hits, f"{what}:\n" + "\n".join(hits[:20])


def test_the_patterns_catch_what_they_are_for():
    # Each sample is put together from pieces, so this file itself holds none of the phrases it forbids.
    samples = {"a work-session number": "as measured in " + "sess" + "ion 28",
               "a tracker number": "see " + "iss" + "ue 15",
               "a machine loan": "on the " + "le" + "nt GPU",
               "a build machine's path": "cd " + "/wo" + "rk/main && pytest"}
    for what, sample in samples.items():
        assert re.search(FORBIDDEN[what], sample, re.IGNORECASE), what
    assert not re.search(FORBIDDEN["a machine loan"], "an excellent, silent release", re.IGNORECASE)
