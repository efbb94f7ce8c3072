"""Learning-rate schedules against their formulas; AdamW parameter groups."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from transformer.config import Schedule, TrainingConfig
from transformer.model.embeddings import RelativePositions
from transformer.training.optim import build_optimizer, learning_rate, parameter_groups


def lr_at(step: int, schedule: Schedule, *, lr=1.0, warmup=4, max_steps=None, min_lr=0.0) -> float:
    return learning_rate(step, schedule=schedule, lr=lr, warmup_steps=warmup, max_steps=max_steps, min_lr=min_lr)


def test_inverse_sqrt_values():
    assert lr_at(1, Schedule.inverse_sqrt, lr=2.0) == pytest.approx(0.5)  # 2 * 1/4
    assert lr_at(4, Schedule.inverse_sqrt, lr=2.0) == pytest.approx(2.0)  # peak at the end of warm-up
    assert lr_at(16, Schedule.inverse_sqrt, lr=2.0) == pytest.approx(1.0)  # 2 * sqrt(4/16)
    assert lr_at(9, Schedule.inverse_sqrt, lr=1.0, warmup=0) == pytest.approx(1 / 3)  # no warm-up: lr / sqrt(step)


def test_inverse_sqrt_reproduces_vaswani_et_al():
    d_model, warmup = 512, 4000
    for step in (1, 100, 3999, 4000, 4001, 10_000, 100_000):
        paper = d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)
        ours = lr_at(step, Schedule.inverse_sqrt, lr=d_model**-0.5 * warmup**-0.5, warmup=warmup)
        assert ours == pytest.approx(paper, rel=1e-12)


def test_cosine_values():
    kwargs = dict(lr=1.0, warmup=10, max_steps=110, min_lr=0.1)
    assert lr_at(5, Schedule.cosine, **kwargs) == pytest.approx(0.5)
    assert lr_at(10, Schedule.cosine, **kwargs) == pytest.approx(1.0)
    assert lr_at(60, Schedule.cosine, **kwargs) == pytest.approx(0.55)  # half-way: (1 + 0.1) / 2
    assert lr_at(110, Schedule.cosine, **kwargs) == pytest.approx(0.1)
    assert lr_at(500, Schedule.cosine, **kwargs) == pytest.approx(0.1)
    assert lr_at(35, Schedule.cosine, **kwargs) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi / 4)))
    with pytest.raises(ValueError, match="max_steps"):
        lr_at(5, Schedule.cosine)


def test_constant_and_step_counting():
    assert [lr_at(s, Schedule.constant, lr=0.8) for s in (1, 2, 4, 1000)] == pytest.approx([0.2, 0.4, 0.8, 0.8])
    with pytest.raises(ValueError, match="from 1"):
        lr_at(0, Schedule.constant)


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.proj = nn.Linear(4, 4)
        self.norm = nn.LayerNorm(4)
        self.out = nn.Linear(4, 10, bias=False)
        self.out.weight = self.embed.weight  # tied
        self.frozen = nn.Linear(4, 4)
        self.frozen.requires_grad_(False)
        self.relative = RelativePositions(4, max_distance=2)  # a lookup table per distance


def test_parameter_groups_decay_only_projection_matrices():
    model = Tiny()
    decay, no_decay = parameter_groups(model, weight_decay=0.1)
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert {id(p) for p in decay["params"]} == {id(model.proj.weight)}
    assert {id(p) for p in no_decay["params"]} == {
        id(model.embed.weight), id(model.proj.bias), id(model.norm.weight), id(model.norm.bias),
        id(model.relative.table)}


def test_build_optimizer_uses_config():
    cfg = TrainingConfig(lr=0.01, betas=[0.8, 0.9], eps=1e-7, weight_decay=0.05)
    optimizer = build_optimizer(Tiny(), cfg)
    assert isinstance(optimizer, torch.optim.AdamW)
    for group in optimizer.param_groups:
        assert group["betas"] == (0.8, 0.9) and group["eps"] == 1e-7 and group["lr"] == 0.01
    frozen = nn.Linear(2, 2).requires_grad_(False)
    with pytest.raises(ValueError, match="no trainable"):
        build_optimizer(frozen, cfg)


def test_optimizer_steps_match_hand_computed_adamw():
    model = nn.Linear(3, 2)
    cfg = TrainingConfig(lr=0.1, betas=[0.9, 0.98], eps=1e-8, weight_decay=0.5)
    optimizer = build_optimizer(model, cfg)
    weight = model.weight.detach().clone()
    m, v = torch.zeros_like(weight), torch.zeros_like(weight)
    for step in (1, 2):
        grad = torch.randn_like(weight)
        model.weight.grad, model.bias.grad = grad.clone(), torch.zeros_like(model.bias)
        optimizer.step()
        m, v = 0.9 * m + 0.1 * grad, 0.98 * v + 0.02 * grad**2
        m_hat, v_hat = m / (1 - 0.9**step), v / (1 - 0.98**step)
        weight = weight * (1 - 0.1 * 0.5) - 0.1 * m_hat / (v_hat.sqrt() + 1e-8)  # decoupled weight decay
        torch.testing.assert_close(model.weight.detach(), weight)
