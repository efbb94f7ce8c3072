"""Checks that need CUDA (marked ``gpu``; skipped without it): bf16 against fp32, cached decoding, the
attention kernels a training step on variable-length batches runs, CUDA graphs (of the compiled step too), and a
run of the pipeline on the GPU's defaults, resumed."""

from __future__ import annotations

import logging

import pytest
import torch
from omegaconf import OmegaConf
from test_decoding import REAL, tiny_model, varied_sources
from test_model import CONFIGS as MODEL_CONFIGS
from test_model import PAD as OPTION_PAD
from test_model import _batch as option_batch
from test_model import _model as option_model
from torch.profiler import ProfilerActivity, profile

from transformer.app import pipeline
from transformer.checkpoint import RunDir, load_checkpoint
from transformer.config import LengthNorm, Precision
from transformer.data.batching import collate_arrays
from transformer.data.corpus import TranslationDataset
from transformer.inference.sampling import Sampler
from transformer.inference.search import beam_search, greedy_hypotheses, greedy_search
from transformer.runtime import autocast
from transformer.training.distributed import DistContext
from transformer.training.objective import TranslationObjective
from transformer.training.optim import build_optimizer, set_learning_rate
from transformer.training.step import TrainStep

from toy_training import BOS, EOS, PAD, copy_pairs, make_trainer, toy_collate, training_config
from toy_training import tiny_model as graph_model

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


def _cuda() -> DistContext:
    return DistContext(rank=0, world_size=1, local_rank=0, device=torch.device("cuda"), is_main=True)


def _loss_and_grads(model: torch.nn.Module, batch, precision: Precision) -> tuple[float, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    with autocast(torch.device("cuda"), precision):
        objective = TranslationObjective(model, label_smoothing=0.1, loss_chunk=8192)
        loss_sum, _ = objective(batch.src, batch.tgt_in, batch.tgt_out, batch.target_positions)
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


def test_sampling_on_cuda_repeats_with_its_seed_and_is_greedy_near_zero_temperature():
    model, src = tiny_model().cuda(), varied_sources().cuda()

    def sample(temperature: float, seed: int, use_cache: bool = True) -> list[list[int]]:
        draws = Sampler(0, 1.0, temperature, torch.Generator(device="cuda").manual_seed(seed))
        return [h.tokens for h in greedy_hypotheses(model, src, sampler=draws, use_cache=use_cache, **REAL)]

    assert sample(1e-4, 0) == greedy_search(model, src, **REAL)
    assert sample(2.0, 0) == sample(2.0, 0, use_cache=False) != sample(2.0, 1)


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


@pytest.mark.parametrize("name", list(MODEL_CONFIGS))
def test_every_attention_and_position_option_on_cuda(name):
    """Each option's fused path on the GPU kernels: a bf16 training step against fp32 (loss within 2 %, gradient
    cosine > 0.99), and cached decoding equal to the full pass in fp32."""
    model = option_model(**MODEL_CONFIGS[name]).cuda().train()
    src, tgt_in = (t.cuda() for t in option_batch())
    tgt_out = torch.cat([tgt_in[:, 1:], torch.full_like(tgt_in[:, :1], OPTION_PAD)], dim=1)
    results = []
    for precision in (Precision.fp32, Precision.bf16):
        model.zero_grad(set_to_none=True)
        with autocast(torch.device("cuda"), precision):
            loss, _ = TranslationObjective(model, label_smoothing=0.1)(src, tgt_in, tgt_out)
        loss.backward()
        results.append((loss.item(), torch.cat([p.grad.float().flatten() for p in model.parameters()
                                                 if p.grad is not None])))
    (loss32, grad32), (loss16, grad16) = results
    assert loss16 == pytest.approx(loss32, rel=2e-2)
    assert torch.nn.functional.cosine_similarity(grad16, grad32, dim=0).item() > 0.99
    model.eval()
    with torch.no_grad():
        enc = model.encode(src)
        full = model.decode(tgt_in, enc).logits
        cache, steps = model.init_cache(enc), []
        for t in range(tgt_in.size(1)):
            out = model.decode(tgt_in[:, t : t + 1], enc, cache)
            cache = out.cache
            steps.append(out.logits)
    assert torch.allclose(torch.cat(steps, dim=1), full, atol=1e-4)


def _graph_batches() -> list:
    """Five pinned batches of copy pairs filled to 240 positions, in three shapes (lengths 2..6)."""
    pairs = copy_pairs(40, seed=6)
    data = TranslationDataset.from_sequences([s for s, _ in pairs], [t for _, t in pairs])
    by_length = sorted(range(len(pairs)), key=lambda i: len(pairs[i][0]))
    groups = [by_length[:6], by_length[15:20], by_length[:6], by_length[30:], by_length[15:20]]
    return [collate_arrays(data, g, pad_id=PAD, bos_id=BOS, eos_id=EOS, fill_to_tokens=240).pin_memory()
            for g in groups]


def _graph_run(record: bool, batches: list, dropout: float, compile: bool = False
               ) -> tuple[TrainStep, list[torch.Tensor]]:
    model = graph_model(seed=0, dropout=dropout).cuda()
    cfg = training_config(cuda_graphs=True, compile=compile)
    step = TrainStep(model, build_optimizer(model, cfg), cfg, torch.device("cuda"), _cuda(), record_graphs=record)
    torch.manual_seed(3)
    stats = []
    for i, batch in enumerate(batches):
        set_learning_rate(step.optimizer, 1e-3 * (i + 1))
        stats.append(step([batch])[0].clone())
    return step, stats


def test_recorded_graphs_train_as_the_same_step_run_eagerly():
    """One graph per batch shape; replaying them gives the statistics and weights of the same fixed-shape step
    run eagerly (fp32, dropout off: this compares the recording, not the numbering of random draws), and with
    dropout the graphs train without a non-finite step."""
    batches = _graph_batches()
    eager, eager_stats = _graph_run(False, batches, dropout=0.0)
    graphed, graphed_stats = _graph_run(True, batches, dropout=0.0)
    assert graphed.graphs is not None and graphed.graphs.n_shapes == len({tuple(b.src.shape) for b in batches})
    for a, b in zip(eager_stats, graphed_stats):  # each step's loss depends on every earlier update
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5)
    # Weights only loosely: a gradient that is zero in exact arithmetic (attention key biases) is rounding noise,
    # which Adam turns into updates of +-lr if a kernel sums in another order (atomics in attention backward).
    eager_params = torch.cat([p.detach().flatten() for p in eager.optimizer.param_groups[0]["params"]])
    graphed_params = torch.cat([p.detach().flatten() for p in graphed.optimizer.param_groups[0]["params"]])
    assert (graphed_params - eager_params).norm() < 1e-2 * eager_params.norm()
    _, with_dropout = _graph_run(True, batches * 4, dropout=0.1)
    assert all(s[2].item() == 0.0 and torch.isfinite(s).all() for s in with_dropout)
    assert with_dropout[-1][0] < with_dropout[4][0]  # the same batch, 15 steps later: a lower loss


