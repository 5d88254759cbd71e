"""Bad input against a real router daemon: refused, logged, and the daemon keeps serving."""

from __future__ import annotations

import asyncio
import os
import socket
import struct
import time
from pathlib import Path

import msgpack
import pytest

import ecast
from ecast.runtime.transport import PROTOCOL_VERSION, _mac
from ecast.wire.codec import pack
from tests.integration.cluster import SECRET, Cluster, RouterProc


@pytest.fixture
def router(tmp_path: Path):  # type: ignore[no-untyped-def]
    c = Cluster(tmp_path)
    r = c.start("r1", None, "--handshake-timeout", "0.5", "--max-frame", "65536")
    c.wait_healthy("r1")
    yield r
    c.stop_all()


def send(sock: socket.socket, obj: object) -> None:
    body = msgpack.packb(obj, use_bin_type=True)
    sock.sendall(struct.pack(">I", len(body)) + body)


def recv(sock: socket.socket, timeout: float = 3.0) -> object | None:
    sock.settimeout(timeout)
    try:
        head = sock.recv(4, socket.MSG_WAITALL)
        if len(head) < 4:
            return None
        (n,) = struct.unpack(">I", head)
        return msgpack.unpackb(sock.recv(n, socket.MSG_WAITALL), raw=False)
    except (TimeoutError, ConnectionError, OSError):
        return None


def closed(sock: socket.socket, timeout: float = 3.0) -> bool:
    sock.settimeout(timeout)
    try:
        while True:
            if not sock.recv(65536):
                return True
    except TimeoutError:
        return False
    except (ConnectionError, OSError):
        return True


def handshake(
    r: RouterProc,
    host: str = "intruder",
    inc: int = 1,
    secret: str = SECRET,
    version: int = PROTOCOL_VERSION,
) -> tuple[socket.socket, object]:
    """Do the dialer's side of the handshake by hand; return the socket and the last reply."""
    sock = socket.create_connection(("127.0.0.1", r.port))
    nonce = os.urandom(16)
    send(sock, ["hello", version, host, inc, None, nonce])
    reply = recv(sock)
    if not (isinstance(reply, list) and reply[0] == "challenge"):
        return sock, reply
    _k, _v, peer, peer_inc, _listen, peer_nonce, _mac_a = reply
    proof = _mac(secret.encode(), b"dialer", bytes(peer_nonce), nonce, host, inc, peer, peer_inc)
    send(sock, ["proof", proof])
    return sock, recv(sock)


def send_packet(sock: socket.socket, *items: object) -> None:
    """A packet of multiplexed items, as a runtime sends after the handshake."""
    body = msgpack.packb(list(items), use_bin_type=True)
    sock.sendall(struct.pack(">I", len(body)) + body)


def packets(sock: socket.socket, timeout: float = 3.0) -> list[object]:
    """Every item the router sends until it goes quiet."""
    out: list[object] = []
    while True:
        p = recv(sock, timeout)
        if p is None:
            return out
        out.extend(p if isinstance(p, list) else [p])
        timeout = 0.5


def still_serving(r: RouterProc) -> None:
    async def go() -> None:
        c = await ecast.connect(
            [r.address], name=f"probe{time.monotonic_ns()}", secret=SECRET.encode()
        )
        ack = await c.submit(b"still here", timeout=10)
        assert ack.delivered
        await c.close()

    asyncio.get_event_loop_policy().new_event_loop().run_until_complete(go())
    h = r.health()
    assert h is not None and h["status"] == "ok"
    assert r.alive()


def test_wrong_secret_is_refused(router: RouterProc) -> None:
    sock, reply = handshake(router, secret="not-the-secret")
    assert isinstance(reply, list) and reply[0] == "error" and "wrong secret" in reply[1]
    assert closed(sock)
    assert "event=handshake_refused" in router.log.read_text()
    still_serving(router)


async def test_sdk_with_the_wrong_secret_cannot_connect(router: RouterProc) -> None:
    with pytest.raises(ConnectionError):
        await ecast.connect([router.address], name="bad", secret=b"nope")


def test_wrong_protocol_version_is_refused(router: RouterProc) -> None:
    sock, reply = handshake(router, version=PROTOCOL_VERSION + 41)
    assert isinstance(reply, list) and reply[0] == "error" and "version" in reply[1]
    assert closed(sock)
    still_serving(router)


