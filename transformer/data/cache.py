"""The data cache: tokenizers and the encoded training split, built once, memory-mapped by every run.

Under ``data.cache_dir``, each folder named by a digest of everything that determines it::

    tokenizers/{src}-{tgt}-{digest}/  joint.model (or src/tgt .model; word level: .json), meta.json
    corpus/{src}-{tgt}-{digest}/      {src,tgt}_tokens.npy {src,tgt}_offsets.npy, meta.json

Both keys hold the training files' identity (resolved path, size, mtime_ns), the languages and
``max_pairs``; the tokenizers' also their settings and text sampling, the corpus's the cleaning settings
and the tokenizers' digests (so a resumed run's own tokenizers key it). Old folders may be deleted.

Why ``.npy``: numpy is already a dependency; ``np.load(mmap_mode="r")`` maps a file read-only, so every
process (DDP ranks, later runs) shares the page cache instead of holding a copy, and slicing a memmap
copies nothing. Four flat integer arrays need no more (Arrow/Parquet would add pyarrow for no gain).

Atomic: a folder is built in a hidden temporary sibling, its files fsynced, ``meta.json`` (with each
file's size) written last, then renamed into place. A folder without a readable ``meta.json`` whose
sizes match is half-written (a crash, a copy cut short): it is removed and rebuilt, never used.

Streaming: a first pass over the corpus picks a seeded random sample of at most
``data.tokenizer.max_sentences`` sentences to train the tokenizers; a second normalizes whitespace,
encodes (:mod:`transformer.data.encoding`: in worker processes for large files), cleans by token counts
(``corpus.cleaning_mask``) and appends the kept pairs to the arrays on disk, chunk by chunk.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
from contextlib import ExitStack, closing, contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import sentencepiece as spm

from transformer.config import ConfigError, DataConfig, TokenizerConfig, to_plain_dict
from transformer.data.corpus import (
    CleaningReport,
    DataError,
    TranslationDataset,
    cleaning_mask,
    iter_parallel,
    normalize_space,
    token_dtype,
)
from transformer.data.encoding import EncodedChunk, NpyWriter, encoded_chunks
from transformer.data.splits import corpus_paths
from transformer.data.tokenizer import Tokenizer, build_tokenizers, load_tokenizers, save_tokenizers, tokenizer_digest
from transformer.files import (
    disk_full_while_building,
    fsync_directory,
    fsync_file,
    sha256,
    temporary_folder,
    write_json,
)
from transformer.tracking import ProgressBar

log = logging.getLogger(__name__)

FORMAT_VERSION = 1  # bump when the layout or the preparation changes what a key's folder would hold
SAMPLE_SEED = 12345  # the tokenizer text sample's seed (part of the tokenizer key)
CHUNK_LINES = 100_000  # pairs per encoding chunk: large enough to amortise calls, small in memory
POOL_MIN_BYTES = 32 << 20  # encoding uses worker processes only for training files above this (start-up cost)
_META = "meta.json"
_ARRAYS = ("src_tokens", "src_offsets", "tgt_tokens", "tgt_offsets")
_SIDE_KEY = 1 << 40  # sample sort key = side * _SIDE_KEY + line: source sentences first, then target


# --------------------------------------------------------------------------------------------------
# Keys and atomic folders
# --------------------------------------------------------------------------------------------------


def file_identity(path: Path) -> dict[str, Any]:
    """What identifies a corpus file without reading it: resolved path, size and modification time."""
    stat = path.stat()
    return {"path": str(path.resolve()), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def _folder(root: Path, kind: str, cfg: DataConfig, key: dict[str, Any]) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()
    return root / kind / f"{cfg.src}-{cfg.tgt}-{digest[:20]}"


def _write_meta(folder: Path, key: dict[str, Any], extra: dict[str, Any]) -> None:
    """Fsync every file in ``folder``, then write ``meta.json`` (key, file sizes and SHA-256, ``extra``) last."""
    files = {path.name: path.stat().st_size for path in sorted(folder.iterdir())}
    for name in files:
        fsync_file(folder / name)
    digests = {name: sha256(folder / name) for name in files}
    meta = {"format": FORMAT_VERSION, "key": key, "files": files, "sha256": digests, "created": time.time(), **extra}
    write_json(folder / _META, meta)


def _valid_meta(folder: Path, key: dict[str, Any]) -> dict[str, Any] | None:
    """``meta.json`` of a complete, intact folder built for ``key``; a half-written or damaged folder is removed
    (None), to be rebuilt. Checking the files' SHA-256 reads them once per use (about 0.1 s per 100 MB)."""
    if not folder.exists():
        return None
    try:
        meta = json.loads((folder / _META).read_text(encoding="utf-8"))
        complete = meta["format"] == FORMAT_VERSION and meta["key"] == key and all(
            (folder / name).stat().st_size == size for name, size in meta["files"].items())
        damaged = complete and [name for name, digest in meta.get("sha256", {}).items()
                                if sha256(folder / name) != digest]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        complete, damaged = False, []
    if complete and not damaged:
        return meta
    if damaged:
        log.warning("%s: %s do not match the SHA-256 in meta.json (a damaged disk or copy): removing the folder to "
                    "rebuild it", folder, ", ".join(damaged))
    else:
        log.warning("%s is incomplete or does not match its key (half-written?): removing it to rebuild", folder)
    shutil.rmtree(folder)
    return None


