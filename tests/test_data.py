"""Reading, validating and cleaning parallel corpora; Multi30k from a local copy; the dataset."""

from __future__ import annotations

import gzip
import hashlib
import re
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from conftest import REPO, multi30k_dir, write_toy_corpus

from transformer.config import CorpusKind, DataConfig, TokenizerConfig, TokenizerKind
from transformer.data.corpus import (
    CleaningReport,
    DataError,
    TranslationDataset,
    clean_pairs,
    cleaning_mask,
    iter_line_blocks,
    iter_parallel,
    read_lines,
    read_parallel,
    token_dtype,
)
from transformer.data.splits import (
    MULTI30K_EXTRA_TESTS,
    MULTI30K_LANGS,
    MULTI30K_SHA256,
    MULTI30K_SPLITS,
    anchored,
    corpus_paths,
    load_split,
    prepare_multi30k,
)
from transformer.data.tokenizer import WordTokenizer

MULTI30K = multi30k_dir()
needs_multi30k = pytest.mark.skipif(not (MULTI30K / "train.en.gz").is_file(), reason=f"no Multi30k at {MULTI30K}")


def _write(path: Path, data: bytes, compress: bool = False) -> Path:
    path.write_bytes(gzip.compress(data) if compress else data)
    return path


# --------------------------------------------------------------------------------------------------
# Reading and validation
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("compress", [False, True])
def test_read_lines_plain_and_gzip(tmp_path, compress):
    text = "\ufeffÄpfel\r\nzwei\u2028drei\n\nvier"
    path = _write(tmp_path / ("a.gz" if compress else "a.txt"), text.encode(), compress)
    # BOM dropped, \r\n handled, U+2028 is not a line break, an empty line is kept, no final newline needed
    assert read_lines(path) == ["Äpfel", "zwei\u2028drei", "", "vier"]


def test_a_file_with_cr_only_line_endings_reads_as_one_line_and_says_how_to_convert_it(tmp_path, caplog):
    path = _write(tmp_path / "mac.en", "eins\rzwei\rdrei\r".encode(), compress=False)
    assert read_lines(path) == ["eins\rzwei\rdrei"]  # lines end only at \n
    assert [record.getMessage() for record in caplog.records] == [
        f"{path}:1: a carriage return (\\r) inside the line: lines end only at \\n, so a file with CR-only line "
        "endings (classic Mac) reads as one line; convert it with tr '\\r' '\\n' < FILE > NEW"]
    caplog.clear()
    read_lines(_write(tmp_path / "windows.en", b"eins\r\nzwei\r\n", compress=False))
    assert not caplog.records  # CRLF is read as lines, quietly


def test_missing_and_empty_files_are_named(tmp_path):
    with pytest.raises(DataError, match=rf"{tmp_path / 'nope.en'}: file not found"):
        read_lines(tmp_path / "nope.en")
    with pytest.raises(DataError, match=rf"{tmp_path / 'empty.en'}: file is empty"):
        read_lines(_write(tmp_path / "empty.en", b""))
    with pytest.raises(DataError, match=r"empty\.de\.gz: file is empty"):
        read_lines(_write(tmp_path / "empty.de.gz", b"", compress=True))


@pytest.mark.parametrize("compress", [False, True])
def test_invalid_utf8_names_line_and_byte_offset(tmp_path, compress):
    # line 1 is bytes 0-3, line 2 bytes 4-6, so line 3 starts at byte 7 and its bad byte (index 2) is byte 9
    data = b"abc\n\xc3\xa4\n" + b"ok\xffno\n" + b"last\n"
    path = _write(tmp_path / ("bad.gz" if compress else "bad.txt"), data, compress)
    with pytest.raises(DataError) as info:
        read_lines(path)
    assert str(info.value).startswith(f"{path}:3: invalid UTF-8 at byte 9 (byte 2 of the line)")


