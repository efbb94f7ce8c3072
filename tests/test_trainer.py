"""Trainer: learning, exact resume (mid-epoch and after Ctrl-C), divergence, early stopping, stop reasons."""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from transformer.checkpoint import CheckpointError, load_checkpoint
from transformer.config import Schedule
from transformer.interrupts import SAME_STOP_SECONDS
from transformer.tracking import Tracker
from transformer.training.step_window import TrainingDiverged
from transformer.training.trainer import Trainer

from toy_training import copy_pairs, make_sampler, make_trainer, parameters, teacher_forced_validate, training_config

PAIRS = copy_pairs(40, seed=1)


def _assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


@pytest.mark.slow
def test_learns_the_copy_task(tmp_path):
    cfg = training_config(max_epochs=20, max_tokens=100, lr=1e-2, warmup_steps=10, schedule=Schedule.constant,
                          label_smoothing=0.0)
    trainer = make_trainer(tmp_path, cfg, PAIRS, dropout=0.0)
    before = trainer.validate(trainer.model.eval(), 0)
    result = trainer.fit()
    assert result.reason == "max_epochs" and result.epochs == 20 and result.steps == 20 * len(trainer.sampler)
    assert result.last_metrics["loss"] < 0.3 * before["loss"]
    assert result.best_bleu > 75.0  # teacher-forced token accuracy in percent; chance is about 12
    assert load_checkpoint(tmp_path / "checkpoints" / "best.pt")["best_bleu"] == result.best_bleu


@pytest.mark.parametrize("accumulate", [1, 2])
def test_resume_mid_epoch_reproduces_uninterrupted_run(tmp_path, accumulate):
    batches = len(make_trainer(tmp_path / "probe", training_config(accumulate=accumulate), PAIRS).sampler)
    per_epoch = -(-batches // accumulate)  # the last step of an epoch may hold fewer batches
    steps = per_epoch + 2  # stop inside the second epoch
    assert 3 < per_epoch
    straight = make_trainer(tmp_path / "a", training_config(max_steps=steps, accumulate=accumulate), PAIRS)
    straight.fit()

    first = make_trainer(tmp_path / "b", training_config(max_steps=3, accumulate=accumulate), PAIRS)
    assert first.fit().reason == "max_steps"
    state = load_checkpoint(tmp_path / "b" / "checkpoints" / "last.pt")
    assert state["step"] == 3 and (state["sampler"]["epoch"], state["sampler"]["position"]) == (0, 3 * accumulate)

    resumed = make_trainer(tmp_path / "b", training_config(max_steps=steps, accumulate=accumulate), PAIRS,
                           model_seed=99)  # different initial weights: everything must come from the checkpoint
    resumed.load_state(state)
    result = resumed.fit()
    assert result.steps == steps and result.epochs == 1
    _assert_same(parameters(straight), parameters(resumed))


def test_ctrl_c_saves_between_steps_and_resumes_exactly(tmp_path):
    before = signal.getsignal(signal.SIGINT)  # SIG_IGN where the suite was started in the background
    cfg = training_config(max_steps=8)
    straight = make_trainer(tmp_path / "a", cfg, PAIRS)
    straight.fit()

    def send_sigint(call: int) -> None:
        if call == 5:  # while collating step 5's batch
            os.kill(os.getpid(), signal.SIGINT)

    interrupted = make_trainer(tmp_path / "b", cfg, PAIRS, collate_hook=send_sigint)
    with pytest.raises(KeyboardInterrupt):
        interrupted.fit()
    state = load_checkpoint(tmp_path / "b" / "checkpoints" / "last.pt")
    assert (state["step"], state["reason"]) == (5, "interrupt")  # step 5 finished before saving
    assert not list((tmp_path / "b" / "checkpoints").glob("step_*.pt"))
    time.sleep(SAME_STOP_SECONDS)  # past the stop's echoes, a signal is handled as before the run, and restores it
    with contextlib.suppress(KeyboardInterrupt):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.5)
    assert signal.getsignal(signal.SIGINT) is before

    resumed = make_trainer(tmp_path / "b", cfg, PAIRS, model_seed=5)
    resumed.load_state(state)
    resumed.fit()
    _assert_same(parameters(straight), parameters(resumed))


