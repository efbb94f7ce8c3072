"""Feed-forward block, encoder layer and decoder layer, with pre- or post-LayerNorm residuals.

Pre-norm (``x + Dropout(F(LN(x)))``) trains stably without a long warm-up (Xiong et al., 2020) and is
the default; post-norm (``LN(x + Dropout(F(x)))``) is the original paper's §3.1 / §5.4 arrangement.

Shape legend: batch, src_len, tgt_len, d_model, d_ff, heads.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor, nn

from transformer.config import Activation, AttentionScore, NormPosition
from transformer.model.attention import KVCache, MultiHeadAttention, SlotCache
from transformer.model.dropout import Dropout
from transformer.model.embeddings import RelativePositions, RotaryPositions
from transformer.model.masks import KeyMask


class FeedForward(nn.Module):
    """Position-wise Linear(d_model, d_ff) -> activation -> dropout -> Linear(d_ff, d_model) (§3.3).

    ``dropout`` acts on the hidden layer (the "activation dropout" of fairseq, the "relu dropout" of tensor2tensor);
    the block's output is dropped by its :class:`Residual`.
    """

    def __init__(self, d_model: int, d_ff: int, dropout: float, activation: Activation) -> None:
        super().__init__()
        self.linear1 = nn.Linear(d_model, d_ff)
        self.linear2 = nn.Linear(d_ff, d_model)
        self.activation = nn.ReLU() if activation is Activation.relu else nn.GELU()
        self.dropout = Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        """(batch, len, d_model) -> (batch, len, d_model)."""
        return self.linear2(self.dropout(self.activation(self.linear1(x))))  # hidden: (batch, len, d_ff)


class Residual(nn.Module):
    """One sub-layer connection; where the LayerNorm sits is chosen by ``norm``.

    Use as ``y = sublayer(block.inner(x)); x = block.outer(x, y)``.
    """

    def __init__(self, d_model: int, dropout: float, norm: NormPosition) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d_model)
        self.dropout = Dropout(dropout)
        self.pre = norm is NormPosition.pre

    def inner(self, x: Tensor) -> Tensor:
        """The sub-layer's input: LN(x) with pre-norm, x with post-norm. (batch, len, d_model)."""
        return self.norm(x) if self.pre else x

    def outer(self, x: Tensor, y: Tensor) -> Tensor:
        """Add the sub-layer output ``y`` to ``x``: x + Dropout(y) (pre) or LN(x + Dropout(y)) (post)."""
        y = self.dropout(y)
        return x + y if self.pre else self.norm(x + y)


@dataclass
class LayerSizes:
    """The sizes and options every layer of a stack shares (taken from ``ModelConfig``)."""

    d_model: int
    n_heads: int
    d_head: int
    d_ff: int
    dropout: float
    attention_dropout: float
    hidden_dropout: float  # the feed-forward hidden layer's
    activation: Activation
    norm: NormPosition
    max_positions: int  # the longest sequence (the rotary tables' length)
    score: AttentionScore = AttentionScore.scaled_dot
    rope_base: float | None = None  # positions=rope: self-attention rotates queries and keys (None: it does not)
    max_relative_distance: int | None = None  # positions=relative: self-attention adds r_{j-i} (None: it does not)

    def self_attention(self) -> MultiHeadAttention:
        """A self-attention layer, with the positions that live in attention (rope, relative) when chosen.

        Cross-attention gets neither: source and target positions are not positions in one sequence, so their
        difference means nothing (a target word's source word can sit anywhere).
        """
        rotary = None if self.rope_base is None else RotaryPositions(self.d_head, self.max_positions, self.rope_base)
        relative = (None if self.max_relative_distance is None
                    else RelativePositions(self.d_head, self.max_relative_distance))
        return MultiHeadAttention(self.d_model, self.n_heads, self.d_head, self.attention_dropout, rotary=rotary,
                                  relative=relative, score=self.score)

    def cross_attention(self) -> MultiHeadAttention:
        """A cross-attention layer (no positions inside: see :meth:`self_attention`)."""
        return MultiHeadAttention(self.d_model, self.n_heads, self.d_head, self.attention_dropout, score=self.score)


