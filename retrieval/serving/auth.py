"""Who may call: identities, the bearer tokens and client certificates that prove them, and
their permissions, read from an access file (TOML) that is re-read when it changes.

Example access file::

    [identities.team-a]
    tokens = ["a-long-random-string"]       # sent as `authorization: Bearer <token>`
    permissions = ["retrieve", "info"]
    rate = 50                                # requests/s (overrides --rate-limit; 0 = unlimited)
    burst = 100

    [identities.team-b]
    token_sha256 = ["9f86d081884c7d65..."]  # hex SHA-256 of the token: the file holds no secret
    token_env = "TEAM_B_TOKEN"               # or a token from the server's environment
    certificates = ["team-b.clients.example.com"]  # mutual TLS: a client certificate's CN or SAN
    permissions = ["retrieve"]
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import threading
import time
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from retrieval.api.convert import SERVICE_NAME

logger = logging.getLogger(__name__)

PERMISSIONS = ("retrieve", "info", "admin")
"""``retrieve``: Retrieve and BatchRetrieve; ``info``: GetModelInfo and server reflection;
``admin``: every method, including any other (reserved for administrative RPCs)."""

METHOD_PERMISSIONS = {
    f"/{SERVICE_NAME}/Retrieve": "retrieve",
    f"/{SERVICE_NAME}/BatchRetrieve": "retrieve",
    f"/{SERVICE_NAME}/GetModelInfo": "info",
    "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo": "info",
    "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo": "info",
}
"""Full method name -> the permission it needs; methods not listed need ``admin``."""

OPEN_SERVICES = ("/grpc.health.v1.Health/",)
"""Method prefixes anyone may call without credentials: the health service, for probes."""

IDENTITY_KEYS = {"tokens", "token_sha256", "token_env", "certificates", "permissions", "rate", "burst"}
CERTIFICATE_NAMES = ("x509_common_name", "x509_subject_alternative_name")
"""The keys of ``ServicerContext.auth_context()`` holding a client certificate's CN and SANs."""


class AccessDenied(Exception):
    """A call refused by access control; ``code`` is its gRPC status.

    Attributes:
        refusal: why, the ``reason`` label of ``retrieval_refusals_total``.
    """

    code = grpc.StatusCode.PERMISSION_DENIED

    def __init__(self, message: str, refusal: str = "permission") -> None:
        super().__init__(message)
        self.refusal = refusal


class Unauthenticated(AccessDenied):
    """No credentials (``refusal`` ``missing_credentials``), or credentials of no known
    identity (``invalid_token``)."""

    code = grpc.StatusCode.UNAUTHENTICATED


@dataclass(frozen=True)
class Identity:
    """A caller.

    Attributes:
        name: how logs, metrics and rate limits call it.
        permissions: names from :data:`PERMISSIONS`.
        rate: its own rate limit in requests a second (0 = unlimited); ``None`` for the server's.
        burst: its own burst; ``None`` for the server's (or one second's worth of its own rate).
        anonymous: not an identity of an access file but a client address (``name``): a
            server without an access file lets it call anything, one with an access file only
            rate-limits it before refusing it.
    """

    name: str
    permissions: frozenset[str] = frozenset(PERMISSIONS)
    rate: float | None = None
    burst: float | None = None
    anonymous: bool = False

    def authorize(self, method: str) -> None:
        """Checks that it may call ``method`` (a full name, ``/package.Service/Method``).

        Raises:
            AccessDenied: it lacks the permission the method needs.
        """
        needed = METHOD_PERMISSIONS.get(method, "admin")
        if needed not in self.permissions and "admin" not in self.permissions:
            name = method.rpartition("/")[2]
            raise AccessDenied(f"identity {self.name!r} may not call {name} (needs permission {needed!r})")


@dataclass(frozen=True)
class Identities:
    """The identities of an access file, by the SHA-256 of their tokens and by certificate name."""

    by_token: Mapping[bytes, Identity]
    by_certificate: Mapping[str, Identity]


def token_digest(token: str) -> bytes:
    """The SHA-256 a token is looked up by (a lookup that compares digests, not the secret)."""
    return hashlib.sha256(token.encode()).digest()


