"""Encoding a corpus into flat arrays: the pieces-written .npy files, encoded chunks against direct encoding,
and worker processes against this process."""

from __future__ import annotations

import os
from concurrent.futures import ProcessPoolExecutor

import numpy as np
import pytest

from transformer.config import TokenizerConfig, TokenizerKind
from transformer.data import encoding
from transformer.data.encoding import NpyWriter, encode_pairs, encoded_chunks
from transformer.data.tokenizer import WordTokenizer

SRC = ["the dog  runs", "a cat", " the red house ", "dog"]
TGT = ["der hund läuft", "eine katze", "das rote haus", "hund"]


@pytest.fixture(scope="module")
def tokenizer() -> WordTokenizer:
    return WordTokenizer.train(SRC + TGT, TokenizerConfig(kind=TokenizerKind.word))


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.int64])
def test_npy_written_in_pieces_loads_as_their_concatenation(tmp_path, dtype):
    pieces = [np.arange(5), np.array([], dtype=np.int64), np.arange(200, 203)]
    with NpyWriter(tmp_path / "a.npy", np.dtype(dtype)) as writer:
        for piece in pieces:
            writer.append(piece)
        writer.finish()
    loaded = np.load(tmp_path / "a.npy")
    assert loaded.dtype == dtype and writer.length == 8
    np.testing.assert_array_equal(loaded, np.concatenate(pieces).astype(dtype))


def test_npy_left_without_finish_holds_no_data(tmp_path):
    with NpyWriter(tmp_path / "a.npy", np.dtype(np.int64)) as writer:
        writer.append(np.arange(10))
    assert np.load(tmp_path / "a.npy").shape == (0,)  # the placeholder header: a half-written file reads as empty


def test_encoded_chunk_is_the_tokenizers_ids_packed(tokenizer):
    chunk = encode_pairs(tokenizer, tokenizer, SRC, TGT, np.dtype(np.uint16))
    src_ids = [tokenizer.encode(" ".join(line.split())) for line in SRC]
    np.testing.assert_array_equal(chunk.src_lengths, [len(ids) for ids in src_ids])
    np.testing.assert_array_equal(chunk.src_tokens, [i for ids in src_ids for i in ids])
    np.testing.assert_array_equal(chunk.tgt_lengths, [len(tokenizer.encode(line)) for line in TGT])
    assert chunk.src_tokens.dtype == np.uint16
    assert chunk.n_whitespace_normalized == 2  # "the dog  runs" and " the red house "


def test_worker_processes_give_the_chunks_in_corpus_order(tokenizer, monkeypatch):
    # twelve different chunks: more than two workers keep in flight, any two out of order differ
    chunks = [(SRC[i % 4:] * (1 + i // 4), TGT[i % 4:] * (1 + i // 4)) for i in range(12)]
    here = list(encoded_chunks(iter(chunks), tokenizer, tokenizer, np.dtype(np.uint16), use_processes=False))
    submitted = []  # the chunks sent to worker processes

    class RecordingPool(ProcessPoolExecutor):
        def submit(self, *args, **kwargs):
            submitted.append(args[1:])
            return super().submit(*args, **kwargs)

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)  # two cores, even on one
    monkeypatch.setattr(encoding, "ProcessPoolExecutor", RecordingPool)
    pooled = list(encoded_chunks(iter(chunks), tokenizer, tokenizer, np.dtype(np.uint16), use_processes=True))
    assert submitted == chunks and len(here) == len(pooled) == len(chunks)
    for a, b in zip(here, pooled):
        for name in ("src_tokens", "src_lengths", "tgt_tokens", "tgt_lengths"):
            np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)
            assert getattr(a, name).dtype == getattr(b, name).dtype, name
        assert a.n_whitespace_normalized == b.n_whitespace_normalized
