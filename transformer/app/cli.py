"""Console entry points (``transformer-train`` & co.): compose the Hydra config, convert it once to typed
dataclasses and call one function of :mod:`.pipeline`, :mod:`.use` or the command's own module; an expected failure
ends in one line (:mod:`.failures`).

The config root is the repository's ``configs/`` folder when the package runs from a source tree (an editable
install, or ``PYTHONPATH``), else the copy of it that a wheel installs inside the package (``transformer/configs``).
"""

from __future__ import annotations

import logging
import signal
import sys
import warnings
from pathlib import Path
from typing import Any, Callable

import hydra
from omegaconf import DictConfig, OmegaConf

from transformer.app import before_hydra, config_files, run_folder, schemas, sweeps
from transformer.app.before_hydra import overrides_given
from transformer.app.failures import (
    PATH_ERRORS,
    named_by_the_command,
    path_error_line,
    run_command,
    said_by_rank_0,
    user_errors,
)
from transformer.app.resumed import with_recipe
from transformer.app.schemas import CONFIG_PATH
from transformer.interrupts import exit_status, raise_interrupted

log = logging.getLogger(__name__)


@hydra.main(config_path=CONFIG_PATH, config_name="train", version_base="1.3")
def _train(cfg: DictConfig) -> float | None:
    from transformer.app import pipeline

    def train(cfg: DictConfig) -> dict:
        _say_what_debug_replaces()
        with said_by_rank_0():
            cfg, recipe = with_recipe(cfg)
            typed = _typed(cfg)
        return pipeline.train(typed, recipe)

    metrics = run_command(train, cfg, typed=False)
    return metrics.get("valid_bleu") if metrics else None  # the value a Hydra sweeper would optimise


def _typed(cfg: DictConfig) -> Any:
    """``cfg`` as its dataclass (which runs every ``__post_init__`` check), refusing a key no schema has."""
    typed = OmegaConf.to_object(cfg)
    schemas.refuse_unknown_keys(typed)
    return typed


def _say_what_debug_replaces() -> None:
    """A ``debug`` preset chooses its own model and search options (it comes after ``experiment`` in the defaults
    list): with an experiment, say that the experiment's model option is not the one trained (a GloVe one, say)."""
    from hydra.core.hydra_config import HydraConfig

    choices = HydraConfig.get().runtime.choices
    if choices.get("debug") and choices.get("experiment"):
        log.warning("debug=%s chooses its own model and search (model=%s, eval=%s) over experiment=%s's; the keys "
                    "the experiment sets itself still apply: a check of the pipeline, not a run of the experiment",
                    choices["debug"], choices.get("model"), choices.get("eval"), choices["experiment"])


def _export_search(cfg: DictConfig) -> DictConfig:
    """``export_dir=``: the search its ``export.json`` records, under the ``eval.*`` settings given on the command
    line (an ``eval=...`` group given: that group's search, as for a run)."""
    from hydra.core.hydra_config import HydraConfig

    from transformer.inference.export import EXPORT_FILE, read_export_record

    if not cfg.get("export_dir") or not (Path(str(cfg.export_dir)) / EXPORT_FILE).is_file():
        return cfg
    given = overrides_given(list(HydraConfig.get().overrides.task))
    if "eval" in given:
        return cfg
    for key, value in read_export_record(Path(str(cfg.export_dir))).get("decoding", {}).items():
        if key in cfg.eval and f"eval.{key}" not in given:
            cfg.eval[key] = value
    return cfg


def _one_kind_of_source(cfg: Any) -> Any:
    """An export is given only as ``export_dir``, and ``export_dir`` is only an export: refused by key before
    anything loads."""
    from transformer.config import ConfigError
    from transformer.inference.export import EXPORT_FILE

    for key in ("run_dir", "checkpoint", "export_dir"):
        if (path := getattr(cfg, key)) is not None and (Path(path) / EXPORT_FILE).is_file() != (key == "export_dir"):
            raise ConfigError(f"{key}: {path} is a CTranslate2 export; give it as export_dir={path}"
                              if key != "export_dir" else
                              f"export_dir: {path} is not an export (no {EXPORT_FILE}; transformer-export makes one); "
                              "give a run as run_dir=... or a checkpoint as checkpoint=...")
    return cfg


