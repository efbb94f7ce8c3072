"""The commands that use a trained model (evaluate, translate, average) on a toy run: scores, files, refusals."""

from __future__ import annotations

import gzip
import io
import logging
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import REPO
from omegaconf import OmegaConf

from transformer.app import translate_io, use
from transformer.checkpoint import CheckpointError, RunDir
from transformer.config import ConfigError
from transformer.data.corpus import DataError, read_parallel
from transformer.inference.loading import load_trained
from transformer.inference.metrics import corpus_scores
from transformer.interrupts import Interrupted, exit_status
from transformer.training.checkpoints import save_checkpoint


def test_evaluate_scores_and_dumps_attention(trained_run, compose_config, tmp_path, caplog):
    run_dir, metrics = trained_run
    cfg = compose_config("evaluate", [f"run_dir={run_dir}", "eval=greedy", f"output_dir={tmp_path}",
                                      "attention.indices=[0]", "attention.on_reference=true"])
    with caplog.at_level(logging.INFO, logger="transformer.app.use"):
        result = use.evaluate(OmegaConf.to_object(cfg))
    assert caplog.messages[-1] == f"wrote hypotheses.txt, metrics.json, tensorboard/, attention/ in {tmp_path}"
    assert all((tmp_path / name).exists() for name in ("hypotheses.txt", "metrics.json", "tensorboard", "attention"))
    assert result["bleu"] == pytest.approx(metrics["test_bleu"], abs=1e-6)  # same weights, same greedy search
    pngs = sorted(p.name for p in (tmp_path / "attention").glob("*.png"))
    assert "test0_hyp_cross_layer0.png" in pngs and "test0_ref_alignment.png" in pngs
    assert (tmp_path / "attention" / "test0_hyp.npz").is_file()


def test_evaluate_scores_another_split_of_the_corpus(trained_run, compose_config, tmp_path):
    run_dir, _ = trained_run
    val_refs = (run_dir.parent / "toy" / "val.tgt").read_text(encoding="utf-8").splitlines()
    cfg = compose_config("evaluate", [f"run_dir={run_dir}", "eval=greedy", f"output_dir={tmp_path}", "split=val"])
    result = use.evaluate(OmegaConf.to_object(cfg))
    assert result["test_set"] == "val.src-tgt" and result["n_sentences"] == len(val_refs) == 40
    by_hand = read_parallel(run_dir.parent / "toy" / "val.src", run_dir.parent / "toy" / "val.tgt")[1]
    assert corpus_scores((tmp_path / "hypotheses.txt").read_text(encoding="utf-8").splitlines(),
                         by_hand).bleu == pytest.approx(result["bleu"])
    with pytest.raises(ConfigError, match="split: give split=... or src_file/ref_file, not both"):
        OmegaConf.to_object(compose_config("evaluate", [f"run_dir={run_dir}", "split=val", "src_file=a",
                                                        "ref_file=b", f"output_dir={tmp_path}"]))
    cfg = compose_config("evaluate", [f"run_dir={run_dir}", f"output_dir={tmp_path}", "split=test_2099",
                                      "overwrite=true"])
    with pytest.raises(DataError, match=r"test_2099\.src\[\.gz\]: file not found"):
        use.evaluate(OmegaConf.to_object(cfg))
    cfg = compose_config("evaluate", [f"run_dir={run_dir}", f"output_dir={tmp_path}", "overwrite=true",
                                      f"src_file={run_dir.parent / 'toy' / 'val.src'}", "ref_file=missing.tgt"])
    with pytest.raises(ConfigError, match=r"^ref_file: missing\.tgt is not a file$"):
        use.evaluate(OmegaConf.to_object(cfg))