def _remove_stale(final: Path) -> None:
    """Remove temporary siblings of ``final`` left by processes that no longer run (killed mid-build)."""
    for tmp in final.parent.glob(f".{final.name}.tmp-*"):
        pid = tmp.name.split(".tmp-", 1)[1].split("-", 1)[0]
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(tmp, ignore_errors=True)
        except (ValueError, PermissionError):
            pass


@contextmanager
def _building(final: Path, key: dict[str, Any]) -> Iterator[Path]:
    """A temporary sibling folder to build ``final`` in, renamed into place only if the block succeeds.

    If another process published ``final`` meanwhile (same key), its folder is kept and ours dropped.
    """
    final.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale(final)
    tmp = temporary_folder(final.parent, f".{final.name}.tmp-{os.getpid()}-")
    try:
        yield tmp
        try:
            os.rename(tmp, final)
        except OSError:
            if _valid_meta(final, key) is None:
                raise
        fsync_directory(final.parent)
    except (OSError, RuntimeError) as error:  # a full disk names the cache folder, not the file that filled it
        raise disk_full_while_building(final, error) or error
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# --------------------------------------------------------------------------------------------------
# Tokenizers
# --------------------------------------------------------------------------------------------------


class ReservoirSample:
    """A uniform random sample of at most ``capacity`` items from a stream of unknown length, seeded.

    Algorithm R (Vitter, 1985) with the random draws vectorised per chunk. Every item carries a sort
    key, and the sample comes back sorted by it: a stream no longer than ``capacity`` comes back whole
    and in order, so small corpora train exactly the tokenizer they would without sampling.
    """

    def __init__(self, capacity: int, seed: int) -> None:
        self.capacity, self.seen = capacity, 0
        self.items: list[str] = []
        self.keys: list[int] = []
        self._rng = np.random.default_rng(seed)

    def add(self, items: list[str], first_key: int) -> None:
        """Offer ``items`` (in stream order); item ``i`` gets the sort key ``first_key + i``."""
        room = max(0, min(self.capacity - len(self.items), len(items)))
        self.items.extend(items[:room])
        self.keys.extend(range(first_key, first_key + room))
        if room < len(items):
            positions = np.arange(self.seen + room, self.seen + len(items))  # 0-based places in the stream
            slots = self._rng.integers(0, positions + 1)  # item at position p: slot j ~ U{0..p}, kept if j < capacity
            for i in np.flatnonzero(slots < self.capacity).tolist():
                self.items[slots[i]], self.keys[slots[i]] = items[room + i], first_key + room + i
        self.seen += len(items)

    def in_order(self) -> list[tuple[int, str]]:
        """The sample as (key, item), sorted by key."""
        return sorted(zip(self.keys, self.items))


