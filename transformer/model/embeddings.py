"""Token embeddings (scaled by √d_model), sinusoidal or learned absolute positions, and the positions that live
in self-attention instead: rotary (queries and keys rotated) and relative (a learned vector per distance).

Shape legend: batch, seq_len, d_model, vocab.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from transformer.config import PositionKind
from transformer.model.dropout import Dropout


def sinusoidal_positions(n_positions: int, d_model: int) -> Tensor:
    """PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d)) (paper §3.5).

    Works for odd ``d_model``: the last column is then a sine with no cosine partner.

    Returns:
        (n_positions, d_model) float32.
    """
    position = torch.arange(n_positions, dtype=torch.float64)[:, None]  # (n_positions, 1)
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)  # (ceil(d/2),)
    angle = position / torch.pow(10000.0, two_i / d_model)  # (n_positions, ceil(d/2))
    table = torch.zeros(n_positions, d_model, dtype=torch.float64)
    table[:, 0::2] = torch.sin(angle)
    table[:, 1::2] = torch.cos(angle[:, : d_model // 2])
    return table.float()


class TokenEmbedding(nn.Module):
    """Token lookup multiplied by √d_model (paper §3.4).

    Weights start at normal(0, d_model^-0.5) so the scaled embedding has unit variance — the same scale
    as the sinusoidal positions — and the weight can double as the tied output projection. The pad row
    is zero and gets no gradient from the lookup.
    """

    def __init__(self, vocab_size: int, d_model: int, pad_id: int) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, d_model, padding_idx=pad_id)
        self.scale = math.sqrt(d_model)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """normal(0, d_model^-0.5), pad row zero."""
        nn.init.normal_(self.embedding.weight, mean=0.0, std=self.embedding.embedding_dim**-0.5)
        with torch.no_grad():
            self.embedding.weight[self.embedding.padding_idx].zero_()

    @property
    def weight(self) -> Tensor:
        """(vocab, d_model) embedding matrix (unscaled)."""
        return self.embedding.weight

    def forward(self, tokens: Tensor) -> Tensor:
        """(batch, seq_len) ids -> (batch, seq_len, d_model)."""
        return self.embedding(tokens) * self.scale


class Embeddings(nn.Module):
    """Scaled token embedding + positions + dropout; the input of an encoder or decoder stack.

    The token embedding is passed in so source and target can share one (``share_embeddings``).
    Sinusoidal positions are a non-persistent buffer (not in checkpoints: they are a pure function of
    the sizes); learned positions are a parameter initialised at normal(0, 0.02).
    """

    def __init__(self, token: TokenEmbedding, positions: PositionKind, max_positions: int,
                 dropout: float) -> None:
        super().__init__()
        self.token = token
        self.max_positions = max_positions
        d_model = token.weight.size(1)
        table = sinusoidal_positions(max_positions, d_model) if positions is PositionKind.sinusoidal else None
        self.register_buffer("sinusoid", table, persistent=False)
        self.learned = None
        if positions is PositionKind.learned:
            self.learned = nn.Embedding(max_positions, d_model)
            nn.init.normal_(self.learned.weight, mean=0.0, std=0.02)
        elif positions not in (PositionKind.sinusoidal, PositionKind.rope, PositionKind.relative, PositionKind.none):
            raise ValueError(f"Embeddings: unknown position kind {positions!r}")
        self.dropout = Dropout(dropout)

    def forward(self, tokens: Tensor, offset: int | Tensor = 0) -> Tensor:
        """Embed ``tokens`` at positions ``offset … offset + seq_len - 1``.

        Args:
            tokens: (batch, seq_len) ids.
            offset: position of the first token (the cache length during incremental decoding); a one-element
                tensor when the position lives on the device (fixed-shape decoding, whose caller keeps it in range).

        Returns:
            (batch, seq_len, d_model).
        """
        seq_len = tokens.size(1)
        if isinstance(offset, int) and offset + seq_len > self.max_positions:
            raise ValueError(
                f"Embeddings: position {offset + seq_len - 1} is beyond model.max_positions={self.max_positions}; "
                f"shorten the input or raise model.max_positions"
            )
        x = self.token(tokens)  # (batch, seq_len, d_model)
        if self.learned is not None:
            x = x + self.learned(position_ids(offset, seq_len, tokens.device))  # (seq_len, d_model), broadcast
        elif self.sinusoid is not None and isinstance(offset, int):
            x = x + self.sinusoid[offset : offset + seq_len].to(x.dtype)
        elif self.sinusoid is not None:
            x = x + self.sinusoid.index_select(0, position_ids(offset, seq_len, tokens.device)).to(x.dtype)
        return self.dropout(x)


def position_ids(offset: int | Tensor, length: int, device: torch.device) -> Tensor:
    """The positions ``offset … offset + length - 1`` as a (length,) long tensor (``offset`` may be a one-element
    tensor, so no value is read back from the device)."""
    if isinstance(offset, int):
        return torch.arange(offset, offset + length, device=device)
    return torch.arange(length, device=device) + offset


class RotaryPositions(nn.Module):
    """Rotary position embedding (RoPE; Su et al., 2021) for one attention layer's queries and keys.

    Coordinates ``i`` and ``i + d_head/2`` of a head form a pair, rotated at position ``p`` by the angle
    ``p * base^(-2i/d_head)``. A rotation by ``m`` then by ``n``'s inverse is a rotation by ``m - n``, so the dot
    product of a query rotated at ``m`` and a key rotated at ``n`` depends on the positions only through
    ``m - n``: relative positions, with no position added to the embeddings. Any even ``d_head`` works.
    The cos/sin tables are a non-persistent buffer (a pure function of the sizes, not in checkpoints).
    """

    def __init__(self, d_head: int, max_positions: int, base: float) -> None:
        super().__init__()
        if d_head % 2:
            raise ValueError(f"RotaryPositions: d_head must be even, got {d_head}")
        half = d_head // 2
        inv_freq = base ** (-torch.arange(half, dtype=torch.float64) / half)  # (half,) = base^(-2i/d_head)
        angle = torch.arange(max_positions, dtype=torch.float64)[:, None] * inv_freq  # (max_positions, half)
        self.register_buffer("cos_sin", torch.stack([angle.cos(), angle.sin()]).float(), persistent=False)
        self.max_positions = max_positions

    def forward(self, x: Tensor, offset: int | Tensor = 0) -> Tensor:
        """Rotate ``x`` (batch, heads, seq_len, d_head) whose positions are ``offset … offset + seq_len - 1``
        (``offset`` an int or a one-element tensor, as in :meth:`Embeddings.forward`)."""
        seq_len = x.size(-2)
        if isinstance(offset, int) and offset + seq_len > self.max_positions:
            raise ValueError(f"RotaryPositions: position {offset + seq_len - 1} is beyond "
                             f"model.max_positions={self.max_positions}")
        if isinstance(offset, int):
            cos, sin = self.cos_sin[:, offset : offset + seq_len].to(x.dtype)  # 2 x (seq_len, half)
        else:
            cos, sin = self.cos_sin.index_select(1, position_ids(offset, seq_len, x.device)).to(x.dtype)
        first, second = x.chunk(2, dim=-1)  # the two coordinates of every pair: (batch, heads, seq_len, half)
        return torch.cat([first * cos - second * sin, first * sin + second * cos], dim=-1)


class RelativePositions(nn.Module):
    """Key-side relative position representations (Shaw et al., 2018) for one self-attention layer.

    A learned vector ``r_d`` (d_head) per distance ``d = j - i`` clipped to ``[-max_distance, max_distance]``
    adds ``q_i · r_{clip(j - i)}`` to the score of query ``i`` and key ``j``. The heads of a layer share the
    table (as in the paper), so it costs ``(2·max_distance + 1)·d_head`` parameters per layer. Only the
    keys side: the paper found the values side added nothing for translation.
    """

    def __init__(self, d_head: int, max_distance: int) -> None:
        super().__init__()
        self.max_distance = max_distance
        self.table = nn.Parameter(torch.empty(2 * max_distance + 1, d_head))  # row d + max_distance = r_d
        nn.init.normal_(self.table, mean=0.0, std=0.02)

    def forward(self, query: Tensor, k_len: int, offset: int | Tensor = 0) -> Tensor:
        """The relative score term of ``query`` (batch, heads, q_len, d_head) at positions ``offset …``
        against keys at positions ``0 … k_len - 1``.

        Returns:
            (batch, heads, q_len, k_len): ``q_i · r_{clip(j - i)}``, unscaled.
        """
        batch, heads, q_len, _ = query.shape
        q_pos = position_ids(offset, q_len, query.device)
        k_pos = torch.arange(k_len, device=query.device)
        distance = (k_pos[None, :] - q_pos[:, None]).clamp(-self.max_distance, self.max_distance)  # (q_len, k_len)
        per_distance = query @ self.table.to(query.dtype).t()  # (batch, heads, q_len, 2·max_distance + 1)
        index = (distance + self.max_distance).expand(batch, heads, q_len, k_len)
        return per_distance.gather(-1, index)
