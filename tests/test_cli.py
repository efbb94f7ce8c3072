"""Console entry points: the config is converted to its dataclass (running the range checks) before the
command runs; expected failures become one logged line and exit status 1, anything else a traceback."""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import CONFIG_DIR, REPO

from transformer.app import cli, failures, schemas, use
from transformer.checkpoint import load_checkpoint
from transformer.config import ConfigError, TrainConfig
from transformer.data.corpus import DataError
from transformer.interrupts import Interrupted, raise_interrupted

RUN = ["output_dir=/tmp/unused"]


def test_config_path_is_the_repository_configs_folder() -> None:
    assert Path(schemas.CONFIG_PATH) == CONFIG_DIR == Path(cli.CONFIG_PATH)


@pytest.mark.parametrize("inherited", [signal.SIG_IGN, signal.SIG_DFL])
def test_a_command_started_with_sigint_ignored_stops_on_it_again(inherited, monkeypatch) -> None:
    # A script's background job inherits SIGINT ignored; the commands restore Python's KeyboardInterrupt. A command
    # started with SIGINT's default (not Python's handler: here, a deliberate choice) keeps it.
    monkeypatch.setattr(sys, "argv", ["transformer-command"])
    before, before_term = signal.signal(signal.SIGINT, inherited), signal.getsignal(signal.SIGTERM)
    try:
        cli._setup()
        expected = signal.default_int_handler if inherited is signal.SIG_IGN else inherited
        assert signal.getsignal(signal.SIGINT) is expected
        assert signal.getsignal(signal.SIGTERM) is raise_interrupted  # a kill stops as Ctrl-C does
    finally:
        signal.signal(signal.SIGINT, before)
        signal.signal(signal.SIGTERM, before_term)


@pytest.mark.parametrize("error, message, code", [
    (KeyboardInterrupt(), "interrupted; what this command writes is written whole or not at all", 130),
    (KeyboardInterrupt("interrupted at step 7; saved last.pt"), "interrupted at step 7; saved last.pt", 130),
    (Interrupted("interrupted at step 7; saved last.pt", signal.SIGTERM), "interrupted at step 7; saved last.pt", 143),
    (PermissionError(13, "Permission denied", "/out/.hyp.txt.x1y2z3w4.tmp"), "cannot write in /out: permission denied",
     1),
    (IsADirectoryError(21, "Is a directory", "/out/.hyp.txt.x1y2z3w4.tmp", None, "/out/hyp.txt"),
     "/out/hyp.txt: is a directory", 1),  # a rename's target, not its temporary source
    (PermissionError(13, "Permission denied", "/home/u/.cache"), "/home/u/.cache: permission denied", 1),
    (PermissionError(13, "Permission denied", "/out/run"), "/out/run: permission denied", 1),
    (FileExistsError(17, "File exists", "/out/run"), "/out/run: a file is there, where a folder should be made", 1),
    (FileNotFoundError(2, "No such file or directory", "/proc/.version.snnm7ii3.tmp"),
     "cannot write in /proc: no such file or directory", 1),  # not Python's [Errno 2] naming the temporary file
    (FileNotFoundError(2, "No such file or directory", "/data/x.txt"), "/data/x.txt: no such file or directory", 1),
])
def test_an_interrupt_or_a_path_that_cannot_be_written_is_one_line(compose_config, caplog, error, message,
                                                                   code) -> None:
    def command(cfg: TrainConfig) -> None:
        raise error

    with caplog.at_level(logging.ERROR, logger="transformer"), pytest.raises(SystemExit) as exit_info:
        failures.run_command(command, compose_config("train", RUN))
    assert exit_info.value.code == code and [r.getMessage() for r in caplog.records] == [message]


@pytest.mark.parametrize("main, command, argv, message", [
    (cli.train_main, "transformer-train", ["data=custom"], "data.dir: is required with data=custom, e.g. "
                                                          "data.dir=/path/to/corpus"),
    (cli.prepare_data_main, "transformer-prepare-data", ["data=custom"], "data.dir: is required with data=custom, "
                                                                        "e.g. data.dir=/path/to/corpus"),
    *[(main, command, ["run_dir=missing", *extra], "run_dir: missing does not exist; give a training run's folder "
                                                   "(outputs/train/<run>)")
      for main, command, extra in ((cli.evaluate_main, "transformer-evaluate", []),
                                   (cli.translate_main, "transformer-translate", []),
                                   (cli.serve_main, "transformer-serve", []),
                                   (cli.export_main, "transformer-export", ["out_dir=out"]))],
])
def test_a_failure_once_started_is_logged_under_the_command_s_name(monkeypatch, tmp_path, capsys, main, command,
                                                                   argv, message) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", [command, *argv])
    with pytest.raises(SystemExit) as exited:
        main()
    console = capsys.readouterr()
    lines = [line for line in (console.out + console.err).splitlines() if "ERROR" in line]
    assert exited.value.code == 1 and len(lines) == 1, lines
    assert re.fullmatch(rf"(\[[^]]+\]\[{command}\]\[ERROR\] - |\[ERROR\] {command}: ){re.escape(message)}", lines[0])


def test_the_command_gets_the_typed_config_and_its_result_is_returned(compose_config) -> None:
    seen = []

    def command(cfg: TrainConfig) -> str:
        seen.append(cfg)
        return "done"

    assert failures.run_command(command, compose_config("train", ["training.lr=0.5", *RUN])) == "done"
    assert isinstance(seen[0], TrainConfig) and seen[0].training.lr == 0.5


def test_a_range_error_is_one_logged_line_and_exit_status_1(compose_config, caplog) -> None:
    def command(cfg: TrainConfig) -> None:
        raise AssertionError("must not run with an invalid config")

    with caplog.at_level(logging.ERROR, logger="transformer"), pytest.raises(SystemExit) as exit_info:
        failures.run_command(command, compose_config("train", ["training.lr=-1", *RUN]))
    assert exit_info.value.code == 1
    assert [r.getMessage() for r in caplog.records] == ["training.lr: must be > 0, got -1.0"]


