"""The checks and arrangements of the run folder before Hydra makes it: taken, held or unwritable folders refused,
a resume into its own folder, a rank above 0 without one."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from transformer.app import run_folder


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
        run_folder.refuse_a_taken_run_dir("train", ["-m", "training.lr=1,2", f"hydra.sweep.dir={sweep}"])
    assert refused.value.code == (
        f"hydra.sweep.dir: {sweep} already holds the checkpoints of an earlier sweep's jobs (0, 1), which this sweep "
        "would overwrite; sweep into a new folder (without hydra.sweep.dir each sweep makes its own), or continue a "
        f"job with resume={sweep / '0'}")
    assert _tree(sweep) == before
    run_folder.refuse_a_taken_run_dir("train", ["-m", "training.lr=1,2"])  # a new timestamped folder: no check
    run_folder.refuse_a_taken_run_dir("train", ["-m", f"hydra.sweep.dir={tmp_path / 'fresh'}"])
    run_folder.refuse_a_taken_run_dir("evaluate", ["-m", f"hydra.sweep.dir={sweep}"])  # no results there yet
    (sweep / "1" / "metrics.json").write_text("{}")
    with pytest.raises(SystemExit, match=r"holds the results of an earlier sweep's jobs \(1\)"):
        run_folder.refuse_a_taken_run_dir("evaluate", ["--multirun", f"hydra.sweep.dir={sweep}"])


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
    assert run_folder.as_a_rank_above_0(argv) == extra


def test_a_resume_without_hydra_run_dir_runs_in_the_resumed_runs_folder(tmp_path, monkeypatch):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "step_4.pt").write_bytes(b"weights")
    into_run = [f"hydra.run.dir={run}", "hydra.output_subdir=null"]
    assert run_folder.resume_in_its_run_dir([f"resume={run}", "training.max_steps=8"]) == into_run
    assert run_folder.resume_in_its_run_dir([f"resume={run / 'checkpoints'}"]) == into_run
    assert run_folder.resume_in_its_run_dir([f"resume={run / 'checkpoints' / 'step_4.pt'}"]) == into_run
    quoted = tmp_path / "it's (v2)"  # a folder name the override grammar would parse: quoted, its quote escaped
    (quoted / "checkpoints").mkdir(parents=True)
    assert run_folder.resume_in_its_run_dir([f'resume="{quoted}"']) == [
        "hydra.run.dir='" + str(quoted).replace("'", "\\'") + "'", "hydra.output_subdir=null"]
    for argv in ([f"resume={run}", f"hydra.run.dir={tmp_path / 'elsewhere'}"], ["resume=auto"], [],
                 [f"resume={tmp_path / 'nothing'}"], ["-m", f"resume={run}"]):
        assert run_folder.resume_in_its_run_dir(argv) == []


def test_a_resume_of_a_run_still_training_is_refused_before_its_first_save_too(tmp_path):
    from transformer.training.run_lock import hold_run

    run = tmp_path / "run"  # started, holding its lock, no checkpoints/ yet
    with hold_run(run, "output_dir"):
        for argv in ([f"resume={run}"], [f"resume={run}", f"hydra.run.dir={run}"]):
            with pytest.raises(SystemExit, match=rf"^resume: another transformer-train \(process {os.getpid()}\) "
                                                 rf"is training in {run}; "):
                run_folder.refuse_a_held_run_dir(argv)
        run_folder.refuse_a_held_run_dir([f"resume={run}", f"hydra.run.dir={tmp_path / 'elsewhere'}"])
        for look in (["--cfg", "job"], ["--help"], ["--cfg=job"]):  # shows the config, writes nothing: not refused
            run_folder.refuse_a_held_run_dir([f"resume={run}", *look])
    run_folder.refuse_a_held_run_dir([f"resume={run}"])  # let go: the resume goes on to its own checks


def test_added_overrides_join_the_command_lines_own_so_flags_may_stand_after_them():
    extra = ["hydra.run.dir=r", "hydra.output_subdir=null"]  # after the command line's own: these win a clash
    assert run_folder.with_overrides(["train", "resume=r", "a=1", "--help"], extra) == [
        "train", "resume=r", "a=1", *extra, "--help"]
    assert run_folder.with_overrides(["train", "--cfg", "job", "resume=r"], extra) == [
        "train", "--cfg", "job", "resume=r", *extra]
    assert run_folder.with_overrides(["train", "--cfg", "job"], extra) == ["train", "--cfg", "job", *extra]


def test_help_or_cfg_of_a_resume_shows_the_runs_recipe_with_the_command_line_on_top(tmp_path):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "step_4.pt").write_bytes(b"weights")  # no last.pt: the recipe comes from .hydra/
    (run / ".hydra").mkdir()
    (run / ".hydra" / "overrides.yaml").write_text("- model=tiny\n- training.max_steps=4\n- training.lr=0.002\n")
    shown = run_folder.the_resumed_recipe_shown(["train", f"resume={run}", "training.max_steps=8", "--cfg", "job"])
    assert shown == ["train", "--cfg", "job", "model=tiny", "training.lr=0.002", "training.max_steps=8",
                     f"resume={run}"]
    auto = ["train", "--help", "resume=auto", f"hydra.run.dir={run}"]
    assert run_folder.the_resumed_recipe_shown(auto) == [
        "train", "--help", "model=tiny", "training.max_steps=4", "training.lr=0.002", "resume=auto",
        f"hydra.run.dir={run}"]
    for argv in (["train", f"resume={run}"],  # a run: the job composes the recipe itself
                 ["train", f"resume={tmp_path / 'nothing'}", "--help"], ["train", "--help"]):
        assert run_folder.the_resumed_recipe_shown(argv) == argv


def test_a_run_folder_that_cannot_be_made_is_refused_in_one_line_before_hydra(tmp_path, monkeypatch):
    (tmp_path / "afile").write_text("x")
    with pytest.raises(SystemExit) as refused:
        run_folder.refuse_unwritable_run_folders([f"hydra.run.dir={tmp_path / 'afile' / 'eval'}"])
    assert refused.value.code == (f"hydra.run.dir: {tmp_path / 'afile'} is a file, not a folder (on the way to "
                                  f"{tmp_path / 'afile' / 'eval'}); name another folder")
    (tmp_path / "locked").mkdir()
    real_access = run_folder.os.access  # a folder without write permission (the tests may run as root, who has it)
    monkeypatch.setattr(run_folder.os, "access", lambda path, mode: Path(path).name != "locked" and real_access(
        path, mode))
    with pytest.raises(SystemExit) as refused:
        run_folder.refuse_unwritable_run_folders(["-m", f"hydra.sweep.dir={tmp_path / 'locked' / 'new' / 'run'}"])
    assert refused.value.code == (f"hydra.sweep.dir: cannot make {tmp_path / 'locked' / 'new' / 'run'}: "
                                  f"{tmp_path / 'locked'} is not writable (permission denied); name another folder")
    run_folder.refuse_unwritable_run_folders([f"hydra.run.dir={tmp_path / 'free' / 'run'}"])  # may be made
    run_folder.refuse_unwritable_run_folders([f"hydra.run.dir={tmp_path / 'locked'}/${{now:%H}}"])  # Hydra's
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile", "locked"]  # nothing made by the check
    assert list((tmp_path / "locked").iterdir()) == []


def test_output_dir_names_the_whole_run_folder_and_its_refusals_name_output_dir(tmp_path):
    assert run_folder.output_dir_as_run_dir(["train", f"output_dir={tmp_path / 'my run'}"]) == [
        f"hydra.run.dir='{tmp_path / 'my run'}'"]
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)  # a training run's folder: its .hydra/ is its record
    for argv in (["output_dir=a", "hydra.run.dir=b"], ["output_dir=a", "resume=r"], ["-m", "output_dir=a"],
                 ["hydra.mode=MULTIRUN", "output_dir=a,b"], ["output_dir=a,b"], ["output_dir=a", "--cfg", "job"],
                 ["output_dir=${hydra:runtime.cwd}/a"], ["training.lr=0.1"], [f"output_dir={tmp_path / 'run'}"]):
        assert run_folder.output_dir_as_run_dir(["train", *argv]) == [], argv
    assert run_folder.output_dir_as_run_dir(["train", "output_dir=a", "resume=auto"]) == ["hydra.run.dir=a"]
    assert run_folder.output_dir_as_run_dir(["train", f"output_dir={tmp_path / 'run'}", "resume=auto"]) == [
        f"hydra.run.dir={tmp_path / 'run'}"]  # continued: the run's own folder
    (tmp_path / "afile").write_text("x")
    with pytest.raises(SystemExit) as refused:
        run_folder.refuse_unwritable_run_folders([f"output_dir={tmp_path / 'afile'}",
                                                  f"hydra.run.dir={tmp_path / 'afile'}"])
    assert str(refused.value.code).startswith(f"output_dir: {tmp_path / 'afile'} is a file, not a folder")


def test_the_run_folder_is_made_before_hydra_and_what_stops_it_is_one_line(tmp_path, monkeypatch):
    run_folder.make_the_run_folder([f"hydra.run.dir={tmp_path / 'new' / 'run'}"])
    assert (tmp_path / "new" / "run").is_dir()
    long = tmp_path / ("a" * 300)  # longer than a name may be on any common file system
    with pytest.raises(SystemExit) as refused:
        run_folder.make_the_run_folder([f"output_dir={long}", f"hydra.run.dir={long}"])
    assert refused.value.code == f"output_dir: {long}: file name too long; name another folder"
    for argv in ([f"hydra.run.dir={tmp_path / 'looked'}", "--cfg", "job"], ["-m", f"hydra.run.dir={tmp_path / 'm'}"],
                 ["hydra.mode=MULTIRUN", f"hydra.run.dir={tmp_path / 'm'}"], [f"hydra.run.dir={tmp_path / 'a'},b"]):
        run_folder.make_the_run_folder(argv)
    monkeypatch.setenv("RANK", "1")  # under torchrun rank 0 makes the folder; the others make none
    run_folder.make_the_run_folder([f"hydra.run.dir={tmp_path / 'rank1'}"])
    assert run_folder.output_dir_as_run_dir(["train", f"output_dir={tmp_path / 'rank1'}"]) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["new"]
