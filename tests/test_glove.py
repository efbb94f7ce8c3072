"""GloVe-format vectors: the four file forms, matching rules, coverage, errors, and the real file."""

from __future__ import annotations

import gzip
import os
import re
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from transformer.config import GloveConfig, GloveSide, ModelConfig
from transformer.data.corpus import TranslationDataset
from transformer.data.tokenizer import SPECIAL_PIECES, WordTokenizer
from transformer.model.transformer import build_model
from transformer.training.glove import (
    GloveError,
    check_dimension,
    init_embedding_from_glove,
    init_model_embeddings,
    read_vectors,
    refreeze_model_embeddings,
    vector_dim,
)

LINES = ["the 0.1 0.2 0.3", "Dog 1 2 3", "dog 4 5 6", "cat 7 8 9", "house 0.5 0.5 0.5"]
PIECES = ["<pad>", "<unk>", "\u2581the", "Dog", "\u2581Cat", "zebra", "\u2581", "HOUSE"]
EXPECTED = {2: [0.1, 0.2, 0.3], 3: [1.0, 2.0, 3.0], 4: [7.0, 8.0, 9.0], 7: [0.5, 0.5, 0.5]}
REAL_GLOVE = Path(
    os.environ.get("GLOVE_50D", Path(__file__).parents[2] / "shared/data/glove/glove.6B.50d.multi30k.txt.gz")
)


def _write_all_formats(tmp: Path) -> dict[str, str]:
    text = "\n".join(LINES) + "\n"
    (tmp / "vectors.txt").write_text(text, encoding="utf-8")
    with gzip.open(tmp / "vectors.txt.gz", "wt", encoding="utf-8") as handle:
        handle.write(text)
    with zipfile.ZipFile(tmp / "glove.test.zip", "w") as archive:
        archive.writestr("glove.test.4d.txt", "the 1 2 3 4\n")
        archive.writestr("glove.test.3d.txt", text)
    (tmp / "vectors.w2v.txt").write_text(f"{len(LINES)} 3\n" + text, encoding="utf-8")
    return {
        "txt": str(tmp / "vectors.txt"),
        "gz": str(tmp / "vectors.txt.gz"),
        "zip_by_dim": str(tmp / "glove.test.zip"),
        "zip_member": f"{tmp / 'glove.test.zip'}:glove.test.3d.txt",
        "word2vec": str(tmp / "vectors.w2v.txt"),
    }


def _embedding(dim: int = 3) -> nn.Embedding:
    torch.manual_seed(0)
    return nn.Embedding(len(PIECES), dim, padding_idx=0)


@pytest.mark.parametrize("form", ["txt", "gz", "zip_by_dim", "zip_member", "word2vec"])
def test_every_file_form_reads_the_same_vectors(tmp_path: Path, form: str) -> None:
    path = _write_all_formats(tmp_path)[form]
    assert vector_dim(path, expected_dim=3) == 3
    vectors = read_vectors(path, expected_dim=3)
    assert vectors.dim == 3 and list(vectors.index) == ["the", "Dog", "dog", "cat", "house"]
    assert vectors.matrix[vectors.index["dog"]].tolist() == [4.0, 5.0, 6.0]
    embedding = _embedding()
    before = embedding.weight.detach().clone()
    coverage = init_embedding_from_glove(embedding, PIECES, path, rescale=False, skip_ids={1})
    for row, values in EXPECTED.items():
        assert embedding.weight[row].tolist() == pytest.approx(values)
    for row in (1, 5, 6):  # skipped, unmatched, bare "▁": untouched
        assert torch.equal(embedding.weight[row], before[row])
    assert torch.equal(embedding.weight[0], torch.zeros(3))  # the pad row stays zero
    assert (coverage.n_types, coverage.n_types_found) == (6, 4)
    assert coverage.type_rate == pytest.approx(4 / 6) and coverage.token_rate is None


def test_matching_prefers_exact_then_lowercase_and_strips_sentencepiece_marker(tmp_path: Path) -> None:
    path = _write_all_formats(tmp_path)["txt"]
    pieces = ["<pad>", "dog", "Dog", "DOG", "\u2581dog", "\u2581DOG"]
    embedding = nn.Embedding(len(pieces), 3, padding_idx=0)
    init_embedding_from_glove(embedding, pieces, path, rescale=False)
    rows = embedding.weight.tolist()
    assert rows[1] == [4.0, 5.0, 6.0] and rows[2] == [1.0, 2.0, 3.0]  # exact wins over lowercase
    assert rows[3] == [4.0, 5.0, 6.0] and rows[4] == [4.0, 5.0, 6.0] and rows[5] == [4.0, 5.0, 6.0]