def test_evaluate_warns_of_blank_lines_in_the_files_it_scores(trained_run, compose_config, tmp_path, caplog):
    run_dir, _ = trained_run
    (tmp_path / "in.src").write_text("a b c\nd e\n \nf g\n", encoding="utf-8")
    (tmp_path / "in.ref").write_text("a b c\n\nh\nf g\n", encoding="utf-8")
    cfg = compose_config("evaluate", [f"run_dir={run_dir}", "eval=greedy", f"output_dir={tmp_path / 'out'}",
                                      f"src_file={tmp_path / 'in.src'}", f"ref_file={tmp_path / 'in.ref'}"])
    with caplog.at_level(logging.WARNING):
        assert use.evaluate(OmegaConf.to_object(cfg))["n_sentences"] == 4  # scored as they are
    assert f"{tmp_path / 'in.src'} / {tmp_path / 'in.ref'}: 2 line(s) with an empty side (2, 3), scored as they " \
           "are" in caplog.text


def test_evaluate_reads_multi30k_from_this_machines_copy_when_the_recorded_one_is_not_here(
        trained_run, compose_config, multi30k, tmp_path, monkeypatch):
    # a run trained on another machine: neither its copy of Multi30k nor its data.dir is here
    state = torch.load(trained_run[0] / "checkpoints" / "final.pt", weights_only=True)
    state["config"]["data"].update(corpus="multi30k", src="en", tgt="de", dir="/nowhere/alice/data/multi30k",
                                   source_dir="../shared/data/multi30k")  # relative, as runs before 0.9.18 have it
    save_checkpoint(state, tmp_path / "moved.pt")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MULTI30K_DIR", raising=False)
    overrides = [f"checkpoint={tmp_path / 'moved.pt'}", "eval=greedy", "split=val", "longer_than=30"]
    cfg = compose_config("evaluate", [*overrides, "output_dir=out"])
    with pytest.raises(DataError, match=r"env MULTI30K_DIR\)=\.\./shared/data/multi30k: directory not found \(relative "
                                        rf"to {re.escape(str(tmp_path))}, where this command runs\)"):
        use.evaluate(OmegaConf.to_object(cfg))
    monkeypatch.setenv("MULTI30K_DIR", str(multi30k))  # this machine's copy, as the message asks
    result = use.evaluate(OmegaConf.to_object(compose_config("evaluate", [*overrides, "output_dir=out2"])))
    scored = int(re.fullmatch(r"val\.en-de \(pairs with > 30 tokens on a side: (\d+)\)", result["test_set"])[1])
    assert 0 < scored == len((tmp_path / "out2" / "hypotheses.txt").read_text(encoding="utf-8").splitlines()) < 1014
    assert sorted(p.name for p in (tmp_path / "data" / "multi30k").iterdir()) == ["val.de.gz", "val.en.gz"]  # as a
    # new run here would have them: copied and verified
    state["config"]["data"].update(source_dir=str(multi30k), dir=None)  # the recorded copy is here: it is read,
    save_checkpoint(state, tmp_path / "here.pt")  # whatever MULTI30K_DIR says
    monkeypatch.setenv("MULTI30K_DIR", str(tmp_path / "stale"))
    cfg = compose_config("evaluate", [f"checkpoint={tmp_path / 'here.pt'}", "eval=greedy", "split=test_2016_flickr",
                                      "longer_than=30", "output_dir=out3"])
    assert use.evaluate(OmegaConf.to_object(cfg))["test_set"].startswith("test_2016_flickr.en-de")


def test_evaluate_longer_than_scores_only_the_long_pairs(trained_run, compose_config, tmp_path):
    run_dir, _ = trained_run
    test_src = (run_dir.parent / "toy" / "test.src").read_text(encoding="utf-8").splitlines()
    long = [line for line in test_src if len(line.split()) > 5]  # word tokens: a copy task, both sides alike
    assert 0 < len(long) < len(test_src)
    cfg = compose_config("evaluate", [f"run_dir={run_dir}", "eval=greedy", f"output_dir={tmp_path}", "longer_than=5"])
    result = use.evaluate(OmegaConf.to_object(cfg))
    assert result["test_set"].endswith(f"(pairs with > 5 tokens on a side: {len(long)})")
    assert len((tmp_path / "hypotheses.txt").read_text(encoding="utf-8").splitlines()) == len(long)
    cfg = compose_config("evaluate", [f"run_dir={run_dir}", f"output_dir={tmp_path / 'again'}", "longer_than=7"])
    with pytest.raises(ConfigError, match="longer_than: no test pair has more than 7 tokens"):
        use.evaluate(OmegaConf.to_object(cfg))


