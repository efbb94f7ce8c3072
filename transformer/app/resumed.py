"""The config of a resumed training run: composed anew from the recipe its checkpoints keep (the command-line
overrides that define the run) with this command's overrides on top, so that ``resume=RUN`` alone continues a run of
any recipe; ``resume=auto`` finds the run in ``hydra.run.dir``, as ``torchrun --max-restarts`` needs."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from transformer.app.before_hydra import overrides_given
from transformer.overrides import merge_overrides, override_value

log = logging.getLogger(__name__)


def _resume_auto(cfg: DictConfig, hydra_cfg: Any) -> str | None:
    """``resume=auto``: the run in ``hydra.run.dir`` when it has a checkpoint (``last.pt``, else its newest
    ``step_N.pt``), else None (a new run there). What ``torchrun --max-restarts`` needs: it restarts the same
    command line."""
    from transformer.checkpoint import STEP_FILE, RunDir
    from transformer.config import ConfigError

    if "hydra.run.dir" not in overrides_given(list(hydra_cfg.overrides.hydra)):
        raise ConfigError("resume: auto continues the run in hydra.run.dir; name that folder (hydra.run.dir=DIR), "
                          "else each start makes a new one")
    run = RunDir(Path(hydra_cfg.runtime.output_dir))
    steps = sorted((int(m.group(1)), p) for p in run.checkpoints.glob("step_*.pt") if (m := STEP_FILE.match(p.name)))
    if run.last.is_file() or steps:
        target = run.root if run.last.is_file() else steps[-1][1]
        log.info("resume=auto: continuing %s", run.last if run.last.is_file() else target)
        return str(target)
    log.info("resume=auto: no checkpoint in %s yet; starting the run", run.root)
    return None


def with_recipe(cfg: DictConfig) -> tuple[DictConfig, list[str]]:
    """This command's config and the run's recipe: the command-line overrides that define a run, kept in its
    checkpoints. A new run's recipe is this command's overrides. With ``resume=RUN`` it is RUN's recipe with this
    command's overrides on top, and the config is composed from it anew, so a run of any recipe continues with
    just ``resume=RUN`` (plus whatever should change, e.g. ``training.max_epochs``)."""
    from hydra.core.hydra_config import HydraConfig

    from transformer.training.resume import saved_recipe

    now = OmegaConf.to_container(HydraConfig.get().overrides.task, resolve=False)  # as typed: ${...} kept
    if cfg.resume == "auto":
        cfg.resume = _resume_auto(cfg, HydraConfig.get())
    if cfg.resume is None:
        return cfg, merge_overrides([], now)
    earlier = saved_recipe(cfg.resume)
    if earlier is None:
        log.warning("%s: no recipe kept with this run; resuming with this command's config alone", cfg.resume)
        return cfg, merge_overrides([], now)
    recipe = merge_overrides(earlier, now)
    log.info("resuming with the run's recipe, this command's overrides on top: %s", " ".join(recipe))
    resume = [f"resume={override_value(cfg.resume)}"]  # auto: resolved
    composed = hydra.compose(config_name="train", overrides=recipe + resume)
    _anchor_corpus_folders(composed, now, cfg.resume)
    _refuse_moved_corpus(composed, now, cfg.resume)
    try:
        composed.model.glove.path  # ${oc.env:GLOVE_PATH} in the GloVe models: unset in this shell, maybe
    except OmegaConfBaseException:
        composed.model.glove.path = None  # read only when a run starts: the vectors are in the resumed weights
    return composed, recipe


def _anchor_corpus_folders(composed: DictConfig, now: list[str], resume: str) -> None:
    """A recipe's corpus folder named relative (as typed, ``data.dir=toy``) means the one under the folder the run
    started in: where this command runs from elsewhere, take it from the checkpoint, which records it absolute."""
    from transformer.training.resume import saved_folders

    given = {override.split("=")[0].lstrip("+~") for override in now}
    for key, folder in saved_folders(resume).items():
        name = key.removeprefix("data.")
        value = composed.data.get(name)
        if key not in given and value is not None and not Path(value).is_absolute() and Path(folder).is_absolute():
            composed.data[name] = folder


def _refuse_moved_corpus(composed: DictConfig, now: list[str], resume: str) -> None:
    """A resumed run's own corpus folder (``data.dir`` of a custom corpus, ``data.train_dir``) that is gone: say
    how to name where it went, unless this command names a folder itself."""
    from transformer.config import ConfigError, CorpusKind

    folders = {"data.train_dir": composed.data.get("train_dir")}
    if composed.data.get("corpus") == CorpusKind.custom:
        folders["data.dir"] = composed.data.get("dir")
    given = {override.split("=")[0].lstrip("+~") for override in now}
    for key, folder in folders.items():
        if folder is not None and key not in given and not Path(folder).is_dir():
            raise ConfigError(f"{key}={folder}: directory not found: the run {resume} was trained on the corpus "
                              f"there; if it moved, name its new folder: resume={override_value(resume)} {key}=NEW "
                              "(the run checks that it holds the same training pairs)")
