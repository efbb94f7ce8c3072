"""Parallel corpora: read and validate, clean, fetch Multi30k, and hold id sequences.

A corpus is a folder of ``{split}.{lang}`` or ``{split}.{lang}.gz`` files, one sentence per line,
UTF-8, source and target files aligned line by line. Multi30k (task 1) is fetched into such a
folder: copied from a local copy (``data.source_dir``) or downloaded from the public
``multi30k/dataset`` repository, and checked against SHA-256 digests kept below either way.
Every error names the file, and the line where there is one.
"""

from __future__ import annotations

import gzip
import hashlib
import http.client
import logging
import os
import tempfile
import urllib.error
import urllib.request
import zlib
from dataclasses import dataclass
from itertools import zip_longest
from pathlib import Path
from typing import BinaryIO, Callable, Iterable, Iterator, Sequence, TypeVar

import numpy as np

from transformer.config import CorpusKind, DataConfig
from transformer.tokenizer import Tokenizer

logger = logging.getLogger(__name__)
Item = TypeVar("Item", str, list[int])  # a sentence or its token ids

MULTI30K_URL = "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw"
MULTI30K_SPLITS = ("train", "val", "test_2016_flickr")
MULTI30K_LANGS = ("en", "de", "fr", "cs")
# SHA-256 of the upstream files (multi30k/dataset, data/task1/raw), as gzip-compressed.
MULTI30K_SHA256 = {
    "train.en.gz": "d79cfa999dd4c51d2cb42499b6796d5a882c3a8a961923c25a898c90f8bbd56f",
    "train.de.gz": "726e39b2fa9eb9ffb6dc763fb35a179f80fae06ffc5d28b6ace5faa883de28a6",
    "train.fr.gz": "622e75069e9f4c577425c4f277116ce66e63a2401c0a2312d90073cb12379a3c",
    "train.cs.gz": "a65adb8b32e3bc664f21ecba7a6e7f6950fd1f405e135f7c312faabdb6255077",
    "val.en.gz": "14f7d25ddd868909a9213e361768460edcacdd6ab9d1e77b92560dc10c10dc28",
    "val.de.gz": "f0cba2f995189cf5770f29a8a9a537a3ad3f51657ad873405082ff6863a5e75a",
    "val.fr.gz": "ca3106f1a72390591d25f6c45cb4cd39dec4cd3f123e099748a3ce5256c160e9",
    "val.cs.gz": "b63226e05c4bd5dd6a42897d74b86a1b9d2c31498252c572b1ea7f7996927fcc",
    "test_2016_flickr.en.gz": "611d361c6334bc7246101d48097c13cf5c4413c5befc793cc629934359d532d9",
    "test_2016_flickr.de.gz": "9204244e408ccb38d2a55cfcd344df15005fc42a07a6e55ca6c52b6ababb8cc8",
    "test_2016_flickr.fr.gz": "6d326e188d259fb1d04ac19eae3af956559b3a0b93d7635e56c90987c40c8b90",
    "test_2016_flickr.cs.gz": "200a4a74cc9560f051924abb9803be008d1908d77f747e9141aeb86dfd2797f1",
}
_CHUNK = 1 << 16


class DataError(ValueError):
    """A corpus file is missing, unreadable or inconsistent; the message names file:line."""


# --------------------------------------------------------------------------------------------------
# Reading
# --------------------------------------------------------------------------------------------------


def _open_binary(path: Path) -> BinaryIO:
    """Open plain or gzip-compressed files alike (decided by the gzip magic bytes, not the name)."""
    with open(path, "rb") as probe:
        compressed = probe.read(2) == b"\x1f\x8b"
    return gzip.open(path, "rb") if compressed else open(path, "rb")  # type: ignore[return-value]


def _decode_error(path: Path, block: list[bytes], number: int, offset: int) -> DataError:
    """The error for the first line of ``block`` (starting at line ``number``, byte ``offset``) that is not UTF-8."""
    for raw in block:
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError as err:
            return DataError(f"{path}:{number}: invalid UTF-8 at byte {offset + err.start} "
                             f"(byte {err.start} of the line): {err.reason}")
        number, offset = number + 1, offset + len(raw)
    return DataError(f"{path}:{number}: invalid UTF-8")  # unreachable: the joined block failed to decode


