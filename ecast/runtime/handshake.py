"""The connection handshake, sans-IO: who the peer is, and the keys that protect its packets.

Four messages, each a msgpack array in one length-prefixed frame of at most
``MAX_HANDSHAKE_FRAME`` bytes::

    dialer   -> acceptor  ["hello", version, host, incarnation, listen, nonce_d, eph_d]
    acceptor -> dialer    ["challenge", version, host, incarnation, listen, nonce_a, eph_a]
    dialer   -> acceptor  ["proof", certificate_d, proof_d]
    acceptor -> dialer    ["proof", certificate_a, proof_a]

``eph`` are ephemeral X25519 public keys, ``nonce`` 32 random bytes.  The *transcript* is
SHA-256 over the hello and the challenge exactly as sent, so it covers both versions,
host ids, incarnations, listen addresses, nonces and ephemeral keys.  A proof is, with a
credential (``ecast.security.credentials``), the certificate and an Ed25519 signature
over the transcript; in the development mode, no certificate and HMAC-SHA256 of the
transcript keyed with the cluster secret.  Each side's proof is bound to its side
(``dialer``/``acceptor``), so one cannot be reflected as the other.

The dialer proves first, and the acceptor proves only to a dialer that did: an acceptor
never hands a stranger something to test guesses of the secret against.  The acceptor
records nothing about the peer (not its incarnation, not its host id) before the proof.

Both sides then derive two packet keys, one per direction, with HKDF-SHA256 from the
X25519 shared secret, salted with the transcript (``PacketKeys``); ``ecast.runtime.
transport`` puts a MAC with a sequence number on every packet with them.  Ephemeral keys
make past traffic's keys unrecoverable from a credential or secret stolen later.

Every field has an exact type and length, checked before it is used: a hello of 17 bytes
that asked for ``bytes(2**30)`` once stalled the event loop for a second.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import msgpack
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from ecast.core.roles import ANY
from ecast.security.credentials import MAX_CERTIFICATE, Credential, CredentialError, covers
from ecast.wire.codec import DecodeError

PROTOCOL_VERSION = 17
MAX_HANDSHAKE_FRAME = 8 * 1024
"""Largest frame a peer may send before it proved itself (a certificate is under 1 KiB)."""
MAX_HOST = 256
MAX_LISTEN = 270
MAX_INCARNATION = 2**63 - 1
NONCE = 32
KEY = 32
_TRANSCRIPT = b"ecast handshake v8\x00"
_PROOF = {True: b"ecast dialer proof v8\x00", False: b"ecast acceptor proof v8\x00"}
_KEYS_INFO = b"ecast packet keys v8"


class HandshakeError(Exception):
    pass


@dataclass(frozen=True, slots=True)
class Identity:
    """What a peer proved: its role and the names it may announce."""

    role: str
    names: tuple[str, ...]
    serial: str
    """The certificate's serial; empty in the development mode."""

    def covers(self, name: str) -> bool:
        return covers(self.names, name)

    def describe(self) -> str:
        if not self.serial:
            return "the development secret"
        return f"{self.role} credential {self.serial} ({', '.join(self.names)})"


DEVELOPMENT = Identity(ANY, ("*",), "")
"""Every peer of the development mode: it knows the secret, so it may be anyone."""


@dataclass(slots=True)
class PeerInfo:
    host: str
    incarnation: int
    listen: str | None
    identity: Identity = DEVELOPMENT

    @property
    def key(self) -> str:
        """The runtime's key for this peer's process: its host id, qualified by its
        credential, so that a process with another credential can never take the place of
        this one (by claiming its host id with a larger incarnation)."""
        serial = self.identity.serial
        return f"{self.host}#{serial}" if serial else self.host


@dataclass(frozen=True, slots=True)
class PacketKeys:
    send: bytes
    receive: bytes


class Auth(Protocol):
    """How this process proves itself and checks its peers."""

    identity: Identity

    def prove(self, transcript: bytes, dialer: bool) -> tuple[bytes | None, bytes]:
        """``(certificate, proof)`` for this side of ``transcript``."""

    def check(self, certificate: Any, proof: Any, transcript: bytes, dialer: bool) -> Identity: ...


