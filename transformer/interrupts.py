"""Ctrl-C and SIGTERM: the exception that says which signal asked for a stop, the exit status it gives, and a
training loop's deferral of the first one until its step is done.

SIGTERM is what ``kill``, ``timeout``, Docker, SLURM and systemd send; the commands treat it as Ctrl-C, and exit
with 128 + the signal's number (130 after Ctrl-C, 143 after SIGTERM), as a shell reports a process a signal ended.
"""

from __future__ import annotations

import contextlib
import inspect
import signal
import threading
import time
from collections.abc import Callable, Iterator


class Interrupted(KeyboardInterrupt):
    """Ctrl-C (SIGINT), or a stop asked by ``kill``, ``timeout``, Docker, SLURM or systemd (SIGTERM), with the
    signal's number: a command so stopped exits with 128 + it (130, 143), as a shell reports a process the signal
    ended. A plain KeyboardInterrupt counts as SIGINT."""

    def __init__(self, message: str = "", signum: int = signal.SIGINT) -> None:
        super().__init__(*([message] if message else []))
        self.signum = int(signum)


def signal_of(interrupt: BaseException) -> int:
    """The signal that asked for ``interrupt``: SIGINT unless it says otherwise."""
    return getattr(interrupt, "signum", int(signal.SIGINT))


def exit_status(interrupt: BaseException) -> int:
    """What a command stopped by ``interrupt`` exits with: 130 after Ctrl-C, 143 after SIGTERM."""
    return 128 + signal_of(interrupt)


def raise_interrupted(signum: int, frame: object) -> None:
    """A signal handler: raise ``Interrupted`` for ``signum`` where the program is (as SIGINT's default does)."""
    raise Interrupted(signum=signum)


def interrupted_a_write() -> bool:
    """Whether the signal handler this is called from interrupted a log line's or a progress bar's write: a write of
    its own to the same stream would then fail as re-entrant, so it should say its piece later."""
    frame = inspect.currentframe()
    while frame is not None:
        if frame.f_globals.get("__name__", "").partition(".")[0] in ("logging", "tqdm"):
            return True
        frame = frame.f_back
    return False


SAME_STOP_SECONDS = 1.0  # a signal this soon after the first is the same stop, delivered twice


@contextlib.contextmanager
def defer_sigint(on_interrupt: Callable[[int], None], same_stop_seconds: float = SAME_STOP_SECONDS) -> Iterator[None]:
    """Turn the first Ctrl-C (SIGINT) or SIGTERM into a call of ``on_interrupt(signum)``; one that comes later stops
    at once (SIGINT raises KeyboardInterrupt, SIGTERM terminates as by default).

    Lets a training loop finish its step and save before stopping. A signal within ``same_stop_seconds`` of the
    first is the same stop, delivered twice, and does nothing, also after the block is left (while the loop's
    ``Interrupted`` is on its way out): SLURM and systemd signal every process of a job, torchrun and
    transformer-recipe pass the stop on, so a run can hear one stop from two senders. The window starts when the
    first signal's handler runs, so a duplicate whose handler waits more than the window for the main thread (a
    rank blocked in a collective) counts as a second stop. This holds where SIGINT was ignored too (a job started in
    the background by a script): ``kill -INT`` then stops a run cleanly. Outside the main thread (where signal
    handlers cannot be installed) this does nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    first: list[float] = []  # when the first signal came

    def echo(now: float) -> bool:
        return now - first[0] < same_stop_seconds

    def handler(signum: int, frame: object) -> None:
        if not first:
            first.append(time.monotonic())
            on_interrupt(signum)
        elif not echo(time.monotonic()):  # asked again: stop at once
            _restore({signal.SIGINT: signal.default_int_handler, signal.SIGTERM: signal.SIG_DFL})
            if signum == signal.SIGTERM:
                signal.raise_signal(signal.SIGTERM)  # ends the process, as SIGTERM does by default
            raise Interrupted(signum=signum)

    def afterwards(signum: int, frame: object) -> None:  # the block was left after a stop: its echoes, then as before
        if not echo(time.monotonic()):
            _restore(previous)
            _as_by(previous[signum], signum, frame)

    for signum in previous:
        signal.signal(signum, handler)
    try:
        yield
    finally:
        if first and echo(time.monotonic()):
            _restore({signum: afterwards for signum in previous})
        else:
            _restore(previous)


def _restore(actions: dict) -> None:
    for signum, action in actions.items():
        signal.signal(signum, action)


def _as_by(action: object, signum: int, frame: object) -> None:
    """Do to ``signum`` what ``action``, a signal's handler as ``signal.getsignal`` gives it, does."""
    if callable(action):
        action(signum, frame)
    elif action != signal.SIG_IGN:  # SIG_DFL, or a handler not installed from Python: the default
        signal.signal(signum, signal.SIG_DFL)
        signal.raise_signal(signum)  # SIGINT's and SIGTERM's default: the process ends
