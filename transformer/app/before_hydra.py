"""What a command checks and arranges from its command line before Hydra composes the config and writes the run
folder: a key the command's schema lacks or a value of the wrong type, a ``hydra.run.dir`` (or sweep folder) that
cannot be made or holds another run's work, the settings of a rank above 0 under torchrun, and a full disk under
Hydra's ``.hydra/`` snapshot. Each refusal is one line and leaves every folder as it was."""

from __future__ import annotations

import errno
import os
import re
import sys
from pathlib import Path
from typing import Any

import yaml
from hydra.errors import HydraException

from transformer.app.schemas import refuse_unknown_overrides, settings_named
from transformer.config import ConfigError
from transformer.overrides import override_value


def overrides_given(overrides: list[str]) -> dict[str, Any]:
    """``{key: value}`` of command-line overrides as Hydra parses them (quotes, ``+``/``++``, ``null``).

    Raises:
        hydra.errors.HydraException: a malformed override (``OverrideParseException``).
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return {o.key_or_group: o.value() for o in OverridesParser.create().parse_overrides(overrides)}


# Hydra's flags that take the next word as their value (``--info`` takes one of INFO_TOPICS, if one follows).
VALUE_FLAGS = ("-c", "--cfg", "-p", "--package", "-cp", "--config-path", "-cn", "--config-name", "-cd", "--config-dir",
               "--experimental-rerun")
INFO_TOPICS = ("all", "config", "defaults", "defaults-tree", "plugins", "searchpath")
MODES = {"-m": "--multirun", "--multirun": "--multirun", "-c": "--cfg", "--cfg": "--cfg", "-i": "--info",
         "--info": "--info", "-r": "--run", "--run": "--run"}  # how Hydra runs the command: one at a time
# Flags under which Hydra runs nothing and writes nothing: it shows the help, a config or its own information.
LOOKS = ("-h", "--help", "--hydra-help", "-c", "--cfg", "-i", "--info")
# Shell completion's queries, and configs (groups) from elsewhere: Hydra answers those itself.
ELSEWHERE = ("-sc", "--shell-completion", "-cd", "--config-dir", "-cp", "--config-path", "-cn", "--config-name",
             "hydra.searchpath", "+hydra.searchpath", "++hydra.searchpath")


def flag(arg: str) -> str:
    """The flag of a command-line word, its value cut off (``--cfg=job`` is ``--cfg``); other words as they are."""
    return arg.split("=")[0] if arg.startswith("-") else arg


def only_looks(argv: list[str]) -> bool:
    """Whether Hydra, given ``argv``, only shows something (help, a config) and runs and writes nothing."""
    return any(flag(arg) in LOOKS for arg in argv)


# Every flag Hydra's command line takes. Its argparse would take a long one shortened too (--multi), but the checks
# here read flags by their whole names, so a shortened one is refused, naming the whole one.
HYDRA_FLAGS = ("-h", "--help", "--hydra-help", "--version", "-c", "--cfg", "--resolve", "-p", "--package", "-r", "--run",
               "-m", "--multirun", "-sc", "--shell-completion", "-cp", "--config-path", "-cn", "--config-name", "-cd",
               "--config-dir", "--experimental-rerun", "-i", "--info")


def refuse_unknown_flags(argv: list[str], schema: type | None) -> None:
    """Exit in one line naming a flag that Hydra lacks (``--max-steps 30``), with the settings it may mean
    (``training.max_steps=30``): Hydra would print its usage and name the value as an unrecognized argument."""
    for i, arg in enumerate(argv):
        name = flag(arg)
        if arg == "--":  # the end of the flags: overrides follow
            return
        if not arg.startswith("-") or name in HYDRA_FLAGS:
            continue
        whole = [known for known in HYDRA_FLAGS if known.startswith("--") and known.startswith(name)]
        if name.startswith("--") and len(whole) == 1:
            sys.exit(f"{name}: give the flag's whole name, {whole[0]}")
        value = arg.partition("=")[2] or (argv[i + 1] if i + 1 < len(argv) and "=" not in argv[i + 1]
                                          and not argv[i + 1].startswith("-") else "VALUE")
        tail = name.lstrip("-").replace("-", "_").split(".")  # --training.max-steps: training.max_steps
        meant = settings_named(schema, tail) if schema is not None else []
        hint = f", did you mean {' or '.join(f'{key}={value}' for key in meant[:3])}?" if meant else ""
        sys.exit(f"{name}: no such flag; settings are given as KEY=VALUE{hint} (--help lists them)")


def refuse_malformed_overrides(argv: list[str]) -> None:
    """Exit in one line naming the first word of ``argv`` that is meant as an override but does not parse as one
    (``training.lr``, ``'training.lr=[1'``): Hydra would print its parser's message without the override, and a
    link to the grammar of another version."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    if "-sc" in argv or "--shell-completion" in argv:
        return
    modes = sorted({MODES[flag(arg)] for arg in argv if flag(arg) in MODES})
    if len(modes) > 1:  # Hydra raises ValueError, with a traceback
        sys.exit(f"{' and '.join(modes)}: Hydra does one of --run, --multirun, --cfg and --info at a time; give one")
    previous = None
    for arg in argv:
        is_a_flag_or_its_value = arg.startswith("-") or previous in VALUE_FLAGS or (
            previous in ("-i", "--info") and arg in INFO_TOPICS)
        previous = arg
        if is_a_flag_or_its_value:
            continue
        try:
            OverridesParser.create().parse_overrides([arg])
        except HydraException as error:
            if "=" not in arg and not arg.startswith("~"):
                sys.exit(f"{arg}: not an override; give KEY=VALUE or GROUP=OPTION (or ~KEY to delete one)")
            sys.exit(f"{arg}: not an override Hydra can read ({_parse_failure(arg, str(error))}); put a value with "
                     "other characters than letters, digits, spaces and _-+./:\\ in quotes ('KEY=\"VALUE\"' in a "
                     "shell), a list in brackets (KEY=[A,B])")


