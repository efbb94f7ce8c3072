"""Checkpoints: round trip, atomic writes, clear load errors, rotation, averaging, the run directory's
names, and which weights a finished run keeps."""

from __future__ import annotations

import copy
import pickle
from pathlib import Path

import pytest
import torch

import transformer.checkpoint as checkpoint
from transformer.checkpoint import CHECKPOINT_VERSION, CheckpointError, RunDir, load_checkpoint
from transformer.config import Schedule
from transformer.training.checkpoints import (
    CheckpointManager,
    average_checkpoints,
    choose_final_weights,
    save_checkpoint,
    save_model,
)


def _state(value: float, step: int = 0) -> dict:
    return {
        "model": {"w": torch.full((2, 2), value), "b": torch.tensor([value]), "count": torch.tensor([step])},
        "step": step,
        "optimizer": {"state": {}, "param_groups": []},
        "sampler": {"epoch": 1, "position": 3},
        "rng": [{"python": (3, tuple(range(5)), None), "torch": torch.get_rng_state(), "cuda": []}],
        "config": {"training": {"lr": 1e-3, "betas": [0.9, 0.98], "schedule": "inverse_sqrt"}},
    }


def test_round_trip_keeps_every_value(tmp_path):
    state = _state(1.5, step=7)
    save_checkpoint(state, tmp_path / "c.pt")
    loaded = load_checkpoint(tmp_path / "c.pt")
    assert loaded["version"] == CHECKPOINT_VERSION
    assert torch.equal(loaded["model"]["w"], state["model"]["w"])
    assert torch.equal(loaded["rng"][0]["torch"], state["rng"][0]["torch"])
    assert loaded["rng"][0]["python"] == (3, (0, 1, 2, 3, 4), None)
    assert loaded["config"] == state["config"] and loaded["sampler"] == state["sampler"]


def test_crash_during_write_leaves_old_file_and_no_temp(tmp_path, monkeypatch):
    path = tmp_path / "last.pt"
    save_checkpoint(_state(1.0), path)
    before = path.read_bytes()

    def torn_save(obj, handle):
        handle.write(b"PK\x03\x04 half a checkpoint")
        raise OSError("disk full")

    monkeypatch.setattr(checkpoint.torch, "save", torn_save)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(_state(2.0), path)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.pt"]


def test_load_errors_name_the_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing.pt"):
        load_checkpoint(tmp_path / "missing.pt")
    good = tmp_path / "good.pt"
    save_checkpoint(_state(1.0), good)
    torn = tmp_path / "torn.pt"
    torn.write_bytes(good.read_bytes()[:200])
    with pytest.raises(CheckpointError, match="torn.pt.*truncated") as refused:
        load_checkpoint(torn)
    assert str(refused.value).endswith("its end is missing (the file was cut short while being written or copied)")
    run = tmp_path / "run" / "checkpoints"  # a torn last.pt names the checkpoint to resume from instead
    run.mkdir(parents=True)
    save_checkpoint(_state(1.0), run / "step_20.pt")
    (run / "last.pt").write_bytes(good.read_bytes()[:200])
    earlier = run / "step_20.pt"
    newest = rf"{earlier} is the newest step checkpoint of the same run"  # a torn last.pt of its own: maybe step 20
    with pytest.raises(CheckpointError, match=rf"truncated .*; {newest} \(resume={earlier}\)$"):
        load_checkpoint(run / "last.pt")
    with pytest.raises(CheckpointError, match=rf"truncated .*; {newest} \(checkpoint={earlier}\)$"):  # evaluate's key
        load_checkpoint(run / "last.pt", retry_key="checkpoint")
    with pytest.raises(CheckpointError, match=rf"truncated .*; {newest}$"):
        load_checkpoint(run / "last.pt", retry_key=None)
    text = tmp_path / "notes.pt"
    text.write_text("hello\nworld")
    with pytest.raises(CheckpointError, match="notes.pt.*not a file torch.save writes: it begins 'hello'$"):
        load_checkpoint(text)
    empty = tmp_path / "empty.pt"
    empty.write_bytes(b"")
    with pytest.raises(CheckpointError, match="empty.pt.*: the file is empty$"):
        load_checkpoint(empty)
    pickled = tmp_path / "pickled.pt"  # a pickle holding code: refused in one line, with no advice to load it anyway
    pickled.write_bytes(pickle.dumps({"model": object}, protocol=4))
    with pytest.raises(CheckpointError) as refused:
        load_checkpoint(pickled)
    assert "pickled.pt: not a readable checkpoint" in str(refused.value) and "\n" not in str(refused.value)
    assert "weights-only load refuses" in str(refused.value) and "weights_only" not in str(refused.value)
    foreign = tmp_path / "foreign.pt"
    torch.save({"weights": torch.zeros(1)}, foreign)
    with pytest.raises(CheckpointError, match="foreign.pt.*version"):
        load_checkpoint(foreign)
    future = tmp_path / "future.pt"
    torch.save({"version": CHECKPOINT_VERSION + 1}, future)
    with pytest.raises(CheckpointError, match=f"version {CHECKPOINT_VERSION + 1}"):
        load_checkpoint(future)
    with pytest.raises(CheckpointError, match=rf"is a folder, not a checkpoint file: .* or give a run's folder as "
                                              rf"run_dir={tmp_path}$"):
        load_checkpoint(tmp_path)  # checkpoint=RUN where run_dir=RUN was meant
    (tmp_path / "checkpoints").mkdir()
    with pytest.raises(CheckpointError, match=rf"\(e\.g\. {tmp_path}/checkpoints/final\.pt\), or give a run's folder "
                                              rf"as run_dir={tmp_path}$"):
        load_checkpoint(tmp_path / "checkpoints")  # checkpoint=RUN/checkpoints: the same run


