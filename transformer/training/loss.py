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

# Target positions per chunk of the fused output projection and loss: on a CPU a chunk's logits stay in the cache;
# on a GPU the chunks are few large kernels.
CPU_LOSS_CHUNK = 512
GPU_LOSS_CHUNK = 8192


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

    It never waits for the GPU (``.item()``): the count can come from the batch. Training uses the fused
    :func:`projected_label_smoothed_sums` (through ``objective.TranslationObjective``); this unfused form is its reference
    in the tests. Computed in float32 even inside a bf16 autocast region, because the log-sum-exp over a large
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


def projected_label_smoothed_sums(hidden: Tensor, weight: Tensor, bias: Tensor | None, target: Tensor, *,
                                  smoothing: float, pad_id: int, chunk_size: int = CPU_LOSS_CHUNK,
                                  positions: Tensor | None = None, dense: bool = False,
                                  consistency: float = 0.0) -> tuple[Tensor, Tensor]:
    """:func:`label_smoothed_sums` of ``F.linear(hidden, weight, bias)``, without materialising the logits.

    The output projection and the loss run ``chunk_size`` real target positions at a time; padding positions
    are dropped first. Since the loss is a scalar, the gradients for ``hidden``, ``weight`` and ``bias`` are
    complete as soon as a chunk's softmax is known, so they are accumulated during the forward pass and the
    backward pass only scales them. No (positions, vocab) tensor outlives its chunk: a step touches a few MiB
    of logits instead of allocating, faulting in and re-reading ~100 MiB tensors several times.

    Args:
        hidden: (batch, tgt_len, d_model) decoder states.
        weight: (vocab, d_model); bias: (vocab,) or None.
        target: (batch, tgt_len) gold ids; positions equal to ``pad_id`` are ignored.
        smoothing: eps in [0, 1).
        pad_id: the padding id.
        chunk_size: positions per chunk (a GPU takes a whole batch in one or two chunks; a CPU runs faster
            when a chunk's logits stay in its caches).
        positions: (n,) flat indices into (batch * tgt_len) of the real target positions, as ``collate`` makes
            them; given, the padding is dropped by an index (no device-to-host wait), else by ``pad_id``.
        dense: project every position and weight the padding by 0 instead of dropping it: more work, but
            every shape depends on the batch's shape alone, as a CUDA graph needs (``positions`` is ignored).
        consistency: > 0 for R-Drop: the batch's second half repeats its first (same targets, other dropout),
            and the loss per position is the mean of the two halves' losses plus ``consistency`` / 4 times the sum
            of the two KL divergences between their predictions: the paper's loss halved (:class:`_ProjectedRDropLoss`).

    Returns:
        ``(loss_sum, nll_sum)`` as float32 (float64 for float64 inputs) scalars; only ``loss_sum`` carries a
        gradient.
    """
    if not 0.0 <= smoothing < 1.0:
        raise ValueError(f"smoothing must be in [0, 1), got {smoothing}")
    if hidden.shape[:-1] != target.shape:
        raise ValueError(
            f"hidden {tuple(hidden.shape)} and target {tuple(target.shape)} disagree; "
            "expected (batch, tgt_len, d_model) and (batch, tgt_len)"
        )
    keep = None
    if dense:
        hidden, target = hidden.flatten(0, 1), target.flatten()  # (batch * tgt_len, ·)
        keep = target.ne(pad_id)
    else:
        if positions is None:
            positions = target.flatten().ne(pad_id).nonzero().squeeze(1)  # (n,); waits for the device
        hidden = hidden.flatten(0, 1).index_select(0, positions)  # (n, d_model)
        target = target.flatten().index_select(0, positions)  # (n,)
    if consistency > 0:
        return _ProjectedRDropLoss.apply(hidden, weight, bias, target, smoothing, chunk_size, keep, consistency)
    return _ProjectedLabelSmoothedLoss.apply(hidden, weight, bias, target, smoothing, chunk_size, keep)


