"""The application's main commands, each from its root config.

It wires data → tokenizers → model → trainer → evaluation and exposes one function per command: ``train``,
``evaluate``, ``translate``, ``prepare_data`` and ``export`` take their root config, ``average`` the checkpoints and
the output. Everything it calls takes the narrowest typed piece of the config (``ModelConfig`` to ``build_model``,
``TrainingConfig`` to the ``Trainer``) or plain arguments. The other commands read their root configs in modules of
their own (``benchmark``, ``diversify``, ``server``).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any, Callable

import torch

from transformer import checkpoint as ckpt
from transformer import files
from transformer.app.before_hydra import results_in
from transformer.app.schemas import EvaluateConfig, ExportConfig, PrepareDataConfig, TranslateConfig
from transformer.app.translate_io import (
    check_output_file,
    check_output_folder,
    read_lines,
    translate_as_typed,
    warn_of_empty_translations,
    write_translations,
)
from transformer.config import ConfigError, ModelConfig, TrainConfig, flatten, from_plain_dict, to_plain_dict
from transformer.data import cache as corpus_cache
from transformer.data.batching import Batch, TokenBucketSampler, collate_arrays, count_oversized
from transformer.data.corpus import DataError, TranslationDataset, read_parallel
from transformer.data.splits import anchored, corpus_paths, load_split
from transformer.data.subword_sampling import ResegmentedCorpus, ResegmentingSampler
from transformer.data.tokenizer import Tokenizer, tokenizer_from_state
from transformer.inference.attention_maps import check_indices, dump_attention
from transformer.inference.loading import check_same_vocabularies, load_model, load_trained
from transformer.inference.metrics import corpus_scores
from transformer.inference.translation import format_scores, score_texts
from transformer.inference.translation import translate as translate_texts
from transformer.inference.translator import Translator
from transformer.model.transformer import Transformer, build_model
from transformer.runtime import (
    choose_device,
    configure_threads,
    resolve_training,
    seed_everything,
    set_deterministic,
)
from transformer.tracking import Tracker
from transformer.training import glove
from transformer.training.checkpoints import CheckpointManager, average_checkpoints, choose_final_weights, save_model
from transformer.training.distributed import DistContext, broadcast_object, cleanup, init_distributed
from transformer.training.optim import build_optimizer
from transformer.training.resume import check_training_split, load_for_resume, take_up_history
from transformer.training.run_lock import hold_run
from transformer.training.trainer import Trainer
from transformer.training.validation import make_validator

log = logging.getLogger(__name__)
_LOG_FORMAT = "[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"  # Hydra's job-log format


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


def build_training_data(cfg: TrainConfig, dist: DistContext,
                        saved_tokenizers: dict[str, Any] | None = None
                        ) -> tuple[Tokenizer, Tokenizer, TranslationDataset]:
    """The tokenizers (a resumed run's ``saved_tokenizers``, else cached or trained) and the cleaned,
    encoded training split memory-mapped from ``data.cache_dir``.

    Rank 0 builds whatever the cache lacks while the other ranks wait; then every rank maps the same
    read-only files, so the corpus occupies the page cache once per machine.
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


def _start_run(cfg: TrainConfig, dist: DistContext,
               held: ExitStack) -> tuple[dict[str, Any] | None, Path | None, ckpt.RunDir]:
    """Checks before any work, then the checkpoint to resume and its file (checked against ``cfg``; None for a new
    run) and the run directory to write into: ``output_dir``, or the resumed run's own directory. Rank 0 holds that
    directory until ``held`` closes: a second run into it is refused."""
    configure_threads(cfg.training.threads)
    set_deterministic(cfg.training.deterministic)
    seed_everything(cfg.training.seed)
    if cfg.resume is None:
        glove.check_dimension(cfg.model.glove, cfg.model.d_model)  # a resumed run's vectors are in its weights
        resumed, path, run = None, None, ckpt.RunDir(Path(cfg.output_dir))
        _hold(run, "output_dir", dist, held)
        if dist.is_main and run.checkpoints.is_dir() and any(run.checkpoints.glob("*.pt")):  # the others: rank 0's
            raise ConfigError(f"output_dir: {run.root} already holds a run's checkpoints, which a new run would "
                              f"overwrite; continue it with resume={run.root}, or train into another directory "
                              "(output_dir=... or hydra.run.dir=...)")
    else:
        resumed, run, path = load_for_resume(cfg.resume, to_plain_dict(cfg))
        _hold(run, "resume", dist, held)
        for stale in files.remove_stale_temporaries(run.checkpoints) if dist.is_main else []:  # never read, only space
            log.info("removed %s, which a write killed midway left", stale)
    run = ckpt.RunDir(Path(broadcast_object(str(run.root))))  # under torchrun, ranks may have timestamped dirs apart
    run.root.mkdir(parents=True, exist_ok=True)
    return resumed, path, run


def _hold(run: ckpt.RunDir, key: str, dist: DistContext, held: ExitStack) -> None:
    """Rank 0 holds ``run``'s folder until ``held`` closes; a refusal is raised on every rank (the others would wait
    for rank 0 otherwise)."""
    refusal = None
    if dist.is_main:
        try:
            held.enter_context(hold_run(run.root, key))
        except ConfigError as error:
            refusal = str(error)
    if (refusal := broadcast_object(refusal)) is not None:
        raise ConfigError(refusal)


@contextmanager
def _log_into(path: Path | None) -> Iterator[None]:
    """Also append the log to ``path`` meanwhile (None, or a file the log already goes to: nothing to add).

    A resumed run writes its checkpoints into the original run directory, so its log continues that run's
    ``train.log`` there too (``transformer-train`` makes the resumed run its Hydra folder, unless ``hydra.run.dir``
    names another, which then keeps a copy).
    """
    root = logging.getLogger()
    handlers = [h for h in root.handlers if isinstance(h, logging.FileHandler)]
    if path is None or any(Path(h.baseFilename) == path.absolute() for h in handlers):
        yield
        return
    handler = logging.FileHandler(path, mode="a", encoding="utf-8")
    handler.setFormatter(handlers[0].formatter if handlers else logging.Formatter(_LOG_FORMAT))
    root.addHandler(handler)
    try:
        yield
    finally:
        root.removeHandler(handler)
        handler.close()


def train(cfg: TrainConfig, recipe: list[str] | None = None) -> dict[str, Any]:
    """Train on the configured corpus, validate as configured, then score the final model on the test set.

    ``recipe``: the command-line overrides that made ``cfg`` (``transformer-train`` passes them), kept in the
    checkpoints so that ``resume=RUN`` can compose the same config. Returns the metrics also written to
    ``metrics.json`` in the run directory.
    """
    dist = init_distributed(choose_device(cfg.device))
    cfg = replace(cfg, training=resolve_training(cfg.training, dist.device, dist.world_size),  # as recorded
                  data=anchored(cfg.data))
    try:
        with ExitStack() as held:
            resumed, resumed_path, run = _start_run(cfg, dist, held)
            with _log_into(run.log_file if resumed is not None and dist.is_main else None):
                try:
                    metrics = _train(cfg, dist, resumed, resumed_path, run, recipe)
                except files.DiskFullError as error:  # the same command again would be refused as a new run there
                    if not any(run.checkpoints.glob("*.pt")):
                        raise
                    raise files.DiskFullError(error.errno, str(error).replace(
                        "run the command again", f"continue the run with resume={run.root}")) from None
            dist.barrier()  # the other ranks wait for rank 0's test evaluation before leaving the group
            return metrics
    finally:
        cleanup()


def _train(cfg: TrainConfig, dist: DistContext, resumed: dict[str, Any] | None, resumed_path: Path | None,
           run: ckpt.RunDir, recipe: list[str] | None) -> dict[str, Any]:
    if resumed is not None:
        log.info("resuming the run in %s at step %d; its log and checkpoints continue there", run.root, resumed["step"])
    # read first: a missing or broken split stops the run before the training data is built (rank 0 scores them)
    scored = {split: load_split(cfg.data, split) for split in (cfg.data.valid_split, cfg.data.test_split)
              if dist.is_main}
    src_tok, tgt_tok, train_set = build_training_data(cfg, dist, resumed["tokenizers"] if resumed else None)
    if resumed is not None:
        check_training_split(resumed, len(train_set), train_set.digest, cfg.data)
    valid_src, valid_ref = scored[cfg.data.valid_split] if dist.is_main else load_split(cfg.data, cfg.data.valid_split)

    seed_everything(cfg.training.seed)  # the same initial weights whatever the data steps consumed
    model = build_model(cfg.model, src_tok.vocab_size, tgt_tok.vocab_size, src_tok.pad_id)
    if resumed is None:
        glove.init_model_embeddings(model, cfg.model.glove, src_tok, tgt_tok, train_set)
    else:  # the checkpoint holds the GloVe-initialised weights; only what it froze must be frozen again
        glove.refreeze_model_embeddings(model, from_plain_dict(ModelConfig, resumed["model_config"]).glove)
    model.to(dist.device)
    log.info("model: %.2fM parameters", sum(p.numel() for p in model.parameters()) / 1e6)

    tracker = Tracker(run.tensorboard, enabled=dist.is_main)
    validate = make_validator(valid_src, valid_ref, src_tok, tgt_tok, training=cfg.training, eval_cfg=cfg.eval,
                              max_positions=cfg.model.max_positions, device=dist.device, tracker=tracker)
    trainer = build_trainer(cfg, model, src_tok, tgt_tok, train_set, dist, tracker, run.root, validate, recipe)
    if resumed is not None:
        take_up_history(resumed, resumed_path, CheckpointManager(run.checkpoints, cfg.training.keep_last), dist)
        trainer.load_state(resumed)
    result = trainer.fit()
    metrics: dict[str, Any] = {"train": asdict(result)}
    if dist.is_main:
        metrics.update(_final_evaluation(cfg, run, model, src_tok, tgt_tok, dist.device, tracker,
                                         scored[cfg.data.valid_split], scored[cfg.data.test_split], result.steps))
        files.write_json(run.metrics, metrics)
        tracker.hparams(_hparams(cfg), {k: v for k, v in metrics.items() if isinstance(v, float)})
    tracker.close()
    return metrics


def build_trainer(cfg: TrainConfig, model: Transformer, src_tok: Tokenizer, tgt_tok: Tokenizer,
                  train_set: TranslationDataset, dist: DistContext, tracker: Tracker, run_dir: Path,
                  validate: Callable[[torch.nn.Module, int], dict[str, float]],
                  recipe: list[str] | None = None) -> Trainer:
    """The trainer with its sampler (this rank's shard), collate function, optimizer and checkpoints; with
    ``training.bpe_dropout``, the sampler re-segments the pairs every epoch and collation reads its epoch's."""
    multiple = cfg.training.pad_to_multiple

    def bucket_sampler(pairs: TranslationDataset) -> TokenBucketSampler:
        return TokenBucketSampler(pairs.src_lengths, pairs.tgt_lengths, cfg.training.max_tokens,
                                  seed=cfg.training.seed, rank=dist.rank, world_size=dist.world_size,
                                  pad_to_multiple=multiple)

    over = count_oversized(train_set.src_lengths, train_set.tgt_lengths, cfg.training.max_tokens, multiple)
    if over and dist.is_main:
        log.warning("%d of %d training pairs need more than training.max_tokens=%d padded positions on their own: "
                    "each gets a batch of its own", over, len(train_set), cfg.training.max_tokens)
    sampler: TokenBucketSampler | ResegmentingSampler
    if cfg.training.bpe_dropout > 0:
        corpus = ResegmentedCorpus(train_set, src_tok, tgt_tok, cfg.training.bpe_dropout,  # type: ignore[arg-type]
                                   seed=cfg.training.seed, max_len=cfg.data.max_len)
        sampler = ResegmentingSampler(corpus, bucket_sampler)
    else:
        sampler = bucket_sampler(train_set)
    specials = dict(pad_id=src_tok.pad_id, bos_id=tgt_tok.bos_id, eos_id=tgt_tok.eos_id, pad_to_multiple=multiple,
                    fill_to_tokens=cfg.training.max_tokens if cfg.training.cuda_graphs else None)

    def collate_fn(indices: list[int]) -> Batch:
        pairs = sampler.dataset if isinstance(sampler, ResegmentingSampler) else train_set
        return collate_arrays(pairs, indices, **specials)

    return Trainer(
        model, build_optimizer(model, cfg.training), cfg.training,
        n_pairs=len(train_set), sampler=sampler, collate_fn=collate_fn,
        device=dist.device, dist=dist, tracker=tracker,
        checkpoints=CheckpointManager(ckpt.RunDir(run_dir).checkpoints, cfg.training.keep_last),
        validate=validate, extra_state={**_extra_state(cfg, src_tok, tgt_tok, recipe), "train_pairs": len(train_set),
                                        "train_digest": train_set.digest},
    )


def _extra_state(cfg: TrainConfig, src_tok: Tokenizer, tgt_tok: Tokenizer,
                 recipe: list[str] | None) -> dict[str, Any]:
    """What every checkpoint carries besides the training state: enough to rebuild model and tokenizers, and
    the recipe (command-line overrides) to compose the run's config again."""
    state = {
        "config": to_plain_dict(cfg),
        "model_config": to_plain_dict(cfg.model),
        "tokenizers": {"src": src_tok.state_dict(), "tgt": tgt_tok.state_dict()},
    }
    return state if recipe is None else {**state, "recipe": list(recipe)}


def _hparams(cfg: TrainConfig) -> dict[str, Any]:
    flat = flatten(to_plain_dict(cfg.model), "model.")
    flat.update({f"training.{k}": v for k, v in to_plain_dict(cfg.training).items() if not isinstance(v, list)})
    return {k: v for k, v in flat.items() if v is not None}


def _final_evaluation(cfg: TrainConfig, run: ckpt.RunDir, model: Transformer, src_tok: Tokenizer,
                      tgt_tok: Tokenizer, device: torch.device, tracker: Tracker,
                      valid: tuple[list[str], list[str]], test: tuple[list[str], list[str]],
                      step: int) -> dict[str, Any]:
    """Choose the final weights, save them as final.pt (with tokenizers and config), score them on the test set.

    The candidates (the best checkpoint, the average of the last ones) are compared by their validation BLEU under
    the search the test set is decoded with (``cfg.eval``), on the sentences validation translates. ``valid`` and
    ``test``: the (source, reference) lines of the splits."""
    (valid_src, valid_ref), (test_src, test_ref) = valid, test
    n_valid = cfg.training.valid_max_sentences or len(valid_src)

    def validate_weights(weights: dict[str, torch.Tensor]) -> float:
        model.load_state_dict(weights)
        scores, _ = score_texts(model, valid_src[:n_valid], valid_ref[:n_valid], src_tok, tgt_tok, cfg.eval, device,
                                cfg.data.tgt, progress=cfg.training.progress_bar)
        return scores.bleu

    final = choose_final_weights(run.checkpoints, cfg.training.average_last, validate_weights)
    model.load_state_dict(final.weights)
    save_model(final.weights, ckpt.load_checkpoint(run.last, map_location="cpu"), run.final, source=final.source)

    scores, hypotheses = score_texts(model, test_src, test_ref, src_tok, tgt_tok, cfg.eval, device, cfg.data.tgt)
    files.write_text(run.test_hypotheses, "\n".join(hypotheses) + "\n")
    tracker.scalars(scores.scalars("test/"), step=step)
    log.info("test (%s, %s): %s", cfg.data.test_split, final.source, format_scores(scores))
    return {
        "valid_bleu": final.valid_bleu, "test_bleu": scores.bleu, "test_chrf": scores.chrf,
        "test_tokenized_bleu": scores.tokenized_bleu,
        "test": asdict(scores), "final_weights": final.source,
    }


# --------------------------------------------------------------------------------------------------
# Evaluation, translation, averaging
# --------------------------------------------------------------------------------------------------


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
        name = Path(cfg.src_file).name
    elif data is None:
        raise ConfigError(f"export_dir: {cfg.export_dir} records no corpus (an export from before version 0.9): "
                          "give the files to score, src_file=... ref_file=...")
    else:
        split = cfg.split or data.test_split
        try:
            src, refs = load_split(data, split)
        except DataError as error:  # a corpus moved, or recorded relative to another folder before version 0.9.2
            raise DataError(f"{error}; or score files of your own: src_file=... ref_file=...") from None
        name = f"{split}.{data.src}-{data.tgt}"
    if cfg.longer_than is not None:
        src, refs = _longer_than(src, refs, src_tok, tgt_tok, cfg.longer_than)
        name = f"{name} (pairs with > {cfg.longer_than} tokens on a side: {len(src)})"
    check_indices(cfg.attention, src, src_tok)  # before the test set is decoded
    if trained is None:
        hypotheses = [nbest[0] for nbest in translator.translate(src)]
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
    if trained is not None:
        dump_attention(cfg.attention, trained, cfg.eval, src, refs, hypotheses, out / "attention", tracker.writer)
    tracker.close()
    log.info("%s: %s", name, format_scores(scores))  # on the console, and in the run's evaluate.log
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
        translate_lines = Translator.load(cfg.export_dir, device=device, eval_cfg=cfg.eval).translate
    else:
        trained = load_model(cfg.run_dir, cfg.checkpoint, cfg.ensemble, device)

        def translate_lines(lines: list[str]) -> list[list[str]]:
            return translate_texts(trained.model, lines, trained.src_tok, trained.tgt_tok, cfg.eval, device,
                                   trained.model.max_positions, progress=len(lines) > 1)  # no bar for one line
    if cfg.input is None and cfg.output is None and sys.stdin is not None and sys.stdin.isatty():
        translate_as_typed(translate_lines)
        return
    lines = read_lines(cfg.input)  # after the model loaded: its errors come before any reading
    nbest = translate_lines(lines)
    warn_of_empty_translations(lines, nbest)
    write_translations(cfg.output, nbest)


def export(cfg: ExportConfig) -> None:
    """Write the model of a run or checkpoint as a CTranslate2 model directory (transformer/inference/export.py)."""
    from transformer.inference.export import export as export_model

    trained = load_model(cfg.run_dir, cfg.checkpoint, [], torch.device("cpu"))
    decoding = {key: value for key, value in to_plain_dict(cfg.eval).items()
                if key in ("beam_size", "length_norm", "length_penalty", "max_len_a", "max_len_b")}
    out = export_model(trained, cfg.out_dir, cfg.quantization.value, decoding)
    print(f"exported {trained.path} to {out} ({cfg.quantization.value})")


def average(paths: list[str], out: str) -> None:
    """Average the model weights of several checkpoints of one run into a new checkpoint file ``out``; refuses to
    overwrite a file (the first argument is the output, so a forgotten one would replace an input) and checkpoints
    of another language pair or other tokenizers."""
    if Path(out).exists():
        raise ConfigError(f"{out} exists; the first argument names the new file the average is written to "
                          "(transformer-average OUT.pt IN1.pt IN2.pt ...), so choose a new name")
    check_same_vocabularies([load_trained(path, torch.device("cpu"), retry_key=None) for path in paths],
                            "averaged checkpoints")
    first = ckpt.load_checkpoint(paths[0], map_location="cpu")
    save_model(average_checkpoints(paths), first, out)
    print(f"averaged {len(paths)} checkpoints into {out}")

