"""Authenticated, integrity-protected, length-prefixed connections between two OS processes.

One connection joins two *hosts* (runtimes), however many logical nodes each one runs:
a leader that forwards to sixteen receivers living in one process writes one packet, not
sixteen, and the receivers' acknowledgements come back in one packet too.  The handshake
(:mod:`ecast.runtime.handshake`) proves each side's credential (or, in the development
mode, knowledge of the cluster secret) once, and derives a key per direction.

Afterwards every packet is ``4-byte big-endian length || body || tag``: the body is a
msgpack array of items (:mod:`ecast.wire.packet`) and ``tag`` the 16-byte GMAC of the body
(AES-256-GCM with the body as associated data and nothing to encrypt), keyed with that
direction's key, its nonce the packet's sequence number in its direction.  The tag is
checked before anything is decoded: a packet altered, dropped, replayed, reordered or
injected on the way closes the connection.
It is one MAC per packet, and packets are batched (often tens of kilobytes), never one
per message.  Without TLS, packets are readable on the way: the tag protects integrity,
not confidentiality (``docs/security.md``).

A packet longer than the limit (default 16 MiB; ``MAX_HANDSHAKE_FRAME`` before the peer
proved itself), a malformed body, an unknown message type, a failed or silent handshake
closes the connection with a logged reason; the process goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import struct
from collections.abc import Callable
from typing import Protocol

import msgpack
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from ecast.core.effects import NodeId
from ecast.runtime.handshake import (
    MAX_HANDSHAKE_FRAME,
    PROTOCOL_VERSION,
    Auth,
    Handshake,
    HandshakeError,
    PeerInfo,
    decode_handshake,
)
from ecast.wire.codec import DecodeError

__all__ = [
    "PROTOCOL_VERSION",
    "Connection",
    "HandshakeError",
    "PeerInfo",
    "split_address",
]

HANDSHAKE_TIMEOUT = 5.0
RTO_MAX_MS = 1000
"""The longest a connection waits before resending what the peer has not acknowledged.

