"""The horizon decides where a run ends and where its schedule ends; the loop state and the horizon each write and
read their part of a checkpoint."""

from __future__ import annotations

import logging

from transformer.config import Schedule
from transformer.training.horizon import Horizon
from transformer.training.loop_state import LoopState

from toy_training import training_config


def test_the_plan_is_the_earlier_of_epochs_and_steps():
    assert Horizon(training_config(max_epochs=3, max_steps=None), epoch_steps=10).planned_steps == 30
    assert Horizon(training_config(max_epochs=3, max_steps=25), epoch_steps=10).planned_steps == 25
    assert Horizon(training_config(max_epochs=3, max_steps=99), epoch_steps=10).planned_steps == 30


def test_steps_and_the_projected_time_end_the_run_and_the_schedule():
    horizon = Horizon(training_config(max_epochs=4, max_steps=35, max_minutes=1.0), epoch_steps=10)
    assert horizon.schedule_steps == 35 and horizon.step_limit(34) is None and horizon.step_limit(35) == "max_steps"
    horizon.reproject(step=10, steps_per_second=0.5, train_seconds=20.0, is_main=True)  # 40 s left: 20 more steps
    assert horizon.time_limit.step == 30 and horizon.schedule_steps == 30
    assert horizon.step_limit(29) is None and horizon.step_limit(30) == "max_minutes"
    assert horizon.out_of_time(59.0) is False and horizon.out_of_time(60.0) is True
    assert horizon.past_max_epochs(3) is False and horizon.past_max_epochs(4) is True


def test_a_time_limit_that_ends_the_run_within_the_warm_up_is_warned_of_once(caplog):
    horizon = Horizon(training_config(max_epochs=10, max_minutes=1.0, warmup_steps=100, lr=1e-3), epoch_steps=50)
    with caplog.at_level(logging.WARNING, logger="transformer.training.horizon"):
        horizon.reproject(step=10, steps_per_second=1.0, train_seconds=10.0, is_main=True)  # 50 s left: step 60
        horizon.reproject(step=20, steps_per_second=1.0, train_seconds=20.0, is_main=True)  # the same, once
    assert [r.getMessage() for r in caplog.records] == [
        "training.max_minutes=1 runs out near step 60, before the 100 steps of warm-up end (training.warmup_steps): "
        "the learning rate rises to 0.0006 at most, never to training.lr=0.001, and the run ends without its decay; "
        "a shorter warm-up or a larger training.max_minutes trains better"]
    caplog.clear()
    enough = Horizon(training_config(max_epochs=10, max_minutes=10.0, warmup_steps=100), epoch_steps=50)
    with caplog.at_level(logging.WARNING, logger="transformer.training.horizon"):
        enough.reproject(step=10, steps_per_second=1.0, train_seconds=10.0, is_main=True)  # step 600: past it
    assert not caplog.records


def test_patience_runs_out_after_validations_without_a_gain():
    horizon = Horizon(training_config(patience=2), epoch_steps=10)
    assert horizon.validated(10.0, 1) == (True, False)
    assert horizon.validated(10.0, 2) == (False, False)  # equal is no gain
    assert horizon.validated(9.0, 3) == (False, True)
    assert horizon.ended_before_start(step=3, train_seconds=0.0, is_main=True) == "early_stopping"


def test_the_horizon_resumes_where_it_was_saved():
    cfg = training_config(max_epochs=5, max_minutes=2.0, patience=3, schedule=Schedule.cosine)
    saved = Horizon(cfg, epoch_steps=10)
    saved.validated(12.5, 7)
    saved.validated(11.0, 14)
    saved.reproject(step=14, steps_per_second=0.25, train_seconds=60.0, is_main=True)
    checkpoint = saved.state_dict()
    resumed = Horizon(cfg, epoch_steps=11)  # a BPE-dropout epoch of another length: the plan keeps the first's
    resumed.load_state_dict(checkpoint, step=14, train_seconds=60.0)
    assert resumed.state_dict() == checkpoint
    assert (resumed.planned_steps, resumed.schedule_steps) == (50, 29)
    assert [resumed.rate(s) for s in (1, 20, 29)] == [saved.rate(s) for s in (1, 20, 29)]


def test_the_time_limit_of_an_older_checkpoint_is_projected_from_the_runs_pace():
    horizon = Horizon(training_config(max_epochs=100, max_minutes=10.0), epoch_steps=10)
    older = {"best_bleu": None, "best_step": None, "bad_validations": 0}  # before epoch_steps and time_limit
    horizon.load_state_dict(older, step=100, train_seconds=300.0)  # 100 steps in 5 minutes: 100 more in 5
    assert horizon.time_limit.step == 200 and horizon.epoch_steps == 10


def test_the_loop_state_round_trips_and_reads_older_checkpoints():
    state = LoopState(step=42, epoch=1, sampler={"epoch": 1, "position": 5}, last_valid_step=40,
                      last_metrics={"bleu": 3.5}, seconds_before=12.0)
    checkpoint = state.state_dict(train_seconds=30.0)
    assert LoopState.from_checkpoint(checkpoint) == LoopState(42, 1, {"epoch": 1, "position": 5}, 40, {"bleu": 3.5},
                                                              30.0)
    older = {"step": 3, "epoch": 0, "sampler": {"epoch": 0, "position": 3}, "last_valid_step": None}
    assert LoopState.from_checkpoint(older) == LoopState(3, 0, {"epoch": 0, "position": 3}, None, {}, 0.0)
