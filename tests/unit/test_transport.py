"""Cutting packets out of a TCP byte stream, whatever the read boundaries, and checking
every packet's integrity tag before anything reads it."""

from __future__ import annotations

import asyncio
import struct
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ecast.runtime.transport import TAG, Connection, PacketMac

KEY = b"k" * 32


class Sink:
    """The runtime side of a connection: records the packets it is handed."""

    max_frame = 1 << 20
    handshake_timeout = 5.0
    host_id = "sink"

    def __init__(self) -> None:
        self.bodies: list[bytes] = []

    def frame_received(self, conn: Connection, body: Any) -> None:
        self.bodies.append(bytes(body))


class Wire:
    """A transport that records what the connection wrote and whether it closed."""

    def __init__(self) -> None:
        self.closed = False

    def close(self) -> None:
        self.closed = True


def open_connection(sink: Sink) -> Connection:
    conn = Connection(sink, dialer=False)  # type: ignore[arg-type]
    conn.state = "open"
    conn._recv_mac = PacketMac(KEY)
    conn.transport = Wire()  # type: ignore[assignment]
    return conn


def sealed(bodies: list[bytes]) -> bytes:
    """The stream a peer with the same key writes: each body with its tag."""
    mac = PacketMac(KEY)
    out = []
    for b in bodies:
        tag = mac.tag([b])
        out.append(struct.pack(">I", len(b) + TAG) + b + tag)
    return b"".join(out)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.binary(max_size=300), min_size=1, max_size=12),
    st.lists(st.integers(1, 400), min_size=1, max_size=40),
)
def test_packets_come_out_whole_and_in_order_however_the_stream_is_cut(
    bodies: list[bytes], cuts: list[int]
) -> None:
    async def run() -> list[bytes]:
        sink = Sink()
        conn = open_connection(sink)
        stream = sealed(bodies)
        pos = 0
        i = 0
        while pos < len(stream):
            step = cuts[i % len(cuts)]
            conn.data_received(stream[pos : pos + step])
            pos += step
            i += 1
        return sink.bodies

    assert asyncio.run(run()) == bodies


def test_a_peer_behind_a_congested_connection_counts_as_far_behind() -> None:
    from ecast.core.endpoint import Endpoint
    from ecast.runtime import CONGESTED, Runtime

    rt = Runtime(b"unit-test-3b9d5e7f1a2c4e6a8b0d2f4a6c8e0a2c")
    node = rt.add_node("r1", Endpoint("r1", ["x"]))
    conn = Connection(rt, dialer=True)
    rt.routes["e1"] = conn
    assert node.lag("e1") == 0
    rt.writing_paused(conn, True)  # the peer's process stopped reading
    assert node.lag("e1") >= CONGESTED and node.lag("e2") == 0
    rt.writing_paused(conn, False)
    assert node.lag("e1") == 0


