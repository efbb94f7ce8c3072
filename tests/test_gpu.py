"""Checks that need CUDA (marked ``gpu``; skipped without it): bf16 against fp32, cached decoding, and the
attention kernels a training step on variable-length batches runs."""

from __future__ import annotations

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from test_decoding import REAL, tiny_model, varied_sources
from toy_training import copy_pairs, make_trainer, toy_collate, training_config
from transformer.config import LengthNorm, Precision
from transformer.decoding import beam_search, greedy_search
from transformer.distributed import DistContext
from transformer.runtime import autocast

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


def _cuda() -> DistContext:
    return DistContext(rank=0, world_size=1, local_rank=0, device=torch.device("cuda"), is_main=True)


def _loss_and_grads(model: torch.nn.Module, batch, precision: Precision) -> tuple[float, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    with autocast(torch.device("cuda"), precision):
        loss_sum, _ = model(batch.src, batch.tgt_in, batch.tgt_out, target_positions=batch.target_positions,
                            label_smoothing=0.1, loss_chunk=8192)
    loss_sum.backward()
    grads = torch.cat([p.grad.float().flatten() for p in model.parameters() if p.grad is not None])
    return loss_sum.item() / batch.n_tgt_tokens, grads


def test_bf16_step_matches_fp32_within_bf16_rounding(tmp_path):
    """bf16 autocast keeps 8 bits of mantissa (relative rounding 2^-8 = 0.4 %): the loss per token agrees within
    1 % and the whole gradient within 5 % in norm and 0.99 in cosine similarity."""
    pairs = copy_pairs(64, seed=4)
    trainer = make_trainer(tmp_path, training_config(), pairs, dropout=0.0, dist=_cuda())
    batch = toy_collate(pairs, list(range(64))).to("cuda")
    model = trainer.model.train()
    loss32, grad32 = _loss_and_grads(model, batch, Precision.fp32)
    loss16, grad16 = _loss_and_grads(model, batch, Precision.bf16)
    assert loss16 == pytest.approx(loss32, rel=1e-2)
    assert torch.linalg.vector_norm(grad16).item() == pytest.approx(torch.linalg.vector_norm(grad32).item(), rel=5e-2)
    assert torch.nn.functional.cosine_similarity(grad16, grad32, dim=0).item() > 0.99


def test_cached_decoding_equals_uncached_on_cuda():
    model, src = tiny_model().cuda(), varied_sources().cuda()
    assert greedy_search(model, src, use_cache=True, **REAL) == greedy_search(model, src, use_cache=False, **REAL)
    kwargs = dict(beam_size=3, n_best=2, length_penalty=0.6, length_norm=LengthNorm.gnmt, **REAL)
    cached = beam_search(model, src, use_cache=True, **kwargs)
    uncached = beam_search(model, src, use_cache=False, **kwargs)
    assert [[h.tokens for h in hyps] for hyps in cached] == [[h.tokens for h in hyps] for hyps in uncached]


def test_training_on_variable_length_batches_never_runs_cudnn_attention(tmp_path):
    """Each new batch shape would make cuDNN build an execution plan; the fused path must avoid that backend."""
    cfg = training_config(max_steps=6, precision=Precision.bf16, max_tokens=64)
    trainer = make_trainer(tmp_path, cfg, copy_pairs(120, seed=5), dist=_cuda(),
                           validate=lambda model, step: {"bleu": 0.0})
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        trainer.fit()
    names = {event.key for event in prof.key_averages()}
    assert not [name for name in names if "cudnn_attention" in name], sorted(names)
    fused = {"aten::_scaled_dot_product_flash_attention", "aten::_scaled_dot_product_efficient_attention"}
    assert fused <= names  # flash for the causal decoder, memory-efficient for the masked kinds
