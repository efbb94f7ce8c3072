"""Label-smoothed cross-entropy over target tokens, ignoring padding.

Dimension names: batch, tgt_len, vocab (V).

Smoothing convention (Szegedy et al., 2016; the Transformer paper, section 5.4, uses eps = 0.1): the
target distribution puts ``eps / V`` on *every* class, the gold one included, plus ``1 - eps`` on the
gold class:

    q(k) = (1 - eps) * [k == gold] + eps / V
    loss = -sum_k q(k) log p(k) = (1 - eps) * nll + eps * mean_k(-log p(k))

(fairseq instead spreads ``eps / (V - 1)`` over the non-gold classes only; the two differ by
``O(eps / V)`` per token.) With ``smoothing = 0`` the loss equals ``F.cross_entropy``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def label_smoothed_cross_entropy(
    logits: Tensor, target: Tensor, *, smoothing: float, pad_id: int
) -> tuple[Tensor, Tensor, int]:
    """Summed label-smoothed loss and summed NLL over the non-padding target positions.

    Args:
        logits: (batch, tgt_len, vocab) unnormalised scores.
        target: (batch, tgt_len) gold ids; positions equal to ``pad_id`` are ignored.
        smoothing: eps in [0, 1).
        pad_id: the padding id.

    Returns:
        ``(loss_sum, nll_sum, n_tokens)``: two float32 scalar tensors summed over real positions (divide
        by ``n_tokens`` for per-token values) and the number of real positions.
    """
    loss_sum, nll_sum = label_smoothed_sums(logits, target, smoothing=smoothing, pad_id=pad_id)
    return loss_sum, nll_sum, int(target.ne(pad_id).sum().item())


def label_smoothed_sums(logits: Tensor, target: Tensor, *, smoothing: float, pad_id: int) -> tuple[Tensor, Tensor]:
    """``(loss_sum, nll_sum)`` of :func:`label_smoothed_cross_entropy` without the token count.

    The trainer takes the count from the batch, so this variant never waits for the GPU (``.item()``).
    Computed in float32 even inside a bf16 autocast region, because the log-sum-exp over a large
    vocabulary loses too much precision in bf16.
    """
    if not 0.0 <= smoothing < 1.0:
        raise ValueError(f"smoothing must be in [0, 1), got {smoothing}")
    if logits.shape[:-1] != target.shape:
        raise ValueError(
            f"logits {tuple(logits.shape)} and target {tuple(target.shape)} disagree; "
            "expected (batch, tgt_len, vocab) and (batch, tgt_len)"
        )
    with torch.autocast(device_type=logits.device.type, enabled=False):
        log_probs = F.log_softmax(logits.float(), dim=-1)  # (batch, tgt_len, vocab)
        keep = target.ne(pad_id)  # (batch, tgt_len)
        safe_target = target.masked_fill(~keep, 0)  # any valid index; these positions are zeroed below
        nll = -log_probs.gather(-1, safe_target.unsqueeze(-1)).squeeze(-1)  # (batch, tgt_len)
        uniform = -log_probs.mean(dim=-1)  # (batch, tgt_len): cross-entropy against the uniform distribution
        nll_sum = nll.masked_fill(~keep, 0.0).sum()
        uniform_sum = uniform.masked_fill(~keep, 0.0).sum()
        loss_sum = (1.0 - smoothing) * nll_sum + smoothing * uniform_sum
    return loss_sum, nll_sum