def iter_line_blocks(path: str | Path, block_bytes: int = 1 << 22) -> Iterator[list[str]]:
    """Stream a UTF-8 text file (plain or .gz) as lists of lines without their line terminators.

    Lines end at ``\\n`` only (a ``\\r`` before it is dropped), so Unicode line separators inside
    a sentence do not shift the alignment. A UTF-8 byte-order mark at the start is dropped. Each block
    holds about ``block_bytes`` of text and is decoded in one call (per line only to locate an error),
    which keeps reading large corpora fast without holding them in memory.

    Raises:
        DataError: the file is missing, empty, not valid gzip, or not UTF-8 (with line and byte offset).
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: file not found" if not path.exists() else f"{path}: not a regular file")
    number, offset = 1, 0  # line number and byte offset (in the decompressed file) of the block's first line
    try:
        with _open_binary(path) as handle:
            while block := handle.readlines(block_bytes):
                try:
                    text = b"".join(block).decode("utf-8")
                except UnicodeDecodeError:
                    raise _decode_error(path, block, number, offset) from None
                lines = text.split("\n")
                if lines[-1] == "":  # the block's last line ended with a newline
                    lines.pop()
                if "\r" in text:
                    lines = [line.removesuffix("\r") for line in lines]
                if number == 1:
                    lines[0] = lines[0].removeprefix("\ufeff")
                yield lines
                number, offset = number + len(block), offset + sum(map(len, block))
    except (OSError, EOFError, zlib.error) as err:
        raise DataError(f"{path}: cannot read the file ({err})") from err
    if number == 1:
        raise DataError(f"{path}: file is empty")


def read_lines(path: str | Path) -> list[str]:
    """Read a whole UTF-8 text file (plain or .gz) into lines; the rules and errors of ``iter_line_blocks``."""
    return [line for block in iter_line_blocks(path) for line in block]


def _length_mismatch(src_path: str | Path, n_src: int, tgt_path: str | Path, n_tgt: int) -> DataError:
    return DataError(
        f"parallel files differ in length: {src_path} has {n_src} lines but {tgt_path} has "
        f"{n_tgt} lines (line {min(n_src, n_tgt) + 1} has no partner)"
    )


def read_parallel(src_path: str | Path, tgt_path: str | Path) -> tuple[list[str], list[str]]:
    """Read aligned source and target files; both must have the same number of lines.

    Raises:
        DataError: from ``read_lines``, or the line counts differ (both files and counts named).
    """
    src, tgt = read_lines(src_path), read_lines(tgt_path)
    if len(src) != len(tgt):
        raise _length_mismatch(src_path, len(src), tgt_path, len(tgt))
    return src, tgt


def _rechunk(blocks: Iterator[list[str]], size: int) -> Iterator[list[str]]:
    """Regroup blocks of lines into lists of exactly ``size`` lines (the last one may be shorter)."""
    pending: list[str] = []
    for block in blocks:
        pending.extend(block)
        while len(pending) >= size:
            yield pending[:size]
            del pending[:size]
    if pending:
        yield pending


def iter_parallel(src_path: str | Path, tgt_path: str | Path, chunk_lines: int = 100_000,
                  max_pairs: int | None = None) -> Iterator[tuple[list[str], list[str]]]:
    """Stream aligned source and target lines in chunks of ``chunk_lines`` pairs (raw text, not normalized).

    Only the first ``max_pairs`` pairs are yielded, but both files are still read to the end, so a
    line-count mismatch or bad UTF-8 anywhere is reported exactly as by ``read_parallel``.

    Raises:
        DataError: as ``read_parallel``; the length check happens when the shorter file ends.
    """
    src_chunks = _rechunk(iter_line_blocks(src_path), chunk_lines)
    tgt_chunks = _rechunk(iter_line_blocks(tgt_path), chunk_lines)
    done = 0
    for src, tgt in zip_longest(src_chunks, tgt_chunks, fillvalue=[]):
        if len(src) != len(tgt):
            n_src = done + len(src) + sum(map(len, src_chunks))
            n_tgt = done + len(tgt) + sum(map(len, tgt_chunks))
            raise _length_mismatch(src_path, n_src, tgt_path, n_tgt)
        wanted = len(src) if max_pairs is None else max(0, min(len(src), max_pairs - done))
        if wanted:
            yield (src, tgt) if wanted == len(src) else (src[:wanted], tgt[:wanted])
        done += len(src)


def normalize_space(text: str) -> str:
    """Strip both ends and collapse every run of whitespace (tabs, no-break spaces) into one space."""
    return " ".join(text.split())


# --------------------------------------------------------------------------------------------------
# Cleaning
# --------------------------------------------------------------------------------------------------


@dataclass
class CleaningReport:
    """What ``clean_pairs`` changed and dropped, rule by rule (nothing is dropped silently)."""

    n_input: int
    n_kept: int
    n_whitespace_normalized: int  # text pairs changed by stripping/collapsing spaces (kept)
    n_empty: int  # dropped: a side is empty after stripping
    n_too_long: int  # dropped: a side has more than max_len tokens
    n_bad_ratio: int  # dropped: longer side / shorter side > max_len_ratio
    max_len: int
    max_len_ratio: float

    @property
    def n_dropped(self) -> int:
        return self.n_empty + self.n_too_long + self.n_bad_ratio

    def summary(self) -> str:
        """One line for the log."""
        return (
            f"kept {self.n_kept} of {self.n_input} pairs; dropped {self.n_empty} with an empty side, "
            f"{self.n_too_long} with more than {self.max_len} tokens on a side, {self.n_bad_ratio} with "
            f"length ratio above {self.max_len_ratio:g}; whitespace normalized in {self.n_whitespace_normalized}"
        )


def cleaning_mask(src_lengths: np.ndarray, tgt_lengths: np.ndarray, *, max_len: int,
                  max_len_ratio: float) -> tuple[np.ndarray, int, int, int]:
    """Which pairs the cleaning rules keep, given token counts; vectorised, so it scales to any corpus.

    Rules, in order (a pair counts under the first rule it fails): a side has no tokens; a side has
    more than ``max_len`` tokens; ``max(n_src, n_tgt) / min(n_src, n_tgt) > max_len_ratio``.

    Args:
        src_lengths, tgt_lengths: (n_pairs,) token counts.

    Returns:
        (keep, n_empty, n_too_long, n_bad_ratio): keep is a (n_pairs,) bool mask.
    """
    src_lengths, tgt_lengths = np.asarray(src_lengths, np.int64), np.asarray(tgt_lengths, np.int64)
    empty = (src_lengths == 0) | (tgt_lengths == 0)
    too_long = ~empty & ((src_lengths > max_len) | (tgt_lengths > max_len))
    longer, shorter = np.maximum(src_lengths, tgt_lengths), np.maximum(np.minimum(src_lengths, tgt_lengths), 1)
    bad_ratio = ~empty & ~too_long & (longer / shorter > max_len_ratio)
    keep = ~(empty | too_long | bad_ratio)
    return keep, int(empty.sum()), int(too_long.sum()), int(bad_ratio.sum())


def _normalized(item: Item) -> Item:
    return normalize_space(item) if isinstance(item, str) else item  # type: ignore[return-value]


def clean_pairs(
    src: Sequence[Item],
    tgt: Sequence[Item],
    *,
    max_len: int,
    max_len_ratio: float,
    count: Callable[[Item], int] = len,
) -> tuple[list[Item], list[Item], CleaningReport]:
    """Drop pairs that would hurt training, counting each rule; normalize whitespace of text.

    Items are either sentences (``str``) or token-id lists; the rules are those of ``cleaning_mask``
    on the token counts (an empty text counts as 0 tokens).

    Args:
        src, tgt: aligned sentences or id lists.
        count: tokens in an item. The default ``len`` counts ids for id lists (characters for
            text; pass e.g. ``lambda s: len(tokenizer.encode(s))`` there).

    Returns:
        The kept source and target items (text whitespace-normalized) and the report.
    """
    if len(src) != len(tgt):
        raise DataError(f"clean_pairs got {len(src)} source but {len(tgt)} target sentences")
    norm_src, norm_tgt = [_normalized(s) for s in src], [_normalized(t) for t in tgt]
    n_changed = sum(s != raw_s or t != raw_t for s, t, raw_s, raw_t in zip(norm_src, norm_tgt, src, tgt))
    src_lengths = [count(s) if len(s) else 0 for s in norm_src]
    tgt_lengths = [count(t) if len(t) else 0 for t in norm_tgt]
    keep, n_empty, n_long, n_ratio = cleaning_mask(np.array(src_lengths, dtype=np.int64),
                                                   np.array(tgt_lengths, dtype=np.int64),
                                                   max_len=max_len, max_len_ratio=max_len_ratio)
    kept = np.flatnonzero(keep).tolist()
    report = CleaningReport(
        n_input=len(src), n_kept=len(kept), n_whitespace_normalized=n_changed, n_empty=n_empty,
        n_too_long=n_long, n_bad_ratio=n_ratio, max_len=max_len, max_len_ratio=max_len_ratio,
    )
    return [norm_src[i] for i in kept], [norm_tgt[i] for i in kept], report


# --------------------------------------------------------------------------------------------------
# Fetching Multi30k
# --------------------------------------------------------------------------------------------------


def sha256_file(path: Path) -> str:
    """Hex SHA-256 digest of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _write_verified(dest: Path, chunks: Iterable[bytes], expected: str, origin: str) -> int:
    """Stream ``chunks`` into a temp file beside ``dest``, check its SHA-256, then ``os.replace``.

    An interruption or a mismatch leaves no file behind: the temp file is removed and ``dest`` is
    either absent or complete. Concurrent writers (several DDP ranks) are safe for the same reason.

    Returns:
        The number of bytes written.
    """
    fd, tmp_name = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".part")
    tmp = Path(tmp_name)
    try:
        digest, size = hashlib.sha256(), 0
        with os.fdopen(fd, "wb") as out:
            for chunk in chunks:
                out.write(chunk)
                digest.update(chunk)
                size += len(chunk)
        if digest.hexdigest() != expected:
            raise DataError(
                f"checksum mismatch for {origin}: expected sha256 {expected}, got {digest.hexdigest()}; "
                f"{dest.name} was not saved"
            )
        os.replace(tmp, dest)
        return size
    finally:
        tmp.unlink(missing_ok=True)


