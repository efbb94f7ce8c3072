"""The application: the only module that reads a root config.

It wires data → tokenizers → model → trainer → evaluation and exposes one function per command:
``train``, ``evaluate``, ``translate``, ``prepare_data``, ``average``. Everything it calls takes the
narrowest typed piece of the config (``ModelConfig`` to ``build_model``, ``TrainingConfig`` to the
``Trainer``) or plain arguments.
"""

from __future__ import annotations

import json
import logging
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from transformer import checkpoint as ckpt
from transformer import corpus_cache
from transformer.batching import TokenBucketSampler, collate_arrays
from transformer.config import (
    ConfigError,
    EvaluateConfig,
    ModelConfig,
    PrepareDataConfig,
    TrainConfig,
    TranslateConfig,
    from_plain_dict,
    to_plain_dict,
)
from transformer.corpus_files import corpus_paths, load_split
from transformer.data import TranslationDataset, read_parallel
from transformer.decoding import translate as translate_texts
from transformer.distributed import DistContext, broadcast_object, cleanup, init_distributed
from transformer.glove import init_embedding_from_glove, vector_dim
from transformer.inference import (
    FINAL_CHECKPOINT,
    TrainedModel,
    attention_maps,
    find_checkpoint,
    format_scores,
    load_trained,
    score_texts,
)
from transformer.model import Transformer, build_model
from transformer.optim import build_optimizer
from transformer.runtime import (
    choose_device,
    configure_threads,
    pad_to_multiple,
    seed_everything,
    set_deterministic,
)
from transformer.tokenizer import Tokenizer, tokenizer_from_state
from transformer.tracking import Tracker
from transformer.trainer import Trainer
from transformer.validation import make_validator
from transformer.visualize import log_attention_maps, save_attention_maps

log = logging.getLogger(__name__)


def _resolve_model_path(run_dir: str | None, checkpoint: str | None) -> Path:
    return Path(checkpoint) if checkpoint is not None else find_checkpoint(run_dir)


# --------------------------------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------------------------------


def prepare_data(cfg: PrepareDataConfig) -> None:
    """Make the configured corpus ready: check every split, then build the tokenizers and the encoded
    training split in ``data.cache_dir`` (progress bars on a terminal), so training starts from the cache."""
    data = cfg.data
    for split in (data.valid_split, data.test_split):
        src_path, tgt_path = corpus_paths(data, split)
        src, _ = read_parallel(src_path, tgt_path)
        log.info("%s: %d pairs (%s, %s)", split, len(src), src_path, tgt_path)
    src_tok, tgt_tok, train_set = corpus_cache.load_or_build(data, progress=True)
    log.info("%s: %d pairs after cleaning, %d + %d tokens; vocabularies %d / %d", data.train_split, len(train_set),
             len(train_set.src_tokens), len(train_set.tgt_tokens), src_tok.vocab_size, tgt_tok.vocab_size)


def build_training_data(cfg: TrainConfig, run_dir: Path, dist: DistContext,
                        saved_tokenizers: dict[str, Any] | None = None
                        ) -> tuple[Tokenizer, Tokenizer, TranslationDataset]:
    """The tokenizers (a resumed run's ``saved_tokenizers``, else cached or trained) and the cleaned,
    encoded training split memory-mapped from ``data.cache_dir``.

    Rank 0 builds whatever the cache lacks while the other ranks wait; then every rank maps the same
    read-only files, so the corpus occupies the page cache once per machine. ``run_dir`` is not used any
    more (tokenizers live in the cache and travel in checkpoints); it stays for the callers.
    """
    tokenizers = None
    if saved_tokenizers is not None:
        tokenizers = tokenizer_from_state(saved_tokenizers["src"]), tokenizer_from_state(saved_tokenizers["tgt"])
    if dist.is_main:
        prepared = corpus_cache.load_or_build(cfg.data, tokenizers, progress=cfg.training.progress_bar)
    dist.barrier()
    if not dist.is_main:
        prepared = corpus_cache.load_or_build(cfg.data, tokenizers)
    return prepared


