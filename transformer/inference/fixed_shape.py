"""Greedy search in fixed shapes: no host work per step, and on a GPU one CUDA-graph replay a step.

:func:`~transformer.inference.search.greedy_hypotheses` reads every step's tokens back to the host and drops
finished sentences from the batch. That suits a CPU, where a step costs what its rows cost. On a GPU a small
model's step is bound by the host: launching its ~200 operators takes longer than running them, and each read
back waits for the device. Here every step has the same shapes and stays on the device:

- the decoder's keys and values live in preallocated slots (:class:`~transformer.model.transformer.SlotDecoderCache`),
  written in place at a position held on the device;
- finished rows stay in the batch and are ignored; tokens, lengths and summed log-probs are gathered on the device;
- the host reads one flag, "is every sentence done", every ``check_every`` steps, and everything else once at
  the end;
- on CUDA the step is captured once as a CUDA graph (after a first step run eagerly, which warms the kernels)
  and replayed, one launch a step.

The hypotheses are those of ``greedy_hypotheses`` (tests compare them): the same tokens, and scores equal up to
float rounding, since attention runs over every slot with the unwritten ones masked.
"""

from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from transformer.config import LengthNorm
from transformer.inference.search import Hypothesis, _finalize, max_lengths
from transformer.model.transformer import Transformer


@torch.inference_mode()
def fixed_shape_greedy(model: Transformer, src: Tensor, *, pad_id: int, bos_id: int, eos_id: int, max_len_a: float,
                       max_len_b: float, max_tgt_len: int | None = None, length_penalty: float = 0.0,
                       length_norm: LengthNorm = LengthNorm.none, check_every: int = 8,
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
    limits = max_lengths(src, pad_id, max_len_a, max_len_b, max_tgt_len)
    steps, rows, device = max(limits), src.size(0), src.device
    enc = model.encode(src)
    cache = model.init_slot_cache(enc, steps)
    vocab = model.output_layer()[0].size(0)
    banned = torch.zeros(vocab, device=device)  # PAD and BOS are never generated
    banned[[pad_id, bos_id]] = -math.inf
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

    step()  # the first step runs eagerly: on a GPU it also warms up what the graph will need
    use_graph = device.type == "cuda" if cuda_graph is None else cuda_graph
    replay = _captured(step, device) if use_graph and steps > 1 else step
    for taken in range(1, steps):
        if taken % check_every == 0 and bool(done.all()):
            break
        replay()
    lengths, log_probs, by_eos = length.tolist(), summed.tolist(), ended.tolist()
    ids = tokens.tolist()
    return [_finalize(ids[row][: lengths[row]], log_probs[row], by_eos[row], length_penalty, length_norm)
            for row in range(rows)]


def _captured(step: Callable[[], None], device: torch.device) -> Callable[[], None]:
    """``step`` captured as a CUDA graph; returns its replay. Capture records the kernels without running them,
    so the state the step updates is untouched until the first replay."""
    if device.type != "cuda":
        raise ValueError(f"fixed_shape_greedy: a CUDA graph needs a CUDA device, got {device}")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.device(device), torch.cuda.graph(graph):
        step()
    return graph.replay
