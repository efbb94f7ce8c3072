"""Collate and the token-bucket sampler: coverage, determinism, sharding, resume, padding efficiency."""

from __future__ import annotations

import random

import pytest
import torch
from conftest import multi30k_dir

from transformer.data.batching import (
    Batch,
    TokenBucketSampler,
    batch_cost,
    collate,
    collate_arrays,
    count_oversized,
    padding_efficiency,
)
from transformer.data.corpus import TranslationDataset
from transformer.data.tokenizer import BOS_ID, EOS_ID, PAD_ID

MULTI30K = multi30k_dir()


def _lengths(n: int, seed: int = 0) -> tuple[list[int], list[int]]:
    rng = random.Random(seed)
    src = [rng.randint(1, 40) for _ in range(n)]
    return src, [max(1, s + rng.randint(-5, 8)) for s in src]


def _epoch(sampler: TokenBucketSampler, epoch: int) -> list[list[int]]:
    sampler.set_epoch(epoch)
    return list(sampler)


def test_collate_pads_and_shifts():
    batch = collate([([5, 6, 7], [8, 9]), ([10], [11, 12, 13])], [4, 9], pad_id=PAD_ID, bos_id=BOS_ID, eos_id=EOS_ID)
    assert torch.equal(batch.src, torch.tensor([[5, 6, 7], [10, 0, 0]]))
    assert torch.equal(batch.tgt_in, torch.tensor([[2, 8, 9, 0], [2, 11, 12, 13]]))
    assert torch.equal(batch.tgt_out, torch.tensor([[8, 9, 3, 0], [11, 12, 13, 3]]))
    assert batch.src.dtype == torch.long and batch.indices == [4, 9]
    assert (batch.n_src_tokens, batch.n_tgt_tokens) == (4, 7)
    moved = batch.to("cpu")
    assert isinstance(moved, Batch) and torch.equal(moved.tgt_in, batch.tgt_in) and moved.n_tgt_tokens == 7
    # the cost formula is what the collated tensors hold
    assert batch_cost(2, 3, 3) == batch.src.numel() + batch.tgt_out.numel() == 14


def test_collate_keeps_a_column_for_empty_sources():
    batch = collate([([], [7])], [0], pad_id=PAD_ID, bos_id=BOS_ID, eos_id=EOS_ID)
    assert torch.equal(batch.src, torch.tensor([[0]])) and batch.n_src_tokens == 0


def test_every_pair_once_per_epoch_within_budget():
    src, tgt = _lengths(500)
    sampler = TokenBucketSampler(src, tgt, 300, seed=1)
    for epoch in range(3):
        batches = _epoch(sampler, epoch)
        assert len(batches) == len(sampler)
        assert sorted(i for b in batches for i in b) == list(range(500))
        for b in batches:
            assert batch_cost(len(b), max(src[i] for i in b), max(tgt[i] for i in b)) <= 300


def test_oversized_pair_gets_its_own_batch():
    src, tgt = [3, 50, 3, 3], [3, 60, 3, 3]
    batches = list(TokenBucketSampler(src, tgt, 40, seed=0))
    assert [1] in batches and sorted(i for b in batches for i in b) == [0, 1, 2, 3]
    assert sorted(map(len, batches)) == [1, 3]  # 3 * 3 + 3 * 4 = 21 <= 40


def test_batches_hold_similar_lengths():
    src = [1, 20, 2, 19, 1, 20, 2, 19]
    sampler = TokenBucketSampler(src, src, 2 * 2 + 2 * 3, seed=3)  # room for two short pairs only
    assert sorted(sorted(b) for b in sampler) == [[0, 4], [1], [2, 6], [3], [5], [7]]


def test_same_seed_same_order_other_seed_or_epoch_differs():
    src, tgt = _lengths(400)
    a = _epoch(TokenBucketSampler(src, tgt, 256, seed=7), 0)
    assert _epoch(TokenBucketSampler(src, tgt, 256, seed=7), 0) == a
    assert _epoch(TokenBucketSampler(src, tgt, 256, seed=8), 0) != a
    assert _epoch(TokenBucketSampler(src, tgt, 256, seed=7), 1) != a
    unshuffled = list(TokenBucketSampler(src, tgt, 256, seed=7, shuffle=False))
    flat = [i for b in unshuffled for i in b]
    assert flat == sorted(range(400), key=lambda i: (src[i], tgt[i], i))  # sorted, ties by index


