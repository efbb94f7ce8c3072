"""TrainStep: the gradient of a step is the mean over all its target tokens, however they are split into
micro-batches; a non-finite step leaves the weights alone and says so."""

from __future__ import annotations

from typing import Callable

import pytest
import torch

from transformer.training.loss import projected_label_smoothed_sums
from transformer.training.optim import build_optimizer
from transformer.training.step import TrainStep, loss_chunk

from toy_training import SINGLE, copy_pairs, tiny_model, toy_collate, training_config

PAIRS = copy_pairs(12, seed=3)


def _batch(indices: list[int]):
    return toy_collate([PAIRS[i] for i in indices], indices)


def _one_step(micro_batches: list[list[int]], clip: float | None = None) -> tuple[dict, torch.Tensor, int]:
    """The gradients of one step of a fresh model (dropout off) over ``micro_batches`` (index lists), with the
    step's statistics and token count. (Gradients, not updated weights: Adam's first update is about
    lr * sign(gradient), which turns rounding noise in near-zero gradients into full-size differences.)"""
    model = tiny_model(seed=0, dropout=0.0)
    cfg = training_config(clip_grad_norm=clip, label_smoothing=0.1)
    step = TrainStep(model, build_optimizer(model, cfg), cfg, torch.device("cpu"), SINGLE)
    stats, tokens = step([_batch(indices) for indices in micro_batches])
    return {name: p.grad.clone() for name, p in model.named_parameters()}, stats, tokens


def test_micro_batches_give_the_update_of_one_batch_holding_them_all():
    """Split 1+11 (uneven on purpose: a per-batch mean would weight the first sentence 11 times more)."""
    together, stats_together, tokens_together = _one_step([list(range(12))], clip=None)
    split, stats_split, tokens_split = _one_step([[0], list(range(1, 12))], clip=None)
    assert tokens_split == tokens_together == sum(len(t) + 1 for _, t in PAIRS)  # + EOS
    torch.testing.assert_close(stats_split[:2], stats_together[:2], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(stats_split[3], stats_together[3], rtol=1e-5, atol=1e-6)  # gradient norm
    for name in together:
        torch.testing.assert_close(split[name], together[name], rtol=1e-4, atol=1e-7, msg=name)


def test_the_returned_norm_is_the_norm_before_clipping():
    unclipped = _one_step([list(range(12))], clip=None)[1][3]
    clipped = _one_step([list(range(12))], clip=1e-3)[1][3]
    assert unclipped > 1e-3
    torch.testing.assert_close(clipped, unclipped)


def test_a_non_finite_loss_skips_the_update_and_is_flagged():
    model = tiny_model(seed=0, dropout=0.0)
    cfg = training_config()
    step = TrainStep(model, build_optimizer(model, cfg), cfg, torch.device("cpu"), SINGLE)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    model.encoder.embed.register_forward_hook(lambda module, args, out: out * float("nan"))
    stats, _ = step([_batch(list(range(12)))])
    assert stats[2].item() == 1.0
    for name, value in model.state_dict().items():
        assert torch.equal(value, before[name]), name


def test_a_step_without_target_tokens_is_refused():
    model = tiny_model(seed=0)
    cfg = training_config()
    step = TrainStep(model, build_optimizer(model, cfg), cfg, torch.device("cpu"), SINGLE)
    batch = _batch([0])
    batch.n_tgt_tokens = 0
    with pytest.raises(ValueError, match="no target tokens"):
        step([batch])


def test_r_drop_without_dropout_is_the_plain_step():
    """Both passes of a dropout-free model agree, so R-Drop's KL term adds nothing: same statistics and gradients
    as the plain step (through the model's doubling of the batch and of its target positions)."""
    def step(r_drop: float) -> tuple[dict, torch.Tensor]:
        model = tiny_model(seed=0, dropout=0.0)
        cfg = training_config(r_drop=r_drop, clip_grad_norm=None)
        stats, _ = TrainStep(model, build_optimizer(model, cfg), cfg, torch.device("cpu"), SINGLE)([_batch(
            list(range(12)))])
        return {name: p.grad.clone() for name, p in model.named_parameters()}, stats

    (plain, plain_stats), (twice, twice_stats) = step(0.0), step(4.0)
    torch.testing.assert_close(twice_stats, plain_stats, rtol=1e-5, atol=1e-6)
    for name in plain:
        torch.testing.assert_close(twice[name], plain[name], rtol=1e-4, atol=1e-7, msg=name)


@pytest.mark.parametrize("r_drop", [0.0, 5.0])
def test_a_compiled_step_takes_every_batch_in_one_chunk_so_a_new_batch_size_compiles_nothing_new(monkeypatch, r_drop):
    monkeypatch.setattr(torch.fx.experimental._config, "use_duck_shape", False)  # as runtime.compile_for_training
    cfg = training_config(compile=True, max_tokens=2048)
    batches = [(30, 20), (35, 20), (40, 22)]  # 600 to 880 target positions: more than a CPU's chunk of 512

    def graphs_compiled(chunk: int) -> int:
        graphs = []

        def counting(graph: torch.fx.GraphModule, inputs: list) -> Callable:
            graphs.append(graph)
            return graph.forward

        torch._dynamo.reset()
        loss = torch.compile(lambda hidden, weight, target: projected_label_smoothed_sums(
            hidden, weight, None, target, smoothing=0.1, pad_id=0, chunk_size=chunk, dense=True,
            consistency=r_drop), dynamic=True, backend=counting)
        weight = torch.randn(50, 16, requires_grad=True)
        for rows, length in batches:
            rows *= 2 if r_drop else 1  # R-Drop: the batch twice
            hidden, target = torch.randn(rows, length, 16, requires_grad=True), torch.randint(1, 50, (rows, length))
            loss(hidden, weight, target)[0].backward()
        torch._dynamo.reset()
        return len(graphs)

    assert graphs_compiled(loss_chunk(cfg, torch.device("cpu"))) == 1
    assert graphs_compiled(loss_chunk(training_config(max_tokens=2048), torch.device("cpu"))) == len(batches)

