"""Greedy and beam search in fixed shapes: no host work per step, and on a GPU one CUDA-graph replay a step.

The searches of :mod:`transformer.inference.search` read every step's decisions back to the host and drop
finished sentences from the batch. That suits a CPU, where a step costs what its rows cost. On a GPU a small
model's step is bound by the host: dispatching its 200 – 300 operators takes longer than running them, and each
read back waits for the device. Here every step has the same shapes and stays on the device:

- the decoder's keys and values live in preallocated slots (:class:`~transformer.model.transformer.SlotDecoderCache`),
  written in place at a position held on the device;
- finished rows stay in the batch and are ignored; tokens, lengths and log-probs are gathered on the device, and
  beam search's finished hypotheses too (each sentence's best ``beam_size`` and their count);
- beam search writes each step's tokens once, beside the row each continues (:class:`_Trail`): a hypothesis is
  where its last token lies, and its tokens are followed back once at the end, on the host, not copied every step;
  on a GPU one gather reorders every layer's keys and values;
- the host reads one flag, "is every sentence done", every ``check_every`` steps, and everything else once at
  the end. Every 2 steps by default: a look should leave the GPU idle for tens of microseconds (not measured
  yet), while a batch runs on past its end by ``(check_every - 1) / 2`` steps of a millisecond or more on average
  (looking every 8 steps, a batch of 40 steps would run 9 % longer than it needs);
- on CUDA the step is captured as a CUDA graph once per batch (after a first step run eagerly, which warms the
  kernels) and replayed, one launch a step.

The hypotheses are those of ``greedy_hypotheses`` and ``beam_search`` (tests compare them): the same tokens, and
scores equal up to float rounding, since attention runs over every slot with the unwritten ones masked. The price
is memory and work for rows that are done: the slots hold every row at the longest limit of the batch.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from transformer.config import LengthNorm
from transformer.inference.search import Hypothesis, expand_beams, finalize_hypothesis, max_lengths, select_beams
from transformer.inference.search import length_penalty as length_penalty_of
from transformer.model.transformer import Transformer, select_encoder_output


@torch.inference_mode()
def fixed_shape_greedy(model: Transformer, src: Tensor, *, pad_id: int, bos_id: int, eos_id: int, max_len_a: float,
                       max_len_b: float, max_tgt_len: int | None = None, length_penalty: float = 0.0,
                       length_norm: LengthNorm = LengthNorm.none, check_every: int = 2,
                       cuda_graph: bool | None = None) -> list[Hypothesis]:
    """Arg-max decoding of a batch, every step in the same shapes (see the module docstring).

    Args:
        src: (batch, src_len) source ids padded with ``pad_id``; the other search settings (``max_len_a``,
            ``max_len_b``, ``max_tgt_len``, ``length_penalty``, ``length_norm``) are those of ``greedy_hypotheses``.
        check_every: steps between the host's looks at whether every sentence is done.
        cuda_graph: replay the step as a CUDA graph; None: when ``src`` is on a CUDA device.

    Returns:
        One hypothesis per sentence.
    """
    if check_every < 1:
        raise ValueError(f"fixed_shape_greedy: check_every must be >= 1, got {check_every}")
    use_graph = _use_graph(cuda_graph, src.device)
    limits = max_lengths(src, pad_id, max_len_a, max_len_b, max_tgt_len)
    steps, rows, device = max(limits), src.size(0), src.device
    enc = model.encode(src)
    cache = model.init_slot_cache(enc, steps)
    banned = _banned(model, pad_id, bos_id, device)
    token = torch.full((rows, 1), bos_id, dtype=torch.long, device=device)  # fed at the next step
    tokens = torch.full((rows, steps + 1), pad_id, dtype=torch.long, device=device)  # column ``steps``: a bin
    length = torch.zeros(rows, dtype=torch.long, device=device)  # tokens kept so far (EOS not counted)
    summed = torch.zeros(rows, dtype=torch.float64, device=device)  # log-prob so far (EOS counted)
    done = torch.zeros(rows, dtype=torch.bool, device=device)
    ended = torch.zeros(rows, dtype=torch.bool, device=device)  # done by EOS (not by the length limit)
    limit = torch.tensor(limits, dtype=torch.long, device=device)
    bin_column = torch.full((rows,), steps, dtype=torch.long, device=device)

    def step() -> None:
        logits = model.decode(token, enc, cache).logits[:, -1].float() + banned  # (rows, vocab)
        best_log_prob, best = F.log_softmax(logits, dim=-1).max(dim=-1)  # (rows,) each
        live = ~done
        is_eos = best == eos_id
        keep = live & ~is_eos  # the token joins the hypothesis
        summed.add_(torch.where(live, best_log_prob.double(), 0.0))
        tokens.scatter_(1, torch.where(keep, length, bin_column)[:, None], best[:, None])
        finishing = live & (is_eos | (length + 1 >= limit))
        length.add_(keep.long())
        ended.logical_or_(live & is_eos)
        done.logical_or_(finishing)
        token.copy_(best[:, None])

    _run(step, steps, done, check_every, use_graph, device)
    lengths, log_probs, by_eos = length.tolist(), summed.tolist(), ended.tolist()
    ids = tokens.tolist()
    return [finalize_hypothesis(ids[row][: lengths[row]], log_probs[row], by_eos[row], length_penalty, length_norm)
            for row in range(rows)]


@torch.inference_mode()
def fixed_shape_beam(model: Transformer, src: Tensor, *, beam_size: int, n_best: int, length_penalty: float,
                     length_norm: LengthNorm, pad_id: int, bos_id: int, eos_id: int, max_len_a: float,
                     max_len_b: float, max_tgt_len: int | None = None, check_every: int = 2,
                     cuda_graph: bool | None = None) -> list[list[Hypothesis]]:
    """Beam search of a batch, every step in the same shapes: the rules of
    :func:`~transformer.inference.search.beam_search`, kept on the device.

    Each sentence keeps its ``beam_size`` best finished hypotheses (by normalized score) and how many it has
    finished in all, which is all that the stopping rule and the ``n_best`` result need; a sentence that is done
    has its alive hypotheses set to -inf, so it expands to nothing and finishes nothing more.

    Args:
        src: (batch, src_len) source ids padded with ``pad_id``; the search settings are ``beam_search``'s.
        check_every: steps between the host's looks at whether every sentence is done.
        cuda_graph: replay the step as a CUDA graph; None: when ``src`` is on a CUDA device.

    Returns:
        For each sentence its ``n_best`` hypotheses, best (highest ``score``) first.
    """
    if not 1 <= n_best <= beam_size:
        raise ValueError(f"fixed_shape_beam: n_best must be in [1, beam_size={beam_size}], got {n_best}")
    if check_every < 1:
        raise ValueError(f"fixed_shape_beam: check_every must be >= 1, got {check_every}")
    use_graph = _use_graph(cuda_graph, src.device)
    alpha, norm, beam, device = length_penalty, length_norm, beam_size, src.device
    limits = max_lengths(src, pad_id, max_len_a, max_len_b, max_tgt_len)
    steps, batch = max(limits), src.size(0)
    enc = select_encoder_output(model.encode(src), torch.arange(batch, device=device).repeat_interleave(beam))
    cache = model.init_slot_cache(enc, steps)
    banned = _banned(model, pad_id, bos_id, device)
    first_row = torch.arange(batch, device=device)[:, None] * beam  # (batch, 1): each sentence's first row
    token = torch.full((batch * beam, 1), bos_id, dtype=torch.long, device=device)  # fed at the next step
    alive = torch.full((batch, beam), -math.inf, device=device)  # cumulative log-probs; -inf: an empty slot
    alive[:, 0] = 0.0  # one live hypothesis per sentence at first, so the beam holds no duplicates
    trail = _Trail.empty(steps, batch * beam, device)
    limit = torch.tensor(limits, dtype=torch.long, device=device)  # (batch,)
    # the length penalty of every length, computed on the host as the ordinary search does, so scores match it
    penalties = torch.tensor([length_penalty_of(max(n, 1), alpha, norm) for n in range(steps + 1)],
                             dtype=torch.float64, device=device)  # (steps + 1,)
    bound = penalties.index_select(0, limit)  # (batch,) no continuation's score exceeds its log-prob over this
    done = torch.zeros(batch, dtype=torch.bool, device=device)
    n_finished = torch.zeros(batch, dtype=torch.long, device=device)
    finished = _Finished.empty(batch, beam, device)

    own_row = torch.arange(batch * beam, device=device).view(batch, beam)  # (batch, beam): each row's index
    k = min(2 * beam, beam * banned.size(0))  # candidates a step: expand_beams' best 2 * beam
    # what the candidates finished at a step are, in merge order: the EOS ones (their parent's tokens, EOS not
    # counted), then the alive ones that reach the limit (every token); length: the step's count plus this
    ends_by_eos = torch.arange(k + beam, device=device) < k  # (k + beam,)
    length_offset = ends_by_eos.long().neg()  # (k + beam,): -1 for EOS

    def step() -> None:
        logits = model.decode(token, enc, cache).logits[:, -1].float() + banned  # (rows, vocab)
        cand = expand_beams(alive, F.log_softmax(logits, dim=-1))  # (batch, k) each
        finishing, order = select_beams(cand, beam, eos_id)
        generated = cache.position  # (1,): tokens generated so far, this step's included (decode advanced it)
        penalty = penalties.index_select(0, generated)  # the length counts the EOS, or is the limit
        parents = first_row + cand.parent  # (batch, k): each candidate's row at the previous step
        new_token, log_prob = cand.token.gather(1, order), cand.log_prob.gather(1, order)
        log_prob = log_prob.masked_fill(new_token == eos_id, -math.inf)  # EOS only as filler: an empty slot
        rows = parents.gather(1, order)  # (batch, beam): the row each new one continues
        trail.extend(generated, new_token, rows)
        cache.reorder_(rows.flatten())
        token.copy_(new_token.view(-1, 1))
        at_limit = (generated >= limit) & ~done  # (batch,): the alive hypotheses finish as they are
        joining = at_limit[:, None] & torch.isfinite(log_prob)
        n_finished.add_(finishing.sum(dim=1) + joining.sum(dim=1))
        ending = torch.cat([cand.log_prob, log_prob], dim=1)  # (batch, k + beam)
        score = torch.where(torch.cat([finishing, joining], dim=1), ending.double() / penalty, -math.inf)
        finished.merge(score, ending, torch.cat([parents, own_row], dim=1), (generated + length_offset).expand_as(score),
                       ends_by_eos.expand_as(score))
        done.logical_or_(at_limit | _cannot_win(log_prob, n_finished, finished.score, bound, n_best, norm))
        alive.copy_(log_prob.masked_fill(done[:, None], -math.inf))

    taken = _run(step, steps, done, check_every, use_graph, device)
    tokens = trail.backtrack(finished.row, finished.length, taken, pad_id)  # (batch, beam, steps)
    return finished.hypotheses(tokens, n_best, alpha, norm)


def _cannot_win(alive: Tensor, n_finished: Tensor, finished: Tensor, bound: Tensor, n_best: int,
                norm: LengthNorm) -> Tensor:
    """(batch,) bool: sentences whose search is over, by the stopping rule of the ordinary beam search: ``n_best``
    hypotheses have finished and none alive can beat the worst of them, even at the longest length (``bound``: the
    length penalty there), or nothing is alive; with length normalization, also a beam's worth finished.

    Args:
        alive: (batch, beam) log-probs of the alive hypotheses, -inf for empty slots.
        n_finished: (batch,) hypotheses finished so far; ``finished``: (batch, beam) their best scores, best first.
    """
    alive_best = alive.max(dim=1).values.double()  # (batch,)
    over = torch.where(n_finished < n_best, alive_best == -math.inf, finished[:, n_best - 1] >= alive_best / bound)
    if norm is not LengthNorm.none:  # a beam full of finished hypotheses also ends a sentence
        over = over | (n_finished >= alive.size(1))
    return over


@dataclass
class _Trail:
    """Every step's alive tokens and where each row came from, written once, never reordered: a hypothesis's tokens
    are read back from its last row by following the parents (:meth:`backtrack`)."""

    token: Tensor  # (steps, rows) long: the token each row took at a step
    parent: Tensor  # (steps, rows) long: the row it continued, at the step before

    @classmethod
    def empty(cls, steps: int, rows: int, device: torch.device) -> _Trail:
        return cls(torch.zeros(steps, rows, dtype=torch.long, device=device),
                   torch.zeros(steps, rows, dtype=torch.long, device=device))

    def extend(self, generated: Tensor, token: Tensor, parent: Tensor) -> None:
        """Record step ``generated`` (a (1,) tensor counting from 1): each row's token and parent, (batch, beam)."""
        self.token.index_copy_(0, generated - 1, token.view(1, -1))
        self.parent.index_copy_(0, generated - 1, parent.view(1, -1))

    def backtrack(self, row: Tensor, length: Tensor, taken: int, pad_id: int) -> np.ndarray:
        """The tokens of the hypotheses that end in ``row`` after ``length`` steps, both (batch, beam), as
        (batch, beam, steps) padded with ``pad_id``; ``taken``: the steps run. One pass over the steps, last first,
        on the host: the trail is copied once, and no small operator a step is launched on the device."""
        token, parent = (t[:taken].cpu().numpy() for t in (self.token, self.parent))
        row, length = row.cpu().numpy(), length.cpu().numpy()
        tokens = np.full((*row.shape, self.token.size(0)), pad_id, dtype=np.int64)
        for step in range(taken, 0, -1):  # step ``step`` wrote position step - 1
            inside = length >= step
            tokens[..., step - 1] = np.where(inside, token[step - 1][row], pad_id)
            row = np.where(inside, parent[step - 1][row], row)
        return tokens