@pytest.mark.parametrize("compress", [False, True])
def test_utf16_and_nul_bytes_are_refused_naming_the_line_and_the_fix(tmp_path, compress):
    text = "ein Hund\nzwei Katzen\n"
    path = _write(tmp_path / ("u 16.gz" if compress else "u 16.txt"), text.encode("utf-16"), compress)  # with a BOM
    fix = (f"gzip -dc '{path}' | iconv -f UTF-16 -t UTF-8 | gzip > NEW.gz" if compress else
           f"iconv -f UTF-16 -t UTF-8 < '{path}' > NEW")  # quoted for the shell: the name has a space
    with pytest.raises(DataError) as info:
        read_lines(path)
    assert str(info.value) == f"{path}:1: UTF-16, not UTF-8 (it begins with UTF-16's byte-order mark); convert it: {fix}"
    fixed = tmp_path / ("NEW.gz" if compress else "NEW")
    subprocess.run(fix, shell=True, cwd=tmp_path, check=True)  # the fix as given works
    assert read_lines(fixed) == ["ein Hund", "zwei Katzen"]
    path = _write(tmp_path / "u16le.txt", text.encode("utf-16-le"))  # no BOM: valid UTF-8, every other byte NUL
    with pytest.raises(DataError, match=r"u16le\.txt:1: a NUL byte \(byte 1 of the line\): UTF-16 without a "
                                        r"byte-order mark, or not a text file\? .*tr -d '\\000' < .*u16le\.txt > NEW$"):
        read_lines(path)
    lines = [f"line {i}" for i in range(300)]  # a stray NUL in a later block
    lines[250] = "line\0 250"
    path = _write(tmp_path / ("nul.gz" if compress else "nul.txt"), "\n".join(lines).encode(), compress)
    with pytest.raises(DataError, match=r"nul\.(gz|txt):251: a NUL byte \(byte 4 of the line\)"):
        list(iter_line_blocks(path, block_bytes=100))
    path = _write(tmp_path / "first.txt", b"ok\nc\0d\ne \xff f\n")  # the first bad line is named, whatever is wrong
    with pytest.raises(DataError, match=r"first\.txt:2: a NUL byte \(byte 1 of the line\)"):
        read_lines(path)


def test_corrupt_gzip_is_reported(tmp_path):
    path = _write(tmp_path / "x.gz", gzip.compress(b"one\ntwo\n")[:-12])
    with pytest.raises(DataError, match=r"x\.gz: cannot read the file"):
        read_lines(path)


def test_different_line_counts_name_both_files_and_counts(tmp_path):
    src = _write(tmp_path / "train.en", b"a\nb\nc\n")
    tgt = _write(tmp_path / "train.de.gz", b"x\ny\n", compress=True)
    with pytest.raises(DataError) as info:
        read_parallel(src, tgt)
    message = str(info.value)
    assert f"{src} has 3 lines" in message and f"{tgt} has 2 lines" in message and "line 3" in message
    assert read_parallel(src, _write(tmp_path / "ok.de", b"x\ny\nz")) == (["a", "b", "c"], ["x", "y", "z"])


@pytest.mark.parametrize("compress", [False, True])
def test_line_blocks_split_only_at_newlines_and_bad_bytes_are_found_in_later_blocks(tmp_path, compress):
    lines = [f"line {i} \u2028 ä" for i in range(300)]
    path = _write(tmp_path / ("a.gz" if compress else "a.txt"), "\r\n".join(lines).encode(), compress)
    blocks = list(iter_line_blocks(path, block_bytes=100))
    assert len(blocks) > 10 and [line for block in blocks for line in block] == lines
    data = b"".join(f"{line}\n".encode() for line in lines[:200]) + b"bad \xff\n"
    path = _write(tmp_path / ("b.gz" if compress else "b.txt"), data, compress)
    with pytest.raises(DataError) as info:
        list(iter_line_blocks(path, block_bytes=100))
    assert str(info.value).startswith(f"{path}:201: invalid UTF-8 at byte {len(data) - 2} (byte 4 of the line)")