@hydra.main(config_path=CONFIG_PATH, config_name="evaluate", version_base="1.3")
def _evaluate(cfg: DictConfig) -> None:
    from transformer.app import use

    run_command(lambda typed: use.evaluate(_one_kind_of_source(typed)), cfg, prepare=_export_search)


@hydra.main(config_path=CONFIG_PATH, config_name="translate", version_base="1.3")
def _translate(cfg: DictConfig) -> None:
    from transformer.app import use

    run_command(lambda typed: use.translate(_one_kind_of_source(typed)), cfg, prepare=_export_search)


@hydra.main(config_path=CONFIG_PATH, config_name="serve", version_base="1.3")
def _serve(cfg: DictConfig) -> None:
    from transformer.app import server

    run_command(lambda typed: server.serve(_one_kind_of_source(typed)), cfg, prepare=_export_search)


@hydra.main(config_path=CONFIG_PATH, config_name="diversify", version_base="1.3")
def _diversify(cfg: DictConfig) -> None:
    from transformer.app import diversify

    run_command(diversify.run, cfg)


@hydra.main(config_path=CONFIG_PATH, config_name="prepare_data", version_base="1.3")
def _prepare_data(cfg: DictConfig) -> None:
    from transformer.app import pipeline

    run_command(pipeline.prepare_data, cfg)


@hydra.main(config_path=CONFIG_PATH, config_name="export", version_base="1.3")
def _export(cfg: DictConfig) -> None:
    from transformer.app import use

    run_command(use.export, cfg)


@hydra.main(config_path=CONFIG_PATH, config_name="benchmark", version_base="1.3")
def _benchmark(cfg: DictConfig) -> None:
    from transformer.app import benchmark

    run_command(benchmark.run, cfg, prepare=_benchmarked_search)


def _benchmarked_search(cfg: DictConfig) -> DictConfig:
    schemas.refuse_benchmarked_sampling(cfg.eval.sampling_topk)
    return cfg


def _setup(schema: type | None = None, command: str = "", check: Callable[[DictConfig], Any] = _typed) -> None:
    """Register the config schemas; the checks before Hydra composes (``before_hydra``: a key the ``schema`` of
    ``command``, whose root config is ``configs/<command>.yaml``, lacks; ``sweeps``: each job of a sweep, put through
    ``check``, what the command's job does to its config before any work); make Ctrl-C stop a command that a shell
    script started in the background.

    Such a command inherits SIGINT ignored (bash's rule for background jobs), yet Ctrl-C reaches the script's whole
    process group: so SIGINT raises KeyboardInterrupt here too, from the start (training itself first finishes its
    step and saves: ``interrupts.defer_sigint``). SIGTERM, what ``kill`` and schedulers send, stops a command as
    Ctrl-C does, and the command exits with 143 instead of 130.
    """
    if "--version" in sys.argv[1:]:  # Hydra's own would name Hydra's version alone
        from transformer.version import __version__

        print(f"{Path(sys.argv[0]).name} {__version__} (Hydra {hydra.__version__})")
        sys.exit(0)
    schemas.register_configs()
    with said_by_rank_0():  # the command line and the config files: the same on every rank
        before_hydra.refuse_unknown_flags(sys.argv[1:], schema)
        before_hydra.refuse_malformed_overrides(sys.argv[1:])
        before_hydra.refuse_malformed_yaml(sys.argv[1:], Path(CONFIG_PATH))
        if schema is not None:
            config_files.refuse_bad_config_files(sys.argv[1:], schema, Path(CONFIG_PATH))
            before_hydra.refuse_mistyped_keys(schema, sys.argv[1:], Path(CONFIG_PATH) / f"{command}.yaml")
            before_hydra.refuse_unknown_options(sys.argv[1:], Path(CONFIG_PATH) / f"{command}.yaml")
            before_hydra.refuse_resolving_the_run_folder(sys.argv[1:], Path(CONFIG_PATH) / f"{command}.yaml")
    if command in run_folder.RUN_FOLDER_COMMANDS:
        sys.argv = run_folder.with_overrides(sys.argv, run_folder.output_dir_as_run_dir(sys.argv[1:]))
    run_folder.refuse_unwritable_run_folders(sys.argv[1:])
    run_folder.make_the_run_folder(sys.argv[1:])
    run_folder.name_a_full_disk_under_hydras_snapshot()
    _stop_on_signals()
    _log_own_warnings()
    if schema is not None:
        sweeps.refuse_a_bad_job(sys.argv[1:], Path(CONFIG_PATH), command, schema, check)


