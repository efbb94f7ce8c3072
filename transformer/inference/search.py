"""Batched greedy and beam search on the incremental decoder (``inference.translation`` runs them on text).

The searches only need a small *decoder protocol* (``Decoder`` below): ``encode(src) -> enc`` (with
``enc.src_mask``), ``init_cache(enc) -> cache``, ``decode(tokens, enc, cache=None) -> out`` (with
``out.logits`` and ``out.cache``), ``cache.select(indices, keep_static=False)`` (``keep_static``: the
indices only reorder rows within each sentence's beam, so per-source entries need not move) and a
``select_encoder(enc, indices)``
function (``transformer.model.transformer.select_encoder_output`` by default). With ``use_cache=True`` each step feeds
only the newest token and the returned cache; with ``use_cache=False`` each step recomputes the whole
prefix (same output, slower; a test checks they agree).

Rows whose sentence is finished are dropped from the batch at once (``cache.select`` and
``select_encoder`` with the remaining rows), so later steps compute only on live sentences.

Conventions shared by both searches:
- scores are sums of float32 ``log_softmax`` log-probabilities over the tokens that may be generated (PAD and
  BOS never are: their logits are -inf before the softmax, as in CTranslate2);
- a sentence of ``src_len`` real tokens gets at most ``max_len = max(1, floor(a * src_len + b))``
  tokens (EOS not counted; ``max_tgt_len`` caps it, e.g. at the model's position limit); a hypothesis
  that reaches it without EOS is finalized as it is;
- the length used for normalization counts the EOS when there is one:
  ``score = log_prob / lp(len)`` with ``lp = ((5 + len) / 6) ** alpha`` (GNMT, Wu et al. 2016),
  ``lp = len`` (average) or ``lp = 1`` (none).

Beam search (per step): *expand* every alive hypothesis by every token, keep the 2·beam best
continuations by raw log-prob; *select*: those ending in EOS among the best ``beam`` become finished
hypotheses, the best ``beam`` others stay alive. A sentence is done when ``n_best`` finished ones cannot be
beaten: the n_best-th finished score is >= ``max alive log_prob / lp(max_len)``, an upper bound on the
normalized score of any continuation (log-probs only fall, lp only grows). With a length normalization that
bound is loose, so a sentence is also done when it has ``beam`` finished hypotheses (fairseq's and
CTranslate2's rule); with none it is exact, and the search stops only on it.
*finalize*: at ``max_len`` the alive hypotheses join the finished ones; the ``n_best`` best are returned.
With ``beam_size=1`` this is exactly greedy search.

Shape names: batch (sentences), beam, rows (live sentences x beam), step, vocab.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Protocol, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from transformer.config import LengthNorm
from transformer.inference.sampling import Sampler
from transformer.model.transformer import select_encoder_output

SelectEncoder = Callable[[Any, Tensor], Any]


class Decoder(Protocol):
    """What the searches need from a model (``transformer.model.transformer.Transformer`` is one, ``transformer.inference.ensemble.Ensemble``
    another, with ``select_ensemble_encoder``)."""

    def encode(self, src: Tensor) -> Any: ...  # -> object with .src_mask (batch, 1, 1, src_len)

    def init_cache(self, encoder_out: Any) -> Any: ...  # -> object with .select(indices)

    def decode(self, tgt_in: Tensor, encoder_out: Any, cache: Any = None) -> Any: ...  # .logits, .cache


@dataclass
class Hypothesis:
    """One finished translation of a sentence."""

    tokens: list[int]  # generated ids, without BOS and EOS
    score: float  # length-normalized log-probability (what n-best lists are sorted by)
    log_prob: float  # summed log-probability of the tokens (and of EOS when the hypothesis ended with it)


# --------------------------------------------------------------------------------------------------
# Pure helpers
# --------------------------------------------------------------------------------------------------


def length_penalty(length: int, alpha: float, norm: LengthNorm) -> float:
    """The divisor of a hypothesis's log-probability: GNMT ``((5+len)/6)**alpha``, ``len`` or 1."""
    if norm is LengthNorm.gnmt:
        return ((5.0 + length) / 6.0) ** alpha
    if norm is LengthNorm.average:
        return float(length)
    return 1.0


