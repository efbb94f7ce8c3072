"""The Transformer: configuration, masking invariances, cached decoding, attention maps, and learning."""

from __future__ import annotations

import pytest
import torch

from transformer.config import AttentionConfig, AttentionScore, ConfigError, ModelConfig, NormPosition, PositionKind
from transformer.inference.search import greedy_search
from transformer.model.transformer import Transformer, build_model, select_encoder_output

from toy_training import BOS as TOY_BOS
from toy_training import EOS as TOY_EOS
from toy_training import PAD as TOY_PAD
from toy_training import reversal_batch, train_reversal_model

# A toy vocabulary local to these tests: the model takes pad_id as an argument.
PAD, BOS, EOS, FIRST_DIGIT = 0, 1, 2, 3
VOCAB = 13


def _cfg(**overrides: object) -> ModelConfig:
    base = dict(d_model=16, n_heads=2, d_ff=32, n_encoder_layers=2, n_decoder_layers=2, dropout=0.0,
                attention_dropout=0.0, max_positions=64, share_embeddings=False)
    base.update(overrides)
    return ModelConfig(**base)  # type: ignore[arg-type]


def _model(seed: int = 0, **overrides: object) -> Transformer:
    torch.manual_seed(seed)
    model = build_model(_cfg(**overrides), VOCAB, VOCAB, PAD).eval()
    with torch.no_grad():  # move the score matrices off I/√d_head and the relative table off ~0: every term counts
        for name, parameter in model.named_parameters():
            if name.endswith(("score_weight", "score_vector", "relative.table")):
                parameter.normal_(0.0, 0.5)
    return model


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    src = torch.tensor([[4, 5, 6, 7, 8], [9, 10, 4, PAD, PAD], [11, PAD, PAD, PAD, PAD]])
    tgt_in = torch.tensor([[BOS, 8, 7, 6, 5, 4], [BOS, 4, 10, 9, PAD, PAD], [BOS, 11, PAD, PAD, PAD, PAD]])
    return src, tgt_in


CONFIGS = {
    "pre_sinusoidal": {},
    "post_learned": {"norm": NormPosition.post, "positions": PositionKind.learned},
    "shared_untied_odd": {"share_embeddings": True, "tie_output": False, "d_model": 15, "n_heads": 3},
    "free_head_size": {"d_model": 12, "n_heads": 5, "d_head": 4},
    "rope": {"positions": PositionKind.rope, "rope_base": 100.0},
    "rope_free_head_size": {"positions": PositionKind.rope, "d_model": 12, "n_heads": 5, "d_head": 6},
    "no_positions": {"positions": PositionKind.none},
    "relative": {"positions": PositionKind.relative, "max_relative_distance": 2},  # clipped within the batch
    "additive": {"attention": AttentionConfig(AttentionScore.additive)},
    "multiplicative_post": {"attention": AttentionConfig(AttentionScore.multiplicative), "norm": NormPosition.post},
    "relative_additive_free_head_size": {"positions": PositionKind.relative, "max_relative_distance": 3,
                                         "attention": AttentionConfig(AttentionScore.additive),
                                         "d_model": 12, "n_heads": 5, "d_head": 4},
    "rope_multiplicative": {"positions": PositionKind.rope, "attention": AttentionConfig(AttentionScore.multiplicative)},
}


def test_shapes_and_embedding_properties() -> None:
    model = _model(share_embeddings=True)
    src, tgt_in = _batch()
    assert model(src, tgt_in).shape == (3, 6, VOCAB)
    assert model.src_token_embedding is model.tgt_token_embedding
    assert model.output_proj is None  # tied to the target embedding
    assert torch.equal(model.src_token_embedding.weight[PAD], torch.zeros(16))
    untied = _model(tie_output=False)
    assert untied.src_token_embedding is not untied.tgt_token_embedding
    extra = sum(p.numel() for p in untied.parameters()) - sum(p.numel() for p in _model().parameters())
    assert extra == 16 * VOCAB  # exactly the separate output projection


def test_share_embeddings_needs_equal_vocab_sizes() -> None:
    with pytest.raises(ConfigError, match="model.share_embeddings.*13.*20"):
        build_model(_cfg(share_embeddings=True), 13, 20, PAD)
    assert build_model(_cfg(), 13, 20, PAD)(*_batch()).shape[-1] == 20


