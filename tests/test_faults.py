"""A kill in the middle of each kind of write (``TRANSFORMER_KILL_AT``, see ``transformer.files``): afterwards the
next command uses nothing half-written, and a resumed run ends with the weights of an uninterrupted one."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from transformer.checkpoint import load_checkpoint
from transformer.files import FAULT_ENV

pytestmark = pytest.mark.slow

TOY = ["data=toy_copy", "model=tiny", "eval=greedy", "device=cpu", "training.progress_bar=false",
       "training.average_last=0", "training.max_tokens=512", "training.lr=3e-3", "training.warmup_steps=5",
       "model.dropout=0.0"]


def command(cwd: Path, *args: str, kill_at: str | None = None, input: str | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != FAULT_ENV}
    if kill_at is not None:
        env[FAULT_ENV] = kill_at
    return subprocess.run([sys.executable, "-m", "transformer", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300, input=input)


def ok(done: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return done


def killed(done: subprocess.CompletedProcess) -> None:
    assert done.returncode == -signal.SIGKILL, done.stdout[-2000:] + done.stderr[-2000:]


def train(cwd: Path, corpus: Path, run: str, *args: str, kill_at: str | None = None) -> subprocess.CompletedProcess:
    return command(cwd, "train", *TOY, f"data.dir={corpus}", "data.cache_dir=cache", f"hydra.run.dir={run}", *args,
                   kill_at=kill_at)


def weights(path: Path) -> dict[str, torch.Tensor]:
    return load_checkpoint(path)["model"]


def test_a_kill_while_a_checkpoint_is_written_then_resume_gives_the_uninterrupted_weights(toy_corpus, tmp_path):
    steps = ["training.max_steps=15", "training.validate_every_steps=5"]
    ok(train(tmp_path, toy_corpus, "straight", *steps))
    killed(train(tmp_path, toy_corpus, "run", *steps, "resume=auto", kill_at="step_10.pt:3000"))
    checkpoints = tmp_path / "run" / "checkpoints"
    assert load_checkpoint(checkpoints / "last.pt")["step"] == 5  # the checkpoint before stays whole
    assert not (checkpoints / "step_10.pt").exists()
    ok(train(tmp_path, toy_corpus, "run", *steps, "resume=auto"))  # the same command line, run again
    resumed, straight = weights(checkpoints / "last.pt"), weights(tmp_path / "straight" / "checkpoints" / "last.pt")
    assert load_checkpoint(checkpoints / "last.pt")["step"] == 15
    assert resumed.keys() == straight.keys() and all(torch.equal(resumed[k], straight[k]) for k in straight)


@pytest.mark.parametrize("kill_at", ["last.pt:0", "best.pt:0"], ids=["last.pt", "best.pt"])
def test_a_kill_while_last_or_best_is_relinked_then_resume_gives_the_uninterrupted_run(toy_corpus, tmp_path, kill_at):
    """The rotation writes step_N.pt, then links last.pt and best.pt to it (a temporary name renamed over each): a
    kill between the two leaves the new step file, the old link (here: none yet) and the temporary name."""
    steps = ["training.max_steps=15", "training.validate_every_steps=5"]
    ok(train(tmp_path, toy_corpus, "straight", *steps))
    killed(train(tmp_path, toy_corpus, "run", *steps, "resume=auto", kill_at=kill_at))
    checkpoints = tmp_path / "run" / "checkpoints"
    name = kill_at.partition(":")[0]
    assert load_checkpoint(checkpoints / "step_5.pt")["step"] == 5 and not (checkpoints / name).exists()
    assert (checkpoints / f".{name}.link.tmp").exists()
    resumed = ok(train(tmp_path, toy_corpus, "run", *steps, "resume=auto"))
    assert not list(checkpoints.glob(".*.tmp")) and "which a write killed midway left" in resumed.stdout + resumed.stderr
    straight = tmp_path / "straight" / "checkpoints"
    for checkpoint in ("last.pt", "best.pt", "final.pt"):
        ours, theirs = weights(checkpoints / checkpoint), weights(straight / checkpoint)
        assert all(torch.equal(ours[k], theirs[k]) for k in theirs), checkpoint
    assert json.loads((tmp_path / "run" / "metrics.json").read_text())["test_bleu"] == \
        json.loads((tmp_path / "straight" / "metrics.json").read_text())["test_bleu"]


@pytest.mark.parametrize("kill_at", ["src_tokens.npy:100", "tgt_offsets.npy:10", "*.json:20"],
                         ids=["token array", "offsets array", "tokenizer file"])
def test_a_kill_while_the_data_cache_is_written_leaves_nothing_the_next_run_uses(toy_corpus, tmp_path, kill_at):
    killed(train(tmp_path, toy_corpus, "first", "training.max_steps=2", kill_at=kill_at))
    assert not list((tmp_path / "cache" / "corpus").glob("*/meta.json"))  # no encoded corpus was published
    ok(train(tmp_path, toy_corpus, "second", "training.max_steps=2"))
    (tmp_path / "clean").mkdir()
    ok(train(tmp_path / "clean", toy_corpus, "run", "training.max_steps=2"))
    built, clean = ({folder.parent.name + "/" + folder.name: json.loads((folder / "meta.json").read_text())["sha256"]
                     for folder in (root / "cache").glob("*/*") if (folder / "meta.json").is_file()}
                    for root in (tmp_path, tmp_path / "clean"))
    assert built == clean  # the same files, byte for byte, as a cache built without the kill


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    from conftest import write_toy_corpus

    folder = tmp_path_factory.mktemp("faults")
    corpus = write_toy_corpus(folder / "toy")
    ok(train(folder, corpus, "run", "training.max_steps=10", "training.validate_every_steps=5"))
    return folder


def test_a_kill_while_translations_are_written_keeps_the_earlier_file(trained):
    (trained / "in.txt").write_text("a b c\nd e\n")
    (trained / "out.txt").write_text("earlier translations\n")
    args = ["translate", "run_dir=run", "input=in.txt", "output=out.txt", "overwrite=true", "eval=greedy"]
    killed(command(trained, *args, kill_at="out.txt:4"))
    assert (trained / "out.txt").read_text() == "earlier translations\n"
    ok(command(trained, *args))
    assert len((trained / "out.txt").read_text().splitlines()) == 2


def test_a_kill_while_an_average_is_written_leaves_no_averaged_checkpoint(trained):
    steps = sorted(str(p) for p in (trained / "run" / "checkpoints").glob("step_*.pt"))
    assert len(steps) == 2
    killed(command(trained, "average", "avg.pt", *steps, kill_at="avg.pt:2000"))
    assert not (trained / "avg.pt").exists()
    ok(command(trained, "average", "avg.pt", *steps))
    averaged, first, second = (weights(Path(p)) for p in (trained / "avg.pt", *steps))
    assert all(torch.allclose(averaged[k], (first[k] + second[k]) / 2) for k in first if first[k].is_floating_point())


@pytest.fixture
def small_disk(tmp_path):
    """A real file system that fills up: a 16 MiB tmpfs (mounting needs root; skipped elsewhere)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(disk)],
                                           capture_output=True).returncode != 0:
        pytest.skip("mounting a tmpfs needs root")
    yield disk
    subprocess.run(["umount", "-l", str(disk)], capture_output=True)


