"""The CPU dropout: its drop rate, scaling, gradient, seeding and modes."""

from __future__ import annotations

import pytest
import torch

from transformer.model.dropout import Dropout, dropout


@pytest.mark.parametrize("p", [0.1, 0.2, 0.5, 0.9])
def test_drops_at_rate_p_and_scales_the_rest_to_keep_the_mean(p: float) -> None:
    torch.manual_seed(0)
    x = torch.ones(1_000, 1_003)  # an odd size: the last int64 of random bits is only partly used
    y = dropout(x, p)
    kept = y != 0
    dropped_levels = round(p * 65536)
    assert torch.all(y[kept] == 65536 / (65536 - dropped_levels))  # one exact scale for every kept element
    # binomial standard deviation over 1M elements is at most 0.0005; each of the 4 int16s of an int64 is used
    for lane in range(4):
        assert kept.flatten()[lane::4].float().mean().item() == pytest.approx(1 - p, abs=0.004)
    assert y.mean().item() == pytest.approx(1.0, abs=0.01 / (1 - p))


def test_gradient_passes_through_the_kept_elements_with_the_same_scale() -> None:
    torch.manual_seed(1)
    x = torch.randn(64, 33, requires_grad=True)
    y = dropout(x, 0.3)
    upstream = torch.randn(64, 33)
    y.backward(upstream)
    scale = 65536 / (65536 - round(0.3 * 65536))
    mask = (y != 0).float()  # x has no exact zeros
    torch.testing.assert_close(y, x.detach() * mask * scale)
    torch.testing.assert_close(x.grad, upstream * mask * scale)


def test_the_seed_fixes_the_mask_and_later_calls_draw_new_ones() -> None:
    x = torch.ones(4, 100)
    torch.manual_seed(7)
    first, second = dropout(x, 0.5), dropout(x, 0.5)
    torch.manual_seed(7)
    assert torch.equal(dropout(x, 0.5), first)
    assert not torch.equal(first, second)


def test_module_is_identity_in_eval_mode_and_at_p_zero() -> None:
    x = torch.randn(3, 5)
    module = Dropout(0.4)
    assert module.eval()(x) is x
    assert Dropout(0.0).train()(x) is x
    assert (module.train()(torch.ones(100, 100)) == 0).any()
    assert repr(module) == "Dropout(p=0.4)"


@pytest.mark.parametrize("p", [-0.1, 1.0, 1.5])
def test_rejects_probabilities_outside_zero_one(p: float) -> None:
    with pytest.raises(ValueError, match="dropout probability"):
        Dropout(p)
    with pytest.raises(ValueError, match="dropout probability"):
        dropout(torch.ones(2), p)


def test_a_probability_within_two_to_the_minus_17_of_one_drops_nearly_everything_and_scales_the_rest() -> None:
    torch.manual_seed(2)  # round(p · 2^16) is 2^16 here: the 16-bit draws cannot express the keep rate
    x = torch.ones(4_000_000)  # 20 kept on average
    y = dropout(x, 0.999995)
    kept = y[y != 0]
    assert 1 <= kept.numel() <= 60 and torch.allclose(kept, torch.full_like(kept, 1 / (1 - 0.999995)))