class EncoderLayer(nn.Module):
    """Self-attention then feed-forward, each in a residual connection."""

    def __init__(self, sizes: LayerSizes) -> None:
        super().__init__()
        s = sizes
        self.self_attn = s.self_attention()
        self.feed_forward = FeedForward(s.d_model, s.d_ff, s.hidden_dropout, s.activation)
        self.attn_block = Residual(s.d_model, s.dropout, s.norm)
        self.ff_block = Residual(s.d_model, s.dropout, s.norm)

    def forward(self, x: Tensor, mask: Tensor | KeyMask | None,
                need_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        """Args: x (batch, src_len, d_model); mask (batch, 1, 1, src_len) bool, True = real token (or its KeyMask).

        Returns:
            (batch, src_len, d_model) and the self-attention weights (batch, heads, src_len, src_len) or None.
        """
        h = self.attn_block.inner(x)
        attn = self.self_attn(h, h, h, mask=mask, need_weights=need_weights)
        x = self.attn_block.outer(x, attn.output)
        x = self.ff_block.outer(x, self.feed_forward(self.ff_block.inner(x)))
        return x, attn.weights


@dataclass
class DecoderLayerOutput:
    """What :class:`DecoderLayer` returns."""

    x: Tensor  # (batch, tgt_len, d_model)
    self_weights: Tensor | None  # (batch, heads, tgt_len, total_tgt_len)
    cross_weights: Tensor | None  # (batch, heads, tgt_len, src_len)
    self_cache: KVCache | SlotCache | None  # the extended self-attention cache when one was given


class DecoderLayer(nn.Module):
    """Masked self-attention, cross-attention over the encoder memory, feed-forward."""

    def __init__(self, sizes: LayerSizes) -> None:
        super().__init__()
        s = sizes
        self.self_attn = s.self_attention()
        self.cross_attn = s.cross_attention()
        self.feed_forward = FeedForward(s.d_model, s.d_ff, s.hidden_dropout, s.activation)
        self.self_block = Residual(s.d_model, s.dropout, s.norm)
        self.cross_block = Residual(s.d_model, s.dropout, s.norm)
        self.ff_block = Residual(s.d_model, s.dropout, s.norm)

    def forward(self, x: Tensor, memory: Tensor | None, self_mask: Tensor | KeyMask | None,
                cross_mask: Tensor | KeyMask | None,
                self_cache: KVCache | SlotCache | None = None, cross_cache: KVCache | None = None,
                need_weights: bool = False, causal: bool = False) -> DecoderLayerOutput:
        """One decoder layer.

        Args:
            x: (batch, tgt_len, d_model) target states (only the new positions when caching).
            memory: (batch, src_len, d_model) encoder output; may be None when ``cross_cache`` is given.
            self_mask: bool, broadcastable to (batch, heads, tgt_len, total_tgt_len), or its ``KeyMask``.
            cross_mask: bool, broadcastable to (batch, heads, tgt_len, src_len), or its ``KeyMask``.
            self_cache: growing K/V of earlier target positions, or their preallocated slots (None: no caching).
            cross_cache: static K/V of the memory from ``cross_attn.project_key_value``.
            need_weights: return both attention weight tensors.
            causal: plain causal self-attention instead of ``self_mask`` (which must be None); exact at the
                real positions of right-padded targets.
        """
        h = self.self_block.inner(x)
        self_out = self.self_attn(h, h, h, mask=self_mask, need_weights=need_weights, cache=self_cache,
                                  is_causal=causal)
        x = self.self_block.outer(x, self_out.output)
        h = self.cross_block.inner(x)
        cross_out = self.cross_attn(h, memory, memory, mask=cross_mask, need_weights=need_weights,
                                    cache=cross_cache)
        x = self.cross_block.outer(x, cross_out.output)
        x = self.ff_block.outer(x, self.feed_forward(self.ff_block.inner(x)))
        return DecoderLayerOutput(x, self_out.weights, cross_out.weights, self_out.cache)