def test_iter_parallel_streams_aligned_chunks_up_to_max_pairs(tmp_path):
    src = _write(tmp_path / "s.txt", "".join(f"s{i}\n" for i in range(10)).encode())
    tgt = _write(tmp_path / "t.gz", "".join(f"t{i}\n" for i in range(10)).encode(), compress=True)
    chunks = list(iter_parallel(src, tgt, chunk_lines=4))
    assert [len(s) for s, _ in chunks] == [4, 4, 2] and chunks[2] == (["s8", "s9"], ["t8", "t9"])
    assert list(iter_parallel(src, tgt, chunk_lines=4, max_pairs=5)) == [
        (["s0", "s1", "s2", "s3"], ["t0", "t1", "t2", "t3"]), (["s4"], ["t4"])]
    short = _write(tmp_path / "short.txt", b"x\n" * 6)
    with pytest.raises(DataError, match=r"s\.txt has 10 lines but .*short\.txt has 6 lines \(line 7 has no partner\)"):
        list(iter_parallel(src, short, chunk_lines=4, max_pairs=2))  # checked to the end, as read_parallel does


# --------------------------------------------------------------------------------------------------
# Cleaning
# --------------------------------------------------------------------------------------------------


def test_cleaning_mask_applies_the_rules_in_order():
    keep, n_empty, n_long, n_ratio = cleaning_mask(np.array([0, 9, 9, 1, 2, 3]), np.array([5, 0, 1, 4, 6, 3]),
                                                   max_len=8, max_len_ratio=3.0)
    # empty (0 src), empty (0 tgt; also too long), too long, ratio 4 > 3, ratio 3 kept, equal kept
    assert keep.tolist() == [False, False, False, False, True, True] and (n_empty, n_long, n_ratio) == (2, 1, 1)


def test_clean_pairs_counts_every_rule():
    src = ["  a  b ", "", "x", "one two three four", "a", "a b c d", "p q"]
    tgt = ["c\td", "y", "  ", "1 2", "a b c d", "a b c d e f", "r"]
    words = lambda s: len(s.split())  # noqa: E731
    kept_src, kept_tgt, report = clean_pairs(src, tgt, max_len=5, max_len_ratio=2.0, count=words)
    # empty: pairs 1 and 2; too long: pair 5 (6 target words); ratio 4 > 2: pair 4; kept: 0, 3, 6
    assert kept_src == ["a b", "one two three four", "p q"]
    assert kept_tgt == ["c d", "1 2", "r"]
    assert report == CleaningReport(
        n_input=7, n_kept=3, n_whitespace_normalized=2, n_empty=2, n_too_long=1, n_bad_ratio=1,
        max_len=5, max_len_ratio=2.0,
    )
    assert report.n_dropped == 4
    assert report.summary() == (
        "kept 3 of 7 pairs; dropped 2 with an empty side, 1 with more than 5 tokens on a side, "
        "1 with length ratio above 2; whitespace normalized in 2"
    )


def test_clean_pairs_on_token_ids_counts_ids():
    src = [[5, 6], [], [5] * 9, [5], [5, 6, 7]]
    tgt = [[7], [8], [8], [8, 8, 8, 8], [9, 9]]
    kept_src, kept_tgt, report = clean_pairs(src, tgt, max_len=8, max_len_ratio=3.0)
    assert (kept_src, kept_tgt) == ([[5, 6], [5, 6, 7]], [[7], [9, 9]])
    assert (report.n_empty, report.n_too_long, report.n_bad_ratio, report.n_whitespace_normalized) == (1, 1, 1, 0)


def test_clean_pairs_rejects_misaligned_input():
    with pytest.raises(DataError, match="2 source but 1 target"):
        clean_pairs(["a", "b"], ["c"], max_len=5, max_len_ratio=2.0)


# --------------------------------------------------------------------------------------------------
# Corpora from config
# --------------------------------------------------------------------------------------------------


def _custom_corpus(directory: Path) -> DataConfig:
    directory.mkdir(parents=True, exist_ok=True)
    _write(directory / "train.xx", b"a b\n c \nd\ne\n")
    _write(directory / "train.yy.gz", b"A B\nC\nD\nE\n", compress=True)
    _write(directory / "dev.xx", b"v\n")
    _write(directory / "dev.yy", b"V\n")
    return DataConfig(corpus=CorpusKind.custom, dir=str(directory), src="xx", tgt="yy",
                      train_split="train", valid_split="dev", max_pairs=3)