def max_lengths(src: Tensor, pad_id: int, max_len_a: float, max_len_b: float,
                max_tgt_len: int | None = None) -> list[int]:
    """Per-sentence token limit ``max(1, floor(a * src_len + b))`` (capped at ``max_tgt_len``).

    Args:
        src: (batch, src_len) ids padded with ``pad_id``; src_len counts real tokens only.
    """
    real = (src != pad_id).sum(dim=1).tolist()  # (batch,)
    return [max_length(n, max_len_a, max_len_b, max_tgt_len) for n in real]


def max_length(src_len: int, max_len_a: float, max_len_b: float, max_tgt_len: int | None = None) -> int:
    """The token limit of one hypothesis of a source of ``src_len`` tokens (see :func:`max_lengths`)."""
    limit = max(1, math.floor(max_len_a * src_len + max_len_b))
    return limit if max_tgt_len is None else min(limit, max_tgt_len)


def finalize_hypothesis(tokens: list[int], log_prob: float, ended: bool, alpha: float, norm: LengthNorm) -> Hypothesis:
    """A hypothesis from its tokens (EOS excluded) and raw log-prob; EOS counts in the length."""
    length = len(tokens) + (1 if ended else 0)
    return Hypothesis(tokens, log_prob / length_penalty(max(length, 1), alpha, norm), log_prob)


def _step_log_probs(model: Decoder, prefix: Tensor, enc: Any, cache: Any,
                    banned: Sequence[int]) -> tuple[Tensor, Any]:
    """Log-probabilities of the next token for every row.

    Args:
        prefix: (rows, step + 1) BOS and the tokens so far.
        cache: the decoder cache (only ``prefix[:, -1:]`` is fed), or None to recompute the whole prefix.

    Returns:
        (rows, vocab) float32 log-probs with the ``banned`` ids at -inf, and the extended cache.
    """
    if cache is None:
        out = model.decode(prefix, enc)
    else:
        out = model.decode(prefix[:, -1:], enc, cache)
    logits = out.logits[:, -1].float()  # (rows, vocab)
    for token in banned:  # a column at a time: indexing by a list would copy it to the device every step
        logits[:, token] = -math.inf
    return F.log_softmax(logits, dim=-1), out.cache


# --------------------------------------------------------------------------------------------------
# Greedy search
# --------------------------------------------------------------------------------------------------


def greedy_search(model: Decoder, src: Tensor, *, pad_id: int, bos_id: int, eos_id: int, max_len_a: float,
                  max_len_b: float, use_cache: bool = True, max_tgt_len: int | None = None,
                  select_encoder: SelectEncoder = select_encoder_output, drop_finished_at: float = 0.0
                  ) -> list[list[int]]:
    """Arg-max decoding of a batch: for each sentence the generated ids, without BOS and EOS (see
    :func:`greedy_hypotheses`, which also gives their scores)."""
    hyps = greedy_hypotheses(model, src, pad_id=pad_id, bos_id=bos_id, eos_id=eos_id, max_len_a=max_len_a,
                             max_len_b=max_len_b, use_cache=use_cache, max_tgt_len=max_tgt_len,
                             select_encoder=select_encoder, drop_finished_at=drop_finished_at)
    return [h.tokens for h in hyps]


