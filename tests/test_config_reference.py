"""The configuration reference is generated from the schemas: every key has help, and the committed page is what
the generator writes."""

from __future__ import annotations

from conftest import REPO

from transformer.app import config_reference


def test_every_key_of_every_command_has_help():
    assert config_reference.missing_help() == []


def test_the_committed_reference_is_what_the_generator_writes():
    committed = (REPO / "docs" / "reference" / "configuration.md").read_text(encoding="utf-8")
    assert committed == config_reference.page(), (
        "docs/reference/configuration.md is out of date: python -m transformer.app.config_reference "
        "> docs/reference/configuration.md")


def test_help_comes_from_the_schemas_comments():
    rows = {key: (kind, default, text) for key, kind, default, text in config_reference.rows(
        config_reference.COMMANDS["transformer-train"])}
    assert rows["training.max_minutes"][1:] == ("`58.0`", "Training time of the whole run (validation included; a "
                                                "resumed run counts its earlier time). Where it runs out before "
                                                "max_epochs / max_steps, projected from the pace so far, the cosine "
                                                "schedule ends there (Trainer), so a slower machine trains fewer "
                                                "steps but still anneals; null: every epoch, however long it takes.")
    assert rows["training.lr"] == ("float", "`0.002`", "peak learning rate, reached at the end of warm-up")
    assert rows["model.positions"][0] == ("`sinusoidal` \\| `learned` \\| `relative` \\| `rope` \\| `none`")
    assert rows["training.max_steps"][:2] == ("int or null", "null")


def test_defaults_are_what_each_command_composes_not_the_schemas():
    def defaults(command: str) -> dict[str, str]:
        cls = config_reference.COMMANDS[command]
        return {key: default for key, _, default, _ in
                config_reference.rows(cls, defaults=config_reference.composed_defaults(command))}

    assert defaults("transformer-diversify")["eval.beam_size"] == "`5`"  # diversify.yaml, over the schema's 8
    assert defaults("transformer-evaluate")["eval.beam_size"] == "`8`"
    train = defaults("transformer-train")
    assert train["data.source_dir"] == "`$MULTI30K_DIR`, else null"  # ${oc.env:MULTI30K_DIR,null}
    assert train["output_dir"].startswith("the run's folder")
    assert config_reference._format("${oc.env:GLOVE_PATH}") == "`$GLOVE_PATH` (required)"  # no fallback: unset fails
