"""MovieLens-100K and -1M folders, and the verified download of MovieLens-100K."""

from __future__ import annotations

import tempfile
import zipfile
from pathlib import Path

import pandas as pd

from retrieval.data.download import ATTEMPTS, BACKOFF_SECONDS, download_file
from retrieval.data.errors import DataError
from retrieval.data.interactions import Interactions
from retrieval.data.parsing import parse_int, read_int_records, read_lines
from retrieval.storage.manifest import sha256_file

# Used when a MovieLens-100K folder has no u.genre; the order of the 19 flags in u.item.
ML100K_GENRES = (
    "unknown", "Action", "Adventure", "Animation", "Children's", "Comedy", "Crime", "Documentary",
    "Drama", "Fantasy", "Film-Noir", "Horror", "Musical", "Mystery", "Romance", "Sci-Fi", "Thriller",
    "War", "Western",
)  # fmt: skip


ML100K_URL = "https://files.grouplens.org/datasets/movielens/ml-100k.zip"
ML100K_SHA256 = {
    "u.item": "553841ebc7de3a0fd0d6b62a204ea30c1e651aacfb2814c7a6584ac52f2c5701",
    "u.user": "f120e114da2e8cf314fd28f99417c94ae9ddf1cb6db8ce0e4b5995d40e90e62c",
}


ML100K_EVENTS = 100_000


def load_movielens(path: Path | str) -> Interactions:
    """Loads a MovieLens-100K or -1M folder (or its ``u.data`` / ``ratings.dat`` file).

    Events keep the ``rating`` (int64) as a side column. Items come from ``u.item`` /
    ``movies.dat`` (Latin-1) with ``title`` and genre ``attributes`` when the file is there,
    else they are the items seen in the events.

    Raises:
        DataError: no ratings file, or a malformed line.
    """
    path = Path(path)
    if not path.exists():
        raise DataError(f"{path}: no such file or folder")
    folder = path.parent if path.is_file() else path
    if (folder / "u.data").is_file():
        events = read_int_records(folder / "u.data", None, ("user", "item", "rating", "timestamp"))
        items = _read_ml100k_items(folder) if (folder / "u.item").is_file() else None
    elif (folder / "ratings.dat").is_file():
        events = read_int_records(folder / "ratings.dat", "::", ("user", "item", "rating", "timestamp"))
        items = _read_ml1m_items(folder / "movies.dat") if (folder / "movies.dat").is_file() else None
    else:
        raise DataError(f"{path}: no u.data or ratings.dat (expected a MovieLens-100K or -1M folder)")
    frame = pd.DataFrame(
        {
            "user": events["user"].astype(str),
            "item": events["item"].astype(str),
            "timestamp": events["timestamp"],
            "rating": events["rating"],
        }
    )
    if items is None:
        items = pd.DataFrame({"item": frame["item"].unique()})
    return Interactions(frame, items, str(path))


def download_movielens_100k(
    dest: Path,
    url: str = ML100K_URL,
    *,
    attempts: int = ATTEMPTS,
    backoff: float = BACKOFF_SECONDS,
    progress: bool = True,
) -> Path:
    """Downloads and extracts MovieLens-100K into ``dest``, verified against the official release.

    The archive is downloaded to ``dest/ml-100k.zip.part`` with a progress bar, retried and
    resumed (:func:`~retrieval.data.download.download_file`; a later run continues it), then
    extracted beside ``dest/ml-100k`` and renamed into place only once it verifies, so a failed
    or corrupted download never leaves a folder that looks complete.

    Returns:
        The ``dest/ml-100k`` folder (an existing one is verified and reused without downloading).

    Raises:
        DataError: the download failed (no network, a server error) or the files do not match
            the official release; one line saying what happened and what to do instead.
    """
    folder = Path(dest) / "ml-100k"
    if (folder / "u.data").is_file():
        verify_movielens_100k(folder)
        return folder
    partial = folder.parent / "ml-100k.zip.part"
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        download_file(url, partial, attempts=attempts, backoff=backoff, progress=progress)
    except OSError as e:  # DownloadError, or a folder that cannot be written
        raise DataError(f"cannot download MovieLens-100K from {url}: {e}; {_instead(folder)}") from None
    with tempfile.TemporaryDirectory(dir=folder.parent) as tmp:
        try:
            with zipfile.ZipFile(partial) as zf:
                zf.extractall(tmp)
            verify_movielens_100k(Path(tmp) / "ml-100k")
            (Path(tmp) / "ml-100k").rename(folder)
        except (zipfile.BadZipFile, DataError, OSError) as e:
            partial.unlink(missing_ok=True)  # not the release: the next run downloads it afresh
            what = str(e).replace(f"{tmp}/", "")  # the archive's own paths, not a deleted folder's
            raise DataError(
                f"the archive downloaded from {url} is not the official MovieLens-100K ({what}); "
                + _instead(folder)
            ) from None
    partial.unlink()
    return folder


