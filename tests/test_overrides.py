"""Overrides as text: values written so that Hydra's parser reads them back, recipes merged."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser

from transformer.overrides import merge_overrides, override_value


@pytest.mark.parametrize("value, text", [
    ("en", "en"), ("/runs/a-1.2/seed_3", "/runs/a-1.2/seed_3"), (Path("/runs/b"), "/runs/b"),
    ("/runs (v2)/corpus", "'/runs (v2)/corpus'"), ("a,b", "'a,b'"),  # a comma would make a sweep
    ("null", "'null'"), ("1e-3", "'1e-3'"), ("123", "'123'"), ("1e1_0", "'1e1_0'"), ("true", "'true'"),  # strings, not other types
    ("it's", "'it\\'s'"), ("C:\\new", "'C:\\new'"), ("end\\", "'end\\\\'"),  # one backslash kept, one doubled
    (None, "null"), (False, "false"), (3, "3"), (0.5, "0.5"), (["/x y", "z"], "['/x y',z]"),
])
def test_override_value_writes_what_the_parser_reads_back(value, text) -> None:
    assert override_value(value) == text
    expected = str(value) if isinstance(value, Path) else value
    assert OverridesParser.create().parse_override(f"key={text}").value() == expected


def test_every_short_string_of_awkward_characters_reads_back_as_itself() -> None:
    parser = OverridesParser.create()
    for length in range(1, 5):
        for characters in itertools.product(["a", "\\", "'", '"', " ", ",", "=", "[", "é", "1", "e", "_"],
                                            repeat=length):
            value = "".join(characters)
            assert parser.parse_override(f"key={override_value(value)}").value() == value, value


def test_merge_overrides_keeps_the_runs_recipe_under_this_commands_values() -> None:
    earlier = ["model=mini", "training.lr=2e-3", "hydra.run.dir=/runs/a", "training.max_epochs=38", "+extra=1",
               "model@other=tiny", "data.cache_dir=${data.dir}/c"]
    now = ["resume=/runs/a", "training.max_epochs=40", "++extra=2", "model=small"]
    assert merge_overrides(earlier, now) == [  # resume and Hydra's own settings are no part of a recipe
        "training.lr=2e-3", "model@other=tiny", "data.cache_dir=${data.dir}/c", "training.max_epochs=40", "++extra=2",
        "model=small"]