def test_unsafe_copies_count_a_peer_far_behind_only_past_megabytes_unsent() -> None:
    """The leader sheds unsafe copies by ``unsafe_lag``: asyncio's congestion mark (64 KiB)
    is passed in every burst to a process hosting many destinations, so it must not
    count; megabytes unsent still do."""
    from ecast.core.endpoint import Endpoint
    from ecast.runtime import CONGESTED, Runtime
    from ecast.runtime.node import UNSAFE_BUFFER

    class Buffer:
        size = 0

        def get_write_buffer_size(self) -> int:
            return self.size

    rt = Runtime(b"unit-test-3b9d5e7f1a2c4e6a8b0d2f4a6c8e0a2c")
    node = rt.add_node("r1", Endpoint("r1", ["x"]))
    conn = Connection(rt, dialer=True)
    buf = Buffer()
    conn.transport = buf  # type: ignore[assignment]
    rt.routes["e1"] = conn
    buf.size = 256 * 1024
    rt.writing_paused(conn, True)  # past asyncio's mark
    assert node.lag("e1") >= CONGESTED and node.unsafe_lag("e1") == 0
    buf.size = UNSAFE_BUFFER + 1
    assert node.unsafe_lag("e1") >= CONGESTED and node.unsafe_lag("e2") == 0


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.binary(min_size=1, max_size=200), min_size=2, max_size=6),
    st.data(),
)
def test_a_packet_altered_replayed_or_reordered_on_the_way_is_refused(
    bodies: list[bytes], data: st.DataObject
) -> None:
    """One flipped bit anywhere (body, tag), a packet sent twice or two swapped: the
    connection closes at that packet and nothing from it on reaches the runtime."""
    stream = bytearray(sealed(bodies))
    attack = data.draw(st.sampled_from(["flip", "replay", "swap"]))
    first = 4 + len(bodies[0]) + TAG
    second = first + 4 + len(bodies[1]) + TAG
    if attack == "flip":
        pos = data.draw(st.integers(4, first - 1))  # in the first packet, after its length
        stream[pos] ^= 1 << data.draw(st.integers(0, 7))
        good = 0
    elif attack == "replay":
        stream[first:first] = stream[:first]
        good = 1
    else:
        stream = stream[first:second] + stream[:first] + stream[second:]
        good = 0

    async def run() -> tuple[list[bytes], bool]:
        sink = Sink()
        conn = open_connection(sink)
        conn.data_received(bytes(stream))
        return sink.bodies, conn.transport.closed  # type: ignore[union-attr]

    got, closed = asyncio.run(run())
    assert closed
    assert got == bodies[:good]


def test_tag_of_parts_matches_tag_of_joined_body() -> None:
    """A packet too large to join is tagged part by part (incremental GCM); the receiver
    checks the contiguous body in one call: both must give the same tag for the same
    sequence number, and a tag is good for its own sequence number only."""
    parts = [b"\x93", bytes(range(256)) * 300, b"", b"tail"]
    joined = b"".join(parts)
    by_parts, by_body, checker = PacketMac(KEY), PacketMac(KEY), PacketMac(KEY)
    for _ in range(3):
        tag = by_parts.tag(parts)
        assert tag == by_body.tag_body(joined)
        assert len(tag) == TAG
        assert checker.verify(joined + tag)
    assert not checker.verify(joined + tag)  # replayed: the next number is expected
    first = PacketMac(KEY).tag_body(joined)
    assert PacketMac(KEY).verify(joined + first)
    assert not PacketMac(KEY).verify(joined[:-1] + b"x" + first)  # altered body


def _kernel_caps_resends() -> bool:
    import socket

    from ecast.runtime.transport import cap_resend_wait

    with socket.socket() as s:
        return cap_resend_wait(s)


@pytest.mark.skipif(not _kernel_caps_resends(), reason="the kernel has no TCP_RTO_MAX_MS")
@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_both_ends_of_a_connection_resend_within_a_second_after_a_partition(loop: str) -> None:
    """Linux's resend wait doubles up to two minutes: a link that carried data across a
    three-second partition stayed silent for up to 3.3 s after the heal (measured with
    nftables dropping a loopback port), long enough for a client cut off with the old
    leader to outlive its lease at the new one.  Both the dialed and the accepted end
    cap it at a second, on either event loop the daemons run."""
    import socket

    from ecast.core.endpoint import Endpoint
    from ecast.runtime import Runtime
    from ecast.runtime.transport import _TCP_RTO_MAX_MS, RTO_MAX_MS

    secret = b"unit-test-3b9d5e7f1a2c4e6a8b0d2f4a6c8e0a2c"

    async def run() -> list[int]:
        a, b = Runtime(secret), Runtime(secret)
        a.add_node("r1", Endpoint("r1", ["x"]))  # a node list to announce
        address = await a.serve("127.0.0.1:0")
        try:
            conn = await b.connect(address)
            for _ in range(200):
                if a.conns:
                    break
                await asyncio.sleep(0.01)
            ends = [conn, *a.conns.values()]
            return [
                c.transport.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP, _TCP_RTO_MAX_MS)
                for c in ends
            ]
        finally:
            await b.close()
            await a.close()

    if loop == "uvloop":
        uvloop = pytest.importorskip("uvloop")
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            caps = runner.run(run())
    else:
        caps = asyncio.run(run())
    assert caps == [RTO_MAX_MS, RTO_MAX_MS]
