"""Recipes: several trainings and what is made of them, run by ``transformer-recipe``.

    transformer-recipe ensemble OUT_DIR [OVERRIDES...] [--seeds 1234,1,2] [--parallel N] [--more-members RUN,...]
    transformer-recipe diversified OUT_DIR [OVERRIDES...] [--seeds ...] [--backward-seeds ...] [--student-seeds ...]
    transformer-recipe best_gpu OUT_DIR [OVERRIDES...] [--no-mps]

(``--parallel N --mps`` trains an ensemble's runs side by side on one GPU.)

- **ensemble**: one run per seed in ``OUT_DIR/seed_<seed>``, scored as one ensemble on the validation and test
  splits (``OUT_DIR/ensemble_val``, ``OUT_DIR/ensemble_test``) (docs/RESULTS.md, "Ensembles").
- **diversified**: data diversification (docs/RESULTS.md, "Data diversification"): teachers in both directions,
  their translations of the training split (``OUT_DIR/corpus``, three times the pairs), students on it, the students
  scored as one ensemble (``OUT_DIR/student/ensemble_test``).
- **best_gpu**: the diversification recipe shaped for one GPU: its runs train side by side under NVIDIA MPS.

OVERRIDES go to every training. Run a recipe again after a crash or Ctrl-C, with the same overrides: a finished
run is kept, a started one resumed (:mod:`transformer.app.runs`). The data is made ready in this process before any
run starts, so that runs side by side share it; scoring runs in this process too.
"""

from __future__ import annotations

import argparse
import json
import logging
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from transformer.app import diversify, pipeline, use
from transformer.app.mps import mps
from transformer.app.runs import TRAIN_COMMAND, RunSpec, RunState, run_state, supervise
from transformer.app.schemas import PrepareDataConfig
from transformer.checkpoint import RunDir, load_checkpoint
from transformer.config import ConfigError, TrainConfig, to_plain_dict
from transformer.data import cache as corpus_cache
from transformer.data.tokenizer import tokenizer_digest, tokenizer_from_state
from transformer.inference.loading import find_checkpoint
from transformer.overrides import override_value

log = logging.getLogger(__name__)


def compose_command(name: str, overrides: Sequence[str]) -> Any:
    """The typed config of command ``name`` (``train``, ``evaluate``, ``diversify``) that ``overrides`` compose, as
    the command would; ``ConfigError`` with Hydra's message when they do not compose."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from transformer.app.schemas import CONFIG_PATH, refuse_unknown_keys, register_configs

    register_configs()
    try:
        with initialize_config_dir(config_dir=CONFIG_PATH, version_base="1.3"):
            # The run folder of ``train`` is Hydra's, resolved only in a Hydra job: the recipe reads other keys.
            cfg = compose(name, overrides=[*overrides, "output_dir=unused"] if name == "train" else list(overrides))
        typed = OmegaConf.to_object(cfg)
        refuse_unknown_keys(typed)
        return typed
    except (HydraException, OmegaConfBaseException) as error:
        raise ConfigError(f"the recipe's overrides do not compose ({' '.join(overrides)}): {error}") from None


def compose_train(overrides: Sequence[str]) -> TrainConfig:
    return compose_command("train", overrides)


def passed_on(overrides: Sequence[str], keys: Sequence[str]) -> list[str]:
    """The overrides of ``keys`` (a group ``eval`` matches ``eval=...`` and ``eval.x=...``)."""
    return [o for o in overrides if any(o.startswith((f"{key}=", f"{key}.")) for key in keys)]


@dataclass
class Options:
    """What every recipe shares: where, with which overrides, how many runs at once, how runs are started."""

    out: Path
    overrides: list[str]
    parallel: int = 1
    train_command: Sequence[str] = TRAIN_COMMAND
    prepare: bool = True  # make the data ready in this process first (tests with a fake command: False)
    train_only: bool = False  # train (or keep) the runs, score nothing


def prepare(overrides: Sequence[str]) -> TrainConfig:
    """Compose the config and make its data ready (corpus checked, tokenizers and encoded split cached)."""
    cfg = compose_train(overrides)
    pipeline.prepare_data(PrepareDataConfig(data=cfg.data))
    return cfg


def member_specs(out: Path, overrides: Sequence[str], seeds: Sequence[int]) -> list[RunSpec]:
    """One run per seed (a seed named twice: one run), in ``out/seed_<seed>``."""
    return [RunSpec(out / f"seed_{seed}", (*overrides, f"training.seed={seed}"), f"seed {seed}")
            for seed in dict.fromkeys(seeds)]


def score_ensemble(members: Sequence[Path], out: Path, overrides: Sequence[str],
                   valid_split: str | None = None) -> dict:
    """Score ``members`` (run folders) as one ensemble on ``valid_split`` (default: the data's validation split) and
    on the test split, with the search the members' training scored them with (``overrides`` composed: a group such
    as ``debug=cpu_tiny`` sets it too) on the ``device`` the overrides name; the test metrics."""
    cfg = compose_train(overrides)
    valid_split = valid_split or cfg.data.valid_split
    first, *others = members
    search = [f"eval.{key}={override_value(value)}" for key, value in to_plain_dict(cfg.eval).items()]
    common = [f"run_dir={override_value(first)}", f"ensemble={override_value(others)}",
              "overwrite=true", *search, *passed_on(overrides, ("device",))]  # overwrite: the recipe's own folders
    use.evaluate(compose_command("evaluate", [*common, f"split={valid_split}",
                                                   f"output_dir={override_value(out / 'ensemble_val')}"]))
    return use.evaluate(compose_command("evaluate", [*common,
                                                          f"output_dir={override_value(out / 'ensemble_test')}"]))


def report_members(members: Sequence[Path]) -> None:
    """Each run's own test score, as its training recorded it in ``metrics.json``."""
    for member in members:
        test = json.loads(RunDir(member).metrics.read_text(encoding="utf-8"))["test"]
        tokenized = "" if test.get("tokenized_bleu") is None else f", tokenized BLEU {test['tokenized_bleu']:.2f}"
        print(f"{member}: test BLEU {test['bleu']:.2f}, chrF {test['chrf']:.2f}{tokenized}")