def test_init_is_xavier_and_scaled_normal() -> None:
    model = build_model(_cfg(d_model=32, d_ff=128), 500, 500, PAD)
    ff = model.encoder.layers[0].feed_forward.linear1.weight  # (128, 32)
    bound = (6 / (128 + 32)) ** 0.5
    assert ff.abs().max() <= bound and ff.abs().max() > 0.9 * bound
    assert torch.equal(model.encoder.layers[0].feed_forward.linear1.bias, torch.zeros(128))
    emb = model.src_token_embedding.weight[1:]
    assert abs(emb.std().item() - 32**-0.5) < 0.01


@pytest.mark.parametrize("name", list(CONFIGS))
def test_padded_batch_equals_each_sentence_alone(name: str) -> None:
    model = _model(**CONFIGS[name])
    src, tgt_in = _batch()
    batched = model(src, tgt_in)
    for i in range(3):
        s_len, t_len = int((src[i] != PAD).sum()), int((tgt_in[i] != PAD).sum())
        alone = model(src[i : i + 1, :s_len], tgt_in[i : i + 1, :t_len])
        assert torch.allclose(batched[i, :t_len], alone[0], atol=1e-5)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_later_target_tokens_do_not_change_earlier_outputs(name: str) -> None:
    model = _model(**CONFIGS[name])
    src, tgt_in = _batch()
    changed = tgt_in.clone()
    changed[:, 3:] = torch.randint(FIRST_DIGIT, VOCAB, (3, 3))
    a, b = model(src, tgt_in), model(src, changed)
    assert torch.allclose(a[:, :3], b[:, :3], atol=1e-6)
    assert not torch.allclose(a[:, 3:], b[:, 3:])


@pytest.mark.parametrize("name", list(CONFIGS))
def test_cached_decoding_equals_the_full_pass(name: str) -> None:
    model = _model(**CONFIGS[name])
    src, tgt_in = _batch()
    with torch.no_grad():
        enc = model.encode(src)
        full = model.decode(tgt_in, enc).logits  # the padding-masked full pass
        real = tgt_in != PAD
        # the training path (plain causal self-attention) agrees at every real position
        assert torch.allclose(model(src, tgt_in)[real], full[real], atol=1e-5)
        cache = model.init_cache(enc)
        steps = []
        for t in range(tgt_in.size(1)):
            out = model.decode(tgt_in[:, t : t + 1], enc, cache)
            cache = out.cache
            steps.append(out.logits)
        assert cache.length == tgt_in.size(1)
        assert torch.allclose(torch.cat(steps, dim=1), full, atol=1e-5)
        # several tokens at once on top of a cache
        cache = model.decode(tgt_in[:, :2], enc, model.init_cache(enc)).cache
        rest = model.decode(tgt_in[:, 2:], enc, cache).logits
        assert torch.allclose(rest, full[:, 2:], atol=1e-5)