def _instead(folder: Path) -> str:
    """What to do when the download cannot be had: where to put the files, or the --data flag."""
    sums = ", ".join(f"{name} {digest}" for name, digest in ML100K_SHA256.items())
    return (
        f"put the official ml-100k files (u.data, u.item, u.user, ...) in {folder}, or pass "
        f"--data PATH to an ML-100K folder (expected SHA-256: {sums})"
    )


def verify_movielens_100k(folder: Path) -> None:
    """Checks that ``folder`` holds the official MovieLens-100K files.

    Raises:
        DataError: a file is missing, has the wrong SHA-256, or ``u.data`` lacks 100,000 lines.
    """
    folder = Path(folder)
    for name, expected in ML100K_SHA256.items():
        if not (folder / name).is_file():
            raise DataError(f"{folder / name}: missing from the MovieLens-100K folder")
        actual = sha256_file(folder / name)
        if actual != expected:
            raise DataError(f"{folder / name}: SHA-256 {actual} differs from the official {expected}")
    if not (folder / "u.data").is_file():
        raise DataError(f"{folder / 'u.data'}: missing from the MovieLens-100K folder")
    with open(folder / "u.data", "rb") as f:
        lines = sum(1 for _ in f)
    if lines != ML100K_EVENTS:
        raise DataError(f"{folder / 'u.data'}: {lines} lines, the official file has {ML100K_EVENTS}")


def _read_ml100k_items(folder: Path) -> pd.DataFrame:
    genres: tuple[str, ...] = ML100K_GENRES
    if (folder / "u.genre").is_file():
        path = folder / "u.genre"
        named: dict[int, str] = {}
        genre_lines: dict[int, int] = {}
        for lineno, line in read_lines(path, "latin-1"):
            fields = line.split("|")
            if len(fields) != 2:
                raise DataError(f"{path}, line {lineno}: expected 'name|index', found {len(fields)} fields")
            index = parse_int(path, lineno, "genre index", fields[1])
            if index in named:
                raise DataError(
                    f"{path}, line {lineno}: genre index {index} already used on line {genre_lines[index]}"
                )
            named[index], genre_lines[index] = fields[0], lineno
        if sorted(named) != list(range(len(named))):
            raise DataError(f"{path}: genre indices must run 0..{len(named) - 1}")
        genres = tuple(named[i] for i in range(len(named)))
    path = folder / "u.item"
    ids, titles, attributes = [], [], []
    first_line: dict[str, int] = {}
    for lineno, line in read_lines(path, "latin-1"):
        fields = line.split("|")
        if len(fields) != 5 + len(genres):
            raise DataError(
                f"{path}, line {lineno}: expected {5 + len(genres)} fields "
                f"(id|title|release|video release|url|{len(genres)} genre flags), found {len(fields)}"
            )
        flags = fields[5:]
        if any(f not in ("0", "1") for f in flags):
            raise DataError(f"{path}, line {lineno}: genre flags must be 0 or 1")
        ids.append(_movie_id(path, lineno, fields[0], first_line))
        titles.append(fields[1])
        attributes.append([g for g, f in zip(genres, flags, strict=True) if f == "1"])
    return pd.DataFrame({"item": ids, "title": titles, "attributes": attributes})


def _read_ml1m_items(path: Path) -> pd.DataFrame:
    ids, titles, attributes = [], [], []
    first_line: dict[str, int] = {}
    for lineno, line in read_lines(path, "latin-1"):
        fields = line.split("::")
        if len(fields) != 3:
            raise DataError(
                f"{path}, line {lineno}: expected 3 fields (id::title::genres), found {len(fields)}"
            )
        ids.append(_movie_id(path, lineno, fields[0], first_line))
        titles.append(fields[1])
        attributes.append(fields[2].split("|") if fields[2] else [])
    return pd.DataFrame({"item": ids, "title": titles, "attributes": attributes})


def _movie_id(path: Path, lineno: int, value: str, first_line: dict[str, int]) -> str:
    """A movie id field, refused when an earlier line (recorded in ``first_line``) has it."""
    item = str(parse_int(path, lineno, "movie id", value))
    if item in first_line:
        raise DataError(f"{path}, line {lineno}: movie id {item} already on line {first_line[item]}")
    first_line[item] = lineno
    return item
