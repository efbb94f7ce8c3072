"""Mask builders: shapes, polarity (True = may attend), and hand-written expected patterns."""

from __future__ import annotations

import pytest
import torch

from transformer.model.masks import cached_decoder_self_mask, causal_mask, decoder_self_mask, padding_mask

PAD = 0


def test_padding_mask_blocks_pad_keys() -> None:
    tokens = torch.tensor([[5, 6, PAD], [7, PAD, PAD]])
    mask = padding_mask(tokens, PAD)
    assert mask.shape == (2, 1, 1, 3) and mask.dtype == torch.bool
    assert mask[:, 0, 0].tolist() == [[True, True, False], [True, False, False]]


def test_causal_mask_is_lower_triangular() -> None:
    mask = causal_mask(3)
    assert mask.shape == (1, 1, 3, 3)
    assert mask[0, 0].tolist() == [[True, False, False], [True, True, False], [True, True, True]]


def test_causal_mask_with_cached_prefix_is_bottom_right_aligned() -> None:
    mask = causal_mask(2, 4)  # two new queries at positions 2 and 3 of 4
    assert mask[0, 0].tolist() == [[True, True, True, False], [True, True, True, True]]
    assert torch.equal(causal_mask(1, 5)[0, 0], torch.ones(1, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match="k_len=1 must be >= q_len=2"):
        causal_mask(2, 1)


def test_decoder_self_mask_is_causal_and_padding() -> None:
    tgt = torch.tensor([[4, 5, PAD]])
    mask = decoder_self_mask(tgt, PAD)
    assert mask.shape == (1, 1, 3, 3)
    assert mask[0, 0].tolist() == [[True, False, False], [True, True, False], [True, True, False]]


def test_cached_decoder_self_mask_equals_the_last_rows_of_the_full_mask() -> None:
    tgt = torch.tensor([[4, PAD, 5, 6], [4, 5, 6, PAD]])
    full = decoder_self_mask(tgt, PAD)
    cached = cached_decoder_self_mask(2, tgt != PAD)
    assert cached.shape == (2, 1, 2, 4)
    assert torch.equal(cached, full[:, :, 2:, :])


def test_source_padding_mask_broadcasts_over_target_queries() -> None:
    src = torch.tensor([[4, 5, PAD, PAD], [4, 5, 6, 7]])
    mask = padding_mask(src, PAD)  # the cross-attention mask
    assert mask.shape == (2, 1, 1, 4)
    scores = torch.zeros(2, 3, 5, 4)  # (batch, heads, tgt_len, src_len)
    expanded = mask.expand_as(scores)
    assert expanded[0, 2, 4].tolist() == [True, True, False, False]
    assert expanded[1].all()