@dataclass
class _Finished:
    """The ``beam`` best finished hypotheses of each sentence, best first (-inf scores: empty slots), each as where
    its tokens end in the :class:`_Trail`."""

    score: Tensor  # (batch, beam) float64
    log_prob: Tensor  # (batch, beam) float32
    row: Tensor  # (batch, beam) long: the row of its last token
    length: Tensor  # (batch, beam) long: tokens without EOS
    ended: Tensor  # (batch, beam) bool: by EOS

    @classmethod
    def empty(cls, batch: int, beam: int, device: torch.device) -> _Finished:
        return cls(torch.full((batch, beam), -math.inf, dtype=torch.float64, device=device),
                   torch.zeros(batch, beam, device=device),
                   torch.zeros(batch, beam, dtype=torch.long, device=device),
                   torch.zeros(batch, beam, dtype=torch.long, device=device),
                   torch.zeros(batch, beam, dtype=torch.bool, device=device))

    def merge(self, score: Tensor, log_prob: Tensor, row: Tensor, length: Tensor, ended: Tensor) -> None:
        """Keep the best ``beam`` of these and the candidates, all (batch, c), in place. A stable sort: among equal
        scores the earlier finished stays first, as in the ordinary search's final sort."""
        beam = self.score.size(1)
        best, pick = torch.cat([self.score, score], dim=1).sort(dim=1, descending=True, stable=True)
        pick = pick[:, :beam]  # (batch, beam)
        self.score.copy_(best[:, :beam])
        for kept, new in ((self.log_prob, log_prob), (self.row, row), (self.length, length), (self.ended, ended)):
            kept.copy_(torch.cat([kept, new], dim=1).gather(1, pick))

    def hypotheses(self, tokens: np.ndarray, n_best: int, alpha: float, norm: LengthNorm) -> list[list[Hypothesis]]:
        """The ``n_best`` best of each sentence, read back once; ``tokens``: theirs, (batch, beam, steps)."""
        scores, log_probs, ids = self.score.tolist(), self.log_prob.tolist(), tokens.tolist()
        lengths, ended = self.length.tolist(), self.ended.tolist()
        return [[finalize_hypothesis(ids[i][j][: lengths[i][j]], log_probs[i][j], ended[i][j], alpha, norm)
                 for j in range(n_best) if scores[i][j] > -math.inf] for i in range(len(scores))]


