"""Scaled dot-product attention (a free function) and multi-head attention with a free head size.

Shape legend: batch, heads (n_heads), q_len (queries), k_len (keys), d_model, d_head, inner = n_heads * d_head.
Masks are bool, True = may attend (see :mod:`transformer.model.masks`).

Which fused kernel runs (``F.scaled_dot_product_attention``'s backend) is chosen here, per attention kind:

- **Causal self-attention without a mask** (the decoder in training, ``is_causal=True``): flash attention,
  then memory-efficient, then the math fallback. It is exact for right-padded targets at every real
  position: a real query only sees earlier positions, which are all real; padding rows are never scored.
- **Masked attention** (encoder self-attention and cross-attention with a padding mask; cached decoding):
  the memory-efficient kernel, then math. Flash takes no mask.
- **Never cuDNN** on CUDA. On Hopper, PyTorch >= 2.10 prefers cuDNN for masked attention, and cuDNN builds a
  new execution plan for every new (batch, q_len, k_len), i.e. for nearly every token-bucketed batch: tens of
  milliseconds of host time per call, most of a small model's step.

On CPU, PyTorch's own order (its flash kernel when there is no dropout on the weights, else math) is already
that choice and plans nothing per shape, so no backend is forced there. Every path gives the numbers of the
explicit softmax(QKᵀ/√d)V (tests compare them).

The score functions (``model.attention.score``) and which path they take:

- ``scaled_dot``: q·k/√d_head, fused.
- ``multiplicative`` (Luong's "general"): qᵀWk with one d_head×d_head matrix W per head. Since
  qᵀWk = (Wᵀq)·k it is still a dot product, so it runs fused too: the query is multiplied by W first and the
  kernel's scale is 1. W starts at I/√d_head, where the score equals scaled_dot's.
- ``additive`` (Bahdanau): vᵀtanh(q + k) per head, where q and k are the head's projected query and key (the
  in-projection is W_q and W_k, its biases the bias inside tanh). No fused kernel computes it: it runs on the
  explicit path, with memory O(batch·heads·q_len·k_len·d_head) per layer.

Relative positions (``model.positions=relative``) add q_i·r_{j-i}/√d_head to the self-attention scores; on the
fused path that term goes in as a float mask, which the memory-efficient and math kernels accept (not flash).
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from transformer.config import AttentionScore
from transformer.model.embeddings import RelativePositions, RotaryPositions
from transformer.model.masks import KeyMask, causal_mask, key_mask

_CAUSAL_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
_MASKED_BACKENDS = [SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def _backends(device: torch.device, is_causal: bool) -> contextlib.AbstractContextManager:
    """The SDPA backends allowed for this attention kind on ``device`` (see the module docstring)."""
    if device.type != "cuda":
        return contextlib.nullcontext()
    return sdpa_kernel(_CAUSAL_BACKENDS if is_causal else _MASKED_BACKENDS)


def softmax_attention(scores: Tensor, value: Tensor, mask: Tensor | KeyMask | None = None,
                      dropout_p: float = 0.0) -> tuple[Tensor, Tensor]:
    """The explicit path of every score function: softmax over the allowed keys, dropout, weighted values.

    Args:
        scores: (batch, heads, q_len, k_len), already scaled.
        value: (batch, heads, k_len, d_v).
        mask: bool, True = may attend, broadcastable to ``scores`` (or that mask as a
            :class:`~transformer.model.masks.KeyMask`); None = all. Rows with no allowed key give all-zero weights
            and a zero output (never NaN).
        dropout_p: dropout on the weights (pass 0 at evaluation).

    Returns:
        output (batch, heads, q_len, d_v) and the weights before dropout (batch, heads, q_len, k_len).
    """
    has_key = None
    if mask is not None:  # rows with no key get every key here, and zeros below
        ready = key_mask(mask)
        scores, has_key = scores.masked_fill(~ready.safe, float("-inf")), ready.has_key
    weights = torch.softmax(scores, dim=-1)
    if has_key is not None:
        weights = weights * has_key  # empty rows -> all-zero weights
    attended = F.dropout(weights, p=dropout_p) if dropout_p > 0 else weights
    return attended @ value, weights  # (batch, heads, q_len, d_v), (batch, heads, q_len, k_len)


def _check_causal(query: Tensor, key: Tensor, mask: Tensor | KeyMask | None) -> None:
    """``is_causal`` needs no mask and as many queries as keys."""
    if mask is not None or query.size(-2) != key.size(-2):
        raise ValueError(f"is_causal needs no mask and q_len == k_len, got mask={mask is not None}, "
                         f"q_len={query.size(-2)}, k_len={key.size(-2)}")


def scaled_dot_product_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    mask: Tensor | KeyMask | None = None,
    dropout_p: float = 0.0,
    need_weights: bool = False,
    is_causal: bool = False,
    scale: float | None = None,
    bias: Tensor | None = None,
) -> tuple[Tensor, Tensor | None]:
    """softmax(Q Kᵀ / √d_head + bias) V  (Vaswani et al., 2017, §3.2.1).

    Two paths with the same numbers: when ``need_weights`` is True an explicit one that returns the
    attention weights (for attention maps); otherwise PyTorch's fused ``F.scaled_dot_product_attention``
    (training and decoding), which also adds a ``bias`` (as a float mask, with gradients). Query rows whose
    mask allows no key give zeros (never NaN) on both paths.

    Args:
        query: (batch, heads, q_len, d_head).
        key: (batch, heads, k_len, d_head).
        value: (batch, heads, k_len, d_v).
        mask: bool, True = may attend, broadcastable to (batch, heads, q_len, k_len), or that mask as a
            :class:`~transformer.model.masks.KeyMask`; None = all.
        dropout_p: dropout on the attention weights (pass 0 at evaluation).
        need_weights: also return the weights (before dropout).
        is_causal: query i may attend to keys 0..i (needs q_len == k_len and no ``mask``); lets the fused
            path run flash attention when there is no ``bias``.
        scale: multiplies Q Kᵀ; None = 1/√d_head.
        bias: (batch, heads, q_len, k_len) added to the scaled scores (relative positions); None = nothing.

    Returns:
        output (batch, heads, q_len, d_v) and weights (batch, heads, q_len, k_len) or None.
    """
    if is_causal:
        _check_causal(query, key, mask)
        if need_weights or bias is not None:  # no fused kernel takes both a causal flag and a float mask
            mask, is_causal = causal_mask(query.size(-2), device=query.device), False  # (1, 1, q_len, q_len)
    scale = 1.0 / math.sqrt(query.size(-1)) if scale is None else scale
    if need_weights:
        scores = query @ key.transpose(-2, -1) * scale  # (batch, heads, q_len, k_len)
        return softmax_attention(scores if bias is None else scores + bias, value, mask, dropout_p)
    has_key = None
    if mask is not None:  # rows with no key get every key here, and zeros after the kernel
        ready = key_mask(mask)
        mask, has_key = ready.safe, ready.has_key
    if bias is not None:  # a float mask is added to the scores; the fused kernels want it in the query's dtype
        bias = bias.to(query.dtype)
        mask = bias if mask is None else bias.masked_fill(~mask, float("-inf"))
    with _backends(query.device, is_causal):
        output = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, dropout_p=dropout_p,
                                                is_causal=is_causal, scale=scale)
    if has_key is not None:
        output = output * has_key  # (batch, heads, q_len, d_v); empty rows -> zeros
    return output, None


def additive_scores(query: Tensor, key: Tensor, v: Tensor) -> Tensor:
    """Bahdanau scores vᵀ tanh(q_i + k_j) of every head, whose q and k are already W_q q and W_k k.

    Memory: the tanh is (batch, heads, q_len, k_len, d_head), which autograd keeps for the backward pass.

    Args:
        query: (batch, heads, q_len, d_head); key: (batch, heads, k_len, d_head).
        v: (heads, d_head), one scoring vector per head.

    Returns:
        (batch, heads, q_len, k_len).
    """
    hidden = torch.tanh(query.unsqueeze(3) + key.unsqueeze(2))  # (batch, heads, q_len, k_len, d_head)
    return torch.einsum("bhqkd,hd->bhqk", hidden, v.to(hidden.dtype))


@dataclass
class KVCache:
    """Projected keys and values of one attention layer, passed in and returned (never stored on modules).

    ``static=True`` marks cross-attention K/V, projected once from the encoder memory and reused as is;
    ``static=False`` marks decoder self-attention K/V, which grow by the new positions at every step.
    """

    key: Tensor  # (batch, heads, k_len, d_head)
    value: Tensor  # (batch, heads, k_len, d_head)
    static: bool = False

    @property
    def length(self) -> int:
        """Number of cached key positions."""
        return self.key.size(2)

    def select(self, indices: Tensor) -> KVCache:
        """Rows ``indices`` of the batch (reorder, repeat or drop rows; beam search)."""
        return KVCache(self.key.index_select(0, indices), self.value.index_select(0, indices), self.static)


@dataclass
class SlotCache:
    """Decoder self-attention K/V in preallocated slots: every step has the same shapes (fixed-shape decoding,
    replayable as a CUDA graph).

    ``key``/``value`` hold ``max_len`` positions per row; a step writes its new position's K/V into slot
    ``position`` (a one-element long tensor on the device, shared by every layer and advanced by the decoder) and
    attends over all slots, with a mask that hides the slots not written yet.
    """

    key: Tensor  # (batch, heads, max_len, d_head)
    value: Tensor  # (batch, heads, max_len, d_head)
    position: Tensor  # (1,) long: the slot of the token being fed

    static = False


@dataclass
class AttentionOutput:
    """What :class:`MultiHeadAttention` returns."""

    output: Tensor  # (batch, q_len, d_model)
    weights: Tensor | None  # (batch, heads, q_len, k_len) when need_weights
    cache: KVCache | SlotCache | None  # the (extended) cache when one was given


class MultiHeadAttention(nn.Module):
    """Multi-head attention whose head size need not divide ``d_model``.

    Q, K and V project d_model -> n_heads·d_head, the output projection W_O maps n_heads·d_head ->
    d_model, so d_model=300 with 8 heads of 64 works. Q, K, V weights live in one ``in_proj_weight``
    (3·inner, d_model) so self-attention runs one matmul; without bias the layer has
    4·d_model·n_heads·d_head parameters, plus n_heads·d_head² for the multiplicative score's W,
    n_heads·d_head for the additive score's v and (2·max_distance + 1)·d_head for a relative-position table.

    Args:
        score: how a query scores a key (see the module docstring).
        rotary: rotates queries and new keys by position (self-attention with positions=rope).
        relative: adds the relative-position term to the scores (self-attention with positions=relative).
    """

    def __init__(self, d_model: int, n_heads: int, d_head: int | None = None, dropout: float = 0.0,
                 bias: bool = True, rotary: RotaryPositions | None = None, relative: RelativePositions | None = None,
                 score: AttentionScore = AttentionScore.scaled_dot) -> None:
        super().__init__()
        if d_head is None:
            if d_model % n_heads != 0:
                raise ValueError(
                    f"MultiHeadAttention: d_model={d_model} is not divisible by n_heads={n_heads}; "
                    f"give d_head explicitly (e.g. d_head=64)"
                )
            d_head = d_model // n_heads
        if d_model <= 0 or n_heads <= 0 or d_head <= 0:
            raise ValueError(f"MultiHeadAttention: sizes must be > 0, got d_model={d_model}, "
                             f"n_heads={n_heads}, d_head={d_head}")
        self.d_model, self.n_heads, self.d_head, self.dropout = d_model, n_heads, d_head, dropout
        inner = n_heads * d_head
        self.in_proj_weight = nn.Parameter(torch.empty(3 * inner, d_model))  # rows: [W_Q; W_K; W_V]
        self.in_proj_bias = nn.Parameter(torch.zeros(3 * inner)) if bias else None
        self.out_proj = nn.Linear(inner, d_model, bias=bias)
        self.rotary, self.relative, self.score = rotary, relative, score
        self.score_weight = None  # multiplicative: (heads, d_head, d_head), the W of qᵀWk per head
        self.score_vector = None  # additive: (heads, d_head), the v of vᵀtanh(q + k) per head
        if score is AttentionScore.multiplicative:
            self.score_weight = nn.Parameter(torch.empty(n_heads, d_head, d_head))
        elif score is AttentionScore.additive:
            self.score_vector = nn.Parameter(torch.empty(n_heads, d_head))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Xavier-uniform per projection (as if Q, K, V were separate layers), zero biases; W = I/√d_head
        (multiplicative starts as scaled_dot), v ~ normal(0, 1/d_head) (additive scores start near unit scale)."""
        for chunk in self.in_proj_weight.data.chunk(3, dim=0):
            nn.init.xavier_uniform_(chunk)
        if self.score_weight is not None:
            with torch.no_grad():
                self.score_weight.copy_(torch.eye(self.d_head).expand_as(self.score_weight) / math.sqrt(self.d_head))
        if self.score_vector is not None:
            nn.init.normal_(self.score_vector, mean=0.0, std=self.d_head**-0.5)
        nn.init.xavier_uniform_(self.out_proj.weight)
        if self.in_proj_bias is not None:
            nn.init.zeros_(self.in_proj_bias)
            nn.init.zeros_(self.out_proj.bias)

    def _project(self, x: Tensor, part: slice) -> Tensor:
        """x (batch, len, d_model) through rows ``part`` of the in-projection -> (batch, len, k·inner)."""
        bias = None if self.in_proj_bias is None else self.in_proj_bias[part]
        return F.linear(x, self.in_proj_weight[part], bias)

    def _split_heads(self, x: Tensor) -> Tensor:
        """(batch, len, inner) -> (batch, heads, len, d_head)."""
        batch, length, _ = x.shape
        return x.view(batch, length, self.n_heads, self.d_head).transpose(1, 2)

    def project_key_value(self, key: Tensor, value: Tensor | None = None, *, static: bool = True) -> KVCache:
        """Project keys/values once, e.g. the encoder memory for cross-attention (``static=True``).

        Args:
            key: (batch, k_len, d_model); value defaults to ``key``.
            static: mark the cache static (reused as is at every step), else a self-attention cache's new part.

        Returns:
            A :class:`KVCache` with (batch, heads, k_len, d_head) tensors.
        """
        inner = self.n_heads * self.d_head
        if value is None or value is key:
            k, v = self._project(key, slice(inner, 3 * inner)).chunk(2, dim=-1)  # 2 x (batch, k_len, inner)
        else:
            k = self._project(key, slice(inner, 2 * inner))
            v = self._project(value, slice(2 * inner, 3 * inner))
        return KVCache(self._split_heads(k), self._split_heads(v), static=static)

    def forward(self, query: Tensor, key: Tensor | None, value: Tensor | None,
                mask: Tensor | KeyMask | None = None, need_weights: bool = False,
                cache: KVCache | SlotCache | None = None,
                is_causal: bool = False) -> AttentionOutput:
        """Attend from ``query`` to ``key``/``value`` (self-attention when all three are the same tensor).

        Args:
            query: (batch, q_len, d_model).
            key: (batch, k_len, d_model); ignored (may be None) when ``cache`` is static.
            value: (batch, k_len, d_model), like ``key``.
            mask: bool, True = may attend, broadcastable to (batch, heads, q_len, total_k_len), or a
                :class:`~transformer.model.masks.KeyMask` of it.
            need_weights: return the attention weights (explicit path) instead of the fused kernel.
            cache: a growing self-attention cache (the new K/V are appended and the longer cache is
                returned), a :class:`SlotCache` (the new K/V are written into its slot ``position``, in place,
                and every slot is attended: ``mask`` must hide the unwritten ones) or a static cross-attention
                cache from :meth:`project_key_value`.
            is_causal: causal self-attention without a mask (see :func:`scaled_dot_product_attention`).

        Returns:
            :class:`AttentionOutput` with output (batch, q_len, d_model), weights
            (batch, heads, q_len, total_k_len) or None, and the cache (None when none was given).
        """
        inner = self.n_heads * self.d_head
        if cache is not None and cache.static:
            q, kv = self._project(query, slice(0, inner)), cache
        elif key is None or value is None:
            raise ValueError("MultiHeadAttention: key and value are required without a static cache")
        elif query is key and key is value:  # self-attention: one fused matmul
            q, k, v = self._project(query, slice(0, 3 * inner)).chunk(3, dim=-1)  # 3 x (batch, len, inner)
            kv = KVCache(self._split_heads(k), self._split_heads(v))
        else:
            q, kv = self._project(query, slice(0, inner)), self.project_key_value(key, value, static=False)
        q = self._split_heads(q)  # (batch, heads, q_len, d_head)
        offset: int | Tensor = 0  # the position of the first query: new positions follow the cached ones
        if isinstance(cache, SlotCache):
            offset = cache.position
        elif cache is not None and not cache.static:
            offset = cache.length
        if self.rotary is not None and not kv.static:
            q, kv = self.rotary(q, offset), KVCache(self.rotary(kv.key, offset), kv.value)
        if isinstance(cache, SlotCache):
            cache.key.index_copy_(2, cache.position, kv.key)  # q_len must be 1: one slot a step
            cache.value.index_copy_(2, cache.position, kv.value)
            kv = KVCache(cache.key, cache.value)
        elif cache is not None and not cache.static and cache.length > 0:  # an empty cache adds nothing
            kv = KVCache(torch.cat([cache.key, kv.key], dim=2), torch.cat([cache.value, kv.value], dim=2))
        dropout_p = self.dropout if self.training else 0.0
        context, weights = self._attend(q, kv, mask, dropout_p, need_weights, is_causal, offset)
        batch, _, q_len, _ = context.shape
        context = context.transpose(1, 2).reshape(batch, q_len, inner)  # (batch, q_len, inner)
        returned = cache if isinstance(cache, SlotCache) else kv if cache is not None else None
        return AttentionOutput(self.out_proj(context), weights, returned)

    def _attend(self, q: Tensor, kv: KVCache, mask: Tensor | KeyMask | None, dropout_p: float,
                need_weights: bool, is_causal: bool, offset: int | Tensor) -> tuple[Tensor, Tensor | None]:
        """Score ``q`` (batch, heads, q_len, d_head), at positions ``offset …``, against the whole ``kv``.

        Returns:
            context (batch, heads, q_len, d_head) and weights (batch, heads, q_len, k_len) or None.
        """
        bias = None
        if self.relative is not None:  # q_i·r_{j-i}/√d_head, from the query before any score matrix
            bias = self.relative(q, kv.length, offset) / math.sqrt(self.d_head)  # (batch, heads, q_len, k_len)
        if self.score is AttentionScore.additive:
            if is_causal:
                _check_causal(q, kv.key, mask)
                mask = causal_mask(q.size(-2), device=q.device)  # (1, 1, q_len, q_len)
            scores = additive_scores(q, kv.key, self.score_vector)  # (batch, heads, q_len, k_len)
            context, weights = softmax_attention(scores if bias is None else scores + bias, kv.value, mask, dropout_p)
            return context, weights if need_weights else None
        scale = None
        if self.score is AttentionScore.multiplicative:  # qᵀWk = (qᵀW)·k: a dot product the fused kernels run
            q, scale = q @ self.score_weight.to(q.dtype), 1.0  # (batch, heads, q_len, d_head)
        return scaled_dot_product_attention(q, kv.key, kv.value, mask, dropout_p, need_weights, is_causal,
                                            scale=scale, bias=bias)
