"""Validation during training: the loss is the unsmoothed per-token cross-entropy over the whole validation set
(checked against each sentence scored alone), perplexity its exp, BLEU/chrF score greedy translations of the
first ``training.valid_max_sentences`` sentences, samples and the alignment figure go to the tracker."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field, replace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from sacrebleu.metrics import BLEU, CHRF
from torch import nn

from transformer.config import AttentionDumpConfig, DataConfig, EvalConfig, ModelConfig, TrainConfig, TrainingConfig
from transformer.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, WordTokenizer
from transformer.inference.translation import translate
from transformer.model.transformer import build_model
from transformer.training import validation

SRC_WORDS = "a b c d e f g h".split()
SRC_TOK = WordTokenizer(["<pad>", "<unk>", "<s>", "</s>", *SRC_WORDS])
TGT_TOK = WordTokenizer(["<pad>", "<unk>", "<s>", "</s>", *[f"w{i}" for i in range(20)]])
N_BLEU = 6  # sentences translated for BLEU


@dataclass
class RecordingTracker:
    """The part of ``Tracker`` validation uses, keeping what it is given."""

    enabled: bool = True
    texts: list[tuple[str, str, int]] = field(default_factory=list)
    images: list[tuple[str, np.ndarray, int]] = field(default_factory=list)

    def text(self, tag: str, text: str, step: int) -> None:
        self.texts.append((tag, text, step))

    def image(self, tag: str, image: np.ndarray, step: int) -> None:
        self.images.append((tag, image, step))


def _texts(n: int, seed: int, words: list[str]) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(words) for _ in range(rng.randint(2, 7))) for _ in range(n)]


def _settings(cfg: TrainConfig) -> dict:
    """make_validator's settings from a root config, as the pipeline passes them."""
    return dict(training=cfg.training, eval_cfg=cfg.eval, max_positions=cfg.model.max_positions,
                device=torch.device("cpu"))


def _config() -> TrainConfig:
    return TrainConfig(
        data=DataConfig(max_len=50),  # the longest batch must fit max_positions
        model=ModelConfig(d_model=16, n_heads=2, d_ff=32, n_encoder_layers=1, n_decoder_layers=1, dropout=0.0,
                          attention_dropout=0.0, max_positions=64, share_embeddings=False),
        training=TrainingConfig(max_tokens=40, valid_max_sentences=N_BLEU, n_samples=2),
        eval=EvalConfig(beam_size=4, max_len_a=0.0, max_len_b=5),  # validation decodes greedily all the same
    )


def _model() -> nn.Module:
    torch.manual_seed(3)
    return build_model(_config().model, SRC_TOK.vocab_size, TGT_TOK.vocab_size, PAD_ID)


def _nll_one_sentence_at_a_time(model: nn.Module, src: list[str], ref: list[str]) -> tuple[float, int]:
    """Summed cross-entropy (nats) and target-token count, each sentence alone, no padding anywhere."""
    total, count = 0.0, 0
    with torch.no_grad():
        for s, r in zip(src, ref):
            tgt = TGT_TOK.encode(r)
            logits = model(torch.tensor([SRC_TOK.encode(s)]), torch.tensor([[BOS_ID, *tgt]]))  # (1, len+1, vocab)
            total += F.cross_entropy(logits[0], torch.tensor([*tgt, EOS_ID]), reduction="sum").item()
            count += len(tgt) + 1
    return total, count


def test_loss_ppl_bleu_and_chrf() -> None:
    model, cfg, tracker = _model(), _config(), RecordingTracker()
    src = _texts(15, 0, SRC_WORDS)
    greedy = replace(cfg.eval, beam_size=1, n_best=1)
    hyps = [nbest[0] for nbest in translate(model, src[:N_BLEU], SRC_TOK, TGT_TOK, greedy, "cpu", 64)]
    assert all(hyps)
    # references: the model's own greedy output for the scored sentences (so BLEU is 100 exactly when those
    # are the hypotheses scored), other target text for the rest (which only the loss sees)
    ref = hyps + _texts(15 - N_BLEU, 1, [f"w{i}" for i in range(20)])
    validate = validation.make_validator(src, ref, SRC_TOK, TGT_TOK, **_settings(cfg), tracker=tracker)
    model.train()
    metrics = validate(model, 7)
    assert model.training  # the mode is restored
    nll, count = _nll_one_sentence_at_a_time(model.eval(), src, ref)
    assert metrics["loss"] == pytest.approx(nll / count, rel=1e-5)
    assert metrics["ppl"] == pytest.approx(math.exp(nll / count), rel=1e-5)
    assert metrics["bleu"] == pytest.approx(100.0) and metrics["chrf"] == pytest.approx(100.0)
    # a different reference for one scored sentence lowers both scores to sacreBLEU's values
    ref[0] = "w19 w19 w19 w19 w19 w19"
    validate = validation.make_validator(src, ref, SRC_TOK, TGT_TOK, **_settings(cfg), tracker=tracker)
    metrics = validate(model, 8)
    assert metrics["bleu"] == pytest.approx(BLEU().corpus_score(hyps, [ref[:N_BLEU]]).score)
    assert metrics["chrf"] == pytest.approx(CHRF().corpus_score(hyps, [ref[:N_BLEU]]).score)
    assert metrics["bleu"] < 100.0


