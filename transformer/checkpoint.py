"""What a checkpoint is and where a run keeps it: the format, ``weights_only`` loads and a run directory's layout.

A checkpoint is a plain dict. The trainer writes these keys (``TRAINER_KEYS``):

    version          CHECKPOINT_VERSION
    model            state dict of the unwrapped model (no ``module.``/``_orig_mod.`` prefixes)
    optimizer        optimizer state dict
    step, epoch      completed optimizer steps; epoch in progress (0-based)
    sampler          the batch sampler's state dict (epoch, position, batches) for exact mid-epoch resume
    rng              list with one capture_rng_state() dict per rank
    best_bleu, best_step, bad_validations, last_valid_step   early-stopping bookkeeping
    last_metrics     the latest validation's metrics (optional: older checkpoints lack it)
    train_seconds    seconds spent in ``Trainer.fit`` up to this checkpoint, resumed runs summed (optional)
    epoch_steps      optimizer steps in the run's first epoch: the cosine schedule's unit (optional)
    schedule_steps   the step at which the cosine schedule reaches its floor (optional)
    time_limit       with ``training.max_minutes``: {"minutes", "step"}, the step at which that limit runs out, as
                     last projected from the pace of training (optional; None before the first projection)
    reason           why it was written ("validation", "interrupt", "final", ...)
    digest           "sha256:<hex>" of every tensor in the checkpoint (:func:`state_digest`), written by
                     ``save_checkpoint`` and verified by :func:`load_checkpoint` (checkpoints before 0.9 lack it)
    digest_all       "sha256-all:<hex>" of everything in it, the config and tokenizers too (since 0.9.4)

plus whatever the caller adds (resolved config, model config, tokenizer states) at the top level. Every
value must be loadable by ``torch.load(weights_only=True)``: tensors, str, int, float, bool, None and
lists/tuples/dicts of them. :func:`check_plain` checks this before a write so a bad value (an Enum, a Path) fails
at save time naming its key, not at resume time.

Also here: the layout of a run directory (:class:`RunDir`, the one place its file names are spelled). Writing,
rotating and averaging checkpoints is :mod:`transformer.training.checkpoints`; whether a config may resume one is
:mod:`transformer.training.resume`.
"""

from __future__ import annotations

import hashlib
import logging
import re
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

from transformer.overrides import override_value

CHECKPOINT_VERSION = 1
TRAINER_KEYS = frozenset({
    "version", "model", "optimizer", "step", "epoch", "sampler", "rng", "best_bleu", "best_step",
    "bad_validations", "last_valid_step", "last_metrics", "train_seconds", "epoch_steps",
    "schedule_steps", "time_limit", "reason", "digest", "digest_all",
})
# Keys a resume can do without: informational, or added after the first checkpoints were written.
OPTIONAL_TRAINER_KEYS = frozenset({"version", "reason", "last_metrics", "train_seconds", "epoch_steps",
                                   "schedule_steps", "time_limit", "digest", "digest_all"})
_PLAIN = (str, int, float, bool, type(None), torch.Tensor)
STEP_FILE = re.compile(r"^step_(\d+)\.pt$")
BEST_FILE = "best.pt"  # the checkpoint with the highest validation BLEU
LAST_FILE = "last.pt"  # the newest checkpoint: what a resume continues from
FINAL_FILE = "final.pt"  # the model the test score belongs to: best, or the average of the last N
DIGEST_KEY = "digest"  # of the tensors: what versions 0.9 to 0.9.3 verify, so they still read newer checkpoints
WHOLE_DIGEST_KEY = "digest_all"  # of everything else too (since 0.9.4)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunDir:
    """The layout of one training run directory; its file names are spelled here (but for the checks that run
    before torch is imported, in ``app.before_hydra``, and the lock of :mod:`transformer.training.run_lock`).

    ``train.log`` is Hydra's job log (``hydra.job.name`` is ``train``); a resumed run appends to it.
    """

    root: Path

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def best(self) -> Path:
        return self.checkpoints / BEST_FILE

    @property
    def last(self) -> Path:
        return self.checkpoints / LAST_FILE

    @property
    def final(self) -> Path:
        return self.checkpoints / FINAL_FILE

    @property
    def tensorboard(self) -> Path:
        return self.root / "tensorboard"

    @property
    def metrics(self) -> Path:
        return self.root / "metrics.json"

    @property
    def test_hypotheses(self) -> Path:
        return self.root / "test.hyp.txt"

    @property
    def log_file(self) -> Path:
        return self.root / "train.log"


