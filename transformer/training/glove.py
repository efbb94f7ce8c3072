"""Read GloVe-format word vectors and initialise embedding rows from them.

Accepted files: plain text (``word v1 … vd`` per line), gzipped text (``.gz``), a member of a ``.zip``
(``glove.6B.zip`` with the member chosen by dimension, or ``archive.zip:member.txt``), and text with a
word2vec header line (``N D``). Files are streamed: with a vocabulary given, only the vectors of needed
words are parsed and kept, so the 400k-line Stanford files never become a 400k-entry dict.

:func:`init_model_embeddings` maps ``model.glove`` onto a model's source and/or target embeddings.
"""

from __future__ import annotations

import gzip
import io
import logging
import zipfile
import zlib
from collections.abc import Collection, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor, nn

from transformer.config import ConfigError, GloveConfig, GloveSide

if TYPE_CHECKING:  # annotations only
    from transformer.data.corpus import TranslationDataset
    from transformer.data.tokenizer import Tokenizer
    from transformer.model.transformer import Transformer

log = logging.getLogger(__name__)


_FLOAT32_MAX = float(torch.finfo(torch.float32).max)


class GloveError(ValueError):
    """A vector file is missing, malformed or of the wrong dimension; the message names file and line."""


@dataclass
class Coverage:
    """How much of a vocabulary found a vector."""

    n_types: int  # vocabulary entries considered (special ids excluded)
    n_types_found: int
    type_rate: float  # n_types_found / n_types
    token_rate: float | None  # share of corpus tokens whose type was found (when counts were given)

    def __str__(self) -> str:
        tokens = "" if self.token_rate is None else f", {100 * self.token_rate:.1f} % of the training tokens"
        return f"{self.n_types_found} of {self.n_types} vocabulary entries found ({100 * self.type_rate:.1f} %{tokens})"


@dataclass
class Vectors:
    """Vectors read from a file: ``matrix[index[word]]`` is the vector of ``word``."""

    path: str
    dim: int
    index: dict[str, int]
    matrix: Tensor  # (n_words, dim) float32


def _split_spec(path: str | Path) -> tuple[Path, str | None]:
    """``archive.zip:member.txt`` -> (archive path, member); any other path -> (path, None)."""
    text = str(path)
    marker = text.lower().find(".zip:")
    if marker >= 0:
        return Path(text[: marker + 4]), text[marker + 5 :]
    return Path(text), None


def _header_dim(first_line: str) -> int | None:
    """D when the line is a word2vec header ``N D``, else None."""
    parts = first_line.split()
    if len(parts) == 2 and parts[0].isdigit() and parts[1].isdigit():
        return int(parts[1])
    return None


def _line_dim(line: str) -> int:
    """Dimension of a vector file from its first line (header or vector line)."""
    header = _header_dim(line)
    return header if header is not None else len(line.rstrip().split(" ")) - 1


def _pick_member(archive: zipfile.ZipFile, zip_path: Path, dim: int | None) -> str:
    """The text member to read: the only one, or the one whose vectors have ``dim`` entries."""
    members = [n for n in archive.namelist() if not n.endswith("/")]
    if len(members) == 1:
        return members[0]
    if dim is None:
        raise GloveError(f"{zip_path}: holds {len(members)} files {members}; name one as "
                         f"'{zip_path}:MEMBER' or give the expected dimension")
    dims = {}
    for name in members:
        with archive.open(name) as raw:
            dims[name] = _line_dim(io.TextIOWrapper(raw, encoding="utf-8").readline())
    matching = [n for n, d in dims.items() if d == dim]
    if not matching:
        raise GloveError(f"{zip_path}: no member has {dim}-dimensional vectors (found {dims})")
    if len(matching) > 1:
        raise GloveError(f"{zip_path}: holds {len(matching)} files of {dim}-dimensional vectors {matching}; name one "
                         f"as '{zip_path}:MEMBER'")
    return matching[0]