def test_custom_corpus_through_config(tmp_path):
    cfg = _custom_corpus(tmp_path / "corpus")
    assert corpus_paths(cfg, "train") == (tmp_path / "corpus/train.xx", tmp_path / "corpus/train.yy.gz")
    assert load_split(cfg, "train") == (["a b", "c", "d"], ["A B", "C", "D"])  # max_pairs=3, spaces normalized
    assert load_split(cfg, "dev") == (["v"], ["V"])  # max_pairs applies to the training split only


def test_a_scored_split_keeps_lines_with_an_empty_side_and_names_them(tmp_path, caplog):
    cfg = _custom_corpus(tmp_path / "corpus")
    _write(tmp_path / "corpus/dev.xx", b"v\n\nw\nx\n")
    _write(tmp_path / "corpus/dev.yy", b"V\nU\nW\n \n")
    with caplog.at_level("WARNING", logger="transformer.data.splits"):
        assert load_split(cfg, "dev") == (["v", "", "w", "x"], ["V", "U", "W", ""])
    assert [r.getMessage() for r in caplog.records] == [
        f"{tmp_path / 'corpus/dev.xx'} / {tmp_path / 'corpus/dev.yy'}: 2 line(s) with an empty side (2, 4), scored as "
        "they are (an empty source translates to an empty line; an empty reference is scored as empty)"]


def test_the_training_split_comes_from_train_dir_and_the_others_from_the_corpus(tmp_path):
    cfg = replace(_custom_corpus(tmp_path / "corpus"), train_dir=str(tmp_path / "more"), max_pairs=None)
    (tmp_path / "more").mkdir()
    _write(tmp_path / "more/train.xx.gz", b"a b\nc\nd\ne\nf\n", compress=True)
    _write(tmp_path / "more/train.yy.gz", b"A B\nC\nD\nE\nF\n", compress=True)
    assert corpus_paths(cfg, "train") == (tmp_path / "more/train.xx.gz", tmp_path / "more/train.yy.gz")
    assert load_split(cfg, "train") == (["a b", "c", "d", "e", "f"], ["A B", "C", "D", "E", "F"])
    assert load_split(cfg, "dev") == (["v"], ["V"])
    (tmp_path / "more/train.yy.gz").unlink()
    with pytest.raises(DataError, match=r"more/train\.yy\[\.gz\]: file not found .*data\.train_dir needs files"):
        corpus_paths(cfg, "train")
    with pytest.raises(DataError, match=r"^data\.train_dir=.*nowhere: directory not found"):
        corpus_paths(replace(cfg, train_dir=str(tmp_path / "nowhere")), "train")


def test_custom_corpus_missing_or_ambiguous_files(tmp_path):
    cfg = _custom_corpus(tmp_path / "corpus")
    with pytest.raises(DataError, match=r"test\.xx\[\.gz\]: file not found .*split 'test'.*\{split\}\.\{lang\}"):
        corpus_paths(cfg, "test")
    (tmp_path / "corpus/test.xx").mkdir()
    with pytest.raises(DataError, match=r"test\.xx is a directory; the test split's xx side must be a text file"):
        corpus_paths(cfg, "test")
    _write(tmp_path / "corpus/dev.xx.gz", b"v\n", compress=True)
    with pytest.raises(DataError, match=r"both .*dev\.xx and .*dev\.xx\.gz exist"):
        corpus_paths(cfg, "dev")
    with pytest.raises(DataError, match=r"data\.dir=.*nowhere: directory not found"):
        corpus_paths(DataConfig(corpus=CorpusKind.custom, dir=str(tmp_path / "nowhere")), "train")


def test_translation_dataset_from_texts():
    words = WordTokenizer.train(["a b c", "b c"], TokenizerConfig(kind=TokenizerKind.word))
    data = TranslationDataset.from_texts(["a b", "c"], ["b c a", ""], words, words)
    assert len(data) == 2 and data.src_lengths.tolist() == [2, 1] and data.tgt_lengths.tolist() == [3, 0]
    assert data[0] == (words.encode("a b"), words.encode("b c a")) and data[1][1] == []
    assert data[-1] == data[1] and data[-2] == data[0]  # negative indices count from the end, as for a list
    for outside in (2, -3):
        with pytest.raises(IndexError, match=f"pair {outside} of a dataset of 2 pairs"):
            data[outside]
    assert data.src_tokens.dtype == np.uint8  # 10 words + 4 specials fit one byte
    with pytest.raises(DataError, match="2 source but 1 target"):
        TranslationDataset.from_sequences([[4], [5]], [[6]])
    with pytest.raises(DataError, match="offsets must run from 0"):
        TranslationDataset(np.zeros(3, np.uint16), np.array([0, 2]), np.zeros(1, np.uint16), np.array([0, 1]))


