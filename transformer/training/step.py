"""One optimizer step: micro-batches, loss normalisation, autocast, clipping, and the skip of a bad update.

Loss normalisation: the gradient of one optimizer step is the mean over *all* target tokens of the step,
i.e. over every micro-batch (``accumulate``) on every rank. The token count is summed before the backward
passes, so a 2-rank run equals a 1-rank run with ``accumulate=2`` over the same batches.

No device-to-host wait: the step's statistics stay on the device (the trainer reads them only at its
checks), and a non-finite loss or gradient norm never reaches the weights: the fused optimizer skips that
update on the device (the flag PyTorch's GradScaler uses); an unfused one is asked on the host.

With ``training.cuda_graphs`` the same update runs as one recorded CUDA graph per batch shape
(:mod:`transformer.training.cuda_graphs`): batches come filled to a fixed shape per padded length, and the loss is
computed densely over every position with the padding weighted by zero.
"""

from __future__ import annotations

import contextlib
from typing import Protocol

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from transformer.config import ConfigError, TrainingConfig
from transformer.runtime import autocast, compile_for_training
from transformer.training import distributed
from transformer.training.cuda_graphs import StepGraphs
from transformer.training.distributed import DistContext
from transformer.training.loss import CPU_LOSS_CHUNK, GPU_LOSS_CHUNK
from transformer.training.objective import TranslationObjective
from transformer.training.optim import set_capturable

# A micro-batch on the device: src, tgt_in, tgt_out, and the real target positions (None with the dense loss)
_DeviceBatch = tuple[torch.Tensor, torch.Tensor, torch.Tensor, "torch.Tensor | None"]


class BatchLike(Protocol):
    src: torch.Tensor  # (batch, src_len)
    tgt_in: torch.Tensor  # (batch, tgt_len)
    tgt_out: torch.Tensor  # (batch, tgt_len)
    target_positions: torch.Tensor  # (n_tgt_tokens,) flat indices of real tgt_out positions
    n_tgt_tokens: int

    def to(self, device: torch.device, non_blocking: bool = False) -> BatchLike: ...

    def pin_memory(self) -> BatchLike: ...


def loss_chunk(cfg: TrainingConfig, device: torch.device) -> int:
    """Target positions per chunk of the fused projection and loss: a CPU's or a GPU's size, or with
    ``training.compile`` every batch in one chunk, its R-Drop passes included (a loop over chunks would pin the
    batch's size in the compiled code, which would then compile again for each new size)."""
    chunk = CPU_LOSS_CHUNK if device.type == "cpu" else GPU_LOSS_CHUNK
    return max(chunk, 2 * cfg.max_tokens) if cfg.compile else chunk