def test_samples_and_the_alignment_of_the_first_sentence_are_logged(monkeypatch) -> None:
    model, cfg, tracker = _model(), _config(), RecordingTracker()
    long_first = " ".join(SRC_WORDS[i % 8] for i in range(60))  # longer than the figures' token limit
    src = [long_first, *_texts(9, 0, SRC_WORDS)]
    ref = _texts(10, 1, [f"w{i}" for i in range(20)])
    drawn = []
    real = validation.compute_attention_maps

    def recording(model: nn.Module, src_ids: list[int], tgt_ids: list[int], **kwargs: object):
        drawn.append((list(src_ids), list(tgt_ids)))
        return real(model, src_ids, tgt_ids, **kwargs)

    monkeypatch.setattr(validation, "compute_attention_maps", recording)
    validation.make_validator(src, ref, SRC_TOK, TGT_TOK, **_settings(cfg), tracker=tracker)(model, 11)
    (tag, table, step), = tracker.texts
    rows = table.splitlines()
    assert (tag, step) == ("valid/samples", 11)
    assert rows[:2] == ["| source | reference | hypothesis |", "|---|---|---|"] and len(rows) == 2 + 2  # n_samples
    assert rows[3].startswith(f"| {src[1]} | {ref[1]} | ")
    (src_ids, tgt_ids), = drawn
    assert src_ids == SRC_TOK.encode(long_first)[: AttentionDumpConfig().max_tokens]
    hypothesis = rows[2].rsplit(" | ", 1)[1].removesuffix(" |")
    assert tgt_ids == TGT_TOK.encode(hypothesis)
    (image_tag, image, image_step), = tracker.images
    assert (image_tag, image_step, image.ndim, image.shape[2], image.dtype) == ("valid/alignment", 11, 3, 3, np.uint8)


def test_a_disabled_tracker_draws_nothing(monkeypatch) -> None:
    monkeypatch.setattr(validation, "compute_attention_maps", lambda *a, **k: pytest.fail("drew a figure"))
    tracker = RecordingTracker(enabled=False)
    src, ref = _texts(4, 0, SRC_WORDS), _texts(4, 1, [f"w{i}" for i in range(20)])
    metrics = validation.make_validator(src, ref, SRC_TOK, TGT_TOK, **_settings(_config()), tracker=tracker)(_model(), 1)
    assert set(metrics) == {"loss", "ppl", "bleu", "chrf"} and tracker.images == []


def test_the_alignment_is_drawn_for_the_first_sentence_with_source_tokens(monkeypatch) -> None:
    model, cfg, tracker = _model(), _config(), RecordingTracker()
    src = ["", "   ", *_texts(4, 0, SRC_WORDS)]  # a validation file that begins with blank source lines
    ref = _texts(6, 1, [f"w{i}" for i in range(20)])
    drawn = []
    real = validation.compute_attention_maps
    monkeypatch.setattr(validation, "compute_attention_maps",
                        lambda model, src_ids, tgt_ids, **kwargs: (drawn.append(list(src_ids)),
                                                                   real(model, src_ids, tgt_ids, **kwargs))[1])
    metrics = validation.make_validator(src, ref, SRC_TOK, TGT_TOK, **_settings(cfg), tracker=tracker)(model, 3)
    assert drawn == [SRC_TOK.encode(src[2])] and len(tracker.images) == 1 and math.isfinite(metrics["loss"])
    blank = RecordingTracker()
    validation.make_validator(["", " "], ["w1", "w2"], SRC_TOK, TGT_TOK, **_settings(cfg), tracker=blank)(model, 4)
    assert blank.images == [] and len(blank.texts) == 1  # no source to draw: the samples only
