"""A sweep (``-m``, Hydra's multirun) checked whole before its first job starts. Hydra composes the jobs' configs
only after it has made the sweep folder, and a job's values meet their range checks only when its turn comes, after
the jobs before it have run: a job out of range would be refused an hour into the sweep, leaving its folder behind.
Here every job's config is composed from its overrides as Hydra's basic sweeper splits them, and put through what its
job checks before any work (keys, types, ranges and what the command adds), before Hydra writes anything; the first
bad job is refused in one line naming it."""

from __future__ import annotations

import contextlib
import copy
import logging
import os
import sys
from pathlib import Path
from typing import Any, Callable, Iterator

from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf, open_dict, read_write
from omegaconf.errors import OmegaConfBaseException

from transformer.app.before_hydra import config_groups, overrides_given, unknown_option
from transformer.app.failures import one_line, user_errors
from transformer.app.schemas import refuse_unknown_overrides
from transformer.config import ConfigError

BASIC_SWEEPER = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"
# Flags under which Hydra runs no job (help, a printed config, shell completion, a rerun), or composes from configs
# elsewhere: Hydra answers those itself.
NOT_CHECKED = ("-h", "--help", "--hydra-help", "--version", "-c", "--cfg", "-i", "--info", "-sc", "--shell-completion",
               "--experimental-rerun", "-cd", "--config-dir", "-cp", "--config-path", "-cn", "--config-name",
               "hydra.searchpath", "+hydra.searchpath", "++hydra.searchpath")


def is_a_sweep(argv: list[str]) -> bool:
    """Whether Hydra runs the command line ``argv`` as a sweep: ``-m`` (``--multirun``) or ``hydra.mode=MULTIRUN``."""
    if "-m" in argv or "--multirun" in argv:
        return True
    try:
        given = overrides_given([arg for arg in argv if "=" in arg and not arg.startswith("-")])
    except HydraException:  # a malformed override: Hydra itself reports it, with its own message
        return False
    return str(given.get("hydra.mode", "")).upper() == "MULTIRUN"


def refuse_a_bad_job(argv: list[str], config_dir: Path, command: str, schema: type,
                     check: Callable[[DictConfig], Any]) -> None:
    """Exit in one line when a job of the sweep ``argv`` asks for would be refused before its work, naming the job,
    its swept overrides and the key: ``job 1 (training.lr=-1): training.lr: must be > 0, got -1.0``.

    Each job's config is composed as Hydra composes it for the job (from ``config_dir/<command>.yaml``, Hydra's own
    overrides, then the job's), its keys and values checked against ``schema`` as a single run's command line is,
    then handed to ``check``: what the command's job does to its config before any work (convert it to its
    dataclass, which runs the range checks, at least), with Hydra's record of the job set as the job sees it. A sweep
    that another sweeper makes (``hydra/sweeper=...``) is left to it, and one that does not compose to Hydra."""
    if not is_a_sweep(argv) or any(arg.split("=")[0] in NOT_CHECKED for arg in argv):
        return
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.types import RunMode

    overrides = [arg for arg in argv if not arg.startswith("-")]
    groups = config_groups(config_dir / f"{command}.yaml")
    with initialize_config_dir(config_dir=str(config_dir), version_base="1.3", job_name=command), _quietly():
        app = GlobalHydra.instance().hydra
        assert app is not None
        try:
            sweep = app.compose_config(command, overrides, run_mode=RunMode.MULTIRUN)
            jobs, swept = _jobs(sweep, app.config_loader)
        except Exception:  # a sweep that does not compose, or that the basic sweeper cannot make: Hydra meets it
            return  # again and says why, in its own words
        for num, job in enumerate(jobs):
            shown = " ".join(override for override in job if override.partition("=")[0] in swept)
            try:
                refuse_unknown_overrides(schema, job, groups)  # one line for a value of the wrong type
                if (refusal := unknown_option(job, config_dir / f"{command}.yaml")) is not None:
                    raise ConfigError(refusal)
                check(_job_config(app.config_loader, sweep, job, num))
            except user_errors() as error:
                sys.exit(f"job {num}{f' ({shown})' if shown else ''}: {_one_line(error)}")


def _jobs(sweep: DictConfig, loader: Any) -> tuple[list[list[str]], set[str]]:
    """Each job's overrides in the order Hydra's basic sweeper runs them (its ``params`` first, then the command
    line's), and the keys swept; no jobs for another sweeper, which chooses its own."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    if sweep.hydra.sweeper.get("_target_") != BASIC_SWEEPER:
        return [], set()
    params = [f"{key}={value}" for key, value in (sweep.hydra.sweeper.get("params") or {}).items()]
    parsed = OverridesParser.create(config_loader=loader).parse_overrides(params + list(sweep.hydra.overrides.task))
    (jobs,) = BasicSweeper.split_arguments(parsed, max_batch_size=None)
    return jobs, {override.get_key_element() for override in parsed if override.is_sweep_override()}


def _job_config(loader: Any, sweep: DictConfig, job: list[str], num: int) -> DictConfig:
    """Job ``num``'s config without Hydra's node, as Hydra's launcher and ``run_job`` make it: Hydra's record of the
    job (its overrides, ``${hydra:runtime.output_dir}``, its folder in the sweep) set as the job sees it."""
    from hydra.core.hydra_config import HydraConfig

    cfg = loader.load_sweep_config(sweep, list(job))
    with open_dict(cfg):
        cfg.hydra.job.id, cfg.hydra.job.num = f"{cfg.hydra.job.name}_{num}", num
    HydraConfig.instance().set_config(cfg)  # the folder below is made of ${hydra:...} interpolations
    folder = Path(str(OmegaConf.select(cfg, "hydra.sweep.dir"))) / str(OmegaConf.select(cfg, "hydra.sweep.subdir"))
    with read_write(cfg.hydra.runtime), open_dict(cfg.hydra.runtime):
        cfg.hydra.runtime.output_dir = os.path.abspath(folder)
    HydraConfig.instance().set_config(cfg)
    task = copy.deepcopy(cfg)
    with read_write(task), open_dict(task):
        del task["hydra"]
    return task


def _one_line(error: BaseException) -> str:
    """A refusal in one line; Hydra's composition errors too (``Could not find 'model/huge'`` and the options)."""
    if not isinstance(error, HydraException):
        return one_line(error)
    if isinstance(error.__cause__, OmegaConfBaseException):
        return one_line(error.__cause__)
    lines = [line.strip() for line in str(error).split("\nConfig search path:")[0].splitlines() if line.strip()]
    if len(lines) > 2 and lines[1].endswith(":"):  # a heading and its items: "Available options in 'model':"
        return f"{lines[0]}; {lines[1]} {', '.join(lines[2:])}"
    return " ".join(lines)


@contextlib.contextmanager
def _quietly() -> Iterator[None]:
    """Logging off (what a job's checks warn of is for the job to say) and Hydra's record of a job put back."""
    from hydra.core.hydra_config import HydraConfig

    hydra_cfg, disabled = HydraConfig.instance().cfg, logging.root.manager.disable
    logging.disable(logging.CRITICAL)
    try:
        yield
    finally:
        logging.disable(disabled)
        HydraConfig.instance().cfg = hydra_cfg
