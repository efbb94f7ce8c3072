"""Additive and multiplicative scores and relative positions: hand-computed examples, gradcheck, fused = explicit,
and the relative term depending on positions only through the distance j - i."""

from __future__ import annotations

import math

import pytest
import torch
from torch.func import functional_call

from transformer.config import AttentionScore
from transformer.model.attention import MultiHeadAttention, additive_scores, scaled_dot_product_attention
from transformer.model.embeddings import RelativePositions
from transformer.model.masks import causal_mask


def _identity_attention(score: AttentionScore = AttentionScore.scaled_dot, max_distance: int | None = None,
                        d: int = 2) -> MultiHeadAttention:
    """One head of size d whose Q, K, V and output projections are the identity: queries and keys are the inputs."""
    relative = None if max_distance is None else RelativePositions(d, max_distance)
    mha = MultiHeadAttention(d, 1, d, bias=False, relative=relative, score=score).eval()
    with torch.no_grad():
        mha.in_proj_weight.copy_(torch.eye(d).repeat(3, 1))
        mha.out_proj.weight.copy_(torch.eye(d))
    return mha


def test_additive_scores_by_hand() -> None:
    query = torch.tensor([[[[1.0, 0.0]]]])  # (1, 1, 1, 2)
    key = torch.tensor([[[[0.0, 0.0], [1.0, 1.0]]]])  # (1, 1, 2, 2)
    v = torch.tensor([[1.0, -1.0]])
    # vᵀ tanh(q + k): tanh([1, 0]) = [0.761594, 0] -> 0.761594;  tanh([2, 1]) = [0.964028, 0.761594] -> 0.202433
    assert additive_scores(query, key, v).flatten().tolist() == pytest.approx([0.761594, 0.202433], abs=1e-6)


@pytest.mark.parametrize("need_weights", [True, False])
def test_additive_attention_by_hand(need_weights: bool) -> None:
    mha = _identity_attention(AttentionScore.additive)
    with torch.no_grad():
        mha.score_vector.copy_(torch.tensor([[1.0, -1.0]]))
    query = torch.tensor([[[1.0, 0.0]]])
    keys = torch.tensor([[[0.0, 0.0], [1.0, 1.0]]])
    out = mha(query, keys, keys, need_weights=True)
    # softmax([0.761594, 0.202433]) = [0.636258, 0.363742]; values = keys: the output is 0.363742 · [1, 1]
    assert out.weights.flatten().tolist() == pytest.approx([0.636258, 0.363742], abs=1e-6)
    fused = mha(query, keys, keys, need_weights=need_weights)
    assert fused.output.flatten().tolist() == pytest.approx([0.363742, 0.363742], abs=1e-6)


@pytest.mark.parametrize("need_weights", [True, False])
def test_multiplicative_attention_by_hand(need_weights: bool) -> None:
    mha = _identity_attention(AttentionScore.multiplicative)
    with torch.no_grad():
        mha.score_weight.copy_(torch.tensor([[[1.0, 2.0], [0.0, 1.0]]]))
    query = torch.tensor([[[1.0, 0.0]]])
    keys = torch.tensor([[[1.0, 0.0], [0.0, 1.0]]])
    # qᵀWk: qᵀW = [1, 2], so the scores are [1, 2] (no 1/√d) and the weights softmax([1, 2]) = [0.26894, 0.73106]
    out = mha(query, keys, keys, need_weights=need_weights)
    assert out.output.flatten().tolist() == pytest.approx([0.26894, 0.73106], abs=1e-5)
    if need_weights:
        assert out.weights.flatten().tolist() == pytest.approx([0.26894, 0.73106], abs=1e-5)


def test_multiplicative_starts_as_scaled_dot() -> None:
    torch.manual_seed(0)
    dot = MultiHeadAttention(12, 3, 6).eval()
    torch.manual_seed(0)
    general = MultiHeadAttention(12, 3, 6, score=AttentionScore.multiplicative).eval()
    x = torch.randn(2, 5, 12)
    assert torch.allclose(general(x, x, x).output, dot(x, x, x).output, atol=1e-6)
    assert sum(p.numel() for p in general.parameters()) - sum(p.numel() for p in dot.parameters()) == 3 * 6 * 6


