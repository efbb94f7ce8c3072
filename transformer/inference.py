"""Using a trained model: find its checkpoint in a run directory, rebuild it (no YAML needed), translate and
score texts. (Attention maps of a trained model's sentences: ``visualize.dump_attention``.)"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from transformer import checkpoint as ckpt
from transformer.config import EvalConfig, TrainConfig, from_plain_dict
from transformer.decoding import translate
from transformer.metrics import Scores, corpus_scores
from transformer.model import Transformer, build_model
from transformer.tokenizer import Tokenizer, tokenizer_from_state


@dataclass
class TrainedModel:
    """A model ready for inference, with the tokenizers and training config it came with."""

    model: Transformer
    src_tok: Tokenizer
    tgt_tok: Tokenizer
    config: TrainConfig
    path: Path


def find_checkpoint(run_dir: str | Path) -> Path:
    """The checkpoint of a training run to evaluate: final, else best, else last."""
    run = ckpt.RunDir(Path(run_dir))
    candidates = (run.final, run.best, run.last)
    for path in candidates:
        if path.is_file():
            return path
    raise FileNotFoundError(f"no checkpoint in {run.checkpoints} (looked for {', '.join(p.name for p in candidates)})")


def load_trained(path: str | Path, device: torch.device) -> TrainedModel:
    """Rebuild model and tokenizers from one checkpoint file; no YAML needed."""
    state = ckpt.load_checkpoint(path, map_location="cpu")
    config = from_plain_dict(TrainConfig, state["config"])
    src_tok = tokenizer_from_state(state["tokenizers"]["src"])
    tgt_tok = tokenizer_from_state(state["tokenizers"]["tgt"])
    model = build_model(config.model, src_tok.vocab_size, tgt_tok.vocab_size, src_tok.pad_id)
    model.load_state_dict(state["model"])
    model.to(device).eval()
    return TrainedModel(model, src_tok, tgt_tok, config, Path(path))


def score_texts(model: Transformer, src: list[str], refs: list[str], src_tok: Tokenizer, tgt_tok: Tokenizer,
                eval_cfg: EvalConfig, device: torch.device, tgt_lang: str, progress: bool = True
                ) -> tuple[Scores, list[str]]:
    """Translate ``src`` (best hypothesis each, with a progress bar) and score it against ``refs`` with sacreBLEU
    (and, with ``eval.report_tokenized_bleu``, in the Multi30k papers' flavour for language ``tgt_lang``)."""
    nbest = translate(model, src, src_tok, tgt_tok, eval_cfg, device, model.max_positions, progress=progress)
    hypotheses = [candidates[0] for candidates in nbest]
    lang = tgt_lang if eval_cfg.report_tokenized_bleu else None
    return corpus_scores(hypotheses, refs, tokenized_lang=lang), hypotheses


def format_scores(scores: Scores) -> str:
    """BLEU and chrF with their sacreBLEU signatures, for the log."""
    text = (f"BLEU {scores.bleu:.2f} chrF {scores.chrf:.2f} on {scores.n_sentences} sentences\n"
            f"  {scores.bleu_signature}\n  {scores.chrf_signature}")
    if scores.tokenized_bleu is not None:
        text += f"\n  tokenized BLEU {scores.tokenized_bleu:.2f} (Multi30k papers' flavour): {scores.tokenized_bleu_signature}"
    return text
