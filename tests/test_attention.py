"""Scaled dot-product attention and MultiHeadAttention against hand-computed and independent oracles."""

from __future__ import annotations

import math

import pytest
import torch

from transformer.model.attention import KVCache, MultiHeadAttention, scaled_dot_product_attention
from transformer.model.masks import causal_mask, decoder_self_mask, key_mask, padding_mask

PAD = 0


def test_worked_example_weights() -> None:
    query = torch.tensor([[[[1.0, 2.0]]]])  # (1, 1, 1, 2)
    key = torch.tensor([[[[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]]])  # (1, 1, 3, 2)
    value = torch.eye(3)[None, None]  # output = weights
    assert (query @ key.transpose(-2, -1)).flatten().tolist() == [1.0, 2.0, 3.0]
    # unscaled softmax([1, 2, 3]): feed Q·√2 so the function's 1/√d_k cancels
    _, unscaled = scaled_dot_product_attention(query * math.sqrt(2), key, value, need_weights=True)
    assert unscaled.flatten().tolist() == pytest.approx([0.0900, 0.2447, 0.6652], abs=1e-4)
    # scaled by √d_k with d_k = 2
    out, weights = scaled_dot_product_attention(query, key, value, need_weights=True)
    assert weights.flatten().tolist() == pytest.approx([0.1400, 0.2840, 0.5760], abs=1e-4)
    fused, none = scaled_dot_product_attention(query, key, value)
    assert none is None
    assert torch.allclose(fused, out, atol=1e-6) and torch.allclose(out.flatten(), weights.flatten())


def test_explicit_path_gradients_equal_the_analytic_ones() -> None:
    torch.manual_seed(0)
    d_k = 4
    q = torch.randn(1, 1, 3, d_k, dtype=torch.float64, requires_grad=True)
    k = torch.randn(1, 1, 5, d_k, dtype=torch.float64, requires_grad=True)
    v = torch.randn(1, 1, 5, 2, dtype=torch.float64, requires_grad=True)
    d_out = torch.randn(1, 1, 3, 2, dtype=torch.float64)
    out, a = scaled_dot_product_attention(q, k, v, need_weights=True)
    out.backward(d_out)
    A, dO, Q, K, V = a.detach()[0, 0], d_out[0, 0], q.detach()[0, 0], k.detach()[0, 0], v.detach()[0, 0]
    dV = A.T @ dO
    dA = dO @ V.T
    dS = A * (dA - (A * dA).sum(dim=1, keepdim=True))
    dQ = dS @ K / math.sqrt(d_k)
    dK = dS.T @ Q / math.sqrt(d_k)
    assert torch.allclose(v.grad[0, 0], dV)
    assert torch.allclose(q.grad[0, 0], dQ)
    assert torch.allclose(k.grad[0, 0], dK)


@pytest.mark.parametrize("need_weights", [True, False])
def test_gradcheck_float64_with_a_fully_masked_row(need_weights: bool) -> None:
    torch.manual_seed(1)
    q = torch.randn(2, 2, 3, 4, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, 2, 4, 4, dtype=torch.float64, requires_grad=True)
    v = torch.randn(2, 2, 4, 3, dtype=torch.float64, requires_grad=True)
    mask = torch.ones(2, 1, 3, 4, dtype=torch.bool)
    mask[0, 0, 1] = False  # one query with no key
    mask[1, 0, :, 2:] = False

    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return scaled_dot_product_attention(q, k, v, mask, need_weights=need_weights)[0]

    assert torch.autograd.gradcheck(attend, (q, k, v))


def _mask_kinds() -> dict[str, torch.Tensor]:
    src = torch.tensor([[4, 5, 6, PAD, PAD], [4, 5, 6, 7, 8]])
    tgt = torch.tensor([[4, 5, PAD, PAD, PAD], [4, 5, 6, 7, PAD]])
    empty_src = torch.tensor([[PAD] * 5, [4, 5, 6, 7, 8]])  # an empty source: every row fully masked
    return {
        "padding": padding_mask(src, PAD),
        "causal": causal_mask(5),
        "decoder_self": decoder_self_mask(tgt, PAD),
        "fully_masked": padding_mask(empty_src, PAD),
        "none": None,
    }


@pytest.mark.parametrize("ready", [False, True])
@pytest.mark.parametrize("kind", list(_mask_kinds()))
def test_fused_and_explicit_paths_agree(kind: str, ready: bool) -> None:
    mask = _mask_kinds()[kind]
    if ready and mask is not None:  # the mask as the encoder and decoder pass it, readied once for every layer
        mask = key_mask(mask)
    torch.manual_seed(2)
    inputs = [torch.randn(2, 3, 5, 4, requires_grad=True) for _ in range(3)]
    d_out = torch.randn(2, 3, 5, 4)
    results = []
    for need_weights in (True, False):
        out, _ = scaled_dot_product_attention(*inputs, mask=mask, need_weights=need_weights)
        grads = torch.autograd.grad(out, inputs, d_out)
        results.append((out, grads))
    (out_e, grads_e), (out_f, grads_f) = results
    assert torch.isfinite(out_f).all() and all(torch.isfinite(g).all() for g in grads_f)
    assert torch.allclose(out_e, out_f, atol=1e-5)
    for g_e, g_f in zip(grads_e, grads_f):
        assert torch.allclose(g_e, g_f, atol=1e-5)


def test_is_causal_equals_the_causal_mask_on_both_paths() -> None:
    torch.manual_seed(3)
    inputs = [torch.randn(2, 3, 6, 4, requires_grad=True) for _ in range(3)]
    d_out = torch.randn(2, 3, 6, 4)
    reference, _ = scaled_dot_product_attention(*inputs, mask=causal_mask(6), need_weights=True)
    reference_grads = torch.autograd.grad(reference, inputs, d_out)
    for need_weights in (True, False):
        out, weights = scaled_dot_product_attention(*inputs, is_causal=True, need_weights=need_weights)
        assert torch.allclose(out, reference, atol=1e-5)
        for g, g_ref in zip(torch.autograd.grad(out, inputs, d_out), reference_grads):
            assert torch.allclose(g, g_ref, atol=1e-5)
        if need_weights:
            assert torch.equal(weights.triu(1), torch.zeros_like(weights))
    with pytest.raises(ValueError, match="is_causal needs no mask and q_len == k_len"):
        scaled_dot_product_attention(*inputs, mask=causal_mask(6), is_causal=True)
    with pytest.raises(ValueError, match="q_len=2, k_len=6"):
        scaled_dot_product_attention(inputs[0][:, :, :2], inputs[1], inputs[2], is_causal=True)


@pytest.mark.parametrize("need_weights", [True, False])
def test_fully_masked_rows_give_zeros_not_nan(need_weights: bool) -> None:
    q, k, v = (torch.randn(1, 2, 3, 4, requires_grad=True) for _ in range(3))
    mask = torch.tensor([True, False, True])[None, None, :, None].expand(1, 1, 3, 3)  # query 1 sees nothing
    out, weights = scaled_dot_product_attention(q, k, v, mask, need_weights=need_weights)
    assert torch.equal(out[:, :, 1], torch.zeros(1, 2, 4))
    if need_weights:
        assert torch.equal(weights[:, :, 1], torch.zeros(1, 2, 3))
        assert torch.allclose(weights[:, :, 0].sum(-1), torch.ones(1, 2))
    out.sum().backward()
    for t in (q, k, v):
        assert torch.isfinite(t.grad).all()
    assert torch.equal(q.grad[:, :, 1], torch.zeros(1, 2, 4))


def test_parameter_count_without_bias() -> None:
    assert sum(p.numel() for p in MultiHeadAttention(1024, 16, bias=False).parameters()) == 4_194_304
    mha = MultiHeadAttention(300, 8, d_head=64, bias=False)
    assert sum(p.numel() for p in mha.parameters()) == 614_400
    assert mha(torch.randn(2, 3, 300), torch.randn(2, 5, 300), torch.randn(2, 5, 300)).output.shape == (2, 3, 300)


def test_d_head_must_be_given_when_heads_do_not_divide_d_model() -> None:
    with pytest.raises(ValueError, match="d_model=300 is not divisible by n_heads=8"):
        MultiHeadAttention(300, 8)


def _per_head_oracle(mha: MultiHeadAttention, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     mask: torch.Tensor | None) -> torch.Tensor:
    """Multi-head attention written out head by head with plain softmax."""
    inner = mha.n_heads * mha.d_head
    w_q, w_k, w_v = mha.in_proj_weight.split(inner)
    b_q, b_k, b_v = mha.in_proj_bias.split(inner)
    heads = []
    for h in range(mha.n_heads):
        rows = slice(h * mha.d_head, (h + 1) * mha.d_head)
        q = query @ w_q[rows].T + b_q[rows]
        k = key @ w_k[rows].T + b_k[rows]
        v = value @ w_v[rows].T + b_v[rows]
        scores = q @ k.transpose(1, 2) / math.sqrt(mha.d_head)
        if mask is not None:
            scores = scores.masked_fill(~mask[:, 0], float("-inf"))
        heads.append(torch.softmax(scores, -1) @ v)
    return mha.out_proj(torch.cat(heads, dim=-1))


@pytest.mark.parametrize("need_weights", [True, False])
def test_multi_head_attention_matches_a_per_head_oracle(need_weights: bool) -> None:
    torch.manual_seed(3)
    mha = MultiHeadAttention(10, 3, d_head=4)  # 3·4 != 10
    x = torch.randn(2, 5, 10)
    memory = torch.randn(2, 6, 10)
    src_mask = padding_mask(torch.tensor([[4, 4, 4, 4, PAD, PAD], [4] * 6]), PAD)
    self_out = mha(x, x, x, mask=causal_mask(5), need_weights=need_weights)
    assert torch.allclose(self_out.output, _per_head_oracle(mha, x, x, x, causal_mask(5)), atol=1e-5)
    cross_out = mha(x, memory, memory, mask=src_mask, need_weights=need_weights)
    assert torch.allclose(cross_out.output, _per_head_oracle(mha, x, memory, memory, src_mask), atol=1e-5)
    value = torch.randn(2, 6, 10)
    kv_out = mha(x, memory, value, need_weights=need_weights)
    assert torch.allclose(kv_out.output, _per_head_oracle(mha, x, memory, value, None), atol=1e-5)
    assert (cross_out.weights is not None) == need_weights and cross_out.cache is None


def test_incremental_self_attention_cache_equals_the_full_pass() -> None:
    torch.manual_seed(4)
    mha = MultiHeadAttention(8, 2)
    x = torch.randn(3, 4, 8)
    full = mha(x, x, x, mask=causal_mask(4)).output
    cache = KVCache(torch.zeros(3, 0, 0, 0), torch.zeros(3, 0, 0, 0))
    steps = []
    for t in range(4):
        step = x[:, t : t + 1]
        out = mha(step, step, step, mask=causal_mask(1, t + 1), cache=cache)
        cache = out.cache
        steps.append(out.output)
    assert cache.length == 4 and not cache.static
    assert torch.allclose(torch.cat(steps, dim=1), full, atol=1e-6)


def test_static_cross_cache_is_projected_once_and_reused() -> None:
    torch.manual_seed(5)
    mha = MultiHeadAttention(8, 2)
    x, memory = torch.randn(3, 2, 8), torch.randn(3, 6, 8)
    static = mha.project_key_value(memory)
    assert static.static and static.key.shape == (3, 2, 6, 4)
    out = mha(x, None, None, cache=static)
    assert out.cache is static
    assert torch.allclose(out.output, mha(x, memory, memory).output, atol=1e-6)
    order = torch.tensor([2, 0, 0])
    picked = static.select(order)
    assert torch.equal(picked.key, static.key[order]) and picked.static
