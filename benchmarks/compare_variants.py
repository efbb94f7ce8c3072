"""The attention and position variants compared on Multi30k en->de (docs/RESULTS.md, "Attention and position
variants").

    [MULTI30K_DIR=/path/to/multi30k] python benchmarks/compare_variants.py [OUT_DIR] [--minutes 12]

Every variant trains the ``mini`` model for the same wall-clock time (``training.max_minutes``, where the cosine
schedule ends since version 0.7; the published figures predate that: their schedule ended at step 500, after the time
limit on the machine they ran on, so they stopped at a higher rate) with the same seed, two runs side by side on one
thread each. Each is scored on test_2016_flickr (greedy) and draws one alignment picture. Then the extrapolation
check: each position option trained on pairs of at most 20 tokens, scored on the test pairs longer than that. The
whole script takes about 6 x (MINUTES + 2) minutes and prints a Markdown table.

The runs are supervised as a recipe's are (:mod:`transformer.app.runs`): Ctrl-C saves every started run, and the
same command again resumes them; a finished run (its ``metrics.json``) and a finished evaluation are kept. A run
that fails stops the others from starting and ends the script without a table (each run's console is in
``OUT/<run>.out``); run it again once the cause is fixed, and the runs go on.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from transformer.app.curves import read_curve
from transformer.app.runs import TRAIN_COMMAND, RecipeInterrupted, RunFailed, RunSpec, supervise
from transformer.config import DataConfig
from transformer.data.splits import load_split

# the settings the published comparison ran with
COMMON = ("model=mini", "eval=greedy", "training.threads=1", "training.max_steps=500", "training.warmup_steps=200",
          "training.valid_max_sentences=500", "training.lr=1e-3", "training.max_tokens=2048", "training.accumulate=2",
          "training.patience=8", "training.weight_decay=0.0")
EVALUATE_COMMAND = (sys.executable, "-m", "transformer", "evaluate")
LONGER_THAN = 20  # tokens: the extrapolation runs train on pairs up to this length and are scored on the longer ones


@dataclass(frozen=True)
class Variant:
    """One run of the comparison: its name and its own overrides."""

    name: str
    overrides: tuple[str, ...] = ()
    extrapolation: bool = False  # trained on short pairs, scored on the longer test pairs

    @property
    def folder(self) -> str:
        return f"long_{self.name}" if self.extrapolation else self.name


VARIANTS = (
    Variant("scaled_dot"),
    Variant("additive", ("experiment=attention_additive",)),
    Variant("multiplicative", ("experiment=attention_multiplicative",)),
    Variant("learned", ("experiment=positions_learned",)),
    Variant("relative", ("experiment=positions_relative",)),
    Variant("rope", ("experiment=positions_rope",)),
    Variant("none", ("experiment=positions_none",)),
    Variant("sinusoidal", (), extrapolation=True),
    Variant("learned", ("experiment=positions_learned",), extrapolation=True),
    Variant("relative", ("experiment=positions_relative",), extrapolation=True),
    Variant("rope", ("experiment=positions_rope",), extrapolation=True),
    Variant("none", ("experiment=positions_none",), extrapolation=True),
)


def run_spec(variant: Variant, out: Path, minutes: float) -> RunSpec:
    short = (f"data.max_len={LONGER_THAN}",) if variant.extrapolation else ()
    return RunSpec(out / variant.folder, (*COMMON, f"training.max_minutes={minutes}", *short, *variant.overrides),
                   label=variant.folder)


def scored_folder(variant: Variant, out: Path) -> Path:
    """Where the variant's evaluation writes: the longer test pairs, or the alignment picture's sentence."""
    return out / variant.folder / ("longer" if variant.extrapolation else "picture")


def evaluate(variant: Variant, out: Path) -> None:
    """Score an extrapolation run on the longer test pairs, or draw a run's alignment picture; kept when done."""
    run, folder = out / variant.folder, scored_folder(variant, out)
    if (folder / "metrics.json").is_file():
        return
    what = ([f"longer_than={LONGER_THAN}"] if variant.extrapolation else
            [f"src_file={out / 'picture.en'}", f"ref_file={out / 'picture.de'}", "attention.indices=[0]"])
    with open(out / f"{variant.folder}.evaluate.out", "w", encoding="utf-8") as console:
        subprocess.run([*EVALUATE_COMMAND, f"run_dir={run}", "eval=greedy", *what, f"output_dir={folder}",
                        "overwrite=true"], stdout=console, stderr=subprocess.STDOUT, check=True,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})


def table_row(variant: Variant, out: Path) -> str:
    """The variant's line of the table, from its run directory (``metrics.json``, TensorBoard) alone."""
    run = out / variant.folder
    metrics = json.loads((run / "metrics.json").read_text())
    test = json.loads((scored_folder(variant, out) / "metrics.json").read_text()) if variant.extrapolation \
        else metrics["test"]
    try:
        rate = f"{statistics.median(read_curve(run, 'train/tokens_per_s').values):.0f}"
    except ValueError:  # stopped before its first log step
        rate = "–"
    tokenized = test.get("tokenized_bleu")
    parameters = f"{metrics['parameters']:,}" if "parameters" in metrics else "–"  # recorded since version 0.9.13
    return (f"| {variant.folder} | {parameters} | {metrics['train']['steps']} "
            f"({metrics['train']['reason']}) | {rate} | {test['bleu']:.2f} | {test['chrf']:.2f} | "
            f"{'–' if tokenized is None else f'{tokenized:.2f}'} | {test['n_sentences']} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", nargs="?", default="outputs/compare", help="the folder of the runs and pictures")
    parser.add_argument("--minutes", type=float, default=12.0, help="training time of each run")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")  # which run starts, resumes, is kept
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    src, ref = load_split(DataConfig(source_dir=os.environ.get("MULTI30K_DIR")), "test_2016_flickr")
    (out / "picture.en").write_text(src[2] + "\n", encoding="utf-8")  # line 3: twelve words
    (out / "picture.de").write_text(ref[2] + "\n", encoding="utf-8")
    try:
        supervise([run_spec(variant, out, args.minutes) for variant in VARIANTS], parallel=2,
                  train_command=TRAIN_COMMAND)
    except (RecipeInterrupted, RunFailed) as stopped:
        sys.exit(f"compare_variants: {stopped}")
    failed = []
    for variant in VARIANTS:
        try:
            evaluate(variant, out)
        except subprocess.CalledProcessError:
            failed.append(variant)
            print(f"{variant.folder}: its evaluation failed (see {out / variant.folder}.evaluate.out); left out",
                  file=sys.stderr)
    print("| run | params | steps (stopped by) | target tok/s (median) | test BLEU | chrF | tokenized BLEU | sentences |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for variant in VARIANTS:
        if variant not in failed:
            print(table_row(variant, out))


if __name__ == "__main__":
    main()
