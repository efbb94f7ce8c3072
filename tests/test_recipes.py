"""Recipes: runs supervised from their run directories (against a fake training command, fast), MPS around them
(against a stand-in daemon), and the recipes end to end on the toy corpus (slow)."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest
import torch
from conftest import REPO

from transformer.app import recipes
from transformer.app.mps import mps
from transformer.app.runs import RunFailed, RunSpec, RunState, run_state, supervise
from transformer.checkpoint import load_checkpoint
from transformer.config import ConfigError
from transformer.training.checkpoints import save_checkpoint

# A stand-in for `python -m transformer train`: it records its command line, marks its run started, and then, as
# FAKE_MODE says, finishes (metrics.json), fails, or trains until SIGINT, which it counts, then "saves" and exits 130.
FAKE_TRAIN = textwrap.dedent("""
    import json, os, signal, sys, time
    from pathlib import Path
    args = dict(a.split("=", 1) for a in sys.argv[1:])
    run = Path(args.get("resume") or args["hydra.run.dir"])
    seed = args["training.seed"]
    with open(os.environ["FAKE_CALLS"], "a") as calls:
        calls.write(json.dumps({"argv": sys.argv[1:], "start": time.time()}) + "\\n")
    signals = []
    signal.signal(signal.SIGINT, lambda *_: signals.append(1))
    (run / "checkpoints").mkdir(parents=True, exist_ok=True)
    (run / "checkpoints" / "last.pt").write_text("started")
    if seed in os.environ.get("FAKE_FAIL", "").split(","):
        sys.exit(1)
    deadline = time.time() + float(os.environ.get("FAKE_SECONDS", "0.3"))
    while time.time() < deadline and not signals:
        time.sleep(0.02)
    if signals:
        time.sleep(0.3)  # saving
        (run / "checkpoints" / "last.pt").write_text(f"interrupt after {len(signals)} SIGINT")
        sys.exit(130)
    (run / "metrics.json").write_text(json.dumps({"test": {"bleu": float(seed), "chrf": 1.0}}))
