"""The tutorials' shell commands run as written, in a smoke form: every ``bash`` block of a tutorial page, in order,
in a fresh folder, with each command's run cut short (a few training steps on a slice of the corpus, greedy search)
by settings appended after the page's own. A command a page spells wrongly, a key it misnames, a file it expects
that the commands before it did not make: each fails here."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest
from conftest import REPO

TUTORIALS = sorted((REPO / "docs" / "tutorials").glob("*.md"))
GLOVE = Path(os.environ.get("GLOVE_50D", REPO.parent / "shared" / "data" / "glove" / "glove.6B.50d.multi30k.txt.gz"))

# Lines not run, each with the reason. Matched at the start of a command line.
SKIPPED = {
    "pip install": "the tests run in the installed project",
    "export MULTI30K_DIR=": "the test points MULTI30K_DIR at the local copy itself",
    "export GLOVE_PATH=": "the test points GLOVE_PATH at the local file itself",
    "transformer-train model=glove300": "needs the 300-d GloVe file (tests/test_glove.py runs the path on a synthetic "
                                        "one)",
    "tensorboard": "a server that runs until stopped",
    "transformer-recipe best_gpu": "refuses a machine without a GPU (tests/test_recipes.py checks the refusal)",
    "python benchmarks/compare_variants.py": "an 80-minute measurement made of the tutorial's own commands",
    "curl -LO https://nlp.stanford.edu/": "a download of 822 MB; the test points GLOVE_PATH at a local file",
}
# Text replaced before running: a smaller form of the same command.
SMALLER = {
    "--times 155": "--times 2",
    "profile_steps=20": "profile_steps=2",
    "--seeds 1234,1,2": "--seeds 1234,1",
    "transformer-recipe diversified runs/diversified":
        "transformer-recipe diversified runs/diversified --seeds 1234 --backward-seeds 1234 --student-seeds 1234 "
        "--wide-student-seeds none",
}
# Settings appended to each command, unless the page's command sets the same key itself.
SMOKE = {
    "transformer-train": ["training.max_steps=8", "training.max_minutes=null", "data.max_pairs=1000",
                          "training.valid_max_sentences=8", "eval=greedy", "training.progress_bar=false"],
    "transformer-recipe": ["training.max_steps=8", "training.max_minutes=null", "data.max_pairs=1000",
                           "training.valid_max_sentences=8", "eval=greedy", "training.progress_bar=false"],
    "transformer-evaluate": ["eval=greedy"],
    "transformer-diversify": ["eval=greedy"],  # translates the teachers' training pairs: data.max_pairs of theirs
    "transformer-prepare-data": ["data.max_pairs=1000"],
    "transformer-benchmark": ["train_steps=2", "untimed_steps=1", "decode_sentences=8", "matmul_size=256"],
}

PRELUDE = r"""
set -euo pipefail
smoke() {  # COMMAND ARGS...: the command with the smoke settings whose keys ARGS do not set
    local name=$1 extra=() setting key arg taken
    shift
    while read -r setting; do
        [[ -z $setting ]] && continue
        key=${setting%%=*}; taken=0
        for arg in "$@"; do [[ ${arg%%=*} == "$key" ]] && taken=1; done
        ((taken)) || extra+=("$setting")
    done <<< "${SMOKE[$name]:-}"
    command "$name" "$@" ${extra[@]+"${extra[@]}"}
}
"""


def bash_blocks(page: Path) -> list[str]:
    return re.findall(r"```bash\n(.*?)```", page.read_text(encoding="utf-8"), re.S)


def script(page: Path) -> str:
    """The page's bash blocks as one script: skipped lines dropped, smaller forms substituted, commands wrapped."""
    lines = [PRELUDE, "declare -A SMOKE"]
    lines += [f"SMOKE[{name}]={shlex.quote(chr(10).join(settings))}" for name, settings in SMOKE.items()]
    lines += [f"{name}() {{ smoke {name} \"$@\"; }}" for name in SMOKE]
    for block in bash_blocks(page):
        for line in block.replace("\\\n", " ").splitlines():
            command = line.strip()
            if any(command.startswith(prefix) for prefix in SKIPPED):
                continue
            for text, smaller in SMALLER.items():
                line = line.replace(text, smaller)
            lines.append(line)
    return "\n".join(lines) + "\n"


def test_every_tutorial_has_commands_and_is_in_the_site():
    assert TUTORIALS
    nav = (REPO / "mkdocs.yml").read_text(encoding="utf-8")
    for page in TUTORIALS:
        assert bash_blocks(page), page.name
        assert f"tutorials/{page.name}" in nav, f"{page.name} is not in mkdocs.yml's nav"


def test_the_smoke_wrapper_keeps_the_pages_own_settings(tmp_path):
    """What the wrapper runs: the page's arguments, then only the smoke settings whose keys they leave unset."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "transformer-train").write_text('#!/bin/sh\nprintf "%s\\n" "$@"\n')
    (bin_dir / "transformer-train").chmod(0o755)
    page = tmp_path / "page.md"
    page.write_text("```bash\ntransformer-train eval=beam training.max_steps=100 \\\n    hydra.run.dir=x\n"
                    "tensorboard --logdir runs\n```\n")
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    out = subprocess.run(["bash", "-c", script(page)], env=env, capture_output=True, text=True, check=True).stdout
    assert out.split() == ["eval=beam", "training.max_steps=100", "hydra.run.dir=x", "training.max_minutes=null",
                           "data.max_pairs=1000", "training.valid_max_sentences=8", "training.progress_bar=false"]


@pytest.mark.slow
@pytest.mark.parametrize("page", TUTORIALS, ids=[page.stem for page in TUTORIALS])
def test_the_tutorials_commands_run(page, multi30k, tmp_path):
    text = page.read_text(encoding="utf-8")
    if "GLOVE_PATH" in text and not GLOVE.is_file():
        pytest.skip(f"the GloVe file {GLOVE} is not here (set GLOVE_50D)")
    env = {**os.environ, "MULTI30K_DIR": str(multi30k), "GLOVE_PATH": str(GLOVE), "OMP_NUM_THREADS": "2",
           "PYTHONUNBUFFERED": "1"}
    for folder in ("scripts", "benchmarks"):  # the pages run them from the repository's root
        (tmp_path / folder).symlink_to(REPO / folder)
    (tmp_path / "tutorial.sh").write_text(script(page), encoding="utf-8")
    done = subprocess.run(["bash", str(tmp_path / "tutorial.sh")], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=1800)
    assert done.returncode == 0, f"{page.name}: exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