def test_ctrl_c_in_an_epochs_last_steps_saves_before_validating_and_the_resume_validates(tmp_path):
    """Where the device is read only every few steps (a GPU), an interrupt seen at the epoch's closing read saves at
    once: the epoch-end validation is left to the resumed run, which ends as the uninterrupted one."""
    cfg = training_config(max_epochs=2, log_every_steps=100)
    straight = make_trainer(tmp_path / "a", cfg, PAIRS)
    straight._check_every = 100  # as on a GPU: no read of the flags inside this epoch
    expected = straight.fit()
    per_epoch = len(straight.sampler)
    validated: list[int] = []
    check = teacher_forced_validate(PAIRS[:16])

    def validate(model, step):
        validated.append(step)
        return check(model, step)

    def send_sigint(call: int) -> None:
        if call == per_epoch:  # while collating the epoch's last batch
            os.kill(os.getpid(), signal.SIGINT)

    interrupted = make_trainer(tmp_path / "b", cfg, PAIRS, validate=validate, collate_hook=send_sigint)
    interrupted._check_every = 100
    with pytest.raises(KeyboardInterrupt):
        interrupted.fit()
    state = load_checkpoint(tmp_path / "b" / "checkpoints" / "last.pt")
    assert (state["step"], state["reason"], validated) == (per_epoch, "interrupt", [])

    resumed = make_trainer(tmp_path / "b", cfg, PAIRS, model_seed=5, validate=validate)
    resumed.load_state(state)
    result = resumed.fit()
    assert validated == [per_epoch, 2 * per_epoch]
    assert (result.steps, result.best_bleu, result.best_step) == (expected.steps, expected.best_bleu,
                                                                  expected.best_step)
    _assert_same(parameters(straight), parameters(resumed))


def test_nan_loss_stops_without_overwriting_last_good_checkpoint(tmp_path):
    cfg = training_config(validate_every_steps=2, max_steps=20)
    poison = {"on": False}

    def poison_at(call: int) -> None:
        poison["on"] = call >= 4

    trainer = make_trainer(tmp_path, cfg, PAIRS, collate_hook=poison_at)
    trainer.model.decoder.embed.register_forward_hook(
        lambda module, args, out: out * float("nan") if poison["on"] else out)
    last = tmp_path / "checkpoints" / "last.pt"
    with pytest.raises(TrainingDiverged, match="step 4.*not overwritten"):
        trainer.fit()
    state = load_checkpoint(last)
    assert state["step"] == 2
    assert all(torch.isfinite(v).all() for v in trainer.model.state_dict().values())  # the NaN step was not applied
    digest = hashlib.sha256(last.read_bytes()).hexdigest()
    assert digest == hashlib.sha256((tmp_path / "checkpoints" / "step_2.pt").read_bytes()).hexdigest()


def test_early_stopping_after_patience_validations_without_gain(tmp_path):
    scripted = iter([10.0, 12.0, 11.0, 12.0, 30.0])
    cfg = training_config(validate_every_steps=1, patience=2, max_steps=50)
    trainer = make_trainer(tmp_path, cfg, PAIRS, validate=lambda model, step: {"bleu": next(scripted), "loss": 1.0})
    result = trainer.fit()
    assert (result.reason, result.stopped_early, result.steps) == ("early_stopping", True, 4)
    assert (result.best_bleu, result.best_step) == (12.0, 2)
    best = load_checkpoint(tmp_path / "checkpoints" / "best.pt")
    assert best["step"] == 2 and best["bad_validations"] == 0
    assert load_checkpoint(tmp_path / "checkpoints" / "last.pt")["bad_validations"] == 2

    resumed = make_trainer(tmp_path, cfg, PAIRS, validate=lambda model, step: pytest.fail("validated again"))
    resumed.load_state(load_checkpoint(tmp_path / "checkpoints" / "last.pt"))
    again = resumed.fit()  # a run that stopped early stays stopped: no step, no validation
    assert (again.reason, again.steps, again.best_bleu) == ("early_stopping", 4, 12.0)
    assert again.last_metrics == result.last_metrics


def test_resuming_a_finished_run_keeps_its_metrics_and_time(tmp_path):
    cfg = training_config(max_epochs=2)
    result = make_trainer(tmp_path, cfg, PAIRS).fit()
    state = load_checkpoint(tmp_path / "checkpoints" / "last.pt")
    assert state["last_metrics"] == result.last_metrics and "bleu" in state["last_metrics"]
    assert 0.0 < state["train_seconds"] <= result.train_seconds

    resumed = make_trainer(tmp_path, cfg, PAIRS)
    resumed.load_state(state)
    again = resumed.fit()
    assert (again.reason, again.steps, again.epochs) == ("max_epochs", result.steps, 2)
    assert again.last_metrics == result.last_metrics  # not emptied by a fit call that had nothing to train
    assert again.train_seconds >= state["train_seconds"] > again.wall_seconds