# --------------------------------------------------------------------------------------------------
# Training
# --------------------------------------------------------------------------------------------------


def _check_glove(cfg: ModelConfig) -> None:
    """Fail before any work when the vector file's dimension cannot match the model."""
    if cfg.glove.path is None:
        return
    dim = vector_dim(cfg.glove.path, expected_dim=cfg.d_model)
    if dim != cfg.d_model:
        raise ConfigError(
            f"model.glove.path: {cfg.glove.path} holds {dim}-dimensional vectors but model.d_model={cfg.d_model}; "
            f"use a model whose d_model is {dim} (e.g. model=glove{dim}) or vectors of size {cfg.d_model}"
        )


def _apply_glove(model: Transformer, cfg: ModelConfig, src_tok: Tokenizer, tgt_tok: Tokenizer,
                 counts: dict[str, dict[str, int]]) -> None:
    sides = {"src": [(model.src_token_embedding, src_tok)], "tgt": [(model.tgt_token_embedding, tgt_tok)]}
    sides["both"] = sides["src"] + sides["tgt"]
    special = {src_tok.pad_id, src_tok.unk_id, src_tok.bos_id, src_tok.eos_id}
    for embedding, tok in sides[cfg.glove.side.value]:
        side = "src" if tok is src_tok else "tgt"
        coverage = init_embedding_from_glove(
            embedding, tok.pieces(), cfg.glove.path, counts=counts[side], freeze=cfg.glove.freeze,
            rescale=cfg.glove.rescale, skip_ids=special
        )
        log.info("GloVe %s embeddings: %s", side, coverage)


def _piece_counts(tokens: np.ndarray, tok: Tokenizer) -> dict[str, int]:
    counts = np.bincount(tokens, minlength=tok.vocab_size)
    return {tok.id_to_piece(i): int(c) for i, c in enumerate(counts.tolist()) if c}


def _resume_state(cfg: TrainConfig) -> tuple[dict[str, Any] | None, Path]:
    """The checkpoint to resume from (if any) and the run directory to write into."""
    if cfg.resume is None:
        return None, Path(cfg.output_dir)
    target = Path(cfg.resume)
    path = target / "checkpoints" / "last.pt" if target.is_dir() else target
    state = ckpt.load_checkpoint(path, map_location="cpu")
    saved_model = from_plain_dict(ModelConfig, state["model_config"])
    for key, value in asdict(saved_model).items():
        if getattr(cfg.model, key) != value and key != "glove":
            raise ConfigError(
                f"model.{key}: the checkpoint {path} was trained with {value!r}, the config says "
                f"{getattr(cfg.model, key)!r}; resume with the same model settings"
            )
    run_dir = target if target.is_dir() else path.parent.parent
    log.info("resuming from %s (step %s) in %s", path, state.get("step"), run_dir)
    return state, run_dir


def train(cfg: TrainConfig) -> dict[str, Any]:
    """Train on the configured corpus, validate as configured, then score the final model on the test set.

    Returns the metrics also written to ``metrics.json`` in the run directory.
    """
    dist = init_distributed(choose_device(cfg.device))
    try:
        metrics = _train(cfg, dist)
        dist.barrier()  # the other ranks wait for rank 0's test evaluation before leaving the group
        return metrics
    finally:
        cleanup()


