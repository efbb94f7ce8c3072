from __future__ import annotations

from transformer.training.early_stopping import EarlyStopping


def test_best_step_and_patience_follow_the_validations():
    stopping = EarlyStopping(patience=2)
    assert stopping.update(10.0, step=100) and (stopping.best_bleu, stopping.best_step) == (10.0, 100)
    assert not stopping.update(9.0, step=200) and not stopping.exhausted
    assert stopping.update(12.5, step=300) and stopping.bad_validations == 0  # a gain resets the count
    assert not stopping.update(12.5, step=400)  # equalling the best is no gain
    assert not stopping.update(11.0, step=500) and stopping.exhausted
    assert (stopping.best_bleu, stopping.best_step, stopping.bad_validations) == (12.5, 300, 2)


def test_without_patience_it_never_stops():
    stopping = EarlyStopping(patience=None)
    stopping.update(5.0, step=1)
    for step in range(2, 50):
        stopping.update(1.0, step=step)
    assert stopping.bad_validations == 48 and not stopping.exhausted


def test_state_round_trips_into_a_fresh_instance():
    stopping = EarlyStopping(patience=3)
    for step, bleu in enumerate([3.0, 7.0, 6.0, 5.0], start=1):
        stopping.update(bleu, step)
    resumed = EarlyStopping(patience=3)
    resumed.load_state_dict(stopping.state_dict())
    assert resumed == stopping
    assert not resumed.update(6.5, step=5) and resumed.exhausted  # the third validation without a gain