@contextmanager
def _open_lines(path: str | Path, dim: int | None) -> Iterator[tuple[str, Iterator[str]]]:
    """Yield (display name, text lines) for a plain, gzipped or zipped vector file; a file that cannot be read
    (truncated, not the archive its name says, a folder) raises ``GloveError`` naming it, also while reading."""
    file_path, member = _split_spec(path)
    if not file_path.exists():
        raise GloveError(f"{file_path}: vector file not found")
    try:
        if file_path.suffix.lower() == ".zip":
            with zipfile.ZipFile(file_path) as archive:
                if member is None:
                    member = _pick_member(archive, file_path, dim)
                elif member not in archive.namelist():
                    raise GloveError(f"{file_path}: has no member {member!r} (members: {archive.namelist()})")
                with archive.open(member) as raw:
                    yield f"{file_path}:{member}", _decoded(raw, f"{file_path}:{member}")
        elif file_path.suffix.lower() == ".gz":
            with gzip.open(file_path, "rb") as raw:
                yield str(file_path), _decoded(raw, str(file_path))
        else:
            with open(file_path, "rb") as raw:
                yield str(file_path), _decoded(raw, str(file_path))
    except (OSError, EOFError, zlib.error, zipfile.BadZipFile) as error:
        raise GloveError(f"{file_path}: cannot read the vector file ({error})") from error


def _decoded(raw: Iterable[bytes], name: str) -> Iterator[str]:
    """The lines of ``raw`` as text, each decoded alone: an invalid byte is named by its line and place in it."""
    for line_no, line in enumerate(raw, start=1):
        if line_no == 1:
            line = line.removeprefix(b"\xef\xbb\xbf")  # a byte-order mark is not part of the first word
        try:
            yield line.decode("utf-8")
        except UnicodeDecodeError as error:
            raise GloveError(f"{name}:{line_no}: not UTF-8 text (byte {error.start + 1} of the line: "
                             f"{error.reason})") from None


def vector_dim(path: str | Path, expected_dim: int | None = None) -> int:
    """The vectors' dimension, from the first line (cheap; for checks before training), and the second where the
    first is a word2vec header: the two must agree.

    ``expected_dim`` only chooses the member of a multi-file ``.zip`` such as ``glove.6B.zip``.
    """
    with _open_lines(path, expected_dim) as (name, lines):
        lines = iter(lines)
        first = next(lines, "")
        header = _header_dim(first)
        second = next(lines, "") if header is not None else ""
        if not first.strip():
            raise GloveError(f"{name}:1: empty vector file")
        if second.strip():
            try:
                _parse_values(name, 2, second.rstrip().split(" "), header)
            except GloveError as error:
                tabs = _TABS if "\t" in second else ""
                raise GloveError(f"{error}{tabs}; the header (line 1) announces {header}-dimensional vectors") from None
        if _line_dim(first) < 1:
            raise _no_numbers(name, 1, first)
        return _line_dim(first)


_TABS = " (tabs separate its fields: GloVe's format separates them by single spaces)"


def _no_numbers(name: str, line_no: int, line: str) -> GloveError:
    """The error of a vector line without numbers after its word: a word alone, or fields not separated by spaces."""
    tabs = _TABS if "\t" in line else ""
    return GloveError(f"{name}:{line_no}: expected a word and numbers separated by spaces, found "
                      f"{len(line.split())} field(s){tabs}")


def _parse_values(name: str, line_no: int, parts: list[str], dim: int) -> tuple[str, list[float]]:
    """Split ``word v1 … vd`` (the word may contain spaces) into the word and its ``dim`` numbers."""
    if len(parts) < dim + 1:
        raise GloveError(f"{name}:{line_no}: expected a word and {dim} numbers, found {len(parts) - 1} values")
    head, tail = parts[: len(parts) - dim], parts[len(parts) - dim :]
    for extra in head[1:]:  # a multi-word entry (glove.840B has a few) may not contain numbers
        try:
            float(extra)
        except ValueError:
            continue
        raise GloveError(f"{name}:{line_no}: expected a word and {dim} numbers, found {len(parts) - 1} values")
    try:
        values = [float(v) for v in tail]
    except ValueError as error:
        raise GloveError(f"{name}:{line_no}: malformed number ({error})") from error
    if not all(abs(v) <= _FLOAT32_MAX for v in values):  # also false for nan
        raise GloveError(f"{name}:{line_no}: the vector of {' '.join(head)!r} holds a number that is not a finite "
                         "float32 (nan, inf or beyond ±3.4e38)")
    return " ".join(head), values


