"""Data-parallel process groups under ``torchrun``; every helper is a no-op in a single process.

``torchrun --nproc_per_node N`` sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT;
:func:`init_distributed` reads them and joins the group (gloo on CPU, NCCL on CUDA). Without them (or with
WORLD_SIZE=1) no process group is created and the collectives below return their input.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from transformer.runtime import choose_device


@dataclass(frozen=True)
class DistContext:
    """Where this process sits in the data-parallel group."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    is_main: bool  # rank 0: the only process that logs, validates and writes files

    @classmethod
    def single(cls, device: torch.device) -> DistContext:
        """The one process of a run without torchrun."""
        return cls(rank=0, world_size=1, local_rank=0, device=device, is_main=True)

    def barrier(self) -> None:
        """Wait for every rank (no-op in a single process)."""
        barrier()


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    if value is None:
        return default
    try:
        return int(value)
    except ValueError as exc:
        raise ValueError(f"environment variable {name}={value!r} is not an integer") from exc


def is_active() -> bool:
    """Whether a process group with more than one process is running."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def init_distributed(device_kind: str | torch.device) -> DistContext:
    """Join the torchrun process group if there is one; otherwise describe a single process.

    Args:
        device_kind: the device setting (``auto``, ``cpu``, ``cuda``, ``cuda:N``). Under torchrun the CUDA
            device is ``cuda:LOCAL_RANK``, so ``cuda:N`` is refused there.
    """
    device_kind = str(device_kind)
    world_size = _env_int("WORLD_SIZE", 1)
    rank = _env_int("RANK", 0)
    local_rank = _env_int("LOCAL_RANK", 0)
    if world_size <= 1:
        return DistContext.single(choose_device(device_kind))
    device = choose_device(device_kind)
    if device.type == "cuda":
        if device.index is not None and device_kind != "auto":
            raise ValueError(f"device={device_kind!r} under torchrun: use device=cuda "
                             "(each rank takes cuda:LOCAL_RANK)")
        if local_rank >= torch.cuda.device_count():
            raise ValueError(f"torchrun started local rank {local_rank} but only {torch.cuda.device_count()} GPU(s) "
                             "are visible: start at most one process per GPU (--nproc_per_node), or use device=cpu")
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    backend = "nccl" if device.type == "cuda" else "gloo"
    if not dist.is_initialized():
        # Long timeout: the other ranks wait while rank 0 validates (beam search over the validation set).
        timeout = datetime.timedelta(minutes=60)
        # torchrun --max-restarts starts a new group on the same store, where the killed group's addresses are
        # still published: each attempt gets keys of its own, else a rank may dial a dead process's port.
        store, rank, world_size = next(dist.rendezvous("env://", rank, world_size, timeout=timeout))
        attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        dist.init_process_group(backend=backend, store=dist.PrefixStore(f"attempt_{attempt}", store), rank=rank,
                                world_size=world_size, timeout=timeout)
    return DistContext(rank=rank, world_size=world_size, local_rank=local_rank, device=device, is_main=rank == 0)


def cleanup() -> None:
    """Leave the process group (if one was joined)."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def _collective_device() -> torch.device:
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def all_reduce_sum(value: torch.Tensor | float) -> torch.Tensor | float:
    """Sum over ranks. Tensors are reduced in place and returned; floats come back as floats."""
    if not is_active():
        return value
    if isinstance(value, torch.Tensor):
        dist.all_reduce(value, op=dist.ReduceOp.SUM)
        return value
    tensor = torch.tensor([float(value)], dtype=torch.float64, device=_collective_device())
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return float(tensor.item())


def broadcast_object(obj: object, src: int = 0) -> object:
    """Rank ``src``'s ``obj`` on every rank (picklable objects)."""
    if not is_active():
        return obj
    holder = [obj]
    dist.broadcast_object_list(holder, src=src)
    return holder[0]


def all_gather_object(obj: object) -> list:
    """Every rank's ``obj``, indexed by rank."""
    if not is_active():
        return [obj]
    gathered: list = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, obj)
    return gathered


def barrier() -> None:
    """Wait for every rank."""
    if is_active():
        dist.barrier()
