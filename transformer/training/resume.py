"""Resuming a run: which config may continue which checkpoint, and the recipe the run was started with.

``resume=RUN`` continues a run exactly where it stopped: the same model and the same batches in the same order.
Keys that decide those must match the checkpoint's (:data:`RESUME_MUST_MATCH`, refused by name otherwise); keys
that change only the optimisation from the resumed step on may differ, with a warning (:data:`RESUME_WARN`). An
epoch begun by one number of processes is finished only by the same number (:func:`check_process_count`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from transformer.checkpoint import OPTIONAL_TRAINER_KEYS, TRAINER_KEYS, CheckpointError, RunDir, load_checkpoint
from transformer.config import ConfigError, DataConfig, ModelConfig, flatten, to_plain_dict
from transformer.overrides import override_value
from transformer.training.checkpoints import CheckpointManager
from transformer.training.distributed import DistContext, broadcast_object
from transformer.training.loop_state import mid_epoch

log = logging.getLogger(__name__)


# Dotted keys (and their subtrees) a resumed run must share with its checkpoint: they shape the model or
# the batches, and the exact resume (the same batches in the same order) depends on every one of them.
RESUME_MUST_MATCH = (
    "model", "data.corpus", "data.dir", "data.src", "data.tgt", "data.train_split", "data.train_dir",
    "data.max_pairs", "data.max_len", "data.max_len_ratio", "data.tokenizer", "training.seed", "training.max_tokens",
    "training.accumulate", "training.pad_to_multiple", "training.bpe_dropout",
)
# Settings whose null meant "the device's default", resolved when a run starts, so no run saves them null: today
# ``pad_to_multiple``; ``max_tokens`` and ``accumulate`` in checkpoints from before they lost their null. A run that
# saved the null leaves its value unknown, so it is not compared.
DEVICE_DEFAULTS = ("training.pad_to_multiple", "training.max_tokens", "training.accumulate")
# Model settings read only when a run starts (GloVe vectors are copied in once, never on resume).
RESUME_INIT_ONLY = ("model.glove.path", "model.glove.rescale")
# Settings that change the optimisation (or when it stops) from the resumed step on, but not the batches: allowed,
# with a warning.
RESUME_WARN = (
    "training.lr", "training.warmup_steps", "training.schedule", "training.min_lr", "training.betas",
    "training.eps", "training.weight_decay", "training.label_smoothing", "training.clip_grad_norm",
    "training.precision", "training.r_drop", "training.cuda_graphs", "training.patience",
)


def _under(key: str, prefixes: Sequence[str]) -> bool:
    return any(key == prefix or key.startswith(prefix + ".") for prefix in prefixes)


def check_resume_config(saved: dict[str, Any], current: dict[str, Any], path: str | Path, *,
                        digest_checked: bool = False) -> None:
    """Refuse to resume checkpoint ``path`` with a config that would not continue it; warn where it changes
    the optimisation only.

    Args:
        saved: the resolved config stored in the checkpoint (``checkpoint["config"]``).
        current: this run's resolved config as plain values (``to_plain_dict(cfg)``).
        path: the checkpoint, for the messages.
        digest_checked: the checkpoint holds a digest of its training split, which :func:`check_training_split`
            compares once the split is encoded: then ``data.dir`` may name another folder (a corpus that moved),
            with a warning, since what is in it is checked.

    Raises:
        ConfigError: naming the first differing key of :data:`RESUME_MUST_MATCH`, both values and why, and the
            overrides that would continue the run as it was trained (every differing key of
            :data:`RESUME_MUST_MATCH` and :data:`RESUME_WARN`; e.g. a run of the defaults before version 0.2).
    """
    old, new = flatten(saved), flatten(current)
    # A model or data key the checkpoint lacks came after it was written: it was trained with that key's default.
    defaults = {**flatten(to_plain_dict(ModelConfig()), "model."), **flatten(to_plain_dict(DataConfig()), "data.")}
    old.update({key: defaults[key] for key in new.keys() - old.keys() if key in defaults})
    refused, changed = [], []
    for key in sorted(old.keys() & new.keys()):  # another key one side lacks (an older schema) is not compared
        if old[key] is None and key in DEVICE_DEFAULTS:
            continue  # an older run left the device's default unresolved: it is not known, so not compared
        if old[key] == new[key] or _under(key, RESUME_INIT_ONLY) or _same_folder(key, old[key], new[key]):
            continue
        if key == "data.dir" and digest_checked and None not in (old[key], new[key]):
            log.warning("data.dir: the checkpoint %s was trained on the corpus in %s, this run reads %s: it "
                        "continues if the training split there holds the same pairs (checked once it is encoded)",
                        path, old[key], new[key])
            continue
        if _under(key, RESUME_MUST_MATCH):
            refused.append(key)
        elif _under(key, RESUME_WARN):
            changed.append(key)
    if refused:
        key = refused[0]
        why = ("resume with the same model settings" if key.startswith("model.") else
               "resume with the same value: it changes the batches or how they form steps, so the run "
               "would not continue exactly where it stopped")
        as_trained = " ".join(f"{name}={override_value(old[name])}" for name in refused + changed)
        raise ConfigError(f"{key}: the checkpoint {path} was trained with {old[key]!r}, the config says "
                          f"{new[key]!r}; {why}. To continue it as it was trained, add: {as_trained}")
    for key in changed:
        if key == "training.cuda_graphs":  # the same update, run another way: not a change of the recipe
            log.warning("%s: the checkpoint %s was trained with %r, this run resolves %r (on one GPU the step is "
                        "replayed from CUDA graphs by default since version 0.8): the same updates up to rounding; "
                        "training.cuda_graphs=%s keeps the step as it was", key, path, old[key], new[key],
                        override_value(old[key]))
            continue
        log.warning("%s: the checkpoint %s was trained with %r, the config says %r; the resumed run uses "
                    "the new value (same batches, a different optimisation or stopping rule from here on)",
                    key, path, old[key], new[key])


def _same_folder(key: str, old: Any, new: Any) -> bool:
    """A corpus folder named relative and absolute (runs record it absolute since version 0.9.2)."""
    return key in ("data.dir", "data.train_dir") and None not in (old, new) and \
        Path(old).absolute() == Path(new).absolute()


def load_for_resume(target: str | Path, config: dict[str, Any]) -> tuple[dict, RunDir, Path]:
    """The checkpoint to continue, the run directory the resumed run writes into (the original one) and the
    checkpoint's file.

    Args:
        target: a run directory (its ``last.pt`` is used) or a checkpoint file inside ``checkpoints/``.
        config: this run's resolved config as plain values, checked by :func:`check_resume_config`.
    """
    run, path = _resume_paths(target)
    state = load_checkpoint(path, map_location="cpu")
    if "config" not in state:
        raise CheckpointError(f"{path}: holds no resolved config, so it cannot be checked for a resume")
    if "optimizer" not in state:
        raise CheckpointError(f"{path}: holds model weights only (no optimizer state), as final.pt and averaged "
                              f"checkpoints do; resume from {run.last} or the run directory {run.root}")
    check_resume_config(state["config"], config, path, digest_checked=state.get("train_digest") is not None)
    return state, run, path


def check_training_split(resumed: dict[str, Any], n_pairs: int, digest: str | None, data: DataConfig) -> None:
    """A resumed run's training split must be the one it trained on (checkpoints since version 0.8.2 hold its size,
    since 0.9.2 a digest of its encoded pairs): an epoch begun on other pairs cannot be finished as begun, so that
    is refused; at an epoch's end the run goes on, with a warning that it is no longer the uninterrupted run. A
    corpus read from another folder than the run's (``data.dir``: a corpus that moved) must hold the same pairs
    wherever the run stopped: other pairs there are another corpus, not an edited one."""
    saved, saved_digest = resumed.get("train_pairs"), resumed.get("train_digest")
    if saved is not None and saved != n_pairs:
        change = f"now has {n_pairs} pairs, the run trained on {saved}"
    elif None not in (saved_digest, digest) and saved_digest != digest:
        change = f"holds other pairs than the run trained on (as many: {n_pairs})"
    else:
        return
    files = f"{data.train_split}.{data.src} / {data.train_split}.{data.tgt}"
    trained_in = resumed.get("config", {}).get("data", {}).get("dir")
    if trained_in is not None and data.dir is not None and not _same_folder("data.dir", trained_in, data.dir):
        raise CheckpointError(
            f"resume: the training split ({files}) in data.dir={data.dir} {change}, in {trained_in}: a moved corpus "
            f"must hold the pairs the run trained on; name the run's own corpus, or start a new run on this one")
    if mid_epoch(resumed["sampler"]):
        raise CheckpointError(
            f"resume: the training split ({files}) {change}; the checkpoint was written in the middle of epoch "
            f"{resumed['epoch'] + 1}: the training files changed, so that epoch cannot be finished as it began; "
            "restore them, or resume from a checkpoint written at an epoch's end")
    log.warning("resume: the training split (%s) %s: the batches from here on are not those of the uninterrupted "
                "run", files, change)


def check_resumable(checkpoint: dict[str, Any], world_size: int) -> None:
    """Refuse what a trainer cannot continue: a checkpoint without the trainer's keys, or an epoch begun by another
    number of processes (:func:`check_process_count`)."""
    missing = sorted(TRAINER_KEYS - OPTIONAL_TRAINER_KEYS - set(checkpoint))
    if missing:
        raise CheckpointError(f"checkpoint lacks trainer keys {missing}; was it written by Trainer.save_now?")
    check_process_count(checkpoint, world_size)


def take_up_history(state: dict[str, Any], path: Path, checkpoints: CheckpointManager, dist: DistContext) -> None:
    """Make the resumed checkpoint ``state`` (the file ``path``) the run's history, on every process, as the last
    step before training goes on: after the last checks that can refuse the resume (:func:`check_resumable`), so
    that a refused resume leaves the run's checkpoints as they were. Rank 0 moves the checkpoints of later steps
    aside (:func:`abandon_later_history`); where the history's best checkpoint is gone, every process forgets the
    best record."""
    check_resumable(state, dist.world_size)
    if broadcast_object(abandon_later_history(checkpoints, state, path) if dist.is_main else None):
        state.update(best_bleu=None, best_step=None, bad_validations=0, last_valid_step=None)


def abandon_later_history(checkpoints: CheckpointManager, state: dict[str, Any], path: Path) -> bool:
    """Resuming from an earlier checkpoint than the run's newest abandons the steps after it: move their
    checkpoints aside (nothing is deleted), so that rotation, averaging and ``best.pt`` hold the resumed history
    only; point ``last.pt`` at the resumed checkpoint ``path`` (``state``'s file) and ``best.pt`` at that
    history's best checkpoint again. Call it on one process.

    Returns:
        Whether that best checkpoint is gone (rotated away since): the resumed state's best record must then
        be forgotten, and the next validation sets a new one.
    """
    step, best_step = int(state["step"]), state["best_step"]
    folder = checkpoints.set_aside_after(step)
    if folder is None:
        return False
    log.warning("resuming at step %d, before the run's newest checkpoints: those of later steps are moved to %s",
                step, folder)
    if not checkpoints.last_path.is_file():  # a run that stops before its next save still has a last.pt
        checkpoints.mark_last(path)
    if best_step is None or checkpoints.best_path.is_file():
        return False
    kept = checkpoints.directory / f"step_{best_step}.pt"
    if kept.is_file():
        checkpoints.mark_best(kept)
        return False
    log.warning("the resumed history's best checkpoint (step %d) was rotated away: the next validation sets a "
                "new best", best_step)
    return True


def check_process_count(checkpoint: dict[str, Any], world_size: int) -> None:
    """Refuse to finish, with ``world_size`` processes, an epoch that another number of processes began: an epoch's
    batches are shared out by process, so where the rest of it lies depends on their number. A checkpoint written
    at an epoch's end continues with any number (with fresh RNG seeds when the number differs).

    Raises:
        CheckpointError: naming both numbers and the ways out.
    """
    writers = len(checkpoint["rng"])  # one RNG state per process that wrote it
    if writers != world_size and mid_epoch(checkpoint["sampler"]):
        raise CheckpointError(
            f"the checkpoint was written by {writers} process(es) in the middle of epoch {checkpoint['epoch'] + 1}, "
            f"this run has {world_size}: an epoch's batches are shared out by process, so where the rest of it "
            f"lies depends on their number. Resume with {writers} process(es), or from a checkpoint written at "
            "an epoch's end (the validations' step_N.pt with training.validate_every_steps=null)")


def _resume_paths(target: str | Path) -> tuple[RunDir, Path]:
    """The run directory and checkpoint file that ``resume=target`` (a run directory or a checkpoint) means."""
    target = Path(target)
    if not target.exists():
        raise ConfigError(f"resume: {target} does not exist; give a run directory or RUN/checkpoints/FILE.pt")
    if target.is_dir():
        run = RunDir(target.parent if target.name == "checkpoints" and not RunDir(target).checkpoints.is_dir()
                     else target)  # RUN/checkpoints means RUN
        if not any(run.checkpoints.glob("*.pt")):
            if not (run.checkpoints.is_dir() or run.log_file.is_file() or (run.root / ".hydra").is_dir()):
                raise ConfigError(f"resume: {run.root} is not a run's folder (no checkpoints/, train.log or .hydra/); "
                                  "give the folder of the run to continue, outputs/train/<run>")
            raise ConfigError(f"resume: {run.root} holds no checkpoint (a run stopped before its first save, or not a "
                              f"run's folder): start the run anew, with its overrides and hydra.run.dir={override_value(run.root)}")
        return run, run.last
    if target.parent.name != "checkpoints":
        raise ConfigError(f"resume: {target} is not a run directory nor a checkpoint in a run's checkpoints/ folder "
                          "(the resumed run writes into that run); give the run directory, or RUN/checkpoints/FILE.pt")
    return RunDir(target.parent.parent), target


def saved_folders(target: str | Path) -> dict[str, str]:
    """``{"data.dir": ..., "data.train_dir": ...}``: the corpus folders the run ``resume=target`` means trained on,
    as its checkpoint records them (absolute since version 0.9.2); those it does not record are left out."""
    _, path = _resume_paths(target)
    if not path.is_file():
        return {}
    data = load_checkpoint(path, mmap=True, verify=False).get("config", {}).get("data", {})
    return {f"data.{key}": str(data[key]) for key in ("dir", "train_dir") if data.get(key) is not None}


def saved_recipe(target: str | Path) -> list[str] | None:
    """The command-line overrides the run ``resume=target`` means was started with: its checkpoint's ``recipe``
    (``transformer-train`` stores it), else for older runs Hydra's ``.hydra/overrides.yaml`` in the run
    directory, else None."""
    run, path = _resume_paths(target)
    if path.is_file():
        recipe = load_checkpoint(path, mmap=True, verify=False).get("recipe")  # mapped: the weights are not read
        if recipe is not None:
            return [str(override) for override in recipe]
    hydra_file = run.root / ".hydra" / "overrides.yaml"
    if hydra_file.is_file():  # values as typed: interpolations stay unresolved
        return [str(override) for override in OmegaConf.to_container(OmegaConf.load(hydra_file), resolve=False)]
    return None