def test_each_validation_logs_the_minutes_of_training_which_a_resume_continues_without_the_pause(tmp_path):
    logged: list[tuple[int, float]] = []

    class Recording(Tracker):
        def scalar(self, tag: str, value: float, step: int) -> None:
            if tag == "train/minutes":
                logged.append((step, value * 60.0))

    first = make_trainer(tmp_path, training_config(max_epochs=1), PAIRS)
    first.tracker = Recording(tmp_path / "tb", enabled=False)
    result = first.fit()
    assert logged and logged[-1] == (result.steps, pytest.approx(result.train_seconds, abs=0.5))
    time.sleep(1.0)  # the run lies stopped
    resumed = make_trainer(tmp_path, training_config(max_epochs=2), PAIRS)
    resumed.tracker = Recording(tmp_path / "tb", enabled=False)
    resumed.load_state(load_checkpoint(tmp_path / "checkpoints" / "last.pt"))
    again = resumed.fit()
    (step_1, seconds_1), (step_2, seconds_2) = logged[-2], logged[-1]
    assert step_1 < step_2 == again.steps and seconds_1 < seconds_2 <= again.train_seconds
    assert seconds_2 - seconds_1 < again.wall_seconds  # the second since the first fit ended is not counted


def test_epoch_validation_and_final_validation(tmp_path):
    seen = []
    cfg = training_config(max_epochs=2, max_steps=100)

    def validate(model, step):
        assert not model.training
        seen.append(step)
        return {"bleu": float(step), "loss": 2.0}

    trainer = make_trainer(tmp_path, cfg, PAIRS, validate=validate)
    n = len(trainer.sampler)
    result = trainer.fit()
    assert seen == [n, 2 * n] and result.reason == "max_epochs"
    assert result.last_metrics["ppl"] == pytest.approx(torch.e ** 2)
    end_of_epoch = load_checkpoint(tmp_path / "checkpoints" / "last.pt")
    assert end_of_epoch["epoch"] == 2 and end_of_epoch["sampler"] == {"epoch": 2, "position": 0, "batches": n}

    seen.clear()
    stopped = make_trainer(tmp_path / "c", replace(cfg, max_steps=n + 3), PAIRS, validate=validate).fit()
    assert seen == [n, n + 3] and stopped.reason == "max_steps" and stopped.epochs == 1


def test_max_minutes_stops(tmp_path):
    cfg = training_config(max_minutes=1e-9, max_epochs=5)
    result = make_trainer(tmp_path, cfg, PAIRS).fit()
    assert (result.reason, result.steps) == ("max_minutes", 1)


def test_max_minutes_counts_the_time_before_a_resume(tmp_path, caplog):
    first = make_trainer(tmp_path, training_config(max_steps=3), PAIRS)
    first.fit()
    state = load_checkpoint(tmp_path / "checkpoints" / "last.pt")
    budget = state["train_seconds"] / 60.0 * 0.999  # the whole budget is already spent
    resumed = make_trainer(tmp_path, training_config(max_steps=10, max_minutes=budget), PAIRS)
    resumed.load_state(state)
    with caplog.at_level("WARNING", logger="transformer.training.trainer"):
        result = resumed.fit()
    assert (result.reason, result.steps) == ("max_minutes", 3)
    assert any("nothing more to train (a larger training.max_minutes, or null" in r.getMessage() for r in caplog.records)


class _StepClock:
    """A monotonic clock that moves only when a training step runs: ``seconds`` per step."""

    def __init__(self, seconds: float) -> None:
        self.now, self.seconds = 1000.0, seconds

    def __call__(self) -> float:
        return self.now

    def tick(self) -> None:
        self.now += self.seconds


def _on_the_step_clock(trainer: Trainer, clock: _StepClock, rates: list[float]) -> None:
    step = trainer.train_step

    def timed_step(group):
        clock.tick()
        stats = step(group)
        rates.append(trainer.optimizer.param_groups[0]["lr"])  # the rate this step trained at
        return stats

    trainer.train_step = timed_step


