"""Cutting packets out of a TCP byte stream, whatever the read boundaries."""

from __future__ import annotations

import asyncio
import struct
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from ecast.runtime.transport import Connection


class Sink:
    """The runtime side of a connection: records the packets it is handed."""

    max_frame = 1 << 20
    handshake_timeout = 5.0

    def __init__(self) -> None:
        self.bodies: list[bytes] = []

    def frame_received(self, conn: Connection, body: Any) -> None:
        self.bodies.append(bytes(body))


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
        conn = Connection(sink, dialer=False)  # type: ignore[arg-type]
        conn.state = "open"
        stream = b"".join(struct.pack(">I", len(b)) + b for b in bodies)
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

    rt = Runtime(b"secret")
    node = rt.add_node("r1", Endpoint("r1", ["x"]))
    conn = Connection(rt, dialer=True)
    rt.routes["e1"] = conn
    assert node.lag("e1") == 0
    rt.writing_paused(conn, True)  # the peer's process stopped reading
    assert node.lag("e1") >= CONGESTED and node.lag("e2") == 0
    rt.writing_paused(conn, False)
    assert node.lag("e1") == 0
