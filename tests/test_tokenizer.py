"""Tokenizers: special ids, round trips on real Multi30k lines, reuse of saved models, state dicts."""

from __future__ import annotations

import gzip
import io

import pytest
import torch
from conftest import multi30k_dir

from transformer.config import SentencePieceModel, TokenizerConfig, TokenizerKind
from transformer.data.tokenizer import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    SPECIAL_PIECES,
    UNK_ID,
    SentencePieceTokenizer,
    TokenizerError,
    WordTokenizer,
    build_tokenizers,
    load_tokenizers,
    save_tokenizers,
    tokenizer_digest,
    tokenizer_from_state,
    train_sentencepiece,
    word_detokenize,
    word_tokenize,
)

MULTI30K = multi30k_dir()


def _lines(name: str, n: int) -> list[str]:
    with gzip.open(MULTI30K / name, "rt", encoding="utf-8") as handle:
        return [" ".join(next(handle).split()) for _ in range(n)]


@pytest.fixture(scope="module")
def corpus() -> dict[str, list[str]]:
    if not (MULTI30K / "train.en.gz").is_file():
        pytest.skip(f"no Multi30k at {MULTI30K}")
    return {
        "train_en": _lines("train.en.gz", 2000),
        "train_de": _lines("train.de.gz", 2000),
        "val_en": _lines("val.en.gz", 300),
        "val_de": _lines("val.de.gz", 300),
    }


@pytest.fixture(scope="module")
def spm_cfg() -> TokenizerConfig:
    return TokenizerConfig(kind=TokenizerKind.sentencepiece, vocab_size=500, joint=True)


@pytest.fixture(scope="module")
def spm_joint(corpus, spm_cfg) -> SentencePieceTokenizer:
    src, tgt = build_tokenizers(spm_cfg, corpus["train_en"], corpus["train_de"])
    assert src is tgt
    return src


# --------------------------------------------------------------------------------------------------
# SentencePiece
# --------------------------------------------------------------------------------------------------


def test_sentencepiece_special_ids_and_vocab_size(spm_joint):
    assert spm_joint.vocab_size == 500
    assert (spm_joint.pad_id, spm_joint.unk_id, spm_joint.bos_id, spm_joint.eos_id) == (0, 1, 2, 3)
    assert [spm_joint.id_to_piece(i) for i in range(4)] == ["<pad>", "<unk>", "<s>", "</s>"]
    assert spm_joint.pieces()[:4] == list(SPECIAL_PIECES) and len(spm_joint.pieces()) == 500


def test_sentencepiece_round_trip_is_exact_on_real_lines(spm_joint, corpus):
    for lines in (corpus["train_en"], corpus["train_de"]):
        assert [spm_joint.decode(spm_joint.encode(line)) for line in lines] == lines
    # unseen validation lines: only characters missing from the 2000 training lines can differ
    val = corpus["val_en"] + corpus["val_de"]
    exact = sum(spm_joint.decode(spm_joint.encode(line)) == line for line in val) / len(val)
    assert exact >= 0.97


def test_sentencepiece_encode_adds_no_specials_and_decode_skips_them(spm_joint):
    ids = spm_joint.encode("A man rides a bike.")
    assert ids and not set(ids) & {PAD_ID, BOS_ID, EOS_ID}
    assert spm_joint.decode([BOS_ID, *ids, EOS_ID, PAD_ID, PAD_ID]) == "A man rides a bike."


def test_sentencepiece_state_dict_survives_weights_only_load(spm_joint, corpus):
    buffer = io.BytesIO()
    torch.save({"tokenizer": spm_joint.state_dict()}, buffer)
    buffer.seek(0)
    state = torch.load(buffer, weights_only=True)["tokenizer"]
    assert state["model_proto"].dtype == torch.uint8
    restored = tokenizer_from_state(state)
    assert restored.pieces() == spm_joint.pieces()
    assert [restored.encode(s) for s in corpus["val_de"][:50]] == [spm_joint.encode(s) for s in corpus["val_de"][:50]]


def test_sentencepiece_separate_vocabularies(corpus):
    cfg = TokenizerConfig(vocab_size=300, joint=False)
    src, tgt = build_tokenizers(cfg, corpus["train_en"][:1000], corpus["train_de"][:1000])
    assert src is not tgt and src.pieces() != tgt.pieces()
    assert "▁Mann" in tgt.pieces() and "▁Mann" not in src.pieces()


def test_unigram_training_is_deterministic(corpus):
    cfg = TokenizerConfig(vocab_size=300, model_type=SentencePieceModel.unigram)
    first = train_sentencepiece(corpus["train_en"][:1000], cfg)
    assert train_sentencepiece(corpus["train_en"][:1000], cfg) == first
    assert SentencePieceTokenizer(first).vocab_size == 300


def test_too_large_vocabulary_gives_a_clear_error():
    cfg = TokenizerConfig(vocab_size=5000)
    with pytest.raises(TokenizerError, match=r"data\.tokenizer\.vocab_size=5000 is too large.*at most \d+"):
        train_sentencepiece(["a small corpus", "with few words"] * 10, cfg)


def test_a_vocabulary_smaller_than_the_characters_is_called_too_small():
    text = ["a small corpus", "with few words"] * 10  # 14 distinct characters and the word boundary
    needed = len(set("".join(text).replace(" ", ""))) + 1 + 4  # + "▁" + <pad>, <unk>, <s>, </s>
    with pytest.raises(TokenizerError, match=rf"^data\.tokenizer\.vocab_size=10 is too small for the characters of "
                                             rf"the training text: set data\.tokenizer\.vocab_size >= {needed} "):
        train_sentencepiece(text, TokenizerConfig(vocab_size=10))
    assert train_sentencepiece(text, TokenizerConfig(vocab_size=needed, model_type=SentencePieceModel.bpe))