""")


@pytest.fixture
def fake(tmp_path, monkeypatch):
    script = tmp_path / "fake_train.py"
    script.write_text(FAKE_TRAIN)
    calls = tmp_path / "calls.jsonl"
    monkeypatch.setenv("FAKE_CALLS", str(calls))

    def recorded() -> list[dict]:
        return [json.loads(line) for line in calls.read_text().splitlines()] if calls.exists() else []

    return (sys.executable, str(script)), recorded


def _specs(out: Path, seeds) -> list[RunSpec]:
    return recipes.member_specs(out, ["data=toy_copy"], seeds)


def test_the_state_of_a_run_is_its_folder(tmp_path):
    run = tmp_path / "run"
    assert run_state(run) is RunState.new
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "last.pt").write_bytes(b"")
    assert run_state(run) is RunState.started
    (run / "metrics.json").write_text("{}")
    assert run_state(run) is RunState.finished


def test_new_runs_train_started_ones_resume_finished_ones_are_kept(tmp_path, fake):
    command, recorded = fake
    out = tmp_path / "ens"
    (out / "seed_2" / "checkpoints").mkdir(parents=True)
    (out / "seed_2" / "checkpoints" / "last.pt").write_text("crashed")
    (out / "seed_3").mkdir()
    (out / "seed_3" / "metrics.json").write_text("{}")
    supervise(_specs(out, [1, 2, 3]), train_command=command)
    argvs = [call["argv"] for call in recorded()]
    assert argvs == [
        ["data=toy_copy", "training.seed=1", "training.progress_bar=false", f"hydra.run.dir={out / 'seed_1'}"],
        ["data=toy_copy", "training.seed=2", "training.progress_bar=false", f"resume={out / 'seed_2'}",
         f"hydra.run.dir={out / 'seed_2'}.resumed"],
    ]
    assert all(run_state(out / f"seed_{seed}") is RunState.finished for seed in (1, 2, 3))


def test_a_finished_run_of_other_overrides_is_kept_with_a_warning_naming_them(tmp_path, fake, caplog):
    command, recorded = fake
    out = tmp_path / "ens"
    for seed, recipe in ((1, ["data=toy_copy", "training.seed=1", "training.progress_bar=false"]),
                         (2, ["data=toy_copy", "training.seed=2", "model.d_model=64", "training.max_steps=30"])):
        (out / f"seed_{seed}" / "checkpoints").mkdir(parents=True)
        save_checkpoint({"recipe": recipe}, out / f"seed_{seed}" / "checkpoints" / "last.pt")
        (out / f"seed_{seed}" / "metrics.json").write_text("{}")
    with caplog.at_level(logging.INFO, logger="transformer.app.runs"):
        supervise(recipes.member_specs(out, ["data=toy_copy", "training.max_steps=40"], [1, 2]),
                  train_command=command)
    assert recorded() == []  # both kept
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("WARNING", f"seed 1: finished earlier with other overrides, kept as it is (training.max_steps=40 (the run: "
                    f"(not set))); remove {out / 'seed_1'} to train it with this recipe's"),
        ("WARNING", f"seed 2: finished earlier with other overrides, kept as it is (model.d_model=(not set) (the run: "
                    f"64); training.max_steps=40 (the run: 30)); remove {out / 'seed_2'} to train it with this "
                    "recipe's")]
    caplog.clear()
    (out / "seed_2" / "checkpoints" / "last.pt").write_bytes(b"torn")  # unreadable: nothing to compare, kept
    with caplog.at_level(logging.INFO, logger="transformer.app.runs"):
        supervise(recipes.member_specs(out, ["data=toy_copy"], [1, 2]), train_command=command)
    assert caplog.messages == [f"seed 1: finished earlier, kept ({out / 'seed_1'})",
                               f"seed 2: finished earlier, kept ({out / 'seed_2'})"] and recorded() == []


def test_parallel_runs_overlap_and_sequential_ones_do_not(tmp_path, fake, monkeypatch):
    command, recorded = fake
    monkeypatch.setenv("FAKE_SECONDS", "1.0")
    started = time.monotonic()
    supervise(_specs(tmp_path / "a", [1, 2]), parallel=2, train_command=command)
    assert time.monotonic() - started < 1.9  # two one-second runs side by side
    first, second = recorded()
    assert abs(first["start"] - second["start"]) < 0.9
    supervise(_specs(tmp_path / "b", [1, 2]), parallel=1, train_command=command)
    first, second = recorded()[2:]
    assert second["start"] - first["start"] >= 1.0


def test_a_failed_run_starts_no_further_run_and_names_its_console(tmp_path, fake, monkeypatch):
    command, recorded = fake
    monkeypatch.setenv("FAKE_FAIL", "1")
    with pytest.raises(RunFailed, match=r"seed_1\.out.*run the recipe again"):
        supervise(_specs(tmp_path, [1, 2, 3]), train_command=command)
    assert len(recorded()) == 1 and not (tmp_path / "seed_2").exists()


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["Ctrl-C", "SIGTERM"])
def test_a_stop_passes_one_sigint_to_each_run_waits_for_their_saves_and_starts_none(tmp_path, fake, stop):
    """The recipe in a process of its own, sent SIGINT (as Ctrl-C reaches it) or SIGTERM (a scheduler's stop)
    while two of three runs train: it exits as a command so stopped does, 130 or 143."""
    command, recorded = fake
    out = tmp_path / "ens"
    code = (f"import sys; sys.path.insert(0, {str(REPO / 'tests')!r})\n"
            "from transformer.app import recipes\nfrom transformer.app.runs import RecipeInterrupted, supervise\n"
            "from transformer.interrupts import exit_status\n"
            "try:\n"
            f"    supervise(recipes.member_specs(__import__('pathlib').Path({str(out)!r}), [], [1, 2, 3]), parallel=2, "
            f"train_command={list(command)!r})\n"
            "except RecipeInterrupted as stopped:\n"
            "    print(stopped, file=sys.stderr)\n"
            "    sys.exit(exit_status(stopped))\n")
    recipe = subprocess.Popen([sys.executable, "-c", code], env={**os.environ, "FAKE_SECONDS": "60"},
                              stderr=subprocess.PIPE, text=True,
                              preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 60
    while len(recorded()) < 2 or not all((out / f"seed_{s}" / "checkpoints" / "last.pt").exists() for s in (1, 2)):
        assert recipe.poll() is None and time.monotonic() < deadline, recipe.communicate()
        time.sleep(0.05)
    recipe.send_signal(stop)
    _, stderr = recipe.communicate(timeout=60)
    assert recipe.returncode == 128 + stop, stderr
    assert stderr.splitlines()[-1] == ("interrupted: every run saved; run the recipe again, with the same overrides, "
                                       "to resume")
    for seed in (1, 2):  # each saved after exactly one SIGINT, before the recipe ended
        assert (out / f"seed_{seed}" / "checkpoints" / "last.pt").read_text() == "interrupt after 1 SIGINT"
    assert len(recorded()) == 2 and not (out / "seed_3").exists()


def test_an_ensemble_refuses_before_training(tmp_path, fake):
    command, recorded = fake
    options = recipes.Options(tmp_path / "ens", [], train_command=command, prepare=False)
    with pytest.raises(ConfigError, match="seeds: name at least one seed"):
        recipes.ensemble(options, [])
    with pytest.raises(ConfigError, match=f"more_members: {tmp_path / 'nope'} is not a finished run"):
        recipes.ensemble(options, [1], more_members=[tmp_path / "nope"])
    assert recorded() == [] and not (tmp_path / "ens").exists()


def test_a_bad_override_stops_diversification_before_any_training(tmp_path, fake):
    command, recorded = fake
    options = recipes.Options(tmp_path / "div", ["model.n_head=3"], train_command=command)
    with pytest.raises(ConfigError, match=r"do not compose \(training.max_minutes=null model.n_head=3\).*n_head"):
        recipes.diversified(options, recipes.Diversified())
    with pytest.raises(ConfigError, match=r"^student-seeds: the recipe ends in its students"):
        recipes.diversified(options, recipes.Diversified(student_seeds=[], wide_student_seeds=[]))
    assert recorded() == [] and not (tmp_path / "div").exists()


def test_the_closing_hint_names_the_ensemble_only_when_there_is_one():
    import shlex

    from hydra.core.override_parser.overrides_parser import OverridesParser

    for metrics in ({"checkpoint": "/r/student/seed_1/checkpoints/final.pt"},
                    {"checkpoint": "/my runs/a,b.pt", "ensemble": ["/my runs/it's", "/r/[c]=d"]}):
        hint = recipes.translate_hint(metrics)
        command = shlex.split(hint.removeprefix("translate with it: ").removesuffix(" < input.txt > output.txt"))
        assert command[0] == "transformer-translate" and len(command) == (3 if "ensemble" in metrics else 2)
        values = {o.key_or_group: o.value() for o in OverridesParser.create().parse_overrides(command[1:])}
        assert values == {key: metrics[key] for key in ("checkpoint", "ensemble") if key in metrics}


def test_the_command_line_reports_a_bad_override_in_one_line(tmp_path):
    done = subprocess.run([sys.executable, "-m", "transformer", "recipe", "ensemble", str(tmp_path / "ens"),
                           "model.n_head=3"], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "model.n_head" in lines[0] and "model.n_heads" in lines[0], done.stderr


def test_seeds_are_read_as_a_list_and_a_seed_given_twice_is_refused(capsys):
    parser = recipes.command_line()
    args = parser.parse_intermixed_args(["ensemble", "out", "--seeds", "1234,1 2", "--backward-seeds", "none"])
    assert (args.seeds, args.backward_seeds) == ([1234, 1, 2], [])
    with pytest.raises(SystemExit) as refused:
        parser.parse_intermixed_args(["ensemble", "out", "--seeds", "1,2,1"])
    assert refused.value.code == 2
    assert "--seeds: seed 1 is given twice in '1,2,1': a seed names one run" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal of a machine without a GPU")
def test_best_gpu_refuses_a_machine_without_a_gpu_and_names_the_cpu_recipe(tmp_path):
    with pytest.raises(ConfigError, match="torch sees none here.*transformer-recipe diversified"):
        recipes.best_gpu(recipes.Options(tmp_path / "best", []), recipes.Diversified())
    assert not (tmp_path / "best").exists()


def test_mps_starts_a_private_daemon_and_stops_it_after_the_block(tmp_path, monkeypatch):
    stub = tmp_path / "bin" / "nvidia-cuda-mps-control"  # logs how it was called
    stub.parent.mkdir()
    log = tmp_path / "calls.log"
    stub.write_text(f'#!/usr/bin/env bash\necho "$* [$(cat -)] $CUDA_MPS_PIPE_DIRECTORY" >>{log}\n')
    stub.chmod(0o755)
    monkeypatch.setenv("PATH", f"{stub.parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.delenv("CUDA_MPS_PIPE_DIRECTORY", raising=False)
    with mps(probe=["true"]) as on:
        pipes = os.environ["CUDA_MPS_PIPE_DIRECTORY"]
        assert on and pipes.startswith(str(tmp_path / "mps.")) and os.environ["CUDA_MPS_LOG_DIRECTORY"] == pipes
    start, stop = log.read_text().splitlines()
    assert start == f"-d [] {pipes}" and stop == f" [quit] {pipes}"  # started for the block, stopped after it
    assert not Path(pipes).exists() and "CUDA_MPS_PIPE_DIRECTORY" not in os.environ
    with mps(probe=["false"]) as on:  # a daemon no CUDA process can use: stopped at once, the block runs without
        assert not on and "CUDA_MPS_PIPE_DIRECTORY" not in os.environ
    with mps(enabled=False) as on:
        assert not on


RECIPE = ["data=toy_copy", "model=tiny", "eval=greedy", "training.max_tokens=256", "training.max_steps=6",
          "training.validate_every_steps=3", "device=cpu"]


def _recipe(tmp_path: Path, toy_corpus: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "transformer", "recipe", *args, *RECIPE, f"data.dir={toy_corpus}",
                           "data.cache_dir=${data.dir}_cache"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=900, env={**os.environ, "OMP_NUM_THREADS": "1"})


@pytest.mark.parametrize("overrides, beam_size, length_norm", [
    (["debug=cpu_tiny"], 1, "gnmt"),  # a group's search: cpu_tiny trains and scores greedily
    (["eval.beam_size=3", "eval.length_norm=average"], 3, "average"),
    ([], 8, "gnmt"),
])
def test_the_ensemble_is_scored_with_the_search_its_members_were(monkeypatch, tmp_path, overrides, beam_size,
                                                                 length_norm):
    asked = []
    monkeypatch.setattr(recipes.use, "evaluate", lambda cfg: asked.append(cfg) or {})
    recipes.score_ensemble([tmp_path / "a", tmp_path / "b"], tmp_path, overrides)
    assert [(cfg.eval.beam_size, cfg.eval.length_norm.value) for cfg in asked] == [(beam_size, length_norm)] * 2
    assert [cfg.split for cfg in asked] == [recipes.compose_train(overrides).data.valid_split, None]


@pytest.mark.slow
def test_an_ensemble_trains_every_seed_scores_the_ensemble_and_resumes(toy_corpus, tmp_path):
    out = tmp_path / "ens"
    first = _recipe(tmp_path, toy_corpus, "ensemble", str(out), "--seeds", "5,6", "--parallel", "2")
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-2000:]
    finals = [out / f"seed_{seed}" / "checkpoints" / "final.pt" for seed in (5, 6)]
    members = [load_checkpoint(path) for path in finals]
    assert [member["config"]["training"]["seed"] for member in members] == [5, 6]
    for split, test_set in (("val", "val.src-tgt"), ("test", "test.src-tgt")):
        metrics = json.loads((out / f"ensemble_{split}" / "metrics.json").read_text(encoding="utf-8"))
        assert (metrics["test_set"], metrics["checkpoint"], metrics["ensemble"]) == (
            test_set, str(finals[0]), [str(finals[1])])
        assert metrics["eval"]["beam_size"] == 1  # the recipe's eval=greedy, not evaluate's default beam
    assert f"{out / 'seed_5'}: test BLEU" in first.stdout and f"{out / 'seed_6'}: test BLEU" in first.stdout

    # a finished run of the other direction as an extra member: refused before the recipe trains anything
    backward = _recipe(tmp_path, toy_corpus, "ensemble", str(tmp_path / "rev"), "--seeds", "8", "--more-members",
                       str(out / "seed_5"), "data.src=tgt", "data.tgt=src")
    assert backward.returncode == 1
    assert (f"more_members: {out / 'seed_5'} (src->tgt) differs from this recipe's runs (tgt->src) in its language "
            "pair; ") in backward.stderr
    assert not (tmp_path / "rev" / "seed_8").exists()

    (out / "seed_6" / "metrics.json").unlink()  # a crash before seed 6's end: kept, resumed, nothing scored
    again = _recipe(tmp_path, toy_corpus, "ensemble", str(out), "--seeds", "5,6", "--train-only")
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
    assert "seed 5: finished earlier, kept" in again.stderr and "seed 6: resuming" in again.stderr
    assert "resuming the run in" in (out / "seed_6" / "train.log").read_text(encoding="utf-8")
    assert (out / "seed_6" / "metrics.json").is_file() and "BLEU" not in again.stdout


@pytest.mark.slow
def test_diversification_trains_both_ways_extends_the_corpus_and_trains_the_students(toy_corpus, tmp_path):
    out = tmp_path / "div (v2)"  # a folder name the override grammar would parse, unquoted
    args = ["diversified", str(out), "eval.batch_size=7", "--seeds", "5,6", "--backward-seeds", "7",
            "--student-seeds", "1234", "--wide-student-seeds", "9", "--student-epochs", "1"]
    first = _recipe(tmp_path, toy_corpus, *args, "--parallel", "2", "--no-score-teachers")
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-2000:]
    backward = load_checkpoint(out / "backward" / "seed_7" / "checkpoints" / "final.pt")["config"]["data"]
    assert (backward["src"], backward["tgt"]) == ("tgt", "src")
    assert not (out / "forward" / "ensemble_val").exists()
    record = json.loads((out / "corpus" / "diversify.json").read_text(encoding="utf-8"))
    assert record["forward"] == [str(out / "forward" / f"seed_{seed}" / "checkpoints" / "final.pt") for seed in (5, 6)]
    assert (record["pairs"], record["written_pairs"]) == (400, 1200)
    assert record["eval"]["batch_size"] == 7 and record["eval"]["beam_size"] == 5  # diversify's own search
    student = load_checkpoint(out / "student" / "seed_1234" / "checkpoints" / "final.pt")["config"]
    assert student["data"]["train_dir"] == str(out / "corpus") and student["training"]["max_epochs"] == 1
    wide = load_checkpoint(out / "student_wide" / "seed_9" / "checkpoints" / "final.pt")["config"]
    assert wide["model"]["d_model"] == 192 and wide["data"]["train_dir"] == str(out / "corpus")
    scored = json.loads((out / "student" / "ensemble_test" / "metrics.json").read_text(encoding="utf-8"))
    assert scored["ensemble"] == [str(out / "student_wide" / "seed_9" / "checkpoints" / "final.pt")]

    again = _recipe(tmp_path, toy_corpus, *args)  # one run at a time, teachers scored: everything kept
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
    assert "diversified corpus: made earlier, kept" in again.stderr
    assert again.stderr.count("finished earlier, kept") == 5
    assert json.loads((out / "forward" / "ensemble_test" / "metrics.json").read_text())["test_set"] == "test.src-tgt"
