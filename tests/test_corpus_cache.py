"""The data cache: ids equal direct encoding, hits, invalidation, crash safety, read-only maps, sampling."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest
from conftest import multi30k_dir

from transformer.config import ConfigError, CorpusKind, DataConfig, TokenizerConfig, TokenizerKind
from transformer.data import cache as corpus_cache
from transformer.data import encoding as corpus_encoding
from transformer.data.cache import ReservoirSample, load_or_build
from transformer.data.corpus import DataError, clean_pairs, normalize_space
from transformer.data.splits import load_split
from transformer.data.tokenizer import WordTokenizer, build_tokenizers, tokenizer_digest

WORDS = "the a dog cat runs sees big small red house near under".split()
# Cleaning cases by hand: a whitespace-only side (empty), 9 words > max_len=8 (too long),
# 1 vs 4 words > ratio 3 (bad ratio), and messy whitespace that is normalized but kept.
SPECIAL_SRC = ["  ", "a b c d e f g h i", "dog", "the \t dog  runs "]
SPECIAL_TGT = ["the dog", "a b", "the big red house", "der  hund läuft"]


def _write_corpus(folder: Path, n_pairs: int = 120, seed: int = 0) -> Path:
    rng = random.Random(seed)
    src = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 6))) for _ in range(n_pairs)]
    tgt = [sentence.upper() for sentence in src]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "train.xx").write_text("".join(s + "\n" for s in src + SPECIAL_SRC), encoding="utf-8")
    (folder / "train.yy").write_text("".join(t + "\n" for t in tgt + SPECIAL_TGT), encoding="utf-8")
    return folder


def _cfg(tmp_path: Path, kind: TokenizerKind = TokenizerKind.word, **changes) -> DataConfig:
    vocab = 60 if kind is TokenizerKind.sentencepiece else 1000
    tokenizer = TokenizerConfig(kind=kind, vocab_size=vocab, **changes.pop("tokenizer", {}))
    changes = {"cache_dir": str(tmp_path / "cache"), "max_len": 8, **changes}
    return DataConfig(corpus=CorpusKind.custom, dir=str(tmp_path / "corpus"), src="xx", tgt="yy",
                      tokenizer=tokenizer, **changes)


@pytest.fixture()
def corpus(tmp_path: Path) -> Path:
    return _write_corpus(tmp_path / "corpus")


def _arrays(dataset) -> list[np.ndarray]:
    return [np.array(a) for a in (dataset.src_tokens, dataset.src_offsets, dataset.tgt_tokens, dataset.tgt_offsets)]


def _folders(tmp_path: Path, kind: str) -> list[str]:
    return sorted(p.name for p in (tmp_path / "cache" / kind).iterdir())


class _Counting:
    """Wraps a function and counts its calls (to tell a cache hit from a rebuild)."""

    def __init__(self, function):
        self.function, self.calls = function, 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self.function(*args, **kwargs)


@pytest.fixture()
def counted(monkeypatch) -> dict[str, _Counting]:
    wrappers = {"encode": _Counting(corpus_encoding.encode_pairs), "train": _Counting(corpus_cache.build_tokenizers)}
    monkeypatch.setattr(corpus_encoding, "encode_pairs", wrappers["encode"])
    monkeypatch.setattr(corpus_cache, "build_tokenizers", wrappers["train"])
    return wrappers


# --------------------------------------------------------------------------------------------------
# Content
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", [TokenizerKind.word, TokenizerKind.sentencepiece])
def test_cached_ids_and_report_equal_direct_encoding_and_clean_pairs(tmp_path, corpus, kind, caplog):
    cfg = _cfg(tmp_path, kind)
    with caplog.at_level("INFO"):
        src_tok, tgt_tok, data = load_or_build(cfg)
    raw_src = (corpus / "train.xx").read_text(encoding="utf-8").splitlines()
    raw_tgt = (corpus / "train.yy").read_text(encoding="utf-8").splitlines()
    kept_src, kept_tgt, report = clean_pairs(raw_src, raw_tgt, max_len=8, max_len_ratio=3.0,
                                             count=lambda s: len(src_tok.encode(s)))  # joint: src_tok is tgt_tok
    assert len(data) == len(kept_src) == report.n_kept
    assert [data[i] for i in range(len(data))] == [(src_tok.encode(s), tgt_tok.encode(t))
                                                   for s, t in zip(kept_src, kept_tgt)]
    meta = json.loads(next((tmp_path / "cache" / "corpus").glob("*/meta.json")).read_text())
    assert meta["cleaning"] == asdict(report)
    if kind is TokenizerKind.word:  # the hand-made cases (SentencePiece splits words into several pieces)
        assert (report.n_empty, report.n_too_long, report.n_bad_ratio, report.n_whitespace_normalized) == (1, 1, 1, 2)
    assert report.summary() in caplog.text


def test_arrays_are_read_only_memory_maps_of_the_smallest_dtype(tmp_path, corpus):
    _, _, data = load_or_build(_cfg(tmp_path))
    for array in (data.src_tokens, data.src_offsets, data.tgt_tokens, data.tgt_offsets):
        assert isinstance(array, np.memmap) and not array.flags.writeable
    assert data.src_tokens.dtype == np.uint8 and data.src_offsets.dtype == np.int64  # a few dozen words + 4 specials
    with pytest.raises(ValueError, match="^assignment destination is read-only$"):
        data.src_tokens[0] = 1


def test_resumed_tokenizers_are_used_and_key_the_cache(tmp_path, corpus):
    cfg = _cfg(tmp_path)
    own = WordTokenizer.train(["the dog runs"], TokenizerConfig(kind=TokenizerKind.word))
    src_tok, _, data = load_or_build(cfg, (own, own))
    assert src_tok is own and data[0] == (own.encode(corpus.joinpath("train.xx").read_text().split("\n")[0]),
                                          own.encode(corpus.joinpath("train.yy").read_text().split("\n")[0]))
    load_or_build(cfg)
    assert len(_folders(tmp_path, "corpus")) == 2  # other tokenizers, other ids


@pytest.mark.parametrize("kind", [TokenizerKind.word, TokenizerKind.sentencepiece])
def test_encoding_in_worker_processes_gives_the_same_arrays(tmp_path, corpus, monkeypatch, kind):
    submitted = []  # the chunks' source lines sent to worker processes

    class RecordingPool(ProcessPoolExecutor):
        def submit(self, *args, **kwargs):
            submitted.append(args[1])
            return super().submit(*args, **kwargs)

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)  # two cores, even on one
    monkeypatch.setattr(corpus_encoding, "ProcessPoolExecutor", RecordingPool)
    in_process = _arrays(load_or_build(_cfg(tmp_path, kind))[2])
    assert submitted == []  # a small file is encoded here
    monkeypatch.setattr(corpus_cache, "POOL_MIN_BYTES", 0)
    monkeypatch.setattr(corpus_cache, "CHUNK_LINES", 25)  # several chunks in flight, results kept in order
    parallel = _arrays(load_or_build(_cfg(tmp_path, kind, cache_dir=str(tmp_path / "again")))[2])
    assert [line for chunk in submitted for line in chunk] == (corpus / "train.xx").read_text().splitlines()
    assert [len(chunk) for chunk in submitted] == [25, 25, 25, 25, 24]
    assert len(in_process) == len(parallel) == 4
    for name, a, b in zip(("src_tokens", "src_offsets", "tgt_tokens", "tgt_offsets"), in_process, parallel):
        np.testing.assert_array_equal(a, b, err_msg=name)
        assert a.dtype == b.dtype, name


# --------------------------------------------------------------------------------------------------
# Hits and invalidation
# --------------------------------------------------------------------------------------------------


def test_second_call_is_a_cache_hit(tmp_path, corpus, counted, caplog):
    first = _arrays(load_or_build(_cfg(tmp_path))[2])
    meta = next((tmp_path / "cache" / "corpus").glob("*/meta.json"))
    created = json.loads(meta.read_text())["created"]
    with caplog.at_level("INFO"):
        second = _arrays(load_or_build(_cfg(tmp_path))[2])
    assert (counted["encode"].calls, counted["train"].calls) == (1, 1)
    assert json.loads(meta.read_text())["created"] == created
    assert "tokenizers: cache hit" in caplog.text and "training data: cache hit" in caplog.text
    assert all(np.array_equal(a, b) for a, b in zip(first, second))


def test_a_changed_corpus_file_rebuilds_everything(tmp_path, corpus, counted):
    load_or_build(_cfg(tmp_path))
    with open(corpus / "train.xx", "a", encoding="utf-8") as handle, open(corpus / "train.yy", "a") as other:
        handle.write("a red cat\n")
        other.write("A RED CAT\n")
    src_tok, tgt_tok, data = load_or_build(_cfg(tmp_path))  # size changed
    assert counted["train"].calls == 2 and counted["encode"].calls == 2
    assert [list(side) for side in data[len(data) - 1]] == [src_tok.encode("a red cat"), tgt_tok.encode("A RED CAT")]
    stat = (corpus / "train.yy").stat()
    os.utime(corpus / "train.yy", ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # same bytes, newer
    load_or_build(_cfg(tmp_path))
    assert counted["train"].calls == 3 and len(_folders(tmp_path, "corpus")) == 3


def test_cleaning_settings_rebuild_the_corpus_and_tokenizer_settings_both(tmp_path, corpus, counted):
    load_or_build(_cfg(tmp_path))
    load_or_build(_cfg(tmp_path, max_len=4))
    assert (counted["train"].calls, counted["encode"].calls) == (1, 2)  # tokenizers reused
    load_or_build(_cfg(tmp_path, tokenizer={"lowercase": True}))
    assert (counted["train"].calls, counted["encode"].calls) == (2, 3)
    assert len(_folders(tmp_path, "tokenizers")) == 2 and len(_folders(tmp_path, "corpus")) == 3


# --------------------------------------------------------------------------------------------------
# Crash safety
# --------------------------------------------------------------------------------------------------


def test_a_crash_mid_write_leaves_no_usable_cache_and_the_next_call_rebuilds(tmp_path, corpus, monkeypatch):
    expected = _arrays(load_or_build(_cfg(tmp_path, cache_dir=str(tmp_path / "reference")))[2])
    calls = []

    def failing_append(self, values):
        calls.append(self.path.name)
        if len(calls) == 3:
            raise RuntimeError("disk full")
        original(self, values)

    original = corpus_encoding.NpyWriter.append
    monkeypatch.setattr(corpus_encoding.NpyWriter, "append", failing_append)
    monkeypatch.setattr(corpus_cache, "CHUNK_LINES", 50)
    with pytest.raises(RuntimeError, match="disk full"):
        load_or_build(_cfg(tmp_path))
    assert list((tmp_path / "cache" / "corpus").iterdir()) == []  # neither a final folder nor a temporary one
    monkeypatch.undo()
    rebuilt = _arrays(load_or_build(_cfg(tmp_path))[2])
    assert all(np.array_equal(a, b) for a, b in zip(expected, rebuilt))


def test_runs_started_together_share_the_tokenizers_published_first(tmp_path, corpus, monkeypatch):
    """Two runs miss the cache at once and both train tokenizers: the one that publishes second must use the
    published pair (an ensemble of the runs needs one pair), here simulated by another run publishing a
    different vocabulary while this one trains."""
    cfg = _cfg(tmp_path)
    other = TokenizerConfig(kind=TokenizerKind.word, vocab_size=12)  # another vocabulary than cfg's
    key = corpus_cache._tokenizer_key(cfg, corpus / "train.xx", corpus / "train.yy")
    folder = corpus_cache._folder(Path(cfg.cache_dir), "tokenizers", cfg, key)

    trained, published = [], []

    def train_while_another_run_publishes(tok_cfg, src_text, tgt_text):
        published.extend(build_tokenizers(other, src_text, tgt_text))
        with corpus_cache._building(folder, key) as tmp:
            corpus_cache.save_tokenizers(tmp, *published)
            corpus_cache._write_meta(tmp, key, {"n_pairs": 0, "n_sentences": [0, 0]})
        trained.extend(build_tokenizers(tok_cfg, src_text, tgt_text))
        return tuple(trained)

    def digests(pair) -> list[str]:
        return [tokenizer_digest(tok) for tok in pair]

    monkeypatch.setattr(corpus_cache, "build_tokenizers", train_while_another_run_publishes)
    src_tok, tgt_tok, _ = load_or_build(cfg)
    assert digests(trained) != digests(published)
    assert digests((src_tok, tgt_tok)) == digests(published)
    assert _folders(tmp_path, "tokenizers") == [folder.name]


@pytest.mark.parametrize("damage", ["no meta.json", "truncated array", "other key"])
def test_a_half_written_folder_is_removed_and_rebuilt(tmp_path, corpus, counted, damage, caplog):
    expected = _arrays(load_or_build(_cfg(tmp_path))[2])
    folder = tmp_path / "cache" / "corpus" / _folders(tmp_path, "corpus")[0]
    if damage == "no meta.json":
        (folder / "meta.json").unlink()
    elif damage == "truncated array":
        with open(folder / "tgt_tokens.npy", "r+b") as handle:
            handle.truncate(folder.joinpath("tgt_tokens.npy").stat().st_size - 3)
    else:
        meta = json.loads((folder / "meta.json").read_text())
        meta["key"]["max_len"] = 99
        (folder / "meta.json").write_text(json.dumps(meta))
    with caplog.at_level("WARNING"):
        rebuilt = _arrays(load_or_build(_cfg(tmp_path))[2])
    assert "incomplete" in caplog.text and counted["encode"].calls == 2
    assert all(np.array_equal(a, b) for a, b in zip(expected, rebuilt))


def test_a_folder_whose_bytes_changed_is_removed_and_rebuilt(tmp_path, corpus, counted, caplog):
    expected = _arrays(load_or_build(_cfg(tmp_path))[2])
    folder = tmp_path / "cache" / "corpus" / _folders(tmp_path, "corpus")[0]
    data = bytearray((folder / "src_tokens.npy").read_bytes())
    data[-1] ^= 0x01  # one flipped bit in the last token id: same size, so only the digest can tell
    (folder / "src_tokens.npy").write_bytes(bytes(data))
    with caplog.at_level("WARNING"):
        rebuilt = _arrays(load_or_build(_cfg(tmp_path))[2])
    assert f"{folder}: src_tokens.npy do not match the SHA-256 in meta.json" in caplog.text
    assert counted["encode"].calls == 2 and all(np.array_equal(a, b) for a, b in zip(expected, rebuilt))


def test_temporary_folders_of_dead_processes_are_removed(tmp_path, corpus):
    load_or_build(_cfg(tmp_path))
    name = _folders(tmp_path, "corpus")[0]
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = tmp_path / "cache" / "corpus" / f".{name}.tmp-{int(dead.stdout)}-abc"
    stale.mkdir()
    (stale / "src_tokens.npy").write_bytes(b"partial")
    (tmp_path / "cache" / "corpus" / name / "meta.json").unlink()
    load_or_build(_cfg(tmp_path))
    assert _folders(tmp_path, "corpus") == [name]


# --------------------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------------------


def test_bad_input_names_file_and_line_and_caches_nothing(tmp_path, corpus):
    lines = (corpus / "train.yy").read_bytes().split(b"\n")
    lines[2] = b"caf\xe9"
    (corpus / "train.yy").write_bytes(b"\n".join(lines))
    with pytest.raises(DataError, match=rf"{corpus / 'train.yy'}:3: invalid UTF-8 at byte \d+ \(byte 3 of the line\)"):
        load_or_build(_cfg(tmp_path))
    (corpus / "train.yy").write_text("only one line\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"train\.xx has 124 lines but .*train\.yy has 1 line \(line 2 has no"):
        load_or_build(_cfg(tmp_path))
    assert not list((tmp_path / "cache").glob("*/*"))


def test_a_corpus_that_cleaning_empties_names_the_key_that_dropped_it(tmp_path):
    folder = tmp_path / "corpus"
    folder.mkdir()
    (folder / "train.xx").write_text("a b c\n" * 5 + " \n", encoding="utf-8")
    (folder / "train.yy").write_text("A B C\n" * 5 + "A\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"^data\.max_len: cleaning dropped every training pair of .*train\.xx and "
                                          r".*train\.yy \(6 read: 1 with an empty side, 5 too long, 0 with .*raise data"):
        load_or_build(_cfg(tmp_path, max_len=2))
    (folder / "train.yy").write_text("A B C D E F G\n" * 5 + "A\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"^data\.max_len_ratio: .*\(6 read: 1 with an empty side, 0 too long, 5 with"):
        load_or_build(_cfg(tmp_path, max_len=8, max_len_ratio=2.0))
    assert not list((tmp_path / "cache" / "corpus").glob("*/*.npy"))


@pytest.mark.parametrize("kind", list(TokenizerKind))
def test_a_corpus_of_blank_lines_is_refused_as_such_by_either_tokenizer(tmp_path, kind):
    folder = tmp_path / "corpus"
    folder.mkdir()
    (folder / "train.xx").write_text("\n" * 30, encoding="utf-8")
    (folder / "train.yy").write_text(" \n" * 30, encoding="utf-8")
    # SentencePiece learnt from nothing would stop with "INTERNAL: ... [!sentences_.empty()]"
    with pytest.raises((DataError, ConfigError), match=r"(are blank|cleaning dropped every training pair).*are the "
                                                       r"files empty or blank\?$"):
        load_or_build(_cfg(tmp_path, kind))
    assert not list((tmp_path / "cache").glob("*/*/*.npy")) and not list((tmp_path / "cache").glob("*/*/*.model"))


# --------------------------------------------------------------------------------------------------
# Tokenizer training text
# --------------------------------------------------------------------------------------------------


def _sample(items: list[str], capacity: int, chunk: int, seed: int = 0) -> list[tuple[int, str]]:
    sample = ReservoirSample(capacity, seed)
    for start in range(0, len(items), chunk):
        sample.add(items[start:start + chunk], 1000 + start)
    return sample.in_order()


def test_reservoir_sample_is_bounded_deterministic_and_in_stream_order():
    items = [f"s{i}" for i in range(2000)]
    chosen = _sample(items, 50, 64)
    assert len(chosen) == 50 and chosen == _sample(items, 50, 64)
    assert [key for key, _ in chosen] == sorted(key for key, _ in chosen)
    assert all(item == f"s{key - 1000}" for key, item in chosen)
    assert chosen != _sample(items, 50, 64, seed=1)
    assert max(key for key, _ in chosen) > 1000 + 1000  # not just a prefix of the stream
    assert _sample(items[:30], 50, 7) == [(1000 + i, f"s{i}") for i in range(30)]  # short streams come back whole


def test_reservoir_sample_is_uniform_enough():
    hits = np.zeros(100)
    for seed in range(400):
        for key, _ in _sample([str(i) for i in range(100)], 10, 16, seed):
            hits[key - 1000] += 1
    assert hits.sum() == 4000 and hits.min() > 15 and hits.max() < 70  # each ~40 = 400 * 10/100


def test_tokenizers_train_on_a_bounded_deterministic_sample(tmp_path, corpus, monkeypatch):
    seen: list[list[str]] = []

    def capture(tok_cfg, src, tgt):
        seen.append([*src, *tgt])
        return build_tokenizers(tok_cfg, src, tgt)

    monkeypatch.setattr(corpus_cache, "build_tokenizers", capture)
    for cache, max_sentences in (("a", 50), ("b", 50), ("c", 1000)):
        load_or_build(_cfg(tmp_path, tokenizer={"max_sentences": max_sentences}, cache_dir=str(tmp_path / cache)))
    src = [normalize_space(line) for line in (corpus / "train.xx").read_text(encoding="utf-8").splitlines()]
    tgt = [normalize_space(line) for line in (corpus / "train.yy").read_text(encoding="utf-8").splitlines()]
    assert len(seen[0]) == 50 and seen[0] == seen[1] and set(seen[0]) <= set(src + tgt)
    assert seen[2] == src + tgt  # the whole split fits: all of it, in order, source side first


def test_a_joint_sample_that_drew_nothing_of_one_side_names_max_sentences(tmp_path, corpus):
    cfg = _cfg(tmp_path, tokenizer={"max_sentences": 1})
    assert cfg.tokenizer.joint
    with pytest.raises(ConfigError, match=r"^data\.tokenizer\.max_sentences=1: the joint sample of both sides drew no "
                                          r"line of .*train\.(xx|yy); sample more sentences"):
        load_or_build(cfg)


def test_multi30k_tokenizer_is_the_one_trained_on_the_whole_split(tmp_path):
    source = multi30k_dir()
    if not (source / "train.en.gz").is_file():
        pytest.skip(f"Multi30k not found in {source}")
    cfg = DataConfig(dir=str(tmp_path / "m30k"), source_dir=str(source), cache_dir=str(tmp_path / "cache"))
    src_tok, _, data = load_or_build(cfg)
    before, _ = build_tokenizers(cfg.tokenizer, *load_split(cfg, "train"))  # what training used until now
    assert src_tok.pieces() == before.pieces()
    assert len(data) > 28_000