def _sample_training_text(cfg: DataConfig, src_path: Path, tgt_path: Path,
                          progress: bool) -> tuple[list[str], list[str], int]:
    """One streaming pass: the tokenizers' training text (normalized) and the number of pairs read."""
    limit = cfg.tokenizer.max_sentences
    src_sample = ReservoirSample(limit, SAMPLE_SEED)
    tgt_sample = src_sample if cfg.tokenizer.joint else ReservoirSample(limit, SAMPLE_SEED + 1)
    bar, n_pairs = ProgressBar(None, enabled=progress, desc="reading train"), 0
    for src, tgt in iter_parallel(src_path, tgt_path, CHUNK_LINES, cfg.max_pairs):
        src_sample.add(src, n_pairs)
        tgt_sample.add(tgt, _SIDE_KEY + n_pairs)
        n_pairs += len(src)
        bar.update(len(src))
    bar.close()
    chosen = src_sample.in_order() + ([] if cfg.tokenizer.joint else tgt_sample.in_order())
    src_text = [normalize_space(text) for key, text in chosen if key < _SIDE_KEY]
    tgt_text = [normalize_space(text) for key, text in chosen if key >= _SIDE_KEY]
    return src_text, tgt_text, n_pairs


def _tokenizer_key(cfg: DataConfig, src_path: Path, tgt_path: Path) -> dict[str, Any]:
    return {"format": FORMAT_VERSION, "src_file": file_identity(src_path), "tgt_file": file_identity(tgt_path),
            "src": cfg.src, "tgt": cfg.tgt, "max_pairs": cfg.max_pairs, "tokenizer": to_plain_dict(cfg.tokenizer),
            "sample_seed": SAMPLE_SEED, "sentencepiece": spm.__version__}


def cached_tokenizers(cfg: DataConfig, src_path: Path, tgt_path: Path,
                      progress: bool = False) -> tuple[Tokenizer, Tokenizer, int | None]:
    """The tokenizers for this corpus and settings: from the cache, else trained on a sample and cached.

    Returns:
        (src_tok, tgt_tok, number of training pairs read when known).
    """
    key = _tokenizer_key(cfg, src_path, tgt_path)
    folder = _folder(Path(cfg.cache_dir), "tokenizers", cfg, key)
    if (meta := _valid_meta(folder, key)) is not None:
        log.info("tokenizers: cache hit in %s", folder)
        return (*load_tokenizers(folder), meta["n_pairs"])
    src_text, tgt_text, n_pairs = _sample_training_text(cfg, src_path, tgt_path, progress)
    for path, text in ((src_path, src_text), (tgt_path, tgt_text)):
        if not text and n_pairs:  # a joint sample that drew every line from the other side
            raise ConfigError(f"data.tokenizer.max_sentences={cfg.tokenizer.max_sentences}: the joint sample of both "
                              f"sides drew no line of {path}; sample more sentences (the default is "
                              f"{TokenizerConfig().max_sentences})")
        if not any(text):  # SentencePiece would stop with an internal error
            lines = f"all {len(text)} lines" if n_pairs <= len(text) else f"the {len(text)} lines sampled of {n_pairs}"
            raise DataError(f"{path}: {lines} are blank, so no tokenizer can be learnt; are the files empty or blank?")
    bar = ProgressBar(1, enabled=progress, desc=f"training {cfg.tokenizer.kind.value} tokenizer")
    log.info("training the tokenizers on %d + %d sentences (of %d pairs)", len(src_text), len(tgt_text), n_pairs)
    src_tok, tgt_tok = build_tokenizers(cfg.tokenizer, src_text, tgt_text)
    bar.update()
    bar.close()
    with _building(folder, key) as tmp:
        save_tokenizers(tmp, src_tok, tgt_tok)
        _write_meta(tmp, key, {"n_pairs": n_pairs, "n_sentences": [len(src_text), len(tgt_text)]})
    log.info("tokenizers: saved in %s", folder)
    # What the cache holds, not what was just trained: a run started beside this one may have published its
    # tokenizers first, and every run of these settings must share one pair (an ensemble of them needs it).
    return (*load_tokenizers(folder), n_pairs)