def test_unsafe_pickles_are_refused(tmp_path):
    path = tmp_path / "evil.pt"
    torch.save({"version": CHECKPOINT_VERSION, "obj": Schedule.cosine}, path)  # an arbitrary class instance
    with pytest.raises(CheckpointError, match="evil.pt"):
        load_checkpoint(path)


def test_save_refuses_values_weights_only_cannot_load(tmp_path):
    with pytest.raises(CheckpointError, match=r"state\.config\.schedule.*Schedule"):
        save_checkpoint({"config": {"schedule": Schedule.cosine}}, tmp_path / "x.pt")
    assert not list(tmp_path.iterdir())


def test_manager_rotation_last_and_best(tmp_path):
    manager = CheckpointManager(tmp_path, keep_last=2)
    for step, best in ((10, True), (20, False), (30, False), (40, False)):
        manager.save(_state(float(step), step), step, is_best=best)
    assert [p.name for p in manager.step_paths()] == ["step_30.pt", "step_40.pt"]
    assert load_checkpoint(manager.latest())["step"] == 40
    assert load_checkpoint(manager.best_path)["step"] == 10  # survives the rotation of step_10.pt
    assert [p.name for p in manager.recent(1)] == ["step_40.pt"]
    manager.save(_state(41.0, 41), 41, is_best=False, periodic=False)
    assert load_checkpoint(manager.latest())["step"] == 41
    assert load_checkpoint(tmp_path / "step_40.pt")["step"] == 40  # last.pt was replaced, not written through
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best.pt", "last.pt", "step_30.pt", "step_40.pt"]


def test_average_checkpoints_by_hand(tmp_path):
    paths = []
    for i, value in enumerate((1.0, 2.0, 6.0)):
        paths.append(tmp_path / f"{i}.pt")
        save_checkpoint(_state(value, step=i), paths[-1])
    averaged = average_checkpoints(paths)
    assert torch.equal(averaged["w"], torch.full((2, 2), 3.0))
    assert torch.equal(averaged["b"], torch.tensor([3.0]))
    assert torch.equal(averaged["count"], torch.tensor([2]))  # integer buffers come from the last checkpoint
    bad = tmp_path / "bad.pt"
    save_checkpoint({"model": {"w": torch.zeros(3, 2), "b": torch.zeros(1), "count": torch.tensor([0])}}, bad)
    with pytest.raises(CheckpointError, match="bad.pt.*w has shape"):
        average_checkpoints([paths[0], bad])


# --------------------------------------------------------------------------------------------------
# Resume compatibility, run directory, final weights
# --------------------------------------------------------------------------------------------------