Linux doubles the wait after every unanswered resend, up to two minutes: a connection that
carried data across a partition of three seconds resends next up to 3.2 s after the
heal (measured here, a 3.5-s cut: 3.3 s), and a client silent that long after a heal can
outlive its lease (5 s) at a leader elected meanwhile.  Capped at a second (the least
Linux allows), a link is back within a second of the heal.  ``TCP_RTO_MAX_MS`` exists
from Linux 6.15; older kernels keep their own doubling."""
_TCP_RTO_MAX_MS = getattr(socket, "TCP_RTO_MAX_MS", 44)
TAG = 16
"""Bytes of the per-packet MAC (a GMAC tag)."""
_JOIN_LIMIT = 64 * 1024
READ_BUDGET = 256 * 1024
"""Bytes a connection may hand to the process per event-loop turn.  Beyond it the
connection stops reading until the next turn, so timers (heartbeats, failure detection)
run between bursts: a peer that sends faster than this process can work must not stall
it for seconds, which its group would take for a crash.  TCP then pushes back on the
sender."""
_LEN = struct.Struct(">I")
log = logging.getLogger("ecast.runtime.transport")


class PacketMac:
    """One direction's packet tags: GMAC (AES-256-GCM with the body as associated data
    and an empty plaintext) with the direction's key, its 12-byte nonce the packet's
    sequence number in that direction.

    GMAC rather than HMAC-SHA256 for speed: with AES-NI and carry-less multiply it tags
    tens of kilobytes about ten times faster (25 KB: 1.4 µs against 14 µs), and tagging
    was most of what integrity cost per message.  It is a standard MAC (NIST SP 800-38D)
    as long as no nonce repeats under a key: each key serves one direction of one
    connection (fresh from the handshake's ephemeral X25519 exchange and nonces) and the
    sequence number only grows.  The sequence number also makes a replayed, dropped or
    reordered packet fail like an altered one.
    """

    __slots__ = ("_aead", "_aes", "seq")

    def __init__(self, key: bytes) -> None:
        self._aead = AESGCM(key)
        self._aes = algorithms.AES(key)
        self.seq = 0

    def _nonce(self) -> bytes:
        nonce = self.seq.to_bytes(12, "big")
        self.seq += 1
        return nonce

    def tag_body(self, body: bytes | memoryview) -> bytes:
        """The tag of the next packet sent, whose body is ``body`` (contiguous)."""
        return self._aead.encrypt(self._nonce(), b"", body)

    def tag(self, parts: tuple[bytes, ...] | list[bytes]) -> bytes:
        """The tag of the next packet sent, whose body is ``parts`` joined: for a packet
        too large to join (the one-shot call needs one buffer)."""
        if len(parts) == 1:
            return self.tag_body(parts[0])
        gcm = Cipher(self._aes, modes.GCM(self._nonce())).encryptor()
        for part in parts:
            gcm.authenticate_additional_data(part)
        gcm.finalize()
        return gcm.tag

    def verify(self, packet: bytes | memoryview) -> bool:
        """Whether ``packet`` (body then tag) is the next packet in this direction."""
        n = len(packet)
        if n < TAG:
            return False
        view = memoryview(packet)
        try:
            # The tag as a ciphertext of nothing: OpenSSL compares it in constant time.
            self._aead.decrypt(self.seq.to_bytes(12, "big"), view[n - TAG :], view[: n - TAG])
        except InvalidTag:
            return False
        self.seq += 1
        return True


class Endpoint(Protocol):
    """What a connection needs from the local process (the runtime) it belongs to."""

    host_id: str
    incarnation: int
    listen: str | None
    auth: Auth
    max_frame: int
    handshake_timeout: float

    def admit(self, conn: Connection) -> str | None:
        """None if a new connection may start its handshake, else why not (caps)."""

    def pre_auth_timeout(self) -> float:
        """How long the connection just admitted may take to prove itself."""

    def handshake_over(self, conn: Connection) -> None:
        """``conn`` is open or closed: it no longer counts against the handshake cap."""

    def check_peer(self, peer: PeerInfo) -> str | None:
        """None if the proven ``peer`` may connect, else the reason it may not."""

    def connection_open(self, conn: Connection) -> None: ...

    def frame_received(self, conn: Connection, body: bytes | memoryview) -> None: ...

    def connection_closed(self, conn: Connection, reason: str) -> None: ...

    def writing_paused(self, conn: Connection, paused: bool) -> None:
        """The connection's send buffer crossed its high (or back under its low) mark."""


class Connection(asyncio.Protocol):
    """One TCP connection, bound to a peer host once the handshake succeeds.

    The runtime keeps its per-connection bookkeeping here too: ``nodes`` (the peer's
    logical nodes and their incarnations) and ``ready`` (local-to-remote node pairs whose
    channel has been synchronised and may carry frames).
    """

    def __init__(
        self,
        local: Endpoint,
        dialer: bool,
        on_fail: Callable[[Connection, str], None] | None = None,
    ) -> None:
        self.local = local
        self.dialer = dialer
        self.on_fail = on_fail
        self.peer: PeerInfo | None = None
        self.state = "new"
        self.transport: asyncio.Transport | None = None
        self._buf = bytearray()
        self._need = 4
        """Bytes ``_buf`` must hold before the next packet can be cut from it."""
        self._handshake: Handshake | None = None
        self._send_mac: PacketMac | None = None
        """Tags the packets we send, once open."""
        self._recv_mac: PacketMac | None = None
        self._timer: asyncio.TimerHandle | None = None
        self.closed_reason = ""
        self.packets_in = 0
        self.bytes_out = 0
        self.nodes: dict[NodeId, int] = {}
        self.ready: set[tuple[NodeId, NodeId]] = set()
        self.pieces: list[bytes] = []
        """Parts of an item too big for one packet, joined as they come in order."""
        self.assembled = 0
        """Bytes in ``pieces``."""
        self.announced = False
        """Set once a node list from the peer arrived (``Runtime.connect`` waits for it)."""
        self._deadline = 0.0
        self.source = ""
        """The peer's address (host only), for the per-source handshake cap."""
        self._turn_bytes = 0
        self._turn_pending = False
        self._budget_paused = False
        self._owner_paused = False

    # ------------------------------------------------------------------ asyncio hooks
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's are not subclasses
        self.state = "handshake"
        cap_resend_wait(transport.get_extra_info("socket"))
        me = self.local
        if not self.dialer:
            problem = me.admit(self)
            if problem:
                self.closed_reason = problem
                self.state = "closed"
                log.warning("event=connection_refused host=%s reason=%r", me.host_id, problem)
                self.transport.abort()
                return
        loop = asyncio.get_running_loop()
        self._deadline = me.pre_auth_timeout() if not self.dialer else me.handshake_timeout
        self._timer = loop.call_later(self._deadline, self._handshake_timeout)
        hs = Handshake(self.dialer, me.auth, me.host_id, me.incarnation, me.listen, me.check_peer)
        self._handshake = hs
        if self.dialer:
            self._send_plain(hs.start())

    def data_received(self, data: bytes) -> None:
        if not self._turn_pending:
            self._turn_pending = True
            asyncio.get_running_loop().call_soon(self._next_turn)
        self._turn_bytes += len(data)
        if self._turn_bytes > READ_BUDGET and not self._budget_paused and self.transport:
            self._budget_paused = True
            self.transport.pause_reading()
        # Bodies are views into what was read, not copies: a packet of a few hundred
        # kilobytes used to be copied twice and the rest of the buffer moved after it.
        buf = self._buf
        if buf:
            buf += data
            if len(buf) < self._need:
                return  # the rest of a packet is still on its way
            data = bytes(buf)
            buf.clear()
        view = memoryview(data)
        size = len(data)
        pos = 0
        limit = self.local.max_frame if self.state == "open" else MAX_HANDSHAKE_FRAME
        while size - pos >= 4:
            (n,) = _LEN.unpack_from(data, pos)
            if n > limit:
                if self.state != "open" and bytes(data[pos : pos + 5]) == b"HTTP/":
                    self.close("not an E-Cast router (HTTP answered)")
                elif self.state != "open":
                    self._refuse(f"a handshake frame of {n} bytes (the limit is {limit})")
                else:
                    self.close(f"frame of {n} bytes exceeds the {limit}-byte limit")
                return
            if size - pos - 4 < n:
                break
            body = view[pos + 4 : pos + 4 + n]
            pos += 4 + n
            if self.state == "open":
                if not self._authentic(body):
                    return
                self.packets_in += 1
                self.local.frame_received(self, body[:-TAG])
            elif self.state == "closed":
                return
            else:
                try:
                    self._handshake_step(bytes(body))
                except (HandshakeError, DecodeError) as e:
                    self._refuse(str(e))
                    return
                if self.state == "open":
                    limit = self.local.max_frame
            if self.state == "closed":
                return
        if pos < size:
            rest = view[pos:]
            buf += rest
            self._need = 4 + _LEN.unpack_from(rest)[0] if len(rest) >= 4 else 4

    def _authentic(self, body: memoryview) -> bool:
        """Check a packet's tag (and count it in its direction's sequence) before anything
        reads it; close the connection if it fails."""
        assert self._recv_mac is not None
        if self._recv_mac.verify(body):
            return True
        n = len(body)
        reason = "packet failed authentication (altered, replayed or injected on the way)"
        if self.packets_in == 0 and n <= MAX_HANDSHAKE_FRAME:
            # The dialer refused our proof: its last word is a plain handshake error.
            with contextlib.suppress(DecodeError):
                msg = decode_handshake(body)
                if msg[0] == "error" and len(msg) == 2 and type(msg[1]) is str:
                    reason = f"peer refused: {msg[1][:300]}"
        log.warning(
            "event=bad_packet host=%s peer=%s reason=%r",
            self.local.host_id,
            self.peer.host if self.peer else "?",
            reason,
        )
        self.close(reason)
        return False

    def _next_turn(self) -> None:
        self._turn_pending = False
        self._turn_bytes = 0
        if self._budget_paused:
            self._budget_paused = False
            if not self._owner_paused and self.transport is not None and self.state != "closed":
                self.transport.resume_reading()

    def set_reading(self, paused: bool) -> None:
        """The owner's backpressure (a full delivery queue), combined with the budget's."""
        self._owner_paused = paused
        t = self.transport
        if t is None or self.state == "closed":
            return
        if paused:
            t.pause_reading()
        elif not self._budget_paused:
            t.resume_reading()

    def pause_writing(self) -> None:
        self.local.writing_paused(self, True)

    def resume_writing(self) -> None:
        self.local.writing_paused(self, False)

    def connection_lost(self, exc: Exception | None) -> None:
        # Whatever its state (a connection closed while its buffer was full is "closing"
        # by now): left among the congested, it would block ``writable()`` for good.
        self.local.writing_paused(self, False)
        if self._timer is not None:
            self._timer.cancel()
        was = self.state
        self.state = "closed"
        if was == "handshake":
            self.local.handshake_over(self)
        reason = self.closed_reason or (str(exc) if exc else "peer closed the connection")
        self.closed_reason = reason
        if was == "open":
            self.local.connection_closed(self, reason)
        elif self.on_fail is not None:
            self.on_fail(self, reason)

    # ------------------------------------------------------------------ sending
    def send(self, head: bytes, parts: list[bytes], size: int) -> None:
        """One packet of ``size`` bytes: ``head`` followed by ``parts``.

        A large packet is handed over in pieces, which uvloop passes to one ``writev``:
        joining it first cost three allocations of its full size per packet (the join, the
        array header, the length prefix), and those short-lived buffers of hundreds of
        kilobytes fragmented the heap, so a leader's resident memory crept up for a minute.
        A small packet is still joined: one buffer is cheaper to hand over than many.
        """
        t = self.transport
        if t is None or self.state != "open":
            return
        assert self._send_mac is not None
        if size <= _JOIN_LIMIT:
            # One buffer for one write: uvloop sends a lone buffer with its fast
            # ``try_write``, but builds a write context for several.  Joining the body
            # twice costs less than that, and less than tagging a memoryview of it.
            body = b"".join((head, *parts))
            t.write(b"".join((_LEN.pack(size + TAG), body, self._send_mac.tag_body(body))))
        else:
            tag = self._send_mac.tag((head, *parts))
            t.writelines((_LEN.pack(size + TAG) + head, *parts, tag))
        self.bytes_out += 4 + size + TAG

    def _send_plain(self, body: bytes) -> None:
        assert self.transport is not None
        self.transport.writelines((_LEN.pack(len(body)), body))

    def close(self, reason: str) -> None:
        if self.state == "closed":
            return
        if not self.closed_reason:
            self.closed_reason = reason
        log.info(
            "event=connection_closed host=%s peer=%s reason=%r",
            self.local.host_id,
            self.peer_name(),
            reason,
        )
        if self.transport is not None:
            self.transport.close()

    # ------------------------------------------------------------------ handshake
    def peer_name(self) -> str:
        """The peer's host id for logs: proven, or claimed (marked with a ``?``)."""
        if self.peer is not None:
            return self.peer.host
        hs = self._handshake
        claimed = hs.claimed if hs is not None else None
        return f"?{claimed!r:.60}" if claimed else "?"

    def _refuse(self, reason: str) -> None:
        log.warning(
            "event=handshake_refused host=%s peer=%s reason=%r",
            self.local.host_id,
            self.peer_name(),
            reason,
        )
        with contextlib.suppress(Exception):  # best effort before closing
            self._send_plain(msgpack.packb(["error", reason[:300]]))
        self.closed_reason = reason
        if self.transport is not None:
            self.transport.close()
        if self.state != "closed":
            self.state = "closed"
            self.local.handshake_over(self)

    def _handshake_timeout(self) -> None:
        if self.state == "handshake":
            self._refuse(f"no handshake within {self._deadline:g}s")

    def _handshake_step(self, body: bytes) -> None:
        hs = self._handshake
        assert hs is not None
        for out in hs.receive(body):
            self._send_plain(out)
        if hs.done:
            assert hs.peer is not None and hs.keys is not None
            self.peer = hs.peer
            self._send_mac = PacketMac(hs.keys.send)
            self._recv_mac = PacketMac(hs.keys.receive)
            self._handshake = None
            self._open()

    def _open(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.state = "open"
        self.local.handshake_over(self)
        self.local.connection_open(self)


def cap_resend_wait(sock: socket.socket | None) -> bool:
    """Cap a TCP socket's resend wait at ``RTO_MAX_MS``: whether the kernel took it."""
    if sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return False
    try:
        sock.setsockopt(socket.IPPROTO_TCP, _TCP_RTO_MAX_MS, RTO_MAX_MS)
    except OSError:
        return False  # a kernel before 6.15, or not Linux
    return True


def split_address(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"address must look like HOST:PORT, got {address!r}")
    return host.strip("[]"), int(port)
