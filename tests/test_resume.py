"""Resuming: which configs may continue a checkpoint (refused by key, allowed, or allowed with a warning), what
``resume=`` may point at, and the recipe a run was started with."""

from __future__ import annotations

import copy
import functools
import re
from dataclasses import replace

import pytest
import torch
from omegaconf import OmegaConf

from transformer.checkpoint import CheckpointError, RunDir
from transformer.config import ConfigError, TrainConfig, TrainingConfig, to_plain_dict
from transformer.runtime import resolve_training
from transformer.training.checkpoints import CheckpointManager, save_checkpoint
from transformer.training.resume import (
    abandon_later_history,
    check_process_count,
    check_resume_config,
    load_for_resume,
    saved_recipe,
)


def _weights_only(step: int = 0) -> dict:
    """A checkpoint with training state but no config."""
    return {"model": {"w": torch.ones(2)}, "step": step, "optimizer": {"state": {}, "param_groups": []}}


def _set(tree: dict, dotted: str, value) -> dict:
    """A deep copy of ``tree`` with ``dotted`` set to ``value``."""
    tree = copy.deepcopy(tree)
    *parents, leaf = dotted.split(".")
    node = tree
    for key in parents:
        node = node[key]
    node[leaf] = value
    return tree


CPU = torch.device("cpu")
SAVED = to_plain_dict(replace(TrainConfig(), training=resolve_training(TrainingConfig(), CPU)))  # as a run saves it


@pytest.mark.parametrize(("key", "value"), [
    ("training.max_tokens", 4097), ("training.accumulate", 7), ("training.seed", 99),
    ("training.pad_to_multiple", 3), ("data.max_len", 17), ("data.max_pairs", 10), ("data.src", "fr"),
    ("data.tokenizer.vocab_size", 123), ("model.d_model", 24), ("model.glove.freeze", True),
    ("data.train_dir", "diversified"),
])
def test_resume_refuses_a_setting_that_changes_batches_or_model(key, value):
    current = _set(SAVED, key, value)
    old = functools.reduce(lambda node, k: node[k], key.split("."), SAVED)
    assert old != value, "choose a value other than the default"
    with pytest.raises(ConfigError, match=re.escape(f"{key}: the checkpoint run/last.pt was trained with {old!r}, "
                                                    f"the config says {value!r}; resume with the same")):
        check_resume_config(SAVED, current, "run/last.pt")


def test_a_corpus_folder_named_relative_or_absolute_is_the_same_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    saved = _set(SAVED, "data.dir", "corp")  # a run before version 0.9.2 recorded it as given
    check_resume_config(saved, _set(SAVED, "data.dir", str(tmp_path / "corp")), "run/last.pt")
    with pytest.raises(ConfigError, match=r"data\.dir: the checkpoint run/last\.pt was trained with 'corp'"):
        check_resume_config(saved, _set(SAVED, "data.dir", str(tmp_path / "other")), "run/last.pt")


def test_a_corpus_that_moved_is_resumed_where_the_checkpoint_can_check_its_training_split(caplog):
    saved, moved = _set(SAVED, "data.dir", "/data/corpus"), _set(SAVED, "data.dir", "/elsewhere/corpus")
    with pytest.raises(ConfigError, match=r"data\.dir: the checkpoint .* was trained with '/data/corpus'"):
        check_resume_config(saved, moved, "run/last.pt")  # no digest (before version 0.9.2): the folder must match
    with caplog.at_level("WARNING"):
        check_resume_config(saved, moved, "run/last.pt", digest_checked=True)
    assert "data.dir: the checkpoint run/last.pt was trained on the corpus in /data/corpus, this run reads " \
           "/elsewhere/corpus: it continues if the training split there holds the same pairs" in caplog.text
    with pytest.raises(ConfigError, match=r"data\.train_dir: "):  # another split of the corpus is another corpus
        check_resume_config(saved, _set(moved, "data.train_dir", "diversified"), "run/last.pt", digest_checked=True)


@pytest.mark.parametrize(("key", "value"), [
    ("training.max_steps", 50), ("training.max_epochs", 3), ("training.max_minutes", 5.0),
    ("training.validate_every_steps", 10), ("training.keep_last", 9), ("training.log_every_steps", 1),
    ("training.save_every_steps", 4), ("eval.beam_size", 2), ("output_dir", "x"), ("resume", "y"),
    ("data.cache_dir", "z"), ("model.glove.path", "vectors.txt"), ("model.glove.rescale", False),
])
def test_resume_allows_stopping_logging_and_init_only_settings_silently(key, value, caplog):
    with caplog.at_level("WARNING"):
        check_resume_config(SAVED, _set(SAVED, key, value), "run/last.pt")
    assert not caplog.records


