"""Translation metrics: sacreBLEU BLEU and chrF with their signatures, token accuracy and perplexity.

BLEU and chrF are computed by sacreBLEU on *detokenized* text (what ``Tokenizer.decode`` returns and what
the reference files hold), with sacreBLEU's own default tokenization (``13a``) and one reference per
sentence, so the numbers are comparable with published sacreBLEU scores; the signature strings say exactly
how they were computed and belong next to every reported number.

Multi30k papers report BLEU differently: on lowercased text with Moses punctuation normalisation and
tokenisation (the task's ``lc.norm.tok`` files), scored with no further tokenisation. ``tokenized_bleu`` does
that with ``sacremoses`` (the maintained Python port of the Moses scripts) on both sides, in the order the
Multi30k files were made (``lowercase.perl | normalize-punctuation.perl -l L | tokenizer.perl -l L``), so the
number can be set next to published ones; its signature names the preprocessing.

Shape names: batch, tgt_len, tgt_vocab.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import sacremoses
import torch
from sacrebleu.metrics import BLEU, CHRF
from torch import Tensor


@dataclass
class Scores:
    """Corpus-level scores of one set of hypotheses against one reference per sentence."""

    bleu: float  # 0-100
    chrf: float  # 0-100
    bleu_signature: str  # e.g. "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0"
    chrf_signature: str
    n_sentences: int
    tokenized_bleu: float | None = None  # the Multi30k papers' flavour (see the module docstring), if asked for
    tokenized_bleu_signature: str | None = None

    def __str__(self) -> str:
        """BLEU and chrF with their sacreBLEU signatures, as the log shows them."""
        text = (f"BLEU {self.bleu:.2f} chrF {self.chrf:.2f} on {self.n_sentences} sentences\n"
                f"  {self.bleu_signature}\n  {self.chrf_signature}")
        if self.tokenized_bleu is not None:
            text += (f"\n  tokenized BLEU {self.tokenized_bleu:.2f} (Multi30k papers' flavour): "
                     f"{self.tokenized_bleu_signature}")
        return text

    def scalars(self, prefix: str) -> dict[str, float]:
        """For TensorBoard: ``{prefix}bleu``, ``{prefix}chrf`` and, where measured, ``{prefix}tokenized_bleu``."""
        values = {"bleu": self.bleu, "chrf": self.chrf, "tokenized_bleu": self.tokenized_bleu}
        return {f"{prefix}{key}": value for key, value in values.items() if value is not None}


def corpus_scores(hypotheses: list[str], references: list[str], tokenized_lang: str | None = None) -> Scores:
    """Corpus BLEU and chrF of detokenized hypotheses against one detokenized reference each.

    Args:
        hypotheses: one system output line per sentence.
        references: the reference line for each sentence, in the same order.
        tokenized_lang: the target language's code: also compute :func:`tokenized_bleu` (None: do not).

    Returns:
        ``Scores`` with both numbers (0-100) and sacreBLEU's signatures.

    Raises:
        ValueError: when the two lists differ in length or are empty.
    """
    if len(hypotheses) != len(references):
        raise ValueError(
            f"corpus_scores: {len(hypotheses)} hypotheses but {len(references)} references; "
            "every hypothesis line needs exactly one reference line"
        )
    if not hypotheses:
        raise ValueError("corpus_scores: no sentences to score")
    bleu, chrf = BLEU(), CHRF()
    bleu_score = bleu.corpus_score(hypotheses, [references])
    chrf_score = chrf.corpus_score(hypotheses, [references])
    scores = Scores(
        bleu=float(bleu_score.score),
        chrf=float(chrf_score.score),
        bleu_signature=str(bleu.get_signature()),
        chrf_signature=str(chrf.get_signature()),
        n_sentences=len(hypotheses),
    )
    if tokenized_lang is not None:
        scores.tokenized_bleu, scores.tokenized_bleu_signature = tokenized_bleu(hypotheses, references, tokenized_lang)
    return scores


def moses_preprocess(lines: list[str], lang: str) -> list[str]:
    """Lowercase, Moses punctuation normalisation, Moses tokenisation (with its default escaping of ``&<>'"``)."""
    normalizer, tokenizer = sacremoses.MosesPunctNormalizer(lang=lang), sacremoses.MosesTokenizer(lang=lang)
    return [tokenizer.tokenize(normalizer.normalize(line.lower()), return_str=True) for line in lines]


def tokenized_bleu(hypotheses: list[str], references: list[str], lang: str) -> tuple[float, str]:
    """BLEU as Multi30k papers compute it: both sides through :func:`moses_preprocess`, then sacreBLEU with no
    tokenisation of its own. Returns the score and a signature naming the preprocessing."""
    bleu = BLEU(tokenize="none", force=True)  # force: tokenized input is the point here, sacreBLEU need not warn
    score = bleu.corpus_score(moses_preprocess(hypotheses, lang), [moses_preprocess(references, lang)])
    return float(score.score), f"{bleu.get_signature()}|pre:lc+moses-norm+moses-tok.{lang}|sacremoses:{sacremoses.__version__}"


def token_accuracy(logits: Tensor, target: Tensor, pad_id: int) -> float:
    """Fraction of non-pad target positions where the arg-max prediction is the target token.

    Args:
        logits: (batch, tgt_len, tgt_vocab) scores (log-probabilities work the same).
        target: (batch, tgt_len) gold ids, ``pad_id`` where there is no token.
        pad_id: the padding id, ignored in numerator and denominator.

    Returns:
        Accuracy in [0, 1]. Weight by the number of non-pad tokens to combine batches.

    Raises:
        ValueError: on mismatched shapes or when ``target`` holds no real token.
    """
    if logits.shape[:-1] != target.shape:
        raise ValueError(f"token_accuracy: logits {tuple(logits.shape)} do not match target {tuple(target.shape)}")
    real = target != pad_id  # (batch, tgt_len)
    n_tokens = int(real.sum())
    if n_tokens == 0:
        raise ValueError("token_accuracy: target holds only padding")
    correct = (logits.argmax(dim=-1) == target) & real  # (batch, tgt_len)
    return int(correct.sum()) / n_tokens


def perplexity(nll_sum: float | Tensor, n_tokens: int) -> float:
    """exp(mean negative log-likelihood per token); ``inf`` when that overflows.

    Args:
        nll_sum: summed negative log-likelihood (nats) over ``n_tokens`` tokens, e.g. the ``nll_sum`` the
            training step returns (not the smoothed loss).
        n_tokens: number of real target tokens the sum covers.
    """
    if n_tokens <= 0:
        raise ValueError(f"perplexity: n_tokens must be > 0, got {n_tokens}")
    if isinstance(nll_sum, torch.Tensor):
        nll_sum = float(nll_sum.detach().float().sum())
    mean = nll_sum / n_tokens
    return math.exp(mean) if mean < 700.0 else math.inf  # exp(709.8) is the float64 limit