# --------------------------------------------------------------------------------------------------
# The encoded training split
# --------------------------------------------------------------------------------------------------


def _append(out: dict[str, NpyWriter], ends: dict[str, int], chunk: EncodedChunk, keep: np.ndarray) -> None:
    """Append the kept pairs of ``chunk``: their tokens, and offsets continuing from ``ends``."""
    for side, tokens, lengths in (("src", chunk.src_tokens, chunk.src_lengths),
                                  ("tgt", chunk.tgt_tokens, chunk.tgt_lengths)):
        out[f"{side}_tokens"].append(tokens[np.repeat(keep, lengths)])
        offsets = ends[side] + np.cumsum(lengths[keep])  # (n_kept,) where each kept sequence ends
        out[f"{side}_offsets"].append(offsets)
        ends[side] += int(lengths[keep].sum())


def _write_corpus(folder: Path, cfg: DataConfig, paths: tuple[Path, Path], src_tok: Tokenizer,
                  tgt_tok: Tokenizer, progress: bool, total: int | None) -> dict[str, Any]:
    """Encode, clean and append the training pairs to the arrays in ``folder``; returns meta.json fields."""
    dtype = token_dtype(max(src_tok.vocab_size, tgt_tok.vocab_size))
    counts = np.zeros(5, np.int64)  # input, empty, too long, bad ratio, whitespace normalized
    ends = {"src": 0, "tgt": 0}
    chunks = iter_parallel(*paths, CHUNK_LINES, cfg.max_pairs)
    with ExitStack() as stack:
        out = {name: stack.enter_context(NpyWriter(folder / f"{name}.npy", dtype if "tokens" in name else np.int64))
               for name in _ARRAYS}
        bar = stack.enter_context(closing(ProgressBar(total, enabled=progress, desc="encoding train")))
        out["src_offsets"].append(np.zeros(1, np.int64))
        out["tgt_offsets"].append(np.zeros(1, np.int64))
        for chunk in encoded_chunks(chunks, src_tok, tgt_tok, dtype, paths[0].stat().st_size >= POOL_MIN_BYTES):
            keep, *dropped = cleaning_mask(chunk.src_lengths, chunk.tgt_lengths, max_len=cfg.max_len,
                                           max_len_ratio=cfg.max_len_ratio)
            _append(out, ends, chunk, keep)
            counts += [len(keep), *dropped, chunk.n_whitespace_normalized]
            bar.update(len(keep))
        n_input, n_empty, n_long, n_ratio, n_changed = counts.tolist()
        if n_input == n_empty + n_long + n_ratio:
            raise _all_dropped(paths, n_input, n_empty, n_long, n_ratio)
        for writer in out.values():
            writer.finish()
    report = CleaningReport(n_input=n_input, n_kept=n_input - n_empty - n_long - n_ratio,
                            n_whitespace_normalized=n_changed, n_empty=n_empty, n_too_long=n_long,
                            n_bad_ratio=n_ratio, max_len=cfg.max_len, max_len_ratio=cfg.max_len_ratio)
    return {"n_pairs": report.n_kept, "src_tokens": ends["src"], "tgt_tokens": ends["tgt"],
            "token_dtype": dtype.name, "cleaning": asdict(report)}