def test_token_dtype_is_the_smallest_that_holds_the_vocabulary():
    assert [token_dtype(v) for v in (256, 257, 65536, 65537)] == [np.uint8, np.uint16, np.uint16, np.uint32]


# --------------------------------------------------------------------------------------------------
# Multi30k from a local copy (the download path is in test_download.py)
# --------------------------------------------------------------------------------------------------


@needs_multi30k
def test_checksums_in_code_match_the_upstream_files():
    main = {f"{s}.{l}.gz" for s in MULTI30K_SPLITS for l in MULTI30K_LANGS}
    extra = {f"{s}.{l}.gz" for s, langs in MULTI30K_EXTRA_TESTS.items() for l in langs}
    assert set(MULTI30K_SHA256) == main | extra
    local = [name for name in MULTI30K_SHA256 if (MULTI30K / name).is_file()]  # the extra test sets may be absent
    assert main <= set(local)
    for name in local:
        assert hashlib.sha256((MULTI30K / name).read_bytes()).hexdigest() == MULTI30K_SHA256[name], name


@needs_multi30k
def test_multi30k_is_copied_from_source_dir_and_loaded(tmp_path):
    cfg = DataConfig(dir=str(tmp_path / "m30k"), source_dir=str(MULTI30K))
    src, tgt = load_split(cfg, "val")
    assert sorted(p.name for p in (tmp_path / "m30k").iterdir()) == ["val.de.gz", "val.en.gz"]
    assert len(src) == len(tgt) == 1014
    assert src[0].startswith("A group of men are loading cotton")
    assert tgt[0].startswith("Eine Gruppe von Männern lädt Baumwolle")
    assert (tmp_path / "m30k/val.en.gz").read_bytes() == (MULTI30K / "val.en.gz").read_bytes()


@needs_multi30k
def test_corrupted_source_copy_is_rejected_and_nothing_is_left(tmp_path):
    source = tmp_path / "source"
    source.mkdir()
    shutil.copy(MULTI30K / "val.en.gz", source / "val.en.gz")
    corrupted = bytearray((MULTI30K / "val.de.gz").read_bytes())
    corrupted[100] ^= 0xFF
    (source / "val.de.gz").write_bytes(bytes(corrupted))
    actual = hashlib.sha256(bytes(corrupted)).hexdigest()
    target = tmp_path / "target"
    with pytest.raises(DataError) as info:
        prepare_multi30k(target, splits=("val",), source_dir=source)
    message = str(info.value)
    assert str(source / "val.de.gz") in message and MULTI30K_SHA256["val.de.gz"] in message and actual in message
    assert sorted(p.name for p in target.iterdir()) == ["val.en.gz"]  # the good file, verified; no temp file


@needs_multi30k
def test_corrupted_file_already_in_target_is_reported(tmp_path):
    (tmp_path / "val.en.gz").write_bytes(b"not the real file")
    with pytest.raises(DataError, match=r"val\.en\.gz: checksum mismatch: expected sha256 14f7d25d.*delete the file"):
        prepare_multi30k(tmp_path, langs=("en",), splits=("val",), source_dir=MULTI30K)


