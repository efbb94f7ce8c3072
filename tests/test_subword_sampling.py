"""BPE-dropout: sampled segmentations are reproducible per (seed, epoch), decode to the same text, keep to
``max_len``, and a run that uses them resumes exactly."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from transformer.app import pipeline
from transformer.checkpoint import RunDir, load_checkpoint
from transformer.config import ConfigError, SentencePieceModel, TokenizerConfig
from transformer.data.batching import TokenBucketSampler
from transformer.data.corpus import TranslationDataset
from transformer.data.subword_sampling import ResegmentedCorpus, ResegmentingSampler
from transformer.data.tokenizer import SentencePieceTokenizer, train_sentencepiece

SYLLABLES = ["ka", "lo", "mi", "ne", "ru", "ta", "so", "be"]


def sentences(n: int, seed: int) -> list[str]:
    """Words of 2-4 syllables, so that BPE learns merges inside words."""
    rng = random.Random(seed)
    words = ["".join(rng.choice(SYLLABLES) for _ in range(rng.randint(2, 4))) for _ in range(40)]
    return [" ".join(rng.choice(words) for _ in range(rng.randint(3, 8))) for _ in range(n)]


@pytest.fixture(scope="module")
def bpe() -> SentencePieceTokenizer:
    cfg = TokenizerConfig(vocab_size=80, model_type=SentencePieceModel.bpe)
    return SentencePieceTokenizer(train_sentencepiece(sentences(300, seed=0), cfg))


@pytest.fixture(scope="module")
def corpus(bpe) -> ResegmentedCorpus:
    src, tgt = sentences(200, seed=1), sentences(200, seed=2)
    dataset = TranslationDataset.from_texts(src, tgt, bpe, bpe)
    return ResegmentedCorpus(dataset, bpe, bpe, p=0.2, seed=5, max_len=64)


def _pairs(dataset: TranslationDataset) -> list[tuple[list[int], list[int]]]:
    return [dataset[i] for i in range(len(dataset))]


def test_sampled_segmentations_decode_to_the_text_and_depend_only_on_the_seed(bpe):
    texts = sentences(50, seed=3)
    first = bpe.encode_sampled(texts, alpha=0.2, seed=11)
    assert bpe.encode_sampled(texts, alpha=0.2, seed=11) == first
    assert bpe.encode_sampled(texts, alpha=0.2, seed=12) != first
    plain = bpe.encode_batch(texts)
    assert first != plain
    assert [bpe.decode(ids) for ids in first] == texts == [bpe.decode(ids) for ids in plain]
    assert sum(map(len, first)) > sum(map(len, plain))  # dropped merges leave more, smaller pieces


def test_each_epoch_is_a_reproducible_resegmentation_of_the_same_pairs(bpe, corpus):
    epoch1 = _pairs(corpus.epoch(1))
    assert _pairs(corpus.epoch(1)) == epoch1
    assert _pairs(corpus.epoch(2)) != epoch1
    base = _pairs(corpus.base)
    assert epoch1 != base
    for (src, tgt), (base_src, base_tgt) in zip(epoch1, base):
        assert bpe.decode(src) == bpe.decode(base_src) and bpe.decode(tgt) == bpe.decode(base_tgt)


def test_pairs_over_max_len_or_with_unk_keep_their_segmentation(bpe):
    src, tgt = sentences(100, seed=4), sentences(100, seed=6)
    src_ids, tgt_ids = bpe.encode_batch(src), bpe.encode_batch(tgt)
    src_ids[0] = src_ids[0][:2] + [bpe.unk_id] + src_ids[0][2:]  # an unknown piece: decodes to " ⁇ "
    dataset = TranslationDataset.from_sequences(src_ids, tgt_ids, bpe.vocab_size)
    limit = int(max(dataset.src_lengths.max(), dataset.tgt_lengths.max()))
    corpus = ResegmentedCorpus(dataset, bpe, bpe, p=0.5, seed=0, max_len=limit)
    resampled = corpus.epoch(0)
    assert resampled.src_lengths.max() <= limit and resampled.tgt_lengths.max() <= limit
    assert resampled[0] == dataset[0]
    unsampled = [i for i in range(len(dataset)) if resampled[i] == dataset[i]]
    unbounded = ResegmentedCorpus(dataset, bpe, bpe, p=0.5, seed=0, max_len=10_000).epoch(0)
    over = [i for i in range(1, len(dataset)) if max(map(len, unbounded[i])) > limit]
    assert over and set(over) <= set(unsampled)  # what would have been too long kept its segmentation


def test_the_sampler_resumes_inside_an_epoch_with_that_epochs_segmentation(corpus):
    def make(pairs: TranslationDataset) -> TokenBucketSampler:
        return TokenBucketSampler(pairs.src_lengths, pairs.tgt_lengths, max_tokens=120, seed=3)

    sampler = ResegmentingSampler(corpus, make)
    sampler.set_epoch(1)
    batches = iter(sampler)
    head = [next(batches) for _ in range(3)]
    state = sampler.state_dict()
    rest = list(batches)
    collated = [[sampler.dataset[i] for i in batch] for batch in rest]

    fresh = ResegmentedCorpus(corpus.base, *corpus._tokenizers, p=corpus.p, seed=corpus.seed, max_len=corpus.max_len)
    resumed = ResegmentingSampler(fresh, make)  # a new process: starts at epoch 0
    resumed.load_state_dict(state)
    assert list(resumed) == rest and head
    assert [[resumed.dataset[i] for i in batch] for batch in rest] == collated
    assert len(resumed) == len(sampler) == len(head) + len(rest)


def test_bpe_dropout_needs_sentencepiece_bpe(compose_config):
    cfg = compose_config("train", ["data=toy_copy", "data.dir=/nowhere", "output_dir=/nowhere", "training.bpe_dropout=0.1"])
    with pytest.raises(ConfigError, match=r"training\.bpe_dropout: needs SentencePiece BPE tokenizers.*this run has word"):
        OmegaConf.to_object(cfg)


def _write_corpus(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", 120), ("val", 10), ("test", 10)):
        text = "".join(s + "\n" for s in sentences(n, seed=len(split)))
        (folder / f"{split}.src").write_text(text, encoding="utf-8")
        (folder / f"{split}.tgt").write_text(text, encoding="utf-8")
    return folder


def test_a_run_with_bpe_dropout_resumes_exactly(compose_config, tmp_path):
    corpus = _write_corpus(tmp_path / "corpus")
    common = ["data=toy_copy", "data.tokenizer.kind=sentencepiece", "data.tokenizer.vocab_size=80",
              f"data.dir={corpus}", f"data.cache_dir={tmp_path / 'cache'}", "model=tiny", "model.dropout=0.0",
              "eval=greedy", "training.bpe_dropout=0.2", "training.max_tokens=256", "training.accumulate=2",
              "training.schedule=inverse_sqrt",
              "training.warmup_steps=5", "training.progress_bar=false", "training.average_last=0",
              "training.validate_every_steps=1000", "training.valid_max_sentences=2",  # validate once, at the end
              "device=cpu"]  # a GPU pads to multiples of 8: fewer, longer epochs than the split below assumes

    def train(run: Path, steps: int, *extra: str) -> dict:
        cfg = compose_config("train", [*common, f"output_dir={run}", f"training.max_steps={steps}", *extra])
        return pipeline.train(OmegaConf.to_object(cfg))

    whole = train(tmp_path / "whole", 24)
    first = train(tmp_path / "split", 15)
    assert 0 < first["train"]["epochs"] < whole["train"]["epochs"]  # stopped inside a later epoch than the first
    train(tmp_path / "split", 24, f"resume={tmp_path / 'split'}")
    straight = load_checkpoint(RunDir(tmp_path / "whole").last)["model"]
    resumed = load_checkpoint(RunDir(tmp_path / "split").last)["model"]
    for name, value in straight.items():
        assert torch.equal(resumed[name], value), name
    assert np.isfinite(whole["test_bleu"])
