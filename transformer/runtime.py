"""Process-level runtime choices: seeding, RNG snapshots, device, autocast, threads, determinism.

RNG snapshots cover Python's ``random`` and torch (CPU and every initialised CUDA device). NumPy's global
RNG is not used by this package, so it is neither seeded nor saved.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
from collections.abc import Callable, Iterator
from dataclasses import replace

import torch

from transformer.config import GPU_PAD_MULTIPLE, ConfigError, EvalConfig, Precision, TrainingConfig

log = logging.getLogger(__name__)


def seed_everything(seed: int) -> None:
    """Seed Python's ``random`` and torch (CPU and all CUDA devices)."""
    random.seed(seed)
    torch.manual_seed(seed)  # also seeds every CUDA device


def capture_rng_state() -> dict:
    """A snapshot of every RNG the training loop draws from, in ``weights_only``-loadable types.

    Returns:
        ``{"python": (version, tuple[int, ...], gauss), "torch": ByteTensor, "cuda": list[ByteTensor]}``
        (``"cuda"`` is empty when CUDA is not initialised).
    """
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else []
    return {"python": random.getstate(), "torch": torch.get_rng_state(), "cuda": list(cuda)}


def restore_rng_state(state: dict) -> None:
    """Restore a snapshot made by :func:`capture_rng_state` (possibly after a save/load round trip)."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    torch.set_rng_state(state["torch"].cpu())
    cuda = state["cuda"]
    if cuda:
        if not torch.cuda.is_available():
            log.warning("checkpoint holds CUDA RNG states but CUDA is unavailable; they are ignored")
        elif len(cuda) != torch.cuda.device_count():
            log.warning("checkpoint holds %d CUDA RNG states for %d devices; they are ignored",
                        len(cuda), torch.cuda.device_count())
        else:
            torch.cuda.set_rng_state_all([s.cpu() for s in cuda])


def choose_device(name: str) -> torch.device:
    """Resolve a device setting: ``auto`` (CUDA if available, else CPU), ``cpu``, ``cuda`` or ``cuda:N``."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError as exc:
        raise ConfigError(f"device: {name!r} is not a device; use auto, cpu, cuda or cuda:N") from exc
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"device: {name!r} but CUDA is not available on this machine; use device=cpu or auto")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ConfigError(f"device: {name!r} but only {torch.cuda.device_count()} CUDA device(s) are visible")
    return device


def resolve_training(cfg: TrainingConfig, device: torch.device, world_size: int = 1) -> TrainingConfig:
    """``cfg`` with the settings left unset (None) filled in for ``device`` and ``world_size`` processes.

    A GPU pads batch lengths to multiples of 8 (tensor-core friendly, few distinct shapes to plan kernels
    for); a CPU pads to nothing, since every padded position costs it time. The step is replayed from CUDA
    graphs wherever that can run: one CUDA process, one batch per step, not compiled (6x the eager step's
    tokens/s for the default model on an H200, docs/RESULTS.md); ``compile`` and ``cuda_graphs`` both set record
    the compiled step. Runs record the resolved values, so resuming on another kind of device is refused by key
    instead of silently changing the batches. ``cuda_graphs`` on another device or under torchrun, and
    ``precision=bf16`` on a GPU without bfloat16, are refused here, before any work.
    """
    gpu = device.type == "cuda"
    if cfg.cuda_graphs and not gpu:
        raise ConfigError(f"training.cuda_graphs: needs a CUDA device; this run is on {device}")
    if cfg.cuda_graphs and world_size > 1:
        raise ConfigError(f"training.cuda_graphs: needs one process (DDP's gradient hooks are not recorded); "
                          f"torchrun started {world_size}")
    if cfg.precision is Precision.bf16 and gpu and not torch.cuda.is_bf16_supported():
        raise ConfigError("training.precision: bf16, but this GPU does not support bfloat16; use fp32 or auto")
    graphs = cfg.cuda_graphs
    if graphs is None:
        graphs = gpu and world_size == 1 and cfg.accumulate == 1 and not cfg.compile
    pad = cfg.pad_to_multiple if cfg.pad_to_multiple is not None else (GPU_PAD_MULTIPLE if gpu else 1)
    return replace(cfg, pad_to_multiple=pad, cuda_graphs=graphs)


def compile_for_training(module: torch.nn.Module) -> Callable:
    """``torch.compile`` for token-bucketed batches: every dimension symbolic from the first call, so a new
    batch shape reuses the compiled code instead of compiling again. Duck sizing is switched off (process-wide,
    it only affects compilation): it would assume that lengths equal on the first batch (source and target,
    say) are always equal, and compile again at the first batch where they are not."""
    torch.fx.experimental._config.use_duck_shape = False
    return torch.compile(module, dynamic=True)


def decode_batch_size(cfg: EvalConfig, device: torch.device | str) -> int:
    """``eval.batch_size``, or when unset 64 sentences on a CPU and 512 on a GPU (where a decoding step costs
    about the same for 64 sentences as for 512: its time goes to launching kernels)."""
    if cfg.batch_size is not None:
        return cfg.batch_size
    return 512 if torch.device(device).type == "cuda" else 64


def autocast_dtype(device: torch.device, precision: Precision) -> torch.dtype | None:
    """The autocast dtype for ``precision`` on ``device``, or ``None`` for plain float32.

    ``auto`` means bf16 on CUDA devices that support it and float32 elsewhere; ``bf16`` is honoured on CPU
    too, though slower: 29 % for the default model on an AMX-capable Xeon (docs/RESULTS.md).
    """
    if precision is Precision.fp32:
        return None
    if precision is Precision.bf16:
        if device.type == "cuda" and not torch.cuda.is_bf16_supported():
            raise ValueError("training.precision=bf16 but this GPU does not support bfloat16; use fp32")
        return torch.bfloat16
    if precision is Precision.auto:
        if device.type == "cuda" and torch.cuda.is_bf16_supported():
            return torch.bfloat16
        return None
    raise ValueError(f"unknown precision {precision!r}; choose one of {[p.value for p in Precision]}")


@contextlib.contextmanager
def autocast(device: torch.device, precision: Precision) -> Iterator[None]:
    """Autocast region for the forward pass according to :func:`autocast_dtype`."""
    dtype = autocast_dtype(device, precision)
    if dtype is None:
        yield
        return
    with torch.autocast(device_type=device.type, dtype=dtype):
        yield


def configure_threads(n: int | None) -> None:
    """Set torch's intra-op thread count (``None``: keep torch's default)."""
    if n is None:
        return
    if n < 1:
        raise ConfigError(f"training.threads: must be >= 1, got {n}")
    torch.set_num_threads(n)


def set_deterministic(flag: bool) -> None:
    """Ask torch for deterministic kernels (errors on ops that have none) and fixed cuDNN algorithms.

    cuBLAS needs ``CUBLAS_WORKSPACE_CONFIG`` for deterministic matmuls; it is set here if unset, which
    only takes effect if CUDA has not been initialised yet.
    """
    if flag:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(flag, warn_only=False)
    torch.backends.cudnn.deterministic = flag
    torch.backends.cudnn.benchmark = False
