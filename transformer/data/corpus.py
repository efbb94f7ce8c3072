"""Parallel corpora: read and validate, clean, and hold id sequences.

A corpus is a folder of ``{split}.{lang}`` or ``{split}.{lang}.gz`` files, one sentence per line,
UTF-8, source and target files aligned line by line (:mod:`transformer.data.splits` finds them and
fetches Multi30k). Every error names the file, and the line where there is one.
"""

from __future__ import annotations

import gzip
import logging
import shlex
import zlib
from dataclasses import dataclass
from itertools import zip_longest
from pathlib import Path
from typing import BinaryIO, Callable, Iterator, Sequence, TypeVar

import numpy as np

from transformer.data.tokenizer import Tokenizer

logger = logging.getLogger(__name__)
Item = TypeVar("Item", str, list[int])  # a sentence or its token ids


class DataError(ValueError):
    """A corpus file is missing, unreadable or inconsistent; the message names file:line."""


# --------------------------------------------------------------------------------------------------
# Reading
# --------------------------------------------------------------------------------------------------


def _is_gzip(path: Path) -> bool:
    """Whether ``path`` is gzip-compressed (by its magic bytes, not its name)."""
    with open(path, "rb") as probe:
        return probe.read(2) == b"\x1f\x8b"


def not_plain_text(raw: bytes, number: int, name: str | Path, compressed: bool = False) -> str | None:
    """What a file's line ``number`` (bytes ``raw``) shows it to be, when that is not UTF-8 text but one of two common
    mistakes: UTF-16 (as Windows' editors save "Unicode"), or a file that is not text; None for anything else. The
    fix is a shell command on the file, ``name`` (gzip-``compressed``: decompressed, then compressed again)."""
    if number == 1 and raw.startswith((b"\xff\xfe", b"\xfe\xff")):
        return ("UTF-16, not UTF-8 (it begins with UTF-16's byte-order mark); convert it: "
                + _filtered(name, compressed, "iconv -f UTF-16 -t UTF-8"))
    if (nul := raw.find(b"\0")) >= 0:
        return (f"a NUL byte (byte {nul} of the line): UTF-16 without a byte-order mark, or not a text file? A text "
                "file with stray NUL bytes can do without them: " + _filtered(name, compressed, "tr -d '\\000'"))
    return None


def _filtered(name: str | Path, compressed: bool, command: str) -> str:
    """The shell line that writes ``name`` through ``command`` into NEW (compressed again if it was)."""
    quoted = shlex.quote(str(name))
    return f"gzip -dc {quoted} | {command} | gzip > NEW.gz" if compressed else f"{command} < {quoted} > NEW"


def _decode_error(path: Path, block: list[bytes], number: int, offset: int, compressed: bool) -> DataError:
    """The error for the first line of ``block`` (starting at line ``number``, byte ``offset``) that is not UTF-8
    text: not UTF-8, or UTF-16 or a NUL byte (:func:`not_plain_text`)."""
    for raw in block:
        if (found := not_plain_text(raw, number, path, compressed)) is not None:
            return DataError(f"{path}:{number}: {found}")
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError as err:
            return DataError(f"{path}:{number}: invalid UTF-8 at byte {offset + err.start} "
                             f"(byte {err.start} of the line): {err.reason}")
        number, offset = number + 1, offset + len(raw)
    return DataError(f"{path}:{number}: invalid UTF-8")  # unreachable: one of the block's lines is bad


def iter_line_blocks(path: str | Path, block_bytes: int = 1 << 22) -> Iterator[list[str]]:
    """Stream a UTF-8 text file (plain or .gz) as lists of lines without their line terminators.

    Lines end at ``\\n`` only (a ``\\r`` before it is dropped), so Unicode line separators inside
    a sentence do not shift the alignment. A UTF-8 byte-order mark at the start is dropped. Each block
    holds about ``block_bytes`` of text and is decoded in one call (per line only to locate an error),
    which keeps reading large corpora fast without holding them in memory.

    Raises:
        DataError: the file is missing, empty, not valid gzip, not UTF-8 (with line and byte offset), or has a NUL
            byte (UTF-16 or binary; :func:`not_plain_text`).
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: file not found" if not path.exists() else f"{path}: not a regular file")
    number, offset = 1, 0  # line number and byte offset (in the decompressed file) of the block's first line
    try:
        compressed = _is_gzip(path)
        with (gzip.open(path, "rb") if compressed else open(path, "rb")) as handle:
            while block := handle.readlines(block_bytes):
                try:
                    text = b"".join(block).decode("utf-8")
                except UnicodeDecodeError:
                    raise _decode_error(path, block, number, offset, compressed) from None
                lines = text.split("\n")
                if lines[-1] == "":  # the block's last line ended with a newline
                    lines.pop()
                if "\0" in text:  # UTF-8 but not text: the line is found as a bad line is
                    raise _decode_error(path, block, number, offset, compressed)
                if "\r" in text:
                    lines = [line.removesuffix("\r") for line in lines]
                if number == 1:
                    lines[0] = lines[0].removeprefix("\ufeff")
                    if "\r" in lines[0]:
                        logger.warning("%s:1: a carriage return (\\r) inside the line: lines end only at \\n, so a "
                                       "file with CR-only line endings (classic Mac) reads as one line; convert it "
                                       "with tr '\\r' '\\n' < FILE > NEW", path)
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
    def lines(n: int) -> str:
        return f"{n} line" if n == 1 else f"{n} lines"

    return DataError(
        f"parallel files differ in length: {src_path} has {lines(n_src)} but {tgt_path} has "
        f"{lines(n_tgt)} (line {min(n_src, n_tgt) + 1} has no partner)"
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
        digest: a digest of the four arrays' contents, or None.
    """

    def __init__(self, src_tokens: np.ndarray, src_offsets: np.ndarray, tgt_tokens: np.ndarray,
                 tgt_offsets: np.ndarray, digest: str | None = None) -> None:
        for side, tokens, offsets in (("source", src_tokens, src_offsets), ("target", tgt_tokens, tgt_offsets)):
            if offsets.ndim != 1 or len(offsets) == 0 or offsets[0] != 0 or offsets[-1] != len(tokens):
                raise DataError(f"TranslationDataset: {side} offsets must run from 0 to the token count "
                                f"{len(tokens)}; got {len(offsets)} offsets ending at {offsets[-1] if len(offsets) else None}")
        if len(src_offsets) != len(tgt_offsets):
            raise DataError(f"TranslationDataset: {len(src_offsets) - 1} source but {len(tgt_offsets) - 1} "
                            "target sequences")
        self.src_tokens, self.src_offsets = src_tokens, src_offsets
        self.tgt_tokens, self.tgt_offsets = tgt_tokens, tgt_offsets
        self.digest = digest  # of the arrays' contents where known (the data cache's), so a resume can compare them
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
        """Pair ``index`` as (source ids, target ids); a negative index counts from the end, as for a list."""
        n = len(self)
        if not -n <= index < n:
            raise IndexError(f"pair {index} of a dataset of {n} pairs")
        index %= n
        s0, s1 = self.src_offsets[index], self.src_offsets[index + 1]
        t0, t1 = self.tgt_offsets[index], self.tgt_offsets[index + 1]
        return self.src_tokens[s0:s1].tolist(), self.tgt_tokens[t0:t1].tolist()