def test_max_minutes_ends_the_cosine_schedule_where_the_time_runs_out(tmp_path, monkeypatch):
    # 10 s a step and a limit of 1.5 epochs' time: after the first epoch's validation the pace (0.1 steps/s)
    # projects the limit to step 1.5 n, so the cosine reaches its floor and training stops there, not at 4 n.
    clock, rates = _StepClock(10.0), []
    monkeypatch.setattr("transformer.training.trainer.time.monotonic", clock)
    probe = make_trainer(tmp_path / "probe", training_config(), PAIRS)
    n = len(probe.sampler)
    limit = 1.5 * n * 10.0 / 60.0  # minutes
    cfg = training_config(max_epochs=4, max_minutes=limit, schedule=Schedule.cosine, warmup_steps=2, min_lr=1e-5)
    trainer = make_trainer(tmp_path / "run", cfg, PAIRS)
    _on_the_step_clock(trainer, clock, rates)
    assert trainer.schedule_steps == 4 * n  # nothing projected before the first validation
    result = trainer.fit()
    assert (result.reason, result.steps) == ("max_minutes", int(1.5 * n))
    assert trainer.schedule_steps == int(1.5 * n)
    assert rates[-1] == pytest.approx(1e-5)  # annealed to the floor at the last step, not cut at a high rate
    saved = load_checkpoint(tmp_path / "run" / "checkpoints" / f"step_{n}.pt")
    assert saved["time_limit"] == {"minutes": limit, "step": int(1.5 * n)}

    # A resume keeps the projection made for its limit; another limit is projected at once from the run's pace
    # (n steps in 10 n seconds): twice the limit, 3 n seconds, runs out at step n + 2 n = 3 n; no limit, 4 n.
    for minutes, expected in ((limit, int(1.5 * n)), (2 * limit, 3 * n), (None, 4 * n)):
        resumed = make_trainer(tmp_path / f"resume_{minutes}", replace(cfg, max_minutes=minutes), PAIRS)
        resumed.load_state(saved)
        assert resumed.schedule_steps == expected


def test_a_validation_that_uses_up_the_time_ends_training_at_its_step(tmp_path, monkeypatch):
    # 10 s a step, a one-minute limit, a validation every 3 steps that takes 100 s: the first one uses up the
    # time, so training stops at step 3, without another step or a second validation for it.
    clock, rates, seen = _StepClock(10.0), [], []
    monkeypatch.setattr("transformer.training.trainer.time.monotonic", clock)

    def validate(model, step):
        seen.append(step)
        clock.now += 100.0
        return {"bleu": 1.0}

    cfg = training_config(max_minutes=1.0, validate_every_steps=3, schedule=Schedule.cosine, warmup_steps=1)
    trainer = make_trainer(tmp_path, cfg, PAIRS, validate=validate)
    _on_the_step_clock(trainer, clock, rates)
    result = trainer.fit()
    assert (result.reason, result.steps, seen) == ("max_minutes", 3, [3])


def test_a_slower_machine_cuts_the_schedule_with_a_warning(tmp_path, monkeypatch, caplog):
    # The first epoch's pace projects the limit to step 1.5 n; then a step takes 1,000 s and the limit runs
    # out before that step: training stops there, above the schedule's floor, and says so.
    clock, rates = _StepClock(10.0), []
    monkeypatch.setattr("transformer.training.trainer.time.monotonic", clock)
    n = len(make_trainer(tmp_path / "probe", training_config(), PAIRS).sampler)
    cfg = training_config(max_epochs=4, max_minutes=1.5 * n * 10.0 / 60.0, schedule=Schedule.cosine,
                          warmup_steps=2, min_lr=1e-5)
    trainer = make_trainer(tmp_path / "run", cfg, PAIRS)
    _on_the_step_clock(trainer, clock, rates)
    step = trainer.train_step
    trainer.train_step = lambda group: (setattr(clock, "seconds", 1000.0 if trainer.step == n else 10.0),
                                        step(group))[1]
    with caplog.at_level("WARNING", logger="transformer.training.trainer"):
        result = trainer.fit()
    assert (result.reason, result.steps) == ("max_minutes", n + 1)
    assert rates[-1] > 10 * 1e-5  # well above the floor: cut, not annealed
    assert [r.getMessage() for r in caplog.records if r.levelname == "WARNING"] == [
        f"training.max_minutes={cfg.max_minutes:g} ran out at step {n + 1}, before step {int(1.5 * n)} where the pace "
        f"so far had projected it (the machine slowed down, or a validation took the rest): training stops with the "
        f"learning rate at {rates[-1]:.3g}, above its floor"]


