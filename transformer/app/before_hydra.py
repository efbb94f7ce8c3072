"""What a command checks of its command line and config files before Hydra composes the config: a flag Hydra lacks,
an override it cannot read, a config file that is not YAML, a key the command's schema lacks or a value of the wrong
type, a group option that is not there. Each refusal is one line, and nothing is written. The run folder's checks
are :mod:`.run_folder`'s."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import yaml
from hydra.errors import HydraException

from transformer.app.schemas import VALUES_ELSEWHERE, refuse_unknown_overrides, settings_named
from transformer.config import ConfigError


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
                                          and not argv[i + 1].startswith("-") else None)
        tail = name.lstrip("-").replace("-", "_").split(".")  # --training.max-steps: training.max_steps
        value = value or VALUES_ELSEWHERE.get(tail[-1], "VALUE")  # --fp16: precision=bf16
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
