"""A sweep checked whole before its first job: each job's config composed as Hydra composes it for the job, the
first bad job refused in one line naming it, nothing written."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from conftest import CONFIG_DIR
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from transformer.app import sweeps
from transformer.app.schemas import register_configs
from transformer.config import TrainConfig


def _typed(cfg: DictConfig) -> TrainConfig:
    return OmegaConf.to_object(cfg)


def _refuse(argv: list[str], config_dir: Path = CONFIG_DIR, check=_typed) -> None:
    register_configs()
    sweeps.refuse_a_bad_job(argv, config_dir, "train", TrainConfig, check)


def _configs_with_experiment(tmp_path: Path, text: str) -> Path:
    configs = tmp_path / "configs"
    shutil.copytree(CONFIG_DIR, configs)
    (configs / "experiment" / "swept.yaml").write_text(f"# @package _global_\n{text}", encoding="utf-8")
    return configs


@pytest.mark.parametrize("argv, message", [
    (["-m", "training.lr=0.001,-1"], "job 1 (training.lr=-1): training.lr: must be > 0, got -1.0"),
    (["--multirun", "training.lr=range(1,3)", "training.warmup_steps=0,-1"],  # Hydra's order: the last key fastest
     "job 1 (training.lr=1 training.warmup_steps=-1): training.warmup_steps: must be >= 0, got -1"),
    (["-m", "model.d_model=32,abc"],
     "job 1 (model.d_model=abc): model.d_model=abc: Value 'abc' of type 'str' could not be converted to Integer"),
    (["hydra.mode=MULTIRUN", "training.lr=-1"], "job 0: training.lr: must be > 0, got -1.0"),
])
def test_the_first_bad_job_is_refused_in_one_line_naming_it(tmp_path, monkeypatch, argv, message) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as refused:
        _refuse(argv)
    assert refused.value.code == message
    assert list(tmp_path.iterdir()) == []


def test_a_group_option_that_is_not_there_is_one_line_with_the_options(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as refused:
        _refuse(["-m", "model=tiny,huge"])
    options = sorted(path.stem for path in (CONFIG_DIR / "model").glob("*.yaml"))
    assert refused.value.code == f"job 1 (model=huge): model=huge: no such option; the options: {', '.join(options)}"
    with pytest.raises(SystemExit) as refused:
        _refuse(["-m", "model=smal,tiny"])
    assert refused.value.code.startswith("job 0 (model=smal): model=smal: no such option; did you mean model=small? ")


def test_each_job_is_checked_as_its_job_sees_its_config(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    seen = []
    _refuse(["-m", "training.lr=0.1,0.2", "hydra.sweep.dir=sweep"],
            check=lambda cfg: seen.append((_typed(cfg), list(HydraConfig.get().overrides.task))))
    assert [(typed.training.lr, typed.output_dir, overrides) for typed, overrides in seen] == [
        (0.1, str(tmp_path / "sweep" / "0"), ["training.lr=0.1"]),
        (0.2, str(tmp_path / "sweep" / "1"), ["training.lr=0.2"])]
    assert list(tmp_path.iterdir()) == [] and not HydraConfig.initialized()


def test_the_sweepers_own_params_are_swept_first(tmp_path, monkeypatch) -> None:
    configs = _configs_with_experiment(tmp_path, "hydra:\n  sweeper:\n    params:\n      training.lr: 0.1,-2\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as refused:
        _refuse(["-m", "experiment=swept", "training.warmup_steps=1,2"], configs)
    assert refused.value.code == "job 2 (training.lr=-2 training.warmup_steps=1): training.lr: must be > 0, got -2.0"


@pytest.mark.parametrize("argv", [
    ["training.lr=0.1,-1"],  # no sweep: Hydra refuses the sweep syntax itself
    ["-m", "--help", "training.lr=0.1,-1"],  # no job runs
    ["-m", "--cfg", "job", "training.lr=0.1,-1"],
    ["-m", "-cd", "elsewhere", "training.lr=0.1,-1"],  # configs from elsewhere
    ["-m", "training.lr=interval(0.1,1)"],  # a sweep the basic sweeper cannot make: Hydra says so
])
def test_what_hydra_answers_itself_is_left_to_it(argv) -> None:
    _refuse(argv)


def test_another_sweepers_jobs_are_left_to_it(tmp_path, monkeypatch) -> None:
    configs = _configs_with_experiment(tmp_path, "hydra:\n  sweeper:\n    _target_: elsewhere.Sweeper\n")
    monkeypatch.chdir(tmp_path)
    _refuse(["-m", "experiment=swept", "training.lr=0.1,-1"], configs)
