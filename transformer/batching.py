"""Token-budget batches: a length-bucketing sampler (deterministic, shardable, resumable) and collate.

Shapes: ``batch`` sentences per batch, ``src_len`` = longest source in the batch, ``tgt_len`` =
longest target + 1 (the BOS shift: ``tgt_in`` = BOS + target, ``tgt_out`` = target + EOS).

Cost of a batch (what ``max_tokens`` bounds), counting padded positions on both sides::

    cost = batch * max(src lengths) + batch * (max(tgt lengths) + 1)

which is exactly ``src.numel() + tgt_out.numel()`` of the collated ``Batch``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Sequence

import numpy as np
import torch
from torch import Tensor


@dataclass
class Batch:
    """A padded batch of translation pairs."""

    src: Tensor  # (batch, src_len) long, padded with pad_id
    tgt_in: Tensor  # (batch, tgt_len) long: BOS + target, padded
    tgt_out: Tensor  # (batch, tgt_len) long: target + EOS, padded
    indices: list[int]  # dataset index of each row
    n_src_tokens: int  # real (non-pad) source tokens
    n_tgt_tokens: int  # real (non-pad) positions in tgt_out, EOS included

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Batch:
        """The same batch with its tensors on ``device``."""
        return Batch(
            src=self.src.to(device, non_blocking=non_blocking),
            tgt_in=self.tgt_in.to(device, non_blocking=non_blocking),
            tgt_out=self.tgt_out.to(device, non_blocking=non_blocking),
            indices=self.indices,
            n_src_tokens=self.n_src_tokens,
            n_tgt_tokens=self.n_tgt_tokens,
        )


def collate(
    examples: Sequence[tuple[Sequence[int], Sequence[int]]],
    indices: Sequence[int],
    *,
    pad_id: int,
    bos_id: int,
    eos_id: int,
) -> Batch:
    """Pad ``(src_ids, tgt_ids)`` pairs (no BOS/EOS in them) into a ``Batch``.

    Returns:
        src (batch, src_len) with src_len = max(1, longest source); tgt_in/tgt_out (batch, tgt_len)
        with tgt_len = longest target + 1.
    """
    if len(examples) != len(indices):
        raise ValueError(f"collate got {len(examples)} examples but {len(indices)} indices")
    if not examples:
        raise ValueError("collate got an empty batch")
    batch = len(examples)
    src_len = max(1, max(len(src) for src, _ in examples))  # keep one column even if all are empty
    tgt_len = max(len(tgt) for _, tgt in examples) + 1
    src = torch.full((batch, src_len), pad_id, dtype=torch.long)  # (batch, src_len)
    tgt_in = torch.full((batch, tgt_len), pad_id, dtype=torch.long)  # (batch, tgt_len)
    tgt_out = torch.full((batch, tgt_len), pad_id, dtype=torch.long)  # (batch, tgt_len)
    n_src = n_tgt = 0
    for row, (src_ids, tgt_ids) in enumerate(examples):
        n, m = len(src_ids), len(tgt_ids)
        src[row, :n] = torch.as_tensor(list(src_ids), dtype=torch.long)
        tgt_in[row, 0] = bos_id
        tgt_in[row, 1 : m + 1] = torch.as_tensor(list(tgt_ids), dtype=torch.long)
        tgt_out[row, :m] = torch.as_tensor(list(tgt_ids), dtype=torch.long)
        tgt_out[row, m] = eos_id
        n_src, n_tgt = n_src + n, n_tgt + m + 1
    return Batch(src, tgt_in, tgt_out, list(indices), n_src, n_tgt)


def batch_cost(n_sentences: int, max_src_len: int, max_tgt_len: int) -> int:
    """Padded positions of a batch: ``n * max_src_len + n * (max_tgt_len + 1)`` (see module doc)."""
    return n_sentences * max_src_len + n_sentences * (max_tgt_len + 1)


class TokenBucketSampler:
    """Batches of similar-length pairs within a padded-token budget, for one DDP rank.

    Per epoch (deterministic from ``seed`` and the epoch): shuffle, stable-sort by (source length,
    target length) so equal lengths are in random order, pack greedily while ``batch_cost`` stays
    within ``max_tokens``, make the batch count a multiple of ``world_size`` by halving the
    largest batches, shuffle the batch order, and give rank ``r`` batches ``r, r + world_size, ...``.
    So every pair is in exactly one batch of one rank, and every rank gets ``len(self)`` batches.

    A pair whose own cost exceeds ``max_tokens`` gets a batch of its own (it is never dropped).
    The batch sizes depend only on the multiset of lengths, so ``len(self)`` is the same each epoch.

    Resume: ``state_dict()`` gives ``{"epoch", "position"}`` where ``position`` counts the batches
    this rank has already been handed in that epoch. After ``load_state_dict``, the next iteration
    yields exactly the remaining batches of that epoch; later iterations start at the beginning.
    If a DataLoader prefetches from this sampler, save the count of batches actually trained on.
    """

    def __init__(
        self,
        src_lengths: Sequence[int],
        tgt_lengths: Sequence[int],
        max_tokens: int,
        *,
        seed: int,
        shuffle: bool = True,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        if len(src_lengths) != len(tgt_lengths):
            raise ValueError(f"{len(src_lengths)} source lengths but {len(tgt_lengths)} target lengths")
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"need 0 <= rank < world_size, got rank={rank}, world_size={world_size}")
        if len(src_lengths) < world_size:
            raise ValueError(f"{len(src_lengths)} pairs cannot fill a batch on each of {world_size} ranks")
        self._src = np.asarray(src_lengths, dtype=np.int64)
        self._tgt = np.asarray(tgt_lengths, dtype=np.int64)
        self.max_tokens = max_tokens
        self.seed = seed
        self.shuffle = shuffle
        self.rank = rank
        self.world_size = world_size
        self.epoch = 0
        self._position = 0  # batches handed out in self.epoch
        self._resume_from: int | None = None
        self._n_batches = len(self._global_batches(0)) // world_size

    def __len__(self) -> int:
        return self._n_batches

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch (its shuffle); a different epoch discards a pending resume position."""
        if epoch != self.epoch:
            self.epoch, self._position, self._resume_from = epoch, 0, None

    def batches(self) -> list[list[int]]:
        """All of this rank's batches of the current epoch (does not change the resume state)."""
        return self._global_batches(self.epoch)[self.rank :: self.world_size]

    def __iter__(self) -> Iterator[list[int]]:
        batches = self.batches()
        if len(batches) != self._n_batches:  # cannot happen: sizes depend on the lengths only
            raise RuntimeError(f"epoch {self.epoch} has {len(batches)} batches, expected {self._n_batches}")
        start = self._resume_from if self._resume_from is not None else 0
        self._resume_from = None
        self._position = start
        for position in range(start, len(batches)):
            self._position = position + 1  # handed out = consumed, for state_dict
            yield batches[position]

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self._position}

    def load_state_dict(self, state: dict) -> None:
        position = int(state["position"])
        if not 0 <= position <= self._n_batches:
            raise ValueError(f"sampler state position {position} is outside 0..{self._n_batches}")
        self.epoch, self._position, self._resume_from = int(state["epoch"]), position, position

    # ----------------------------------------------------------------------------------------------

    def _global_batches(self, epoch: int) -> list[list[int]]:
        """Every rank's batches of ``epoch``, before sharding."""
        rng = np.random.default_rng([self.seed, epoch])
        order = rng.permutation(len(self._src)) if self.shuffle else np.arange(len(self._src))
        key = self._src[order] * (int(self._tgt.max(initial=0)) + 1) + self._tgt[order]
        order = order[np.argsort(key, kind="stable")]  # by (src, tgt) length; ties stay shuffled
        batches = self._pack(order.tolist())
        batches = _split_to_multiple(batches, self.world_size)
        if self.shuffle:
            batches = [batches[i] for i in rng.permutation(len(batches))]
        return batches

    def _pack(self, order: list[int]) -> list[list[int]]:
        """Greedy packing of length-sorted indices under ``max_tokens``."""
        src, tgt = self._src.tolist(), self._tgt.tolist()
        batches: list[list[int]] = []
        current: list[int] = []
        max_src = max_tgt = 0
        for index in order:
            new_src, new_tgt = max(max_src, src[index]), max(max_tgt, tgt[index])
            if current and batch_cost(len(current) + 1, new_src, new_tgt) > self.max_tokens:
                batches.append(current)
                current, new_src, new_tgt = [], src[index], tgt[index]
            current.append(index)
            max_src, max_tgt = new_src, new_tgt
        if current:
            batches.append(current)
        return batches


