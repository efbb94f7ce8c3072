"""The CUDA-graph step (``training.cuda_graphs``) on the CPU: everything but the recording itself.

Fixed-shape batches (filler rows), the dense loss, the warm-up that must leave weights, optimizer state and
random state as they were, and the optimizer's learning-rate form across checkpoints. The recorded graphs
themselves are checked against this eager path in ``test_gpu.py``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch._dynamo.utils import counters

from transformer.config import ConfigError
from transformer.data.batching import collate_arrays, static_rows
from transformer.data.corpus import TranslationDataset
from transformer.runtime import resolve_training
from transformer.training.distributed import DistContext
from transformer.training.loss import projected_label_smoothed_sums
from transformer.training.optim import build_optimizer, set_learning_rate
from transformer.training.step import TrainStep

from toy_training import BOS, EOS, PAD, SINGLE, copy_pairs, tiny_model, training_config

PAIRS = copy_pairs(24, seed=5)
DATA = TranslationDataset.from_sequences([s for s, _ in PAIRS], [t for _, t in PAIRS])
CPU = torch.device("cpu")


def _collate(indices: list[int], fill_to_tokens: int | None = None):
    return collate_arrays(DATA, indices, pad_id=PAD, bos_id=BOS, eos_id=EOS, fill_to_tokens=fill_to_tokens)


def test_filler_rows_give_one_shape_per_padded_lengths_and_add_no_tokens():
    plain, filled = _collate([0, 1, 2]), _collate([0, 1, 2], fill_to_tokens=200)
    src_len, tgt_len = plain.src.shape[1], plain.tgt_in.shape[1]
    rows = static_rows(200, src_len, tgt_len)
    assert rows == 200 // (src_len + tgt_len) and rows > 3
    assert filled.src.shape == (rows, src_len) and filled.tgt_out.shape == (rows, tgt_len)
    for name in ("src", "tgt_in", "tgt_out", "target_positions"):
        assert torch.equal(getattr(filled, name)[: len(getattr(plain, name))], getattr(plain, name)), name
    assert (filled.n_src_tokens, filled.n_tgt_tokens, filled.indices) == (plain.n_src_tokens, plain.n_tgt_tokens,
                                                                          [0, 1, 2])
    assert filled.src[3:, 0].eq(EOS).all() and filled.src[3:, 1:].eq(PAD).all()  # one token to attend to
    assert filled.tgt_in[3:, 0].eq(BOS).all() and filled.tgt_out[3:].eq(PAD).all()  # no target position


def test_a_batch_over_the_budget_it_is_filled_to_is_refused():
    with pytest.raises(ValueError, match="exceed the 10-position budget"):
        _collate(list(range(6)), fill_to_tokens=10)


def test_the_dense_loss_equals_the_gathered_loss_with_its_gradients():
    torch.manual_seed(0)
    batch = _collate(list(range(8)))
    hidden = torch.randn(*batch.tgt_out.shape, 16, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(12, 16, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(12, dtype=torch.float64, requires_grad=True)
    results = []
    for kwargs in (dict(positions=batch.target_positions), dict(dense=True)):
        loss, nll = projected_label_smoothed_sums(hidden, weight, bias, batch.tgt_out, smoothing=0.1, pad_id=PAD,
                                                  chunk_size=7, **kwargs)  # several chunks, the last one short
        grads = torch.autograd.grad(loss, (hidden, weight, bias))
        results.append((loss, nll, *grads))
    for gathered, dense in zip(*results):
        torch.testing.assert_close(dense, gathered, rtol=1e-12, atol=1e-12)


def _step(graphs: bool, dropout: float = 0.1, compile: bool = False) -> TrainStep:
    model = tiny_model(seed=0, dropout=dropout)
    cfg = training_config(cuda_graphs=graphs, compile=compile)
    return TrainStep(model, build_optimizer(model, cfg), cfg, CPU, SINGLE, record_graphs=False)


def _train(step: TrainStep, batches: list, seed: int = 11) -> list[torch.Tensor]:
    torch.manual_seed(seed)
    stats = []
    for i, batch in enumerate(batches):
        set_learning_rate(step.optimizer, 1e-3 * (i + 1))
        stats.append(step([batch])[0].clone())
    return stats


def test_the_fixed_shape_path_trains_as_the_plain_step_does():
    """Same filled batches, same seed: the warm-up of each new shape (twice the step, update skipped) leaves
    weights, Adam's moments and step count and the dropout stream as they were; only the loss's summation
    order differs."""
    batches = [_collate(indices, fill_to_tokens=120) for indices in ([0, 1, 2, 3], [4, 5], [0, 1, 2, 3], [6])]
    plain, graphed = _step(graphs=False), _step(graphs=True)
    plain_stats, graphed_stats = _train(plain, batches), _train(graphed, batches)
    assert graphed.graphs is not None and graphed.graphs.n_shapes == 3  # (9, 6), (13, 4) and (24, 2) sources
    for a, b in zip(plain_stats, graphed_stats):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)
    for p, q in zip(plain.optimizer.param_groups[0]["params"], graphed.optimizer.param_groups[0]["params"]):
        torch.testing.assert_close(q, p, rtol=1e-5, atol=1e-6)
        assert plain.optimizer.state[p]["step"].item() == graphed.optimizer.state[q]["step"].item() == len(batches)


@pytest.mark.slow
def test_the_compiled_step_is_what_the_graphs_run():
    """``compile`` with ``cuda_graphs``: the warm-up of each shape compiles the objective (one compilation for
    every shape: its sizes are symbolic), and the compiled fixed-shape step trains as the eager one (dropout off:
    compiled code draws its random numbers its own way); only the order of floating-point sums differs."""
    batches = [_collate(indices, fill_to_tokens=120) for indices in ([0, 1, 2, 3], [4, 5], [0, 1, 2, 3], [6])]
    torch._dynamo.reset()
    counters.clear()
    eager, compiled = _step(graphs=True, dropout=0.0), _step(graphs=True, dropout=0.0, compile=True)
    eager_stats, compiled_stats = _train(eager, batches), _train(compiled, batches)
    assert compiled.graphs.n_shapes == 3
    assert counters["stats"]["unique_graphs"] == 1  # one graph traced, whole (no break), for all three shapes
    for a, b in zip(eager_stats, compiled_stats):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5)
    for p, q in zip(eager.optimizer.param_groups[0]["params"], compiled.optimizer.param_groups[0]["params"]):
        torch.testing.assert_close(q, p, rtol=1e-4, atol=1e-5)


def test_a_warm_up_step_changes_nothing():
    step = _step(graphs=True)
    params = [p.detach().clone() for p in step.optimizer.param_groups[0]["params"]]
    rng, batch = torch.get_rng_state(), _collate([0, 1])
    step._graph_body(batch.src, batch.tgt_in, batch.tgt_out, torch.tensor(0.1), True)
    for before, p in zip(params, step.optimizer.param_groups[0]["params"]):
        assert torch.equal(before, p.detach())
        assert step.optimizer.state[p]["step"].item() == 0.0 and step.optimizer.state[p]["exp_avg"].abs().sum() == 0
    assert not torch.equal(rng, torch.get_rng_state())  # dropout drew: StepGraphs puts the state back itself


def test_settings_the_graphs_cannot_hold_are_refused_by_the_config():
    with pytest.raises(ConfigError, match="training.accumulate: training.cuda_graphs records one batch per step: "
                                          "must be 1, got 2"):
        training_config(cuda_graphs=True, accumulate=2)


def test_graphs_need_one_process_and_the_fused_optimizer():
    model = tiny_model(seed=0)
    cfg = training_config(cuda_graphs=True)
    two_ranks = DistContext(rank=0, world_size=2, local_rank=0, device=CPU, is_main=True)
    with pytest.raises(ConfigError, match="needs one process .*torchrun started 2"):
        TrainStep(model, build_optimizer(model, cfg), cfg, CPU, two_ranks, record_graphs=False)
    unfused = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with pytest.raises(ConfigError, match="needs the fused AdamW"):
        TrainStep(model, unfused, cfg, CPU, SINGLE, record_graphs=False)


def test_recording_needs_a_cuda_device():
    with pytest.raises(ConfigError, match="training.cuda_graphs: needs a CUDA device; this run is on cpu"):
        resolve_training(training_config(cuda_graphs=True), CPU)  # what a run checks first
    with pytest.raises(ConfigError, match="training.cuda_graphs: needs one process .*torchrun started 2"):
        resolve_training(training_config(cuda_graphs=True), torch.device("cuda"), world_size=2)
    model = tiny_model(seed=0)
    cfg = training_config(cuda_graphs=True)
    with pytest.raises(ValueError, match="CUDA graphs need a CUDA device, got cpu"):
        TrainStep(model, build_optimizer(model, cfg), cfg, CPU, SINGLE)


def test_a_graph_runs_tensor_learning_rate_loads_as_a_float_for_eager_steps():
    saved = _step(graphs=False)
    _train(saved, [_collate([0, 1])])
    state = saved.optimizer.state_dict()
    for group in state["param_groups"]:  # as a recording run saves it
        group["lr"], group["capturable"] = torch.tensor(group["lr"]), True
    eager = _step(graphs=False)
    eager.load_optimizer_state(state)
    assert all(type(g["lr"]) is float and g["capturable"] is False for g in eager.optimizer.param_groups)
    _train(eager, [_collate([2, 3])])  # a capturable CPU optimizer would refuse to step
    assert np.isclose(eager.optimizer.param_groups[0]["lr"], 1e-3)


def test_the_optimizer_state_must_come_before_the_first_graph():
    step = _step(graphs=True)
    state = step.optimizer.state_dict()
    _train(step, [_collate([0, 1])])
    with pytest.raises(RuntimeError, match="before the first step"):
        step.load_optimizer_state(state)
    step.graphs.release()
    step.load_optimizer_state(state)  # nothing recorded reads the old rate any more
