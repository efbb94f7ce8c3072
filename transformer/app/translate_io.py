"""The input and output of ``transformer-translate``: its input read line for line as the corpus reader reads a
corpus, or translated line by line as a person types it at a terminal; its output, a file checked before any
decoding so that a refusal loses no work, or stdout. A long input is translated in windows of lines: stdout gets
each window as it is done, and a run stopped part way keeps the windows done (``OUTPUT.partial``)."""

from __future__ import annotations

import gzip
import itertools
import logging
import os
import sys
import warnings
import zlib
from pathlib import Path
from typing import Callable, Iterator

from transformer import files
from transformer.config import ConfigError
from transformer.data.corpus import not_plain_text
from transformer.interrupts import Interrupted, signal_of

log = logging.getLogger(__name__)

WINDOW_LINES = 10_000  # lines translated (sorted by length within), warned of and written at a time


def check_output_file(path: str, input_path: str | None, overwrite: bool) -> None:
    """Refuse, before any decoding, an ``output`` file that would replace the input or earlier results (unless
    ``overwrite``), that names a folder, or whose folder is missing or not writable."""
    target = Path(path)
    if input_path is not None and target.resolve() == Path(input_path).resolve():
        raise ConfigError(f"output: {path} is the input file; the translations would replace the sentences, so "
                          "choose another file")
    if target.is_dir():
        raise ConfigError(f"output: {path} is a directory; give a file name")
    if files.is_stream(target):  # /dev/null, /dev/stdout, a named pipe: written to, never replaced
        return
    if target.exists() and not overwrite:
        raise ConfigError(f"output: {path} exists; choose a new file, or overwrite=true to replace it")
    folder = Path(os.path.realpath(target)).parent  # a symbolic link's file is written, in its own folder
    if not folder.is_dir():
        raise ConfigError(f"output: the directory {folder} does not exist; create it or choose another file")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ConfigError(f"output: cannot write in {folder} (permission denied); choose another file")


