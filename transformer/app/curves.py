"""Training curves from a run's TensorBoard events: validation BLEU against minutes of training, or against
optimizer steps (for runs timed on different machines, where minutes mislead).

Minutes are the trainer's own clock (``train/minutes``, logged at each validation), which leaves out the time a
resumed run lay stopped; runs from before that scalar existed are timed by wall clock from their first event."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from transformer.checkpoint import RunDir
from transformer.tracking import TRAIN_MINUTES


@dataclass
class Curve:
    """One scalar of one run: ``minutes`` of training, ``steps`` and ``values``."""

    label: str
    minutes: list[float]
    steps: list[int]
    values: list[float]


def read_curve(run_dir: str | Path, tag: str = "valid/bleu", label: str | None = None) -> Curve:
    """The scalar ``tag`` of a training run directory (its ``tensorboard/`` events)."""
    folder = RunDir(Path(run_dir)).tensorboard
    if not folder.is_dir():
        raise ValueError(f"{run_dir}: no TensorBoard events ({folder} is not a folder); give a training run's folder")
    events = EventAccumulator(str(folder), size_guidance={"scalars": 0})
    events.Reload()
    if tag not in events.Tags()["scalars"]:
        raise ValueError(f"{folder}: no scalar {tag!r} (found {sorted(events.Tags()['scalars'])})")
    scalars = events.Scalars(tag)
    clock = {s.step: s.value for s in events.Scalars(TRAIN_MINUTES)} if TRAIN_MINUTES in events.Tags()["scalars"] \
        else {}
    if all(s.step in clock for s in scalars):
        minutes = [clock[s.step] for s in scalars]
    else:  # the wall clock: it counts the time between a stop and a resume too
        start = min(event.wall_time for tag_name in events.Tags()["scalars"] for event in events.Scalars(tag_name))
        minutes = [(s.wall_time - start) / 60 for s in scalars]
    return Curve(label or Path(run_dir).name, minutes, [s.step for s in scalars], [s.value for s in scalars])


X_AXES = {"minutes": "minutes of training", "steps": "optimizer steps"}


def plot_curves(curves: list[Curve], out: str | Path, ylabel: str = "validation BLEU",
                reference: Curve | None = None, x: str = "minutes") -> Path:
    """Draw value-against-``x`` lines (``minutes`` or ``steps``; an optional dashed reference curve) into a PNG."""
    if x not in X_AXES:
        raise ValueError(f"x must be one of {sorted(X_AXES)}, got {x!r}")
    fig = Figure(figsize=(7, 4.5), dpi=120)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for curve in curves:
        ax.plot(getattr(curve, x), curve.values, marker="o", markersize=3, label=curve.label)
    if reference is not None:
        ax.plot(getattr(reference, x), reference.values, linestyle="--", marker="s", color="grey",
                label=reference.label)
    ax.set_xlabel(X_AXES[x])
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out)
    return Path(out)
