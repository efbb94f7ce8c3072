"""Config files of a ``--config-dir``, checked before Hydra composes them: a folder that is not there, a key that
names no setting, a value its setting cannot hold, a group option a ``defaults`` list names that is not there. Each
is refused in one line naming the file and line, as the command line's own overrides are; Hydra would answer with a
paragraph (``Key 'trainig' not in 'TrainConfig' ... Set the environment variable HYDRA_FULL_ERROR=1 ...``). The
project's own configs are composed by its tests; these are the files only the user has seen."""

from __future__ import annotations

import dataclasses
import difflib
import sys
import types
import typing
from pathlib import Path
from typing import Any

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from transformer.app.before_hydra import flag

GLOBAL = "# @package _global_"


def refuse_bad_config_files(argv: list[str], schema: type, config_root: Path) -> None:
    """Exit in one line at the first fault of a config file that ``argv`` chooses (``GROUP=OPTION``) from a
    ``--config-dir`` (or ``-cd``) folder, or at a ``--config-dir`` that is not a folder."""
    extra = []
    for i, arg in enumerate(argv):
        if flag(arg) in ("-cd", "--config-dir"):
            value = arg.split("=", 1)[1] if "=" in arg else argv[i + 1] if i + 1 < len(argv) else ""
            if not Path(value).is_dir():
                sys.exit(f"{flag(arg)} {value}: no such folder; give the folder that holds your config groups "
                         "(experiment/, model/, ...)")
            extra.append(Path(value))
    if not extra:
        return
    folders = [*extra, config_root]
    for arg in argv:
        group, _, option = arg.partition("=")
        if arg.startswith("-") or not option or "." in group or "/" in group or "," in option:
            continue  # flags, keys, nested groups and sweeps: Hydra's
        found = next((folder / group / f"{option}.yaml" for folder in folders
                      if (folder / group / f"{option}.yaml").is_file()), None)
        options = sorted({p.stem for folder in folders for p in (folder / group).glob("*.yaml")})
        if found is None and options and option != "null":
            near = difflib.get_close_matches(option, options, n=1)
            hint = f"did you mean {group}={near[0]}? " if near else ""
            sys.exit(f"{group}={option}: no such option in {' or '.join(map(str, folders))}; {hint}The options: "
                     f"{', '.join(options)}")
        if found is not None and not found.is_relative_to(config_root):
            _check_file(found, group, schema, folders)


def _check_file(path: Path, group: str, schema: type, folders: list[Path]) -> None:
    text = path.read_text(encoding="utf-8")
    try:
        root = yaml.compose(text)
    except yaml.YAMLError:
        return  # not YAML: before_hydra.refuse_malformed_yaml names it
    if not isinstance(root, yaml.MappingNode):
        return
    header = [line.strip() for line in text.splitlines()[:20] if line.strip().startswith("#")]
    prefix = "" if GLOBAL in header else f"{group}."  # the file's keys are the root's, or its group's
    typed = OmegaConf.structured(schema)
    for key, value in root.value:
        if key.value == "defaults":
            _check_defaults(path, value, folders)
        elif not key.value.startswith("hydra"):
            _check_key(path, f"{prefix}{key.value}", key, value, schema, typed)


def _check_defaults(path: Path, node: yaml.Node, folders: list[Path]) -> None:
    """Every ``override /group: option`` (or ``/group: option``) of a defaults list names an option there is."""
    if not isinstance(node, yaml.SequenceNode):
        return
    for entry in node.value:
        if not isinstance(entry, yaml.MappingNode) or len(entry.value) != 1:
            continue
        key, value = entry.value[0]
        group = key.value.removeprefix("override ").strip().lstrip("/")
        if "@" in group or not isinstance(value, yaml.ScalarNode) or value.value in ("null", "???"):
            continue
        options = sorted({p.stem for folder in folders for p in (folder / group).glob("*.yaml")})
        if options and value.value not in options:
            near = difflib.get_close_matches(value.value, options, n=1)
            hint = f"did you mean {group}: {near[0]}? " if near else ""
            sys.exit(f"{path}:{value.start_mark.line + 1}: {group}: {value.value}: no such option; {hint}The options: "
                     f"{', '.join(options)}")


def _check_key(path: Path, dotted: str, key: yaml.Node, value: yaml.Node, schema: type, typed: Any) -> None:
    """A key names a setting (nested mappings key by key) and its value fits the setting's type."""
    line = f"{path}:{key.start_mark.line + 1}"
    node: type | None = schema
    for depth, name in enumerate(dotted.split(".")):
        fields = typing.get_type_hints(node) if node is not None else {}
        if name not in fields:
            known = [".".join([*dotted.split(".")[:depth], field]) for field in fields]
            near = difflib.get_close_matches(dotted, known, n=1)
            sys.exit(f"{line}: {dotted}: no such setting" + (f"; did you mean {near[0]}?" if near else ""))
        node = _dataclass(fields[name])
    if node is not None and isinstance(value, yaml.MappingNode):
        for inner_key, inner_value in value.value:
            _check_key(path, f"{dotted}.{inner_key.value}", inner_key, inner_value, schema, typed)
        return
    plain = yaml.safe_load(yaml.serialize(value))
    if isinstance(plain, str) and "${" in plain:
        return  # an interpolation: resolved by Hydra, later
    try:
        OmegaConf.update(typed, dotted, plain, merge=True)
    except OmegaConfBaseException as error:
        sys.exit(f"{line}: {dotted}: {str(error).splitlines()[0]}")


def _dataclass(kind: Any) -> type | None:
    """The dataclass a field holds (``Optional[SomeConfig]`` included), else None."""
    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        kind = next((option for option in typing.get_args(kind) if option is not type(None)), kind)
    return kind if dataclasses.is_dataclass(kind) else None
