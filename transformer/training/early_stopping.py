"""Early stopping on validation BLEU: the best score so far, the step that reached it, and how many validations
have passed without a gain since. Its state travels in every checkpoint (``best_bleu``, ``best_step``,
``bad_validations``), so a resumed run stops exactly where an uninterrupted one would."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class EarlyStopping:
    """Validation bookkeeping of one run. ``patience``: validations in a row without a gain before stopping
    (None: never stop early)."""

    patience: int | None
    best_bleu: float | None = None
    best_step: int | None = None
    bad_validations: int = 0

    def update(self, bleu: float, step: int) -> bool:
        """Record the validation at ``step``; True when it is the best so far (equalling the best is no gain)."""
        if self.best_bleu is None or bleu > self.best_bleu:
            self.best_bleu, self.best_step, self.bad_validations = bleu, step, 0
            return True
        self.bad_validations += 1
        return False

    @property
    def exhausted(self) -> bool:
        """``patience`` validations in a row have brought no gain."""
        return self.patience is not None and self.bad_validations >= self.patience

    def state_dict(self) -> dict[str, Any]:
        return {"best_bleu": self.best_bleu, "best_step": self.best_step, "bad_validations": self.bad_validations}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.best_bleu, self.best_step = state["best_bleu"], state["best_step"]
        self.bad_validations = int(state["bad_validations"])
