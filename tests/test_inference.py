"""Using a trained model: which checkpoint of a run directory is evaluated, rebuilding it without YAML, and
translating lines of text."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from test_decoding import SPECIAL, tiny_model

from transformer.checkpoint import CheckpointError, RunDir
from transformer.config import EvalConfig, ModelConfig, TrainConfig, to_plain_dict
from transformer.data.tokenizer import SPECIAL_PIECES, WordTokenizer
from transformer.inference.loading import find_checkpoint, load_trained
from transformer.inference.search import beam_search
from transformer.inference.translation import TruncationWarning, translate
from transformer.model.transformer import build_model
from transformer.training.checkpoints import save_checkpoint


def test_find_checkpoint_prefers_final_then_best_then_last(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    with pytest.raises(FileNotFoundError, match=r"looked for final\.pt, best\.pt, last\.pt"):
        find_checkpoint(tmp_path)
    for expected in (run.last, run.best, run.final):
        save_checkpoint({"step": 0}, expected)
        assert find_checkpoint(tmp_path) == expected
    with pytest.raises(CheckpointError, match=r"run_dir: .*final\.pt is a file; give a checkpoint file as checkpoint="):
        find_checkpoint(run.final)
    with pytest.raises(FileNotFoundError, match=r"run_dir: .*nowhere does not exist; give a training run's folder"):
        find_checkpoint(tmp_path / "nowhere")


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


def test_translate_keeps_line_alignment_and_handles_odd_input() -> None:
    src_tok = WordTokenizer(["<pad>", "<unk>", "<s>", "</s>", *"a b c d e f g h".split()])
    tgt_tok = WordTokenizer(["<pad>", "<unk>", "<s>", "</s>", *[f"w{i}" for i in range(20)]])
    model = tiny_model(src_tok.vocab_size, tgt_tok.vocab_size).train()
    texts = ["a b c", "", "h g f e d c b a a b", "   ", "ünïcödé ☃ a\tb", "e", "a b c d e f g h a b c d"]
    cfg = EvalConfig(beam_size=3, n_best=2, batch_size=2, max_len_a=1.0, max_len_b=2)
    truncated = r"1 input line\(s\) longer than 10 source tokens were truncated: line 7 \(12 tokens\)"
    with pytest.warns(TruncationWarning, match=truncated) as warned:
        out = translate(model, texts, src_tok, tgt_tok, cfg, "cpu", max_positions=10)
    assert warned[0].filename == __file__, "the warning points at the caller's line, not into the library"
    assert model.training, "translate restores the training mode"
    assert len(out) == len(texts) and all(len(nbest) == 2 for nbest in out)
    assert out[1] == ["", ""] and out[3] == ["", ""]
    # each line translated alone (batch of one) gives the same n-best: batching and sorting keep alignment
    for i in (0, 2, 4, 5):
        assert translate(model, [texts[i]], src_tok, tgt_tok, cfg, "cpu", max_positions=10)[0] == out[i]
    with pytest.warns(TruncationWarning, match=r"^the sentence has 12 source tokens, more than the model's 10: it was "
                                         r"truncated$"):  # alone, as one typed at a terminal: no line number
        assert translate(model, [texts[6]], src_tok, tgt_tok, cfg, "cpu", max_positions=10)[0] == out[6]
    # the output strings are the target tokenizer's decoding of the beam search result
    src = torch.tensor([src_tok.encode(texts[0])])
    hyps = beam_search(model.eval(), src, beam_size=3, n_best=2, length_penalty=cfg.length_penalty,
                       length_norm=cfg.length_norm, max_len_a=1.0, max_len_b=2, max_tgt_len=10, **SPECIAL)[0]
    assert out[0] == [tgt_tok.decode(h.tokens) for h in hyps]
    greedy_cfg = EvalConfig(beam_size=1, n_best=1, batch_size=3, max_len_a=1.0, max_len_b=2)
    greedy = translate(model, texts, src_tok, tgt_tok, greedy_cfg, "cpu", max_positions=20)
    assert [len(nbest) for nbest in greedy] == [1] * len(texts) and greedy[1] == [""]