class CheckpointError(ValueError):
    """A checkpoint cannot be written or read; the message names the file (and key)."""


def check_plain(value: object, key: str = "state") -> None:
    """Raise :class:`CheckpointError` naming the first value ``weights_only`` loading would reject."""
    if isinstance(value, _PLAIN):
        return
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, (str, int)):
                raise CheckpointError(f"{key}: key {k!r} of type {type(k).__name__} is not str or int")
            check_plain(v, f"{key}.{k}")
        return
    if isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            check_plain(v, f"{key}[{i}]")
        return
    raise CheckpointError(
        f"{key}: a {type(value).__name__} cannot be stored in a weights_only checkpoint; "
        "convert it to plain types first (Enum -> .value, Path -> str, dataclass -> dict)"
    )


TENSORS_ONLY, WHOLE_STATE = "sha256:", "sha256-all:"  # the digest's scheme, the prefix of its value


def state_digest(state: object, scheme: str = WHOLE_STATE) -> str:
    """``<scheme><hex>``: SHA-256 over every tensor of ``state`` (nested dicts, lists, tuples), with its place,
    dtype and shape, and with ``WHOLE_STATE`` over every other value too (the config, the tokenizers' words, the
    counters), in a fixed order; the digests' own keys are left out. torch's zip reader checks no CRC, so this is
    what catches flipped or zeroed bytes inside a checkpoint."""
    digest = hashlib.sha256()

    def walk(value: object, where: str) -> None:
        if isinstance(value, torch.Tensor):
            tensor = value.detach().cpu().contiguous()
            digest.update(f"{where}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
            digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
        elif isinstance(value, (str, int, float, bool, type(None))):
            if scheme == WHOLE_STATE:  # repr: exact for floats, tells 1 from 1.0 from True from "1", escapes all
                digest.update(f"{where}|{type(value).__name__}|{value!r}|".encode())
        elif isinstance(value, dict):
            for key in sorted(value, key=lambda k: (type(k).__name__, k)):
                if not (where == "" and key in (DIGEST_KEY, WHOLE_DIGEST_KEY)):
                    walk(value[key], f"{where}/{key}")
        elif isinstance(value, (list, tuple)):
            for i, item in enumerate(value):
                walk(item, f"{where}[{i}]")

    walk(state, "")
    return f"{scheme}{digest.hexdigest()}"


def _earlier_checkpoint(path: Path) -> Path | None:
    """The newest ``step_N.pt`` beside ``path`` that is not the same file (``last.pt`` is a link to one)."""
    steps = []
    for other in path.parent.glob("step_*.pt"):
        match = STEP_FILE.match(other.name)
        if match and other.is_file() and not other.samefile(path):
            steps.append((int(match.group(1)), other))
    if STEP_FILE.match(path.name):  # an earlier step, not a later one
        steps = [(n, p) for n, p in steps if n < int(STEP_FILE.match(path.name).group(1))]
    return max(steps)[1] if steps else None


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu", *, mmap: bool = False,
                    verify: bool = True, retry_key: str | None = "resume") -> dict:
    """Read a checkpoint written by :func:`transformer.training.checkpoints.save_checkpoint` with ``torch.load(weights_only=True)`` (``mmap``: its
    tensors mapped from the file, read only when used).

    ``verify`` recomputes the digest and compares it with the stored one. That reads every tensor: about a
    tenth of a second per 100 MB on this project's CPU, and with ``mmap`` it pages the whole file in; callers that
    read only metadata from a mapped checkpoint pass ``verify=False``. A checkpoint without a digest (written
    before version 0.9) loads with a warning. The error for a damaged file names the run's newest earlier step file,
    as the value of ``retry_key`` (the key of the command that reads it: ``resume`` to train on, ``checkpoint`` to
    evaluate or translate) when one is given.

    Raises:
        FileNotFoundError: no file at ``path``.
        CheckpointError: truncated/corrupt file, not a checkpoint dict, a different format version, or tensors
            that do not match the stored digest.
    """
    path = Path(path)
    if path.is_dir():
        run = path.parent if path.name == "checkpoints" else path
        raise CheckpointError(f"checkpoint {path} is a folder, not a checkpoint file: name a .pt file (e.g. "
                              f"{run}/checkpoints/final.pt), or give a run's folder as run_dir={run}")
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    try:
        with warnings.catch_warnings():  # a foreign pickle's protocol warning says nothing the error does not
            warnings.simplefilter("ignore")
            state = torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except Exception as exc:  # torch raises RuntimeError/UnpicklingError/EOFError/KeyError for torn or foreign files
        earlier = _earlier_checkpoint(path) if STEP_FILE.match(path.name) or path.name == LAST_FILE else None
        raise CheckpointError(f"{path}: not a readable checkpoint (truncated or not a torch file): "
                              f"{_load_failure(path, exc)}{_way_back(path, earlier, retry_key, '')}") from exc
    if not isinstance(state, dict) or "version" not in state:
        raise CheckpointError(f"{path}: not a checkpoint of this project (no 'version' key)")
    if state["version"] != CHECKPOINT_VERSION:
        raise CheckpointError(
            f"{path}: checkpoint format version {state['version']}, this code reads version {CHECKPOINT_VERSION}"
        )
    if verify:
        _verify(path, state, retry_key)
    return state


