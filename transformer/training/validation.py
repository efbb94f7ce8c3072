"""Validation during training: loss and perplexity on the validation set, BLEU and chrF of greedy
translations, a few sample translations and the attention maps of one fixed sentence for TensorBoard."""

from __future__ import annotations

from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import nn

from transformer.config import AttentionDumpConfig, EvalConfig, TrainingConfig
from transformer.data.batching import TokenBucketSampler, collate
from transformer.data.tokenizer import Tokenizer
from transformer.inference.attention_maps import alignment_figure, compute_attention_maps, figure_to_array
from transformer.inference.metrics import corpus_scores, perplexity
from transformer.inference.translation import translate_hypotheses
from transformer.tracking import Tracker
from transformer.training.trainer import ValidateFn


def make_validator(valid_src: list[str], valid_ref: list[str], src_tok: Tokenizer, tgt_tok: Tokenizer, *,
                   training: TrainingConfig, eval_cfg: EvalConfig, max_positions: int, device: torch.device,
                   tracker: Tracker) -> ValidateFn:
    """Build ``validate(model, step) -> {"loss", "ppl", "bleu", "chrf"}`` for the trainer.

    The loss is the plain (unsmoothed) cross-entropy per target token over the whole validation set, in
    batches of ``training.max_tokens``; BLEU/chrF come from greedy translations (``eval_cfg``'s limits) of
    the first ``training.valid_max_sentences`` sentences. ``max_positions``: the model's.
    """
    src_ids = [src_tok.encode(text)[:max_positions] for text in valid_src]
    tgt_ids = [tgt_tok.encode(text)[: max_positions - 1] for text in valid_ref]
    sampler = TokenBucketSampler([len(s) for s in src_ids], [len(t) for t in tgt_ids],
                                 training.max_tokens, seed=0, shuffle=False)
    batches = [collate([(src_ids[i], tgt_ids[i]) for i in indices], indices, pad_id=tgt_tok.pad_id,
                       bos_id=tgt_tok.bos_id, eos_id=tgt_tok.eos_id) for indices in sampler]
    n_bleu = training.valid_max_sentences or len(valid_src)
    greedy = replace(eval_cfg, beam_size=1, n_best=1)
    figure_tokens = AttentionDumpConfig().max_tokens  # cut as transformer-evaluate cuts its attention figures
    drawn = next((i for i in range(min(n_bleu, len(src_ids))) if src_ids[i]), None)  # a source with tokens

    @torch.inference_mode()
    def validate(model: nn.Module, step: int) -> dict[str, float]:
        was_training = model.training
        model.eval()
        nll, n_tokens = 0.0, 0
        for batch in batches:
            batch = batch.to(device)
            logits = model(batch.src, batch.tgt_in)  # (batch, tgt_len, vocab)
            nll += F.cross_entropy(logits.flatten(0, 1).float(), batch.tgt_out.flatten(),
                                   ignore_index=tgt_tok.pad_id, reduction="sum").item()
            n_tokens += batch.n_tgt_tokens
        found = [nbest[0].tokens for nbest in translate_hypotheses(model, valid_src[:n_bleu], src_tok, tgt_tok,
                                                                    greedy, device, max_positions)]
        hypotheses = [tgt_tok.decode(ids) for ids in found]
        scores = corpus_scores(hypotheses, valid_ref[:n_bleu])
        _log_samples(tracker, valid_src, valid_ref, hypotheses, training.n_samples, step)
        if drawn is not None:
            _log_attention(tracker, model, src_tok, tgt_tok, valid_src[drawn], found[drawn], step, figure_tokens)
        model.train(was_training)
        n_tokens = max(n_tokens, 1)
        return {"loss": nll / n_tokens, "ppl": perplexity(nll, n_tokens), "bleu": scores.bleu, "chrf": scores.chrf}

    return validate


def _log_samples(tracker: Tracker, src: list[str], ref: list[str], hyp: list[str], n: int, step: int) -> None:
    rows = [f"| {s} | {r} | {h} |" for s, r, h in list(zip(src, ref, hyp))[:n]]
    tracker.text("valid/samples", "\n".join(["| source | reference | hypothesis |", "|---|---|---|", *rows]), step)


def _log_attention(tracker: Tracker, model: nn.Module, src_tok: Tokenizer, tgt_tok: Tokenizer,
                   source: str, hypothesis: list[int], step: int, max_tokens: int) -> None:
    """The source-target alignment (last layer, head-averaged cross-attention) of the first validation
    sentence whose source has tokens, teacher-forced on the model's own translation (the ids it generated): one
    picture per validation, cheap to draw. Both sides are cut to ``max_tokens`` tokens."""
    if not tracker.enabled:
        return
    src_ids, tgt_ids = src_tok.encode(source)[:max_tokens], hypothesis[:max_tokens]
    maps = compute_attention_maps(
        model, src_ids, tgt_ids,
        src_pieces=[src_tok.id_to_piece(i) for i in src_ids], tgt_pieces=[tgt_tok.id_to_piece(i) for i in tgt_ids],
        bos_id=tgt_tok.bos_id, eos_id=tgt_tok.eos_id, pad_id=src_tok.pad_id,
    )
    tracker.image("valid/alignment", figure_to_array(alignment_figure(maps)), step)