def parse_identities(text: str, source: str = "access file") -> Identities:
    """Reads an access file's TOML (see the module docstring).

    Raises:
        ValueError: invalid TOML, an unknown key or permission, a token or certificate name of
            two identities, an identity without credentials, a ``token_env`` that is not set.
    """
    try:
        table = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"{source}: {e}") from None
    if set(table) - {"identities"} or not isinstance(table.get("identities"), dict):
        raise ValueError(f"{source}: expected only [identities.NAME] tables")
    by_token: dict[bytes, Identity] = {}
    by_certificate: dict[str, Identity] = {}
    for name, entry in table["identities"].items():
        where = f"{source}: identity {name!r}"
        identity, digests, certificates = parse_identity(name, entry, where)
        if not digests and not certificates:
            raise ValueError(f"{where} has no token and no certificate")
        for digest in digests:
            if by_token.setdefault(digest, identity) is not identity:
                raise ValueError(f"{where} shares a token with {by_token[digest].name!r}")
        for certificate in certificates:
            if by_certificate.setdefault(certificate, identity) is not identity:
                raise ValueError(f"{where} shares certificate {certificate!r} with another identity")
    return Identities(by_token, by_certificate)


def parse_identity(name: str, entry: Any, where: str) -> tuple[Identity, list[bytes], list[str]]:
    """One ``[identities.NAME]`` table: the identity, its token digests and certificate names."""
    if not isinstance(entry, dict) or set(entry) - IDENTITY_KEYS:
        raise ValueError(f"{where}: keys must be among {sorted(IDENTITY_KEYS)}")
    permissions = strings(entry, "permissions", where)
    unknown = set(permissions) - set(PERMISSIONS)
    if unknown:
        raise ValueError(f"{where}: unknown permissions {sorted(unknown)}; choose from {PERMISSIONS}")
    rate, burst = entry.get("rate"), entry.get("burst")
    if rate is not None and not (isinstance(rate, int | float) and math.isfinite(rate) and rate >= 0):
        raise ValueError(f"{where}: rate must be a number >= 0 (0 = unlimited)")
    if burst is not None and not (isinstance(burst, int | float) and math.isfinite(burst) and burst >= 1):
        raise ValueError(f"{where}: burst must be a number >= 1")
    tokens = strings(entry, "tokens", where)
    for i, token in enumerate(tokens):
        _check_token(token, f"{where}: tokens[{i}]")
    digests = [token_digest(token) for token in tokens]
    for hexdigest in strings(entry, "token_sha256", where):
        try:
            digests.append(bytes.fromhex(hexdigest))
        except ValueError:
            raise ValueError(f"{where}: token_sha256 {hexdigest!r} is not hexadecimal") from None
    if "token_env" in entry:
        token = os.environ.get(str(entry["token_env"]), "")
        if not token:
            raise ValueError(f"{where}: environment variable {entry['token_env']!r} is not set")
        _check_token(token, f"{where}: the token of environment variable {entry['token_env']!r}")
        digests.append(token_digest(token))
    if any(len(d) != hashlib.sha256().digest_size for d in digests):
        raise ValueError(f"{where}: a token_sha256 is not 64 hexadecimal digits")
    identity = Identity(name, frozenset(permissions), rate, burst)
    return identity, digests, strings(entry, "certificates", where)


def _check_token(token: str, where: str) -> None:
    """Refuses a token no call could match: one with whitespace around it (the server reads a
    caller's token without it, :func:`bearer_token`) or a control character (which gRPC metadata
    cannot carry).

    Raises:
        ValueError: naming the entry, never the token.
    """
    if token != token.strip() or not token.isprintable():
        raise ValueError(
            f"{where} starts or ends with whitespace or holds a control character: "
            "no call could ever match it"
        )


def strings(entry: dict[str, Any], key: str, where: str) -> list[str]:
    """``entry[key]``, a list of non-empty strings (empty when absent)."""
    value = entry.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ValueError(f"{where}: {key} must be a list of non-empty strings")
    return value


