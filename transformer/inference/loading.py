"""A trained model from its files: find a run's checkpoint, rebuild the model and tokenizers from it (no YAML
needed), or an ensemble of several that share their vocabularies."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from transformer import checkpoint as ckpt
from transformer.config import ConfigError, TrainConfig, from_plain_dict
from transformer.data.tokenizer import Tokenizer, tokenizer_digest, tokenizer_from_state
from transformer.inference.ensemble import Ensemble
from transformer.model.transformer import Transformer, build_model

log = logging.getLogger(__name__)


@dataclass
class TrainedModel:
    """A model ready for inference, with the tokenizers and training config it came with (an ensemble's: those
    of its first member, which the others share)."""

    model: Transformer | Ensemble
    src_tok: Tokenizer
    tgt_tok: Tokenizer
    config: TrainConfig
    path: Path
    ensemble_paths: tuple[Path, ...] = ()  # an ensemble's other members


def find_checkpoint(run_dir: str | Path) -> Path:
    """The checkpoint of a training run to evaluate: final, else best, else last."""
    if Path(run_dir).is_file():
        raise ckpt.CheckpointError(f"run_dir: {run_dir} is a file; give a checkpoint file as checkpoint={run_dir}, "
                                   "or its run's folder as run_dir")
    if not Path(run_dir).is_dir():
        raise FileNotFoundError(f"run_dir: {run_dir} does not exist; give a training run's folder "
                                "(outputs/train/<run>)")
    run = ckpt.RunDir(Path(run_dir))
    candidates = (run.final, run.best, run.last)
    for path in candidates:
        if path.is_file():
            return path
    raise FileNotFoundError(f"no checkpoint in {run.checkpoints} (looked for {', '.join(p.name for p in candidates)})")


def load_trained(path: str | Path, device: torch.device, retry_key: str | None = "checkpoint") -> TrainedModel:
    """Rebuild model and tokenizers from one checkpoint file; no YAML needed. A damaged file's error suggests the
    run's earlier checkpoint as ``retry_key=...``."""
    state = ckpt.load_checkpoint(path, map_location="cpu", retry_key=retry_key)
    config = from_plain_dict(TrainConfig, state["config"])
    src_tok = tokenizer_from_state(state["tokenizers"]["src"])
    tgt_tok = tokenizer_from_state(state["tokenizers"]["tgt"])
    model = build_model(config.model, src_tok.vocab_size, tgt_tok.vocab_size, src_tok.pad_id)
    model.load_state_dict(state["model"])
    model.to(device).eval()
    return TrainedModel(model, src_tok, tgt_tok, config, Path(path))


def check_same_vocabularies(members: Sequence[TrainedModel], what: str, key: str | None = None) -> None:
    """Raise ``ConfigError`` naming the first of ``members`` not trained with the first one's language pair and
    tokenizers (``what`` the members are and the config ``key`` that gave them, for the message)."""
    def identity(member: TrainedModel) -> tuple[str, str, str, str]:
        data = member.config.data
        return data.src, data.tgt, tokenizer_digest(member.src_tok), tokenizer_digest(member.tgt_tok)

    def described(member: TrainedModel) -> str:
        data = member.config.data
        return (f"{member.path} ({data.src}->{data.tgt}, vocabularies of {member.src_tok.vocab_size} and "
                f"{member.tgt_tok.vocab_size})")

    first = members[0]
    for other in members[1:]:
        if identity(other) != identity(first):
            where = "" if key is None else f"{key}: "
            differs = "language pair" if identity(other)[:2] != identity(first)[:2] else "tokenizers"
            raise ConfigError(
                f"{where}{described(other)} differs from {described(first)} in its {differs}; {what} must share the "
                "language pair and tokenizers (train them with the same data settings)")


def load_ensemble(paths: Sequence[str | Path], device: torch.device,
                  retry_key: str | None = "checkpoint") -> TrainedModel:
    """The models of several checkpoint files as one :class:`~transformer.inference.ensemble.Ensemble`; they must share the
    first one's language pair and tokenizers (raises ``ConfigError`` naming the one that does not)."""
    members = [load_trained(path, device, retry_key=retry_key if i == 0 else None) for i, path in enumerate(paths)]
    check_same_vocabularies(members, "an ensemble's models", key="ensemble")
    first = members[0]
    return TrainedModel(Ensemble([member.model for member in members]).eval(), first.src_tok, first.tgt_tok,
                        first.config, first.path, tuple(member.path for member in members[1:]))


def load_model(run_dir: str | Path | None, checkpoint: str | Path | None, ensemble: Sequence[str | Path],
               device: torch.device, retry_key: str | None = "checkpoint") -> TrainedModel:
    """The model a run directory or checkpoint file names (give one); with ``ensemble`` (more run directories or
    checkpoint files), the ensemble of it and those. A damaged first checkpoint's error suggests the run's earlier
    one as ``retry_key=...`` (None: names it only)."""
    path = Path(checkpoint) if checkpoint is not None else find_checkpoint(run_dir)
    if not ensemble:
        return load_trained(path, device, retry_key)
    others = []
    for i, entry in enumerate(ensemble):
        other = Path(entry)
        if not other.exists():
            raise ConfigError(f"ensemble[{i}]: {other} does not exist (give run directories or checkpoint files)")
        other = find_checkpoint(other) if other.is_dir() else other
        twice = [earlier for earlier in [path, *others] if earlier.resolve() == other.resolve()]
        if twice:  # allowed (a model mixed with itself is that model), but rarely what was meant
            log.warning("ensemble[%d]: %s is %s again: it counts twice in the ensemble's mean of probabilities",
                        i, other, twice[0])
        others.append(other)
    log.info("decoding with an ensemble of %d models: %s", 1 + len(others), ", ".join(map(str, [path, *others])))
    return load_ensemble([path, *others], device, retry_key)
