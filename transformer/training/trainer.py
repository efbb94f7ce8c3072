"""The training loop: accumulation, autocast, clipping, per-step learning rate, validation, early stopping,
checkpoints and exact resume.

The trainer receives built collaborators (model, optimizer, sampler, collate function, validation callback,
checkpoint manager, tracker) and the ``TrainingConfig``; it never reads the root config. The loop reads as:
a step (``step.TrainStep``), then the events it brings (check, log, validate, save, stop), then acting on them. Where
training stops and where the schedule ends is ``horizon.Horizon`` (epochs, steps, minutes, patience); the loop's
position is a ``loop_state.LoopState``; each writes and reads its part of a checkpoint.

- Exact resume: checkpoints are written only between optimizer steps, with the sampler position (mid-epoch too),
  per-rank RNG states and early-stopping counters; training on from one reproduces the uninterrupted run's
  parameters (CPU; on a GPU unless a kernel is non-deterministic: ``training.deterministic``).
  ``save_every_steps`` / ``save_every_minutes`` write ``last.pt`` between validations.
- Host work: batches are collated ahead of the step (on CUDA in a thread, pinned, copied ``non_blocking``); the
  step's statistics stay on the device until a *check* reads them (``step_window``: every step on a CPU, every
  ``log_every_steps`` on a GPU, and before every validation, save and stop). A non-finite loss or gradient norm
  never reaches the weights, and the next check raises ``TrainingDiverged``.
- A time limit (``max_minutes``) ends the run annealed: from the pace so far the trainer projects the step where
  the limit runs out and ends the cosine schedule there (docs/guide/train.md, Time limit).
- Ctrl-C or SIGTERM: the steps up to the next check finish, ``last.pt`` is written and ``Interrupted`` raised; a
  second one aborts at once without saving.
- DDP: validation runs on rank 0 while the other ranks wait for its metrics, so every rank takes the same
  early-stopping decision; only rank 0 logs and writes files.
"""

from __future__ import annotations

import itertools
import logging
import math
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import nn

from transformer.checkpoint import TRAINER_KEYS, CheckpointError, check_plain
from transformer.config import TrainingConfig
from transformer.data.prefetch import prefetched
from transformer.inference.metrics import perplexity
from transformer.interrupts import Interrupted, defer_sigint, interrupted_a_write
from transformer.runtime import capture_rng_state, resolve_training, restore_rng_state, seed_everything
from transformer.tracking import TRAIN_MINUTES, ProgressBar, Tracker
from transformer.training import distributed
from transformer.training.checkpoints import CheckpointManager
from transformer.training.cuda_graphs import StepGraphs
from transformer.training.distributed import DistContext
from transformer.training.horizon import Horizon
from transformer.training.loop_state import LoopState
from transformer.training.optim import set_learning_rate
from transformer.training.resume import check_resumable
from transformer.training.step import BatchLike, TrainStep
from transformer.training.step_window import Reading, StepWindow

log = logging.getLogger(__name__)

ValidateFn = Callable[[nn.Module, int], dict[str, float]]


class SamplerLike(Protocol):
    def set_epoch(self, epoch: int) -> None: ...
    def __iter__(self) -> Iterator[list[int]]: ...
    def __len__(self) -> int: ...
    def state_dict(self) -> dict: ...
    def load_state_dict(self, state: dict) -> None: ...


@dataclass
class TrainResult:
    """How a ``fit`` call ended."""

    steps: int  # optimizer steps completed in total (resumed runs included)
    epochs: int  # epochs completed
    best_bleu: float | None
    best_step: int | None
    stopped_early: bool
    reason: str  # max_epochs | max_steps | max_minutes | early_stopping
    wall_seconds: float  # this fit call only
    train_seconds: float = 0.0  # all fit calls of the run, resumed ones summed (the figure to report)
    last_metrics: dict[str, float] = field(default_factory=dict)  # the latest validation's