def _stop_on_signals() -> None:
    """Ctrl-C, and SIGTERM (a stop by ``kill`` or a scheduler) alike, raise ``Interrupted`` where the command is, also
    in a command a script started in the background (which inherits SIGINT ignored)."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, raise_interrupted)


def _log_own_warnings() -> None:
    """Show this package's warnings (an input line cut to the model's length) as log lines, on the console and in
    the run's log, instead of as Python's file, line and source; other packages' warnings as Python shows them."""
    show = warnings.showwarning
    if getattr(show, "logs_own_warnings", False):  # installed already
        return

    def showwarning(message: Warning | str, category: type[Warning], filename: str, lineno: int, file: Any = None,
                    line: str | None = None) -> None:
        if category.__module__.split(".")[0] == "transformer":
            logging.getLogger(category.__module__).warning("%s", message)
        else:
            show(message, category, filename, lineno, file, line)

    showwarning.logs_own_warnings = True  # type: ignore[attr-defined]
    warnings.showwarning = showwarning


def _checked_source(cfg: DictConfig) -> Any:
    """What evaluate, translate and serve check before loading a model: the typed config of one kind of source."""
    return _one_kind_of_source(_typed(_export_search(cfg)))


def _checked_training(cfg: DictConfig) -> Any:
    """What a sweep's training job checks before it starts: its typed config, and its corpus's split names (the
    first job would train for an hour before the next found its split missing)."""
    from transformer.data.splits import refuse_unknown_split

    typed = _typed(with_recipe(cfg)[0])
    for split in (typed.data.train_split, typed.data.valid_split, typed.data.test_split):
        refuse_unknown_split(typed.data, split)
    return typed


@named_by_the_command
def train_main() -> None:
    _setup(schemas.TrainConfig, "train", _checked_training)
    with said_by_rank_0():
        run_folder.refuse_a_taken_run_dir("train", sys.argv[1:])
    sys.argv = run_folder.the_resumed_recipe_shown(sys.argv)
    sys.argv = run_folder.with_overrides(sys.argv, run_folder.resume_in_its_run_dir(sys.argv[1:]))
    sys.argv = run_folder.with_overrides(sys.argv, run_folder.as_a_rank_above_0(sys.argv[1:]))
    run_folder.refuse_a_held_run_dir(sys.argv[1:])
    _train()


@named_by_the_command
def evaluate_main() -> None:
    _setup(schemas.EvaluateConfig, "evaluate", _checked_source)
    run_folder.refuse_a_taken_run_dir("evaluate", sys.argv[1:])
    _evaluate()


@named_by_the_command
def translate_main() -> None:
    _setup(schemas.TranslateConfig, "translate", _checked_source)
    _translate()


@named_by_the_command
def serve_main() -> None:
    _setup(schemas.ServeConfig, "serve", _checked_source)
    _serve()


@named_by_the_command
def diversify_main() -> None:
    _setup(schemas.DiversifyConfig, "diversify")
    _diversify()


@named_by_the_command
def prepare_data_main() -> None:
    _setup(schemas.PrepareDataConfig, "prepare_data")
    _prepare_data()


@named_by_the_command
def export_main() -> None:
    _setup(schemas.ExportConfig, "export")
    _export()


@named_by_the_command
def benchmark_main() -> None:
    _setup(schemas.BenchmarkConfig, "benchmark")
    _benchmark()


