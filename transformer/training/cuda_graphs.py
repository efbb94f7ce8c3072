"""The whole training step as one CUDA graph per batch shape (``training.cuda_graphs``).

For a model the size of ``small``, a step's GPU work takes a few milliseconds, but launching its ~700 kernels
one by one from Python takes several times that (docs/RESULTS.md, "On one H100"). A CUDA graph records the
kernels of a step once and replays them all with one launch. A graph replays fixed shapes at fixed addresses
and takes no decision on the host, so the step is written for that (``TrainStep`` with ``cuda_graphs``):

- a batch's shape depends only on its padded lengths: rows are filled up to what the token budget holds
  (``collate_arrays(fill_to_tokens=...)``), and the batch is copied into that shape's input buffers;
- the loss projects every position and weights the padding by zero (the objective's ``dense``), instead of gathering a
  number of positions that changes from batch to batch;
- the learning rate and the loss scale (1 / target tokens) are device tensors that the graph reads; AdamW runs
  with ``capturable=True`` and skips a non-finite update on the device (``found_inf``);
- the gradients are allocated once, before the first recording, and every graph zeroes and fills the same
  tensors; the graphs' intermediate tensors share one memory pool, as graphs never run at the same time.

A shape is recorded when its first batch comes: two warm-up steps with the update skipped (they create the
optimizer state and let cuBLAS and autocast set up, and change no weight and no optimizer moment) on a side
stream, then the recording. The random state is put back after the warm-up, so dropout draws continue as if it
had not happened, and a replay advances it as an eager step would.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor

log = logging.getLogger(__name__)

# (src, tgt_in, tgt_out, loss scale, skip the update) -> the step's statistics (4,)
StepBody = Callable[[Tensor, Tensor, Tensor, Tensor, bool], Tensor]

WARMUP_STEPS = 2


@dataclass
class _Recorded:
    """One batch shape's input buffers, its graph (None when not recording) and the statistics it writes."""

    inputs: tuple[Tensor, Tensor, Tensor, Tensor]  # src, tgt_in, tgt_out, scale
    graph: torch.cuda.CUDAGraph | None
    stats: Tensor | None


class StepGraphs:
    """Runs ``body`` on per-shape input buffers: as a recorded CUDA graph, or with ``record=False`` eagerly
    on the same path, warm-up included (how the CPU tests check everything but the recording itself)."""

    def __init__(self, body: StepBody, device: torch.device, *, record: bool) -> None:
        if record and device.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA device, got {device}")
        self._body = body
        self.device = device
        self.record = record
        self._shapes: dict[tuple[tuple[int, ...], ...], _Recorded] = {}
        self._pool = torch.cuda.graph_pool_handle() if record else None
        self._capture_stream = torch.cuda.Stream(device) if record else None  # one for all: they share the pool

    @property
    def n_shapes(self) -> int:
        """Batch shapes seen so far (graphs recorded, when recording)."""
        return len(self._shapes)

    def __call__(self, src: Tensor, tgt_in: Tensor, tgt_out: Tensor, scale: float) -> Tensor:
        """One training step on this batch (host tensors, pinned for an asynchronous copy); its statistics, in a
        tensor that the next call may overwrite (graphs share their memory)."""
        key = (tuple(src.shape), tuple(tgt_in.shape))
        recorded = self._shapes.get(key)
        with _on(self.device):  # a graph records the current device's streams: make it the run's device
            if recorded is None:
                recorded = self._shapes[key] = self._prepare(src, tgt_in, tgt_out)
            for buffer, value in zip(recorded.inputs[:3], (src, tgt_in, tgt_out)):
                buffer.copy_(value, non_blocking=True)
            recorded.inputs[3].fill_(scale)
            if recorded.graph is None:
                return self._body(*recorded.inputs, False)
            recorded.graph.replay()
        return recorded.stats

    def release(self) -> None:
        """Drop the graphs and give their memory pool back (after training: validation and decoding need it);
        a later call records again."""
        self._shapes.clear()
        if self.record:
            self._pool = torch.cuda.graph_pool_handle()
            torch.cuda.empty_cache()

    def _prepare(self, src: Tensor, tgt_in: Tensor, tgt_out: Tensor) -> _Recorded:
        """Input buffers for a new shape (holding this batch), the warm-up, and the recording."""
        inputs = (*(t.to(self.device, copy=True) for t in (src, tgt_in, tgt_out)),
                  torch.ones((), device=self.device))
        rng = _rng_state(self.device)
        if not self.record:
            self._warm_up(inputs)
            _set_rng_state(self.device, rng)
            return _Recorded(inputs, None, None)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            self._warm_up(inputs)
        torch.cuda.current_stream(self.device).wait_stream(side)
        _set_rng_state(self.device, rng)
        graph = torch.cuda.CUDAGraph()
        # thread_local: the batch prefetcher keeps pinning host memory in its thread meanwhile, which the default
        # ("global") mode would count as an unsafe call during the capture
        with torch.cuda.graph(graph, pool=self._pool, stream=self._capture_stream, capture_error_mode="thread_local"):
            stats = self._body(*inputs, False)
        log.debug("recorded a CUDA graph of the training step for batch shape src %s, tgt %s (%d shapes so far; "
                  "%.0f MiB reserved)", tuple(src.shape), tuple(tgt_in.shape), len(self._shapes) + 1,
                  torch.cuda.memory_reserved(self.device) / 2**20)
        return _Recorded(inputs, graph, stats)

    def _warm_up(self, inputs: tuple[Tensor, ...]) -> None:
        with warnings.catch_warnings():  # AdamW warns once that a capturable optimizer steps outside a graph
            warnings.filterwarnings("ignore", message=".*capturable=True.*")
            for _ in range(WARMUP_STEPS):
                self._body(*inputs, True)


def _on(device: torch.device) -> contextlib.AbstractContextManager:
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


def _rng_state(device: torch.device) -> Tensor:
    return torch.cuda.get_rng_state(device) if device.type == "cuda" else torch.get_rng_state()


def _set_rng_state(device: torch.device, state: Tensor) -> None:
    if device.type == "cuda":
        torch.cuda.set_rng_state(state, device)
    else:
        torch.set_rng_state(state)