@pytest.mark.parametrize("n, world_size", [(400, 2), (401, 3), (57, 4), (5, 5)])
def test_ranks_are_disjoint_cover_everything_and_have_equal_counts(n, world_size):
    src, tgt = _lengths(n, seed=n)
    samplers = [TokenBucketSampler(src, tgt, 200, seed=5, rank=r, world_size=world_size) for r in range(world_size)]
    for epoch in (0, 1):
        shards = [_epoch(s, epoch) for s in samplers]
        assert len({len(s) for s in samplers}) == 1
        assert all(len(shard) == len(samplers[0]) for shard in shards)
        seen = [i for shard in shards for b in shard for i in b]
        assert sorted(seen) == list(range(n))  # disjoint (no duplicates) and complete


def test_too_few_pairs_for_the_ranks_is_an_error():
    with pytest.raises(ValueError, match="3 pairs cannot fill a batch on each of 4 ranks"):
        TokenBucketSampler([1, 2, 3], [1, 2, 3], 100, seed=0, rank=0, world_size=4)
    with pytest.raises(ValueError, match="rank < world_size"):
        TokenBucketSampler([1, 2, 3], [1, 2, 3], 100, seed=0, rank=2, world_size=2)


def test_resume_mid_epoch_yields_exactly_the_remaining_batches():
    src, tgt = _lengths(300)
    sampler = TokenBucketSampler(src, tgt, 200, seed=11, rank=1, world_size=2)
    sampler.set_epoch(3)
    full = list(sampler)
    sampler.set_epoch(3)
    iterator = iter(sampler)
    consumed = [next(iterator) for _ in range(5)]
    state = sampler.state_dict()
    assert state == {"epoch": 3, "position": 5, "batches": len(full)} and all(type(v) is int for v in state.values())

    fresh = TokenBucketSampler(src, tgt, 200, seed=11, rank=1, world_size=2)
    fresh.load_state_dict(state)
    fresh.set_epoch(3)  # re-selecting the same epoch keeps the resume position
    rest = list(fresh)
    assert consumed + rest == full
    assert fresh.state_dict() == {"epoch": 3, "position": len(full), "batches": len(full)}
    assert list(fresh) == full  # the next pass over the same epoch starts at the beginning
    fresh.load_state_dict(state)
    fresh.set_epoch(4)  # another epoch discards the pending resume
    assert len(list(fresh)) == len(full)
    assert fresh.state_dict() == {"epoch": 4, "position": len(full), "batches": len(full)}


def test_resume_at_epoch_end_yields_nothing():
    src, tgt = _lengths(50)
    sampler = TokenBucketSampler(src, tgt, 200, seed=0)
    sampler.load_state_dict({"epoch": 0, "position": len(sampler)})
    assert list(sampler) == []
    with pytest.raises(ValueError, match="outside"):
        sampler.load_state_dict({"epoch": 0, "position": len(sampler) + 1})


def test_an_epochs_end_written_by_another_number_of_processes_loads_as_this_samplers_end():
    src, tgt = _lengths(300)
    alone = TokenBucketSampler(src, tgt, 200, seed=11)
    alone.set_epoch(2)
    list(alone)
    end = alone.state_dict()
    two = TokenBucketSampler(src, tgt, 200, seed=11, rank=1, world_size=2)
    assert end["position"] == len(alone) > len(two)
    two.load_state_dict(end)
    assert list(two) == [] and two.state_dict() == {"epoch": 2, "position": len(two), "batches": len(two)}
    with pytest.raises(ValueError, match="outside"):  # inside an epoch the count must fit: no such mapping
        two.load_state_dict({**end, "position": len(alone) - 1})


def test_padding_efficiency_by_hand():
    # max_tokens 12 packs [0, 1] (cost 2*2 + 2*3 = 10) and [2] (cost 4 + 5 = 9)
    src, tgt = [2, 1, 4], [1, 2, 4]
    sampler = TokenBucketSampler(src, tgt, 12, seed=0, shuffle=False)
    assert list(sampler) == [[1, 0], [2]]
    real = (2 + 1 + 1 + 2 + 2) + (4 + 4 + 1)  # tokens plus one EOS per pair
    assert padding_efficiency(sampler, src, tgt) == pytest.approx(real / (10 + 9))


