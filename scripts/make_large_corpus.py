"""Write a large parallel corpus for timing data preparation: Multi30k's training split repeated N times.

    python scripts/make_large_corpus.py /tmp/big                  # 155 x 29,000 = 4.5M pairs, en-de
    python scripts/make_large_corpus.py /tmp/huge --times 1240    # 36M pairs (about 5 GB of text)
    transformer-train data=custom data.dir=/tmp/big data.src=en data.tgt=de ...

The folder gets ``train.{src,tgt}`` (plain, or ``.gz`` with ``--gzip``) plus copies of Multi30k's
validation and 2016 Flickr test splits as ``val.*`` and ``test.*`` (the layout ``data=custom`` reads).
Only one copy of the (small) Multi30k split is held in memory; the output is streamed to disk. Keep
such corpora out of the repository (``/tmp``).
"""

from __future__ import annotations

import argparse
import gzip
import os
import shutil
from pathlib import Path
from typing import BinaryIO

_SPLITS = {"train": "train", "val": "val", "test": "test_2016_flickr"}  # written name -> Multi30k name


def _default_source() -> Path:
    """``MULTI30K_DIR`` when set, else where the commands put Multi30k (``data/multi30k``)."""
    return Path(os.environ.get("MULTI30K_DIR", "data/multi30k"))


def _source_file(folder: Path, name: str, lang: str) -> Path:
    """``{name}.{lang}.gz`` or ``{name}.{lang}`` in ``folder``; refused naming it when neither is there."""
    plain, compressed = folder / f"{name}.{lang}", folder / f"{name}.{lang}.gz"
    if compressed.is_file():
        return compressed
    if plain.is_file():
        return plain
    raise SystemExit(f"{plain}[.gz]: file not found (set --source or MULTI30K_DIR)")


def _read_source(folder: Path, name: str, lang: str) -> bytes:
    """The decompressed bytes of ``{name}.{lang}[.gz]``, ending with a newline."""
    path = _source_file(folder, name, lang)
    data = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    return data if data.endswith(b"\n") else data + b"\n"


def _open_out(path: Path, compress: bool) -> BinaryIO:
    # compresslevel 1: the point is a big file quickly, not a small one.
    return gzip.open(path, "wb", compresslevel=1) if compress else open(path, "wb")  # type: ignore[return-value]


def write_corpus(out: Path, source: Path, langs: tuple[str, str], times: int, compress: bool) -> None:
    """Write ``train`` repeated ``times`` times and single copies of ``val`` and ``test`` into ``out``."""
    if out.resolve() == source.resolve():
        raise SystemExit(f"{out}: is the source corpus itself; write the large corpus into another folder")
    for name in _SPLITS.values():  # every source there before anything is written: no half corpus
        for lang in langs:
            _source_file(source, name, lang)
    out.mkdir(parents=True, exist_ok=True)
    suffix = ".gz" if compress else ""
    for written, name in _SPLITS.items():
        for lang in langs:
            for stale in (out / f"{written}.{lang}", out / f"{written}.{lang}.gz"):
                stale.unlink(missing_ok=True)  # a plain and a .gz copy side by side would be ambiguous
            data = _read_source(source, name, lang)
            repeat = times if written == "train" else 1
            with _open_out(out / f"{written}.{lang}{suffix}", compress) as handle:
                for _ in range(repeat):
                    handle.write(data)
            n_lines = repeat * data.count(b"\n")
            print(f"{out / f'{written}.{lang}{suffix}'}: {n_lines:,} lines")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path, help="folder to write (created if missing)")
    parser.add_argument("--times", type=int, default=155, help="how often the training split is repeated")
    parser.add_argument("--source", type=Path, default=_default_source(), help="the Multi30k folder")
    parser.add_argument("--src", default="en")
    parser.add_argument("--tgt", default="de")
    parser.add_argument("--gzip", action="store_true", help="write .gz files (level 1) instead of plain text")
    args = parser.parse_args()
    if args.times < 1:
        parser.error("--times must be >= 1")
    write_corpus(args.out, args.source, (args.src, args.tgt), args.times, args.gzip)
    print(f"free space left in {args.out}: {shutil.disk_usage(args.out).free / 2**30:.1f} GiB")


if __name__ == "__main__":
    main()
