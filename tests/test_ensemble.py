"""Ensembles: the mixture's log-probabilities against an independent computation, the searches on it (cached =
uncached, one model twice = that model), and loading one from checkpoints with its checks."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from test_decoding import BOS_ID, REAL, tiny_model, varied_sources

from transformer.app.schemas import EvaluateConfig, TranslateConfig
from transformer.checkpoint import RunDir
from transformer.config import (
    AttentionDumpConfig,
    ConfigError,
    DataConfig,
    EvalConfig,
    LengthNorm,
    ModelConfig,
    TrainConfig,
    to_plain_dict,
)
from transformer.data.tokenizer import SPECIAL_PIECES, WordTokenizer
from transformer.inference.ensemble import Ensemble, select_ensemble_encoder
from transformer.inference.loading import load_model
from transformer.inference.search import beam_search, greedy_search
from transformer.model.transformer import build_model
from transformer.training.checkpoints import save_checkpoint

BEAM = dict(beam_size=3, n_best=2, length_penalty=0.6, length_norm=LengthNorm.gnmt, **REAL)


def _tokens(hypotheses) -> list[list[list[int]]]:
    return [[h.tokens for h in hyps] for hyps in hypotheses]


def test_decode_is_the_log_of_the_members_mean_probability() -> None:
    members = [tiny_model(seed=2), tiny_model(seed=3), tiny_model(seed=4)]
    src = varied_sources()
    words = torch.randint(4, 24, (src.size(0), 4), generator=torch.Generator().manual_seed(0))
    tgt_in = torch.cat([torch.full((src.size(0), 1), BOS_ID), words], dim=1)  # (batch, 5), no padding
    out = Ensemble(members).eval().decode(tgt_in, Ensemble(members).encode(src))
    probs = [torch.softmax(model(src, tgt_in), dim=-1) for model in members]  # the training path, by hand
    expected = torch.log(sum(probs) / len(members))
    torch.testing.assert_close(out.logits, expected, atol=1e-5, rtol=1e-5)
    assert torch.allclose(out.logits.exp().sum(-1), torch.ones(()), atol=1e-5)  # already normalized
    assert out.cache is None


def test_a_model_ensembled_with_itself_decodes_as_that_model() -> None:
    model, src = tiny_model(), varied_sources()
    twice = Ensemble([model, model])
    common = dict(select_encoder=select_ensemble_encoder)
    assert greedy_search(twice, src, **common, **REAL) == greedy_search(model, src, **REAL)
    alone, ensembled = beam_search(model, src, **BEAM), beam_search(twice, src, **common, **BEAM)
    assert _tokens(ensembled) == _tokens(alone)
    for a, e in zip(alone, ensembled):
        assert [h.score for h in e] == pytest.approx([h.score for h in a], abs=1e-4)


@pytest.mark.parametrize("search", ["greedy", "beam"])
def test_cached_equals_uncached_with_members_of_different_shapes(search: str) -> None:
    torch.manual_seed(5)
    other = build_model(ModelConfig(d_model=12, n_heads=3, d_ff=20, n_encoder_layers=1, n_decoder_layers=3,
                                    dropout=0.0, attention_dropout=0.0, max_positions=48), 24, 24, 0).eval()
    ensemble, src = Ensemble([tiny_model(), other]), varied_sources()
    assert ensemble.max_positions == 48
    common = dict(select_encoder=select_ensemble_encoder, **(REAL if search == "greedy" else BEAM))
    run = greedy_search if search == "greedy" else beam_search
    cached, uncached = run(ensemble, src, use_cache=True, **common), run(ensemble, src, use_cache=False, **common)
    if search == "beam":
        cached, uncached = _tokens(cached), _tokens(uncached)
    assert cached == uncached
    alone = run(tiny_model(), src, **(REAL if search == "greedy" else BEAM))
    assert cached != (alone if search == "greedy" else _tokens(alone)), "the second model must change something"


def test_members_must_share_the_target_vocabulary() -> None:
    with pytest.raises(ValueError, match=r"share the target vocabulary; their sizes are \[24, 30\]"):
        Ensemble([tiny_model(), tiny_model(tgt_vocab=30)])
    with pytest.raises(ValueError, match="at least 2 models"):
        Ensemble([tiny_model()])


# --------------------------------------------------------------------------------------------------
# Loading from checkpoints
# --------------------------------------------------------------------------------------------------


def _save_run(folder: Path, seed: int, words: str = "a b c", src: str = "en", tgt: str = "de") -> Path:
    cfg = TrainConfig(data=DataConfig(src=src, tgt=tgt),
                      model=ModelConfig(d_model=8, n_heads=2, d_ff=16, n_encoder_layers=1, n_decoder_layers=1))
    tok = WordTokenizer([*SPECIAL_PIECES, *words.split()])
    torch.manual_seed(seed)
    model = build_model(cfg.model, tok.vocab_size, tok.vocab_size, tok.pad_id)
    save_checkpoint({"config": to_plain_dict(cfg), "model": model.state_dict(),
                     "tokenizers": {"src": tok.state_dict(), "tgt": tok.state_dict()}}, RunDir(folder).final)
    return folder


def test_load_model_builds_an_ensemble_from_run_dirs_and_files(tmp_path: Path) -> None:
    first, second, third = (_save_run(tmp_path / name, seed) for seed, name in enumerate(("r1", "r2", "r3")))
    cpu = torch.device("cpu")
    trained = load_model(None, RunDir(first).final, [second, RunDir(third).final], cpu)
    assert isinstance(trained.model, Ensemble) and len(trained.model.members) == 3 and not trained.model.training
    assert trained.path == RunDir(first).final and trained.ensemble_paths == (RunDir(second).final,
                                                                             RunDir(third).final)
    alone = [load_model(run, None, [], cpu).model.state_dict() for run in (first, second, third)]
    for member, weights in zip(trained.model.members, alone):  # each member is its own run, in the order given
        assert all(torch.equal(member.state_dict()[key], value) for key, value in weights.items())
    key = "encoder.layers.0.self_attn.in_proj_weight"  # three seeds, three models
    assert not torch.equal(alone[0][key], alone[1][key]) and not torch.equal(alone[1][key], alone[2][key])


def test_a_member_given_twice_is_loaded_with_a_warning(tmp_path: Path, caplog) -> None:
    first, second = _save_run(tmp_path / "r1", 0), _save_run(tmp_path / "r2", 1)
    trained = load_model(first, None, [second, RunDir(second).final], torch.device("cpu"))  # a folder, then its file
    assert len(trained.model.members) == 3
    assert re.search(r"ensemble\[1\]: .*r2.*final\.pt is .*r2.*final\.pt again", caplog.text)
    caplog.clear()
    load_model(first, None, [second], torch.device("cpu"))
    assert "again" not in caplog.text


@pytest.mark.parametrize("change, differs", [(dict(words="a b d"), "tokenizers"),
                                             (dict(src="de", tgt="en"), "language pair")])
def test_load_model_refuses_members_with_other_tokenizers_or_direction(tmp_path: Path, change: dict, differs) -> None:
    first, other = _save_run(tmp_path / "r1", 0), _save_run(tmp_path / "r2", 1, **change)
    with pytest.raises(ConfigError, match=rf"ensemble: .*r2.* differs from .*r1.* in its {differs};"):
        load_model(first, None, [other], torch.device("cpu"))


def test_a_missing_member_or_attention_maps_are_config_errors(tmp_path: Path) -> None:
    first, second = _save_run(tmp_path / "r1", 0), _save_run(tmp_path / "r2", 1)
    with pytest.raises(ConfigError, match=r"ensemble\[1\]: .*nowhere does not exist"):
        load_model(first, None, [second, tmp_path / "nowhere"], torch.device("cpu"))
    with pytest.raises(ConfigError, match="attention: attention maps are drawn for one model"):
        EvaluateConfig(run_dir=str(first), ensemble=[str(first)], attention=AttentionDumpConfig(indices=[0]))



@pytest.mark.parametrize("command", [EvaluateConfig, TranslateConfig])
def test_an_ensemble_in_fixed_shapes_is_refused_before_any_model_loads(command, tmp_path: Path) -> None:
    # the run folders do not exist: the refusal comes from the config alone, before anything is read
    with pytest.raises(ConfigError, match=r"^eval.fixed_shape: decodes a single Transformer, not an ensemble"):
        command(run_dir=str(tmp_path / "a"), ensemble=[str(tmp_path / "b")], eval=EvalConfig(fixed_shape=True))
    assert command(run_dir=str(tmp_path / "a"), eval=EvalConfig(fixed_shape=True)).eval.fixed_shape