def test_a_disk_that_fills_up_mid_run_keeps_the_last_checkpoint_and_resume_gives_the_uninterrupted_run(
        toy_corpus, tmp_path, small_disk):
    steps = ["training.max_steps=15", "training.validate_every_steps=5"]
    ok(train(tmp_path, toy_corpus, "straight", *steps))
    size = (tmp_path / "straight" / "checkpoints" / "step_5.pt").stat().st_size
    ballast = small_disk / "ballast"
    with open(ballast, "wb") as handle:  # leave room for the run's logs and step_5.pt, not for step_10.pt beside it
        handle.write(bytes(os.statvfs(small_disk).f_bavail * os.statvfs(small_disk).f_frsize - size * 3 // 2))
    run = small_disk / "run"
    full = train(tmp_path, toy_corpus, str(run), *steps, "resume=auto")
    assert full.returncode == 1
    message = [line for line in (full.stdout + full.stderr).splitlines() if "ENOSPC" in line]
    assert len(message) == 1 and "while writing" in message[0] and "free space" in message[0], full.stderr[-2000:]
    assert message[0].endswith(f"continue the run with resume={run}"), message[0]  # not "run the command again"
    checkpoints = run / "checkpoints"
    assert load_checkpoint(checkpoints / "last.pt")["step"] == 5  # whole, and the newest the run has
    assert not list(checkpoints.glob(".*.tmp")) and not (checkpoints / "step_10.pt").exists()
    ballast.unlink()  # space freed: the same command line continues the run
    ok(train(tmp_path, toy_corpus, str(run), *steps, "resume=auto"))
    resumed, straight = weights(checkpoints / "last.pt"), weights(tmp_path / "straight" / "checkpoints" / "last.pt")
    assert all(torch.equal(resumed[k], straight[k]) for k in straight)


def fill(disk: Path, leave: int) -> Path:
    """Fill ``disk`` with one file until ``leave`` bytes are free; delete the file to free the space again."""
    ballast = disk / "ballast"
    with open(ballast, "wb") as handle:
        handle.write(bytes(max(0, os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize - leave)))
    return ballast


def one_enospc_line(done: subprocess.CompletedProcess, path_part: str) -> None:
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    assert "Traceback" not in done.stderr, done.stderr[-2000:]
    lines = [line for line in (done.stdout + done.stderr).splitlines() if "ENOSPC" in line]
    assert len(lines) == 1 and path_part in lines[0] and "free space" in lines[0], lines


def test_a_full_disk_under_the_corpus_cache_leaves_no_half_cache_and_the_same_command_then_builds_it(
        toy_corpus, tmp_path, small_disk):
    cache = small_disk / "cache"
    args = ["train", *TOY, f"data.dir={toy_corpus}", f"data.cache_dir={cache}", "training.max_steps=2",
            "hydra.run.dir=run", "resume=auto"]
    ballast = fill(small_disk, leave=8 * 1024)  # room for a directory or two, not for the tokenizers and arrays
    one_enospc_line(command(tmp_path, *args), str(cache / "corpus"))
    assert not [p for p in cache.rglob("*") if ".tmp-" in p.name]  # no half-built folder left to fill the disk
    assert not list((cache / "corpus").iterdir())  # and no corpus entry for the next run to trust
    ballast.unlink()
    done = ok(command(tmp_path, *args))
    assert "training data: encoded 400 pairs" in done.stdout + done.stderr  # built afresh
    assert load_checkpoint(tmp_path / "run" / "checkpoints" / "last.pt")["step"] == 2


def test_a_full_disk_under_evaluates_folder_is_one_line_and_a_rerun_with_space_completes(trained, small_disk):
    """Hydra writes the folder's ``.hydra/`` snapshot before the command's code; a full disk there is one line
    too. (evaluate's own outputs on a full disk: tests/test_files.py, through a writer that reports ENOSPC.)"""
    out = small_disk / "eval"
    args = ["evaluate", "run_dir=run", "eval=greedy", "device=cpu", f"hydra.run.dir={out}"]
    ballast = fill(small_disk, leave=0)
    one_enospc_line(command(trained, *args), str(out / ".hydra"))
    assert not (out / "metrics.json").exists()
    ballast.unlink()
    ok(command(trained, *args, "overwrite=true"))  # into the folder the refused run began (its .hydra/ is there)
    assert json.loads((out / "metrics.json").read_text())["bleu"] >= 0


def test_a_kill_while_a_diversified_split_is_written_leaves_no_split_and_says_so(trained):
    args = ["diversify", "forward=[run]", "eval=greedy", "device=cpu"]
    killed(command(trained, *args, "out_dir=split", kill_at="train.tgt.gz:100"))
    assert not (trained / "split" / "diversify.json").exists()  # written last: the split is not done
    assert not (trained / "split" / "train.tgt.gz").exists()  # and no side half-written
    refused = command(trained, *args, "out_dir=split")
    assert refused.returncode == 1 and "has no diversify.json, as a transformer-diversify stopped midway leaves it" \
        in refused.stdout + refused.stderr
    ok(command(trained, *args, "out_dir=clean"))
    for side in ("train.src.gz", "train.tgt.gz"):  # what the stopped run had written is what a clean run writes
        assert not (trained / "split" / side).exists() or \
            (trained / "split" / side).read_bytes() == (trained / "clean" / side).read_bytes()


def test_a_rank_killed_under_torchrun_restarts_and_ends_with_the_uninterrupted_weights(toy_corpus, tmp_path):
    """torchrun --max-restarts=1 runs the same command line again: with resume=auto the group continues from the
    last save, and its weights end as an uninterrupted run's."""
    from conftest import REPO

    from transformer.files import FAULT_ONCE_ENV

    def torchrun(run: str, **env: str) -> subprocess.CompletedProcess:
        environment = {k: v for k, v in os.environ.items() if k not in (FAULT_ENV, FAULT_ONCE_ENV)} | env
        return subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--standalone", "--max-restarts=1",
             str(REPO / "scripts" / "train.py"), *TOY, f"data.dir={toy_corpus}", "data.cache_dir=cache",
             "training.max_steps=12", "training.save_every_steps=3", "training.validate_every_steps=6",
             "training.threads=1", "resume=auto", f"hydra.run.dir={run}"],
            cwd=tmp_path, env=environment, capture_output=True, text=True, timeout=600)

    ok(torchrun("straight"))
    marker = tmp_path / "killed-once"
    restarted = ok(torchrun("run", **{FAULT_ENV: "step_6.pt:1000", FAULT_ONCE_ENV: str(marker)}))
    assert marker.exists()  # rank 0 was SIGKILLed writing step_6.pt ...
    assert "resume=auto: continuing" in restarted.stdout + restarted.stderr  # ... and the group came back
    resumed, straight = (weights(tmp_path / run / "checkpoints" / "last.pt") for run in ("run", "straight"))
    assert load_checkpoint(tmp_path / "run" / "checkpoints" / "last.pt")["step"] == 12
    assert all(torch.equal(resumed[k], straight[k]) for k in straight)
