"""``training.max_minutes``: where the time limit runs out, projected from the pace of training so far.

A limit that merely stopped training would cut a cosine schedule at a high learning rate. Instead the trainer
projects, at every validation and every ``log_every_steps`` steps, the step at which the limit runs out, and when
that comes before ``max_epochs`` / ``max_steps`` the schedule reaches its floor there and training stops there. The
pace is this call's (steps per second of wall time since it started, validations included), so one-off costs
weigh less as the call goes on; a resumed run under another limit projects at once from the pace of the whole
run so far, as its checkpoint records it.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from transformer.training import distributed

log = logging.getLogger(__name__)


def projected_step(step: int, steps_per_second: float, seconds_left: float) -> int:
    """The step reached when ``seconds_left`` more seconds pass at ``steps_per_second`` (``step`` if none are left)."""
    return step + max(0, math.floor(seconds_left * steps_per_second))


class TimeLimit:
    """The projection for one limit: ``step`` is where ``minutes`` runs out (None: no limit, or not yet projected)."""

    def __init__(self, minutes: float | None) -> None:
        self.minutes = minutes
        self.step: int | None = None
        self._reported: int | None = None  # the last projection worth a log line

    def project(self, step: int, steps_per_second: float, train_seconds: float) -> int:
        """Where the limit runs out for a run at ``step`` after ``train_seconds`` of training, going on at
        ``steps_per_second`` (call it only with a limit)."""
        assert self.minutes is not None, "no time limit to project"
        return projected_step(step, steps_per_second, self.minutes * 60.0 - train_seconds)

    def reproject(self, step: int, steps_per_second: float, train_seconds: float, planned_steps: int,
                  is_main: bool) -> None:
        """Project anew for a run at ``step`` going on at ``steps_per_second``, and log the projection when it is
        worth a line. Collective under DDP: rank 0's projection is broadcast, so every rank trains the same
        schedule."""
        projected = self.project(step, steps_per_second, train_seconds) if is_main else None
        self.step = distributed.broadcast_object(projected)
        if is_main and self.worth_reporting(planned_steps):
            log.info("time limit: at %.0f steps per minute, training.max_minutes=%g runs out at step %d, before "
                     "step %d (max_epochs / max_steps): the schedule ends and training stops there",
                     60.0 * steps_per_second, self.minutes, self.step, planned_steps)

    def warn_cut(self, step: int, schedule_end: int, lr: float) -> None:
        """The limit ran out at ``step``, before ``schedule_end`` where the schedule was projected to end: training
        stops at ``lr``, above the schedule's floor."""
        log.warning("training.max_minutes=%g ran out at step %d, before step %d where the pace so far had projected "
                    "it (the machine slowed down, or a validation took the rest): training stops with the learning "
                    "rate at %.3g, above its floor", self.minutes, step, schedule_end, lr)

    def out_of_time(self, train_seconds: float) -> bool:
        return self.minutes is not None and train_seconds >= self.minutes * 60.0

    def worth_reporting(self, planned_steps: int) -> bool:
        """Whether ``step`` deserves a log line: when it first ends training before ``planned_steps`` and
        whenever it has moved by more than 1 % of them since the last one reported."""
        if self.step is None or self.step >= planned_steps:
            return False
        if self._reported is not None and abs(self.step - self._reported) <= 0.01 * planned_steps:
            return False
        self._reported = self.step
        return True

    def state_dict(self) -> dict[str, Any] | None:
        return None if self.step is None else {"minutes": self.minutes, "step": self.step}

    def load_state_dict(self, saved: dict[str, Any] | None, step: int, train_seconds: float) -> None:
        """Continue a run saved at ``step`` after ``train_seconds``: keep the projection it was saved with when it
        was made for this limit, else project this limit from the whole run's pace."""
        if saved is not None and saved["minutes"] == self.minutes:
            self.step = int(saved["step"])
        elif self.minutes is not None and step > 0 and train_seconds > 0.0:
            self.step = self.project(step, step / train_seconds, train_seconds)
        else:
            self.step = None
