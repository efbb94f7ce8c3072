"""Distributed helpers: single-process no-ops, and a 2-process gloo run that must equal one process
accumulating the same two batches per step."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from transformer.checkpoint import load_checkpoint
from transformer.training import distributed
from transformer.training.distributed import DistContext, init_distributed

from toy_training import copy_pairs, make_sampler, make_trainer, parameters, training_config

PAIRS = copy_pairs(48, seed=3)
STEPS = 6
# Attention key biases get an exactly-zero true gradient (softmax ignores a constant shift), so their
# computed gradient is rounding noise that Adam, with a tiny eps, would blow up to +-lr differently in the
# two runs. A larger eps keeps such noise from moving the weights; every real gradient is unaffected in kind.
ADAM_EPS = 1e-4


def test_single_process_is_a_no_op(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    ctx = init_distributed("cpu")
    assert ctx == DistContext(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"), is_main=True)
    assert not distributed.is_active()
    assert distributed.all_reduce_sum(2.5) == 2.5
    tensor = torch.tensor([1.0, 2.0])
    assert distributed.all_reduce_sum(tensor) is tensor
    assert distributed.broadcast_object({"a": 1}) == {"a": 1}
    assert distributed.all_gather_object(3) == [3]
    distributed.barrier()
    distributed.cleanup()


def test_bad_environment_is_named(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "two")
    with pytest.raises(ValueError, match="WORLD_SIZE='two'"):
        init_distributed("cpu")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _worker(rank: int, world_size: int, port: int, run_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world_size),
                      LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    ctx = init_distributed("cpu")
    try:
        def validate(model, step):
            assert ctx.rank == 0, "validation must run on rank 0 only"
            return {"bleu": 1.0, "loss": 1.0}

        cfg = training_config(max_steps=STEPS, accumulate=1, eps=ADAM_EPS)
        trainer = make_trainer(Path(run_dir), cfg, PAIRS, dropout=0.0, dist=ctx, validate=validate)
        result = trainer.fit()
        assert result.steps == STEPS and result.last_metrics["bleu"] == 1.0  # broadcast to every rank
        torch.save(parameters(trainer), Path(run_dir) / f"rank{rank}.pt")
    finally:
        distributed.cleanup()


class _Interleaved:
    """The two ranks' batches in global order (rank 0's k-th, rank 1's k-th, ...), for one process."""

    def __init__(self, cfg) -> None:
        self.ranks = [make_sampler(PAIRS, cfg, rank=r, world_size=2) for r in range(2)]

    def set_epoch(self, epoch: int) -> None:
        for sampler in self.ranks:
            sampler.set_epoch(epoch)

    def __iter__(self):
        for first, second in zip(*self.ranks):
            yield first
            yield second

    def __len__(self) -> int:
        return 2 * len(self.ranks[0])

    def state_dict(self) -> dict:
        return {"ranks": [s.state_dict() for s in self.ranks]}

    def load_state_dict(self, state: dict) -> None:
        for sampler, saved in zip(self.ranks, state["ranks"]):
            sampler.load_state_dict(saved)


@pytest.mark.slow
def test_two_processes_equal_one_process_accumulating(tmp_path):
    mp.spawn(_worker, args=(2, _free_port(), str(tmp_path)), nprocs=2, join=True)
    rank0, rank1 = (torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(2))
    for key in rank0:
        assert torch.equal(rank0[key], rank1[key]), key
    saved = load_checkpoint(tmp_path / "checkpoints" / "last.pt")
    assert saved["step"] == STEPS and len(saved["rng"]) == 2  # one RNG state per rank

    cfg = training_config(max_steps=STEPS, accumulate=2, eps=ADAM_EPS)
    single = make_trainer(tmp_path / "single", cfg, PAIRS, dropout=0.0, sampler=_Interleaved(cfg),
                          validate=lambda model, step: {"bleu": 1.0, "loss": 1.0})
    single.fit()
    reference = parameters(single)
    initial = parameters(make_trainer(tmp_path / "init", cfg, PAIRS, dropout=0.0))
    for key in reference:
        torch.testing.assert_close(rank0[key], reference[key], atol=1e-5, rtol=0)
    assert any(not torch.allclose(initial[k], reference[k]) for k in reference)  # training moved the weights