def _parse_failure(arg: str, message: str) -> str:
    """Why Hydra's override parser refused ``arg``, from its ``message``: the character its lexer stopped at (the
    line under the override marks it), else the parser's own reason without its list of the tokens it expected."""
    lines = message.splitlines()
    if lines[0].startswith("LexerNoViableAltException: ") and len(lines) > 1 and "^" in lines[1]:
        at = lines[1].index("^") - len("LexerNoViableAltException: ")
        if 0 <= at < len(arg):
            return (f"a quote left open at character {at + 1}" if arg[at] in "'\"" else
                    f"{arg[at]!r} at character {at + 1}")
    reason = "; ".join(line.strip() for line in lines
                       if line.strip() and not line.startswith(("See https:", "Error parsing override")))
    return re.sub(r" expecting \{[^}]*\}", "", reason)


def refuse_malformed_yaml(argv: list[str], config_root: Path) -> None:
    """Exit naming the file and line of a config file that YAML cannot read (a list left open, a tab in the
    indentation, a key given twice), in ``config_root`` or a ``--config-dir`` of ``argv``: Hydra would answer with a
    traceback of its own frames. Every file is read, with the loader Hydra reads them with (a few milliseconds): which
    ones a command composes is Hydra's to find out. What YAML reads but Hydra may not (a tag of another tool, several
    documents, bytes that are not UTF-8) is left to Hydra."""
    folders = [config_root]
    for i, arg in enumerate(argv):
        if flag(arg) in ("-cd", "--config-dir"):
            value = arg.split("=", 1)[1] if "=" in arg else argv[i + 1] if i + 1 < len(argv) else ""
            if value:
                folders.append(Path(value))
    try:
        from omegaconf._utils import get_yaml_loader  # the loader OmegaConf, and so Hydra, reads config files with

        loader: Any = get_yaml_loader()
    except ImportError:  # another omegaconf: PyYAML's own safe loader reads nearly the same
        loader = yaml.SafeLoader
    for path in sorted(p for folder in folders if folder.is_dir() for p in folder.rglob("*.yaml") if p.is_file()):
        try:
            yaml.load(path.read_text(encoding="utf-8"), Loader=loader)
        except (OSError, UnicodeDecodeError):
            continue
        except yaml.MarkedYAMLError as error:
            if isinstance(error, yaml.constructor.ConstructorError) and "duplicate key" not in str(error.problem):
                continue  # a tag of another tool's file
            if isinstance(error, yaml.composer.ComposerError):
                continue  # several documents: not a config file
            mark = error.problem_mark or error.context_mark
            where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
            sys.exit(f"{where}: not valid YAML ({' '.join(filter(None, (error.problem, error.context)))})")


def refuse_mistyped_keys(schema: type, argv: list[str], root_config: Path) -> None:
    """Exit naming the nearest setting when a ``key=value`` of ``argv`` names none of ``schema`` (nor a config group
    that the command's ``root_config`` YAML chooses from), or naming the type when its value cannot be one: Hydra
    would answer with a paragraph (for a key, one that advises adding it with ``+``)."""
    if any(arg.split("=")[0] in ELSEWHERE for arg in argv):
        return  # shell completion's queries, or configs (groups) from elsewhere: Hydra answers those itself
    try:
        refuse_unknown_overrides(schema, argv, config_groups(root_config))
    except ConfigError as error:
        sys.exit(str(error))


def refuse_unknown_options(argv: list[str], root_config: Path) -> None:
    """Exit in one line when ``GROUP=OPTION`` in ``argv`` names an option the group lacks (:func:`unknown_option`):
    Hydra would answer with a paragraph and its search path. A sweep's options are left to :mod:`.sweeps`, which
    checks each job; options from other folders (``--config-dir``, ``hydra.searchpath``) to Hydra."""
    if any(arg.split("=")[0] in ELSEWHERE for arg in argv):
        return
    if (refusal := unknown_option([arg for arg in argv if "=" in arg and not arg.startswith("-")],
                                  root_config)) is not None:
        sys.exit(refusal)


