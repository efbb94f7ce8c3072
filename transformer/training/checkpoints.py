"""Writing a run's checkpoints: atomic saves, the ``checkpoints/`` folder's rotation, averaging, and the weights a
finished run keeps. (What a checkpoint holds, a run directory's layout and reading: :mod:`transformer.checkpoint`.)
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from transformer.checkpoint import (
    BEST_FILE,
    CHECKPOINT_VERSION,
    DIGEST_KEY,
    FINAL_FILE,
    LAST_FILE,
    STEP_FILE,
    TENSORS_ONLY,
    WHOLE_DIGEST_KEY,
    CheckpointError,
    check_plain,
    load_checkpoint,
    state_digest,
)
from transformer.files import atomic_write, fsync_directory, link_atomically

log = logging.getLogger(__name__)


def save_checkpoint(state: dict, path: str | Path) -> None:
    """Write ``state`` (plus ``version`` and the ``digest`` of all of it) to ``path`` atomically.

    The data goes to a temporary file in the same directory, is flushed and fsynced, and then renamed over
    ``path`` with ``os.replace``; a crash at any point leaves either the old file or the new one, never a
    torn file, and the temporary file is removed on error.
    """
    path = Path(path)
    state = {**state, "version": CHECKPOINT_VERSION}
    check_plain(state)
    state[DIGEST_KEY], state[WHOLE_DIGEST_KEY] = state_digest(state, TENSORS_ONLY), state_digest(state)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_write(path) as handle:
        torch.save(state, handle)


class CheckpointManager:
    """Checkpoint files of one run's ``checkpoints/`` folder: ``last.pt``, ``best.pt`` and rotated ``step_{N}.pt``.

    ``save`` writes ``step_{N}.pt`` once and points ``last.pt`` (and ``best.pt`` when ``is_best``) at the
    same bytes via hard links, so a save costs one write. Only the newest ``keep_last`` step files are kept.
    """

    def __init__(self, directory: str | Path, keep_last: int) -> None:
        if keep_last < 1:
            raise ValueError(f"keep_last must be >= 1, got {keep_last}")
        self.directory = Path(directory)
        self.keep_last = keep_last

    @property
    def last_path(self) -> Path:
        return self.directory / LAST_FILE

    @property
    def best_path(self) -> Path:
        return self.directory / BEST_FILE

    def save(self, state: dict, step: int, *, is_best: bool, periodic: bool = True) -> Path:
        """Write ``state`` as the latest checkpoint; return the path written.

        Args:
            state: the checkpoint dict.
            step: completed optimizer steps (names the rotated file).
            is_best: also make it ``best.pt``.
            periodic: keep a ``step_{N}.pt`` copy in the rotation (False: only ``last.pt``/``best.pt``).
        """
        if periodic:
            written = self.directory / f"step_{step}.pt"
            save_checkpoint(state, written)
            link_atomically(written, self.last_path)
            self._rotate()
        else:
            written = self.last_path
            save_checkpoint(state, written)
        if is_best:
            link_atomically(written, self.best_path)
        fsync_directory(self.directory)
        return written

    def step_paths(self) -> list[Path]:
        """The rotated ``step_{N}.pt`` files, oldest first."""
        if not self.directory.is_dir():
            return []
        found = [(int(m.group(1)), p) for p in self.directory.iterdir() if (m := STEP_FILE.match(p.name))]
        return [p for _, p in sorted(found)]

    def recent(self, n: int) -> list[Path]:
        """The newest ``n`` rotated step files, oldest first (fewer if fewer exist; keep_last caps them)."""
        if n < 1:
            raise ValueError(f"recent() needs n >= 1, got {n}")
        return self.step_paths()[-n:]

    def latest(self) -> Path | None:
        """``last.pt`` if it exists."""
        return self.last_path if self.last_path.is_file() else None

    def mark_best(self, path: Path) -> None:
        """Make ``best.pt`` the checkpoint ``path`` (one of this folder's)."""
        link_atomically(path, self.best_path)
        fsync_directory(self.directory)

    def mark_last(self, path: Path) -> None:
        """Make ``last.pt`` the checkpoint ``path`` (one of this folder's)."""
        link_atomically(path, self.last_path)
        fsync_directory(self.directory)

    def set_aside_after(self, step: int) -> Path | None:
        """Move every checkpoint of a step after ``step`` (rotated, ``last.pt``, ``best.pt``, ``final.pt``) into
        ``abandoned_after_step_{step}/``: what resuming from an earlier checkpoint than the run's last does, so
        that rotation, averaging and ``best.pt`` see the resumed history only. Nothing is deleted. Returns the
        folder, or None when no checkpoint is newer than ``step``."""
        later = [path for path in self.step_paths() if int(STEP_FILE.match(path.name).group(1)) > step]
        for name in (LAST_FILE, BEST_FILE, FINAL_FILE):
            path = self.directory / name
            if not path.is_file():
                continue
            try:
                if int(load_checkpoint(path, mmap=True, verify=False)["step"]) > step:
                    later.append(path)
            except CheckpointError as error:  # e.g. a torn last.pt: kept, with the history it may belong to
                log.warning("%s; set aside with the checkpoints after step %d", error, step)
                later.append(path)
        if not later:
            return None
        folder = self.directory / f"abandoned_after_step_{step}"
        n = 1
        while folder.exists():  # an earlier resume from the same step abandoned another history
            n += 1
            folder = self.directory / f"abandoned_after_step_{step}.{n}"
        folder.mkdir()
        for path in later:
            os.replace(path, folder / path.name)
        fsync_directory(self.directory)
        return folder

    def _rotate(self) -> None:
        paths = self.step_paths()
        for stale in paths[: max(len(paths) - self.keep_last, 0)]:
            stale.unlink(missing_ok=True)


def average_checkpoints(paths: Sequence[str | Path]) -> dict[str, torch.Tensor]:
    """Element-wise mean of the ``model`` state dicts of several checkpoints.

    Floating-point tensors are averaged (accumulated in float64, returned in their own dtype); other
    tensors (integer buffers) are taken from the last checkpoint. All checkpoints must hold the same keys
    and shapes.
    """
    if not paths:
        raise ValueError("average_checkpoints needs at least one checkpoint path")
    for i, later in enumerate(paths):  # a run's best.pt and last.pt are links to its step files: count each once
        if (same := next((p for p in paths[:i] if os.path.samefile(p, later)), None)) is not None:
            raise CheckpointError(f"{later} is the same file as {same} (a run's best.pt and last.pt are links to "
                                  "its step_N.pt files): name each checkpoint once")
    total: dict[str, torch.Tensor] = {}
    reference: dict[str, torch.Tensor] = {}
    first = Path(paths[0])
    for path in paths:
        model = load_checkpoint(path)["model"]
        if reference and model.keys() != reference.keys():
            differing = sorted(set(model) ^ set(reference))
            raise CheckpointError(f"{path}: parameters differ from {first}: {differing[:5]}")
        for key, tensor in model.items():
            if reference and tensor.shape != reference[key].shape:
                raise CheckpointError(
                    f"{path}: {key} has shape {tuple(tensor.shape)}, {first} has {tuple(reference[key].shape)}"
                )
            if tensor.is_floating_point():
                total[key] = total[key] + tensor.double() if key in total else tensor.double()
        reference = model
    return {
        key: (total[key] / len(paths)).to(tensor.dtype) if tensor.is_floating_point() else tensor
        for key, tensor in reference.items()
    }


def save_model(weights: dict[str, torch.Tensor], like: dict, path: str | Path, source: str | None = None) -> None:
    """Write model weights with the metadata of checkpoint ``like`` (config, model config, tokenizers, step)
    but no training state: what ``final.pt`` and ``transformer-average`` write; ``source`` says where the
    weights came from."""
    state = {key: like[key] for key in ("config", "model_config", "tokenizers", "step") if key in like}
    save_checkpoint({**state, "model": weights, **({"source": source} if source is not None else {})}, path)


# --------------------------------------------------------------------------------------------------
# The weights a finished run keeps
# --------------------------------------------------------------------------------------------------


@dataclass
class FinalWeights:
    """The weights chosen for the final model, where they came from and their validation BLEU."""

    weights: dict[str, torch.Tensor]
    source: str  # "best (step N)" or "average of the last K checkpoints"
    valid_bleu: float


def choose_final_weights(folder: str | Path, average_last: int,
                         validate: Callable[[dict[str, torch.Tensor]], float]) -> FinalWeights:
    """``best.pt``, or the average of the newest ``average_last`` step checkpoints when that validates higher.

    Averaging the last checkpoints usually gains a little BLEU (Vaswani et al., 2017, §6.1), but not on
    every run, so it is kept only when its validation BLEU beats the best checkpoint's (ties: best). Both are
    scored by ``validate``, not by the BLEU that made ``best.pt`` best: that one comes from greedy decoding during
    training, and its highest epoch is often a noisy peak that the search the test set is decoded with does not
    confirm (docs/RESULTS.md).

    Args:
        folder: a run's ``checkpoints/`` folder.
        average_last: ``training.average_last`` (0 or 1: best only).
        validate: state dict -> validation BLEU; called on the best and then on the averaged weights, so the
            returned ``valid_bleu`` is always ``validate``'s.
    """
    best = load_checkpoint(Path(folder) / BEST_FILE, map_location="cpu")
    chosen = FinalWeights(best["model"], f"best (step {best['step']})", float(validate(best["model"])))
    paths = CheckpointManager(folder, keep_last=max(average_last, 1)).recent(average_last) if average_last > 1 else []
    if len(paths) < 2:
        return chosen
    weights = average_checkpoints(paths)
    averaged = FinalWeights(weights, f"average of the last {len(paths)} checkpoints", float(validate(weights)))
    log.info("validation BLEU: best checkpoint %.2f, %s %.2f", chosen.valid_bleu, averaged.source, averaged.valid_bleu)
    return averaged if averaged.valid_bleu > chosen.valid_bleu else chosen