@torch.inference_mode()
def greedy_hypotheses(model: Decoder, src: Tensor, *, pad_id: int, bos_id: int, eos_id: int, max_len_a: float,
                      max_len_b: float, use_cache: bool = True, max_tgt_len: int | None = None,
                      select_encoder: SelectEncoder = select_encoder_output, drop_finished_at: float = 0.0,
                      length_penalty: float = 0.0, length_norm: LengthNorm = LengthNorm.none,
                      sampler: Sampler | None = None) -> list[Hypothesis]:
    """Arg-max decoding of a batch (or, with a ``sampler``, random sampling); finished sentences leave the batch.

    Each step copies only the chosen tokens and their log-probs to the host (one wait for the device); the
    tokens so far are mirrored there, so finishing a sentence reads nothing more.

    Args:
        src: (batch, src_len) source ids padded with ``pad_id``.
        drop_finished_at: finished rows leave the batch once they are at least this fraction of it (0: at
            once). Until then they are computed and ignored. Dropping rows selects every cached tensor; on a
            GPU, where a step costs about the same for any number of rows, doing that at nearly every step
            costs more than carrying finished rows a little longer.
        length_penalty: the GNMT alpha of ``length_norm``.
        length_norm: how each hypothesis's ``score`` is normalized (as in beam search).
        sampler: draws each token (:mod:`~transformer.inference.sampling`) instead of taking the likeliest; the
            score is still the model's log-probability of the tokens.

    Returns:
        One hypothesis per sentence.
    """
    limits = max_lengths(src, pad_id, max_len_a, max_len_b, max_tgt_len)
    enc = model.encode(src)
    cache = model.init_cache(enc) if use_cache else None
    live: list[int | None] = list(range(src.size(0)))  # sentence index of each row; None: finished, still there
    prefix = torch.full((src.size(0), 1), bos_id, dtype=torch.long, device=src.device)  # (rows, 1)
    generated: list[list[int]] = [[] for _ in live]  # host copy of each row's tokens
    summed = [0.0 for _ in live]  # each row's log-prob so far
    results: list[Hypothesis | None] = [None for _ in live]
    n_finished = 0  # rows of finished sentences still in the batch
    while n_finished < len(live):
        log_probs, cache = _step_log_probs(model, prefix, enc, cache, (pad_id, bos_id))
        if sampler is None:
            best_log_prob, best = log_probs.max(dim=-1, keepdim=True)  # (rows, 1) each
        else:
            best = sampler.draw(log_probs)  # (rows, 1)
            best_log_prob = log_probs.gather(1, best)
        prefix = torch.cat([prefix, best], dim=1)  # (rows, step + 1)
        on_host = torch.cat([best.double(), best_log_prob.double()], dim=1).cpu().tolist()  # one transfer
        for row, (s, (token, log_prob)) in enumerate(zip(live, on_host)):
            if s is None:
                continue
            token, summed[row] = int(token), summed[row] + log_prob
            if token == eos_id or len(generated[row]) + 1 >= limits[s]:
                ended = token == eos_id
                tokens = generated[row] if ended else generated[row] + [token]
                results[s] = finalize_hypothesis(tokens, summed[row], ended, length_penalty, length_norm)
                live[row], n_finished = None, n_finished + 1
            else:
                generated[row].append(token)
        if 0 < n_finished < len(live) and n_finished >= drop_finished_at * len(live):
            keep = [row for row, s in enumerate(live) if s is not None]
            live, n_finished = [live[row] for row in keep], 0
            generated, summed = [generated[row] for row in keep], [summed[row] for row in keep]
            index = torch.tensor(keep, dtype=torch.long, device=src.device)
            prefix, enc = prefix.index_select(0, index), select_encoder(enc, index)
            cache = cache.select(index) if cache is not None else None
    return [h for h in results if h is not None]


# --------------------------------------------------------------------------------------------------
# Beam search: expand / select / finalize
# --------------------------------------------------------------------------------------------------


@dataclass
class Candidates:
    """The 2·beam best one-token continuations of each live sentence (by raw log-prob)."""

    log_prob: Tensor  # (sentences, k) cumulative log-prob, sorted descending
    parent: Tensor  # (sentences, k) beam slot the continuation extends
    token: Tensor  # (sentences, k) the appended token


def expand_beams(beam_log_prob: Tensor, step_log_probs: Tensor) -> Candidates:
    """Score every (hypothesis, token) pair and keep the best ``2 * beam`` per sentence.

    Args:
        beam_log_prob: (sentences, beam) cumulative log-probs, -inf for empty slots.
        step_log_probs: (sentences * beam, vocab) next-token log-probs.
    """
    n, beam = beam_log_prob.shape
    vocab = step_log_probs.size(-1)
    total = beam_log_prob.unsqueeze(-1) + step_log_probs.view(n, beam, vocab)  # (sentences, beam, vocab)
    k = min(2 * beam, beam * vocab)
    best, flat = total.view(n, beam * vocab).topk(k, dim=1)  # (sentences, k)
    return Candidates(best, torch.div(flat, vocab, rounding_mode="floor"), flat % vocab)


def select_beams(cand: Candidates, beam: int, eos_id: int) -> tuple[Tensor, Tensor]:
    """Split candidates into finished ones and the next alive beam.

    Returns:
        finishing: (sentences, k) bool, EOS candidates among the ``beam`` best (finite score);
        order: (sentences, beam) indices into the candidates of the ``beam`` best non-EOS ones
        (an EOS candidate fills a slot only when fewer remain; the caller gives it -inf).
    """
    rank = torch.arange(cand.token.size(1), device=cand.token.device).expand_as(cand.token)  # (sentences, k)
    is_eos = cand.token == eos_id
    finishing = is_eos & (rank < beam) & torch.isfinite(cand.log_prob)
    order = torch.argsort(rank + is_eos.long() * cand.token.size(1), dim=1)[:, :beam]  # (sentences, beam)
    return finishing, order


