"""Tokenizers: one small interface, a SentencePiece and a word-level implementation.

Special ids are fixed project-wide and defined only here:

====  =========  ==========================================
 id    piece      meaning
====  =========  ==========================================
 0     ``<pad>``  padding (ignored by loss and attention)
 1     ``<unk>``  unknown piece/word
 2     ``<s>``    beginning of sentence (decoder input start)
 3     ``</s>``   end of sentence (decoder output end)
====  =========  ==========================================

``encode`` never adds BOS/EOS (``batching.collate`` does); ``decode`` drops pad/BOS/EOS and
shows unknowns (SentencePiece as `` ⁇ ``, word level as ``<unk>``).
Both tokenizers serialize to a ``state_dict`` of plain values and tensors, so they live inside a
``torch.load(weights_only=True)`` checkpoint and a run can be translated without its work directory.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
from collections import Counter
from pathlib import Path
from typing import Iterable, Protocol, Sequence

import sentencepiece as spm
import torch

from transformer.config import TokenizerConfig, TokenizerKind
from transformer.files import dying_at_fault_point

PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3
PAD_PIECE, UNK_PIECE, BOS_PIECE, EOS_PIECE = "<pad>", "<unk>", "<s>", "</s>"
SPECIAL_PIECES = (PAD_PIECE, UNK_PIECE, BOS_PIECE, EOS_PIECE)  # indexed by id
_SKIPPED_IDS = frozenset((PAD_ID, BOS_ID, EOS_ID))  # decode drops these; <unk> stays visible


class TokenizerError(ValueError):
    """A tokenizer cannot be trained or restored; the message says what to change."""


class Tokenizer(Protocol):
    """What the rest of the code needs from a tokenizer."""

    vocab_size: int
    pad_id: int
    unk_id: int
    bos_id: int
    eos_id: int

    def encode(self, text: str) -> list[int]: ...  # no BOS/EOS added

    def encode_batch(self, texts: list[str], num_threads: int = 1) -> list[list[int]]: ...  # encode each text

    def decode(self, ids: Sequence[int]) -> str: ...  # pad/BOS/EOS skipped, text detokenized

    def id_to_piece(self, idx: int) -> str: ...

    def pieces(self) -> list[str]: ...  # the piece of every id, in id order

    def state_dict(self) -> dict: ...


class _SpecialIds:
    """The fixed special ids as attributes (shared by both implementations)."""

    pad_id: int = PAD_ID
    unk_id: int = UNK_ID
    bos_id: int = BOS_ID
    eos_id: int = EOS_ID


# --------------------------------------------------------------------------------------------------
# SentencePiece
# --------------------------------------------------------------------------------------------------


class SentencePieceTokenizer(_SpecialIds):
    """A trained SentencePiece model (BPE or unigram), held as its serialized proto."""

    def __init__(self, model_proto: bytes) -> None:
        self._proto = bytes(model_proto)
        self._sp = spm.SentencePieceProcessor(model_proto=self._proto)
        self.vocab_size = self._sp.get_piece_size()
        for idx, piece in enumerate(SPECIAL_PIECES):
            if self._sp.id_to_piece(idx) != piece:
                raise TokenizerError(
                    f"SentencePiece model has {self._sp.id_to_piece(idx)!r} at id {idx}, expected {piece!r} "
                    "(train it with build_tokenizers so the special ids are fixed)"
                )

    @property
    def model_proto(self) -> bytes:
        """The serialized SentencePiece model (what ``spm.SentencePieceProcessor(model_file=...)`` reads)."""
        return self._proto

    def encode(self, text: str) -> list[int]:
        return self._sp.encode(text, out_type=int)

    def encode_batch(self, texts: list[str], num_threads: int = 1) -> list[list[int]]:
        """``encode`` for many texts at once, in ``num_threads`` C++ threads (one call instead of one per text)."""
        return self._sp.encode(texts, out_type=int, num_threads=num_threads)

    def encode_sampled(self, texts: list[str], alpha: float, seed: int) -> list[list[int]]:
        """A random segmentation of each text, the same for the same ``seed``: BPE-dropout with drop rate
        ``alpha`` for a BPE model (Provilkov et al. 2020), subword sampling with smoothing ``alpha`` for a
        unigram one (Kudo 2018). SentencePiece's generator is process-wide: it is reseeded here and the texts
        are encoded in this one thread, which is what makes the result a function of ``seed``."""
        spm.set_random_generator_seed(seed)
        return self._sp.encode(texts, out_type=int, enable_sampling=True, alpha=alpha, nbest_size=-1, num_threads=1)

    def decode(self, ids: Sequence[int]) -> str:
        return self._sp.decode([int(i) for i in ids if int(i) not in _SKIPPED_IDS])

    def id_to_piece(self, idx: int) -> str:
        return self._sp.id_to_piece(int(idx))

    def pieces(self) -> list[str]:
        return [self._sp.id_to_piece(i) for i in range(self.vocab_size)]

    def state_dict(self) -> dict:
        # uint8 tensor: compact, and loadable with torch.load(weights_only=True).
        proto = torch.frombuffer(bytearray(self._proto), dtype=torch.uint8).clone()
        return {"kind": TokenizerKind.sentencepiece.value, "model_proto": proto}


def train_sentencepiece(texts: Iterable[str], cfg: TokenizerConfig) -> bytes:
    """Train a SentencePiece model in memory and return its serialized proto.

    Deterministic: ``num_threads`` is fixed at 1 because unigram training gives different pieces
    for different thread counts (BPE does not). Logging is silenced.

    Raises:
        TokenizerError: the corpus is too small for ``cfg.vocab_size``, or it has more characters than that.
    """
    writer = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(texts),
            model_writer=writer,
            model_type=cfg.model_type.value,
            vocab_size=cfg.vocab_size,
            character_coverage=cfg.character_coverage,
            pad_id=PAD_ID, unk_id=UNK_ID, bos_id=BOS_ID, eos_id=EOS_ID,
            pad_piece=PAD_PIECE, unk_piece=UNK_PIECE, bos_piece=BOS_PIECE, eos_piece=EOS_PIECE,
            num_threads=1,
            minloglevel=2,
        )
    except RuntimeError as err:
        too_small = re.search(r"smaller than required_chars\. \d+ vs (\d+)", str(err))
        if too_small:  # every character kept needs a piece of its own, as do <pad>, <unk>, <s> and </s>
            raise TokenizerError(
                f"data.tokenizer.vocab_size={cfg.vocab_size} is too small for the characters of the training text: "
                f"set data.tokenizer.vocab_size >= {too_small.group(1)} (or a lower "
                "data.tokenizer.character_coverage, which maps rare characters to <unk>)") from err
        found = re.search(r"value <= (\d+)", str(err))
        if "Vocabulary size" in str(err):
            hint = f" (at most {found.group(1)} for this corpus)" if found else ""
            raise TokenizerError(
                f"data.tokenizer.vocab_size={cfg.vocab_size} is too large for the training text; "
                f"set a smaller data.tokenizer.vocab_size{hint}"
            ) from err
        raise TokenizerError(f"SentencePiece training failed: {err}") from err
    return writer.getvalue()


# --------------------------------------------------------------------------------------------------
# Word level
# --------------------------------------------------------------------------------------------------

# Words keep inner hyphens and apostrophes ("well-known", "o'clock") as GloVe does; numbers keep
# their decimal/thousands separators; every other non-space character is a token of its own.
_TOKEN_RE = re.compile(r"\d+(?:[.,:]\d+)+|\w+(?:[-'’]\w+)*|[^\w\s]")
# English clitics split off like the Stanford tokenizer behind GloVe: "don't" -> "do n't".
_NT_RE = re.compile(r"^(\w+)(n['’]t)$", re.IGNORECASE)
_CLITIC_RE = re.compile(r"^(\w+)(['’](?:s|re|ve|ll|d|m))$", re.IGNORECASE)
_CLITICS = frozenset({"n't", "'s", "'re", "'ve", "'ll", "'d", "'m"})
_NO_SPACE_BEFORE = frozenset(",.!?;:)]}%…")
_NO_SPACE_AFTER = frozenset("([{$#")
# closing quote -> the opening quotes it closes (German „…“ and ‚…‘, English “…”, ‘…’, straight "…")
_QUOTE_CLOSES = {'"': '"', "'": "'", "”": "“", "“": "„", "’": "‘", "‘": "‚", "»": "«", "«": "»"}
_QUOTE_OPENERS = frozenset('"\'`„“‘‚«»')


def word_tokenize(text: str, lowercase: bool = False) -> list[str]:
    """Split text into words, numbers, clitics and single punctuation marks."""
    if lowercase:
        text = text.lower()
    tokens: list[str] = []
    for token in _TOKEN_RE.findall(text):
        split = _NT_RE.match(token) or _CLITIC_RE.match(token)
        tokens.extend(split.groups() if split else (token,))
    return tokens


def word_detokenize(tokens: Sequence[str]) -> str:
    """Join tokens with ordinary spacing.

    No space before ``, . ! ? ; : ) ] } %`` or a clitic (``'s``, ``n't``), none after ``( [ { $ #``;
    a quote mark closes the innermost open quote it matches (no space before it), an apostrophe
    after a word ending in s is a plural possessive, any other quote mark opens a quote (no space
    after it).
    """
    out: list[str] = []
    glue_next = True  # no space before the first token
    open_quotes: list[str] = []
    for token in tokens:
        glue = glue_next or token in _NO_SPACE_BEFORE or token.lower().replace("’", "'") in _CLITICS
        glue_next = token in _NO_SPACE_AFTER
        if open_quotes and _QUOTE_CLOSES.get(token) == open_quotes[-1]:
            open_quotes.pop()
            glue = True
        elif token == "'" and out and out[-1][-1:] in ("s", "S"):  # plural possessive: "dogs' toys"
            glue = True
        elif token in _QUOTE_OPENERS:
            open_quotes.append(token)
            glue_next = True
        out.append(token if glue else " " + token)
    return "".join(out)


class WordTokenizer(_SpecialIds):
    """Whole-word vocabulary (full GloVe coverage); unknown words map to ``<unk>``."""

    def __init__(self, pieces: Sequence[str], lowercase: bool = False) -> None:
        if tuple(pieces[: len(SPECIAL_PIECES)]) != SPECIAL_PIECES:
            raise TokenizerError(f"word vocabulary must start with {SPECIAL_PIECES}, got {tuple(pieces[:4])}")
        self._pieces = list(pieces)
        self._index = {piece: idx for idx, piece in enumerate(self._pieces)}
        if len(self._index) != len(self._pieces):
            raise TokenizerError("word vocabulary has duplicate entries")
        self.lowercase = lowercase
        self.vocab_size = len(self._pieces)

    @classmethod
    def train(cls, texts: Iterable[str], cfg: TokenizerConfig) -> WordTokenizer:
        """Keep the ``cfg.vocab_size - 4`` most frequent words seen at least ``cfg.min_freq`` times
        (ties broken alphabetically, so the vocabulary is deterministic)."""
        counts = Counter(tok for text in texts for tok in word_tokenize(text, cfg.lowercase))
        words = sorted((w for w, c in counts.items() if c >= cfg.min_freq), key=lambda w: (-counts[w], w))
        words = [w for w in words if w not in SPECIAL_PIECES][: max(0, cfg.vocab_size - len(SPECIAL_PIECES))]
        return cls([*SPECIAL_PIECES, *words], lowercase=cfg.lowercase)

    def encode(self, text: str) -> list[int]:
        return [self._index.get(tok, UNK_ID) for tok in word_tokenize(text, self.lowercase)]

    def encode_batch(self, texts: list[str], num_threads: int = 1) -> list[list[int]]:
        """``encode`` for many texts. Python regexes gain nothing from threads (the GIL), so ``num_threads``
        must be 1; ``data.cache`` runs word-level encoding in worker processes instead."""
        if num_threads != 1:
            raise TokenizerError(f"WordTokenizer.encode_batch runs in one thread, got num_threads={num_threads}")
        return [self.encode(text) for text in texts]

    def decode(self, ids: Sequence[int]) -> str:
        return word_detokenize([self._pieces[int(i)] for i in ids if int(i) not in _SKIPPED_IDS])

    def id_to_piece(self, idx: int) -> str:
        return self._pieces[int(idx)]

    def pieces(self) -> list[str]:
        return list(self._pieces)

    def state_dict(self) -> dict:
        return {"kind": TokenizerKind.word.value, "pieces": list(self._pieces), "lowercase": self.lowercase}


# --------------------------------------------------------------------------------------------------
# Building and restoring
# --------------------------------------------------------------------------------------------------


def tokenizer_from_state(state: dict) -> Tokenizer:
    """Rebuild a tokenizer from ``state_dict()`` output (e.g. read from a checkpoint)."""
    kind = state.get("kind")
    if kind == TokenizerKind.sentencepiece.value:
        proto = state["model_proto"]
        data = proto.numpy().tobytes() if isinstance(proto, torch.Tensor) else bytes(proto)
        return SentencePieceTokenizer(data)
    if kind == TokenizerKind.word.value:
        return WordTokenizer(state["pieces"], lowercase=bool(state["lowercase"]))
    valid = [k.value for k in TokenizerKind]
    raise TokenizerError(f"unknown tokenizer kind {kind!r} in state (expected one of {valid})")


def build_tokenizers(cfg: TokenizerConfig, src_texts: list[str], tgt_texts: list[str]) -> tuple[Tokenizer, Tokenizer]:
    """Train the source and target tokenizers on the given training text.

    With ``cfg.joint`` one tokenizer is trained on both sides (source text first) and returned twice
    (the same object). Nothing is saved: ``data.cache`` keeps trained tokenizers, keyed by corpus and settings.
    """
    if cfg.kind is TokenizerKind.sentencepiece:
        if cfg.joint:
            joint = SentencePieceTokenizer(train_sentencepiece([*src_texts, *tgt_texts], cfg))
            return joint, joint
        return (SentencePieceTokenizer(train_sentencepiece(src_texts, cfg)),
                SentencePieceTokenizer(train_sentencepiece(tgt_texts, cfg)))
    if cfg.joint:
        joint_words = WordTokenizer.train([*src_texts, *tgt_texts], cfg)
        return joint_words, joint_words
    return WordTokenizer.train(src_texts, cfg), WordTokenizer.train(tgt_texts, cfg)


# --------------------------------------------------------------------------------------------------
# Files and identity
# --------------------------------------------------------------------------------------------------


def tokenizer_digest(tok: Tokenizer) -> str:
    """SHA-256 of what determines a tokenizer's ids (the SentencePiece proto, or the word list and casing)."""
    state = tok.state_dict()
    digest = hashlib.sha256(state["kind"].encode())
    if state["kind"] == TokenizerKind.sentencepiece.value:
        digest.update(state["model_proto"].numpy().tobytes())
    else:
        digest.update(json.dumps([state["pieces"], state["lowercase"]]).encode("utf-8"))
    return digest.hexdigest()


def _tokenizer_file(folder: Path, role: str, tok: Tokenizer) -> Path:
    return folder / (f"{role}.model" if isinstance(tok, SentencePieceTokenizer) else f"{role}.json")


def save_tokenizers(folder: Path, src_tok: Tokenizer, tgt_tok: Tokenizer) -> list[Path]:
    """Write the tokenizers into ``folder``: a SentencePiece model as its ``.model`` proto (readable by
    the ``spm_*`` tools), a word vocabulary as JSON; one ``joint`` file when both sides share one.

    Returns:
        The written files.
    """
    roles = {"joint": src_tok} if src_tok is tgt_tok else {"src": src_tok, "tgt": tgt_tok}
    written = []
    for role, tok in roles.items():
        path = _tokenizer_file(folder, role, tok)
        state = tok.state_dict()
        if isinstance(tok, SentencePieceTokenizer):
            data = state["model_proto"].numpy().tobytes()
        else:
            data = json.dumps({"pieces": state["pieces"], "lowercase": state["lowercase"]}).encode("utf-8")
        with dying_at_fault_point(open(path, "wb"), path) as handle:
            handle.write(data)
        written.append(path)
    return written


def _load_tokenizer_file(path: Path) -> Tokenizer:
    if path.suffix == ".model":
        return SentencePieceTokenizer(path.read_bytes())
    state = json.loads(path.read_text(encoding="utf-8"))
    return WordTokenizer(state["pieces"], lowercase=bool(state["lowercase"]))


def load_tokenizers(folder: Path) -> tuple[Tokenizer, Tokenizer]:
    """Read what ``save_tokenizers`` wrote (a joint tokenizer comes back as one object, twice).

    Raises:
        TokenizerError: the folder holds no tokenizer files.
    """
    for suffix in (".model", ".json"):
        if (folder / f"joint{suffix}").is_file():
            joint = _load_tokenizer_file(folder / f"joint{suffix}")
            return joint, joint
        if (folder / f"src{suffix}").is_file():
            return _load_tokenizer_file(folder / f"src{suffix}"), _load_tokenizer_file(folder / f"tgt{suffix}")
    raise TokenizerError(f"{folder}: no saved tokenizer (joint.model, src.model or their .json forms)")
