"""Greedy and beam search in fixed shapes (``transformer.inference.fixed_shape``): the hypotheses of the ordinary
searches for every position kind and option, length normalisation and n-best, on a trained model too, without
reading the device back inside a step; on CUDA also replayed as a CUDA graph; a bfloat16 copy of a trained model
decoding as well."""

from __future__ import annotations

import math

import pytest
import torch
from test_decoding import REAL, SPECIAL, tiny_model, varied_sources
from torch.utils._python_dispatch import TorchDispatchMode

from transformer.config import (
    AttentionScore,
    ConfigError,
    EvalConfig,
    LengthNorm,
    ModelConfig,
    NormPosition,
    PositionKind,
    Precision,
)
from transformer.data.tokenizer import EOS_ID, PAD_ID
from transformer.inference.ensemble import Ensemble
from transformer.inference.fixed_shape import _cannot_win, fixed_shape_beam, fixed_shape_greedy
from transformer.inference.search import beam_search, greedy_hypotheses, greedy_search, max_lengths
from transformer.inference.translation import searches_in_fixed_shapes
from transformer.model.transformer import build_model

from toy_training import reversal_batch


def assert_same_hypotheses(fixed, ordinary, tolerance: float = 1e-5) -> None:
    assert [h.tokens for h in fixed] == [h.tokens for h in ordinary]
    assert [h.log_prob for h in fixed] == pytest.approx([h.log_prob for h in ordinary], abs=tolerance)
    assert [h.score for h in fixed] == pytest.approx([h.score for h in ordinary], abs=tolerance)


@pytest.mark.parametrize("check_every", [1, 3, 100])
@pytest.mark.parametrize(("norm", "alpha"), [(LengthNorm.gnmt, 0.6), (LengthNorm.average, 0.0), (LengthNorm.none, 0.0)])
def test_fixed_shape_greedy_gives_the_ordinary_greedy_hypotheses(check_every: int, norm: LengthNorm,
                                                                  alpha: float) -> None:
    model, src = tiny_model(), varied_sources()
    ordinary = greedy_hypotheses(model, src, length_penalty=alpha, length_norm=norm, **REAL)
    lengths = {len(h.tokens) for h in ordinary}
    assert len(lengths) > 3, "needs sentences that end at different steps (some by EOS, some at the limit)"
    fixed = fixed_shape_greedy(model, src, length_penalty=alpha, length_norm=norm, check_every=check_every, **REAL)
    assert_same_hypotheses(fixed, ordinary)


@pytest.mark.parametrize("option", ["sinusoidal", "learned", "rope", "relative", "none", "post-norm", "multiplicative",
                                    "additive", "free head size"])
def test_fixed_shape_greedy_covers_every_position_kind_and_option(option: str) -> None:
    cfg = ModelConfig(d_model=16, n_heads=2, d_ff=32, n_encoder_layers=2, n_decoder_layers=2, dropout=0.0,
                      attention_dropout=0.0, max_positions=64, tie_output=False, share_embeddings=False)
    if option in {p.value for p in PositionKind}:
        cfg.positions = PositionKind(option)
    elif option == "post-norm":
        cfg.norm = NormPosition.post
    elif option in ("multiplicative", "additive"):
        cfg.attention.score = AttentionScore(option)
    else:
        cfg.n_heads, cfg.d_head = 3, 10
    torch.manual_seed(3)
    model = build_model(cfg, 24, 24, PAD_ID).eval()
    with torch.no_grad():  # peaky outputs that end at different steps
        model.output_proj.weight.mul_(3.0)
        model.output_proj.weight[EOS_ID].mul_(2.0)
    src = varied_sources()
    assert_same_hypotheses(fixed_shape_greedy(model, src, **REAL), greedy_hypotheses(model, src, **REAL))


def assert_same_nbest(fixed, ordinary, tolerance: float = 1e-5) -> None:
    assert [[h.tokens for h in hyps] for hyps in fixed] == [[h.tokens for h in hyps] for hyps in ordinary]
    for f, o in zip(fixed, ordinary):
        assert [h.score for h in f] == pytest.approx([h.score for h in o], abs=tolerance)
        assert [h.log_prob for h in f] == pytest.approx([h.log_prob for h in o], abs=tolerance)