def _all_dropped(paths: tuple[Path, Path], n_input: int, n_empty: int, n_long: int, n_ratio: int) -> Exception:
    """The error for a corpus that cleaning emptied, naming what to change for the reason that dropped most."""
    why = (f"cleaning dropped every training pair of {paths[0]} and {paths[1]} ({n_input} read: {n_empty} with an "
           f"empty side, {n_long} too long, {n_ratio} with too high a length ratio)")
    if n_empty == n_input:
        return DataError(f"{why}; are the files empty or blank?")
    key = "data.max_len" if n_long >= n_ratio else "data.max_len_ratio"
    return ConfigError(f"{key}: {why}; raise {key}")


def _open_dataset(folder: Path, meta: dict[str, Any]) -> TranslationDataset:
    """Memory-map the arrays read-only (nothing is copied); their lengths must be those in ``meta``."""
    arrays = {name: np.load(folder / f"{name}.npy", mmap_mode="r") for name in _ARRAYS}
    lengths = {name: len(array) for name, array in arrays.items()}
    expected = dict(src_tokens=meta["src_tokens"], src_offsets=meta["n_pairs"] + 1, tgt_tokens=meta["tgt_tokens"],
                    tgt_offsets=meta["n_pairs"] + 1)
    if lengths != expected:
        raise DataError(f"{folder}: arrays hold {lengths} values but meta.json says {expected}; delete the folder")
    digest = hashlib.sha256(json.dumps(meta["sha256"], sort_keys=True).encode()).hexdigest()  # the files' SHA-256
    return TranslationDataset(*(arrays[name] for name in _ARRAYS), digest=digest)


def cached_corpus(cfg: DataConfig, src_path: Path, tgt_path: Path, src_tok: Tokenizer, tgt_tok: Tokenizer,
                  progress: bool = False, total: int | None = None) -> TranslationDataset:
    """The cleaned, encoded training split, memory-mapped from the cache (built there first if missing).

    Args:
        total: pairs expected (for the progress bar), when known.
    """
    key = {"format": FORMAT_VERSION, "src_file": file_identity(src_path), "tgt_file": file_identity(tgt_path),
           "src": cfg.src, "tgt": cfg.tgt, "max_pairs": cfg.max_pairs, "max_len": cfg.max_len,
           "max_len_ratio": cfg.max_len_ratio, "src_tokenizer": tokenizer_digest(src_tok),
           "tgt_tokenizer": tokenizer_digest(tgt_tok)}
    folder = _folder(Path(cfg.cache_dir), "corpus", cfg, key)
    meta = _valid_meta(folder, key)
    if meta is None:
        start = time.perf_counter()
        with _building(folder, key) as tmp:
            _write_meta(tmp, key, _write_corpus(tmp, cfg, (src_path, tgt_path), src_tok, tgt_tok, progress, total))
        meta = json.loads((folder / _META).read_text(encoding="utf-8"))
        log.info("training data: encoded %d pairs into %s in %.1f s", meta["n_pairs"], folder,
                 time.perf_counter() - start)
    else:
        log.info("training data: cache hit, %d pairs memory-mapped from %s", meta["n_pairs"], folder)
    log.info("training pairs: %s", CleaningReport(**meta["cleaning"]).summary())
    return _open_dataset(folder, meta)


def load_or_build(cfg: DataConfig, tokenizers: tuple[Tokenizer, Tokenizer] | None = None,
                  progress: bool = False) -> tuple[Tokenizer, Tokenizer, TranslationDataset]:
    """Tokenizers and the memory-mapped training set for ``cfg``, from ``cfg.cache_dir`` or built there now.

    Args:
        tokenizers: use these (e.g. a resumed run's) instead of the cached or newly trained ones.
        progress: show progress bars (only on a terminal).
    """
    src_path, tgt_path = corpus_paths(cfg, cfg.train_split)
    total = None
    if tokenizers is None:
        src_tok, tgt_tok, total = cached_tokenizers(cfg, src_path, tgt_path, progress)
    else:
        src_tok, tgt_tok = tokenizers
    return src_tok, tgt_tok, cached_corpus(cfg, src_path, tgt_path, src_tok, tgt_tok, progress, total)