def average_main() -> None:
    """``transformer-average OUT.pt IN1.pt IN2.pt ...``: average model weights of checkpoints."""
    from transformer.app import use

    usage = "usage: transformer-average OUT.pt IN1.pt IN2.pt [...]: average the model weights of checkpoints"
    if {"-h", "--help"} & set(sys.argv[1:]):
        print(f"{usage}\nGuide: transformer-guide average (docs/guide/average.md)")
        return
    if len(sys.argv) == 3:
        sys.exit(f"transformer-average: one checkpoint ({sys.argv[2]}); averaging takes two or more\n{usage}")
    if len(sys.argv) < 4:
        sys.exit(usage)
    _stop_on_signals()
    try:
        use.average(sys.argv[2:], sys.argv[1])
    except KeyboardInterrupt as interrupt:
        print(f"transformer-average: interrupted; {sys.argv[1]} was not written", file=sys.stderr)
        sys.exit(exit_status(interrupt))
    except user_errors() as error:
        sys.exit(f"transformer-average: {error}")
    except OSError as error:
        if error.errno not in PATH_ERRORS or not error.filename:
            raise
        sys.exit(f"transformer-average: {path_error_line(error)}")


@named_by_the_command
def recipe_main() -> None:
    """``transformer-recipe ensemble|diversified|best_gpu OUT_DIR [OVERRIDES...] [options]``: several trainings and
    what is made of them (:mod:`transformer.app.recipes`)."""
    from transformer.app import recipes
    from transformer.app.mps import mps
    from transformer.app.pipeline import LOG_FORMAT
    from transformer.app.runs import RunFailed

    parser = recipes.command_line()
    args = parser.parse_intermixed_args()
    if args.out_dir is None:  # optional to argparse, which would otherwise call the overrides required too
        parser.error("give a recipe and its folder, e.g. transformer-recipe ensemble outputs/ensemble")
    if args.parallel is not None and args.parallel < 1:
        parser.error(f"--parallel: runs at once must be >= 1, got {args.parallel}")
    run_folder.refuse_an_unwritable_folder("OUT_DIR", Path(args.out_dir))
    before_hydra.refuse_malformed_overrides(list(args.overrides))
    before_hydra.refuse_mistyped_keys(schemas.TrainConfig, list(args.overrides), Path(CONFIG_PATH) / "train.yaml")
    before_hydra.refuse_unknown_options(list(args.overrides), Path(CONFIG_PATH) / "train.yaml")
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
    # Ctrl-C, and SIGTERM alike, end the recipe as KeyboardInterrupt wherever it is (MPS is stopped on the way out);
    # while runs train, the recipe passes them on instead (transformer.app.runs). Also when started in a script's
    # background, which ignores SIGINT.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, raise_interrupted)
    parallel = args.parallel or (3 if args.recipe == "best_gpu" else 1)
    options = recipes.Options(Path(args.out_dir), list(args.overrides), parallel=parallel, train_only=args.train_only)
    plan = recipes.Diversified(args.seeds, args.backward_seeds, args.student_seeds, args.wide_student_seeds,
                               args.student_epochs, not args.no_score_teachers)
    try:
        if args.recipe == "best_gpu":
            recipes.best_gpu(options, plan, use_mps=args.mps is not False)
            return
        with mps(enabled=bool(args.mps)):
            if args.recipe == "ensemble":
                recipes.ensemble(options, args.seeds, args.more_members, args.valid_split)
            else:
                recipes.diversified(options, plan)
    except KeyboardInterrupt as interrupted:  # RecipeInterrupted, or an interrupt outside the runs' training
        said = str(interrupted) or "interrupted: run the recipe again, with the same overrides, to resume"
        logging.getLogger("transformer-recipe").error("%s", said)  # the line names the command
        sys.exit(exit_status(interrupted))
    except (RunFailed, *user_errors()) as error:
        logging.getLogger("transformer-recipe").error("%s", error)
        sys.exit(1)


def guide_main() -> None:
    """``transformer-guide [PAGE]``: print a page of the user guide (no PAGE: the list of pages)."""
    from transformer.app import guide

    if len(sys.argv) > 2:
        sys.exit("usage: transformer-guide [PAGE]: one page at a time (no PAGE: the list of pages)")
    if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help"):
        print(guide.contents())
        return
    try:
        print(guide.page_text(sys.argv[1]), end="")
    except LookupError as error:
        sys.exit(f"transformer-guide: {error.args[0]}")
