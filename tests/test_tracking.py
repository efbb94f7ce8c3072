"""Tracker: scalars land in TensorBoard event files under the documented names; disabled trackers write nothing."""

from __future__ import annotations

import io
import sys

import numpy as np
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from transformer.tracking import ProgressBar, Tracker


def test_scalars_and_text_are_written(tmp_path):
    tracker = Tracker(tmp_path / "tb", enabled=True)
    tracker.scalars({"loss": 2.5, "lr": 0.001}, 3, prefix="train")
    tracker.scalars({"test/bleu": 31.0}, 9)
    tracker.text("valid/samples", "a | b", 3)
    tracker.close()
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    assert set(events.Tags()["scalars"]) == {"train/loss", "train/lr", "test/bleu"}
    [loss] = events.Scalars("train/loss")
    assert (loss.step, loss.value) == (3, 2.5)
    assert events.Scalars("test/bleu")[0].step == 9
    [sample] = events.Tensors("valid/samples/text_summary")
    assert sample.step == 3 and sample.tensor_proto.string_val == [b"a | b"]


def test_an_image_is_written_height_width_channels(tmp_path):
    picture = np.zeros((5, 7, 3), dtype=np.uint8)  # 5 high, 7 wide
    picture[:, :, 0] = 255
    tracker = Tracker(tmp_path / "tb", enabled=True)
    tracker.image("valid/alignment", picture, 4)
    tracker.close()
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    [image] = events.Images("valid/alignment")
    assert (image.step, image.height, image.width) == (4, 5, 7)


def test_disabled_tracker_and_bar_do_nothing(tmp_path, capsys):
    tracker = Tracker(tmp_path / "tb", enabled=False)
    tracker.scalars({"loss": 1.0}, 1, prefix="train")
    tracker.hparams({"lr": 1.0}, {"bleu": 1.0})
    tracker.close()
    assert not (tmp_path / "tb").exists()
    bar = ProgressBar(10, enabled=False)
    bar.update(1, loss=1.0, tokens_per_s=5.0)
    bar.close()
    assert capsys.readouterr() == ("", "")


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("stream, shown", [(_Terminal(), True), (io.StringIO(), False)])
def test_progress_bar_draws_only_on_a_terminal(monkeypatch, stream, shown):
    monkeypatch.setattr(sys, "stderr", stream)
    bar = ProgressBar(10, enabled=True, desc="epoch 3")
    bar.update(4, loss=1.25)
    bar.close()
    assert ("epoch 3:" in stream.getvalue()) is shown
    assert shown or stream.getvalue() == ""
