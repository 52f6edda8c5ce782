"""Writers of a root take turns (:func:`retrieval.storage.versions.writer_lock`): no publication is
lost or fails because another writer published at the same time, a writer that waits says so
once, the lock dies with its process, and nothing fails once ``current`` switched."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from retrieval.storage.versions import CURRENT, LOCK, publish, resolve_current, version_folders, writer_lock
from tests.helpers import REPO_ROOT

ROUNDS, WRITERS, EACH = 20, 4, 3


@pytest.fixture
def root(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "root"
    path.mkdir()
    yield path


def _counter(root: Path) -> int:
    return int((resolve_current(root) / "n").read_text()) if (root / CURRENT).is_symlink() else 0


def _write_count(n: int) -> Callable[[Path], None]:
    def write(folder: Path) -> None:
        folder.mkdir()
        (folder / "n").write_text(str(n))

    return write


def _increment(root: Path) -> Path:
    """Reads the current version's counter and publishes it plus one: a read-modify-write, as a
    catalogue change does."""
    with writer_lock(root):
        return publish(root, _write_count(_counter(root) + 1), keep=2, grace=0)


@pytest.mark.parametrize("round_", range(ROUNDS))
def test_read_modify_writes_under_the_lock_lose_nothing(root: Path, round_: int) -> None:
    """4 threads × 3 increments: the counter ends at 12 and the 12 versions were published one
    over the other (names in publication order), whatever the interleaving."""
    with ThreadPoolExecutor(WRITERS) as pool:
        folders = list(pool.map(lambda _: _increment(root), range(WRITERS * EACH)))
    assert _counter(root) == WRITERS * EACH
    assert len({f.name for f in folders}) == WRITERS * EACH
    assert resolve_current(root) == max(folders, key=lambda f: f.name).resolve()


@pytest.mark.parametrize("round_", range(ROUNDS))
def test_publishes_at_the_same_time_all_succeed(tmp_path: Path, round_: int) -> None:
    """With no grace, a writer's pruning used to remove (or fail on) another writer's staging
    folder. Every publication must return, and ``current`` must be complete."""
    root = tmp_path / "root"  # publish makes it
    with ThreadPoolExecutor(WRITERS) as pool:
        folders = list(
            pool.map(lambda n: publish(root, _write_count(n), keep=1, grace=0), range(WRITERS * EACH))
        )
    assert len({f.name for f in folders}) == WRITERS * EACH
    assert (resolve_current(root) / "n").is_file()
    assert version_folders(root) == [max(folders, key=lambda f: f.name)]  # keep=1, no grace
    assert not [p for p in (root / "versions").iterdir() if p.name.startswith(".")]  # no leftovers


def _holder(root: Path, seconds: float) -> subprocess.Popen[str]:
    """A child process holding ``root``'s lock for ``seconds`` once it printed its pid."""
    code = (
        "import sys, time\n"
        "from retrieval.storage.versions import writer_lock\n"
        "with writer_lock(sys.argv[1]):\n"
        "    print('held', flush=True)\n"
        "    time.sleep(float(sys.argv[2]))\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", code, str(root), str(seconds)],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None and child.stdout.readline().strip() == "held"
    return child


def test_a_writer_waits_for_another_process_and_says_so_once(
    root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    holder = _holder(root, 1.5)
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="retrieval.storage.versions"):
        publish(root, _write_count(1))
    waited = time.monotonic() - started
    assert holder.wait(30) == 0
    assert waited >= 1.0  # the holder slept 1.5 s after saying it held the lock
    (record,) = caplog.records
    assert f"waiting for another writer of {root} (process {holder.pid})" in record.getMessage()
    assert _counter(root) == 1


def test_a_killed_writer_leaves_no_lock(root: Path, caplog: pytest.LogCaptureFixture) -> None:
    holder = _holder(root, 300)
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait(30)
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="retrieval.storage.versions"):
        publish(root, _write_count(1))
    assert time.monotonic() - started < 30 and not caplog.records
    assert (root / LOCK).is_file()  # the file stays; the lock went with the process


def test_an_entry_vanishing_while_pruning_is_skipped(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A leftover that vanishes between the listing and its ``stat`` used to raise
    FileNotFoundError after ``current`` switched (``mitt add-items`` then said "not published")."""
    publish(root, _write_count(1), grace=0)
    leftover = root / "versions" / ".crashed.tmp"
    leftover.mkdir()
    real_stat = Path.stat

    def vanishing(path: Path, **kwargs: bool) -> os.stat_result:
        if path == leftover:
            raise FileNotFoundError(2, "No such file or directory", str(path))
        return real_stat(path, **kwargs)

    monkeypatch.setattr(Path, "stat", vanishing)
    second = publish(root, _write_count(2), keep=1, grace=0)
    assert resolve_current(root) == second.resolve() and _counter(root) == 2


def test_a_version_that_cannot_be_removed_is_logged_not_raised(
    root: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    first = publish(root, _write_count(1), grace=0)

    def refuse(path: Path) -> None:
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr("retrieval.storage.versions.shutil.rmtree", refuse)
    with caplog.at_level(logging.WARNING, logger="retrieval.storage.versions"):
        second = publish(root, _write_count(2), keep=1, grace=0)
    assert resolve_current(root) == second.resolve() and first.is_dir()
    (record,) = caplog.records
    assert (
        "published; could not remove the old version" in record.getMessage()
        and first.name in record.getMessage()
    )
