"""Attention masks: one convention everywhere — bool, ``True`` = this query may attend to this key.

This is the polarity of PyTorch's ``F.scaled_dot_product_attention`` bool masks. Every builder returns
a tensor that broadcasts to ``(batch, heads, q_len, k_len)``; the shape each one returns is in its
docstring. Masks are turned into ``-inf`` scores only inside :mod:`transformer.model.attention`.

Shape legend: batch, heads, src_len (source keys), tgt_len (target queries/keys), q_len, k_len.

A query row that may attend to no key (a source of padding only) would make the softmax NaN; attention gives such
a row every key and zeroes its output afterwards. :class:`KeyMask` holds a mask with that guard worked out, so that
a stack of layers applying one mask prepares it once rather than once a layer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


def padding_mask(tokens: Tensor, pad_id: int) -> Tensor:
    """Keys that are padding may not be attended.

    On the source ids this is both the encoder self-attention mask and the cross-attention mask: it
    broadcasts over heads and queries to (batch, heads, q_len, src_len).

    Args:
        tokens: (batch, k_len) token ids.
        pad_id: the padding id.

    Returns:
        (batch, 1, 1, k_len) bool, True at real (non-pad) tokens.
    """
    return (tokens != pad_id)[:, None, None, :]  # (batch, 1, 1, k_len)


def causal_mask(q_len: int, k_len: int | None = None, device: torch.device | str | None = None) -> Tensor:
    """Query ``i`` may attend to keys ``0 … i + (k_len - q_len)`` (lower triangular when square).

    With a KV cache the ``q_len`` new queries are the *last* ``q_len`` of ``k_len`` positions, so the
    triangle is aligned to the bottom-right corner.

    Args:
        q_len: number of queries.
        k_len: number of keys (default ``q_len``); must be >= ``q_len``.
        device: where to build the mask.

    Returns:
        (1, 1, q_len, k_len) bool.
    """
    k_len = q_len if k_len is None else k_len
    if k_len < q_len:
        raise ValueError(f"causal_mask: k_len={k_len} must be >= q_len={q_len}")
    allowed = torch.ones(q_len, k_len, dtype=torch.bool, device=device).tril(diagonal=k_len - q_len)
    return allowed[None, None]  # (1, 1, q_len, k_len)


def decoder_self_mask(tgt: Tensor, pad_id: int) -> Tensor:
    """Decoder self-attention: causal AND target keys that are not padding.

    Args:
        tgt: (batch, tgt_len) target ids (teacher-forced decoder input).
        pad_id: the padding id.

    Returns:
        (batch, 1, tgt_len, tgt_len) bool.
    """
    tgt_len = tgt.size(1)
    return causal_mask(tgt_len, device=tgt.device) & padding_mask(tgt, pad_id)  # (batch, 1, tgt_len, tgt_len)


def cached_decoder_self_mask(q_len: int, key_valid: Tensor) -> Tensor:
    """Decoder self-attention mask for ``q_len`` new queries on top of a cache.

    Args:
        q_len: number of new target positions (the last ``q_len`` of ``key_valid``).
        key_valid: (batch, k_len) bool, True at every real target position so far (cached + new).

    Returns:
        (batch, 1, q_len, k_len) bool.
    """
    k_len = key_valid.size(1)
    return causal_mask(q_len, k_len, device=key_valid.device) & key_valid[:, None, None, :]



@dataclass(frozen=True)
class KeyMask:
    """A bool mask (True = may attend) readied for attention: :func:`key_mask` makes one.

    Every attention function that takes a mask also takes this; the encoder and the decoder make one per mask and
    pass it to every layer (on a GPU, three kernels a layer fewer).
    """

    allowed: Tensor  # the mask itself
    safe: Tensor  # ``allowed``, with every key allowed in the rows that allow none: the softmax stays finite
    has_key: Tensor | None  # (..., q_len, 1) bool: the rows that allow some key; None: every row does

    @classmethod
    def with_a_key_in_every_row(cls, mask: Tensor) -> KeyMask:
        """A mask known to allow some key in every query row (a caller's promise: nothing is checked)."""
        return cls(mask, mask, None)


def key_mask(mask: Tensor | KeyMask) -> KeyMask:
    """``mask`` readied for attention (a :class:`KeyMask` is returned as it is)."""
    if isinstance(mask, KeyMask):
        return mask
    has_key = mask.any(dim=-1, keepdim=True)  # (..., q_len, 1)
    return KeyMask(mask, mask | ~has_key, has_key)