def check_output_folder(key: str, path: str | Path) -> None:
    """Refuse, before any work, a folder to write results into that cannot be made or written: ``key`` names the
    setting. Nothing is created: the folder, or the nearest one above it that exists, must be a writable folder."""
    folder = Path(path).absolute()
    existing = next(p for p in (folder, *folder.parents) if p.exists())
    if not existing.is_dir():
        raise ConfigError(f"{key}: {existing} is a file, not a folder; choose another folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(f"{key}: cannot write in {existing} (permission denied); choose another folder")


def read_lines(path: str | None) -> list[str]:
    """The lines of ``path`` (stdin if None), split at newlines only: a form feed or U+2028 inside a line stays
    in it, so there is one output line per input line. A Windows ``\\r\\n`` ending counts as one newline, and a
    UTF-8 byte-order mark at the start is dropped; gzip-compressed input is decompressed. UTF-16 and NUL bytes
    are refused naming the line, before anything is translated."""
    name = "stdin" if path is None else path
    if path is None and sys.stdin is None:
        raise ConfigError("input: stdin is closed; give input=FILE, or pipe the sentences in")
    try:
        data = sys.stdin.buffer.read() if path is None else Path(path).read_bytes()
    except IsADirectoryError:
        raise ConfigError(f"input: {path} is a directory; give a text file with one sentence per line") from None
    except FileNotFoundError:
        raise ConfigError(f"input: {path} not found") from None
    compressed = data.startswith(b"\x1f\x8b")  # gzip's magic bytes: read as the corpus reader reads a compressed corpus
    if compressed:
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as error:
            raise ConfigError(f"input: {name} begins as gzip but cannot be decompressed ({error})") from None
    rows = data.removeprefix(b"\xef\xbb\xbf").split(b"\n")  # a byte-order mark is not text, as the corpus reader has it
    if rows[-1] == b"":
        rows.pop()  # the newline that ends the last line
    lines = []
    for number, row in enumerate(rows, start=1):
        if (found := not_plain_text(row, number, path or "FILE", compressed)) is not None:  # before any is translated
            raise ConfigError(f"input: {name}:{number}: {found}")
        try:
            lines.append(row.removesuffix(b"\r").decode("utf-8"))
        except UnicodeDecodeError as error:
            raise ConfigError(f"input: {name}:{number} is not valid UTF-8 ({error.reason} at byte {error.start})") \
                from None
    return lines


def translate_in_windows(lines: list[str], translate_lines: Callable[[list[str]], list[list[str]]],
                         output: str | None, reads: Callable[[str], bool] = bool) -> None:
    """Translate ``lines`` ``WINDOW_LINES`` at a time into ``output`` (None: stdout, each window as it is done; a
    device or a named pipe alike).

    A file is written whole at the end; a Ctrl-C or a failure after some windows keeps their translations in
    ``OUTPUT.partial`` (its lines are the first lines of the input; ``OUTPUT.partial.1`` and on when that exists)
    and says so. ``reads``: whether the model reads a token of a line (:func:`warn_of_empty_translations`)."""
    if output is not None and files.is_stream(output):
        with open(output, "w", encoding="utf-8") as stream:
            for nbest in _windows(lines, translate_lines, reads):
                try:
                    stream.write(_as_text(nbest))
                    stream.flush()
                except BrokenPipeError:  # a reader of the pipe that stopped early, as on stdout
                    sys.exit(141)
        return
    done: list[list[str]] = []
    try:
        for nbest in _windows(lines, translate_lines, reads):
            if output is None:
                write_translations(None, nbest)
            else:
                done += nbest
        if output is not None:
            write_translations(output, done)
    except BaseException as error:
        if output is None or not done:
            raise
        partial = _free_name(f"{output}.partial")
        write_translations(partial, done)
        kept = f"the translations of lines 1-{len(done)} of {len(lines)} are in {partial}"
        if isinstance(error, KeyboardInterrupt):
            raise Interrupted(f"interrupted; {kept}", signal_of(error)) from None
        log.error("translate failed; %s", kept)
        raise


def _free_name(path: str) -> str:
    """``path``, or when that exists (an earlier run's partial output, say) the first free ``path.1``, ``path.2``,
    ...: nothing kept is overwritten."""
    if not os.path.lexists(path):
        return path
    return next(f"{path}.{n}" for n in itertools.count(1) if not os.path.lexists(f"{path}.{n}"))


def _windows(lines: list[str], translate_lines: Callable[[list[str]], list[list[str]]],
             reads: Callable[[str], bool]) -> Iterator[list[list[str]]]:
    """The translations of each window of ``lines``; lines with words but an empty translation are warned of."""
    for start in range(0, len(lines), WINDOW_LINES):
        window = lines[start:start + WINDOW_LINES]
        nbest = translate_lines(window)
        warn_of_empty_translations(window, nbest, first_line_no=start + 1, reads=reads)
        yield nbest


def _as_text(nbest: list[list[str]]) -> str:
    """One line per input line, its n-best joined by tabs."""
    return "".join("\t".join(candidates) + "\n" for candidates in nbest)


def write_translations(path: str | None, nbest: list[list[str]]) -> None:
    """One line per input line, its n-best joined by tabs, into the file ``path`` (a regular file written
    atomically: a crash leaves any earlier file as it was; through a symbolic link, the file it points to) or
    stdout. A reader of stdout that stopped early (``| head``) ends the command quietly with 141, the status of a
    process ended by SIGPIPE."""
    text = _as_text(nbest)
    if path is not None:
        files.write_text_through(path, text)
        return
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:  # what the reader read is what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so that the flush at exit fails no more
        sys.exit(141)


def translate_as_typed(translate_lines: Callable[[list[str]], list[list[str]]],
                       reads: Callable[[str], bool] = bool) -> None:
    """Translate each line typed at a terminal when Enter ends it, until Ctrl-D: read whole, stdin would give
    nothing back before the end of the input. Each warning comes after the line it is about, every time."""
    print("Type a sentence and press Enter; Ctrl-D ends.", file=sys.stderr, flush=True)
    for line_no, row in enumerate(sys.stdin.buffer, start=1):
        try:
            line = row.removesuffix(b"\n").removesuffix(b"\r").decode("utf-8")
        except UnicodeDecodeError as error:  # a terminal in another encoding: this line is lost, not the session
            log.error("input: line %d is not valid UTF-8 (%s at byte %d); set the terminal to UTF-8 and type it "
                      "again", line_no, error.reason, error.start)
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("always")  # a second over-long line is warned of too
            candidates = translate_lines([line])[0]
        warn_of_empty_translations([line], [candidates], first_line_no=line_no, reads=reads)
        write_translations(None, [candidates])


def warn_of_empty_translations(lines: list[str], nbest: list[list[str]], first_line_no: int = 1,
                               reads: Callable[[str], bool] = bool) -> bool:
    """Warn when lines with words got an empty best translation: what an undertrained model gives (it ends every
    hypothesis at once), which printed alone looks like a command that did nothing; or what a line gets that has no
    token the model reads (``reads(line)`` false: only characters its tokenizer drops, such as a zero-width space),
    said apart. One warning names each kind's lines; returns whether there was one."""
    empty = [(line_no, reads(line)) for line_no, (line, candidates) in enumerate(zip(lines, nbest),
                                                                                 start=first_line_no)
             if line.strip() and not candidates[0]]
    unread = [line_no for line_no, read in empty if not read]
    ended = [line_no for line_no, read in empty if read]
    if unread:
        log.warning("%d non-blank line(s) have no token the model reads, so their translation is empty (line %s): "
                    "the source tokenizer drops every character of them (zero-width or control characters)",
                    len(unread), _shown(unread))
    if ended:
        log.warning("%d of %d non-blank lines got an empty translation (line %s): the model ends its translations "
                    "at once, as one trained for a few steps does (debug=cpu_tiny); transformer-evaluate gives its "
                    "BLEU", len(ended), sum(1 for line in lines if line.strip()) - len(unread), _shown(ended))
    return bool(empty)


def _shown(line_numbers: list[int]) -> str:
    """The first ten line numbers, and how many more."""
    more = f" and {len(line_numbers) - 10} more" if len(line_numbers) > 10 else ""
    return ", ".join(map(str, line_numbers[:10])) + more
