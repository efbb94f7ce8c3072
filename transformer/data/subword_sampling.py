"""BPE-dropout (Provilkov et al. 2020, ``training.bpe_dropout``): the training pairs segmented anew every epoch.

BPE builds a word by merging its pieces in a fixed order; BPE-dropout skips each merge with probability p,
so a word comes out in smaller pieces of the same vocabulary, differently each time. The model sees many
segmentations of every word while training and translates with the usual one; on small corpora this is
worth up to a few BLEU (the paper: 0.5 - 2.3 on IWSLT and WMT tasks, p = 0.1). SentencePiece does the
sampling; this module makes it reproducible and feeds it to the batching:

- **Reproducible.** An epoch's segmentation is a function of (seed, epoch) alone: SentencePiece's generator
  is reseeded before one single-threaded encoding pass. So a resumed run re-creates the epoch it stopped in,
  and every DDP rank segments alike and takes its own share of the same batches.
- **Within the token budget.** The batches of an epoch are packed from that epoch's lengths, so
  ``training.max_tokens`` holds. Sampled pieces are shorter, so an epoch has more tokens and batches (on
  Multi30k's German, 8k BPE, p = 0.1: about 40 % more), and the batch count changes a little from epoch to
  epoch; a cosine schedule is laid out over the first epoch's count.
- **Text from the cache.** The corpus cache holds ids only; the texts are recovered once by decoding them
  (SentencePiece decoding is lossless up to its normalisation, which encoding applies again anyway). Pairs
  holding ``<unk>`` (which does not decode back to its text), or whose sampled segmentation would exceed
  ``data.max_len``, keep their ordinary segmentation.

Every epoch encodes the whole training split again in one thread: a second or two for Multi30k, but meant
for corpora of that order (up to a few hundred thousand pairs), not for WMT-size ones.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np

from transformer.data.batching import TokenBucketSampler
from transformer.data.corpus import TranslationDataset
from transformer.data.tokenizer import SentencePieceTokenizer


class ResegmentedCorpus:
    """The training pairs of ``dataset`` with a fresh BPE-dropout segmentation per epoch.

    Args:
        dataset: the pairs in their ordinary segmentation (the corpus cache's ids).
        src_tok, tgt_tok: the SentencePiece BPE tokenizers the ids come from.
        p: the merge drop rate, in (0, 1).
        seed: with the epoch, decides each epoch's segmentation.
        max_len: the longest sequence a side may have (``data.max_len``).
    """

    def __init__(self, dataset: TranslationDataset, src_tok: SentencePieceTokenizer, tgt_tok: SentencePieceTokenizer,
                 p: float, seed: int, max_len: int) -> None:
        if not 0.0 < p < 1.0:
            raise ValueError(f"the BPE-dropout rate must be in (0, 1), got {p}")
        self.base = dataset
        self.p, self.seed, self.max_len = p, seed, max_len
        self._tokenizers = (src_tok, tgt_tok)
        self._texts = tuple(self._decoded(tok, tokens, offsets) for tok, tokens, offsets in (
            (src_tok, dataset.src_tokens, dataset.src_offsets), (tgt_tok, dataset.tgt_tokens, dataset.tgt_offsets)))
        self._has_unk = (_holds(dataset.src_tokens, dataset.src_offsets, src_tok.unk_id)
                         | _holds(dataset.tgt_tokens, dataset.tgt_offsets, tgt_tok.unk_id))  # (n_pairs,)

    @staticmethod
    def _decoded(tok: SentencePieceTokenizer, tokens: np.ndarray, offsets: np.ndarray) -> list[str]:
        ids = tokens.tolist()
        return [tok.decode(ids[start:end]) for start, end in zip(offsets[:-1].tolist(), offsets[1:].tolist())]

    def epoch(self, epoch: int) -> TranslationDataset:
        """Epoch ``epoch``'s pairs: the same pairs in the same order, segmented at random."""
        seeds = np.random.SeedSequence([self.seed, epoch]).generate_state(2).tolist()  # one per side
        sides = [tok.encode_sampled(texts, self.p, seed) for tok, texts, seed in zip(self._tokenizers, self._texts, seeds)]
        too_long = [np.fromiter(map(len, ids), np.int64, len(ids)) > self.max_len for ids in sides]
        for i in np.flatnonzero(self._has_unk | too_long[0] | too_long[1]).tolist():
            sides[0][i], sides[1][i] = self.base[i]
        vocab = max(tok.vocab_size for tok in self._tokenizers)
        return TranslationDataset.from_sequences(sides[0], sides[1], vocab)


def _holds(tokens: np.ndarray, offsets: np.ndarray, token_id: int) -> np.ndarray:
    """(n_pairs,) bool: whether each sequence of the flat ``tokens`` (split at ``offsets``) holds ``token_id``."""
    hits = np.concatenate([[0], np.cumsum(tokens == token_id)])  # hits[k]: occurrences among tokens[:k]
    return hits[offsets[1:]] > hits[offsets[:-1]]


class ResegmentingSampler:
    """Token-bucket batches over each epoch's re-segmented pairs, with the sampler protocol the trainer uses.

    ``dataset`` is the epoch's pairs (collate from it). ``make_sampler`` builds a ``TokenBucketSampler`` for
    a dataset; it is rebuilt when the epoch changes, so ``len`` is the batch count of the current epoch.
    """

    def __init__(self, corpus: ResegmentedCorpus,
                 make_sampler: Callable[[TranslationDataset], TokenBucketSampler]) -> None:
        self.corpus = corpus
        self._make_sampler = make_sampler
        self._epoch = 0
        self.dataset = corpus.epoch(0)
        self._sampler = make_sampler(self.dataset)

    def _select(self, epoch: int) -> None:
        if epoch != self._epoch:
            self.dataset = self.corpus.epoch(epoch)
            self._sampler = self._make_sampler(self.dataset)
            self._epoch = epoch

    def set_epoch(self, epoch: int) -> None:
        self._select(epoch)
        self._sampler.set_epoch(epoch)

    def __iter__(self) -> Iterator[list[int]]:
        return iter(self._sampler)

    def __len__(self) -> int:
        return len(self._sampler)

    def state_dict(self) -> dict:
        return self._sampler.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self._select(int(state["epoch"]))
        self._sampler.load_state_dict(state)
