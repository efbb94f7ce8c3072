"""The configuration reference, generated from the schemas: every key by the dotted name typed on the command line,
with its type, default and help. The help is the comment the schema gives the field (on its line, or the comment
lines right above it), and the default is what the command's own YAML composes to (its groups' choices
included), so the reference and the code cannot drift apart.

    python -m transformer.app.config_reference > docs/reference/configuration.md

``tests/test_config_reference.py`` fails when a key has no help or when the committed page differs from this output.
"""

from __future__ import annotations

import ast
import dataclasses
import enum
import inspect
import io
import sys
import tokenize
import typing
from typing import Any

from transformer import config
from transformer.app import schemas

COMMANDS = {  # the root schema of each command (its root YAML: the name after transformer-), as its page section
    "transformer-train": config.TrainConfig,
    "transformer-evaluate": schemas.EvaluateConfig,
    "transformer-translate": schemas.TranslateConfig,
    "transformer-serve": schemas.ServeConfig,
    "transformer-export": schemas.ExportConfig,
    "transformer-prepare-data": schemas.PrepareDataConfig,
    "transformer-diversify": schemas.DiversifyConfig,
    "transformer-benchmark": schemas.BenchmarkConfig,
}


def field_comments(cls: type) -> dict[str, str]:
    """``{field: help}`` from the comments of a dataclass's source: a field's inline comment, else the block of
    comment lines right above it."""
    source = inspect.getsource(cls)
    comments = {start[0]: text.lstrip("#").strip() for kind, text, start, _, _ in
                tokenize.generate_tokens(io.StringIO(source).readline) if kind == tokenize.COMMENT}
    lines = source.splitlines()
    out = {}
    for node in ast.parse(source).body[0].body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            row = node.lineno
            if row in comments and not lines[row - 1].lstrip().startswith("#"):
                out[node.target.id] = comments[row]
                continue
            above = []
            while row - 1 in comments and lines[row - 2].lstrip().startswith("#"):
                above.insert(0, comments[row - 1])
                row -= 1
            if above:
                out[node.target.id] = " ".join(above)
    return out


def _type_name(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    if origin is typing.Union:
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return f"{' | '.join(_type_name(a) for a in args)} or null"
    if origin is list:
        return f"list of {_type_name(typing.get_args(annotation)[0])}"
    if origin is dict:
        return "mapping"
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return " \\| ".join(f"`{member.value}`" for member in annotation)
    return getattr(annotation, "__name__", str(annotation))


def _schema_default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return "???"


def _format(value: Any) -> str:
    if isinstance(value, enum.Enum):
        value = value.value
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if value == "???":
        return "required"
    if value == "${hydra:runtime.output_dir}":
        return "the run's folder, `outputs/<command>/<date_time>` (`hydra.run.dir`)"
    if isinstance(value, str) and value.startswith("${oc.env:"):  # ${oc.env:NAME,fallback}
        name, comma, fallback = value.removeprefix("${oc.env:").removesuffix("}").partition(",")
        if not comma:
            return f"`${name}` (required)"
        return f"`${name}`, else {_format(None if fallback == 'null' else fallback)}"
    return f"`{value!r}`" if isinstance(value, str) else f"`{value}`"


def composed_defaults(command: str) -> dict[str, Any]:
    """``{dotted key: value}`` of the config ``command`` composes with no overrides (interpolations unresolved)."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from transformer.app.schemas import CONFIG_PATH, register_configs

    register_configs()
    with initialize_config_dir(config_dir=CONFIG_PATH, version_base="1.3"):
        tree = OmegaConf.to_container(compose(command.removeprefix("transformer-").replace("-", "_")), resolve=False)

    def flat(node: dict[str, Any], prefix: str = "") -> dict[str, Any]:
        out = {}
        for key, value in node.items():
            out.update(flat(value, f"{prefix}{key}.") if isinstance(value, dict) else {f"{prefix}{key}": value})
        return out

    return flat(tree)


def rows(cls: type, prefix: str = "", defaults: dict[str, Any] | None = None) -> list[tuple[str, str, str, str]]:
    """``(dotted key, type, default, help)`` for every leaf key of ``cls``, nested configs flattened; the default
    from ``defaults`` (a command's composed YAML) where it has the key, else the schema's."""
    hints = typing.get_type_hints(cls)
    helps = field_comments(cls)
    defaults = defaults or {}
    out = []
    for f in dataclasses.fields(cls):
        kind, key = hints[f.name], f"{prefix}{f.name}"
        if dataclasses.is_dataclass(kind):
            out += rows(kind, f"{key}.", defaults)
        else:
            out.append((key, _type_name(kind), _format(defaults.get(key, _schema_default(f))), helps.get(f.name, "")))
    return out


def missing_help() -> list[str]:
    """Keys that have no help, as ``command: key``."""
    return [f"{command}: {key}" for command, cls in COMMANDS.items() for key, _, _, help_text in rows(cls)
            if not help_text]


def page() -> str:
    parts = ["# Configuration reference", "",
             "Every setting of every command, as typed on its command line (`transformer-train training.lr=1e-3`),",
             "with its type, default and help. The default is what the command starts from: its YAML in `configs/`",
             "with its default groups (`$NAME, else ...`: the environment variable, where it is set). Generated",
             "from the schemas in `transformer/config.py` and `transformer/app/schemas.py` and the YAML by",
             "`python -m transformer.app.config_reference`; the config groups that set several at once are in",
             "[Configuration](../guide/configuration.md).", ""]
    for command, cls in COMMANDS.items():
        parts += [f"## {command}", "", "| key | type | default | help |", "| --- | --- | --- | --- |"]
        for key, kind, default, help_text in rows(cls, defaults=composed_defaults(command)):
            parts.append(f"| `{key}` | {kind} | {default} | {help_text.replace('|', chr(92) + '|')} |")
        parts.append("")
    return "\n".join(parts)


if __name__ == "__main__":
    sys.stdout.write(page())
