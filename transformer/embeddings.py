"""Token embeddings (scaled by √d_model) and sinusoidal or learned positions.

Shape legend: batch, seq_len, d_model, vocab.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from transformer.config import PositionKind
from transformer.dropout import Dropout


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
        self.kind = positions
        self.max_positions = max_positions
        d_model = token.weight.size(1)
        if positions is PositionKind.sinusoidal:
            self.register_buffer("sinusoid", sinusoidal_positions(max_positions, d_model), persistent=False)
            self.learned = None
        elif positions is PositionKind.learned:
            self.learned = nn.Embedding(max_positions, d_model)
            nn.init.normal_(self.learned.weight, mean=0.0, std=0.02)
        else:
            raise ValueError(f"Embeddings: unknown position kind {positions!r}")
        self.dropout = Dropout(dropout)

    def forward(self, tokens: Tensor, offset: int = 0) -> Tensor:
        """Embed ``tokens`` at positions ``offset … offset + seq_len - 1``.

        Args:
            tokens: (batch, seq_len) ids.
            offset: position of the first token (the cache length during incremental decoding).

        Returns:
            (batch, seq_len, d_model).
        """
        seq_len = tokens.size(1)
        if offset + seq_len > self.max_positions:
            raise ValueError(
                f"Embeddings: position {offset + seq_len - 1} is beyond model.max_positions={self.max_positions}; "
                f"shorten the input or raise model.max_positions"
            )
        x = self.token(tokens)  # (batch, seq_len, d_model)
        if self.learned is not None:
            index = torch.arange(offset, offset + seq_len, device=tokens.device)
            x = x + self.learned(index)  # (seq_len, d_model) broadcast over batch
        else:
            x = x + self.sinusoid[offset : offset + seq_len].to(x.dtype)
        return self.dropout(x)