def check_finished(runs: Sequence[Path], what: str) -> None:
    """Refuse, before any training, runs to score with the recipe's that are not finished."""
    for run in runs:
        if run_state(run) is not RunState.finished:
            raise ConfigError(f"{what}: {run} is not a finished run (no {RunDir(run).metrics})")


def check_same_data(cfg: TrainConfig, runs: Sequence[Path]) -> None:
    """Refuse, before any training, extra members of another language pair or other tokenizers than the recipe's
    runs (``cfg``'s, whose data is ready): the ensemble would refuse them only after the training."""
    if not runs:
        return
    src_tok, tgt_tok, _ = corpus_cache.load_or_build(cfg.data)
    ours = (cfg.data.src, cfg.data.tgt, tokenizer_digest(src_tok), tokenizer_digest(tgt_tok))
    for run in runs:
        state = load_checkpoint(find_checkpoint(run), mmap=True)  # its config and tokenizers, no model built
        data, tokenizers = state["config"]["data"], state["tokenizers"]
        theirs = (data["src"], data["tgt"], *(tokenizer_digest(tokenizer_from_state(tokenizers[side]))
                                              for side in ("src", "tgt")))
        if theirs != ours:
            differs = "language pair" if theirs[:2] != ours[:2] else "tokenizers"
            raise ConfigError(f"more_members: {run} ({data['src']}->{data['tgt']}) differs from this recipe's runs "
                              f"({cfg.data.src}->{cfg.data.tgt}) in its {differs}; an ensemble's members must share "
                              "them: add runs trained with the same data settings")


def ensemble(options: Options, seeds: Sequence[int], more_members: Sequence[Path] = (),
             valid_split: str | None = None) -> dict | None:
    """Train one run per seed (kept, resumed or new) and score them, with ``more_members``, as one ensemble; the
    ensemble's test metrics (None when only training, or with one run)."""
    if not seeds:
        raise ConfigError("seeds: name at least one seed")
    check_finished(more_members, "more_members")
    if options.prepare:
        check_same_data(prepare(options.overrides), more_members)
    specs = member_specs(options.out, options.overrides, seeds)
    supervise(specs, parallel=options.parallel, train_command=options.train_command)
    members = [spec.run for spec in specs] + list(more_members)
    if options.train_only:
        return None
    if len(members) == 1:
        report_members(members)
        return None
    metrics = score_ensemble(members, options.out, options.overrides, valid_split)
    report_members(members)
    return metrics