@pytest.mark.parametrize(("beam", "n_best"), [(1, 1), (3, 2), (4, 4), (40, 5)])
@pytest.mark.parametrize(("norm", "alpha"), [(LengthNorm.gnmt, 0.6), (LengthNorm.gnmt, 1.5), (LengthNorm.average, 0.0),
                                             (LengthNorm.none, 0.0)])
def test_fixed_shape_beam_gives_the_ordinary_beam_hypotheses(beam: int, n_best: int, norm: LengthNorm,
                                                             alpha: float) -> None:
    model, src = tiny_model(), varied_sources()
    kwargs = dict(beam_size=beam, n_best=n_best, length_penalty=alpha, length_norm=norm, **REAL)
    ordinary = beam_search(model, src, **kwargs)
    assert len({len(hyps[0].tokens) for hyps in ordinary}) > 2
    assert_same_nbest(fixed_shape_beam(model, src, check_every=3, **kwargs), ordinary)


def test_fixed_shape_beam_with_a_vocabulary_smaller_than_two_beams() -> None:
    model, src = tiny_model(tgt_vocab=6), torch.tensor([[7, 9, 11], [5, 0, 0]])
    kwargs = dict(beam_size=4, n_best=4, length_penalty=1.0, length_norm=LengthNorm.gnmt, max_len_a=0.0, max_len_b=3,
                  **SPECIAL)
    assert_same_nbest(fixed_shape_beam(model, src, **kwargs), beam_search(model, src, **kwargs))


@pytest.mark.parametrize("option", ["rope", "relative", "free head size"])
def test_fixed_shape_beam_covers_positions_inside_attention_and_a_free_head_size(option: str) -> None:
    cfg = ModelConfig(d_model=16, n_heads=2, d_ff=32, n_encoder_layers=2, n_decoder_layers=2, dropout=0.0,
                      attention_dropout=0.0, max_positions=64, tie_output=False, share_embeddings=False)
    if option == "free head size":
        cfg.n_heads, cfg.d_head = 3, 10
    else:
        cfg.positions = PositionKind(option)
    torch.manual_seed(4)
    model = build_model(cfg, 24, 24, PAD_ID).eval()
    with torch.no_grad():
        model.output_proj.weight.mul_(3.0)
        model.output_proj.weight[EOS_ID].mul_(2.0)
    src = varied_sources()
    kwargs = dict(beam_size=4, n_best=2, length_penalty=1.5, length_norm=LengthNorm.gnmt, **REAL)
    assert_same_nbest(fixed_shape_beam(model, src, **kwargs), beam_search(model, src, **kwargs))


@pytest.mark.slow
def test_fixed_shape_greedy_decodes_the_trained_reversal_model(reversal_model) -> None:
    src, _, _ = reversal_batch(torch.Generator().manual_seed(7), 50)  # held-out strings
    expected = [row[row != PAD_ID].flip(0).tolist() for row in src]
    kwargs = dict(max_len_a=1.0, max_len_b=3, **SPECIAL)
    fixed = [h.tokens for h in fixed_shape_greedy(reversal_model, src, **kwargs)]
    assert fixed == greedy_search(reversal_model, src, **kwargs)
    assert sum(f == e for f, e in zip(fixed, expected)) >= 49
    beams = dict(beam_size=4, n_best=2, length_penalty=0.6, length_norm=LengthNorm.gnmt, **kwargs)
    fixed_beams = fixed_shape_beam(reversal_model, src, **beams)
    assert_same_nbest(fixed_beams, beam_search(reversal_model, src, **beams), tolerance=1e-4)
    assert sum(b[0].tokens == e for b, e in zip(fixed_beams, expected)) >= 49


class _CountReads(TorchDispatchMode):
    """Counts the operators that copy a device value to the host (``.item()``, ``bool(tensor)``)."""

    def __init__(self) -> None:
        super().__init__()
        self.reads = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket in (torch.ops.aten._local_scalar_dense, torch.ops.aten.is_nonzero):
            self.reads += 1
        return func(*args, **(kwargs or {}))