@pytest.mark.parametrize(("key", "value"), [("training.lr", 0.5), ("training.warmup_steps", 3),
                                            ("training.label_smoothing", 0.0), ("training.clip_grad_norm", 9.0),
                                            ("training.patience", 5)])  # a null saved is compared like any value
def test_resume_warns_naming_an_optimisation_setting(key, value, caplog):
    with caplog.at_level("WARNING"):
        check_resume_config(SAVED, _set(SAVED, key, value), "run/last.pt")
    assert [r.levelname for r in caplog.records] == ["WARNING"]
    assert caplog.records[0].getMessage().startswith(f"{key}: the checkpoint run/last.pt was trained with ")


def test_an_eager_run_resumed_on_a_gpu_is_told_how_to_keep_its_step(caplog):
    on_gpu = _set(SAVED, "training.cuda_graphs", True)  # the saved run's other values: only the step changes
    with caplog.at_level("WARNING"):
        check_resume_config(SAVED, on_gpu, "run/last.pt")
    message = caplog.records[0].getMessage()
    assert len(caplog.records) == 1 and message.startswith("training.cuda_graphs: the checkpoint run/last.pt was "
                                                           "trained with False, this run resolves True")
    assert message.endswith("training.cuda_graphs=false keeps the step as it was")


def test_resume_compares_only_keys_both_configs_have():
    older = copy.deepcopy(SAVED)
    del older["training"]["max_tokens"]  # a checkpoint from before the key existed
    check_resume_config(older, _set(SAVED, "training.max_tokens", 4097), "run/last.pt")


def test_resume_treats_a_model_key_the_checkpoint_lacks_as_its_default():
    older = copy.deepcopy(SAVED)
    del older["model"]["attention"], older["model"]["max_relative_distance"]  # a checkpoint from before them
    check_resume_config(older, SAVED, "run/last.pt")  # today's defaults: the same model
    with pytest.raises(ConfigError, match=re.escape("model.attention.score: the checkpoint run/last.pt was trained "
                                                    "with 'scaled_dot', the config says 'additive'")):
        check_resume_config(older, _set(SAVED, "model.attention.score", "additive"), "run/last.pt")


def test_resume_treats_a_data_key_the_checkpoint_lacks_as_its_default():
    older = copy.deepcopy(SAVED)
    del older["data"]["train_dir"]  # a checkpoint from before version 0.5
    check_resume_config(older, SAVED, "run/last.pt")
    with pytest.raises(ConfigError, match=re.escape("data.train_dir: the checkpoint run/last.pt was trained with "
                                                    "None, the config says 'diversified'")):
        check_resume_config(older, _set(SAVED, "data.train_dir", "diversified"), "run/last.pt")


def test_the_refusal_gives_the_overrides_that_continue_the_run_as_trained(compose_config, caplog):
    # what a run of the defaults before version 0.2 saved: the small model, two 2048-position batches per step
    before = SAVED
    for key, value in [("model.d_model", 256), ("model.d_ff", 1024), ("model.n_encoder_layers", 3),
                       ("model.n_decoder_layers", 3), ("model.attention_dropout", 0.0), ("training.lr", 1e-3),
                       ("training.max_epochs", 19), ("training.max_tokens", 2048), ("training.accumulate", 2),
                       ("training.betas", [0.9, 0.99]), ("training.weight_decay", 0.0), ("training.patience", 8)]:
        before = _set(before, key, value)
    with pytest.raises(ConfigError) as refusal:
        check_resume_config(before, SAVED, "run/last.pt")
    message = str(refusal.value)
    assert message.startswith("model.attention_dropout: the checkpoint run/last.pt was trained with 0.0, the config "
                              "says 0.1; resume with the same model settings.")
    hint = message.split("To continue it as it was trained, add: ")[1].split()
    assert hint == ["model.attention_dropout=0.0", "model.d_ff=1024", "model.d_model=256", "model.n_decoder_layers=3",
                    "model.n_encoder_layers=3", "training.accumulate=2",  # max_tokens 2048 is today's default
                    "training.betas=[0.9,0.99]", "training.lr=0.001", "training.patience=8",  # refused, then warned
                    "training.weight_decay=0.0"]

    def resumable(overrides: list[str]) -> None:  # passes, and warns of no changed optimisation setting
        cfg = OmegaConf.to_object(compose_config("train", [*overrides, "output_dir=/runs/x"]))
        cfg = replace(cfg, training=resolve_training(cfg.training, CPU), data=TrainConfig().data)
        caplog.clear()
        check_resume_config(before, to_plain_dict(cfg), "run/last.pt")
        assert not caplog.records

    resumable([*hint, "training.max_epochs=19"])  # max_epochs may differ: it is given to stop at the same place
    resumable(["experiment=multi30k_small", "training.betas=[0.9,0.99]"])  # the old recipe, named