def _read_chunks(handle: BinaryIO) -> Iterator[bytes]:
    while chunk := handle.read(_CHUNK):
        yield chunk


def _checked_length(chunks: Iterator[bytes], length: str | None, url: str) -> Iterator[bytes]:
    """Pass chunks through; raise if the server closed before sending Content-Length bytes."""
    received = 0
    for chunk in chunks:
        received += len(chunk)
        yield chunk
    if length is not None and length.isdigit() and received < int(length):
        raise DataError(f"downloading {url} failed: connection closed after {received} of {length} bytes")


def download_file(url: str, dest: Path, sha256: str, *, timeout: float = 60.0) -> None:
    """Download ``url`` to ``dest`` (urllib only), verifying its SHA-256; atomic, see ``_write_verified``.

    Raises:
        DataError: HTTP error, unreachable host, timeout, or checksum mismatch (nothing is left behind).
    """
    hint = "set data.source_dir (or env MULTI30K_DIR) to a local copy, or place the file there yourself"
    logger.info("downloading %s -> %s", url, dest)
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            length = response.headers.get("Content-Length")
            size = _write_verified(dest, _checked_length(_read_chunks(response), length, url), sha256, url)
    except urllib.error.HTTPError as err:
        raise DataError(f"downloading {url} failed: HTTP {err.code} {err.reason}; {hint}") from err
    except (urllib.error.URLError, OSError, http.client.HTTPException) as err:
        reason = getattr(err, "reason", err)
        raise DataError(f"downloading {url} failed: {reason}; {hint}") from err
    logger.info("saved %s (%.1f kB, sha256 verified)", dest, size / 1024)


