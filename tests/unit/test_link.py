"""The link layer restores FIFO, loss-less delivery over a lossy, duplicating network."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from ecast.core.link import DATAGRAM, Frame, LinkLayer, LinkParams


def pump(a: LinkLayer, b: LinkLayer, frames: list[tuple[str, Frame]], now: float) -> list:
    """Deliver frames a -> b; return what b delivered."""
    out = []
    for dst, frame in frames:
        assert dst == b.me
        out.extend(b.on_frame(a.me, frame, now))
    return out


def test_one_frame_per_peer_per_flush_carries_every_queued_message() -> None:
    a = LinkLayer("a", 1)
    for i in range(5):
        a.send("b", i)
    a.send("c", "x")
    frames = a.flush(0.0)
    assert sorted(dst for dst, _ in frames) == ["b", "c"]
    by_dst = dict(frames)
    assert by_dst["b"].msgs == (0, 1, 2, 3, 4)
    assert by_dst["b"].seq == 1
    assert a.flush(0.0) == []  # nothing queued, nothing sent


def test_sized_messages_are_cut_into_frames_of_at_most_frame_bytes_in_order() -> None:
    """A burst of sized messages (direct messages, packed) leaves in several frames, none
    over ``frame_bytes`` unless one message alone is bigger, and arrives whole, in order."""
    p = LinkParams(frame_bytes=100)
    a, b = LinkLayer("a", 1, p), LinkLayer("b", 1, p)
    sizes = [30, 30, 30, 30, 150, 10, 0, 60, 50]
    for i, size in enumerate(sizes):
        a.send("b", i, size)
    a.send("c", "x", 10)
    frames = a.flush(0.0)
    to_b = [f for dst, f in frames if dst == "b"]
    assert [f.msgs for f in to_b] == [(0, 1, 2), (3,), (4,), (5, 6, 7), (8,)]
    assert [f.seq for f in to_b] == [1, 2, 3, 4, 5]
    assert all(sum(sizes[i] for i in f.msgs) <= 100 for f in to_b if len(f.msgs) > 1)
    assert pump(a, b, [(d, f) for d, f in frames if d == "b"], 0.0) == list(range(len(sizes)))
    a.send("b", "next", 90)  # the byte count starts afresh with each flush
    a.send("b", "and", 10)
    assert [f.msgs for _, f in a.flush(0.0)] == [("next", "and")]


def test_lost_frame_is_resent_and_order_is_restored() -> None:
    p = LinkParams(resend_timeout=0.1, ack_delay=0.01)
    a, b = LinkLayer("a", 1, p), LinkLayer("b", 1, p)
    a.send("b", "m1")
    f1 = a.flush(0.0)
    a.send("b", "m2")
    f2 = a.flush(0.0)
    # f1 is lost; f2 arrives first and must wait in the reorder buffer.
    assert pump(a, b, f2, 0.0) == []
    assert a.next_deadline() == 0.1
    resent = a.on_tick(0.1)
    assert [f.seq for _, f in resent] == [f1[0][1].seq, f2[0][1].seq]
    assert pump(a, b, resent, 0.1) == ["m1", "m2"]
    # b acknowledges; a stops resending.
    acks = b.on_tick(0.2)
    for _, frame in acks:
        a.on_frame("b", frame, 0.2)
    assert a.unacked("b") == 0
    assert a.on_tick(1.0) == []


def test_duplicates_are_delivered_once() -> None:
    a, b = LinkLayer("a", 1), LinkLayer("b", 1)
    a.send("b", "m")
    frames = a.flush(0.0)
    assert pump(a, b, frames, 0.0) == ["m"]
    assert pump(a, b, frames, 0.0) == []


def test_ack_piggybacks_on_data() -> None:
    a, b = LinkLayer("a", 1), LinkLayer("b", 1)
    a.send("b", "ping")
    pump(a, b, a.flush(0.0), 0.0)
    b.send("a", "pong")
    ((_dst, frame),) = b.flush(0.001)
    assert frame.ack == 1
    a.on_frame("b", frame, 0.001)
    assert a.unacked("b") == 0


def test_new_incarnation_resets_the_channel_and_nothing_is_resent_to_it() -> None:
    a, b = LinkLayer("a", 1), LinkLayer("b", 1)
    a.send("b", "hello")
    pump(a, b, a.flush(0.0), 0.0)
    b.send("a", "reply")
    for _, f in b.flush(0.0):
        a.on_frame("b", f, 0.0)
    a.send("b", "to-old-b")
    a.flush(0.0)  # sent, never acknowledged: old b died
    b2 = LinkLayer("b", 2)  # b restarted: a new process
    b2.send("a", "i am new")
    got = [m for _, f in b2.flush(1.0) for m in a.on_frame("b", f, 1.0)]
    assert got == ["i am new"]
    assert a.unacked("b") == 0  # the old incarnation's frames are gone
    assert all(f.seq == 0 for _, f in a.on_tick(5.0))  # at most a bare ack, no data


def test_frames_for_a_dead_incarnation_are_dropped_and_answered() -> None:
    a = LinkLayer("a", 1)
    b2 = LinkLayer("b", 2)
    stale = Frame(src_inc=1, dst_inc=1, seq=7, ack=0, msgs=("old",))  # meant for b's first life
    assert b2.on_frame("a", stale, 0.0) == []
    assert b2.stats["frames_dropped_stale"] == 1
    # b2 answers with a bare ack that tells a about the new incarnation.
    answer = b2.on_tick(1.0)
    assert answer and answer[0][1].src_inc == 2 and answer[0][1].seq == 0
    a.on_frame("b", answer[0][1], 1.0)  # a resets its channel to b


def test_forgotten_peer_gets_best_effort_datagrams_both_ways() -> None:
    a, b = LinkLayer("a", 1), LinkLayer("b", 1)
    a.forget("b")
    a.send("b", "you were parted")
    ((_dst, frame),) = a.flush(0.0)
    assert frame.seq == DATAGRAM
    assert b.on_frame("a", frame, 0.0) == ["you were parted"]
    assert a.unacked("b") == 0 and a.on_tick(10.0) == []
    # Sequenced frames from a forgotten peer are delivered without channel state.
    b.send("a", "late")
    ((_dst, late),) = b.flush(0.0)
    assert a.on_frame("b", late, 0.0) == ["late"]


@settings(max_examples=300, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    n=st.integers(1, 60),
    loss=st.floats(0.0, 0.6),
    dup=st.floats(0.0, 0.3),
)
def test_lossy_duplicating_reordering_network_yields_fifo_exactly_once(
    seed: int, n: int, loss: float, dup: float
) -> None:
    rng = random.Random(seed)
    p = LinkParams(resend_timeout=0.05, ack_delay=0.01)
    a, b = LinkLayer("a", 1, p), LinkLayer("b", 1, p)
    got: list[int] = []
    wire: list[tuple[float, str, Frame]] = []  # (arrival, receiver, frame)
    now = 0.0
    sent = 0

    def transmit(src: LinkLayer, frames: list[tuple[str, Frame]]) -> None:
        for dst, f in frames:
            if rng.random() < loss:
                continue
            copies = 2 if rng.random() < dup else 1
            for _ in range(copies):
                wire.append((now + rng.uniform(0.001, 0.03), dst, f))

    for _ in range(4000):
        if sent < n and rng.random() < 0.3:
            a.send("b", sent)
            sent += 1
            transmit(a, a.flush(now))
        now += 0.005
        wire.sort(key=lambda x: x[0])
        due = [w for w in wire if w[0] <= now]
        wire = [w for w in wire if w[0] > now]
        for _, dst, f in due:
            if dst == "b":
                got.extend(b.on_frame("a", f, now))
            else:
                a.on_frame("b", f, now)
        transmit(a, a.on_tick(now))
        transmit(b, b.on_tick(now))
        if sent == n and len(got) == n and a.unacked("b") == 0:
            break
    assert got == list(range(n))


def test_old_duplicates_leave_no_state_behind() -> None:
    a, b = LinkLayer("a", 1), LinkLayer("b", 1)
    frames = []
    for i in range(3):
        a.send("b", i)
        frames += a.flush(0.0)
    pump(a, b, frames, 0.0)
    pump(a, b, frames, 0.0)  # every frame again
    assert b._chans["a"].reorder == {}


def test_unacked_messages_count_until_the_peer_acknowledges_them() -> None:
    a, b = LinkLayer("a", 1), LinkLayer("b", 1)
    for i in range(3):
        a.send("b", i)
    f1 = a.flush(0.0)
    a.send("b", 3)
    f2 = a.flush(0.0)
    assert a.unacked_messages("b") == 4 and a.unacked_messages("nobody") == 0
    pump(a, b, f1 + f2, 0.0)
    b.send("a", "reply")  # carries b's acknowledgement of both frames
    pump(b, a, b.flush(0.0), 0.0)
    assert a.unacked_messages("b") == 0
    # Resends keep counting what is still unacknowledged, and nothing twice.
    a.send("b", "lost")
    a.flush(0.0)
    a.on_tick(10.0)
    assert a.unacked_messages("b") == 1


def test_a_dropped_peer_loses_its_buffers_not_what_is_queued_and_its_name_starts_afresh() -> None:
    a = LinkLayer("a", 1)
    a.send("app", "x")
    a.send("app", "y")
    a.flush(0.0)
    assert a.unacked("app") == 1 and a.unacked_messages("app") == 2
    a.send("app", "queued")
    a.drop("app")  # it parted; its departure is stable and collected
    assert a.unacked("app") == 0 and "app" not in a.peers()
    # What was queued in the same step (the acknowledgement of its part) still leaves,
    # once, as a datagram; nothing unacknowledged is ever resent.
    [(_, last)] = a.flush(0.1)
    assert last.seq == DATAGRAM and last.msgs == ("queued",)
    assert a.on_tick(10.0) == [] and a.flush(10.0) == []
    # Unlike forget, the name is not remembered: a new process called "app" gets a
    # channel with ordering and resends again, not best-effort datagrams.
    app = LinkLayer("app", 7)
    app.send("a", "hello")
    [(_, frame)] = app.flush(0.2)
    assert frame.seq != DATAGRAM and a.on_frame("app", frame, 0.2) == ["hello"]
    a.send("app", "welcome")
    [(_, reply)] = a.flush(0.3)
    assert reply.seq == 1 and reply.dst_inc == 7


def test_after_a_peer_stopped_what_is_sent_to_its_name_goes_to_its_next_incarnation() -> None:
    a, b = LinkLayer("a", 1), LinkLayer("b", 1)
    a.send("b", "hello")
    pump(a, b, a.flush(0.0), 0.0)
    a.send("b", "to-old-b")
    a.flush(0.1)  # never acknowledged: b stops
    a.peer_stopped("b", 1)  # its process said so
    assert a.unacked("b") == 0 and a.ended_incarnation("b") == 1
    a.send("b", "to-whoever-is-next")
    [(_, waiting)] = a.flush(0.2)  # no connection to anyone called b yet
    assert waiting.dst_inc == 0
    assert a.on_connected("b", 1, 0, 0.3) == []  # the stopped one cannot take it
    b2 = LinkLayer("b", 2)
    resent = a.on_connected("b", 2, 0, 0.4)
    assert [f.dst_inc for _, f in resent] == [2]
    assert pump(a, b2, resent, 0.4) == ["to-whoever-is-next"]
    # The stopped incarnation stays stale; a channel on a newer one is left alone.
    assert a.on_frame("b", Frame(1, 1, 9, 0, ("late",)), 0.5) == []
    a.peer_stopped("b", 1)
    assert a.known_incarnation("b") == 2 and a.ended_incarnation("b") == 1
    a.peer_stopped("nobody", 3)
    assert "nobody" not in a.peers()


def test_frames_ahead_of_a_gap_are_held_within_byte_bounds_and_released() -> None:
    """Probe: 300 frames of 1 MiB after a gap took a router from 52 to 356 MB, kept after
    the sender disconnected.  Frames beyond the bounds are dropped (the sender resends
    what was not acknowledged), and a gone connection's frames are let go."""
    p = LinkParams(resend_timeout=0.1, reorder_bytes=3000, reorder_total_bytes=5000)
    a, c, b = LinkLayer("a", 1, p), LinkLayer("c", 1, p), LinkLayer("b", 1, p)
    frames = []
    for i in range(6):
        a.send("b", f"a{i}")
        frames.append(a.flush(0.0)[0][1])
    for f in frames[1:]:  # the first is lost: five wait, 1,000 bytes each
        assert b.on_frame("a", f, 0.0, 1000) == []
    assert b.reorder_bytes == 3000 and b.stats["frames_dropped_reorder"] == 2
    c.send("b", "c0")
    c.flush(0.0)
    c.send("b", "c1")
    late = c.flush(0.0)[0][1]
    for size in (2500, 600):  # over the total bound, then within it
        assert b.on_frame("c", late, 0.0, size) == []
    assert b.reorder_bytes == 3600 and b.stats["frames_dropped_reorder"] == 3
    # The resends fill the gap: everything arrives once, in order.
    got = [m for _, f in a.on_tick(0.1) for m in b.on_frame("a", f, 0.1, 1000)]
    assert got == [f"a{i}" for i in range(6)]
    assert b.reorder_bytes == 600
    b.release_reordered("c")  # c's connection went: it resends all it was not acked for
    assert b.reorder_bytes == 0
    got = [m for _, f in c.on_tick(0.1) for m in b.on_frame("c", f, 0.1, 600)]
    assert got == ["c0", "c1"]
