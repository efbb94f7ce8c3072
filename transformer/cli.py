"""Console entry points (``transformer-train`` & co.): compose the Hydra config, convert it once to typed
dataclasses, call one ``pipeline`` function, and turn expected failures into a one-line message.

The ``configs/`` folder next to the package is the config root (an editable install keeps it there).
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any, Callable

import hydra
from omegaconf import DictConfig, OmegaConf

from transformer.config import register_configs

log = logging.getLogger(__name__)

# An absolute path: Hydra would otherwise look for a Python package named ``configs``.
CONFIG_PATH = str(Path(__file__).resolve().parents[1] / "configs")


def _user_errors() -> tuple[type[BaseException], ...]:
    """Failures that deserve a clear message rather than a traceback."""
    from transformer.checkpoint import CheckpointError
    from transformer.config import ConfigError
    from transformer.data import DataError
    from transformer.glove import GloveError
    from transformer.tokenizer import TokenizerError
    from transformer.trainer import TrainingDiverged

    return (ConfigError, DataError, GloveError, CheckpointError, TokenizerError, TrainingDiverged, FileNotFoundError)


def _run(command: Callable[[Any], Any], cfg: DictConfig) -> Any:
    try:
        typed = OmegaConf.to_object(cfg)  # runs every __post_init__ range check
        return command(typed)
    except _user_errors() as error:
        log.error("%s", error)  # to the console and, for runs with a directory, to its log file
        sys.exit(1)


def merge_overrides(earlier: list[str], now: list[str]) -> list[str]:
    """Command-line overrides ``earlier`` (minus Hydra's own and ``resume``), then ``now``; where both set the
    same key or group, ``now``'s value alone."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    given = {o.key_or_group for o in parser.parse_overrides(now)}
    kept = [o.input_line for o in parser.parse_overrides(earlier)
            if o.key_or_group not in given and o.key_or_group != "resume" and not o.key_or_group.startswith("hydra")]
    return kept + list(now)


def _resumed_config(cfg: DictConfig) -> DictConfig:
    """With ``resume=RUN``: the config RUN was started with (its command-line overrides, which Hydra saved in
    ``RUN/.hydra/overrides.yaml``) with this command's overrides on top, so a recipe need not be typed again to
    continue it. A run started otherwise (no such file) resumes with this command's config as it is."""
    if cfg.get("resume") is None:
        return cfg
    from hydra.core.hydra_config import HydraConfig

    target = Path(cfg.resume)
    saved = (target if target.is_dir() else target.parent.parent) / ".hydra" / "overrides.yaml"
    if not saved.is_file():
        return cfg
    earlier = [str(o) for o in OmegaConf.load(saved)]
    overrides = merge_overrides(earlier, list(HydraConfig.get().overrides.task))
    log.info("resuming with the run's own overrides, this command's on top: %s", " ".join(overrides))
    return hydra.compose(config_name="train", overrides=overrides)


@hydra.main(config_path=CONFIG_PATH, config_name="train", version_base="1.3")
def _train(cfg: DictConfig) -> float | None:
    from transformer import pipeline

    metrics = _run(pipeline.train, _resumed_config(cfg))
    return metrics.get("valid_bleu") if metrics else None  # the value a Hydra sweeper would optimise


@hydra.main(config_path=CONFIG_PATH, config_name="evaluate", version_base="1.3")
def _evaluate(cfg: DictConfig) -> None:
    from transformer import pipeline

    _run(pipeline.evaluate, cfg)


@hydra.main(config_path=CONFIG_PATH, config_name="translate", version_base="1.3")
def _translate(cfg: DictConfig) -> None:
    from transformer import pipeline

    _run(pipeline.translate, cfg)


@hydra.main(config_path=CONFIG_PATH, config_name="prepare_data", version_base="1.3")
def _prepare_data(cfg: DictConfig) -> None:
    from transformer import pipeline

    _run(pipeline.prepare_data, cfg)


@hydra.main(config_path=CONFIG_PATH, config_name="benchmark", version_base="1.3")
def _benchmark(cfg: DictConfig) -> None:
    from transformer import benchmark

    _run(benchmark.run, cfg)


def train_main() -> None:
    register_configs()
    _train()


def evaluate_main() -> None:
    register_configs()
    _evaluate()


def translate_main() -> None:
    register_configs()
    _translate()


def prepare_data_main() -> None:
    register_configs()
    _prepare_data()


def benchmark_main() -> None:
    register_configs()
    _benchmark()


def average_main() -> None:
    """``transformer-average OUT.pt IN1.pt IN2.pt ...``: average model weights of checkpoints."""
    from transformer import pipeline

    if len(sys.argv) < 4:
        sys.exit("usage: transformer-average OUT.pt IN1.pt IN2.pt [...]")
    pipeline.average(sys.argv[2:], sys.argv[1])
