"""The run folder, before Hydra makes it and writes its ``.hydra/`` record and log there: a ``hydra.run.dir`` (or
sweep folder) that cannot be made or holds another run's work is refused in one line, leaving every folder as it was;
a resume runs in the resumed run's own folder and shows its recipe; a rank above 0 under torchrun makes none; a full
disk under Hydra's ``.hydra/`` snapshot is named in one line."""

from __future__ import annotations

import errno
import os
import sys
from pathlib import Path
from typing import Any

from hydra.errors import HydraException

from transformer.app.before_hydra import flag, only_looks, overrides_given
from transformer.app.failures import path_error_line
from transformer.app.sweeps import is_a_sweep
from transformer.config import ConfigError
from transformer.overrides import override_value


def _given(argv: list[str]) -> dict[str, Any] | None:
    """The values the overrides of ``argv`` give, by key; None for a malformed override, which Hydra itself reports
    with its own message."""
    try:
        return overrides_given([arg for arg in argv if "=" in arg and not arg.startswith("-")])
    except HydraException:
        return None


def name_a_full_disk_under_hydras_snapshot() -> None:
    """Hydra writes the run folder's ``.hydra/`` snapshot before any command's code runs, and reports a failed write
    as a traceback: on a full disk, say so in one line instead, as the commands do for their own writes."""
    from hydra.core import utils as hydra_utils

    save = hydra_utils._save_config
    if getattr(save, "names_a_full_disk", False):
        return

    def save_or_name_a_full_disk(cfg: Any, filename: str, output_dir: Path) -> None:
        try:
            save(cfg, filename, output_dir)
        except OSError as error:
            if error.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            sys.exit(f"no space left on device (ENOSPC) while writing {Path(output_dir) / filename}; "
                     "free space and run the command again")

    save_or_name_a_full_disk.names_a_full_disk = True  # type: ignore[attr-defined]
    hydra_utils._save_config = save_or_name_a_full_disk


RUN_FOLDER_COMMANDS = ("train", "evaluate", "benchmark")  # their output_dir is the run folder, Hydra's by default


def output_dir_as_run_dir(argv: list[str]) -> list[str]:
    """``output_dir=DIR`` on rank 0 of a command that runs: the Hydra setting that makes DIR the command's folder too,
    so that its log and ``.hydra/`` record of the config go where its results go, not into a timestamped folder of
    their own. Nothing where ``hydra.run.dir``, a resume or a sweep chooses the folder, nor for a training run's
    folder that is not being continued (``resume=auto``): its ``.hydra/`` keeps the record of how the run began."""
    if only_looks(argv) or is_a_sweep(argv) or os.environ.get("RANK", "0") != "0" or (given := _given(argv)) is None:
        return []
    out = given.get("output_dir")
    if not isinstance(out, str) or "${" in out or "hydra.run.dir" in given:
        return []
    resume = given.get("resume")
    if resume not in (None, "auto") or (resume is None and (Path(out) / "checkpoints").is_dir()):
        return []
    return [f"hydra.run.dir={override_value(out)}"]


def _run_dir_key(given: dict[str, Any]) -> str:
    """The key the command line named the run folder by: ``output_dir`` where that made ``hydra.run.dir``."""
    named_by_output_dir = given.get("output_dir") is not None and str(given["output_dir"]) == str(
        given.get("hydra.run.dir"))
    return "output_dir" if named_by_output_dir else "hydra.run.dir"


def refuse_a_taken_run_dir(command: str, argv: list[str]) -> None:
    """Before Hydra writes anything (``.hydra/``, the log) into ``hydra.run.dir``: refuse a folder holding another
    run's work, so a refused command leaves it byte for byte as it was. ``train`` refuses a folder with
    checkpoints unless it resumes that very run; ``evaluate`` one with results unless ``overwrite=true``."""
    if only_looks(argv):  # nothing is written
        return
    if (given := _given(argv)) is None:
        return
    if "-m" in argv or "--multirun" in argv or str(given.get("hydra.mode", "")).upper() == "MULTIRUN":
        if given.get("hydra.sweep.dir") is not None:  # else each sweep makes a folder of its own
            _refuse_a_taken_sweep_dir(command, Path(str(given["hydra.sweep.dir"])))
        return
    if given.get("hydra.run.dir") is None:
        return
    folder = Path(str(given["hydra.run.dir"]))
    resume = given.get("resume")
    resumes_it = resume == "auto" or (resume is not None and folder.resolve() in
                                      (Path(str(resume)).resolve(), *Path(str(resume)).resolve().parents))
    key = _run_dir_key(given)
    if command == "train" and not resumes_it and any((folder / "checkpoints").glob("*.pt")):
        sys.exit(f"{key}: {folder} already holds a run's checkpoints, which a new run would overwrite; "
                 f"continue it with resume={folder}, or train into another directory")
    if command == "evaluate" and given.get("overwrite") is not True and (taken := results_in(folder)):
        sys.exit(f"{key}: {folder} {taken}")


