"""The commands that use a trained model, each from its root config: ``evaluate``, ``translate`` and ``export``
take theirs, ``average`` the checkpoints and the output. Training and data preparation are in :mod:`.pipeline`.
"""

from __future__ import annotations

import logging
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable

import torch

from transformer import checkpoint as ckpt
from transformer import files
from transformer.app.run_folder import results_in
from transformer.app.schemas import EvaluateConfig, ExportConfig, TranslateConfig
from transformer.app.translate_io import (
    check_output_file,
    check_output_folder,
    read_lines,
    translate_as_typed,
    translate_in_windows,
)
from transformer.config import ConfigError, to_plain_dict
from transformer.data.corpus import DataError, read_parallel
from transformer.data.splits import load_split, warn_of_empty_sides, with_local_copy
from transformer.data.tokenizer import Tokenizer
from transformer.inference.attention_maps import check_indices, dump_attention
from transformer.inference.loading import check_same_vocabularies, load_model, load_trained
from transformer.inference.metrics import corpus_scores
from transformer.inference.sampling import generator
from transformer.inference.translation import decoding_model, score_texts
from transformer.inference.translation import translate as translate_texts
from transformer.inference.translator import Translator
from transformer.runtime import choose_device
from transformer.tracking import Tracker
from transformer.training.checkpoints import average_checkpoints, save_model

log = logging.getLogger(__name__)


def evaluate(cfg: EvaluateConfig) -> dict[str, Any]:
    """Score a trained model (or an export) on its test split (or another split, or given files) and dump the
    requested attention maps."""
    out = Path(cfg.output_dir)
    if not cfg.overwrite and (taken := results_in(out)):
        raise ConfigError(f"output_dir: {out} {taken}")
    check_output_folder("output_dir", out)
    for key in ("src_file", "ref_file"):  # before the model is loaded
        if (path := getattr(cfg, key)) is not None and not Path(path).is_file():
            raise ConfigError(f"{key}: {path} is not a file")
    device = choose_device(cfg.device)
    if cfg.export_dir is not None:
        translator, trained = Translator.load(cfg.export_dir, device=device, eval_cfg=cfg.eval), None
        data, src_tok, tgt_tok, source = translator.data, translator.src_tok, translator.tgt_tok, translator.source
    else:
        trained = load_model(cfg.run_dir, cfg.checkpoint, cfg.ensemble, device)
        data, src_tok, tgt_tok, source = trained.config.data, trained.src_tok, trained.tgt_tok, trained.path
    if cfg.src_file is not None:
        src, refs = read_parallel(cfg.src_file, cfg.ref_file)
        warn_of_empty_sides(src, refs, (cfg.src_file, cfg.ref_file))
        name = Path(cfg.src_file).name
    elif data is None:
        raise ConfigError(f"export_dir: {cfg.export_dir} records no corpus (an export from before version 0.9): "
                          "give the files to score, src_file=... ref_file=...")
    else:
        split = cfg.split or data.test_split
        try:
            src, refs = load_split(with_local_copy(data), split)
        except DataError as error:  # a corpus moved, or recorded relative to another folder before version 0.9.2
            raise DataError(f"{error}; or score files of your own: src_file=... ref_file=...") from None
        name = f"{split}.{data.src}-{data.tgt}"
    if cfg.longer_than is not None:
        src, refs = _longer_than(src, refs, src_tok, tgt_tok, cfg.longer_than)
        name = f"{name} (pairs with > {cfg.longer_than} tokens on a side: {len(src)})"
    check_indices(cfg.attention, src, src_tok, name)  # before the test set is decoded
    if trained is None:
        hypotheses = [nbest[0] for nbest in translator.translate(src, progress=True)]
        target_lang = translator.languages[1]
        scores = corpus_scores(hypotheses, refs, tokenized_lang=target_lang if cfg.eval.report_tokenized_bleu else None)
    else:
        scores, hypotheses = score_texts(trained.model, src, refs, src_tok, tgt_tok, cfg.eval, device, data.tgt)
    out.mkdir(parents=True, exist_ok=True)
    files.write_text(out / "hypotheses.txt", "\n".join(hypotheses) + "\n")
    metrics = {"checkpoint" if trained else "export": str(Path(source).absolute()), "test_set": name,
               **asdict(scores), "eval": to_plain_dict(cfg.eval)}
    if trained is not None and trained.ensemble_paths:
        metrics["ensemble"] = [str(Path(path).absolute()) for path in trained.ensemble_paths]
    files.write_json(out / "metrics.json", metrics)
    tracker = Tracker(out / "tensorboard", enabled=True)
    tracker.scalars(scores.scalars("test/"), step=0)
    drawn = dump_attention(cfg.attention, trained, cfg.eval, src, refs, out / "attention", tracker.writer) \
        if trained is not None else []
    tracker.close()
    log.info("%s: %s", name, scores)  # on the console, and in the run's evaluate.log
    log.info("wrote hypotheses.txt, metrics.json, tensorboard/%s in %s", ", attention/" if drawn else "", out)
    return metrics


