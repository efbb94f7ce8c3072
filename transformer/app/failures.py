"""How a command ends when it fails: an expected failure (a bad config value, file or checkpoint, a path that
cannot be written, a full disk) as one logged line and exit status 1, Ctrl-C or SIGTERM as one line and 130 or 143;
anything else keeps its traceback. The run folder Hydra made for a command refused at once is removed again."""

from __future__ import annotations

import errno
import functools
import logging
import os
import re
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from transformer.app import schemas
from transformer.app.before_hydra import overrides_given
from transformer.interrupts import exit_status


def user_errors() -> tuple[type[BaseException], ...]:
    """Failures that deserve a clear message rather than a traceback."""
    from hydra.errors import HydraException  # e.g. composing a resumed run's recipe that no longer composes

    from transformer.checkpoint import CheckpointError
    from transformer.config import ConfigError
    from transformer.data.corpus import DataError
    from transformer.data.tokenizer import TokenizerError
    from transformer.files import DiskFullError
    from transformer.training.glove import GloveError
    from transformer.training.step_window import TrainingDiverged

    return (ConfigError, DataError, GloveError, CheckpointError, TokenizerError, TrainingDiverged, FileNotFoundError,
            DiskFullError, HydraException, OmegaConfBaseException)


def command_log() -> logging.Logger:
    """The logger a failure is said by: the command's name (``transformer-train``), which the line then shows."""
    from hydra.core.hydra_config import HydraConfig

    name = HydraConfig.get().job.name if HydraConfig.initialized() else None
    return logging.getLogger(f"transformer-{name.replace('_', '-')}" if name else "transformer")


INTERRUPTED = "interrupted; what this command writes is written whole or not at all"


def named_by_the_command(main: Callable[[], None]) -> Callable[[], None]:
    """``main`` whose refusals made before Hydra starts (``sys.exit(message)``) begin with the command's name, as
    ``transformer-train: max_steps: no such setting; ...``: as the errors met once it has started are logged under
    it, and as a shell script that runs several commands needs to tell which one refused."""

    @functools.wraps(main)
    def named() -> None:
        name = Path(sys.argv[0]).name
        try:
            main()
        except SystemExit as refusal:
            if isinstance(refusal.code, str) and not refusal.code.startswith(f"{name}: "):
                raise SystemExit(f"{name}: {refusal.code}") from None
            raise
        except KeyboardInterrupt as interrupt:  # before the command's own work began: Hydra composing, a module loading
            print(f"{name}: {str(interrupt) or INTERRUPTED}", file=sys.stderr)
            sys.exit(exit_status(interrupt))

    return named


def run_command(command: Callable[[Any], Any], cfg: DictConfig, *, typed: bool = True,
                prepare: Callable[[DictConfig], DictConfig] | None = None) -> Any:
    """``command`` on the typed config (``typed=False``: on ``cfg`` as it is; ``prepare``: on ``prepare(cfg)``), a
    user error as one logged line."""
    log = command_log()
    try:
        with said_by_rank_0():
            if prepare is not None:
                cfg = prepare(cfg)
            if typed:
                cfg = OmegaConf.to_object(cfg)  # runs every __post_init__ check
                schemas.refuse_unknown_keys(cfg)
        return command(cfg)
    except user_errors() as error:
        if isinstance(error, OSError):  # a full disk: the run's log file may be on it, so its handler fails quietly
            logging.raiseExceptions = False
        log.error("%s", one_line(error))  # to the console and, for runs with a directory, to its log file
        forget_refused_run()
        sys.exit(1)
    except OSError as error:  # a full disk met by a write of its own (the corpus cache's arrays, say), a folder
        if error.errno in (errno.ENOSPC, errno.EDQUOT):  # not writable, a file where a folder should be
            logging.raiseExceptions = False  # the run's log file may be on the full disk: its handler fails quietly
            log.error("no space left on device (ENOSPC) while writing %s; free space and run the command again",
                      error.filename or "a file")
        elif error.errno in PATH_ERRORS and error.filename:
            log.error("%s", path_error_line(error))
        else:
            raise
        forget_refused_run()
        sys.exit(1)
    except KeyboardInterrupt as interrupt:  # Ctrl-C or SIGTERM: what was saved, in one line, not a traceback
        log.error("%s", str(interrupt) or INTERRUPTED)
        sys.exit(exit_status(interrupt))