def _banned(model: Transformer, pad_id: int, bos_id: int, device: torch.device) -> Tensor:
    """(vocab,) 0, and -inf at PAD and BOS, which are never generated: added to the logits."""
    banned = torch.zeros(model.output_layer()[0].size(0), device=device)
    banned[[pad_id, bos_id]] = -math.inf
    return banned


def _use_graph(cuda_graph: bool | None, device: torch.device) -> bool:
    """Whether to replay the step as a CUDA graph (None: on CUDA); asking for one elsewhere is an error."""
    if cuda_graph and device.type != "cuda":
        raise ValueError(f"fixed-shape search: a CUDA graph needs a CUDA device, got {device}")
    return device.type == "cuda" if cuda_graph is None else cuda_graph


def _run(step: Callable[[], None], steps: int, done: Tensor, check_every: int, use_graph: bool,
         device: torch.device) -> int:
    """Up to ``steps`` steps: the first eagerly (on a GPU it also warms up what the graph will need), the others
    replayed from a CUDA graph when ``use_graph``; the host reads ``done.all()`` every ``check_every`` steps.
    Returns the steps run."""
    replay = _captured(step, device) if use_graph and steps > 1 else None
    if replay is None:
        step()
        replay = step
    for taken in range(1, steps):
        if taken % check_every == 0 and bool(done.all()):
            return taken
        replay()
    return steps