@pytest.mark.parametrize("override, message", [
    ("+training.max_stepz=5", "training.max_stepz: no such setting; did you mean training.max_steps?"),
    ("+model.glove.pth=x", "model.glove.pth: no such setting; did you mean model.glove.path?"),
    ("+zzz=1", "zzz: no such setting; the settings here: data, model, training, eval, "),
])
def test_a_key_no_schema_has_is_refused_naming_the_nearest(compose_config, caplog, override, message) -> None:
    def command(cfg: TrainConfig) -> None:
        raise AssertionError("must not run with a setting nothing reads")

    with caplog.at_level(logging.ERROR, logger="transformer"), pytest.raises(SystemExit) as exit_info:
        failures.run_command(command, compose_config("train", [override, *RUN]))
    assert exit_info.value.code == 1
    assert caplog.records[0].getMessage().startswith(message)


@pytest.mark.parametrize("main, argv, message", [
    (cli.train_main, ["training.max_token=1"],
     "training.max_token: no such setting; did you mean training.max_tokens?"),
    (cli.train_main, ["model=small", "trainng.lr=1"], "trainng: no such setting; did you mean training?"),
    (cli.train_main, ["resum=auto"], "resum: no such setting; did you mean resume?"),
    (cli.train_main, ["+training.max_stepz=5"],
     "training.max_stepz: no such setting; did you mean training.max_steps?"),
    (cli.train_main, ["experimnt=multi30k_cpu"], "experimnt: no such setting; did you mean experiment?"),
    (cli.train_main, ["data.tokenizer.kindd=word"], "data.tokenizer.kindd: no such setting; did you mean "
                                                     "data.tokenizer.kind?"),
    (cli.evaluate_main, ["run_dir=x", "eval.beam=3"], "eval.beam: no such setting; did you mean eval.beam_size?"),
    (cli.serve_main, ["hots=0.0.0.0"], "hots: no such setting; did you mean host?"),
    (cli.train_main, ["model.d_model=abc"], "model.d_model=abc: Value 'abc' of type 'str' could not be converted to "
                                            "Integer"),
    (cli.train_main, ["+training.max_steps=3.5"], "training.max_steps=3.5: Value '3.5' of type 'float' could not be "
                                                  "converted to Integer"),
    (cli.train_main, ["model.norm=middle"], "model.norm=middle: Invalid value 'middle', expected one of [pre, post]"),
    (cli.evaluate_main, ["run_dir=x", "eval.beam_size=null"], "eval.beam_size=null: field 'beam_size' is not "
                                                              "Optional"),
    (cli.evaluate_main, ["run_dir=x", "ensemble=run2"], "ensemble=run2: Invalid value assigned: str is not a "
                                                        "ListConfig, list or tuple; give a list: ensemble=[run2]"),
    (cli.train_main, ["training.betas=abc"], "training.betas=abc: Invalid value assigned: str is not a ListConfig, "
                                             "list or tuple; give a list: training.betas=[...]"),
    (cli.train_main, ["-m", "debug=cpu_tiny", "data.test_split=test_2016_flickr,nope"],  # before job 0 trains
     "job 1 (data.test_split=nope): data.test_split=nope: Multi30k has no such split; it has train, val, "
     "test_2016_flickr, test_2017_flickr, test_2017_mscoco, test_2018_flickr"),
    (cli.train_main, ["hydra.run.dri=x"], "hydra.run.dri: no such setting; did you mean hydra.run.dir?"),
    (cli.evaluate_main, ["run_dir=x", "hydra.job.chdir=maybe"], "hydra.job.chdir=maybe: Value 'maybe' is not a "
                                                                "valid bool (type str)"),
    (cli.train_main, ["model=tinyy"], "model=tinyy: no such option; did you mean model=tiny? The options: "
                                      + ", ".join(sorted(path.stem for path in (CONFIG_DIR / "model").glob("*.yaml")))),
    # a setting without its group, or under another one: the key where it lives
    (cli.train_main, ["max_steps=30"], "max_steps: no such setting; did you mean training.max_steps?"),
    (cli.translate_main, ["run_dir=x", "beam_size=4"], "beam_size: no such setting; did you mean eval.beam_size?"),
    (cli.train_main, ["training.beam_size=4"], "training.beam_size: no such setting; did you mean eval.beam_size?"),
    (cli.train_main, ["model.tokenizer.vocab_size=4"],
     "model.tokenizer: no such setting; did you mean data.tokenizer.vocab_size?"),
    # another toolkit's name for a setting: the setting here, the group typed first
    (cli.train_main, ["training.batch_size=64"], "training.batch_size: no such setting; did you mean "
                                                  "training.max_tokens or eval.batch_size?"),
    (cli.train_main, ["model.layers=3"], "model.layers: no such setting; did you mean model.n_encoder_layers or "
                                         "model.n_decoder_layers?"),
    (cli.train_main, ["model.hidden_size=64"], "model.hidden_size: no such setting; did you mean model.d_model?"),
    (cli.train_main, ["--learning-rate", "3e-4"], "--learning-rate: no such flag; settings are given as KEY=VALUE, "
                                                  "did you mean training.lr=3e-4? (--help lists them)"),
    # flags Hydra lacks: the setting meant, as KEY=VALUE
    (cli.train_main, ["--max-steps", "30"], "--max-steps: no such flag; settings are given as "
                                            "KEY=VALUE, did you mean training.max_steps=30? (--help lists them)"),
    (cli.serve_main, ["--port=9000"], "--port: no such flag; settings are given as KEY=VALUE, "
                                      "did you mean port=9000? (--help lists them)"),
    (cli.train_main, ["-q"], "-q: no such flag; settings are given as KEY=VALUE (--help lists "
                             "them)"),
    (cli.train_main, ["--batch-size", "64"], "--batch-size: no such flag; settings are given as KEY=VALUE, did you "
                                             "mean training.max_tokens=64 or eval.batch_size=64? (--help lists them)"),
    (cli.translate_main, ["--batch-size", "64"], "--batch-size: no such flag; settings are given as KEY=VALUE, did "
                                                 "you mean eval.batch_size=64? (--help lists them)"),
    (cli.train_main, ["--fp16"], "--fp16: no such flag; settings are given as KEY=VALUE, did you mean "
                                 "training.precision=bf16 or eval.precision=bf16? (--help lists them)"),
    (cli.train_main, ["--precision", "bf16"], "--precision: no such flag; settings are given as "
                                              "KEY=VALUE, did you mean training.precision=bf16 or eval.precision=bf16? "
                                              "(--help lists them)"),
    (cli.train_main, ["--training.max-steps", "3"], "--training.max-steps: no such flag; settings "
                                                    "are given as KEY=VALUE, did you mean training.max_steps=3? (--help "
                                                    "lists them)"),
    (cli.train_main, ["--", "max_steps=3"], "max_steps: no such setting; did you mean training.max_steps?"),
    (cli.train_main, ["--multi", "--cfg", "job"], "--multi: give the flag's whole name, --multirun"),
    *[(main, [*argv, "-c", "job", "--resolve"], "--resolve: output_dir is the run folder, which a command that only "
                                                "shows its config does not make; give output_dir=DIR to resolve with "
                                                "it, or leave --resolve out")
      for main, argv in ((cli.train_main, []), (cli.evaluate_main, ["run_dir=x"]), (cli.benchmark_main, []))],
])
def test_a_mistyped_key_or_value_on_the_command_line_is_refused_before_hydra_in_one_line(
        monkeypatch, tmp_path, main, argv, message) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["transformer-command", *argv])
    with pytest.raises(SystemExit) as exit_info:
        main()
    assert exit_info.value.code == f"transformer-command: {message}"  # printed to stderr, exit status 1
    assert not list(tmp_path.iterdir())  # nothing written: no run folder, no log


