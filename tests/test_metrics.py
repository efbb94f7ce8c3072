"""Metrics: BLEU/chrF against hand-computed values, signatures, token accuracy, perplexity."""

from __future__ import annotations

import math

import pytest
import torch

from transformer.inference.metrics import (
    Scores,
    corpus_scores,
    moses_preprocess,
    perplexity,
    token_accuracy,
    tokenized_bleu,
)


def test_identical_text_scores_100() -> None:
    lines = ["A man rides a bike.", "Two dogs play in the snow!"]
    scores = corpus_scores(lines, lines)
    assert isinstance(scores, Scores)
    assert scores.bleu == pytest.approx(100.0)
    assert scores.chrf == pytest.approx(100.0)
    assert scores.n_sentences == 2


def test_bleu_matches_hand_computed_ngram_precisions() -> None:
    # hyp: the cat sat on the mat / ref: the cat sat on a mat
    # clipped n-gram matches: 1-gram 5/6, 2-gram 3/5 (the cat, cat sat, sat on), 3-gram 2/4, 4-gram 1/3;
    # equal lengths -> brevity penalty 1; BLEU = (5/6 * 3/5 * 2/4 * 1/3) ** (1/4).
    expected = 100 * (5 / 6 * 3 / 5 * 2 / 4 * 1 / 3) ** 0.25
    scores = corpus_scores(["the cat sat on the mat"], ["the cat sat on a mat"])
    assert scores.bleu == pytest.approx(expected, abs=1e-6)


def test_bleu_brevity_penalty() -> None:
    # every n-gram of the 4-token hypothesis matches; BP = exp(1 - 6/4).
    scores = corpus_scores(["the cat sat on"], ["the cat sat on the mat"])
    assert scores.bleu == pytest.approx(100 * math.exp(1 - 6 / 4), abs=1e-6)


def test_bleu_tokenizes_punctuation_13a() -> None:
    # 13a splits the final period, so "mat." and "mat ." are the same hypothesis.
    assert corpus_scores(["the cat sat on the mat."], ["the cat sat on the mat ."]).bleu == pytest.approx(100.0)


def test_disjoint_text_scores_zero() -> None:
    scores = corpus_scores(["xyz qqq"], ["abc def"])
    assert scores.bleu == pytest.approx(0.0)
    assert scores.chrf == pytest.approx(0.0)


def test_signatures_say_how_scores_were_computed() -> None:
    scores = corpus_scores(["a b c d"], ["a b c d"])
    for part in ("nrefs:1", "tok:13a", "case:mixed", "version:"):
        assert part in scores.bleu_signature
    assert "nrefs:1" in scores.chrf_signature and "case:mixed" in scores.chrf_signature
    assert str(scores) == f"BLEU 100.00 chrF 100.00 on 1 sentences\n  {scores.bleu_signature}\n  {scores.chrf_signature}"


def test_corpus_scores_rejects_mismatched_lengths() -> None:
    with pytest.raises(ValueError, match="2 hypotheses but 1 references"):
        corpus_scores(["a", "b"], ["a"])
    with pytest.raises(ValueError, match="no sentences"):
        corpus_scores([], [])


def test_moses_preprocessing_lowercases_normalises_and_tokenises_like_the_multi30k_files() -> None:
    # normalize-punctuation turns the en dash into "-" and the curly quotes into '"'; tokenizer.perl splits
    # punctuation off and escapes '"' and "'" (as the task's lc.norm.tok files have them)
    assert moses_preprocess(["Ein Mann \u2013 im \u201eroten\u201c Hemd \u2013 sagt: \"Das ist's!\""], "de") == [
        "ein mann - im &quot; roten &quot; hemd - sagt : &quot; das ist &apos; s ! &quot;"]
    assert moses_preprocess(["A dog, running."], "en") == ["a dog , running ."]


def test_tokenized_bleu_ignores_case_and_spacing_of_punctuation_where_sacrebleu_does_not() -> None:
    hyps, refs = ["Ein Hund rennt ."], ["ein Hund rennt."]  # differ only in case and the space before "."
    scores = corpus_scores(hyps, refs, tokenized_lang="de")
    assert scores.tokenized_bleu == pytest.approx(100.0)
    assert scores.bleu < 100.0  # cased: "Ein" is not "ein"
    assert "tok:none" in scores.tokenized_bleu_signature
    assert "pre:lc+moses-norm+moses-tok.de|sacremoses:" in scores.tokenized_bleu_signature
    assert corpus_scores(hyps, refs).tokenized_bleu is None  # only when asked for


def test_tokenized_bleu_matches_hand_computed_precisions() -> None:
    # after preprocessing: "the cat sat on a mat ." against "the cat sat on the mat ." (7 tokens each):
    # matches 6/7 unigrams, 4/6 bigrams, 2/5 trigrams, 1/4 four-grams; no brevity penalty
    expected = 100 * math.exp((math.log(6 / 7) + math.log(4 / 6) + math.log(2 / 5) + math.log(1 / 4)) / 4)
    score, _ = tokenized_bleu(["The cat sat on a mat."], ["the cat sat on the mat ."], "en")
    assert score == pytest.approx(expected, abs=1e-9)


def test_token_accuracy_ignores_padding() -> None:
    pad = 0
    target = torch.tensor([[5, 6, 7], [8, pad, pad]])
    # predictions: row 0 -> 5, 9, 7 ; row 1 -> 1, 6(pad position), 6(pad position)
    predicted = torch.tensor([[5, 9, 7], [1, 6, 6]])
    logits = torch.nn.functional.one_hot(predicted, num_classes=10).float()  # (2, 3, 10)
    assert token_accuracy(logits, target, pad) == pytest.approx(2 / 4)
    with pytest.raises(ValueError, match="only padding"):
        token_accuracy(logits, torch.zeros_like(target), pad)
    with pytest.raises(ValueError, match="do not match"):
        token_accuracy(logits[:, :2], target, pad)


def test_perplexity() -> None:
    assert perplexity(0.0, 10) == pytest.approx(1.0)
    assert perplexity(10 * math.log(4.0), 10) == pytest.approx(4.0)
    assert perplexity(torch.tensor(20 * math.log(3.0)), 20) == pytest.approx(3.0)
    assert perplexity(1e6, 1) == math.inf
    with pytest.raises(ValueError, match="n_tokens"):
        perplexity(1.0, 0)


def test_tokenized_bleu_does_not_warn_about_its_own_tokenized_input(caplog) -> None:
    lines = [f"ein Hund Nummer {i} ." for i in range(120)]  # sacreBLEU warns from 100 lines ending in " ."
    with caplog.at_level("WARNING"):
        score, _ = tokenized_bleu(lines, lines, "de")
    assert score == pytest.approx(100.0)
    assert not [r for r in caplog.records if "detokenize" in r.getMessage()]
