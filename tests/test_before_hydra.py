"""The checks each command makes of its command line before Hydra writes anything."""

from __future__ import annotations

import pytest
from conftest import CONFIG_DIR

from transformer.app import before_hydra
from transformer.app.schemas import EvaluateConfig
from transformer.config import TrainConfig


def test_shell_completion_and_configs_from_elsewhere_are_left_to_hydra(tmp_path):
    for argv in (["-sc", "install=bash"], ["--config-dir", str(tmp_path), "mygroup=x"],
                 ["hydra.searchpath=[file://x]", "mygroup=x"]):
        before_hydra.refuse_mistyped_keys(TrainConfig, argv, CONFIG_DIR / "train.yaml")  # no exit
    with pytest.raises(SystemExit, match="^mygroup: no such setting; the settings here: data, model, training, eval, "
                                         "output_dir, resume, device, debug, experiment$"):
        before_hydra.refuse_mistyped_keys(TrainConfig, ["mygroup=x"], CONFIG_DIR / "train.yaml")


def test_a_group_the_command_does_not_choose_from_is_refused_with_its_own_settings():
    with pytest.raises(SystemExit, match="^model: no such setting; "):  # evaluate takes its model from the run
        before_hydra.refuse_mistyped_keys(EvaluateConfig, ["run_dir=x", "model=small"], CONFIG_DIR / "evaluate.yaml")
    before_hydra.refuse_mistyped_keys(EvaluateConfig, ["run_dir=x", "eval=greedy"], CONFIG_DIR / "evaluate.yaml")


def test_a_group_option_that_is_not_there_is_refused_in_one_line_naming_the_nearest():
    root = CONFIG_DIR / "train.yaml"
    options = sorted(path.stem for path in (CONFIG_DIR / "model").glob("*.yaml"))
    assert {"tiny", "small", "base"} <= set(options)
    with pytest.raises(SystemExit, match=rf"^model=tinyy: no such option; did you mean model=tiny\? The options: "
                                         rf"{', '.join(options)}$"):
        before_hydra.refuse_unknown_options(["debug=cpu_tiny", "model=tinyy", "--cfg", "job"], root)
    with pytest.raises(SystemExit, match=r"^experiment=zzz: no such option; the options: attention_additive, "):
        before_hydra.refuse_unknown_options(["experiment=zzz"], root)
    for argv in (["model=tiny", "debug=cpu_tiny", "training.lr=1"], ["model=tiny,huge"], ["~experiment"],
                 ["hydra/job_logging=stderr"],  # a sweep's options: each job is checked in .sweeps
                 ["--config-dir", "extra", "model=mine"], ["hydra.searchpath=[file:///extra]", "model=mine"]):
        before_hydra.refuse_unknown_options(argv, root)


@pytest.mark.parametrize("argv, message", [
    (["training.lr"], "training.lr: not an override; give KEY=VALUE or GROUP=OPTION (or ~KEY to delete one)"),
    (["model=small", "training.lr=[1"], "training.lr=[1: not an override Hydra can read (no viable alternative at "
                                        "input '[1'); put a value with other characters than letters, digits, "
                                        "spaces and _-+./:\\ in quotes ('KEY=\"VALUE\"' in a shell), a list in "
                                        "brackets (KEY=[A,B])"),
    (["model=tiny,"], "model=tiny,: not an override Hydra can read (mismatched input '<EOF>'); put a value"),
    (["data.dir='my corpus"], "data.dir='my corpus: not an override Hydra can read (a quote left open at character "
                              "10); put a value"),
    (["data.source_dir=/tmp/données"], "data.source_dir=/tmp/données: not an override Hydra can read ('é' at "
                                       "character 26); put a value"),
    (["-m", "model=tiny,small", "--cfg", "job"], "--cfg and --multirun: Hydra does one of --run, --multirun, --cfg "
                                                 "and --info at a time; give one"),
    (["--cfg=job", "-r"], "--cfg and --run: Hydra does one of"),
])
def test_a_malformed_override_is_refused_in_one_line_naming_it(argv, message):
    with pytest.raises(SystemExit) as refused:
        before_hydra.refuse_malformed_overrides(argv)
    assert refused.value.code.startswith(message) and "\n" not in refused.value.code and "https" not in refused.value.code


def test_flags_and_their_values_are_not_taken_for_overrides():
    for argv in (["--cfg", "job", "model=tiny"], ["-c", "hydra"], ["--info", "searchpath", "model=tiny"], ["--info"],
                 ["-cn", "train", "-cp", "configs", "--help"], ["-m", "training.lr=1e-3,2e-3", "data.dir=a b"],
                 ["~experiment", "+training.max_steps=3", "eval@x=greedy"], ["-sc", "query=tra"]):
        before_hydra.refuse_malformed_overrides(argv)


def test_a_config_file_that_is_not_yaml_is_refused_naming_its_file_and_line(tmp_path):
    before_hydra.refuse_malformed_yaml([], CONFIG_DIR)  # the shipped configs: no exit
    (tmp_path / "experiment").mkdir()
    broken = tmp_path / "experiment" / "broken.yaml"
    broken.write_text("# a list left open\ntraining:\n  max_steps: [\n")
    for argv in (["--config-dir", str(tmp_path)], [f"--config-dir={tmp_path}"], ["-cd", str(tmp_path)]):
        with pytest.raises(SystemExit, match=rf"^{broken}:4: not valid YAML \(.*while parsing a flow node\)$"):
            before_hydra.refuse_malformed_yaml([*argv, "experiment=broken"], CONFIG_DIR)
    broken.write_text("a: 1\n\tb: 2\n")
    with pytest.raises(SystemExit, match=rf"^{broken}:2: not valid YAML \(found character '\\t' that cannot start"):
        before_hydra.refuse_malformed_yaml(["-cd", str(tmp_path)], CONFIG_DIR)
    broken.write_text("max_steps: 1\nmax_steps: 2\n")  # read by PyYAML's fast loader, refused by Hydra's
    with pytest.raises(SystemExit, match=rf"^{broken}:2: not valid YAML \(found duplicate key max_steps"):
        before_hydra.refuse_malformed_yaml(["-cd", str(tmp_path)], CONFIG_DIR)
    broken.write_text("x: !Ref y\n")  # another tool's tag, or several documents: left to Hydra, if it reads them
    (tmp_path / "mkdocs.yaml").write_text("a: 1\n---\nb: 2\n")
    before_hydra.refuse_malformed_yaml(["-cd", str(tmp_path)], CONFIG_DIR)
    before_hydra.refuse_malformed_yaml(["--config-dir"], CONFIG_DIR)  # no folder given: Hydra says so
