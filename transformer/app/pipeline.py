"""Training from its root config, and the data it reads.

It wires data → tokenizers → model → trainer → evaluation and exposes ``train`` and ``prepare_data``. Everything it
calls takes the narrowest typed piece of the config (``ModelConfig`` to ``build_model``, ``TrainingConfig`` to the
``Trainer``) or plain arguments. The commands that use a trained model (evaluate, translate, export, average) are in
:mod:`.use`; the others read their root configs in modules of their own (``benchmark``, ``diversify``, ``server``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any, Callable

import torch

from transformer import checkpoint as ckpt
from transformer import files
from transformer.app.schemas import PrepareDataConfig
from transformer.config import ConfigError, ModelConfig, TrainConfig, flatten, from_plain_dict, to_plain_dict
from transformer.data import cache as corpus_cache
from transformer.data.batching import Batch, TokenBucketSampler, collate_arrays, count_oversized
from transformer.data.corpus import TranslationDataset, read_parallel
from transformer.data.splits import anchored, corpus_paths, load_split
from transformer.data.subword_sampling import ResegmentedCorpus, ResegmentingSampler
from transformer.data.tokenizer import Tokenizer, tokenizer_from_state
from transformer.inference.translation import score_texts
from transformer.model.transformer import Transformer, build_model
from transformer.overrides import override_value
from transformer.runtime import (
    choose_device,
    configure_threads,
    resolve_training,
    seed_everything,
    set_deterministic,
)
from transformer.tracking import Tracker
from transformer.training import glove
from transformer.training.checkpoints import CheckpointManager, choose_final_weights, save_model
from transformer.training.distributed import DistContext, broadcast_object, cleanup, init_distributed
from transformer.training.optim import build_optimizer
from transformer.training.resume import check_resumable, check_training_split, load_for_resume, take_up_history
from transformer.training.run_lock import hold_run
from transformer.training.trainer import Trainer
from transformer.training.validation import make_validator

log = logging.getLogger(__name__)
LOG_FORMAT = "[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"  # Hydra's job-log format


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
        _hold(run, "output_dir", dist, held, then=_refuse_a_started_run)
    else:
        resumed, run, path = load_for_resume(cfg.resume, to_plain_dict(cfg))
        check_resumable(resumed, dist.world_size)  # another number of processes mid-epoch: before any work
        _hold(run, "resume", dist, held)
        for stale in files.remove_stale_temporaries(run.checkpoints) if dist.is_main else []:  # never read, only space
            log.info("removed %s, which a write killed midway left", stale)
    run = ckpt.RunDir(Path(broadcast_object(str(run.root))))  # under torchrun, ranks may have timestamped dirs apart
    run.root.mkdir(parents=True, exist_ok=True)
    return resumed, path, run


def _hold(run: ckpt.RunDir, key: str, dist: DistContext, held: ExitStack,
          then: Callable[[ckpt.RunDir], None] | None = None) -> None:
    """Rank 0 holds ``run``'s folder until ``held`` closes, then checks it with ``then``; a refusal of either is
    raised on every rank (the others would wait for rank 0 otherwise)."""
    refusal = None
    if dist.is_main:
        try:
            held.enter_context(hold_run(run.root, key))
            if then is not None:
                then(run)
        except ConfigError as error:
            refusal = str(error)
    if (refusal := broadcast_object(refusal)) is not None:
        raise ConfigError(refusal)


def _refuse_a_started_run(run: ckpt.RunDir) -> None:
    if run.checkpoints.is_dir() and any(run.checkpoints.glob("*.pt")):
        raise ConfigError(f"output_dir: {run.root} already holds a run's checkpoints, which a new run would "
                          f"overwrite; continue it with resume={override_value(run.root)}, or train into another directory "
                          "(output_dir=... or hydra.run.dir=...)")


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
    handler.setFormatter(handlers[0].formatter if handlers else logging.Formatter(LOG_FORMAT))
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
                        "run the command again", f"continue the run with resume={override_value(run.root)}")) from None
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
    n_parameters = sum(p.numel() for p in model.parameters())
    log.info("model: %.2fM parameters", n_parameters / 1e6)

    tracker = Tracker(run.tensorboard, enabled=dist.is_main)
    validate = (make_validator(valid_src, valid_ref, src_tok, tgt_tok, training=cfg.training, eval_cfg=cfg.eval,
                               max_positions=cfg.model.max_positions, device=dist.device, tracker=tracker)
                if dist.is_main else _validated_on_rank_0)  # the split's batches are built where they are used
    trainer = build_trainer(cfg, model, src_tok, tgt_tok, train_set, dist, tracker, run.root, validate, recipe)
    if resumed is not None:
        take_up_history(resumed, resumed_path, CheckpointManager(run.checkpoints, cfg.training.keep_last), dist)
        trainer.load_state(resumed)
    result = trainer.fit()
    metrics: dict[str, Any] = {"parameters": n_parameters, "train": asdict(result)}
    if dist.is_main:
        metrics.update(_final_evaluation(cfg, run, model, src_tok, tgt_tok, dist.device, tracker,
                                         scored[cfg.data.valid_split], scored[cfg.data.test_split], result.steps))
        files.write_json(run.metrics, metrics)
        tracker.hparams(_hparams(cfg), {k: v for k, v in metrics.items() if isinstance(v, float)})
    tracker.close()
    return metrics


def _validated_on_rank_0(model: torch.nn.Module, step: int) -> dict[str, float]:
    raise RuntimeError("validation runs on rank 0 only; the other ranks receive its metrics")


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
    log.info("test (%s, %s): %s", cfg.data.test_split, final.source, scores)
    return {
        "valid_bleu": final.valid_bleu, "test_bleu": scores.bleu, "test_chrf": scores.chrf,
        "test_tokenized_bleu": scores.tokenized_bleu,
        "test": asdict(scores), "final_weights": final.source,
    }