def test_token_coverage_from_counts(tmp_path: Path) -> None:
    path = _write_all_formats(tmp_path)["txt"]
    counts = {"\u2581the": 10, "Dog": 5, "\u2581Cat": 3, "zebra": 2, "<unk>": 100}
    coverage = init_embedding_from_glove(_embedding(), PIECES, path, rescale=False, counts=counts, skip_ids={1})
    assert coverage.token_rate == pytest.approx(18 / 20)  # <unk> is skipped, so not counted


def test_freeze_stops_training_the_embedding(tmp_path: Path) -> None:
    embedding = _embedding()
    init_embedding_from_glove(embedding, PIECES, _write_all_formats(tmp_path)["txt"], rescale=False, freeze=True)
    assert not embedding.weight.requires_grad


def test_only_requested_words_are_kept(tmp_path: Path) -> None:
    vectors = read_vectors(_write_all_formats(tmp_path)["gz"], words={"cat", "house", "absent"})
    assert sorted(vectors.index) == ["cat", "house"] and vectors.matrix.shape == (2, 3)


def test_dimension_mismatch_names_file_line_and_numbers(tmp_path: Path) -> None:
    path = _write_all_formats(tmp_path)["txt"]
    with pytest.raises(GloveError, match=re.escape(f"{path}:1: vectors have 3 dimensions, but 4 are needed")):
        init_embedding_from_glove(_embedding(4), PIECES, path, rescale=False)
    zipped = _write_all_formats(tmp_path)["zip_by_dim"]
    with pytest.raises(GloveError, match="no member has 5-dimensional vectors"):
        vector_dim(zipped, expected_dim=5)
    with pytest.raises(GloveError, match="holds 2 files"):
        vector_dim(zipped)


def test_a_word2vec_header_that_disagrees_with_the_vectors_is_named(tmp_path: Path) -> None:
    path = tmp_path / "vectors.w2v.txt"
    path.write_text("2 30\nthe 0.1 0.2 0.3\ndog 4 5 6\n", encoding="utf-8")  # the header says 30, the lines 3
    with pytest.raises(GloveError, match=re.escape(f"{path}:2: expected a word and 30 numbers, found 3 values; the "
                                                   "header (line 1) announces 30-dimensional vectors")):
        vector_dim(path)


@pytest.mark.parametrize(
    ("bad_line", "message"),
    [("cat 7 8", "expected a word and 3 numbers, found 2 values"),
     ("cat 7 8 9 10", "expected a word and 3 numbers, found 4 values"),
     ("cat 7 x 9", "malformed number"),
     ("cat 7 nan 9", "the vector of 'cat' holds a number that is not a finite float32"),
     ("cat 7 -inf 9", "the vector of 'cat' holds a number that is not a finite float32"),
     ("cat 7 1e39 9", "the vector of 'cat' holds a number that is not a finite float32")],  # inf as a float32
)
def test_malformed_line_names_file_and_line(tmp_path: Path, bad_line: str, message: str) -> None:
    path = tmp_path / "bad.txt"
    path.write_text("the 0.1 0.2 0.3\ndog 4 5 6\n" + bad_line + "\n", encoding="utf-8")
    with pytest.raises(GloveError, match=re.escape(f"{path}:3: {message}")):
        read_vectors(path)
    if "values" in message:  # the field count is checked even for words nobody asked for
        with pytest.raises(GloveError, match=re.escape(f"{path}:3:")):
            read_vectors(path, words={"the"})


@pytest.mark.parametrize(("first_line", "message"), [
    ("the\t0.1\t0.2\t0.3", "expected a word and numbers separated by spaces, found 4 field(s) (tabs separate its "
                           "fields: GloVe's format separates them by single spaces)"),
    ("the", "expected a word and numbers separated by spaces, found 1 field(s)"),
])
def test_a_first_line_without_numbers_is_named_as_such(tmp_path: Path, first_line: str, message: str) -> None:
    """Not as vectors of 0 dimensions, which the dimension check would answer with advice to use d_model=0."""
    path = tmp_path / "bad.txt"
    path.write_text(first_line + "\ndog 4 5 6\n", encoding="utf-8")
    for read in (vector_dim, read_vectors, lambda p: read_vectors(p, expected_dim=3)):
        with pytest.raises(GloveError, match=re.escape(f"{path}:1: {message}")):
            read(path)