class _ProjectedLabelSmoothedLoss(torch.autograd.Function):
    """Projection + label-smoothed cross-entropy over (n, d_model) states; gradients made in the forward pass.

    Per position, with p = softmax(logits) and q the smoothed target of the module docstring,
    d loss / d logits = p - q; so d loss / d hidden = (p - q) W and d loss / d W = (p - q)ᵀ hidden.
    With ``keep`` (n,) bool, positions where it is False add nothing to the sums or the gradients.
    """

    @staticmethod
    def forward(ctx, hidden: Tensor, weight: Tensor, bias: Tensor | None, target: Tensor, smoothing: float,
                chunk_size: int, keep: Tensor | None) -> tuple[Tensor, Tensor]:
        vocab = weight.size(0)
        need_hidden, need_weight, need_bias = ctx.needs_input_grad[:3]
        grad_hidden = torch.empty_like(hidden) if need_hidden else None
        grad_weight = torch.zeros_like(weight) if need_weight else None
        grad_bias = torch.zeros_like(bias) if need_bias else None
        dtype = torch.promote_types(hidden.dtype, torch.float32)  # float32 even under bf16 autocast
        nll_sum = hidden.new_zeros((), dtype=dtype)
        uniform_sum = hidden.new_zeros((), dtype=dtype)
        n = hidden.size(0)
        # One chunk needs no loop over n: under torch.compile(dynamic=True) such a loop would pin n to a constant.
        for start in ([0] if n <= chunk_size else range(0, n, chunk_size)):
            h, gold = hidden[start:start + chunk_size], target[start:start + chunk_size].unsqueeze(-1)  # (n, ·)
            logits = F.linear(h, weight, bias).to(dtype)  # (n, vocab)
            gold_logit, mean_logit = logits.gather(-1, gold).squeeze(-1), logits.mean(dim=-1)  # (n,), (n,)
            # softmax with a single exp pass over the logits, in place: e = exp(logits - max), Z = max + log(sum e)
            peak = logits.amax(dim=-1, keepdim=True)  # (n, 1)
            exp = logits.sub_(peak).exp_()  # (n, vocab); the logits are gone from here on
            total = exp.sum(dim=-1, keepdim=True)  # (n, 1)
            log_z = (peak + total.log()).squeeze(-1)  # (n,)
            nll, uniform = log_z - gold_logit, log_z - mean_logit  # (n,): -log p(gold), -mean_k log p(k)
            weights = None if keep is None else keep[start:start + chunk_size].to(dtype)  # (n,)
            nll_sum += nll.sum() if weights is None else (nll * weights).sum()
            uniform_sum += uniform.sum() if weights is None else (uniform * weights).sum()
            if not (need_hidden or need_weight or need_bias):
                continue
            grad_logits = exp.div_(total)  # p
            grad_logits -= smoothing / vocab
            grad_logits.scatter_add_(-1, gold, grad_logits.new_full(gold.shape, smoothing - 1.0))  # p - q
            if weights is not None:
                grad_logits *= weights.unsqueeze(-1)
            grad_logits = grad_logits.to(h.dtype)
            if need_hidden:
                grad_hidden[start:start + chunk_size] = grad_logits @ weight
            if need_weight:
                grad_weight += grad_logits.t() @ h
            if need_bias:
                grad_bias += grad_logits.sum(dim=0)
        ctx.save_for_backward(grad_hidden, grad_weight, grad_bias)
        loss_sum = (1.0 - smoothing) * nll_sum + smoothing * uniform_sum
        ctx.mark_non_differentiable(nll_sum)
        return loss_sum, nll_sum

    @staticmethod
    def backward(ctx, grad_loss: Tensor, grad_nll: Tensor) -> tuple[Tensor | None, ...]:
        grads = [None if g is None else g * grad_loss.to(g.dtype) for g in ctx.saved_tensors]
        return *grads, None, None, None, None


