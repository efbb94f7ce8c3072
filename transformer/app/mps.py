"""NVIDIA MPS (Multi-Process Service) around a block: the CUDA processes started in it share the GPU's
multiprocessors at once instead of taking turns, which several small trainings on one GPU need (each alone leaves
most of them idle: docs/RESULTS.md, "Nine minutes on one H100").

A control daemon of this process's own is started (its pipe folder private, named to the children through
``CUDA_MPS_PIPE_DIRECTORY``) where ``nvidia-cuda-mps-control`` exists and a CUDA process can use it, and stopped when
the block ends; otherwise the block runs without MPS, with a warning. The GPU's settings are left alone.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

log = logging.getLogger(__name__)

CONTROL = "nvidia-cuda-mps-control"
_VARIABLES = ("CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY")
_CUDA_WORKS = "import torch; torch.ones(1, device='cuda').sum().item()"


@contextmanager
def mps(enabled: bool = True, probe: Sequence[str] = (sys.executable, "-c", _CUDA_WORKS)) -> Iterator[bool]:
    """Run the block with MPS on where it can be; yields whether it is on. ``probe``: a command that succeeds when
    a CUDA process can use the daemon."""
    if not enabled:
        log.debug("MPS not asked for: the CUDA processes, if any, take turns on the GPU")
        yield False
        return
    if shutil.which(CONTROL) is None:
        log.warning("no %s on the PATH: without MPS, the CUDA processes take turns on the GPU", CONTROL)
        yield False
        return
    pipes = Path(tempfile.mkdtemp(prefix="mps."))
    saved = {name: os.environ.get(name) for name in _VARIABLES}
    os.environ.update({name: str(pipes) for name in _VARIABLES})
    try:
        started = subprocess.run([CONTROL, "-d"], capture_output=True).returncode == 0
        if started and subprocess.run(list(probe), capture_output=True).returncode == 0:
            log.info("MPS: on (pipe folder %s)", pipes)
            yield True
        else:
            log.warning("MPS did not start (%s): without it, the CUDA processes take turns on the GPU",
                        _last_lines(pipes / "control.log"))
            _stop(pipes, saved)
            pipes = None
            yield False
    finally:
        if pipes is not None:
            _stop(pipes, saved)


def _stop(pipes: Path, saved: dict[str, str | None]) -> None:
    """Stop the daemon, remove its folder, and give the environment back."""
    subprocess.run([CONTROL], input=b"quit\n", capture_output=True)
    shutil.rmtree(pipes, ignore_errors=True)
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def _last_lines(path: Path, n: int = 2) -> str:
    try:
        return " ".join(path.read_text(errors="replace").splitlines()[-n:]) or "no log"
    except OSError:
        return "no log"
