"""A wheel works without the source tree: built from this checkout, installed into a fresh virtual environment,
its commands compose their configs from the copy packaged inside it, train and translate from another folder."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _run(command: list[str | Path], cwd: Path, env: dict[str, str], **kwargs) -> subprocess.CompletedProcess:
    done = subprocess.run([str(c) for c in command], cwd=cwd, env=env, capture_output=True, text=True, **kwargs)
    assert done.returncode == 0, f"{command}:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    return done


def _not_source(folder: str, names: list[str]) -> set[str]:
    """What a wheel is not built from: the repository's corpora, runs and build leftovers; caches anywhere."""
    top = {".git", "build", "dist", "outputs", "data", ".whl"} if Path(folder) == REPO else set()
    return {n for n in names if n in top or n in ("__pycache__", ".pytest_cache") or n.endswith(".egg-info")}


@pytest.mark.slow
def test_a_wheel_installed_elsewhere_trains_and_translates(tmp_path, multi30k):
    pytest.importorskip("setuptools", reason="builds the wheel with this environment's setuptools")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    source = tmp_path / "source"  # a copy: building leaves build/ behind, which must not reach the next wheel
    shutil.copytree(REPO, source, ignore=_not_source)
    _run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "-w", tmp_path / "dist",
          source], tmp_path, env)
    (wheel,) = (tmp_path / "dist").glob("transformer-*.whl")
    # The environment sees this machine's packages (torch and the rest) but not the source tree: the wheel's own
    # copy of the package comes first on its path.
    venv.create(tmp_path / "venv", system_site_packages=True, with_pip=True)
    bin_dir = tmp_path / "venv" / "bin"
    _run([bin_dir / "python", "-m", "pip", "install", "--quiet", "--no-deps", wheel], tmp_path, env)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()

    where = _run([bin_dir / "python", "-c", "import transformer.app.schemas as s; print(s.__file__, s.CONFIG_PATH)"],
                 elsewhere, env).stdout.split()
    site = tmp_path / "venv" / "lib"
    assert Path(where[0]).is_relative_to(site) and Path(where[1]) == Path(where[0]).parents[1] / "configs"

    env["MULTI30K_DIR"] = str(multi30k)
    _run([bin_dir / "transformer-train", "debug=cpu_tiny", "training.max_steps=5", "training.progress_bar=false",
          "data.cache_dir=cache", "hydra.run.dir=run"], elsewhere, env)
    assert (elsewhere / "run" / "checkpoints" / "final.pt").is_file()
    done = _run([bin_dir / "transformer-translate", "run_dir=run", "eval.beam_size=1"], elsewhere, env,
                input="A man is riding a bike.\nTwo dogs play.\n")
    assert len(done.stdout.splitlines()) == 2
    page = _run([bin_dir / "python", "-c", "from transformer.inference.explorer import live_page, ASSETS; "
                 "print(ASSETS); print(live_page())"], elsewhere, env).stdout  # the explorer's assets came along
    assert Path(page.splitlines()[0]).is_relative_to(site) and "/static/explorer.js" in page
    assert (Path(page.splitlines()[0]) / "explorer.js").is_file()
    for page, file in (("docs/guide/train.md", "guide/train.md"), ("troubleshooting", "troubleshooting.md")):
        shown = _run([bin_dir / "transformer-guide", page], elsewhere, env).stdout  # as --help names it
        assert shown == (REPO / "docs" / file).read_text(encoding="utf-8")
