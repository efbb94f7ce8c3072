"""Text in, text out: translate lines with a model's search, and score translations with sacreBLEU. (Loading the
model: :mod:`transformer.inference.loading`; the searches themselves: :mod:`transformer.inference.search`.)"""

from __future__ import annotations

import copy
import sys
import warnings
from pathlib import Path

import torch
from torch import Tensor, nn
from tqdm import tqdm

from transformer.config import ConfigError, EvalConfig, Precision
from transformer.data.tokenizer import Tokenizer
from transformer.inference.ensemble import Ensemble, select_ensemble_encoder
from transformer.inference.fixed_shape import fixed_shape_beam, fixed_shape_greedy
from transformer.inference.metrics import Scores, corpus_scores
from transformer.inference.sampling import Sampler
from transformer.inference.search import Decoder, Hypothesis, beam_search, greedy_hypotheses
from transformer.model.transformer import Transformer, select_encoder_output
from transformer.runtime import decode_batch_size


def score_texts(model: Transformer | Ensemble, src: list[str], refs: list[str], src_tok: Tokenizer,
                tgt_tok: Tokenizer, eval_cfg: EvalConfig, device: torch.device, tgt_lang: str, progress: bool = True
                ) -> tuple[Scores, list[str]]:
    """Translate ``src`` (best hypothesis each, with a progress bar) and score it against ``refs`` with sacreBLEU
    (and, with ``eval.report_tokenized_bleu``, in the Multi30k papers' flavour for language ``tgt_lang``)."""
    nbest = translate(model, src, src_tok, tgt_tok, eval_cfg, device, model.max_positions, progress=progress)
    hypotheses = [candidates[0] for candidates in nbest]
    lang = tgt_lang if eval_cfg.report_tokenized_bleu else None
    return corpus_scores(hypotheses, refs, tokenized_lang=lang), hypotheses


class TruncationWarning(UserWarning):
    """Input lines were cut to the model's position limit (a server, which names them in each answer, ignores it)."""


def outside_stacklevel() -> int:
    """The ``stacklevel`` that makes a warning raised by this function's caller point at the first line outside this
    package: the program's own call, not the library function that passed the sentences on."""
    package = Path(__file__).resolve().parents[1]
    frame, level = sys._getframe(1), 1
    while frame.f_back is not None and Path(frame.f_code.co_filename).resolve().is_relative_to(package):
        frame, level = frame.f_back, level + 1
    return level


def translate(model: nn.Module, texts: list[str], src_tok: Tokenizer, tgt_tok: Tokenizer, cfg: EvalConfig,
              device: torch.device | str, max_positions: int, progress: bool = False,
              random: torch.Generator | None = None) -> list[list[str]]:
    """Translate lines of text; returns ``cfg.n_best`` strings per line, in the input order (see
    :func:`translate_scored`)."""
    scored = translate_scored(model, texts, src_tok, tgt_tok, cfg, device, max_positions, progress, random)
    return [[text for text, _ in nbest] for nbest in scored]


def translate_scored(model: nn.Module, texts: list[str], src_tok: Tokenizer, tgt_tok: Tokenizer, cfg: EvalConfig,
                     device: torch.device | str, max_positions: int, progress: bool = False,
                     random: torch.Generator | None = None) -> list[list[tuple[str, float]]]:
    """Translate lines of text; returns ``cfg.n_best`` (text, score) pairs per line, best first, in the input
    order (see :func:`translate_hypotheses`)."""
    found = translate_hypotheses(model, texts, src_tok, tgt_tok, cfg, device, max_positions, progress, random)
    return [[(tgt_tok.decode(h.tokens), h.score) for h in nbest] for nbest in found]