def results_in(folder: Path) -> str | None:
    """What an evaluation into ``folder`` would overwrite, said as the rest of a refusal, or None. ``.hydra/`` and
    a log alone are a refused command's: nothing of value, so a retry may reuse the folder."""
    taken = [name for name in ("metrics.json", "hypotheses.txt", "checkpoints") if (folder / name).exists()]
    if not taken:
        return None
    return (f"already holds {', '.join(taken)} (a training run's or an earlier evaluation's); evaluate into a new "
            "folder, or overwrite=true to write into it")


def refuse_a_held_run_dir(argv: list[str]) -> None:
    """Exit in one line when ``hydra.run.dir`` (a resume's own folder included) is a run another process is
    training in, before Hydra rewrites its ``.hydra/`` record and appends to its log (:mod:`.run_lock`)."""
    from transformer.training.run_lock import holder_of, in_use_message

    if os.environ.get("RANK", "0") != "0" or only_looks(argv):  # rank 0 holds the folder; a look writes nothing
        return
    if (given := _given(argv)) is None:
        return
    if "-m" in argv or "--multirun" in argv:
        return
    if given.get("hydra.run.dir") is not None:
        folder = Path(str(given["hydra.run.dir"]))
    elif given.get("resume") not in (None, "auto"):  # a run before its first save: no checkpoints/ to go by yet
        folder = _run_root(Path(str(given["resume"])))
    else:
        return
    if (holder := holder_of(folder)) is not None:
        key = "resume" if given.get("resume") not in (None, "auto") else _run_dir_key(given)
        sys.exit(in_use_message(key, folder, holder))


def refuse_unwritable_run_folders(argv: list[str]) -> None:
    """Exit in one line when the ``hydra.run.dir`` or ``hydra.sweep.dir`` that ``argv`` names cannot be made or
    written (Hydra would stop with a traceback). One built by interpolation (``${...}``) is left to Hydra."""
    if (given := _given(argv)) is None:
        return
    for key in ("hydra.run.dir", "hydra.sweep.dir"):
        if given.get(key) is not None and "${" not in str(given[key]):
            named = _run_dir_key(given) if key == "hydra.run.dir" else key
            refuse_an_unwritable_folder(named, Path(str(given[key])))


def make_the_run_folder(argv: list[str]) -> None:
    """Make the ``hydra.run.dir`` that ``argv`` names, as Hydra would next, naming in one line what stops it where
    Hydra prints a traceback: a name too long, a file system that takes no new folders (``/proc``). Nothing for a
    command that only looks, a sweep, a rank above 0, or a folder built by interpolation (Hydra's)."""
    if only_looks(argv) or os.environ.get("RANK", "0") != "0" or is_a_sweep(argv):
        return
    folder = None if (given := _given(argv)) is None else given.get("hydra.run.dir")
    if not isinstance(folder, str) or "${" in folder:
        return
    try:
        Path(folder).mkdir(parents=True, exist_ok=True)
    except OSError as error:
        sys.exit(f"{_run_dir_key(given)}: {path_error_line(error)}; name another folder")


def refuse_an_unwritable_folder(key: str, folder: Path) -> None:
    """Exit in one line when ``folder`` (to be made if missing) cannot be: a file in its place or on its path, or
    its nearest existing folder not writable. Python would answer later, with a traceback."""
    # os.path.exists, not Path.exists: it says False, rather than raising, below a folder that cannot be entered
    existing = next(path for path in (folder, *folder.parents) if os.path.exists(path))  # "." or "/" at the latest
    if not existing.is_dir():
        on_the_way = "" if existing == folder else f" (on the way to {folder})"
        sys.exit(f"{key}: {existing} is a file, not a folder{on_the_way}; name another folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        what = f"{folder} is not writable" if existing == folder else (
            f"cannot make {folder}: {existing} is not writable")
        sys.exit(f"{key}: {what} (permission denied); name another folder")