def test_tabs_after_a_word2vec_header_are_named_as_such(tmp_path: Path) -> None:
    path = tmp_path / "w2v.txt"
    path.write_text("2 3\nthe\t0.1\t0.2\t0.3\ndog 4 5 6\n", encoding="utf-8")
    with pytest.raises(GloveError, match=re.escape(
            f"{path}:2: expected a word and 3 numbers, found 0 values (tabs separate its fields: GloVe's format "
            "separates them by single spaces); the header (line 1) announces 3-dimensional vectors")):
        vector_dim(path)


def test_a_zip_with_two_members_of_the_dimension_asked_for_asks_which(tmp_path: Path) -> None:
    path = tmp_path / "two.zip"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("a.3d.txt", "the 1 2 3\n")
        archive.writestr("b.3d.txt", "the 4 5 6\n")
        archive.writestr("c.4d.txt", "the 1 2 3 4\n")
    with pytest.raises(GloveError, match=re.escape(f"{path}: holds 2 files of 3-dimensional vectors ['a.3d.txt', "
                                                   f"'b.3d.txt']; name one as '{path}:MEMBER'")):
        read_vectors(path, expected_dim=3)
    assert read_vectors(f"{path}:b.3d.txt", expected_dim=3).matrix.tolist() == [[4.0, 5.0, 6.0]]
    assert read_vectors(path, expected_dim=4).dim == 4


def test_a_byte_order_mark_is_not_part_of_the_first_word(tmp_path: Path) -> None:
    path = tmp_path / "bom.txt"
    path.write_bytes(b"\xef\xbb\xbf" + ("\n".join(LINES) + "\n").encode("utf-8"))
    assert vector_dim(path) == 3
    vectors = read_vectors(path, words={"the"})
    assert list(vectors.index) == ["the"] and vectors.matrix.tolist() == [pytest.approx([0.1, 0.2, 0.3])]


def test_a_byte_that_is_not_utf8_is_named_by_its_own_line_and_place(tmp_path: Path) -> None:
    lines = [f"w{i} 0.1 0.2 0.3".encode() for i in range(3000)]  # longer than a decoding block
    lines[2499] = b"caf\xe9 0.1 0.2 0.3"  # line 2500, byte 4
    for path in (tmp_path / "v.txt", tmp_path / "v.txt.gz"):
        data = b"\n".join(lines) + b"\n"
        path.write_bytes(gzip.compress(data) if path.suffix == ".gz" else data)
        for words in (None, {"w1"}):  # also where the line's word is not asked for
            with pytest.raises(GloveError, match=re.escape(f"{path}:2500: not UTF-8 text (byte 4 of the line: "
                                                           "invalid continuation byte)")):
                read_vectors(path, words=words)
    first = tmp_path / "first.txt"
    first.write_bytes(b"\xff 0.1 0.2\n")
    with pytest.raises(GloveError, match=re.escape(f"{first}:1: not UTF-8 text (byte 1 of the line: invalid "
                                                   "start byte)")):
        vector_dim(first)


def test_multi_word_entries_are_read(tmp_path: Path) -> None:
    path = tmp_path / "spaced.txt"
    path.write_text("the 0.1 0.2 0.3\n. . . 1 2 3\n", encoding="utf-8")
    assert read_vectors(path).matrix[read_vectors(path).index[". . ."]].tolist() == [1.0, 2.0, 3.0]


def test_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(GloveError, match=rf"{re.escape(str(tmp_path / 'nope.txt'))}.*not found"):
        vector_dim(tmp_path / "nope.txt")
    glove = GloveConfig(path=str(tmp_path / "nope.txt"))  # as a training run checks it: the key named too
    with pytest.raises(GloveError, match=rf"^model\.glove\.path: {re.escape(glove.path)}: vector file not found$"):
        check_dimension(glove, 50)


def test_an_unreadable_file_names_it(tmp_path: Path) -> None:
    truncated = tmp_path / "vectors.txt.gz"
    truncated.write_bytes(gzip.compress(b"a 0.1 0.2\nb 0.3 0.4\n" * 50)[:40])
    not_zip = tmp_path / "vectors.zip"
    not_zip.write_text("a 0.1 0.2\n", encoding="utf-8")
    folder = tmp_path / "vectors.txt"
    folder.mkdir()
    for path in (truncated, not_zip, folder):
        with pytest.raises(GloveError, match=rf"^{re.escape(str(path))}: cannot read the vector file"):
            read_vectors(path)


@pytest.mark.skipif(not REAL_GLOVE.exists(), reason=f"{REAL_GLOVE} is absent")
def test_real_glove_file() -> None:
    assert vector_dim(REAL_GLOVE) == 50
    vectors = read_vectors(REAL_GLOVE, expected_dim=50, words={"the"})
    assert vectors.matrix[0, :2].tolist() == pytest.approx([0.418, 0.24968])
    pieces = ["<pad>", "\u2581the", "\u2581dog", "\u2581Runs", "man", "\u2581Street", "qzxqv"]
    coverage = init_embedding_from_glove(nn.Embedding(len(pieces), 50, padding_idx=0), pieces, REAL_GLOVE,
                                         rescale=False)
    assert (coverage.n_types, coverage.n_types_found) == (6, 5)


