"""Random sampling (transformer/inference/sampling.py): the distribution each filter leaves, computed by hand; draws
that follow it; samples scored as the model scores them; seeded, cached = uncached, and the settings' checks."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
from torch import Tensor, nn

from transformer.config import ConfigError, EvalConfig, LengthNorm, ModelConfig, TrainConfig
from transformer.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from transformer.inference.sampling import Sampler
from transformer.inference.search import greedy_hypotheses
from transformer.model.transformer import build_model

PROBS = [0.4, 0.3, 0.15, 0.1, 0.05]
SEARCH = dict(pad_id=PAD_ID, bos_id=BOS_ID, eos_id=EOS_ID, max_len_a=1.0, max_len_b=4)


def sampler(topk: int = 0, topp: float = 1.0, temperature: float = 1.0, seed: int = 0) -> Sampler:
    return Sampler(topk, topp, temperature, torch.Generator().manual_seed(seed))


def log_probs(*rows: list[float]) -> Tensor:
    return torch.tensor(rows).log()  # a probability of 0 is -inf: a token that may not come


@pytest.mark.parametrize("settings, expected", [
    (dict(), PROBS),
    (dict(topk=2), [0.4 / 0.7, 0.3 / 0.7, 0, 0, 0]),
    (dict(topk=9), PROBS),  # more than the vocabulary: no cut
    (dict(topp=0.8), [0.4 / 0.85, 0.3 / 0.85, 0.15 / 0.85, 0, 0]),  # 0.4 + 0.3 < 0.8: the third is needed
    (dict(topp=0.69), [0.4 / 0.7, 0.3 / 0.7, 0, 0, 0]),  # reached with two: no more
    (dict(topp=0.1), [1, 0, 0, 0, 0]),  # the likeliest always stays
    (dict(temperature=2.0), [p ** 0.5 / sum(q ** 0.5 for q in PROBS) for p in PROBS]),
    (dict(topk=3, topp=0.5), [0.4 / 0.7, 0.3 / 0.7, 0, 0, 0]),  # top 3 renormalised: 0.47, 0.35, 0.18
])
def test_each_filter_leaves_the_distribution_computed_by_hand(settings, expected) -> None:
    got = sampler(**settings).distribution(log_probs(PROBS))[0]
    assert got.tolist() == pytest.approx(expected, abs=1e-6)


def test_a_token_that_may_not_come_is_never_drawn_and_ties_with_the_kth_stay() -> None:
    got = sampler(topk=2).distribution(log_probs([0.0, 0.4, 0.2, 0.2, 0.2]))[0]
    assert got.tolist() == pytest.approx([0, 0.4, 0.2, 0.2, 0.2], abs=1e-6)
    draws = sampler(seed=3).draw(log_probs(*[[0.0, 0.5, 0.5, 0.0, 0.0]] * 2000))
    assert set(draws.flatten().tolist()) == {1, 2}


@pytest.mark.parametrize("settings", [dict(), dict(topk=3, temperature=0.5), dict(topp=0.8)])
def test_draws_follow_the_distribution(settings) -> None:
    chosen = sampler(**settings)
    expected = chosen.distribution(log_probs(PROBS))[0]
    draws = chosen.draw(log_probs(*[PROBS] * 40_000)).flatten()  # (40000,)
    frequencies = torch.bincount(draws, minlength=len(PROBS)).double() / len(draws)
    assert frequencies.tolist() == pytest.approx(expected.tolist(), abs=0.01)  # 4.5 standard deviations at most


# --------------------------------------------------------------------------------------------------
# Sampling inside the search, on a tiny random model
# --------------------------------------------------------------------------------------------------


def flat_model(seed: int = 2, vocab: int = 24) -> nn.Module:
    """A random tiny model: its distributions are wide, so samples differ from each other and from greedy."""
    torch.manual_seed(seed)
    cfg = ModelConfig(d_model=16, n_heads=2, d_ff=32, n_encoder_layers=1, n_decoder_layers=1, dropout=0.0,
                      attention_dropout=0.0, max_positions=64, tie_output=False, share_embeddings=False)
    return build_model(cfg, vocab, vocab, PAD_ID).eval()


def sources(n: int = 8, vocab: int = 24) -> Tensor:
    """(n, 7) sources of 1 to 7 tokens, right-padded."""
    gen = torch.Generator().manual_seed(1)
    src = torch.full((n, 7), PAD_ID)
    for row in range(n):
        length = row % 7 + 1
        src[row, :length] = torch.randint(4, vocab, (length,), generator=gen)
    return src


def sequence_log_prob(model: nn.Module, src: Tensor, tokens: list[int], ended: bool) -> float:
    """The model's log-probability of ``tokens`` (and EOS when ``ended``) by one teacher-forced pass, PAD and BOS
    out of the distribution (they are never generated): independent of the search."""
    logits = model(src, torch.tensor([[BOS_ID, *tokens]]))[0].float()  # (len + 1, vocab)
    logits[:, [PAD_ID, BOS_ID]] = -math.inf
    steps = torch.log_softmax(logits, dim=-1)
    return sum(float(steps[t, token]) for t, token in enumerate(tokens + [EOS_ID] if ended else tokens))


def sample(model: nn.Module, src: Tensor, seed: int = 0, **settings) -> list[list[int]]:
    hypotheses = greedy_hypotheses(model, src, sampler=sampler(seed=seed, **settings), **SEARCH)
    return [h.tokens for h in hypotheses]


@torch.inference_mode()
def test_samples_are_scored_with_the_model_s_own_log_probability() -> None:
    model, src = flat_model(), sources()
    hypotheses = greedy_hypotheses(model, src, sampler=sampler(temperature=1.5), length_norm=LengthNorm.average,
                                   **SEARCH)
    greedy = [h.tokens for h in greedy_hypotheses(model, src, **SEARCH)]
    assert [h.tokens for h in hypotheses] != greedy
    limits = [int(n) + 4 for n in (src != PAD_ID).sum(dim=1)]
    for row, (h, limit) in enumerate(zip(hypotheses, limits)):
        ended = len(h.tokens) < limit
        one = src[row : row + 1, : int((src[row] != PAD_ID).sum())]
        assert h.log_prob == pytest.approx(sequence_log_prob(model, one, h.tokens, ended), abs=1e-4)
        assert h.score == pytest.approx(h.log_prob / (len(h.tokens) + ended), abs=1e-5)  # average: per token


@torch.inference_mode()
def test_the_same_seed_gives_the_same_samples_cached_or_not_and_another_seed_others() -> None:
    model, src = flat_model(), sources()
    first = sample(model, src)
    assert sample(model, src) == first
    uncached = greedy_hypotheses(model, src, sampler=sampler(), use_cache=False, **SEARCH)
    assert [h.tokens for h in uncached] == first
    assert sample(model, src, seed=1) != first


@torch.inference_mode()
def test_a_temperature_near_zero_or_the_top_token_alone_is_greedy_search() -> None:
    model, src = flat_model(), sources()
    greedy = [h.tokens for h in greedy_hypotheses(model, src, **SEARCH)]
    assert sample(model, src, temperature=1e-4) == greedy
    assert sample(model, src, topp=1e-6) == greedy


def test_the_settings_are_checked_by_key() -> None:
    with pytest.raises(ConfigError, match=r"^eval.sampling_topk=0: samples one token at a time.*eval.beam_size=1"):
        EvalConfig(sampling_topk=0)
    with pytest.raises(ConfigError, match=r"^eval.sampling_topp=0.9: applies to sampling.*eval.sampling_topk=0"):
        EvalConfig(sampling_topp=0.9)
    with pytest.raises(ConfigError, match=r"^eval.sampling_temperature: must be > 0, got 0.0"):
        EvalConfig(beam_size=1, sampling_topk=0, sampling_temperature=0.0)
    with pytest.raises(ConfigError, match=r"^eval.sampling_topp: must be in \(0, 1\], got 1.5"):
        EvalConfig(beam_size=1, sampling_topk=0, sampling_topp=1.5)
    with pytest.raises(ConfigError, match=r"^eval.fixed_shape: searches; it does not sample"):
        EvalConfig(beam_size=1, sampling_topk=0, fixed_shape=True)
    with pytest.raises(ConfigError, match=r"^eval.sampling_topk: a training run chooses and scores its model with"):
        TrainConfig(eval=EvalConfig(beam_size=1, sampling_topk=0))
    samples = EvalConfig(beam_size=1, sampling_topk=0, n_best=5)  # n_best: samples, not limited by the beam
    assert Sampler.from_config(samples, "cpu") is not None and Sampler.from_config(EvalConfig(), "cpu") is None
    assert replace(samples, n_best=1).n_best == 1