def test_evaluate_and_translate_an_ensemble_of_the_run_with_itself(trained_run, compose_config, tmp_path):
    run_dir, metrics = trained_run  # a model mixed with itself is that model: the same BLEU and translations
    final = RunDir(run_dir).final
    cfg = compose_config("evaluate", [f"run_dir={run_dir}", "eval=greedy", f"output_dir={tmp_path}",
                                      f"ensemble=[{final},{run_dir}]"])
    result = use.evaluate(OmegaConf.to_object(cfg))
    assert result["bleu"] == pytest.approx(metrics["test_bleu"], abs=1e-6)
    assert result["ensemble"] == [str(final), str(final)]
    (tmp_path / "in.txt").write_text("a b c\nd e f g\n", encoding="utf-8")
    outputs = []
    for ensemble in ([], [str(run_dir)]):
        cfg = compose_config("translate", [f"run_dir={run_dir}", f"input={tmp_path / 'in.txt'}",
                                           f"output={tmp_path / 'out.txt'}", f"ensemble={ensemble}",
                                           "overwrite=true"])
        use.translate(OmegaConf.to_object(cfg))
        outputs.append((tmp_path / "out.txt").read_text(encoding="utf-8"))
    assert outputs[0] == outputs[1] and len(outputs[0].splitlines()) == 2


def test_translate_cli_keeps_line_alignment(trained_run, tmp_path):
    run_dir, _ = trained_run
    text = "a b c\n\nd e f g\n\u00e9\u00e8 \u2603 \U0001F600\nh\n" + "a " * 1030 + "\n"  # 1030 > 1024 positions
    out = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "translate.py"), f"run_dir={run_dir}", "eval=greedy", "device=cpu"],
        input=text, capture_output=True, text=True, check=True, cwd=tmp_path,
    )
    lines = out.stdout.split("\n")[:-1]
    assert len(lines) == 6 and lines[1] == ""
    assert lines[0].split() == ["a", "b", "c"]
    # the cut line is a log line of the app, not a Python warning pointing into its code
    assert ("[WARNING] transformer.inference.translation: 1 input line(s) longer than 1024 source tokens were "
            "truncated: line 6 (1030 tokens)\n") in out.stderr
    assert "TruncationWarning" not in out.stderr and "translation.py:" not in out.stderr