def test_a_run_records_its_local_copy_absolute_and_a_relative_one_not_found_names_where_it_was_looked_for(
        tmp_path, monkeypatch):
    # MULTI30K_DIR=../shared/data/multi30k, as the README has it: later commands run from other folders
    monkeypatch.chdir(tmp_path)
    recorded = anchored(DataConfig(source_dir="../copy", dir="corpus"))
    assert (recorded.source_dir, recorded.dir) == (str(tmp_path / ".." / "copy"), str(tmp_path / "corpus"))
    assert anchored(DataConfig()).source_dir is None  # none given: downloaded
    with pytest.raises(DataError, match=rf"=nowhere: directory not found \(relative to {re.escape(str(tmp_path))}, "
                                        r"where this command runs\); point it at"):
        prepare_multi30k(tmp_path / "target", langs=("en",), splits=("val",), source_dir="nowhere",
                         base_url="http://127.0.0.1:9/never")


def test_a_source_dir_that_does_not_exist_is_refused_not_downloaded_around(tmp_path):
    with pytest.raises(DataError, match=r"data.source_dir \(or env MULTI30K_DIR\)=.*nowhere: directory not found; "
                                        r"point it at a local copy of Multi30k, or leave it unset to download val.en.gz"):
        prepare_multi30k(tmp_path / "target", langs=("en",), splits=("val",), source_dir=tmp_path / "nowhere",
                         base_url="http://127.0.0.1:9/never")
    assert not (tmp_path / "target").exists()  # no folder is left that was made for files that never came
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "notes.txt").write_text("kept")
    (tmp_path / "empty").mkdir()  # there before, empty: kept, also when named through a folder that is not there
    for target in (tmp_path / "new" / "multi30k", tmp_path / "data" / "multi30k", tmp_path / "new" / ".." / "empty"):
        with pytest.raises(DataError, match="directory not found"):
            prepare_multi30k(target, langs=("en",), splits=("val",), source_dir=tmp_path / "nowhere")
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == ["data", "data/notes.txt", "empty"]


def test_a_split_multi30k_lacks_is_refused_naming_those_it_has(tmp_path):
    cfg = DataConfig(dir=str(tmp_path / "m30k"))
    with pytest.raises(DataError, match=r"^split=tset: Multi30k has no such split; it has train, val, "
                                        r"test_2016_flickr, test_2017_flickr, test_2017_mscoco, test_2018_flickr$"):
        load_split(cfg, "tset")  # a split asked for by name (transformer-evaluate split=tset)
    with pytest.raises(DataError, match=r"^data\.test_split=tset: Multi30k has no such split; it has train, "):
        load_split(DataConfig(dir=str(tmp_path / "m30k"), test_split="tset"), "tset")  # the key that names it
    (tmp_path / "m30k").mkdir()  # a split the user placed in the folder is read as it is
    for lang, line in (("en", "a house"), ("de", "ein Haus")):
        (tmp_path / "m30k" / f"mine.{lang}").write_text(line + "\n")
    assert load_split(cfg, "mine") == (["a house"], ["ein Haus"])


def test_unknown_multi30k_file_without_checksum_is_refused(tmp_path):
    with pytest.raises(DataError, match=r"test_2017_mscoco\.cs\.gz: not found, and no checksum is known"):
        prepare_multi30k(tmp_path, langs=("cs",), splits=("test_2017_mscoco",))


def test_the_large_corpus_script_refuses_to_write_over_its_source(tmp_path):
    source = write_toy_corpus(tmp_path / "toy")
    before = {p.name: p.read_bytes() for p in source.iterdir()}
    out = subprocess.run([sys.executable, str(REPO / "scripts" / "make_large_corpus.py"), str(source),
                          "--source", str(source), "--src", "src", "--tgt", "tgt"],
                         capture_output=True, text=True)
    assert out.returncode == 1 and "is the source corpus itself" in out.stderr
    assert {p.name: p.read_bytes() for p in source.iterdir()} == before


def test_the_large_corpus_script_checks_every_source_file_before_it_writes_one(tmp_path):
    source = write_toy_corpus(tmp_path / "toy")
    out = subprocess.run([sys.executable, str(REPO / "scripts" / "make_large_corpus.py"), str(tmp_path / "big"),
                          "--source", str(source), "--src", "src", "--tgt", "xx", "--times", "2"],
                         capture_output=True, text=True)
    assert (out.returncode, out.stdout) == (1, "")
    assert out.stderr == f"{source / 'train.xx'}[.gz]: file not found (set --source or MULTI30K_DIR)\n"
    assert not (tmp_path / "big").exists()
