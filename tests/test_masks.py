"""Mask builders: shapes, polarity (True = may attend), and hand-written expected patterns; masks readied once for
every layer give the plain masks' numbers."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from transformer.config import ModelConfig
from transformer.model.attention import scaled_dot_product_attention
from transformer.model.masks import (
    KeyMask,
    cached_decoder_self_mask,
    causal_mask,
    decoder_self_mask,
    key_mask,
    padding_mask,
)
from transformer.model.transformer import build_model

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


def test_a_readied_mask_gives_every_key_to_the_rows_that_have_none() -> None:
    mask = torch.tensor([[True, False, True], [False, False, False]])[None, None]  # (1, 1, 2, 3): row 1 sees nothing
    ready = key_mask(mask)
    assert ready.allowed is mask
    assert ready.has_key.flatten().tolist() == [True, False]
    assert ready.safe[0, 0].tolist() == [[True, False, True], [True, True, True]]
    assert key_mask(ready) is ready
    promised = KeyMask.with_a_key_in_every_row(mask[..., :1, :])
    assert promised.safe is promised.allowed and promised.has_key is None


@pytest.mark.parametrize("need_weights", [True, False])
def test_attention_with_a_readied_mask_equals_it_with_the_plain_mask(need_weights: bool) -> None:
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 4, 5) for _ in range(3))
    mask = padding_mask(torch.tensor([[PAD] * 4, [4, 5, PAD, PAD]]), PAD)  # an empty source, a padded one
    plain, plain_weights = scaled_dot_product_attention(q, k, v, mask, need_weights=need_weights)
    readied, readied_weights = scaled_dot_product_attention(q, k, v, key_mask(mask), need_weights=need_weights)
    assert torch.equal(readied, plain) and torch.equal(plain[0], torch.zeros(3, 4, 5))
    if need_weights:
        assert torch.equal(readied_weights, plain_weights)


class _Anys(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += func.overloadpacket is torch.ops.aten.any
        return func(*args, **(kwargs or {}))


def test_the_encoder_and_the_decoder_ready_each_mask_once_for_all_their_layers() -> None:
    cfg = ModelConfig(d_model=16, n_heads=2, d_ff=32, n_encoder_layers=3, n_decoder_layers=3, dropout=0.0,
                      attention_dropout=0.0)
    model = build_model(cfg, 20, 20, PAD).eval()
    src, tgt = torch.tensor([[4, 5, 6, PAD], [4, 5, 6, 7]]), torch.tensor([[1, 4, 5], [1, 4, PAD]])
    counter = _Anys()
    with counter, torch.no_grad():
        encoded = model.encode(src)
    assert counter.count == 1  # not one per layer
    counter.count = 0
    with counter, torch.no_grad():
        model.decode(tgt, encoded)
    assert counter.count == 2  # the self-attention mask and the source mask
