"""The text files of ``transformer-translate``: its input, read line for line as the corpus reader reads a corpus,
and its output file, checked before any decoding so that a refusal loses no work."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from transformer.config import ConfigError


def check_output_file(path: str, input_path: str | None, overwrite: bool) -> None:
    """Refuse, before any decoding, an ``output`` file that would replace the input or earlier results (unless
    ``overwrite``), that names a folder, or whose folder is missing or not writable."""
    target = Path(path)
    if input_path is not None and target.resolve() == Path(input_path).resolve():
        raise ConfigError(f"output: {path} is the input file; the translations would replace the sentences, so "
                          "choose another file")
    if target.is_dir():
        raise ConfigError(f"output: {path} is a directory; give a file name")
    if target.exists() and not overwrite:
        raise ConfigError(f"output: {path} exists; choose a new file, or overwrite=true to replace it")
    if not target.parent.is_dir():
        raise ConfigError(f"output: the directory {target.parent} does not exist; create it or choose another file")
    if not os.access(target.parent, os.W_OK | os.X_OK):
        raise ConfigError(f"output: cannot write in {target.parent} (permission denied); choose another file")


def read_lines(path: str | None) -> list[str]:
    """The lines of ``path`` (stdin if None), split at newlines only: a form feed or U+2028 inside a line stays
    in it, so there is one output line per input line. A Windows ``\\r\\n`` ending counts as one newline, and a
    UTF-8 byte-order mark at the start is dropped."""
    name = "stdin" if path is None else path
    try:
        data = sys.stdin.buffer.read() if path is None else Path(path).read_bytes()
    except IsADirectoryError:
        raise ConfigError(f"input: {path} is a directory; give a text file with one sentence per line") from None
    except FileNotFoundError:
        raise ConfigError(f"input: {path} not found") from None
    rows = data.removeprefix(b"\xef\xbb\xbf").split(b"\n")  # a byte-order mark is not text, as the corpus reader has it
    if rows[-1] == b"":
        rows.pop()  # the newline that ends the last line
    lines = []
    for number, row in enumerate(rows, start=1):
        try:
            lines.append(row.removesuffix(b"\r").decode("utf-8"))
        except UnicodeDecodeError as error:
            raise ConfigError(f"input: {name}:{number} is not valid UTF-8 ({error.reason} at byte {error.start})") \
                from None
    return lines