def _fetch_multi30k_file(name: str, target: Path, source_dir: Path | None, base_url: str, timeout: float) -> None:
    """Make sure ``target/name`` exists and matches its digest: keep, copy from ``source_dir``, or download."""
    dest = target / name
    expected = MULTI30K_SHA256.get(name)
    if dest.is_file():
        if expected is not None and (actual := sha256_file(dest)) != expected:
            raise DataError(
                f"{dest}: checksum mismatch: expected sha256 {expected}, got {actual}; "
                "delete the file to fetch it again"
            )
        return
    if dest.with_suffix("").is_file():  # an uncompressed copy the user put there
        return
    if expected is None:
        raise DataError(
            f"{dest}: not found, and no checksum is known for {name!r} (known: {sorted(MULTI30K_SHA256)}); "
            "place the file there yourself or use data=custom"
        )
    local = source_dir / name if source_dir is not None else None
    if local is not None and local.is_file():
        logger.info("copying %s -> %s", local, dest)
        with open(local, "rb") as handle:
            _write_verified(dest, _read_chunks(handle), expected, str(local))
        return
    if local is not None:
        logger.info("%s not found; downloading instead", local)
    download_file(f"{base_url.rstrip('/')}/{name}", dest, expected, timeout=timeout)


def prepare_multi30k(
    target_dir: str | Path,
    langs: Sequence[str] = ("en", "de"),
    splits: Sequence[str] = MULTI30K_SPLITS,
    source_dir: str | Path | None = None,
    base_url: str = MULTI30K_URL,
    *,
    timeout: float = 60.0,
) -> Path:
    """Put ``{split}.{lang}.gz`` for every split and language into ``target_dir``, checksum-verified.

    Files already in ``target_dir`` are verified and kept; missing ones are copied from
    ``source_dir`` when it has them, else downloaded from ``base_url``.

    Returns:
        ``target_dir`` as a Path.
    """
    target = Path(target_dir)
    target.mkdir(parents=True, exist_ok=True)
    source = Path(source_dir) if source_dir else None
    for split in splits:
        for lang in langs:
            _fetch_multi30k_file(f"{split}.{lang}.gz", target, source, base_url, timeout)
    return target


