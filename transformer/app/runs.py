"""Training runs as child processes, supervised: what a recipe launches.

A run's state is its run directory, never its log text: ``metrics.json`` written means finished (kept), a
``checkpoints/last.pt`` means started (resumed with ``resume=RUN``), neither means new. :func:`supervise` starts the
runs, at most ``parallel`` at once, each in a session of its own with its console in ``RUN.out``; a run that fails
stops the others from starting (they would fail alike). A terminal's Ctrl-C reaches the recipe alone; on Ctrl-C or
SIGTERM the recipe passes one SIGINT to every run, starts none after, and waits until each has saved its
``last.pt`` and stopped; a second interrupt passes a second SIGINT on, which aborts the runs without saving. A run
that also hears the stop itself (SLURM and systemd signal every process of a job) takes the two as one
(``interrupts.defer_sigint``).
"""

from __future__ import annotations

import enum
import logging
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from transformer.checkpoint import RunDir
from transformer.interrupts import Interrupted
from transformer.overrides import override_value

log = logging.getLogger(__name__)

# How a recipe starts a training: this interpreter, the package's own entry point (tests give a fake one).
TRAIN_COMMAND = (sys.executable, "-m", "transformer", "train")


class RunState(enum.Enum):
    new = "new"
    started = "started"  # a checkpoint to resume from
    finished = "finished"  # metrics.json written: scored on the test set


def run_state(run: Path) -> RunState:
    """What a run directory says of its run."""
    folder = RunDir(run)
    if folder.metrics.is_file():
        return RunState.finished
    if folder.last.is_file():
        return RunState.started
    return RunState.new


@dataclass(frozen=True)
class RunSpec:
    """One training of a recipe: its run directory and its overrides (the recipe's, then its own)."""

    run: Path
    overrides: tuple[str, ...]
    label: str = ""

    @property
    def console(self) -> Path:
        return self.run.with_name(self.run.name + ".out")

    def command(self, train_command: Sequence[str]) -> list[str]:
        """The command line that trains, resumes or (finished) would redo this run."""
        where = [f"resume={override_value(self.run)}", f"hydra.run.dir={override_value(f'{self.run}.resumed')}"] \
            if run_state(self.run) is RunState.started else [f"hydra.run.dir={override_value(self.run)}"]
        return [*train_command, *self.overrides, "training.progress_bar=false", *where]


# How a run the recipe stopped ends: saved and exited after a signal (130, 143), or killed by one before it could
# handle it (a run still starting up, one that heard SIGTERM twice)
STOPPED = (128 + signal.SIGINT, 128 + signal.SIGTERM, -signal.SIGINT, -signal.SIGTERM)


class RecipeInterrupted(Interrupted):
    """The recipe was interrupted; every run it had started has saved and stopped."""


class RunFailed(RuntimeError):
    """A run of the recipe failed; the message names its console file."""


@dataclass
class _Supervisor:
    train_command: Sequence[str]
    parallel: int
    running: dict[RunSpec, tuple[subprocess.Popen, IO[bytes]]] = field(default_factory=dict)
    failed: list[RunSpec] = field(default_factory=list)
    interrupts: int = 0  # Ctrl-C / SIGTERM received
    first_signal: int = signal.SIGINT  # the signal of the first
    signalled: dict[int, int] = field(default_factory=dict)  # SIGINTs passed on, by process id

    @property
    def interrupted(self) -> bool:
        return self.interrupts > 0

    def start(self, spec: RunSpec) -> None:
        state = run_state(spec.run)
        log.info("%s: %s %s", spec.label or spec.run.name, "resuming" if state is RunState.started else "training",
                 spec.run)
        spec.run.parent.mkdir(parents=True, exist_ok=True)
        console = open(spec.console, "ab")
        # A session of its own: a terminal's Ctrl-C reaches the recipe alone, which passes it on once.
        process = subprocess.Popen(spec.command(self.train_command), stdout=console, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, start_new_session=True)
        self.running[spec] = (process, console)
        self.pass_on()  # an interrupt that came while it started reaches it too

    def reap(self) -> None:
        """Forget the runs that ended, noting failures (a run that stopped for an interrupt is none)."""
        for spec, (process, console) in list(self.running.items()):
            if process.poll() is None:
                continue
            console.close()
            del self.running[spec]
            name = spec.label or spec.run.name
            if process.returncode in STOPPED and (self.interrupts > 1 or process.returncode < 0):  # nothing saved
                log.info("%s: stopped (%s)", name, spec.run)
            elif process.returncode in STOPPED and self.interrupted:
                log.info("%s: saved and stopped (%s)", name, spec.run)
            elif process.returncode != 0:
                self.failed.append(spec)
                log.error("%s: failed (exit %d), see %s", name, process.returncode, spec.console)

    def interrupt(self, signum: int, frame: object) -> None:
        """Pass the interrupt on: the first makes every run save after its step and stop, a second aborts them
        without saving (as two Ctrl-C do to one run)."""
        self.interrupts += 1
        if self.interrupts == 1:
            self.first_signal = signum
            log.warning("interrupted: every run saves and stops (interrupt again to abort them without saving)")
        self.pass_on()

    def pass_on(self) -> None:
        """Send every run as many SIGINTs as the recipe has received."""
        for process, _ in list(self.running.values()):
            while self.signalled.get(process.pid, 0) < self.interrupts:
                self.signalled[process.pid] = self.signalled.get(process.pid, 0) + 1
                if process.poll() is None:
                    process.send_signal(signal.SIGINT)

    def stop_all(self) -> None:
        """Interrupt the runs still going and wait for them (the recipe is leaving on an error)."""
        if self.running:
            self.interrupt(signal.SIGINT, None)
        while self.running:
            self.reap()
            time.sleep(0.1)


