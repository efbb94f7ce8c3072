"""Ctrl-C and SIGTERM: the first asks for a stop after the step, the same stop heard twice is one stop, a later one
stops at once; a command so stopped exits with 128 + the signal's number."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time

import pytest

from transformer.checkpoint import load_checkpoint
from transformer.interrupts import Interrupted, defer_sigint, exit_status, interrupted_a_write, raise_interrupted


def test_the_exit_status_is_128_plus_the_signal_and_a_plain_keyboard_interrupt_counts_as_ctrl_c():
    assert exit_status(KeyboardInterrupt()) == 130
    assert exit_status(Interrupted("interrupted at step 7", signal.SIGINT)) == 130
    assert exit_status(Interrupted("interrupted at step 7", signal.SIGTERM)) == 143
    assert str(Interrupted("interrupted at step 7", signal.SIGTERM)) == "interrupted at step 7"
    assert str(Interrupted(signum=signal.SIGTERM)) == ""  # the command then says its own line


def test_a_sigterm_handled_as_ctrl_c_raises_an_interrupt_that_names_it():
    before = signal.signal(signal.SIGTERM, raise_interrupted)
    try:
        with pytest.raises(Interrupted) as raised:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(1)  # the handler runs between bytecodes: at the latest here
    finally:
        signal.signal(signal.SIGTERM, before)
    assert raised.value.signum == signal.SIGTERM and isinstance(raised.value, KeyboardInterrupt)


def test_the_first_ctrl_c_calls_back_and_a_later_one_interrupts():
    before = signal.getsignal(signal.SIGINT)  # SIG_IGN where the suite was started in the background
    calls = []
    with defer_sigint(calls.append, same_stop_seconds=0.0):
        os.kill(os.getpid(), signal.SIGINT)
        assert calls == [signal.SIGINT]
        with pytest.raises(Interrupted) as raised:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)
    assert raised.value.signum == signal.SIGINT and calls == [signal.SIGINT]
    assert signal.getsignal(signal.SIGINT) is before


@pytest.fixture
def as_the_commands_set_them():
    """SIGINT and SIGTERM as the commands set them (``cli._stop_on_signals``) for the test; as before after it."""
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, raise_interrupted)
    yield
    signal.signal(signal.SIGINT, before[0])
    signal.signal(signal.SIGTERM, before[1])


def test_one_stop_heard_from_two_senders_is_one_stop_also_once_the_loop_has_left(as_the_commands_set_them):
    # SLURM signals every process of a job, and transformer-recipe passes the stop on to its runs: a run hears
    # SIGTERM and SIGINT a moment apart, and must still finish its step and save rather than abort, also when the
    # second comes as the loop's Interrupted is on its way out.
    calls = []
    with defer_sigint(calls.append, same_stop_seconds=0.5):
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)
        assert calls == [signal.SIGTERM]
    os.kill(os.getpid(), signal.SIGINT)  # still the same stop
    time.sleep(0.05)
    time.sleep(0.5)  # past the window: a signal is a new stop, handled as before the loop
    with pytest.raises(KeyboardInterrupt):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(1)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert signal.getsignal(signal.SIGTERM) is raise_interrupted
    assert calls == [signal.SIGTERM]


def test_without_a_stop_the_loop_leaves_the_handlers_as_they_were(as_the_commands_set_them):
    with defer_sigint(lambda signum: pytest.fail("no signal was sent")):
        assert signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert signal.getsignal(signal.SIGTERM) is raise_interrupted


def test_a_handler_knows_when_it_interrupted_a_log_lines_write():
    seen = []

    class Probe(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:  # called by logging, as a write to a stream is
            seen.append(interrupted_a_write())

    logger = logging.getLogger("test_interrupts.probe")
    logger.addHandler(probe := Probe())
    try:
        logger.warning("a line")
    finally:
        logger.removeHandler(probe)
    assert seen == [True] and interrupted_a_write() is False


def test_a_later_sigterm_ends_the_process_as_sigterm_does():
    program = ("import os, signal, time\n"
               "from transformer.interrupts import defer_sigint\n"
               "with defer_sigint(lambda signum: print('first', signum, flush=True), same_stop_seconds=0.0):\n"
               "    os.kill(os.getpid(), signal.SIGTERM)\n"
               "    os.kill(os.getpid(), signal.SIGTERM)\n"
               "    time.sleep(5)\n"
               "print('not stopped', flush=True)\n")
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60)
    assert done.returncode == -signal.SIGTERM, done.stderr
    assert done.stdout == f"first {int(signal.SIGTERM)}\n"


@pytest.mark.slow
@pytest.mark.parametrize("second", [signal.SIGINT, signal.SIGTERM], ids=["then SIGINT", "then SIGTERM"])
def test_a_run_stopped_by_a_scheduler_saves_after_its_step_and_exits_143(toy_corpus, tmp_path, second):
    """``transformer-train`` sent SIGTERM by a scheduler, then the same stop by a supervisor passing it on
    (transformer-recipe: SIGINT; torchrun: SIGTERM) once the run has heard the first."""
    overrides = ["data=toy_copy", "model=tiny", "eval=greedy", "device=cpu", "training.progress_bar=false",
                 f"data.dir={toy_corpus}", "data.cache_dir=cache", "hydra.run.dir=run", "training.max_epochs=100000",
                 "training.max_minutes=null", "training.log_every_steps=1"]
    run = subprocess.Popen([sys.executable, "-m", "transformer", "train", *overrides], cwd=tmp_path, text=True,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    said = []
    for line in run.stdout:  # the log, line by line
        said.append(line)
        if " step 2: loss" in line:  # training
            run.send_signal(signal.SIGTERM)
        if "interrupt: saving last.pt after this step" in line:  # heard
            run.send_signal(second)
            break
    said += run.stdout.readlines()
    assert run.wait(timeout=120) == 143, "".join(said[-20:])
    last = tmp_path / "run" / "checkpoints" / "last.pt"
    assert "interrupted at step" in said[-1] and f"saved {last} (resume=" in said[-1]
    assert load_checkpoint(last)["reason"] == "interrupt"


@pytest.mark.slow
def test_ctrl_c_under_torchrun_stops_every_rank_after_its_step_and_rank_0_saves(toy_corpus, tmp_path):
    """A terminal's Ctrl-C reaches torchrun and both its workers, and torchrun passes it on to them (each rank hears
    SIGINT twice; here the two mostly arrive before the rank's handler runs, and count once): the group finishes its
    step, rank 0 saves ``last.pt`` and every rank stops, none aborted."""
    from conftest import REPO

    log = tmp_path / "torchrun.log"
    with open(log, "w") as console:
        group = subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--standalone",
             str(REPO / "scripts" / "train.py"), "data=toy_copy", "model=tiny", "eval=greedy", "device=cpu",
             "training.progress_bar=false", f"data.dir={toy_corpus}", "data.cache_dir=cache", "hydra.run.dir=run",
             "training.max_epochs=100000", "training.max_minutes=null", "training.log_every_steps=1",
             "training.threads=1"],
            cwd=tmp_path, stdout=console, stderr=subprocess.STDOUT, start_new_session=True)  # a terminal's group
        deadline = time.monotonic() + 300
        while " step 3: loss" not in log.read_text():
            assert group.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.1)
        os.killpg(group.pid, signal.SIGINT)  # Ctrl-C
        group.wait(timeout=120)
    said = log.read_text()
    last = tmp_path / "run" / "checkpoints" / "last.pt"
    assert f"saved {last} (resume=" in said, said[-3000:]
    assert load_checkpoint(last)["reason"] == "interrupt"
    assert "Traceback" not in said.partition("interrupted at step")[0], said[-3000:]  # no rank aborted