def read_vectors(path: str | Path, expected_dim: int | None = None, words: Collection[str] | None = None) -> Vectors:
    """Read a vector file, keeping only ``words`` when given (first occurrence of a word wins).

    Every line is checked for the right number of fields; numbers are parsed only for kept words.

    Raises:
        GloveError: file missing, dimension != ``expected_dim``, or a malformed line (names file:line).
    """
    wanted = None if words is None else set(words)
    index: dict[str, int] = {}
    rows: list[list[float]] = []
    with _open_lines(path, expected_dim) as (name, lines):
        dim = None
        for line_no, line in enumerate(lines, start=1):
            line = line.rstrip()
            if not line:
                continue
            if dim is None:
                dim = _header_dim(line) if line_no == 1 else None
                if dim is None:
                    dim = len(line.split(" ")) - 1
                else:
                    continue  # word2vec header
                if dim < 1:
                    raise _no_numbers(name, line_no, line)
                if expected_dim is not None and dim != expected_dim:
                    raise GloveError(f"{name}:{line_no}: vectors have {dim} dimensions, "
                                     f"but {expected_dim} are needed (model.d_model)")
            word = line.split(" ", 1)[0]
            simple = line.count(" ") == dim  # the common case: one-token word, right count
            if simple and wanted is not None and word not in wanted:
                continue
            word, values = _parse_values(name, line_no, line.split(" "), dim)
            if (wanted is None or word in wanted) and word not in index:
                index[word] = len(rows)
                rows.append(values)
        if dim is None:
            raise GloveError(f"{name}: no vectors in file")
    matrix = torch.tensor(rows, dtype=torch.float32) if rows else torch.zeros(0, dim)
    return Vectors(name, dim, index, matrix)


def _candidates(piece: str) -> list[str]:
    """Words to look up for a vocabulary piece: exact, lowercase, then without SentencePiece's ``▁``."""
    found = [piece, piece.lower()]
    if piece.startswith("\u2581") and len(piece) > 1:
        found += [piece[1:], piece[1:].lower()]
    return found


def init_embedding_from_glove(embedding: nn.Embedding, pieces: list[str], path: str | Path, *,
                              rescale: bool, counts: dict[str, int] | None = None, freeze: bool = False,
                              skip_ids: Collection[int] = ()) -> Coverage:
    """Copy vectors into the rows of ``embedding`` whose piece has one; other rows keep their init.

    Matching per piece: exact, then lowercase; a SentencePiece piece ``▁word`` also matches ``word``.
    Rows in ``skip_ids`` and the padding row are neither changed nor counted. Vectors are copied as
    they are (the model multiplies embeddings by √d_model).

    Args:
        embedding: (vocab, d) embedding; ``d`` must equal the vectors' dimension.
        pieces: the piece of every id (``len(pieces) == vocab``).
        path: vector file (see module docstring for accepted forms).
        counts: piece -> corpus frequency, for the token coverage rate.
        rescale: scale the copied vectors to the standard deviation the rows had before (the random
            init), so pretrained rows are not several times larger than the others after √d_model.
        freeze: stop training the WHOLE embedding weight (``requires_grad=False``), not only the
            GloVe rows; with tied or shared embeddings that also freezes what shares the weight.
        skip_ids: ids to leave alone (special tokens).

    Returns:
        :class:`Coverage` of the considered pieces.
    """
    vocab, dim = embedding.weight.shape
    if len(pieces) != vocab:
        raise ValueError(f"init_embedding_from_glove: {len(pieces)} pieces for an embedding of {vocab} rows")
    skip = set(skip_ids) | ({embedding.padding_idx} if embedding.padding_idx is not None else set())
    considered = [i for i in range(vocab) if i not in skip]
    wanted = {word for i in considered for word in _candidates(pieces[i])}
    vectors = read_vectors(path, expected_dim=dim, words=wanted)
    found: list[int] = []
    with torch.no_grad():
        init_std = embedding.weight[considered].std().item() if considered else 1.0
        for i in considered:
            word = next((w for w in _candidates(pieces[i]) if w in vectors.index), None)
            if word is not None:
                embedding.weight[i] = vectors.matrix[vectors.index[word]].to(embedding.weight.dtype)
                found.append(i)
        spread = embedding.weight[found].std().item() if len(found) > 1 else 0.0
        if rescale and spread > 0.0:  # vectors all alike (spread 0) have no scale to match
            embedding.weight[found] *= init_std / spread
    if freeze:
        embedding.weight.requires_grad_(False)
    token_rate = None
    if counts is not None:
        total = sum(counts.get(pieces[i], 0) for i in considered)
        hit = sum(counts.get(pieces[i], 0) for i in found)
        token_rate = hit / total if total else 0.0
    n = len(considered)
    return Coverage(n, len(found), len(found) / n if n else 0.0, token_rate)