class AccessFile:
    """The identities of an access file, re-read when the file changes (checked at most every
    ``check_interval`` seconds, on the calls themselves: no thread).

    A change that does not parse, or a file deleted or unreadable, leaves the identities read
    before in force (the last good file: a typo must not lock every caller out, nor let every
    caller in), and is made visible: an ERROR line once per change, :attr:`failures` counted,
    :attr:`stale` saying why until a good file is read, and the hooks of :meth:`on_reload`
    (the server's metrics) told.

    Example:
        >>> access = AccessFile(Path("/etc/mitt/access.toml"))
        >>> access.identify(context.invocation_metadata(), context.auth_context()).name
        'team-a'
    """

    def __init__(self, path: Path, check_interval: float = 1.0) -> None:
        """Reads ``path``.

        Raises:
            OSError: the file cannot be read.
            ValueError: it is not a valid access file (:func:`parse_identities`).
        """
        self.path = Path(path)
        self.check_interval = check_interval
        self._lock = threading.Lock()
        self._stamp: tuple[int, int, int] | None = self._file_stamp()
        self._identities = parse_identities(self.path.read_text(), str(self.path))
        self._checked = time.monotonic()
        self._hooks: list[Callable[[bool], None]] = []
        self.failures = 0
        """Changes of the file that were not applied (unparsable, deleted, unreadable)."""
        self.stale: str | None = None
        """Why the identities in force are not the file's, ``None`` while they are."""

    @property
    def identities(self) -> Identities:
        """The identities in force (the last good file's)."""
        return self._identities

    def check(self) -> None:
        """Re-reads the file if it changed, at most every ``check_interval`` seconds, as
        :meth:`identify` does first: the native engine, which reads no file on its calls, calls
        it from a thread of its own."""
        self._reload_if_changed()

    def on_reload(self, hook: Callable[[bool], None]) -> None:
        """Registers ``hook(applied)``, called after every change of the file is read: ``True``
        when it is in force, ``False`` when it was not applied."""
        self._hooks.append(hook)

    def identify(
        self, metadata: Sequence[tuple[str, str | bytes]] | None, auth_context: Mapping[str, Sequence[bytes]]
    ) -> Identity:
        """The caller: by its bearer token if it sends one, else by its client certificate.

        Args:
            metadata: the call's invocation metadata (``authorization: Bearer <token>``).
            auth_context: the call's ``ServicerContext.auth_context()`` (certificate CN and SANs).

        Raises:
            Unauthenticated: no token and no known certificate, or a wrong token.
        """
        self._reload_if_changed()
        identities = self._identities
        token = bearer_token(metadata)
        if token is not None:
            identity = identities.by_token.get(token_digest(token))
            if identity is None:
                raise Unauthenticated("invalid bearer token", "invalid_token")
            return identity
        for key in CERTIFICATE_NAMES:
            for name in auth_context.get(key, ()):
                identity = identities.by_certificate.get(name.decode(errors="replace"))
                if identity is not None:
                    return identity
        raise Unauthenticated(
            "missing credentials: send 'authorization: Bearer <token>' metadata", "missing_credentials"
        )

    def _file_stamp(self) -> tuple[int, int, int]:
        stat = self.path.stat()
        return stat.st_mtime_ns, stat.st_size, stat.st_ino

    def _reload_if_changed(self) -> None:
        now = time.monotonic()
        if now - self._checked < self.check_interval or not self._lock.acquire(blocking=False):
            return  # checked recently, or another call is checking
        try:
            self._checked = now
            try:
                stamp: tuple[int, int, int] | None = self._file_stamp()
            except OSError:
                stamp = None  # deleted or unreadable: reported once, until it changes again
            if stamp == self._stamp:
                return
            self._stamp = stamp
            try:
                self._identities = parse_identities(self.path.read_text(), str(self.path))
            except (OSError, ValueError) as e:
                self._failed(e)
            else:
                self.stale = None
                logger.info("access file %s reloaded", self.path)
                self._tell(True)
        finally:
            self._lock.release()

    def _failed(self, error: OSError | ValueError) -> None:
        """Records a change that was not applied."""
        reason = f"{self.path}: {error.strerror}" if isinstance(error, OSError) else str(error)
        self.failures += 1
        self.stale = reason
        logger.error("access file not reloaded, the previous identities stay in force: %s", reason)
        self._tell(False)

    def _tell(self, applied: bool) -> None:
        for hook in self._hooks:
            hook(applied)


def bearer_token(metadata: Sequence[tuple[str, str | bytes]] | None) -> str | None:
    """The token of the first ``authorization: Bearer <token>`` entry; ``None`` when there is none."""
    for key, value in metadata or ():
        if key == "authorization" and isinstance(value, str):
            scheme, _, token = value.partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return token.strip()
    return None
