"""Tiny training setups shared by the tests: a copy task, a tiny real Transformer and a Trainer built from
them (CPU, seconds), and the digit-reversal task a small model learns from scratch (the ``reversal_model``
fixture of conftest.py trains it once per session)."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from transformer.config import ModelConfig, PositionKind, Precision, Schedule, TrainingConfig
from transformer.data.batching import Batch, TokenBucketSampler, collate
from transformer.data.tokenizer import BOS_ID as BOS
from transformer.data.tokenizer import EOS_ID as EOS
from transformer.data.tokenizer import PAD_ID as PAD
from transformer.model.transformer import build_model
from transformer.tracking import Tracker
from transformer.training.checkpoints import CheckpointManager
from transformer.training.distributed import DistContext
from transformer.training.optim import build_optimizer
from transformer.training.trainer import Trainer

# the toy vocabulary's own symbols are VOCAB_START..VOCAB-1, after the special ids
VOCAB_START, VOCAB = 4, 12
SINGLE = DistContext(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"), is_main=True)


def copy_pairs(n: int, seed: int = 0) -> list[tuple[list[int], list[int]]]:
    """(src, tgt) pairs where the target is the source, lengths 2..6, ids VOCAB_START..VOCAB-1."""
    rng = random.Random(seed)
    pairs = []
    for _ in range(n):
        seq = [rng.randrange(VOCAB_START, VOCAB) for _ in range(rng.randint(2, 6))]
        pairs.append((seq, list(seq)))
    return pairs


def tiny_model(seed: int, dropout: float = 0.1) -> nn.Module:
    torch.manual_seed(seed)
    cfg = ModelConfig(d_model=16, n_heads=2, d_ff=32, n_encoder_layers=1, n_decoder_layers=1, dropout=dropout,
                      attention_dropout=0.0, max_positions=32, share_embeddings=False)
    return build_model(cfg, VOCAB, VOCAB, PAD)


def training_config(**overrides) -> TrainingConfig:
    base = dict(seed=7, max_epochs=3, max_tokens=48, accumulate=1, lr=3e-3, warmup_steps=4, schedule=Schedule.inverse_sqrt,
                label_smoothing=0.1, clip_grad_norm=1.0, precision=Precision.fp32, patience=None,
                log_every_steps=2, keep_last=2, average_last=0, progress_bar=False,
                cuda_graphs=False)  # the eager step on any device, unless a test asks for graphs
    base.update(overrides)
    return TrainingConfig(**base)


def teacher_forced_validate(pairs: list[tuple[list[int], list[int]]]) -> Callable[[nn.Module, int], dict]:
    """A validation callback: per-token NLL and token accuracy (as "bleu", x100) on ``pairs``; uses no RNG."""
    batch = toy_collate(pairs, list(range(len(pairs))))

    def validate(model: nn.Module, step: int) -> dict[str, float]:
        logits = model(batch.src, batch.tgt_in)  # (batch, tgt_len, vocab)
        keep = batch.tgt_out.ne(PAD)
        loss = F.cross_entropy(logits.flatten(0, 1), batch.tgt_out.flatten(), ignore_index=PAD).item()
        correct = (logits.argmax(-1).eq(batch.tgt_out) & keep).sum().item()
        return {"loss": loss, "bleu": 100.0 * correct / keep.sum().item()}

    return validate


def toy_collate(examples: list[tuple[list[int], list[int]]], indices: list[int]) -> Batch:
    return collate(examples, indices, pad_id=PAD, bos_id=BOS, eos_id=EOS)


def make_sampler(pairs: list[tuple[list[int], list[int]]], cfg: TrainingConfig, *, rank: int = 0,
                 world_size: int = 1) -> TokenBucketSampler:
    return TokenBucketSampler([len(s) for s, _ in pairs], [len(t) for _, t in pairs], cfg.max_tokens,
                              seed=cfg.seed, rank=rank, world_size=world_size)


def make_trainer(
    run_dir: Path,
    cfg: TrainingConfig,
    pairs: list[tuple[list[int], list[int]]],
    *,
    model_seed: int = 0,
    dropout: float = 0.1,
    validate: Callable[[nn.Module, int], dict] | None = None,
    dist: DistContext = SINGLE,
    collate_hook: Callable[[int], None] | None = None,
    sampler: object | None = None,
) -> Trainer:
    """A Trainer over ``pairs`` with a fresh tiny model; ``collate_hook(call_number)`` runs inside collate."""
    model = tiny_model(model_seed, dropout)
    sampler = sampler or make_sampler(pairs, cfg, rank=dist.rank, world_size=dist.world_size)
    calls = [0]

    def collate_fn(indices: list[int]) -> Batch:
        calls[0] += 1
        if collate_hook is not None:
            collate_hook(calls[0])
        return toy_collate([pairs[i] for i in indices], indices)

    return Trainer(
        model, build_optimizer(model, cfg), cfg, n_pairs=len(pairs), sampler=sampler, collate_fn=collate_fn,
        device=dist.device, dist=dist, tracker=Tracker(run_dir / "tb", enabled=False),
        checkpoints=CheckpointManager(run_dir / "checkpoints", cfg.keep_last),
        validate=validate or teacher_forced_validate(pairs[:16]), extra_state={"note": "toy", "vocab": VOCAB},
    )


def parameters(trainer: Trainer) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}


# --------------------------------------------------------------------------------------------------
# Digit reversal: the target is the source reversed; learned from scratch to ~100 % exact match
# --------------------------------------------------------------------------------------------------

FIRST_DIGIT = 4  # the ten digits are ids 4..13, after the tokenizer's special ids
REVERSAL_VOCAB = FIRST_DIGIT + 10


def reversal_batch(gen: torch.Generator, n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``n`` random digit strings of 3-8 digits: (src, tgt_in, tgt_out), the target being the source reversed.

    Returns:
        src (n, width), tgt_in (n, width + 1) = BOS + reversed digits, tgt_out (n, width + 1) = reversed
        digits + EOS; right-padded with PAD, width the longest string.
    """
    lengths = torch.randint(3, 9, (n,), generator=gen).tolist()
    width = max(lengths)
    src = torch.full((n, width), PAD)
    tgt_in = torch.full((n, width + 1), PAD)
    tgt_out = torch.full((n, width + 1), PAD)
    for i, length in enumerate(lengths):
        digits = torch.randint(FIRST_DIGIT, REVERSAL_VOCAB, (length,), generator=gen)
        src[i, :length] = digits
        tgt_in[i, 0], tgt_in[i, 1 : length + 1] = BOS, digits.flip(0)
        tgt_out[i, :length], tgt_out[i, length] = digits.flip(0), EOS
    return src, tgt_in, tgt_out


def train_reversal_model(steps: int = 600, positions: PositionKind = PositionKind.sinusoidal,
                         **model_options: object) -> nn.Module:
    """A 2+2-layer d_model-32 model trained from scratch on digit reversal (Adam, linear decay); eval mode.

    ``model_options`` are further ``ModelConfig`` fields (e.g. ``attention=AttentionConfig(...)``).
    """
    torch.manual_seed(0)
    cfg = ModelConfig(d_model=32, n_heads=4, d_ff=64, n_encoder_layers=2, n_decoder_layers=2, dropout=0.0,
                      attention_dropout=0.0, max_positions=64, share_embeddings=False, positions=positions,
                      **model_options)
    model = build_model(cfg, REVERSAL_VOCAB, REVERSAL_VOCAB, PAD)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1 - s / steps)
    gen = torch.Generator().manual_seed(1)
    for _ in range(steps):
        src, tgt_in, tgt_out = reversal_batch(gen, 64)
        loss = F.cross_entropy(model(src, tgt_in).transpose(1, 2), tgt_out, ignore_index=PAD)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
    return model.eval()