# --------------------------------------------------------------------------------------------------
# Splits from config
# --------------------------------------------------------------------------------------------------


def _find_split_file(directory: Path, split: str, lang: str, cfg: DataConfig) -> Path:
    plain, compressed = directory / f"{split}.{lang}", directory / f"{split}.{lang}.gz"
    if plain.is_file() and compressed.is_file():
        raise DataError(f"both {plain} and {compressed} exist; remove one so it is clear which to read")
    for path in (compressed, plain):
        if path.is_file():
            return path
    how = (
        "run `transformer-prepare-data` or set data.source_dir"
        if cfg.corpus is CorpusKind.multi30k
        else f"a custom corpus needs files named {{split}}.{{lang}}[.gz] in data.dir={cfg.corpus_dir}"
    )
    raise DataError(f"{plain}[.gz]: file not found (data.corpus={cfg.corpus.value}, split {split!r}); {how}")


def corpus_paths(cfg: DataConfig, split: str) -> tuple[Path, Path]:
    """Source and target file of ``split``; Multi30k files are fetched and verified first."""
    directory = cfg.corpus_dir
    if cfg.corpus is CorpusKind.multi30k:
        prepare_multi30k(directory, langs=(cfg.src, cfg.tgt), splits=(split,), source_dir=cfg.source_dir)
    elif not directory.is_dir():
        raise DataError(f"data.dir={cfg.corpus_dir}: directory not found (data.corpus=custom)")
    return _find_split_file(directory, split, cfg.src, cfg), _find_split_file(directory, split, cfg.tgt, cfg)


def load_split(cfg: DataConfig, split: str) -> tuple[list[str], list[str]]:
    """Read a split as whitespace-normalized aligned sentences (nothing dropped).

    ``cfg.max_pairs`` keeps only the first N pairs of the training split (smoke runs).
    """
    src, tgt = read_parallel(*corpus_paths(cfg, split))
    if split == cfg.train_split and cfg.max_pairs is not None:
        src, tgt = src[: cfg.max_pairs], tgt[: cfg.max_pairs]
    return [normalize_space(s) for s in src], [normalize_space(t) for t in tgt]


# --------------------------------------------------------------------------------------------------
# Dataset
# --------------------------------------------------------------------------------------------------


def token_dtype(vocab_size: int) -> np.dtype:
    """The smallest unsigned integer type that holds every id below ``vocab_size``."""
    for dtype in (np.uint8, np.uint16, np.uint32):
        if vocab_size - 1 <= np.iinfo(dtype).max:
            return np.dtype(dtype)
    raise DataError(f"vocabulary of {vocab_size} entries does not fit 32-bit ids")


def _lengths(offsets: np.ndarray) -> np.ndarray:
    """``np.diff(offsets)`` as int32, without an int64 temporary (8 bytes per pair saved on large corpora)."""
    return np.subtract(offsets[1:], offsets[:-1], out=np.empty(len(offsets) - 1, np.int32), casting="unsafe")


