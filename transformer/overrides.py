"""Hydra command-line overrides as text: a value written in the override grammar, and two lists of overrides merged.

The commands write overrides for other commands (a recipe's runs, a resumed run's recipe, the settings a refused
resume suggests); a path goes into them as a value, and may hold what the grammar parses (a space, a comma, brackets,
quotes, ``=``) or look like another type (``null``, ``1e-3``).
"""

from __future__ import annotations

import re
from pathlib import PurePath
from typing import Any

_PLAIN = re.compile(r"[\w./+-]+", re.ASCII)  # what the grammar reads back as the same string, unquoted
_BEFORE_A_QUOTE_OR_THE_END = re.compile(r"(\\*)('|$)")  # a quoted value's other backslashes are read as they are
_NOT_A_STRING = re.compile(r"null|true|false|[+-]?(inf|nan)|[+-]?[\d_]*\.?[\d_]*(e[+-]?[\d_]+)?", re.IGNORECASE)


def override_value(value: Any) -> str:
    """``value`` as an override writes it: ``key=`` + this reads back as ``value`` (a string or path stays one).

    ``None`` is ``null``, a bool ``true``/``false``, a list ``[a,b]``; a string or path is single-quoted where the
    grammar would parse it or read it as another type (its quotes escaped, and the backslashes before a quote or at
    the end doubled), else left bare.
    """
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(override_value(item) for item in value) + "]"
    text = str(value)
    if isinstance(value, (str, PurePath)) and (not _PLAIN.fullmatch(text) or _NOT_A_STRING.fullmatch(text)):
        return "'" + _BEFORE_A_QUOTE_OR_THE_END.sub(lambda m: m[1] * 2 + ("\\'" if m[2] else ""), text) + "'"
    return text


def merge_overrides(earlier: list[str], now: list[str]) -> list[str]:
    """Command-line overrides ``earlier``, then ``now``; where both set the same key or group (in the same
    package), ``now``'s alone. Hydra's own settings and ``resume`` are left out of both: not part of a recipe."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    earlier_parsed, now_parsed = parser.parse_overrides(earlier), parser.parse_overrides(now)
    given = {(o.key_or_group, o.package) for o in now_parsed}
    kept = [o for o in earlier_parsed if (o.key_or_group, o.package) not in given] + now_parsed
    return [o.input_line for o in kept if o.key_or_group != "resume" and not o.key_or_group.startswith("hydra")]