def test_translate_answers_each_line_typed_at_a_terminal_before_the_input_ends(trained_run, tmp_path):
    import pty
    import select

    def read_line(stream, timeout: float = 120.0) -> str:
        assert select.select([stream], [], [], timeout)[0], "no translation came while the terminal stayed open"
        return stream.readline().decode("utf-8")

    terminal, typed_into = pty.openpty()  # stdin a terminal, as when a person types the sentences
    process = subprocess.Popen([sys.executable, "-m", "transformer", "translate", f"run_dir={trained_run[0]}",
                                "eval=greedy", "device=cpu"], cwd=tmp_path, stdin=typed_into,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    os.close(typed_into)
    try:
        os.write(terminal, b"a b c\n")
        assert read_line(process.stdout).split() == ["a", "b", "c"]  # answered with the input still open
        os.write(terminal, b"\n")
        assert read_line(process.stdout) == "\n"
        os.write(terminal, b"caf\xe9\n")  # Latin-1, not UTF-8: refused in a line on stderr, the session goes on
        os.write(terminal, b"d e f g\n\x04")  # a last line, then Ctrl-D
        assert read_line(process.stdout).split() == ["d", "e", "f", "g"]
        assert process.wait(timeout=60) == 0
        stderr = process.stderr.read().decode("utf-8")
        assert "Type a sentence and press Enter; Ctrl-D ends." in stderr and "Traceback" not in stderr
        assert "input: line 3 is not valid UTF-8 (unexpected end of data at byte 3); set the terminal" in stderr
    finally:
        process.kill()
        os.close(terminal)
        process.stdout.close()
        process.stderr.close()

    terminal, typed_into = pty.openpty()
    reader, writer = os.pipe()
    os.close(reader)  # `transformer-translate run_dir=... | head -0` at a terminal: nobody reads the translations
    try:
        process = subprocess.Popen([sys.executable, "-m", "transformer", "translate", f"run_dir={trained_run[0]}",
                                    "eval=greedy", "device=cpu"], cwd=tmp_path, stdin=typed_into, stdout=writer,
                                   stderr=subprocess.PIPE)
        os.close(typed_into)
        os.close(writer)
        os.write(terminal, b"a b c\n")
        assert process.wait(timeout=120) == 141
        assert b"Traceback" not in process.stderr.read()
    finally:
        process.kill()
        os.close(terminal)
        process.stderr.close()


def test_n_best_translations_are_columns_and_an_empty_line_keeps_them(tmp_path):
    out = tmp_path / "out.txt"
    translate_io.write_translations(str(out), [["ein Hund", "der Hund"], ["", ""], ["Katze", ""]])
    assert out.read_text(encoding="utf-8") == "ein Hund\tder Hund\n\t\nKatze\t\n"


def test_each_line_typed_at_a_terminal_that_gets_an_empty_translation_draws_a_warning(monkeypatch, capsys, caplog):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"a b\n\nc\nd e\nc\n"), encoding="utf-8"))
    with caplog.at_level(logging.WARNING, logger="transformer.app.translate_io"):
        translate_io.translate_as_typed(lambda lines: [["" if line == "c" or not line else line.upper()]
                                                       for line in lines])
    assert capsys.readouterr().out == "A B\n\n\nD E\n\n"
    assert [record.getMessage()[:56] for record in caplog.records] == [
        "1 of 1 non-blank lines got an empty translation (line 3)",
        "1 of 1 non-blank lines got an empty translation (line 5)"]


def test_lines_without_a_token_the_model_reads_are_warned_of_apart(caplog):
    """A line of characters the source vocabulary drops (a zero-width space, say) translates to nothing: said as
    such, not blamed on the model."""
    lines, nbest = ["a b", "\u200b", "c", "\u200b \u200b", ""], [["A B"], [""], [""], [""], [""]]
    with caplog.at_level(logging.WARNING, logger="transformer.app.translate_io"):
        assert translate_io.warn_of_empty_translations(lines, nbest, first_line_no=11,
                                                       reads=lambda line: "\u200b" not in line)
    assert [record.getMessage() for record in caplog.records] == [
        "2 non-blank line(s) have no token the model reads, so their translation is empty (line 12, 14): the source "
        "tokenizer drops every character of them (zero-width or control characters)",
        "1 of 2 non-blank lines got an empty translation (line 13): the model ends its translations at once, as one "
        "trained for a few steps does (debug=cpu_tiny); transformer-evaluate gives its BLEU"]


def _upper_until(stop_at: str):
    """A translation of lines (upper case) that fails, as Ctrl-C or a crash would, at the line ``stop_at``."""
    def translate_lines(lines: list[str]) -> list[list[str]]:
        if stop_at in lines:
            raise KeyboardInterrupt
        return [[line.upper()] for line in lines]
    return translate_lines


def test_a_translation_stopped_by_sigterm_keeps_its_windows_and_exits_as_sigterm(monkeypatch, tmp_path):
    monkeypatch.setattr(translate_io, "WINDOW_LINES", 2)

    def stopped_at_c(lines: list[str]) -> list[list[str]]:
        if "c" in lines:
            raise Interrupted(signum=signal.SIGTERM)  # a scheduler's stop
        return [[line.upper()] for line in lines]

    out = tmp_path / "out.txt"
    with pytest.raises(Interrupted, match=r"lines 1-2 of 5 are in .*out\.txt\.partial$") as raised:
        translate_io.translate_in_windows(["a", "b", "c", "d", "e"], stopped_at_c, str(out))
    assert exit_status(raised.value) == 143 and Path(f"{out}.partial").read_text(encoding="utf-8") == "A\nB\n"