def _sentence_done(finished: list[Hypothesis], alive_best: float, beam: int, n_best: int, limit: int,
                   alpha: float, norm: LengthNorm) -> bool:
    """Beam full of finished hypotheses (with a length normalization), or the n_best best cannot be beaten by any
    continuation."""
    if len(finished) >= beam and norm is not LengthNorm.none:
        return True
    if len(finished) < n_best:
        return alive_best == -math.inf
    kth = sorted((h.score for h in finished), reverse=True)[n_best - 1]
    return kth >= alive_best / length_penalty(limit, alpha, norm)


@dataclass
class _Beams:
    """Per-batch search state; sentence ``i`` owns rows ``i*beam ... i*beam+beam-1``."""

    sentences: list[int]  # original index of each live sentence
    log_prob: Tensor  # (sentences, beam) cumulative log-probs, -inf for empty slots
    prefix: Tensor  # (rows, step + 1) BOS + tokens, on the device
    tokens: np.ndarray  # (rows, step) the same tokens without BOS, on the host


@dataclass
class _StepOnHost:
    """One step's search decisions, copied to the host in a single transfer."""

    cand_log_prob: np.ndarray  # (sentences, k)
    cand_parent: np.ndarray  # (sentences, k)
    finishing: np.ndarray  # (sentences, k) bool
    token: np.ndarray  # (sentences, beam) the new beam's last tokens
    parent: np.ndarray  # (sentences, beam) the beam slot each extends
    log_prob: np.ndarray  # (sentences, beam) the new beam's log-probs (-inf: empty slot)

    @classmethod
    def fetch(cls, cand: Candidates, finishing: Tensor, token: Tensor, parent: Tensor, log_prob: Tensor) -> _StepOnHost:
        k, beam = cand.token.size(1), token.size(1)
        packed = torch.cat([cand.log_prob.double(), cand.parent.double(), finishing.double(), token.double(),
                            parent.double(), log_prob.double()], dim=1).cpu().numpy()  # (sentences, 3k + 3 beam)
        cuts = np.cumsum([k, k, k, beam, beam])
        lp, cp, fin, tok, par, new = np.split(packed, cuts, axis=1)
        return cls(lp, cp.astype(np.int64), fin > 0, tok.astype(np.int64), par.astype(np.int64), new)


@torch.inference_mode()
def beam_search(model: Decoder, src: Tensor, *, beam_size: int, n_best: int, length_penalty: float,
                length_norm: LengthNorm, pad_id: int, bos_id: int, eos_id: int, max_len_a: float, max_len_b: float,
                use_cache: bool = True, max_tgt_len: int | None = None,
                select_encoder: SelectEncoder = select_encoder_output) -> list[list[Hypothesis]]:
    """Batched beam search (see the module docstring for the rules).

    The search runs on the device; each step copies its decisions to the host once (:class:`_StepOnHost`),
    where the finished hypotheses are collected from a host copy of the tokens.

    Args:
        src: (batch, src_len) source ids padded with ``pad_id``.
        length_penalty: GNMT alpha (used with ``length_norm=gnmt``).

    Returns:
        For each sentence its ``n_best`` hypotheses, best (highest ``score``) first.
    """
    if not 1 <= n_best <= beam_size:
        raise ValueError(f"beam_search: n_best must be in [1, beam_size={beam_size}], got {n_best}")
    alpha, norm, beam, device = length_penalty, length_norm, beam_size, src.device
    limits = max_lengths(src, pad_id, max_len_a, max_len_b, max_tgt_len)
    batch = src.size(0)
    enc = select_encoder(model.encode(src), torch.arange(batch, device=device).repeat_interleave(beam))
    cache = model.init_cache(enc) if use_cache else None
    start = torch.full((batch, beam), -math.inf, device=device)
    start[:, 0] = 0.0  # one live hypothesis per sentence at first, so the beam holds no duplicates
    state = _Beams(list(range(batch)), start, torch.full((batch * beam, 1), bos_id, dtype=torch.long, device=device),
                   np.zeros((batch * beam, 0), dtype=np.int64))
    finished: list[list[Hypothesis]] = [[] for _ in range(batch)]
    while state.sentences:
        log_probs, cache = _step_log_probs(model, state.prefix, enc, cache, (pad_id, bos_id))
        cand = expand_beams(state.log_prob, log_probs)
        finishing, order = select_beams(cand, beam, eos_id)
        rows, step = _advance(state, cand, order, finishing, eos_id)
        _collect_finished(state, step, beam, finished, alpha, norm)
        state.tokens = np.concatenate([state.tokens[_parent_rows(step.parent, beam)], step.token.reshape(-1, 1)], 1)
        done = _collect_at_limit(state, step.log_prob, limits, finished, beam, n_best, alpha, norm)
        keep = [i for i, d in enumerate(done) if not d]
        if not keep:
            break
        rows = rows.view(len(done), beam)[keep].flatten()  # (live rows,) into the previous step's rows
        if len(keep) < len(done):
            enc_rows = torch.tensor(keep, device=device).unsqueeze(1) * beam + torch.arange(beam, device=device)
            enc = select_encoder(enc, enc_rows.flatten())  # (live rows, ...)
            state.sentences = [state.sentences[i] for i in keep]
            state.log_prob = state.log_prob[keep]
            state.prefix = state.prefix.view(len(done), beam, -1)[keep].flatten(0, 1)
            state.tokens = state.tokens.reshape(len(done), beam, -1)[keep].reshape(len(keep) * beam, -1)
        if cache is not None:  # rows stay within their sentence unless sentences left: the source K/V stay put
            cache = cache.select(rows, keep_static=len(keep) == len(done))
    return [sorted(hyps, key=lambda h: h.score, reverse=True)[:n_best] for hyps in finished]