# --------------------------------------------------------------------------------------------------
# A model's embeddings
# --------------------------------------------------------------------------------------------------


def check_dimension(glove: GloveConfig, d_model: int) -> None:
    """Fail before any work when the vector file's dimension cannot match the model (no-op without a path)."""
    if glove.path is None:
        return
    try:
        dim = vector_dim(glove.path, expected_dim=d_model)
    except GloveError as error:  # the file named: the key that names it, too
        raise GloveError(f"model.glove.path: {error}") from None
    if dim != d_model:
        raise ConfigError(
            f"model.glove.path: {glove.path} holds {dim}-dimensional vectors but model.d_model={d_model}; "
            f"use a model whose d_model is {dim} ("
            + (f"model=glove{dim}, or " if dim in (50, 300) else "")  # the configs/model files that exist
            + f"model.d_model={dim}) or vectors of size {d_model}"
        )


def _sides(model: Transformer, glove: GloveConfig) -> list[tuple[str, nn.Embedding]]:
    """``(side, embedding)`` for the sides ``glove.side`` names, source first."""
    embeddings = [("src", model.src_token_embedding), ("tgt", model.tgt_token_embedding)]
    return [(side, embedding) for side, embedding in embeddings if glove.side in (GloveSide(side), GloveSide.both)]


def piece_counts(tokens: np.ndarray, tok: Tokenizer) -> dict[str, int]:
    """Corpus frequency of every piece that occurs in ``tokens`` (an id array of one side)."""
    counts = np.bincount(tokens, minlength=tok.vocab_size)
    return {tok.id_to_piece(i): int(c) for i, c in enumerate(counts.tolist()) if c}


def init_model_embeddings(model: Transformer, glove: GloveConfig, src_tok: Tokenizer, tgt_tok: Tokenizer,
                          train_set: TranslationDataset) -> dict[str, Coverage]:
    """Copy GloVe vectors into the embeddings of the side(s) ``glove.side`` names and log each side's coverage.

    Each side is matched with its own tokenizer's pieces and its token coverage is counted on its own side
    of the training data, also when a joint vocabulary makes ``src_tok`` and ``tgt_tok`` one object.
    Special tokens keep their random init.

    Returns:
        ``{"src": Coverage, "tgt": Coverage}`` for the initialised sides; empty without ``glove.path``.
    """
    if glove.path is None:
        return {}
    tokenizers = {"src": (src_tok, train_set.src_tokens), "tgt": (tgt_tok, train_set.tgt_tokens)}
    coverages = {}
    for side, embedding in _sides(model, glove):
        tok, tokens = tokenizers[side]
        coverages[side] = init_embedding_from_glove(
            embedding, tok.pieces(), glove.path, counts=piece_counts(tokens, tok), freeze=glove.freeze,
            rescale=glove.rescale, skip_ids={tok.pad_id, tok.unk_id, tok.bos_id, tok.eos_id},
        )
        if coverages[side].n_types_found == 0:
            log.warning("GloVe %s embeddings: no vocabulary entry has a vector in %s, so they stay random: is it "
                        "a file of the %s language?", side, glove.path, "source" if side == "src" else "target")
        else:
            log.info("GloVe %s embeddings: %s", side, coverages[side])
    return coverages


def refreeze_model_embeddings(model: Transformer, glove: GloveConfig) -> None:
    """On resume, freeze again what :func:`init_model_embeddings` froze (``requires_grad`` is not saved),
    so the optimizer gets the same parameters as the run that wrote the checkpoint.

    Args:
        glove: the checkpoint's own ``model.glove`` (what was frozen), not the resuming config's.
    """
    if glove.path is not None and glove.freeze:
        for _, embedding in _sides(model, glove):
            embedding.weight.requires_grad_(False)
