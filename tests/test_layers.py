"""Feed-forward, residual norm placement, encoder and decoder layers."""

from __future__ import annotations

import pytest
import torch

from transformer.config import Activation, NormPosition
from transformer.model.layers import DecoderLayer, EncoderLayer, FeedForward, LayerSizes, Residual
from transformer.model.masks import causal_mask, padding_mask

PAD = 0


def _sizes(norm: NormPosition = NormPosition.pre) -> LayerSizes:
    return LayerSizes(d_model=8, n_heads=2, d_head=4, d_ff=16, dropout=0.0, attention_dropout=0.0,
                      hidden_dropout=0.0, activation=Activation.relu, norm=norm, max_positions=16)


def test_feed_forward_by_hand() -> None:
    ff = FeedForward(2, 3, dropout=0.0, activation=Activation.relu)
    with torch.no_grad():
        ff.linear1.weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]))
        ff.linear1.bias.copy_(torch.tensor([0.0, -5.0, 0.0]))
        ff.linear2.weight.copy_(torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 2.0]]))
        ff.linear2.bias.zero_()
    # hidden = relu([1, 2-5, 3]) = [1, 0, 3] -> [4, 6]
    assert ff(torch.tensor([[1.0, 2.0]])).tolist() == [[4.0, 6.0]]


def test_residual_pre_and_post_norm_placement() -> None:
    x = torch.tensor([[[1.0, 2.0, 3.0, 6.0]]])
    double = lambda h: 2 * h  # noqa: E731
    pre = Residual(4, 0.0, NormPosition.pre)
    post = Residual(4, 0.0, NormPosition.post)
    ln = torch.nn.functional.layer_norm
    assert torch.allclose(pre.outer(x, double(pre.inner(x))), x + 2 * ln(x, (4,)), atol=1e-6)
    assert torch.allclose(post.outer(x, double(post.inner(x))), ln(3 * x, (4,)), atol=1e-6)


@pytest.mark.parametrize("norm", list(NormPosition))
def test_encoder_layer_ignores_padding_content(norm: NormPosition) -> None:
    torch.manual_seed(0)
    layer = EncoderLayer(_sizes(norm)).eval()
    tokens = torch.tensor([[4, 5, 6, PAD, PAD]])
    mask = padding_mask(tokens, PAD)
    x = torch.randn(1, 5, 8)
    x2 = x.clone()
    x2[:, 3:] = torch.randn(1, 2, 8) * 10  # different garbage at pad positions
    out, weights = layer(x, mask, need_weights=True)
    out2, _ = layer(x2, mask)
    assert torch.allclose(out[:, :3], out2[:, :3], atol=1e-6)
    alone, _ = layer(x[:, :3], None)
    assert torch.allclose(out[:, :3], alone, atol=1e-5)
    assert weights.shape == (1, 2, 5, 5)
    assert torch.equal(weights[..., 3:], torch.zeros(1, 2, 5, 2))
    assert torch.allclose(weights.sum(-1), torch.ones(1, 2, 5), atol=1e-6)


@pytest.mark.parametrize("norm", list(NormPosition))
def test_decoder_layer_is_causal(norm: NormPosition) -> None:
    torch.manual_seed(1)
    layer = DecoderLayer(_sizes(norm)).eval()
    x, memory = torch.randn(2, 6, 8), torch.randn(2, 4, 8)
    later = x.clone()
    later[:, 3:] = torch.randn(2, 3, 8)
    out = layer(x, memory, causal_mask(6), None, need_weights=True)
    out_later = layer(later, memory, causal_mask(6), None)
    assert torch.allclose(out.x[:, :3], out_later.x[:, :3], atol=1e-6)
    assert not torch.allclose(out.x[:, 3:], out_later.x[:, 3:])
    assert out.self_weights.shape == (2, 2, 6, 6) and out.cross_weights.shape == (2, 2, 6, 4)
    assert torch.equal(out.self_weights.triu(1), torch.zeros(2, 2, 6, 6))
    assert out.self_cache is None


def test_post_norm_layer_output_is_normalised() -> None:
    torch.manual_seed(2)
    layer = EncoderLayer(_sizes(NormPosition.post)).eval()
    out, _ = layer(torch.randn(2, 3, 8) * 5 + 3, None)
    assert torch.allclose(out.mean(-1), torch.zeros(2, 3), atol=1e-5)
    assert torch.allclose(out.var(-1, unbiased=False), torch.ones(2, 3), atol=1e-3)