@dataclass
class Diversified:
    """The seeds of data diversification's runs (``none`` on the command line: no runs of that kind)."""

    seeds: list[int] = field(default_factory=lambda: [1234, 1, 2])  # forward teachers
    backward_seeds: list[int] = field(default_factory=lambda: [1234, 1])
    student_seeds: list[int] = field(default_factory=lambda: [1234, 1, 2])
    wide_student_seeds: list[int] = field(default_factory=lambda: [1234])
    student_epochs: int = 15  # 46 epochs' worth of updates on three times the pairs
    score_teachers: bool = True


def diversified(options: Options, plan: Diversified) -> dict | None:
    """Teachers both ways, the corpus they extend, students on it scored as one ensemble; its test metrics."""
    if not plan.seeds:
        raise ConfigError("seeds: the forward teachers need at least one seed")
    if not plan.student_seeds and not plan.wide_student_seeds:
        raise ConfigError("student-seeds: the recipe ends in its students; name at least one seed (student-seeds "
                          "or wide-student-seeds)")
    overrides = ["training.max_minutes=null", *options.overrides]  # first, so that a limit among them wins
    # two kinds of runs side by side: both directions' teachers, then both kinds of students
    at_once = options.parallel * (2 if options.parallel > 1 else 1)
    cfg = compose_train(overrides)  # a bad override stops the recipe here, before any training
    backward = [*overrides, f"data.src={override_value(cfg.data.tgt)}", f"data.tgt={override_value(cfg.data.src)}"]
    out = options.out
    if options.prepare:
        prepare(overrides)
        if plan.backward_seeds:
            prepare(backward)
    teachers = member_specs(out / "forward", overrides, plan.seeds) \
        + member_specs(out / "backward", backward, plan.backward_seeds)
    # The two directions side by side: up to twice ``parallel`` runs at once.
    supervise(teachers, parallel=at_once,
              train_command=options.train_command)
    if plan.score_teachers and not options.train_only:
        for side, seeds, composed in (("forward", plan.seeds, overrides), ("backward", plan.backward_seeds, backward)):
            if len(seeds) > 1:
                score_ensemble([out / side / f"seed_{seed}" for seed in seeds], out / side, composed)
    corpus = out / "corpus"
    if (corpus / "diversify.json").is_file():
        log.info("diversified corpus: made earlier, kept (%s)", corpus)
    else:
        make_corpus(out, overrides, plan)
    student = [*overrides, f"data.train_dir={override_value(corpus)}", "data.max_pairs=null",
               f"training.max_epochs={plan.student_epochs}"]
    if options.prepare:
        prepare(student)
    students = member_specs(out / "student", student, plan.student_seeds) \
        + member_specs(out / "student_wide", [*student, "model=wide"], plan.wide_student_seeds)
    supervise(students, parallel=at_once,
              train_command=options.train_command)
    if options.train_only:
        return None
    metrics = score_ensemble([spec.run for spec in students], out / "student", overrides)
    report_members([spec.run for spec in students])
    return metrics


def make_corpus(out: Path, overrides: Sequence[str], plan: Diversified) -> None:
    """The training split extended by the teachers' translations of it (``transformer-diversify``'s search; of the
    recipe's overrides only the device and ``eval.batch_size`` reach this step)."""
    shutil.rmtree(out / "corpus", ignore_errors=True)  # a crash before diversify.json leaves nothing worth keeping
    diversify.run(compose_command("diversify", [
        f"forward={override_value([out / 'forward' / f'seed_{seed}' for seed in plan.seeds])}",
        f"backward={override_value([out / 'backward' / f'seed_{seed}' for seed in plan.backward_seeds])}",
        f"out_dir={override_value(out / 'corpus')}", *passed_on(overrides, ("device", "eval.batch_size"))]))


BEST_GPU_OVERRIDES = ("training.validate_every_steps=1082", "eval.batch_size=2048")


def best_gpu(options: Options, plan: Diversified, use_mps: bool = True) -> dict | None:
    """Data diversification on one GPU: runs side by side (three teachers of each direction at once, then the
    students) under MPS, validating every 1,082 steps, decoding 2,048 sentences a batch; teachers' ensembles
    unscored. Measured on one H100: 9.0 minutes each way (docs/RESULTS.md, "Nine minutes on one H100")."""
    probe = "import sys, torch; sys.exit(not torch.cuda.is_available())"  # apart: CUDA starts after MPS here
    if subprocess.run([sys.executable, "-c", probe], capture_output=True).returncode != 0:
        raise ConfigError("best_gpu is the recipe for a GPU, and torch sees none here; on a CPU, "
                          f"transformer-recipe diversified {options.out} trains the same recipe one run at a time "
                          "(about 8.5 hours on 2 cores)")
    started = time.monotonic()
    shaped = replace(options, overrides=[*BEST_GPU_OVERRIDES, *options.overrides])  # the caller's stay as they were
    with mps(enabled=use_mps):
        metrics = diversified(shaped, replace(plan, score_teachers=False))
    minutes, seconds = divmod(int(time.monotonic() - started), 60)
    print(f"the recipe took {minutes} min {seconds} s")
    if metrics is not None:
        print(translate_hint(metrics))
    return metrics


