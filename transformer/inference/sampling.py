"""Random sampling: each token drawn from the model's distribution instead of taken as its arg-max.

What back-translation wants (Edunov et al., 2018: sampled source sentences teach more than beam-searched ones), and
what ``eval.sampling_topk`` asks for. The draw runs inside greedy search (:func:`~transformer.inference.search.
greedy_hypotheses`, one row per sample), so everything else is the search's: the length limit, EOS, the cache, and
the score, which is the model's own log-probability of the sampled tokens (before the temperature and the filters),
normalized as ``eval.length_norm`` says.

Per step the log-probabilities are divided by the temperature, cut to the ``topk`` likeliest tokens (0: no cut; a
tie with the k-th is kept), then to the smallest set of the likeliest whose probabilities sum to at least ``topp``
(the nucleus, Holtzman et al., 2020), renormalised, and one token is drawn. The settings are CTranslate2's
(``sampling_topk``, ``sampling_topp``, ``sampling_temperature``), so an export samples alike, from CTranslate2's own
random numbers (which differ from call to call), except that a tie with the k-th token stays here and a ``topk``
above the vocabulary is no cut (CTranslate2 refuses it: the translator passes it the vocabulary size instead).

Here the draws come from a generator seeded with ``eval.sampling_seed`` (:func:`generator`): one per command or
:class:`~transformer.inference.translator.Translator`, whose calls continue its draws, so that the windows of a
long input, or a server's requests, are not drawn from the same random numbers. The same sentences, settings, seed
and batches give the same samples.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from transformer.config import EvalConfig


@dataclass
class Sampler:
    """Draws the next token of every row. ``topk``: 0 (every token) or k >= 2; ``topp`` in (0, 1]."""

    topk: int
    topp: float
    temperature: float
    generator: torch.Generator

    @classmethod
    def from_config(cls, cfg: EvalConfig, device: torch.device | str,
                    random: torch.Generator | None = None) -> Sampler | None:
        """The sampler ``cfg`` asks for, drawing from ``random`` (default: a new :func:`generator`); None when
        ``cfg`` asks for a search."""
        if cfg.sampling_topk == 1:
            return None
        return cls(cfg.sampling_topk, cfg.sampling_topp, cfg.sampling_temperature, random or generator(cfg, device))

    def distribution(self, log_probs: Tensor) -> Tensor:
        """(rows, vocab) probabilities to draw from: ``log_probs`` (rows, vocab; -inf where a token may not come)
        tempered, cut to the top k and to the nucleus, renormalised."""
        logits = log_probs / self.temperature
        if 1 < self.topk < logits.size(-1):
            kth = logits.topk(self.topk, dim=-1).values[:, -1:]  # (rows, 1)
            logits = logits.masked_fill(logits < kth, -math.inf)
        if self.topp < 1.0:
            ordered, order = logits.sort(dim=-1, descending=True)  # (rows, vocab) each
            probs = ordered.softmax(dim=-1)
            before = probs.cumsum(dim=-1) - probs  # the mass of the likelier tokens: the first always stays
            ordered = ordered.masked_fill(before >= self.topp, -math.inf)
            logits = torch.full_like(logits, -math.inf).scatter(-1, order, ordered)
        return logits.softmax(dim=-1)

    def draw(self, log_probs: Tensor) -> Tensor:
        """(rows, 1) tokens drawn from :meth:`distribution`."""
        return torch.multinomial(self.distribution(log_probs), 1, generator=self.generator)


def generator(cfg: EvalConfig, device: torch.device | str) -> torch.Generator | None:
    """A random-number generator on ``device`` seeded with ``eval.sampling_seed``, when ``cfg`` samples: what the
    calls of one command or translator share."""
    if cfg.sampling_topk == 1:
        return None
    return torch.Generator(device=device).manual_seed(cfg.sampling_seed)
