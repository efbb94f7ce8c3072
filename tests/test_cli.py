"""Console entry points: the config is converted to its dataclass (running the range checks) before the
command runs; expected failures become one logged line and exit status 1, anything else a traceback."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from transformer import cli, pipeline
from transformer.config import ConfigError, TrainConfig
from transformer.data import DataError

from conftest import CONFIG_DIR, REPO

RUN = ["output_dir=/tmp/unused"]


def test_config_path_is_the_repository_configs_folder() -> None:
    assert Path(cli.CONFIG_PATH) == CONFIG_DIR


def test_the_command_gets_the_typed_config_and_its_result_is_returned(compose_config) -> None:
    seen = []

    def command(cfg: TrainConfig) -> str:
        seen.append(cfg)
        return "done"

    assert cli._run(command, compose_config("train", ["training.lr=0.5", *RUN])) == "done"
    assert isinstance(seen[0], TrainConfig) and seen[0].training.lr == 0.5


def test_a_range_error_is_one_logged_line_and_exit_status_1(compose_config, caplog) -> None:
    def command(cfg: TrainConfig) -> None:
        raise AssertionError("must not run with an invalid config")

    with caplog.at_level(logging.ERROR, logger="transformer.cli"), pytest.raises(SystemExit) as exit_info:
        cli._run(command, compose_config("train", ["training.lr=-1", *RUN]))
    assert exit_info.value.code == 1
    assert [r.getMessage() for r in caplog.records] == ["training.lr: must be > 0, got -1.0"]


@pytest.mark.parametrize("error", [DataError("train.en:3: empty line"), FileNotFoundError("no such file: x.pt"),
                                   ConfigError("eval.n_best: too many")])
def test_user_errors_raised_by_the_command_exit_with_status_1(compose_config, caplog, error) -> None:
    def command(cfg: TrainConfig) -> None:
        raise error

    with caplog.at_level(logging.ERROR, logger="transformer.cli"), pytest.raises(SystemExit) as exit_info:
        cli._run(command, compose_config("train", RUN))
    assert exit_info.value.code == 1 and caplog.records[-1].getMessage() == str(error)


def test_other_errors_keep_their_traceback(compose_config) -> None:
    def command(cfg: TrainConfig) -> None:
        raise RuntimeError("a bug")

    with pytest.raises(RuntimeError, match="a bug"):
        cli._run(command, compose_config("train", RUN))


def test_average_passes_inputs_and_output_in_order(monkeypatch) -> None:
    calls = []
    monkeypatch.setattr(pipeline, "average", lambda paths, out: calls.append((paths, out)))
    monkeypatch.setattr(sys, "argv", ["transformer-average", "avg.pt", "a.pt", "b.pt", "c.pt"])
    cli.average_main()
    assert calls == [(["a.pt", "b.pt", "c.pt"], "avg.pt")]


@pytest.mark.parametrize("argv", [["transformer-average"], ["transformer-average", "avg.pt", "a.pt"]])
def test_average_needs_an_output_and_two_inputs(monkeypatch, argv) -> None:
    monkeypatch.setattr(pipeline, "average", lambda paths, out: pytest.fail("must not average"))
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit, match="usage: transformer-average OUT.pt IN1.pt IN2.pt"):
        cli.average_main()


def test_train_entry_point_stops_on_a_bad_value_before_any_work(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    result = subprocess.run(
        [sys.executable, "-c", "from transformer.cli import train_main; train_main()", "training.lr=-1",
         f"hydra.run.dir={run_dir}"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])},
    )
    assert result.returncode == 1
    assert "training.lr: must be > 0, got -1.0" in result.stdout + result.stderr
    logs = [path.read_text() for path in run_dir.glob("*.log")]
    assert logs and all("training.lr: must be > 0" in text for text in logs)  # the run's log has it too
    assert not (run_dir / "checkpoints").exists()
