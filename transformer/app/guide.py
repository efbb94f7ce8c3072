"""The user guide's pages (``docs/guide/*.md``, with ``docs/troubleshooting.md`` and ``docs/api.md``) as
``transformer-guide [PAGE]`` prints them: each command's ``--help`` names its page, and an installed wheel, which has
no ``docs/`` folder, ships a copy of them inside the package (as it ships ``configs/``). The page ``reference``,
every key of every command, is generated from the schemas (:mod:`.config_reference`), as
``docs/reference/configuration.md`` is."""

from __future__ import annotations

import difflib
from pathlib import Path

from transformer.app.schemas import shipped_folder

REFERENCE = "reference"  # docs/reference/configuration.md, made anew
BESIDE_THE_GUIDE = ("troubleshooting", "api")  # pages of docs/ that the guide's pages send a user to


def docs_root() -> Path:
    """The documentation's folder: the source tree's ``docs/``, else the wheel's packaged copy of its pages."""
    return shipped_folder("docs", "guide")


def pages(root: Path | None = None) -> dict[str, Path]:
    """Each page by name (its file name without ``.md``): the guide's in alphabetical order, then those beside it."""
    root = root or docs_root()
    found = {path.stem: path for path in sorted((root / "guide").glob("*.md"))}
    return found | {name: root / f"{name}.md" for name in BESIDE_THE_GUIDE if (root / f"{name}.md").is_file()}


def title(page: Path) -> str:
    """A page's first heading, without its ``#``."""
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.startswith("# "):
            return line[2:].strip()
    return page.stem


def contents(root: Path | None = None) -> str:
    """The list of pages, one a line: name and title."""
    titles = {name: title(path) for name, path in pages(root).items()}
    titles[REFERENCE] = "Every key of every command (docs/reference/configuration.md)"
    width = max(map(len, titles))
    lines = [f"  {name:<{width}}  {about}" for name, about in titles.items()]
    return ("usage: transformer-guide PAGE   (the same as python -m transformer guide PAGE)\n\n"
            "pages of the guide (docs/guide/PAGE.md, docs/troubleshooting.md, docs/api.md):\n" + "\n".join(lines)
            + "\n\nThe pages' links, and the scripts/, benchmarks/ and tests/ they name, are the source tree's.")


def page_text(name: str, root: Path | None = None) -> str:
    """The Markdown of page ``name`` (``train``, or ``train.md``, or ``docs/guide/train.md`` as ``--help`` writes
    it; ``reference``, or ``docs/reference/configuration.md``; ``troubleshooting``); an unknown name raises
    ``LookupError`` naming the closest page."""
    found = pages(root)
    stem = Path(name).stem if name.endswith(".md") else name
    if stem == REFERENCE or name.endswith("reference/configuration.md"):
        from transformer.app.config_reference import page

        return page()
    if stem not in found:
        close = difflib.get_close_matches(stem, [*found, REFERENCE], n=1)
        hint = f"did you mean {close[0]}?" if close else f"one of: {', '.join([*found, REFERENCE])}"
        raise LookupError(f"no page {name!r} in the guide; {hint}")
    return found[stem].read_text(encoding="utf-8")
