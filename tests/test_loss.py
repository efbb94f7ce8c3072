"""Label-smoothed cross-entropy against a hand computation and F.cross_entropy; the fused projection + loss."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from transformer.training.loss import label_smoothed_cross_entropy, label_smoothed_sums, projected_label_smoothed_sums

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


def _projection_problem(dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    torch.manual_seed(0)
    hidden = torch.randn(4, 6, 5, dtype=dtype, requires_grad=True)
    weight = torch.randn(11, 5, dtype=dtype, requires_grad=True)
    bias = torch.randn(11, dtype=dtype, requires_grad=True)
    target = torch.randint(1, 11, (4, 6))
    target[0, 2:] = PAD
    target[3, 5:] = PAD
    return hidden, weight, bias, target


@pytest.mark.parametrize("chunk_size, dense", [(1, False), (4, False), (64, False), (4, True), (64, True)])
def test_fused_projection_loss_equals_logits_then_loss_in_value_and_gradient(chunk_size, dense):
    hidden, weight, bias, target = _projection_problem(torch.float32)
    reference = label_smoothed_sums(F.linear(hidden, weight, bias), target, smoothing=0.2, pad_id=PAD)
    (reference[0] * 0.7).backward()
    expected_grads = [t.grad.clone() for t in (hidden, weight, bias)]
    for t in (hidden, weight, bias):
        t.grad = None

    loss_sum, nll_sum = projected_label_smoothed_sums(hidden, weight, bias, target, smoothing=0.2, pad_id=PAD,
                                                      chunk_size=chunk_size, dense=dense)  # dense: padding weighted 0
    (loss_sum * 0.7).backward()
    torch.testing.assert_close(loss_sum, reference[0])
    torch.testing.assert_close(nll_sum, reference[1])
    assert not nll_sum.requires_grad
    for got, expected in zip((hidden.grad, weight.grad, bias.grad), expected_grads):
        torch.testing.assert_close(got, expected)
    assert hidden.grad[0, 2:].abs().sum() == 0  # padding positions get no gradient


def test_fused_projection_loss_passes_gradcheck():
    hidden, weight, bias, target = _projection_problem(torch.float64)  # computed in float64 throughout
    assert torch.autograd.gradcheck(
        lambda h, w, b: projected_label_smoothed_sums(h, w, b, target, smoothing=0.1, pad_id=PAD, chunk_size=5)[0],
        (hidden, weight, bias))


def test_fused_projection_loss_without_bias_or_gradients():
    hidden, weight, _, target = _projection_problem(torch.float32)
    reference = label_smoothed_sums(F.linear(hidden, weight), target, smoothing=0.1, pad_id=PAD)
    with torch.no_grad():
        fused = projected_label_smoothed_sums(hidden, weight, None, target, smoothing=0.1, pad_id=PAD)
    torch.testing.assert_close(fused, reference)


def _r_drop_reference(hidden, weight, bias, target, smoothing, alpha):
    """R-Drop written plainly with autograd: rows b and 2 + b of a (4, ...) batch are the two passes of pair b."""
    log_p = F.log_softmax(F.linear(hidden, weight, bias), dim=-1)  # (4, tgt_len, vocab)
    keep = target[:2].ne(PAD)
    a, b, gold = log_p[:2], log_p[2:], target[:2].unsqueeze(-1)

    def cross_entropy(log_q):
        return -(1 - smoothing) * log_q.gather(-1, gold).squeeze(-1) - smoothing * log_q.mean(-1)

    kl = (a.exp() * (a - b)).sum(-1) + (b.exp() * (b - a)).sum(-1)  # KL12 + KL21
    loss = 0.5 * (cross_entropy(a) + cross_entropy(b) + alpha * kl / 2)  # half the paper's: ce1 + ce2 + alpha * KL
    nll = -0.5 * (a.gather(-1, gold) + b.gather(-1, gold)).squeeze(-1)
    return loss[keep].sum(), nll[keep].sum()


@pytest.mark.parametrize("dense, chunk_size", [(False, 3), (False, 64), (True, 5), (True, 1)])
def test_r_drop_loss_equals_its_plain_autograd_form_in_value_and_gradient(dense, chunk_size):
    hidden, weight, bias, target = _projection_problem(torch.float64)
    target = torch.cat([target[:2], target[:2]])  # rows 2, 3 repeat rows 0, 1 (other hidden states: other dropout)
    expected = _r_drop_reference(hidden, weight, bias, target, smoothing=0.1, alpha=3.0)
    expected_grads = torch.autograd.grad(expected[0], (hidden, weight, bias))
    positions = None if dense else target.flatten().ne(PAD).nonzero().squeeze(1)
    if positions is not None:  # the model's order: every real position of the first pass, then of the second
        first = positions[positions < target[:2].numel()]
        positions = torch.cat([first, first + target[:2].numel()])
    got = projected_label_smoothed_sums(hidden, weight, bias, target, smoothing=0.1, pad_id=PAD, dense=dense,
                                        positions=positions, chunk_size=chunk_size, consistency=3.0)
    got_grads = torch.autograd.grad(got[0], (hidden, weight, bias))
    for g, e in zip((*got, *got_grads), (*expected, *expected_grads)):
        torch.testing.assert_close(g, e, rtol=1e-10, atol=1e-10)
    assert expected[0] > _r_drop_reference(hidden, weight, bias, target, smoothing=0.1, alpha=0.0)[0]  # KL > 0


def test_r_drop_of_identical_passes_is_the_plain_loss():
    """Without dropout both passes agree: the KL term and its gradient vanish."""
    hidden, weight, bias, target = _projection_problem(torch.float64)
    plain = projected_label_smoothed_sums(hidden, weight, bias, target, smoothing=0.1, pad_id=PAD)
    plain_grads = torch.autograd.grad(plain[0], (hidden, weight, bias))
    twice = projected_label_smoothed_sums(torch.cat([hidden, hidden]), weight, bias, torch.cat([target, target]),
                                          smoothing=0.1, pad_id=PAD, dense=True, consistency=5.0)
    twice_grads = torch.autograd.grad(twice[0], (hidden, weight, bias))
    torch.testing.assert_close(twice, plain, rtol=1e-12, atol=1e-12)
    for g, e in zip(twice_grads, plain_grads):
        torch.testing.assert_close(g, e, rtol=1e-12, atol=1e-12)