def test_run_dir_names_every_file():
    run = RunDir(Path("out"))
    names = ("best.pt", "last.pt", "final.pt")
    assert (run.best, run.last, run.final) == tuple(Path("out/checkpoints") / name for name in names)
    assert (run.metrics, run.tensorboard, run.test_hypotheses, run.log_file) == (
        Path("out/metrics.json"), Path("out/tensorboard"), Path("out/test.hyp.txt"), Path("out/train.log"))
    assert CheckpointManager(run.checkpoints, 1).last_path == run.last


def _checkpoints_with_best_at_step_2(folder) -> None:
    """Steps 1-4 (weights = the step number) with keep_last=3: step_2..4.pt remain; best.pt is step 2."""
    manager = CheckpointManager(folder, keep_last=3)
    for step in (1, 2, 3, 4):
        manager.save({**_state(float(step), step), "best_bleu": 20.0}, step, is_best=step == 2)


@pytest.mark.parametrize(("averaged_bleu", "expected"), [(25.0, "average of the last 3 checkpoints"),
                                                         (22.0, "best (step 2)"), (5.0, "best (step 2)")])
def test_final_weights_keep_the_average_only_when_it_validates_higher(tmp_path, averaged_bleu, expected):
    _checkpoints_with_best_at_step_2(tmp_path)
    scores = {2.0: 22.0, 3.0: averaged_bleu}  # by the weights' value: best.pt is 2, the mean of steps 2, 3, 4 is 3
    seen = []

    def validate(weights):
        seen.append(weights["w"][0, 0].item())
        return scores[seen[-1]]

    final = choose_final_weights(tmp_path, average_last=3, validate=validate)
    assert seen == [2.0, 3.0]  # both validated again: best.pt's own 20.0 came from another search
    assert final.source == expected
    assert final.valid_bleu == max(averaged_bleu, 22.0)
    assert final.weights["w"][0, 0].item() == (3.0 if averaged_bleu > 22.0 else 2.0)


@pytest.mark.parametrize("average_last", [0, 1])
def test_final_weights_without_averaging_are_best_validated_once(tmp_path, average_last):
    _checkpoints_with_best_at_step_2(tmp_path)
    seen = []

    def validate(weights):
        seen.append(weights["w"][0, 0].item())
        return 21.5

    final = choose_final_weights(tmp_path, average_last=average_last, validate=validate)
    assert seen == [2.0]
    assert (final.source, final.valid_bleu, final.weights["w"][0, 0].item()) == ("best (step 2)", 21.5, 2.0)


def test_save_model_keeps_metadata_but_no_training_state(tmp_path):
    like = {**_state(1.0, 7), "model_config": {"d_model": 8}, "tokenizers": {"src": {}, "tgt": {}}, "optimizer": {}}
    save_model({"w": torch.ones(1)}, like, tmp_path / "final.pt", source="best (step 7)")
    saved = load_checkpoint(tmp_path / "final.pt")
    assert sorted(saved) == ["config", "digest", "digest_all", "model", "model_config", "source", "step", "tokenizers",
                             "version"]
    assert saved["step"] == 7 and saved["source"] == "best (step 7)"


def _damage(path: Path, pattern: bytes, replacement: bytes) -> None:
    """Overwrite the first occurrence of ``pattern`` inside the file (a tensor's stored bytes)."""
    data = path.read_bytes()
    at = data.index(pattern)
    path.write_bytes(data[:at] + replacement + data[at + len(replacement):])


@pytest.mark.parametrize("damage", ["flipped", "zeroed"])
def test_a_checkpoint_with_damaged_tensor_bytes_is_refused_naming_an_earlier_one(tmp_path, damage):
    manager = CheckpointManager(tmp_path, keep_last=3)
    for step in (10, 20):
        state = _state(1.0, step)
        state["model"]["w"] = torch.full((64,), 1.2345 + step)  # bytes to find in the file
        manager.save(state, step, is_best=False)
    newest = tmp_path / "step_20.pt"
    weights = torch.full((64,), 21.2345).numpy().tobytes()
    assert torch.load(newest, weights_only=True)["step"] == 20  # what torch alone would read: no complaint
    _damage(newest, weights[:16], bytes([weights[0] ^ 0x10]) if damage == "flipped" else bytes(16))
    assert torch.load(newest, weights_only=True)["step"] == 20  # torch's zip reader checks no CRC
    for path in (newest, tmp_path / "last.pt"):  # last.pt is the same file
        with pytest.raises(CheckpointError, match=rf"{path}: corrupt: its contents do not match the digest .*"
                                                  rf"{tmp_path / 'step_10.pt'} is an earlier checkpoint of the same run "
                                                  rf"\(resume={tmp_path / 'step_10.pt'}\)$"):
            load_checkpoint(path)
    assert load_checkpoint(tmp_path / "step_10.pt")["step"] == 10
    assert load_checkpoint(newest, verify=False)["step"] == 20  # metadata only, on request