def _split_to_multiple(batches: list[list[int]], world_size: int) -> list[list[int]]:
    """Halve the largest batches (first one on ties) until the count divides ``world_size``.

    Halving never raises a batch's cost, so the token budget still holds.
    """
    batches = list(batches)
    while len(batches) % world_size:
        largest = max(range(len(batches)), key=lambda i: (len(batches[i]), -i))
        if len(batches[largest]) < 2:
            raise ValueError(f"cannot split {len(batches)} single-pair batches evenly over {world_size} ranks")
        half = len(batches[largest]) // 2
        batches[largest : largest + 1] = [batches[largest][:half], batches[largest][half:]]
    return batches


def padding_efficiency(sampler: TokenBucketSampler, src_lengths: Sequence[int], tgt_lengths: Sequence[int]) -> float:
    """Real positions / padded positions over this rank's batches of the sampler's current epoch.

    Real = source tokens + target tokens + 1 (EOS) per pair; padded = ``batch_cost`` per batch.
    """
    real = padded = 0
    for batch in sampler.batches():
        src = [src_lengths[i] for i in batch]
        tgt = [tgt_lengths[i] for i in batch]
        real += sum(src) + sum(tgt) + len(batch)
        padded += batch_cost(len(batch), max(src), max(tgt))
    return real / padded if padded else 1.0