@pytest.mark.parametrize("name", ["pre_sinusoidal", "rope", "relative", "relative_additive_free_head_size"])
def test_cached_decoding_after_select_reorders_rows(name: str) -> None:
    model = _model(**CONFIGS[name])
    src, tgt_in = _batch()
    order = torch.tensor([2, 0, 0, 1])  # reorder and repeat rows, as beam search does
    with torch.no_grad():
        full = model.decode(tgt_in[order], model.encode(src[order])).logits
        enc = model.encode(src)
        cache = model.decode(tgt_in[:, :3], enc, model.init_cache(enc)).cache  # 3 steps on the original rows
        cache, enc = cache.select(order), select_encoder_output(enc, order)
        steps = []
        for t in range(3, 5):
            out = model.decode(tgt_in[order][:, t : t + 1], enc, cache)
            cache = out.cache
            steps.append(out.logits)
        assert torch.allclose(torch.cat(steps, dim=1), full[:, 3:5], atol=1e-5)
        keep = torch.tensor([1, 3])  # drop finished rows
        cache, enc = cache.select(keep), select_encoder_output(enc, keep)
        last = model.decode(tgt_in[order][keep][:, 5:], enc, cache).logits
        assert torch.allclose(last, full[keep][:, 5:], atol=1e-5)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_attention_weights_of_every_layer(name: str) -> None:
    model = _model(**CONFIGS[name])
    heads = model.cfg.n_heads
    src, tgt_in = _batch()
    enc = model.encode(src, need_weights=True)
    assert len(enc.attentions) == 2 and enc.attentions[0].shape == (3, heads, 5, 5)
    out = model.decode(tgt_in, enc, need_weights=True)
    assert len(out.self_attentions) == 2 and out.self_attentions[1].shape == (3, heads, 6, 6)
    assert len(out.cross_attentions) == 2 and out.cross_attentions[0].shape == (3, heads, 6, 5)
    assert torch.equal(out.cross_attentions[0][1, :, :, 3:], torch.zeros(heads, 6, 2))  # source pads
    assert torch.equal(out.self_attentions[0][0].triu(1), torch.zeros(heads, 6, 6))  # causal
    assert torch.allclose(out.cross_attentions[1].sum(-1), torch.ones(3, heads, 6), atol=1e-5)  # distributions
    assert torch.allclose(out.logits, model.decode(tgt_in, model.encode(src)).logits, atol=1e-5)  # explicit == fused
    real = tgt_in != PAD
    assert torch.allclose(out.logits[real], model(src, tgt_in)[real], atol=1e-5)  # == causal training path
    assert model.encode(src).attentions is None and model.decode(tgt_in, enc).self_attentions is None
    # with a cache: one step's weights are the last row of the full maps
    cache = model.decode(tgt_in[:, :5], enc, model.init_cache(enc)).cache
    step = model.decode(tgt_in[:, 5:], enc, cache, need_weights=True)
    assert torch.allclose(step.self_attentions[0], out.self_attentions[0][:, :, 5:], atol=1e-5)
    assert torch.allclose(step.cross_attentions[1], out.cross_attentions[1][:, :, 5:], atol=1e-5)


def test_empty_source_gives_finite_outputs_and_gradients() -> None:
    model = _model()
    model.train()
    src = torch.tensor([[PAD, PAD, PAD], [4, 5, 6]])
    tgt_in = torch.tensor([[BOS, 4], [BOS, 5]])
    logits = model(src, tgt_in)
    assert torch.isfinite(logits).all()
    logits.sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


@pytest.mark.parametrize(("dropout", "activation_dropout", "hidden_rate"), [(0.5, None, 0.5), (0.5, 0.0, 0.0),
                                                                      (0.0, 0.5, 0.5)])
def test_activation_dropout_is_the_rate_of_the_feed_forward_hidden_layer(dropout, activation_dropout,
                                                                         hidden_rate) -> None:
    """Measured on the hidden activations themselves: model.activation_dropout drops them (model.dropout when null)
    and scales the kept ones by 1 / (1 - rate), whatever the other dropouts are."""
    model = _model(dropout=dropout, activation_dropout=activation_dropout).train()
    feed_forward, seen = model.encoder.layers[0].feed_forward, {}
    feed_forward.activation.register_forward_hook(lambda module, inputs, output: seen.update(activated=output))
    feed_forward.linear2.register_forward_hook(lambda module, inputs, output: seen.update(dropped=inputs[0]))
    model(*_batch())
    alive = seen["activated"] != 0  # ReLU's zeros say nothing about dropout
    activated, dropped = seen["activated"][alive], seen["dropped"][alive]
    kept = dropped != 0
    assert alive.sum() > 100
    assert 1 - kept.float().mean().item() == pytest.approx(hidden_rate, abs=0.1)
    assert torch.allclose(dropped[kept], activated[kept] / (1 - hidden_rate))


def test_rope_needs_an_even_head_size_and_adds_no_parameters() -> None:
    with pytest.raises(ConfigError, match="model.positions: rope rotates pairs"):
        ModelConfig(d_model=15, n_heads=3, positions=PositionKind.rope)
    assert set(_model(positions=PositionKind.rope).state_dict()) == set(_model().state_dict())