def test_a_version_0_3_run_resumes_with_its_named_recipe(compose_config, caplog):
    # version 0.3's default: today's model and schedule in 4096-position batches, early stopping after 8 validations,
    # no weight decay
    v03 = _set(_set(_set(SAVED, "training.max_tokens", 4096), "training.patience", 8), "training.weight_decay", 0.0)
    with pytest.raises(ConfigError) as refusal:
        check_resume_config(v03, SAVED, "run/last.pt")
    assert str(refusal.value).split("add: ")[1].split() == ["training.max_tokens=4096", "training.patience=8",
                                                            "training.weight_decay=0.0"]
    with caplog.at_level("WARNING"):  # the batches alone: it resumes, warned of the new stopping rule and decay
        check_resume_config(v03, _set(SAVED, "training.max_tokens", 4096), "run/last.pt")
    assert [r.getMessage().split(":")[0] for r in caplog.records] == ["training.patience", "training.weight_decay"]
    cfg = OmegaConf.to_object(compose_config("train", ["experiment=multi30k_v03", "output_dir=/runs/x"]))
    cfg = replace(cfg, training=resolve_training(cfg.training, CPU), data=TrainConfig().data)
    caplog.clear()
    check_resume_config(v03, to_plain_dict(cfg), "run/last.pt")
    assert not caplog.records  # the same batches and the same stopping rule


def test_resume_on_another_kind_of_device_is_refused_by_the_resolved_padding():
    on_gpu = to_plain_dict(replace(TrainConfig(), training=resolve_training(TrainingConfig(), torch.device("cuda"))))
    with pytest.raises(ConfigError, match=r"training\.pad_to_multiple: the checkpoint run/last.pt was trained with 1, "
                                          r"the config says 8"):
        check_resume_config(SAVED, on_gpu, "run/last.pt")
    # runs before version 0.2 could also leave max_tokens and accumulate to the device: not known, so not compared
    older = _set(_set(SAVED, "training.pad_to_multiple", None), "training.max_tokens", None)
    check_resume_config(older, _set(SAVED, "training.max_tokens", 4096), "run/last.pt")


def test_load_for_resume_takes_a_run_directory_or_a_checkpoint_file(tmp_path):
    run = RunDir(tmp_path / "run")
    CheckpointManager(run.checkpoints, keep_last=2).save({**_weights_only(3), "config": SAVED}, 3, is_best=True)
    for target in (run.root, run.checkpoints / "step_3.pt"):
        state, found, path = load_for_resume(target, SAVED)
        assert found == run and state["step"] == 3 and path == (run.last if target == run.root else target)
    with pytest.raises(ConfigError, match="training.seed: "):
        load_for_resume(run.root, _set(SAVED, "training.seed", 5))
    save_checkpoint(_weights_only(3), run.last)
    with pytest.raises(CheckpointError, match="holds no resolved config"):
        load_for_resume(run.root, SAVED)


def test_a_runs_recipe_comes_from_its_checkpoint_else_from_hydras_record(tmp_path):
    run = RunDir(tmp_path / "run")
    (run.root / ".hydra").mkdir(parents=True)
    (run.root / ".hydra" / "overrides.yaml").write_text("- model=mini\n- data.cache_dir=${data.dir}/c\n")
    save_checkpoint(_weights_only(), run.last)  # an older run: no recipe in its checkpoints
    assert saved_recipe(run.root) == ["model=mini", "data.cache_dir=${data.dir}/c"]  # as typed
    save_checkpoint({**_weights_only(), "recipe": ["model=tiny"]}, run.last)
    assert saved_recipe(run.root) == saved_recipe(run.last) == ["model=tiny"]
    (tmp_path / "elsewhere" / "checkpoints").mkdir(parents=True)
    save_checkpoint(_weights_only(), tmp_path / "elsewhere" / "checkpoints" / "x.pt")
    assert saved_recipe(tmp_path / "elsewhere" / "checkpoints" / "x.pt") is None  # neither kept a recipe


def test_resume_of_a_runs_checkpoints_folder_means_the_run(tmp_path):
    run = RunDir(tmp_path / "run")
    save_checkpoint({**_weights_only(3), "config": SAVED}, run.last)
    state, resumed_run, path = load_for_resume(run.checkpoints, SAVED)
    assert (resumed_run.root, path, state["step"]) == (run.root, run.last, 3)


