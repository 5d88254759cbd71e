"""Authenticated, length-prefixed connections between two OS processes (hosts).

One connection joins two *hosts* (runtimes), however many logical nodes each one runs:
a leader that forwards to sixteen receivers living in one process writes one packet, not
sixteen, and the receivers' acknowledgements come back in one packet too.  The handshake
authenticates the processes, once:

    dialer   -> acceptor  ["hello", version, host, incarnation, listen, nonce_d]
    acceptor -> dialer    ["challenge", version, host, incarnation, listen, nonce_a, mac_a]
    dialer   -> acceptor  ["proof", mac_d]
    acceptor -> dialer    ["ready"]

``mac_a`` and ``mac_d`` are HMAC-SHA256 over both nonces, both host ids and both
incarnations, keyed with the cluster secret: each side proves it knows the secret without
sending it, and the proof binds the identities it claims.

Afterwards every packet is ``4-byte big-endian length || body`` where the body is a msgpack
array of items (see :mod:`ecast.runtime` for the items).  A packet longer than the limit
(default 16 MiB), a malformed body, an unknown message type, a failed or silent handshake
closes the connection with a logged reason; the process goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import logging
import os
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import msgpack

from ecast.core.effects import NodeId

PROTOCOL_VERSION = 7
HANDSHAKE_TIMEOUT = 5.0
_JOIN_LIMIT = 64 * 1024
READ_BUDGET = 256 * 1024
"""Bytes a connection may hand to the process per event-loop turn.  Beyond it the
connection stops reading until the next turn, so timers (heartbeats, failure detection)
run between bursts: a peer that sends faster than this process can work must not stall
it for seconds, which its group would take for a crash.  TCP then pushes back on the
sender."""
_LEN = struct.Struct(">I")
log = logging.getLogger("ecast.runtime.transport")


class HandshakeError(Exception):
    pass


@dataclass(slots=True)
class PeerInfo:
    host: str
    incarnation: int
    listen: str | None


class Endpoint(Protocol):
    """What a connection needs from the local process (the runtime) it belongs to."""

    host_id: str
    incarnation: int
    listen: str | None
    secret: bytes
    max_frame: int
    handshake_timeout: float

    def check_peer(self, peer: PeerInfo) -> str | None:
        """None if ``peer`` may connect, else the reason it may not."""

    def connection_open(self, conn: Connection) -> None: ...

    def frame_received(self, conn: Connection, body: bytes | memoryview) -> None: ...

    def connection_closed(self, conn: Connection, reason: str) -> None: ...

    def writing_paused(self, conn: Connection, paused: bool) -> None:
        """The connection's send buffer crossed its high (or back under its low) mark."""