class TrainStep:
    """Forward and backward of the model's objective over a step's micro-batches, then clip and update; the
    objective (:class:`~transformer.training.objective.TranslationObjective`) is DDP-wrapped when
    ``dist.world_size > 1``, compiled when ``cfg.compile``, replayed from CUDA graphs when ``cfg.cuda_graphs``.
    ``cfg`` must be resolved for ``device`` (``runtime.resolve_training``). ``record_graphs=False`` runs the
    CUDA-graph path eagerly (fixed-shape buffers, dense loss, warm-up), on any device: for tests."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, cfg: TrainingConfig,
                 device: torch.device, dist: DistContext, *, record_graphs: bool = True) -> None:
        self.optimizer = optimizer
        self.cfg = cfg
        self.device = device
        self.dist = dist
        self._skip_on_device = bool(optimizer.defaults.get("fused"))  # the fused step honours found_inf
        if cfg.cuda_graphs:
            self._check_graphable()
        objective = TranslationObjective(model, label_smoothing=cfg.label_smoothing, r_drop=cfg.r_drop,
                                         loss_chunk=loss_chunk(cfg, device))
        self.ddp = self._wrap_ddp(objective) if dist.world_size > 1 else None
        forward_module = self.ddp if self.ddp is not None else objective
        self._forward = compile_for_training(forward_module) if cfg.compile else forward_module
        self._params = [p for p in model.parameters() if p.requires_grad]
        self.graphs: StepGraphs | None = None
        if cfg.cuda_graphs:
            self.graphs = StepGraphs(self._graph_body, device, record=record_graphs)
            if record_graphs:
                set_capturable(optimizer, device)

    def _check_graphable(self) -> None:
        """What only the step knows: the number of processes and the optimizer (the config checked the rest)."""
        if self.dist.world_size > 1:
            raise ConfigError(f"training.cuda_graphs: needs one process (DDP's gradient hooks are not recorded); "
                              f"torchrun started {self.dist.world_size}")
        if not self._skip_on_device:
            raise ConfigError("training.cuda_graphs: needs the fused AdamW, which skips a bad update on the device")

    def load_optimizer_state(self, state: dict) -> None:
        """``optimizer.load_state_dict`` (a checkpoint keeps the saved run's learning-rate form), then the form
        this step needs."""
        if self.graphs is not None and self.graphs.n_shapes:
            raise RuntimeError("load the optimizer state before the first step: recorded graphs read the old rate")
        self.optimizer.load_state_dict(state)
        record = self.graphs is not None and self.graphs.record
        set_capturable(self.optimizer, self.device if record else None)

    def _wrap_ddp(self, objective: nn.Module) -> DistributedDataParallel:
        device_ids = [self.device.index] if self.device.type == "cuda" else None
        return DistributedDataParallel(objective, device_ids=device_ids)

    def __call__(self, batches: list[BatchLike]) -> tuple[torch.Tensor, int]:
        """One optimizer step over the collated micro-batches ``batches`` at the optimizer's current rate.

        Returns:
            The step's statistics on the device, (4,): loss sum and NLL sum (this rank), 1.0 if the loss or the
            gradient norm is not finite (then the update was skipped), the gradient norm before clipping; and
            this rank's target token count.
        """
        local_tokens = sum(b.n_tgt_tokens for b in batches)
        if local_tokens <= 0:
            raise ValueError("the step's batches hold no target tokens")
        tokens: torch.Tensor | float = float(local_tokens)
        if self.dist.world_size > 1:  # stays on the device: no wait for the sum
            tokens = distributed.all_reduce_sum(torch.tensor(tokens, device=self.device))
        scale = self.dist.world_size / tokens  # DDP averages gradients over ranks; undo that, then per token
        if self.graphs is not None:
            (batch,) = batches
            return self.graphs(batch.src, batch.tgt_in, batch.tgt_out, float(scale)), local_tokens
        on_device = [batch.to(self.device, non_blocking=True) for batch in batches]
        return self._update([(b.src, b.tgt_in, b.tgt_out, b.target_positions) for b in on_device], scale), local_tokens

    def _graph_body(self, src: torch.Tensor, tgt_in: torch.Tensor, tgt_out: torch.Tensor, scale: torch.Tensor,
                    skip_update: bool) -> torch.Tensor:
        """The update as :class:`StepGraphs` records it: fixed-shape inputs, the dense loss."""
        return self._update([(src, tgt_in, tgt_out, None)], scale, dense=True, skip_update=skip_update)

    def _update(self, batches: list[_DeviceBatch], scale: torch.Tensor | float, dense: bool = False,
                skip_update: bool = False) -> torch.Tensor:
        """Gradients of the step's micro-batches, clipping and the optimizer step; the statistics (4,).

        ``dense`` computes the loss over every position, the padding weighted by zero (fixed shapes for a graph).
        ``skip_update`` computes everything but leaves weights and optimizer state as they are (the warm-up
        before a CUDA graph is recorded).
        """
        self.optimizer.zero_grad(set_to_none=self.graphs is None)  # the graphs reuse one set of gradients
        sums = torch.zeros(2, device=self.device)  # (loss_sum, nll_sum)
        for i, (src, tgt_in, tgt_out, positions) in enumerate(batches):
            last = i == len(batches) - 1
            sync = contextlib.nullcontext() if self.ddp is None or last else self.ddp.no_sync()
            with sync:
                with autocast(self.device, self.cfg.precision):
                    loss_sum, nll_sum = self._forward(src, tgt_in, tgt_out, positions, dense=dense)
                (loss_sum * scale).backward()
            sums += torch.stack([loss_sum.detach(), nll_sum.detach()])
        grad_norm = self._clip_gradients().float().reshape(())
        nonfinite = (~(torch.isfinite(sums[0]) & torch.isfinite(grad_norm))).float()
        self._optimizer_step(torch.ones_like(nonfinite) if skip_update else nonfinite)
        return torch.cat([sums, nonfinite.reshape(1), grad_norm.reshape(1)])

    def _optimizer_step(self, nonfinite: torch.Tensor) -> None:
        """Apply the update unless ``nonfinite`` (a device scalar) is 1: decided on the device for the fused
        optimizer (no wait), on the host otherwise."""
        if self._skip_on_device:
            self.optimizer.found_inf = nonfinite
            self.optimizer.step()
            self.optimizer.found_inf = None  # no later step may read this one's flag (in a graph's memory, say)
        elif not nonfinite.item():
            self.optimizer.step()

    def _clip_gradients(self) -> torch.Tensor:
        """Clip to ``cfg.clip_grad_norm`` (if set); the total norm before clipping either way."""
        if self.cfg.clip_grad_norm is not None:
            return torch.nn.utils.clip_grad_norm_(self._params, self.cfg.clip_grad_norm)
        grads = [p.grad for p in self._params if p.grad is not None]
        return torch.nn.utils.get_total_norm(grads) if grads else torch.zeros((), device=self.device)