@contextmanager
def _signals_to(handler: Callable[[int, object], None]) -> Iterator[None]:
    """SIGINT, SIGTERM and SIGHUP (a closed terminal: the runs, in sessions of their own, would not hear it) call
    ``handler`` in the block, as before after it. Call it from the main thread (Python's rule for handlers)."""
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        for sig in saved:
            signal.signal(sig, handler)
        yield
    finally:
        for sig, before in saved.items():
            signal.signal(sig, before)


_NOT_THE_RUNS = ("resume", "training.progress_bar")  # overrides that say how a run is trained, not which run


def overrides_differing(spec: RunSpec) -> list[str]:
    """Where the overrides a run recorded differ from ``spec``'s, as ``key=now (the run: then)``; none where they
    agree or the run recorded none."""
    from transformer.checkpoint import CheckpointError
    from transformer.config import ConfigError
    from transformer.training.resume import saved_recipe

    try:
        recorded = saved_recipe(spec.run)
    except (ConfigError, CheckpointError):  # no checkpoint to read it from, or a damaged one
        return []
    if recorded is None:
        return []
    then, now = _settings(recorded), _settings(spec.overrides)
    return [f"{key}={now.get(key, '(not set)')} (the run: {then.get(key, '(not set)')})"
            for key in sorted(then.keys() | now.keys()) if then.get(key) != now.get(key)]


def _settings(overrides: Sequence[str]) -> dict[str, str]:
    """``key: value`` of the overrides that say which run it is."""
    pairs = (override.lstrip("+~").partition("=") for override in overrides)
    return {key: value for key, _, value in pairs if key not in _NOT_THE_RUNS and not key.startswith("hydra.")}


def supervise(specs: Sequence[RunSpec], *, parallel: int = 1, train_command: Sequence[str] = TRAIN_COMMAND,
              poll_seconds: float = 0.2) -> None:
    """Train every run of ``specs`` that is not finished, ``parallel`` at a time, and wait for them.

    Raises:
        RecipeInterrupted: on Ctrl-C or SIGTERM, once every started run has saved and stopped.
        RunFailed: after the runs already started have stopped, when one failed (none is started after it).
    """
    supervisor = _Supervisor(train_command, max(1, parallel))
    todo = []
    for spec in dict.fromkeys(specs):  # a run named twice is trained once
        if run_state(spec.run) is RunState.finished and (differences := overrides_differing(spec)):
            log.warning("%s: finished earlier with other overrides, kept as it is (%s); remove %s to train it with "
                        "this recipe's", spec.label or spec.run.name, "; ".join(differences), spec.run)
        elif run_state(spec.run) is RunState.finished:
            log.info("%s: finished earlier, kept (%s)", spec.label or spec.run.name, spec.run)
        else:
            todo.append(spec)
    with _signals_to(supervisor.interrupt):
        try:
            while todo or supervisor.running:
                supervisor.reap()
                while todo and len(supervisor.running) < supervisor.parallel and not supervisor.interrupted \
                        and not supervisor.failed:
                    supervisor.start(todo.pop(0))
                if supervisor.interrupted or supervisor.failed:
                    todo.clear()
                if supervisor.running:
                    time.sleep(poll_seconds)
        except BaseException:
            supervisor.stop_all()  # no run outlives the recipe
            raise
    if supervisor.interrupted:
        saved = "every run saved" if supervisor.interrupts == 1 else "the runs stopped at once, without saving"
        raise RecipeInterrupted(f"interrupted: {saved}; run the recipe again, with the same overrides, to resume",
                                supervisor.first_signal)
    if supervisor.failed:
        consoles = ", ".join(str(spec.console) for spec in supervisor.failed)
        raise RunFailed(f"a run failed (see {consoles}); run the recipe again, with the same overrides, to resume")
