"""The addresses a server binds for a host name: every one its clients may reach it at.

gRPC binds ``host:port`` on every address the name resolves to and reports success if any one
bound: with ``127.0.0.1:P`` taken, ``localhost:P`` started on ``[::1]`` alone, and clients of
``localhost:P`` reached the other server. Servers here bind each address of
:func:`host_addresses` on its own, and fail if any one fails.
"""

from __future__ import annotations

import errno
import socket
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import grpc

__all__ = ["bind_every_address", "host_addresses", "join_host_port"]

_LOOPBACKS = ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1"))

_MISSING_FAMILY = (errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT)
"""How binding fails on a machine without that address family (no IPv6)."""


def host_addresses(host: str) -> list[tuple[socket.AddressFamily, str]]:
    """``(family, address)`` of each address a server on ``host`` binds, without repeats.

    What the system resolver answers for ``host`` (a bracketed IPv6 address is unbracketed;
    ``""`` means every interface), and for ``localhost`` both loopback addresses this machine
    has: gRPC's resolver answers both for that name (RFC 6761), whatever ``/etc/hosts`` says,
    so a client of ``localhost:P`` may try either.

    Example:
        >>> host_addresses("localhost")
        [(<AddressFamily.AF_INET: 2>, '127.0.0.1'), (<AddressFamily.AF_INET6: 10>, '::1')]

    Raises:
        OSError: ``host`` does not resolve (``socket.gaierror``).
    """
    name = host.strip("[]") or None
    found = [
        (socket.AddressFamily(family), str(address[0]))
        for family, _, _, _, address in socket.getaddrinfo(
            name, 0, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
    ]
    if name == "localhost":
        found += [(family, address) for family, address in _LOOPBACKS if _has_address(family, address)]
    return list(dict.fromkeys(found))


def bind_every_address(
    server: grpc.Server,
    host: str,
    port: int,
    credentials: grpc.ServerCredentials | None = None,
    what: str = "gRPC",
) -> int:
    """Binds ``server`` to ``port`` on every address ``host`` resolves to (:func:`host_addresses`),
    the same port on each (``port`` 0: the one the first bind picked); returns the port.

    Raises:
        OSError: an address cannot be bound (``cannot serve <what> on host:port: ...``, naming
            the address): grpcio would have served the others alone.
    """
    try:
        addresses = host_addresses(host)
    except OSError as e:
        raise OSError(f"cannot serve {what} on {host}:{port}: {e.strerror or e}") from None
    for _, address in addresses:
        target = join_host_port(address, port)
        try:
            if credentials is None:
                bound = server.add_insecure_port(target)
            else:
                bound = server.add_secure_port(target, credentials)
        except RuntimeError:  # grpcio's "Failed to bind to address"
            bound = 0
        if not bound:  # older grpcio answers 0 instead of raising
            which = "" if target == f"{host}:{port}" else f" ({target})"
            cause = f"the address is in use or not available{which}"
            raise OSError(f"cannot serve {what} on {host}:{port}: {cause}")
        port = bound
    return port


def join_host_port(address: str, port: int) -> str:
    """``address:port``, an IPv6 address in brackets (``[::1]:50051``)."""
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


def _has_address(family: socket.AddressFamily, address: str) -> bool:
    """Whether this machine can bind ``address`` (IPv6 may be off)."""
    try:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.bind((address, 0))
    except OSError as e:
        if e.errno in _MISSING_FAMILY:
            return False
        raise
    return True