class SecretAuth:
    """The development mode: HMAC-SHA256 of the transcript keyed with the cluster secret."""

    identity = DEVELOPMENT

    def __init__(self, secret: bytes) -> None:
        self.secret = secret

    def _mac(self, transcript: bytes, dialer: bool) -> bytes:
        return hmac.digest(self.secret, _PROOF[dialer] + transcript, "sha256")

    def prove(self, transcript: bytes, dialer: bool) -> tuple[bytes | None, bytes]:
        return None, self._mac(transcript, dialer)

    def check(self, certificate: Any, proof: Any, transcript: bytes, dialer: bool) -> Identity:
        if certificate is not None:
            raise HandshakeError(
                "peer presented a credential, this process uses the development secret"
            )
        if type(proof) is not bytes or len(proof) != 32:
            raise HandshakeError("malformed handshake: a secret proof is 32 bytes")
        if not hmac.compare_digest(self._mac(transcript, dialer), proof):
            raise HandshakeError("peer failed authentication (wrong secret)")
        return DEVELOPMENT


class CredentialAuth:
    """Per-process credentials: the certificate and a signature over the transcript."""

    def __init__(self, credential: Credential) -> None:
        self.credential = credential
        cert = credential.certificate
        self.identity = Identity(cert.role, cert.names, cert.serial)

    def prove(self, transcript: bytes, dialer: bool) -> tuple[bytes | None, bytes]:
        return (
            self.credential.certificate.encoded,
            self.credential.sign(_PROOF[dialer] + transcript),
        )

    def check(self, certificate: Any, proof: Any, transcript: bytes, dialer: bool) -> Identity:
        if certificate is None:
            raise HandshakeError(
                "peer uses the development secret, this process requires a credential"
            )
        if type(proof) is not bytes or len(proof) != 64:
            raise HandshakeError("malformed handshake: a signature is 64 bytes")
        try:
            cert = self.credential.authority.verify(certificate)
        except CredentialError as e:
            raise HandshakeError(f"peer failed authentication ({e})") from None
        try:
            Ed25519PublicKey.from_public_bytes(cert.public_key).verify(
                proof, _PROOF[dialer] + transcript
            )
        except InvalidSignature:
            raise HandshakeError(
                f"peer failed authentication (no valid signature for {cert.serial})"
            ) from None
        return Identity(cert.role, cert.names, cert.serial)


# ------------------------------------------------------------------ decoding
def _no_ext(code: int, data: bytes) -> Any:
    raise DecodeError("no extension types in a handshake")


def decode_handshake(body: bytes | memoryview) -> list[Any]:
    """A handshake message as a list whose first item is its kind; nothing else decodes."""
    if len(body) > MAX_HANDSHAKE_FRAME:
        raise DecodeError(f"a handshake message of {len(body)} bytes")
    try:
        msg = msgpack.unpackb(
            body,
            raw=False,
            use_list=True,
            strict_map_key=True,
            ext_hook=_no_ext,
        )
    except DecodeError:
        raise
    except Exception as e:  # msgpack's many shapes of "malformed"
        raise DecodeError(f"malformed handshake: {type(e).__name__}") from None
    if type(msg) is not list or not msg or type(msg[0]) is not str:
        raise DecodeError("a handshake message is a list led by its kind")
    return msg


def _host(value: Any) -> str:
    if type(value) is not str or not 1 <= len(value) <= MAX_HOST or not value.isprintable():
        raise HandshakeError(f"malformed handshake: host id {value!r:.40}")
    return value


def _listen(value: Any) -> str | None:
    if value is None:
        return None
    if type(value) is not str or len(value) > MAX_LISTEN or not value.isprintable():
        raise HandshakeError(f"malformed handshake: listen address {value!r:.40}")
    host, _, port = value.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536 or " " in value:
        raise HandshakeError(f"malformed handshake: listen address {value!r:.40}")
    return value


def _bytes(value: Any, size: int, what: str) -> bytes:
    if type(value) is not bytes or len(value) != size:
        raise HandshakeError(f"malformed handshake: {what} must be {size} bytes")
    return value


def _introduction(msg: list[Any], kind: str) -> tuple[PeerInfo, bytes, bytes]:
    """A hello or a challenge, every field checked: peer, nonce, ephemeral key."""
    if len(msg) != 7:
        raise HandshakeError(f"malformed handshake: {kind} has {len(msg)} fields, not 7")
    _, version, host, inc, listen, nonce, eph = msg
    if type(version) is not int or version != PROTOCOL_VERSION:
        raise HandshakeError(
            f"protocol version {version!r:.20} (this process speaks {PROTOCOL_VERSION})"
        )
    if type(inc) is not int or not 0 <= inc <= MAX_INCARNATION:
        raise HandshakeError(f"malformed handshake: incarnation {inc!r:.30}")
    peer = PeerInfo(_host(host), inc, _listen(listen))
    return peer, _bytes(nonce, NONCE, "the nonce"), _bytes(eph, KEY, "the ephemeral key")


