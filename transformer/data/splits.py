"""Where a configured corpus's split files are: Multi30k fetched and verified, a custom folder checked.

Multi30k (task 1) is fetched into its folder: copied from a local copy (``data.source_dir``) or downloaded
from the public ``multi30k/dataset`` repository, and checked against SHA-256 digests kept below either way.
A custom corpus is a folder of ``{split}.{lang}[.gz]`` files. Errors name the file and say what to do.
"""

from __future__ import annotations

import hashlib
import http.client
import logging
import os
import urllib.error
import urllib.request
from dataclasses import replace
from pathlib import Path
from typing import BinaryIO, Iterable, Iterator, Sequence

from transformer.config import CorpusKind, DataConfig
from transformer.data.corpus import DataError, normalize_space, read_parallel
from transformer.files import DiskFullError, atomic_write, sha256

logger = logging.getLogger(__name__)

MULTI30K_URL = "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw"
MULTI30K_SPLITS = ("train", "val", "test_2016_flickr")
MULTI30K_LANGS = ("en", "de", "fr", "cs")
# The later shared-task test sets, fetched on demand (e.g. ``transformer-evaluate split=test_2017_mscoco``); they
# have no Czech side, except 2018.
MULTI30K_EXTRA_TESTS = {
    "test_2017_flickr": ("en", "de", "fr"),
    "test_2017_mscoco": ("en", "de", "fr"),
    "test_2018_flickr": ("en", "de", "fr", "cs"),
}
# SHA-256 of the upstream files (multi30k/dataset, data/task1/raw), as gzip-compressed.
MULTI30K_SHA256 = {
    "train.en.gz": "d79cfa999dd4c51d2cb42499b6796d5a882c3a8a961923c25a898c90f8bbd56f",
    "train.de.gz": "726e39b2fa9eb9ffb6dc763fb35a179f80fae06ffc5d28b6ace5faa883de28a6",
    "train.fr.gz": "622e75069e9f4c577425c4f277116ce66e63a2401c0a2312d90073cb12379a3c",
    "train.cs.gz": "a65adb8b32e3bc664f21ecba7a6e7f6950fd1f405e135f7c312faabdb6255077",
    "val.en.gz": "14f7d25ddd868909a9213e361768460edcacdd6ab9d1e77b92560dc10c10dc28",
    "val.de.gz": "f0cba2f995189cf5770f29a8a9a537a3ad3f51657ad873405082ff6863a5e75a",
    "val.fr.gz": "ca3106f1a72390591d25f6c45cb4cd39dec4cd3f123e099748a3ce5256c160e9",
    "val.cs.gz": "b63226e05c4bd5dd6a42897d74b86a1b9d2c31498252c572b1ea7f7996927fcc",
    "test_2016_flickr.en.gz": "611d361c6334bc7246101d48097c13cf5c4413c5befc793cc629934359d532d9",
    "test_2016_flickr.de.gz": "9204244e408ccb38d2a55cfcd344df15005fc42a07a6e55ca6c52b6ababb8cc8",
    "test_2016_flickr.fr.gz": "6d326e188d259fb1d04ac19eae3af956559b3a0b93d7635e56c90987c40c8b90",
    "test_2016_flickr.cs.gz": "200a4a74cc9560f051924abb9803be008d1908d77f747e9141aeb86dfd2797f1",
    "test_2017_flickr.en.gz": "76a444ee25172e72695cddb13ae4a3bda59430617be88e0bb46b60504f054074",
    "test_2017_flickr.de.gz": "a2c89666db00c495cd8513b9d708d5a3acc205d7de312ef2bf5fb7ebc1540aee",
    "test_2017_flickr.fr.gz": "3ba671ceb2299f3304ffafefea7a833d08632fbaf0ba18546f8a2ec2391af496",
    "test_2017_mscoco.en.gz": "aab300bfb4427697987e02cd0aacd44bfe8aa50456231b6474c08038bbed2b58",
    "test_2017_mscoco.de.gz": "799e4854c25d601cb6cb6be29eabe5667734c61ace2f495e03e429031a0bc338",
    "test_2017_mscoco.fr.gz": "754f3072ba9f124569ba5258b32730fc1d214bbf8e0c6dfb2b74401676220db0",
    "test_2018_flickr.en.gz": "ef4f4844037d4c5dea75c9a8ed5fd78905967a26f67c255e230cc9780032654d",
    "test_2018_flickr.de.gz": "ddd0130c7d97482dc5197a02141dae8dd79f20f03586c480d675c09a32daf608",
    "test_2018_flickr.fr.gz": "fb2b83fcceb937a4f7e3e93c1c51c22aba92f1e342391e6b5ba392b16a920501",
    "test_2018_flickr.cs.gz": "7d0a9db904f94c554a8c58049a9f3a5357c27f46cc3d710d70cb0b4a2585b8c2",
}
_CHUNK = 1 << 16