def _mac(secret: bytes, role: bytes, *parts: Any) -> bytes:
    h = hmac.new(secret, role, hashlib.sha256)
    for p in parts:
        h.update(b"\x00")
        h.update(p if isinstance(p, bytes) else str(p).encode())
    return h.digest()


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
        self._nonce = os.urandom(16)
        self._peer_nonce = b""
        self._timer: asyncio.TimerHandle | None = None
        self.closed_reason = ""
        self.packets_in = 0
        self.bytes_out = 0
        self.nodes: dict[NodeId, int] = {}
        self.ready: set[tuple[NodeId, NodeId]] = set()
        self.announced = False
        """Set once a node list from the peer arrived (``Runtime.connect`` waits for it)."""
        self._turn_bytes = 0
        self._turn_pending = False
        self._budget_paused = False
        self._owner_paused = False

    # ------------------------------------------------------------------ asyncio hooks
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's are not subclasses
        self.state = "handshake"
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(self.local.handshake_timeout, self._handshake_timeout)
        if self.dialer:
            me = self.local
            self._send_plain(
                ["hello", PROTOCOL_VERSION, me.host_id, me.incarnation, me.listen, self._nonce]
            )

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
        limit = self.local.max_frame
        while size - pos >= 4:
            (n,) = _LEN.unpack_from(data, pos)
            if n > limit:
                if self.state != "open" and bytes(data[pos : pos + 5]) == b"HTTP/":
                    self.close("not an E-Cast router (HTTP answered)")
                else:
                    self.close(f"frame of {n} bytes exceeds the {limit}-byte limit")
                return
            if size - pos - 4 < n:
                break
            body = view[pos + 4 : pos + 4 + n]
            pos += 4 + n
            if self.state == "open":
                self.packets_in += 1
                self.local.frame_received(self, body)
            else:
                try:
                    self._handshake_step(bytes(body))
                except HandshakeError as e:
                    self._refuse(str(e))
                    return
                except Exception as e:  # malformed handshake bodies of any shape
                    self._refuse(f"malformed handshake: {e}")
                    return
            if self.state == "closed":
                return
        if pos < size:
            rest = view[pos:]
            buf += rest
            self._need = 4 + _LEN.unpack_from(rest)[0] if len(rest) >= 4 else 4

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
        if self.state == "open":
            self.local.writing_paused(self, False)
        if self._timer is not None:
            self._timer.cancel()
        was = self.state
        self.state = "closed"
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
        if size <= _JOIN_LIMIT:
            t.write(b"".join((_LEN.pack(size), head, *parts)))
        else:
            t.writelines((_LEN.pack(size) + head, *parts))
        self.bytes_out += 4 + size

    def _send_plain(self, obj: Any) -> None:
        body = msgpack.packb(obj, use_bin_type=True)
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
            self.peer.host if self.peer else "?",
            reason,
        )
        if self.transport is not None:
            self.transport.close()

    # ------------------------------------------------------------------ handshake
    def _refuse(self, reason: str) -> None:
        log.warning(
            "event=handshake_refused host=%s peer=%s reason=%r",
            self.local.host_id,
            self.peer.host if self.peer else "?",
            reason,
        )
        with contextlib.suppress(Exception):  # best effort before closing
            self._send_plain(["error", reason])
        self.closed_reason = reason
        if self.transport is not None:
            self.transport.close()
        self.state = "closed"

    def _handshake_timeout(self) -> None:
        if self.state in ("handshake", "proven"):
            self._refuse(f"no handshake within {self.local.handshake_timeout:g}s")

    def _handshake_step(self, body: bytes) -> None:
        msg = msgpack.unpackb(body, raw=False, use_list=True, strict_map_key=False)
        if not isinstance(msg, list) or not msg or not isinstance(msg[0], str):
            raise HandshakeError("handshake expected")
        kind = msg[0]
        me = self.local
        if kind == "error":
            raise HandshakeError(f"peer refused: {msg[1] if len(msg) > 1 else '?'}")
        if not self.dialer and kind == "hello" and self.peer is None:
            _, version, host, inc, listen, nonce = msg
            self._check_version(version)
            self.peer = PeerInfo(str(host), int(inc), listen)
            self._peer_nonce = bytes(nonce)
            self._check_identity(self.peer)
            mac = _mac(
                me.secret, b"acceptor", self._peer_nonce, self._nonce, host, inc,
                me.host_id, me.incarnation,
            )  # fmt: skip
            self._send_plain(
                [
                    "challenge",
                    PROTOCOL_VERSION,
                    me.host_id,
                    me.incarnation,
                    me.listen,
                    self._nonce,
                    mac,
                ]
            )
        elif self.dialer and kind == "challenge" and self.peer is None:
            _, version, host, inc, listen, nonce, mac = msg
            self._check_version(version)
            peer = PeerInfo(str(host), int(inc), listen)
            want = _mac(
                me.secret, b"acceptor", self._nonce, bytes(nonce), me.host_id, me.incarnation,
                host, inc,
            )  # fmt: skip
            if not hmac.compare_digest(want, bytes(mac)):
                raise HandshakeError("acceptor failed authentication (wrong secret)")
            self.peer = peer
            self._check_identity(peer)
            proof = _mac(
                me.secret, b"dialer", bytes(nonce), self._nonce, me.host_id, me.incarnation,
                host, inc,
            )  # fmt: skip
            self._send_plain(["proof", proof])
            self.state = "proven"
        elif not self.dialer and kind == "proof" and self.peer is not None:
            peer = self.peer
            want = _mac(
                me.secret, b"dialer", self._nonce, self._peer_nonce, peer.host,
                peer.incarnation, me.host_id, me.incarnation,
            )  # fmt: skip
            if not hmac.compare_digest(want, bytes(msg[1])):
                raise HandshakeError("dialer failed authentication (wrong secret)")
            self._send_plain(["ready"])
            self._open()
        elif self.dialer and kind == "ready" and self.state == "proven":
            self._open()
        else:
            raise HandshakeError(f"unexpected {kind!r} during the handshake")

    def _check_version(self, version: Any) -> None:
        if version != PROTOCOL_VERSION:
            raise HandshakeError(
                f"protocol version {version} (this process speaks {PROTOCOL_VERSION})"
            )

    def _check_identity(self, peer: PeerInfo) -> None:
        problem = self.local.check_peer(peer)
        if problem:
            raise HandshakeError(problem)

    def _open(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.state = "open"
        self.local.connection_open(self)


def split_address(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"address must look like HOST:PORT, got {address!r}")
    return host.strip("[]"), int(port)