def refuse_resolving_the_run_folder(argv: list[str], root_config: Path) -> None:
    """Exit in one line when ``--cfg ... --resolve`` would resolve ``output_dir``, which the root config takes from
    the run folder Hydra makes: showing a config makes none, and OmegaConf would end in a traceback."""
    shows = any(flag(arg) in ("-c", "--cfg") for arg in argv) and "--resolve" in argv
    if shows and "${hydra:runtime.output_dir}" in root_config.read_text(encoding="utf-8") and not any(
            arg.lstrip("+").startswith("output_dir=") for arg in argv):
        sys.exit("--resolve: output_dir is the run folder, which a command that only shows its config does not make; "
                 "give output_dir=DIR to resolve with it, or leave --resolve out")


def unknown_option(overrides: list[str], root_config: Path) -> str | None:
    """The refusal of the first ``GROUP=OPTION`` of ``overrides`` whose option the group's folder beside
    ``root_config`` lacks, naming the nearest option and all of them; None when every option is there."""
    import difflib

    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except HydraException:  # a malformed override: Hydra itself reports it
        return None
    groups = config_groups(root_config)
    for override in parsed:
        group, option = override.key_or_group, override.value()
        if group not in groups or not isinstance(option, str) or override.is_delete():
            continue
        folder = root_config.parent / group
        if (folder / f"{option}.yaml").is_file():
            continue
        options = sorted(str(path.relative_to(folder).with_suffix("")) for path in folder.rglob("*.yaml"))
        nearest = difflib.get_close_matches(option, options, n=1)
        listed = f"the options: {', '.join(options)}"
        return f"{group}={option}: no such option; " + (f"did you mean {group}={nearest[0]}? T{listed[1:]}"
                                                         if nearest else listed)
    return None


def config_groups(root_config: Path) -> list[str]:
    """The config groups (``model``, ``experiment``, ...) that a command's root config YAML chooses from: names a
    command line may give beside the schema's keys."""
    defaults = yaml.safe_load(root_config.read_text(encoding="utf-8")).get("defaults", [])
    return [key for entry in defaults if isinstance(entry, dict) for key in entry
            if key != "hydra" and not key.startswith("override ")]


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


def refuse_a_taken_run_dir(command: str, argv: list[str]) -> None:
    """Before Hydra writes anything (``.hydra/``, the log) into ``hydra.run.dir``: refuse a folder holding another
    run's work, so a refused command leaves it byte for byte as it was. ``train`` refuses a folder with
    checkpoints unless it resumes that very run; ``evaluate`` one with results unless ``overwrite=true``."""
    if only_looks(argv):  # nothing is written
        return
    overrides = [arg for arg in argv if "=" in arg and not arg.startswith("-")]
    try:
        given = overrides_given(overrides)
    except HydraException:  # a malformed override: Hydra itself reports it, with its own message
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
    if command == "train" and not resumes_it and any((folder / "checkpoints").glob("*.pt")):
        sys.exit(f"hydra.run.dir: {folder} already holds a run's checkpoints, which a new run would overwrite; "
                 f"continue it with resume={folder}, or train into another directory")
    if command == "evaluate" and given.get("overwrite") is not True and (taken := results_in(folder)):
        sys.exit(f"hydra.run.dir: {folder} {taken}")


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
    try:
        given = overrides_given([arg for arg in argv if "=" in arg and not arg.startswith("-")])
    except HydraException:  # a malformed override: Hydra itself reports it, with its own message
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
        key = "resume" if given.get("resume") not in (None, "auto") else "hydra.run.dir"
        sys.exit(in_use_message(key, folder, holder))


def refuse_unwritable_run_folders(argv: list[str]) -> None:
    """Exit in one line when the ``hydra.run.dir`` or ``hydra.sweep.dir`` that ``argv`` names cannot be made or
    written (Hydra would stop with a traceback). One built by interpolation (``${...}``) is left to Hydra."""
    try:
        given = overrides_given([arg for arg in argv if "=" in arg and not arg.startswith("-")])
    except HydraException:  # a malformed override: Hydra itself reports it, with its own message
        return
    for key in ("hydra.run.dir", "hydra.sweep.dir"):
        if given.get(key) is not None and "${" not in str(given[key]):
            refuse_an_unwritable_folder(key, Path(str(given[key])))


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
    try:
        given = overrides_given([arg for arg in argv if "=" in arg and not arg.startswith("-")])
    except HydraException:  # a malformed override: Hydra itself reports it, with its own message
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
    try:
        named = "hydra.run.dir" in overrides_given([arg for arg in argv if "=" in arg and not arg.startswith("-")])
    except HydraException:  # a malformed override: Hydra itself reports it, with its own message
        named = True
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
    overrides on top, as the job would compose them (``cli._with_recipe``), so that the config Hydra shows is the
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