# --------------------------------------------------------------------------------------------------
# Fetching Multi30k
# --------------------------------------------------------------------------------------------------


def sha256_file(path: Path) -> str:
    """Hex SHA-256 digest of a file's bytes."""
    return sha256(path)


def _write_verified(dest: Path, chunks: Iterable[bytes], expected: str, origin: str) -> int:
    """Stream ``chunks`` into a temp file beside ``dest``, check its SHA-256, then rename it to ``dest``
    (:func:`transformer.files.atomic_write`).

    An interruption or a mismatch leaves no file behind: the temp file is removed and ``dest`` is
    either absent or complete. Concurrent writers (several DDP ranks) are safe for the same reason.

    Returns:
        The number of bytes written.
    """
    digest, size = hashlib.sha256(), 0
    chunks = iter(chunks)
    try:
        with atomic_write(dest, suffix=".part") as out:
            while (chunk := _next_chunk(chunks)) is not None:
                out.write(chunk)
                digest.update(chunk)
                size += len(chunk)
            if digest.hexdigest() != expected:
                raise DataError(
                    f"checksum mismatch for {origin}: expected sha256 {expected}, got {digest.hexdigest()}; "
                    f"{dest.name} was not saved"
                )
    except _ReadFailed as failed:  # reading may fail too: the caller names the origin for that
        raise failed.error from None
    except OSError as err:  # creating, writing, flushing (a full disk may show only then) or renaming
        raise _cannot_write(dest, err) from err
    return size


