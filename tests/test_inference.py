"""Using a trained model: which checkpoint of a run directory is evaluated, and rebuilding it without YAML."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from transformer.checkpoint import RunDir, save_checkpoint
from transformer.config import ModelConfig, TrainConfig, to_plain_dict
from transformer.inference import find_checkpoint, load_trained
from transformer.model import build_model
from transformer.tokenizer import SPECIAL_PIECES, WordTokenizer


def test_find_checkpoint_prefers_final_then_best_then_last(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    with pytest.raises(FileNotFoundError, match=r"looked for final\.pt, best\.pt, last\.pt"):
        find_checkpoint(tmp_path)
    for expected in (run.last, run.best, run.final):
        save_checkpoint({"step": 0}, expected)
        assert find_checkpoint(tmp_path) == expected


def test_load_trained_rebuilds_model_and_tokenizers_from_the_checkpoint_alone(tmp_path: Path) -> None:
    cfg = TrainConfig(model=ModelConfig(d_model=8, n_heads=2, d_ff=16, n_encoder_layers=1, n_decoder_layers=1))
    tok = WordTokenizer([*SPECIAL_PIECES, "a", "b"])
    torch.manual_seed(0)
    model = build_model(cfg.model, tok.vocab_size, tok.vocab_size, tok.pad_id)
    save_checkpoint({"config": to_plain_dict(cfg), "model": model.state_dict(),
                     "tokenizers": {"src": tok.state_dict(), "tgt": tok.state_dict()}}, RunDir(tmp_path).final)
    trained = load_trained(find_checkpoint(tmp_path), torch.device("cpu"))
    assert trained.path == RunDir(tmp_path).final and trained.config.model == cfg.model
    assert trained.src_tok.pieces() == tok.pieces() and not trained.model.training
    for key, value in model.state_dict().items():
        assert torch.equal(trained.model.state_dict()[key], value), key
