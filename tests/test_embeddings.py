"""Token embeddings and positions: hand-computed sinusoid values, odd d_model, scaling, offsets."""

from __future__ import annotations

import math

import pytest
import torch

from transformer.config import PositionKind
from transformer.model.embeddings import Embeddings, RotaryPositions, TokenEmbedding, sinusoidal_positions


def test_sinusoid_matches_the_formula_by_hand() -> None:
    table = sinusoidal_positions(5, 4)
    assert table.shape == (5, 4)
    # pos 0: sin 0 = 0, cos 0 = 1
    assert table[0].tolist() == [0.0, 1.0, 0.0, 1.0]
    # pos 3, i = 1: angle = 3 / 10000^(2/4) = 0.03
    assert table[3, 2].item() == pytest.approx(math.sin(0.03), abs=1e-7)
    assert table[3, 3].item() == pytest.approx(math.cos(0.03), abs=1e-7)
    assert table[3, 0].item() == pytest.approx(math.sin(3.0), abs=1e-7)


def test_sinusoid_works_for_odd_d_model() -> None:
    d = 75
    table = sinusoidal_positions(10, d)
    assert table.shape == (10, d)
    # the last column (74 = 2*37) is a sine with frequency 10000^(74/75)
    assert table[7, 74].item() == pytest.approx(math.sin(7 / 10000 ** (74 / 75)), abs=1e-7)
    assert table[7, 73].item() == pytest.approx(math.cos(7 / 10000 ** (72 / 75)), abs=1e-7)
    assert torch.isfinite(table).all()


def test_token_embedding_is_scaled_and_pad_row_is_zero() -> None:
    torch.manual_seed(0)
    emb = TokenEmbedding(50, 16, pad_id=3)
    assert torch.equal(emb.weight[3], torch.zeros(16))
    out = emb(torch.tensor([[1, 3]]))
    assert torch.allclose(out[0, 0], emb.weight[1] * 4.0)
    assert torch.equal(out[0, 1], torch.zeros(16))
    # normal(0, d^-0.5) init: the scaled embedding has roughly unit variance
    assert 0.8 < (emb.weight[4:] * 4.0).std().item() < 1.2


def test_sinusoidal_embeddings_add_positions_from_offset() -> None:
    token = TokenEmbedding(10, 6, pad_id=0)
    embed = Embeddings(token, PositionKind.sinusoidal, max_positions=8, dropout=0.0)
    tokens = torch.tensor([[4, 5, 6]])
    full = embed(tokens)
    assert torch.allclose(full - token(tokens), sinusoidal_positions(8, 6)[:3], atol=1e-6)
    assert torch.allclose(embed(tokens[:, 2:], offset=2), full[:, 2:])
    assert "sinusoid" not in embed.state_dict()  # recomputed, not stored in checkpoints


def test_learned_positions_are_a_trainable_table() -> None:
    token = TokenEmbedding(10, 6, pad_id=0)
    embed = Embeddings(token, PositionKind.learned, max_positions=8, dropout=0.0)
    tokens = torch.tensor([[4, 5, 6]])
    assert torch.allclose(embed(tokens) - token(tokens), embed.learned.weight[:3], atol=1e-6)
    assert torch.allclose(embed(tokens[:, 1:], offset=1), embed(tokens)[:, 1:])
    embed(tokens).sum().backward()
    assert embed.learned.weight.grad[:3].abs().sum() > 0 and embed.learned.weight.grad[3:].abs().sum() == 0


def test_positions_beyond_the_table_are_a_clear_error() -> None:
    embed = Embeddings(TokenEmbedding(10, 6, pad_id=0), PositionKind.sinusoidal, max_positions=4, dropout=0.0)
    with pytest.raises(ValueError, match="max_positions=4"):
        embed(torch.ones(1, 3, dtype=torch.long), offset=2)


def test_rotary_positions_rotate_each_pair_by_position_times_its_frequency() -> None:
    rope = RotaryPositions(d_head=4, max_positions=8, base=100.0)  # pairs (0, 2) and (1, 3); frequencies 1, 0.1
    x = torch.tensor([1.0, 0.0, 0.0, 2.0]).view(1, 1, 1, 4)  # pair 0 = (1, 0), pair 1 = (0, 2)
    out = rope(x, offset=3).flatten()  # position 3: angles 3 and 0.3
    expected = [math.cos(3), -2 * math.sin(0.3), math.sin(3), 2 * math.cos(0.3)]
    assert out.tolist() == pytest.approx(expected, abs=1e-6)
    assert torch.equal(rope(x, offset=0), x)  # position 0: no rotation


def test_rotary_scores_depend_only_on_the_position_difference() -> None:
    gen = torch.Generator().manual_seed(0)
    rope = RotaryPositions(d_head=6, max_positions=64, base=10000.0)
    q, k = torch.randn(1, 1, 1, 6, generator=gen), torch.randn(1, 1, 1, 6, generator=gen)

    def score(m: int, n: int) -> float:
        return (rope(q, m) * rope(k, n)).sum().item()

    for m, n in ((5, 2), (2, 5), (7, 7)):
        for shift in (1, 10, 40):
            assert score(m + shift, n + shift) == pytest.approx(score(m, n), abs=1e-5)
    assert score(5, 2) != pytest.approx(score(2, 5), abs=1e-3)  # the sign of the difference matters
    with pytest.raises(ValueError, match="beyond model.max_positions=64"):
        rope(q, 64)


def test_rope_and_none_add_nothing_to_the_embeddings() -> None:
    token = TokenEmbedding(10, 6, pad_id=0)
    tokens = torch.tensor([[3, 4, 5]])
    for kind in (PositionKind.rope, PositionKind.none):
        embed = Embeddings(token, kind, max_positions=8, dropout=0.0)
        assert torch.equal(embed(tokens, offset=2), token(tokens))
