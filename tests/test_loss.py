"""Label-smoothed cross-entropy against a hand computation and against F.cross_entropy."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from transformer.loss import label_smoothed_cross_entropy, label_smoothed_sums

PAD = 0


def test_matches_hand_computation_on_three_classes():
    # one real position over V = 3 classes with logits (0, ln 2, ln 5): p = (1/8, 2/8, 5/8), gold = 2
    logits = torch.tensor([[[0.0, math.log(2.0), math.log(5.0)], [9.0, 9.0, 9.0]]])
    target = torch.tensor([[2, PAD]])
    eps = 0.3
    # q = (1 - eps) * onehot(2) + eps / 3 everywhere: q = (0.1, 0.1, 0.8)
    expected = -(0.1 * math.log(1 / 8) + 0.1 * math.log(2 / 8) + 0.8 * math.log(5 / 8))
    loss, nll, n = label_smoothed_cross_entropy(logits, target, smoothing=eps, pad_id=PAD)
    assert n == 1
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    assert nll.item() == pytest.approx(-math.log(5 / 8), rel=1e-6)


def test_without_smoothing_equals_cross_entropy_with_ignore_index():
    torch.manual_seed(0)
    logits = torch.randn(3, 5, 7)
    target = torch.randint(1, 7, (3, 5))
    target[0, 3:] = PAD
    target[2, 1:] = PAD
    loss, nll, n = label_smoothed_cross_entropy(logits, target, smoothing=0.0, pad_id=PAD)
    reference = F.cross_entropy(logits.flatten(0, 1), target.flatten(), ignore_index=PAD, reduction="sum")
    assert n == int(target.ne(PAD).sum()) == 9
    torch.testing.assert_close(loss, reference)
    torch.testing.assert_close(nll, reference)


def test_padding_positions_do_not_contribute_or_receive_gradient():
    torch.manual_seed(1)
    logits = torch.randn(2, 4, 6, requires_grad=True)
    target = torch.tensor([[3, 4, PAD, PAD], [5, PAD, PAD, PAD]])
    loss, _, n = label_smoothed_cross_entropy(logits, target, smoothing=0.1, pad_id=PAD)
    loss.backward()
    assert n == 3
    assert logits.grad[0, 2:].abs().sum() == 0 and logits.grad[1, 1:].abs().sum() == 0
    assert logits.grad[0, :2].abs().sum() > 0


def test_float32_under_bf16_autocast():
    torch.manual_seed(2)
    logits = torch.randn(2, 3, 50).bfloat16()
    target = torch.randint(1, 50, (2, 3))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss, nll = label_smoothed_sums(logits, target, smoothing=0.1, pad_id=PAD)
    assert loss.dtype == nll.dtype == torch.float32
    expected, _ = label_smoothed_sums(logits.float(), target, smoothing=0.1, pad_id=PAD)
    torch.testing.assert_close(loss, expected)


def test_rejects_bad_arguments():
    with pytest.raises(ValueError, match="smoothing"):
        label_smoothed_sums(torch.zeros(1, 2, 3), torch.ones(1, 2, dtype=torch.long), smoothing=1.0, pad_id=PAD)
    with pytest.raises(ValueError, match="disagree"):
        label_smoothed_sums(torch.zeros(1, 2, 3), torch.ones(1, 3, dtype=torch.long), smoothing=0.1, pad_id=PAD)