def test_resume_names_a_target_that_is_missing_or_outside_a_run(tmp_path):
    with pytest.raises(ConfigError, match=r"^resume: .*nowhere does not exist"):
        load_for_resume(tmp_path / "nowhere", SAVED)
    loose = tmp_path / "copied.pt"  # a checkpoint file outside a run: which run would the resume write into?
    save_checkpoint({**_weights_only(3), "config": SAVED}, loose)
    with pytest.raises(ConfigError, match=r"^resume: .*copied.pt is not a run directory nor a checkpoint in a run's "
                                          r"checkpoints/ folder"):
        load_for_resume(loose, SAVED)
    started = RunDir(tmp_path / "started")  # stopped before its first save: .hydra/ and a log, no checkpoint
    started.checkpoints.mkdir(parents=True)
    for target in (started.root, started.checkpoints):
        with pytest.raises(ConfigError, match=rf"^resume: {started.root} holds no checkpoint \(a run stopped before its "
                                              rf"first save, or not a run's folder\): start the run anew, with its "
                                              rf"overrides and hydra\.run\.dir={started.root}$"):
            load_for_resume(target, SAVED)
    corpus = tmp_path / "corpus"  # a folder of anything else: a run must not be started into it
    corpus.mkdir()
    (corpus / "train.en").write_text("a\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=rf"^resume: {corpus} is not a run's folder \(no checkpoints/, train\.log or "
                                          r"\.hydra/\); give the folder of the run to continue"):
        load_for_resume(corpus, SAVED)


def _history(run: RunDir, steps: list[int], best: int) -> CheckpointManager:
    """A run's checkpoints folder after validations at ``steps`` (``best`` the best of them), rotated to 3."""
    manager = CheckpointManager(run.checkpoints, keep_last=3)
    for step in steps:
        manager.save({**_weights_only(step), "config": SAVED, "best_step": min(step, best)}, step, is_best=step <= best)
    return manager


def test_resuming_an_earlier_checkpoint_sets_the_later_history_aside(tmp_path):
    run = RunDir(tmp_path / "run")
    manager = _history(run, [10, 20, 30, 40], best=40)
    state, _, path = load_for_resume(run.checkpoints / "step_20.pt", SAVED)
    assert not abandon_later_history(manager, state, path)
    kept = sorted(p.name for p in run.checkpoints.glob("*.pt"))
    assert kept == ["best.pt", "last.pt", "step_20.pt"]  # best.pt is the resumed history's best again: step 20
    assert torch.load(run.best, weights_only=True)["step"] == 20 and manager.recent(5) == [run.checkpoints / "step_20.pt"]
    assert torch.load(run.last, weights_only=True)["step"] == 20  # a run stopped before its next save resumes here
    aside = run.checkpoints / "abandoned_after_step_20"
    assert sorted(p.name for p in aside.iterdir()) == ["best.pt", "last.pt", "step_30.pt", "step_40.pt"]  # nothing lost
    assert torch.load(aside / "last.pt", weights_only=True)["step"] == 40
    assert not abandon_later_history(manager, state, path)  # the history is already the resumed one: nothing to move


def test_resuming_when_the_best_checkpoint_was_rotated_away_forgets_the_best_record(tmp_path):
    run = RunDir(tmp_path / "run")
    manager = _history(run, [10, 20, 30, 40, 50], best=20)  # step_20.pt rotated away, best.pt still holds step 20
    state, _, path = load_for_resume(run.checkpoints / "step_30.pt", SAVED)
    assert not abandon_later_history(manager, state, path)  # best.pt (step 20) belongs to the resumed history: kept
    assert torch.load(run.best, weights_only=True)["step"] == 20
    manager = _history(RunDir(tmp_path / "other"), [10, 20, 30, 40, 50], best=50)
    state, _, path = load_for_resume(tmp_path / "other" / "checkpoints" / "step_30.pt", SAVED)
    state["best_step"] = 10  # the resumed history's best, rotated away long ago
    assert abandon_later_history(manager, state, path)
    assert not manager.best_path.exists()


def test_an_epoch_begun_by_two_processes_is_finished_only_by_two():
    mid_epoch = {"rng": [{}, {}], "sampler": {"position": 17}, "epoch": 2}
    check_process_count(mid_epoch, world_size=2)
    with pytest.raises(CheckpointError, match=r"written by 2 process\(es\) in the middle of epoch 3, this run has 1"):
        check_process_count(mid_epoch, world_size=1)
    check_process_count({**mid_epoch, "sampler": {"position": 0}}, world_size=1)  # at an epoch's end: any number
    check_process_count({**mid_epoch, "sampler": {"position": 17, "batches": 17}}, world_size=1)  # its last step