def test_the_steps_read_nothing_back_but_one_flag_every_check_every_steps() -> None:
    model, src = tiny_model(), varied_sources()
    limits = max_lengths(src, PAD_ID, REAL["max_len_a"], REAL["max_len_b"])
    steps = max(limits)
    # the step at which the last sentence is done: n tokens then EOS take n + 1 steps, n tokens at the limit n
    last = max(len(h.tokens) + (len(h.tokens) < limit)
               for h, limit in zip(greedy_hypotheses(model, src, **REAL), limits))
    assert 4 < last < steps

    def flags_read(check_every: int) -> int:  # a flag after every check_every-th step, until one says done
        reads = 0
        for taken in range(check_every, steps, check_every):
            reads += 1
            if taken >= last:
                break
        return reads

    reads = {}
    for check_every in (1, 4, steps):
        counter = _CountReads()
        with counter:
            fixed_shape_greedy(model, src, check_every=check_every, **REAL)
        reads[check_every] = counter.reads
    assert flags_read(steps) == 0
    assert reads[1] - reads[steps] == flags_read(1) == last
    assert reads[4] - reads[steps] == flags_read(4)


def test_beam_steps_read_nothing_back_but_the_done_flag(monkeypatch) -> None:
    model, src = tiny_model(), varied_sources()
    steps = max(max_lengths(src, PAD_ID, REAL["max_len_a"], REAL["max_len_b"]))
    kwargs = dict(beam_size=3, n_best=2, length_penalty=0.6, length_norm=LengthNorm.gnmt, **REAL)
    decode, calls = model.decode, []
    monkeypatch.setattr(model, "decode", lambda *args, **kw: calls.append(1) or decode(*args, **kw))
    reads = {}
    for check_every in (1, steps):
        calls.clear()
        counter = _CountReads()
        with counter:
            fixed_shape_beam(model, src, check_every=check_every, **kwargs)
        reads[check_every] = (counter.reads, len(calls))
    assert reads[steps][1] == steps  # never asked: every step runs
    flags, taken = reads[1][0] - reads[steps][0], reads[1][1]
    assert 1 < taken < steps and flags == taken  # asked after every step, it stops at the first "done"


class _Operators(TorchDispatchMode):
    """The operators run, by name."""

    def __init__(self) -> None:
        super().__init__()
        self.names: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.add(str(func.overloadpacket))
        return func(*args, **(kwargs or {}))


# What a CUDA graph cannot hold: reads to the host, tensors made from host data (copied in at capture, so replays
# would reuse them), shapes that depend on values
_NOT_IN_A_GRAPH = {"aten._local_scalar_dense", "aten.is_nonzero", "aten.item", "aten.lift_fresh", "aten.nonzero",
                   "aten.masked_select", "aten.unique", "aten._unique2", "aten.masked_scatter"}


@pytest.mark.parametrize("search", ["greedy", "beam"])
def test_a_step_holds_nothing_a_cuda_graph_cannot(monkeypatch, search: str) -> None:
    from transformer.inference import fixed_shape

    operators = _Operators()

    def run(step, steps, done, check_every, use_graph, device) -> int:  # the step as _captured would record it
        step()
        with operators:
            step()
        return 2

    monkeypatch.setattr(fixed_shape, "_run", run)
    model, src = tiny_model(), varied_sources()
    if search == "greedy":
        fixed_shape_greedy(model, src, **REAL)
    else:
        fixed_shape_beam(model, src, beam_size=3, n_best=2, length_penalty=0.6, length_norm=LengthNorm.gnmt, **REAL)
    assert {"aten.linear", "aten.scaled_dot_product_attention"} <= operators.names  # a whole decoder step ran
    assert operators.names & _NOT_IN_A_GRAPH == set()


def test_check_every_must_be_positive_and_the_slots_fit_the_positions() -> None:
    with pytest.raises(ValueError, match="check_every must be >= 1, got 0"):
        fixed_shape_greedy(tiny_model(), varied_sources(), check_every=0, **REAL)
    with pytest.raises(ValueError, match="max_len=65 is beyond model.max_positions=64"):
        fixed_shape_greedy(tiny_model(), varied_sources(), **{**REAL, "max_len_b": 56})
    assert len(fixed_shape_greedy(tiny_model(), varied_sources(), max_tgt_len=64, **{**REAL, "max_len_b": 56})) == 6


