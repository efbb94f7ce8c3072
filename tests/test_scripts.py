"""The shell scripts in scripts/ that drive the commands: run on the toy corpus, as a user runs them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import REPO

from transformer.checkpoint import load_checkpoint

RECIPE = ["data=toy_copy", "model=tiny", "eval=greedy", "training.max_tokens=256", "training.max_steps=6",
          "training.validate_every_steps=3", "device=cpu"]  # the scripts' logic, the same on a GPU machine


def _train_ensemble(out: Path, toy_corpus: Path, *overrides: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(REPO / "scripts" / "train_ensemble.sh"), str(out), *RECIPE, f"data.dir={toy_corpus}",
         "data.cache_dir=${data.dir}_cache", *overrides],
        cwd=out.parent, capture_output=True, text=True, timeout=600,
        env={**os.environ, "PYTHON": sys.executable, "OMP_NUM_THREADS": "1", **env,
             "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])},
    )


@pytest.mark.slow
def test_train_ensemble_trains_every_seed_scores_the_ensemble_and_resumes(toy_corpus: Path, tmp_path: Path) -> None:
    out = tmp_path / "ens"
    first = _train_ensemble(out, toy_corpus, SEEDS="5 6", PARALLEL="2")
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-2000:]
    finals = [out / f"seed_{seed}" / "checkpoints" / "final.pt" for seed in (5, 6)]
    members = [load_checkpoint(path) for path in finals]
    assert [member["config"]["training"]["seed"] for member in members] == [5, 6]
    assert not torch.equal(*(member["model"]["encoder.layers.0.feed_forward.linear1.weight"] for member in members))
    for split, test_set in (("val", "val.src-tgt"), ("test", "test.src-tgt")):
        metrics = json.loads((out / f"ensemble_{split}" / "metrics.json").read_text(encoding="utf-8"))
        assert (metrics["test_set"], metrics["checkpoint"], metrics["ensemble"]) == (
            test_set, str(finals[0]), [str(finals[1])])
        assert metrics["eval"]["beam_size"] == 1  # the recipe's eval=greedy, not evaluate's default beam
        assert f"{test_set}: BLEU" in first.stdout
    assert "seed 5: test (" in first.stdout and "seed 6: test (" in first.stdout

    # A crash before seed 6's end (its metrics.json not written): run again, seed 5 is kept and seed 6 resumed;
    # TRAIN_ONLY=1 scores no ensemble.
    (out / "seed_6" / "metrics.json").unlink()
    for split in ("val", "test"):
        (out / f"ensemble_{split}" / "metrics.json").unlink()
    again = _train_ensemble(out, toy_corpus, SEEDS="5 6", TRAIN_ONLY="1")
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
    assert "seed 5: finished earlier, kept" in again.stdout and "seed 6: resuming" in again.stdout
    assert (out / "seed_6" / "metrics.json").is_file()
    assert "resuming the run in" in (out / "seed_6" / "train.log").read_text(encoding="utf-8")
    assert not (out / "ensemble_val" / "metrics.json").exists() and "BLEU" not in again.stdout


@pytest.mark.slow
def test_train_ensemble_interrupted_waits_for_its_runs_to_save(toy_corpus: Path, tmp_path: Path) -> None:
    # Ctrl-C at a terminal reaches the script's whole process group: the runs save after their step, and the script
    # waits for them (so that nothing is cut while they save) and starts no further run.
    out = tmp_path / "ens"
    command = ["bash", str(REPO / "scripts" / "train_ensemble.sh"), str(out), *RECIPE, f"data.dir={toy_corpus}",
               "data.cache_dir=${data.dir}_cache", "training.max_steps=100000"]
    env = {**os.environ, "PYTHON": sys.executable, "OMP_NUM_THREADS": "1", "SEEDS": "5 6 7", "PARALLEL": "2",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    # As from a terminal: SIGINT not ignored, whatever this test's own process inherited (a background job's
    # ignores it, and bash cannot trap a signal ignored on entry).
    script = subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=env, start_new_session=True,
                              preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    logs = [out / f"seed_{seed}" / "train.log" for seed in (5, 6)]
    deadline = time.monotonic() + 300
    while not all(log.is_file() and "training on" in log.read_text(encoding="utf-8") for log in logs):
        assert script.poll() is None and time.monotonic() < deadline, script.communicate()
        time.sleep(0.5)
    os.killpg(script.pid, signal.SIGINT)
    stdout, stderr = script.communicate(timeout=300)
    assert script.returncode == 130, stdout + stderr
    assert "interrupted: run this script again" in stderr
    for seed in (5, 6):
        assert load_checkpoint(out / f"seed_{seed}" / "checkpoints" / "last.pt")["reason"] == "interrupt"
    assert not (out / "seed_7").exists()  # no run started after the interruption
    assert subprocess.run(["pgrep", "-f", str(out)], capture_output=True).returncode == 1  # no run left behind


def test_train_ensemble_stops_before_scoring_when_a_member_fails(toy_corpus: Path, tmp_path: Path) -> None:
    out = tmp_path / "ens"
    result = _train_ensemble(out, toy_corpus, "training.lr=-1", SEEDS="5 6")
    assert result.returncode == 1
    assert "seed 5: failed, see" in result.stderr and "run this script again" in result.stderr
    assert "training.lr: must be > 0" in (out / "seed_5.out").read_text(encoding="utf-8")
    assert not (out / "ensemble_val").exists()


def test_train_ensemble_needs_a_seed(tmp_path: Path) -> None:
    result = _train_ensemble(tmp_path / "ens", tmp_path, SEEDS=" ")
    assert result.returncode == 2 and "SEEDS names no seed" in result.stderr


def test_train_ensemble_refuses_an_unfinished_extra_member_before_training(tmp_path: Path) -> None:
    missing = tmp_path / "not_a_run"
    result = _train_ensemble(tmp_path / "ens", tmp_path, SEEDS="5", MORE_MEMBERS=str(missing))
    assert result.returncode == 2
    assert f"MORE_MEMBERS: {missing} is not a finished run" in result.stderr
    assert not (tmp_path / "ens").exists()


def _log_span(log: Path) -> tuple[str, str]:
    """A run's log's first and last time stamps ('2026-11-26 05:06:30,017': they sort as times)."""
    stamps = [line[1:24] for line in log.read_text(encoding="utf-8").splitlines() if line.startswith("[20")]
    return stamps[0], stamps[-1]


def test_train_diversified_refuses_a_bad_override_before_training(tmp_path: Path) -> None:
    out = tmp_path / "div"
    result = subprocess.run(["bash", str(REPO / "scripts" / "train_diversified.sh"), str(out), "model.n_head=3"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=120,
                            env={**os.environ, "PYTHON": sys.executable})
    assert result.returncode == 2
    assert "Key 'n_head' not in 'ModelConfig'" in result.stderr  # Hydra's own message, then the script's
    assert result.stderr.rstrip().endswith("does not compose from these overrides (Hydra's message above): "
                                           "training.max_minutes=null model.n_head=3")
    assert not out.exists()


@pytest.mark.slow
def test_train_diversified_trains_both_ways_extends_the_corpus_and_trains_the_student(toy_corpus: Path,
                                                                                     tmp_path: Path) -> None:
    out = tmp_path / "div"
    command = ["bash", str(REPO / "scripts" / "train_diversified.sh"), str(out), *RECIPE, f"data.dir={toy_corpus}",
               "data.cache_dir=${data.dir}_cache", "eval.batch_size=7"]
    env = {**os.environ, "PYTHON": sys.executable, "OMP_NUM_THREADS": "1", "SEEDS": "5 6", "BACKWARD_SEEDS": "7 8",
           "STUDENT_SEEDS": "1234", "WIDE_STUDENT_SEEDS": "9", "PARALLEL": "2", "SCORE_TEACHERS": "0",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    first = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=900, env=env)
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-2000:]
    backward = load_checkpoint(out / "backward" / "seed_7" / "checkpoints" / "final.pt")["config"]["data"]
    assert (backward["src"], backward["tgt"]) == ("tgt", "src")
    # PARALLEL > 1: the two directions' teachers trained side by side (each log's first and last time stamps)
    forward_span, backward_span = (_log_span(out / side / f"seed_{seed}" / "train.log")
                                   for side, seed in (("forward", 5), ("backward", 7)))
    assert backward_span[0] < forward_span[1] and forward_span[0] < backward_span[1]
    assert not (out / "forward" / "ensemble_val").exists() and not (out / "backward" / "ensemble_test").exists()
    record = json.loads((out / "corpus" / "diversify.json").read_text(encoding="utf-8"))
    assert record["forward"] == [str(out / "forward" / f"seed_{seed}" / "checkpoints" / "final.pt") for seed in (5, 6)]
    assert (record["pairs"], record["written_pairs"]) == (400, 1200)
    assert record["eval"]["batch_size"] == 7  # eval.batch_size reaches the translations
    student = load_checkpoint(out / "student" / "seed_1234" / "checkpoints" / "final.pt")["config"]
    assert student["data"]["train_dir"] == str(out / "corpus") and student["data"]["src"] == "src"
    assert "seed 1234: test (test" in first.stdout
    wide = load_checkpoint(out / "student_wide" / "seed_9" / "checkpoints" / "final.pt")["config"]
    assert wide["model"]["d_model"] == 192 and wide["data"]["train_dir"] == str(out / "corpus")
    scored = json.loads((out / "student" / "ensemble_test" / "metrics.json").read_text(encoding="utf-8"))
    assert scored["ensemble"] == [str(out / "student_wide" / "seed_9" / "checkpoints" / "final.pt")]
    assert f"{out / 'student_wide' / 'seed_9'}: test (test" in first.stdout

    # Run again one run at a time, scoring the teachers: everything is kept, the ensembles scored.
    env.pop("PARALLEL")
    env.pop("SCORE_TEACHERS")
    again = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=900, env=env)
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
    assert "diversified corpus: made earlier, kept" in again.stdout
    assert again.stdout.count("finished earlier, kept") == 6
    assert json.loads((out / "backward" / "ensemble_test" / "metrics.json").read_text())["test_set"] == "test.tgt-src"


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal of a machine without a GPU")
def test_train_best_gpu_refuses_a_machine_without_a_gpu_and_names_the_cpu_recipe(tmp_path: Path) -> None:
    result = subprocess.run(["bash", str(REPO / "scripts" / "train_best_gpu.sh"), str(tmp_path / "best")],
                            capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHON": sys.executable})
    assert result.returncode == 2
    assert "torch sees none here" in result.stderr and "scripts/train_diversified.sh" in result.stderr
    assert not (tmp_path / "best").exists()


def test_with_mps_runs_the_command_and_returns_its_status(tmp_path: Path) -> None:
    command = ["bash", str(REPO / "scripts" / "with_mps.sh"), "bash", "-c", "echo ran with $0; exit 7", "args"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60, env={**os.environ, "MPS": "0"})
    assert result.returncode == 7
    assert result.stdout.splitlines() == ["MPS=0: without MPS, the CUDA processes take turns on the GPU", "ran with args"]
    assert subprocess.run(["bash", str(REPO / "scripts" / "with_mps.sh")], capture_output=True).returncode == 2


def test_with_mps_starts_a_private_daemon_and_stops_it_after_the_command(tmp_path: Path) -> None:
    # A stand-in for nvidia-cuda-mps-control that logs how it was called; PYTHON=true passes the CUDA probe.
    stub = tmp_path / "bin" / "nvidia-cuda-mps-control"
    stub.parent.mkdir()
    log = tmp_path / "calls.log"
    stub.write_text(f'#!/usr/bin/env bash\necho "$* [$(cat -)] $CUDA_MPS_PIPE_DIRECTORY" >>{log}\n')
    stub.chmod(0o755)
    command = ["bash", str(REPO / "scripts" / "with_mps.sh"), "bash", "-c", 'echo "pipes: $CUDA_MPS_PIPE_DIRECTORY"; exit 7']
    env = {**os.environ, "PATH": f"{stub.parent}{os.pathsep}{os.environ['PATH']}", "PYTHON": "true",
           "TMPDIR": str(tmp_path)}
    result = subprocess.run(command, capture_output=True, text=True, timeout=60, env={**env, "MPS": "1"},
                            stdin=subprocess.DEVNULL)
    assert result.returncode == 7, result.stderr
    pipes = result.stdout.splitlines()[-1].removeprefix("pipes: ")
    assert result.stdout.startswith(f"MPS: on (pipe folder {pipes})") and pipes.startswith(str(tmp_path / "mps."))
    start, stop = log.read_text().splitlines()
    assert start == f"-d [] {pipes}"  # the daemon started, with the command's pipe folder
    assert stop == f" [quit] {pipes}"  # stopped when the command ended
    assert not Path(pipes).exists()