def _parent_rows(parent: np.ndarray, beam: int) -> np.ndarray:
    """(sentences, beam) beam slots -> (rows,) row indices of the previous step."""
    return (np.arange(len(parent))[:, None] * beam + parent).reshape(-1)


def _collect_finished(state: _Beams, step: _StepOnHost, beam: int, finished: list[list[Hypothesis]], alpha: float,
                      norm: LengthNorm) -> None:
    """Turn this step's EOS candidates (``step.finishing``) into finished hypotheses (``state.tokens`` is the
    previous step's)."""
    for i, j in zip(*np.nonzero(step.finishing)):
        tokens = state.tokens[i * beam + step.cand_parent[i, j]].tolist()
        log_prob = float(step.cand_log_prob[i, j])
        finished[state.sentences[i]].append(finalize_hypothesis(tokens, log_prob, True, alpha, norm))


def _advance(state: _Beams, cand: Candidates, order: Tensor, finishing: Tensor,
             eos_id: int) -> tuple[Tensor, _StepOnHost]:
    """Make the selected candidates the new beam on the device; returns (rows,) the parent row of each new row
    and the step's decisions on the host."""
    n, beam = order.shape
    parent = cand.parent.gather(1, order)  # (sentences, beam)
    token = cand.token.gather(1, order)  # (sentences, beam)
    log_prob = cand.log_prob.gather(1, order)
    state.log_prob = log_prob.masked_fill(token == eos_id, -math.inf)  # EOS only as filler: an empty slot
    rows = (torch.arange(n, device=order.device).unsqueeze(1) * beam + parent).flatten()  # (rows,)
    state.prefix = torch.cat([state.prefix.index_select(0, rows), token.view(-1, 1)], dim=1)  # (rows, step + 1)
    return rows, _StepOnHost.fetch(cand, finishing, token, parent, state.log_prob)


def _collect_at_limit(state: _Beams, log_prob: np.ndarray, limits: list[int], finished: list[list[Hypothesis]],
                      beam: int, n_best: int, alpha: float, norm: LengthNorm) -> list[bool]:
    """Which live sentences are done; those at their length limit finalize their alive hypotheses.

    ``log_prob`` is the host copy of ``state.log_prob`` (sentences, beam)."""
    n_generated = state.tokens.shape[1]
    alive_best = log_prob.max(axis=1)  # (sentences,)
    done: list[bool] = []
    for i, s in enumerate(state.sentences):
        if n_generated >= limits[s]:
            for b, lp in enumerate(log_prob[i].tolist()):
                if lp > -math.inf:
                    finished[s].append(finalize_hypothesis(state.tokens[i * beam + b].tolist(), lp, False, alpha, norm))
            done.append(True)
        else:
            done.append(_sentence_done(finished[s], float(alive_best[i]), beam, n_best, limits[s], alpha, norm))
    return done