class Handshake:
    """One side of one connection's handshake.

    ``start()`` gives the dialer's first message; ``receive(body)`` takes each message from
    the peer and returns the messages to send back.  ``check(peer)`` is the owner's last
    word on a proven peer (None to admit it, else why not); it runs before this side sends
    its own proof.  Once ``done``, ``peer`` (with its proven identity) and ``keys`` are set.
    Any failure raises :class:`HandshakeError` (or ``DecodeError``) with the reason.
    """

    def __init__(
        self,
        dialer: bool,
        auth: Auth,
        host: str,
        incarnation: int,
        listen: str | None,
        check: Callable[[PeerInfo], str | None],
    ) -> None:
        self.dialer = dialer
        self.auth = auth
        self.check = check
        self.done = False
        self.peer: PeerInfo | None = None
        """Set once the peer proved itself (before that, nothing about it is trusted)."""
        self.keys: PacketKeys | None = None
        self.claimed: str | None = None
        """The host id the peer claims, for logs only, until it proves it."""
        self._eph = X25519PrivateKey.generate()
        eph = self._eph.public_key().public_bytes_raw()
        kind = "hello" if dialer else "challenge"
        self._mine = msgpack.packb(
            [kind, PROTOCOL_VERSION, host, incarnation, listen, os.urandom(NONCE), eph],
            use_bin_type=True,
        )
        self._theirs: bytes | None = None
        self._claim: PeerInfo | None = None
        self._peer_eph = b""
        self._transcript = b""
        self._stage = "start" if dialer else "hello"

    def start(self) -> bytes:
        assert self.dialer and self._stage == "start"
        self._stage = "challenge"
        return self._mine

    def receive(self, body: bytes) -> list[bytes]:
        msg = decode_handshake(body)
        kind = msg[0]
        if kind == "error":
            reason = msg[1] if len(msg) == 2 and type(msg[1]) is str else "?"
            raise HandshakeError(f"peer refused: {reason[:300]}")
        stage = self._stage
        if kind != stage and not (kind == "proof" and stage in ("proof", "final")):
            raise HandshakeError(f"unexpected {kind[:20]!r} during the handshake")
        if stage == "hello":
            self._introduced(msg, body)
            self._stage = "proof"
            return [self._mine]
        if stage == "challenge":
            self._introduced(msg, body)
            self._stage = "final"
            return [self._proof()]
        if stage == "proof":  # the acceptor checks the dialer's proof, then proves
            self._proven(msg)
            out = [self._proof()]
            self._finish()
            return out
        if stage == "final":  # the dialer checks the acceptor's proof
            self._proven(msg)
            self._finish()
            return []
        raise HandshakeError("handshake already finished")

    # ------------------------------------------------------------------ steps
    def _introduced(self, msg: list[Any], body: bytes) -> None:
        claim, _nonce, eph = _introduction(msg, msg[0])
        self.claimed = claim.host
        self._claim = claim
        self._peer_eph = eph
        self._theirs = bytes(body)
        hello, challenge = (self._mine, self._theirs) if self.dialer else (self._theirs, self._mine)
        h = hashlib.sha256(_TRANSCRIPT)
        for part in (hello, challenge):
            h.update(len(part).to_bytes(4, "big"))
            h.update(part)
        self._transcript = h.digest()

    def _proof(self) -> bytes:
        cert, proof = self.auth.prove(self._transcript, self.dialer)
        return msgpack.packb(["proof", cert, proof], use_bin_type=True)

    def _proven(self, msg: list[Any]) -> None:
        if len(msg) != 3:
            raise HandshakeError("malformed handshake: a proof has 3 fields")
        _, cert, proof = msg
        if cert is not None and (type(cert) is not bytes or len(cert) > MAX_CERTIFICATE):
            raise HandshakeError("malformed handshake: a certificate is at most 4 KiB of bytes")
        identity = self.auth.check(cert, proof, self._transcript, not self.dialer)
        claim = self._claim
        assert claim is not None
        peer = PeerInfo(claim.host, claim.incarnation, claim.listen, identity)
        problem = self.check(peer)
        if problem:
            raise HandshakeError(problem)
        self.peer = peer

    def _finish(self) -> None:
        try:
            shared = self._eph.exchange(X25519PublicKey.from_public_bytes(self._peer_eph))
        except ValueError:  # a low-order point: no shared secret
            raise HandshakeError("malformed handshake: unusable ephemeral key") from None
        okm = HKDF(hashes.SHA256(), 2 * KEY, self._transcript, _KEYS_INFO).derive(shared)
        to_acceptor, to_dialer = okm[:KEY], okm[KEY:]
        if self.dialer:
            self.keys = PacketKeys(send=to_acceptor, receive=to_dialer)
        else:
            self.keys = PacketKeys(send=to_dialer, receive=to_acceptor)
        self.done = True
        self._stage = "done"