def _train(cfg: TrainConfig, dist: DistContext) -> dict[str, Any]:
    configure_threads(cfg.training.threads)
    set_deterministic(cfg.training.deterministic)
    seed_everything(cfg.training.seed)
    _check_glove(cfg.model)
    resumed, run_dir = _resume_state(cfg)
    run_dir = Path(broadcast_object(str(run_dir)))  # under torchrun, ranks may have timestamped dirs apart
    run_dir.mkdir(parents=True, exist_ok=True)

    src_tok, tgt_tok, train_set = build_training_data(cfg, run_dir, dist,
                                                      resumed["tokenizers"] if resumed else None)
    valid_src, valid_ref = load_split(cfg.data, cfg.data.valid_split)

    seed_everything(cfg.training.seed)  # the same initial weights whatever the data steps consumed
    model = build_model(cfg.model, src_tok.vocab_size, tgt_tok.vocab_size, src_tok.pad_id)
    if cfg.model.glove.path is not None and resumed is None:
        counts = {"src": _piece_counts(train_set.src_tokens, src_tok), "tgt": _piece_counts(train_set.tgt_tokens, tgt_tok)}
        _apply_glove(model, cfg.model, src_tok, tgt_tok, counts)
    model.to(dist.device)
    log.info("model: %.2fM parameters", sum(p.numel() for p in model.parameters()) / 1e6)

    tracker = Tracker(run_dir / "tensorboard", enabled=dist.is_main)
    validate = make_validator(valid_src, valid_ref, src_tok, tgt_tok, cfg, dist.device, tracker)
    trainer = build_trainer(cfg, model, src_tok, tgt_tok, train_set, dist, tracker, run_dir, validate)
    if resumed is not None:
        trainer.load_state(resumed)
    result = trainer.fit()
    metrics: dict[str, Any] = {"train": asdict(result)}
    if dist.is_main:
        metrics.update(_final_evaluation(cfg, run_dir, model, src_tok, tgt_tok, dist.device, tracker,
                                         validate, result.steps))
        _write_json(run_dir / "metrics.json", metrics)
        tracker.hparams(_hparams(cfg), {k: v for k, v in metrics.items() if isinstance(v, float)})
    tracker.close()
    return metrics


def build_trainer(cfg: TrainConfig, model: Transformer, src_tok: Tokenizer, tgt_tok: Tokenizer,
                  train_set: TranslationDataset, dist: DistContext, tracker: Tracker, run_dir: Path,
                  validate: Callable[[torch.nn.Module, int], dict[str, float]]) -> Trainer:
    """The trainer with its sampler (this rank's shard), collate function, optimizer and checkpoints."""
    multiple = pad_to_multiple(cfg.training, dist.device)
    sampler = TokenBucketSampler(train_set.src_lengths, train_set.tgt_lengths, cfg.training.max_tokens,
                                 seed=cfg.training.seed, rank=dist.rank, world_size=dist.world_size,
                                 pad_to_multiple=multiple)
    specials = dict(pad_id=src_tok.pad_id, bos_id=tgt_tok.bos_id, eos_id=tgt_tok.eos_id, pad_to_multiple=multiple)
    return Trainer(
        model, build_optimizer(model, cfg.training), cfg.training,
        dataset=train_set, sampler=sampler,
        collate_fn=lambda indices: collate_arrays(train_set, indices, **specials),
        pad_id=tgt_tok.pad_id, device=dist.device, dist=dist, tracker=tracker,
        checkpoints=ckpt.CheckpointManager(run_dir / "checkpoints", cfg.training.keep_last),
        validate=validate, extra_state=_extra_state(cfg, src_tok, tgt_tok),
    )


def _extra_state(cfg: TrainConfig, src_tok: Tokenizer, tgt_tok: Tokenizer) -> dict[str, Any]:
    """What every checkpoint carries besides the training state: enough to rebuild model and tokenizers."""
    return {
        "config": to_plain_dict(cfg),
        "model_config": to_plain_dict(cfg.model),
        "tokenizers": {"src": src_tok.state_dict(), "tgt": tgt_tok.state_dict()},
    }


