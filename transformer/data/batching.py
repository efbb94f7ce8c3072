"""Token-budget batches: a length-bucketing sampler (deterministic, shardable, resumable) and collate.

Shapes: ``batch`` sentences per batch, ``src_len`` = longest source in the batch, ``tgt_len`` =
longest target + 1 (the BOS shift: ``tgt_in`` = BOS + target, ``tgt_out`` = target + EOS), each rounded
up to a multiple of ``pad_to_multiple`` (8 keeps GPU tensor cores busy and the number of distinct shapes
small; 1 adds no padding).

Cost of a batch (what ``max_tokens`` bounds), counting padded positions on both sides::

    cost = batch * round_up(max(src lengths)) + batch * round_up(max(tgt lengths) + 1)

which is exactly ``src.numel() + tgt_out.numel()`` of the collated ``Batch`` (unless filler rows pad it to a fixed
shape for CUDA graphs: ``collate_arrays(fill_to_tokens=...)``).

Everything here works on length and token arrays with numpy (no per-sentence Python in the step, memory
O(pairs) in compact arrays), so a corpus of millions of pairs is packed in seconds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Protocol, Sequence

import numpy as np
import torch
from torch import Tensor

from transformer.data.corpus import TranslationDataset


@dataclass
class Batch:
    """A padded batch of translation pairs."""

    src: Tensor  # (batch, src_len) long, padded with pad_id
    tgt_in: Tensor  # (batch, tgt_len) long: BOS + target, padded
    tgt_out: Tensor  # (batch, tgt_len) long: target + EOS, padded
    target_positions: Tensor  # (n_tgt_tokens,) long: flat indices of the real positions of tgt_out
    indices: list[int]  # dataset index of each row
    n_src_tokens: int  # real (non-pad) source tokens
    n_tgt_tokens: int  # real (non-pad) positions in tgt_out, EOS included

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Batch:
        """The same batch with its tensors on ``device``."""
        src, tgt_in, tgt_out, positions = (t.to(device, non_blocking=non_blocking)
                                           for t in (self.src, self.tgt_in, self.tgt_out, self.target_positions))
        return Batch(src, tgt_in, tgt_out, positions, self.indices, self.n_src_tokens, self.n_tgt_tokens)

    def pin_memory(self) -> Batch:
        """The same batch in page-locked host memory, so a ``non_blocking`` copy to the GPU is asynchronous."""
        src, tgt_in, tgt_out, positions = (t.pin_memory()
                                           for t in (self.src, self.tgt_in, self.tgt_out, self.target_positions))
        return Batch(src, tgt_in, tgt_out, positions, self.indices, self.n_src_tokens, self.n_tgt_tokens)


class PairArrays(Protocol):
    """Aligned id sequences in flat arrays, as :class:`transformer.data.corpus.TranslationDataset` holds them."""

    src_tokens: np.ndarray  # (n_tokens,)
    src_offsets: np.ndarray  # (n_pairs + 1,)
    tgt_tokens: np.ndarray
    tgt_offsets: np.ndarray


def round_up(length: np.ndarray | int, multiple: int) -> np.ndarray | int:
    """``length`` rounded up to a multiple of ``multiple`` (elementwise for arrays)."""
    return -(-length // multiple) * multiple


def batch_cost(n_sentences: int, max_src_len: int, max_tgt_len: int, pad_to_multiple: int = 1) -> int:
    """Padded positions of a batch (see module doc): ``n * round_up(max_src_len) + n * round_up(max_tgt_len + 1)``."""
    src_len = round_up(max(1, max_src_len), pad_to_multiple)
    return n_sentences * src_len + n_sentences * round_up(max_tgt_len + 1, pad_to_multiple)


def count_oversized(src_lengths: Sequence[int] | np.ndarray, tgt_lengths: Sequence[int] | np.ndarray, max_tokens: int,
                    pad_to_multiple: int = 1) -> int:
    """How many pairs cost more than ``max_tokens`` alone (:func:`batch_cost` of one): each gets a batch of its own."""
    src = np.maximum(np.asarray(src_lengths, dtype=np.int64), 1)
    tgt = np.asarray(tgt_lengths, dtype=np.int64) + 1
    return int((round_up(src, pad_to_multiple) + round_up(tgt, pad_to_multiple) > max_tokens).sum())


def _gather_padded(tokens: np.ndarray, starts: np.ndarray, lengths: np.ndarray, width: int, shift: int,
                   pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows ``tokens[starts[r]:starts[r] + lengths[r]]`` placed at columns ``shift…`` of a (rows, width) matrix.

    Returns:
        (rows, width) int64 filled with ``pad_id`` elsewhere, and the (rows, width) bool mask of the placed cells.
    """
    columns = np.arange(width)[None, :] - shift  # (1, width): position within the sequence
    placed = (columns >= 0) & (columns < lengths[:, None])  # (rows, width)
    out = np.full((len(starts), width), pad_id, dtype=np.int64)
    out[placed] = tokens[(starts[:, None] + columns)[placed]]
    return out, placed