def test_default_model_has_the_parameters_of_checkpoints_from_before_the_variants() -> None:
    names = set(_model().state_dict())
    assert not [name for name in names if "score_" in name or "relative" in name]  # old checkpoints load strictly
    relative = _model(positions=PositionKind.relative, max_relative_distance=3)
    added = set(relative.state_dict()) - names
    assert added == {f"{stack}.layers.{i}.self_attn.relative.table" for stack in ("encoder", "decoder") for i in (0, 1)}


@pytest.mark.parametrize("name", ["rope", "relative"])
def test_positions_inside_attention_stay_out_of_cross_attention(name: str) -> None:
    model = _model(**CONFIGS[name])
    for layer in model.decoder.layers:
        assert layer.cross_attn.rotary is None and layer.cross_attn.relative is None
        assert (layer.self_attn.rotary is not None) == (name == "rope")
        assert (layer.self_attn.relative is not None) == (name == "relative")


# Steps each option needs for >= 99 % (measured when written, greedy on 500 held-out strings): positions that
# live in attention (rope, relative) must learn where a digit sits from attention patterns, which takes longer.
REVERSAL_OPTIONS = {
    "additive": (600, {"attention": AttentionConfig(AttentionScore.additive)}),  # 100 % (~40 s)
    "multiplicative": (1200, {"attention": AttentionConfig(AttentionScore.multiplicative)}),  # 600: 99.6 %; 100 %
    "learned": (1200, {"positions": PositionKind.learned}),  # 600: 98.8 %; 100 %
    # relative: 1,200 steps 94.4 %; 2,000 99.0 % here, 98.8 % on a GPU machine's CPU (torch 2.11); 3,000 99.6 %
    "relative": (3000, {"positions": PositionKind.relative, "max_relative_distance": 8}),
    "rope": (2000, {"positions": PositionKind.rope}),  # 600: 89 %, 1,200: 98.8 %, 2,000: 99.8 % (~70 s)
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(REVERSAL_OPTIONS))
def test_every_option_learns_to_reverse_digit_strings(name: str) -> None:
    steps, options = REVERSAL_OPTIONS[name]
    model = train_reversal_model(steps=steps, **options)  # sinusoidal + scaled_dot: the reversal_model fixture
    src, _, tgt_out = reversal_batch(torch.Generator().manual_seed(99), 500)  # held-out strings
    expected = [row[row != TOY_PAD].flip(0).tolist() for row in src]
    greedy = greedy_search(model, src, pad_id=TOY_PAD, bos_id=TOY_BOS, eos_id=TOY_EOS, max_len_a=1.0, max_len_b=3)
    assert sum(g == e for g, e in zip(greedy, expected)) >= 0.99 * len(expected)


def test_without_positions_the_source_is_a_bag_of_tokens() -> None:
    # positions=none cannot learn reversal, by construction: the encoder is permutation-equivariant and
    # cross-attention sums over the source, so any reordering of the source gives the same translation
    model = _model(positions=PositionKind.none)
    src, tgt_in = _batch()
    shuffled = src[:, [3, 0, 4, 2, 1]]  # every row permuted alike; the pads move with their row's tokens
    assert torch.allclose(model(src, tgt_in), model(shuffled, tgt_in), atol=1e-5)
    with_positions = _model()
    assert not torch.allclose(with_positions(src, tgt_in), with_positions(shuffled, tgt_in), atol=1e-3)


@pytest.mark.slow
def test_learns_to_reverse_digit_strings(reversal_model) -> None:
    src, _, tgt_out = reversal_batch(torch.Generator().manual_seed(99), 500)  # held-out strings
    with torch.no_grad():  # greedy decoding with the cache
        enc = reversal_model.encode(src)
        cache = reversal_model.init_cache(enc)
        token, predicted = torch.full((500, 1), TOY_BOS), []
        for _ in range(tgt_out.size(1)):
            out = reversal_model.decode(token, enc, cache)
            cache, token = out.cache, out.logits[:, -1].argmax(-1, keepdim=True)
            predicted.append(token)
    predicted = torch.cat(predicted, dim=1)
    exact = ((predicted == tgt_out) | (tgt_out == TOY_PAD)).all(dim=1).float().mean().item()
    assert exact >= 0.99