def _way_back(path: Path, earlier: Path | None, retry_key: str | None, otherwise: str) -> str:
    """The end of a damaged checkpoint's error: the run's earlier checkpoint to use instead, if it has one. Beside
    a damaged ``last.pt`` that is its own file (not a link to a step file) the newest step file may hold the same
    step: it is named the newest step checkpoint, not an earlier one."""
    if earlier is None:
        return otherwise
    own_file = path.name == LAST_FILE and not any(other.samefile(path) for other in path.parent.glob("step_*.pt"))
    which = "the newest step checkpoint" if own_file else "an earlier checkpoint"
    return f"; {earlier} is {which} of the same run" + (f" ({retry_key}={override_value(earlier)})" if retry_key else "")


def _load_failure(path: Path, exc: Exception) -> str:
    """The cause of a failed ``torch.load`` of ``path`` in one line. A file that is empty or not in a format
    ``torch.save`` writes (a zip archive, or an old-style pickle) is said to be so: torch's own error for it names
    a pickle opcode (``KeyError: 101``). For a foreign pickle PyTorch's message is a paragraph whose advice (load
    with ``weights_only=False``) would run the file's code: only its reason is kept."""
    try:
        with open(path, "rb") as file:
            head = file.read(24)
    except OSError as error:  # not readable at all (permissions): the reason is the error itself
        return f"{type(error).__name__}: {error.strerror}"
    if not head:
        return "the file is empty"
    if not head.startswith((b"PK\x03\x04", b"\x80")):  # torch.save's zip archive; a legacy pickle's PROTO opcode
        start = head.decode("utf-8", errors="replace").split("\n")[0]
        return f"not a file torch.save writes: it begins {start!r}" if start.isprintable() else \
            f"not a file torch.save writes: it begins with the bytes {head[:8].hex(' ')}"
    text = str(exc)
    if "central directory" in text:  # torch.save's zip archive ends in its directory, which a cut file lacks
        return "its end is missing (the file was cut short while being written or copied)"
    reason = re.search(r"WeightsUnpickler error:\s*(.+?)\s*(?:\n\n|$)", text, flags=re.S)
    if reason is not None:
        return f"holds what a weights-only load refuses ({reason[1].splitlines()[0]})"
    lines = [line for line in text.splitlines() if line.strip()]
    first = lines[0].split(". ")[0] if lines else ""
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def _verify(path: Path, state: dict, retry_key: str | None) -> None:
    stored = state.get(DIGEST_KEY)
    if stored is None:
        log.warning("%s: written before checkpoints carried a digest of their tensors; loaded unverified", path)
        return
    whole = state.get(WHOLE_DIGEST_KEY)  # before 0.9.4: none
    if state_digest(state, TENSORS_ONLY) != stored or (whole is not None and state_digest(state) != whole):
        way_back = _way_back(path, _earlier_checkpoint(path), retry_key, "; train again or restore it from a copy")
        raise CheckpointError(f"{path}: corrupt: its contents do not match the digest written with them (a damaged "
                              f"disk or copy){way_back}")