class _ProjectedRDropLoss(torch.autograd.Function):
    """R-Drop (Liang et al., 2021) on top of the projection + label-smoothed loss; gradients made in the forward.

    The (2m, d_model) states are two passes over the same m positions: rows i and m + i share a target (the
    caller's promise: checking it would wait for the device). With z1, z2 their logits, a = log p1, b = log p2,
    KL12 = sum p1 (a - b), KL21 = sum p2 (b - a) and q the smoothed target, the loss per position is half the
    paper's, ce1 + ce2 + alpha * (KL12 + KL21) / 2, so that alpha means what it does there (5 for their
    translation runs) while the per-token scale stays that of one pass:

        L = (ce1 + ce2) / 2 + alpha / 4 * (KL12 + KL21)

    With softmax's Jacobian, dKL12/dz1 = p1 * (a - b - KL12) and dKL12/dz2 = p2 - p1 (KL21 alike), so

        dL/dz1 = (p1 - q) / 2 + alpha / 4 * (p1 * (a - b - KL12) + p1 - p2)
        dL/dz2 = (p2 - q) / 2 + alpha / 4 * (p2 * (b - a - KL21) + p2 - p1)

    A chunk takes ``chunk_size // 2`` positions of each pass and holds four (positions, vocab) buffers.
    Returns ``(loss_sum, nll_sum)`` summed over the m positions (``nll_sum`` the mean of the two passes'), so
    per-token values compare with the plain loss's.
    """

    @staticmethod
    def forward(ctx, hidden: Tensor, weight: Tensor, bias: Tensor | None, target: Tensor, smoothing: float,
                chunk_size: int, keep: Tensor | None, alpha: float) -> tuple[Tensor, Tensor]:
        m = hidden.size(0) // 2
        if hidden.size(0) != 2 * m:
            raise ValueError(f"R-Drop needs the batch twice (an even number of positions), got {hidden.size(0)}")
        vocab, pairs = weight.size(0), max(1, chunk_size // 2)
        dtype = torch.promote_types(hidden.dtype, torch.float32)
        need_hidden, need_weight, need_bias = ctx.needs_input_grad[:3]
        grad_hidden = torch.empty_like(hidden) if need_hidden else None
        grad_weight = torch.zeros_like(weight) if need_weight else None
        grad_bias = torch.zeros_like(bias) if need_bias else None
        sums = hidden.new_zeros(3, dtype=dtype)  # nll (both passes), uniform (both passes), KL12 + KL21
        for start in ([0] if m <= pairs else range(0, m, pairs)):
            first, second = slice(start, min(start + pairs, m)), slice(m + start, m + min(start + pairs, m))
            gold = target[first].unsqueeze(-1)  # (n, 1)
            p1 = F.log_softmax(F.linear(hidden[first], weight, bias).to(dtype), dim=-1)  # (n, vocab): a, for now
            p2 = F.log_softmax(F.linear(hidden[second], weight, bias).to(dtype), dim=-1)  # b, for now
            nll = -(p1.gather(-1, gold) + p2.gather(-1, gold)).squeeze(-1)  # (n,)
            uniform = -(p1.mean(-1) + p2.mean(-1))
            log_ratio = p1 - p2  # a - b
            p1.exp_()
            p2.exp_()
            kl12, kl21 = (p1 * log_ratio).sum(-1, keepdim=True), -(p2 * log_ratio).sum(-1, keepdim=True)  # (n, 1)
            terms = torch.stack([nll, uniform, (kl12 + kl21).squeeze(-1)])  # (3, n)
            weights = None if keep is None else keep[first].to(dtype)  # (n,)
            sums += (terms if weights is None else terms * weights).sum(-1)
            if not (need_hidden or need_weight or need_bias):
                continue
            grad1 = (log_ratio - kl12).mul_(p1).add_(p1).sub_(p2).mul_(alpha / 4).add_(p1, alpha=0.5)
            grad2 = log_ratio.neg_().sub_(kl21).mul_(p2).add_(p2).sub_(p1).mul_(alpha / 4).add_(p2, alpha=0.5)
            for grad in (grad1, grad2):  # minus q / 2
                grad -= 0.5 * smoothing / vocab
                grad.scatter_add_(-1, gold, grad.new_full(gold.shape, -0.5 * (1.0 - smoothing)))
                if weights is not None:
                    grad *= weights.unsqueeze(-1)
            for rows, grad in ((first, grad1.to(hidden.dtype)), (second, grad2.to(hidden.dtype))):
                if grad_hidden is not None:
                    grad_hidden[rows] = grad @ weight
                if grad_weight is not None:
                    grad_weight += grad.t() @ hidden[rows]
                if grad_bias is not None:
                    grad_bias += grad.sum(0)
        ctx.save_for_backward(grad_hidden, grad_weight, grad_bias)
        nll_sum, uniform_sum = 0.5 * sums[0], 0.5 * sums[1]
        loss_sum = (1.0 - smoothing) * nll_sum + smoothing * uniform_sum + 0.25 * alpha * sums[2]
        ctx.mark_non_differentiable(nll_sum)
        return loss_sum, nll_sum

    @staticmethod
    def backward(ctx, grad_loss: Tensor, grad_nll: Tensor) -> tuple[Tensor | None, ...]:
        grads = [None if g is None else g * grad_loss.to(g.dtype) for g in ctx.saved_tensors]
        return *grads, None, None, None, None, None
