"""The training objective: the fused loss equals the loss of the model's logits, R-Drop pairs each position with
its own second pass, and the wrapper adds no parameters and keeps the model's order."""

from __future__ import annotations

import pytest
import torch

from transformer.config import ModelConfig
from transformer.model.transformer import build_model
from transformer.training.loss import label_smoothed_sums
from transformer.training.objective import TranslationObjective

from toy_training import copy_pairs, tiny_model, toy_collate

PAD, BOS, VOCAB = 0, 1, 13
PAIRS = copy_pairs(12, seed=3)


def _model(tie_output: bool):
    torch.manual_seed(0)
    cfg = ModelConfig(d_model=16, n_heads=2, d_ff=32, n_encoder_layers=2, n_decoder_layers=2, dropout=0.0,
                      attention_dropout=0.0, max_positions=64, share_embeddings=False, tie_output=tie_output)
    return build_model(cfg, VOCAB, VOCAB, PAD).eval()


def _batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    src = torch.tensor([[4, 5, 6, 7, 8], [9, 10, 4, PAD, PAD], [11, PAD, PAD, PAD, PAD]])
    tgt_in = torch.tensor([[BOS, 8, 7, 6, 5, 4], [BOS, 4, 10, 9, PAD, PAD], [BOS, 11, PAD, PAD, PAD, PAD]])
    tgt_out = torch.cat([tgt_in[:, 1:], torch.full((3, 1), PAD)], dim=1).masked_fill(tgt_in == PAD, PAD)
    return src, tgt_in, tgt_out


@pytest.mark.parametrize("tie_output", [True, False])
def test_the_fused_loss_is_the_loss_of_the_models_logits(tie_output: bool) -> None:
    model = _model(tie_output)
    src, tgt_in, tgt_out = _batch()
    weight, bias = model.output_layer()
    expected_weight = model.tgt_token_embedding.weight if tie_output else model.output_proj.weight
    assert weight is expected_weight and bias is None
    reference = label_smoothed_sums(model(src, tgt_in), tgt_out, smoothing=0.1, pad_id=PAD)  # via the logits
    reference_grads = torch.autograd.grad(reference[0], list(model.parameters()), allow_unused=True)
    positions = (tgt_out != PAD).flatten().nonzero().squeeze(1)
    objective = TranslationObjective(model, label_smoothing=0.1, loss_chunk=4)
    for given, dense in ((None, False), (positions, False), (None, True)):
        loss_sum, nll_sum = objective(src, tgt_in, tgt_out, given, dense=dense)
        torch.testing.assert_close((loss_sum, nll_sum), reference)
        grads = torch.autograd.grad(loss_sum, list(model.parameters()), allow_unused=True)
        for g, g_ref in zip(grads, reference_grads):
            assert (g is None) == (g_ref is None) and (g is None or torch.allclose(g, g_ref, atol=1e-5))


def test_r_drop_pairs_each_position_with_its_own_second_pass():
    """With dropout the passes differ; the gathered loss (target positions doubled by the objective) must pair the
    same positions as the dense one, which needs no positions: equal losses from equal dropout draws."""
    model = tiny_model(seed=0, dropout=0.3).train()
    batch = toy_collate(PAIRS, list(range(12)))
    r_drop = TranslationObjective(model, label_smoothing=0.1, r_drop=2.0)
    losses = []
    for dense in (False, True):
        torch.manual_seed(5)
        loss_sum, _ = r_drop(batch.src, batch.tgt_in, batch.tgt_out, batch.target_positions, dense=dense)
        losses.append(loss_sum)
    torch.manual_seed(5)
    plain, _ = TranslationObjective(model, label_smoothing=0.1)(
        torch.cat([batch.src] * 2), torch.cat([batch.tgt_in] * 2), torch.cat([batch.tgt_out] * 2))
    torch.testing.assert_close(losses[0], losses[1], rtol=1e-5, atol=1e-5)
    assert losses[0] > plain / 2 + 1e-3  # the mean of the two passes' losses, plus a KL term that is not zero


def test_the_objective_holds_the_models_parameters_in_the_models_order():
    """DDP and torch.compile wrap the objective, while the optimizer and checkpoints see the model: both must
    list the same tensors in the same order (Adam's moments are restored by position)."""
    model = _model(tie_output=False)
    objective = TranslationObjective(model, label_smoothing=0.1)
    assert [id(p) for p in objective.parameters()] == [id(p) for p in model.parameters()]
    assert list(objective.state_dict()) == [f"model.{name}" for name in model.state_dict()]
