"""TLS credentials that follow their PEM files: certificates rotated on disk (by cert-manager, a
mounted Kubernetes secret, a cron job) are used for new connections without a restart."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import cast

import grpc

logger = logging.getLogger(__name__)


class CertificateFiles:
    """gRPC's certificate-configuration fetcher for a server's PEM files: called before every
    new TLS handshake, it re-reads the files once they changed (modification time, size or
    inode, so a swapped symlink counts too) and otherwise keeps the configuration in use.

    Example:
        >>> files = CertificateFiles(Path("server.pem"), Path("server.key"), Path("clients-ca.pem"))
        >>> credentials = files.credentials()
    """

    def __init__(self, cert: Path, key: Path, ca: Path | None = None) -> None:
        self.paths = tuple(Path(p) for p in (cert, key, ca) if p is not None)
        self.mutual = ca is not None
        self._lock = threading.Lock()
        self._stamp = self._file_stamps()

    def configuration(self) -> grpc.ServerCertificateConfiguration:
        """The files' current contents as gRPC's certificate configuration.

        Raises:
            OSError: a file cannot be read.
        """
        cert, key, *ca = (path.read_bytes() for path in self.paths)
        return grpc.ssl_server_certificate_configuration([(key, cert)], ca[0] if ca else None)

    def credentials(self) -> grpc.ServerCredentials:
        """Server credentials that fetch a new configuration whenever the files change
        (mutual TLS, requiring client certificates signed by the CA, when there is one).

        Raises:
            OSError: a file cannot be read.
        """
        # The stubs type the fetcher's result as never None, which gRPC documents as "no change".
        fetcher = cast(Callable[[], grpc.ServerCertificateConfiguration], self)
        return grpc.dynamic_ssl_server_credentials(self.configuration(), fetcher, self.mutual)

    def __call__(self) -> grpc.ServerCertificateConfiguration | None:
        """The new configuration if a file changed since the last call, else ``None`` (no change).

        A file that cannot be read is logged and the configuration in use is kept; a key that
        does not match its certificate (a rotation half written) is refused by gRPC, which
        keeps the previous one too, and read again at the next change of either file.
        """
        with self._lock:
            try:
                stamp = self._file_stamps()
                if stamp == self._stamp:
                    return None
                configuration = self.configuration()
            except OSError as e:
                logger.error("TLS files not reloaded, the certificates in use stay: %s", e)
                return None
            self._stamp = stamp
        logger.info("TLS files changed, re-read %s for new connections", ", ".join(map(str, self.paths)))
        return configuration

    def _file_stamps(self) -> tuple[tuple[int, int, int], ...]:
        return tuple((s.st_mtime_ns, s.st_size, s.st_ino) for s in (p.stat() for p in self.paths))