def test_a_long_input_goes_out_window_by_window_and_an_interruption_keeps_the_windows_done(
        monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(translate_io, "WINDOW_LINES", 2)
    lines = ["a", "b", "c", "d", "e"]
    out = tmp_path / "out.txt"
    translate_io.translate_in_windows(lines, _upper_until("none"), str(out))
    assert out.read_text(encoding="utf-8") == "A\nB\nC\nD\nE\n" and not Path(f"{out}.partial").exists()
    out.unlink()
    with pytest.raises(KeyboardInterrupt, match=rf"^interrupted; the translations of lines 1-4 of 5 are in "
                                                rf"{re.escape(str(out))}\.partial$"):
        translate_io.translate_in_windows(lines, _upper_until("e"), str(out))
    assert not out.exists() and Path(f"{out}.partial").read_text(encoding="utf-8") == "A\nB\nC\nD\n"
    Path(f"{out}.partial.1").write_text("kept\n", encoding="utf-8")
    with pytest.raises(KeyboardInterrupt, match=rf"lines 1-2 of 5 are in {re.escape(str(out))}\.partial\.2$"):
        translate_io.translate_in_windows(lines, _upper_until("c"), str(out))  # the earlier ones are left alone
    assert [Path(f"{out}.partial{n}").read_text(encoding="utf-8") for n in ("", ".1", ".2")] == [
        "A\nB\nC\nD\n", "kept\n", "A\nB\n"]
    for n in (".1", ".2"):
        Path(f"{out}.partial{n}").unlink()
    with pytest.raises(KeyboardInterrupt):  # stdout: the windows done were written as they were done
        translate_io.translate_in_windows(lines, _upper_until("c"), None)
    assert capsys.readouterr().out == "A\nB\n"
    Path(f"{out}.partial").unlink()
    with pytest.raises(KeyboardInterrupt, match="^$"):  # nothing done: nothing to keep
        translate_io.translate_in_windows(lines, _upper_until("a"), str(out))
    assert list(tmp_path.iterdir()) == []


def test_translate_warns_once_of_lines_that_got_an_empty_translation(compose_config, trained_run, tmp_path,
                                                                    monkeypatch, caplog):
    """An undertrained model ends its hypotheses at once; its empty lines are named in one warning (a blank input
    line is not counted), and a model that translates every line draws none."""
    source = tmp_path / "in.txt"
    source.write_text("a b c\nd e f\n\ng h\n", encoding="utf-8")
    cfg = compose_config("translate", [f"run_dir={trained_run[0]}", "eval=greedy", "device=cpu",
                                       f"input={source}", f"output={tmp_path / 'out.txt'}", "overwrite=true"])
    with caplog.at_level(logging.WARNING, logger="transformer.app.translate_io"):
        use.translate(OmegaConf.to_object(cfg))
    assert "empty translation" not in caplog.text
    assert all(line for i, line in enumerate((tmp_path / "out.txt").read_text(encoding="utf-8").splitlines()) if i != 2)

    translate_texts = use.translate_texts  # the real model, its second line's translation emptied

    def second_line_empty(*args, **kwargs):
        nbest = translate_texts(*args, **kwargs)
        return [nbest[0], [""], *nbest[2:]]

    monkeypatch.setattr(use, "translate_texts", second_line_empty)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="transformer.app.translate_io"):
        use.translate(OmegaConf.to_object(cfg))
    warnings = [record.getMessage() for record in caplog.records if "empty translation" in record.getMessage()]
    assert len(warnings) == 1 and warnings[0].startswith("1 of 3 non-blank lines got an empty translation (line 2)")


