"""Runtime helpers: RNG snapshots, seeding, device choice, autocast."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
import torch

from transformer.checkpoint import load_checkpoint
from transformer.config import EvalConfig, Precision, TrainingConfig
from transformer.runtime import (
    autocast,
    autocast_dtype,
    capture_rng_state,
    choose_device,
    decode_batch_size,
    resolve_training,
    restore_rng_state,
    seed_everything,
)
from transformer.training.checkpoints import save_checkpoint


def _draw() -> tuple:
    return random.random(), torch.rand(3).tolist(), torch.nn.functional.dropout(torch.ones(8), 0.5).tolist()


def test_rng_snapshot_survives_a_checkpoint_round_trip(tmp_path):
    seed_everything(3)
    _draw()
    save_checkpoint({"rng": capture_rng_state()}, tmp_path / "rng.pt")
    expected = _draw()
    _draw()  # move on
    restore_rng_state(load_checkpoint(tmp_path / "rng.pt")["rng"])
    assert _draw() == expected


def test_seed_everything_is_reproducible():
    seed_everything(11)
    first = _draw()
    seed_everything(11)
    assert _draw() == first
    seed_everything(12)
    assert _draw() != first


def test_choose_device():
    assert choose_device("cpu") == torch.device("cpu")
    assert choose_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(ValueError, match="not a device"):
        choose_device("gpu0")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            choose_device("cuda")


def test_autocast_choice_on_cpu():
    cpu = torch.device("cpu")
    assert autocast_dtype(cpu, Precision.auto) is None
    assert autocast_dtype(cpu, Precision.fp32) is None
    assert autocast_dtype(cpu, Precision.bf16) is torch.bfloat16
    a, b = torch.randn(4, 4), torch.randn(4, 4)
    with autocast(cpu, Precision.bf16):
        assert (a @ b).dtype == torch.bfloat16
    with autocast(cpu, Precision.auto):
        assert (a @ b).dtype == torch.float32


def test_padding_and_graph_defaults_per_device_and_explicit_values_win():
    cpu = resolve_training(TrainingConfig(), torch.device("cpu"))
    gpu = resolve_training(TrainingConfig(), torch.device("cuda"))
    assert (cpu.pad_to_multiple, gpu.pad_to_multiple) == (1, 8)
    assert (cpu.cuda_graphs, gpu.cuda_graphs) == (False, True)
    unresolved = dict(pad_to_multiple=None, cuda_graphs=None)
    assert replace(cpu, **unresolved) == replace(gpu, **unresolved) == TrainingConfig()
    mine = resolve_training(TrainingConfig(pad_to_multiple=4, cuda_graphs=False), torch.device("cuda"))
    assert (mine.pad_to_multiple, mine.cuda_graphs) == (4, False)
    assert resolve_training(gpu, torch.device("cuda")) == gpu  # resolving twice changes nothing


@pytest.mark.parametrize("overrides, world_size", [(dict(accumulate=2), 1), (dict(compile=True), 1), ({}, 2)])
def test_graphs_are_left_off_where_they_cannot_run(overrides, world_size):
    resolved = resolve_training(TrainingConfig(**overrides), torch.device("cuda"), world_size)
    assert resolved.cuda_graphs is False


def test_decoding_batch_size_defaults_per_device():
    assert decode_batch_size(EvalConfig(), "cpu") == 64
    assert decode_batch_size(EvalConfig(), torch.device("cuda")) == 512
    assert decode_batch_size(EvalConfig(batch_size=7), "cuda") == 7