def _hparams(cfg: TrainConfig) -> dict[str, Any]:
    flat = {f"model.{k}": v for k, v in to_plain_dict(cfg.model).items() if not isinstance(v, dict)}
    flat.update({f"training.{k}": v for k, v in to_plain_dict(cfg.training).items() if not isinstance(v, list)})
    return {k: v for k, v in flat.items() if v is not None}


def _final_weights(cfg: TrainConfig, folder: Path, model: Transformer,
                   validate: Callable[[torch.nn.Module, int], dict[str, float]], step: int
                   ) -> tuple[dict[str, Any], str, float]:
    """The weights to keep: best.pt, or the average of the last checkpoints when that validates higher.

    Returns (model state, where it came from, its validation BLEU).
    """
    best = ckpt.load_checkpoint(folder / "best.pt", map_location="cpu")
    candidates = [(best["model"], f"best (step {best['step']})", float(best["best_bleu"]))]
    n_average = cfg.training.average_last
    paths = ckpt.CheckpointManager(folder, cfg.training.keep_last).recent(n_average) if n_average > 1 else []
    if len(paths) > 1:
        averaged = ckpt.average_checkpoints(paths)
        model.load_state_dict(averaged)
        bleu = validate(model, step)["bleu"]
        candidates.append((averaged, f"average of the last {len(paths)} checkpoints", bleu))
        log.info("validation BLEU: best checkpoint %.2f, %s %.2f", candidates[0][2], candidates[1][1], bleu)
    return max(candidates, key=lambda candidate: candidate[2])


def _final_evaluation(cfg: TrainConfig, run_dir: Path, model: Transformer, src_tok: Tokenizer,
                      tgt_tok: Tokenizer, device: torch.device, tracker: Tracker,
                      validate: Callable[[torch.nn.Module, int], dict[str, float]], step: int) -> dict[str, Any]:
    """Choose the final weights, save them as final.pt (with tokenizers and config), score them on the test set."""
    folder = run_dir / "checkpoints"
    weights, source, valid_bleu = _final_weights(cfg, folder, model, validate, step)
    model.load_state_dict(weights)
    last = ckpt.load_checkpoint(folder / "last.pt", map_location="cpu")
    keep = {key: last[key] for key in ("config", "model_config", "tokenizers", "version", "step")}
    ckpt.save_checkpoint({**keep, "model": weights, "source": source}, folder / FINAL_CHECKPOINT)

    test_src, test_ref = load_split(cfg.data, cfg.data.test_split)
    scores, hypotheses = score_texts(model, test_src, test_ref, src_tok, tgt_tok, cfg.eval, device)
    (run_dir / "test.hyp.txt").write_text("\n".join(hypotheses) + "\n", encoding="utf-8")
    tracker.scalars({"test/bleu": scores.bleu, "test/chrf": scores.chrf}, step=step)
    log.info("test (%s, %s): %s", cfg.data.test_split, source, format_scores(scores))
    return {
        "valid_bleu": valid_bleu, "test_bleu": scores.bleu, "test_chrf": scores.chrf,
        "test": asdict(scores), "final_weights": source,
    }


# --------------------------------------------------------------------------------------------------
# Evaluation, translation, averaging
# --------------------------------------------------------------------------------------------------


def evaluate(cfg: EvaluateConfig) -> dict[str, Any]:
    """Score a trained model on its test split (or given files) and dump the requested attention maps."""
    device = choose_device(cfg.device)
    trained = load_trained(_resolve_model_path(cfg.run_dir, cfg.checkpoint), device)
    data = trained.config.data
    if cfg.src_file is not None:
        src, refs = read_parallel(cfg.src_file, cfg.ref_file)
        name = Path(cfg.src_file).name
    else:
        src, refs = load_split(data, data.test_split)
        name = f"{data.test_split}.{data.src}-{data.tgt}"
    scores, hypotheses = score_texts(trained.model, src, refs, trained.src_tok, trained.tgt_tok, cfg.eval, device)
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "hypotheses.txt").write_text("\n".join(hypotheses) + "\n", encoding="utf-8")
    metrics = {"checkpoint": str(trained.path), "test_set": name, **asdict(scores), "eval": to_plain_dict(cfg.eval)}
    _write_json(out / "metrics.json", metrics)
    tracker = Tracker(out / "tensorboard", enabled=True)
    tracker.scalars({"test/bleu": scores.bleu, "test/chrf": scores.chrf}, step=0)
    _dump_attention(cfg, trained, src, refs, hypotheses, out / "attention", tracker)
    tracker.close()
    print(f"{name}: {format_scores(scores)}")
    return metrics