@pytest.mark.parametrize("main", [cli.train_main, cli.serve_main])
def test_version_names_this_package_and_hydra(monkeypatch, capsys, main) -> None:
    import hydra

    from transformer import __version__

    monkeypatch.setattr(sys, "argv", ["transformer-command", "model=small", "--version"])
    with pytest.raises(SystemExit) as exit_info:
        main()
    version = re.search(r"^## (\S+) — ", (REPO / "CHANGELOG.md").read_text(encoding="utf-8"), re.M)[1]  # the newest
    assert exit_info.value.code == 0 and __version__ == version
    assert capsys.readouterr().out == f"transformer-command {version} (Hydra {hydra.__version__})\n"


@pytest.mark.parametrize("main", [cli.train_main, cli.evaluate_main, cli.benchmark_main, cli.diversify_main,
                                  cli.prepare_data_main, cli.export_main])
def test_a_run_folder_under_a_file_is_refused_by_every_command_before_hydra(monkeypatch, tmp_path, main) -> None:
    (tmp_path / "afile").write_text("x")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["transformer-command", "hydra.run.dir=afile/run"])
    with pytest.raises(SystemExit) as exit_info:
        main()
    assert exit_info.value.code == "transformer-command: hydra.run.dir: afile is a file, not a folder (on the way to afile/run); name " \
                                   "another folder"


def test_the_keys_hydra_and_the_config_groups_own_pass_the_command_line_check() -> None:
    argv = ["-m", "--cfg", "job", "model=small", "experiment=multi30k_cpu", "debug=cpu_tiny", "+experiment=glove",
            "~eval.beam_size", "hydra.run.dir=x", "hydra/launcher=basic", "model.glove.path=g.txt",
            "training.lr=1e-3,2e-3", "data.tokenizer.vocab_size=8000", "resume=auto", "eval@x=y",
            "model.d_model=${model.d_ff}", "model.norm=pre", "training.max_steps=null", "model.dropout=0",
            "hydra.job_logging.root.level=ERROR", "hydra.sweep.subdir=${hydra.job.num}", "hydra.output_subdir=null",
            "hydra.mode=MULTIRUN", "hydra.sweeper.params.x=1,2", "hydra.verbose=true"]
    cli.schemas.refuse_unknown_overrides(TrainConfig, argv, ["model", "experiment", "debug", "data", "eval"])


@pytest.mark.parametrize("error", [DataError("train.en:3: empty line"), FileNotFoundError("no such file: x.pt"),
                                   ConfigError("eval.n_best: too many")])
def test_user_errors_raised_by_the_command_exit_with_status_1(compose_config, caplog, error) -> None:
    def command(cfg: TrainConfig) -> None:
        raise error

    with caplog.at_level(logging.ERROR, logger="transformer"), pytest.raises(SystemExit) as exit_info:
        failures.run_command(command, compose_config("train", RUN))
    assert exit_info.value.code == 1 and caplog.records[-1].getMessage() == str(error)


def test_an_interpolation_that_does_not_resolve_is_one_line(compose_config, caplog) -> None:
    def command(cfg: TrainConfig) -> None:
        raise AssertionError("must not run with an unresolved config")

    with caplog.at_level(logging.ERROR, logger="transformer"), pytest.raises(SystemExit) as exit_info:
        failures.run_command(command, compose_config("train", ["training.lr=${oops}", *RUN]))
    assert exit_info.value.code == 1
    assert "oops" in caplog.records[-1].getMessage() and "training.lr" in caplog.records[-1].getMessage()


def test_an_interrupted_command_ends_in_one_line_and_exit_status_130(compose_config, caplog) -> None:
    def command(cfg: TrainConfig) -> None:
        raise KeyboardInterrupt("interrupted at step 7; saved run/checkpoints/last.pt (resume=run continues it)")

    with caplog.at_level(logging.ERROR, logger="transformer"), pytest.raises(SystemExit) as exit_info:
        failures.run_command(command, compose_config("train", RUN))
    assert exit_info.value.code == 130
    assert caplog.records[-1].getMessage() == ("interrupted at step 7; saved run/checkpoints/last.pt (resume=run "
                                               "continues it)")


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupt_before_the_commands_work_began_is_one_line_too(monkeypatch, capsys, stop) -> None:
    # while Hydra composes the config or a module loads: outside run_command, inside the command's entry point
    def main() -> None:
        raise Interrupted(signum=stop)

    monkeypatch.setattr(sys, "argv", ["transformer-translate", "run_dir=x"])
    with pytest.raises(SystemExit) as exit_info:
        failures.named_by_the_command(main)()
    assert exit_info.value.code == 128 + stop
    assert capsys.readouterr().err == ("transformer-translate: interrupted; what this command writes is written whole "
                                       "or not at all\n")


