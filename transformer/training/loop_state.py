"""Where the training loop is: the part of a checkpoint that says how far a run has come."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


def mid_epoch(sampler_state: dict[str, Any]) -> bool:
    """Whether a sampler state lies inside an epoch: some of its batches trained, not all (a state without
    ``batches``, written before version 0.9.3, counts as inside once it has begun)."""
    return 0 < sampler_state.get("position", 0) < sampler_state.get("batches", float("inf"))


@dataclass
class LoopState:
    """The loop's position; with the horizon's state, the model, the optimizer and the RNGs, what an exact resume
    needs."""

    step: int = 0  # optimizer steps completed
    epoch: int = 0  # epoch in progress (0-based)
    sampler: dict[str, Any] = field(default_factory=dict)  # the sampler's state as of the last batch trained on
    last_valid_step: int | None = None
    last_metrics: dict[str, float] = field(default_factory=dict)  # the latest validation's
    seconds_before: float = 0.0  # training time of the run's earlier fit calls (resumed runs)

    @property
    def epochs_done(self) -> int:
        """Epochs trained whole: ``epoch``, and the one in progress where its last step is done."""
        return self.epoch + (self.sampler.get("position", 0) > 0 and not mid_epoch(self.sampler))

    def state_dict(self, train_seconds: float) -> dict[str, Any]:
        """The checkpoint keys of the loop; ``train_seconds``: the run's training time up to now."""
        return {"step": self.step, "epoch": self.epoch, "sampler": dict(self.sampler),
                "last_valid_step": self.last_valid_step, "last_metrics": dict(self.last_metrics),
                "train_seconds": train_seconds}

    @classmethod
    def from_checkpoint(cls, checkpoint: dict[str, Any]) -> LoopState:
        """The loop state a checkpoint was written at (``last_metrics`` and ``train_seconds`` came later: optional)."""
        return cls(step=int(checkpoint["step"]), epoch=int(checkpoint["epoch"]), sampler=dict(checkpoint["sampler"]),
                   last_valid_step=checkpoint["last_valid_step"],
                   last_metrics=dict(checkpoint.get("last_metrics", {})),
                   seconds_before=float(checkpoint.get("train_seconds", 0.0)))
