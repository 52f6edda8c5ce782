"""A file over HTTP(S), with a progress bar, retries with backoff, and resumption (HTTP ``Range``)
of what an interrupted attempt, or an earlier run, already wrote."""

from __future__ import annotations

import http.client
import logging
import re
import time
import urllib.error
import urllib.request
from pathlib import Path

from tqdm import tqdm

log = logging.getLogger(__name__)

ATTEMPTS = 4
"""Tries before giving up."""
BACKOFF_SECONDS = 2.0
"""The wait before the second try, doubled before each next one."""
TIMEOUT_SECONDS = 60.0
"""How long a connection or a read may stall."""
CHUNK = 1 << 16


class DownloadError(OSError):
    """A download that failed every attempt; the message says why (in a few words)."""


def download_file(
    url: str,
    partial: Path,
    *,
    attempts: int = ATTEMPTS,
    backoff: float = BACKOFF_SECONDS,
    timeout: float = TIMEOUT_SECONDS,
    progress: bool = True,
) -> Path:
    """Downloads ``url`` into ``partial``, continuing the bytes already there.

    A partial file left by a failed attempt (or an earlier run) is continued with an HTTP
    ``Range`` request when the server honours it (``206``), else downloaded again from the
    start. Connection errors, timeouts, short reads and server errors (5xx, 408, 429) are retried
    up to ``attempts`` times, waiting ``backoff`` seconds, then twice as long each time; other
    HTTP errors (404) are not. The caller checks the content: a complete download is only as
    right as the server.

    Returns:
        ``partial``, now holding the whole file.

    Raises:
        DownloadError: every attempt failed; the partial file is kept, for the next run to continue.
    """
    reason = "no attempt made"
    for attempt in range(1, attempts + 1):
        try:
            _fetch(url, partial, timeout, progress)
            return partial
        except urllib.error.HTTPError as e:
            reason = f"HTTP {e.code} {e.reason}"
            if e.code == 416:  # nothing left past the partial file's end: it cannot be continued
                partial.unlink(missing_ok=True)
            elif 400 <= e.code < 500 and e.code not in (408, 429):
                raise DownloadError(reason) from None
        except urllib.error.URLError as e:
            reason = str(e.reason)
        except (OSError, http.client.HTTPException) as e:  # timeouts, resets, short reads
            reason = str(e) or type(e).__name__
        if attempt < attempts:
            wait = backoff * 2 ** (attempt - 1)
            log.warning("download of %s failed (%s): retry %d in %.0f s", url, reason, attempt, wait)
            time.sleep(wait)
    raise DownloadError(f"{reason} (after {attempts} attempt{'s' if attempts > 1 else ''})")


def _fetch(url: str, partial: Path, timeout: float, progress: bool) -> None:
    """One attempt: the rest of the file appended to ``partial`` (all of it when the server
    ignores the range)."""
    have = partial.stat().st_size if partial.is_file() else 0
    headers = {"Range": f"bytes={have}-"} if have else {}
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout) as response:
        resumed = response.status == 206
        if resumed and _range_start(response) != have:  # another part than asked: start afresh
            partial.unlink(missing_ok=True)
            raise DownloadError(f"the server sent another range than bytes {have}-")
        if not resumed:
            have = 0  # the whole file again (the server ignores ranges)
        length = response.headers.get("Content-Length")
        total = have + int(length) if length and length.isdigit() else None
        name = url.rstrip("/").rpartition("/")[2]
        bar = tqdm(total=total, initial=have, unit="B", unit_scale=True, desc=name, disable=not progress)
        with open(partial, "ab" if resumed else "wb") as f, bar:
            while chunk := response.read(CHUNK):
                f.write(chunk)
                bar.update(len(chunk))
    size = partial.stat().st_size
    if total is not None and size < total:
        raise DownloadError(f"connection closed after {size} of {total} bytes")


def _range_start(response: http.client.HTTPResponse) -> int | None:
    """The first byte a ``206`` response holds (``Content-Range: bytes 100-199/200``)."""
    match = re.fullmatch(r"bytes (\d+)-\d+/(\d+|\*)", response.headers.get("Content-Range", "").strip())
    return int(match.group(1)) if match else None