def test_stale_incarnation_is_refused(router: RouterProc) -> None:
    sock, reply = handshake(router)
    assert reply == ["ready"]
    send_packet(sock, ["nodes", [["ghost", 1000]]])
    frame = pack(("ghost", "r1", 1000, 0, 1, 0, ()))
    body = b"\x91" + frame  # a one-item packet: the router now knows incarnation 1000
    sock.sendall(struct.pack(">I", len(body)) + body)
    time.sleep(0.2)
    old, reply = handshake(router, host="intruder-2")
    assert reply == ["ready"]
    send_packet(old, ["nodes", [["ghost", 999]]])  # an earlier life of "ghost"
    items = packets(old)
    assert ["error", "stale incarnation 999 of ghost (current 1000)"] in items
    assert closed(old)
    assert "stale incarnation" in router.log.read_text()
    still_serving(router)


def test_an_older_incarnation_of_a_process_is_refused(router: RouterProc) -> None:
    _sock, reply = handshake(router, host="proc", inc=50)
    assert reply == ["ready"]
    old, reply = handshake(router, host="proc", inc=49)
    assert isinstance(reply, list) and reply[0] == "error" and "stale incarnation" in reply[1]
    assert closed(old)
    still_serving(router)


def test_frames_from_a_node_that_was_not_announced_are_refused(router: RouterProc) -> None:
    sock, _ = handshake(router)
    frame = pack(("nobody", "r1", 7, 0, 1, 0, ()))
    body = b"\x91" + frame
    sock.sendall(struct.pack(">I", len(body)) + body)
    assert any("unannounced node" in str(x) for x in packets(sock))
    assert closed(sock)
    still_serving(router)


def test_claiming_the_routers_own_node_id_is_refused(router: RouterProc) -> None:
    sock, _ = handshake(router)
    send_packet(sock, ["nodes", [["r1", 5]]])
    assert any("runs here" in str(x) for x in packets(sock))
    assert closed(sock)
    still_serving(router)


def test_malformed_frame_closes_the_connection(router: RouterProc) -> None:
    sock, reply = handshake(router)
    assert reply == ["ready"]
    junk = b"\xc1\xff\x00garbage"
    sock.sendall(struct.pack(">I", len(junk)) + junk)
    assert closed(sock)
    assert "event=bad_frame" in router.log.read_text()
    still_serving(router)


def test_unknown_message_type_closes_the_connection(router: RouterProc) -> None:
    sock, _ = handshake(router)
    body = msgpack.packb(msgpack.ExtType(99, msgpack.packb([1, 2])), use_bin_type=True)
    sock.sendall(struct.pack(">I", len(body)) + body)
    assert closed(sock)
    assert "unknown message type code 99" in router.log.read_text()
    still_serving(router)


def test_oversized_frame_closes_the_connection(router: RouterProc) -> None:
    sock, _ = handshake(router)
    sock.sendall(struct.pack(">I", 10_000_000) + b"x" * 1000)  # the limit is 64 KiB here
    assert closed(sock)
    assert "exceeds the 65536-byte limit" in router.log.read_text()
    still_serving(router)


def test_a_peer_that_connects_and_says_nothing_is_dropped(router: RouterProc) -> None:
    sock = socket.create_connection(("127.0.0.1", router.port))
    t0 = time.monotonic()
    assert closed(sock, timeout=5)
    assert time.monotonic() - t0 < 3
    assert "no handshake within 0.5s" in router.log.read_text()
    still_serving(router)


def test_a_frame_with_a_wrongly_typed_header_is_refused(router: RouterProc) -> None:
    sock, _ = handshake(router)
    send_packet(sock, ["nodes", [["typo", 1]]])
    data = b"\x91" + pack(("typo", "r1", 1, 0, "one", 0, ()))
    sock.sendall(struct.pack(">I", len(data)) + data)
    assert closed(sock)
    assert "bad frame header" in router.log.read_text()
    still_serving(router)


def test_well_formed_frame_with_a_wrongly_typed_field_is_refused(router: RouterProc) -> None:
    sock, _ = handshake(router)
    from ecast.core.proto import Confirm

    send_packet(sock, ["nodes", [["typo", 1]]])
    bad = (Confirm("not a number"),)  # type: ignore[arg-type]
    data = b"\x91" + pack(("typo", "r1", 1, 0, 1, 0, bad))
    sock.sendall(struct.pack(">I", len(data)) + data)
    assert closed(sock)
    assert "Confirm.upto" in router.log.read_text()
    still_serving(router)