# --------------------------------------------------------------------------------------------------
# Word level
# --------------------------------------------------------------------------------------------------


def test_word_tokenize_keeps_words_and_splits_clitics_and_punctuation():
    text = "Don't stop, it's John's well-known 3.5-hour show (o'clock)!"
    assert word_tokenize(text) == [
        "Do", "n't", "stop", ",", "it", "'s", "John", "'s", "well-known", "3.5", "-", "hour", "show",
        "(", "o'clock", ")", "!",
    ]
    assert word_tokenize("Ein Mann. Zwei", lowercase=True) == ["ein", "mann", ".", "zwei"]


@pytest.mark.parametrize(
    "text",
    [
        'He said "don\'t go" (twice) to the dogs\' owners.',
        "Ein Schild mit „Open“-Anzeige, 20% billiger; wirklich?",
        "A “quoted” word, a $5 bill and #19: done...",
    ],
)
def test_word_detokenize_restores_ordinary_spacing(text):
    expected = text.replace("-Anzeige", " - Anzeige")  # a hyphen after a quote is its own token
    assert word_detokenize(word_tokenize(text)) == expected


def test_word_vocabulary_is_ordered_by_frequency_and_capped():
    texts = ["e b a b", "c b a e f", "e d"]  # b:3 e:3 a:2 c:1 d:1 f:1
    cfg = TokenizerConfig(kind=TokenizerKind.word, vocab_size=8, min_freq=1)
    words = WordTokenizer.train(texts, cfg)
    assert words.pieces() == [*SPECIAL_PIECES, "b", "e", "a", "c"]  # ties alphabetical; d, f cut by vocab_size
    assert words.encode("a b d") == [6, 4, UNK_ID]
    assert words.decode([BOS_ID, 6, 4, UNK_ID, EOS_ID, PAD_ID]) == "a b <unk>"
    rare = WordTokenizer.train(texts, TokenizerConfig(kind=TokenizerKind.word, vocab_size=100, min_freq=2))
    assert rare.pieces() == [*SPECIAL_PIECES, "b", "e", "a"]
    full = WordTokenizer.train(texts, TokenizerConfig(kind=TokenizerKind.word, vocab_size=100))
    assert full.pieces() == [*SPECIAL_PIECES, "b", "e", "a", "c", "d", "f"]


def test_word_round_trip_rate_on_real_lines(corpus):
    cfg = TokenizerConfig(kind=TokenizerKind.word, vocab_size=100_000, joint=False)
    for lines in (corpus["train_en"], corpus["train_de"]):
        words, _ = build_tokenizers(cfg, lines, lines)
        assert UNK_ID not in {i for line in lines for i in words.encode(line)}
        exact = sum(words.decode(words.encode(line)) == line for line in lines) / len(lines)
        assert exact >= 0.98, exact


def test_word_lowercase_and_state_dict(corpus):
    cfg = TokenizerConfig(kind=TokenizerKind.word, vocab_size=3000, lowercase=True)
    words, same = build_tokenizers(cfg, corpus["train_en"], corpus["train_en"])
    assert words is same
    assert words.encode("A DOG") == words.encode("a dog") and UNK_ID not in words.encode("a dog")
    buffer = io.BytesIO()
    torch.save(words.state_dict(), buffer)
    buffer.seek(0)
    restored = tokenizer_from_state(torch.load(buffer, weights_only=True))
    assert isinstance(restored, WordTokenizer) and restored.pieces() == words.pieces()
    assert restored.encode(corpus["val_en"][0]) == words.encode(corpus["val_en"][0])


@pytest.mark.parametrize("kind", [TokenizerKind.sentencepiece, TokenizerKind.word])
@pytest.mark.parametrize("joint", [True, False])
def test_saved_tokenizers_load_back_with_the_same_ids_and_digest(corpus, tmp_path, kind, joint):
    cfg = TokenizerConfig(kind=kind, vocab_size=300, joint=joint)
    src, tgt = build_tokenizers(cfg, corpus["train_en"][:500], corpus["train_de"][:500])
    files = save_tokenizers(tmp_path, src, tgt)
    assert len(files) == (1 if joint else 2)
    loaded_src, loaded_tgt = load_tokenizers(tmp_path)
    assert (loaded_src is loaded_tgt) == joint
    for before, after, lines in ((src, loaded_src, corpus["val_en"]), (tgt, loaded_tgt, corpus["val_de"])):
        assert tokenizer_digest(after) == tokenizer_digest(before)
        assert after.encode_batch(lines) == [before.encode(line) for line in lines]
    assert tokenizer_digest(src) != tokenizer_digest(build_tokenizers(cfg, corpus["train_en"][:400],
                                                                      corpus["train_de"][:400])[0])
    with pytest.raises(TokenizerError, match="no saved tokenizer"):
        load_tokenizers(tmp_path / "nothing")


def test_sentencepiece_batch_encoding_in_threads_equals_one_by_one(spm_joint, corpus):
    lines = corpus["val_en"] + corpus["val_de"]
    assert spm_joint.encode_batch(lines, num_threads=2) == [spm_joint.encode(line) for line in lines]
    with pytest.raises(TokenizerError, match="one thread"):
        WordTokenizer(list(SPECIAL_PIECES)).encode_batch(lines, num_threads=2)


def test_bad_states_are_rejected():
    with pytest.raises(TokenizerError, match="unknown tokenizer kind 'bpe'"):
        tokenizer_from_state({"kind": "bpe"})
    with pytest.raises(TokenizerError, match="must start with"):
        WordTokenizer(["a", "b", "c", "d"])