def test_other_errors_keep_their_traceback(compose_config) -> None:
    def command(cfg: TrainConfig) -> None:
        raise RuntimeError("a bug")

    with pytest.raises(RuntimeError, match="a bug"):
        failures.run_command(command, compose_config("train", RUN))


def test_average_interrupted_says_its_output_was_not_written(monkeypatch, capsys) -> None:
    def interrupted(paths, out):
        raise KeyboardInterrupt

    monkeypatch.setattr(use, "average", interrupted)
    monkeypatch.setattr(sys, "argv", ["transformer-average", "avg.pt", "a.pt", "b.pt"])
    with pytest.raises(SystemExit) as exit_info:
        cli.average_main()
    assert exit_info.value.code == 130
    assert capsys.readouterr().err == "transformer-average: interrupted; avg.pt was not written\n"


def test_average_passes_inputs_and_output_in_order(monkeypatch) -> None:
    calls = []
    monkeypatch.setattr(use, "average", lambda paths, out: calls.append((paths, out)))
    monkeypatch.setattr(sys, "argv", ["transformer-average", "avg.pt", "a.pt", "b.pt", "c.pt"])
    cli.average_main()
    assert calls == [(["a.pt", "b.pt", "c.pt"], "avg.pt")]


def test_average_of_a_missing_checkpoint_is_one_line(monkeypatch, tmp_path) -> None:
    monkeypatch.setattr(sys, "argv", ["transformer-average", str(tmp_path / "avg.pt"), str(tmp_path / "a.pt"),
                                      str(tmp_path / "b.pt")])
    with pytest.raises(SystemExit, match=r"^transformer-average: checkpoint .*a\.pt does not exist"):
        cli.average_main()


def test_average_into_a_folder_that_is_not_there_is_refused_before_reading(monkeypatch, tmp_path) -> None:
    out = tmp_path / "nowhere" / "avg.pt"
    monkeypatch.setattr(sys, "argv", ["transformer-average", str(out), str(tmp_path / "a.pt"), str(tmp_path / "b.pt")])
    with pytest.raises(SystemExit, match=rf"^transformer-average: {re.escape(str(out))}: the directory "
                                         rf"{re.escape(str(out.parent))} does not exist; create it or choose"):
        cli.average_main()
    assert not out.parent.exists()


@pytest.mark.parametrize("argv, reason", [(["transformer-average"], ""),
                                          (["transformer-average", "avg.pt", "a.pt"],
                                           "transformer-average: one checkpoint (a.pt); averaging takes two or more\n")])
def test_average_needs_an_output_and_two_inputs(monkeypatch, argv, reason) -> None:
    monkeypatch.setattr(use, "average", lambda paths, out: pytest.fail("must not average"))
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit, match=f"^{re.escape(reason)}usage: transformer-average OUT.pt IN1.pt IN2.pt"):
        cli.average_main()


def test_average_help_prints_its_usage_and_succeeds(monkeypatch, capsys) -> None:
    monkeypatch.setattr(use, "average", lambda paths, out: pytest.fail("must not average"))
    monkeypatch.setattr(sys, "argv", ["transformer-average", "--help"])
    cli.average_main()  # returns: exit status 0
    assert capsys.readouterr().out.startswith("usage: transformer-average OUT.pt IN1.pt IN2.pt [...]: average")


@pytest.mark.parametrize("argv", [["transformer-recipe"], ["transformer-recipe", "ensemble", "--seeds", "1,2"]])
def test_a_recipe_without_its_folder_is_refused_in_one_usage_line(monkeypatch, capsys, argv) -> None:
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit) as exited:
        cli.recipe_main()
    assert exited.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        "transformer-recipe: error: give a recipe and its folder, e.g. transformer-recipe ensemble outputs/ensemble")


@pytest.mark.parametrize("args, message", [
    (["model.n_head=3"], "model.n_head: no such setting; did you mean model.n_heads?"),
    (["model.d_model=x"], "model.d_model=x: Value 'x' of type 'str' could not be converted to Integer"),
    (["debug=cpu_tiny", "model=tinyy"], "model=tinyy: no such option; did you mean model=tiny? The options: "
     + ", ".join(sorted(path.stem for path in (CONFIG_DIR / "model").glob("*.yaml")))),
    (["training.lr=[1"], "training.lr=[1: not an override Hydra can read (no viable alternative at input '[1'); put "
                         "a value with other characters than letters, digits, spaces and _-+./:\\ in quotes "
                         "('KEY=\"VALUE\"' in a shell), a list in brackets (KEY=[A,B])"),
    (["--parallel", "0"], "transformer-recipe: error: --parallel: runs at once must be >= 1, got 0"),
])
def test_a_recipe_refuses_a_bad_override_or_option_before_any_run(monkeypatch, tmp_path, capsys, args,
                                                                   message) -> None:
    monkeypatch.setattr(sys, "argv", ["transformer-recipe", "ensemble", str(tmp_path / "out"), *args])
    with pytest.raises(SystemExit) as exited:
        cli.recipe_main()
    said = exited.value.code if isinstance(exited.value.code, str) else capsys.readouterr().err.splitlines()[-1]
    assert said == (message if message.startswith("transformer-recipe: ") else f"transformer-recipe: {message}")
    assert not (tmp_path / "out").exists()