def test_fixed_shapes_are_the_default_on_a_gpu_only_where_they_can_run() -> None:
    model = tiny_model()
    default = EvalConfig()
    assert searches_in_fixed_shapes(default, model, "cuda") and searches_in_fixed_shapes(default, model, "cuda:1")
    assert not searches_in_fixed_shapes(default, model, "cpu")  # carrying finished rows costs a CPU time
    assert not searches_in_fixed_shapes(default, Ensemble([model, model]), "cuda")  # one model only
    assert not searches_in_fixed_shapes(EvalConfig(use_cache=False), model, "cuda")  # the slots are the cache
    assert not searches_in_fixed_shapes(EvalConfig(beam_size=1, sampling_topk=0), model, "cuda")  # it samples
    assert searches_in_fixed_shapes(EvalConfig(fixed_shape=True), model, "cpu")  # asked for: as asked
    assert not searches_in_fixed_shapes(EvalConfig(fixed_shape=False), model, "cuda")


def test_eval_fixed_shape_without_the_cache_is_refused_by_key() -> None:
    with pytest.raises(ConfigError, match="eval.fixed_shape: runs on the decoder's cache: set eval.use_cache=true"):
        EvalConfig(fixed_shape=True, use_cache=False)
    assert EvalConfig(fixed_shape=True, beam_size=5).fixed_shape


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_the_cuda_graphs_replay_the_fixed_shape_searches_on_a_gpu() -> None:
    model, src = tiny_model().cuda(), varied_sources().cuda()
    ordinary = greedy_hypotheses(model, src, length_penalty=0.6, length_norm=LengthNorm.gnmt, **REAL)
    beams = dict(beam_size=4, n_best=2, length_penalty=1.5, length_norm=LengthNorm.gnmt, **REAL)
    ordinary_beams = beam_search(model, src, **beams)
    for cuda_graph in (False, True):
        fixed = fixed_shape_greedy(model, src, length_penalty=0.6, length_norm=LengthNorm.gnmt, cuda_graph=cuda_graph,
                                   **REAL)
        assert_same_hypotheses(fixed, ordinary, tolerance=1e-4)
        assert_same_nbest(fixed_shape_beam(model, src, cuda_graph=cuda_graph, **beams), ordinary_beams, tolerance=1e-4)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_the_cuda_graphs_replay_the_fixed_shape_searches_of_a_bfloat16_model_on_a_gpu() -> None:
    model, src = tiny_model().cuda().to(torch.bfloat16), varied_sources().cuda()  # eval.precision=bf16's copy
    ordinary = greedy_hypotheses(model, src, length_penalty=0.6, length_norm=LengthNorm.gnmt, **REAL)
    beams = dict(beam_size=4, n_best=2, length_penalty=1.5, length_norm=LengthNorm.gnmt, **REAL)
    ordinary_beams = beam_search(model, src, **beams)
    for cuda_graph in (False, True):  # the same kernels as the ordinary search's, in bfloat16 (on a CPU: exact)
        fixed = fixed_shape_greedy(model, src, length_penalty=0.6, length_norm=LengthNorm.gnmt, cuda_graph=cuda_graph,
                                   **REAL)
        assert_same_hypotheses(fixed, ordinary, tolerance=5e-2)
        assert_same_nbest(fixed_shape_beam(model, src, cuda_graph=cuda_graph, **beams), ordinary_beams, tolerance=5e-2)


@pytest.mark.parametrize("at_once", [False, True])  # one layer at a time (a CPU's way), the whole block (a GPU's)
def test_a_reorder_gives_each_row_the_keys_and_values_of_its_parent(at_once: bool) -> None:
    model, src = tiny_model(), varied_sources()
    cache = model.init_slot_cache(model.encode(src), max_len=6)
    torch.manual_seed(0)
    cache.slots_kv.copy_(torch.randn_like(cache.slots_kv))
    before = cache.slots_kv.clone()
    rows = torch.randint(src.size(0), (src.size(0),))
    cache.reorder_(rows, at_once=at_once)
    for i, parent in enumerate(rows.tolist()):  # (layers, 2, batch, heads, max_len, d_head)
        assert torch.equal(cache.slots_kv[:, :, i], before[:, :, parent])
    for n, layer in enumerate(cache.self_attn):  # in place: each layer's views see the reordered block
        assert torch.equal(layer.key, cache.slots_kv[n, 0]) and torch.equal(layer.value, cache.slots_kv[n, 1])


