from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from transformer.training.step_window import StepWindow, TrainingDiverged


def _window_of(steps: list[tuple[float, float, float, float, int]]) -> StepWindow:
    window = StepWindow(torch.zeros(4), first_step=7)
    for loss, nll, nonfinite, norm, tokens in steps:
        window.add(torch.tensor([loss, nll, nonfinite, norm]), tokens)
    return window


def test_a_read_sums_the_steps_and_keeps_the_last_gradient_norm():
    window = _window_of([(10.0, 8.0, 0.0, 1.5, 4), (6.0, 4.0, 0.0, 0.5, 6)])
    reading = window.read(interrupt=False, late=True, save_due=False, world_size=1)
    assert (reading.loss_sum, reading.nll_sum, reading.tokens, reading.grad_norm) == (16.0, 12.0, 10.0, 0.5)
    assert (reading.interrupt, reading.late, reading.save_due) == (False, True, False)
    values = reading.log_values(seconds=2.0, lr=1e-3)
    assert values["loss"] == pytest.approx(1.6) and values["tokens_per_s"] == pytest.approx(5.0)
    assert values["ppl"] == pytest.approx(math.exp(1.2))
    reading.raise_if_diverged(8, window.first_step, Path("last.pt"))  # finite: nothing happens


def test_a_non_finite_step_in_the_window_raises_with_where_it_happened(tmp_path):
    window = _window_of([(10.0, 8.0, 0.0, 1.0, 4), (0.0, 0.0, 1.0, float("inf"), 4)])
    reading = window.read(interrupt=False, late=False, save_due=False, world_size=1)
    last = tmp_path / "last.pt"
    with pytest.raises(TrainingDiverged, match=r"step 8: .*1 non-finite step\(s\) since step 7.*skipped and no "
                                               r"checkpoint was written \(none had been yet\); lower training\.lr"):
        reading.raise_if_diverged(8, window.first_step, last)
    last.write_bytes(b"a checkpoint")
    with pytest.raises(TrainingDiverged, match=rf"skipped and the last good checkpoint \({last}\) was not "
                                               r"overwritten; lower training\.lr"):
        reading.raise_if_diverged(8, window.first_step, last)


def test_reset_starts_an_empty_window_after_the_step():
    window = _window_of([(10.0, 8.0, 0.0, 1.0, 4)])
    window.reset(step=9)
    assert window.tokens == 0.0 and window.first_step == 10 and not window.sums.any()
