"""Training statistics between two log lines, kept on the device until the trainer reads them.

A step adds its statistics to the window without waiting for the device. A *read* (at the trainer's checks)
packs them with the host's stop and save flags into one tensor and sums it over the ranks: one device-to-host
wait, and under DDP one all-reduce, for everything the loop decides on. A read that finds a non-finite loss or
gradient norm stops training (:meth:`Reading.raise_if_diverged`).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from transformer.inference.metrics import perplexity
from transformer.training import distributed


class TrainingDiverged(RuntimeError):
    """The loss or gradient norm became NaN/inf; the last good checkpoint was left untouched."""


@dataclass
class Reading:
    """What a read found, summed over ranks: the window's statistics and the stop/save flags."""

    loss_sum: float
    nll_sum: float
    nonfinite_steps: float
    grad_norm: float  # the window's last step's
    tokens: float
    interrupt: bool  # some rank was asked to stop (Ctrl-C)
    late: bool  # some rank is past training.max_minutes
    save_due: bool  # some rank's training.save_every_minutes has come

    def raise_if_diverged(self, step: int, first_step: int, last_good: Path) -> None:
        """Raise ``TrainingDiverged`` if a step of the window (``first_step`` to ``step``) had a non-finite loss or
        gradient norm; the trainer skipped those updates and ``last_good`` was not overwritten."""
        if self.nonfinite_steps > 0 or not math.isfinite(self.loss_sum):
            kept = (f"the last good checkpoint ({last_good}) was not overwritten" if last_good.exists() else
                    "no checkpoint was written (none had been yet)")
            raise TrainingDiverged(
                f"step {step}: loss per token {self.loss_sum / max(self.tokens, 1.0)}, gradient norm {self.grad_norm}, "
                f"{self.nonfinite_steps:.0f} non-finite step(s) since step {first_step}; stopping. Their updates were "
                f"skipped and {kept}; lower training.lr, raise training.warmup_steps or set training.clip_grad_norm.")

    def log_values(self, seconds: float, lr: float) -> dict[str, float]:
        """The scalars a log line and TensorBoard show for a window that lasted ``seconds``."""
        return {
            "loss": self.loss_sum / self.tokens,
            "nll": self.nll_sum / self.tokens,
            "ppl": perplexity(self.nll_sum, self.tokens),
            "lr": lr,
            "grad_norm": self.grad_norm,
            "tokens_per_s": self.tokens / max(seconds, 1e-9),
        }


@dataclass
class StepWindow:
    """The steps since the last log line; ``sums`` stays on the device until :meth:`read`."""

    sums: torch.Tensor  # (4,): loss sum, NLL sum, non-finite steps, last gradient norm
    tokens: float = 0.0  # this rank's target tokens
    first_step: int = 1
    started: float = field(default_factory=time.perf_counter)

    def add(self, stats: torch.Tensor, tokens: int) -> None:
        """Add one step's (loss sum, NLL sum, non-finite flag, gradient norm) and its token count."""
        self.sums[:3] += stats[:3]
        self.sums[3] = stats[3]
        self.tokens += tokens

    def reset(self, step: int) -> None:
        """Start a new window after ``step``."""
        self.sums.zero_()
        self.tokens, self.first_step, self.started = 0.0, step + 1, time.perf_counter()

    def read(self, *, interrupt: bool, late: bool, save_due: bool, world_size: int) -> Reading:
        """The window and this rank's flags, summed over ranks (waits for the device)."""
        flags = torch.tensor([float(interrupt), float(late), float(save_due), self.tokens], device=self.sums.device)
        loss_sum, nll_sum, nonfinite, norm, interrupt_n, late_n, save_n, tokens = \
            distributed.all_reduce_sum(torch.cat([self.sums, flags])).tolist()
        return Reading(loss_sum, nll_sum, nonfinite, norm / world_size,  # the norm is the same on every rank
                       tokens, interrupt_n > 0, late_n > 0, save_n > 0)