def _dump_attention(cfg: EvaluateConfig, trained: TrainedModel, src: list[str], refs: list[str],
                    hypotheses: list[str], out: Path, tracker: Tracker) -> None:
    """Attention maps for the chosen test indices and given texts, on the hypothesis (and reference)."""
    chosen: list[tuple[str, str, str, str | None]] = []  # (name, source, hypothesis, reference)
    for index in cfg.attention.indices:
        if not 0 <= index < len(src):
            raise ConfigError(f"attention.indices: {index} is outside the test set (0..{len(src) - 1})")
        chosen.append((f"test{index}", src[index], hypotheses[index], refs[index]))
    if cfg.attention.texts:
        texts = list(cfg.attention.texts)
        given = translate_texts(trained.model, texts, trained.src_tok, trained.tgt_tok, cfg.eval,
                                next(trained.model.parameters()).device, trained.model.max_positions)
        chosen += [(f"text{i}", text, nbest[0], None) for i, (text, nbest) in enumerate(zip(texts, given))]
    for name, source, hypothesis, reference in chosen:
        targets = [("hyp", hypothesis)]
        if cfg.attention.on_reference and reference is not None:
            targets.append(("ref", reference))
        for kind, target in targets:
            maps = attention_maps(trained, source, target, cfg.attention.max_tokens)
            paths = save_attention_maps(maps, out, f"{name}_{kind}")
            log_attention_maps(tracker.writer, maps, f"attention/{name}_{kind}", step=0)
            log.info("attention maps for %s (%s): %d files in %s", name, kind, len(paths), out)


def translate(cfg: TranslateConfig) -> None:
    """Translate lines from a file or stdin; one output line per input line (n-best joined by tabs)."""
    device = choose_device(cfg.device)
    trained = load_trained(_resolve_model_path(cfg.run_dir, cfg.checkpoint), device)
    lines = _read_input(cfg.input)
    nbest = translate_texts(trained.model, lines, trained.src_tok, trained.tgt_tok, cfg.eval, device,
                            trained.model.max_positions, progress=True)
    text = "".join("\t".join(candidates) + "\n" for candidates in nbest)
    if cfg.output is None:
        sys.stdout.write(text)
        sys.stdout.flush()
    else:
        Path(cfg.output).write_text(text, encoding="utf-8")


def _read_input(path: str | None) -> list[str]:
    if path is None:
        return sys.stdin.read().splitlines()
    try:
        return Path(path).read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as error:
        line = Path(path).read_bytes()[: error.start].count(b"\n") + 1
        raise ConfigError(f"input: {path}:{line} is not valid UTF-8 ({error.reason})") from None


def average(paths: list[str], out: str) -> None:
    """Average the model weights of several checkpoints of one run into a new checkpoint."""
    first = ckpt.load_checkpoint(paths[0], map_location="cpu")
    weights = ckpt.average_checkpoints(paths)
    keep = {key: first[key] for key in ("config", "model_config", "tokenizers", "version", "step") if key in first}
    ckpt.save_checkpoint({**keep, "model": weights}, out)
    print(f"averaged {len(paths)} checkpoints into {out}")


def _write_json(path: Path, payload: dict[str, Any]) -> None:
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(payload, indent=2, default=str) + "\n", encoding="utf-8")
    tmp.replace(path)
