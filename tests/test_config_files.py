"""Config files of a ``--config-dir``: each fault refused in one line naming the file and line, before Hydra; every
config file the project ships passes the same checks when given from a ``--config-dir``."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
from conftest import CONFIG_DIR

from transformer.app import cli, config_files
from transformer.config import TrainConfig

EXPERIMENT = """# @package _global_
defaults:
  - override /model: tiny
training:
  max_steps: 5
  lr: 3.0e-3
model:
  dropout: 0.1
"""


def refusal(folder: Path, text: str, group: str = "experiment", option: str = "mine") -> str | None:
    (folder / group).mkdir(parents=True, exist_ok=True)
    (folder / group / f"{option}.yaml").write_text(text, encoding="utf-8")
    try:
        config_files.refuse_bad_config_files(["--config-dir", str(folder), f"{group}={option}"], TrainConfig,
                                             CONFIG_DIR)
    except SystemExit as refused:
        return str(refused.code)
    return None


@pytest.mark.parametrize("change, message", [
    (("training:", "trainig:"), "experiment/mine.yaml:4: trainig: no such setting; did you mean training?"),
    (("max_steps: 5", "max_step: 5"), "experiment/mine.yaml:5: training.max_step: no such setting; did you mean "
                                      "training.max_steps?"),
    (("max_steps: 5", "max_steps: five"), "experiment/mine.yaml:5: training.max_steps: Value 'five' of type 'str' "
                                          "could not be converted to Integer"),
    (("dropout: 0.1", "norm: middle"), "experiment/mine.yaml:8: model.norm: Invalid value 'middle', expected one of "
                                       "[pre, post]"),
    (("/model: tiny", "/model: tinyy"), "experiment/mine.yaml:3: model: tinyy: no such option; did you mean model: "
                                        "tiny? The options: "),
])
def test_a_fault_in_an_experiment_file_is_named_by_file_and_line(tmp_path, change, message):
    assert refusal(tmp_path, EXPERIMENT) is None
    said = refusal(tmp_path, EXPERIMENT.replace(*change))
    assert said is not None and said.startswith(str(tmp_path / message.split(":")[0]) + ":")
    assert message in said


def test_a_group_file_keys_its_group_and_a_missing_folder_is_named(tmp_path):
    assert refusal(tmp_path, "d_model: 64\nn_heads: 4\n", group="model") is None
    assert refusal(tmp_path, "d_model: 64\nn_head: 4\n", group="model", option="typo").endswith(
        "model/typo.yaml:2: model.n_head: no such setting; did you mean model.n_heads?")
    with pytest.raises(SystemExit, match=r"^model=tinyy: no such option in .* or .*configs; did you mean model=tiny\? "
                                         r"The options: .*typo"):  # the options of both folders
        config_files.refuse_bad_config_files(["--config-dir", str(tmp_path), "model=tinyy"], TrainConfig, CONFIG_DIR)
    with pytest.raises(SystemExit, match=r"^--config-dir /no/such/folder: no such folder; give the folder that holds "
                                         r"your config groups"):
        config_files.refuse_bad_config_files(["--config-dir", "/no/such/folder"], TrainConfig, CONFIG_DIR)


@pytest.mark.parametrize("group", ["experiment", "model", "data", "training", "eval", "debug"])
def test_every_config_file_the_project_ships_passes_when_given_from_a_config_dir(tmp_path, group):
    for shipped in sorted((CONFIG_DIR / group).glob("*.yaml")):
        (tmp_path / group).mkdir(exist_ok=True)
        shutil.copy(shipped, tmp_path / group / f"copy_{shipped.name}")
        config_files.refuse_bad_config_files(["--config-dir", str(tmp_path), f"{group}=copy_{shipped.stem}"],
                                             TrainConfig, CONFIG_DIR)


def test_the_command_refuses_before_hydra_naming_itself(tmp_path, monkeypatch):
    (tmp_path / "experiment").mkdir()
    (tmp_path / "experiment" / "mine.yaml").write_text(EXPERIMENT.replace("training:", "trainig:"), encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["transformer-train", "--config-dir", ".", "experiment=mine"])
    with pytest.raises(SystemExit) as refused:
        cli.train_main()
    assert refused.value.code == ("transformer-train: experiment/mine.yaml:4: trainig: no such setting; did you mean "
                                  "training?")
    assert not (tmp_path / "outputs").exists()