def translate_hypotheses(model: nn.Module, texts: list[str], src_tok: Tokenizer, tgt_tok: Tokenizer,
                         cfg: EvalConfig, device: torch.device | str, max_positions: int, progress: bool = False,
                         random: torch.Generator | None = None) -> list[list[Hypothesis]]:
    """Translate lines of text; returns ``cfg.n_best`` hypotheses (the generated ids and their scores) per line,
    best first, in the input order. The score is the hypothesis's log-probability normalized as
    ``cfg.length_norm`` says.

    Sources are encoded without BOS/EOS (as ``batching.collate`` does), sorted by length and decoded in
    batches of :func:`~transformer.runtime.decode_batch_size` sentences. An empty (or all-whitespace) line gives
    ``n_best`` empty hypotheses (score 0) without running the model. A line longer than ``max_positions`` tokens
    is cut to that length with a warning; hypotheses are capped at ``max_positions`` tokens too (pass the model's
    position limit).
    ``beam_size=1`` runs greedy search; ``sampling_topk`` other than 1 samples ``n_best`` translations of each
    line (:mod:`~transformer.inference.sampling`), best score first, drawn from ``random`` (default: a generator
    seeded for this call; pass one :func:`~transformer.inference.sampling.generator` to calls that go on from each
    other), ``eval.batch_size / n_best`` lines at a time.
    The model is in eval mode during the call and restored after; ``eval.precision`` bf16 decodes with a bfloat16
    copy of it (:func:`decoding_model`).
    ``progress`` shows a progress bar (sentences) on stderr when it is a terminal.
    """
    ids = encode_sources(texts, src_tok, max_positions)
    outputs: list[list[Hypothesis]] = [[Hypothesis([], 0.0, 0.0)] * cfg.n_best for _ in texts]
    todo = sorted((i for i, seq in enumerate(ids) if seq), key=lambda i: len(ids[i]), reverse=True)
    was_training = model.training
    model.eval()
    bar = progress_bar(len(todo), progress)
    sampler = Sampler.from_config(cfg, device, random)
    try:
        searcher = decoding_model(model, cfg.precision, device)
        with torch.inference_mode():
            batch_size = max(1, decode_batch_size(cfg, device) // (cfg.n_best if sampler else 1))  # rows, not lines
            for start in range(0, len(todo), batch_size):
                chunk = todo[start:start + batch_size]
                src = _pad([ids[i] for i in chunk], src_tok.pad_id, device)  # (batch, src_len)
                for i, nbest in zip(chunk, _search(searcher, src, tgt_tok, cfg, max_positions, sampler)):
                    outputs[i] = nbest
                bar.update(len(chunk))
    finally:
        bar.close()
        model.train(was_training)
    return outputs


def decodes_in_bf16(precision: Precision, device: torch.device | str) -> bool:
    """Whether ``eval.precision`` decodes in bfloat16 on ``device``: bf16 always (refused on a GPU without it),
    auto on a GPU that has it (native from compute capability 8, Ampere)."""
    gpu = torch.device(device).type == "cuda"
    native = gpu and torch.cuda.get_device_properties(torch.device(device)).major >= 8
    if precision is Precision.bf16 and gpu and not native:
        raise ConfigError("eval.precision: bf16, but this GPU does not support bfloat16; use fp32 or auto")
    return precision is Precision.bf16 or (precision is Precision.auto and native)


def decoding_model(model: nn.Module, precision: Precision, device: torch.device | str) -> nn.Module:
    """The model a search runs for ``eval.precision``: ``model`` itself for fp32 (and when its weights are in
    bfloat16 already), else a bfloat16 copy of it (:func:`decodes_in_bf16`). The searches turn the logits to
    float32 before their log-softmax, so scores add up in float32 either way."""
    if not decodes_in_bf16(precision, device) or next(model.parameters()).dtype == torch.bfloat16:
        return model
    no_gradients = {id(p.grad): None for p in model.parameters() if p.grad is not None}  # a training model's
    return copy.deepcopy(model, memo=no_gradients).to(torch.bfloat16)


def progress_bar(sentences: int, progress: bool) -> tqdm:
    """A bar counting translated sentences on stderr, shown when ``progress`` and stderr is a terminal; gone when
    it closes."""
    return tqdm(total=sentences, unit="sent", desc="translating", disable=not (progress and sys.stderr.isatty()),
                leave=False)


def encode_sources(texts: list[str], src_tok: Tokenizer, max_positions: int) -> list[list[int]]:
    """Source ids per line (empty for blank lines), cut to ``max_positions`` with a warning."""
    ids = [src_tok.encode(text) if text.strip() else [] for text in texts]
    too_long = [(line_no, len(seq)) for line_no, seq in enumerate(ids, start=1) if len(seq) > max_positions]
    if too_long and len(texts) == 1:  # a sentence alone (one typed at a terminal): no line number to give
        warnings.warn(f"the sentence has {too_long[0][1]} source tokens, more than the model's {max_positions}: "
                      "it was truncated", TruncationWarning, stacklevel=outside_stacklevel())
    elif too_long:
        shown = ", ".join(f"line {line_no} ({n} tokens)" for line_no, n in too_long[:10])
        more = f" and {len(too_long) - 10} more" if len(too_long) > 10 else ""
        warnings.warn(f"{len(too_long)} input line(s) longer than {max_positions} source tokens were truncated: "
                      f"{shown}{more}", TruncationWarning, stacklevel=outside_stacklevel())
    return [seq[:max_positions] for seq in ids]


def _pad(seqs: list[list[int]], pad_id: int, device: torch.device | str) -> Tensor:
    """(batch, longest) long tensor of the sequences right-padded with ``pad_id``."""
    out = torch.full((len(seqs), max(len(s) for s in seqs)), pad_id, dtype=torch.long)
    for row, seq in enumerate(seqs):
        out[row, : len(seq)] = torch.tensor(seq, dtype=torch.long)
    return out.to(device)


def searches_in_fixed_shapes(cfg: EvalConfig, model: Decoder, device: torch.device | str) -> bool:
    """``eval.fixed_shape``, or when unset: on a GPU for a single model's cached search (the ordinary search's
    translations, faster there), off elsewhere (on a CPU the rows carried along cost time) and for sampling."""
    if cfg.fixed_shape is not None:
        return cfg.fixed_shape
    searches = cfg.sampling_topk == 1  # sampling draws in the ordinary loop
    return torch.device(device).type == "cuda" and isinstance(model, Transformer) and cfg.use_cache and searches


def _search(model: Decoder, src: Tensor, tgt_tok: Tokenizer, cfg: EvalConfig, max_tgt_len: int,
            sampler: Sampler | None = None) -> list[list[Hypothesis]]:
    """n-best hypotheses per sentence with the search ``cfg`` asks for (``n_best`` samples with a ``sampler``)."""
    select_encoder = select_ensemble_encoder if isinstance(model, Ensemble) else select_encoder_output
    common = dict(pad_id=tgt_tok.pad_id, bos_id=tgt_tok.bos_id, eos_id=tgt_tok.eos_id, max_len_a=cfg.max_len_a,
                  max_len_b=cfg.max_len_b, use_cache=cfg.use_cache, max_tgt_len=max_tgt_len,
                  select_encoder=select_encoder, length_penalty=cfg.length_penalty, length_norm=cfg.length_norm)
    drop_finished_at = 0.25 if src.device.type == "cuda" else 0.0  # greedy search and sampling: see greedy_hypotheses
    if sampler is not None:  # n_best rows of each sentence, side by side: (batch * n_best, src_len)
        samples = greedy_hypotheses(model, src.repeat_interleave(cfg.n_best, dim=0), sampler=sampler,
                                    drop_finished_at=drop_finished_at, **common)
        return [sorted(samples[i:i + cfg.n_best], key=lambda h: -h.score) for i in range(0, len(samples), cfg.n_best)]
    if searches_in_fixed_shapes(cfg, model, src.device):
        if not isinstance(model, Transformer):
            raise ConfigError("eval.fixed_shape: decodes a single Transformer, not an ensemble; set eval.fixed_shape=false")
        fixed = {key: common[key] for key in ("pad_id", "bos_id", "eos_id", "max_len_a", "max_len_b", "max_tgt_len",
                                              "length_penalty", "length_norm")}
        if cfg.beam_size == 1:
            return [[h] for h in fixed_shape_greedy(model, src, **fixed)]
        return fixed_shape_beam(model, src, beam_size=cfg.beam_size, n_best=cfg.n_best, **fixed)
    if cfg.beam_size == 1:
        return [[h] for h in greedy_hypotheses(model, src, drop_finished_at=drop_finished_at, **common)]
    return beam_search(model, src, beam_size=cfg.beam_size, n_best=cfg.n_best, **common)