def test_the_stopping_rule_by_hand() -> None:
    inf = math.inf
    alive = torch.tensor([[-1.0, -inf], [-inf, -inf], [-1.0, -3.0], [-1.0, -3.0], [-1.0, -inf]])  # (batch, beam)
    n_finished = torch.tensor([0, 0, 1, 1, 2])
    finished = torch.tensor([[-inf, -inf], [-inf, -inf], [-0.5, -inf], [-2.0, -inf], [-3.0, -4.0]],
                            dtype=torch.float64)
    # still open / nothing alive / the finished one beats every alive one / an alive one may beat it / likewise
    expected = [False, True, True, False, False]
    assert _cannot_win(alive, n_finished, finished, torch.ones(5, dtype=torch.float64), 1,
                       LengthNorm.none).tolist() == expected
    # with normalization, a full beam of finished ends the sentence; the bound lifts the best alive one's score:
    # -1 / 0.4 = -2.5, so -2.0 wins now
    bound = torch.full((5,), 0.4, dtype=torch.float64)
    assert _cannot_win(alive, n_finished, finished, bound, 1, LengthNorm.average).tolist() == [False, True, True,
                                                                                               True, True]


def test_the_bfloat16_copy_of_a_training_model_leaves_its_gradients_behind() -> None:
    from transformer.inference.translation import decoding_model

    model = tiny_model()
    model(varied_sources(), varied_sources()).sum().backward()  # as during training, at a validation
    bf16 = decoding_model(model, Precision.bf16, "cpu")
    assert all(p.grad is None and p.dtype == torch.bfloat16 for p in bf16.parameters())
    assert all(p.grad is not None and p.dtype == torch.float32 for p in model.parameters() if p.requires_grad)


@pytest.mark.slow
def test_a_bfloat16_copy_decodes_the_trained_reversal_model(reversal_model) -> None:
    from transformer.inference.translation import decoding_model

    bf16 = decoding_model(reversal_model, Precision.bf16, "cpu")
    assert bf16 is not reversal_model and next(bf16.parameters()).dtype == torch.bfloat16
    assert next(reversal_model.parameters()).dtype == torch.float32  # the model itself is left as it was
    assert decoding_model(bf16, Precision.bf16, "cpu") is bf16  # already in bfloat16: no second copy
    for kept in (Precision.fp32, Precision.auto):  # auto: bf16 on a GPU only
        assert decoding_model(reversal_model, kept, "cpu") is reversal_model
    src, _, _ = reversal_batch(torch.Generator().manual_seed(7), 50)  # held-out strings
    expected = [row[row != PAD_ID].flip(0).tolist() for row in src]
    beams = dict(beam_size=4, n_best=1, length_penalty=0.6, length_norm=LengthNorm.gnmt, max_len_a=1.0, max_len_b=3,
                 **SPECIAL)
    found = fixed_shape_beam(bf16, src, **beams)
    assert sum(b[0].tokens == e for b, e in zip(found, expected)) >= 49
    exact = fixed_shape_beam(reversal_model, src, **beams)
    same = [(b[0], e[0]) for b, e in zip(found, exact) if b[0].tokens == e[0].tokens]
    assert len(same) >= 49
    # bfloat16 keeps about three significant digits: the scores of the same hypotheses stay close
    assert [b.score for b, _ in same] == pytest.approx([e.score for _, e in same], abs=0.05)


def test_translate_hypotheses_searches_with_the_model_eval_precision_asks_for(monkeypatch) -> None:
    from transformer.inference import translation

    class Ids:  # a tokenizer of letters, enough to reach the search
        pad_id, bos_id, eos_id = PAD_ID, 1, EOS_ID

        def encode(self, text: str) -> list[int]:
            return [4 + ord(c) % 20 for c in text]

    seen = []
    monkeypatch.setattr(translation, "_search", lambda model, src, *args: seen.append(next(model.parameters()).dtype)
                        or [[translation.Hypothesis([], 0.0, 0.0)]] * src.size(0))
    model = tiny_model()
    for precision in (Precision.fp32, Precision.bf16):
        translation.translate_hypotheses(model, ["abc", "de"], Ids(), Ids(), EvalConfig(precision=precision), "cpu", 64)
    assert seen == [torch.float32, torch.bfloat16]
    assert next(model.parameters()).dtype == torch.float32
