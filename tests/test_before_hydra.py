"""The checks each command makes of its command line before Hydra writes anything."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import CONFIG_DIR

from transformer.app import before_hydra
from transformer.app.schemas import EvaluateConfig
from transformer.config import TrainConfig


def _tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_sweep_into_a_folder_whose_jobs_hold_checkpoints_is_refused_before_hydra_rewrites_their_records(tmp_path):
    sweep = tmp_path / "sweep"
    for job in ("0", "1"):
        (sweep / job / "checkpoints").mkdir(parents=True)
        (sweep / job / "checkpoints" / "last.pt").write_bytes(b"weights")
        (sweep / job / ".hydra").mkdir()
        (sweep / job / ".hydra" / "overrides.yaml").write_text(f"- training.lr={job}\n")
    before = _tree(sweep)
    with pytest.raises(SystemExit) as refused:
        before_hydra.refuse_a_taken_run_dir("train", ["-m", "training.lr=1,2", f"hydra.sweep.dir={sweep}"])
    assert refused.value.code == (
        f"hydra.sweep.dir: {sweep} already holds the checkpoints of an earlier sweep's jobs (0, 1), which this sweep "
        "would overwrite; sweep into a new folder (without hydra.sweep.dir each sweep makes its own), or continue a "
        f"job with resume={sweep / '0'}")
    assert _tree(sweep) == before
    before_hydra.refuse_a_taken_run_dir("train", ["-m", "training.lr=1,2"])  # a new timestamped folder: no check
    before_hydra.refuse_a_taken_run_dir("train", ["-m", f"hydra.sweep.dir={tmp_path / 'fresh'}"])
    before_hydra.refuse_a_taken_run_dir("evaluate", ["-m", f"hydra.sweep.dir={sweep}"])  # no results there yet
    (sweep / "1" / "metrics.json").write_text("{}")
    with pytest.raises(SystemExit, match=r"holds the results of an earlier sweep's jobs \(1\)"):
        before_hydra.refuse_a_taken_run_dir("evaluate", ["--multirun", f"hydra.sweep.dir={sweep}"])


QUIET = ["hydra/job_logging=stderr", "hydra.job_logging.root.level=ERROR", "hydra.output_subdir=null"]


@pytest.mark.parametrize("rank, argv, extra", [
    (None, [], []),
    ("0", ["hydra.run.dir=run"], []),
    ("1", [], [*QUIET, "hydra.job_logging.formatters.simple.format='[rank 1][%(levelname)s] %(name)s: %(message)s'",
               "hydra.run.dir=."]),
    ("3", ["++hydra.run.dir=run"], [
        *QUIET, "hydra.job_logging.formatters.simple.format='[rank 3][%(levelname)s] %(name)s: %(message)s'"]),
])
def test_a_rank_above_0_under_torchrun_leaves_the_folder_and_the_log_to_rank_0(monkeypatch, rank, argv, extra):
    if rank is None:
        monkeypatch.delenv("RANK", raising=False)
    else:
        monkeypatch.setenv("RANK", rank)
    assert before_hydra.as_a_rank_above_0(argv) == extra


def test_shell_completion_and_configs_from_elsewhere_are_left_to_hydra(tmp_path):
    for argv in (["-sc", "install=bash"], ["--config-dir", str(tmp_path), "mygroup=x"],
                 ["hydra.searchpath=[file://x]", "mygroup=x"]):
        before_hydra.refuse_mistyped_keys(TrainConfig, argv, CONFIG_DIR / "train.yaml")  # no exit
    with pytest.raises(SystemExit, match="^mygroup: no such setting; the settings here: data, model, training, eval, "
                                         "output_dir, resume, device, debug, experiment$"):
        before_hydra.refuse_mistyped_keys(TrainConfig, ["mygroup=x"], CONFIG_DIR / "train.yaml")


def test_a_group_the_command_does_not_choose_from_is_refused_with_its_own_settings():
    with pytest.raises(SystemExit, match="^model: no such setting; "):  # evaluate takes its model from the run
        before_hydra.refuse_mistyped_keys(EvaluateConfig, ["run_dir=x", "model=small"], CONFIG_DIR / "evaluate.yaml")
    before_hydra.refuse_mistyped_keys(EvaluateConfig, ["run_dir=x", "eval=greedy"], CONFIG_DIR / "evaluate.yaml")


def test_a_resume_without_hydra_run_dir_runs_in_the_resumed_runs_folder(tmp_path, monkeypatch):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "step_4.pt").write_bytes(b"weights")
    into_run = [f"hydra.run.dir={run}", "hydra.output_subdir=null"]
    assert before_hydra.resume_in_its_run_dir([f"resume={run}", "training.max_steps=8"]) == into_run
    assert before_hydra.resume_in_its_run_dir([f"resume={run / 'checkpoints'}"]) == into_run
    assert before_hydra.resume_in_its_run_dir([f"resume={run / 'checkpoints' / 'step_4.pt'}"]) == into_run
    quoted = tmp_path / "it's (v2)"  # a folder name the override grammar would parse: quoted, its quote escaped
    (quoted / "checkpoints").mkdir(parents=True)
    assert before_hydra.resume_in_its_run_dir([f'resume="{quoted}"']) == [
        "hydra.run.dir='" + str(quoted).replace("'", "\\'") + "'", "hydra.output_subdir=null"]
    for argv in ([f"resume={run}", f"hydra.run.dir={tmp_path / 'elsewhere'}"], ["resume=auto"], [],
                 [f"resume={tmp_path / 'nothing'}"], ["-m", f"resume={run}"]):
        assert before_hydra.resume_in_its_run_dir(argv) == []


def test_a_resume_of_a_run_still_training_is_refused_before_its_first_save_too(tmp_path):
    from transformer.training.run_lock import hold_run

    run = tmp_path / "run"  # started, holding its lock, no checkpoints/ yet
    with hold_run(run, "output_dir"):
        for argv in ([f"resume={run}"], [f"resume={run}", f"hydra.run.dir={run}"]):
            with pytest.raises(SystemExit, match=rf"^resume: another transformer-train \(process {os.getpid()}\) "
                                                 rf"is training in {run}; "):
                before_hydra.refuse_a_held_run_dir(argv)
        before_hydra.refuse_a_held_run_dir([f"resume={run}", f"hydra.run.dir={tmp_path / 'elsewhere'}"])
        for look in (["--cfg", "job"], ["--help"], ["--cfg=job"]):  # shows the config, writes nothing: not refused
            before_hydra.refuse_a_held_run_dir([f"resume={run}", *look])
    before_hydra.refuse_a_held_run_dir([f"resume={run}"])  # let go: the resume goes on to its own checks


def test_added_overrides_join_the_command_lines_own_so_flags_may_stand_after_them():
    extra = ["hydra.run.dir=r", "hydra.output_subdir=null"]  # after the command line's own: these win a clash
    assert before_hydra.with_overrides(["train", "resume=r", "a=1", "--help"], extra) == [
        "train", "resume=r", "a=1", *extra, "--help"]
    assert before_hydra.with_overrides(["train", "--cfg", "job", "resume=r"], extra) == [
        "train", "--cfg", "job", "resume=r", *extra]
    assert before_hydra.with_overrides(["train", "--cfg", "job"], extra) == ["train", "--cfg", "job", *extra]


def test_help_or_cfg_of_a_resume_shows_the_runs_recipe_with_the_command_line_on_top(tmp_path):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "step_4.pt").write_bytes(b"weights")  # no last.pt: the recipe comes from .hydra/
    (run / ".hydra").mkdir()
    (run / ".hydra" / "overrides.yaml").write_text("- model=tiny\n- training.max_steps=4\n- training.lr=0.002\n")
    shown = before_hydra.the_resumed_recipe_shown(["train", f"resume={run}", "training.max_steps=8", "--cfg", "job"])
    assert shown == ["train", "--cfg", "job", "model=tiny", "training.lr=0.002", "training.max_steps=8",
                     f"resume={run}"]
    auto = ["train", "--help", "resume=auto", f"hydra.run.dir={run}"]
    assert before_hydra.the_resumed_recipe_shown(auto) == [
        "train", "--help", "model=tiny", "training.max_steps=4", "training.lr=0.002", "resume=auto",
        f"hydra.run.dir={run}"]
    for argv in (["train", f"resume={run}"],  # a run: the job composes the recipe itself
                 ["train", f"resume={tmp_path / 'nothing'}", "--help"], ["train", "--help"]):
        assert before_hydra.the_resumed_recipe_shown(argv) == argv


def test_a_group_option_that_is_not_there_is_refused_in_one_line_naming_the_nearest():
    root = CONFIG_DIR / "train.yaml"
    options = sorted(path.stem for path in (CONFIG_DIR / "model").glob("*.yaml"))
    assert {"tiny", "small", "base"} <= set(options)
    with pytest.raises(SystemExit, match=rf"^model=tinyy: no such option; did you mean model=tiny\? The options: "
                                         rf"{', '.join(options)}$"):
        before_hydra.refuse_unknown_options(["debug=cpu_tiny", "model=tinyy", "--cfg", "job"], root)
    with pytest.raises(SystemExit, match=r"^experiment=zzz: no such option; the options: attention_additive, "):
        before_hydra.refuse_unknown_options(["experiment=zzz"], root)
    for argv in (["model=tiny", "debug=cpu_tiny", "training.lr=1"], ["model=tiny,huge"], ["~experiment"],
                 ["hydra/job_logging=stderr"],  # a sweep's options: each job is checked in .sweeps
                 ["--config-dir", "extra", "model=mine"], ["hydra.searchpath=[file:///extra]", "model=mine"]):
        before_hydra.refuse_unknown_options(argv, root)


@pytest.mark.parametrize("argv, message", [
    (["training.lr"], "training.lr: not an override; give KEY=VALUE or GROUP=OPTION (or ~KEY to delete one)"),
    (["model=small", "training.lr=[1"], "training.lr=[1: not an override Hydra can read (no viable alternative at "
                                        "input '[1'); put a value with other characters than letters, digits, "
                                        "spaces and _-+./:\\ in quotes ('KEY=\"VALUE\"' in a shell), a list in "
                                        "brackets (KEY=[A,B])"),
    (["model=tiny,"], "model=tiny,: not an override Hydra can read (mismatched input '<EOF>'); put a value"),
    (["data.dir='my corpus"], "data.dir='my corpus: not an override Hydra can read (a quote left open at character "
                              "10); put a value"),
    (["data.source_dir=/tmp/données"], "data.source_dir=/tmp/données: not an override Hydra can read ('é' at "
                                       "character 26); put a value"),
    (["-m", "model=tiny,small", "--cfg", "job"], "--cfg and --multirun: Hydra does one of --run, --multirun, --cfg "
                                                 "and --info at a time; give one"),
    (["--cfg=job", "-r"], "--cfg and --run: Hydra does one of"),
])
def test_a_malformed_override_is_refused_in_one_line_naming_it(argv, message):
    with pytest.raises(SystemExit) as refused:
        before_hydra.refuse_malformed_overrides(argv)
    assert refused.value.code.startswith(message) and "\n" not in refused.value.code and "https" not in refused.value.code


def test_flags_and_their_values_are_not_taken_for_overrides():
    for argv in (["--cfg", "job", "model=tiny"], ["-c", "hydra"], ["--info", "searchpath", "model=tiny"], ["--info"],
                 ["-cn", "train", "-cp", "configs", "--help"], ["-m", "training.lr=1e-3,2e-3", "data.dir=a b"],
                 ["~experiment", "+training.max_steps=3", "eval@x=greedy"], ["-sc", "query=tra"]):
        before_hydra.refuse_malformed_overrides(argv)


def test_a_run_folder_that_cannot_be_made_is_refused_in_one_line_before_hydra(tmp_path, monkeypatch):
    (tmp_path / "afile").write_text("x")
    with pytest.raises(SystemExit) as refused:
        before_hydra.refuse_unwritable_run_folders([f"hydra.run.dir={tmp_path / 'afile' / 'eval'}"])
    assert refused.value.code == (f"hydra.run.dir: {tmp_path / 'afile'} is a file, not a folder (on the way to "
                                  f"{tmp_path / 'afile' / 'eval'}); name another folder")
    (tmp_path / "locked").mkdir()
    real_access = before_hydra.os.access  # a folder without write permission (the tests may run as root, who has it)
    monkeypatch.setattr(before_hydra.os, "access", lambda path, mode: Path(path).name != "locked" and real_access(
        path, mode))
    with pytest.raises(SystemExit) as refused:
        before_hydra.refuse_unwritable_run_folders(["-m", f"hydra.sweep.dir={tmp_path / 'locked' / 'new' / 'run'}"])
    assert refused.value.code == (f"hydra.sweep.dir: cannot make {tmp_path / 'locked' / 'new' / 'run'}: "
                                  f"{tmp_path / 'locked'} is not writable (permission denied); name another folder")
    before_hydra.refuse_unwritable_run_folders([f"hydra.run.dir={tmp_path / 'free' / 'run'}"])  # may be made
    before_hydra.refuse_unwritable_run_folders([f"hydra.run.dir={tmp_path / 'locked'}/${{now:%H}}"])  # Hydra's
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile", "locked"]  # nothing made by the check
    assert list((tmp_path / "locked").iterdir()) == []


def test_a_config_file_that_is_not_yaml_is_refused_naming_its_file_and_line(tmp_path):
    before_hydra.refuse_malformed_yaml([], CONFIG_DIR)  # the shipped configs: no exit
    (tmp_path / "experiment").mkdir()
    broken = tmp_path / "experiment" / "broken.yaml"
    broken.write_text("# a list left open\ntraining:\n  max_steps: [\n")
    for argv in (["--config-dir", str(tmp_path)], [f"--config-dir={tmp_path}"], ["-cd", str(tmp_path)]):
        with pytest.raises(SystemExit, match=rf"^{broken}:4: not valid YAML \(.*while parsing a flow node\)$"):
            before_hydra.refuse_malformed_yaml([*argv, "experiment=broken"], CONFIG_DIR)
    broken.write_text("a: 1\n\tb: 2\n")
    with pytest.raises(SystemExit, match=rf"^{broken}:2: not valid YAML \(found character '\\t' that cannot start"):
        before_hydra.refuse_malformed_yaml(["-cd", str(tmp_path)], CONFIG_DIR)
    broken.write_text("max_steps: 1\nmax_steps: 2\n")  # read by PyYAML's fast loader, refused by Hydra's
    with pytest.raises(SystemExit, match=rf"^{broken}:2: not valid YAML \(found duplicate key max_steps"):
        before_hydra.refuse_malformed_yaml(["-cd", str(tmp_path)], CONFIG_DIR)
    broken.write_text("x: !Ref y\n")  # another tool's tag, or several documents: left to Hydra, if it reads them
    (tmp_path / "mkdocs.yaml").write_text("a: 1\n---\nb: 2\n")
    before_hydra.refuse_malformed_yaml(["-cd", str(tmp_path)], CONFIG_DIR)
    before_hydra.refuse_malformed_yaml(["--config-dir"], CONFIG_DIR)  # no folder given: Hydra says so