def test_translate_writes_through_links_pipes_and_devices_and_keeps_a_files_mode(compose_config, trained_run,
                                                                                  tmp_path, monkeypatch, capsys):
    """An output that a rename would replace is written through, as a shell's ``>`` writes it: a symbolic link's
    file, a named pipe and a device (no overwrite=true needed: nothing is replaced); a replaced file keeps its mode.
    ``-`` names stdin and stdout, and an empty ``input=`` or ``output=`` is refused by key."""
    import threading

    run_dir, _ = trained_run
    source = tmp_path / "in.txt"
    source.write_text("a b c\nd e\n", encoding="utf-8")

    def translate(*overrides: str) -> None:
        use.translate(OmegaConf.to_object(compose_config("translate", [
            f"run_dir={run_dir}", "eval=greedy", "device=cpu", f"input={source}", *overrides])))

    plain = tmp_path / "plain.txt"
    translate(f"output={plain}")
    expected = plain.read_text(encoding="utf-8")
    assert len(expected.splitlines()) == 2

    private = tmp_path / "private.txt"
    private.write_text("old\n")
    private.chmod(0o600)
    previous = os.umask(0o022)  # a new file would be 644: the mode kept is the replaced file's, not the umask's
    try:
        translate(f"output={private}", "overwrite=true")
    finally:
        os.umask(previous)
    assert private.read_text(encoding="utf-8") == expected and private.stat().st_mode & 0o777 == 0o600

    target, link = tmp_path / "target.txt", tmp_path / "link.txt"
    target.write_text("old\n")
    link.symlink_to(target.name)
    translate(f"output={link}", "overwrite=true")
    assert link.is_symlink() and target.read_text(encoding="utf-8") == expected
    dangling = tmp_path / "dangling.txt"  # a link into a folder that is not there: refused before any translating
    dangling.symlink_to(tmp_path / "missing" / "out.txt")
    with pytest.raises(ConfigError, match=rf"^output: the directory {tmp_path / 'missing'} does not exist"):
        translate(f"output={dangling}")

    pipe, received = tmp_path / "pipe", []
    os.mkfifo(pipe)
    reader = threading.Thread(target=lambda: received.append(pipe.read_text(encoding="utf-8")), daemon=True)
    reader.start()
    translate(f"output={pipe}")
    reader.join(timeout=60)
    assert received == [expected] and pipe.is_fifo()

    translate(f"output={os.devnull}")  # exists, yet is no file to keep: written to without overwrite=true
    assert Path(os.devnull).is_char_device()

    capsys.readouterr()
    for output in ("-", "/dev/stdout"):  # /dev/stdout is stdout, whatever the shell made of it
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(source.read_bytes())))
        translate("input=-", f"output={output}")
        assert capsys.readouterr().out == expected
    for key in ("input", "output"):
        with pytest.raises(ConfigError, match=rf"^{key}: is empty; give a file, or leave {key} out \(or {key}=-\)"):
            translate(f"{key}=")


