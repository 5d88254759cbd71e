"""Per-process credentials: who a process is (its names) and what it may do (its role).

A cluster has one *certificate authority* (CA): an Ed25519 key pair the operator keeps.
Every process holds a *credential*: its own Ed25519 private key and a *certificate* the CA
signed, which says

- ``role``: ``router`` (may take part in ufabcast and send what routers send to
  application processes) or ``application`` (an SDK process);
- ``names``: the node names the process may announce, each an exact name or a prefix
  ending in ``*`` (``client:spark-*``: Spark tasks take a fresh name per attempt, and
  names are unique for ever);
- ``public_key``, ``serial`` (random, for revocation), ``issued`` and ``expires``.

Every process trusts the CA's public key, which its credential file carries, so two
application processes (a storage process serving direct connections and its client)
verify each other without any secret of the operator's.  Why asymmetric rather than keys
derived from one master secret: an acceptor that checks derived keys must hold the master
secret, and then every router, and every application process that serves direct
connections, could mint any identity.

Files are JSON, for people to read; the certificate itself is the signed msgpack body
inside (``certificate``), and the readable fields beside it are informational.  Files that
hold a private key are written with mode 600 and refused when others can read them.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from ecast.core.roles import APPLICATION, ROUTER
from ecast.security.secret import shared_with_others

ROLES = (ROUTER, APPLICATION)
MAX_NAME = 200
"""Longest name pattern (the SDK's longest process name)."""
MAX_NAMES = 64
MAX_CERTIFICATE = 4096
"""Largest certificate a handshake carries, in bytes."""
_CERT_TAG = "ecast-cert"
_CERT_VERSION = 1
_SIGNED = b"ecast certificate v1\x00"
"""Prefix of what the CA signs: a CA signature can never be replayed as another kind of
signature (a handshake proof is prefixed differently)."""


class CredentialError(ValueError):
    """A credential, certificate or CA file that cannot be used, and why."""


def check_pattern(pattern: Any) -> str:
    """A valid name pattern: an exact name, or a prefix followed by one final ``*``."""
    if type(pattern) is not str or not pattern or len(pattern) > MAX_NAME:
        raise CredentialError(f"a name pattern is 1 to {MAX_NAME} characters, got {pattern!r:.60}")
    if not pattern.isprintable() or any(c.isspace() for c in pattern):
        raise CredentialError(f"name pattern {pattern!r:.60} must be printable, without spaces")
    if pattern.startswith("@"):
        raise CredentialError(f"{pattern!r}: names starting with @ are reserved for the routers")
    if "*" in pattern[:-1]:
        raise CredentialError(f"{pattern!r}: '*' may only end a pattern (a prefix)")
    if pattern == "*":
        raise CredentialError(
            "'*' alone covers every name: its holder could take any process's name (a "
            "super's, a storage process's, a router's not yet announced) and every "
            "session; give a prefix such as 'client:*'"
        )
    return pattern


def covers(patterns: tuple[str, ...], name: str) -> bool:
    """Whether any of ``patterns`` (exact names or ``prefix*``) matches ``name``."""
    for p in patterns:
        if p[-1] == "*":
            if name.startswith(p[:-1]):
                return True
        elif p == name:
            return True
    return False


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _unb64(text: Any, what: str) -> bytes:
    try:
        return base64.b64decode(str(text), validate=True)
    except (ValueError, TypeError) as e:
        raise CredentialError(f"{what}: not base64 ({e})") from None


def _raw_public(key: Ed25519PublicKey) -> bytes:
    return key.public_bytes(Encoding.Raw, PublicFormat.Raw)


@dataclass(frozen=True, slots=True)
class Certificate:
    """A CA-signed statement: the holder of ``public_key`` is ``role`` under ``names``."""

    serial: str
    role: str
    names: tuple[str, ...]
    public_key: bytes
    issued: int
    expires: int
    """Unix seconds; 0: never."""
    encoded: bytes
    """The certificate as it travels: msgpack ``[body, signature]``."""

    def covers(self, name: str) -> bool:
        return covers(self.names, name)

    def describe(self) -> dict[str, Any]:
        return {
            "serial": self.serial,
            "role": self.role,
            "names": list(self.names),
            "issued": _iso(self.issued),
            "expires": _iso(self.expires) if self.expires else "never",
        }


def _iso(t: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


class Authority:
    """What every process trusts: the CA's public key, and the serials it revoked."""

    def __init__(self, public_key: bytes, revoked: frozenset[str] = frozenset()) -> None:
        if type(public_key) is not bytes or len(public_key) != 32:
            raise CredentialError("a CA public key is 32 bytes")
        self.public_key = public_key
        self._key = Ed25519PublicKey.from_public_bytes(public_key)
        self.revoked = revoked

    def verify(self, encoded: Any, now: float | None = None) -> Certificate:
        """The certificate in ``encoded`` if this CA signed it and it is in force."""
        if type(encoded) is not bytes or len(encoded) > MAX_CERTIFICATE:
            raise CredentialError("a certificate is at most 4 KiB of bytes")
        try:
            outer = msgpack.unpackb(encoded, raw=False, use_list=False)
        except Exception:
            raise CredentialError("a certificate that does not decode") from None
        if (
            type(outer) is not tuple
            or len(outer) != 2
            or type(outer[0]) is not bytes
            or type(outer[1]) is not bytes
            or len(outer[1]) != 64
        ):
            raise CredentialError("a certificate is [body, 64-byte signature]")
        body, signature = outer
        try:
            self._key.verify(signature, _SIGNED + body)
        except InvalidSignature:
            raise CredentialError("certificate not signed by this cluster's CA") from None
        cert = _parse_body(body, encoded)
        if cert.serial in self.revoked:
            raise CredentialError(f"certificate {cert.serial} was revoked")
        t = time.time() if now is None else now
        if cert.expires and t > cert.expires:
            raise CredentialError(f"certificate {cert.serial} expired at {_iso(cert.expires)}")
        if t + 300 < cert.issued:  # five minutes of clock skew
            raise CredentialError(
                f"certificate {cert.serial} is not valid before {_iso(cert.issued)}"
            )
        return cert


def _parse_body(body: bytes, encoded: bytes) -> Certificate:
    """Signed by the CA, so trusted, but still checked: a bug in an issuer must not turn
    into an exception deep in a handshake."""
    try:
        fields = msgpack.unpackb(body, raw=False, use_list=False)
        tag, version, serial, role, names, public_key, issued, expires = fields
    except Exception:
        raise CredentialError("a certificate body of the wrong shape") from None
    if tag != _CERT_TAG or version != _CERT_VERSION:
        raise CredentialError(f"unknown certificate format {tag!r:.20} {version!r:.10}")
    if (
        type(serial) is not str
        or role not in ROLES
        or type(names) is not tuple
        or not 1 <= len(names) <= MAX_NAMES
        or type(public_key) is not bytes
        or len(public_key) != 32
        or type(issued) is not int
        or type(expires) is not int
    ):
        raise CredentialError("a certificate with fields of the wrong types")
    for n in names:
        check_pattern(n)
    return Certificate(serial, role, names, public_key, issued, expires, encoded)


@dataclass(frozen=True)
class Credential:
    """A process's private key, its certificate, and the CA it trusts."""

    certificate: Certificate
    private_key: Ed25519PrivateKey
    authority: Authority

    def sign(self, data: bytes) -> bytes:
        return self.private_key.sign(data)

    @property
    def role(self) -> str:
        return self.certificate.role

    @property
    def names(self) -> tuple[str, ...]:
        return self.certificate.names

    def with_revoked(self, revoked: frozenset[str]) -> Credential:
        return Credential(
            self.certificate, self.private_key, Authority(self.authority.public_key, revoked)
        )

    # ------------------------------------------------------------------ files
    def to_json(self) -> str:
        from cryptography.hazmat.primitives.serialization import NoEncryption, PrivateFormat

        raw = self.private_key.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
        doc = {
            "ecast_credential": 1,
            **self.certificate.describe(),
            "certificate": _b64(self.certificate.encoded),
            "private_key": _b64(raw),
            "ca": _b64(self.authority.public_key),
        }
        return json.dumps(doc, indent=1) + "\n"

    def save(self, path: Path | str) -> None:
        _write_private(Path(path), self.to_json())

    @staticmethod
    def load(path: Path | str, revoked: frozenset[str] = frozenset()) -> Credential:
        """A credential file; refused if others can read it, or if it is not in force."""
        p = Path(path)
        doc = _read_private(p, "ecast_credential")
        authority = Authority(_unb64(doc.get("ca"), f"{p}: ca"), revoked)
        try:
            cert = authority.verify(_unb64(doc.get("certificate"), f"{p}: certificate"))
        except CredentialError as e:
            raise CredentialError(f"{p}: {e}") from None
        key = Ed25519PrivateKey.from_private_bytes(_unb64(doc.get("private_key"), f"{p}: key"))
        if _raw_public(key.public_key()) != cert.public_key:
            raise CredentialError(f"{p}: the private key does not match the certificate")
        return Credential(cert, key, authority)


class CertificateAuthority:
    """The operator's signing key (keep its file offline, or at least mode 600)."""

    def __init__(self, private_key: Ed25519PrivateKey) -> None:
        self._key = private_key
        self.public_key = _raw_public(private_key.public_key())

    @staticmethod
    def create() -> CertificateAuthority:
        return CertificateAuthority(Ed25519PrivateKey.generate())

    def authority(self, revoked: frozenset[str] = frozenset()) -> Authority:
        return Authority(self.public_key, revoked)

    def issue(
        self,
        role: str,
        names: list[str] | tuple[str, ...],
        *,
        expires: int = 0,
        now: float | None = None,
    ) -> Credential:
        """A new key pair and its certificate for ``role`` under ``names``."""
        if role not in ROLES:
            raise CredentialError(f"role must be one of {', '.join(ROLES)}, got {role!r}")
        names = tuple(check_pattern(n) for n in names)
        if not 1 <= len(names) <= MAX_NAMES:
            raise CredentialError(f"a credential covers 1 to {MAX_NAMES} names")
        key = Ed25519PrivateKey.generate()
        issued = int(time.time() if now is None else now)
        serial = secrets.token_hex(8)
        body = msgpack.packb(
            [_CERT_TAG, _CERT_VERSION, serial, role, list(names), _raw_public(key.public_key()),
             issued, int(expires)],
            use_bin_type=True,
        )  # fmt: skip
        signature = self._key.sign(_SIGNED + body)
        encoded = msgpack.packb([body, signature], use_bin_type=True)
        cert = _parse_body(body, encoded)
        return Credential(cert, key, self.authority())

    # ------------------------------------------------------------------ files
    def save(self, path: Path | str) -> None:
        from cryptography.hazmat.primitives.serialization import NoEncryption, PrivateFormat

        raw = self._key.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
        doc = {
            "ecast_ca": 1,
            "public_key": _b64(self.public_key),
            "private_key": _b64(raw),
            "created": _iso(int(time.time())),
        }
        _write_private(Path(path), json.dumps(doc, indent=1) + "\n")

    @staticmethod
    def load(path: Path | str) -> CertificateAuthority:
        p = Path(path)
        doc = _read_private(p, "ecast_ca")
        key = Ed25519PrivateKey.from_private_bytes(_unb64(doc.get("private_key"), f"{p}: key"))
        return CertificateAuthority(key)


def read_revoked(path: Path | str) -> frozenset[str]:
    """Revoked serials: one per line; ``#`` starts a comment."""
    out = set()
    for line in Path(path).read_text().splitlines():
        serial = line.split("#", 1)[0].strip()
        if serial:
            out.add(serial)
    return frozenset(out)


def readable_by_others(path: Path) -> bool:
    return shared_with_others(path.stat())


def _write_private(path: Path, text: str) -> None:
    """Create the file with mode 600 from the start (never readable by others, even for a
    moment), replacing any earlier one."""
    tmp = path.with_name(path.name + ".tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def _read_private(path: Path, kind: str) -> dict[str, Any]:
    try:
        if readable_by_others(path):
            raise CredentialError(
                f"{path} can be read by others (it holds a private key): chmod 600 {path}"
            )
        doc = json.loads(path.read_text())
    except OSError as e:
        raise CredentialError(f"{path}: {e.strerror or e}") from None
    except json.JSONDecodeError as e:
        raise CredentialError(f"{path}: not a JSON document ({e})") from None
    if type(doc) is not dict or doc.get(kind) != 1:
        what = "a credential" if kind == "ecast_credential" else "a CA"
        raise CredentialError(f"{path} is not {what} file ({kind}: 1 missing)")
    return doc
