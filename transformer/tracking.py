"""TensorBoard logging and a progress bar, both active on rank 0 only.

Scalar names, one scheme for the whole project (``split/metric``):

    train/loss  train/nll  train/ppl  train/lr  train/grad_norm  train/tokens_per_s (target tokens, all ranks)
    train/minutes (at each validation: minutes of training so far, resumed runs' earlier calls included)
    valid/loss  valid/ppl  valid/bleu  valid/chrf  (and any other key ``validate`` returns)
    test/bleu   test/chrf  ...

A disabled tracker accepts every call and does nothing, so callers never branch on the rank.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
from torch.utils.tensorboard import SummaryWriter
from tqdm import tqdm

TRAIN_MINUTES = "train/minutes"


class Tracker:
    """A thin wrapper around ``SummaryWriter`` that is a no-op when ``enabled`` is false."""

    def __init__(self, log_dir: str | Path, enabled: bool) -> None:
        self.log_dir = Path(log_dir)
        self.enabled = enabled
        self._writer = SummaryWriter(log_dir=str(self.log_dir)) if enabled else None

    @property
    def writer(self) -> SummaryWriter | None:
        """The underlying writer (``None`` when disabled), for helpers such as attention-map logging."""
        return self._writer

    def scalar(self, tag: str, value: float, step: int) -> None:
        if self._writer is not None:
            self._writer.add_scalar(tag, value, step)

    def scalars(self, values: dict[str, float], step: int, *, prefix: str = "") -> None:
        """Log ``{name: value}``; tags are ``prefix/name`` when a prefix is given, else the names themselves."""
        for name, value in values.items():
            self.scalar(f"{prefix}/{name}" if prefix else name, float(value), step)

    def text(self, tag: str, text: str, step: int) -> None:
        if self._writer is not None:
            self._writer.add_text(tag, text, step)

    def image(self, tag: str, image: np.ndarray, step: int) -> None:
        """Log an (height, width, channels) uint8 or [0, 1] float image."""
        if self._writer is not None:
            self._writer.add_image(tag, image, step, dataformats="HWC")

    def hparams(self, hparams: dict[str, Any], metrics: dict[str, float]) -> None:
        """Log a run's hyper-parameters with its final metrics (TensorBoard's HPARAMS tab).

        Values that are not bool/int/float/str (None, lists) are logged as their string form.
        """
        if self._writer is None:
            return
        clean = {k: v if isinstance(v, (bool, int, float, str)) else str(v) for k, v in hparams.items()}
        self._writer.add_hparams(clean, {k: float(v) for k, v in metrics.items()}, run_name=".")

    def flush(self) -> None:
        if self._writer is not None:
            self._writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


class ProgressBar:
    """A tqdm bar over optimizer steps showing loss and tokens/s; does nothing when disabled.

    Shown only when stderr is a terminal: redrawn bars would fill a redirected log with carriage returns.
    """

    def __init__(self, total: int | None, *, enabled: bool, desc: str = "train") -> None:
        enabled = enabled and sys.stderr.isatty()
        self._bar = tqdm(total=total, desc=desc, dynamic_ncols=True, leave=False) if enabled else None

    def update(self, n: int = 1, *, loss: float | None = None, tokens_per_s: float | None = None) -> None:
        if self._bar is None:
            return
        postfix = {}
        if loss is not None:
            postfix["loss"] = f"{loss:.3f}"
        if tokens_per_s is not None:
            postfix["tok/s"] = f"{tokens_per_s:,.0f}"
        if postfix:
            self._bar.set_postfix(postfix, refresh=False)
        self._bar.update(n)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