def test_relative_positions_by_hand() -> None:
    mha = _identity_attention(max_distance=1)
    with torch.no_grad():  # rows: r_-1, r_0, r_+1
        mha.relative.table.copy_(torch.tensor([[1.0, 0.0], [0.0, 0.0], [0.0, 1.0]]))
    x = torch.tensor([[[1.0, 1.0], [1.0, 0.0], [0.0, 1.0]]])  # (1, 3, 2)
    # q_i · r_clip(j-i): row 0 sees r_0, r_+1, r_+1 (distance 2 clipped); row 1 r_-1, r_0, r_+1; row 2 r_-1, r_-1, r_0
    relative = mha.relative(x[:, None], k_len=3)
    assert relative[0, 0].tolist() == [[0.0, 1.0, 1.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]]
    # plus q_i · k_j = [[2, 1, 1], [1, 1, 0], [1, 0, 1]], all over √2
    scores = torch.tensor([[2.0, 2.0, 2.0], [2.0, 1.0, 0.0], [1.0, 0.0, 1.0]]) / math.sqrt(2)
    out = mha(x, x, x, need_weights=True)
    assert torch.allclose(out.weights[0, 0], torch.softmax(scores, dim=-1), atol=1e-6)
    # queries at positions 1, 2 (a cache holding position 0) get the rows 1, 2 of the same term
    assert torch.equal(mha.relative(x[:, None, 1:], k_len=3, offset=1)[0, 0], relative[0, 0, 1:])


def test_relative_scores_depend_on_positions_only_through_the_distance() -> None:
    torch.manual_seed(0)
    mha = MultiHeadAttention(8, 2, 4, relative=RelativePositions(4, max_distance=3)).eval()
    with torch.no_grad():
        mha.relative.table.normal_()
    x = torch.randn(1, 6, 8)
    out = mha(x, x, x).output
    # shift: the same tokens after 4 keys nobody may attend to, i.e. at positions 4..9: the same outputs
    shifted = torch.cat([torch.randn(1, 4, 8), x], dim=1)
    mask = torch.arange(10).ge(4)[None, None, None, :]  # (1, 1, 1, 10), True = may attend
    assert torch.allclose(mha(shifted, shifted, shifted, mask=mask).output[:, 4:], out, atol=1e-5)
    # the term itself: one query vector at every position gives a matrix constant along each diagonal j - i,
    # and distances beyond max_distance share r_{±max_distance}
    same = torch.randn(1, 1, 1, 4).expand(1, 1, 7, 4)
    term = mha.relative(same, k_len=7)[0, 0]  # (7, 7)
    assert torch.equal(term[1:, 1:], term[:-1, :-1])  # (i + 1, j + 1) scores as (i, j)
    assert term[0, 3] == term[0, 6] and term[3, 0] == term[6, 0]  # clipped at ±3
    # a permutation of the tokens is not undone by the positions: the outputs differ from the permuted outputs
    order = torch.tensor([3, 0, 5, 1, 4, 2])
    assert not torch.allclose(mha(x[:, order], x[:, order], x[:, order]).output, out[:, order], atol=1e-3)


@pytest.mark.parametrize("score", list(AttentionScore))
@pytest.mark.parametrize("relative", [False, True])
def test_gradcheck_float64_every_score(score: AttentionScore, relative: bool) -> None:
    torch.manual_seed(1)
    mha = MultiHeadAttention(6, 2, 3, relative=RelativePositions(3, 2) if relative else None, score=score).double()
    mha.train()  # no attention dropout was given, so training mode is deterministic
    x = torch.randn(2, 4, 6, dtype=torch.float64, requires_grad=True)
    mask = torch.ones(2, 1, 4, 4, dtype=torch.bool)
    mask[0, 0, 1] = False  # one query with no key
    mask[1, 0, :, 3:] = False
    names = [name for name, _ in mha.named_parameters()]
    params = [p.detach().clone().requires_grad_() for p in mha.parameters()]

    def attend(x: torch.Tensor, *params: torch.Tensor) -> torch.Tensor:
        return functional_call(mha, dict(zip(names, params)), (x, x, x), {"mask": mask}).output

    assert torch.autograd.gradcheck(attend, (x, *params))
    assert torch.equal(attend(x, *params)[0, 1], torch.zeros(6, dtype=torch.float64))  # the empty row


@pytest.mark.parametrize("causal", [False, True])
def test_bias_on_the_fused_path_equals_the_explicit_one(causal: bool) -> None:
    torch.manual_seed(2)
    q, k, v = (torch.randn(2, 3, 5, 4, requires_grad=True) for _ in range(3))
    bias = torch.randn(2, 3, 5, 5, requires_grad=True)
    mask = None if causal else torch.tensor([True, True, True, False, False])[None, None, None, :]
    reference_mask = causal_mask(5) if causal else mask
    d_out = torch.randn(2, 3, 5, 4)
    explicit, weights = scaled_dot_product_attention(q, k, v, reference_mask, need_weights=True, bias=bias)
    manual = torch.softmax((q @ k.transpose(-2, -1) / 2 + bias).masked_fill(~reference_mask, float("-inf")), -1)
    assert torch.allclose(weights, manual, atol=1e-6)
    fused, _ = scaled_dot_product_attention(q, k, v, mask, is_causal=causal, bias=bias)
    assert torch.allclose(fused, explicit, atol=1e-5)
    for g_e, g_f in zip(torch.autograd.grad(explicit, (q, k, v, bias), d_out),
                        torch.autograd.grad(fused, (q, k, v, bias), d_out)):
        assert torch.allclose(g_e, g_f, atol=1e-5)