def test_graphs_record_the_compiled_step():
    """``training.compile`` with ``training.cuda_graphs``: each shape's warm-up compiles, the recording captures
    the compiled kernels, and replaying them trains as the same compiled step run eagerly; with dropout (drawn by
    the compiled code) the replays train without a non-finite step."""
    batches = _graph_batches()
    torch._dynamo.reset()
    _, eager_stats = _graph_run(False, batches, dropout=0.0, compile=True)
    graphed, graphed_stats = _graph_run(True, batches, dropout=0.0, compile=True)
    assert graphed.graphs is not None and graphed.graphs.n_shapes == 3
    for a, b in zip(eager_stats, graphed_stats):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5)
    _, with_dropout = _graph_run(True, batches * 4, dropout=0.1, compile=True)
    assert all(s[2].item() == 0.0 and torch.isfinite(s).all() for s in with_dropout)
    assert with_dropout[-1][0] < with_dropout[4][0]


def test_a_run_on_the_gpus_defaults_replays_graphs_and_resumes(compose_config, toy_corpus, tmp_path, caplog):
    """The pipeline on CUDA with every default (bf16, padding to 8, CUDA graphs): it records graphs, and the
    run resumed from its step-4 checkpoint retrains steps 5 - 8 to about the same weights (loosely, as above:
    atomics in attention backward may sum in another order)."""
    caplog.set_level(logging.INFO, logger="transformer.training.trainer")
    steps = ["training.max_steps=8", "training.validate_every_steps=4", "training.average_last=0"]

    def train(*extra: str) -> dict:
        cfg = compose_config("train", [
            "data=toy_copy", "model=tiny", "model.dropout=0.0", "eval=greedy", "training.progress_bar=false",
            "training.lr=3e-3", "training.warmup_steps=4", "training.max_tokens=512", f"data.dir={toy_corpus}",
            f"data.cache_dir={tmp_path / 'cache'}", f"output_dir={tmp_path / 'run'}", *steps, *extra])
        return pipeline.train(OmegaConf.to_object(cfg))

    train()
    run = RunDir(tmp_path / "run")
    first = load_checkpoint(run.last)
    assert first["config"]["training"]["cuda_graphs"] is True and first["config"]["training"]["pad_to_multiple"] == 8
    assert "CUDA graphs recorded for" in caplog.text
    again = train(f"resume={run.checkpoints / 'step_4.pt'}")
    assert again["train"]["steps"] == 8
    a = torch.cat([w.float().flatten() for w in first["model"].values()])
    b = torch.cat([w.float().flatten() for w in load_checkpoint(run.last)["model"].values()])
    assert (a - b).norm() < 1e-2 * a.norm()