class Trainer:
    """Runs optimisation for a built model; see the module docstring for the guarantees."""

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        cfg: TrainingConfig,
        *,
        n_pairs: int,
        sampler: SamplerLike,
        collate_fn: Callable[[list[int]], BatchLike],
        device: torch.device,
        dist: DistContext,
        tracker: Tracker,
        checkpoints: CheckpointManager,
        validate: ValidateFn,
        extra_state: dict[str, Any],
    ) -> None:
        clashes = sorted(TRAINER_KEYS & set(extra_state))
        if clashes:
            raise ValueError(f"extra_state keys {clashes} clash with the trainer's checkpoint keys")
        check_plain(extra_state, "extra_state")
        if len(sampler) == 0:
            raise ValueError("the sampler yields no batches: is the training set empty?")
        self.model = model.to(device)
        self.optimizer = optimizer
        self.cfg = cfg = resolve_training(cfg, device, dist.world_size)
        self.n_pairs = n_pairs  # of the training split, for the log: the collate function reads the pairs
        self.sampler = sampler
        self.collate_fn = collate_fn
        self.device = device
        self.dist = dist
        self.tracker = tracker
        self.checkpoints = checkpoints
        self.validate = validate
        self.extra_state = extra_state
        self._update = TrainStep(self.model, optimizer, cfg, device, dist)
        self.horizon = Horizon(cfg, epoch_steps=self.steps_per_epoch)
        self.state = LoopState(sampler=sampler.state_dict())  # the sampler may run ahead of the batches trained on
        self._check_every = 1 if device.type == "cpu" else cfg.log_every_steps  # steps between device-to-host reads
        self._last_save = time.monotonic()
        self._sampler_positioned = False  # the sampler already points into self.epoch (load_state, epoch end)
        self._pending_rng: dict | None = None  # this rank's RNG state from load_state, applied by fit
        self._start_seed: int | None = cfg.seed + dist.rank  # fresh runs: ranks draw different dropout masks
        self._interrupt_requested = False
        self._interrupt_signal = int(signal.SIGINT)  # the signal that asked for it; another rank's: SIGINT
        self._interrupt_said = False
        self._in_step = False
        self._started = time.monotonic()
        self._first_step = 0  # the step this fit call started from: its pace is measured from there

    @property
    def graphs(self) -> StepGraphs | None:
        """The step's CUDA graphs (``training.cuda_graphs``), else None."""
        return self._update.graphs

    @property
    def steps_per_epoch(self) -> int:
        """Optimizer steps in the current epoch (``accumulate`` batches each; the last step may take fewer)."""
        return math.ceil(len(self.sampler) / self.cfg.accumulate)

    @property
    def step(self) -> int:
        """Optimizer steps completed."""
        return self.state.step

    @property
    def epoch(self) -> int:
        """The epoch in progress (0-based)."""
        return self.state.epoch

    @property
    def schedule_steps(self) -> int:
        """The step at which the schedule reaches its floor (:attr:`Horizon.schedule_steps`)."""
        return self.horizon.schedule_steps

    # ---------------------------------------------------------------------------------------------
    # State
    # ---------------------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The checkpoint dict (collective under DDP: every rank must call it; it gathers RNG states)."""
        rng = distributed.all_gather_object(capture_rng_state())
        return {**self.extra_state, "model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "rng": rng, **self.state.state_dict(self.train_seconds), **self.horizon.state_dict()}

    def load_state(self, checkpoint: dict[str, Any]) -> None:
        """Continue from a checkpoint dict (every rank loads the same one). RNGs are restored when ``fit`` starts."""
        check_resumable(checkpoint, self.dist.world_size)
        rng = checkpoint["rng"]  # one state per process that wrote it
        self.model.load_state_dict(checkpoint["model"])
        self._update.load_optimizer_state(checkpoint["optimizer"])
        self.state = LoopState.from_checkpoint(checkpoint)
        try:  # an epoch's end loads as the sampler's own end: its batch count differs with the number of processes
            self.sampler.load_state_dict(checkpoint["sampler"])
        except ValueError as error:  # a checkpoint from before train_pairs was saved, on a changed training split
            raise CheckpointError(f"{error}: the checkpoint was written in an epoch of another training split (did "
                                  "the training files change?)") from None
        self.state.sampler = self.sampler.state_dict()
        self._sampler_positioned = True
        self.horizon.load_state_dict(checkpoint, self.step, self.state.seconds_before)
        if len(rng) == self.dist.world_size:
            self._pending_rng, self._start_seed = rng[self.dist.rank], None
        else:
            log.warning("checkpoint has RNG states for %d rank(s), this run has %d: resuming with fresh seeds, "
                        "so the continuation is not bit-identical", len(rng), self.dist.world_size)
            # a seed apart from the run's first (seed + rank) and from a resume at another step
            self._pending_rng, self._start_seed = None, self.cfg.seed + 1000 * self.step + self.dist.rank

    def save_now(self, reason: str, *, is_best: bool = False) -> None:
        """Write a checkpoint of the current state (between steps). Collective under DDP; rank 0 writes.

        ``"validation"`` and ``"final"`` also add a rotated ``step_{N}.pt``; ``"interrupt"`` and ``"scheduled"``
        (``save_every_steps`` / ``save_every_minutes``) write only ``last.pt``.
        """
        state = self.state_dict()
        self._last_save = time.monotonic()
        if self.dist.is_main:
            path = self.checkpoints.save({**state, "reason": reason}, self.step, is_best=is_best,
                                         periodic=reason in ("validation", "final"))
            log.info("step %d: saved %s (%s%s)", self.step, path, reason, ", best" if is_best else "")
        distributed.barrier()  # nobody exits (and makes torchrun kill rank 0) before the file is complete

    # ---------------------------------------------------------------------------------------------
    # Loop
    # ---------------------------------------------------------------------------------------------

    def fit(self) -> TrainResult:
        """Train until max_epochs / max_steps / max_minutes or early stopping; validate and save at the end."""
        self._started, self._first_step = time.monotonic(), self.step
        if self._pending_rng is not None:
            restore_rng_state(self._pending_rng)
        elif self._start_seed is not None:
            seed_everything(self._start_seed)
        self._pending_rng = self._start_seed = None
        self.model.train()
        if self.dist.is_main:
            log.info("training on %d pairs, %d batches per epoch and rank, from step %d (epoch %d)",
                     self.n_pairs, len(self.sampler), self.step, self.epoch + 1)
            self.horizon.warn_if_warmup_outlasts()
        with defer_sigint(self._on_sigint):
            try:
                reason = self._run()
            except KeyboardInterrupt:
                if not self._in_step and self.dist.world_size == 1 and not self._interrupt_requested:
                    self.save_now("interrupt")  # an interrupt that bypassed the handler, between steps
                raise
            finally:
                graphs = self._release_graphs()
            if self.state.last_valid_step != self.step:
                self._validate_and_save(final=True)
        self.tracker.flush()
        if self.dist.is_main:
            log.info("training stopped (%s) at step %d: %.1f minutes of training in all, %.1f in this call%s",
                     reason, self.step, self.train_seconds / 60.0, (time.monotonic() - self._started) / 60.0, graphs)
        stopping = self.horizon.early_stopping
        return TrainResult(steps=self.step, epochs=self.state.epochs_done, best_bleu=stopping.best_bleu,
                           best_step=stopping.best_step, stopped_early=reason == "early_stopping", reason=reason,
                           wall_seconds=time.monotonic() - self._started, train_seconds=self.train_seconds,
                           last_metrics=dict(self.state.last_metrics))

    def _release_graphs(self) -> str:
        """Free the recorded CUDA graphs' memory pool (for validation and test decoding); what to log of them."""
        if self.graphs is None:
            return ""
        shapes = self.graphs.n_shapes
        self.graphs.release()
        return f"; CUDA graphs recorded for {shapes} batch shapes"

    @property
    def train_seconds(self) -> float:
        """Seconds spent training this run so far, earlier (resumed) fit calls included."""
        return self.state.seconds_before + time.monotonic() - self._started

    def _run(self) -> str:
        """Epochs and steps; returns why training stopped."""
        # A resumed run may have stopped early or used its time already (this call's time is not yet due).
        if (reason := self.horizon.ended_before_start(self.step, self.state.seconds_before, self.dist.is_main)):
            return reason
        state = self.state
        while not self.horizon.past_max_epochs(state.epoch):
            if not self._sampler_positioned:
                self.sampler.set_epoch(state.epoch)
            self._sampler_positioned = False
            state.sampler = self.sampler.state_dict()
            reason = self._run_epoch()
            if reason is not None:
                return reason
            state.epoch += 1
            self.sampler.set_epoch(state.epoch)  # checkpoints written now resume at the next epoch's start
            state.sampler = self.sampler.state_dict()
            self._sampler_positioned = True
            # A run resumed from the end of an epoch has already validated this step (its last one).
            validate = self.cfg.validate_every_steps is None and state.last_valid_step != self.step
            if validate and self._validate_and_save():
                return "early_stopping"
        return "max_epochs"

    def _batches(self) -> Iterator[tuple[BatchLike, dict]]:
        """This epoch's remaining batches, each with the sampler state right after it (what a checkpoint saves
        once it is trained on); on CUDA pinned (``prefetched`` runs this ahead in a thread)."""
        pin = self.device.type == "cuda"
        for indices in self.sampler:
            batch = self.collate_fn(indices)
            yield batch.pin_memory() if pin else batch, self.sampler.state_dict()

    def _run_epoch(self) -> str | None:
        """The steps of one epoch (from the sampler's position); a stop reason, or None at the epoch's end."""
        cfg = self.cfg
        if (reason := self.horizon.step_limit(self.step)) is not None:
            return reason
        bar = ProgressBar(self.steps_per_epoch, enabled=cfg.progress_bar and self.dist.is_main,
                          desc=f"epoch {self.epoch + 1}")
        window = StepWindow(torch.zeros(4, device=self.device), first_step=self.step + 1)
        try:
            with prefetched(self._batches(), self.device) as batches:
                while group := list(itertools.islice(batches, cfg.accumulate)):
                    stats, tokens = self.train_step([batch for batch, _ in group])
                    self.state.step += 1
                    self.state.sampler = group[-1][1]
                    window.add(stats, tokens)
                    bar.update(1)
                    reason = self._after_step(window, bar)
                    if reason is not None:
                        return reason
            # The epoch's last steps, before validation or a checkpoint (an interrupt saves without validating).
            self._stop_if_interrupted(self._check(window, bar, log_now=True))
        finally:
            bar.close()
        return None

    def _after_step(self, window: StepWindow, bar: ProgressBar) -> str | None:
        """Checks, logging, validation and scheduled checkpoints after a step; a stop reason or None."""
        cfg = self.cfg
        if self._interrupt_requested:
            self._say_interrupt()
        validate = cfg.validate_every_steps is not None and self.step % cfg.validate_every_steps == 0
        save = cfg.save_every_steps is not None and self.step % cfg.save_every_steps == 0
        project = cfg.max_minutes is not None and self.step % cfg.log_every_steps == 0
        schedule_end = self.schedule_steps  # what this step trained on, before a new projection moves it
        check = self.step % self._check_every == 0
        if not (validate or save or project or check or self.horizon.step_limit(self.step)):
            return None
        reading = self._check(window, bar)
        self._stop_if_interrupted(reading)
        if validate:
            started = time.perf_counter()
            if self._validate_and_save():
                return "early_stopping"
            window.started += time.perf_counter() - started  # the window's tokens/s counts training time only
        elif project:
            self._project_time_limit()
        last = self.horizon.step_limit(self.step)  # after a new projection: it may end training at this very step
        if last is None and reading.late:
            last = "max_minutes"
        if last == "max_minutes" and self.step < schedule_end and self.dist.is_main:
            self.horizon.time_limit.warn_cut(self.step, schedule_end, float(self.optimizer.param_groups[0]["lr"]))
        if not validate and (save or reading.save_due) and last is None:  # at the last step the final validation saves
            self.save_now("scheduled")
        return last

    def _stop_if_interrupted(self, reading: Reading) -> None:
        """After a Ctrl-C or SIGTERM (on any rank): save ``last.pt`` now and raise ``Interrupted`` naming it."""
        if reading.interrupt:
            self.save_now("interrupt")
            last = self.checkpoints.last_path  # <run>/checkpoints/last.pt
            if not self.dist.is_main:  # rank 0 wrote it, and says so
                raise Interrupted(f"interrupted at step {self.step}; rank 0 saved the run's {last.name}",
                                  self._interrupt_signal)
            raise Interrupted(f"interrupted at step {self.step}; saved {last} (resume={last.parent.parent} continues "
                              "it)", self._interrupt_signal)

    def train_step(self, batches: list[BatchLike]) -> tuple[torch.Tensor, int]:
        """One optimizer step over the collated micro-batches ``batches`` at this step's learning rate (``fit``
        calls it, so does the benchmark); returns ``TrainStep``'s device statistics and token count."""
        set_learning_rate(self.optimizer, self.horizon.rate(self.step + 1))
        self._in_step = True  # stays set if the step raises: fit then saves nothing half-updated
        stats = self._update(batches)
        self._in_step = False
        return stats

    def _save_due_by_time(self) -> bool:
        minutes = self.cfg.save_every_minutes
        return minutes is not None and time.monotonic() - self._last_save >= minutes * 60.0

    def _check(self, window: StepWindow, bar: ProgressBar, log_now: bool = False) -> Reading:
        """Read the window and the flags (one wait for the device), stop on divergence, and log when a log step
        has come (or ``log_now``: the steps since the last log line would be lost to the log otherwise)."""
        late = self.horizon.out_of_time(self.train_seconds)
        reading = window.read(interrupt=self._interrupt_requested, late=late, save_due=self._save_due_by_time(),
                              world_size=self.dist.world_size)
        reading.raise_if_diverged(self.step, window.first_step, self.checkpoints.last_path)
        if (log_now or self.step % self.cfg.log_every_steps == 0) and reading.tokens > 0:
            self._log(reading, window, bar)
        return reading

    def _log(self, reading: Reading, window: StepWindow, bar: ProgressBar) -> None:
        """Log the window (rank 0) and start a new one."""
        if self.dist.is_main:
            lr = float(self.optimizer.param_groups[0]["lr"])  # a device tensor with CUDA graphs
            values = reading.log_values(time.perf_counter() - window.started, lr)
            self.tracker.scalars(values, self.step, prefix="train")
            bar.update(0, loss=values["loss"], tokens_per_s=values["tokens_per_s"])
            log.info("epoch %d step %d: loss %.4f ppl %.2f lr %.3g grad_norm %.3f %.0f tok/s", self.epoch + 1,
                     self.step, values["loss"], values["ppl"], lr, values["grad_norm"], values["tokens_per_s"])
        window.reset(self.step)

    # ---------------------------------------------------------------------------------------------
    # Validation, early stopping, interrupts
    # ---------------------------------------------------------------------------------------------

    def _validate_and_save(self, final: bool = False) -> bool:
        """Validate (rank 0), update best/patience, save; True when patience is exhausted."""
        metrics: dict[str, float] | None = None
        if self.dist.is_main:
            self.model.eval()
            with torch.no_grad():
                metrics = {k: float(v) for k, v in self.validate(self.model, self.step).items()}
            self.model.train()
        metrics = distributed.broadcast_object(metrics)
        if "bleu" not in metrics:
            raise KeyError(f"validate() must return a 'bleu' entry; it returned keys {sorted(metrics)}")
        if "loss" in metrics and "ppl" not in metrics:
            metrics["ppl"] = perplexity(metrics["loss"], n_tokens=1)  # the loss is already per token
        is_best, exhausted = self.horizon.validated(metrics["bleu"], self.step)
        self.state.last_valid_step, self.state.last_metrics = self.step, metrics
        self.tracker.scalars(metrics, self.step, prefix="valid")
        self.tracker.scalar(TRAIN_MINUTES, self.train_seconds / 60.0, self.step)  # the curves' clock (app.curves)
        if not final:  # the final validation comes after training: its checkpoint keeps the schedule trained with
            self._project_time_limit()
        if self.dist.is_main:
            shown = " ".join(f"{k} {v:.4g}" for k, v in sorted(metrics.items()))
            stopping = self.horizon.early_stopping
            log.info("step %d validation: %s (best bleu %.2f at step %s)", self.step, shown, stopping.best_bleu,
                     stopping.best_step)
        self.save_now("final" if final else "validation", is_best=is_best)
        return exhausted

    def _project_time_limit(self) -> None:
        """Project where ``max_minutes`` runs out at this call's pace so far, validations included. Collective under
        DDP: rank 0's projection is broadcast, so every rank trains the same schedule."""
        steps = self.step - self._first_step
        if self.cfg.max_minutes is None or steps == 0:  # the same on every rank: all or none broadcast
            return
        pace = steps / max(time.monotonic() - self._started, 1e-9)  # steps per second, validations included
        self.horizon.reproject(self.step, pace, self.train_seconds, self.dist.is_main)

    def request_interrupt(self, signum: int = signal.SIGINT) -> None:
        """Ask the loop to save ``last.pt`` after the current step and raise ``Interrupted`` for ``signum`` (SIGINT
        and SIGTERM do this)."""
        self._interrupt_requested, self._interrupt_signal = True, int(signum)

    def _on_sigint(self, signum: int) -> None:
        self.request_interrupt(signum)
        if not interrupted_a_write():  # said at once; else after the step
            self._say_interrupt()

    def _say_interrupt(self) -> None:
        if self.dist.is_main and not self._interrupt_said:
            log.warning("interrupt: saving last.pt after this step (interrupt again, a second or more later, to stop "
                        "at once without saving)")
        self._interrupt_said = True
