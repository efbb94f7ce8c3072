"""The package's shape: five parts whose imports run one way, a few shared modules below them, small modules.

    model      imports the shared modules only
    data       imports the shared modules only
    inference  imports model, data and the shared modules
    training   imports model, data, inference and the shared modules
    app        imports anything (and only app imports app)
    shared     (config, choices, overrides, runtime, interrupts, tracking, checkpoint, files) imports no part

Every import counts, at the top of a module or inside a function or an ``if TYPE_CHECKING:`` block.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "transformer"
PARTS = ("model", "data", "inference", "training", "app")
ALLOWED = {
    "model": {"model"},
    "data": {"data"},
    "inference": {"inference", "model", "data"},
    "training": {"training", "model", "data", "inference"},
    "app": set(PARTS),
    "shared": set(),
}
MAX_LINES = 450


def part_of(module: str) -> str:
    """``transformer.data.cache`` -> ``data``; a module directly in the package (``transformer.config``) -> shared;
    the package itself and ``python -m transformer`` -> ``root`` (its public names and commands reach every part)."""
    names = module.split(".")
    if names in (["transformer"], ["transformer", "__main__"]):
        return "root"
    return names[1] if names[1] in PARTS else "shared"


def module_name(path: Path) -> str:
    relative = path.relative_to(PACKAGE.parent).with_suffix("")
    names = list(relative.parts)
    return ".".join(names[:-1] if names[-1] == "__init__" else names)


def imported_modules(source: str, module: str) -> list[tuple[int, str]]:
    """(line, module) for every ``transformer`` module that ``source`` imports; ``from transformer import x`` counts
    as ``transformer.x`` when ``x`` is a module or part, else as the package itself (its public names)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names if alias.name.split(".")[0] == "transformer"]
        elif isinstance(node, ast.ImportFrom) and node.level > 0:  # the package imports absolutely, always
            found.append((node.lineno, f"{'.' * node.level}{node.module or ''} (a relative import)"))
        elif isinstance(node, ast.ImportFrom) and node.module:
            if node.module.split(".")[0] != "transformer":
                continue
            folder = PACKAGE.parent.joinpath(*node.module.split("."))
            for alias in node.names:  # ``from transformer.data import cache`` imports transformer.data.cache
                is_module = (folder / f"{alias.name}.py").is_file() or (folder / alias.name).is_dir()
                found.append((node.lineno, f"{node.module}.{alias.name}" if is_module else node.module))
    return found


def wrong_way(source: str, module: str) -> list[str]:
    """The imports of ``module`` (whose text is ``source``) that run against the parts' direction."""
    here = part_of(module)
    if here == "root":
        return []
    problems = []
    for line, target in imported_modules(source, module):
        if target.startswith("."):
            problems.append(f"{module}:{line} imports {target}")
            continue
        there = part_of(target)
        if there == "shared" or there == here or there in ALLOWED[here]:
            continue
        problems.append(f"{module}:{line} ({here}) imports {target} ({there})")
    return problems


def package_modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_the_parts_are_the_package_folders():
    folders = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").is_file()}
    assert folders == set(PARTS)


def test_imports_run_one_way():
    problems = [problem for path in package_modules()
                for problem in wrong_way(path.read_text(encoding="utf-8"), module_name(path))]
    assert problems == []


@pytest.mark.parametrize("module, source, expected", [
    ("transformer.model.transformer", "from transformer.training.loss import x", "imports transformer.training.loss"),
    ("transformer.data.cache", "def f():\n    from transformer.model import attention", "model.attention (model)"),
    ("transformer.inference.loading", "from transformer.app.schemas import TrainConfig", "(app)"),
    ("transformer.inference.loading", "import transformer.training.checkpoints", "(training)"),
    ("transformer.config", "from transformer.data.tokenizer import Tokenizer", "(shared) imports"),
    ("transformer.training.trainer", "from transformer import TrainConfig", "imports transformer (root)"),
    ("transformer.model.layers", "from ..app import cli", "..app (a relative import)"),
])
def test_a_wrong_way_import_is_found(module, source, expected):
    problems = wrong_way(source, module)
    assert len(problems) == 1 and expected in problems[0]


def test_right_way_imports_pass():
    source = "from transformer.model.transformer import Transformer\nfrom transformer import checkpoint\n" \
             "from transformer.config import ModelConfig\nfrom transformer.data import cache"
    assert wrong_way(source, "transformer.inference.loading") == []


def test_no_module_is_long():
    long = {module_name(p): n for p in package_modules() if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}


def test_the_public_names_are_importable_from_the_package():
    import transformer

    assert transformer.__all__ and all(getattr(transformer, name) is not None for name in transformer.__all__)
    assert {"Transformer", "build_model", "TrainConfig", "load_trained", "beam_search"} <= set(transformer.__all__)
