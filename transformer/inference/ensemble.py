"""Several trained models decoding as one: an ensemble averages their next-token probabilities.

``Ensemble`` implements the searches' decoder protocol (``search.Decoder``), so greedy and beam search,
the KV cache and ``inference.translation.translate`` run on it unchanged. At each step every model scores the next
token given the same prefix, and the ensemble's log-probability is that of the models' mean probability:

    log p(y | x, y<t) = logsumexp_m log p_m(y | x, y<t) - log M

(a linear mixture, as fairseq's ensembles use; averaging log-probabilities instead is a product of experts,
which rewards only the tokens every model finds likely). The models must share the source and target
vocabularies; their sizes and layers may differ. ``inference.loading.load_ensemble`` loads one from checkpoints.

Unlike averaging checkpoints (``transformer-average``), which gives one model of the same cost, an ensemble
costs the sum of its models at every step and works for models of different runs, seeds and shapes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from transformer.model.transformer import DecoderCache, EncoderOutput, Transformer, select_encoder_output


@dataclass
class EnsembleEncoderOutput:
    """Each model's encoder output for the same source batch."""

    parts: list[EncoderOutput]

    @property
    def src_mask(self) -> Tensor:
        """(batch, 1, 1, src_len) bool, True = real token: the same for every model (same source ids)."""
        return self.parts[0].src_mask


def select_ensemble_encoder(enc: EnsembleEncoderOutput, indices: Tensor) -> EnsembleEncoderOutput:
    """Rows ``indices`` of every model's encoder output (the searches' ``select_encoder``)."""
    return EnsembleEncoderOutput([select_encoder_output(part, indices) for part in enc.parts])


@dataclass
class EnsembleCache:
    """Each model's decoder cache; the searches reorder and shrink them together."""

    parts: list[DecoderCache]

    def select(self, indices: Tensor, keep_static: bool = False) -> EnsembleCache:
        return EnsembleCache([part.select(indices, keep_static=keep_static) for part in self.parts])


@dataclass
class EnsembleOutput:
    """What :meth:`Ensemble.decode` returns: the mixture's log-probabilities stand in for logits."""

    logits: Tensor  # (batch, tgt_len, tgt_vocab) float32 log-probabilities of the mean probability
    cache: EnsembleCache | None


class Ensemble(nn.Module):
    """Models that decode together (see the module docstring). Inference only."""

    def __init__(self, models: Sequence[Transformer]) -> None:
        super().__init__()
        if len(models) < 2:
            raise ValueError(f"an ensemble needs at least 2 models, got {len(models)}")
        vocab = {model.output_layer()[0].size(0) for model in models}
        if len(vocab) != 1:
            raise ValueError(f"ensemble members must share the target vocabulary; their sizes are {sorted(vocab)}")
        self.members = nn.ModuleList(models)

    @property
    def max_positions(self) -> int:
        """The longest sequence every member accepts."""
        return min(model.max_positions for model in self.members)

    def encode(self, src: Tensor) -> EnsembleEncoderOutput:
        """src: (batch, src_len) ids -> every member's encoder output."""
        return EnsembleEncoderOutput([model.encode(src) for model in self.members])

    def init_cache(self, encoder_out: EnsembleEncoderOutput) -> EnsembleCache:
        return EnsembleCache([model.init_cache(part) for model, part in zip(self.members, encoder_out.parts)])

    def decode(self, tgt_in: Tensor, encoder_out: EnsembleEncoderOutput,
               cache: EnsembleCache | None = None) -> EnsembleOutput:
        """Every member's decoder pass over ``tgt_in`` (batch, tgt_len), mixed in probability space."""
        caches = cache.parts if cache is not None else [None] * len(self.members)
        outputs = [model.decode(tgt_in, part, part_cache)
                   for model, part, part_cache in zip(self.members, encoder_out.parts, caches)]
        log_probs = torch.stack([F.log_softmax(out.logits.float(), dim=-1) for out in outputs])  # (M, batch, len, V)
        mixed = torch.logsumexp(log_probs, dim=0) - math.log(len(outputs))  # (batch, tgt_len, tgt_vocab)
        new_cache = EnsembleCache([out.cache for out in outputs]) if cache is not None else None
        return EnsembleOutput(mixed, new_cache)