def test_the_digest_covers_every_tensor_and_value_and_its_place():
    state = {**_state(1.0, 3), "config": {"lr": 0.001, "name": "run", "steps": [1, 2], "norm": None}}
    digest = checkpoint.state_digest(state)
    assert digest.startswith("sha256-all:") and checkpoint.state_digest(copy.deepcopy(state)) == digest
    changed = [copy.deepcopy(state) for _ in range(9)]
    changed[0]["model"]["b"][0] = 1.0000001  # a value
    changed[1]["model"]["w"] = changed[1]["model"]["w"].reshape(4)  # a shape
    changed[2]["model"]["w"] = changed[2]["model"]["w"].double()  # a dtype
    changed[3]["model"]["v"] = changed[3]["model"].pop("w")  # a place
    changed[4]["config"]["lr"] = 0.0011  # a number of the config
    changed[5]["config"]["name"] = "rum"  # one letter
    changed[6]["config"]["steps"] = [1.0, 2]  # a type
    changed[7]["config"]["norm"] = "None"
    changed[8]["step"] = 4  # a counter
    assert len({digest, *(checkpoint.state_digest(s) for s in changed)}) == 10
    assert checkpoint.state_digest({**state, "digest": "anything", "digest_all": "anything"}) == digest
    tensors_only = checkpoint.state_digest(state, checkpoint.TENSORS_ONLY)  # the digest of versions 0.9 to 0.9.3
    assert tensors_only.startswith("sha256:") and checkpoint.state_digest(changed[4], checkpoint.TENSORS_ONLY) == \
        tensors_only and checkpoint.state_digest(changed[0], checkpoint.TENSORS_ONLY) != tensors_only


def test_a_damaged_config_is_refused_and_checkpoints_of_0_9_3_and_of_now_verify_either_way(tmp_path):
    state = {**_state(1.0, 3), "config": {"data": {"corpus": "multi30k"}, "training": {"lr": 0.001}}}
    save_checkpoint(state, tmp_path / "step_3.pt")
    saved = torch.load(tmp_path / "step_3.pt", weights_only=True)  # "digest" stays what 0.9 to 0.9.3 verify
    assert saved["digest"] == checkpoint.state_digest(saved, checkpoint.TENSORS_ONLY)
    assert saved["digest_all"] == checkpoint.state_digest(saved) != saved["digest"]
    # the config's text changed on disk (as one flipped byte in the pickle would): torch loads it without complaint
    loaded = torch.load(tmp_path / "step_3.pt", weights_only=True)
    loaded["config"]["data"]["corpus"] = "multi30j"
    torch.save(loaded, tmp_path / "step_3.pt")
    with pytest.raises(CheckpointError, match=r"step_3\.pt: corrupt: its contents do not match the digest"):
        load_checkpoint(tmp_path / "step_3.pt")
    old = {**state, "version": CHECKPOINT_VERSION}  # written by 0.9.3: a digest of its tensors alone
    torch.save({**old, "digest": checkpoint.state_digest(old, checkpoint.TENSORS_ONLY)}, tmp_path / "old.pt")
    assert load_checkpoint(tmp_path / "old.pt")["config"] == state["config"]


def test_a_checkpoint_without_a_digest_loads_with_a_warning(tmp_path, caplog):
    torch.save({**_state(1.0, 5), "version": CHECKPOINT_VERSION}, tmp_path / "old.pt")  # as versions before 0.9
    with caplog.at_level("WARNING", logger="transformer.checkpoint"):
        assert load_checkpoint(tmp_path / "old.pt")["step"] == 5
    assert f"{tmp_path / 'old.pt'}: written before checkpoints carried a digest" in caplog.text