def test_rescale_matches_the_random_init_std(tmp_path):
    rows = {f"w{i}": [float((i * 7 + j) % 11) for j in range(4)] for i in range(20)}
    path = tmp_path / "v.txt"
    path.write_text("".join(f"{w} {' '.join(map(str, v))}\n" for w, v in rows.items()), encoding="utf-8")
    torch.manual_seed(0)
    embedding = nn.Embedding(40, 4)
    nn.init.normal_(embedding.weight, std=0.5)
    pieces = list(rows) + [f"x{i}" for i in range(20)]
    init_std = embedding.weight.detach().std().item()
    init_embedding_from_glove(embedding, pieces, path, rescale=True)
    copied = torch.tensor([rows[w] for w in rows])
    assert embedding.weight[:20].detach().std().item() == pytest.approx(init_std, rel=1e-5)
    ratio = embedding.weight[:20].detach() / copied.clamp(min=1e-9)
    assert torch.allclose(ratio[copied > 0], ratio[copied > 0][0])  # one common factor: directions kept


def test_vectors_all_alike_are_copied_unscaled(tmp_path):
    path = tmp_path / "v.txt"  # no spread to match: the rescale leaves them as they are (it divided by zero)
    path.write_text("".join(f"w{i} 0.5 0.5 0.5 0.5\n" for i in range(3)), encoding="utf-8")
    embedding = nn.Embedding(4, 4)
    init_embedding_from_glove(embedding, ["w0", "w1", "w2", "other"], path, rescale=True)
    assert torch.equal(embedding.weight[:3].detach(), torch.full((3, 4), 0.5))


def _joint_vocabulary_setup(tmp_path: Path, side: GloveSide, freeze: bool = False):
    """One tokenizer object for both sides; source text "cat cat dog", target text "katze hund hund hund";
    only "katze" has a vector, so the target side's token coverage is 1/4 and the source side's 0."""
    tok = WordTokenizer([*SPECIAL_PIECES, "cat", "dog", "katze", "hund"])
    vectors = tmp_path / "vectors.txt"
    vectors.write_text("katze " + " ".join(["0.5"] * 8) + "\n", encoding="utf-8")
    src = np.array(tok.encode("cat cat dog"), dtype=np.uint16)
    tgt = np.array(tok.encode("katze hund hund hund"), dtype=np.uint16)
    train_set = TranslationDataset(src, np.array([0, len(src)]), tgt, np.array([0, len(tgt)]))
    glove = GloveConfig(path=str(vectors), side=side, freeze=freeze, rescale=False)
    cfg = ModelConfig(d_model=8, n_heads=2, d_ff=16, n_encoder_layers=1, n_decoder_layers=1,
                      attention_dropout=0.0, share_embeddings=False, tie_output=False, glove=glove)
    torch.manual_seed(0)
    return build_model(cfg, tok.vocab_size, tok.vocab_size, tok.pad_id), glove, tok, train_set


def test_a_file_that_covers_no_entry_is_a_warning_and_coverage_reads_as_a_sentence(tmp_path, caplog):
    model, glove, tok, train_set = _joint_vocabulary_setup(tmp_path, GloveSide.tgt)
    with caplog.at_level("INFO", logger="transformer.training.glove"):
        coverage = init_model_embeddings(model, glove, tok, tok, train_set)["tgt"]
    assert str(coverage) == "1 of 4 vocabulary entries found (25.0 %, 25.0 % of the training tokens)"
    assert f"GloVe tgt embeddings: {coverage}" in caplog.text
    Path(glove.path).write_text("zebra " + " ".join(["0.5"] * 8) + "\n", encoding="utf-8")  # no word in common
    caplog.clear()
    with caplog.at_level("INFO", logger="transformer.training.glove"):
        init_model_embeddings(model, glove, tok, tok, train_set)
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("WARNING", f"GloVe tgt embeddings: no vocabulary entry has a vector in {glove.path}, so they stay random: is "
                    "it a file of the target language?")]


