"""The Python examples of the README and the documentation pages run as written and print what their comments say,
doctest-style: every ``print(...)`` line ends with ``# <expected output>``, compared line by line with what the block
printed."""

from __future__ import annotations

import re

import pytest
from conftest import REPO

PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
BLOCKS = [block for page in PAGES
          for block in re.findall(r"```python\n(.*?)```", page.read_text(encoding="utf-8"), re.S)]


def expected_output(block: str) -> list[str]:
    """The ``# ...`` comment of each ``print(`` line, in order; a print without one is an error."""
    expected = []
    for line in block.splitlines():
        if line.lstrip().startswith("print("):
            match = re.search(r"\)\s+# (.+)$", line)
            assert match, f"README example: a print without its expected output: {line.strip()!r}"
            expected.append(match.group(1).strip())
    return expected


def test_readme_has_python_examples():
    assert BLOCKS


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_python_example_prints_what_it_shows(index, capsys):
    expected = expected_output(BLOCKS[index])
    assert expected  # the examples show what they do
    exec(compile(BLOCKS[index], f"python example {index}", "exec"), {})
    assert capsys.readouterr().out.splitlines() == expected