def _longer_than(src: list[str], refs: list[str], src_tok: Tokenizer, tgt_tok: Tokenizer,
                 n_tokens: int) -> tuple[list[str], list[str]]:
    """The pairs whose source or reference has more than ``n_tokens`` tokens in the model's tokenizers."""
    src_lengths = [len(ids) for ids in src_tok.encode_batch(src)]
    ref_lengths = [len(ids) for ids in tgt_tok.encode_batch(refs)]
    kept = [i for i, (s, r) in enumerate(zip(src_lengths, ref_lengths)) if max(s, r) > n_tokens]
    if not kept:
        raise ConfigError(f"longer_than: no test pair has more than {n_tokens} tokens on a side")
    return [src[i] for i in kept], [refs[i] for i in kept]


def translate(cfg: TranslateConfig) -> None:
    """Translate lines from a file or stdin; one output line per input line (n-best joined by tabs). Lines typed
    at a terminal are translated one by one as they come."""
    device = choose_device(cfg.device)
    if cfg.output is not None:
        check_output_file(cfg.output, cfg.input, cfg.overwrite)  # before the work, not after it
    translate_lines: Callable[[list[str]], list[list[str]]]
    if cfg.export_dir is not None:
        translator = Translator.load(cfg.export_dir, device=device, eval_cfg=cfg.eval)

        def translate_lines(lines: list[str]) -> list[list[str]]:
            return translator.translate(lines, progress=len(lines) > 1)  # no bar for one line
    else:
        trained = load_model(cfg.run_dir, cfg.checkpoint, cfg.ensemble, device)
        random = generator(cfg.eval, device)  # sampling: the windows and typed lines go on drawing from one seed
        searcher = decoding_model(trained.model, cfg.eval.precision, device)  # a bf16 copy made once, not a window

        def translate_lines(lines: list[str]) -> list[list[str]]:
            return translate_texts(searcher, lines, trained.src_tok, trained.tgt_tok, cfg.eval, device,
                                   trained.model.max_positions, progress=len(lines) > 1, random=random)
    src_tok = translator.src_tok if cfg.export_dir is not None else trained.src_tok

    def reads(line: str) -> bool:  # a token of the line is one the model reads
        return bool(src_tok.encode(line))

    if cfg.input is None and cfg.output is None and sys.stdin is not None and sys.stdin.isatty():
        translate_as_typed(translate_lines, reads)
        return
    lines = read_lines(cfg.input)  # after the model loaded: its errors come before any reading
    translate_in_windows(lines, translate_lines, cfg.output, reads)


def export(cfg: ExportConfig) -> None:
    """Write the model of a run or checkpoint as a CTranslate2 model directory (transformer/inference/export.py)."""
    from transformer.inference.export import export as export_model

    trained = load_model(cfg.run_dir, cfg.checkpoint, [], torch.device("cpu"))
    decoding = {key: value for key, value in to_plain_dict(cfg.eval).items()
                if key in ("beam_size", "length_norm", "length_penalty", "max_len_a", "max_len_b", "sampling_topk",
                           "sampling_topp", "sampling_temperature", "sampling_seed")}
    out = export_model(trained, cfg.out_dir, cfg.quantization.value, decoding)
    print(f"exported {trained.path} to {out} (quantization={cfg.quantization.value}); "
          f"transformer-translate export_dir={out} uses it")


def average(paths: list[str], out: str) -> None:
    """Average the model weights of several checkpoints of one run into a new checkpoint file ``out``; refuses to
    overwrite a file (the first argument is the output, so a forgotten one would replace an input) and checkpoints
    of another language pair or other tokenizers."""
    if Path(out).exists():
        raise ConfigError(f"{out} exists; the first argument names the new file the average is written to "
                          "(transformer-average OUT.pt IN1.pt IN2.pt ...), so choose a new name")
    if not (folder := Path(out).absolute().parent).is_dir():  # as transformer-translate's output: never made here
        raise ConfigError(f"{out}: the directory {folder} does not exist; create it or choose another file")
    check_same_vocabularies([load_trained(path, torch.device("cpu"), retry_key=None) for path in paths],
                            "averaged checkpoints")
    first = ckpt.load_checkpoint(paths[0], map_location="cpu")
    save_model(average_checkpoints(paths), first, out)
    print(f"averaged {len(paths)} checkpoints into {out}")