def static_rows(max_tokens: int, src_len: int, tgt_len: int) -> int:
    """Rows of a fixed-shape batch with padded lengths ``src_len`` and ``tgt_len``: as many as ``max_tokens``
    positions hold (at least one). A packed batch never has more (its cost is within the budget, or it is
    one pair), so padding every batch to this many rows leaves one shape per pair of padded lengths."""
    return max(1, max_tokens // (src_len + tgt_len))


def collate_arrays(data: PairArrays, indices: Sequence[int], *, pad_id: int, bos_id: int, eos_id: int,
                   pad_to_multiple: int = 1, fill_to_tokens: int | None = None) -> Batch:
    """Pad the pairs ``indices`` of flat id arrays into a ``Batch``, vectorised (no loop over sentences).

    With ``fill_to_tokens``, filler rows follow the pairs up to ``static_rows(fill_to_tokens, src_len, tgt_len)``
    rows, so the batch's shape is a function of its padded lengths (for CUDA graphs). A filler row has one real
    source token (EOS; a row with none would leave attention nothing to attend to), BOS as decoder input and
    only padding as target: it adds nothing to the loss, ``target_positions`` or the token counts, and
    ``indices`` lists the real pairs only.

    Returns:
        src (rows, src_len) with src_len = round_up(max(1, longest source)); tgt_in/tgt_out (rows, tgt_len)
        with tgt_len = round_up(longest target + 1).
    """
    if len(indices) == 0:
        raise ValueError("collate got an empty batch")
    rows = np.asarray(indices, dtype=np.int64)
    src_start, tgt_start = data.src_offsets[rows], data.tgt_offsets[rows]  # (batch,)
    src_lens, tgt_lens = data.src_offsets[rows + 1] - src_start, data.tgt_offsets[rows + 1] - tgt_start
    src_len = round_up(max(1, int(src_lens.max())), pad_to_multiple)  # one column even if all are empty
    tgt_len = round_up(int(tgt_lens.max()) + 1, pad_to_multiple)
    src, _ = _gather_padded(data.src_tokens, src_start, src_lens, src_len, 0, pad_id)  # (batch, src_len)
    tgt_in, _ = _gather_padded(data.tgt_tokens, tgt_start, tgt_lens, tgt_len, 1, pad_id)  # (batch, tgt_len)
    tgt_out, _ = _gather_padded(data.tgt_tokens, tgt_start, tgt_lens, tgt_len, 0, pad_id)  # (batch, tgt_len)
    tgt_in[:, 0] = bos_id
    tgt_out[np.arange(len(rows)), tgt_lens] = eos_id
    positions = np.flatnonzero(np.arange(tgt_len)[None, :] <= tgt_lens[:, None])  # real cells of tgt_out
    if fill_to_tokens is not None:
        fillers = static_rows(fill_to_tokens, src_len, tgt_len) - len(rows)
        if fillers < 0:
            raise ValueError(f"{len(rows)} pairs padded to lengths ({src_len}, {tgt_len}) exceed the "
                             f"{fill_to_tokens}-position budget they are filled to")
        filler_src = np.full((fillers, src_len), pad_id, dtype=np.int64)
        filler_src[:, 0] = eos_id
        filler_tgt_in = np.full((fillers, tgt_len), pad_id, dtype=np.int64)
        filler_tgt_in[:, 0] = bos_id
        src, tgt_in = np.concatenate([src, filler_src]), np.concatenate([tgt_in, filler_tgt_in])
        tgt_out = np.concatenate([tgt_out, np.full((fillers, tgt_len), pad_id, dtype=np.int64)])
    return Batch(torch.from_numpy(src), torch.from_numpy(tgt_in), torch.from_numpy(tgt_out),
                 torch.from_numpy(positions), rows.tolist(), int(src_lens.sum()), int(tgt_lens.sum()) + len(rows))


def collate(
    examples: Sequence[tuple[Sequence[int], Sequence[int]]],
    indices: Sequence[int],
    *,
    pad_id: int,
    bos_id: int,
    eos_id: int,
    pad_to_multiple: int = 1,
) -> Batch:
    """Pad ``(src_ids, tgt_ids)`` pairs (no BOS/EOS in them) into a ``Batch`` (see :func:`collate_arrays`);
    ``indices`` are the pairs' dataset indices, kept in ``Batch.indices``."""
    if len(examples) != len(indices):
        raise ValueError(f"collate got {len(examples)} examples but {len(indices)} indices")
    if not examples:
        raise ValueError("collate got an empty batch")
    pairs = TranslationDataset.from_sequences([src for src, _ in examples], [tgt for _, tgt in examples])
    batch = collate_arrays(pairs, range(len(examples)), pad_id=pad_id, bos_id=bos_id, eos_id=eos_id,
                           pad_to_multiple=pad_to_multiple)
    batch.indices = list(indices)
    return batch


class TokenBucketSampler:
    """Batches of similar-length pairs within a padded-token budget, for one DDP rank.

    Per epoch (deterministic from ``seed`` and the epoch): shuffle, stable-sort by (source length,
    target length) so equal lengths are in random order, pack greedily while ``batch_cost`` stays
    within ``max_tokens``, make the batch count a multiple of ``world_size`` by halving the
    largest batches, shuffle the batch order, and give rank ``r`` batches ``r, r + world_size, ...``.
    So every pair is in exactly one batch of one rank, and every rank gets ``len(self)`` batches.

    A pair whose own cost exceeds ``max_tokens`` gets a batch of its own (it is never dropped).
    The batch sizes depend only on the multiset of lengths, so ``len(self)`` is the same each epoch.
    An epoch is held as two arrays (the sorted pair order and the batch boundaries), not as lists.

    Resume: ``state_dict()`` gives ``{"epoch", "position", "batches"}`` where ``position`` counts the batches
    this rank has already been handed in that epoch, of ``batches`` (``len(self)``: ``position == batches`` is an
    epoch's end, whatever the number of processes, and loads as this sampler's own end). After ``load_state_dict``,
    the next iteration
    yields exactly the remaining batches of that epoch; later iterations start at the beginning.
    If a consumer prefetches from this sampler, it saves the count of batches actually trained on.
    """

    def __init__(
        self,
        src_lengths: Sequence[int] | np.ndarray,
        tgt_lengths: Sequence[int] | np.ndarray,
        max_tokens: int,
        *,
        seed: int,
        shuffle: bool = True,
        rank: int = 0,
        world_size: int = 1,
        pad_to_multiple: int = 1,
    ) -> None:
        if len(src_lengths) != len(tgt_lengths):
            raise ValueError(f"{len(src_lengths)} source lengths but {len(tgt_lengths)} target lengths")
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        if pad_to_multiple < 1:
            raise ValueError(f"pad_to_multiple must be >= 1, got {pad_to_multiple}")
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"need 0 <= rank < world_size, got rank={rank}, world_size={world_size}")
        if len(src_lengths) < world_size:
            raise ValueError(f"{len(src_lengths)} pairs cannot fill a batch on each of {world_size} ranks")
        self._src = np.asarray(src_lengths, dtype=np.int32)
        self._tgt = np.asarray(tgt_lengths, dtype=np.int32)
        self.max_tokens = max_tokens
        self.pad_to_multiple = pad_to_multiple
        self.seed = seed
        self.shuffle = shuffle
        self.rank = rank
        self.world_size = world_size
        self.epoch = 0
        self._position = 0  # batches handed out in self.epoch
        self._resume_from: int | None = None
        self._cached: tuple[int, np.ndarray, np.ndarray] | None = None  # (epoch, order, this rank's bounds)
        self._n_batches = len(self._epoch_batches(0)[1])

    def __len__(self) -> int:
        return self._n_batches

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch (its shuffle); a different epoch discards a pending resume position."""
        if epoch != self.epoch:
            self.epoch, self._position, self._resume_from = epoch, 0, None

    def batches(self) -> list[list[int]]:
        """All of this rank's batches of the current epoch (does not change the resume state)."""
        order, bounds = self._epoch_batches(self.epoch)
        return [order[start:end].tolist() for start, end in bounds]

    def __iter__(self) -> Iterator[list[int]]:
        order, bounds = self._epoch_batches(self.epoch)
        if len(bounds) != self._n_batches:  # cannot happen: sizes depend on the lengths only
            raise RuntimeError(f"epoch {self.epoch} has {len(bounds)} batches, expected {self._n_batches}")
        start = self._resume_from if self._resume_from is not None else 0
        self._resume_from = None
        self._position = start
        for position in range(start, len(bounds)):
            self._position = position + 1  # handed out = consumed, for state_dict
            begin, end = bounds[position]
            yield order[begin:end].tolist()

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self._position, "batches": self._n_batches}

    def load_state_dict(self, state: dict) -> None:
        position = int(state["position"])
        if position > 0 and position == state.get("batches"):  # an epoch's end, written with another batch count
            position = self._n_batches  # (another number of processes, another epoch's re-segmented pairs)
        if not 0 <= position <= self._n_batches:
            raise ValueError(f"sampler state position {position} is outside 0..{self._n_batches}")
        self.epoch, self._position, self._resume_from = int(state["epoch"]), position, position

    # ----------------------------------------------------------------------------------------------

    def _epoch_batches(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """This rank's batches of ``epoch``: the pair order and (n_batches, 2) [start, end) rows into it."""
        if self._cached is None or self._cached[0] != epoch:
            order, bounds = self._global_batches(epoch)
            self._cached = (epoch, order, bounds[self.rank :: self.world_size])
        return self._cached[1], self._cached[2]

    def _global_batches(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """Every rank's batches of ``epoch`` in their shuffled order, before sharding."""
        rng = np.random.default_rng([self.seed, epoch])
        order = rng.permutation(len(self._src)) if self.shuffle else np.arange(len(self._src))
        key = self._src[order].astype(np.int64) * (int(self._tgt.max(initial=0)) + 1) + self._tgt[order]
        order = order[np.argsort(key, kind="stable")]  # by (src, tgt) length; ties stay shuffled
        ends = _split_to_multiple(self._pack(order), self.world_size)
        bounds = np.stack([np.concatenate([[0], ends[:-1]]), ends], axis=1)  # (n_batches, 2)
        if self.shuffle:
            bounds = bounds[rng.permutation(len(bounds))]
        return order, bounds

    def _pack(self, order: np.ndarray) -> np.ndarray:
        """Greedy packing of length-sorted pairs under ``max_tokens``: the end of each batch in ``order``.

        A batch grows while its cost stays within the budget. The cost of the first k pairs from ``start`` is
        non-decreasing in k, so the batch length is the number of prefixes within budget (at least one), found
        with numpy on a window that no batch can outgrow.
        """
        src, tgt = self._src[order].astype(np.int64), self._tgt[order].astype(np.int64)
        multiple, budget = self.pad_to_multiple, self.max_tokens
        ends, start, n = [], 0, len(order)
        while start < n:
            cheapest = round_up(max(1, int(src[start])), multiple) + 1  # sources are sorted, targets cost >= 1
            stop = min(n, start + budget // cheapest + 1)
            k = np.arange(1, stop - start + 1)
            src_len = round_up(np.maximum(1, np.maximum.accumulate(src[start:stop])), multiple)
            tgt_len = round_up(np.maximum.accumulate(tgt[start:stop]) + 1, multiple)
            size = max(1, int(np.searchsorted(k * src_len + k * tgt_len, budget, side="right")))
            start += size
            ends.append(start)
        return np.asarray(ends, dtype=np.int64)


def _split_to_multiple(ends: np.ndarray, world_size: int) -> np.ndarray:
    """Halve the largest batches (first one on ties) until the count divides ``world_size``.

    Batches are given by their ``ends`` in the pair order. Halving never raises a batch's cost, so the token
    budget still holds.
    """
    ends = ends.copy()
    while len(ends) % world_size:
        sizes = np.diff(ends, prepend=0)
        largest = int(np.argmax(sizes))
        if sizes[largest] < 2:
            raise ValueError(f"cannot split {len(ends)} single-pair batches evenly over {world_size} ranks")
        ends = np.insert(ends, largest, ends[largest] - sizes[largest] + sizes[largest] // 2)
    return ends


def padding_efficiency(sampler: TokenBucketSampler, src_lengths: Sequence[int], tgt_lengths: Sequence[int]) -> float:
    """Real positions / padded positions over this rank's batches of the sampler's current epoch.

    Real = source tokens + target tokens + 1 (EOS) per pair; padded = ``batch_cost`` per batch.
    """
    src, tgt = np.asarray(src_lengths), np.asarray(tgt_lengths)
    real = padded = 0
    for batch in sampler.batches():
        real += int(src[batch].sum() + tgt[batch].sum()) + len(batch)
        padded += batch_cost(len(batch), int(src[batch].max()), int(tgt[batch].max()), sampler.pad_to_multiple)
    return real / padded if padded else 1.0