@contextmanager
def said_by_rank_0() -> Iterator[None]:
    """Around the checks of the command line and of the composed config, which every rank of a torchrun group makes
    alike: a refusal is said by rank 0 alone, and a rank above 0 exits with status 1 in silence (its message would
    repeat rank 0's, or interleave with it on one line). What a rank meets later (a file, a device) it still says."""
    try:
        yield
    except SystemExit as refusal:  # a refusal before Hydra: sys.exit(message)
        if refusal.code in (None, 0) or os.environ.get("RANK", "0") == "0":
            raise
        sys.exit(1)
    except user_errors():
        if os.environ.get("RANK", "0") == "0":
            raise
        sys.exit(1)


# errors of a path that the user names: a folder not writable or not there, a file where a folder should be
PATH_ERRORS = (errno.EACCES, errno.EPERM, errno.EROFS, errno.EEXIST, errno.ENOTDIR, errno.EISDIR)


def path_error_line(error: OSError) -> str:
    """One line naming the path of a failed file operation and why; the folder for a file or folder written in it
    under a temporary name (``.NAME.XXXXXXXX[.tmp]``, see ``transformer.files``) before taking its own."""
    path = Path(str(error.filename2 or error.filename))  # a rename's target, else the file operated on
    reason = {errno.EEXIST: "a file is there, where a folder should be made",
              errno.ENOTDIR: "a part of this path is a file, not a folder"}.get(error.errno or 0)
    reason = reason or (error.strerror or str(error)).lower()
    if re.fullmatch(r"\..+\.([a-z0-9_]{8}(\.tmp|\.part)?|link\.tmp)", path.name):  # tempfile's 8 random characters
        return f"cannot write in {path.parent}: {reason}"
    return f"{path}: {reason}"


def one_line(error: BaseException) -> str:
    """An error's message; a failed file operation's as its file and why (not Python's ``[Errno N] ...``); OmegaConf's
    (an interpolation that does not resolve, a value of the wrong type) as the key and the first line, where it is a
    paragraph naming the key on its second."""
    if isinstance(error, OSError) and error.errno is not None and error.filename is not None:
        return path_error_line(error)  # the file (for one written under a temporary name, its folder) and why
    key = getattr(error, "full_key", None) if isinstance(error, OmegaConfBaseException) else None
    if not key:
        return str(error)
    reason = str(getattr(error, "msg", error)).strip().splitlines()[0]
    if (variable := re.search(r"Environment variable '(\w+)' not found", reason)) is not None:
        return (f"{key}: the environment variable {variable[1]} is not set; set it, or give {key}=... on the "
                "command line")
    return f"{key}: {reason}"


def forget_refused_run() -> None:
    """Remove the folder Hydra made for a refused command when it named it itself (``outputs/<task>/<time>``, or a
    sweep's ``outputs/multirun/<task>/<time>/<job>``) and it holds nothing but Hydra's record, the log and a
    training's lock, and the folders above it left empty (a sweep's folder holding only its ``multirun.yaml``, the
    first job refused): listings of runs show only runs that started. A folder named with ``hydra.run.dir`` (a sweep
    into ``hydra.sweep.dir``) keeps its log, which says why the command was refused."""
    import shutil

    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from transformer.training.run_lock import LOCK_FILE

    if not HydraConfig.initialized():
        return
    hydra_cfg = HydraConfig.get()
    sweep = hydra_cfg.mode == RunMode.MULTIRUN
    if (hydra_cfg.output_subdir is None
            or ("hydra.sweep.dir" if sweep else "hydra.run.dir") in overrides_given(list(hydra_cfg.overrides.hydra))):
        return
    run = Path(hydra_cfg.runtime.output_dir)
    made = {hydra_cfg.output_subdir, f"{hydra_cfg.job.name}.log", LOCK_FILE}
    here = Path.cwd().resolve()
    if run.is_dir() and run.resolve() != here and {p.name for p in run.iterdir()} <= made:
        shutil.rmtree(run, ignore_errors=True)
        sweep_dir = Path(str(hydra_cfg.sweep.dir)).resolve() if sweep else None
        for parent in run.resolve().parents:  # outputs/<task>/ as well, where Hydra made it for this run alone
            try:
                if parent == sweep_dir and [p.name for p in parent.iterdir()] == ["multirun.yaml"]:
                    (parent / "multirun.yaml").unlink()  # Hydra's record of a sweep whose first job was refused
                if parent == here or here not in parent.parents or any(parent.iterdir()):
                    break
                parent.rmdir()
            except OSError:  # another command, started beside this one, made a folder in it meanwhile
                break