def _refuse_a_taken_sweep_dir(command: str, folder: Path) -> None:
    """A sweep into ``hydra.sweep.dir`` writes each job's ``.hydra/`` record into ``DIR/<job>`` before the job's
    code runs: refuse a folder whose jobs hold checkpoints (``train``) or results (``evaluate``) first."""
    names = ["checkpoints/*.pt"] if command == "train" else ["metrics.json", "hypotheses.txt"]
    jobs = sorted({str((path.parent.parent if command == "train" else path.parent).relative_to(folder))
                   for name in names for path in folder.glob(f"**/{name}")})
    if jobs:
        what = "checkpoints" if command == "train" else "results"
        sys.exit(f"hydra.sweep.dir: {folder} already holds the {what} of an earlier sweep's jobs "
                 f"({', '.join(jobs[:5])}{', ...' if len(jobs) > 5 else ''}), which this sweep would overwrite; "
                 "sweep into a new folder (without hydra.sweep.dir each sweep makes its own)"
                 + (f", or continue a job with resume={folder / jobs[0]}" if command == "train" else ""))


def resume_in_its_run_dir(argv: list[str]) -> list[str]:
    """``resume=RUN`` (or a checkpoint of RUN) without ``hydra.run.dir``: the Hydra settings that make RUN this
    command's folder, so its log continues RUN's ``train.log`` and RUN's ``.hydra/`` record of how it started is
    kept, instead of a new timestamped folder that would hold only a copy of the log."""
    if "-m" in argv or "--multirun" in argv:
        return []
    if (given := _given(argv)) is None:
        return []
    if given.get("resume") in (None, "auto") or "hydra.run.dir" in given:
        return []
    root = _run_root(Path(str(given["resume"])))
    if not (root / "checkpoints").is_dir():
        return []  # not a run: the command names what is wrong with resume=
    return [f"hydra.run.dir={override_value(root)}", "hydra.output_subdir=null"]


def _run_root(target: Path) -> Path:
    """The run folder ``resume=target`` names: the run, its ``checkpoints/`` folder or a checkpoint in it."""
    if target.is_file() and target.parent.name == "checkpoints":
        return target.parent.parent
    return target.parent if target.name == "checkpoints" else target


def as_a_rank_above_0(argv: list[str]) -> list[str]:
    """Under torchrun, the Hydra settings that leave the run's folder and log to rank 0 (which tells the others its
    folder): a rank above 0 makes no folder (its own is the current one, unwritten), no ``.hydra``, and logs its
    errors only, to stderr, naming its rank."""
    rank = int(os.environ.get("RANK", "0"))
    if rank == 0:
        return []
    quiet = ["hydra/job_logging=stderr", "hydra.job_logging.root.level=ERROR", "hydra.output_subdir=null",
             f"hydra.job_logging.formatters.simple.format='[rank {rank}][%(levelname)s] %(name)s: %(message)s'"]
    given = _given(argv)
    named = given is None or "hydra.run.dir" in given  # a malformed override: Hydra itself reports it
    return quiet if named else [*quiet, "hydra.run.dir=."]


def with_overrides(argv: list[str], extra: list[str]) -> list[str]:
    """``argv`` with the overrides ``extra`` right after its own, so that they win where both set a key: Hydra reads a
    command line's overrides as one run of words, and a flag (``--help``, ``--cfg job``) may stand before or after
    them, not among them."""
    own = [i for i, arg in enumerate(argv) if i and "=" in arg and not arg.startswith("-")]
    at = own[-1] + 1 if own else len(argv)
    return [*argv[:at], *extra, *argv[at:]]


def the_resumed_recipe_shown(argv: list[str]) -> list[str]:
    """``argv`` (``sys.argv``) for ``--help`` or ``--cfg`` of a resume: the resumed run's recipe with the command's
    overrides on top, as the job would compose them (``resumed.with_recipe``), so that the config Hydra shows is the
    one the resume trains with. Any other command line as it is."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from transformer.checkpoint import CheckpointError
    from transformer.overrides import merge_overrides
    from transformer.training.resume import saved_recipe

    if not any(flag(arg) in ("-h", "--help", "-c", "--cfg") for arg in argv[1:]):
        return argv
    overrides = [arg for arg in argv[1:] if "=" in arg and not arg.startswith("-")]
    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except HydraException:  # a malformed override: Hydra itself reports it
        return argv
    given = {o.key_or_group: o.value() for o in parsed}
    resume = given.get("resume")
    if resume == "auto" and given.get("hydra.run.dir") is not None:  # auto continues a run that has checkpoints
        resume = given["hydra.run.dir"] if (Path(str(given["hydra.run.dir"])) / "checkpoints").is_dir() else None
    if resume in (None, "auto"):
        return argv
    try:
        earlier = saved_recipe(str(resume))
    except (ConfigError, CheckpointError, OSError):  # the command, run, says what is wrong with resume=
        return argv
    if earlier is None:
        return argv
    own = [o.input_line for o in parsed if o.key_or_group == "resume" or o.key_or_group.startswith("hydra")]
    flags = [arg for arg in argv[1:] if arg not in overrides]
    return with_overrides([argv[0], *flags], [*merge_overrides(earlier, overrides), *own])
