"""AdamW parameter groups and learning-rate schedules as pure functions of the step.

Steps count from 1: ``learning_rate(1, ...)`` is the rate of the first optimizer update. The trainer sets
the rate on every step, so resuming needs only the step number (no scheduler object to save).

``inverse_sqrt`` with ``lr = d_model ** -0.5 * warmup_steps ** -0.5`` is exactly the schedule of Vaswani et
al. (2017, section 5.3), ``d_model ** -0.5 * min(step ** -0.5, step * warmup ** -1.5)``:
``lr * min(step / w, sqrt(w / step)) = d ** -0.5 * min(step * w ** -1.5, step ** -0.5)``.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from transformer.config import Schedule, TrainingConfig
from transformer.model.embeddings import RelativePositions

# Modules whose weights are scales/lookup tables, not projections: no weight decay for them.
_NO_DECAY_MODULES = (nn.Embedding, RelativePositions, nn.LayerNorm, nn.RMSNorm, nn.GroupNorm, nn.BatchNorm1d)


def learning_rate(
    step: int, *, schedule: Schedule, lr: float, warmup_steps: int, max_steps: int | None, min_lr: float
) -> float:
    """The learning rate of optimizer step ``step`` (1-based).

    All schedules rise linearly to ``lr`` at ``step == warmup_steps`` (``warmup_steps = 0``: no warm-up).
      * ``inverse_sqrt``: ``lr * min(step / warmup, sqrt(warmup / step))``; with no warm-up,
        ``lr / sqrt(step)``.
      * ``cosine``: after warm-up, ``min_lr + (lr - min_lr) * (1 + cos(pi * progress)) / 2`` with
        ``progress`` going from 0 at the end of warm-up to 1 at ``max_steps`` (flat at ``min_lr`` after).
      * ``constant``: flat at ``lr`` after warm-up.
    """
    if step < 1:
        raise ValueError(f"steps count from 1, got step={step}")
    warmup = max(warmup_steps, 0)
    if warmup > 0 and step < warmup:
        return lr * step / warmup
    if schedule is Schedule.inverse_sqrt:
        return lr * math.sqrt(max(warmup, 1) / step)
    if schedule is Schedule.constant:
        return lr
    if schedule is Schedule.cosine:
        if max_steps is None:
            raise ValueError("the cosine schedule needs max_steps")
        span = max(max_steps - warmup, 1)
        progress = min((step - warmup) / span, 1.0)
        return min_lr + (lr - min_lr) * 0.5 * (1.0 + math.cos(math.pi * progress))
    raise ValueError(f"unknown schedule {schedule!r}; choose one of {[s.value for s in Schedule]}")


def scheduled_rate(cfg: TrainingConfig, step: int, schedule_steps: int) -> float:
    """:func:`learning_rate` of step ``step`` under ``cfg``'s schedule, a decaying one reaching ``min_lr`` at
    ``schedule_steps``."""
    return learning_rate(step, schedule=cfg.schedule, lr=cfg.lr, warmup_steps=cfg.warmup_steps,
                         max_steps=schedule_steps, min_lr=cfg.min_lr)


def parameter_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Split trainable parameters into a decayed group and a non-decayed group.

    Decayed: parameters with >= 2 dimensions (projection matrices). Not decayed: biases, normalisation
    scales and embedding tables (a tied output projection shares the embedding matrix, so it follows the
    embedding). Frozen parameters (``requires_grad=False``, e.g. frozen GloVe) are left out entirely.
    """
    no_decay_ids: set[int] = set()
    for module in model.modules():
        if isinstance(module, _NO_DECAY_MODULES):
            no_decay_ids.update(id(p) for p in module.parameters(recurse=False))
    decay, no_decay = [], []
    for param in model.parameters():  # yields each shared (tied) parameter once
        if not param.requires_grad:
            continue
        if param.ndim >= 2 and id(param) not in no_decay_ids:
            decay.append(param)
        else:
            no_decay.append(param)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return [group for group in groups if group["params"]]


def build_optimizer(model: nn.Module, cfg: TrainingConfig) -> torch.optim.Optimizer:
    """AdamW over the trainable parameters with ``cfg.betas``, ``cfg.eps`` and ``cfg.weight_decay``.

    The initial rate is ``cfg.lr``; the trainer overwrites it every step with :func:`learning_rate`. The
    update runs as one fused kernel over all parameters (PyTorch's ``fused=True``, CPU and CUDA).
    """
    groups = parameter_groups(model, cfg.weight_decay)
    if not groups:
        raise ValueError("the model has no trainable parameters (all have requires_grad=False)")
    beta1, beta2 = cfg.betas
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(beta1, beta2), eps=cfg.eps, fused=True)


def set_learning_rate(optimizer: torch.optim.Optimizer, value: float) -> None:
    """Set the same learning rate on every parameter group (in place where it is a tensor: see
    :func:`set_capturable`)."""
    for group in optimizer.param_groups:
        if isinstance(group["lr"], torch.Tensor):
            group["lr"].fill_(value)
        else:
            group["lr"] = value


def set_capturable(optimizer: torch.optim.Optimizer, device: torch.device | None) -> None:
    """Ready AdamW for steps recorded in a CUDA graph on ``device``: ``capturable``, and the learning rate a
    tensor there that the graph reads and :func:`set_learning_rate` fills; or, with ``None``, for eager steps
    (a float rate). Call it again after ``load_state_dict``, which restores the saved run's settings."""
    for group in optimizer.param_groups:
        lr = float(group["lr"])
        group["capturable"] = device is not None
        group["lr"] = lr if device is None else torch.tensor(lr, device=device)