@pytest.mark.parametrize("side", [GloveSide.tgt, GloveSide.both])
def test_joint_vocabulary_target_side_is_named_and_counted_as_target(tmp_path, caplog, side):
    model, glove, tok, train_set = _joint_vocabulary_setup(tmp_path, side)
    with caplog.at_level("INFO", logger="transformer.training.glove"):
        coverages = init_model_embeddings(model, glove, tok, tok, train_set)
    assert sorted(coverages) == (["tgt"] if side is GloveSide.tgt else ["src", "tgt"])
    assert coverages["tgt"].token_rate == pytest.approx(1 / 4)  # counted on the target side, not the source
    assert "GloVe tgt embeddings" in caplog.text
    assert ("GloVe src embeddings" in caplog.text) == (side is GloveSide.both)
    katze = tok.encode("katze")[0]
    assert model.tgt_token_embedding.weight[katze].tolist() == [0.5] * 8
    if side is GloveSide.both:
        assert coverages["src"].token_rate == 0.0


def test_resume_freezes_again_what_the_run_froze(tmp_path):
    model, glove, tok, train_set = _joint_vocabulary_setup(tmp_path, GloveSide.tgt, freeze=True)
    init_model_embeddings(model, glove, tok, tok, train_set)
    fresh, _, _, _ = _joint_vocabulary_setup(tmp_path, GloveSide.tgt, freeze=True)
    refreeze_model_embeddings(fresh, glove)
    frozen = [name for name, p in model.named_parameters() if not p.requires_grad]
    assert frozen and frozen == [name for name, p in fresh.named_parameters() if not p.requires_grad]


@pytest.mark.slow
def test_a_300_dimensional_glove_file_trains_draws_and_exports_a_glove300_model(toy_corpus, tmp_path):
    """``model=glove300`` end to end (8 heads of 64 = 512, which 300 is not), with a synthetic 300-d GloVe-format file
    holding the toy corpus's source words: coverage, shapes, a short training, attention maps and the export."""
    import subprocess
    import sys

    from transformer.checkpoint import load_checkpoint

    def command(*args: str, **kwargs) -> subprocess.CompletedProcess:
        done = subprocess.run([sys.executable, "-m", "transformer", *args], cwd=tmp_path, capture_output=True,
                              text=True, timeout=600, **kwargs)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        return done

    words = sorted({word for line in (toy_corpus / "train.src").read_text().splitlines() for word in line.split()})
    rng = np.random.default_rng(0)
    (tmp_path / "glove.300d.txt").write_text("".join(
        word + " " + " ".join(f"{x:.4f}" for x in rng.normal(0.0, 0.4, 300)) + "\n" for word in words))
    trained = command("train", "data=toy_copy", f"data.dir={toy_corpus}", "data.cache_dir=cache", "model=glove300",
                      "model.glove.path=glove.300d.txt", "model.n_encoder_layers=1", "model.n_decoder_layers=1",
                      "training.max_steps=20", "training.validate_every_steps=20", "training.average_last=0",
                      "training.progress_bar=false", "eval=greedy", "device=cpu", "hydra.run.dir=run")
    assert f"GloVe src embeddings: {len(words)} of {len(words)} vocabulary entries found (100.0 %" in trained.stdout
    state = load_checkpoint(tmp_path / "run" / "checkpoints" / "final.pt")
    assert state["config"]["model"]["d_model"] == 300 and state["config"]["model"]["d_head"] == 64
    shapes = {name: tuple(tensor.shape) for name, tensor in state["model"].items()}
    assert {shape for name, shape in shapes.items() if name.endswith("in_proj_weight")} == {(3 * 512, 300)}
    assert {shape for name, shape in shapes.items() if name.endswith("out_proj.weight")} == {(300, 512)}
    rows, vectors = state["model"]["encoder.embed.token.embedding.weight"], read_vectors(tmp_path / "glove.300d.txt")
    pieces = state["tokenizers"]["src"]["pieces"]
    for word in words:  # each row is its word's vector, rescaled, after 20 small steps
        row, vector = rows[pieces.index(word)], vectors.matrix[vectors.index[word]]
        assert torch.cosine_similarity(row, vector, dim=0) > 0.95, word

    command("evaluate", "run_dir=run", "eval=greedy", "attention.indices=[0]", "hydra.run.dir=maps")
    maps = np.load(tmp_path / "maps" / "attention" / "test0_hyp.npz")
    assert maps["encoder"].shape[:2] == (1, 8) and maps["cross"].shape[:2] == (1, 8)
    assert np.allclose(maps["cross"].sum(-1), 1.0, atol=1e-5)

    command("export", "run_dir=run", "out_dir=exported", "eval=greedy")
    source = (toy_corpus / "test.src").read_text()
    assert command("translate", "export_dir=exported", "eval=greedy", input=source).stdout == \
        command("translate", "run_dir=run", "eval=greedy", input=source).stdout