def test_max_minutes_longer_than_the_epochs_changes_nothing(tmp_path, monkeypatch):
    clock = _StepClock(10.0)
    monkeypatch.setattr("transformer.training.trainer.time.monotonic", clock)
    cfg = training_config(max_epochs=2, schedule=Schedule.cosine, warmup_steps=2)
    runs = {}
    for minutes in (None, 1e6):
        rates: list[float] = []
        trainer = make_trainer(tmp_path / str(minutes), replace(cfg, max_minutes=minutes), PAIRS)
        _on_the_step_clock(trainer, clock, rates)
        result = trainer.fit()
        runs[minutes] = (result.reason, result.steps, rates, parameters(trainer))
    assert runs[None][:3] == runs[1e6][:3] and runs[None][0] == "max_epochs"
    _assert_same(runs[None][3], runs[1e6][3])


@pytest.mark.parametrize("accumulate", [1, 3])
def test_cosine_without_max_steps_reaches_its_floor_on_the_last_epoch_step(tmp_path, accumulate):
    cfg = training_config(max_epochs=2, accumulate=accumulate, schedule=Schedule.cosine, warmup_steps=2, min_lr=1e-5)
    trainer = make_trainer(tmp_path, cfg, PAIRS)
    per_epoch = -(-len(trainer.sampler) // accumulate)
    assert trainer.schedule_steps == 2 * per_epoch
    rates = []
    step = trainer.train_step
    trainer.train_step = lambda group: (step(group), rates.append(trainer.optimizer.param_groups[0]["lr"]))[0]
    assert trainer.fit().steps == 2 * per_epoch
    assert rates[1] == pytest.approx(cfg.lr)  # the end of warm-up
    assert rates[-1] == pytest.approx(1e-5) and min(rates[2:-1]) > 1e-5  # the floor comes at the very last step
    assert all(a > b for a, b in zip(rates[1:], rates[2:]))  # decays monotonically after warm-up


class _GrowingEpochs:
    """A sampler whose epochs grow by one batch each (as BPE-dropout's differ a little in length)."""

    def __init__(self, sampler) -> None:
        self.sampler = sampler

    def set_epoch(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)

    def __iter__(self):
        return iter(self.sampler)

    def __len__(self) -> int:
        return len(self.sampler) + self.sampler.epoch

    def state_dict(self) -> dict:
        return self.sampler.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.sampler.load_state_dict(state)


class _EpochOwnBatches:
    """A sampler whose epochs each have their own batch count, built for the epoch a state names when it is loaded
    (as BPE-dropout's re-segmented epochs): epoch e packs ``max_tokens + 12 e`` tokens a batch."""

    def __init__(self, cfg) -> None:
        self.cfg = cfg
        self.set_epoch(0)

    def set_epoch(self, epoch: int) -> None:
        if getattr(self, "epoch", None) != epoch:
            self.epoch = epoch
            self.sampler = make_sampler(PAIRS, replace(self.cfg, max_tokens=self.cfg.max_tokens + 12 * epoch))
        self.sampler.set_epoch(epoch)

    def __iter__(self):
        return iter(self.sampler)

    def __len__(self) -> int:
        return len(self.sampler)

    def state_dict(self) -> dict:
        return self.sampler.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.set_epoch(int(state["epoch"]))
        self.sampler.load_state_dict(state)


def test_a_stop_at_an_epochs_last_step_resumes_with_the_next_epoch_whatever_its_batch_count(tmp_path):
    cfg = training_config(max_epochs=3)
    counts = [len(_EpochOwnBatches(cfg).sampler)] + [len(make_sampler(PAIRS, replace(cfg, max_tokens=48 + 12 * e)))
                                                     for e in (1, 2)]
    assert counts[0] > counts[1] > counts[2]  # epoch 1 ends before the batch count of epoch 0, a new process's

    def trained(trainer: Trainer, record: list) -> None:
        step = trainer.train_step
        trainer.train_step = lambda group: (record.append([batch.indices for batch in group]), step(group))[1]

    straight_groups = []
    straight = make_trainer(tmp_path / "straight", cfg, PAIRS, sampler=_EpochOwnBatches(cfg))
    trained(straight, straight_groups)
    assert straight.fit().steps == sum(counts)

    stopped = make_trainer(tmp_path / "run", replace(cfg, max_steps=counts[0] + counts[1]), PAIRS,
                           sampler=_EpochOwnBatches(cfg))
    stopped.fit()  # stops at the last step of epoch 1
    state = load_checkpoint(tmp_path / "run" / "checkpoints" / "last.pt")
    assert state["sampler"]["epoch"] == 1 and state["sampler"]["position"] == state["sampler"]["batches"] == counts[1]
    resumed_groups = []
    resumed = make_trainer(tmp_path / "run", cfg, PAIRS, sampler=_EpochOwnBatches(cfg))  # a new process: epoch 0
    resumed.load_state(state)
    trained(resumed, resumed_groups)
    assert resumed.fit().steps == sum(counts)
    assert resumed_groups == straight_groups[-counts[2]:]  # epoch 2 alone: nothing of epoch 1 again
    _assert_same(parameters(resumed), parameters(straight))


def test_the_schedule_keeps_the_first_epochs_length_also_after_a_resume(tmp_path):
    cfg = training_config(max_epochs=3, schedule=Schedule.cosine)
    trainer = make_trainer(tmp_path, cfg, PAIRS, sampler=_GrowingEpochs(make_sampler(PAIRS, cfg)))
    first_epoch = len(trainer.sampler)
    trainer.fit()
    assert trainer.steps_per_epoch == first_epoch + 3  # the sampler now stands at epoch 3
    assert trainer.schedule_steps == 3 * first_epoch  # not moved by the longer epochs
    later = _GrowingEpochs(make_sampler(PAIRS, cfg))
    later.set_epoch(2)
    resumed = make_trainer(tmp_path, cfg, PAIRS, sampler=later)  # built when the epochs have grown
    resumed.load_state(load_checkpoint(tmp_path / "checkpoints" / "last.pt"))
    assert resumed.schedule_steps == 3 * first_epoch


def test_each_epochs_last_steps_reach_the_log(tmp_path, caplog):
    per_epoch = len(make_sampler(PAIRS, training_config()))
    cfg = training_config(max_epochs=2, log_every_steps=2 * per_epoch + 1)  # no log step comes in the run
    with caplog.at_level("INFO", logger="transformer.training.trainer"):
        make_trainer(tmp_path, cfg, PAIRS).fit()
    logged = [int(m.group(1)) for r in caplog.records if (m := re.match(r"epoch \d+ step (\d+): loss", r.getMessage()))]
    assert logged == [per_epoch, 2 * per_epoch]


def test_a_mid_epoch_checkpoint_refuses_another_number_of_processes(tmp_path):
    make_trainer(tmp_path / "a", training_config(max_steps=3), PAIRS).fit()
    by_two = load_checkpoint(tmp_path / "a" / "checkpoints" / "last.pt")
    by_two["rng"] = by_two["rng"] * 2  # as two processes write it: one RNG state each
    with pytest.raises(CheckpointError, match=r"written by 2 process\(es\) in the middle of epoch 1, this run has 1"):
        make_trainer(tmp_path / "b", training_config(), PAIRS).load_state(by_two)
    make_trainer(tmp_path / "c", training_config(max_epochs=1), PAIRS).fit()
    epoch_end = load_checkpoint(tmp_path / "c" / "checkpoints" / "last.pt")
    epoch_end["rng"] = epoch_end["rng"] * 2
    assert epoch_end["sampler"]["position"] == 0
    resumed = make_trainer(tmp_path / "d", training_config(max_epochs=2), PAIRS)
    resumed.load_state(epoch_end)  # at an epoch's end: allowed, with fresh seeds and a warning
    assert resumed.fit().steps == 2 * len(resumed.sampler)
    per_epoch = len(resumed.sampler)
    make_trainer(tmp_path / "e", training_config(max_steps=per_epoch), PAIRS).fit()  # stops at the epoch's last step
    last_step = load_checkpoint(tmp_path / "e" / "checkpoints" / "last.pt")
    last_step["rng"] = last_step["rng"] * 2
    half = per_epoch // 2
    last_step["sampler"] = {"epoch": 0, "position": half, "batches": half}  # as each of two processes ends epoch 1
    resumed = make_trainer(tmp_path / "f", training_config(max_epochs=2), PAIRS)
    resumed.load_state(last_step)  # the epoch is over for every process: any number continues it
    assert resumed.fit().steps == 2 * per_epoch  # the whole of epoch 2 and nothing of epoch 1 again


def test_max_steps_or_max_epochs_whichever_comes_first_sets_the_schedule_length(tmp_path):
    cfg = training_config(max_steps=5, max_epochs=50, schedule=Schedule.cosine)
    assert make_trainer(tmp_path / "a", cfg, PAIRS).schedule_steps == 5
    cfg = training_config(max_steps=10_000, max_epochs=2, schedule=Schedule.cosine)
    trainer = make_trainer(tmp_path / "b", cfg, PAIRS)
    assert trainer.schedule_steps == 2 * len(trainer.sampler)  # training ends there, so must the decay


def test_a_resume_that_moves_the_end_of_the_cosine_schedule_says_so(tmp_path, caplog):
    cfg = training_config(max_epochs=2, schedule=Schedule.cosine, warmup_steps=2)
    first = make_trainer(tmp_path, replace(cfg, max_steps=3), PAIRS)
    first.fit()
    state = load_checkpoint(tmp_path / "checkpoints" / "last.pt")
    assert state["schedule_steps"] == 3
    for max_steps, warned in [(3, False), (5, True)]:
        caplog.clear()
        with caplog.at_level("WARNING", logger="transformer.training.trainer"):
            make_trainer(tmp_path, replace(cfg, max_steps=max_steps), PAIRS).load_state(state)
        moved = [r.getMessage() for r in caplog.records if "cosine schedule" in r.getMessage()]
        assert bool(moved) == warned
    # step 4 of 3 sat at the floor (0); of 5, (1 + cos(pi * 2/3)) / 2 = 0.25 of the peak
    assert moved == [f"the cosine schedule now reaches its floor at step 5, not 3 as when the checkpoint was written "
                     f"(training.max_epochs / max_steps / max_minutes changed): step 4's learning rate goes from 0 to "
                     f"{0.25 * cfg.lr:.3g}"]


def test_a_warm_up_longer_than_the_run_is_a_warning_naming_the_highest_rate(tmp_path, caplog):
    cfg = training_config(max_steps=4, warmup_steps=10, schedule=Schedule.cosine)
    with caplog.at_level("WARNING", logger="transformer.training.trainer"):
        make_trainer(tmp_path, cfg, PAIRS).fit()
    assert [r.getMessage() for r in caplog.records if "warmup" in r.getMessage()] == [
        f"training.warmup_steps=10 is more than the 4 steps planned (max_epochs / max_steps): the learning rate rises "
        f"to {0.4 * cfg.lr:.3g} at most, never to training.lr={cfg.lr:g}"]


def test_a_resume_within_the_warm_up_says_the_decay_moved_not_the_rate(tmp_path, caplog):
    cfg = training_config(max_epochs=2, schedule=Schedule.cosine, warmup_steps=10)
    make_trainer(tmp_path, replace(cfg, max_steps=3), PAIRS).fit()
    state = load_checkpoint(tmp_path / "checkpoints" / "last.pt")
    with caplog.at_level("WARNING", logger="transformer.training.trainer"):
        make_trainer(tmp_path, replace(cfg, max_steps=5), PAIRS).load_state(state)
    assert [r.getMessage() for r in caplog.records if "cosine schedule" in r.getMessage()] == [
        "the cosine schedule now reaches its floor at step 5, not 3 as when the checkpoint was written "
        "(training.max_epochs / max_steps / max_minutes changed) (the warm-up, where the run is, is the same; the "
        "decay after it changes)"]


def test_a_run_resumed_at_an_epochs_last_step_does_not_validate_that_step_again(tmp_path):
    per_epoch = len(make_sampler(PAIRS, training_config()))
    first = make_trainer(tmp_path, training_config(max_steps=per_epoch, patience=1), PAIRS)
    stopped = first.fit()
    assert (stopped.reason, stopped.epochs) == ("max_steps", 1)  # its last step trained: the epoch is done
    state = load_checkpoint(tmp_path / "checkpoints" / "last.pt")
    assert state["sampler"] == {"epoch": 0, "position": per_epoch, "batches": per_epoch}
    assert state["last_valid_step"] == per_epoch
    resumed = make_trainer(tmp_path, training_config(max_steps=per_epoch + 2, patience=1), PAIRS)
    resumed.load_state(state)
    validated, validate = [], resumed.validate
    resumed.validate = lambda model, step: (validated.append(step), validate(model, step))[1]
    result = resumed.fit()  # a second validation of step per_epoch would not beat the best: patience 1 would stop
    assert (result.reason, result.steps, validated) == ("max_steps", per_epoch + 2, [per_epoch + 2])


@pytest.mark.parametrize("extra, error, message", [
    ({"step": 1}, ValueError, "clash"),  # would shadow the trainer's own key
    ({"schedule": Schedule.cosine}, CheckpointError, r"extra_state\.schedule"),  # not weights_only-loadable
])
def test_extra_state_is_checked_up_front(tmp_path, extra, error, message):
    t = make_trainer(tmp_path, training_config(), PAIRS)
    with pytest.raises(error, match=message):
        Trainer(t.model, t.optimizer, t.cfg, n_pairs=len(PAIRS), sampler=t.sampler, collate_fn=t.collate_fn,
                device=t.device, dist=t.dist, tracker=t.tracker, checkpoints=t.checkpoints, validate=t.validate,
                extra_state=extra)


_KILLED_RUN = """
import os, signal, sys
sys.path.insert(0, {tests!r})
from pathlib import Path
import torch
from toy_training import copy_pairs, make_trainer, training_config

torch.set_num_threads(1)  # as the test's own process: another thread count rounds differently

def kill_at(call):
    if call == {kill_at}:  # while collating a batch of the next step: no chance to save
        os.kill(os.getpid(), signal.SIGKILL)

cfg = training_config(max_steps={steps}, save_every_steps={every})
make_trainer(Path({run!r}), cfg, copy_pairs(40, seed=1), collate_hook=kill_at).fit()
"""


@pytest.fixture()
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_kill_9_loses_at_most_save_every_steps_and_resumes_bit_identically(tmp_path, one_thread):
    """A run killed in a fresh process and resumed here ends bit-identical to one never killed. All three runs use
    one thread: the same count in both processes, and no parallel reduction whose order a busy machine could change."""
    steps, every = 9, 3
    straight = make_trainer(tmp_path / "a", training_config(max_steps=steps), PAIRS)
    straight.fit()
    assert 6 < len(straight.sampler)  # the kill lands inside the first epoch

    script = _KILLED_RUN.format(tests=str(Path(__file__).parent), kill_at=8, steps=steps, every=every,
                                run=str(tmp_path / "b"))
    killed = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    state = load_checkpoint(tmp_path / "b" / "checkpoints" / "last.pt")
    assert (state["step"], state["reason"]) == (6, "scheduled")  # step 7 was in progress: 1 step lost
    assert (state["sampler"]["epoch"], state["sampler"]["position"]) == (0, 6) and state["last_valid_step"] is None
    assert not list((tmp_path / "b" / "checkpoints").glob("step_*.pt"))  # no validation, no rotation

    resumed = make_trainer(tmp_path / "b", training_config(max_steps=steps, save_every_steps=every), PAIRS,
                           model_seed=42)
    resumed.load_state(state)
    assert resumed.fit().steps == steps
    _assert_same(parameters(straight), parameters(resumed))


def test_save_every_minutes_writes_last_without_validating(tmp_path):
    validations = []
    cfg = training_config(max_steps=4, save_every_minutes=1e-9)  # due after every step
    trainer = make_trainer(tmp_path, cfg, PAIRS, validate=lambda m, s: validations.append(s) or {"bleu": 1.0})
    saved = []
    original = trainer.save_now
    trainer.save_now = lambda reason, **kw: (saved.append((trainer.step, reason)), original(reason, **kw))
    trainer.fit()
    assert saved == [(1, "scheduled"), (2, "scheduled"), (3, "scheduled"), (4, "final")]
    assert validations == [4]  # only the final validation


def test_a_late_check_still_keeps_non_finite_updates_out_of_the_weights(tmp_path):
    """With checks every 4 steps (as on a GPU), a NaN step's update is skipped on the device and the next
    check stops the run."""
    cfg = training_config(max_steps=20, log_every_steps=4)  # on a GPU the checks come with the log lines
    poison = {"on": False}

    def poison_at(call: int) -> None:
        poison["on"] = call == 2  # only step 2 is bad

    trainer = make_trainer(tmp_path, cfg, PAIRS, collate_hook=poison_at)
    trainer._check_every = 4
    trainer.model.decoder.embed.register_forward_hook(
        lambda module, args, out: out * float("nan") if poison["on"] else out)
    with pytest.raises(TrainingDiverged, match=r"step 4: .*1 non-finite step\(s\) since step 1"):
        trainer.fit()
    assert all(torch.isfinite(v).all() for v in trainer.model.state_dict().values())
    assert all(torch.isfinite(s["exp_avg_sq"]).all() for s in trainer.optimizer.state.values())
    assert all(int(s["step"]) == 3 for s in trainer.optimizer.state.values())  # steps 1, 3 and 4 were applied