@pytest.mark.slow
@pytest.mark.skipif(not (MULTI30K / "train.en.gz").is_file(), reason=f"no Multi30k at {MULTI30K}")
def test_multi30k_padding_efficiency_at_4096_tokens():
    """The target: >= 95 % real tokens with the default 8k joint BPE at max_tokens=4096."""
    from transformer.config import CorpusKind, DataConfig
    from transformer.data.corpus import TranslationDataset, clean_pairs
    from transformer.data.splits import load_split
    from transformer.data.tokenizer import build_tokenizers

    cfg = DataConfig(corpus=CorpusKind.custom, dir=str(MULTI30K))
    src, tgt = load_split(cfg, cfg.train_split)
    src_tok, tgt_tok = build_tokenizers(cfg.tokenizer, src, tgt)
    src, tgt, _ = clean_pairs(src, tgt, max_len=cfg.max_len, max_len_ratio=cfg.max_len_ratio,
                              count=lambda s: len(src_tok.encode(s)))
    data = TranslationDataset.from_texts(src, tgt, src_tok, tgt_tok)
    sampler = TokenBucketSampler(data.src_lengths, data.tgt_lengths, 4096, seed=1234)
    assert padding_efficiency(sampler, data.src_lengths, data.tgt_lengths) >= 0.95


def _loop_collate(pairs, pad_to_multiple):
    """An independent reference: pad row by row."""
    src_len = -(-max(1, max(len(s) for s, _ in pairs)) // pad_to_multiple) * pad_to_multiple
    tgt_len = -(-(max(len(t) for _, t in pairs) + 1) // pad_to_multiple) * pad_to_multiple
    src = torch.full((len(pairs), src_len), PAD_ID)
    tgt_in = torch.full((len(pairs), tgt_len), PAD_ID)
    tgt_out = torch.full((len(pairs), tgt_len), PAD_ID)
    for row, (s, t) in enumerate(pairs):
        src[row, : len(s)] = torch.tensor(s, dtype=torch.long)
        tgt_in[row, : len(t) + 1] = torch.tensor([BOS_ID, *t])
        tgt_out[row, : len(t) + 1] = torch.tensor([*t, EOS_ID])
    return src, tgt_in, tgt_out


@pytest.mark.parametrize("multiple", [1, 3, 8])
def test_vectorised_collate_equals_a_row_by_row_reference(multiple):
    rng = random.Random(multiple)
    pairs = [([rng.randrange(4, 300) for _ in range(rng.randint(0, 9))],
              [rng.randrange(4, 300) for _ in range(rng.randint(0, 11))]) for _ in range(40)]
    data = TranslationDataset.from_sequences([s for s, _ in pairs], [t for _, t in pairs])
    indices = [7, 3, 39, 0, 12]
    batch = collate_arrays(data, indices, pad_id=PAD_ID, bos_id=BOS_ID, eos_id=EOS_ID, pad_to_multiple=multiple)
    src, tgt_in, tgt_out = _loop_collate([pairs[i] for i in indices], multiple)
    assert torch.equal(batch.src, src) and torch.equal(batch.tgt_in, tgt_in) and torch.equal(batch.tgt_out, tgt_out)
    assert batch.src.size(1) % multiple == 0 and batch.tgt_out.size(1) % multiple == 0
    assert batch.indices == indices and batch.n_tgt_tokens == sum(len(pairs[i][1]) + 1 for i in indices)
    # target_positions are exactly the real cells of tgt_out, in row-major order
    real = torch.zeros(tgt_out.numel(), dtype=torch.bool)
    real[batch.target_positions] = True
    assert torch.equal(real.view_as(tgt_out), tgt_out != PAD_ID) and len(batch.target_positions) == batch.n_tgt_tokens
    rows = [max(len(pairs[i][0]) for i in indices), max(len(pairs[i][1]) for i in indices)]
    assert batch_cost(len(indices), *rows, multiple) == batch.src.numel() + batch.tgt_out.numel()


def test_sampler_budget_counts_the_rounded_lengths():
    src, tgt = _lengths(300, seed=4)
    sampler = TokenBucketSampler(src, tgt, 256, seed=2, pad_to_multiple=8)
    batches = list(sampler)
    assert sorted(i for b in batches for i in b) == list(range(300))
    for b in batches:
        assert batch_cost(len(b), max(src[i] for i in b), max(tgt[i] for i in b), 8) <= 256 or len(b) == 1
    # rounding makes batches no fuller than without it
    assert len(sampler) >= len(TokenBucketSampler(src, tgt, 256, seed=2))


@pytest.mark.parametrize("multiple", [1, 8])
def test_the_pairs_counted_oversized_are_those_the_sampler_batches_alone(multiple):
    src, tgt = _lengths(300, seed=5)
    for budget in (16, 40, 10_000):
        over = {i for i in range(300) if batch_cost(1, src[i], tgt[i], multiple) > budget}
        assert count_oversized(src, tgt, budget, multiple) == len(over)
        batches = list(TokenBucketSampler(src, tgt, budget, seed=0, pad_to_multiple=multiple))
        assert all([i] in batches for i in over)
    assert count_oversized([0, 3], [0, 3], 2) == 1  # an empty source still costs a position
