"""Plot validation BLEU against training minutes (or optimizer steps) for one or more runs.

    python scripts/plot_curves.py docs/curve.png outputs/train/RUN_A ours=outputs/train/RUN_B \
        [--tag valid/bleu] [--x steps] [--reference "OpenNMT-py=11:13.4,23:29.6"]

Minutes are the training time each validation logged (``train/minutes``: the time a resumed run lay stopped is
not counted); runs from machines of different speeds compare better by ``--x steps``.
"""

from __future__ import annotations

import argparse
import sys

from transformer.app.curves import X_AXES, Curve, plot_curves, read_curve


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", help="PNG to write")
    parser.add_argument("runs", nargs="+", help="training run directories; LABEL=DIR names a curve")
    parser.add_argument("--tag", default="valid/bleu", help="TensorBoard scalar to plot")
    parser.add_argument("--x", choices=sorted(X_AXES), default="minutes", help="the horizontal axis")
    parser.add_argument("--reference", help="a dashed reference curve, LABEL=X:VALUE,X:VALUE,... (X in --x units)")
    args = parser.parse_args()
    reference = None
    if args.reference:
        try:
            label, points = args.reference.split("=", 1)
            pairs = [(float(x), float(value)) for x, value in (point.split(":") for point in points.split(","))]
        except ValueError:
            parser.error(f"--reference: {args.reference!r} is not LABEL=X:VALUE,X:VALUE,... "
                         "(e.g. \"OpenNMT-py=11:13.4,23:29.6\")")
        xs = [x for x, _ in pairs]
        reference = Curve(label, xs, [int(x) for x in xs], [v for _, v in pairs])  # x in either unit
    try:
        curves = [read_curve(run.split("=", 1)[-1], args.tag, run.split("=", 1)[0] if "=" in run else None)
                  for run in args.runs]
        print(plot_curves(curves, args.out, ylabel=args.tag, reference=reference, x=args.x))
    except (ValueError, OSError) as error:  # a folder without events, a scalar not logged, an unwritable PNG
        sys.exit(f"plot_curves: {error}")


if __name__ == "__main__":
    main()
