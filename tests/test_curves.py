"""Training curves: scalars read back from TensorBoard events with minutes since the run's first event,
a missing tag named with the ones found, and the PNG drawn at the figure's size."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import matplotlib.image
import pytest
from conftest import REPO
from torch.utils.tensorboard import SummaryWriter

from transformer.app.curves import Curve, plot_curves, read_curve

T0 = 1_700_000_000.0  # wall-clock seconds of the run's first event


@pytest.fixture()
def run_dir(tmp_path: Path) -> Path:
    """A run whose first event is a training loss at T0; validation BLEU follows 2, 5 and 9 minutes later."""
    run = tmp_path / "2026-01-01_00-00-00"
    with SummaryWriter(log_dir=str(run / "tensorboard")) as writer:
        writer.add_scalar("train/loss", 5.0, 10, walltime=T0)
        for step, minutes, bleu in ((100, 2.0, 10.5), (200, 5.0, 20.25), (300, 9.0, 24.0)):
            writer.add_scalar("valid/bleu", bleu, step, walltime=T0 + 60 * minutes)
    return run


def test_read_curve_measures_minutes_from_the_first_event_of_any_tag(run_dir: Path) -> None:
    curve = read_curve(run_dir)
    assert curve.label == "2026-01-01_00-00-00"  # the run directory's name by default
    assert curve.steps == [100, 200, 300]
    assert curve.values == [10.5, 20.25, 24.0]  # exact in float32
    assert curve.minutes == pytest.approx([2.0, 5.0, 9.0], abs=1e-3)
    loss = read_curve(run_dir, tag="train/loss", label="loss")
    assert (loss.label, loss.minutes, loss.steps, loss.values) == ("loss", [0.0], [10], [5.0])


def test_minutes_come_from_the_trainers_clock_when_it_was_logged(tmp_path: Path) -> None:
    """A run stopped for an hour after step 200 and resumed: its wall clock jumps, its training clock does not.
    A run logging the clock at some validations only falls back to the wall clock for all of them."""
    run = tmp_path / "resumed"
    with SummaryWriter(log_dir=str(run / "tensorboard")) as writer:
        writer.add_scalar("train/loss", 5.0, 10, walltime=T0)
        for step, wall, trained, bleu in ((100, 2.0, 2.0, 10.5), (200, 5.0, 5.0, 20.25), (300, 69.0, 9.0, 24.0)):
            writer.add_scalar("valid/bleu", bleu, step, walltime=T0 + 60 * wall)
            writer.add_scalar("train/minutes", trained, step, walltime=T0 + 60 * wall)
    assert read_curve(run).minutes == pytest.approx([2.0, 5.0, 9.0])
    assert read_curve(run, tag="train/minutes").values == pytest.approx([2.0, 5.0, 9.0])
    old = tmp_path / "partly"
    with SummaryWriter(log_dir=str(old / "tensorboard")) as writer:
        writer.add_scalar("valid/bleu", 10.5, 100, walltime=T0)
        writer.add_scalar("valid/bleu", 20.25, 200, walltime=T0 + 60 * 65.0)
        writer.add_scalar("train/minutes", 4.0, 200, walltime=T0 + 60 * 65.0)
    assert read_curve(old).minutes == pytest.approx([0.0, 65.0], abs=1e-3)


def test_a_missing_tag_names_the_tags_found(run_dir: Path) -> None:
    with pytest.raises(ValueError, match=r"no scalar 'valid/chrf' \(found \['train/loss', 'valid/bleu'\]\)"):
        read_curve(run_dir, tag="valid/chrf")


def test_the_script_refuses_a_folder_without_events_a_missing_tag_and_a_bad_reference_in_one_line(
        run_dir: Path, tmp_path: Path) -> None:
    def plot(*args: str) -> tuple[int, str]:
        done = subprocess.run([sys.executable, str(REPO / "scripts" / "plot_curves.py"), str(tmp_path / "c.png"),
                               *args], capture_output=True, text=True)
        return done.returncode, done.stderr.strip().splitlines()[-1]

    assert plot(str(tmp_path / "nowhere")) == (1, f"plot_curves: {tmp_path / 'nowhere'}: no TensorBoard events "
                                                  f"({tmp_path / 'nowhere' / 'tensorboard'} is not a folder); give a "
                                                  "training run's folder")
    assert plot(str(run_dir), "--tag", "valid/blue") == (
        1, f"plot_curves: {run_dir / 'tensorboard'}: no scalar 'valid/blue' (found ['train/loss', 'valid/bleu'])")
    code, said = plot(str(run_dir), "--reference", "bad")
    assert code == 2 and said.endswith("error: --reference: 'bad' is not LABEL=X:VALUE,X:VALUE,... "
                                       '(e.g. "OpenNMT-py=11:13.4,23:29.6")')
    assert not (tmp_path / "c.png").exists()


def _lines(figure) -> list[tuple[str, list, list, str]]:
    """Each line of the figure's one plot: its label, x and y values and line style."""
    [axes] = figure.axes
    return [(line.get_label(), list(line.get_xdata()), list(line.get_ydata()), line.get_linestyle())
            for line in axes.get_lines()]


def test_plot_curves_draws_each_curve_and_the_reference_in_a_png_of_the_figure_size(run_dir: Path, tmp_path: Path,
                                                                                   saved_figures) -> None:
    ours = read_curve(run_dir, label="ours")
    reference = Curve("reference", [1.0, 4.0], [0, 0], [8.0, 16.0])
    out = plot_curves([ours], tmp_path / "curve.png", reference=reference)
    assert out == tmp_path / "curve.png"
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert matplotlib.image.imread(out).shape[:2] == (540, 840)  # 4.5 x 7 inches at 120 dpi
    [figure] = saved_figures
    assert _lines(figure) == [("ours", ours.minutes, [10.5, 20.25, 24.0], "-"),
                              ("reference", [1.0, 4.0], [8.0, 16.0], "--")]
    [axes] = figure.axes
    assert [text.get_text() for text in axes.get_legend().get_texts()] == ["ours", "reference"]
    assert (axes.get_xlabel(), axes.get_ylabel()) == ("minutes of training", "validation BLEU")


def test_plot_curves_draws_against_steps_when_asked(run_dir: Path, tmp_path: Path, saved_figures) -> None:
    curve = read_curve(run_dir, label="ours")
    by_minutes = plot_curves([curve], tmp_path / "minutes.png")
    by_steps = plot_curves([curve], tmp_path / "steps.png", x="steps")
    assert matplotlib.image.imread(by_steps).shape == matplotlib.image.imread(by_minutes).shape
    minutes, steps = saved_figures
    assert _lines(minutes) == [("ours", curve.minutes, curve.values, "-")]
    assert _lines(steps) == [("ours", [100, 200, 300], curve.values, "-")]
    assert steps.axes[0].get_xlabel() == "optimizer steps" and minutes.axes[0].get_xlabel() == "minutes of training"
    with pytest.raises(ValueError, match=r"x must be one of \['minutes', 'steps'\], got 'epochs'"):
        plot_curves([curve], tmp_path / "epochs.png", x="epochs")
    assert len(saved_figures) == 2 and not (tmp_path / "epochs.png").exists()