class _ReadFailed(Exception):
    """Carries an error of the source through the writer's handling of write errors."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


def _next_chunk(chunks: Iterator[bytes]) -> bytes | None:
    """The next chunk, None at the end; a failure to read is wrapped as :class:`_ReadFailed`."""
    try:
        return next(chunks)
    except StopIteration:
        return None
    except Exception as error:
        raise _ReadFailed(error) from error


def _cannot_write(dest: Path, err: OSError) -> DataError:
    if isinstance(err, DiskFullError):  # its message already names the file and says what to do
        return DataError(str(err))
    return DataError(f"{dest}: cannot write the file here ({err}); check the folder's permissions and free space")


def _read_chunks(handle: BinaryIO) -> Iterator[bytes]:
    while chunk := handle.read(_CHUNK):
        yield chunk


def _checked_length(chunks: Iterator[bytes], length: str | None, url: str) -> Iterator[bytes]:
    """Pass chunks through; raise if the server closed before sending Content-Length bytes."""
    received = 0
    for chunk in chunks:
        received += len(chunk)
        yield chunk
    if length is not None and length.isdigit() and received < int(length):
        raise DataError(f"downloading {url} failed: connection closed after {received} of {length} bytes")


def download_file(url: str, dest: Path, sha256: str, *, timeout: float = 60.0) -> None:
    """Download ``url`` to ``dest`` (urllib only), verifying its SHA-256; atomic, see ``_write_verified``.

    Raises:
        DataError: HTTP error, unreachable host, timeout, or checksum mismatch (nothing is left behind).
    """
    hint = "set data.source_dir (or env MULTI30K_DIR) to a local copy, or place the file there yourself"
    logger.info("downloading %s -> %s", url, dest)
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            length = response.headers.get("Content-Length")
            size = _write_verified(dest, _checked_length(_read_chunks(response), length, url), sha256, url)
    except urllib.error.HTTPError as err:
        raise DataError(f"downloading {url} failed: HTTP {err.code} {err.reason}; {hint}") from err
    except (urllib.error.URLError, OSError, http.client.HTTPException) as err:
        reason = getattr(err, "reason", err)
        raise DataError(f"downloading {url} failed: {reason}; {hint}") from err
    logger.info("saved %s (%.1f kB, sha256 verified)", dest, size / 1024)


def _fetch_multi30k_file(name: str, target: Path, source_dir: Path | None, base_url: str, timeout: float) -> None:
    """Make sure ``target/name`` exists and matches its digest: keep, copy from ``source_dir``, or download."""
    dest = target / name
    expected = MULTI30K_SHA256.get(name)
    if dest.is_file():
        if expected is not None and (actual := sha256_file(dest)) != expected:
            raise DataError(
                f"{dest}: checksum mismatch: expected sha256 {expected}, got {actual}; "
                "delete the file to fetch it again"
            )
        return
    if dest.with_suffix("").is_file():  # an uncompressed copy the user put there
        return
    if expected is None:
        raise DataError(
            f"{dest}: not found, and no checksum is known for {name!r} (known: {sorted(MULTI30K_SHA256)}); "
            "place the file there yourself or use data=custom"
        )
    if source_dir is not None and not source_dir.is_dir():  # a mistyped path, not a wish to download
        where = "" if source_dir.is_absolute() else f" (relative to {Path.cwd()}, where this command runs)"
        raise DataError(f"data.source_dir (or env MULTI30K_DIR)={source_dir}: directory not found{where}; point it at "
                        f"a local copy of Multi30k, or leave it unset to download {name}")
    local = source_dir / name if source_dir is not None else None
    if local is not None and local.is_file():
        logger.info("copying %s -> %s", local, dest)
        try:
            with open(local, "rb") as handle:
                _write_verified(dest, _read_chunks(handle), expected, str(local))
        except OSError as err:  # writing errors are already DataErrors naming dest
            raise DataError(f"{local}: cannot read the file ({err})") from err
        return
    if local is not None:
        logger.info("%s not found; downloading instead", local)
    download_file(f"{base_url.rstrip('/')}/{name}", dest, expected, timeout=timeout)


def prepare_multi30k(
    target_dir: str | Path,
    langs: Sequence[str] = ("en", "de"),
    splits: Sequence[str] = MULTI30K_SPLITS,
    source_dir: str | Path | None = None,
    base_url: str = MULTI30K_URL,
    *,
    timeout: float = 60.0,
) -> Path:
    """Put ``{split}.{lang}.gz`` for every split and language into ``target_dir``, checksum-verified.

    Files already in ``target_dir`` are verified and kept; missing ones are copied from
    ``source_dir`` when it has them, else downloaded from ``base_url``.

    Returns:
        ``target_dir`` as a Path.
    """
    target = Path(target_dir)
    made = _make_folders(target)
    source = Path(source_dir) if source_dir else None
    try:
        for split in splits:
            for lang in langs:
                _fetch_multi30k_file(f"{split}.{lang}.gz", target, source, base_url, timeout)
    except BaseException:  # a folder made for files that never came is not left behind
        for folder in made:
            try:
                folder.rmdir()
            except OSError:  # not empty: something else is in it, or some files came
                break
        raise
    return target


def _make_folders(folder: Path) -> list[Path]:
    """Make ``folder`` and its missing parents; returns those this call made, the innermost first."""
    folder = Path(os.path.abspath(folder))  # "new/../data" is data itself, which may be there already
    missing = []
    for level in (folder, *folder.parents):
        if level.is_dir():
            break
        missing.append(level)
    made = []
    for level in reversed(missing):
        try:
            level.mkdir()
            made.append(level)
        except FileExistsError:  # made by another process meanwhile (not ours to remove), or a file in the way
            if not level.is_dir():
                raise
    return made[::-1]


# --------------------------------------------------------------------------------------------------
# Splits from config
# --------------------------------------------------------------------------------------------------


def _find_split_file(directory: Path, split: str, lang: str, cfg: DataConfig) -> Path:
    plain, compressed = directory / f"{split}.{lang}", directory / f"{split}.{lang}.gz"
    if plain.is_file() and compressed.is_file():
        raise DataError(f"both {plain} and {compressed} exist; remove one so it is clear which to read")
    for path in (compressed, plain):
        if path.is_file():
            return path
        if path.is_dir():
            raise DataError(f"{path} is a directory; the {split} split's {lang} side must be a text file (.gz or not)")
    if split == cfg.train_split and cfg.train_dir is not None:
        how = f"data.train_dir needs files named {split}.{{lang}}[.gz]"
    elif cfg.corpus is CorpusKind.multi30k:
        how = "run `transformer-prepare-data` or set data.source_dir"
    else:
        how = f"a custom corpus needs files named {{split}}.{{lang}}[.gz] in data.dir={cfg.corpus_dir}"
    raise DataError(f"{plain}[.gz]: file not found (data.corpus={cfg.corpus.value}, split {split!r}); {how}")


def anchored(cfg: DataConfig) -> DataConfig:
    """``cfg`` with ``data.dir``, ``data.train_dir`` and ``data.source_dir`` absolute, as a run records them: a
    relative folder means the one under the directory the run started in, wherever the run is evaluated or resumed
    from later (``MULTI30K_DIR=../shared/data/multi30k`` included)."""
    folders = ("dir", "train_dir", "source_dir")
    paths = {key: str(Path(value).absolute()) for key in folders if (value := getattr(cfg, key))}
    return replace(cfg, **paths)


def with_local_copy(cfg: DataConfig) -> DataConfig:
    """A trained run's ``cfg`` as this machine reads its corpus. A run records where Multi30k came from and where it
    went (``data.source_dir``, ``data.dir``): folders of the machine and directory it was trained in, or relative ones
    in older runs. Where the recorded copy is not here, env ``MULTI30K_DIR`` (when set) names this machine's, as it
    does for a new run; and where the recorded ``data.dir`` is not here either, the files go where a new run puts
    them (``data/multi30k``). Checked against their digests wherever they are, so the run reads the same corpus."""
    local = os.environ.get("MULTI30K_DIR")
    if cfg.corpus is not CorpusKind.multi30k or not local:
        return cfg
    if cfg.source_dir is not None and Path(cfg.source_dir).is_dir():  # the recorded copy is here
        return cfg
    return replace(cfg, source_dir=local, dir=cfg.dir if cfg.dir is None or Path(cfg.dir).is_dir() else None)


def refuse_unknown_split(cfg: DataConfig, split: str) -> None:
    """Refuse a split of Multi30k that it does not have and that no file placed in ``data.dir`` provides, naming the
    key that asks for it (``split`` where none does: a command's own); for another corpus, nothing to check."""
    if cfg.corpus is not CorpusKind.multi30k or (split == cfg.train_split and cfg.train_dir is not None):
        return
    known = (*MULTI30K_SPLITS, *MULTI30K_EXTRA_TESTS)
    placed = any((cfg.corpus_dir / f"{split}.{cfg.src}{ext}").is_file() for ext in ("", ".gz"))  # counts too
    if split not in known and not placed:
        key = next((f"data.{name}" for name in ("test_split", "valid_split", "train_split")
                    if getattr(cfg, name) == split), "split")
        raise DataError(f"{key}={split}: Multi30k has no such split; it has {', '.join(known)}")


def corpus_paths(cfg: DataConfig, split: str) -> tuple[Path, Path]:
    """Source and target file of ``split``; Multi30k files are fetched and verified first. The training split comes
    from ``data.train_dir`` when that is set."""
    if split == cfg.train_split and cfg.train_dir is not None:
        directory = Path(cfg.train_dir)
        if not directory.is_dir():
            raise DataError(f"data.train_dir={directory}: directory not found")
        return _find_split_file(directory, split, cfg.src, cfg), _find_split_file(directory, split, cfg.tgt, cfg)
    directory = cfg.corpus_dir
    if cfg.corpus is CorpusKind.multi30k:
        refuse_unknown_split(cfg, split)
        prepare_multi30k(directory, langs=(cfg.src, cfg.tgt), splits=(split,), source_dir=cfg.source_dir)
    elif not directory.is_dir():
        raise DataError(f"data.dir={cfg.corpus_dir}: directory not found (data.corpus=custom)")
    return _find_split_file(directory, split, cfg.src, cfg), _find_split_file(directory, split, cfg.tgt, cfg)


def load_split(cfg: DataConfig, split: str) -> tuple[list[str], list[str]]:
    """Read a split as whitespace-normalized aligned sentences (nothing dropped).

    ``cfg.max_pairs`` keeps only the first N pairs of the training split (smoke runs).
    """
    paths = corpus_paths(cfg, split)
    src, tgt = read_parallel(*paths)
    if split == cfg.train_split and cfg.max_pairs is not None:
        src, tgt = src[: cfg.max_pairs], tgt[: cfg.max_pairs]
    src, tgt = [normalize_space(s) for s in src], [normalize_space(t) for t in tgt]
    if split != cfg.train_split:  # training drops such pairs (and counts them); a scored split keeps every line
        warn_of_empty_sides(src, tgt, paths)
    return src, tgt


def warn_of_empty_sides(src: list[str], tgt: list[str], paths: tuple[str | Path, str | Path]) -> None:
    """Warn, naming the lines, of pairs to be scored whose source or reference is blank."""
    empty = [line for line, (s, t) in enumerate(zip(src, tgt), start=1) if not (s.strip() and t.strip())]
    if empty:
        shown = ", ".join(map(str, empty[:10])) + (f" and {len(empty) - 10} more" if len(empty) > 10 else "")
        logger.warning("%s / %s: %d line(s) with an empty side (%s), scored as they are (an empty source "
                       "translates to an empty line; an empty reference is scored as empty)", *paths, len(empty),
                       shown)
