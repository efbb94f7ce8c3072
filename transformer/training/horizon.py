"""Where a run ends: the one place that decides when training stops and where the learning-rate schedule ends.

Four limits can end a run: ``max_epochs`` and ``max_steps`` (the plan), ``max_minutes`` (projected to a step from the
pace of training: :mod:`transformer.training.time_limit`) and ``patience`` (validations without a BLEU gain:
:mod:`transformer.training.early_stopping`). A decaying schedule reaches its floor at :attr:`Horizon.schedule_steps`,
the plan's end or the projected end of the time, whichever comes first, so a run cut by its time limit still ends
annealed. The horizon's state travels in every checkpoint, so a resumed run stops where an uninterrupted one would.
"""

from __future__ import annotations

import logging
from typing import Any

from transformer.config import Schedule, TrainingConfig
from transformer.training.early_stopping import EarlyStopping
from transformer.training.optim import scheduled_rate
from transformer.training.time_limit import TimeLimit

log = logging.getLogger(__name__)


class Horizon:
    """The limits of one run.

    Args:
        cfg: the training config (``max_epochs``, ``max_steps``, ``max_minutes``, ``patience``, the schedule).
        epoch_steps: optimizer steps in the run's first epoch: the plan's unit (BPE-dropout epochs differ a little
            in length; the schedule must not move with them).
    """

    def __init__(self, cfg: TrainingConfig, epoch_steps: int) -> None:
        self.cfg = cfg
        self.epoch_steps = epoch_steps
        self.time_limit = TimeLimit(cfg.max_minutes)
        self.early_stopping = EarlyStopping(cfg.patience)
        self._warned_of_a_short_time = False

    @property
    def planned_steps(self) -> int:
        """``max_epochs`` times the first epoch's steps, or ``max_steps`` when that comes first."""
        by_epochs = self.cfg.max_epochs * self.epoch_steps
        return by_epochs if self.cfg.max_steps is None else min(self.cfg.max_steps, by_epochs)

    @property
    def schedule_steps(self) -> int:
        """The step at which a decaying schedule (cosine) reaches ``min_lr``: :attr:`planned_steps`, or where
        ``max_minutes`` is projected to run out when that comes first."""
        projected = self.time_limit.step
        return self.planned_steps if projected is None else min(self.planned_steps, projected)

    def rate(self, step: int) -> float:
        """The learning rate of optimizer step ``step`` (1-based)."""
        return scheduled_rate(self.cfg, step, self.schedule_steps)

    def step_limit(self, step: int) -> str | None:
        """``"max_steps"`` or ``"max_minutes"`` (the projected step of the time limit) once ``step`` reaches it."""
        if self.cfg.max_steps is not None and step >= self.cfg.max_steps:
            return "max_steps"
        if self.time_limit.step is not None and step >= self.time_limit.step:
            return "max_minutes"
        return None

    def past_max_epochs(self, epoch: int) -> bool:
        """Whether ``epoch`` (0-based, in progress) is past ``max_epochs``."""
        return epoch >= self.cfg.max_epochs

    def out_of_time(self, train_seconds: float) -> bool:
        """Whether ``max_minutes`` has run out after ``train_seconds`` of training."""
        return self.time_limit.out_of_time(train_seconds)

    def validated(self, bleu: float, step: int) -> tuple[bool, bool]:
        """Record a validation's BLEU: (is it the best so far, has patience run out)."""
        is_best = self.early_stopping.update(bleu, step)
        return is_best, self.early_stopping.exhausted

    def ended_before_start(self, step: int, train_seconds: float, is_main: bool) -> str | None:
        """Why a resumed run that already reached a limit trains no more (None: it goes on)."""
        if self.early_stopping.exhausted:
            return "early_stopping"
        if self.out_of_time(train_seconds):
            if is_main and step < self.planned_steps:  # stopped by the time, not by its plan
                log.warning("this run has trained %.1f minutes already, training.max_minutes=%g: nothing more to "
                            "train (a larger training.max_minutes, or null, continues it)",
                            train_seconds / 60.0, self.cfg.max_minutes)
            return "max_minutes"
        return None

    def reproject(self, step: int, steps_per_second: float, train_seconds: float, is_main: bool) -> None:
        """Project where ``max_minutes`` runs out at this pace (collective under DDP); warn once if that comes
        before the warm-up ends."""
        self.time_limit.reproject(step, steps_per_second, train_seconds, self.planned_steps, is_main)
        end = self.schedule_steps  # a plan shorter than the warm-up is warned of on its own (warn_if_warmup_outlasts)
        if is_main and end < self.cfg.warmup_steps <= self.planned_steps and not self._warned_of_a_short_time:
            self._warned_of_a_short_time = True
            log.warning("training.max_minutes=%g runs out near step %d, before the %d steps of warm-up end "
                        "(training.warmup_steps): the learning rate rises to %.3g at most, never to training.lr=%g, "
                        "and the run ends without its decay; a shorter warm-up or a larger training.max_minutes "
                        "trains better", self.cfg.max_minutes, end, self.cfg.warmup_steps, self.rate(end),
                        self.cfg.lr)

    def warn_if_warmup_outlasts(self) -> None:
        """A warm-up longer than the plan never reaches ``training.lr``: say the highest rate it reaches."""
        if self.planned_steps < self.cfg.warmup_steps:
            log.warning("training.warmup_steps=%d is more than the %d steps planned (max_epochs / max_steps): the "
                        "learning rate rises to %.3g at most, never to training.lr=%g", self.cfg.warmup_steps,
                        self.planned_steps, self.rate(self.planned_steps), self.cfg.lr)

    def warn_if_the_schedule_moved(self, saved_steps: int | None, step: int) -> None:
        """A resumed run whose max_epochs / max_steps / max_minutes end the cosine decay elsewhere than its checkpoint
        recorded jumps to another learning rate at ``step``."""
        if self.cfg.schedule is not Schedule.cosine or saved_steps is None or saved_steps == self.schedule_steps:
            return
        rates = scheduled_rate(self.cfg, step, saved_steps), self.rate(step)
        change = f": step {step}'s learning rate goes from {rates[0]:.3g} to {rates[1]:.3g}" if rates[0] != rates[1] \
            else " (the warm-up, where the run is, is the same; the decay after it changes)"
        log.warning("the cosine schedule now reaches its floor at step %d, not %d as when the checkpoint was written "
                    "(training.max_epochs / max_steps / max_minutes changed)%s", self.schedule_steps, saved_steps,
                    change)

    def state_dict(self) -> dict[str, Any]:
        """The checkpoint keys of the horizon (early stopping's three, the plan's unit, the schedule's end and the
        time limit's projection)."""
        return {**self.early_stopping.state_dict(), "epoch_steps": self.epoch_steps,
                "schedule_steps": self.schedule_steps, "time_limit": self.time_limit.state_dict()}

    def load_state_dict(self, checkpoint: dict[str, Any], step: int, train_seconds: float) -> None:
        """Continue a run saved at ``step`` after ``train_seconds`` of training (older checkpoints lack the last
        three keys: the plan's unit is then this epoch's, and the time limit projects from the run's pace)."""
        self.early_stopping.load_state_dict(checkpoint)
        self.epoch_steps = int(checkpoint.get("epoch_steps", self.epoch_steps))
        self.time_limit.load_state_dict(checkpoint.get("time_limit"), step, train_seconds)
        self.warn_if_the_schedule_moved(checkpoint.get("schedule_steps"), step + 1)
