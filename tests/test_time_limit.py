"""TimeLimit: the projection of ``training.max_minutes``, its log lines and its checkpoint state."""

from __future__ import annotations

from transformer.training.time_limit import TimeLimit, projected_step


def test_projected_step_by_hand():
    assert projected_step(100, steps_per_second=2.5, seconds_left=10.0) == 125
    assert projected_step(100, steps_per_second=2.5, seconds_left=0.5) == 101  # 1.25 steps: one whole step
    assert projected_step(100, steps_per_second=2.5, seconds_left=-30.0) == 100  # out of time: here


def test_project_counts_the_time_already_trained():
    limit = TimeLimit(minutes=2.0)  # 120 s
    assert limit.project(step=30, steps_per_second=0.5, train_seconds=60.0) == 30 + 30
    assert not limit.out_of_time(119.9) and limit.out_of_time(120.0)
    assert not TimeLimit(None).out_of_time(1e9)


def test_reports_when_it_first_binds_and_when_it_moved_more_than_one_percent():
    limit = TimeLimit(minutes=1.0)
    reported = []
    for step in (1200, 900, 905, 909, 911, 890, 1000):  # planned: 1,000 steps, so 1 % is 10
        limit.step = step
        reported.append(limit.worth_reporting(planned_steps=1000))
    assert reported == [False, True, False, False, True, True, False]


def test_reproject_takes_the_projection_and_logs_only_the_lines_worth_reporting(caplog):
    limit = TimeLimit(minutes=10.0)  # 600 s; after 60 s at 100 steps a minute, 540 s are left: 900 more steps
    with caplog.at_level("INFO", logger="transformer.training.time_limit"):
        limit.reproject(step=100, steps_per_second=100 / 60, train_seconds=60.0, planned_steps=2000, is_main=True)
        assert limit.step == 1000
        limit.reproject(step=200, steps_per_second=95 / 60, train_seconds=120.0, planned_steps=2000, is_main=True)
        assert limit.step == 200 + 760  # moved by 40 steps, 2 % of the plan: a second line
        limit.reproject(step=300, steps_per_second=94.5 / 60, train_seconds=180.0, planned_steps=2000, is_main=True)
        assert limit.step == 300 + 661  # 1 step from the last line: none
    assert [r.getMessage() for r in caplog.records] == [
        f"time limit: at {rate} steps per minute, training.max_minutes=10 runs out at step {step}, before step 2000 "
        f"(max_epochs / max_steps): the schedule ends and training stops there" for rate, step in [(100, 1000), (95, 960)]]


def test_a_checkpoint_keeps_its_projection_under_the_same_limit_and_projects_another_from_the_run_pace():
    saved = TimeLimit(minutes=10.0)
    saved.step = 700
    state = saved.state_dict()
    assert state == {"minutes": 10.0, "step": 700}

    same = TimeLimit(minutes=10.0)
    same.load_state_dict(state, step=400, train_seconds=300.0)
    assert same.step == 700

    longer = TimeLimit(minutes=20.0)  # 400 steps in 300 s; 900 s left at that pace: 1,200 more steps
    longer.load_state_dict(state, step=400, train_seconds=300.0)
    assert longer.step == 1600

    unlimited = TimeLimit(minutes=None)
    unlimited.load_state_dict(state, step=400, train_seconds=300.0)
    assert unlimited.step is None and unlimited.state_dict() is None

    older = TimeLimit(minutes=10.0)  # a checkpoint from before time limits were projected
    older.load_state_dict(None, step=400, train_seconds=300.0)
    assert older.step == 400 + 400
    fresh = TimeLimit(minutes=10.0)
    fresh.load_state_dict(None, step=0, train_seconds=0.0)
    assert fresh.step is None