def translate_hint(metrics: dict[str, Any]) -> str:
    """The command that translates with the students an evaluation scored (one student: no ensemble)."""
    others = metrics.get("ensemble") or []  # quoted for Hydra, then for the shell
    members = " " + shlex.quote(f"ensemble={override_value(others)}") if others else ""
    checkpoint = shlex.quote(f"checkpoint={override_value(metrics['checkpoint'])}")
    return f"translate with it: transformer-translate {checkpoint}{members} < input.txt > output.txt"


def _seeds(text: str) -> list[int]:
    """``1234,1,2`` -> [1234, 1, 2]; ``none`` -> []."""
    if text.strip() == "none":
        return []
    try:
        seeds = [int(seed) for seed in text.replace(" ", ",").split(",") if seed]
    except ValueError:
        raise argparse.ArgumentTypeError(f"seeds are integers separated by commas (or none), got {text!r}") from None
    if twice := sorted({seed for seed in seeds if seeds.count(seed) > 1}):
        raise argparse.ArgumentTypeError(f"seed {twice[0]} is given twice in {text!r}: a seed names one run")
    return seeds


DESCRIPTION = """transformer-recipe: several trainings and what is made of them. ensemble: seeds trained and scored as
one ensemble; diversified: data diversification, from the teachers through the corpus to the students scored as one;
best_gpu: the best recipe shaped for one GPU. Guide: transformer-guide recipe (docs/guide/recipe.md)"""


def command_line() -> argparse.ArgumentParser:
    """``transformer-recipe``'s arguments."""
    parser = argparse.ArgumentParser(prog="transformer-recipe", description=DESCRIPTION)
    default = Diversified()
    parser.add_argument("recipe", nargs="?", choices=["ensemble", "diversified", "best_gpu"], help="the recipe")
    parser.add_argument("out_dir", nargs="?", help="the recipe's folder: its runs, corpus and scores")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides for every training, e.g. data=multi30k_de_en")
    parser.add_argument("--seeds", type=_seeds, default=default.seeds, help="the runs' seeds (diversified: the "
                        "forward teachers'), comma-separated (default " + ",".join(map(str, default.seeds)) + ")")
    parser.add_argument("--parallel", type=int, help="runs at once: more only on a GPU (default 1; best_gpu: 3); "
                        "above 1, diversified and best_gpu run twice as many (both directions' teachers together)")
    parser.add_argument("--train-only", action="store_true", help="train or keep the runs, score nothing")
    parser.add_argument("--more-members", type=lambda text: [Path(p) for p in text.split(",") if p], default=[],
                        help="ensemble: finished runs of another recipe on the same data, scored with these")
    parser.add_argument("--valid-split", help="ensemble: the split to score it on besides the test split (default: "
                        "the corpus's data.valid_split)")
    parser.add_argument("--backward-seeds", type=_seeds, default=default.backward_seeds, help="diversified: the "
                        "backward teachers, the direction swapped (default "
                        + ",".join(map(str, default.backward_seeds)) + "; none: no backward teachers)")
    parser.add_argument("--student-seeds", type=_seeds, default=default.student_seeds, help="diversified: the "
                        "students of the recipe's own model (default " + ",".join(map(str, default.student_seeds))
                        + "; none: only wide ones)")
    parser.add_argument("--wide-student-seeds", type=_seeds, default=default.wide_student_seeds,
                        help="diversified: the students of model=wide (default "
                        + ",".join(map(str, default.wide_student_seeds)) + "; none: no wide one)")
    parser.add_argument("--student-epochs", type=int, default=default.student_epochs, help="diversified: the "
                        f"students' epochs over the diversified corpus (default {default.student_epochs})")
    parser.add_argument("--no-score-teachers", action="store_true", help="diversified: score no teachers' ensemble")
    parser.add_argument("--mps", action=argparse.BooleanOptionalAction, help="run under NVIDIA MPS, so that runs "
                        "side by side share the GPU at once (default: on for best_gpu only)")
    return parser