def test_train_entry_point_stops_on_a_bad_value_before_any_work(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    result = subprocess.run(
        [sys.executable, "-c", "from transformer.app.cli import train_main; train_main()", "training.lr=-1",
         f"hydra.run.dir={run_dir}"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])},
    )
    assert result.returncode == 1
    assert "training.lr: must be > 0, got -1.0" in result.stdout + result.stderr
    logs = [path.read_text() for path in run_dir.glob("*.log")]
    assert logs and all("training.lr: must be > 0" in text for text in logs)  # the run's log has it too
    assert not (run_dir / "checkpoints").exists()
    # in a folder Hydra names itself, the refused command leaves no run behind
    result = subprocess.run([sys.executable, "-m", "transformer", "train", "training.lr=-1"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 1 and "training.lr: must be > 0, got -1.0" in result.stdout + result.stderr
    assert not (tmp_path / "outputs").exists()  # nor the empty folders above it
    (tmp_path / "outputs" / "train" / "an_earlier_run").mkdir(parents=True)
    result = subprocess.run([sys.executable, "-m", "transformer", "train", "training.lr=-1"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 1 and [p.name for p in (tmp_path / "outputs" / "train").iterdir()] == ["an_earlier_run"]


def _train_command(cwd: Path, *overrides: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", "from transformer.app.cli import train_main; train_main()", *overrides],
        cwd=cwd, capture_output=True, text=True, timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1",
             "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])},
    )


def test_output_dir_is_the_whole_run_folder_log_and_config_record_included(toy_corpus: Path, tmp_path: Path) -> None:
    run = tmp_path / "runs" / "first"
    done = _train_command(tmp_path, "data=toy_copy", "model=tiny", "eval=greedy", "training.progress_bar=false",
                          f"data.dir={toy_corpus}", "data.cache_dir=cache", "training.max_tokens=256",
                          "training.max_steps=2", "device=cpu", f"output_dir={run}")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "training stopped (max_steps) at step 2" in (run / "train.log").read_text(encoding="utf-8")
    assert "max_steps: 2" in (run / ".hydra" / "config.yaml").read_text(encoding="utf-8")
    assert (run / "checkpoints" / "final.pt").is_file() and not (tmp_path / "outputs").exists()


def test_resume_takes_the_recipe_from_the_run(toy_corpus: Path, tmp_path: Path) -> None:
    """Started with a recipe on the command line (into ``output_dir``, so Hydra's own record of it lies elsewhere),
    continued from a checkpoint file with only ``resume=`` and a longer ``max_steps``: the recipe comes back from
    the checkpoint, interpolations as typed (a default model or batch size would be refused by the resume check)."""
    recipe = ["data=toy_copy", "model=tiny", "eval=greedy", "training.progress_bar=false", f"data.dir={toy_corpus}",
              "data.cache_dir=${data.dir}_cache", "training.max_tokens=256", "device=cpu"]
    run = tmp_path / "run"
    first = _train_command(tmp_path, *recipe, "training.max_steps=4", f"output_dir={run}",
                           f"hydra.run.dir={tmp_path / 'first'}")
    assert first.returncode == 0, first.stderr[-2000:]
    assert load_checkpoint(run / "checkpoints" / "last.pt")["recipe"] == [*recipe, "training.max_steps=4",
                                                                          f"output_dir={run}"]
    shown = _train_command(tmp_path, f"resume={run}", "training.max_steps=8", "--cfg", "job")  # flags last
    assert shown.returncode == 0 and "  d_model: 32\n" in shown.stdout and "  max_steps: 8\n" in shown.stdout
    resumed = _train_command(tmp_path, f"resume={run / 'checkpoints' / 'last.pt'}", "training.max_steps=8",
                             f"hydra.run.dir={tmp_path / 'again'}")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    log = (tmp_path / "again" / "train.log").read_text(encoding="utf-8")
    assert "resuming with the run's recipe" in log and "training stopped (max_steps) at step 8" in log
    assert load_checkpoint(run / "checkpoints" / "last.pt")["recipe"][-2:] == [f"output_dir={run}",
                                                                               "training.max_steps=8"]


def test_a_run_named_its_corpus_relative_resumes_from_another_folder(toy_corpus: Path, tmp_path: Path) -> None:
    """The recipe keeps data.dir=toy as typed; the checkpoint, the folder it meant: a resume from elsewhere uses it."""
    recipe = ["data=toy_copy", "model=tiny", "eval=greedy", "training.progress_bar=false",
              f"data.dir={toy_corpus.name}", "training.max_tokens=256", "device=cpu"]
    run, elsewhere = tmp_path / "run", tmp_path / "elsewhere"
    first = _train_command(toy_corpus.parent, *recipe, "training.max_steps=2", f"hydra.run.dir={run}")
    assert first.returncode == 0, first.stderr[-2000:]
    elsewhere.mkdir()
    resumed = _train_command(elsewhere, f"resume={run}", "training.max_steps=4")
    assert resumed.returncode == 0, (resumed.stdout + resumed.stderr)[-2000:]
    assert load_checkpoint(run / "checkpoints" / "last.pt")["config"]["data"]["dir"] == str(toy_corpus)


def test_a_run_whose_corpus_moved_is_told_to_name_the_new_folder(toy_corpus: Path, tmp_path: Path) -> None:
    """The recipe names the corpus's old folder: the refusal says which key to give, and with it the run goes on."""
    recipe = ["data=toy_copy", "model=tiny", "eval=greedy", "training.progress_bar=false", f"data.dir={toy_corpus}",
              "training.max_tokens=256", "device=cpu"]
    run = tmp_path / "run"
    first = _train_command(tmp_path, *recipe, "training.max_steps=2", f"hydra.run.dir={run}")
    assert first.returncode == 0, first.stderr[-2000:]
    moved = toy_corpus.rename(tmp_path / "moved")
    refused = _train_command(tmp_path, f"resume={run}", "training.max_steps=4")
    output = refused.stdout + refused.stderr
    assert refused.returncode == 1 and "Traceback" not in output
    assert output.strip().splitlines()[-1].endswith(
        f"[ERROR] - data.dir={toy_corpus}: directory not found: the run {run} was trained on the corpus there; if it "
        f"moved, name its new folder: resume={run} data.dir=NEW (the run checks that it holds the same training pairs)")
    resumed = _train_command(tmp_path, f"resume={run}", "training.max_steps=4", f"data.dir={moved}")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert load_checkpoint(run / "checkpoints" / "last.pt")["step"] == 4


def test_a_resume_continues_the_runs_log_and_makes_no_folder_of_its_own(toy_corpus: Path, tmp_path: Path) -> None:
    recipe = ["data=toy_copy", "model=tiny", "eval=greedy", "training.progress_bar=false", f"data.dir={toy_corpus}",
              "data.cache_dir=${data.dir}_cache", "training.max_tokens=256", "device=cpu"]
    run = tmp_path / "outputs" / "train" / "run"
    first = _train_command(tmp_path, *recipe, "training.max_steps=2", f"hydra.run.dir={run}")
    assert first.returncode == 0, first.stderr[-2000:]
    started = _tree(run / ".hydra")
    resumed = _train_command(tmp_path, f"resume={run / 'checkpoints' / 'last.pt'}", "training.max_steps=4")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert [path.name for path in (tmp_path / "outputs" / "train").iterdir()] == ["run"]
    assert _tree(run / ".hydra") == started  # the record of how the run started
    log = (run / "train.log").read_text(encoding="utf-8")
    assert log.count("training stopped (max_steps) at step 2") == log.count("at step 4: ") == 1


def test_a_glove_run_resumes_without_its_vectors_file_or_glove_path(toy_corpus: Path, tmp_path: Path) -> None:
    """The vectors are read only when a run starts: the run resumes after its file is gone and GLOVE_PATH unset,
    and a new run without GLOVE_PATH is refused in one line that names the variable."""
    vectors = tmp_path / "vectors.txt"
    vectors.write_text("".join(f"{word} {' '.join(['0.5'] * 32)}\n" for word in "abcdefgh"), encoding="utf-8")
    recipe = ["data=toy_copy", "model=tiny", "eval=greedy", "training.progress_bar=false", f"data.dir={toy_corpus}",
              "data.cache_dir=${data.dir}_cache", "training.max_tokens=256", "device=cpu",
              "model.glove.path=${oc.env:GLOVE_PATH}", "model.share_embeddings=false", "model.tie_output=false"]
    run = tmp_path / "run"
    os.environ["GLOVE_PATH"] = str(vectors)
    try:
        first = _train_command(tmp_path, *recipe, "training.max_steps=2", f"hydra.run.dir={run}")
    finally:
        del os.environ["GLOVE_PATH"]
    assert first.returncode == 0, first.stderr[-2000:]
    vectors.unlink()
    resumed = _train_command(tmp_path, f"resume={run}", "training.max_steps=4", f"hydra.run.dir={run}")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert load_checkpoint(run / "checkpoints" / "last.pt")["step"] == 4
    fresh = _train_command(tmp_path, *recipe, "training.max_steps=2", f"hydra.run.dir={tmp_path / 'new'}")
    assert fresh.returncode == 1 and "Traceback" not in fresh.stdout + fresh.stderr
    assert ("model.glove.path: the environment variable GLOVE_PATH is not set; set it, or give model.glove.path=... "
            "on the command line") in fresh.stdout


def test_a_debug_preset_over_an_experiment_says_whose_model_is_trained(tmp_path: Path) -> None:
    done = _train_command(tmp_path, "experiment=multi30k_glove", "debug=cpu_tiny", "model.glove.path=null",
                          "training.lr=-1", f"hydra.run.dir={tmp_path / 'run'}")  # refused just after the warning
    assert done.returncode == 1 and "training.lr: must be > 0" in done.stdout
    assert ("debug=cpu_tiny chooses its own model and search (model=tiny, eval=greedy) over experiment="
            "multi30k_glove's; the keys the experiment sets itself still apply: a check of the pipeline, not a run of "
            "the experiment") in done.stdout


def _tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("command, argv, message", [
    ("train", ["training.lr=0.1"], "already holds a run's checkpoints, which a new run would overwrite; continue it "
                                   "with resume="),
    ("evaluate", ["run_dir=elsewhere"], "already holds metrics.json, checkpoints (a training run's"),
])
def test_a_refused_command_leaves_the_run_it_names_byte_for_byte(tmp_path: Path, command, argv, message) -> None:
    run = tmp_path / "run"
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "config.yaml").write_text("training:\n  lr: 0.002\n")
    (run / "checkpoints").mkdir()
    (run / "checkpoints" / "last.pt").write_bytes(b"weights")
    (run / "metrics.json").write_text('{"bleu": 39.6}')
    (run / "train.log").write_text("the run's log\n")
    before = _tree(run)
    done = subprocess.run([sys.executable, "-m", "transformer", command, *argv, f"hydra.run.dir={run}"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and message in done.stderr
    assert _tree(run) == before


SWEPT = ["data=toy_copy", "model=tiny", "eval=greedy", "training.progress_bar=false", "data.cache_dir=cache",
         "training.max_tokens=256", "training.max_steps=2", "device=cpu"]


def _command(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "transformer", *args], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1",
                                            "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])})


@pytest.mark.parametrize("command, argv, message", [
    ("train", ["training.lr=0.001,-1"], "job 1 (training.lr=-1): training.lr: must be > 0, got -1.0"),
    ("train", ["model.d_model=32,abc"],
     "job 1 (model.d_model=abc): model.d_model=abc: Value 'abc' of type 'str' could not be converted to Integer"),
    ("evaluate", ["run_dir=nowhere", "eval.beam_size=1,0"],  # job 0 alone would be refused for its run_dir
     "job 1 (eval.beam_size=0): eval.beam_size: must be >= 1, got 0"),
])
def test_a_sweep_with_a_bad_job_is_refused_before_its_first_job_starts(toy_corpus: Path, tmp_path: Path, command,
                                                                       argv, message) -> None:
    common = [*SWEPT, f"data.dir={toy_corpus}"] if command == "train" else ["eval=greedy"]
    done = _command(tmp_path, command, "-m", *common, *argv)
    assert done.returncode == 1 and done.stderr.splitlines() == [f"transformer-{command}: {message}"]
    assert done.stdout == ""
    assert sorted(path.name for path in tmp_path.iterdir()) == ["toy"]  # no sweep folder, no data cache: no job ran


def test_a_sweep_runs_every_job_and_a_job_refused_in_its_turn_leaves_no_folder(toy_corpus: Path,
                                                                                tmp_path: Path) -> None:
    done = _command(tmp_path, "train", "-m", *SWEPT, f"data.dir={toy_corpus}", "training.lr=0.001,0.002")
    assert done.returncode == 0, done.stderr[-2000:]
    (sweep,) = (tmp_path / "outputs" / "multirun" / "train").iterdir()
    for job, lr in (("0", "0.001"), ("1", "0.002")):
        assert (sweep / job / "checkpoints" / "final.pt").is_file() and (sweep / job / "metrics.json").is_file()
        assert f"training.lr={lr}" in (sweep / job / ".hydra" / "overrides.yaml").read_text(encoding="utf-8")
    # a split that is not there is found only when the job reads it: the refused job's folder goes, and the sweep's
    # folder with it when that job was the first
    evaluations = tmp_path / "outputs" / "multirun" / "evaluate"
    refused = _command(tmp_path, "evaluate", "-m", f"run_dir={sweep / '0'}", "eval=greedy", "split=tset,test")
    assert refused.returncode == 1 and "tset.src[.gz]: file not found" in refused.stdout
    assert not evaluations.exists()
    refused = _command(tmp_path, "evaluate", "-m", f"run_dir={sweep / '0'}", "eval=greedy", "split=test,tset")
    assert refused.returncode == 1 and "tset.src[.gz]: file not found" in refused.stdout
    (evaluated,) = evaluations.iterdir()
    assert sorted(path.name for path in evaluated.iterdir()) == ["0", "multirun.yaml"]
    assert (evaluated / "0" / "metrics.json").is_file()


def test_a_refused_evaluation_into_a_named_folder_may_be_retried_there(tmp_path: Path) -> None:
    def evaluate(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "transformer", "evaluate", *args, "hydra.run.dir=ev"],
                              cwd=tmp_path, capture_output=True, text=True, timeout=120)

    first = evaluate("run_dir=nowhere")
    assert first.returncode == 1 and "run_dir: nowhere does not exist" in first.stdout + first.stderr
    assert (tmp_path / "ev" / ".hydra").is_dir()  # Hydra wrote it before the refusal
    again = evaluate("run_dir=still_nowhere")  # refused for its run_dir again, not for the first try's folder
    assert again.returncode == 1 and "run_dir: still_nowhere does not exist" in again.stdout + again.stderr


def test_evaluate_and_translate_do_not_replace_results_unless_told(tmp_path: Path, compose_config) -> None:
    from transformer.app.schemas import EvaluateConfig, TranslateConfig

    (tmp_path / "metrics.json").write_text("{}")
    with pytest.raises(ConfigError, match=r"output_dir: .* already holds metrics.json .* overwrite=true"):
        use.evaluate(EvaluateConfig(run_dir="nowhere", output_dir=str(tmp_path)))
    (tmp_path / "out.txt").write_text("earlier translations\n")
    with pytest.raises(ConfigError, match=r"output: .*out.txt exists; choose a new file, or overwrite=true"):
        use.translate(TranslateConfig(run_dir="nowhere", output=str(tmp_path / "out.txt")))
    assert (tmp_path / "out.txt").read_text() == "earlier translations\n"


def test_a_full_disk_ends_the_command_in_one_line_naming_enospc(compose_config, caplog) -> None:
    import errno

    def command(cfg: TrainConfig) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", "data/cache/corpus/x/src_tokens.npy")

    with caplog.at_level(logging.ERROR, logger="transformer"), pytest.raises(SystemExit) as exit_info:
        failures.run_command(command, compose_config("train", RUN))
    assert exit_info.value.code == 1
    assert [r.getMessage() for r in caplog.records] == [
        "no space left on device (ENOSPC) while writing data/cache/corpus/x/src_tokens.npy; free space and run the "
        "command again"]


def test_resume_auto_starts_a_run_then_continues_it(toy_corpus: Path, tmp_path: Path) -> None:
    """What torchrun --max-restarts needs: the same command line starts the run, and after a crash continues it."""
    run = tmp_path / "run"

    def train(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "transformer", "train", "data=toy_copy", "model=tiny",
                               f"data.dir={toy_corpus}", "data.cache_dir=cache", "training.progress_bar=false",
                               "training.validate_every_steps=10", "training.average_last=0", "eval=greedy",
                               "device=cpu", *args], cwd=tmp_path, capture_output=True, text=True, timeout=300)

    first = train("training.max_steps=10", "resume=auto", f"hydra.run.dir={run}")
    assert first.returncode == 0, first.stderr[-2000:]
    assert "resume=auto: no checkpoint in" in first.stdout + first.stderr
    second = train("training.max_steps=20", "resume=auto", f"hydra.run.dir={run}")
    assert second.returncode == 0, second.stderr[-2000:]
    assert f"resume=auto: continuing {run / 'checkpoints' / 'last.pt'}" in second.stdout + second.stderr
    assert load_checkpoint(run / "checkpoints" / "last.pt")["step"] == 20
    nameless = train("training.max_steps=10", "resume=auto")
    assert nameless.returncode == 1
    assert "resume: auto continues the run in hydra.run.dir" in nameless.stdout + nameless.stderr


@pytest.mark.parametrize("command, overrides, setting", [
    ("translate", ["eval.beam_size=3"], "eval:\n  beam_size: 3\n"),
    ("train", ["model=small"], "model:\n  d_model: 256\n"),
])
def test_help_says_what_the_command_does_and_shows_its_settings_as_overridden(tmp_path, command, overrides,
                                                                                setting) -> None:
    done = subprocess.run([sys.executable, "-m", "transformer", command, "--help", *overrides], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0
    assert done.stdout.startswith(f"transformer-{command}: ") and "\nUsage:\n  transformer-" in done.stdout
    assert setting in done.stdout and "docs/reference/configuration.md" in done.stdout
    assert "Configuration groups" not in done.stdout and "powered by Hydra" not in done.stdout
    assert list(tmp_path.iterdir()) == []  # help writes nothing
    groups = "== Config groups (choose an option: group=option) ==\n\ndata: custom, multi30k_cs_en, multi30k_de_en"
    assert (groups in done.stdout) == (command == "train")  # listed from the config search path: also in a wheel
    if command == "train":
        assert "\ndebug: cpu_tiny, overfit_batch\n" in done.stdout and "glove50" in done.stdout


def test_every_command_config_says_what_its_command_does() -> None:
    import yaml

    roots = [path for path in CONFIG_DIR.glob("*.yaml") if f"{path.stem}_schema" in path.read_text()]
    assert len(roots) == 8
    for path in roots:
        header = yaml.safe_load(path.read_text())["hydra"]["help"]["header"]
        assert header.startswith(f"transformer-{path.stem.replace('_', '-')}: "), path
        assert f"\nUsage:\n  transformer-{path.stem.replace('_', '-')}" in header, path


def test_every_help_names_a_guide_page_that_transformer_guide_prints(monkeypatch, capsys) -> None:
    import yaml

    from transformer.app import guide, recipes

    helps = [yaml.safe_load(path.read_text())["hydra"]["help"]["header"] for path in CONFIG_DIR.glob("*.yaml")
             if f"{path.stem}_schema" in path.read_text()]
    helps.append(recipes.command_line().format_help())
    monkeypatch.setattr(sys, "argv", ["transformer-average", "--help"])
    cli.average_main()
    helps.append(capsys.readouterr().out)
    named = [re.findall(r"Guide: transformer-guide (\S+) \(docs/guide/(\S+)\.md\)", " ".join(text.split()))
             for text in helps]  # argparse wraps lines
    assert [len(found) for found in named] == [1] * 10 and all(page == file for (page, file), in named)
    for (page, _), in named:  # the page the help names, as the docs folder holds it
        assert guide.page_text(page) == (REPO / "docs" / "guide" / f"{page}.md").read_text(encoding="utf-8")
    listed = [line.split()[0] for line in guide.contents().splitlines() if line.startswith("  ")]
    assert listed == sorted(path.stem for path in (REPO / "docs" / "guide").glob("*.md")) + [
        "troubleshooting", "api", "reference"]
    for argv, out in ((["docs/reference/configuration.md"], "docs/reference/configuration.md"),
                      (["docs/guide/serve.md"], "docs/guide/serve.md"),  # as --help writes them
                      (["troubleshooting"], "docs/troubleshooting.md")):
        monkeypatch.setattr(sys, "argv", ["transformer-guide", *argv])
        cli.guide_main()
        assert capsys.readouterr().out == (REPO / out).read_text(encoding="utf-8")
    for argv, said in ((["trian"], "transformer-guide: no page 'trian' in the guide; did you mean train?"),
                       (["train", "serve"], "usage: transformer-guide [PAGE]: one page at a time (no PAGE: the list "
                                            "of pages)")):
        monkeypatch.setattr(sys, "argv", ["transformer-guide", *argv])
        with pytest.raises(SystemExit, match=re.escape(said)):
            cli.guide_main()


def test_python_m_transformer_lists_every_console_command_and_names_a_misspelt_one(tmp_path):
    import tomllib

    from transformer.__main__ import COMMANDS

    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert {f"transformer-{name}": f"{entry.__module__}:{entry.__name__}" for name, (entry, _) in COMMANDS.items()} \
        == scripts  # the same commands as the installed scripts, each the same function
    listed = subprocess.run([sys.executable, "-m", "transformer", "--help"], capture_output=True, text=True,
                            cwd=tmp_path)
    assert listed.returncode == 0 and listed.stderr == ""
    assert [line.split()[0] for line in listed.stdout.splitlines() if line.startswith("  ")] == list(COMMANDS)
    bare = subprocess.run([sys.executable, "-m", "transformer"], capture_output=True, text=True, cwd=tmp_path)
    assert bare.returncode == 2 and bare.stdout == "" and bare.stderr == listed.stdout
    wrong = subprocess.run([sys.executable, "-m", "transformer", "trian"], capture_output=True, text=True,
                           cwd=tmp_path)
    assert (wrong.returncode, wrong.stderr) == (1, "python -m transformer: no command 'trian'; did you mean train? "
                                                   "(--help lists them)\n")


def test_the_commands_log_the_apps_warnings_and_leave_other_warnings_as_python_shows_them(caplog):
    import warnings

    from transformer.inference.translation import TruncationWarning

    with warnings.catch_warnings(record=True) as shown:  # what Python shows, recorded; restored afterwards
        warnings.simplefilter("always")
        cli._log_own_warnings()
        installed = warnings.showwarning
        cli._log_own_warnings()
        assert warnings.showwarning is installed  # installed once, not wrapped again
        with caplog.at_level(logging.WARNING):
            warnings.warn("a line was cut", TruncationWarning)
            warnings.warn("another package's warning", DeprecationWarning)
    assert [(r.name, r.getMessage()) for r in caplog.records] == [("transformer.inference.translation",
                                                                   "a line was cut")]
    assert [(w.category, str(w.message), w.filename) for w in shown] == [
        (DeprecationWarning, "another package's warning", __file__)]  # with its file and line, as Python shows it


def test_the_benchmark_refuses_sampling_with_its_own_reason(tmp_path: Path) -> None:
    """``eval=sampling`` sets eval.beam_size 1, which the benchmark's config sets back to 5: the benchmark's reason
    comes first, not the eval group's refusal of sampling in a beam."""
    result = _command(tmp_path, "benchmark", "eval=sampling")
    assert result.returncode == 1
    assert (result.stdout + result.stderr).strip().splitlines()[-1].endswith(
        "eval.sampling_topk: the benchmark times the searches (greedy and beam, cached, uncached and in fixed shapes), "
        "not sampling: leave it at 1")
    assert not (tmp_path / "outputs").exists()