# a side stream per CUDA device and thread, for warm-ups and captures: two threads decoding on one GPU (two
# Translators, say) must not capture on the same stream
_CAPTURE_STREAMS: dict[tuple[int, int], torch.cuda.Stream] = {}


def _captured(step: Callable[[], None], device: torch.device) -> Callable[[], None]:
    """Run ``step`` once eagerly, then capture it as a CUDA graph; returns the graph's replay.

    Both on a side stream, as CUDA graphs need; the capture records the kernels without running them, so the state
    the step updates is as the eager step left it until the first replay. The lower-level capture calls skip what
    ``torch.cuda.graph`` does on entry (a garbage collection and emptying the allocator's cache), too costly once
    per batch; ``thread_local``: another thread (during training, the batch prefetcher) may pin host memory
    meanwhile, which the default mode would count as an unsafe call.
    """
    index = device.index if device.index is not None else torch.cuda.current_device()
    with torch.cuda.device(index):
        key = (index, threading.get_ident())
        if key not in _CAPTURE_STREAMS:
            _CAPTURE_STREAMS[key] = torch.cuda.Stream(index)
        side = _CAPTURE_STREAMS[key]
        side.wait_stream(torch.cuda.current_stream(index))
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.stream(side):
            step()
            graph.capture_begin(capture_error_mode="thread_local")
            try:
                step()
            finally:
                graph.capture_end()
        torch.cuda.current_stream(index).wait_stream(side)
    return graph.replay
