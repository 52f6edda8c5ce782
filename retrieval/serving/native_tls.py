"""The native engine's TLS files: gRPC C++ re-reads a server's PEM files every second
(``FileWatcherCertificateProvider``) but loads whatever it finds, and a rotation half written (a
new certificate beside the old key) would fail every new handshake until the key follows. The
engine reads checked copies instead: :class:`CheckedCopies` replaces them only with files that
load together, so such a rotation keeps the pair in use, as the Python engine's
:class:`~retrieval.serving.tls.CertificateFiles` does.

Example:
    >>> copies = CheckedCopies(Path("server.pem"), Path("server.key"), Path("clients-ca.pem"))
    >>> copies.files()  # what the engine reads
    >>> copies.check()  # a thread calls it every second
"""

from __future__ import annotations

import logging
import os
import shutil
import ssl
import tempfile
import weakref
from pathlib import Path

logger = logging.getLogger(__name__)

__all__ = ["CheckedCopies"]


class CheckedCopies:
    """Copies of a server's certificate, key and CA in a private folder (mode 0700), replaced by
    :meth:`check` only with files that load together."""

    def __init__(self, cert: Path, key: Path, ca: Path | None = None) -> None:
        """Copies the files.

        Raises:
            OSError: a file cannot be read.
            ValueError: they do not load together (a key that is not the certificate's, a PEM
                file that does not parse).
        """
        self.sources = tuple(Path(p) for p in (cert, key, ca) if p is not None)
        self.folder = Path(tempfile.mkdtemp(prefix="mitt-tls-"))
        # Removed at the latest when the interpreter exits (a server never stopped).
        self._removal = weakref.finalize(self, shutil.rmtree, self.folder, ignore_errors=True)
        self.paths = tuple(
            self.folder / name for name in ("cert.pem", "key.pem", "ca.pem")[: len(self.sources)]
        )
        """The copies of the certificate, the key and (with one) the CA, in that order."""
        self._stamp: tuple[tuple[int, int, int], ...] | None = None
        try:
            self._copy()
        except (OSError, ValueError):
            self.remove()
            raise

    def files(self) -> tuple[str, str, str]:
        """``(certificate, key, CA or "")``: the copies' paths, as the engine takes them."""
        cert, key, *ca = map(str, self.paths)
        return cert, key, ca[0] if ca else ""

    def check(self) -> None:
        """Replaces the copies when the files changed and load together; otherwise keeps them
        (an ERROR line once per change that does not load)."""
        try:
            self._copy()
        except (OSError, ValueError) as e:
            logger.error("TLS files not reloaded, the certificates in use stay: %s", e)

    def remove(self) -> None:
        """Deletes the copies (the server is stopped)."""
        self._removal()

    def _copy(self) -> None:
        stamp = tuple((s.st_mtime_ns, s.st_size, s.st_ino) for s in (p.stat() for p in self.sources))
        if stamp == self._stamp:
            return
        staged = [path.with_suffix(".new") for path in self.paths]
        for source, copy in zip(self.sources, staged, strict=True):
            shutil.copyfile(source, copy)
        self._stamp = stamp  # read: a pair that does not load is tried again once a file changes
        _check_loads(*staged)
        # gRPC may read between two renames (microseconds, against its one-second period): its
        # handshakes would fail until its next read.
        for copy, path in zip(staged, self.paths, strict=True):
            os.replace(copy, path)
        logger.info("TLS files changed, re-read %s for new connections", ", ".join(map(str, self.sources)))


def _check_loads(cert: Path, key: Path, ca: Path | None = None) -> None:
    """Raises ValueError unless ``key`` is ``cert``'s and ``ca`` parses (OpenSSL loads them)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(cert, key)
        if ca is not None:
            context.load_verify_locations(ca)
    except ssl.SSLError as e:
        raise ValueError(f"the TLS files do not load together ({e.reason or e})") from None
