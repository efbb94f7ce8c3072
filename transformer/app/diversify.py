"""Data diversification (Nguyen et al., 2020): a training split extended with translations of itself.

Models trained on a corpus translate its training split: *forward* models (the corpus's direction) translate the
source side, which gives sequence-level distillation pairs (Kim & Rush, 2016); *backward* models (the other
direction) translate the target side, which gives back-translation pairs (Sennrich et al., 2016). The new split
holds the original pairs, then (source, forward translation), then (backward translation, target): every pair keeps
at least one human side. A model trained on it (``data.train_dir``) learns from targets that are easier to fit
and from more varied sources, and is validated and tested on the corpus's own splits as before.

``transformer-diversify`` calls :func:`run`, which translates with the given models, then builds and writes the
split. It holds the split and its translations in memory: a corpus of Multi30k's size, not WMT's.
"""

from __future__ import annotations

import gzip
import logging
from dataclasses import replace
from pathlib import Path
from typing import Any, Iterable

import torch

from transformer import files
from transformer.app.schemas import DiversifyConfig
from transformer.app.translate_io import check_output_folder
from transformer.checkpoint import CheckpointError
from transformer.config import ConfigError, to_plain_dict
from transformer.data.corpus import DataError
from transformer.data.splits import corpus_paths, load_split, with_local_copy
from transformer.inference.loading import TrainedModel, load_model
from transformer.inference.sampling import generator
from transformer.inference.translation import translate
from transformer.runtime import choose_device

log = logging.getLogger(__name__)


def run(cfg: DiversifyConfig) -> dict[str, Any]:
    """Translate the forward models' training split both ways and write it, extended, to ``cfg.out_dir``;
    returns what ``out_dir/diversify.json`` records."""
    check_output_folder("out_dir", cfg.out_dir)  # before any model loads or sentence is translated
    device = choose_device(cfg.device)
    forward = _load("forward", cfg.forward, device)
    data = replace(with_local_copy(forward.config.data), train_dir=None)  # the corpus's own training split
    check_free(cfg.out_dir, data.train_split, data.src, data.tgt)
    backward = _load("backward", cfg.backward, device) if cfg.backward else None
    if backward is not None and (backward.config.data.src, backward.config.data.tgt) != (data.tgt, data.src):
        raise ConfigError(f"backward: {backward.path} translates {backward.config.data.src}->"
                          f"{backward.config.data.tgt}; the forward models' corpus needs {data.tgt}->{data.src}")
    src, tgt = load_split(data, data.train_split)
    random = generator(cfg.eval, device)  # sampling: both directions draw from one seed, one after the other

    def translated(trained: TrainedModel, lines: list[str], what: str) -> list[str]:
        log.info("translating the %d training %s with %s", len(lines), what,
                 " + ".join(map(str, (trained.path, *trained.ensemble_paths))))
        nbest = translate(trained.model, lines, trained.src_tok, trained.tgt_tok, cfg.eval, device,
                          trained.model.max_positions, progress=True, random=random)
        return [candidates[0] for candidates in nbest]

    forward_tgt = translated(forward, src, f"sources ({data.src})")
    backward_src = translated(backward, tgt, f"targets ({data.tgt})") if backward is not None else None
    new_src, new_tgt = diversified_pairs(src, tgt, forward_tgt, backward_src)
    written = write_split(cfg.out_dir, data.train_split, data.src, data.tgt, new_src, new_tgt)

    def absolute(paths: Iterable[str | Path]) -> list[str]:  # the record is read from other folders (recipes)
        return [str(Path(path).absolute()) for path in paths]

    record = {
        "corpus": absolute(corpus_paths(data, data.train_split)), "pairs": len(src),
        "written": absolute(written), "written_pairs": len(new_src),
        "forward": absolute((forward.path, *forward.ensemble_paths)),
        "backward": [] if backward is None else absolute((backward.path, *backward.ensemble_paths)),
        "eval": to_plain_dict(cfg.eval),
    }
    record_path = Path(cfg.out_dir) / "diversify.json"  # written last and whole: recipes take it as "done"
    files.write_json(record_path, record)
    log.info("wrote %d pairs (%d original) to %s; train on them with data.train_dir=%s", len(new_src), len(src),
             " and ".join(map(str, written)), cfg.out_dir)
    return record


def _load(key: str, models: list[str], device: torch.device) -> TrainedModel:
    """The model, or ensemble, that ``models`` (run directories or checkpoint files) name; errors name ``key``."""
    for i, model in enumerate(models):
        if not Path(model).exists():
            raise ConfigError(f"{key}[{i}]: {model} does not exist (give run directories or checkpoint files)")
    first, others = Path(models[0]), models[1:]
    try:
        if first.is_file():
            return load_model(None, first, others, device, retry_key=None)
        return load_model(first, None, others, device, retry_key=None)
    except (ConfigError, CheckpointError, FileNotFoundError) as error:  # no checkpoint; tokenizers that differ
        raise ConfigError(f"{key}: {error}") from None


def diversified_pairs(src: list[str], tgt: list[str], forward: list[str],
                      backward: list[str] | None) -> tuple[list[str], list[str]]:
    """The original pairs, then (source, forward translation), then (backward translation, target) when given.

    Args:
        src, tgt: the training split's aligned sides.
        forward: one translation of each ``src`` line into the target language.
        backward: one translation of each ``tgt`` line into the source language, or None.
    """
    if not (len(src) == len(tgt) == len(forward)) or (backward is not None and len(backward) != len(tgt)):
        raise ValueError(f"sides differ in length: {len(src)} sources, {len(tgt)} targets, {len(forward)} forward "
                         f"and {None if backward is None else len(backward)} backward translations")
    new_src, new_tgt = src + src, tgt + forward
    if backward is not None:
        new_src, new_tgt = new_src + backward, new_tgt + tgt
    return new_src, new_tgt


def split_files(folder: str | Path, split: str, src_lang: str, tgt_lang: str) -> tuple[Path, Path]:
    """Where :func:`write_split` puts a split: ``{split}.{lang}.gz``, the layout ``data.train_dir`` reads."""
    return Path(folder) / f"{split}.{src_lang}.gz", Path(folder) / f"{split}.{tgt_lang}.gz"


def check_free(folder: str | Path, split: str, src_lang: str, tgt_lang: str) -> None:
    """Refuse a folder that already holds the split (or the same names uncompressed): nothing is overwritten."""
    for path in split_files(folder, split, src_lang, tgt_lang):
        for existing in (path, path.with_suffix("")):
            if existing.exists() and not (Path(folder) / "diversify.json").is_file():  # written last: not done
                raise DataError(f"out_dir: {existing} exists but {folder} has no diversify.json, as a "
                                "transformer-diversify stopped midway leaves it; remove the folder or choose another")
            if existing.exists():
                raise DataError(f"out_dir: {existing} exists; choose a new folder or remove the old split first")


def write_split(folder: str | Path, split: str, src_lang: str, tgt_lang: str, src: list[str],
                tgt: list[str]) -> tuple[Path, Path]:
    """Write the aligned sides as gzip-compressed ``{split}.{lang}.gz`` files, each atomically (a temporary file
    renamed into place), so a crash leaves either a whole file or none. Returns the two paths."""
    Path(folder).mkdir(parents=True, exist_ok=True)
    paths = split_files(folder, split, src_lang, tgt_lang)
    for path, lines in zip(paths, (src, tgt)):
        with files.atomic_write(path) as raw:  # on disk before diversify.json, written last, says the split is done
            with gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as out:
                out.write("".join(line + "\n" for line in lines).encode("utf-8"))
    return paths
