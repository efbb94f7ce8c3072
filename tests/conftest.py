"""Shared fixtures: config composition, the real Multi30k folder, a tiny synthetic parallel corpus, a small model
trained on digit reversal, and the figures the training curves are drawn on."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, OmegaConf
from torch import nn

from transformer.app.schemas import register_configs

from toy_training import train_reversal_model

REPO = Path(__file__).resolve().parents[1]
CONFIG_DIR = REPO / "configs"

# The learning tests' steps and thresholds were set on the 2-core CI machine, at 2 threads. A many-core machine (a
# GPU host) would run the suite's tiny matrices on all its cores: slower, and rounding differently.
torch.set_num_threads(min(2, torch.get_num_threads()))


def multi30k_dir() -> Path:
    """The local Multi30k copy CI and benchmarks use (``MULTI30K_DIR``, default ``../shared/data/multi30k``)."""
    folder = Path(os.environ.get("MULTI30K_DIR", REPO.parent / "shared" / "data" / "multi30k"))
    return folder.absolute()  # as subprocesses started in another folder see it


@pytest.fixture(scope="session")
def multi30k() -> Path:
    folder = multi30k_dir()
    if not (folder / "train.en.gz").is_file():
        pytest.skip(f"Multi30k not found in {folder} (set MULTI30K_DIR)")
    return folder


@pytest.fixture(scope="session")
def compose_config():
    """``compose_config(name, overrides) -> DictConfig`` against the real ``configs/`` folder."""
    register_configs()

    def _compose(name: str, overrides: list[str] | None = None) -> DictConfig:
        with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
            return compose(name, overrides=overrides or [])

    return _compose


def write_toy_corpus(folder: Path, n_train: int = 400, seed: int = 0) -> Path:
    """A copy task in {split}.{src,tgt} (the ``toy_copy`` data config): the target is the source."""
    rng = random.Random(seed)
    words = ["a", "b", "c", "d", "e", "f", "g", "h"]
    folder.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", n_train), ("val", 40), ("test", 40)):
        src = [" ".join(rng.choice(words) for _ in range(rng.randint(3, 7))) for _ in range(n)]
        (folder / f"{split}.src").write_text("".join(s + "\n" for s in src), encoding="utf-8")
        (folder / f"{split}.tgt").write_text("".join(s + "\n" for s in src), encoding="utf-8")
    return folder


@pytest.fixture()
def toy_corpus(tmp_path: Path) -> Path:
    return write_toy_corpus(tmp_path / "toy")


# device=cpu: exact resumes, bit-equal weights and step counts here are the CPU's (on a GPU machine too; the CUDA
# paths have their own tests, tests/test_gpu.py)
TOY = ["data=toy_copy", "model=tiny", "eval=greedy", "training.progress_bar=false", "training.warmup_steps=20",
       "training.lr=3e-3", "model.dropout=0.0", "training.max_tokens=512", "device=cpu"]


def train_toy(compose_config, toy_corpus: Path, run_dir: Path, *overrides: str) -> dict:
    """``transformer-train`` of the tiny model on the toy copy task in ``toy_corpus``, into ``run_dir``."""
    from transformer.app import pipeline

    cfg = compose_config("train", [*TOY, f"data.dir={toy_corpus}", f"data.cache_dir={toy_corpus.parent / 'cache'}",
                                   f"output_dir={run_dir}", *overrides])
    return pipeline.train(OmegaConf.to_object(cfg))


@pytest.fixture(scope="session")
def trained_run(compose_config, tmp_path_factory) -> tuple[Path, dict]:
    """One short toy training run (its folder and metrics) shared by the tests that evaluate and translate."""
    root = tmp_path_factory.mktemp("run")
    corpus = write_toy_corpus(root / "toy")
    metrics = train_toy(compose_config, corpus, root / "out", "training.max_epochs=50",
                        "training.validate_every_steps=40")
    return root / "out", metrics


@pytest.fixture(scope="session")
def reversal_model() -> nn.Module:
    """``toy_training.train_reversal_model()``, trained once per session (~25 s on one CPU thread); eval mode.
    Tests only decode with it: they must not train or change it."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: extra threads only contend for the shared cores
    try:
        return train_reversal_model()
    finally:
        torch.set_num_threads(threads)


@pytest.fixture()
def saved_figures(monkeypatch) -> list:
    """Every figure ``transformer.app.curves`` saves while the test runs (still saved), to read its lines back."""
    from matplotlib.figure import Figure

    from transformer.app import curves

    figures: list[Figure] = []

    class Recorded(Figure):
        def savefig(self, *args, **kwargs) -> None:
            figures.append(self)
            super().savefig(*args, **kwargs)

    monkeypatch.setattr(curves, "Figure", Recorded)
    return figures