class TranslationDataset:
    """Aligned id sequences (no BOS/EOS; ``collate`` adds those) in flat arrays.

    Pair ``i`` is ``src_tokens[src_offsets[i]:src_offsets[i + 1]]`` and the same on the target side. The
    arrays may be memory-mapped (read-only, shared between processes): nothing here copies them, and the
    length arrays cost 4 bytes per pair and side.

    Args:
        src_tokens, tgt_tokens: (n_tokens,) unsigned ids.
        src_offsets, tgt_offsets: (n_pairs + 1,) int64, starting at 0, non-decreasing, ending at the token count.
    """

    def __init__(self, src_tokens: np.ndarray, src_offsets: np.ndarray, tgt_tokens: np.ndarray,
                 tgt_offsets: np.ndarray) -> None:
        for side, tokens, offsets in (("source", src_tokens, src_offsets), ("target", tgt_tokens, tgt_offsets)):
            if offsets.ndim != 1 or len(offsets) == 0 or offsets[0] != 0 or offsets[-1] != len(tokens):
                raise DataError(f"TranslationDataset: {side} offsets must run from 0 to the token count "
                                f"{len(tokens)}; got {len(offsets)} offsets ending at {offsets[-1] if len(offsets) else None}")
        if len(src_offsets) != len(tgt_offsets):
            raise DataError(f"TranslationDataset: {len(src_offsets) - 1} source but {len(tgt_offsets) - 1} "
                            "target sequences")
        self.src_tokens, self.src_offsets = src_tokens, src_offsets
        self.tgt_tokens, self.tgt_offsets = tgt_tokens, tgt_offsets
        self.src_lengths = _lengths(src_offsets)  # (n_pairs,) int32
        self.tgt_lengths = _lengths(tgt_offsets)  # (n_pairs,) int32
        if (self.src_lengths < 0).any() or (self.tgt_lengths < 0).any():
            raise DataError("TranslationDataset: offsets must be non-decreasing")

    @classmethod
    def from_sequences(cls, src_ids: Sequence[Sequence[int]], tgt_ids: Sequence[Sequence[int]],
                       vocab_size: int | None = None) -> TranslationDataset:
        """Pack id lists into arrays of :func:`token_dtype` (of ``vocab_size``, default the largest id + 1)."""
        if len(src_ids) != len(tgt_ids):
            raise DataError(f"TranslationDataset: {len(src_ids)} source but {len(tgt_ids)} target sequences")
        arrays = []
        for seqs in (src_ids, tgt_ids):
            offsets = np.zeros(len(seqs) + 1, dtype=np.int64)
            np.cumsum([len(seq) for seq in seqs], out=offsets[1:])
            arrays.append((np.fromiter((i for seq in seqs for i in seq), dtype=np.int64, count=int(offsets[-1])),
                           offsets))
        largest = max((int(tokens.max()) for tokens, _ in arrays if len(tokens)), default=0)
        if min((int(tokens.min()) for tokens, _ in arrays if len(tokens)), default=0) < 0:
            raise DataError("TranslationDataset: token ids must be >= 0")
        dtype = token_dtype(vocab_size if vocab_size is not None else largest + 1)
        (src, src_offsets), (tgt, tgt_offsets) = arrays
        return cls(src.astype(dtype), src_offsets, tgt.astype(dtype), tgt_offsets)

    @classmethod
    def from_texts(
        cls, src: Sequence[str], tgt: Sequence[str], src_tok: Tokenizer, tgt_tok: Tokenizer
    ) -> TranslationDataset:
        """Encode aligned sentences with the source and target tokenizers."""
        return cls.from_sequences([src_tok.encode(s) for s in src], [tgt_tok.encode(t) for t in tgt],
                                  max(src_tok.vocab_size, tgt_tok.vocab_size))

    def __len__(self) -> int:
        return len(self.src_lengths)

    def __getitem__(self, index: int) -> tuple[list[int], list[int]]:
        s0, s1 = self.src_offsets[index], self.src_offsets[index + 1]
        t0, t1 = self.tgt_offsets[index], self.tgt_offsets[index + 1]
        return self.src_tokens[s0:s1].tolist(), self.tgt_tokens[t0:t1].tolist()