def test_translate_reads_lines_as_the_corpus_reader_does(compose_config, trained_run, tmp_path, monkeypatch):
    """Only newlines end lines (a form feed or U+2028 inside one does not), CRLF counts once, and bad UTF-8 or an
    output path that cannot be written is refused, by key and line, before any translating."""
    run_dir, _ = trained_run
    source = tmp_path / "in.txt"
    source.write_bytes("a b\u2028c\r\nd\x0ce\n\nf g\n".encode("utf-8"))
    out = tmp_path / "out.txt"

    def translate(*overrides: str):
        return compose_config("translate", [f"run_dir={run_dir}", "eval=greedy", "device=cpu", *overrides])

    use.translate(OmegaConf.to_object(translate(f"input={source}", f"output={out}")))
    lines = out.read_text(encoding="utf-8").split("\n")[:-1]
    assert len(lines) == 4 and lines[2] == ""

    translations = []
    for mark in (b"", b"\xef\xbb\xbf"):  # a byte-order mark (Notepad's UTF-8) is not part of line 1
        source.write_bytes(mark + b"a\nf g\n")
        use.translate(OmegaConf.to_object(translate(f"input={source}", f"output={out}", "overwrite=true")))
        translations.append(out.read_text(encoding="utf-8"))
    packed = tmp_path / "in.txt.gz"  # compressed as a corpus may be: read as the corpus reader reads it
    packed.write_bytes(gzip.compress(b"a\nf g\n"))
    use.translate(OmegaConf.to_object(translate(f"input={packed}", f"output={out}", "overwrite=true")))
    assert out.read_text(encoding="utf-8") == translations[0]
    packed.write_bytes(gzip.compress(b"a\nf g\n")[:-12])  # cut short
    with pytest.raises(ConfigError, match=rf"^input: {packed} begins as gzip but cannot be decompressed"):
        use.translate(OmegaConf.to_object(translate(f"input={packed}", f"output={out}", "overwrite=true")))
    assert translations[0] == translations[1]

    source.write_bytes(b"a b\nc \xff d\n")
    with pytest.raises(ConfigError, match=rf"^input: {source}:2 is not valid UTF-8"):
        use.translate(OmegaConf.to_object(translate(f"input={source}", f"output={out}", "overwrite=true")))
    for data, found in ((b"a b\nc\0d\n", r":2: a NUL byte \(byte 1 of the line\)"),
                        ("a b\n".encode("utf-16"), r":1: UTF-16, not UTF-8")):
        source.write_bytes(data)
        with pytest.raises(ConfigError, match=rf"^input: {source}{found}"):
            use.translate(OmegaConf.to_object(translate(f"input={source}", f"output={out}", "overwrite=true")))
    with pytest.raises(ConfigError, match=r"^output: the directory .*nowhere does not exist"):
        use.translate(OmegaConf.to_object(translate(f"input={source}", f"output={tmp_path / 'nowhere' / 'o'}")))
    source.write_text("a b\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"^output: .*in\.txt is the input file"):  # the same file, named otherwise
        use.translate(OmegaConf.to_object(translate(f"input={source}", f"output={tmp_path / '.' / 'in.txt'}")))
    assert source.read_text(encoding="utf-8") == "a b\n"
    (tmp_path / "locked").mkdir()  # a folder without write permission (the tests may run as root, who has it)
    real_access = os.access
    monkeypatch.setattr(translate_io.os, "access", lambda path, mode: Path(path).name != "locked" and real_access(
        path, mode))
    monkeypatch.setattr(use, "translate_texts", lambda *args, **kwargs: pytest.fail("decoded before refusing"))
    with pytest.raises(ConfigError, match=r"^output: cannot write in .*locked \(permission denied\)"):
        use.translate(OmegaConf.to_object(translate(f"input={source}", f"output={tmp_path / 'locked' / 'o'}")))
    monkeypatch.setattr(sys, "stdin", None)  # `transformer-translate ... <&-`
    with pytest.raises(ConfigError, match=r"^input: stdin is closed; give input=FILE, or pipe the sentences in$"):
        use.translate(OmegaConf.to_object(translate()))


def test_evaluate_refuses_attention_indices_outside_the_test_set_before_decoding(compose_config, trained_run,
                                                                                 tmp_path):
    cfg = compose_config("evaluate", [f"run_dir={trained_run[0]}", "eval=greedy", "device=cpu",
                                      "attention.indices=[0,999999]", f"output_dir={tmp_path / 'ev'}"])
    with pytest.raises(ConfigError, match=r"^attention.indices: 999999 is outside the sentences scored, "
                                          r"test\.src-tgt \(0\.\.\d+\)$"):
        use.evaluate(OmegaConf.to_object(cfg))
    assert not (tmp_path / "ev").exists()  # nothing decoded, nothing written


def test_evaluate_refuses_an_output_dir_it_cannot_write_by_its_key_before_loading(compose_config, trained_run,
                                                                                    tmp_path, monkeypatch):
    def evaluate(output_dir: Path) -> None:
        cfg = compose_config("evaluate", [f"run_dir={trained_run[0]}", "eval=greedy", "device=cpu",
                                          f"output_dir={output_dir}"])
        use.evaluate(OmegaConf.to_object(cfg))

    monkeypatch.setattr(use, "load_model", lambda *args: pytest.fail("loaded the model before refusing"))
    (tmp_path / "notes").write_text("a file\n")
    with pytest.raises(ConfigError, match=rf"^output_dir: {tmp_path / 'notes'} is a file, not a folder; choose "):
        evaluate(tmp_path / "notes" / "ev")
    (tmp_path / "locked").mkdir()  # without write permission (the tests may run as root, who has it)
    real_access = os.access
    monkeypatch.setattr(translate_io.os, "access", lambda path, mode: Path(path).name != "locked" and real_access(
        path, mode))
    with pytest.raises(ConfigError, match=rf"^output_dir: cannot write in {tmp_path / 'locked'} \(permission denied\)"):
        evaluate(tmp_path / "locked" / "new" / "ev")  # the nearest folder that exists is the one checked
    assert sorted(path.name for path in tmp_path.iterdir()) == ["locked", "notes"]  # nothing made


def test_translate_into_a_pipe_its_reader_closed_ends_quietly(trained_run, tmp_path):
    import os
    import subprocess
    import sys

    reader, writer = os.pipe()
    os.close(reader)  # `transformer-translate ... | head -0`: nobody reads the translations
    try:
        completed = subprocess.run([sys.executable, "-m", "transformer", "translate", f"run_dir={trained_run[0]}",
                                    "eval=greedy", "device=cpu"], cwd=tmp_path, input=b"a b\n" * 20,
                                   stdout=writer, stderr=subprocess.PIPE)
    finally:
        os.close(writer)
    assert completed.returncode == 141 and b"Traceback" not in completed.stderr, completed.stderr.decode()


def test_average_writes_only_a_new_file_from_checkpoints_of_one_language_pair(trained_run, tmp_path):
    run = RunDir(trained_run[0])
    steps = sorted(run.checkpoints.glob("step_*.pt"), key=lambda path: int(path.stem.removeprefix("step_")))
    a, b = (str(path) for path in steps[-2:])
    before = Path(a).read_bytes()
    with pytest.raises(ConfigError, match=r"step_\d+\.pt exists; the first argument names the new file"):
        use.average([b, str(run.checkpoints / "final.pt")], a)  # OUT forgotten: the first input as output
    assert Path(a).read_bytes() == before

    use.average([a, b], str(tmp_path / "avg.pt"))
    averaged = load_trained(tmp_path / "avg.pt", torch.device("cpu")).model.state_dict()
    members = [load_trained(path, torch.device("cpu")).model.state_dict() for path in (a, b)]
    for key, value in averaged.items():
        torch.testing.assert_close(value, (members[0][key] + members[1][key]) / 2)

    other = torch.load(b, weights_only=True)
    other["config"]["data"]["src"], other["config"]["data"]["tgt"] = "de", "en"  # as a de->en run's checkpoint
    save_checkpoint(other, tmp_path / "de_en.pt")
    with pytest.raises(ConfigError, match=r"de_en\.pt \(de->en, vocabularies of \d+ and \d+\) differs from "
                                          r".*\(src->tgt, .*in its language pair; averaged checkpoints must share"):
        use.average([a, str(tmp_path / "de_en.pt")], str(tmp_path / "mixed.pt"))
    assert not (tmp_path / "mixed.pt").exists()

    linked = tmp_path / "linked.pt"  # another name of one file (as best.pt and last.pt are): counted once or refused
    os.link(b, linked)
    with pytest.raises(CheckpointError, match=r"linked\.pt is the same file as .*step_\d+\.pt \(a run's best\.pt and "
                                          r"last\.pt are links to its step_N\.pt files\): name each checkpoint once"):
        use.average([a, b, str(linked)], str(tmp_path / "twice.pt"))
    assert not (tmp_path / "twice.pt").exists()
